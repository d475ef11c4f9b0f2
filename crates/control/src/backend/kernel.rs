//! What the kernel backends (vxlan, ipip, host-gw) share: turning leases into per-peer kernel
//! state, and converging the kernel onto exactly that state.
//!
//! Each backend only says what one peer needs ([`PeerPlan`]); adding, removing and reconciling
//! are done here once. Reconcile reads back what is really in the kernel instead of trusting
//! memory, which is what makes it correct after a crash or a `kill -9`.

use std::collections::BTreeMap;
use std::net::Ipv6Addr;

use anyhow::Context;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use tracing::{info, warn};

pub use super::peer_state::PeerState;
use super::peer_state::{Owned, Snapshot};
use super::{each, Backend};
use crate::host::netlink::{Netlink, Route, Write};
use crate::host::nexthops::{self, NexthopTable, Nexthops};
use crate::lease::{Lease, SubnetId};
use crate::node::Node;
use std::borrow::Borrow;

/// What every kernel backend needs to know about this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelConfig {
    /// The external interface (`--iface`): tunnel endpoint and next hop for direct routes.
    pub iface: String,
    /// The flannel `Network`, `None` on an IPv6-only network. Routes are only ever removed
    /// inside it.
    pub network: Option<Ipv4Net>,
    /// vxlan and ipip: peers on the iface's own subnet get a plain route via their PublicIP
    /// instead of the tunnel. host-gw always routes that way and ignores this.
    pub direct_routing: bool,
    /// Each peer's route through a nexthop object of its own, where the kernel has them;
    /// off (`--no-nexthop-objects`): gateway routes, as flanneld writes them.
    pub nexthop_objects: bool,
    /// On a dual-stack or IPv6-only network: its IPv6 half.
    pub ipv6: Option<Ipv6Side>,
}

/// A dual-stack or IPv6-only node's IPv6 half, as the kernel backends need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Side {
    /// `IPv6Network`: IPv6 routes are only ever removed inside it.
    pub network: Ipv6Net,
    /// This node's PublicIPv6: where peers send its IPv6 side, vxlan's IPv6 tunnel endpoint.
    pub public_ip: Ipv6Addr,
}

impl KernelConfig {
    pub fn of(node: &Node) -> KernelConfig {
        let ipv6 = node.config.ipv6.as_ref().zip(node.public_addrs.v6());
        KernelConfig {
            iface: node.iface.name.clone(),
            network: node.config.ipv4.as_ref().map(|v4| v4.network),
            direct_routing: node.config.backend.direct_routing,
            nexthop_objects: node.options.nexthop_objects,
            ipv6: ipv6.map(|(config, public_ip)| Ipv6Side {
                network: config.network,
                public_ip,
            }),
        }
    }

    /// The networks whose routes the backend owns: `Network` and `IPv6Network`, each where the
    /// network has that family.
    pub(crate) fn networks(&self) -> Vec<IpNet> {
        let v4 = self.network.map(IpNet::V4);
        let v6 = self.ipv6.map(|side| IpNet::V6(side.network));
        v4.into_iter().chain(v6).collect()
    }

    /// How this node's kernel takes peers' routes, asked once at start.
    pub(crate) async fn nexthops(&self, nl: &Netlink) -> Nexthops {
        Nexthops::probe(nl, self.network, self.nexthop_objects).await
    }
}

/// Leases a reconcile plans and writes at once: a few netlink batches' worth (up to four
/// writes a peer), so that the kernel is kept as busy as with all of them, in little memory.
const INSTALL_CHUNK: usize = 1024;

/// The part that differs between kernel backends: what one peer needs.
pub trait PeerPlan {
    /// Fails when the lease lacks what this backend needs (e.g. a vxlan lease without VtepMAC).
    fn peer_state(&self, lease: &Lease) -> anyhow::Result<PeerState>;

    /// What the lease's IPv6 side needs, on a dual-stack node; `None` where this node or the
    /// lease has no IPv6 side, or the backend carries no IPv6.
    fn peer_state_v6(&self, _lease: &Lease) -> anyhow::Result<Option<PeerState>> {
        Ok(None)
    }
}

/// What a kernel backend holds as its own: our lease's id, the kernel state it may delete, and
/// how its peers' routes go.
pub(crate) struct Ours {
    /// An IPv6-only node's is [`SubnetId::V6`], as are its peers': the network has no IPv4.
    pub subnet: SubnetId,
    pub owned: Owned,
    pub nexthops: Nexthops,
}

/// A kernel backend: a [`PeerPlan`] plus the shared add / remove / reconcile mechanics.
pub struct KernelBackend<P> {
    nl: Netlink,
    plan: P,
    own_subnet: SubnetId,
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

    /// Whether `lease` is a peer this backend programs: any but our own. Leases of another
    /// backend type never arrive: the lease gate refuses them.
    fn is_peer(&self, lease: &Lease) -> bool {
        lease.id() != self.own_subnet
    }

    /// The lease's IPv4 subnet, where this node's network has IPv4 (not IPv6-only).
    fn ipv4_side(&self, lease: &Lease) -> Option<Ipv4Net> {
        let carries_ipv4 = matches!(self.own_subnet, SubnetId::V4(_));
        lease.subnets.v4().filter(|_| carries_ipv4)
    }

    /// The nexthop twill holds for `lease`'s IPv4 route, if it has one.
    async fn held_nexthops(&self, lease: &Lease) -> anyhow::Result<NexthopTable> {
        match self.ipv4_side(lease) {
            Some(subnet) => self.nexthops.lookup(&self.nl, subnet).await,
            None => Ok(NexthopTable::default()),
        }
    }

    /// What `lease` needs: its IPv4 side, the route through its own nexthop where it can
    /// have one, and its IPv6 side where the node has one (gateway routes: twill's nexthop
    /// ids number IPv4 subnets).
    fn peer_states(
        &mut self,
        lease: &Lease,
        have: &NexthopTable,
    ) -> anyhow::Result<Vec<PeerState>> {
        let v4 = match self.ipv4_side(lease) {
            Some(subnet) => {
                let state = self.plan.peer_state(lease)?;
                let nexthop = self.nexthops.through(subnet, &state.route, have);
                Some(state.through(nexthop))
            }
            None => None,
        };
        let v6 = self.plan.peer_state_v6(lease)?;
        Ok(v4.into_iter().chain(v6).collect())
    }

    /// Both sides of a peer as planned, without nexthops: what removing it must find.
    fn planned(&self, lease: &Lease) -> anyhow::Result<Vec<PeerState>> {
        let v4 = self.ipv4_side(lease).map(|_| self.plan.peer_state(lease));
        let v6 = self.plan.peer_state_v6(lease)?;
        Ok(v4.transpose()?.into_iter().chain(v6).collect())
    }

    /// The changes that make `peer` present, leaving out what `have` already holds.
    fn install(&self, peer: &PeerState, have: &Snapshot) -> Vec<Write> {
        let mut writes = Vec::new();
        let l2 = self.owned.l2;
        let neighbour = peer.neighbour.filter(|n| !have.neighbours.contains(n));
        let neighbour = neighbour.and_then(|n| Some(Write::ReplaceNeighbour(l2.for_ip(n.ip)?, n)));
        writes.extend(neighbour);
        let fdb = peer.fdb.filter(|f| !have.fdb.contains(f));
        writes.extend(fdb.and_then(|f| Some(Write::ReplaceFdb(l2.for_ip(f.dst)?, f))));
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
        let nexthops = have.ours.keys().filter(|_| !peer.is_ipv6());
        for &id in nexthops {
            let route = Route {
                nhid: Some(id),
                ..peer.route
            };
            writes.extend([Write::DeleteRoute(route), Write::DeleteNexthop(id)]);
        }
        let l2 = self.owned.l2;
        let fdb = peer
            .fdb
            .and_then(|f| Some(Write::DeleteFdb(l2.for_ip(f.dst)?, f)));
        writes.extend(fdb);
        let neighbour = peer.neighbour;
        writes.extend(neighbour.and_then(|n| Some(Write::DeleteNeighbour(l2.for_ip(n.ip)?, n.ip))));
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

    /// What `leases` want, each peer's states with its subnet; a peer whose lease lacks what
    /// the backend needs is skipped and logged.
    fn desired<'a>(
        &mut self,
        leases: impl Iterator<Item = &'a Lease>,
        have: &NexthopTable,
    ) -> Vec<(SubnetId, PeerState)> {
        let mut desired = Vec::new();
        let own = self.own_subnet;
        for lease in leases.filter(|l| l.id() != own) {
            let subnet = lease.id();
            match self.peer_states(lease, have) {
                Ok(states) => desired.extend(states.into_iter().map(|s| (subnet, s))),
                Err(e) => warn!(%subnet, "skipping peer: {e:#}"),
            }
        }
        desired
    }

    /// Writes what the `desired` peers need and `have` lacks, and checks them off `have`;
    /// notes each failed peer with its first failure.
    async fn install_missing(
        &self,
        desired: &[(SubnetId, PeerState)],
        have: &mut Snapshot,
        failed: &mut BTreeMap<SubnetId, String>,
    ) {
        let (mut owners, mut writes) = (Vec::new(), Vec::new());
        for (subnet, peer) in desired {
            for write in self.install(peer, have) {
                owners.push(*subnet);
                writes.push(write);
            }
        }
        for (_, peer) in desired {
            have.check_off(peer);
        }
        let results = self.nl.write(&writes).await;
        for ((subnet, write), result) in owners.iter().zip(&writes).zip(results) {
            if let Err(e) = result {
                failed.entry(*subnet).or_insert(format!("{write}: {e}"));
            }
        }
    }

    /// Deletes what we own but no peer wants ([`Snapshot::check_off`] left it). Runs after
    /// installing, so a route that moved (same subnet, new gateway or device) was already
    /// replaced in place: no gap in traffic.
    async fn remove_unwanted(&self, unwanted: &Snapshot) -> anyhow::Result<()> {
        let routes = unwanted.routes.left();
        let mut writes: Vec<Write> = routes.map(|r| Write::DeleteRoute(*r)).collect();
        let nexthops = unwanted.nexthops.keys();
        writes.extend(nexthops.map(|id| Write::DeleteNexthop(*id)));
        let l2 = self.owned.l2;
        let fdb = unwanted.fdb.left();
        writes.extend(fdb.filter_map(|f| Some(Write::DeleteFdb(l2.for_ip(f.dst)?, *f))));
        let neighbours = unwanted.neighbours.left();
        writes.extend(
            neighbours.filter_map(|n| Some(Write::DeleteNeighbour(l2.for_ip(n.ip)?, n.ip))),
        );
        for write in &writes {
            info!("stale: {write}");
        }
        self.apply(&writes).await
    }
}

impl<P: PeerPlan> Backend for KernelBackend<P> {
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
        let held = self.held_nexthops(lease).await?;
        let peer = self.peer_states(lease, &held)?;
        info!(subnet = %lease.id(), public_ip = %lease.public_addrs, "adding peer");
        let have = Snapshot {
            nexthops: held.ours,
            ..Snapshot::default()
        };
        let writes: Vec<Write> = peer.iter().flat_map(|p| self.install(p, &have)).collect();
        let result = self.apply(&writes).await;
        result.with_context(|| format!("programming peer {}", lease.id()))
    }

    async fn remove_peer(&mut self, lease: &Lease) -> anyhow::Result<()> {
        if !self.is_peer(lease) {
            return Ok(());
        }
        let peer = self.planned(lease)?;
        let held = self.held_nexthops(lease).await?;
        info!(subnet = %lease.id(), "removing peer");
        let writes: Vec<Write> = peer.iter().flat_map(|p| self.uninstall(p, &held)).collect();
        let result = self.apply(&writes).await;
        result.with_context(|| format!("removing peer {}", lease.id()))
    }

    /// Plans the peers [`INSTALL_CHUNK`] leases at a time, writing what each chunk lacks and
    /// checking it off what the kernel holds, so that neither the planned states of every peer
    /// (about 9 MB at 60,000 vxlan peers) nor their writes (about 20 MB at a cold start) are
    /// ever held at once.
    async fn reconcile<L: Borrow<Lease>>(&mut self, leases: &[L]) -> anyhow::Result<()> {
        let listed = self.nexthops.list(&self.nl).await;
        let NexthopTable { ours, foreign } = listed.context("listing nexthops")?;
        let foreign = NexthopTable {
            foreign,
            ..NexthopTable::default()
        };
        let mut have = Snapshot::read(&self.nl, &self.owned, ours).await?;
        let mut failed = BTreeMap::new();
        for chunk in leases.chunks(INSTALL_CHUNK) {
            let desired = self.desired(each(chunk), &foreign);
            self.install_missing(&desired, &mut have, &mut failed).await;
        }
        for (subnet, why) in &failed {
            warn!(%subnet, "reconcile: {why}");
        }
        if have.may_hold_replaced() {
            // Planned again, without the log: the first pass said what was skipped.
            let own = self.own_subnet;
            let peers = each(leases).filter(|l| l.id() != own);
            let wanted = peers.filter_map(|l| self.peer_states(l, &foreign).ok());
            have.keep_replaced(wanted.flatten());
        }
        self.remove_unwanted(&have).await?;
        if !failed.is_empty() {
            let subnets: Vec<_> = failed.keys().collect();
            anyhow::bail!("reconcile could not program peers {subnets:?}");
        }
        Ok(())
    }
}
