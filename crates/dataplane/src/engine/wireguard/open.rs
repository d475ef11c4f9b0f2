//! One datagram off the underlay, as WireGuard receives it: find the peer (by the index in the
//! message, or for a handshake initiation by the key inside it), let the peer's tunnel
//! authenticate and decrypt it, then check the inner packet against the peer's allowed IPs.
//! No I/O here: the engine's receive direction, the fuzz target and the benchmarks all drive it.

use super::flood::{Gate, Verdict};
use super::peer_map::PeerMap;
use super::peers::{Families, TunnelParams, WgPeer};
use super::PublicKey;
use crate::engine::check_from;
use crate::stats::DropReason;
use crate::wire::ip::IpPacket;
use boringtun::noise::errors::WireGuardError;
use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::{Packet, Tunn, TunnResult};
use boringtun::x25519;
use std::net::SocketAddr;

/// What became of one datagram.
#[derive(Debug, Clone, Copy)]
pub enum Opened<'p> {
    /// An inner packet of this many bytes is at the start of the buffer, from this peer and
    /// inside its allowed IPs.
    Packet(&'p WgPeer, usize),
    /// Send this many bytes of the buffer back to the sender: a handshake response, or a
    /// keepalive that confirms a session. The peer, if known, may now send what waited for
    /// the handshake ([`WgPeer::next_staged`]).
    Reply(Option<&'p WgPeer>, usize),
    /// A handshake message not taken up because this node is under load (a `handshake_flood`
    /// drop): send this many bytes of the buffer, a cookie reply, back to the sender.
    Cookie(usize),
    /// Authentic, but nothing to deliver (a keepalive, a cookie).
    Nothing,
    Dropped(DropReason),
}

/// The kind of message a datagram is, once its peer is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A handshake initiation: the only message that may make a peer's tunnel.
    Initiation,
    Response,
    Other,
}

/// One device's side of every tunnel: this node's keys, the limit on handshakes, and the
/// families its peers' allowed IPs hold.
pub struct Crypto {
    pub params: TunnelParams,
    pub families: Families,
    public: x25519::PublicKey,
    gate: Gate,
}

impl Crypto {
    pub fn new(params: TunnelParams, families: Families) -> Crypto {
        let public = x25519::PublicKey::from(params.private_key.public_key().0);
        Crypto {
            gate: Gate::new(&public),
            public,
            params,
            families,
        }
    }

    /// Starts a new second of the handshake limit when one is over; call a few times a second.
    pub fn reset_rate_limit(&self) {
        self.gate.tick();
    }

    /// Authenticate and decrypt `datagram`, which came from `from`, into `dst` (at least as
    /// long as the datagram, and 148 bytes). `mtu` bounds the inner packet, as the TUN does.
    pub fn open<'p>(
        &self,
        peers: &'p PeerMap,
        from: SocketAddr,
        datagram: &[u8],
        dst: &mut [u8],
        mtu: usize,
    ) -> Opened<'p> {
        let (peer, kind) = match self.sender(peers, from, datagram, dst) {
            Ok(found) => found,
            Err(opened) => return opened,
        };
        let source = Some(from.ip());
        let result = peer.with_tunnel(&self.params, kind == Kind::Initiation, |tunn| {
            Outcome::of(tunn.decapsulate(source, datagram, dst))
        });
        if kind == Kind::Response {
            peer.note_response(matches!(result, Some(Ok(_))));
        }
        let outcome = match result {
            None => return Opened::Dropped(DropReason::NoSession),
            Some(Err(reason)) => return Opened::Dropped(reason),
            Some(Ok(outcome)) => outcome,
        };
        if peer.roam(from) {
            tracing::info!(peer = %peer.subnet, endpoint = %from, "WireGuard peer roamed");
        }
        match outcome {
            Outcome::Packet(len) => check_inner(peer, self.families, &dst[..len], mtu)
                .map_or_else(Opened::Dropped, |()| Opened::Packet(peer, len)),
            Outcome::Reply(len) => Opened::Reply(Some(peer), len),
            Outcome::Nothing => Opened::Nothing,
        }
    }

    /// The peer a datagram comes from, and what kind of message it is. Handshake messages pass
    /// the node's handshake limit first.
    fn sender<'p>(
        &self,
        peers: &'p PeerMap,
        from: SocketAddr,
        datagram: &[u8],
        dst: &mut [u8],
    ) -> Result<(&'p WgPeer, Kind), Opened<'p>> {
        let (receiver, kind) = match Tunn::parse_incoming_packet(datagram) {
            Err(_) => return Err(Opened::Dropped(DropReason::Malformed)),
            Ok(Packet::HandshakeInit(_)) => return self.initiator(peers, from, datagram, dst),
            Ok(Packet::HandshakeResponse(p)) => {
                self.admit_handshake(from, datagram, dst)?;
                (p.receiver_idx, Kind::Response)
            }
            Ok(Packet::PacketCookieReply(p)) => (p.receiver_idx, Kind::Other),
            Ok(Packet::PacketData(p)) => (p.receiver_idx, Kind::Other),
        };
        let peer = peers.by_receiver(receiver);
        peer.map(|p| (p, kind))
            .ok_or(Opened::Dropped(DropReason::UnknownPeer))
    }

    /// A handshake initiation names its sender only inside: check its MAC and the handshake
    /// limit first (cheap), then decrypt the sender's static key (one Diffie-Hellman).
    fn initiator<'p>(
        &self,
        peers: &'p PeerMap,
        from: SocketAddr,
        datagram: &[u8],
        dst: &mut [u8],
    ) -> Result<(&'p WgPeer, Kind), Opened<'p>> {
        let Packet::HandshakeInit(init) = self.admit_handshake(from, datagram, dst)? else {
            return Err(Opened::Dropped(DropReason::Malformed));
        };
        let secret = self.params.private_key.secret();
        let half = parse_handshake_anon(secret, &self.public, &init)
            .map_err(|e| Opened::Dropped(reason(&e)))?;
        let peer = peers.by_key(&PublicKey(half.peer_static_public));
        peer.map(|p| (p, Kind::Initiation))
            .ok_or(Opened::Dropped(DropReason::UnknownPeer))
    }

    fn admit_handshake<'a>(
        &self,
        from: SocketAddr,
        datagram: &'a [u8],
        dst: &mut [u8],
    ) -> Result<Packet<'a>, Opened<'static>> {
        match self.gate.check(from, datagram, dst) {
            Verdict::Pass(packet) => Ok(packet),
            Verdict::Cookie(len) => Err(Opened::Cookie(len)),
            Verdict::Dropped(reason) => Err(Opened::Dropped(reason)),
        }
    }
}

/// A tunnel's answer to an authentic message, without the borrow of the buffer it wrote to.
enum Outcome {
    Packet(usize),
    Reply(usize),
    Nothing,
}

impl Outcome {
    fn of(result: TunnResult<'_>) -> Result<Outcome, DropReason> {
        Ok(match result {
            TunnResult::WriteToTunnelV4(packet, _) | TunnResult::WriteToTunnelV6(packet, _) => {
                Outcome::Packet(packet.len())
            }
            TunnResult::WriteToNetwork(reply) => Outcome::Reply(reply.len()),
            TunnResult::Done => Outcome::Nothing,
            TunnResult::Err(e) => return Err(reason(&e)),
        })
    }
}

/// WireGuard's cryptokey routing on receive: the inner packet must come from the peer's
/// allowed IPs (its lease's subnet of the packet's family, on a device that carries that
/// family), and fit the TUN.
fn check_inner(
    peer: &WgPeer,
    families: Families,
    packet: &[u8],
    mtu: usize,
) -> Result<(), DropReason> {
    let ip = IpPacket::new_checked(packet).map_err(|_| DropReason::Malformed)?;
    if !families.carry(&ip) {
        return Err(DropReason::SpoofedSource);
    }
    check_from(&ip, peer.subnet, peer.subnet6, mtu)
}

/// The drop counter each of boringtun's refusals goes to.
fn reason(e: &WireGuardError) -> DropReason {
    use WireGuardError::*;
    match e {
        InvalidMac | InvalidAeadTag | WrongKey => DropReason::BadMac,
        DuplicateCounter | InvalidCounter | WrongTai64nTimestamp | UnexpectedPacket => {
            DropReason::Replay
        }
        NoCurrentSession | WrongIndex | ConnectionExpired => DropReason::NoSession,
        _ => DropReason::Malformed,
    }
}
