//! The background task behind [`super::EtcdRegistry::start`]: keeps our lease alive and turns
//! etcd's view of the other leases into [`LeaseEvent`]s.
//!
//! One task does both so that our own lease and the peer table change in one order: a watch
//! event about our key is handled after, never during, a renewal or re-acquisition.

use super::store::{describe, key_text, Listing, Store};
use super::Timing;
use crate::config::Config;
use crate::lease::LeaseEvent;
use crate::lease::{Lease, LeaseAttrs, Subnets};
use crate::registry::Backoff;
use crate::shown;
use anyhow::{anyhow, Context};
use etcd_client::{EventType, WatchResponse};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};
use tracing::{debug, info, warn};

pub(super) struct Keeper {
    store: Store,
    config: Config,
    attrs: LeaseAttrs,
    timing: Timing,
    own: Lease,
    /// False from the moment our key is seen gone until it is acquired again.
    held: bool,
    /// Another node holds our subnet: nothing is renewed or acquired any more.
    taken: bool,
    /// How the config in etcd differs from ours, as last reported (`None`: it does not).
    config_change: Option<String>,
    /// When to renew (while held) or retry the acquisition (while not).
    maintain_at: Instant,
    /// The other leases, by the subnets their key names: the same copies the lease gate
    /// keeps, not copies of them.
    peers: BTreeMap<Subnets, Arc<Lease>>,
    /// Entries under the lease prefix that are not leases, by key, with what is wrong.
    unreadable: BTreeMap<String, String>,
    tx: mpsc::Sender<LeaseEvent>,
    backoff: Backoff,
}

impl Keeper {
    pub fn new(
        store: Store,
        config: Config,
        timing: Timing,
        own: Lease,
        tx: mpsc::Sender<LeaseEvent>,
    ) -> Keeper {
        Keeper {
            attrs: own.attrs(),
            maintain_at: Instant::now() + timing.renew_after(),
            backoff: timing.backoff(),
            store,
            config,
            timing,
            own,
            held: true,
            taken: false,
            config_change: None,
            peers: BTreeMap::new(),
            unreadable: BTreeMap::new(),
            tx,
        }
    }

    /// Runs until the consumer drops its receiver. etcd errors never end it: the consumer keeps
    /// its last table while etcd is away, and gets a fresh snapshot when it is back.
    pub async fn run(mut self) {
        loop {
            let started = Instant::now();
            let Err(error) = self.list_and_watch().await else {
                return;
            };
            // A watch that ran for a while was healthy; start the backoff over, so a later
            // outage is noticed quickly. One that failed at once (etcd still down, history
            // compacted again) keeps growing the delay, so there is no hot loop.
            if started.elapsed() > self.timing.backoff_max {
                self.backoff.reset();
            }
            let delay = self.backoff.next_delay();
            warn!(
                "etcd watch failed ({}); keeping the last lease table, re-listing in {delay:?}",
                describe(&error)
            );
            if !self.idle(delay).await {
                return;
            }
        }
    }

    /// Waits `delay` while still renewing or re-acquiring our lease on time; `false` when the
    /// consumer went away meanwhile.
    async fn idle(&mut self, delay: Duration) -> bool {
        let until = Instant::now() + delay;
        loop {
            // biased: a consumer that is gone must stop us before we touch etcd again.
            tokio::select! {
                biased;
                _ = self.tx.closed() => return false,
                _ = sleep_until(until) => return true,
                _ = sleep_until(self.maintain_at) => self.maintain().await,
            }
        }
    }

    /// Lists every lease at revision R, sends the snapshot, then follows the watch from R+1.
    /// Returns `Ok` only when the consumer went away.
    async fn list_and_watch(&mut self) -> anyhow::Result<()> {
        let listing = self.store.list().await?;
        let revision = listing.revision;
        self.resync(listing).await;
        let mut stream = self.store.watch(revision + 1).await?;
        loop {
            tokio::select! {
                biased;
                _ = self.tx.closed() => return Ok(()),
                _ = sleep_until(self.maintain_at) => self.maintain().await,
                message = stream.message() => {
                    let response = message?.context("etcd closed the watch stream")?;
                    self.on_watch(response).await?;
                }
            }
        }
    }

    async fn resync(&mut self, listing: Listing) {
        let now: BTreeMap<String, String> = listing.unreadable.into_iter().collect();
        let gone: Vec<String> = self
            .unreadable
            .keys()
            .filter(|k| !now.contains_key(*k))
            .cloned()
            .collect();
        for key in gone {
            self.readable(key).await;
        }
        for (key, why) in now {
            self.unreadable(key, why).await;
        }
        let (own, peers): (Vec<_>, Vec<_>) = listing
            .leases
            .into_iter()
            .map(|l| l.lease)
            .partition(|l| self.is_own(l));
        info!(
            "listed {} peer leases at etcd revision {}",
            peers.len(),
            listing.revision
        );
        self.peers = peers.into_iter().map(|l| (l.subnets, l)).collect();
        self.emit(LeaseEvent::Snapshot(self.peers.values().cloned().collect()))
            .await;
        if own.is_empty() && self.held {
            self.lost("is missing from etcd");
        }
        // The watch reports config changes from here on; this catches those made before.
        match self.store.config_json().await {
            Ok(config) => self.on_config(config.as_deref().map(str::as_bytes)).await,
            Err(e) => debug!("re-reading the network config failed: {e:#}"),
        }
    }

    /// Our lease: at our key (both subnets) with our public IP.
    fn is_own(&self, lease: &Lease) -> bool {
        lease.subnets == self.own.subnets && lease.public_addrs == self.attrs.public_addrs
    }

    async fn on_watch(&mut self, response: WatchResponse) -> anyhow::Result<()> {
        if response.canceled() {
            return Err(canceled(&response));
        }
        let config_key = self.store.config_key();
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            if kv.key() == config_key.as_bytes() {
                let value = (event.event_type() == EventType::Put).then(|| kv.value());
                self.on_config(value).await;
                continue;
            }
            let key = key_text(kv.key());
            match event.event_type() {
                EventType::Put => match self.store.parse_kv(kv) {
                    Ok(lease) => {
                        self.readable(key).await;
                        self.on_put(lease).await
                    }
                    Err(e) => self.unreadable(key, format!("{e:#}")).await,
                },
                EventType::Delete => {
                    self.readable(key).await;
                    match self.store.parse_key(kv.key()) {
                        Ok(subnets) => self.on_delete(subnets).await,
                        Err(e) => debug!("ignoring deleted key: {e:#}"),
                    }
                }
            }
        }
        Ok(())
    }

    /// An entry that is not a lease: warned about once per key and reason, and reported.
    async fn unreadable(&mut self, key: String, why: String) {
        if self.unreadable.get(&key) == Some(&why) {
            return;
        }
        warn!(
            "ignoring etcd entry {}: {}",
            shown::line(&key),
            shown::line(&why)
        );
        self.unreadable.insert(key.clone(), why.clone());
        self.emit(LeaseEvent::Unreadable {
            key,
            why: Some(why),
        })
        .await;
    }

    /// `key` is gone or holds a lease now: if it was unreadable, say that is over.
    async fn readable(&mut self, key: String) {
        if self.unreadable.remove(&key).is_some() {
            self.emit(LeaseEvent::Unreadable { key, why: None }).await;
        }
    }

    /// The network config was written (`Some`) or deleted (`None`). A running node cannot
    /// change network, subnet size or backend under its containers; it says so, once.
    async fn on_config(&mut self, value: Option<&[u8]>) {
        let change = match value.map(String::from_utf8_lossy) {
            None => Some("the config key was deleted".to_string()),
            Some(json) => match Config::parse(&json) {
                Ok(config) => self.config.difference(&config),
                Err(e) => Some(format!("it is no longer valid ({e})")),
            },
        };
        let change = change.map(|c| shown::line(&c).owned());
        if change != self.config_change {
            self.config_change = change.clone();
            self.emit(LeaseEvent::ConfigChanged(change)).await;
        }
    }

    async fn on_put(&mut self, lease: Lease) {
        if self.is_own(&lease) {
            return;
        }
        // Only a write to our very key takes our lease over. Another key that repeats one of
        // our subnets (our IPv4 subnet with another IPv6 half, say) is another lease, which the
        // lease gate refuses for overlapping ours: stopping for it would let any writer of a
        // key stop this node.
        if lease.subnets == self.own.subnets && !self.taken {
            return self.taken_over(lease).await;
        }
        let subnets = lease.subnets;
        if self.peers.get(&subnets).map(|held| &**held) != Some(&lease) {
            let lease = Arc::new(lease);
            self.peers.insert(subnets, lease.clone());
            self.emit(LeaseEvent::Added(lease)).await;
        }
    }

    /// Another node wrote our key: we stop renewing and tell the consumer, which stops.
    async fn taken_over(&mut self, by: Lease) {
        warn!(
            "our lease {} was taken over by the node at {}",
            self.own.subnets, by.public_addrs
        );
        self.taken = true;
        self.held = false;
        self.emit(LeaseEvent::OwnLeaseTaken(by)).await;
    }

    async fn on_delete(&mut self, subnets: Subnets) {
        if subnets == self.own.subnets && self.held {
            self.lost("was deleted or expired");
        } else if let Some(lease) = self.peers.remove(&subnets) {
            self.emit(LeaseEvent::Removed(lease)).await;
        }
    }

    /// Notes that our key is gone; the acquisition runs at once from the select loop.
    fn lost(&mut self, why: &str) {
        warn!("our lease {} {why}; acquiring it again", self.own.subnets);
        self.held = false;
        self.maintain_at = Instant::now();
    }

    async fn maintain(&mut self) {
        if self.taken {
            self.maintain_at = Instant::now() + self.timing.renew_after();
            return;
        }
        let result = if self.held {
            self.renew().await
        } else {
            self.reacquire().await
        };
        if let Err(e) = result {
            let retry = self.timing.retry_interval;
            warn!(
                "keeping lease {} failed ({}); trying again in {retry:?}",
                self.own.subnets,
                describe(&e)
            );
            self.maintain_at = Instant::now() + retry;
        }
    }

    /// Grants a new etcd lease and re-puts our key on it, as flanneld does.
    async fn renew(&mut self) -> anyhow::Result<()> {
        if !self.store.renew(&self.own, self.timing.lease_ttl).await? {
            self.lost("changed under us");
            return Ok(());
        }
        info!(
            "renewed lease {} for {:?}",
            self.own.subnets, self.timing.lease_ttl
        );
        self.maintain_at = Instant::now() + self.timing.renew_after();
        Ok(())
    }

    /// Claims our subnets again, and only those: other subnets would not match the containers
    /// on this host. If another node got it first, that node keeps it.
    async fn reacquire(&mut self) -> anyhow::Result<()> {
        let ttl = self.timing.lease_ttl;
        let own = self.own.subnets;
        let claimed = match self.store.get(own).await? {
            None => self.store.create(&self.own, ttl).await?,
            // Our public IP's lease with other attributes (say, an older run's): ours to update.
            Some(held) if self.is_own(&held.lease) => {
                self.store
                    .replace(&self.own, held.mod_revision, ttl)
                    .await?
            }
            Some(held) => {
                self.taken_over(Arc::unwrap_or_clone(held.lease)).await;
                return Ok(());
            }
        };
        if !claimed {
            anyhow::bail!("our key changed while re-acquiring it");
        }
        info!("re-acquired our lease {own}");
        self.held = true;
        self.maintain_at = Instant::now() + self.timing.renew_after();
        if let Some(stale) = self.peers.remove(&own) {
            self.emit(LeaseEvent::Removed(stale)).await;
        }
        self.emit(LeaseEvent::OwnLease(self.own.clone())).await;
        Ok(())
    }

    /// A consumer that went away is noticed by the select loops; nothing to do here.
    async fn emit(&self, event: LeaseEvent) {
        let _ = self.tx.send(event).await;
    }
}

fn canceled(response: &WatchResponse) -> anyhow::Error {
    match response.compact_revision() {
        0 => anyhow!("etcd canceled the watch: {}", response.cancel_reason()),
        rev => anyhow!("watch history was compacted up to revision {rev}; re-listing"),
    }
}
