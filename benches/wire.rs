//! Per-packet cost of each step of twill's dataplane, from header parsing to the syscalls.
//!
//! Every benchmark declares `Throughput::Elements(packets per iteration)`, so criterion prints
//! packets per second beside the time per iteration; docs/performance.md turns both into ns per
//! packet. `sudo cargo bench --bench wire` also runs the device benchmarks (see devices.rs).

#[path = "wire/devices.rs"]
mod devices;

use criterion::{BatchSize, Criterion, Throughput};
use ipnet::Ipv4Net;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;
use twill_dataplane::engine;
use twill_dataplane::table::{PeerSpec, PeerTable};
use twill_dataplane::wire::batch::{BatchPacket, BatchWriter};
use twill_dataplane::wire::ipv4::{Ipv4Packet, Ipv4Repr, PROTO_UDP};
use twill_dataplane::wire::{checksum, flannel};

/// A bulk packet, as fast-path.md counts them.
const BULK: usize = 1400;
/// A pure ACK's size: 32 of them fit one batch datagram, the case batching exists for.
const SMALL: usize = 40;
/// The TUN MTU on a 1500-byte underlay (flannel udp adds 28 bytes).
const MTU: usize = 1472;
/// A batch datagram's capacity on that underlay: PMTU minus outer IPv4 and UDP.
const BATCH_CAPACITY: usize = 1500 - 28;

fn main() {
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .without_plots()
        .configure_from_args();
    ipv4(&mut c);
    flannel_udp(&mut c);
    batch(&mut c);
    peer_table(&mut c);
    devices::bench(&mut c);
    c.final_summary();
}

/// The one packet every benchmark uses: UDP in IPv4, `len` bytes in all, with valid checksums,
/// since tun-rs only coalesces (GRO) UDP packets whose checksum verifies, as the kernel's are.
pub fn udp_packet(src: SocketAddrV4, dst: SocketAddrV4, len: usize) -> Vec<u8> {
    let udp_len = u16::try_from(len - 20).expect("packet fits IPv4");
    let repr = Ipv4Repr {
        src: *src.ip(),
        dst: *dst.ip(),
        protocol: PROTO_UDP,
        ttl: 64,
        payload_len: usize::from(udp_len),
    };
    let mut buf = vec![0; len];
    repr.emit(&mut buf).expect("buffer sized for the packet");
    let udp = &mut buf[20..];
    udp[0..2].copy_from_slice(&src.port().to_be_bytes());
    udp[2..4].copy_from_slice(&dst.port().to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    let mut pseudo_header = [0; 12];
    pseudo_header[0..4].copy_from_slice(&src.ip().octets());
    pseudo_header[4..8].copy_from_slice(&dst.ip().octets());
    pseudo_header[9] = PROTO_UDP;
    pseudo_header[10..12].copy_from_slice(&udp_len.to_be_bytes());
    let sum = !checksum::fold(checksum::sum(&pseudo_header) + checksum::sum(udp));
    // 0 means "no checksum" in UDP, so a sum of 0 goes on the wire as its other form.
    let sum = if sum == 0 { 0xffff } else { sum };
    udp[6..8].copy_from_slice(&sum.to_be_bytes());
    buf
}

/// Peer `i`'s lease: /24 subnets laid out in 10.0.0.0/8, as a flannel network of that size would.
fn subnet(i: u32) -> Ipv4Net {
    Ipv4Net::new(Ipv4Addr::from(0x0a00_0000 | (i << 8)), 24).expect("valid prefix")
}

fn endpoint(i: u32) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::from(0xc0a8_0000 | i), flannel::DEFAULT_PORT)
}

fn host(i: u32, last_octet: u8) -> SocketAddrV4 {
    SocketAddrV4::new(
        Ipv4Addr::from(u32::from(subnet(i).network()) | u32::from(last_octet)),
        5201,
    )
}

fn table(peers: u32) -> PeerTable {
    let specs: Vec<PeerSpec> = (0..peers)
        .map(|i| PeerSpec {
            subnet: subnet(i),
            endpoint: endpoint(i),
            version: 1,
        })
        .collect();
    PeerTable::new(&specs, &PeerTable::default())
}

/// A packet from a container behind peer 1 to one behind peer 2.
fn peer_to_peer(len: usize) -> Vec<u8> {
    udp_packet(host(1, 2), host(2, 2), len)
}

fn ipv4(c: &mut Criterion) {
    let packet = peer_to_peer(BULK);
    let mut group = c.benchmark_group("ipv4");
    group.throughput(Throughput::Elements(1));
    group.bench_function("parse+verify_checksum", |b| {
        b.iter(|| {
            Ipv4Packet::new_checked(black_box(&packet[..])).is_ok_and(|ip| ip.verify_checksum())
        })
    });
    group.finish();
}

/// The udp engine's own work on a packet read from TUN, then the datagram payload it sends.
fn encap(packet: &mut [u8], table: &PeerTable) -> Option<(usize, usize)> {
    let peer = engine::route_outbound(packet, table).ok()?;
    Some((
        peer,
        flannel::encap(&Ipv4Packet::new_unchecked(&*packet)).len(),
    ))
}

/// The udp engine's own checks on a datagram before it goes to TUN.
fn decap(datagram: &mut [u8], from: SocketAddrV4, table: &PeerTable) -> bool {
    table
        .by_endpoint(from)
        .is_some_and(|peer| engine::accept_inbound(datagram, peer, MTU).is_ok())
}

/// Both steps decrement the TTL in place, so each iteration gets a fresh copy, made outside the
/// timing; batches of 256 keep the copies in L2 and the timer's overhead under 0.2 ns.
fn flannel_udp(c: &mut Criterion) {
    let table = table(10);
    let packet = peer_to_peer(BULK);
    let mut group = c.benchmark_group("flannel_udp");
    group.throughput(Throughput::Elements(1));
    group.bench_function("encap (route+ttl+encap)", |b| {
        b.iter_batched_ref(
            || packet.clone(),
            |p| encap(p, &table).expect("routable"),
            BatchSize::NumIterations(256),
        )
    });
    group.bench_function("decap (+peer,source,mtu,ttl checks)", |b| {
        b.iter_batched_ref(
            || packet.clone(),
            |p| assert!(decap(p, endpoint(1), &table)),
            BatchSize::NumIterations(256),
        )
    });
    group.finish();
}

fn pack(buf: &mut [u8], packets: &[Vec<u8>]) -> usize {
    let mut writer = BatchWriter::new(buf, subnet(1));
    for packet in packets {
        assert!(writer.push(packet), "batch capacity exceeded");
    }
    writer.finish()
}

/// The receiver's framing (`BatchPacket::new_checked` + records) and its per-record rule that
/// each record is exactly one IPv4 packet; returns the records that pass.
fn unpack(datagram: &[u8]) -> usize {
    let batch = BatchPacket::new_checked(datagram).expect("valid batch");
    batch
        .records()
        .filter(|record| matches!(record, Ok(r) if flannel::decap(*r).is_ok()))
        .count()
}

fn batch(c: &mut Criterion) {
    let mut group = c.benchmark_group("batch");
    for (count, len) in [(1, SMALL), (8, SMALL), (32, SMALL), (1, BULK)] {
        let packets = vec![peer_to_peer(len); count];
        let mut buf = vec![0; BATCH_CAPACITY];
        let datagram_len = pack(&mut buf, &packets);
        group.throughput(Throughput::Elements(count as u64));
        group.bench_function(format!("pack/{count}x{len}B"), |b| {
            b.iter(|| pack(&mut buf, black_box(&packets)))
        });
        group.bench_function(format!("unpack/{count}x{len}B"), |b| {
            b.iter(|| unpack(black_box(&buf[..datagram_len])))
        });
    }
    group.finish();
}

/// Destinations spread at random over all leased subnets, so a big table misses the cache as a
/// real one would.
fn peer_table(c: &mut Criterion) {
    const LOOKUPS: usize = 1024;
    let mut rng = StdRng::seed_from_u64(5);
    let mut group = c.benchmark_group("peer_table");
    group.throughput(Throughput::Elements(LOOKUPS as u64));
    for peers in [10, 1_000, 10_000] {
        let table = table(peers);
        let destinations: Vec<Ipv4Addr> = (0..LOOKUPS)
            .map(|_| *host(rng.random_range(0..peers), rng.random_range(1..255)).ip())
            .collect();
        group.bench_function(format!("route/{peers}_peers"), |b| {
            b.iter(|| {
                destinations
                    .iter()
                    .filter_map(|&dst| table.route(black_box(dst)))
                    .sum::<usize>()
            })
        });
    }
    group.finish();
}
