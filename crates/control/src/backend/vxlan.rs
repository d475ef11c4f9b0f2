//! flannel's `vxlan` backend: the kernel's VXLAN device `flannel.<VNI>`, and per peer a permanent
//! neighbour, an fdb entry and an onlink route. On a dual-stack node the same again for IPv6 on
//! a second device, `flannel-v6.<VNI>`, tunnelling over the underlay's IPv6: its MAC goes in the
//! lease's BackendV6Data, its entries point at the peers' PublicIPv6. On an IPv6-only network
//! (`EnableIPv4` false) `flannel-v6.<VNI>` is the only device, and the lease has no
//! BackendData, as flanneld writes it.
//!
//! The device comes first and the lease second, as in flanneld: the lease's BackendData carries
//! the device's MAC (VtepMAC), so the device must exist before the lease is written.
//! [`VxlanDevice::ensure`] creates (or reuses) it, [`VxlanDevice::backend_data`] is what goes into
//! the lease, and [`VxlanDevice::attach`] finishes the setup once the lease is known.

use anyhow::Context;
use serde_json::json;
use tracing::{info, warn};

use super::kernel::{KernelBackend, KernelConfig, PeerPlan, PeerState};
use super::tunnel::{ensure_mtu, Tunnel, TunnelRoutes};
use super::Setup;
use crate::backend_kind::{BackendKind, KERNEL_VXLAN_PORT};
use crate::config::BackendConfig;
use crate::host::netlink::{
    vxlan_link_message, FdbEntry, Link, LinkKind, MacAddr, Neighbour, Netlink, Route, VxlanParams,
};
use crate::host::uplink::connect;
use crate::host::Interface;
use crate::lease::{BackendData, Lease, LeaseAttrs, PublicAddrs};
use crate::node::Node;
use ipnet::IpNet;
use std::net::IpAddr;

/// IPv4 (20) + UDP (8) + VXLAN (8) + inner Ethernet (14).
const ENCAP_OVERHEAD: u32 = 50;
/// IPv6 (40) + UDP (8) + VXLAN (8) + inner Ethernet (14): `flannel-v6.<VNI>` over IPv6.
const ENCAP_OVERHEAD_V6: u32 = 70;

/// The VXLAN part of flannel's `Backend` config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VxlanConfig {
    /// `VNI`, default 1.
    pub vni: u32,
    /// `Port`; 0 (the default) leaves it to the kernel, which uses 8472.
    pub port: u16,
    /// `GBP`: VXLAN's group-based policy extension (the kernel's `gbp` flag), default off.
    pub gbp: bool,
    /// `Learning`: the kernel learns fdb entries from what arrives, default off (flannel
    /// writes every peer's entry itself).
    pub learning: bool,
    /// `MTU`: the MTU the devices are made from, in flannel's sense (the underlay's, of which
    /// the encapsulation takes its share); the underlay interface's when absent.
    pub mtu: Option<u32>,
}

/// The smallest `MTU` a vxlan network can have: IPv4's minimum MTU after the encapsulation.
const MIN_MTU: u32 = 68 + ENCAP_OVERHEAD_V6;

impl VxlanConfig {
    /// The `VNI` of the node's network config, flannel's 1 when absent.
    pub fn vni(node: &Node) -> u32 {
        node.config
            .backend
            .vni
            .unwrap_or(VxlanConfig::default().vni)
    }

    /// The node's network config's, with flannel's defaults for what it leaves out.
    pub fn of(node: &Node) -> anyhow::Result<VxlanConfig> {
        VxlanConfig::read(&node.config.backend, &node.iface)
    }

    /// `backend`'s, for a node on `iface`.
    fn read(backend: &BackendConfig, iface: &Interface) -> anyhow::Result<VxlanConfig> {
        let defaults = VxlanConfig::default();
        let flag = |name: &str| match crate::config::field_of(&backend.raw, name) {
            None | Some(serde_json::Value::Null) => Ok(false),
            Some(serde_json::Value::Bool(on)) => Ok(*on),
            Some(other) => Err(anyhow::anyhow!(
                "invalid network config: Backend.{name} must be true or false, got {other}"
            )),
        };
        let mtu = backend.mtu;
        if let Some(mtu) = mtu.filter(|&m| m < MIN_MTU) {
            anyhow::bail!(
                "invalid network config: Backend.MTU {mtu} leaves no room for a packet after \
                 vxlan's encapsulation (at least {MIN_MTU})"
            );
        }
        if let Some(mtu) = mtu.filter(|&m| m > iface.mtu) {
            warn!(
                "Backend.MTU {mtu} is more than {}'s MTU {}: packets that size cannot cross \
                 the underlay",
                iface.name, iface.mtu
            );
        }
        Ok(VxlanConfig {
            vni: backend.vni.unwrap_or(defaults.vni),
            port: backend.port.unwrap_or(defaults.port),
            gbp: flag("GBP")?,
            learning: flag("Learning")?,
            mtu,
        })
    }
}

impl Default for VxlanConfig {
    fn default() -> Self {
        VxlanConfig {
            vni: 1,
            port: 0,
            gbp: false,
            learning: false,
            mtu: None,
        }
    }
}

/// The VtepMACs this node published before (the registry remembers them): devices made again
/// take them, so the peers' fdb and neighbour entries for us stay right across a restart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VtepMacs {
    pub v4: Option<MacAddr>,
    pub v6: Option<MacAddr>,
}

pub type VxlanBackend = KernelBackend<VxlanPlan>;

/// `flannel.<VNI>` (and `flannel-v6.<VNI>` on a dual-stack node), created or reused, before
/// our lease exists.
pub struct VxlanDevice {
    tunnel: Tunnel,
    /// `flannel.<VNI>`'s MAC; `None` on an IPv6-only node, which has no such device.
    mac: Option<MacAddr>,
    /// `flannel-v6.<VNI>`'s MAC, on a dual-stack node.
    mac6: Option<MacAddr>,
    vni: u32,
}

impl VxlanDevice {
    /// Creates `flannel.<VNI>` on `config.iface`, or reuses an existing one whose settings
    /// match (recreating it otherwise, as flanneld does); on a dual-stack node `flannel-v6.<VNI>`
    /// too, from our PublicIPv6.
    pub async fn ensure(
        config: &KernelConfig,
        vxlan: VxlanConfig,
        macs: VtepMacs,
    ) -> anyhow::Result<VxlanDevice> {
        let (nl, uplink) = connect(&config.iface).await?;
        let mtu = vxlan.mtu.unwrap_or(uplink.mtu);
        let device = |name: String, local: IpAddr, overhead: u32, mac| VxlanLink {
            want: VxlanParams {
                vni: vxlan.vni,
                local: Some(local),
                dev: Some(uplink.index),
                port: vxlan.port,
                learning: vxlan.learning,
                gbp: vxlan.gbp,
            },
            name,
            mtu: mtu.saturating_sub(overhead),
            mac,
        };
        let (link, mac) = match config.network {
            Some(_) => {
                let name = format!("flannel.{}", vxlan.vni);
                let local = uplink.ipv4(&config.iface)?;
                let v4 = device(name, local.addr().into(), ENCAP_OVERHEAD, macs.v4);
                let (link, mac) = v4.ensure(&nl).await?;
                (Some(link), Some(mac))
            }
            None => (None, None),
        };
        let (link6, mac6) = match config.ipv6 {
            Some(v6) => {
                let name = format!("flannel-v6.{}", vxlan.vni);
                let v6 = device(name, v6.public_ip.into(), ENCAP_OVERHEAD_V6, macs.v6);
                let (link6, mac6) = v6.ensure(&nl).await?;
                refuse_router_advertisements(&link6.name);
                (Some(link6), Some(mac6))
            }
            None => (None, None),
        };
        let tunnel = Tunnel {
            nl,
            link,
            link6,
            uplink,
            config: config.clone(),
        };
        Ok(VxlanDevice {
            tunnel,
            mac,
            mac6,
            vni: vxlan.vni,
        })
    }

    /// The VtepMAC peers put in their fdb for us; `None` on an IPv6-only node.
    pub fn mac(&self) -> Option<MacAddr> {
        self.mac
    }
}

impl Setup for VxlanDevice {
    type Backend = VxlanBackend;

    fn lease_attrs(&self, public_addrs: PublicAddrs) -> LeaseAttrs {
        let attrs = match self.mac {
            Some(mac) => LeaseAttrs::vxlan(public_addrs, self.vni, &mac.to_string()),
            None => LeaseAttrs::typed(public_addrs, BackendKind::Vxlan.lease_type(), None),
        };
        match (self.tunnel.config.ipv6, self.mac6) {
            (Some(v6), Some(mac6)) => {
                attrs.with_ipv6(v6.public_ip, Some(backend_data(self.vni, mac6).into()))
            }
            _ => attrs,
        }
    }

    /// Finishes the device for our lease (its /32 address, up) and returns the backend.
    async fn attach(self, lease: &Lease) -> anyhow::Result<VxlanBackend> {
        self.tunnel.attach(lease, VxlanPlan).await
    }
}

/// What a vxlan peer needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanPlan(TunnelRoutes);

impl PeerPlan for VxlanPlan {
    fn peer_state(&self, lease: &Lease) -> anyhow::Result<PeerState> {
        if let Some(route) = self.0.direct(lease) {
            return Ok(PeerState::route_only(route));
        }
        let mac = vtep_mac(lease.backend_data.as_ref(), "BackendData")?;
        let (subnet, public_ip) = lease.ipv4_side()?;
        Ok(tunnelled(
            subnet.into(),
            public_ip.into(),
            mac,
            self.0.dev()?,
        ))
    }

    /// The same over `flannel-v6.<VNI>`: the IPv6 subnet's network address behind the peer's
    /// IPv6 VtepMAC, tunnelled to its PublicIPv6.
    fn peer_state_v6(&self, lease: &Lease) -> anyhow::Result<Option<PeerState>> {
        let (Some(dev6), Some((subnet, public_ip))) = (self.0.dev6, lease.ipv6_side()) else {
            return Ok(None);
        };
        if let Some(route) = self.0.direct6(lease) {
            return Ok(Some(PeerState::route_only(route)));
        }
        let mac = vtep_mac(lease.backend_v6_data.as_ref(), "BackendV6Data")?;
        Ok(Some(tunnelled(subnet.into(), public_ip.into(), mac, dev6)))
    }
}

/// A peer behind a vxlan device: `<subnet> via <subnet's network address> dev <dev> onlink`,
/// that address's neighbour entry with the peer's VtepMAC, and the fdb entry that sends
/// frames for that MAC to the peer's public address.
fn tunnelled(subnet: IpNet, public_ip: IpAddr, mac: MacAddr, dev: u32) -> PeerState {
    let gateway = subnet.network();
    PeerState {
        neighbour: Some(Neighbour { ip: gateway, mac }),
        fdb: Some(FdbEntry {
            mac,
            dst: public_ip,
        }),
        nexthop: None,
        route: Route {
            dst: subnet,
            gateway: Some(gateway),
            oif: dev,
            onlink: true,
            nhid: None,
        },
    }
}

fn backend_data(vni: u32, mac: MacAddr) -> serde_json::Value {
    json!({ "VNI": vni, "VtepMAC": mac.to_string() })
}

/// `VtepMAC` of a lease's BackendData or BackendV6Data (`field` names which, for the error).
fn vtep_mac(data: Option<&BackendData>, field: &str) -> anyhow::Result<MacAddr> {
    let mac = data.and_then(|d| d.get("VtepMAC"));
    let mac = mac.with_context(|| format!("lease has no {field}.VtepMAC"))?;
    let mac = mac
        .as_str()
        .with_context(|| format!("{field}.VtepMAC is not a string"))?;
    mac.parse().map_err(anyhow::Error::msg)
}

/// A vxlan device to create or reuse.
struct VxlanLink {
    name: String,
    want: VxlanParams,
    mtu: u32,
    /// The MAC a device made now takes: the one published before, else a random one.
    mac: Option<MacAddr>,
}

impl VxlanLink {
    async fn ensure(&self, nl: &Netlink) -> anyhow::Result<(Link, MacAddr)> {
        let link = ensure_link(nl, &self.name, &self.want, self.mtu, self.mac).await?;
        let mac = link
            .mac
            .with_context(|| format!("{} has no MAC address", self.name))?;
        Ok((link, mac))
    }
}

/// flanneld sets accept_ra 0 on its IPv6 device: a router advertisement arriving through the
/// tunnel must not give the host addresses or routes. A kernel without the knob has no RAs.
fn refuse_router_advertisements(device: &str) {
    let knob = format!("/proc/sys/net/ipv6/conf/{device}/accept_ra");
    if let Err(e) = std::fs::write(&knob, "0") {
        warn!("cannot turn off router advertisements on {device} ({knob}): {e}");
    }
}

async fn ensure_link(
    nl: &Netlink,
    name: &str,
    want: &VxlanParams,
    mtu: u32,
    mac: Option<MacAddr>,
) -> anyhow::Result<Link> {
    if let Some(have) = nl.link_by_name(name).await? {
        let Some(reason) = incompatibility(&have, want) else {
            info!(device = name, "reusing existing VXLAN device");
            return ensure_mtu(nl, have, mtu).await;
        };
        warn!(
            device = name,
            "exists with incompatible configuration: {reason}; recreating device"
        );
        nl.delete_link(have.index)
            .await
            .with_context(|| format!("deleting {name}"))?;
    }
    if let Some(mac) = mac {
        info!(
            device = name,
            "made with the VtepMAC {mac} this node published before"
        );
    }
    let msg = vxlan_link_message(name, want, mtu, mac.unwrap_or_else(MacAddr::random));
    nl.create_link(msg)
        .await
        .with_context(|| format!("creating VXLAN device {name}"))?;
    Ok(nl.created_link(name).await?)
}

/// Why an existing device can't be reused, or `None` if it can. flanneld compares type, VNI,
/// underlay device, local address and port; twill also insists on nolearning (a learning device
/// would fill the fdb with entries reconcile does not own) and compares the effective port, so a
/// device on 4789 isn't mistaken for the default 8472.
fn incompatibility(have: &Link, want: &VxlanParams) -> Option<String> {
    let LinkKind::Vxlan(have) = &have.kind else {
        return Some(format!("not a vxlan device ({:?})", have.kind));
    };
    let port = |p: u16| if p == 0 { KERNEL_VXLAN_PORT } else { p };
    let checks = [
        (
            have.vni != want.vni,
            "vni",
            format!("{} vs {}", have.vni, want.vni),
        ),
        (
            have.dev != want.dev,
            "underlay device",
            format!("{:?} vs {:?}", have.dev, want.dev),
        ),
        (
            have.local != want.local,
            "local IP",
            format!("{:?} vs {:?}", have.local, want.local),
        ),
        (
            port(have.port) != port(want.port),
            "port",
            format!("{} vs {}", port(have.port), port(want.port)),
        ),
        (
            have.learning != want.learning,
            "learning",
            format!("{} vs {}", have.learning, want.learning),
        ),
        (
            have.gbp != want.gbp,
            "gbp",
            format!("{} vs {}", have.gbp, want.gbp),
        ),
    ];
    let mut mismatches = checks.into_iter().filter(|(differs, ..)| *differs);
    mismatches
        .next()
        .map(|(_, what, values)| format!("{what}: {values}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::peer_state::route_via;
    use crate::backend::peer_state::tests::lease;
    use crate::backend::tunnel::tests::routes;
    use crate::host::uplink::tests::uplink;
    use std::net::Ipv4Addr;

    fn plan(direct_routing: bool) -> VxlanPlan {
        VxlanPlan(routes(direct_routing))
    }

    fn vxlan_lease(subnet: &str, public_ip: &str, mac: &str) -> Lease {
        let mut l = lease(subnet, public_ip, Some("vxlan"));
        l.backend_data = Some(json!({ "VNI": 1, "VtepMAC": mac }).into());
        l
    }

    #[test]
    fn peer_gets_neighbour_fdb_and_onlink_route() {
        let l = vxlan_lease("10.5.2.0/24", "10.200.0.2", "d6:60:f1:85:5a:fc");
        let mac: MacAddr = "d6:60:f1:85:5a:fc".parse().unwrap();
        let state = plan(false).peer_state(&l).unwrap();
        let net_addr = Ipv4Addr::new(10, 5, 2, 0);
        assert_eq!(
            state.neighbour,
            Some(Neighbour {
                ip: net_addr.into(),
                mac
            })
        );
        assert_eq!(
            state.fdb,
            Some(FdbEntry {
                mac,
                dst: l.public_addrs.v4().unwrap().into()
            })
        );
        let route = Route {
            dst: l.subnets.v4().unwrap().into(),
            gateway: Some(net_addr.into()),
            oif: 7,
            onlink: true,
            nhid: None,
        };
        assert_eq!(state.route, route);
    }

    #[test]
    fn direct_routing_uses_a_plain_route_for_same_segment_peers_only() {
        let near = vxlan_lease("10.5.2.0/24", "10.200.0.2", "d6:60:f1:85:5a:fc");
        let far = vxlan_lease("10.5.3.0/24", "192.168.1.3", "d6:60:f1:85:5a:fd");
        let state = plan(true).peer_state(&near).unwrap();
        assert_eq!(
            state,
            PeerState::route_only(route_via(&uplink(), &near).unwrap())
        );
        let state = plan(true).peer_state(&far).unwrap();
        assert!(state.fdb.is_some() && state.route.onlink);
    }

    #[test]
    fn lease_without_vtep_mac_is_refused() {
        let l = lease("10.5.2.0/24", "10.200.0.2", Some("vxlan"));
        let err = plan(false).peer_state(&l).unwrap_err();
        assert!(err.to_string().contains("VtepMAC"), "{err}");
    }

    #[test]
    fn gbp_learning_and_mtu_are_read_and_checked() {
        let eth0 = Interface {
            name: "eth0".into(),
            address: Some(Ipv4Addr::new(10, 200, 0, 1)),
            ipv6: None,
            mtu: 1500,
        };
        let read = |backend: &str| {
            let json = format!(r#"{{"Network":"10.5.0.0/16","Backend":{backend}}}"#);
            let config = crate::config::Config::parse(&json).unwrap();
            VxlanConfig::read(&config.backend, &eth0).map_err(|e| e.to_string())
        };
        let c = read(r#"{"Type":"vxlan","GBP":true,"learning":true,"MTU":1400,"VNI":4}"#).unwrap();
        assert_eq!(
            (c.vni, c.gbp, c.learning, c.mtu),
            (4, true, true, Some(1400))
        );
        assert_eq!(read(r#"{"Type":"vxlan"}"#), Ok(VxlanConfig::default()));
        let err = read(r#"{"Type":"vxlan","GBP":"yes"}"#).unwrap_err();
        assert!(err.contains("Backend.GBP must be true or false"), "{err}");
        let err = read(r#"{"Type":"vxlan","MTU":100}"#).unwrap_err();
        assert!(err.contains("Backend.MTU 100"), "{err}");
    }

    #[test]
    fn existing_device_is_reused_only_when_settings_match() {
        let want = VxlanParams {
            vni: 1,
            local: Some(Ipv4Addr::new(10, 200, 0, 1).into()),
            dev: Some(2),
            port: 0,
            learning: false,
            gbp: false,
        };
        let link = |p: VxlanParams| Link {
            index: 9,
            name: "flannel.1".into(),
            mtu: 1450,
            mac: None,
            kind: LinkKind::Vxlan(p),
            up: true,
        };
        let reported = VxlanParams {
            port: 8472,
            ..want.clone()
        };
        assert_eq!(incompatibility(&link(reported.clone()), &want), None);
        let other_port = VxlanParams {
            port: 4789,
            ..want.clone()
        };
        assert!(incompatibility(&link(other_port), &want)
            .unwrap()
            .contains("port"));
        let learning = VxlanParams {
            learning: true,
            ..reported.clone()
        };
        assert!(incompatibility(&link(learning), &want)
            .unwrap()
            .contains("learning"));
        let gbp = VxlanParams {
            gbp: true,
            ..reported.clone()
        };
        assert!(incompatibility(&link(gbp), &want).unwrap().contains("gbp"));
        let other_vni = VxlanParams { vni: 2, ..reported };
        assert!(incompatibility(&link(other_vni), &want)
            .unwrap()
            .contains("vni"));
        let not_vxlan = Link {
            kind: LinkKind::Other(None),
            ..link(want.clone())
        };
        assert!(incompatibility(&not_vxlan, &want).is_some());
    }

    #[test]
    fn backend_data_matches_flannels_json() {
        let mac: MacAddr = "d6:60:f1:85:5a:fc".parse().unwrap();
        assert_eq!(
            backend_data(1, mac).to_string(),
            r#"{"VNI":1,"VtepMAC":"d6:60:f1:85:5a:fc"}"#
        );
    }
}
