//! The other nodes' leases as this node acts on them: every lease event from the registry goes
//! through [`Peers::admit`], which lets a backend see only leases that passed
//! [`crate::lease_check`], and remembers the refused ones (with their reasons) for the log and
//! `twill status`.

use crate::lease::Lease;
use crate::lease_check::{self, LeaseRules, Rejection};
use crate::registry::{LeaseEvent, LeaseNamer};
use ipnet::Ipv4Net;
use std::collections::BTreeMap;

/// A lease that was refused, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub lease: Lease,
    pub reason: Rejection,
}

/// Accepted and refused peer leases, each keyed by subnet.
#[derive(Debug)]
pub struct Peers {
    rules: LeaseRules,
    /// How a lease is named in the log: its etcd key, or the flag that gave it.
    namer: LeaseNamer,
    accepted: BTreeMap<Ipv4Net, Lease>,
    refused: BTreeMap<Ipv4Net, Refused>,
    /// Entries among the leases that are not leases at all: key, and what is wrong.
    unreadable: BTreeMap<String, String>,
}

impl Peers {
    pub fn new(rules: LeaseRules, namer: LeaseNamer) -> Peers {
        Peers {
            rules,
            namer,
            accepted: BTreeMap::new(),
            refused: BTreeMap::new(),
            unreadable: BTreeMap::new(),
        }
    }

    /// Turns a registry event into the event the backend must see, if any: refused leases are
    /// left out, and a refused lease that goes away changes nothing.
    pub fn admit(&mut self, event: LeaseEvent) -> Option<LeaseEvent> {
        match event {
            LeaseEvent::Snapshot(all) => Some(LeaseEvent::Snapshot(self.replace_all(all))),
            LeaseEvent::Added(lease) => self.add(lease),
            LeaseEvent::Removed(lease) => {
                self.refused.remove(&lease.subnet);
                self.accepted.remove(&lease.subnet).map(LeaseEvent::Removed)
            }
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

    fn replace_all(&mut self, all: Vec<Lease>) -> Vec<Lease> {
        let mut refused = std::mem::take(&mut self.refused);
        self.accepted.clear();
        for lease in all {
            match lease_check::admit(&self.rules, &self.accepted, &lease) {
                Ok(()) => {
                    self.accepted.insert(lease.subnet, lease);
                }
                Err(reason) => {
                    let known = refused.remove(&lease.subnet);
                    self.refuse(lease, reason, known.as_ref());
                }
            }
        }
        self.accepted.values().cloned().collect()
    }

    fn add(&mut self, lease: Lease) -> Option<LeaseEvent> {
        let subnet = lease.subnet;
        match lease_check::admit(&self.rules, &self.accepted, &lease) {
            Ok(()) => {
                self.refused.remove(&subnet);
                self.accepted.insert(subnet, lease.clone());
                Some(LeaseEvent::Added(lease))
            }
            Err(reason) => {
                let known = self.refused.remove(&subnet);
                self.refuse(lease, reason, known.as_ref());
                // The key that held a good lease now holds a bad one: its old owner is gone.
                self.accepted.remove(&subnet).map(LeaseEvent::Removed)
            }
        }
    }

    /// Notes a refusal, warning once per lease and reason (a periodic re-list repeats them).
    fn refuse(&mut self, lease: Lease, reason: Rejection, known: Option<&Refused>) {
        let refused = Refused { lease, reason };
        if known != Some(&refused) {
            tracing::warn!(
                "ignoring lease {}: {}",
                self.namer.name(refused.lease.subnet),
                refused.reason
            );
        }
        self.refused.insert(refused.lease.subnet, refused);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::LeaseAttrs;

    fn lease(subnet: &str, ip: &str) -> Lease {
        Lease::new(
            subnet.parse().unwrap(),
            LeaseAttrs::udp(ip.parse().unwrap()),
        )
    }

    fn peers() -> Peers {
        let rules = LeaseRules {
            network: "10.5.0.0/16".parse().unwrap(),
            subnet_len: 24,
            own_subnet: "10.5.1.0/24".parse().unwrap(),
            own_public_ip: "10.200.0.1".parse().unwrap(),
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
