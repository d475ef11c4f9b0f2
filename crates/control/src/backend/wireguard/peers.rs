//! The WireGuard peers the other nodes' leases describe, by subnet. [`crate::lease_check`]
//! already refuses a wireguard lease whose data is unusable; a lease of another backend type
//! is skipped here, with one warning, repeated only when that lease changes.

use crate::lease::Lease;
use ipnet::Ipv4Net;
use std::collections::BTreeMap;
use std::net::SocketAddrV4;
use twill_dataplane::engine::wireguard::WgPeerSpec;

/// What a lease event did to the peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Unchanged,
    /// A peer came, or changed (`old` is what it was: a new key means a new peer).
    Set {
        old: Option<WgPeerSpec>,
        new: WgPeerSpec,
    },
    Removed(WgPeerSpec),
}

pub struct PeerBook {
    /// The port of a lease that names none (flannel before leases carried `Port`): ours.
    default_port: u16,
    peers: BTreeMap<Ipv4Net, WgPeerSpec>,
    /// Why a lease was skipped, so each reason is logged once.
    skipped: BTreeMap<Ipv4Net, String>,
}

impl PeerBook {
    pub fn new(default_port: u16) -> PeerBook {
        PeerBook {
            default_port,
            peers: BTreeMap::new(),
            skipped: BTreeMap::new(),
        }
    }

    pub fn add(&mut self, lease: &Lease) -> Change {
        match self.spec(lease) {
            Some(new) => match self.peers.insert(lease.subnet, new) {
                Some(old) if old == new => Change::Unchanged,
                old => Change::Set { old, new },
            },
            None => self
                .peers
                .remove(&lease.subnet)
                .map_or(Change::Unchanged, Change::Removed),
        }
    }

    pub fn remove(&mut self, lease: &Lease) -> Change {
        self.skipped.remove(&lease.subnet);
        self.peers
            .remove(&lease.subnet)
            .map_or(Change::Unchanged, Change::Removed)
    }

    /// Make the peers exactly those of `leases`; returns what that changed, peer by peer.
    pub fn reconcile(&mut self, leases: &[Lease]) -> Vec<Change> {
        self.skipped
            .retain(|s, _| leases.iter().any(|l| l.subnet == *s));
        let now: BTreeMap<_, _> = leases
            .iter()
            .filter_map(|l| Some((l.subnet, self.spec(l)?)))
            .collect();
        let before = std::mem::replace(&mut self.peers, now);
        let set = self.peers.iter().filter_map(|(subnet, new)| {
            let old = before.get(subnet).copied();
            (old != Some(*new)).then_some(Change::Set { old, new: *new })
        });
        let mut changes: Vec<Change> = set.collect();
        let gone = before
            .into_iter()
            .filter(|(s, _)| !self.peers.contains_key(s));
        changes.extend(gone.map(|(_, old)| Change::Removed(old)));
        changes
    }

    pub fn specs(&self) -> Vec<WgPeerSpec> {
        self.peers.values().copied().collect()
    }

    fn spec(&mut self, lease: &Lease) -> Option<WgPeerSpec> {
        match parse(lease, self.default_port) {
            Ok(spec) => {
                self.skipped.remove(&lease.subnet);
                Some(spec)
            }
            Err(why) => {
                if self.skipped.get(&lease.subnet) != Some(&why) {
                    tracing::warn!(subnet = %lease.subnet, "skipping lease: {why}");
                    self.skipped.insert(lease.subnet, why);
                }
                None
            }
        }
    }
}

/// A lease as a WireGuard peer: its subnet, `PublicIP:Port` and `PublicKey`.
fn parse(lease: &Lease, default_port: u16) -> Result<WgPeerSpec, String> {
    let (public_key, port) = lease.wireguard_data()?;
    Ok(WgPeerSpec {
        subnet: lease.subnet,
        endpoint: SocketAddrV4::new(lease.public_ip, port.unwrap_or(default_port)),
        public_key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::LeaseAttrs;
    use serde_json::Value;

    const KEY: &str = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=";

    fn lease(subnet: &str, data: Value) -> Lease {
        let attrs = LeaseAttrs {
            public_ip: "10.200.0.2".parse().unwrap(),
            public_ipv6: None,
            backend_type: Some("wireguard".into()),
            backend_data: Some(data.into()),
            backend_v6_data: None,
        };
        Lease::new(subnet.parse().unwrap(), attrs)
    }

    fn good(subnet: &str) -> Lease {
        lease(subnet, serde_json::json!({"PublicKey": KEY, "Port": 51999}))
    }

    #[test]
    fn a_lease_becomes_a_peer_at_its_public_ip_and_port() {
        let mut book = PeerBook::new(51820);
        let Change::Set { old: None, new } = book.add(&good("10.5.2.0/24")) else {
            panic!("not added");
        };
        assert_eq!(new.endpoint.to_string(), "10.200.0.2:51999");
        assert_eq!(new.public_key.to_string(), KEY);
        assert_eq!(book.add(&good("10.5.2.0/24")), Change::Unchanged);
        let old_flannel = lease("10.5.3.0/24", serde_json::json!({ "PublicKey": KEY }));
        let Change::Set { new, .. } = book.add(&old_flannel) else {
            panic!("not added");
        };
        assert_eq!(new.endpoint.port(), 51820, "no Port: our own ListenPort");
    }

    #[test]
    fn a_new_key_replaces_the_peer() {
        let mut book = PeerBook::new(51820);
        book.add(&good("10.5.2.0/24"));
        let other = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";
        let rekeyed = lease("10.5.2.0/24", serde_json::json!({ "PublicKey": other }));
        let Change::Set {
            old: Some(old),
            new,
        } = book.add(&rekeyed)
        else {
            panic!("not replaced");
        };
        assert_ne!(old.public_key, new.public_key);
    }

    #[test]
    fn malformed_leases_are_skipped_and_remove_what_they_replace() {
        let mut book = PeerBook::new(51820);
        book.add(&good("10.5.2.0/24"));
        let bad = lease("10.5.2.0/24", serde_json::json!({"PublicKey": "short"}));
        assert!(matches!(book.add(&bad), Change::Removed(_)));
        assert_eq!(
            book.skipped[&bad.subnet],
            "its PublicKey \"short\" is not a WireGuard key: not base64"
        );
        for data in [
            serde_json::json!({}),
            serde_json::json!({"PublicKey": 5}),
            serde_json::json!({"PublicKey": KEY, "Port": 0}),
        ] {
            assert_eq!(book.add(&lease("10.5.4.0/24", data)), Change::Unchanged);
        }
        assert!(book.specs().is_empty());
    }

    #[test]
    fn reconcile_keeps_exactly_the_good_leases() {
        let mut book = PeerBook::new(51820);
        book.add(&good("10.5.9.0/24"));
        let bad = lease("10.5.3.0/24", serde_json::json!({}));
        book.reconcile(&[good("10.5.2.0/24"), bad.clone()]);
        let subnets: Vec<String> = book.specs().iter().map(|s| s.subnet.to_string()).collect();
        assert_eq!(subnets, ["10.5.2.0/24"]);
        assert!(book.skipped.contains_key(&bad.subnet));
        book.reconcile(&[]);
        assert!(book.skipped.is_empty() && book.specs().is_empty());
    }

    #[test]
    fn reconcile_returns_only_what_changed() {
        let mut book = PeerBook::new(51820);
        let (kept, moved, gone) = (
            good("10.5.2.0/24"),
            good("10.5.3.0/24"),
            good("10.5.4.0/24"),
        );
        let first = book.reconcile(&[kept.clone(), moved.clone(), gone.clone()]);
        assert_eq!(first.len(), 3);
        assert!(first
            .iter()
            .all(|c| matches!(c, Change::Set { old: None, .. })));
        assert!(book
            .reconcile(&[kept.clone(), moved.clone(), gone.clone()])
            .is_empty());

        let (before, removed) = (book.specs()[1], book.specs()[2]);
        assert_eq!(removed.subnet, gone.subnet);
        let mut moved_now = moved.clone();
        moved_now.public_ip = "10.200.0.77".parse().unwrap();
        let changes = book.reconcile(&[kept, moved_now]);
        let after = book.specs()[1];
        assert_eq!(
            changes,
            [
                Change::Set {
                    old: Some(before),
                    new: after
                },
                Change::Removed(removed),
            ]
        );
    }
}
