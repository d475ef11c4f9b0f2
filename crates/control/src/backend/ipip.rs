//! flannel's `ipip` backend: the kernel's IPIP tunnel `flannel.ipip` and one onlink route per peer.
//!
//! Needs the kernel's ipip module (CONFIG_NET_IPIP). Without it the kernel refuses the link type
//! with EOPNOTSUPP, and [`IpipDevice::ensure`] says so in one line that names the missing option
//! and the backends that work without it. The device is made before the lease, like vxlan's, so
//! a node that can't run ipip fails before it claims a subnet.

use anyhow::Context;
use tracing::{info, warn};

use super::kernel::{KernelBackend, KernelConfig, PeerPlan, PeerState};
use super::tunnel::{ensure_mtu, Tunnel, TunnelRoutes};
use super::Setup;
use crate::host::netlink::{ipip_link_message, IpipParams, Link, LinkKind, Netlink, Route};
use crate::host::uplink::connect;
use crate::lease::{Lease, LeaseAttrs, PublicAddrs};
use ipnet::Ipv4Net;

/// flanneld's name; not `tunl0`, which the ipip module creates by itself and users may rely on.
pub const DEVICE: &str = "flannel.ipip";

/// The outer IPv4 header.
const ENCAP_OVERHEAD: u32 = 20;

pub type IpipBackend = KernelBackend<IpipPlan>;

/// `flannel.ipip`, created or reused, before our lease exists.
pub struct IpipDevice {
    tunnel: Tunnel,
}

impl IpipDevice {
    pub async fn ensure(config: &KernelConfig) -> anyhow::Result<IpipDevice> {
        let (nl, uplink) = connect(&config.iface).await?;
        let want = wanted(uplink.ipv4(&config.iface)?);
        let mtu = uplink.mtu.checked_sub(ENCAP_OVERHEAD).filter(|&m| m > 0);
        let mtu = mtu.with_context(|| {
            format!(
                "MTU {} of {} is too small for ipip",
                uplink.mtu, config.iface
            )
        })?;
        let link = ensure_link(&nl, &want, mtu).await?;
        let tunnel = Tunnel {
            nl,
            link: Some(link),
            link6: None,
            uplink,
            config: config.clone(),
        };
        Ok(IpipDevice { tunnel })
    }
}

impl Setup for IpipDevice {
    type Backend = IpipBackend;

    fn lease_attrs(&self, public_addrs: PublicAddrs) -> LeaseAttrs {
        LeaseAttrs::ipip(public_addrs)
    }

    /// Finishes the device for our lease (its /32 address, up) and returns the backend.
    async fn attach(self, lease: &Lease) -> anyhow::Result<IpipBackend> {
        self.tunnel.attach(lease, IpipPlan).await
    }
}

/// What an ipip peer needs: `<subnet> via <PublicIP> dev flannel.ipip onlink`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpipPlan(TunnelRoutes);

impl PeerPlan for IpipPlan {
    fn peer_state(&self, lease: &Lease) -> anyhow::Result<PeerState> {
        let (subnet, public_ip) = lease.ipv4_side()?;
        let tunnelled = Route {
            dst: subnet.into(),
            gateway: Some(public_ip.into()),
            oif: self.0.dev()?,
            onlink: true,
            nhid: None,
        };
        let direct = self.0.direct(lease);
        Ok(PeerState::route_only(direct.unwrap_or(tunnelled)))
    }
}

/// `local <iface ip>` and no remote: one device serves every peer, the route picks the far end.
fn wanted(local: Ipv4Net) -> IpipParams {
    IpipParams {
        local: Some(local.addr()),
        remote: None,
    }
}

async fn ensure_link(nl: &Netlink, want: &IpipParams, mtu: u32) -> anyhow::Result<Link> {
    if let Some(have) = nl.link_by_name(DEVICE).await? {
        match &have.kind {
            LinkKind::Ipip(params) if params == want => {
                info!(device = DEVICE, "reusing existing IPIP device");
                return ensure_mtu(nl, have, mtu).await;
            }
            LinkKind::Ipip(params) => {
                warn!(
                    device = DEVICE,
                    "exists with {params:?}, want {want:?}; recreating device"
                );
                nl.delete_link(have.index)
                    .await
                    .with_context(|| format!("deleting {DEVICE}"))?;
            }
            // Not ours to delete: flanneld asks the user to remove it, and so does twill.
            other => anyhow::bail!(
                "{DEVICE} exists but is not an ipip device ({other:?}); remove it and try again"
            ),
        }
    }
    create(nl, want, mtu).await
}

async fn create(nl: &Netlink, want: &IpipParams, mtu: u32) -> anyhow::Result<Link> {
    match nl.create_link(ipip_link_message(DEVICE, want, mtu)).await {
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => return Err(unsupported()),
        other => other.with_context(|| format!("creating IPIP device {DEVICE}"))?,
    }
    Ok(nl.created_link(DEVICE).await?)
}

/// The one line an operator sees on a kernel without ipip.
fn unsupported() -> anyhow::Error {
    anyhow::anyhow!(
        "ipip backend: this kernel has no IPIP tunnel support (CONFIG_NET_IPIP, module ipip), \
         so {DEVICE} cannot be created; use a backend that works here: udp, batch, vxlan or host-gw"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::peer_state::route_via;
    use crate::backend::peer_state::tests::lease;
    use crate::backend::tunnel::tests::routes;
    use crate::host::netlink::parse_link;
    use crate::host::uplink::tests::uplink;
    use std::net::Ipv4Addr;

    fn plan(direct_routing: bool) -> IpipPlan {
        IpipPlan(routes(direct_routing))
    }

    #[test]
    fn device_message_is_flannels_ipip_tunnel() {
        let link = parse_link(ipip_link_message(
            DEVICE,
            &wanted(uplink().addr.unwrap()),
            1480,
        ));
        assert_eq!((link.name.as_str(), link.mtu), ("flannel.ipip", 1480));
        let params = IpipParams {
            local: Some(Ipv4Addr::new(10, 200, 0, 1)),
            remote: None,
        };
        assert_eq!(link.kind, LinkKind::Ipip(params));
    }

    #[test]
    fn peer_gets_an_onlink_route_via_its_public_ip() {
        let l = lease("10.5.2.0/24", "10.200.0.2", Some("ipip"));
        let route = Route {
            dst: l.subnets.v4().unwrap().into(),
            gateway: Some(l.public_addrs.v4().unwrap().into()),
            oif: 7,
            onlink: true,
            nhid: None,
        };
        assert_eq!(
            plan(false).peer_state(&l).unwrap(),
            PeerState::route_only(route)
        );
    }

    #[test]
    fn direct_routing_skips_the_tunnel_for_same_segment_peers() {
        let near = lease("10.5.2.0/24", "10.200.0.2", Some("ipip"));
        let far = lease("10.5.3.0/24", "192.168.1.3", Some("ipip"));
        let direct = PeerState::route_only(route_via(&uplink(), &near).unwrap());
        assert_eq!(plan(true).peer_state(&near).unwrap(), direct);
        assert_eq!(plan(true).peer_state(&far).unwrap().route.oif, 7);
    }

    #[test]
    fn missing_module_error_is_one_line_naming_the_option_and_alternatives() {
        let msg = unsupported().to_string();
        assert!(!msg.contains('\n'), "{msg}");
        for needle in ["CONFIG_NET_IPIP", "udp", "batch", "vxlan", "host-gw"] {
            assert!(msg.contains(needle), "{needle} missing from {msg}");
        }
    }
}
