//! The kernel backends' state as plain values: what one peer needs ([`PeerState`]), what a
//! backend owns ([`Owned`]), and all of it at once, as read back from the kernel ([`Snapshot`]).

use std::collections::{HashMap, HashSet};

use std::net::IpAddr;

use anyhow::Context;
use ipnet::IpNet;

use super::checklist::Checklist;
use crate::host::netlink::{FdbEntry, Neighbour, Netlink, Nexthop, Route};
use crate::host::uplink::Uplink;
use crate::lease::Lease;

/// Kernel state for one peer. Installed in field order (neighbour, fdb, nexthop, route:
/// flannel's order, so the kernel never resolves the route's gateway before its neighbour
/// entry exists) and removed in reverse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerState {
    /// Permanent ARP (IPv4) or NDP (IPv6) entry on the backend's device of its family.
    pub neighbour: Option<Neighbour>,
    /// VXLAN forwarding entry on the backend's device of the route's family.
    pub fdb: Option<FdbEntry>,
    /// The nexthop object the route goes through; set by the kernel backend, not the plan.
    pub nexthop: Option<Nexthop>,
    pub route: Route,
}

impl PeerState {
    pub fn route_only(route: Route) -> PeerState {
        PeerState {
            neighbour: None,
            fdb: None,
            nexthop: None,
            route,
        }
    }

    /// Whether this is a peer's IPv6 side (its route, neighbour and fdb entry go with the
    /// backend's IPv6 device).
    pub fn is_ipv6(&self) -> bool {
        self.route.dst.addr().is_ipv6()
    }

    /// The same state with its route through `nexthop` (`None`: the gateway route as it is).
    pub(crate) fn through(mut self, nexthop: Option<Nexthop>) -> PeerState {
        if let Some(nh) = nexthop {
            self.route.nhid = Some(nh.id);
        }
        self.nexthop = nexthop;
        self
    }
}

/// `<subnet> via <PublicIP> dev <iface>`: host-gw's route to a peer, and DirectRouting's.
pub(crate) fn route_via(uplink: &Uplink, lease: &Lease) -> anyhow::Result<Route> {
    let (subnet, public_ip) = lease.ipv4_side()?;
    Ok(uplink.route_via(subnet, public_ip))
}

/// `<IPv6 subnet> via <PublicIPv6> dev <iface>`, for a lease with an IPv6 side.
pub(crate) fn route_via6(uplink: &Uplink, lease: &Lease) -> Option<Route> {
    let (subnet, public_ip) = lease.ipv6_side()?;
    Some(uplink.route_via(subnet, public_ip))
}

/// The kernel state a backend owns, and so may delete when no lease wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owned {
    /// The flannel `Network`, and on a dual-stack node its `IPv6Network`.
    pub networks: Vec<IpNet>,
    /// Routes inside `networks` on these links.
    pub route_links: Vec<u32>,
    /// The backend's own tunnel devices, whose permanent neighbours and fdb entries it owns.
    pub l2: L2Links,
}

impl Owned {
    fn owns_route(&self, route: &Route) -> bool {
        self.route_links.contains(&route.oif)
            && self.networks.iter().any(|n| n.contains(&route.dst))
    }
}

/// A tunnel backend's devices by the family they carry: vxlan's `flannel.<VNI>` (IPv4) and
/// `flannel-v6.<VNI>` (IPv6, on a dual-stack node). An entry of one family lives only on the
/// device of that family, so the family of its address names its device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct L2Links {
    pub v4: Option<u32>,
    pub v6: Option<u32>,
}

impl L2Links {
    /// The device that holds entries for `ip`'s family.
    pub fn for_ip(&self, ip: IpAddr) -> Option<u32> {
        match ip {
            IpAddr::V4(_) => self.v4,
            IpAddr::V6(_) => self.v6,
        }
    }

    fn each(&self) -> impl Iterator<Item = (u32, bool)> {
        let v4 = self.v4.map(|dev| (dev, false));
        v4.into_iter().chain(self.v6.map(|dev| (dev, true)))
    }
}

/// Owned kernel state, read back from the kernel.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    pub routes: Checklist<Route>,
    pub neighbours: Checklist<Neighbour>,
    pub fdb: Checklist<FdbEntry>,
    /// twill's nexthop objects, by id; checked off by removing them.
    pub nexthops: HashMap<u32, Nexthop>,
}

impl Snapshot {
    /// What the kernel holds of `owned`, with twill's nexthops as `nexthops` listed them.
    pub async fn read(
        nl: &Netlink,
        owned: &Owned,
        nexthops: HashMap<u32, Nexthop>,
    ) -> anyhow::Result<Snapshot> {
        let routes = nl.boot_routes().await.context("listing routes")?;
        let routes = routes.into_iter().map(|r| with_nexthop(r, &nexthops));
        let routes = routes.filter(|r| owned.owns_route(r)).collect();
        let (mut neighbours, mut fdb) = (Vec::new(), Vec::new());
        for (dev, ipv6) in owned.l2.each() {
            // Only entries of the device's own family are its: any other is not twill's.
            let found = nl.permanent_neighbours(dev).await;
            let found = found.context("listing neighbours")?;
            append(&mut neighbours, found, |n| n.ip.is_ipv6() == ipv6);
            let found = nl.fdb(dev).await.context("listing fdb")?;
            append(&mut fdb, found, |f| f.dst.is_ipv6() == ipv6);
        }
        Ok(Snapshot {
            routes: Checklist::of(routes),
            neighbours: Checklist::of(neighbours),
            fdb: Checklist::of(fdb),
            nexthops,
        })
    }

    /// Checks what `peer` wants off what the kernel holds. Checked off peer by peer as each is
    /// planned, what is left at the end is what no peer wants, without a set of everything
    /// wanted beside it.
    pub fn check_off(&mut self, peer: &PeerState) {
        self.routes.check_off(&peer.route);
        if let Some(neighbour) = &peer.neighbour {
            self.neighbours.check_off(neighbour);
        }
        if let Some(fdb) = &peer.fdb {
            self.fdb.check_off(fdb);
        }
        if let Some(nexthop) = &peer.nexthop {
            self.nexthops.remove(&nexthop.id);
        }
    }

    /// Whether what is left after checking off may hold something a peer wants in another
    /// form ([`Snapshot::keep_replaced`]): usually nothing is left, and the peers need not be
    /// planned a second time.
    pub fn may_hold_replaced(&self) -> bool {
        self.routes.left().any(|r| through(r).is_some()) || self.neighbours.left().next().is_some()
    }

    /// Keeps, of what is left after checking off all `peers`, what a peer wants in another form
    /// and was just replaced in place: a route through the same nexthop id (its nexthop
    /// moved), a neighbour of the same IP (its MAC changed). Deleting those would delete the
    /// replacement.
    pub fn keep_replaced(&mut self, peers: impl Iterator<Item = PeerState>) {
        // What is left is usually nothing, so these sets are small.
        let left_through: HashSet<(u32, IpNet)> = self.routes.left().filter_map(through).collect();
        let left_ips: HashSet<IpAddr> = self.neighbours.left().map(|n| n.ip).collect();
        let (mut moved, mut replaced) = (HashSet::new(), HashSet::new());
        for p in peers {
            moved.extend(through(&p.route).filter(|t| left_through.contains(t)));
            replaced.extend(p.neighbour.map(|n| n.ip).filter(|ip| left_ips.contains(ip)));
        }
        self.routes
            .check_off_where(|r| through(r).is_some_and(|t| moved.contains(&t)));
        self.neighbours
            .check_off_where(|n| replaced.contains(&n.ip));
    }
}

/// Adds what `found` holds that `keep` keeps to `all`; the first device's entries are kept in
/// the `Vec` they were read into, not copied.
fn append<T>(all: &mut Vec<T>, found: Vec<T>, keep: impl Fn(&T) -> bool) {
    let found = found.into_iter().filter(keep);
    if all.is_empty() {
        *all = found.collect();
    } else {
        all.extend(found);
    }
}

/// A route through a nexthop as the kernel deletes it: by nexthop id and destination.
fn through(route: &Route) -> Option<(u32, IpNet)> {
    Some((route.nhid?, route.dst))
}

/// A route through one of twill's nexthops takes its gateway and device from it: the kernel
/// lists them with the route only in nexthop_compat_mode, the default.
fn with_nexthop(route: Route, nexthops: &HashMap<u32, Nexthop>) -> Route {
    match route.nhid.and_then(|id| nexthops.get(&id)) {
        Some(nh) => Route {
            gateway: Some(nh.gateway.into()),
            oif: nh.oif,
            onlink: nh.onlink,
            ..route
        },
        None => route,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::host::netlink::MacAddr;
    use crate::lease::LeaseAttrs;
    use std::net::Ipv4Addr;

    pub fn lease(subnet: &str, public_ip: &str, backend_type: Option<&str>) -> Lease {
        let public_ip: Ipv4Addr = public_ip.parse().unwrap();
        let attrs = LeaseAttrs::typed(public_ip, backend_type, None);
        Lease::new(subnet.parse::<ipnet::Ipv4Net>().unwrap(), attrs)
    }

    /// `lease` with an IPv6 side.
    pub fn dual_stack(lease: Lease, subnet6: &str, public_ipv6: &str) -> Lease {
        let attrs = lease
            .attrs()
            .with_ipv6(public_ipv6.parse().unwrap(), lease.backend_v6_data.clone());
        Lease::new(lease.subnets.with_v6(subnet6.parse().unwrap()), attrs)
    }

    fn route(dst: &str, oif: u32) -> Route {
        Route {
            dst: dst.parse().unwrap(),
            gateway: None,
            oif,
            onlink: false,
            nhid: None,
        }
    }

    #[test]
    fn owns_only_routes_inside_the_network_on_its_links() {
        let owned = Owned {
            networks: vec!["10.5.0.0/16".parse().unwrap(), "fd10::/56".parse().unwrap()],
            route_links: vec![4, 2],
            l2: L2Links {
                v4: Some(4),
                v6: None,
            },
        };
        assert!(owned.owns_route(&route("10.5.3.0/24", 4)));
        assert!(owned.owns_route(&route("10.5.3.0/24", 2)));
        assert!(!owned.owns_route(&route("10.5.3.0/24", 9)));
        assert!(!owned.owns_route(&route("10.6.3.0/24", 4)));
        assert!(!owned.owns_route(&route("10.0.0.0/8", 4)));
        assert!(owned.owns_route(&route("fd10:0:0:3::/64", 2)));
        assert!(!owned.owns_route(&route("fd11:0:0:3::/64", 2)));
    }

    #[test]
    fn a_route_through_our_nexthop_reads_back_as_it_was_planned() {
        let nh = Nexthop {
            id: 0x7400_0003,
            gateway: Ipv4Addr::new(10, 5, 3, 0),
            oif: 4,
            onlink: true,
        };
        let planned = PeerState::route_only(Route {
            gateway: Some(nh.gateway.into()),
            onlink: true,
            ..route("10.5.3.0/24", 4)
        })
        .through(Some(nh));
        assert_eq!(planned.route.nhid, Some(nh.id));
        // Listed without the compat fields (nexthop_compat_mode 0): the id alone.
        let listed = Route {
            nhid: Some(nh.id),
            ..route("10.5.3.0/24", 0)
        };
        let ours = HashMap::from([(nh.id, nh)]);
        assert_eq!(with_nexthop(listed, &ours), planned.route);
        assert_eq!(with_nexthop(listed, &HashMap::new()), listed, "not ours");
    }

    fn mac(last: u8) -> MacAddr {
        MacAddr([0x0e, 0, 0, 0, 0, last])
    }

    /// A vxlan peer of 10.5.<n>.0/24 at 10.200.0.<n>, its route through nexthop `n`.
    fn vxlan_peer(n: u8) -> PeerState {
        let gateway = Ipv4Addr::new(10, 5, n, 0);
        let nexthop = Nexthop {
            id: u32::from(n),
            gateway,
            oif: 4,
            onlink: true,
        };
        PeerState {
            neighbour: Some(Neighbour {
                ip: gateway.into(),
                mac: mac(n),
            }),
            fdb: Some(FdbEntry {
                mac: mac(n),
                dst: Ipv4Addr::new(10, 200, 0, n).into(),
            }),
            nexthop: None,
            route: Route {
                gateway: Some(gateway.into()),
                onlink: true,
                ..route(&format!("10.5.{n}.0/24"), 4)
            },
        }
        .through(Some(nexthop))
    }

    /// The kernel holding exactly `peers`.
    fn holding(peers: &[PeerState]) -> Snapshot {
        Snapshot {
            routes: Checklist::of(peers.iter().map(|p| p.route).collect()),
            neighbours: Checklist::of(peers.iter().filter_map(|p| p.neighbour).collect()),
            fdb: Checklist::of(peers.iter().filter_map(|p| p.fdb).collect()),
            nexthops: peers
                .iter()
                .filter_map(|p| p.nexthop.map(|nh| (nh.id, nh)))
                .collect(),
        }
    }

    fn left<T: Ord>(list: &Checklist<T>) -> Vec<&T> {
        list.left().collect()
    }

    /// What a reconcile does with what the kernel holds: checks off each peer, then keeps
    /// what was replaced in place.
    fn settle(held: &mut Snapshot, peers: Vec<PeerState>) {
        for peer in &peers {
            held.check_off(peer);
        }
        if held.may_hold_replaced() {
            held.keep_replaced(peers.into_iter());
        }
    }

    #[test]
    fn checking_off_the_wanted_peers_leaves_only_what_no_peer_wants() {
        let (kept, gone) = (vxlan_peer(3), vxlan_peer(4));
        let mut held = holding(&[kept.clone(), gone.clone()]);
        settle(&mut held, vec![kept]);
        assert_eq!(left(&held.routes), [&gone.route]);
        assert_eq!(left(&held.neighbours), [&gone.neighbour.unwrap()]);
        assert_eq!(left(&held.fdb), [&gone.fdb.unwrap()]);
        let gone_nexthop = gone.nexthop.unwrap();
        assert_eq!(
            held.nexthops,
            HashMap::from([(gone_nexthop.id, gone_nexthop)])
        );
    }

    #[test]
    fn what_was_replaced_in_place_is_still_wanted() {
        let before = vxlan_peer(3);
        // The peer's VtepMAC changed, and its route's nexthop moved to another gateway: both
        // were just replaced in place (same neighbour IP, same nexthop id and destination).
        let mut now = before.clone();
        now.neighbour.as_mut().unwrap().mac = mac(9);
        now.fdb.as_mut().unwrap().mac = mac(9);
        now.route.gateway = Some(Ipv4Addr::new(10, 5, 9, 0).into());
        let mut held = holding(std::slice::from_ref(&before));
        settle(&mut held, vec![now]);
        assert!(left(&held.routes).is_empty(), "{:?}", held.routes);
        assert!(left(&held.neighbours).is_empty(), "{:?}", held.neighbours);
        assert!(held.nexthops.is_empty());
        // An fdb entry is keyed by MAC and destination: the old one is stale.
        assert_eq!(left(&held.fdb), [&before.fdb.unwrap()]);
    }
}
