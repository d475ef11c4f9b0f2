//! Two WireGuard nodes in one process, joined by function calls instead of sockets: what the
//! engine's send and receive steps do to a packet, without TUN or UDP. The fuzz target, the
//! benchmarks and the protocol tests below use it.

use super::open::{Crypto, Opened};
use super::peer_map::WgPeers;
use super::peers::{Families, Sealed, TunnelParams, WgPeerSpec};
use super::{PresharedKey, PrivateKey, DEFAULT_PORT};
use crate::wire::ipv4::{Ipv4Repr, PROTO_UDP};
use crate::wire::ipv6::{Ipv6Repr, NEXT_HEADER_UDP};
use anyhow::bail;
use ipnet::{Ipv4Net, Ipv6Net};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

/// The TUN MTU these nodes check inner packets against: a 1500-byte underlay less flannel's 80.
pub const MTU: usize = 1420;

/// A dual-stack node `10.200.0.<n>:51820` owning `10.5.<n>.0/24` and `fd10:0:0:<n>::/64`,
/// whose one device carries both families.
pub struct Node {
    pub crypto: Crypto,
    pub peers: WgPeers,
    pub addr: SocketAddr,
    pub subnet: Ipv4Net,
    pub subnet6: Ipv6Net,
}

impl Node {
    pub fn new(n: u8, preshared_key: Option<PresharedKey>) -> Node {
        Node::carrying(n, preshared_key, Families::Both)
    }

    /// A node whose device carries `families` only.
    pub fn carrying(n: u8, preshared_key: Option<PresharedKey>, families: Families) -> Node {
        let params = TunnelParams {
            private_key: PrivateKey::generate(),
            preshared_key,
            keepalive: None,
        };
        Node {
            crypto: Crypto::new(params, families),
            peers: WgPeers::default(),
            addr: SocketAddr::from((Ipv4Addr::new(10, 200, 0, n), DEFAULT_PORT)),
            subnet: Ipv4Net::new(Ipv4Addr::new(10, 5, n, 0), 24).expect("a /24"),
            subnet6: Ipv6Net::new(Ipv6Addr::new(0xfd10, 0, 0, n.into(), 0, 0, 0, 0), 64)
                .expect("a /64"),
        }
    }

    /// What this node's lease says about it.
    pub fn spec(&self) -> WgPeerSpec {
        WgPeerSpec {
            subnet: self.subnet,
            subnet6: Some(self.subnet6),
            endpoint: self.addr,
            public_key: self.crypto.params.private_key.public_key(),
        }
    }

    /// Make `peers` this node's peers, as their leases would.
    pub fn knows(&self, peers: &[WgPeerSpec]) {
        self.peers.set(peers);
    }

    /// Encrypt `packet` for `to` into `dst`, as the send step does.
    pub fn seal(&self, to: &Node, packet: &[u8], dst: &mut [u8]) -> Sealed {
        match self.peers.load().by_subnet(to.subnet) {
            Some(peer) => peer.seal(&self.crypto.params, packet, dst),
            None => Sealed::Dropped,
        }
    }

    /// Receive `datagram` from `from`'s address, as the receive step does. The outcome's peer
    /// is copied out as its subnet, since the peer table is loaded only for this call.
    pub fn open(&self, from: SocketAddr, datagram: &[u8], dst: &mut [u8]) -> Received {
        let peers = self.peers.load();
        match self.crypto.open(&peers, from, datagram, dst, MTU) {
            Opened::Packet(peer, len) => Received::Packet(peer.subnet, len),
            Opened::Reply(_, len) | Opened::Cookie(len) => Received::Reply(len),
            Opened::Nothing => Received::Nothing,
            Opened::Dropped(reason) => Received::Dropped(reason),
        }
    }

    /// The address of the container behind this node (`10.5.<n>.2`, as the lab gives it).
    pub fn container_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.subnet.network()) + 2)
    }

    /// The IPv6 address of the container behind this node (`fd10:0:0:<n>::2`).
    pub fn container_ip6(&self) -> Ipv6Addr {
        Ipv6Addr::from(u128::from(self.subnet6.network()) + 2)
    }

    /// A UDP packet over IPv6 from this node's container to `to`'s, `len` bytes in all.
    pub fn packet6_to(&self, to: &Node, len: usize) -> Vec<u8> {
        let repr = Ipv6Repr {
            src: self.container_ip6(),
            dst: to.container_ip6(),
            next_header: NEXT_HEADER_UDP,
            hop_limit: 64,
            payload_len: len - 40,
        };
        let mut packet = vec![0x5a; len];
        repr.emit(&mut packet).expect("len fits IPv6");
        packet
    }

    /// A UDP packet from this node's container to `to`'s, `len` bytes in all.
    pub fn packet_to(&self, to: &Node, len: usize) -> Vec<u8> {
        let repr = Ipv4Repr {
            src: self.container_ip(),
            dst: to.container_ip(),
            protocol: PROTO_UDP,
            ttl: 64,
            payload_len: len - 20,
        };
        let mut packet = vec![0x5a; len];
        repr.emit(&mut packet).expect("len fits IPv4");
        packet
    }
}

/// [`Opened`] without the borrow of the peer table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    Packet(Ipv4Net, usize),
    Reply(usize),
    Nothing,
    Dropped(crate::stats::DropReason),
}

/// Two nodes, 1 and 2, that know each other (as from their leases); [`handshake`] connects them.
pub fn connected(psk_a: Option<PresharedKey>, psk_b: Option<PresharedKey>) -> (Node, Node) {
    let (a, b) = (Node::new(1, psk_a), Node::new(2, psk_b));
    a.knows(&[b.spec()]);
    b.knows(&[a.spec()]);
    (a, b)
}

/// Run a handshake from `a` to `b`: initiation, response, and the keepalive that confirms it.
pub fn handshake(a: &Node, b: &Node) -> anyhow::Result<()> {
    let mut buf = vec![0u8; 2048];
    let mut out = vec![0u8; 2048];
    let Some(init) = initiation(a, b, &mut buf) else {
        bail!("{} does not know {}", a.addr, b.addr);
    };
    let Received::Reply(len) = b.open(a.addr, &buf[..init], &mut out) else {
        bail!("no response to the initiation");
    };
    let Received::Reply(len) = a.open(b.addr, &out[..len], &mut buf) else {
        bail!("the response was not accepted");
    };
    match b.open(a.addr, &buf[..len], &mut out) {
        Received::Nothing => Ok(()),
        other => bail!("the confirming keepalive gave {other:?}"),
    }
}

fn initiation(a: &Node, b: &Node, dst: &mut [u8]) -> Option<usize> {
    let peers = a.peers.load();
    let peer = peers.by_subnet(b.subnet)?;
    peer.with_tunnel(&a.crypto.params, true, |tunn| {
        match tunn.format_handshake_initiation(dst, true) {
            boringtun::noise::TunnResult::WriteToNetwork(m) => Some(m.len()),
            _ => None,
        }
    })?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::DropReason;

    fn psk(byte: u8) -> Option<PresharedKey> {
        PresharedKey::from_base64(&base64_of(&[byte; 32])).ok()
    }

    fn base64_of(bytes: &[u8]) -> String {
        use base64::prelude::{Engine as _, BASE64_STANDARD};
        BASE64_STANDARD.encode(bytes)
    }

    /// `a` seals one packet for `b`; the datagram.
    fn datagram(a: &Node, b: &Node, len: usize) -> Vec<u8> {
        sealed(a, b, &a.packet_to(b, len))
    }

    /// `a` seals `packet` for `b`; the datagram.
    fn sealed(a: &Node, b: &Node, packet: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; 2048];
        match a.seal(b, packet, &mut buf) {
            Sealed::Data(n) => buf[..n].to_vec(),
            other => panic!("sealing gave {other:?}"),
        }
    }

    #[test]
    fn ipv6_packets_cross_both_ways_inside_the_peers_ipv6_subnets() {
        let (a, b) = connected(None, None);
        handshake(&a, &b).unwrap();
        let mut out = vec![0u8; 2048];
        let sent = a.packet6_to(&b, 120);
        let got = b.open(a.addr, &sealed(&a, &b, &sent), &mut out);
        assert_eq!(got, Received::Packet(a.subnet, 120));
        assert_eq!(&out[..120], &sent[..]);
        let back = sealed(&b, &a, &b.packet6_to(&a, MTU));
        assert_eq!(
            a.open(b.addr, &back, &mut out),
            Received::Packet(b.subnet, MTU)
        );
    }

    #[test]
    fn an_inner_ipv6_source_outside_the_peers_ipv6_subnet_is_dropped_as_spoofed() {
        let (a, b) = connected(None, None);
        handshake(&a, &b).unwrap();
        let mut packet = a.packet6_to(&b, 100);
        // Another node's IPv6 subnet, fd10:0:0:9::/64.
        packet[8..24].copy_from_slice(&"fd10:0:0:9::9".parse::<Ipv6Addr>().unwrap().octets());
        let got = b.open(a.addr, &sealed(&a, &b, &packet), &mut vec![0u8; 2048]);
        assert_eq!(got, Received::Dropped(DropReason::SpoofedSource));
        // A peer whose lease has no IPv6 subnet sends no IPv6 at all.
        let (a, b) = connected(None, None);
        b.knows(&[WgPeerSpec {
            subnet6: None,
            ..a.spec()
        }]);
        handshake(&a, &b).unwrap();
        let packet = a.packet6_to(&b, 100);
        let got = b.open(a.addr, &sealed(&a, &b, &packet), &mut vec![0u8; 2048]);
        assert_eq!(got, Received::Dropped(DropReason::SpoofedSource));
    }

    #[test]
    fn a_device_of_one_family_takes_no_inner_packet_of_the_other() {
        for families in [Families::Ipv4, Families::Ipv6] {
            let a = Node::new(1, None);
            let b = Node::carrying(2, None, families);
            a.knows(&[b.spec()]);
            b.knows(&[a.spec()]);
            handshake(&a, &b).unwrap();
            let (v4, v6) = (a.packet_to(&b, 100), a.packet6_to(&b, 100));
            let (carried, other) = match families {
                Families::Ipv4 => (v4, v6),
                _ => (v6, v4),
            };
            let mut out = vec![0u8; 2048];
            let got = b.open(a.addr, &sealed(&a, &b, &other), &mut out);
            assert_eq!(
                got,
                Received::Dropped(DropReason::SpoofedSource),
                "{families:?}"
            );
            let got = b.open(a.addr, &sealed(&a, &b, &carried), &mut out);
            assert_eq!(got, Received::Packet(a.subnet, 100), "{families:?}");
        }
    }

    #[test]
    fn a_peer_roams_to_an_ipv6_endpoint_and_back() {
        let (a, b) = connected(None, None);
        handshake(&a, &b).unwrap();
        let endpoint = || b.peers.load().by_subnet(a.subnet).unwrap().endpoint();
        let v6: SocketAddr = "[fd00:200::1]:51820".parse().unwrap();
        b.open(v6, &datagram(&a, &b, 100), &mut vec![0u8; 2048]);
        assert_eq!(endpoint(), v6);
        b.open(a.addr, &datagram(&a, &b, 100), &mut vec![0u8; 2048]);
        assert_eq!(endpoint(), a.addr);
    }

    #[test]
    fn packets_cross_both_ways_after_a_handshake() {
        let (a, b) = connected(psk(1), psk(1));
        handshake(&a, &b).unwrap();
        let mut out = vec![0u8; 2048];
        let sent = a.packet_to(&b, 100);
        let got = b.open(a.addr, &datagram(&a, &b, 100), &mut out);
        assert_eq!(got, Received::Packet(a.subnet, 100));
        assert_eq!(&out[..100], &sent[..]);
        let back = datagram(&b, &a, 1400);
        assert_eq!(
            a.open(b.addr, &back, &mut out),
            Received::Packet(b.subnet, 1400)
        );
    }

    #[test]
    fn a_replayed_datagram_is_dropped_as_replay() {
        let (a, b) = connected(None, None);
        handshake(&a, &b).unwrap();
        let d = datagram(&a, &b, 100);
        let mut out = vec![0u8; 2048];
        assert!(matches!(b.open(a.addr, &d, &mut out), Received::Packet(..)));
        let again = b.open(a.addr, &d, &mut out);
        assert_eq!(again, Received::Dropped(DropReason::Replay));
    }

    #[test]
    fn a_changed_datagram_is_dropped_as_bad_mac() {
        let (a, b) = connected(None, None);
        handshake(&a, &b).unwrap();
        let mut d = datagram(&a, &b, 100);
        d[40] ^= 1;
        let got = b.open(a.addr, &d, &mut vec![0u8; 2048]);
        assert_eq!(got, Received::Dropped(DropReason::BadMac));
    }

    #[test]
    fn a_wrong_preshared_key_fails_the_handshake_with_bad_mac() {
        let (a, b) = connected(psk(1), psk(2));
        let err = handshake(&a, &b).unwrap_err().to_string();
        assert!(err.contains("response was not accepted"), "{err}");
        let mut buf = vec![0u8; 2048];
        let init = initiation(&a, &b, &mut buf).unwrap();
        let mut out = vec![0u8; 2048];
        let Received::Reply(len) = b.open(a.addr, &buf[..init], &mut out) else {
            panic!("b answers: the preshared key only enters the response");
        };
        let got = a.open(b.addr, &out[..len], &mut buf);
        assert_eq!(got, Received::Dropped(DropReason::BadMac));
    }

    #[test]
    fn an_initiation_to_the_wrong_key_is_dropped_as_bad_mac() {
        let (a, b) = connected(None, None);
        let impostor = Node::new(2, None);
        a.knows(&[impostor.spec()]);
        let mut buf = vec![0u8; 2048];
        let init = initiation(&a, &b, &mut buf).unwrap();
        let got = b.open(a.addr, &buf[..init], &mut vec![0u8; 2048]);
        assert_eq!(got, Received::Dropped(DropReason::BadMac));
    }

    #[test]
    fn an_initiation_from_a_key_no_lease_holds_is_an_unknown_peer() {
        let (a, b) = connected(None, None);
        b.knows(&[]);
        let mut buf = vec![0u8; 2048];
        let init = initiation(&a, &b, &mut buf).unwrap();
        let got = b.open(a.addr, &buf[..init], &mut vec![0u8; 2048]);
        assert_eq!(got, Received::Dropped(DropReason::UnknownPeer));
    }

    #[test]
    fn an_inner_source_outside_the_allowed_ips_is_dropped() {
        let (a, b) = connected(None, None);
        handshake(&a, &b).unwrap();
        let mut packet = a.packet_to(&b, 100);
        packet[12..16].copy_from_slice(&[10, 5, 9, 9]);
        let mut buf = vec![0u8; 2048];
        let Sealed::Data(n) = a.seal(&b, &packet, &mut buf) else {
            panic!("no session")
        };
        let got = b.open(a.addr, &buf[..n], &mut vec![0u8; 2048]);
        assert_eq!(got, Received::Dropped(DropReason::SpoofedSource));
    }

    #[test]
    fn a_peer_follows_the_source_of_authentic_datagrams_only() {
        let (a, b) = connected(None, None);
        handshake(&a, &b).unwrap();
        let roamed = SocketAddr::from((Ipv4Addr::new(192, 0, 2, 7), 40000));
        let endpoint = || b.peers.load().by_subnet(a.subnet).unwrap().endpoint();
        let mut d = datagram(&a, &b, 100);
        d[40] ^= 1;
        b.open(roamed, &d, &mut vec![0u8; 2048]);
        assert_eq!(
            endpoint(),
            a.addr,
            "a forged datagram must not move the peer"
        );
        b.open(roamed, &datagram(&a, &b, 100), &mut vec![0u8; 2048]);
        assert_eq!(endpoint(), roamed);
    }

    /// `b` opens `datagram` from `from` `n` times; how often each came out.
    fn flood(b: &Node, from: SocketAddr, datagram: &[u8], n: usize) -> Vec<Received> {
        let mut out = vec![0u8; 2048];
        (0..n).map(|_| b.open(from, datagram, &mut out)).collect()
    }

    #[test]
    fn under_load_an_address_gets_cookies_then_its_share_and_a_proven_peer_gets_through() {
        use super::super::flood::{HANDSHAKES_PER_SECOND, SOURCE_BURST};
        let (a, b) = connected(None, None);
        let mut buf = vec![0u8; 2048];
        let init = initiation(&a, &b, &mut buf).unwrap();
        let replayed = buf[..init].to_vec();
        // a's initiation over and over from elsewhere, as anyone who saw it can send it.
        let attacker = SocketAddr::from((Ipv4Addr::new(10, 200, 0, 66), 40000));
        let (load, burst) = (HANDSHAKES_PER_SECOND as usize, SOURCE_BURST as usize);
        let results = flood(&b, attacker, &replayed, load + 20);
        let flood_drop = Received::Dropped(DropReason::HandshakeFlood);
        assert!(!results[..load].contains(&flood_drop));
        let (cookies, refused) = results[load..].split_at(burst);
        assert!(
            cookies.iter().all(|r| *r == Received::Reply(64)),
            "{cookies:?}"
        );
        assert!(refused.iter().all(|r| *r == flood_drop), "{refused:?}");

        // a, from its own address, takes a cookie and initiates again: its address is proven,
        // and the handshake completes although b is under load, and a's own tunnel at b took
        // the whole flood (a tunnel of its own judging load would answer with its own cookie).
        let mut cookie = vec![0u8; 2048];
        let Received::Reply(len) = b.open(a.addr, &replayed, &mut cookie) else {
            panic!("no cookie");
        };
        assert_eq!(a.open(b.addr, &cookie[..len], &mut buf), Received::Nothing);
        let init = initiation(&a, &b, &mut buf).unwrap();
        let proven = buf[..init].to_vec();
        let mut out = vec![0u8; 2048];
        let Received::Reply(len) = b.open(a.addr, &proven, &mut out) else {
            panic!("the proven initiation was not answered");
        };
        assert_eq!(len, 92, "a handshake response, not another cookie");
        assert!(matches!(
            a.open(b.addr, &out[..len], &mut buf),
            Received::Reply(_)
        ));

        // Then a's address has the rest of its burst (and what refilled meanwhile), no more.
        let again = flood(&b, a.addr, &proven, 2 * burst);
        let refused = again.iter().filter(|r| **r == flood_drop).count();
        assert!(again[0] != flood_drop && refused >= burst, "{again:?}");
    }

    #[test]
    fn packets_sent_before_the_handshake_follow_it() {
        let (a, b) = connected(None, None);
        let mut buf = vec![0u8; 2048];
        let Sealed::Handshake(init) = a.seal(&b, &a.packet_to(&b, 60), &mut buf) else {
            panic!("the first packet must start a handshake");
        };
        let mut out = vec![0u8; 2048];
        let Received::Reply(len) = b.open(a.addr, &buf[..init], &mut out) else {
            panic!("no response");
        };
        assert!(matches!(
            a.open(b.addr, &out[..len], &mut buf),
            Received::Reply(_)
        ));
        let peers = a.peers.load();
        let staged = peers
            .by_subnet(b.subnet)
            .unwrap()
            .next_staged(&mut buf)
            .unwrap();
        let got = b.open(a.addr, &buf[..staged], &mut out);
        assert_eq!(got, Received::Packet(a.subnet, 60));
    }
}
