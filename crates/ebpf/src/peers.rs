//! The peers in the maps: a destination subnet's route, the peer found by its underlay
//! address, and its slot in the per-peer counters. The same rules as the userspace engine's
//! table (twill_dataplane::table): one peer per subnet and per endpoint address, counters kept
//! while a peer stays as it is and started afresh when it changes.

use crate::maps::{
    addr_of, port_of, possible_cpus, wire_addr, wire_port, Maps, Peer, RawTraffic, Route, RouteKey,
    MAX_PEERS,
};
use anyhow::{bail, Context};
use aya::maps::PerCpuValues;
use ipnet::Ipv4Net;
use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddrV4};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    endpoint: SocketAddrV4,
    slot: u32,
}

/// The maps' peers as userspace tracks them, read back from the maps when they are adopted.
pub(crate) struct PeerSet {
    by_subnet: BTreeMap<Ipv4Net, Entry>,
    /// Which subnet each endpoint address belongs to (the ingress program's key).
    by_address: HashMap<Ipv4Addr, Ipv4Net>,
    /// Counter slots no peer holds; their counters are zero.
    free: Vec<u32>,
}

impl PeerSet {
    /// The peers the maps hold now (none when they were just created).
    pub fn read(maps: &mut Maps) -> anyhow::Result<PeerSet> {
        let mut by_subnet = BTreeMap::new();
        for item in maps.routes.iter() {
            let (key, route) = item.context("reading the routes map")?;
            let subnet = Ipv4Net::new(addr_of(key.data()), key.prefix_len() as u8)?;
            let endpoint = SocketAddrV4::new(addr_of(route.endpoint), port_of(route.port));
            by_subnet.insert(
                subnet,
                Entry {
                    endpoint,
                    slot: route.slot,
                },
            );
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
            .map(|(s, e)| (*e.endpoint.ip(), *s))
            .collect();
        Ok(PeerSet {
            by_subnet,
            by_address,
            free,
        })
    }

    pub fn len(&self) -> usize {
        self.by_subnet.len()
    }

    pub fn list(&self) -> Vec<(Ipv4Net, SocketAddrV4)> {
        self.by_subnet
            .iter()
            .map(|(s, e)| (*s, e.endpoint))
            .collect()
    }

    /// The subnet whose counters sit in each held slot.
    pub fn slots(&self) -> impl Iterator<Item = (Ipv4Net, u32)> + '_ {
        self.by_subnet.iter().map(|(s, e)| (*s, e.slot))
    }

    /// Add the peer of `subnet`, or point it at a new endpoint. The peer entry goes in before
    /// the route, so a packet routed to the peer can already be answered.
    pub fn set(
        &mut self,
        maps: &mut Maps,
        subnet: Ipv4Net,
        endpoint: SocketAddrV4,
    ) -> anyhow::Result<()> {
        let subnet = subnet.trunc();
        let holder = self.by_address.get(endpoint.ip()).copied();
        if let Some(holder) = holder.filter(|h| *h != subnet) {
            bail!(
                "peer {subnet} left out: its endpoint {endpoint} belongs to the peer of {holder}"
            );
        }
        let old = self.by_subnet.get(&subnet).copied();
        if old.is_some_and(|e| e.endpoint == endpoint) {
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
        let peer = Peer {
            subnet: wire_addr(subnet.network()),
            mask: wire_addr(subnet.netmask()),
            port: wire_port(endpoint.port()),
            pad: 0,
            slot,
        };
        let route = Route {
            endpoint: wire_addr(*endpoint.ip()),
            port: wire_port(endpoint.port()),
            pad: 0,
            slot,
        };
        let inserted = insert(maps, subnet, peer, route);
        if let Err(e) = inserted {
            if old.is_none() {
                self.free.push(slot);
            }
            return Err(e);
        }
        if let Some(old) = old.filter(|o| o.endpoint.ip() != endpoint.ip()) {
            maps.peers
                .remove(&wire_addr(*old.endpoint.ip()))
                .with_context(|| format!("removing the peer {}", old.endpoint))?;
            self.by_address.remove(old.endpoint.ip());
        }
        self.by_subnet.insert(subnet, Entry { endpoint, slot });
        self.by_address.insert(*endpoint.ip(), subnet);
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
        maps.peers
            .remove(&wire_addr(*entry.endpoint.ip()))
            .with_context(|| format!("removing the peer {}", entry.endpoint))?;
        self.by_subnet.remove(&subnet);
        self.by_address.remove(entry.endpoint.ip());
        zero_counters(maps, entry.slot)?;
        self.free.push(entry.slot);
        Ok(())
    }
}

pub(crate) fn route_key(subnet: Ipv4Net) -> RouteKey {
    RouteKey::new(u32::from(subnet.prefix_len()), wire_addr(subnet.network()))
}

fn insert(maps: &mut Maps, subnet: Ipv4Net, peer: Peer, route: Route) -> anyhow::Result<()> {
    maps.peers
        .insert(route.endpoint, peer, 0)
        .with_context(|| format!("adding the peer of {subnet} to the peers map"))?;
    maps.routes
        .insert(&route_key(subnet), route, 0)
        .with_context(|| format!("adding the route to {subnet}"))?;
    Ok(())
}

fn zero_counters(maps: &mut Maps, slot: u32) -> anyhow::Result<()> {
    let zero = PerCpuValues::try_from(vec![RawTraffic::default(); possible_cpus()?])?;
    maps.peer_traffic
        .set(slot, zero, 0)
        .with_context(|| format!("zeroing the counters in slot {slot}"))
}
