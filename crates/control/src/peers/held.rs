//! What the accepted leases hold: every [`Claim`] of every accepted lease, indexed so that the
//! holders of what a new lease claims are found in O(log K). Accepted leases never clash, so
//! each thing has one holder at most, and the nearest subnets on either side are the only ones
//! a subnet can overlap.

use crate::host::netlink::MacAddr;
use crate::lease::SubnetId;
use crate::lease_check::{Claim, VtepFamily};
use ipnet::{Ipv4Net, Ipv6Net};
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use twill_dataplane::engine::wireguard::PublicKey;

/// Each claim of the accepted leases, with the [`SubnetId`] of the lease that holds it.
#[derive(Debug, Default)]
pub(super) struct Held {
    subnets: BTreeMap<Ipv4Net, SubnetId>,
    ipv6_subnets: BTreeMap<Ipv6Net, SubnetId>,
    endpoints: HashMap<(IpAddr, Option<u16>), SubnetId>,
    keys: HashMap<PublicKey, SubnetId>,
    vtep_macs: HashMap<(VtepFamily, MacAddr), SubnetId>,
}

impl Held {
    pub fn clear(&mut self) {
        *self = Held::default();
    }

    /// Notes that the lease `holder` holds `claims`.
    pub fn insert(&mut self, claims: &[Claim], holder: SubnetId) {
        for claim in claims {
            match *claim {
                Claim::Subnet(subnet) => self.subnets.insert(subnet, holder),
                Claim::Ipv6Subnet(subnet) => self.ipv6_subnets.insert(subnet, holder),
                Claim::Endpoint { ip, port } => self.endpoints.insert((ip, port), holder),
                Claim::Key(key) => self.keys.insert(key, holder),
                Claim::VtepMac { family, mac } => self.vtep_macs.insert((family, mac), holder),
            };
        }
    }

    /// Forgets the `claims` of the lease `holder`.
    pub fn remove(&mut self, claims: &[Claim], holder: SubnetId) {
        for claim in claims {
            let held = match *claim {
                Claim::Subnet(subnet) => remove_if(&mut self.subnets, &subnet, holder),
                Claim::Ipv6Subnet(subnet) => remove_if(&mut self.ipv6_subnets, &subnet, holder),
                Claim::Endpoint { ip, port } => {
                    remove_held(&mut self.endpoints, &(ip, port), holder)
                }
                Claim::Key(key) => remove_held(&mut self.keys, &key, holder),
                Claim::VtepMac { family, mac } => {
                    remove_held(&mut self.vtep_macs, &(family, mac), holder)
                }
            };
            debug_assert!(held, "{claim:?} was not held by {holder}");
        }
    }

    /// Every accepted lease that holds something `claims` clashes with, each once, with the
    /// first such thing it holds.
    pub fn holders(&self, claims: &[Claim]) -> Vec<(Claim, SubnetId)> {
        let mut found: Vec<(Claim, SubnetId)> = Vec::new();
        for claim in claims {
            for (held, holder) in self.clashing(claim) {
                if !found.iter().any(|(_, h)| *h == holder) {
                    found.push((held, holder));
                }
            }
        }
        found
    }

    /// What the accepted leases hold that clashes with `claim`, and who holds it.
    fn clashing(&self, claim: &Claim) -> Vec<(Claim, SubnetId)> {
        match *claim {
            Claim::Subnet(subnet) => {
                let range = Ipv4Net::new(subnet.network(), 0).expect("/0")
                    ..=Ipv4Net::new(subnet.broadcast(), 32).expect("/32");
                overlapping(&self.subnets, subnet, range, |s| {
                    s.contains(&subnet.network())
                })
                .map(|(s, h)| (Claim::Subnet(s), h))
                .collect()
            }
            Claim::Ipv6Subnet(subnet) => {
                let range = Ipv6Net::new(subnet.network(), 0).expect("/0")
                    ..=Ipv6Net::new(subnet.broadcast(), 128).expect("/128");
                overlapping(&self.ipv6_subnets, subnet, range, |s| {
                    s.contains(&subnet.network())
                })
                .map(|(s, h)| (Claim::Ipv6Subnet(s), h))
                .collect()
            }
            Claim::Endpoint { ip, port } => held_by(&self.endpoints, &(ip, port), claim),
            Claim::Key(key) => held_by(&self.keys, &key, claim),
            Claim::VtepMac { family, mac } => held_by(&self.vtep_macs, &(family, mac), claim),
        }
    }
}

/// The subnets of `held` that overlap `subnet`: the nearest one below it, if it contains
/// `subnet`'s first address, and every one whose first address lies in `subnet` (`inside`
/// spans them). Accepted subnets never overlap each other, so no other can.
fn overlapping<'a, N: Ord + Copy>(
    held: &'a BTreeMap<N, SubnetId>,
    subnet: N,
    inside: std::ops::RangeInclusive<N>,
    contains_start: impl Fn(&N) -> bool,
) -> impl Iterator<Item = (N, SubnetId)> + 'a {
    let below = held.range(..subnet).next_back();
    let below = below.filter(|(s, _)| contains_start(s));
    below
        .into_iter()
        .chain(held.range(inside))
        .map(|(s, h)| (*s, *h))
}

/// `claim` with its holder, if `key`, what it claims, is held.
fn held_by<K: Eq + std::hash::Hash>(
    map: &HashMap<K, SubnetId>,
    key: &K,
    claim: &Claim,
) -> Vec<(Claim, SubnetId)> {
    map.get(key).map(|h| (*claim, *h)).into_iter().collect()
}

fn remove_held<K: Eq + std::hash::Hash>(
    map: &mut HashMap<K, SubnetId>,
    key: &K,
    holder: SubnetId,
) -> bool {
    let held = map.get(key) == Some(&holder);
    held && map.remove(key).is_some()
}

fn remove_if<K: Ord>(map: &mut BTreeMap<K, SubnetId>, key: &K, holder: SubnetId) -> bool {
    let held = map.get(key) == Some(&holder);
    held && map.remove(key).is_some()
}
