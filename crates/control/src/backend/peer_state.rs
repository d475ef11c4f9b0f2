//! The kernel backends' state as plain values: what one peer needs ([`PeerState`]), what a
//! backend owns ([`Owned`]), and all of it at once, as wanted or as read back ([`Snapshot`]).

use std::collections::{HashMap, HashSet};

use anyhow::Context;
use ipnet::Ipv4Net;

use super::netlink::{FdbEntry, Neighbour, Netlink, Nexthop, Route};

/// Kernel state for one peer. Installed in field order (neighbour, fdb, nexthop, route:
/// flannel's order, so the kernel never resolves the route's gateway before its neighbour
/// entry exists) and removed in reverse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerState {
    /// Permanent ARP entry on the backend's device.
    pub neighbour: Option<Neighbour>,
    /// VXLAN forwarding entry on the backend's device.
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

    /// The same state with its route through `nexthop` (`None`: the gateway route as it is).
    pub(crate) fn through(mut self, nexthop: Option<Nexthop>) -> PeerState {
        if let Some(nh) = nexthop {
            self.route.nhid = Some(nh.id);
        }
        self.nexthop = nexthop;
        self
    }
}

/// The kernel state a backend owns, and so may delete when no lease wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owned {
    pub network: Ipv4Net,
    /// Routes inside `network` on these links.
    pub route_links: Vec<u32>,
    /// Permanent neighbours and fdb entries on this link (the backend's own tunnel device).
    pub l2_link: Option<u32>,
}

impl Owned {
    fn owns_route(&self, route: &Route) -> bool {
        self.route_links.contains(&route.oif) && self.network.contains(&route.dst)
    }
}

/// Owned kernel state, read back from the kernel or computed from leases.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    pub routes: HashSet<Route>,
    pub neighbours: HashSet<Neighbour>,
    pub fdb: HashSet<FdbEntry>,
    /// twill's nexthop objects, by id.
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
        let mut snap = Snapshot {
            routes: routes.filter(|r| owned.owns_route(r)).collect(),
            nexthops,
            ..Snapshot::default()
        };
        if let Some(dev) = owned.l2_link {
            let neighbours = nl
                .permanent_neighbours(dev)
                .await
                .context("listing neighbours")?;
            snap.neighbours = neighbours.into_iter().collect();
            snap.fdb = nl
                .fdb(dev)
                .await
                .context("listing fdb")?
                .into_iter()
                .collect();
        }
        Ok(snap)
    }

    pub fn of<'a>(peers: impl Iterator<Item = &'a PeerState>) -> Snapshot {
        let mut snap = Snapshot::default();
        for p in peers {
            snap.routes.insert(p.route);
            snap.neighbours.extend(p.neighbour);
            snap.fdb.extend(p.fdb);
            snap.nexthops.extend(p.nexthop.map(|nh| (nh.id, nh)));
        }
        snap
    }
}

/// A route through one of twill's nexthops takes its gateway and device from it: the kernel
/// lists them with the route only in nexthop_compat_mode, the default.
fn with_nexthop(route: Route, nexthops: &HashMap<u32, Nexthop>) -> Route {
    match route.nhid.and_then(|id| nexthops.get(&id)) {
        Some(nh) => Route {
            gateway: Some(nh.gateway),
            oif: nh.oif,
            onlink: nh.onlink,
            ..route
        },
        None => route,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

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
            network: "10.5.0.0/16".parse().unwrap(),
            route_links: vec![4, 2],
            l2_link: Some(4),
        };
        assert!(owned.owns_route(&route("10.5.3.0/24", 4)));
        assert!(owned.owns_route(&route("10.5.3.0/24", 2)));
        assert!(!owned.owns_route(&route("10.5.3.0/24", 9)));
        assert!(!owned.owns_route(&route("10.6.3.0/24", 4)));
        assert!(!owned.owns_route(&route("10.0.0.0/8", 4)));
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
            gateway: Some(nh.gateway),
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
}
