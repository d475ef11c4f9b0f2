//! The peers in the maps: a destination subnet's route (and its IPv6 subnet's, on a dual-stack
//! network), the peer found by its underlay address, and its slot in the per-peer counters.
//! The same rules as the userspace engine's table (twill_dataplane::table): one peer per subnet,
//! per IPv6 subnet and per endpoint address, counters kept while a peer stays as it is and
//! started afresh when it changes.

use crate::maps::{
    addr_of, port_of, possible_cpus, wire_addr, wire_port, Maps, Peer, RawTraffic, Route, RouteKey,
    RouteKey6, Subnet6, MAX_PEERS, ROUTE_SUPER_PACKETS,
};
use anyhow::{bail, Context};
use aya::maps::PerCpuValues;
use ipnet::{Ipv4Net, Ipv6Net};
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// What a peer's node takes from a veth underlay, which hands over what the sender's stack made
/// (docs/decisions.md, "A veth underlay is not a wire").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takes {
    /// Datagrams as a wire carries them, read from a socket (a TUN node, flanneld): on a veth
    /// underlay what goes to it passes the segmenter first.
    Datagrams,
    /// TCP super-packets whole and checksums still to be filled in (an eBPF node).
    SuperPackets,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    /// An IPv4 address over the IPv4 underlay, an IPv6 one over the IPv6 underlay.
    endpoint: SocketAddr,
    subnet6: Option<Ipv6Net>,
    takes: Takes,
    slot: u32,
}

/// The maps' peers as userspace tracks them, read back from the maps when they are adopted.
pub(crate) struct PeerSet {
    by_subnet: BTreeMap<Ipv4Net, Entry>,
    /// Which subnet each endpoint address belongs to (the ingress program's key).
    by_address: HashMap<IpAddr, Ipv4Net>,
    /// Which peer (by its IPv4 subnet) each IPv6 subnet belongs to.
    by_subnet6: HashMap<Ipv6Net, Ipv4Net>,
    /// Counter slots no peer holds; their counters are zero.
    free: Vec<u32>,
}

impl PeerSet {
    /// The peers the maps hold now (none when they were just created).
    pub fn read(maps: &mut Maps) -> anyhow::Result<PeerSet> {
        let mut by_subnet = BTreeMap::new();
        let endpoints6: Result<HashMap<u32, [u8; 16]>, _> = maps.endpoints6.iter().collect();
        let endpoints6 = endpoints6.context("reading the endpoints6 map")?;
        for item in maps.routes.iter() {
            let (key, route) = item.context("reading the routes map")?;
            let subnet = Ipv4Net::new(addr_of(key.data()), key.prefix_len() as u8)?;
            // An IPv6-underlay peer's route has no IPv4 endpoint.
            let address = match (route.endpoint, endpoints6.get(&route.slot)) {
                (0, Some(octets)) => IpAddr::V6(Ipv6Addr::from(*octets)),
                _ => IpAddr::V4(addr_of(route.endpoint)),
            };
            let endpoint = SocketAddr::new(address, port_of(route.port));
            let takes = match route.flags & ROUTE_SUPER_PACKETS {
                0 => Takes::Datagrams,
                _ => Takes::SuperPackets,
            };
            by_subnet.insert(
                subnet,
                Entry {
                    endpoint,
                    subnet6: None,
                    takes,
                    slot: route.slot,
                },
            );
        }
        let by_slot: HashMap<u32, Ipv4Net> = by_subnet.iter().map(|(s, e)| (e.slot, *s)).collect();
        let routes6: Result<Vec<_>, _> = maps.routes6.iter().collect();
        for (key, route) in routes6.context("reading the routes6 map")? {
            let subnet6 = Ipv6Net::new(key.data().into(), key.prefix_len() as u8)?;
            let entry = by_slot.get(&route.slot).and_then(|s| by_subnet.get_mut(s));
            match entry {
                Some(entry) => entry.subnet6 = Some(subnet6),
                // Left by a run that stopped half-way through a change: the reconcile that
                // follows a load puts every lease's in again.
                None => maps
                    .routes6
                    .remove(&route_key6(subnet6))
                    .with_context(|| format!("removing the stray route to {subnet6}"))?,
            }
        }
        let mut used = vec![false; MAX_PEERS as usize];
        for entry in by_subnet.values() {
            used[entry.slot as usize] = true;
        }
        let free = (0..MAX_PEERS)
            .rev()
            .filter(|s| !used[*s as usize])
            .collect();
        let by_address = by_subnet
            .iter()
            .map(|(s, e)| (e.endpoint.ip(), *s))
            .collect();
        // The same for a slot's IPv6 subnet without its route: the slot's next peer must not
        // inherit it.
        let with6: std::collections::HashSet<u32> = by_subnet
            .values()
            .filter(|e| e.subnet6.is_some())
            .map(|e| e.slot)
            .collect();
        let slots6: Result<Vec<u32>, _> = maps.peer_subnets6.keys().collect();
        for slot in slots6.context("reading the peer_subnets6 map")? {
            if !with6.contains(&slot) {
                maps.peer_subnets6
                    .remove(&slot)
                    .with_context(|| format!("removing the stray IPv6 subnet of slot {slot}"))?;
            }
        }
        let by_subnet6 = by_subnet
            .iter()
            .filter_map(|(s, e)| Some((e.subnet6?, *s)))
            .collect();
        Ok(PeerSet {
            by_subnet,
            by_address,
            by_subnet6,
            free,
        })
    }

    pub fn len(&self) -> usize {
        self.by_subnet.len()
    }

    pub fn list(&self) -> Vec<(Ipv4Net, SocketAddr)> {
        self.by_subnet
            .iter()
            .map(|(s, e)| (*s, e.endpoint))
            .collect()
    }

    /// What each peer takes, by its subnet.
    pub fn takes(&self) -> BTreeMap<Ipv4Net, Takes> {
        self.by_subnet.iter().map(|(s, e)| (*s, e.takes)).collect()
    }

    /// The IPv6 subnet of each peer that has one, by its IPv4 subnet.
    pub fn subnets6(&self) -> BTreeMap<Ipv4Net, Ipv6Net> {
        self.by_subnet
            .iter()
            .filter_map(|(s, e)| Some((*s, e.subnet6?)))
            .collect()
    }

    /// The subnet whose counters sit in each held slot.
    pub fn slots(&self) -> impl Iterator<Item = (Ipv4Net, u32)> + '_ {
        self.by_subnet.iter().map(|(s, e)| (*s, e.slot))
    }

    /// Add the peer of `subnet` (with `subnet6`, its IPv6 subnet on a dual-stack network), or
    /// change its endpoint or IPv6 subnet. The peer entries go in before the routes, so a
    /// packet routed to the peer can already be answered.
    pub fn set(
        &mut self,
        maps: &mut Maps,
        subnet: Ipv4Net,
        subnet6: Option<Ipv6Net>,
        endpoint: SocketAddr,
        takes: Takes,
    ) -> anyhow::Result<()> {
        let (subnet, subnet6) = (subnet.trunc(), subnet6.map(|s| s.trunc()));
        let holder = self.by_address.get(&endpoint.ip()).copied();
        if let Some(holder) = holder.filter(|h| *h != subnet) {
            bail!(
                "peer {subnet} left out: its endpoint {endpoint} belongs to the peer of {holder}"
            );
        }
        let holder6 = subnet6.and_then(|s6| Some((s6, *self.by_subnet6.get(&s6)?)));
        if let Some((subnet6, holder)) = holder6.filter(|(_, h)| *h != subnet) {
            bail!(
                "peer {subnet} left out: its IPv6 subnet {subnet6} belongs to the peer of {holder}"
            );
        }
        let old = self.by_subnet.get(&subnet).copied();
        let new = |slot| Entry {
            endpoint,
            subnet6,
            takes,
            slot,
        };
        if old.is_some_and(|e| e == new(e.slot)) {
            return Ok(());
        }
        let slot = match old {
            Some(entry) => {
                zero_counters(maps, entry.slot)?;
                entry.slot
            }
            None => self.free.pop().with_context(|| {
                format!("peer {subnet} left out: the maps hold {MAX_PEERS} peers")
            })?,
        };
        let inserted = insert(maps, subnet, new(slot));
        if let Err(e) = inserted {
            if old.is_none() {
                self.free.push(slot);
            }
            return Err(e);
        }
        if let Some(old) = old {
            self.forget_changed(maps, old, new(slot))?;
        }
        self.by_subnet.insert(subnet, new(slot));
        self.by_address.insert(endpoint.ip(), subnet);
        if let Some(subnet6) = subnet6 {
            self.by_subnet6.insert(subnet6, subnet);
        }
        Ok(())
    }

    /// Takes out of the maps what of `old` the peer's `new` entry no longer has: its former
    /// endpoint address, its former IPv6 subnet.
    fn forget_changed(&mut self, maps: &mut Maps, old: Entry, new: Entry) -> anyhow::Result<()> {
        let moved = old.endpoint.ip() != new.endpoint.ip();
        if moved {
            remove_endpoint(maps, old, new.endpoint.is_ipv6())?;
            self.by_address.remove(&old.endpoint.ip());
        }
        if let Some(old6) = old.subnet6.filter(|s| Some(*s) != new.subnet6) {
            remove_route6(maps, old6)?;
            self.by_subnet6.remove(&old6);
        }
        if new.subnet6.is_none() {
            remove_subnet6_of(maps, old)?;
        }
        Ok(())
    }

    /// Remove the peer of `subnet`, if there is one: its route first, then its peer entry,
    /// then its counters (zeroed for the next peer in its slot).
    pub fn remove(&mut self, maps: &mut Maps, subnet: Ipv4Net) -> anyhow::Result<()> {
        let subnet = subnet.trunc();
        let Some(entry) = self.by_subnet.get(&subnet).copied() else {
            return Ok(());
        };
        maps.routes
            .remove(&route_key(subnet))
            .with_context(|| format!("removing the route to {subnet}"))?;
        if let Some(subnet6) = entry.subnet6 {
            remove_route6(maps, subnet6)?;
            self.by_subnet6.remove(&subnet6);
        }
        remove_endpoint(maps, entry, false)?;
        remove_subnet6_of(maps, entry)?;
        self.by_subnet.remove(&subnet);
        self.by_address.remove(&entry.endpoint.ip());
        zero_counters(maps, entry.slot)?;
        self.free.push(entry.slot);
        Ok(())
    }
}

pub(crate) fn route_key(subnet: Ipv4Net) -> RouteKey {
    RouteKey::new(u32::from(subnet.prefix_len()), wire_addr(subnet.network()))
}

pub(crate) fn route_key6(subnet: Ipv6Net) -> RouteKey6 {
    RouteKey6::new(u32::from(subnet.prefix_len()), subnet.network().octets())
}

fn insert(maps: &mut Maps, subnet: Ipv4Net, entry: Entry) -> anyhow::Result<()> {
    let Entry {
        endpoint,
        subnet6,
        takes,
        slot,
    } = entry;
    let peer = Peer {
        subnet: wire_addr(subnet.network()),
        mask: wire_addr(subnet.netmask()),
        port: wire_port(endpoint.port()),
        pad: 0,
        slot,
    };
    // Over the IPv6 underlay the route's IPv4 endpoint is unused (0): endpoints6 has the
    // peer's address by its slot.
    let address = match endpoint.ip() {
        IpAddr::V4(address) => {
            maps.peers
                .insert(wire_addr(address), peer, 0)
                .with_context(|| format!("adding the peer of {subnet} to the peers map"))?;
            wire_addr(address)
        }
        IpAddr::V6(address) => {
            maps.peers6
                .insert(address.octets(), peer, 0)
                .with_context(|| format!("adding the peer of {subnet} to the peers6 map"))?;
            maps.endpoints6
                .insert(slot, address.octets(), 0)
                .with_context(|| format!("adding the endpoint of {subnet} to endpoints6"))?;
            0
        }
    };
    let route = Route {
        endpoint: address,
        port: wire_port(endpoint.port()),
        flags: match takes {
            Takes::Datagrams => 0,
            Takes::SuperPackets => ROUTE_SUPER_PACKETS,
        },
        slot,
    };
    if let Some(subnet6) = subnet6 {
        maps.peer_subnets6
            .insert(slot, Subnet6::of(subnet6), 0)
            .with_context(|| format!("adding {subnet6} to the peer_subnets6 map"))?;
    }
    maps.routes
        .insert(&route_key(subnet), route, 0)
        .with_context(|| format!("adding the route to {subnet}"))?;
    if let Some(subnet6) = subnet6 {
        maps.routes6
            .insert(&route_key6(subnet6), route, 0)
            .with_context(|| format!("adding the route to {subnet6}"))?;
    }
    Ok(())
}

/// Removes the peer `entry` from the map that finds it by its underlay address; and, unless the
/// peer stays on the IPv6 underlay (`keeps_endpoint6`: the new address took the slot's place in
/// endpoints6 already), its slot's IPv6 endpoint.
fn remove_endpoint(maps: &mut Maps, entry: Entry, keeps_endpoint6: bool) -> anyhow::Result<()> {
    let removed = match entry.endpoint.ip() {
        IpAddr::V4(address) => maps.peers.remove(&wire_addr(address)),
        IpAddr::V6(address) => maps.peers6.remove(&address.octets()).and_then(|()| {
            if keeps_endpoint6 {
                return Ok(());
            }
            maps.endpoints6.remove(&entry.slot)
        }),
    };
    removed.with_context(|| format!("removing the peer {}", entry.endpoint))
}

fn remove_route6(maps: &mut Maps, subnet6: Ipv6Net) -> anyhow::Result<()> {
    maps.routes6
        .remove(&route_key6(subnet6))
        .with_context(|| format!("removing the route to {subnet6}"))
}

/// Removes the IPv6 subnet of the peer `entry`, if it has one.
fn remove_subnet6_of(maps: &mut Maps, entry: Entry) -> anyhow::Result<()> {
    if entry.subnet6.is_none() {
        return Ok(());
    }
    maps.peer_subnets6
        .remove(&entry.slot)
        .with_context(|| format!("removing the IPv6 subnet of the peer {}", entry.endpoint))
}

fn zero_counters(maps: &mut Maps, slot: u32) -> anyhow::Result<()> {
    let zero = PerCpuValues::try_from(vec![RawTraffic::default(); possible_cpus()?])?;
    maps.peer_traffic
        .set(slot, zero, 0)
        .with_context(|| format!("zeroing the counters in slot {slot}"))
}
