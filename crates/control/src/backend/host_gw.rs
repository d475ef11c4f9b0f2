//! flannel's `host-gw` backend: no device, one route per peer via its PublicIP on the iface,
//! and on a dual-stack node a second one for its IPv6 subnet via its PublicIPv6.
//! Only works when every host shares one L2 segment; a peer elsewhere is refused by the kernel
//! ("nexthop has invalid gateway"), reported, and retried by the next reconcile.

use super::kernel::{KernelBackend, KernelConfig, Ours, PeerPlan, PeerState};
use super::peer_state::{route_via, route_via6, L2Links, Owned};
use super::Setup;
use crate::host::uplink::{connect, Uplink};
use crate::lease::{Lease, LeaseAttrs, PublicAddrs};

pub type HostGwBackend = KernelBackend<HostGwPlan>;

/// What a host-gw peer needs: `<subnet> via <PublicIP> dev <iface>`, and on a dual-stack node
/// `<IPv6 subnet> via <PublicIPv6> dev <iface>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostGwPlan {
    uplink: Uplink,
    dual_stack: bool,
}

impl PeerPlan for HostGwPlan {
    fn peer_state(&self, lease: &Lease) -> anyhow::Result<PeerState> {
        Ok(PeerState::route_only(route_via(&self.uplink, lease)?))
    }

    fn peer_state_v6(&self, lease: &Lease) -> anyhow::Result<Option<PeerState>> {
        let route = route_via6(&self.uplink, lease).filter(|_| self.dual_stack);
        Ok(route.map(PeerState::route_only))
    }
}

/// host-gw has nothing to make before the lease: its routes go on the iface.
pub struct HostGwSetup(pub KernelConfig);

impl Setup for HostGwSetup {
    type Backend = HostGwBackend;

    fn lease_attrs(&self, public_addrs: PublicAddrs) -> LeaseAttrs {
        let attrs = LeaseAttrs::host_gw(public_addrs);
        match self.0.ipv6 {
            Some(v6) => attrs.with_ipv6(v6.public_ip, None),
            None => attrs,
        }
    }

    /// `direct_routing` is ignored: host-gw routes directly by definition.
    async fn attach(self, lease: &Lease) -> anyhow::Result<HostGwBackend> {
        let config = self.0;
        let (nl, uplink) = connect(&config.iface).await?;
        let owned = Owned {
            networks: config.networks(),
            route_links: vec![uplink.index],
            l2: L2Links::default(),
        };
        let mtu = uplink.mtu;
        let ours = Ours {
            subnet: lease.id(),
            owned,
            nexthops: config.nexthops(&nl).await,
        };
        let plan = HostGwPlan {
            uplink,
            dual_stack: config.ipv6.is_some(),
        };
        Ok(KernelBackend::new(nl, plan, ours, mtu))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::peer_state::tests::{dual_stack, lease};
    use crate::host::netlink::Route;
    use crate::host::uplink::tests::uplink;

    fn plan(dual_stack: bool) -> HostGwPlan {
        HostGwPlan {
            uplink: uplink(),
            dual_stack,
        }
    }

    #[test]
    fn peer_gets_a_route_via_its_public_ip_on_the_iface() {
        let l = lease("10.5.2.0/24", "10.200.0.2", Some("host-gw"));
        let state = plan(false).peer_state(&l).unwrap();
        let route = Route {
            dst: l.subnets.v4().unwrap().into(),
            gateway: Some(l.public_addrs.v4().unwrap().into()),
            oif: uplink().index,
            onlink: false,
            nhid: None,
        };
        assert_eq!(state, PeerState::route_only(route));
    }

    #[test]
    fn a_dual_stack_peer_gets_an_ipv6_route_via_its_public_ipv6() {
        let l = lease("10.5.2.0/24", "10.200.0.2", Some("host-gw"));
        let l = dual_stack(l, "fd10:0:0:2::/64", "fd00:200::2");
        let route = Route {
            dst: "fd10:0:0:2::/64".parse().unwrap(),
            gateway: Some("fd00:200::2".parse().unwrap()),
            oif: uplink().index,
            onlink: false,
            nhid: None,
        };
        let state = plan(true).peer_state_v6(&l).unwrap();
        assert_eq!(state, Some(PeerState::route_only(route)));
        assert_eq!(
            plan(false).peer_state_v6(&l).unwrap(),
            None,
            "an IPv4-only node"
        );
        let v4_only = lease("10.5.3.0/24", "10.200.0.3", Some("host-gw"));
        assert_eq!(plan(true).peer_state_v6(&v4_only).unwrap(), None);
    }
}
