//! The other nodes' leases as this node acts on them: every lease event from the registry goes
//! through [`Peers::admit`], which lets a backend see only leases that passed
//! [`crate::lease_check`], and remembers the refused ones (with their reasons) for the log and
//! `twill status`.
//!
//! One check needs every lease at once: a WireGuard key names one peer, so of the leases with
//! one key only the first made ([`lease_check::first_made`]) is a peer, and the others are
//! refused as duplicates. That holds whatever order the leases arrive in: a lease made before
//! the peer that has its key takes the key over, and when the holder goes away (or changes its
//! key) the next one in line becomes the peer with that very event.

use crate::lease::{Lease, SubnetId};
use crate::lease_check::{self, AcceptedPeers, LeaseRules, Rejection};
use crate::registry::{LeaseEvent, LeaseNamer};
use ipnet::{Ipv4Net, Ipv6Net};
use std::collections::{BTreeMap, HashMap};
use twill_dataplane::engine::wireguard::PublicKey;

/// A lease that was refused, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub lease: Lease,
    pub reason: Rejection,
}

/// Accepted and refused peer leases, each keyed by its [`SubnetId`].
#[derive(Debug)]
pub struct Peers {
    rules: LeaseRules,
    /// How a lease is named in the log: its etcd key, or the flag that gave it.
    namer: LeaseNamer,
    accepted: BTreeMap<SubnetId, Lease>,
    refused: BTreeMap<SubnetId, Refused>,
    /// Entries among the leases that are not leases at all: key, and what is wrong.
    unreadable: BTreeMap<String, String>,
    /// The accepted lease that has each WireGuard key.
    keys: HashMap<PublicKey, SubnetId>,
    /// On a node with IPv6, the accepted lease that has each IPv6 subnet, so a lease's IPv6
    /// overlap check is O(log K) too.
    ipv6: BTreeMap<Ipv6Net, SubnetId>,
}

/// The accepted leases as the overlap checks see them.
struct Accepted<'a> {
    leases: &'a BTreeMap<SubnetId, Lease>,
    ipv6: &'a BTreeMap<Ipv6Net, SubnetId>,
}

impl AcceptedPeers for Accepted<'_> {
    /// Accepted IPv4 subnets never overlap each other, so only the nearest one on each side
    /// can overlap `subnet`.
    fn overlapping(&self, subnet: Ipv4Net) -> Option<Ipv4Net> {
        let id = SubnetId::V4(subnet);
        let below = self.leases.range(..id).next_back();
        let above = self.leases.range(id..).find(|(s, _)| **s != id);
        let near = below.into_iter().chain(above);
        let mut near = near.filter_map(|(_, lease)| lease.ipv4_subnet());
        near.find(|other| lease_check::overlaps(subnet, *other))
    }

    /// Accepted IPv6 subnets never overlap each other, so only the nearest one on each side
    /// can overlap `subnet`.
    fn overlapping_ipv6(&self, subnet: Ipv6Net, own: SubnetId) -> Option<(Ipv6Net, SubnetId)> {
        let below = self.ipv6.range(..=subnet).rev().find(|(_, s)| **s != own);
        let above = self.ipv6.range(subnet..).find(|(_, s)| **s != own);
        let mut near = below.into_iter().chain(above).map(|(v6, s)| (*v6, *s));
        near.find(|(other, _)| lease_check::overlaps_v6(subnet, *other))
    }
}

/// The subnets one event changed, each with its accepted lease before the event.
#[derive(Default)]
struct Touched(Vec<(SubnetId, Option<Lease>)>);

impl Peers {
    pub fn new(rules: LeaseRules, namer: LeaseNamer) -> Peers {
        Peers {
            rules,
            namer,
            accepted: BTreeMap::new(),
            refused: BTreeMap::new(),
            unreadable: BTreeMap::new(),
            keys: HashMap::new(),
            ipv6: BTreeMap::new(),
        }
    }

    /// Turns a registry event into the event the backend must see, if any: refused leases are
    /// left out, and a refused lease that goes away changes nothing. An event that changes more
    /// than one peer (a key passing from one lease to another) reaches the backend as a
    /// snapshot of all accepted leases.
    pub fn admit(&mut self, event: LeaseEvent) -> Option<LeaseEvent> {
        match event {
            LeaseEvent::Snapshot(all) => Some(LeaseEvent::Snapshot(self.replace_all(all))),
            LeaseEvent::Added(lease) => self.add(lease),
            LeaseEvent::Removed(lease) => self.remove(lease.id()),
            LeaseEvent::Unreadable { key, why } => {
                match why {
                    Some(why) => self.unreadable.insert(key, why),
                    None => self.unreadable.remove(&key),
                };
                None
            }
            own @ (LeaseEvent::OwnLease(_)
            | LeaseEvent::OwnLeaseTaken(_)
            | LeaseEvent::OwnLeaseGone(_)
            | LeaseEvent::ConfigChanged(_)) => Some(own),
        }
    }

    /// Checks every lease afresh, the first made first, so that of two leases with one key
    /// the first made is accepted and the other refused, as the events would have left them.
    fn replace_all(&mut self, mut all: Vec<Lease>) -> Vec<Lease> {
        let mut refused = std::mem::take(&mut self.refused);
        self.accepted.clear();
        self.keys.clear();
        self.ipv6.clear();
        all.sort_by(lease_check::by_creation);
        for lease in all {
            let known = refused.remove(&lease.id());
            self.judge(lease, known.as_ref(), &mut Touched::default());
        }
        self.accepted.values().cloned().collect()
    }

    fn add(&mut self, lease: Lease) -> Option<LeaseEvent> {
        let (subnet, mut touched) = (lease.id(), Touched::default());
        let known = self.refused.remove(&subnet);
        // The key that held a good lease now holds another: its old owner is gone.
        let vacated = self.unaccept(subnet, &mut touched);
        self.judge(lease, known.as_ref(), &mut touched);
        if let Some(key) = vacated.filter(|k| self.keys.get(k) != Some(&subnet)) {
            self.settle(key, &mut touched);
        }
        self.events(subnet, touched)
    }

    fn remove(&mut self, subnet: SubnetId) -> Option<LeaseEvent> {
        let mut touched = Touched::default();
        self.refused.remove(&subnet);
        if let Some(key) = self.unaccept(subnet, &mut touched) {
            self.settle(key, &mut touched);
        }
        self.events(subnet, touched)
    }

    /// Accepts or refuses `lease`, whose subnet holds no accepted lease now. Of two leases with
    /// one key the first made wins, even over one accepted already.
    fn judge(&mut self, lease: Lease, known: Option<&Refused>, touched: &mut Touched) {
        let accepted = Accepted {
            leases: &self.accepted,
            ipv6: &self.ipv6,
        };
        let key = match lease_check::admit_keyed(&self.rules, &accepted, &lease) {
            Ok(key) => key,
            Err(reason) => return self.refuse(lease, reason, known),
        };
        let Some((key, first)) = key.and_then(|k| Some((k, *self.keys.get(&k)?))) else {
            return self.accept(lease, key, touched);
        };
        let holder = self.accepted[&first].clone();
        if !lease_check::first_made(&lease, &holder) {
            return self.refuse(lease, Rejection::DuplicateKey { key, first }, known);
        }
        let to = lease.id();
        self.unaccept(first, touched);
        self.accept(lease, Some(key), touched);
        self.refuse(holder, Rejection::DuplicateKey { key, first: to }, None);
        // The leases refused as duplicates of the old holder now name the new one.
        self.settle(key, touched);
    }

    /// Checks again, first made first, every lease refused because another had `key`: the
    /// first becomes its peer if none has it now, and the rest name the one that has.
    fn settle(&mut self, key: PublicKey, touched: &mut Touched) {
        let waiting = self
            .refused
            .values()
            .filter(|r| matches!(r.reason, Rejection::DuplicateKey { key: k, .. } if k == key));
        let mut waiting: Vec<Lease> = waiting.map(|r| r.lease.clone()).collect();
        waiting.sort_by(lease_check::by_creation);
        for lease in waiting {
            let known = self.refused.remove(&lease.id());
            self.judge(lease, known.as_ref(), touched);
        }
    }

    fn accept(&mut self, lease: Lease, key: Option<PublicKey>, touched: &mut Touched) {
        let id = lease.id();
        touched.note(id, &self.accepted);
        if let Some(key) = key {
            self.keys.insert(key, id);
        }
        if let Some(v6) = lease.ipv6_subnet.filter(|_| self.rules.ipv6.is_some()) {
            self.ipv6.insert(v6, id);
        }
        self.accepted.insert(id, lease);
    }

    /// Takes the accepted lease at `subnet` away; the WireGuard key it leaves free, if any.
    fn unaccept(&mut self, subnet: SubnetId, touched: &mut Touched) -> Option<PublicKey> {
        touched.note(subnet, &self.accepted);
        let lease = self.accepted.remove(&subnet)?;
        if let Some(v6) = lease.ipv6_subnet {
            if self.ipv6.get(&v6) == Some(&subnet) {
                self.ipv6.remove(&v6);
            }
        }
        let key = lease_check::wireguard_key(&lease)?;
        if self.keys.get(&key) != Some(&subnet) {
            return None;
        }
        self.keys.remove(&key);
        Some(key)
    }

    /// Notes a refusal, warning once per lease and reason (a periodic re-list repeats them).
    fn refuse(&mut self, lease: Lease, reason: Rejection, known: Option<&Refused>) {
        let refused = Refused { lease, reason };
        if known != Some(&refused) {
            tracing::warn!(
                "ignoring lease {}: {}",
                self.namer.name(refused.lease.id()),
                refused.reason
            );
        }
        self.refused.insert(refused.lease.id(), refused);
    }

    /// What the backend must hear of an event about `subnet`: that lease as it is now (added,
    /// changed or removed), or, when the event changed other peers too, every accepted lease.
    fn events(&self, subnet: SubnetId, touched: Touched) -> Option<LeaseEvent> {
        let mut changes: Vec<LeaseEvent> = touched
            .0
            .into_iter()
            .filter_map(|(s, before)| match (before, self.accepted.get(&s)) {
                (Some(before), None) => Some(LeaseEvent::Removed(before)),
                (before, Some(now)) if s == subnet || before.as_ref() != Some(now) => {
                    Some(LeaseEvent::Added(now.clone()))
                }
                _ => None,
            })
            .collect();
        match changes.len() {
            0 | 1 => changes.pop(),
            _ => Some(LeaseEvent::Snapshot(
                self.accepted.values().cloned().collect(),
            )),
        }
    }

    /// The leases the backend has, lowest subnet first.
    pub fn accepted(&self) -> impl ExactSizeIterator<Item = &Lease> {
        self.accepted.values()
    }

    pub fn refused(&self) -> impl ExactSizeIterator<Item = &Refused> {
        self.refused.values()
    }

    /// Entries among the leases that are not leases: key, and what is wrong.
    pub fn unreadable(&self) -> impl ExactSizeIterator<Item = (&String, &String)> {
        self.unreadable.iter()
    }

    pub fn namer(&self) -> &LeaseNamer {
        &self.namer
    }
}

impl Touched {
    /// Remembers what `subnet` held before this event, the first time it changes.
    fn note(&mut self, subnet: SubnetId, accepted: &BTreeMap<SubnetId, Lease>) {
        if !self.0.iter().any(|(s, _)| *s == subnet) {
            self.0.push((subnet, accepted.get(&subnet).cloned()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::LeaseAttrs;
    use crate::lease_check::Ipv4Rules;

    fn lease(subnet: &str, ip: &str) -> Lease {
        Lease::new(
            subnet.parse().unwrap(),
            LeaseAttrs::udp(ip.parse().unwrap()),
        )
    }

    fn peers() -> Peers {
        peers_on(None)
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
            peers.admit(LeaseEvent::Added(real.clone())),
            Some(LeaseEvent::Added(real.clone()))
        );
        assert_eq!(peers.admit(LeaseEvent::Added(bogus.clone())), None);
        assert_eq!(peers.refused().count(), 1);
        assert_eq!(peers.admit(LeaseEvent::Removed(bogus)), None);
        assert_eq!(peers.refused().count(), 0);
        assert_eq!(peers.accepted().collect::<Vec<_>>(), [&real]);
    }

    #[test]
    fn a_good_key_overwritten_with_a_bad_lease_removes_the_old_peer() {
        let mut peers = peers();
        let real = lease("10.5.2.0/24", "10.200.0.2");
        peers.admit(LeaseEvent::Added(real.clone()));
        let overwritten = lease("10.5.2.0/24", "10.200.0.1");
        assert_eq!(
            peers.admit(LeaseEvent::Added(overwritten)),
            Some(LeaseEvent::Removed(real))
        );
        assert_eq!(peers.accepted().count(), 0);
    }

    #[test]
    fn a_snapshot_keeps_only_good_leases_and_remembers_the_rest() {
        let mut peers = peers();
        let good = lease("10.5.3.0/24", "10.200.0.3");
        let all = vec![good.clone(), lease("10.6.0.0/24", "10.200.0.4")];
        assert_eq!(
            peers.admit(LeaseEvent::Snapshot(all.clone())),
            Some(LeaseEvent::Snapshot(vec![good.clone()]))
        );
        assert_eq!(peers.refused().count(), 1);
        peers.admit(LeaseEvent::Snapshot(vec![good]));
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
        assert_eq!(peers.admit(bad), None);
        assert_eq!(peers.unreadable().count(), 1);
        assert_eq!(peers.admit(LeaseEvent::Unreadable { key, why: None }), None);
        assert_eq!(peers.unreadable().count(), 0);
    }
}

#[cfg(test)]
mod ipv6_tests;

#[cfg(test)]
mod key_tests;
