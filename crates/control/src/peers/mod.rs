//! The other nodes' leases as this node acts on them: every lease event from the registry goes
//! through [`Peers::admit`], which lets a backend see only leases that passed
//! [`crate::lease_check`], and remembers the refused ones (with their reasons) for the log and
//! `twill status`.
//!
//! Leases are told apart by their origin (an etcd key, a Kubernetes Node: [`LeaseOrigin`]),
//! never by their subnet alone, so a second lease for a peer's subnet is a second lease and not
//! an update of the first. The duplicate rule needs every lease at once: of two leases that
//! claim one thing only one peer may have (overlapping subnets of either family, one endpoint,
//! one WireGuard key: [`Claim`]), the older one ([`lease_check::by_creation`]) is the peer and
//! the newer is refused naming it. That holds whatever order the leases arrive in: an older
//! lease takes the place of the newer ones it clashes with, and when a peer goes away (or stops
//! claiming something) the leases that waited for it are judged again, oldest first, with that
//! very event. The outcome is the one a fresh snapshot of the same leases gives.

mod gate;
mod held;

pub use gate::{Gate, PeersView};

use crate::lease::{Lease, LeaseEvent, LeaseNamer, LeaseOrigin, SubnetId};
use crate::lease_check::{self, by_creation, first_made, Claim, LeaseRules, Rejection};
use crate::shown;
use held::Held;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// A lease that was refused, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub lease: Arc<Lease>,
    pub reason: Rejection,
    /// The accepted lease that has what this one claims: when it goes, this one is judged again.
    pub waits_for: Option<LeaseOrigin>,
}

/// Accepted and refused peer leases.
#[derive(Debug)]
pub struct Peers {
    rules: LeaseRules,
    /// How a lease is named in the log: its etcd key, the Node, or the flag that gave it.
    namer: LeaseNamer,
    /// The accepted leases by [`SubnetId`]: they never clash, so no two share one. Each is
    /// the one copy of that lease the node keeps: a reconcile is handed these, not copies.
    accepted: BTreeMap<SubnetId, Arc<Lease>>,
    /// Where each origin's accepted lease is. A B-tree rather than a hash map: at 60,000 leases
    /// a hash map's table (131,072 slots) is about twice the size.
    origins: BTreeMap<LeaseOrigin, SubnetId>,
    /// What the accepted leases claim.
    held: Held,
    refused: BTreeMap<LeaseOrigin, Refused>,
    /// The refused leases waiting for each accepted one to go.
    waiting: HashMap<LeaseOrigin, BTreeSet<LeaseOrigin>>,
    /// Entries among the leases that are not leases at all, by key: the key and what is
    /// wrong, as they are shown (cut to a bound: whoever wrote the entry chose their length).
    unreadable: BTreeMap<String, (String, String)>,
}

/// What the backend must do after an event, as the gate admitted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admitted {
    /// Make the peers exactly the accepted leases ([`Gate::accepted_leases`]): the registry
    /// listed them all, or one event changed more than one peer.
    Reconcile,
    /// A peer lease was accepted, or an accepted one changed.
    Added(Arc<Lease>),
    /// An accepted peer lease went, as it was.
    Removed(Arc<Lease>),
    /// An event about this node rather than its peers (its own lease, the network config),
    /// passed on as it came.
    Node(LeaseEvent),
}

/// The subnets one event changed, each with its accepted lease before the event; `None` for a
/// snapshot, which is its own account of what changed.
#[derive(Default)]
struct Touched(Option<Vec<(SubnetId, Option<Arc<Lease>>)>>);

impl Peers {
    pub fn new(rules: LeaseRules, namer: LeaseNamer) -> Peers {
        Peers {
            rules,
            namer,
            accepted: BTreeMap::new(),
            origins: BTreeMap::new(),
            held: Held::default(),
            refused: BTreeMap::new(),
            waiting: HashMap::new(),
            unreadable: BTreeMap::new(),
        }
    }

    /// Turns a registry event into what the backend must do, if anything: refused leases are
    /// left out, and a refused lease that goes away changes nothing. An event that changes more
    /// than one peer (a subnet or key passing from one lease to another) reaches the backend as
    /// a reconcile with all accepted leases.
    pub fn admit(&mut self, event: LeaseEvent) -> Option<Admitted> {
        match event {
            LeaseEvent::Snapshot(all) => {
                self.replace_all(all);
                Some(Admitted::Reconcile)
            }
            LeaseEvent::Added(lease) => self.add(lease),
            LeaseEvent::Removed(lease) => self.remove(&lease.origin()),
            LeaseEvent::Unreadable { key, why } => {
                match why {
                    Some(why) => {
                        let shown = (shown::line(&key).owned(), shown::line(&why).owned());
                        self.unreadable.insert(key, shown)
                    }
                    None => self.unreadable.remove(&key),
                };
                None
            }
            own @ (LeaseEvent::OwnLease(_)
            | LeaseEvent::OwnLeaseTaken(_)
            | LeaseEvent::OwnLeaseGone(_)
            | LeaseEvent::ConfigChanged(_)) => Some(Admitted::Node(own)),
        }
    }

    /// Checks every lease afresh, the first made first, so that of two leases that clash the
    /// first made is accepted and the other refused, as the events would have left them.
    fn replace_all(&mut self, mut all: Vec<Arc<Lease>>) {
        let mut before = std::mem::take(&mut self.refused);
        self.waiting.clear();
        self.accepted.clear();
        self.origins.clear();
        self.held.clear();
        all.sort_by(|a, b| by_creation(a, b));
        // The snapshot is the event: what each lease changed needs no account.
        let mut touched = Touched::default();
        for lease in all {
            let origin = lease.origin();
            let known = before.remove(&origin);
            // A registry lists each origin once; should one come twice, the later stands.
            self.take_refused(&origin);
            self.unaccept_origin(&origin, &mut touched);
            self.judge(lease, known.as_ref(), &mut touched);
        }
    }

    fn add(&mut self, lease: Arc<Lease>) -> Option<Admitted> {
        let (id, origin, mut touched) = (lease.id(), lease.origin(), Touched::kept());
        let known = self.take_refused(&origin);
        let replaced = self.unaccept_origin(&origin, &mut touched);
        self.judge(lease, known.as_ref(), &mut touched);
        // What the old version held and the new one may not: the next in line gets it.
        if replaced.is_some() {
            self.settle(&origin, &mut touched);
        }
        self.events(id, touched)
    }

    fn remove(&mut self, origin: &LeaseOrigin) -> Option<Admitted> {
        self.take_refused(origin);
        let mut touched = Touched::kept();
        let removed = self.unaccept_origin(origin, &mut touched)?;
        self.settle(origin, &mut touched);
        self.events(removed.id(), touched)
    }

    /// Accepts or refuses `lease`, whose origin has no accepted or refused lease now. A lease
    /// older than every accepted one it clashes with takes their place.
    fn judge(&mut self, lease: Arc<Lease>, known: Option<&Refused>, touched: &mut Touched) {
        let key = match self.rules.check_keyed(&lease) {
            Ok(key) => key,
            Err(reason) => return self.refuse(lease, reason, None, known),
        };
        let claims = self.rules.claims(&lease, key);
        let holders = self.held.holders(&claims);
        let older = holders
            .iter()
            .map(|(claim, id)| (claim, &self.accepted[id]))
            .filter(|(_, holder)| first_made(holder, &lease))
            .min_by(|a, b| by_creation(a.1, b.1));
        if let Some((claim, holder)) = older {
            let first = self.namer.holder(holder);
            let reason = Rejection::Taken {
                claim: *claim,
                first,
            };
            let waits_for = Some(holder.origin());
            return self.refuse(lease, reason, waits_for, known);
        }
        let displaced: Vec<Arc<Lease>> = holders
            .iter()
            .filter_map(|(_, id)| self.unaccept(*id, touched))
            .collect();
        let (first, origin) = (self.namer.holder(&lease), lease.origin());
        self.accept(lease, &claims, touched);
        for lease in &displaced {
            let theirs = self.rules.claims(lease, lease_check::wireguard_key(lease));
            let claim = claims.iter().find(|c| theirs.iter().any(|t| t.clashes(c)));
            let claim = *claim.expect("a displaced lease clashes with the one that displaced it");
            let first = first.clone();
            let reason = Rejection::Taken { claim, first };
            self.refuse(Arc::clone(lease), reason, Some(origin.clone()), None);
        }
        // What waited for the displaced leases may not clash with the new one.
        for lease in displaced {
            self.settle(&lease.origin(), touched);
        }
    }

    /// Judges again, first made first, every lease that waited for the lease of `origin`,
    /// which is no longer accepted or no longer claims what it did.
    fn settle(&mut self, origin: &LeaseOrigin, touched: &mut Touched) {
        let Some(waiters) = self.waiting.remove(origin) else {
            return;
        };
        let mut waiting: Vec<Refused> = waiters
            .iter()
            .filter_map(|w| self.refused.remove(w))
            .collect();
        waiting.sort_by(|a, b| by_creation(&a.lease, &b.lease));
        for known in waiting {
            self.judge(known.lease.clone(), Some(&known), touched);
        }
    }

    fn accept(&mut self, lease: Arc<Lease>, claims: &[Claim], touched: &mut Touched) {
        let id = lease.id();
        touched.note(id, &self.accepted);
        self.held.insert(claims, id);
        self.origins.insert(lease.origin(), id);
        self.accepted.insert(id, lease);
    }

    /// Takes the accepted lease at `id` away, and what it claimed.
    fn unaccept(&mut self, id: SubnetId, touched: &mut Touched) -> Option<Arc<Lease>> {
        touched.note(id, &self.accepted);
        let lease = self.accepted.remove(&id)?;
        let claims = self
            .rules
            .claims(&lease, lease_check::wireguard_key(&lease));
        self.held.remove(&claims, id);
        self.origins.remove(&lease.origin());
        Some(lease)
    }

    fn unaccept_origin(
        &mut self,
        origin: &LeaseOrigin,
        touched: &mut Touched,
    ) -> Option<Arc<Lease>> {
        let id = *self.origins.get(origin)?;
        self.unaccept(id, touched)
    }

    /// Notes a refusal, warning once per lease and reason (a periodic re-list repeats them).
    fn refuse(
        &mut self,
        lease: Arc<Lease>,
        reason: Rejection,
        waits_for: Option<LeaseOrigin>,
        known: Option<&Refused>,
    ) {
        let refused = Refused {
            lease,
            reason,
            waits_for,
        };
        if known != Some(&refused) {
            tracing::warn!(
                "ignoring lease {}: {}",
                self.namer.name(&refused.lease),
                shown::line(&refused.reason.to_string())
            );
        }
        let origin = refused.lease.origin();
        if let Some(holder) = &refused.waits_for {
            let waiters = self.waiting.entry(holder.clone()).or_default();
            waiters.insert(origin.clone());
        }
        self.refused.insert(origin, refused);
    }

    /// Forgets the refused lease of `origin`, if there is one.
    fn take_refused(&mut self, origin: &LeaseOrigin) -> Option<Refused> {
        let refused = self.refused.remove(origin)?;
        if let Some(holder) = &refused.waits_for {
            if let Some(waiters) = self.waiting.get_mut(holder) {
                waiters.remove(origin);
                if waiters.is_empty() {
                    self.waiting.remove(holder);
                }
            }
        }
        Some(refused)
    }

    /// What the backend must hear of an event about `subnet`: that lease as it is now (added,
    /// changed or removed), or, when the event changed other peers too, every accepted lease.
    fn events(&self, subnet: SubnetId, touched: Touched) -> Option<Admitted> {
        let mut changes: Vec<Admitted> = touched
            .0
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(s, before)| match (before, self.accepted.get(&s)) {
                (Some(before), None) => Some(Admitted::Removed(before)),
                (before, Some(now)) if s == subnet || before.as_ref() != Some(now) => {
                    Some(Admitted::Added(now.clone()))
                }
                _ => None,
            })
            .collect();
        match changes.len() {
            0 | 1 => changes.pop(),
            _ => Some(Admitted::Reconcile),
        }
    }

    /// The leases the backend has, lowest subnet first.
    pub fn accepted(&self) -> impl ExactSizeIterator<Item = &Lease> {
        self.accepted.values().map(|lease| &**lease)
    }

    pub fn refused(&self) -> impl ExactSizeIterator<Item = &Refused> {
        self.refused.values()
    }

    /// Entries among the leases that are not leases: key, and what is wrong, as shown.
    pub fn unreadable(&self) -> impl ExactSizeIterator<Item = (&String, &String)> {
        self.unreadable.values().map(|(key, why)| (key, why))
    }

    pub fn namer(&self) -> &LeaseNamer {
        &self.namer
    }
}

impl Touched {
    /// Remembers what `subnet` held before this event, the first time it changes.
    fn note(&mut self, subnet: SubnetId, accepted: &BTreeMap<SubnetId, Arc<Lease>>) {
        let Some(touched) = &mut self.0 else {
            return;
        };
        if !touched.iter().any(|(s, _)| *s == subnet) {
            touched.push((subnet, accepted.get(&subnet).cloned()));
        }
    }

    /// An account of the changes of one event.
    fn kept() -> Touched {
        Touched(Some(Vec::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::LeaseAttrs;
    use crate::lease_check::Ipv4Rules;

    fn lease(subnet: &str, ip: &str) -> Lease {
        Lease::new(
            subnet.parse::<ipnet::Ipv4Net>().unwrap(),
            LeaseAttrs::udp(ip.parse::<std::net::Ipv4Addr>().unwrap()),
        )
    }

    fn peers() -> Peers {
        peers_on(None)
    }

    /// What the backend is told of `event`, a reconcile as the leases it reconciles with.
    pub(super) fn admitted(peers: &mut Peers, event: LeaseEvent) -> Option<LeaseEvent> {
        Some(match peers.admit(event)? {
            Admitted::Reconcile => LeaseEvent::Snapshot(peers.accepted.values().cloned().collect()),
            Admitted::Added(lease) => LeaseEvent::Added(lease),
            Admitted::Removed(lease) => LeaseEvent::Removed(lease),
            Admitted::Node(event) => event,
        })
    }

    /// A node of 10.5.0.0/16 with the lease 10.5.1.0/24, running `backend_type`.
    pub(super) fn peers_on(backend_type: Option<&str>) -> Peers {
        let rules = LeaseRules {
            ipv4: Some(Ipv4Rules {
                network: "10.5.0.0/16".parse().unwrap(),
                subnet_len: 24,
                own_subnet: "10.5.1.0/24".parse().unwrap(),
                own_public_ip: "10.200.0.1".parse().unwrap(),
            }),
            own_key: None,
            backend_type: backend_type.map(Into::into),
            ipv6: None,
        };
        Peers::new(rules, LeaseNamer::default())
    }

    #[test]
    fn a_refused_lease_never_reaches_the_backend_nor_does_its_removal() {
        let mut peers = peers();
        let real = lease("10.5.2.0/24", "10.200.0.2");
        let bogus = lease("10.5.2.0/25", "10.200.0.66");
        assert_eq!(
            admitted(&mut peers, LeaseEvent::Added(real.clone().into())),
            Some(LeaseEvent::Added(real.clone().into()))
        );
        assert_eq!(
            admitted(&mut peers, LeaseEvent::Added(bogus.clone().into())),
            None
        );
        assert_eq!(peers.refused().count(), 1);
        assert_eq!(
            admitted(&mut peers, LeaseEvent::Removed(bogus.into())),
            None
        );
        assert_eq!(peers.refused().count(), 0);
        assert_eq!(peers.accepted().collect::<Vec<_>>(), [&real]);
    }

    #[test]
    fn a_good_key_overwritten_with_a_bad_lease_removes_the_old_peer() {
        let mut peers = peers();
        let real = lease("10.5.2.0/24", "10.200.0.2");
        admitted(&mut peers, LeaseEvent::Added(real.clone().into()));
        let overwritten = lease("10.5.2.0/24", "10.200.0.1");
        assert_eq!(
            admitted(&mut peers, LeaseEvent::Added(overwritten.into())),
            Some(LeaseEvent::Removed(real.into()))
        );
        assert_eq!(peers.accepted().count(), 0);
    }

    #[test]
    fn a_snapshot_keeps_only_good_leases_and_remembers_the_rest() {
        let mut peers = peers();
        let good = lease("10.5.3.0/24", "10.200.0.3");
        let bad = lease("10.6.0.0/24", "10.200.0.4");
        assert_eq!(
            admitted(
                &mut peers,
                LeaseEvent::Snapshot(vec![good.clone().into(), bad.into()])
            ),
            Some(LeaseEvent::Snapshot(vec![good.clone().into()]))
        );
        assert_eq!(peers.refused().count(), 1);
        admitted(&mut peers, LeaseEvent::Snapshot(vec![good.into()]));
        assert_eq!(
            peers.refused().count(),
            0,
            "gone from the registry, gone here"
        );
    }

    #[test]
    fn unreadable_entries_are_kept_until_they_go() {
        let mut peers = peers();
        let key = "/coreos.com/network/subnets/10.5.9.0-24".to_string();
        let bad = LeaseEvent::Unreadable {
            key: key.clone(),
            why: Some("invalid lease value".into()),
        };
        assert_eq!(admitted(&mut peers, bad), None);
        assert_eq!(peers.unreadable().count(), 1);
        assert_eq!(
            admitted(&mut peers, LeaseEvent::Unreadable { key, why: None }),
            None
        );
        assert_eq!(peers.unreadable().count(), 0);
    }
}

#[cfg(test)]
mod ipv6_tests;

#[cfg(test)]
mod key_tests;

#[cfg(test)]
mod rule_tests;
