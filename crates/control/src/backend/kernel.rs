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

use super::netlink::{FdbEntry, Link, Neighbour, Netlink, Route, Write};
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
}

impl KernelConfig {
    pub fn of(node: &Node) -> KernelConfig {
        KernelConfig {
            iface: node.iface.name.clone(),
            network: node.config.network,
            direct_routing: node.config.backend.direct_routing,
        }
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
        Ok(KernelBackend::new(
            self.nl,
            plan,
            lease,
            owned,
            self.link.mtu,
        ))
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

/// Kernel state for one peer. Installed in field order (neighbour, fdb, route: flannel's order,
/// so the kernel never resolves the route's gateway before its neighbour entry exists) and
/// removed in reverse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerState {
    /// Permanent ARP entry on the backend's device.
    pub neighbour: Option<Neighbour>,
    /// VXLAN forwarding entry on the backend's device.
    pub fdb: Option<FdbEntry>,
    pub route: Route,
}

impl PeerState {
    pub fn route_only(route: Route) -> PeerState {
        PeerState {
            neighbour: None,
            fdb: None,
            route,
        }
    }
}

/// The part that differs between kernel backends: what one peer needs.
pub trait PeerPlan {
    /// Only leases with this `BackendType` are programmed.
    const BACKEND_TYPE: &'static str;

    /// Fails when the lease lacks what this backend needs (e.g. a vxlan lease without VtepMAC).
    fn peer_state(&self, lease: &Lease) -> anyhow::Result<PeerState>;
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

/// A kernel backend: a [`PeerPlan`] plus the shared add / remove / reconcile mechanics.
pub struct KernelBackend<P> {
    nl: Netlink,
    plan: P,
    own_subnet: Ipv4Net,
    owned: Owned,
    mtu: u32,
}

impl<P: PeerPlan> KernelBackend<P> {
    pub(crate) fn new(nl: Netlink, plan: P, own: &Lease, owned: Owned, mtu: u32) -> Self {
        KernelBackend {
            nl,
            plan,
            own_subnet: own.subnet,
            owned,
            mtu,
        }
    }

    /// Whether `lease` is a peer this backend programs: any but our own subnet. Leases of
    /// another backend type never arrive: the lease gate refuses them.
    fn is_peer(&self, lease: &Lease) -> bool {
        lease.subnet != self.own_subnet
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
        if !have.routes.contains(&peer.route) {
            writes.push(Write::ReplaceRoute(peer.route));
        }
        writes
    }

    /// The changes that remove `peer`, in the reverse order of installing.
    fn uninstall(&self, peer: &PeerState) -> Vec<Write> {
        let mut writes = vec![Write::DeleteRoute(peer.route)];
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

    fn desired(&self, leases: &[Lease]) -> Vec<(Ipv4Net, PeerState)> {
        let peers = leases.iter().filter(|l| self.is_peer(l));
        let planned = peers.map(|l| (l.subnet, self.plan.peer_state(l)));
        let usable = planned.filter_map(|(subnet, state)| match state {
            Ok(state) => Some((subnet, state)),
            Err(e) => {
                warn!(%subnet, "skipping peer: {e:#}");
                None
            }
        });
        usable.collect()
    }

    /// Deletes what we own but no peer wants. Runs after installing, so a route that moved
    /// (same subnet, new gateway or device) was already replaced in place: no gap in traffic,
    /// and the delete of its old form is a no-op.
    async fn remove_unwanted(&self, have: &Snapshot, want: &Snapshot) -> anyhow::Result<()> {
        let mut writes: Vec<Write> = have
            .routes
            .difference(&want.routes)
            .map(|r| Write::DeleteRoute(*r))
            .collect();
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
        let peer = self.plan.peer_state(lease)?;
        info!(subnet = %lease.subnet, public_ip = %lease.public_ip, "adding peer");
        let result = self.apply(&self.install(&peer, &Snapshot::default())).await;
        result.with_context(|| format!("programming peer {}", lease.subnet))
    }

    async fn remove_peer(&mut self, lease: &Lease) -> anyhow::Result<()> {
        if !self.is_peer(lease) {
            return Ok(());
        }
        let peer = self.plan.peer_state(lease)?;
        info!(subnet = %lease.subnet, "removing peer");
        let result = self.apply(&self.uninstall(&peer)).await;
        result.with_context(|| format!("removing peer {}", lease.subnet))
    }

    async fn reconcile(&mut self, leases: &[Lease]) -> anyhow::Result<()> {
        let desired = self.desired(leases);
        let have = Snapshot::read(&self.nl, &self.owned).await?;
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

/// Owned kernel state, read back from the kernel or computed from leases.
#[derive(Debug, Default)]
struct Snapshot {
    routes: HashSet<Route>,
    neighbours: HashSet<Neighbour>,
    fdb: HashSet<FdbEntry>,
}

impl Snapshot {
    async fn read(nl: &Netlink, owned: &Owned) -> anyhow::Result<Snapshot> {
        let routes = nl.boot_routes().await.context("listing routes")?;
        let mut snap = Snapshot {
            routes: routes.into_iter().filter(|r| owned.owns_route(r)).collect(),
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

    fn of<'a>(peers: impl Iterator<Item = &'a PeerState>) -> Snapshot {
        let mut snap = Snapshot::default();
        for p in peers {
            snap.routes.insert(p.route);
            snap.neighbours.extend(p.neighbour);
            snap.fdb.extend(p.fdb);
        }
        snap
    }
}

impl Owned {
    fn owns_route(&self, route: &Route) -> bool {
        self.route_links.contains(&route.oif) && self.network.contains(&route.dst)
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
        };
        assert_eq!(routes(true).direct(&near), Some(expected));
        assert_eq!(routes(true).direct(&far), None);
        assert_eq!(routes(false).direct(&near), None);
    }

    #[test]
    fn owns_only_routes_inside_the_network_on_its_links() {
        let owned = Owned {
            network: "10.5.0.0/16".parse().unwrap(),
            route_links: vec![4, 2],
            l2_link: Some(4),
        };
        let route = |dst: &str, oif| Route {
            dst: dst.parse().unwrap(),
            gateway: None,
            oif,
            onlink: false,
        };
        assert!(owned.owns_route(&route("10.5.3.0/24", 4)));
        assert!(owned.owns_route(&route("10.5.3.0/24", 2)));
        assert!(!owned.owns_route(&route("10.5.3.0/24", 9)));
        assert!(!owned.owns_route(&route("10.6.3.0/24", 4)));
        assert!(!owned.owns_route(&route("10.0.0.0/8", 4)));
    }
}
