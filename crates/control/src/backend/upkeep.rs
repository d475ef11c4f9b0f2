//! What the daemon keeps in order besides the peers, whichever backend runs: the backend's
//! devices ([`DeviceGuard`]) and the routes and devices other backends left ([`Sweep`]).
//!
//! At start and at every reconcile the device is repaired first (so that the backend's own
//! reconcile can program routes through it) and the sweep runs last. Between reconciles the
//! kernel's notices about the device trigger a check at once.

use std::time::Duration;

use anyhow::Context;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use tracing::warn;

use super::guard::{DeviceGuard, DeviceSpec, MtuCeiling};
use super::ipip;
use super::sweep::{Scope, Sweep};
use super::vxlan::VxlanConfig;
use super::wireguard;
use crate::backend_kind::BackendKind;
use crate::config::wireguard::{Mode, WireguardConfig};
use crate::host::netlink::{Groups, Netlink, Watch};
use crate::lease::Lease;
use crate::node::Node;
use crate::status::NodeStatus;

/// Where a backend's traffic goes, as far as upkeep cares.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layout {
    /// The backend's own device; host-gw has none, nor has vxlan on an IPv6-only node.
    device: Option<String>,
    /// The IPv6 device of vxlan, or of wireguard's Mode separate, on a dual-stack node, and of
    /// vxlan on an IPv6-only one.
    device6: Option<String>,
    /// Whether the devices carry the route for the whole network (the TUN backends and
    /// wireguard) rather than one route per peer (vxlan, ipip). The IPv6Network's route goes
    /// into the IPv6 device where there is one, else into the device.
    network_route: bool,
    /// Devices whose routes the backend programs and reconciles itself.
    keep: Vec<String>,
}

fn layout(node: &Node) -> Layout {
    let vni = VxlanConfig::vni(node);
    let names = Names {
        vxlan: node.config.ipv4.is_some().then(|| format!("flannel.{vni}")),
        vxlan6: node
            .config
            .ipv6
            .is_some()
            .then(|| format!("flannel-v6.{vni}")),
        wireguard6: wireguard6(node),
        tun: node.options.tun_name.clone(),
        underlay: node.iface.name.clone(),
    };
    names.layout(node.config.backend.kind())
}

/// `flannel-wg-v6`, made by wireguard's Mode separate on a dual-stack node.
fn wireguard6(node: &Node) -> Option<String> {
    let mode = WireguardConfig::parse(&node.config.backend).map(|c| c.mode);
    let separate = node.config.ipv6.is_some() && mode == Ok(Mode::Separate);
    separate.then(|| wireguard::DEVICE_V6.to_string())
}

/// The devices a node's backends would use.
struct Names {
    /// `flannel.<VNI>`, on a node with IPv4.
    vxlan: Option<String>,
    /// `flannel-v6.<VNI>`, on a node with IPv6.
    vxlan6: Option<String>,
    /// `flannel-wg-v6`, on a dual-stack node of wireguard's Mode separate.
    wireguard6: Option<String>,
    /// `--tun-name`.
    tun: String,
    underlay: String,
}

impl Names {
    fn layout(self, backend: Option<BackendKind>) -> Layout {
        let tunnel = |dev: Option<String>, dev6: Option<String>| Layout {
            device: dev.clone(),
            device6: dev6.clone(),
            network_route: false,
            keep: dev
                .into_iter()
                .chain([self.underlay.clone()])
                .chain(dev6)
                .collect(),
        };
        let whole_network = |dev: String, dev6: Option<String>| Layout {
            device: Some(dev.clone()),
            device6: dev6.clone(),
            network_route: true,
            keep: std::iter::once(dev).chain(dev6).collect(),
        };
        match backend {
            Some(BackendKind::Vxlan) => tunnel(self.vxlan.clone(), self.vxlan6.clone()),
            Some(BackendKind::Ipip) => tunnel(Some(ipip::DEVICE.to_string()), None),
            Some(BackendKind::Wireguard) => {
                whole_network(wireguard::DEVICE.to_string(), self.wireguard6.clone())
            }
            Some(BackendKind::HostGw) => Layout {
                device: None,
                device6: None,
                network_route: false,
                keep: vec![self.underlay.clone()],
            },
            // The daemon refuses a type twill does not run before this.
            Some(BackendKind::Udp | BackendKind::TwillBatch) | None => {
                whole_network(self.tun.clone(), None)
            }
        }
    }
}

/// The kernel's notices about the devices; without them only the periodic reconcile repairs.
fn subscribe(specs: &[DeviceSpec]) -> Option<Watch> {
    let ipv6 = |net: &IpNet| matches!(net, IpNet::V6(_));
    let groups = Groups {
        routes: specs.iter().any(|s| !s.network_routes.is_empty()),
        ipv6: specs
            .iter()
            .any(|s| s.addresses.iter().chain(&s.network_routes).any(ipv6)),
    };
    let why = "the periodic reconcile repairs them";
    Watch::subscribe(groups)
        .inspect_err(|e| warn!("no kernel notices about the devices: {e}; {why}"))
        .ok()
}

/// The backend's device MTU, and what encapsulation adds for a device whose MTU must stay
/// within the underlay's ([`super::Backend::encapsulation_overhead`]).
#[derive(Debug, Clone, Copy)]
pub struct DeviceMtu {
    pub mtu: u32,
    pub overhead: Option<u32>,
}

/// The devices as their backend set them up. The device has the lease's network address as a
/// /32, and the IPv6 subnet's as a /128 too where it carries the IPv6Network (the TUN
/// backends, wireguard's one-device modes); an IPv6 device (vxlan's, wireguard's Mode separate)
/// has only the /128.
fn device_specs(
    layout: &Layout,
    node: &Node,
    lease: &Lease,
    DeviceMtu { mtu, overhead }: DeviceMtu,
) -> anyhow::Result<Vec<DeviceSpec>> {
    let (routes, routes6) = network_routes(layout, node);
    let own6 = match lease.subnets.v6() {
        Some(subnet) => Some(IpNet::from(Ipv6Net::new(subnet.network(), 128)?)),
        None => None,
    };
    let mut specs = Vec::new();
    if let Some(name) = layout.device.clone() {
        let subnet = lease.subnets.v4();
        let subnet =
            subnet.with_context(|| format!("{name} is made, but our lease has no IPv4 subnet"))?;
        let own = IpNet::from(Ipv4Net::new(subnet.network(), 32)?);
        let carries_ipv6 = routes.iter().any(|n| matches!(n, IpNet::V6(_)));
        specs.push(DeviceSpec {
            name,
            addresses: std::iter::once(own)
                .chain(own6.filter(|_| carries_ipv6))
                .collect(),
            mtu,
            within: overhead.map(|overhead| MtuCeiling {
                underlay: node.iface.name.clone(),
                overhead,
            }),
            network_routes: routes,
        });
    }
    if let Some(name) = layout.device6.clone() {
        let own6 =
            own6.with_context(|| format!("{name} is made, but our lease has no IPv6 subnet"))?;
        specs.push(DeviceSpec {
            name,
            addresses: vec![own6],
            mtu,
            within: None,
            network_routes: routes6,
        });
    }
    Ok(specs)
}

/// The networks routed whole into the device and into the IPv6 device: none where the backend
/// routes per peer; the IPv6Network goes into the IPv6 device where there is one.
fn network_routes(layout: &Layout, node: &Node) -> (Vec<IpNet>, Vec<IpNet>) {
    if !layout.network_route {
        return (Vec::new(), Vec::new());
    }
    let routes: Vec<IpNet> = node
        .config
        .ipv4
        .iter()
        .map(|v4| v4.network.into())
        .collect();
    match node.config.ipv6.as_ref().map(|v6| IpNet::from(v6.network)) {
        None => (routes, Vec::new()),
        Some(network6) if layout.device6.is_some() => (routes, vec![network6]),
        Some(network6) => ([routes, vec![network6]].concat(), Vec::new()),
    }
}

/// The device guard, its notices, and the sweep.
pub struct Upkeep {
    sweep: Sweep,
    guard: Option<DeviceGuard>,
    /// The kernel's notices about the device, while they come.
    watch: Option<Watch>,
}

impl Upkeep {
    /// For the backend attached to `lease`, whose device has MTU `mtu`.
    pub async fn start(
        node: &Node,
        lease: &Lease,
        mtu: DeviceMtu,
        reconcile_every: Duration,
    ) -> anyhow::Result<Upkeep> {
        let nl = Netlink::connect().context("opening rtnetlink")?;
        let layout = layout(node);
        let specs = device_specs(&layout, node, lease, mtu)?;
        let scope = Scope {
            ipv4: node
                .config
                .ipv4
                .as_ref()
                .zip(lease.subnets.v4())
                .map(|(v4, own)| (v4.network, own)),
            ipv6: node
                .config
                .ipv6
                .as_ref()
                .zip(lease.subnets.v6())
                .map(|(v6, own)| (v6.network, own)),
            underlay: node.iface.name.clone(),
            tun_name: node.options.tun_name.clone(),
            backend: node.config.backend.backend_type.clone(),
            keep: layout.keep,
            // One route per peer: a kernel backend, whose reconcile owns twill's nexthops.
            nexthops_kept: !layout.network_route,
        };
        let (guard, watch) = if specs.is_empty() {
            (None, None)
        } else {
            // Subscribed before the first check, so no change after it goes unheard.
            let watch = subscribe(&specs);
            let guard = DeviceGuard::new(nl.clone(), specs, reconcile_every).await?;
            (Some(guard), watch)
        };
        Ok(Upkeep {
            sweep: Sweep::new(nl, scope),
            guard,
            watch,
        })
    }

    /// Before the backend's reconcile: the device repaired, set up again if it was down.
    pub async fn repair(&mut self, status: &NodeStatus) {
        if let Some(guard) = &mut self.guard {
            guard.check(true, status).await;
        }
    }

    /// After the backend's reconcile: what other backends left, removed.
    pub async fn sweep(&self) {
        if let Err(e) = self.sweep.run().await {
            warn!("removing what other backends left: {e:#}");
        }
    }

    /// Resolves when the kernel reports a change to the device, its address or its route;
    /// never without a device, or once the kernel's notices stopped.
    pub async fn changed(&mut self) {
        let (Some(guard), Some(watch)) = (&self.guard, &mut self.watch) else {
            return std::future::pending().await;
        };
        while let Some(notice) = watch.next().await {
            if guard.watches(notice.index()) {
                watch.drain();
                return;
            }
        }
        warn!("the kernel's notices about the device stopped; the periodic reconcile repairs it");
        self.watch = None;
        std::future::pending().await
    }

    /// After [`Upkeep::changed`]: the device checked and repaired, except that a device set
    /// down stays down until the next reconcile. Whether it can forward, so that the backend
    /// can put back what the kernel flushed with it.
    pub async fn recheck(&mut self, status: &NodeStatus) -> bool {
        match &mut self.guard {
            Some(guard) => guard.check(false, status).await,
            None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(backend: &str) -> Layout {
        let backend = BackendKind::parse(backend);
        let names = Names {
            vxlan: Some("flannel.7".into()),
            vxlan6: None,
            wireguard6: None,
            tun: "tun9".into(),
            underlay: "ens3".into(),
        };
        names.layout(backend)
    }

    #[test]
    fn a_dual_stack_vxlan_node_keeps_both_of_its_devices() {
        let names = Names {
            vxlan: Some("flannel.7".into()),
            vxlan6: Some("flannel-v6.7".into()),
            wireguard6: None,
            tun: "tun9".into(),
            underlay: "ens3".into(),
        };
        let vxlan = names.layout(BackendKind::parse("vxlan"));
        assert_eq!(vxlan.device6.as_deref(), Some("flannel-v6.7"));
        assert_eq!(vxlan.keep, ["flannel.7", "ens3", "flannel-v6.7"]);
    }

    #[test]
    fn an_ipv6_only_vxlan_node_keeps_only_its_ipv6_device() {
        let names = Names {
            vxlan: None,
            vxlan6: Some("flannel-v6.7".into()),
            wireguard6: None,
            tun: "tun9".into(),
            underlay: "ens3".into(),
        };
        let vxlan = names.layout(BackendKind::parse("vxlan"));
        assert_eq!(vxlan.device, None);
        assert_eq!(vxlan.device6.as_deref(), Some("flannel-v6.7"));
        assert_eq!(vxlan.keep, ["ens3", "flannel-v6.7"]);
    }

    #[test]
    fn wireguard_s_mode_separate_keeps_both_devices_with_their_network_routes() {
        let names = Names {
            vxlan: Some("flannel.7".into()),
            vxlan6: None,
            wireguard6: Some("flannel-wg-v6".into()),
            tun: "tun9".into(),
            underlay: "ens3".into(),
        };
        let wireguard = names.layout(BackendKind::parse("wireguard"));
        assert_eq!(wireguard.device6.as_deref(), Some("flannel-wg-v6"));
        assert!(wireguard.network_route);
        assert_eq!(wireguard.keep, ["flannel-wg", "flannel-wg-v6"]);
    }

    #[test]
    fn each_backend_keeps_its_own_devices_routes() {
        let whole = |dev: &str| Layout {
            device: Some(dev.into()),
            device6: None,
            network_route: true,
            keep: vec![dev.into()],
        };
        assert_eq!(layout("udp"), whole("tun9"));
        assert_eq!(layout("twill-batch"), whole("tun9"));
        assert_eq!(layout("wireguard"), whole("flannel-wg"));
        // A tunnel backend also owns the direct routes on the underlay (DirectRouting).
        let vxlan = layout("vxlan");
        assert_eq!(vxlan.device.as_deref(), Some("flannel.7"));
        assert!(!vxlan.network_route);
        assert_eq!(vxlan.keep, ["flannel.7", "ens3"]);
        assert_eq!(layout("ipip").keep, ["flannel.ipip", "ens3"]);
        let host_gw = layout("host-gw");
        assert_eq!(
            (host_gw.device, host_gw.keep),
            (None, vec!["ens3".to_string()])
        );
    }
}
