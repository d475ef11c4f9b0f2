//! What the kernel backends (vxlan, ipip, host-gw) share: turning leases into per-peer kernel
//! state, and converging the kernel onto exactly that state.
//!
//! Each backend only says what one peer needs ([`PeerPlan`]); adding, removing and reconciling
//! are done here once. Reconcile reads back what is really in the kernel instead of trusting
//! memory, which is what makes it correct after a crash or a `kill -9`.

use std::collections::{BTreeMap, HashSet};
use std::net::Ipv4Addr;

use anyhow::Context;
use ipnet::Ipv4Net;
use tracing::{info, warn};

use super::netlink::{Link, Netlink, Route, Write};
use super::nexthops::{self, NexthopTable, Nexthops};
pub use super::peer_state::PeerState;
use super::peer_state::{Owned, Snapshot};
use super::Backend;
use crate::lease::Lease;
use crate::node::Node;

/// What every kernel backend needs to know about this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelConfig {
    /// The external interface (`--iface`): tunnel endpoint and next hop for direct routes.
    pub iface: String,
    /// The flannel `Network`. Routes are only ever removed inside it.
    pub network: Ipv4Net,
    /// vxlan and ipip: peers on the iface's own subnet get a plain route via their PublicIP
    /// instead of the tunnel. host-gw always routes that way and ignores this.
    pub direct_routing: bool,
    /// Each peer's route through a nexthop object of its own, where the kernel has them;
    /// off (`--no-nexthop-objects`): gateway routes, as flanneld writes them.
    pub nexthop_objects: bool,
}

impl KernelConfig {
    pub fn of(node: &Node) -> KernelConfig {
        KernelConfig {
            iface: node.iface.name.clone(),
            network: node.config.network,
            direct_routing: node.config.backend.direct_routing,
            nexthop_objects: node.options.nexthop_objects,
        }
    }

    /// How this node's kernel takes peers' routes, asked once at start.
    pub(crate) async fn nexthops(&self, nl: &Netlink) -> Nexthops {
        Nexthops::probe(nl, self.network, self.nexthop_objects).await
    }
}

/// The external interface as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Uplink {
    pub index: u32,
    /// First IPv4 address with its prefix, as flanneld picks it.
    pub addr: Ipv4Net,
    pub mtu: u32,
}

/// Opens rtnetlink in the caller's network namespace and looks up the external interface.
pub(crate) async fn connect(iface: &str) -> anyhow::Result<(Netlink, Uplink)> {
    let nl = Netlink::connect().context("opening rtnetlink")?;
    let uplink = Uplink::lookup(&nl, iface).await?;
    Ok((nl, uplink))
}

impl Uplink {
    pub async fn lookup(nl: &Netlink, name: &str) -> anyhow::Result<Uplink> {
        let link = nl.link_by_name(name).await?;
        let link = link.with_context(|| format!("interface {name} not found"))?;
        let addrs = nl.ipv4_addresses(link.index).await?;
        let addr = addrs.first().copied();
        let addr = addr.with_context(|| format!("interface {name} has no IPv4 address"))?;
        Ok(Uplink {
            index: link.index,
            addr,
            mtu: link.mtu,
        })
    }

    /// `<subnet> via <PublicIP> dev <iface>`: host-gw's route, and DirectRouting's.
    pub fn route_via(&self, lease: &Lease) -> Route {
        Route {
            dst: lease.subnet,
            gateway: Some(lease.public_ip),
            oif: self.index,
            onlink: false,
            nhid: None,
        }
    }
}

/// Leaves `addr` as the device's only IPv4 address: a changed lease must not leave the old
/// /32 behind. Only ever called on our own tunnel devices.
async fn ensure_only_address(nl: &Netlink, index: u32, addr: Ipv4Net) -> anyhow::Result<()> {
    let existing = nl.ipv4_addresses(index).await?;
    for old in existing.iter().filter(|&&a| a != addr) {
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

/// A backend's tunnel device (`flannel.<VNI>`, `flannel.ipip`), made before our lease exists.
pub(crate) struct Tunnel {
    pub nl: Netlink,
    pub link: Link,
    pub uplink: Uplink,
    pub config: KernelConfig,
}

impl Tunnel {
    /// Gives the device our lease's network address as a /32 (a source address for host to
    /// container traffic that creates no subnet route), brings it up, and returns the backend.
    pub async fn attach<P: PeerPlan>(
        self,
        lease: &Lease,
        plan: impl FnOnce(TunnelRoutes) -> P,
    ) -> anyhow::Result<KernelBackend<P>> {
        let (index, name) = (self.link.index, &self.link.name);
        let addr = Ipv4Net::new(lease.subnet.network(), 32)?;
        let configured = ensure_only_address(&self.nl, index, addr).await;
        configured.with_context(|| format!("setting the address of {name}"))?;
        self.nl
            .set_up(index)
            .await
            .with_context(|| format!("setting {name} up"))?;
        let owned = Owned {
            network: self.config.network,
            route_links: vec![index, self.uplink.index],
            l2_link: Some(index),
        };
        let plan = plan(TunnelRoutes {
            dev: index,
            uplink: self.uplink,
            direct_routing: self.config.direct_routing,
        });
        let nexthops = self.config.nexthops(&self.nl).await;
        let ours = Ours {
            subnet: lease.subnet,
            owned,
            nexthops,
        };
        Ok(KernelBackend::new(self.nl, plan, ours, self.link.mtu))
    }
}

/// Where a tunnel backend (vxlan, ipip) sends a peer's traffic: into its device, or straight
/// out of the iface when DirectRouting is on and the peer shares our L2 segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TunnelRoutes {
    pub dev: u32,
    pub uplink: Uplink,
    pub direct_routing: bool,
}

impl TunnelRoutes {
    pub fn direct(&self, lease: &Lease) -> Option<Route> {
        let same_segment = self.uplink.addr.contains(&lease.public_ip);
        (self.direct_routing && same_segment).then(|| self.uplink.route_via(lease))
    }
}

/// The part that differs between kernel backends: what one peer needs.
pub trait PeerPlan {
    /// Only leases with this `BackendType` are programmed.
    const BACKEND_TYPE: &'static str;

    /// Fails when the lease lacks what this backend needs (e.g. a vxlan lease without VtepMAC).
    fn peer_state(&self, lease: &Lease) -> anyhow::Result<PeerState>;
}

/// What a kernel backend holds as its own: our subnet, the kernel state it may delete, and
/// how its peers' routes go.
pub(crate) struct Ours {
    pub subnet: Ipv4Net,
    pub owned: Owned,
    pub nexthops: Nexthops,
}

/// A kernel backend: a [`PeerPlan`] plus the shared add / remove / reconcile mechanics.
pub struct KernelBackend<P> {
    nl: Netlink,
    plan: P,
    own_subnet: Ipv4Net,
    owned: Owned,
    nexthops: Nexthops,
    mtu: u32,
}

impl<P: PeerPlan> KernelBackend<P> {
    pub(crate) fn new(nl: Netlink, plan: P, ours: Ours, mtu: u32) -> Self {
        KernelBackend {
            nl,
            plan,
            own_subnet: ours.subnet,
            owned: ours.owned,
            nexthops: ours.nexthops,
            mtu,
        }
    }

    /// Whether `lease` is a peer this backend programs: any but our own subnet. Leases of
    /// another backend type never arrive: the lease gate refuses them.
    fn is_peer(&self, lease: &Lease) -> bool {
        lease.subnet != self.own_subnet
    }

    /// What `lease` needs, its route through its own nexthop where it can have one.
    fn peer_state(&mut self, lease: &Lease, have: &NexthopTable) -> anyhow::Result<PeerState> {
        let state = self.plan.peer_state(lease)?;
        let nexthop = self.nexthops.through(lease.subnet, &state.route, have);
        Ok(state.through(nexthop))
    }

    /// The changes that make `peer` present, leaving out what `have` already holds.
    fn install(&self, peer: &PeerState, have: &Snapshot) -> Vec<Write> {
        let mut writes = Vec::new();
        if let Some(dev) = self.owned.l2_link {
            let neighbour = peer.neighbour.filter(|n| !have.neighbours.contains(n));
            writes.extend(neighbour.map(|n| Write::ReplaceNeighbour(dev, n)));
            let fdb = peer.fdb.filter(|f| !have.fdb.contains(f));
            writes.extend(fdb.map(|f| Write::ReplaceFdb(dev, f)));
        }
        let nexthop = peer
            .nexthop
            .and_then(|nh| nexthops::install(nh, &have.nexthops));
        writes.extend(nexthop);
        if !have.routes.contains(&peer.route) {
            writes.push(Write::ReplaceRoute(peer.route));
        }
        writes
    }

    /// The changes that remove `peer`, in the reverse order of installing: its route in
    /// either form (through its nexthop, or with its own gateway: an earlier run may have
    /// used the other), and its nexthop if twill holds it (`have`).
    fn uninstall(&self, peer: &PeerState, have: &NexthopTable) -> Vec<Write> {
        let gateway_route = Route {
            nhid: None,
            ..peer.route
        };
        let mut writes = vec![Write::DeleteRoute(gateway_route)];
        for &id in have.ours.keys() {
            let route = Route {
                nhid: Some(id),
                ..peer.route
            };
            writes.extend([Write::DeleteRoute(route), Write::DeleteNexthop(id)]);
        }
        if let Some(dev) = self.owned.l2_link {
            writes.extend(peer.fdb.map(|f| Write::DeleteFdb(dev, f)));
            writes.extend(peer.neighbour.map(|n| Write::DeleteNeighbour(dev, n.ip)));
        }
        writes
    }

    /// Makes the changes; the first that failed is the error.
    async fn apply(&self, writes: &[Write]) -> anyhow::Result<()> {
        let results = self.nl.write(writes).await;
        for (write, result) in writes.iter().zip(results) {
            result.with_context(|| write.to_string())?;
        }
        Ok(())
    }

    fn desired(&mut self, leases: &[Lease], have: &NexthopTable) -> Vec<(Ipv4Net, PeerState)> {
        let mut desired = Vec::with_capacity(leases.len());
        let own = self.own_subnet;
        for lease in leases.iter().filter(|l| l.subnet != own) {
            let subnet = lease.subnet;
            match self.peer_state(lease, have) {
                Ok(state) => desired.push((subnet, state)),
                Err(e) => warn!(%subnet, "skipping peer: {e:#}"),
            }
        }
        desired
    }

    /// Deletes what we own but no peer wants. Runs after installing, so a route that moved
    /// (same subnet, new gateway or device) was already replaced in place: no gap in traffic,
    /// and the delete of its old form is a no-op.
    async fn remove_unwanted(&self, have: &Snapshot, want: &Snapshot) -> anyhow::Result<()> {
        // A route through a nexthop is deleted by its id: one whose nexthop moved (same id)
        // was just changed in place and must stay.
        let through = want.routes.iter().filter_map(|r| r.nhid.zip(Some(r.dst)));
        let through: HashSet<_> = through.collect();
        let moved = |r: &Route| r.nhid.is_some_and(|id| through.contains(&(id, r.dst)));
        let stale_routes = have.routes.difference(&want.routes).filter(|r| !moved(r));
        let mut writes: Vec<Write> = stale_routes.map(|r| Write::DeleteRoute(*r)).collect();
        let stale_nexthops = have
            .nexthops
            .keys()
            .filter(|id| !want.nexthops.contains_key(id));
        writes.extend(stale_nexthops.map(|id| Write::DeleteNexthop(*id)));
        if let Some(dev) = self.owned.l2_link {
            let fdb = have.fdb.difference(&want.fdb);
            writes.extend(fdb.map(|f| Write::DeleteFdb(dev, *f)));
            // Keyed by IP only: an entry whose MAC changed was just replaced and must stay.
            let wanted_ips: HashSet<Ipv4Addr> = want.neighbours.iter().map(|n| n.ip).collect();
            let stale = have
                .neighbours
                .iter()
                .filter(|n| !wanted_ips.contains(&n.ip));
            writes.extend(stale.map(|n| Write::DeleteNeighbour(dev, n.ip)));
        }
        for write in &writes {
            info!("stale: {write}");
        }
        self.apply(&writes).await
    }
}

impl<P: PeerPlan> Backend for KernelBackend<P> {
    fn backend_type(&self) -> Option<&'static str> {
        Some(P::BACKEND_TYPE)
    }

    fn mtu(&self) -> u32 {
        self.mtu
    }

    fn kernel_writes(&self) -> u64 {
        self.nl.writes()
    }

    async fn add_peer(&mut self, lease: &Lease) -> anyhow::Result<()> {
        if !self.is_peer(lease) {
            return Ok(());
        }
        let held = self.nexthops.lookup(&self.nl, lease.subnet).await?;
        let peer = self.peer_state(lease, &held)?;
        info!(subnet = %lease.subnet, public_ip = %lease.public_ip, "adding peer");
        let have = Snapshot {
            nexthops: held.ours,
            ..Snapshot::default()
        };
        let result = self.apply(&self.install(&peer, &have)).await;
        result.with_context(|| format!("programming peer {}", lease.subnet))
    }

    async fn remove_peer(&mut self, lease: &Lease) -> anyhow::Result<()> {
        if !self.is_peer(lease) {
            return Ok(());
        }
        let peer = self.plan.peer_state(lease)?;
        let held = self.nexthops.lookup(&self.nl, lease.subnet).await?;
        info!(subnet = %lease.subnet, "removing peer");
        let result = self.apply(&self.uninstall(&peer, &held)).await;
        result.with_context(|| format!("removing peer {}", lease.subnet))
    }

    async fn reconcile(&mut self, leases: &[Lease]) -> anyhow::Result<()> {
        let listed = self.nexthops.list(&self.nl).await;
        let listed = listed.context("listing nexthops")?;
        let desired = self.desired(leases, &listed);
        let have = Snapshot::read(&self.nl, &self.owned, listed.ours).await?;
        let (mut owners, mut writes) = (Vec::new(), Vec::new());
        for (subnet, peer) in &desired {
            for write in self.install(peer, &have) {
                owners.push(*subnet);
                writes.push(write);
            }
        }
        let results = self.nl.write(&writes).await;
        let mut failed = BTreeMap::new();
        for ((subnet, write), result) in owners.iter().zip(&writes).zip(results) {
            if let Err(e) = result {
                failed.entry(*subnet).or_insert(format!("{write}: {e}"));
            }
        }
        for (subnet, why) in &failed {
            warn!(%subnet, "reconcile: {why}");
        }
        let want = Snapshot::of(desired.iter().map(|(_, p)| p));
        self.remove_unwanted(&have, &want).await?;
        if !failed.is_empty() {
            let subnets: Vec<_> = failed.keys().collect();
            anyhow::bail!("reconcile could not program peers {subnets:?}");
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn lease(subnet: &str, public_ip: &str, backend_type: Option<&str>) -> Lease {
        Lease {
            subnet: subnet.parse().unwrap(),
            ipv6_subnet: None,
            public_ip: public_ip.parse().unwrap(),
            public_ipv6: None,
            backend_type: backend_type.map(Into::into),
            backend_data: None,
            backend_v6_data: None,
            created: Default::default(),
        }
    }

    pub fn uplink() -> Uplink {
        Uplink {
            index: 2,
            addr: "10.200.0.1/24".parse().unwrap(),
            mtu: 1500,
        }
    }

    pub fn routes(direct_routing: bool) -> TunnelRoutes {
        TunnelRoutes {
            dev: 7,
            uplink: uplink(),
            direct_routing,
        }
    }

    #[test]
    fn direct_route_only_for_peers_on_the_uplink_subnet() {
        let near = lease("10.5.2.0/24", "10.200.0.2", Some("vxlan"));
        let far = lease("10.5.3.0/24", "192.168.9.3", Some("vxlan"));
        let expected = Route {
            dst: near.subnet,
            gateway: Some(near.public_ip),
            oif: 2,
            onlink: false,
            nhid: None,
        };
        assert_eq!(routes(true).direct(&near), Some(expected));
        assert_eq!(routes(true).direct(&far), None);
        assert_eq!(routes(false).direct(&near), None);
    }
}
