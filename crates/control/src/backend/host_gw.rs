//! flannel's `host-gw` backend: no device, one route per peer via its PublicIP on the iface.
//! Only works when every host shares one L2 segment; a peer elsewhere is refused by the kernel
//! ("nexthop has invalid gateway"), reported, and retried by the next reconcile.

use super::kernel::{connect, KernelBackend, KernelConfig, Ours, PeerPlan, PeerState, Uplink};
use super::peer_state::Owned;
use super::Setup;
use crate::lease::{Lease, LeaseAttrs};
use std::net::Ipv4Addr;

pub type HostGwBackend = KernelBackend<HostGwPlan>;

/// What a host-gw peer needs: `<subnet> via <PublicIP> dev <iface>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostGwPlan {
    uplink: Uplink,
}

impl PeerPlan for HostGwPlan {
    const BACKEND_TYPE: &'static str = "host-gw";

    fn peer_state(&self, lease: &Lease) -> anyhow::Result<PeerState> {
        Ok(PeerState::route_only(self.uplink.route_via(lease)))
    }
}

/// host-gw has nothing to make before the lease: its routes go on the iface.
pub struct HostGwSetup(pub KernelConfig);

impl Setup for HostGwSetup {
    type Backend = HostGwBackend;

    fn lease_attrs(&self, public_ip: Ipv4Addr) -> LeaseAttrs {
        LeaseAttrs::host_gw(public_ip)
    }

    /// `direct_routing` is ignored: host-gw routes directly by definition.
    async fn attach(self, lease: &Lease) -> anyhow::Result<HostGwBackend> {
        let config = self.0;
        let (nl, uplink) = connect(&config.iface).await?;
        let owned = Owned {
            network: config.network,
            route_links: vec![uplink.index],
            l2_link: None,
        };
        let mtu = uplink.mtu;
        let ours = Ours {
            subnet: lease.subnet,
            owned,
            nexthops: config.nexthops(&nl).await,
        };
        Ok(KernelBackend::new(nl, HostGwPlan { uplink }, ours, mtu))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::kernel::tests::{lease, uplink};
    use crate::backend::netlink::Route;

    #[test]
    fn peer_gets_a_route_via_its_public_ip_on_the_iface() {
        let l = lease("10.5.2.0/24", "10.200.0.2", Some("host-gw"));
        let state = HostGwPlan { uplink: uplink() }.peer_state(&l).unwrap();
        let route = Route {
            dst: l.subnet,
            gateway: Some(l.public_ip),
            oif: uplink().index,
            onlink: false,
            nhid: None,
        };
        assert_eq!(state, PeerState::route_only(route));
    }
}
