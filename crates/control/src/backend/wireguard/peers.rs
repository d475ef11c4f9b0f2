//! The WireGuard peers the other nodes' leases describe, by subnet, on each of this node's
//! devices. The lease gate already refuses a wireguard lease this node's Mode cannot read
//! ([`crate::lease_check::wireguard`]); one that still fails is skipped here, on every device, with one
//! warning, repeated only when that lease changes. A lease of another backend type is
//! skipped the same way.

use crate::lease::{Lease, SubnetId};
use crate::lease_check::wireguard::{LeasePeers, LeaseReader};
use std::collections::BTreeMap;
use twill_dataplane::engine::wireguard::{Device, WgPeerSpec};

/// What a lease event did to the peers of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A peer came, or changed (`old` is what it was: a new key means a new peer).
    Set {
        old: Option<WgPeerSpec>,
        new: WgPeerSpec,
    },
    Removed(WgPeerSpec),
}

pub struct PeerBook {
    reader: LeaseReader,
    peers: BTreeMap<SubnetId, LeasePeers>,
    /// Why a lease was skipped, so each reason is logged once.
    skipped: BTreeMap<SubnetId, String>,
}

impl PeerBook {
    pub fn new(reader: LeaseReader) -> PeerBook {
        PeerBook {
            reader,
            peers: BTreeMap::new(),
            skipped: BTreeMap::new(),
        }
    }

    pub fn add(&mut self, lease: &Lease) -> Vec<(Device, Change)> {
        let new = self.read(lease);
        let old = match new {
            Some(new) => self.peers.insert(lease.id(), new),
            None => self.peers.remove(&lease.id()),
        };
        changes(old.as_ref(), new.as_ref())
    }

    pub fn remove(&mut self, lease: &Lease) -> Vec<(Device, Change)> {
        self.skipped.remove(&lease.id());
        changes(self.peers.remove(&lease.id()).as_ref(), None)
    }

    /// Make the peers exactly those of `leases`; returns what that changed, peer by peer.
    pub fn reconcile(&mut self, leases: &[Lease]) -> Vec<(Device, Change)> {
        self.skipped
            .retain(|s, _| leases.iter().any(|l| l.id() == *s));
        let now: BTreeMap<_, _> = leases
            .iter()
            .filter_map(|l| Some((l.id(), self.read(l)?)))
            .collect();
        let before = std::mem::replace(&mut self.peers, now);
        let mut changed: Vec<(Device, Change)> = self
            .peers
            .iter()
            .flat_map(|(subnet, new)| changes(before.get(subnet), Some(new)))
            .collect();
        let gone = before.iter().filter(|(s, _)| !self.peers.contains_key(s));
        changed.extend(gone.flat_map(|(_, old)| changes(Some(old), None)));
        changed
    }

    /// The peers of `device`.
    pub fn specs(&self, device: Device) -> Vec<WgPeerSpec> {
        self.peers.values().filter_map(|p| on(device, p)).collect()
    }

    fn read(&mut self, lease: &Lease) -> Option<LeasePeers> {
        match self.reader.read(lease) {
            Ok(peers) => {
                self.skipped.remove(&lease.id());
                Some(peers)
            }
            Err(why) => {
                if self.skipped.get(&lease.id()) != Some(&why) {
                    tracing::warn!(subnet = %lease.id(), "skipping lease: {why}");
                    self.skipped.insert(lease.id(), why);
                }
                None
            }
        }
    }
}

/// A lease's peer on `device`, if it has one there.
fn on(device: Device, peers: &LeasePeers) -> Option<WgPeerSpec> {
    match device {
        Device::Main => Some(peers.main),
        Device::V6 => peers.v6,
    }
}

/// What going from `old` to `new` changes on each device.
fn changes(old: Option<&LeasePeers>, new: Option<&LeasePeers>) -> Vec<(Device, Change)> {
    [Device::Main, Device::V6]
        .into_iter()
        .filter_map(|device| {
            let (old, new) = (
                old.and_then(|p| on(device, p)),
                new.and_then(|p| on(device, p)),
            );
            let change = match (old, new) {
                (old, Some(new)) if old != Some(new) => Change::Set { old, new },
                (Some(old), None) => Change::Removed(old),
                _ => return None,
            };
            Some((device, change))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::wireguard::Mode;
    use crate::lease::{BackendData, LeaseAttrs};
    use serde_json::Value;

    const KEY: &str = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=";

    fn book(mode: Mode) -> PeerBook {
        PeerBook::new(LeaseReader {
            mode,
            listen_port: 51820,
            listen_port_v6: 51821,
            own_public_ipv6: Some("fd00:200::1".parse().unwrap()),
        })
    }

    fn lease(subnet: &str, data: Value) -> Lease {
        let ip: std::net::Ipv4Addr = "10.200.0.2".parse().unwrap();
        let attrs = LeaseAttrs::typed(ip, Some("wireguard"), Some(data.into()));
        Lease::new(subnet.parse::<ipnet::Ipv4Net>().unwrap(), attrs)
    }

    fn good(subnet: &str) -> Lease {
        lease(subnet, serde_json::json!({"PublicKey": KEY, "Port": 51999}))
    }

    /// `good(subnet)` with an IPv6 side, as flanneld writes a dual-stack lease.
    fn dual(subnet: &str, subnet6: &str) -> Lease {
        let attrs = good(subnet).attrs().with_ipv6(
            "fd00:200::2".parse().unwrap(),
            Some(BackendData::wireguard(KEY, 51998)),
        );
        Lease::new(subnet.parse::<ipnet::Ipv4Net>().unwrap(), attrs)
            .with_ipv6_subnet(subnet6.parse().unwrap())
    }

    fn set(device: Device, change: &(Device, Change)) -> Option<WgPeerSpec> {
        match change {
            (d, Change::Set { new, .. }) if *d == device => Some(*new),
            _ => None,
        }
    }

    #[test]
    fn a_lease_becomes_a_peer_at_its_public_ip_and_port() {
        let mut book = book(Mode::Separate);
        let changes = book.add(&good("10.5.2.0/24"));
        let [(Device::Main, Change::Set { old: None, new })] = changes[..] else {
            panic!("not added: {changes:?}");
        };
        assert_eq!(new.endpoint.to_string(), "10.200.0.2:51999");
        assert_eq!(new.public_key.to_string(), KEY);
        assert_eq!(book.add(&good("10.5.2.0/24")), []);
        let old_flannel = lease("10.5.3.0/24", serde_json::json!({ "PublicKey": KEY }));
        let new = set(Device::Main, &book.add(&old_flannel)[0]).unwrap();
        assert_eq!(new.endpoint.port(), 51820, "no Port: our own ListenPort");
    }

    #[test]
    fn a_dual_stack_lease_is_a_peer_on_each_device_in_mode_separate_and_on_one_in_the_others() {
        let mut separate = book(Mode::Separate);
        let changes = separate.add(&dual("10.5.2.0/24", "fd10:0:0:2::/64"));
        let main = set(Device::Main, &changes[0]).unwrap();
        let v6 = set(Device::V6, &changes[1]).unwrap();
        assert_eq!(main.endpoint.to_string(), "10.200.0.2:51999");
        assert_eq!(v6.endpoint.to_string(), "[fd00:200::2]:51998");
        assert_eq!(separate.specs(Device::V6), [v6]);
        // The lease loses its IPv6 side: its flannel-wg-v6 peer goes, flannel-wg's changes.
        let changes = separate.add(&good("10.5.2.0/24"));
        assert_eq!(changes.len(), 2, "{changes:?}");
        assert_eq!(changes[1], (Device::V6, Change::Removed(v6)));
        assert!(separate.specs(Device::V6).is_empty());

        let mut one = book(Mode::Ipv6);
        let changes = one.add(&dual("10.5.2.0/24", "fd10:0:0:2::/64"));
        let [(Device::Main, Change::Set { new, .. })] = changes[..] else {
            panic!("{changes:?}");
        };
        assert_eq!(new.endpoint.to_string(), "[fd00:200::2]:51999");
        assert_eq!(new.subnet6, Some("fd10:0:0:2::/64".parse().unwrap()));
    }

    #[test]
    fn a_new_key_replaces_the_peer() {
        let mut book = book(Mode::Separate);
        book.add(&good("10.5.2.0/24"));
        let other = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";
        let rekeyed = lease("10.5.2.0/24", serde_json::json!({ "PublicKey": other }));
        let changes = book.add(&rekeyed);
        let [(
            Device::Main,
            Change::Set {
                old: Some(old),
                new,
            },
        )] = changes[..]
        else {
            panic!("not replaced");
        };
        assert_ne!(old.public_key, new.public_key);
    }

    #[test]
    fn malformed_leases_are_skipped_on_every_device_and_remove_what_they_replace() {
        let mut book = book(Mode::Separate);
        book.add(&dual("10.5.2.0/24", "fd10:0:0:2::/64"));
        let bad = lease("10.5.2.0/24", serde_json::json!({"PublicKey": "short"}));
        let changes = book.add(&bad);
        assert!(changes.iter().all(|(_, c)| matches!(c, Change::Removed(_))));
        assert_eq!(changes.len(), 2);
        assert_eq!(
            book.skipped[&bad.id()],
            "its PublicKey \"short\" is not a WireGuard key: not base64"
        );
        let mut no_v6_data = dual("10.5.4.0/24", "fd10:0:0:4::/64");
        no_v6_data.backend_v6_data = None;
        for lease in [
            lease("10.5.4.0/24", serde_json::json!({})),
            lease("10.5.4.0/24", serde_json::json!({"PublicKey": 5})),
            lease(
                "10.5.4.0/24",
                serde_json::json!({"PublicKey": KEY, "Port": 0}),
            ),
            no_v6_data,
        ] {
            assert_eq!(book.add(&lease), []);
        }
        assert!(book.specs(Device::Main).is_empty() && book.specs(Device::V6).is_empty());
    }

    #[test]
    fn reconcile_keeps_exactly_the_good_leases() {
        let mut book = book(Mode::Separate);
        book.add(&good("10.5.9.0/24"));
        let bad = lease("10.5.3.0/24", serde_json::json!({}));
        book.reconcile(&[dual("10.5.2.0/24", "fd10:0:0:2::/64"), bad.clone()]);
        let subnets = |device| -> Vec<String> {
            let specs = book.specs(device);
            specs.iter().map(|s| s.subnet.to_string()).collect()
        };
        assert_eq!(subnets(Device::Main), ["10.5.2.0/24"]);
        assert_eq!(subnets(Device::V6), ["10.5.2.0/24"]);
        assert!(book.skipped.contains_key(&bad.id()));
        book.reconcile(&[]);
        assert!(book.skipped.is_empty() && book.specs(Device::Main).is_empty());
    }

    #[test]
    fn reconcile_returns_only_what_changed() {
        let mut book = book(Mode::Separate);
        let (kept, moved, gone) = (
            good("10.5.2.0/24"),
            good("10.5.3.0/24"),
            dual("10.5.4.0/24", "fd10:0:0:4::/64"),
        );
        let first = book.reconcile(&[kept.clone(), moved.clone(), gone.clone()]);
        assert_eq!(first.len(), 4);
        assert!(first
            .iter()
            .all(|(_, c)| matches!(c, Change::Set { old: None, .. })));
        assert!(book
            .reconcile(&[kept.clone(), moved.clone(), gone.clone()])
            .is_empty());

        let (before, removed) = (book.specs(Device::Main)[1], book.specs(Device::Main)[2]);
        let removed6 = book.specs(Device::V6)[0];
        assert_eq!(removed.subnet, gone.subnets.v4().unwrap());
        let mut moved_now = moved.clone();
        moved_now.public_addrs = "10.200.0.77".parse::<std::net::Ipv4Addr>().unwrap().into();
        let changes = book.reconcile(&[kept, moved_now]);
        let after = book.specs(Device::Main)[1];
        assert_eq!(
            changes,
            [
                (
                    Device::Main,
                    Change::Set {
                        old: Some(before),
                        new: after
                    }
                ),
                (Device::Main, Change::Removed(removed)),
                (Device::V6, Change::Removed(removed6)),
            ]
        );
    }
}
