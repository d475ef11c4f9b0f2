//! What one lease event costs a userspace WireGuard engine with 10, 1,000 and 10,000 peers:
//! a lease added and a lease removed, each applied on its own (`Peering::set`, `remove`: its
//! WireGuard peer maps and its routing-table entry, O(log K)), and the same two events applied
//! the way a reconcile applies leases, all of them at once (`Peering::set_all`, O(K)), which
//! is what every lease event cost before. No devices: `cargo bench --bench leases`.

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use ipnet::Ipv4Net;
use std::hint::black_box;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use twill_dataplane::engine::wireguard::{Peering, PublicKey, WgPeerSpec};

const PEERS: [u32; 3] = [10, 1_000, 10_000];

fn main() {
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .without_plots()
        .configure_from_args();
    let mut group = c.benchmark_group("wireguard_lease");
    group.throughput(Throughput::Elements(1));
    for k in PEERS {
        one_event(&mut group, k);
        all_leases(&mut group, k);
    }
    group.finish();
    c.final_summary();
}

/// Peer `i`: a /24 in 10.0.0.0/8, as a flannel network of that size would lease, with a key
/// of its own.
fn spec(i: u32) -> WgPeerSpec {
    let mut key = [0u8; 32];
    key[..4].copy_from_slice(&(i + 1).to_le_bytes());
    WgPeerSpec {
        subnet: Ipv4Net::new(Ipv4Addr::from(0x0a00_0000 | (i << 8)), 24).expect("a /24"),
        subnet6: None,
        endpoint: SocketAddr::from((Ipv4Addr::from(0xc0a8_0000 | i), 51820)),
        public_key: PublicKey(key),
    }
}

/// An engine's peers with `k` peers in them.
fn peering(k: u32) -> Peering {
    let peering = Peering::new(Arc::default(), Arc::default());
    let specs: Vec<WgPeerSpec> = (0..k).map(spec).collect();
    peering.set_all(&specs);
    peering
}

/// Times `timed`, then undoes it with `untimed`, `iters` times.
fn timed_then_undone(iters: u64, mut timed: impl FnMut(), mut untimed: impl FnMut()) -> Duration {
    let mut spent = Duration::ZERO;
    for _ in 0..iters {
        let start = Instant::now();
        timed();
        spent += start.elapsed();
        untimed();
    }
    spent
}

/// A lease event applied on its own: peer `k` comes, or goes.
fn one_event(group: &mut BenchmarkGroup<WallTime>, k: u32) {
    let (peers, extra) = (peering(k), spec(k));
    let add = || peers.set(black_box(&extra)).expect("a free subnet and key");
    let remove = || peers.remove(black_box(extra.subnet));
    group.bench_function(format!("add/{k}_peers"), |b| {
        b.iter_custom(|iters| timed_then_undone(iters, add, remove))
    });
    group.bench_function(format!("remove/{k}_peers"), |b| {
        b.iter_custom(|iters| timed_then_undone(iters, remove, add))
    });
}

/// The same events applied as a reconcile applies leases: all `k + 1`, or all `k`.
fn all_leases(group: &mut BenchmarkGroup<WallTime>, k: u32) {
    let peers = peering(k);
    let with: Vec<WgPeerSpec> = (0..=k).map(spec).collect();
    let add = || peers.set_all(black_box(&with));
    let remove = || peers.set_all(black_box(&with[..k as usize]));
    group.bench_function(format!("add_by_reconcile/{k}_peers"), |b| {
        b.iter_custom(|iters| timed_then_undone(iters, add, remove))
    });
    group.bench_function(format!("remove_by_reconcile/{k}_peers"), |b| {
        b.iter_custom(|iters| timed_then_undone(iters, remove, add))
    });
}
