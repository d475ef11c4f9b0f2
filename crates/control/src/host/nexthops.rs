//! Each peer's route through a nexthop object of its own (Linux 5.3+), instead of a route
//! with its own gateway.
//!
//! Why: every gateway route on one device makes its own `fib_info`, and those all land in one
//! hash bucket of the kernel, so adding route *n* costs O(n): 30,000 vxlan peers took 11.6 s
//! of `ip -batch` alone, growing quadratically. A route through a nexthop object shares that
//! object's `fib_info` lookup by id, and 60,000 of each take 0.57 s.
//!
//! Which ids are twill's: those in [`ID_BASE`]`..+`[`ID_SPAN`] whose protocol is
//! [`NEXTHOP_PROTOCOL`]. Both must hold: an id in the range that another daemon or an
//! administrator made is never changed or deleted (its peer keeps a gateway route, and the
//! collision is logged once), and one with twill's protocol outside the range is not ours
//! either. A peer's id follows from its subnet, so a restart, even after `kill -9`, finds and
//! adopts the ids it made before, and the reconcile deletes those no lease wants.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use ipnet::Ipv4Net;
use tracing::{info, warn};

use super::netlink::{ListedNexthop, Netlink, Nexthop, Write, NEXTHOP_PROTOCOL};

/// twill's ids: 't' in the top byte, the subnet's index in the network below it.
const ID_BASE: u32 = 0x7400_0000;
const ID_SPAN: u32 = 1 << 24;

/// Whether a listed nexthop is one twill made: its id range and its protocol.
pub(crate) fn is_twills(listed: &ListedNexthop) -> bool {
    listed.protocol == NEXTHOP_PROTOCOL && (ID_BASE..ID_BASE + ID_SPAN).contains(&listed.id)
}

/// The nexthop objects in twill's id range, as the kernel listed them.
#[derive(Debug, Default)]
pub(crate) struct NexthopTable {
    /// twill's own, by id.
    pub ours: HashMap<u32, Nexthop>,
    /// Ids in twill's range that someone else holds: never touched.
    pub foreign: HashSet<u32>,
}

impl NexthopTable {
    pub fn of(listed: impl IntoIterator<Item = ListedNexthop>) -> NexthopTable {
        let mut table = NexthopTable::default();
        for nh in listed {
            match nh.gateway.filter(|_| is_twills(&nh)) {
                Some(gateway) => {
                    table.ours.insert(nh.id, gateway);
                }
                None if (ID_BASE..ID_BASE + ID_SPAN).contains(&nh.id) => {
                    table.foreign.insert(nh.id);
                }
                None => {}
            }
        }
        table
    }
}

/// How a kernel backend writes its peers' routes, found once at start.
#[derive(Debug)]
pub(crate) struct Nexthops {
    /// Peers' routes go through nexthop objects; else gateway routes, as flanneld writes them.
    enabled: bool,
    /// The kernel lists nexthop objects, so twill's (from a run that used them) can be
    /// adopted or removed, whichever way routes go now.
    listable: bool,
    /// `Network`; `None` on an IPv6-only network, whose peers all get gateway routes.
    network: Option<Ipv4Net>,
    /// Ids found held by someone else, each logged once.
    collisions: HashSet<u32>,
}

impl Nexthops {
    /// Asks the kernel whether it has nexthop objects; says once which way routes go.
    /// `wanted` is false under `--no-nexthop-objects`.
    pub async fn probe(nl: &Netlink, network: Option<Ipv4Net>, wanted: bool) -> Nexthops {
        let listable = match nl.nexthops().await {
            Ok(_) => true,
            Err(e) => {
                let why = format!("the kernel refuses nexthop objects ({e})");
                warn!("{why}: each peer gets a gateway route, as flanneld writes it");
                false
            }
        };
        if listable && !wanted {
            info!("--no-nexthop-objects: each peer gets a gateway route, as flanneld writes it");
        } else if listable {
            info!("each peer's route goes through a nexthop object of its own");
        }
        Nexthops {
            enabled: listable && wanted,
            listable,
            network,
            collisions: HashSet::new(),
        }
    }

    /// The id of `subnet`'s nexthop: its index among the network's subnets of its size (every
    /// lease has the network's SubnetLen), so distinct subnets have distinct ids.
    fn id(&self, subnet: Ipv4Net) -> Option<u32> {
        let network = self.network?;
        let offset = u32::from(subnet.network()).checked_sub(u32::from(network.network()))?;
        let index = offset.checked_shr(32 - u32::from(subnet.prefix_len()))?;
        (index < ID_SPAN).then_some(ID_BASE | index)
    }

    /// twill's nexthops and the foreign ids in its range; empty on a kernel without them.
    pub async fn list(&self, nl: &Netlink) -> anyhow::Result<NexthopTable> {
        if !self.listable {
            return Ok(NexthopTable::default());
        }
        Ok(NexthopTable::of(nl.nexthops().await?))
    }

    /// What the kernel holds under `subnet`'s id, for a change to one peer.
    pub async fn lookup(&self, nl: &Netlink, subnet: Ipv4Net) -> anyhow::Result<NexthopTable> {
        let Some(id) = self.id(subnet).filter(|_| self.listable) else {
            return Ok(NexthopTable::default());
        };
        Ok(NexthopTable::of(nl.nexthop(id).await?))
    }

    /// The nexthop `subnet`'s route goes through, made from its gateway route; `None` keeps
    /// the gateway route (nexthops off, or the id held by someone else).
    pub fn through(
        &mut self,
        subnet: Ipv4Net,
        route: &super::netlink::Route,
        have: &NexthopTable,
    ) -> Option<Nexthop> {
        let Some(IpAddr::V4(gateway)) = route.gateway.filter(|_| self.enabled) else {
            return None;
        };
        let id = self.id(subnet)?;
        if have.foreign.contains(&id) {
            if self.collisions.insert(id) {
                warn!(
                    %subnet,
                    "nexthop id {id} is held by another program: this peer keeps a gateway route"
                );
            }
            return None;
        }
        Some(Nexthop {
            id,
            gateway,
            oif: route.oif,
            onlink: route.onlink,
        })
    }
}

/// The change that makes `nh` present, if `have` does not already hold it.
pub(crate) fn install(nh: Nexthop, have: &HashMap<u32, Nexthop>) -> Option<Write> {
    match have.get(&nh.id) {
        Some(held) if *held == nh => None,
        Some(_) => Some(Write::ReplaceNexthop(nh)),
        None => Some(Write::CreateNexthop(nh)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::netlink::Route;
    use std::net::Ipv4Addr;

    fn nexthops(enabled: bool) -> Nexthops {
        Nexthops {
            enabled,
            listable: true,
            network: Some("10.5.0.0/16".parse().unwrap()),
            collisions: HashSet::new(),
        }
    }

    fn listed(id: u32, protocol: u8) -> ListedNexthop {
        ListedNexthop {
            id,
            protocol,
            gateway: Some(Nexthop {
                id,
                gateway: Ipv4Addr::new(10, 200, 0, 2),
                oif: 2,
                onlink: false,
            }),
        }
    }

    fn route(dst: &str) -> Route {
        let dst: Ipv4Net = dst.parse().unwrap();
        Route {
            dst: dst.into(),
            gateway: Some(dst.network().into()),
            oif: 7,
            onlink: true,
            nhid: None,
        }
    }

    #[test]
    fn ids_follow_the_subnet_and_stay_in_twills_range() {
        let n = nexthops(true);
        let id = |s: &str| n.id(s.parse().unwrap());
        assert_eq!(id("10.5.0.0/24"), Some(0x7400_0000));
        assert_eq!(id("10.5.2.0/24"), Some(0x7400_0002));
        assert_eq!(id("10.5.255.0/24"), Some(0x7400_00ff));
        assert_eq!(id("10.5.3.128/25"), Some(0x7400_0007));
        assert_eq!(id("10.4.0.0/24"), None, "outside the network");
        let wide = Nexthops {
            network: Some("0.0.0.0/0".parse().unwrap()),
            ..nexthops(true)
        };
        assert_eq!(
            wide.id("255.255.255.0/24".parse().unwrap()),
            Some(0x74ff_ffff)
        );
        assert_eq!(
            wide.id("255.255.255.0/25".parse().unwrap()),
            None,
            "2^25 subnets"
        );
        let ipv6_only = Nexthops {
            network: None,
            ..nexthops(true)
        };
        assert_eq!(ipv6_only.id("10.5.2.0/24".parse().unwrap()), None);
    }

    #[test]
    fn only_twills_protocol_inside_twills_range_is_ours() {
        let table = NexthopTable::of([
            listed(0x7400_0002, NEXTHOP_PROTOCOL),
            listed(0x7400_0003, 3),
            listed(0x7400_0004, 0),
            listed(12, NEXTHOP_PROTOCOL),
            listed(13, 0),
        ]);
        assert_eq!(table.ours.keys().collect::<Vec<_>>(), [&0x7400_0002]);
        let foreign: HashSet<u32> = [0x7400_0003, 0x7400_0004].into();
        assert_eq!(table.foreign, foreign);
        // A group with twill's protocol in the range is not something twill makes.
        let group = ListedNexthop {
            gateway: None,
            ..listed(0x7400_0005, NEXTHOP_PROTOCOL)
        };
        assert!(NexthopTable::of([group]).foreign.contains(&0x7400_0005));
    }

    #[test]
    fn a_peer_goes_through_its_nexthop_unless_off_or_the_id_is_taken() {
        let r = route("10.5.2.0/24");
        let subnet: Ipv4Net = "10.5.2.0/24".parse().unwrap();
        let empty = NexthopTable::default();
        let nh = nexthops(true).through(subnet, &r, &empty).unwrap();
        let want = Nexthop {
            id: 0x7400_0002,
            gateway: Ipv4Addr::new(10, 5, 2, 0),
            oif: 7,
            onlink: true,
        };
        assert_eq!(nh, want);
        assert_eq!(nexthops(false).through(subnet, &r, &empty), None);
        let taken = NexthopTable::of([listed(0x7400_0002, 0)]);
        let mut n = nexthops(true);
        assert_eq!(n.through(subnet, &r, &taken), None);
        assert!(n.collisions.contains(&0x7400_0002), "logged once");
        let no_gateway = Route { gateway: None, ..r };
        assert_eq!(nexthops(true).through(subnet, &no_gateway, &empty), None);
    }

    #[test]
    fn a_held_nexthop_is_kept_changed_in_place_or_created() {
        let nh = listed(0x7400_0002, NEXTHOP_PROTOCOL).gateway.unwrap();
        let mut have = HashMap::new();
        assert_eq!(install(nh, &have), Some(Write::CreateNexthop(nh)));
        have.insert(nh.id, nh);
        assert_eq!(install(nh, &have), None);
        let moved = Nexthop { oif: 9, ..nh };
        assert_eq!(install(moved, &have), Some(Write::ReplaceNexthop(moved)));
    }
}
