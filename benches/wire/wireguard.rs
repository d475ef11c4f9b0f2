//! WireGuard in twill's userspace engine: what one packet costs to seal (encrypt) at one end and
//! open (authenticate, decrypt, check against the sender's allowed IPs) at the other, at 64 and
//! 1,400 bytes, and per 64 KB TCP super-packet with the split before and the coalescing after
//! (the syscalls are left out, as in `super_packet`).

use super::{tcp_super_frame, SplitCoalesce};
use criterion::{BatchSize, Criterion, Throughput};
use std::hint::black_box;
use twill_dataplane::engine::wireguard::pair::{self, Node, Received, MTU};
use twill_dataplane::engine::wireguard::Sealed;

/// TCP payload per segment when the TUN MTU is flannel's 1420.
const MSS: usize = MTU - 40;
/// As many as fit one 64 KB super-packet.
const SEGMENTS: usize = 47;

pub fn bench(c: &mut Criterion) {
    let (a, b) = pair::connected(None, None);
    pair::handshake(&a, &b).expect("handshake");
    let mut sealed = vec![0u8; 2048];
    let mut opened = vec![0u8; 2048];
    let mut group = c.benchmark_group("wireguard");
    group.throughput(Throughput::Elements(1));
    for len in [64, 1400] {
        let packet = a.packet_to(&b, len);
        group.bench_function(format!("seal+open/{len}B"), |bench| {
            bench.iter(|| seal_and_open(&a, &b, black_box(&packet), &mut sealed, &mut opened))
        });
    }
    group.throughput(Throughput::Elements(SEGMENTS as u64));
    let frame = tcp_super_frame(a.container_ip(), b.container_ip(), MSS, SEGMENTS);
    let mut split = SplitCoalesce::new(MTU);
    group.bench_function("split+seal+open+coalesce/64KB", |bench| {
        bench.iter_batched_ref(
            || frame.clone(),
            |frame| {
                split.run(frame, |packet, coalescer| {
                    let len = seal_and_open(&a, &b, packet, &mut sealed, &mut opened);
                    coalescer.push(&opened[..len]);
                })
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

/// `a` seals `packet` for `b`, `b` opens it; the length of what `b` would write to TUN.
fn seal_and_open(a: &Node, b: &Node, packet: &[u8], sealed: &mut [u8], opened: &mut [u8]) -> usize {
    let Sealed::Data(n) = a.seal(b, packet, sealed) else {
        panic!("no session");
    };
    match b.open(a.addr, &sealed[..n], opened) {
        Received::Packet(_, len) => len,
        other => panic!("not delivered: {other:?}"),
    }
}
