//! Packets from a peer on their way to TUN: the coalescer reads their TCP and UDP headers to
//! merge them into super-packets, so any bytes must be safe to push, and merging never makes
//! data up.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tun_rs::VIRTIO_NET_HDR_LEN;
use twill_dataplane::io::gro::{Coalescer, Merge};

fuzz_target!(|data: &[u8]| {
    let merge = Merge {
        tcp: true,
        udp: true,
    };
    let mut coalescer = Coalescer::new(4, merge);
    let (mut pushed, mut written) = (0, 0);
    for packet in length_prefixed(data) {
        if coalescer.is_full() {
            written += drained_bytes(&mut coalescer);
        }
        coalescer.push(packet);
        pushed += packet.len();
    }
    written += drained_bytes(&mut coalescer);
    assert!(
        written <= pushed,
        "{written} bytes written from {pushed} pushed"
    );
});

fn drained_bytes(coalescer: &mut Coalescer) -> usize {
    coalescer
        .drain()
        .map(|slot| slot.len() - VIRTIO_NET_HDR_LEN)
        .sum()
}

/// Packets as a 2-byte big-endian length, then that many bytes (fewer at the end).
fn length_prefixed(mut data: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::from_fn(move || {
        let (len, rest) = data.split_first_chunk::<2>()?;
        let take = usize::from(u16::from_be_bytes(*len)).min(rest.len());
        let (packet, rest) = rest.split_at(take);
        data = rest;
        Some(packet)
    })
}
