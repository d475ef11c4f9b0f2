//! WireGuard's receive step on a node with a live session: arbitrary bytes as a datagram, and
//! arbitrary plaintexts sealed by the node's real peer (so the checks after decryption see any
//! inner packet). Nothing may panic, and what is delivered must come from the peer's subnet of
//! its family (the nodes are dual-stack) and be exactly what the peer sealed.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use twill_dataplane::engine::wireguard::pair::{self, Node, Received, MTU};
use twill_dataplane::engine::wireguard::Sealed;
use twill_dataplane::wire::ip::IpPacket;

fn nodes() -> &'static (Node, Node) {
    static NODES: OnceLock<(Node, Node)> = OnceLock::new();
    NODES.get_or_init(|| {
        let (a, b) = pair::connected(None, None);
        pair::handshake(&a, &b).expect("a handshake between two fresh nodes");
        (a, b)
    })
}

fuzz_target!(|data: &[u8]| {
    let (a, b) = nodes();
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut out = vec![0u8; rest.len() + 256];
    if mode % 2 == 0 {
        let got = b.open(a.addr, rest, &mut out);
        check(a, got, &out, None);
        return;
    }
    let mut sealed = vec![0u8; rest.len() + 256];
    if let Sealed::Data(len) = a.seal(b, rest, &mut sealed) {
        let got = b.open(a.addr, &sealed[..len], &mut out);
        check(a, got, &out, Some(rest));
    }
});

fn check(from: &Node, got: Received, out: &[u8], plaintext: Option<&[u8]>) {
    let Received::Packet(subnet, len) = got else {
        return;
    };
    assert_eq!(subnet, from.subnet);
    assert!(len <= MTU);
    let inside = match IpPacket::new_checked(&out[..len]).expect("delivered packets are IP") {
        IpPacket::V4(packet) => from.subnet.contains(&packet.src_addr()),
        IpPacket::V6(packet) => from.subnet6.contains(&packet.src_addr()),
    };
    assert!(inside);
    if let Some(sent) = plaintext {
        assert_eq!(&out[..len], &sent[..len]);
    }
}
