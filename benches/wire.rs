//! Per-packet cost of each step of twill's dataplane, from header parsing to the syscalls.
//!
//! Every benchmark declares `Throughput::Elements(packets per iteration)`, so criterion prints
//! packets per second beside the time per iteration; docs/performance.md turns both into ns per
//! packet. `sudo cargo bench --bench wire` also runs the device benchmarks (see devices.rs).

#[path = "wire/devices.rs"]
mod devices;
#[path = "wire/ipv6.rs"]
mod ipv6;
#[path = "wire/wireguard.rs"]
mod wireguard;

use criterion::{BatchSize, Criterion, Throughput};
use ipnet::Ipv4Net;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;
use twill_dataplane::engine;
use twill_dataplane::io::gro::{Coalescer, Merge};
use twill_dataplane::io::gso;
use twill_dataplane::table::{PeerSpec, PeerTable};
use twill_dataplane::wire::batch::{BatchPacket, BatchWriter};
use twill_dataplane::wire::chunk::{ChunkPacket, ChunkRepr, CHUNK_HEADER_LEN};
use twill_dataplane::wire::ip::IpPacket;
use twill_dataplane::wire::ipv4::{Ipv4Packet, Ipv4Repr, PROTO_UDP};
use twill_dataplane::wire::{checksum, flannel, virtio};

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
    super_packet(&mut c);
    ipv6::bench(&mut c);
    wireguard::bench(&mut c);
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

fn endpoint(i: u32) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::from(0xc0a8_0000 | i), flannel::DEFAULT_PORT))
}

fn host(i: u32, last_octet: u8) -> SocketAddrV4 {
    SocketAddrV4::new(
        Ipv4Addr::from(u32::from(subnet(i).network()) | u32::from(last_octet)),
        5201,
    )
}

/// A dual-stack table: each peer has an IPv4 and an IPv6 subnet.
fn table(peers: u32) -> PeerTable {
    let specs: Vec<PeerSpec> = (0..peers)
        .map(|i| PeerSpec {
            subnet: subnet(i),
            subnet6: Some(ipv6::subnet6(i)),
            endpoint: endpoint(i),
            version: 1,
        })
        .collect();
    PeerTable::new(&specs)
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
        flannel::encap(&IpPacket::new_checked(&*packet).ok()?).len(),
    ))
}

/// The udp engine's own checks on a datagram before it goes to TUN.
fn decap(datagram: &mut [u8], from: SocketAddr, table: &PeerTable) -> bool {
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
/// each record is exactly one IPv4 or IPv6 packet; returns the records that pass.
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

/// The MSS of a TCP stream over the batch engine's TUN (MTU 1458) and the segments of a
/// 64 KB super-packet at that MSS.
const MSS: usize = 1418;
const SUPER_SEGMENTS: usize = 46;

/// A TCP/IPv4 super-packet frame as TUN reads it with TSO: virtio-net header, then one packet
/// of `segments` segments of `mss` bytes with the pseudo-header sum in its checksum field.
pub fn tcp_super_frame(src: Ipv4Addr, dst: Ipv4Addr, mss: usize, segments: usize) -> Vec<u8> {
    let total = 40 + segments * mss;
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[6] = 0x40;
    p[8] = 64;
    p[9] = 6;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    let ip_sum = checksum::compute(&p[..20]);
    p[10..12].copy_from_slice(&ip_sum.to_be_bytes());
    p[32] = 5 << 4;
    p[33] = 0x10;
    StdRng::seed_from_u64(7).fill(&mut p[40..]);
    let pseudo = checksum::sum(&p[12..20]) + 6 + (total as u32 - 20);
    p[36..38].copy_from_slice(&checksum::fold(pseudo).to_be_bytes());
    let hdr = gso::tcp_super_header(&p, virtio::GSO_TCPV4, mss as u16).expect("TCP header");
    let mut frame = vec![0u8; gso::VIRTIO_NET_HDR_LEN];
    hdr.encode(&mut frame).expect("header fits");
    frame.extend_from_slice(&p);
    frame
}

/// What each end does in userspace with one 64 KB TCP super-packet, per segment: split it into
/// packets and coalesce them again (udp, batch v1), or cut it into chunks and lay them out
/// again (batch v2). The syscalls are the same size either way, so they are left out.
fn super_packet(c: &mut Criterion) {
    let frame = tcp_super_frame(*host(1, 2).ip(), *host(2, 2).ip(), MSS, SUPER_SEGMENTS);
    let mut group = c.benchmark_group("super_packet");
    group.throughput(Throughput::Elements(SUPER_SEGMENTS as u64));
    let mut split = SplitCoalesce::new(MTU);
    group.bench_function("split+coalesce/64KB", |b| {
        b.iter_batched_ref(
            || frame.clone(),
            |frame| split.run(frame, |packet, coalescer| coalescer.push(packet)),
            BatchSize::SmallInput,
        )
    });
    let mut train = vec![0u8; 2 * 65535];
    let mut reassembled = vec![0u8; frame.len()];
    group.bench_function("chunk+reassemble/64KB", |b| {
        b.iter(|| chunk_and_reassemble(black_box(&frame), &mut train, &mut reassembled))
    });
    group.finish();
}

/// A TUN frame split into packets (the sending end) and the packets coalesced again (the
/// receiving end), with whatever the path does to each packet in between.
pub struct SplitCoalesce {
    slots: Vec<Vec<u8>>,
    sizes: [usize; 64],
    coalescer: Coalescer,
}

impl SplitCoalesce {
    pub fn new(mtu: usize) -> SplitCoalesce {
        let merge = Merge {
            tcp: true,
            udp: true,
        };
        SplitCoalesce {
            slots: vec![vec![0u8; mtu]; 64],
            sizes: [0; 64],
            coalescer: Coalescer::new(128, merge),
        }
    }

    /// Split `frame`, hand each packet to `carry` (which pushes what arrives), and return the
    /// bytes the coalesced super-packets hold.
    pub fn run(&mut self, frame: &mut [u8], mut carry: impl FnMut(&[u8], &mut Coalescer)) -> usize {
        let hdr = gso::header(frame).expect("virtio-net header");
        let packet = &mut frame[gso::VIRTIO_NET_HDR_LEN..];
        let n = gso::split(hdr, packet, &mut self.slots, &mut self.sizes).expect("split");
        for (slot, &len) in self.slots.iter().zip(&self.sizes[..n]) {
            carry(&slot[..len], &mut self.coalescer);
        }
        self.coalescer.drain().map(<[u8]>::len).sum::<usize>()
    }
}

/// The sender's `send_chunks` and the receiver's reassembly, without the engines around them.
fn chunk_and_reassemble(frame: &[u8], train: &mut [u8], out: &mut [u8]) -> usize {
    let packet = &frame[gso::VIRTIO_NET_HDR_LEN..];
    let mut repr = ChunkRepr {
        sender: subnet(1),
        seq: 0,
        total: packet.len() as u16,
        offset: 0,
        gso_size: MSS as u16,
        gso_type: virtio::GSO_TCPV4,
        stream: 0,
    };
    let mut end = 0;
    for part in packet.chunks(BATCH_CAPACITY - CHUNK_HEADER_LEN) {
        let datagram = &mut train[end..end + CHUNK_HEADER_LEN + part.len()];
        repr.emit(datagram);
        datagram[CHUNK_HEADER_LEN..].copy_from_slice(part);
        repr.offset += part.len() as u16;
        end += datagram.len();
    }
    for datagram in train[..end].chunks(BATCH_CAPACITY) {
        let chunk = ChunkPacket::new_checked(datagram).expect("valid chunk");
        let at = usize::from(chunk.repr().offset);
        out[at..at + chunk.payload().len()].copy_from_slice(chunk.payload());
    }
    end
}
