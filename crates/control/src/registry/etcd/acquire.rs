//! Lease acquisition in flannel's order (pkg/subnet/etcd/local_manager.go, tryAcquireLease),
//! dual-stack included, except that a lost create race is retried instead of ending the daemon.

use super::store::{Listing, Store};
use super::taken::Taken;
use crate::config::{Config, Ipv6Config};
use crate::lease::{Lease, LeaseAttrs, Subnets};
use anyhow::{anyhow, bail, Context};
use ipnet::Ipv6Net;
use rand::Rng;
use std::net::Ipv6Addr;
use std::time::Duration;
use tracing::{info, warn};

/// Each lost race means another node got a subnet, so progress is being made; this many in a
/// row means something else is wrong (e.g. a script racing us for every key).
const RACE_RETRIES: usize = 10;

/// flannel picks at random among the first this many free subnets, which spreads concurrent
/// joiners apart without scanning a huge network. IPv4 and IPv6 subnets are picked apart.
const CANDIDATES: usize = 100;

/// Acquires a lease for `attrs`:
/// 1. the lease that already carries our public IP, if it fits the config (re-put, new TTL);
/// 2. else `preferred` (the subnets from subnet.env) if they fit the config and are free;
/// 3. else a random free subnet among the first 100 between SubnetMin and SubnetMax, and on a
///    dual-stack network one among the first 100 between IPv6SubnetMin and IPv6SubnetMax.
pub(super) async fn acquire(
    store: &Store,
    config: &Config,
    attrs: &LeaseAttrs,
    preferred: Option<Subnets>,
    ttl: Duration,
) -> anyhow::Result<Lease> {
    if let (Some(v6), None) = (&config.ipv6, attrs.public_addrs.v6()) {
        bail!(
            "the network config enables IPv6 (IPv6Network {}), but this node's lease has no \
             PublicIPv6: give --public-ipv6 or an IPv6 address on the interface",
            v6.network
        );
    }
    for _ in 0..RACE_RETRIES {
        if let Some(lease) = try_acquire(store, config, attrs, preferred, ttl).await? {
            return Ok(lease);
        }
    }
    bail!("could not acquire a subnet: lost the race to other nodes {RACE_RETRIES} times in a row")
}

/// One attempt; `Ok(None)` when another node changed the chosen key first.
async fn try_acquire(
    store: &Store,
    config: &Config,
    attrs: &LeaseAttrs,
    preferred: Option<Subnets>,
    ttl: Duration,
) -> anyhow::Result<Option<Lease>> {
    let listing = store.list().await?;
    if let Some(found) = listing
        .leases
        .iter()
        .find(|l| is_ours(config, &l.lease, attrs))
    {
        let held = found.lease.subnets;
        match misfit(config, held) {
            None => {
                let lease = Lease::new(held, attrs.clone());
                let reused = store.replace(&lease, found.mod_revision, ttl).await?;
                log_outcome(reused, "reusing the lease of our public IP", &lease);
                return Ok(reused.then_some(lease));
            }
            Some(why) => {
                warn!(
                    "deleting lease {held} of our public IP {}: {why}",
                    attrs.public_addrs
                );
                store.delete(held).await?;
            }
        }
    }
    let lease = Lease::new(choose_subnets(config, &listing, preferred)?, attrs.clone());
    let created = store.create(&lease, ttl).await?;
    log_outcome(created, "acquired", &lease);
    Ok(created.then_some(lease))
}

/// Whether `lease` carries our public address: PublicIP, as flanneld matches, or on an
/// IPv6-only network, where no lease has a PublicIP, PublicIPv6.
fn is_ours(config: &Config, lease: &Lease, attrs: &LeaseAttrs) -> bool {
    let (theirs, ours) = (lease.public_addrs, attrs.public_addrs);
    match config.ipv4 {
        Some(_) => theirs.v4().is_some() && theirs.v4() == ours.v4(),
        None => theirs.v6().is_some() && theirs.v6() == ours.v6(),
    }
}

fn log_outcome(won: bool, action: &str, lease: &Lease) {
    let subnets = lease.subnets;
    if won {
        info!("{action} {subnets} for public IP {}", lease.public_addrs);
    } else {
        info!("lost the race for {subnets} to another node; retrying");
    }
}

/// Why a lease on `subnets` does not fit `config`, `None` if it does (flannel's
/// `isSubnetConfigCompat` and `isIPv6SubnetConfigCompat`): each subnet present where the
/// network has its family, leasable there, and absent otherwise.
fn misfit(config: &Config, subnets: Subnets) -> Option<String> {
    match (&config.ipv4, subnets.v4()) {
        (None, Some(v4)) => {
            return Some(format!(
                "it has the IPv4 subnet {v4}, and the network config is IPv6-only"
            ))
        }
        (Some(c), Some(v4)) if !c.is_leasable(v4) => {
            return Some(format!(
                "{v4} is not a /{} between SubnetMin {} and SubnetMax {}",
                c.subnet_len, c.subnet_min, c.subnet_max
            ))
        }
        (Some(_), None) => return Some("it has no IPv4 subnet".into()),
        _ => {}
    }
    match (&config.ipv6, subnets.v6()) {
        (None, None) => None,
        (None, Some(v6)) => Some(format!(
            "it has the IPv6 subnet {v6}, and the network config does not enable IPv6"
        )),
        (Some(c), None) => Some(format!(
            "it has no IPv6 subnet, and the network config enables IPv6 (IPv6Network {})",
            c.network
        )),
        (Some(c), Some(v6)) if !ipv6_leasable(c, v6) => Some(format!(
            "{v6} is not a /{} between IPv6SubnetMin {} and IPv6SubnetMax {}",
            c.subnet_len, c.subnet_min, c.subnet_max
        )),
        (Some(_), Some(_)) => None,
    }
}

fn ipv6_leasable(config: &Ipv6Config, subnet: Ipv6Net) -> bool {
    subnet.prefix_len() == config.subnet_len
        && subnet.network() >= config.subnet_min
        && subnet.network() <= config.subnet_max
}

/// Every leasable IPv6 subnet, lowest first.
fn ipv6_subnets(config: &Ipv6Config) -> impl Iterator<Item = Ipv6Net> + '_ {
    let step = 1u128 << (128 - u32::from(config.subnet_len));
    let (min, max) = (u128::from(config.subnet_min), u128::from(config.subnet_max));
    // Both bounds lie on a subnet boundary, so a step from below `max` lands at most on it.
    std::iter::successors(Some(min), move |&ip| (ip < max).then(|| ip + step)).map(move |ip| {
        Ipv6Net::new(Ipv6Addr::from(ip), config.subnet_len).expect("IPv6SubnetLen <= 126")
    })
}

fn choose_subnets(
    config: &Config,
    listing: &Listing,
    preferred: Option<Subnets>,
) -> anyhow::Result<Subnets> {
    let leases = || listing.leases.iter().map(|l| &l.lease);
    let taken_v4 = Taken::v4(leases().filter_map(|l| l.subnets.v4()));
    let taken_v6 = Taken::v6(leases().filter_map(|l| l.subnets.v6()));
    if let Some(p) = preferred {
        let free_v4 = p.v4().is_none_or(|v4| taken_v4.is_free_v4(v4));
        let free = free_v4 && p.v6().is_none_or(|v6| taken_v6.is_free_v6(v6));
        match misfit(config, p) {
            None if free => return Ok(p),
            None => info!("previous subnet {p} is taken; picking another"),
            Some(why) => info!(
                "previous subnet {p} does not fit the network config ({why}); picking another"
            ),
        }
    }
    let v4 = match &config.ipv4 {
        Some(c) => Some(
            pick(c.subnets().filter(|s| taken_v4.is_free_v4(*s))).ok_or_else(|| {
                anyhow!(
                    "no free subnet left between SubnetMin {} and SubnetMax {} of network {}",
                    c.subnet_min,
                    c.subnet_max,
                    c.network
                )
            })?,
        ),
        None => None,
    };
    let v6 = match &config.ipv6 {
        Some(c) => Some(
            pick(ipv6_subnets(c).filter(|s| taken_v6.is_free_v6(*s))).ok_or_else(|| {
                anyhow!(
                    "no free IPv6 subnet left between IPv6SubnetMin {} and IPv6SubnetMax {} \
                     of IPv6Network {}",
                    c.subnet_min,
                    c.subnet_max,
                    c.network
                )
            })?,
        ),
        None => None,
    };
    Subnets::from_parts(v4, v6).context("the network config enables neither IPv4 nor IPv6")
}

/// One of the first [`CANDIDATES`] of `free`, at random; `None` if there is none.
fn pick<T: Copy>(free: impl Iterator<Item = T>) -> Option<T> {
    let free: Vec<T> = free.take(CANDIDATES).collect();
    (!free.is_empty()).then(|| free[rand::rng().random_range(0..free.len())])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dual(v6: &str) -> Config {
        let json = format!(r#"{{"Network":"10.5.0.0/16","EnableIPv6":true,{v6}}}"#);
        Config::from_json(&json).unwrap()
    }

    fn subnets(v4: &str, v6: Option<&str>) -> Subnets {
        let v6 = v6.map(|s| s.parse().unwrap());
        Subnets::from_parts(Some(v4.parse().unwrap()), v6).unwrap()
    }

    #[test]
    fn ipv6_subnets_step_from_min_to_max() {
        let config = dual(
            r#""IPv6Network":"fd10::/48","IPv6SubnetMin":"fd10:0:0:fffd::","IPv6SubnetMax":"fd10:0:0:ffff::""#,
        );
        let all: Vec<String> = ipv6_subnets(config.ipv6.as_ref().unwrap())
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            all,
            [
                "fd10:0:0:fffd::/64",
                "fd10:0:0:fffe::/64",
                "fd10:0:0:ffff::/64"
            ]
        );
        let top = dual(r#""IPv6Network":"ffff::/16","IPv6SubnetMin":"ffff:ffff:ffff:ffff::""#);
        let last: Vec<Ipv6Net> = ipv6_subnets(top.ipv6.as_ref().unwrap()).collect();
        assert_eq!(last, ["ffff:ffff:ffff:ffff::/64".parse().unwrap()]);
    }

    #[test]
    fn a_lease_fits_a_dual_stack_config_only_with_a_leasable_ipv6_subnet() {
        let config = dual(r#""IPv6Network":"fd10::/48","IPv6SubnetMin":"fd10:0:0:10::""#);
        assert_eq!(
            misfit(&config, subnets("10.5.1.0/24", Some("fd10:0:0:10::/64"))),
            None
        );
        let cases = [
            (
                subnets("10.5.1.0/24", None),
                "it has no IPv6 subnet, and the network config enables IPv6 (IPv6Network fd10::/48)",
            ),
            (
                subnets("10.5.1.0/24", Some("fd10:0:0:f::/64")),
                "fd10:0:0:f::/64 is not a /64 between IPv6SubnetMin fd10:0:0:10:: and \
                 IPv6SubnetMax fd10:0:0:ffff::",
            ),
            (
                subnets("10.5.1.0/24", Some("fd10:0:0:10::/56")),
                "fd10:0:0:10::/56 is not a /64",
            ),
            (
                subnets("10.6.1.0/24", Some("fd10:0:0:10::/64")),
                "10.6.1.0/24 is not a /24 between SubnetMin 10.5.1.0 and SubnetMax 10.5.255.0",
            ),
        ];
        for (s, want) in cases {
            let why = misfit(&config, s).unwrap_or_else(|| panic!("{s} fits"));
            assert!(why.starts_with(want), "{s}: {why}");
        }
        let v4 = Config::from_json(r#"{"Network":"10.5.0.0/16"}"#).unwrap();
        assert_eq!(
            misfit(&v4, subnets("10.5.1.0/24", Some("fd10::/64"))).unwrap(),
            "it has the IPv6 subnet fd10::/64, and the network config does not enable IPv6"
        );
    }
}
