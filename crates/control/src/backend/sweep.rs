//! What an earlier run of another backend (twill's or flanneld's) left in the network: its
//! routes, and its tunnel device.
//!
//! Switching backends across a restart must not leave the old backend carrying traffic. A
//! host-gw route `10.5.2.0/24 via <peer> dev eth0` is more specific than wireguard's
//! `10.5.0.0/16 dev flannel-wg`, so it would keep container traffic flowing in the clear, and
//! nothing would say so. So at start and at every reconcile the node sweeps the routes inside
//! its `Network` that have the shape one of flannel's backends programs (flanneld
//! v0.28.9's routes, as the tests record them) and that the running backend does not own, and logs each.
//!
//! Only proto boot routes of the main table are looked at ([`Netlink::boot_routes`]: what
//! flanneld and twill write, never the kernel's own prefix routes such as `10.5.1.0/24 dev
//! cni0`), never one inside this node's own subnet, and only on the device names those backends
//! use (the underlay for host-gw's): a route of the same form on another device is not ours.
//!
//! On a dual-stack node the same holds for the IPv6 routes inside `IPv6Network`.
//!
//! Devices: a kernel tunnel of another backend (`flannel.<VNI>`, `flannel-v6.<VNI>`,
//! `flannel.ipip`, a kernel `flannel-wg`) that carries an address inside our `Network` (or
//! `IPv6Network`) was made for this network by an
//! earlier run, and is deleted with everything on it: kept, it would still decapsulate what a
//! peer sends it in the clear, and a route through it could come back. TUNs are never
//! deleted: one exists only while a process holds it, and that process's device is not ours;
//! its routes are still swept.
//!
//! Nexthop objects: twill's own (see `nexthops`), when the running backend is not one of the
//! kernel backends, whose reconcile owns them: with the routes through them gone, nothing
//! uses them.

use std::collections::HashMap;

use anyhow::Context;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use netlink_packet_route::link::InfoKind;
use tracing::warn;

use crate::backend_kind::BackendKind;
use crate::host::netlink::{Link, LinkKind, Netlink, Route, Write};
use crate::host::nexthops::is_twills;

/// flanneld's udp TUN; twill's is `--tun-name`.
const FLANNEL_UDP_TUN: &str = "flannel0";
/// The wireguard backend's device, kernel or TUN.
const WIREGUARD_DEV: &str = super::wireguard::DEVICE;
/// The ipip backend's device.
const IPIP_DEV: &str = super::ipip::DEVICE;

/// The node as the sweep sees it.
#[derive(Debug, Clone)]
pub struct Scope {
    /// `Network` and our IPv4 subnet; `None` on an IPv6-only node.
    pub ipv4: Option<(Ipv4Net, Ipv4Net)>,
    /// `IPv6Network` and our IPv6 subnet, on a dual-stack node.
    pub ipv6: Option<(Ipv6Net, Ipv6Net)>,
    pub underlay: String,
    /// This node's `--tun-name`, the userspace backends' device.
    pub tun_name: String,
    /// The running backend, for the log.
    pub backend: String,
    /// Devices whose routes the running backend programs and reconciles itself.
    pub keep: Vec<String>,
    /// The running backend reconciles twill's nexthop objects itself.
    pub nexthops_kept: bool,
}

impl Scope {
    /// The node's networks, for the log: `10.5.0.0/16`, `fd10::/48`, or both.
    fn networks(&self) -> String {
        let v4 = self.ipv4.map(|(network, _)| network.to_string());
        let v6 = self.ipv6.map(|(network, _)| network.to_string());
        v4.into_iter().chain(v6).collect::<Vec<_>>().join(" and ")
    }

    /// The backend shape of `route` on the device `dev`, if it is one the sweep may remove.
    fn stale_shape(&self, route: &Route, dev: &str) -> Option<BackendKind> {
        let (network, own) = match route.dst {
            IpNet::V4(_) => {
                let (network, own) = self.ipv4?;
                (IpNet::V4(network), IpNet::V4(own))
            }
            IpNet::V6(_) => {
                let (network, own) = self.ipv6?;
                (IpNet::V6(network), IpNet::V6(own))
            }
        };
        let swept = network.contains(&route.dst)
            && !own.contains(&route.dst)
            && !self.keep.iter().any(|k| k == dev);
        swept.then(|| shape(route, dev, self, network))?
    }

    /// A kernel tunnel device another backend made, which the running one does not use.
    fn foreign_tunnel(&self, link: &Link) -> bool {
        let made_by_a_backend = match &link.kind {
            LinkKind::Vxlan(_) => is_vxlan_name(&link.name),
            LinkKind::Ipip(_) => link.name == IPIP_DEV,
            LinkKind::Other(Some(InfoKind::Wireguard)) => link.name == WIREGUARD_DEV,
            _ => false,
        };
        made_by_a_backend && !self.keep.contains(&link.name)
    }
}

/// The backend whose shape `route` on `dev` has, inside `network` (the node's `Network` or
/// `IPv6Network`). Each backend names its own, so a new one must: no two shapes overlap.
fn shape(route: &Route, dev: &str, scope: &Scope, network: IpNet) -> Option<BackendKind> {
    let whole_network = route.dst == network && route.gateway.is_none();
    // A peer's route is for one subnet, never the whole network (an operator's may be).
    let one_subnet = route.dst.prefix_len() > network.prefix_len();
    let via = route.gateway.filter(|_| one_subnet);
    let has_shape = |kind: &BackendKind| match kind {
        // `<subnet> via <peer> dev <underlay>`; also vxlan's and ipip's DirectRouting.
        BackendKind::HostGw => dev == scope.underlay && via.is_some() && !route.onlink,
        // `<subnet> via <subnet's network address> dev flannel.<VNI> onlink` (and
        // `flannel-v6.<VNI>`).
        BackendKind::Vxlan => {
            is_vxlan_name(dev) && route.onlink && via == Some(route.dst.network())
        }
        // `<subnet> via <peer> dev flannel.ipip onlink`.
        BackendKind::Ipip => dev == IPIP_DEV && route.onlink && via.is_some(),
        // `<network> dev flannel0`, or twill's TUN (twill-batch's too: one shape for both).
        BackendKind::Udp => whole_network && (dev == FLANNEL_UDP_TUN || dev == scope.tun_name),
        BackendKind::TwillBatch => false,
        // `<network> dev flannel-wg`.
        BackendKind::Wireguard => whole_network && dev == WIREGUARD_DEV,
    };
    BackendKind::ALL.into_iter().find(has_shape)
}

/// `flannel.<VNI>` or `flannel-v6.<VNI>`; not `flannel.ipip`.
fn is_vxlan_name(name: &str) -> bool {
    let vni = name
        .strip_prefix("flannel.")
        .or_else(|| name.strip_prefix("flannel-v6."));
    vni.is_some_and(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
}

/// A route as `ip route` prints it.
fn describe(route: &Route, dev: &str) -> String {
    let via = route
        .gateway
        .map(|g| format!(" via {g}"))
        .unwrap_or_default();
    let onlink = if route.onlink { " onlink" } else { "" };
    format!("{}{via} dev {dev}{onlink}", route.dst)
}

/// Removes what other backends left, as [`Scope`] bounds it.
pub struct Sweep {
    nl: Netlink,
    scope: Scope,
}

impl Sweep {
    pub fn new(nl: Netlink, scope: Scope) -> Sweep {
        Sweep { nl, scope }
    }

    /// Devices first: deleting one takes its routes, neighbours and fdb entries with it.
    pub async fn run(&self) -> anyhow::Result<()> {
        let links = self.nl.links().await.context("listing links")?;
        let mut names: HashMap<u32, String> = HashMap::new();
        for link in links {
            if self.scope.foreign_tunnel(&link) && self.in_network(&link).await? {
                self.delete_device(&link).await?;
            } else {
                names.insert(link.index, link.name);
            }
        }
        self.remove_routes(&names).await?;
        self.remove_nexthops().await
    }

    /// twill's nexthop objects, unless the running backend keeps them; none on a kernel
    /// without nexthop objects.
    async fn remove_nexthops(&self) -> anyhow::Result<()> {
        if self.scope.nexthops_kept {
            return Ok(());
        }
        let Ok(listed) = self.nl.nexthops().await else {
            return Ok(());
        };
        let writes: Vec<Write> = listed
            .iter()
            .filter(|nh| is_twills(nh))
            .map(|nh| Write::DeleteNexthop(nh.id))
            .collect();
        let results = self.nl.write(&writes).await;
        let failed = results.into_iter().find_map(Result::err);
        if let Some(e) = failed {
            anyhow::bail!("removing twill's nexthop objects: {e}");
        }
        if !writes.is_empty() {
            warn!(
                "removed {} nexthop objects an earlier run of a kernel backend made; this node \
                 runs {}",
                writes.len(),
                self.scope.backend
            );
        }
        Ok(())
    }

    /// Whether the device holds an address inside our networks: made for them, not another's.
    async fn in_network(&self, link: &Link) -> anyhow::Result<bool> {
        if let Some((network, _)) = self.scope.ipv4 {
            let addrs = self.nl.ipv4_addresses(link.index).await?;
            if addrs.iter().any(|a| network.contains(&a.addr())) {
                return Ok(true);
            }
        }
        let Some((network6, _)) = self.scope.ipv6 else {
            return Ok(false);
        };
        let addrs6 = self.nl.ipv6_addresses(link.index).await?;
        Ok(addrs6.iter().any(|a| network6.contains(&a.addr())))
    }

    async fn delete_device(&self, link: &Link) -> anyhow::Result<()> {
        let deleted = self.nl.delete_link(link.index).await;
        deleted.with_context(|| format!("deleting {}", link.name))?;
        warn!(
            device = %link.name,
            "deleted {}, a tunnel device an earlier run of another backend made for {}: \
             this node now runs {}, and the old device would still carry traffic",
            link.name,
            self.scope.networks(),
            self.scope.backend
        );
        Ok(())
    }

    async fn remove_routes(&self, names: &HashMap<u32, String>) -> anyhow::Result<()> {
        let routes = self.nl.boot_routes().await.context("listing routes")?;
        let stale: Vec<(Route, &str, BackendKind)> = routes
            .into_iter()
            .filter_map(|r| {
                let dev = names.get(&r.oif)?;
                Some((r, dev.as_str(), self.scope.stale_shape(&r, dev)?))
            })
            .collect();
        let writes: Vec<Write> = stale.iter().map(|(r, ..)| Write::DeleteRoute(*r)).collect();
        let results = self.nl.write(&writes).await;
        let mut failed = None;
        for ((route, dev, shape), result) in stale.iter().zip(results) {
            let route = describe(route, dev);
            match result {
                Ok(()) => warn!(
                    "removed route {route}: {shape}'s, left by an earlier run; this node runs {} \
                     and the route would carry traffic around it",
                    self.scope.backend
                ),
                Err(e) => failed = failed.or(Some(format!("removing route {route}: {e}"))),
            }
        }
        failed.map_or(Ok(()), |why| Err(anyhow::anyhow!(why)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::netlink::VxlanParams;

    fn scope(keep: &[&str]) -> Scope {
        Scope {
            ipv4: Some((
                "10.5.0.0/16".parse().unwrap(),
                "10.5.1.0/24".parse().unwrap(),
            )),
            ipv6: Some((
                "fd10::/56".parse().unwrap(),
                "fd10:0:0:1::/64".parse().unwrap(),
            )),
            underlay: "eth0".into(),
            tun_name: "twill0".into(),
            backend: "wireguard".into(),
            keep: keep.iter().map(|k| k.to_string()).collect(),
            nexthops_kept: false,
        }
    }

    fn route(dst: &str, via: Option<&str>, onlink: bool) -> Route {
        Route {
            dst: dst.parse().unwrap(),
            gateway: via.map(|v| v.parse::<std::net::IpAddr>().unwrap()),
            oif: 3,
            onlink,
            nhid: None,
        }
    }

    #[test]
    fn each_backends_route_shape_is_recognised() {
        let s = scope(&["flannel-wg"]);
        let cases = [
            (
                route("10.5.2.0/24", Some("10.200.0.2"), false),
                "eth0",
                BackendKind::HostGw,
            ),
            (
                route("10.5.2.0/24", Some("10.5.2.0"), true),
                "flannel.1",
                BackendKind::Vxlan,
            ),
            (
                route("10.5.2.0/24", Some("10.5.2.0"), true),
                "flannel.7",
                BackendKind::Vxlan,
            ),
            (
                route("10.5.2.0/24", Some("10.200.0.2"), true),
                "flannel.ipip",
                BackendKind::Ipip,
            ),
            (
                route("10.5.0.0/16", None, false),
                "flannel0",
                BackendKind::Udp,
            ),
            (
                route("10.5.0.0/16", None, false),
                "twill0",
                BackendKind::Udp,
            ),
        ];
        for (r, dev, want) in cases {
            assert_eq!(s.stale_shape(&r, dev), Some(want), "{}", describe(&r, dev));
        }
        let wg = route("10.5.0.0/16", None, false);
        assert_eq!(
            scope(&["twill0"]).stale_shape(&wg, "flannel-wg"),
            Some(BackendKind::Wireguard)
        );
    }

    #[test]
    fn a_dual_stack_nodes_ipv6_leftovers_are_swept_and_the_rest_left_alone() {
        let s = scope(&["flannel-wg"]);
        let host_gw = route("fd10:0:0:2::/64", Some("fd00:200::2"), false);
        assert_eq!(s.stale_shape(&host_gw, "eth0"), Some(BackendKind::HostGw));
        let vxlan = route("fd10:0:0:2::/64", Some("fd10:0:0:2::"), true);
        assert_eq!(
            s.stale_shape(&vxlan, "flannel-v6.1"),
            Some(BackendKind::Vxlan)
        );
        let left_alone = [
            // Our own IPv6 subnet, outside IPv6Network, or the running backend's.
            (route("fd10:0:0:1::/64", Some("fd00:200::9"), false), "eth0"),
            (route("fd99:0:0:2::/64", Some("fd00:200::2"), false), "eth0"),
            (
                route("fd10:0:0:2::/64", Some("fd10:0:0:2::"), true),
                "flannel-v6x.1",
            ),
        ];
        for (r, dev) in left_alone {
            assert_eq!(s.stale_shape(&r, dev), None, "{}", describe(&r, dev));
        }
        assert_eq!(
            scope(&["flannel-v6.1"]).stale_shape(&vxlan, "flannel-v6.1"),
            None
        );
        let ipv4_only = Scope {
            ipv6: None,
            ..scope(&["flannel-wg"])
        };
        assert_eq!(ipv4_only.stale_shape(&host_gw, "eth0"), None);
        // An IPv6-only node has no IPv4 network: no IPv4 route is its to sweep.
        let ipv6_only = Scope {
            ipv4: None,
            ..scope(&["flannel-v6.1"])
        };
        let ipv4_peer = route("10.5.2.0/24", Some("10.200.0.2"), false);
        assert_eq!(ipv6_only.stale_shape(&ipv4_peer, "eth0"), None);
        assert_eq!(
            scope(&["flannel-v6.1"]).stale_shape(&ipv4_peer, "eth0"),
            Some(BackendKind::HostGw)
        );
    }

    #[test]
    fn the_running_backends_own_routes_are_kept() {
        let s = scope(&["flannel-wg"]);
        assert_eq!(
            s.stale_shape(&route("10.5.0.0/16", None, false), "flannel-wg"),
            None
        );
        let host_gw = scope(&["eth0"]);
        let r = route("10.5.2.0/24", Some("10.200.0.2"), false);
        assert_eq!(host_gw.stale_shape(&r, "eth0"), None);
    }

    #[test]
    fn routes_outside_the_shapes_the_network_or_in_our_subnet_are_left_alone() {
        let s = scope(&["flannel-wg"]);
        let left_alone = [
            // Our own subnet: a container bridge or veth route.
            (route("10.5.1.0/24", None, false), "cni0"),
            (route("10.5.1.0/24", Some("10.200.0.9"), false), "eth0"),
            (route("10.5.1.16/28", None, false), "veth0"),
            // Outside the network.
            (route("10.6.2.0/24", Some("10.200.0.2"), false), "eth0"),
            (route("10.0.0.0/8", None, false), "twill0"),
            // Inside it, but on a device no flannel backend uses, or not in a backend's form.
            (route("10.5.2.0/24", Some("10.200.0.2"), false), "eth1"),
            (route("10.5.2.0/24", None, false), "eth0"),
            (route("10.5.0.0/16", Some("10.200.0.254"), false), "eth0"),
            (route("10.5.2.0/24", Some("10.5.2.0"), true), "flannelx.1"),
            (route("10.5.2.0/24", Some("10.5.9.0"), true), "flannel.1"),
            (route("10.5.2.0/24", None, false), "flannel-wg"),
            (route("10.5.0.0/16", None, false), "tun7"),
        ];
        for (r, dev) in left_alone {
            assert_eq!(s.stale_shape(&r, dev), None, "{}", describe(&r, dev));
        }
    }

    #[test]
    fn only_other_backends_kernel_tunnels_are_foreign() {
        let link = |name: &str, kind| Link {
            index: 5,
            name: name.into(),
            mtu: 1450,
            mac: None,
            kind,
            up: true,
        };
        let vxlan = || LinkKind::Vxlan(VxlanParams::default());
        let s = scope(&["flannel-wg"]);
        assert!(s.foreign_tunnel(&link("flannel.1", vxlan())));
        assert!(s.foreign_tunnel(&link("flannel-v6.1", vxlan())));
        assert!(s.foreign_tunnel(&link("flannel.ipip", LinkKind::Ipip(Default::default()))));
        let kernel_wg = LinkKind::Other(Some(InfoKind::Wireguard));
        assert!(scope(&["twill0"]).foreign_tunnel(&link("flannel-wg", kernel_wg.clone())));
        assert!(!s.foreign_tunnel(&link("flannel-wg", kernel_wg)));
        assert!(!scope(&["flannel.1"]).foreign_tunnel(&link("flannel.1", vxlan())));
        assert!(!s.foreign_tunnel(&link("vxlan0", vxlan())));
        let tun = LinkKind::Tun { held: true };
        assert!(!scope(&["twill0"]).foreign_tunnel(&link("flannel-wg", tun)));
    }
}
