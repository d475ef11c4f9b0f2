//! Lease acquisition in flannel's order (pkg/subnet/etcd/local_manager.go, tryAcquireLease),
//! except that a lost create race is retried instead of ending the daemon.

use super::store::{Listing, Store};
use crate::config::Config;
use crate::lease::{Lease, LeaseAttrs};
use anyhow::bail;
use ipnet::Ipv4Net;
use rand::Rng;
use std::collections::BTreeSet;
use std::time::Duration;
use tracing::{info, warn};

/// Each lost race means another node got a subnet, so progress is being made; this many in a
/// row means something else is wrong (e.g. a script racing us for every key).
const RACE_RETRIES: usize = 10;

/// flannel picks at random among the first this many free subnets, which spreads concurrent
/// joiners apart without scanning a huge network.
const CANDIDATES: usize = 100;

/// Acquires a lease for `attrs`:
/// 1. the lease that already carries our public IP, if it fits the config (re-put, new TTL);
/// 2. else `preferred` (the subnet from subnet.env, or the one we just lost) if it is free;
/// 3. else a random free subnet among the first 100 between SubnetMin and SubnetMax.
pub(super) async fn acquire(
    store: &Store,
    config: &Config,
    attrs: &LeaseAttrs,
    preferred: Option<Ipv4Net>,
    ttl: Duration,
) -> anyhow::Result<Lease> {
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
    preferred: Option<Ipv4Net>,
    ttl: Duration,
) -> anyhow::Result<Option<Lease>> {
    let listing = store.list().await?;
    if let Some(found) = listing
        .leases
        .iter()
        .find(|l| l.lease.public_ip == attrs.public_ip)
    {
        let subnet = found.lease.subnet;
        if config.is_leasable(subnet) {
            let lease = Lease::new(subnet, attrs.clone());
            let reused = store.replace(&lease, found.mod_revision, ttl).await?;
            log_outcome(reused, "reusing the lease of our public IP", &lease);
            return Ok(reused.then_some(lease));
        }
        warn!(
            "deleting lease {subnet} of our public IP {}: it does not fit the network config",
            attrs.public_ip
        );
        store.delete(subnet).await?;
    }
    let subnet = choose_subnet(config, &listing, preferred)?;
    let lease = Lease::new(subnet, attrs.clone());
    let created = store.create(&lease, ttl).await?;
    log_outcome(created, "acquired", &lease);
    Ok(created.then_some(lease))
}

fn log_outcome(won: bool, action: &str, lease: &Lease) {
    if won {
        info!(
            "{action} {} for public IP {}",
            lease.subnet, lease.public_ip
        );
    } else {
        info!(
            "lost the race for {} to another node; retrying",
            lease.subnet
        );
    }
}

fn choose_subnet(
    config: &Config,
    listing: &Listing,
    preferred: Option<Ipv4Net>,
) -> anyhow::Result<Ipv4Net> {
    let taken = Taken::new(listing.leases.iter().map(|l| l.lease.subnet));
    if let Some(p) = preferred {
        if config.is_leasable(p) && taken.is_free(p) {
            return Ok(p);
        }
        info!("previous subnet {p} is taken or outside the network config; picking another");
    }
    let free = config.subnets().filter(|s| taken.is_free(*s));
    let free: Vec<Ipv4Net> = free.take(CANDIDATES).collect();
    if free.is_empty() {
        bail!(
            "no free subnet left between SubnetMin {} and SubnetMax {} of network {}",
            config.subnet_min,
            config.subnet_max,
            config.network
        );
    }
    Ok(free[rand::rng().random_range(0..free.len())])
}

/// The subnets other leases hold, sorted, so that whether a subnet is free costs O(log K)
/// lookups instead of a pass over every lease: a node joining a network of 60,000 leases looks
/// past all of them for a free one.
struct Taken(BTreeSet<(u32, u8)>);

impl Taken {
    fn new(subnets: impl Iterator<Item = Ipv4Net>) -> Taken {
        Taken(
            subnets
                .map(|s| (u32::from(s.network()), s.prefix_len()))
                .collect(),
        )
    }

    /// Whether no taken subnet overlaps `subnet`: none lies inside it, and none contains it.
    fn is_free(&self, subnet: Ipv4Net) -> bool {
        let (first, last) = (u32::from(subnet.network()), u32::from(subnet.broadcast()));
        let inside = self.0.range((first, 0)..=(last, 32)).next().is_some();
        let around = (0..subnet.prefix_len()).any(|len| {
            let outer = Ipv4Net::new(subnet.network(), len).map(|n| n.trunc());
            outer.is_ok_and(|n| self.0.contains(&(u32::from(n.network()), len)))
        });
        !inside && !around
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn a_subnet_is_free_unless_a_lease_overlaps_it_either_way() {
        let taken = Taken::new(
            ["10.5.1.0/24", "10.6.0.0/16", "10.7.3.128/25"]
                .into_iter()
                .map(net),
        );
        assert!(!taken.is_free(net("10.5.1.0/24")), "the same subnet");
        assert!(taken.is_free(net("10.5.2.0/24")));
        assert!(taken.is_free(net("10.5.0.0/24")));
        assert!(!taken.is_free(net("10.6.9.0/24")), "inside a taken /16");
        assert!(!taken.is_free(net("10.7.3.0/24")), "holds a taken /25");
        assert!(!taken.is_free(net("10.0.0.0/8")), "holds them all");
        assert!(taken.is_free(net("10.7.4.0/24")));
    }
}
