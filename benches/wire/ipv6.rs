//! The IPv6 twins of the IPv4 cases: the udp engine's encap and decap of an IPv6 packet, the
//! batch receiver's unpacking of IPv6 records, and the table's IPv6 lookup. Each runs on the
//! same dual-stack table and the same packet sizes as its IPv4 twin (an IPv6 pure ACK is 20
//! bytes longer), so docs/performance.md sets them side by side.

use super::{decap, encap, endpoint, pack, unpack, BATCH_CAPACITY, BULK, SMALL};
use criterion::{BatchSize, Criterion, Throughput};
use ipnet::Ipv6Net;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::net::Ipv6Addr;
use twill_dataplane::wire::checksum;
use twill_dataplane::wire::ipv6::{Ipv6Repr, NEXT_HEADER_UDP};

/// A pure ACK over IPv6: the IPv4 one plus 20 bytes of header.
const SMALL6: usize = SMALL + 20;

/// Peer `i`'s IPv6 lease: /64s laid out in fd10::/32.
pub fn subnet6(i: u32) -> Ipv6Net {
    let network = Ipv6Addr::from((0xfd10u128 << 112) | (u128::from(i) << 64));
    Ipv6Net::new(network, 64).expect("valid prefix")
}

fn host6(i: u32, last: u16) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(subnet6(i).network()) | u128::from(last))
}

/// UDP in IPv6, `len` bytes in all, with a valid checksum.
fn udp_packet6(src: Ipv6Addr, dst: Ipv6Addr, len: usize) -> Vec<u8> {
    let repr = Ipv6Repr {
        src,
        dst,
        next_header: NEXT_HEADER_UDP,
        hop_limit: 64,
        payload_len: len - 40,
    };
    let mut buf = vec![0; len];
    repr.emit(&mut buf).expect("buffer sized for the packet");
    let udp = &mut buf[40..];
    udp[0..2].copy_from_slice(&5201u16.to_be_bytes());
    udp[2..4].copy_from_slice(&5201u16.to_be_bytes());
    udp[4..6].copy_from_slice(&((len - 40) as u16).to_be_bytes());
    let sum = !checksum::fold(repr.pseudo_header_sum() + checksum::sum(udp));
    udp[6..8].copy_from_slice(&sum.to_be_bytes());
    buf
}

fn peer_to_peer6(len: usize) -> Vec<u8> {
    udp_packet6(host6(1, 2), host6(2, 2), len)
}

pub fn bench(c: &mut Criterion) {
    flannel_udp(c);
    batch(c);
    peer_table(c);
}

fn flannel_udp(c: &mut Criterion) {
    let table = super::table(10);
    let packet = peer_to_peer6(BULK);
    let mut group = c.benchmark_group("flannel_udp_ipv6");
    group.throughput(Throughput::Elements(1));
    group.bench_function("encap (route+hop limit+encap)", |b| {
        b.iter_batched_ref(
            || packet.clone(),
            |p| encap(p, &table).expect("routable"),
            BatchSize::NumIterations(256),
        )
    });
    group.bench_function("decap (+peer,source,mtu,hop limit checks)", |b| {
        b.iter_batched_ref(
            || packet.clone(),
            |p| assert!(decap(p, endpoint(1), &table)),
            BatchSize::NumIterations(256),
        )
    });
    group.finish();
}

fn batch(c: &mut Criterion) {
    let mut group = c.benchmark_group("batch_ipv6");
    for (count, len) in [(1, SMALL6), (8, SMALL6), (16, SMALL6), (1, BULK)] {
        let packets = vec![peer_to_peer6(len); count];
        let mut buf = vec![0; BATCH_CAPACITY];
        let datagram_len = pack(&mut buf, &packets);
        group.throughput(Throughput::Elements(count as u64));
        group.bench_function(format!("unpack/{count}x{len}B"), |b| {
            b.iter(|| unpack(black_box(&buf[..datagram_len])))
        });
    }
    group.finish();
}

/// As the IPv4 `peer_table` bench: destinations spread at random over all leased subnets.
fn peer_table(c: &mut Criterion) {
    const LOOKUPS: usize = 1024;
    let mut rng = StdRng::seed_from_u64(5);
    let mut group = c.benchmark_group("peer_table_ipv6");
    group.throughput(Throughput::Elements(LOOKUPS as u64));
    for peers in [10, 1_000, 10_000] {
        let table = super::table(peers);
        let destinations: Vec<Ipv6Addr> = (0..LOOKUPS)
            .map(|_| host6(rng.random_range(0..peers), rng.random_range(1..0xffff)))
            .collect();
        group.bench_function(format!("route6/{peers}_peers"), |b| {
            b.iter(|| {
                destinations
                    .iter()
                    .filter_map(|&dst| table.route6(black_box(dst)))
                    .sum::<usize>()
            })
        });
    }
    group.finish();
}
