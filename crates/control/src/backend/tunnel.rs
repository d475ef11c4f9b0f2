//! A tunnel backend's devices (vxlan's `flannel.<VNI>` and `flannel-v6.<VNI>`, ipip's
//! `flannel.ipip`): made before our lease exists, given their addresses once it does, and where
//! each peer's traffic goes, into a device or straight out of the iface.

use anyhow::Context;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::kernel::{KernelBackend, KernelConfig, Ours, PeerPlan};
use super::peer_state::route_via6;
use super::peer_state::{L2Links, Owned};
use crate::host::netlink::{Link, Netlink, Route};
use crate::host::uplink::{is_link_local, Uplink};
use crate::lease::Lease;

/// Leaves `addr` as the device's only address of its family (IPv6: besides the link-local one
/// the kernel gives every device): a changed lease must not leave the old one behind. Only
/// ever called on our own tunnel devices.
async fn ensure_only_address(nl: &Netlink, index: u32, addr: IpNet) -> anyhow::Result<()> {
    let existing: Vec<IpNet> = match addr {
        IpNet::V4(_) => nl
            .ipv4_addresses(index)
            .await?
            .into_iter()
            .map(IpNet::V4)
            .collect(),
        IpNet::V6(_) => nl
            .ipv6_addresses(index)
            .await?
            .into_iter()
            .map(IpNet::V6)
            .collect(),
    };
    let stale = existing.iter().filter(|a| **a != addr);
    for old in stale.filter(|a| !matches!(a, IpNet::V6(v6) if is_link_local(v6.addr()))) {
        nl.delete_address(index, *old).await?;
    }
    if !existing.contains(&addr) {
        nl.add_address(index, addr).await?;
    }
    Ok(())
}

/// Sets a reused tunnel device's MTU to what it would have been created with: the iface's MTU
/// may have changed since, and FLANNEL_MTU must match the device.
pub(crate) async fn ensure_mtu(nl: &Netlink, mut link: Link, mtu: u32) -> anyhow::Result<Link> {
    if link.mtu != mtu {
        let set = nl.set_mtu(link.index, mtu).await;
        set.with_context(|| format!("setting the MTU of {}", link.name))?;
        link.mtu = mtu;
    }
    Ok(link)
}

/// A backend's tunnel device (`flannel.<VNI>`, `flannel.ipip`), made before our lease exists;
/// on a dual-stack vxlan node also its IPv6 device (`flannel-v6.<VNI>`), which is the only one
/// on an IPv6-only node.
pub(crate) struct Tunnel {
    pub nl: Netlink,
    /// The IPv4 device; `None` on an IPv6-only network.
    pub link: Option<Link>,
    pub link6: Option<Link>,
    pub uplink: Uplink,
    pub config: KernelConfig,
}

impl Tunnel {
    /// Gives the device our lease's network address as a /32 (a source address for host to
    /// container traffic that creates no subnet route), and the IPv6 device our IPv6 subnet's
    /// as a /128, brings them up, and returns the backend.
    pub async fn attach<P: PeerPlan>(
        self,
        lease: &Lease,
        plan: impl FnOnce(TunnelRoutes) -> P,
    ) -> anyhow::Result<KernelBackend<P>> {
        if let Some(link) = &self.link {
            let subnet = lease.subnets.v4().with_context(|| {
                format!("{} is made, but our lease has no IPv4 subnet", link.name)
            })?;
            self.configure(link, Ipv4Net::new(subnet.network(), 32)?.into())
                .await?;
        }
        if let Some(link6) = &self.link6 {
            let subnet = lease.subnets.v6().with_context(|| {
                format!("{} is made, but our lease has no IPv6 subnet", link6.name)
            })?;
            self.configure(link6, Ipv6Net::new(subnet.network(), 128)?.into())
                .await?;
        }
        let index = self.link.as_ref().map(|l| l.index);
        let index6 = self.link6.as_ref().map(|l| l.index);
        let owned = Owned {
            networks: self.config.networks(),
            route_links: index
                .into_iter()
                .chain([self.uplink.index])
                .chain(index6)
                .collect(),
            l2: L2Links {
                v4: index,
                v6: index6,
            },
        };
        let plan = plan(TunnelRoutes {
            dev: index,
            dev6: index6,
            uplink: self.uplink,
            direct_routing: self.config.direct_routing,
        });
        let nexthops = self.config.nexthops(&self.nl).await;
        let ours = Ours {
            subnet: lease.id(),
            owned,
            nexthops,
        };
        // Containers get one MTU for both families: the smaller device's.
        let mtus = self.link.iter().chain(&self.link6).map(|l| l.mtu);
        let mtu = mtus.min().context("a tunnel backend without a device")?;
        Ok(KernelBackend::new(self.nl, plan, ours, mtu))
    }

    /// `addr` as the device's only address of its family, and the device up.
    async fn configure(&self, link: &Link, addr: IpNet) -> anyhow::Result<()> {
        let configured = ensure_only_address(&self.nl, link.index, addr).await;
        configured.with_context(|| format!("setting the address of {}", link.name))?;
        let up = self.nl.set_up(link.index).await;
        up.with_context(|| format!("setting {} up", link.name))
    }
}

/// Where a tunnel backend (vxlan, ipip) sends a peer's traffic: into its device, or straight
/// out of the iface when DirectRouting is on and the peer shares our L2 segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TunnelRoutes {
    /// The IPv4 device; `None` on an IPv6-only node, which plans no IPv4 side.
    pub dev: Option<u32>,
    /// The IPv6 device, on a dual-stack node.
    pub dev6: Option<u32>,
    pub uplink: Uplink,
    pub direct_routing: bool,
}

impl TunnelRoutes {
    /// The IPv4 device, for a peer's IPv4 side.
    pub fn dev(&self) -> anyhow::Result<u32> {
        self.dev
            .context("this node has no IPv4 tunnel device (an IPv6-only network)")
    }

    pub fn direct(&self, lease: &Lease) -> Option<Route> {
        let (subnet, public_ip) = lease.ipv4_side().ok()?;
        let same_segment = self.uplink.addr.is_some_and(|a| a.contains(&public_ip));
        (self.direct_routing && same_segment).then(|| self.uplink.route_via(subnet, public_ip))
    }

    /// [`TunnelRoutes::direct`] for the lease's IPv6 side: a peer on the iface's IPv6 subnet.
    pub fn direct6(&self, lease: &Lease) -> Option<Route> {
        let (_, public_ipv6) = lease.ipv6_side()?;
        let near = self.uplink.addr6.is_some_and(|a| a.contains(&public_ipv6));
        (self.direct_routing && near).then(|| route_via6(&self.uplink, lease))?
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::backend::peer_state::tests::lease;
    use crate::host::uplink::tests::uplink;

    pub fn routes(direct_routing: bool) -> TunnelRoutes {
        TunnelRoutes {
            dev: Some(7),
            dev6: Some(8),
            uplink: uplink(),
            direct_routing,
        }
    }

    #[test]
    fn direct_route_only_for_peers_on_the_uplink_subnet() {
        let near = lease("10.5.2.0/24", "10.200.0.2", Some("vxlan"));
        let far = lease("10.5.3.0/24", "192.168.9.3", Some("vxlan"));
        let expected = Route {
            dst: near.subnets.v4().unwrap().into(),
            gateway: Some(near.public_addrs.v4().unwrap().into()),
            oif: 2,
            onlink: false,
            nhid: None,
        };
        assert_eq!(routes(true).direct(&near), Some(expected));
        assert_eq!(routes(true).direct(&far), None);
        assert_eq!(routes(false).direct(&near), None);
    }
}
