//! The Nodes as lease events: a list+watch (resourceVersion, bookmarks, a fresh list after 410
//! Gone, all through kube-runtime's watcher) turned into the [`LeaseEvent`]s every registry
//! sends. A re-list is a [`LeaseEvent::Snapshot`], so nothing missed while the watch was
//! broken stays missed. The watcher is started over with a fresh list when the API server's
//! history went back ([`super::history`]); a dead connection is noticed by the client's TCP
//! keepalive ([`super::client`]).

use super::annotations::NodeLease;
use super::client::{chain, Failure};
use super::history::{server_version, unknown_version, History, RECHECK};
use super::node_view::NodeView;
use super::own_node::{OwnChange, OwnNode};
use crate::lease::Lease;
use crate::lease::{node_key, LeaseEvent};
use crate::registry::Backoff;
use anyhow::anyhow;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use kube::api::WatchParams;
use kube::runtime::watcher::{self, watcher, Event};
use kube::Api;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::time::Instant;

type Nodes = BoxStream<'static, Result<Event<NodeView>, watcher::Error>>;

/// What this node knows of another Node.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Peer {
    /// The same copy the lease gate keeps once it accepts it.
    Lease(Arc<Lease>),
    Unreadable(String),
}

pub(super) struct Follower {
    own: OwnNode,
    lease: Lease,
    /// Every other Node that is a lease or claims to be one, by name.
    peers: HashMap<String, Peer>,
    /// A list in progress (between the watcher's Init and InitDone).
    listing: Option<Listing>,
    /// A whole list has been sent as a snapshot.
    listed: bool,
    /// Our Node was last seen without a podCIDR (said once, until it has one again).
    own_unassigned: bool,
    tx: mpsc::Sender<LeaseEvent>,
}

/// A list in progress, read Node by Node as the pages arrive, so that only what each Node is
/// to the network is kept until the list is whole.
#[derive(Default)]
struct Listing {
    peers: HashMap<String, Peer>,
    own: Option<NodeView>,
}

/// The consumer went away: stop following.
struct Gone;

impl Follower {
    pub fn new(own: OwnNode, lease: Lease, tx: mpsc::Sender<LeaseEvent>) -> Follower {
        Follower {
            own,
            lease,
            own_unassigned: false,
            peers: HashMap::new(),
            listing: None,
            listed: false,
            tx,
        }
    }

    /// Lists the Nodes and sends the first snapshot; returns the watch that follows, to run
    /// in the background. A refused list or watch (401, 403) fails here, at start, in one line:
    /// a node that may list but not watch would keep a frozen table.
    pub async fn list(mut self, nodes: Api<NodeView>) -> anyhow::Result<impl Future<Output = ()>> {
        let mut stream = watch(&nodes);
        let mut backoff = self.own.timing.backoff();
        while !self.listed {
            match stream.try_next().await {
                Ok(Some(event)) => self.on(event).await.map_err(|Gone| anyhow!("stopped"))?,
                Ok(None) => return Err(anyhow!("the Node watch ended before the first list")),
                Err(e) => match failure(&e) {
                    Failure::Denied(why) => return Err(anyhow!(why)),
                    Failure::Unreachable(why) | Failure::Refused(why) => {
                        let delay = backoff.next_delay();
                        tracing::warn!("listing Nodes failed ({why}); retrying in {delay:?}");
                        tokio::time::sleep(delay).await;
                    }
                },
            }
        }
        may_watch(&nodes, &self.own.timing).await?;
        Ok(self.follow(nodes, stream))
    }

    /// Follows the watch until the consumer goes away. Errors never end it: the node keeps
    /// its last table while the API server is away, and the watcher lists again when back, or
    /// at once when the server's history is not the one the watch follows ([`history`]).
    async fn follow(mut self, nodes: Api<NodeView>, mut stream: Nodes) {
        let mut backoff = self.own.timing.backoff();
        let mut last_error = None;
        let mut history = History::default();
        let mut recheck = Recheck::new(&self.own.timing);
        loop {
            let next = tokio::select! {
                biased;
                _ = self.tx.closed() => return,
                () = recheck.due() => {
                    match server_version(&nodes, &self.own.name).await {
                        Ok(version) => {
                            recheck.done();
                            if let Some(why) = history.behind(version) {
                                stream = relist(&nodes, &why);
                            }
                        }
                        Err(_) => recheck.failed(),
                    }
                    continue;
                }
                next = stream.next() => next,
            };
            let outcome = match next {
                None => return,
                Some(Ok(event)) => match history.went_back(&event) {
                    Some(why) => {
                        stream = relist(&nodes, &why);
                        Ok(())
                    }
                    None => {
                        backoff.reset();
                        last_error = None;
                        self.on(event).await
                    }
                },
                Some(Err(e)) => {
                    match unknown_version(&e) {
                        Some(why) => stream = relist(&nodes, &why),
                        // Once the server answers again, is its history still ours?
                        None => recheck.soon(),
                    }
                    let why = failure(&e).text();
                    let delay = backoff.next_delay();
                    if last_error.as_ref() != Some(&why) {
                        tracing::warn!(
                            "watching Nodes failed ({why}); keeping the last lease table, \
                             trying again in {delay:?}"
                        );
                    }
                    last_error = Some(why);
                    tokio::time::sleep(delay).await;
                    Ok(())
                }
            };
            if let Err(Gone) = outcome {
                return;
            }
        }
    }

    async fn on(&mut self, event: Event<NodeView>) -> Result<(), Gone> {
        match event {
            Event::Init => self.listing = Some(Listing::default()),
            Event::InitApply(node) => self.listed(node),
            Event::InitDone => {
                let listing = self.listing.take().unwrap_or_default();
                self.resync(listing).await?;
                self.listed = true;
            }
            Event::Apply(node) => self.apply(node).await?,
            Event::Delete(node) => self.delete(&node).await?,
        }
        Ok(())
    }

    /// One Node of a list in progress.
    fn listed(&mut self, node: NodeView) {
        if node.name() == self.own.name {
            self.listing.get_or_insert_with(Listing::default).own = Some(node);
        } else if let Some(peer) = self.peer(&node) {
            let listing = self.listing.get_or_insert_with(Listing::default);
            listing.peers.insert(node.name().to_string(), peer);
        }
    }

    /// A complete list: every peer is replaced, and unreadable Nodes that are gone or
    /// readable again are cleared.
    async fn resync(&mut self, listing: Listing) -> Result<(), Gone> {
        if let Some(own) = &listing.own {
            self.own_changed(own).await?;
        }
        let old = std::mem::replace(&mut self.peers, listing.peers);
        for (name, old) in &old {
            if matches!(old, Peer::Unreadable(_)) && !self.is_unreadable(name) {
                self.send(unreadable(name, None)).await?;
            }
        }
        let mut leases = Vec::new();
        for (name, peer) in &self.peers {
            match peer {
                Peer::Lease(lease) => leases.push(lease.clone()),
                Peer::Unreadable(why) => {
                    if old.get(name) != Some(peer) {
                        warn_unreadable(name, why);
                    }
                    self.send(unreadable(name, Some(why))).await?;
                }
            }
        }
        self.send(LeaseEvent::Snapshot(leases)).await
    }

    /// One Node added or changed.
    async fn apply(&mut self, node: NodeView) -> Result<(), Gone> {
        let name = node.name().to_string();
        if name == self.own.name {
            return self.own_changed(&node).await;
        }
        let new = self.peer(&node);
        let old = match &new {
            Some(peer) => self.peers.insert(name.clone(), peer.clone()),
            None => self.peers.remove(&name),
        };
        if old == new {
            return Ok(());
        }
        match (old, new) {
            // One Node is one lease (its origin), whatever its podCIDR says.
            (Some(Peer::Lease(_)), Some(Peer::Lease(new))) => {
                self.send(LeaseEvent::Added(new)).await
            }
            (old, new) => {
                self.gone(&name, old).await?;
                self.came(&name, new).await
            }
        }
    }

    async fn delete(&mut self, node: &NodeView) -> Result<(), Gone> {
        let name = node.name().to_string();
        if name == self.own.name {
            tracing::warn!(
                "this node's Node object {name} was deleted; twill keeps forwarding with its \
                 lease {} (restart twill once the Node is back)",
                self.lease.id()
            );
            return Ok(());
        }
        let old = self.peers.remove(&name);
        self.gone(&name, old).await
    }

    /// What a Node no longer is.
    async fn gone(&mut self, name: &str, old: Option<Peer>) -> Result<(), Gone> {
        match old {
            Some(Peer::Lease(lease)) => self.send(LeaseEvent::Removed(lease)).await,
            Some(Peer::Unreadable(_)) => self.send(unreadable(name, None)).await,
            None => Ok(()),
        }
    }

    /// What a Node now is.
    async fn came(&mut self, name: &str, new: Option<Peer>) -> Result<(), Gone> {
        match new {
            Some(Peer::Lease(lease)) => self.send(LeaseEvent::Added(lease)).await,
            Some(Peer::Unreadable(why)) => {
                warn_unreadable(name, &why);
                self.send(unreadable(name, Some(&why))).await
            }
            None => Ok(()),
        }
    }

    /// Our own Node changed: re-publish our annotations if someone changed them, and stop if
    /// our podCIDR is no longer our lease.
    async fn own_changed(&mut self, node: &NodeView) -> Result<(), Gone> {
        let change = self.own.change(node, &self.lease);
        let unassigned = matches!(change, OwnChange::Unassigned);
        if unassigned != self.own_unassigned {
            match unassigned {
                true => tracing::warn!(
                    "Node {} has no podCIDR now (registered anew?); forwarding goes on with \
                     {}, and twill waits for the controller manager to give it one",
                    self.own.name,
                    self.lease.id()
                ),
                false => tracing::info!("Node {} has a podCIDR again", self.own.name),
            }
            self.own_unassigned = unassigned;
        }
        match change {
            OwnChange::None | OwnChange::Unassigned => Ok(()),
            OwnChange::Annotate(missing) => {
                tracing::info!(
                    "Node {}'s flannel annotations changed; writing them again",
                    self.own.name
                );
                if let Err(e) = self.own.annotate(missing).await {
                    tracing::warn!("re-annotating Node {} failed: {e:#}", self.own.name);
                }
                Ok(())
            }
            OwnChange::Lost(why) => self.send(LeaseEvent::OwnLeaseGone(why)).await,
        }
    }

    fn peer(&self, node: &NodeView) -> Option<Peer> {
        match self
            .own
            .annotations
            .node_lease(node, self.own.config.stack())
        {
            NodeLease::NotFlannel => None,
            NodeLease::Lease(lease) => Some(Peer::Lease(Arc::new(lease))),
            NodeLease::Unreadable(why) => Some(Peer::Unreadable(why)),
        }
    }

    fn is_unreadable(&self, name: &str) -> bool {
        matches!(self.peers.get(name), Some(Peer::Unreadable(_)))
    }

    async fn send(&self, event: LeaseEvent) -> Result<(), Gone> {
        self.tx.send(event).await.map_err(|_| Gone)
    }
}

fn unreadable(name: &str, why: Option<&String>) -> LeaseEvent {
    LeaseEvent::Unreadable {
        key: node_key(name),
        why: why.cloned(),
    }
}

fn warn_unreadable(name: &str, why: &str) {
    tracing::warn!("ignoring {}: {}", node_key(name), crate::shown::line(why));
}

/// When to ask the API server its resourceVersion next: every [`RECHECK`], and soon after
/// the watch broke, again and again until the server answers.
struct Recheck {
    at: Instant,
    retry: Backoff,
}

impl Recheck {
    fn new(timing: &super::KubeTiming) -> Recheck {
        Recheck {
            at: Instant::now() + RECHECK,
            retry: timing.backoff(),
        }
    }

    async fn due(&self) {
        tokio::time::sleep_until(self.at).await
    }

    fn soon(&mut self) {
        self.at = self.at.min(Instant::now() + self.retry.next_delay());
    }

    fn failed(&mut self) {
        self.at = Instant::now() + self.retry.next_delay();
    }

    fn done(&mut self) {
        self.retry.reset();
        self.at = Instant::now() + RECHECK;
    }
}

/// The watcher of every Node: a list (served whole from the API server's watch cache,
/// resourceVersion 0, which ignores paging, as client-go's informers and so flanneld list: ten
/// pages of 500 Nodes cost the server about twice as long), then a watch from its version.
fn watch(nodes: &Api<NodeView>) -> Nodes {
    let mut config = watcher::Config::default().any_semantic();
    // kube leaves resourceVersion=0 out of a list that has a limit.
    config.page_size = None;
    watcher(nodes.clone(), config).boxed()
}

/// A new watcher, whose list replaces the table: what the old one followed is gone.
fn relist(nodes: &Api<NodeView>, why: &str) -> Nodes {
    tracing::warn!(
        "{why}: its storage lost data or was restored from an older backup; listing the Nodes \
         again"
    );
    watch(nodes)
}

/// Fails, naming the verb, when the API server refuses this node a watch of the Nodes. The
/// watcher's own first watch starts in the background, where a refusal would only be retried.
async fn may_watch(nodes: &Api<NodeView>, timing: &super::KubeTiming) -> anyhow::Result<()> {
    let params = WatchParams::default().timeout(1);
    let watched = super::retry(timing, "watch", "nodes", || nodes.watch(&params, "0"));
    watched.await.map(drop)
}

fn failure(error: &watcher::Error) -> Failure {
    match error {
        watcher::Error::InitialListFailed(e) => Failure::of(e, "list", "nodes"),
        watcher::Error::WatchStartFailed(e) | watcher::Error::WatchFailed(e) => {
            Failure::of(e, "watch", "nodes")
        }
        other => Failure::Unreachable(chain(other)),
    }
}
