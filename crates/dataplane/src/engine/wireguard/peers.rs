//! One WireGuard peer: what its lease says, where datagrams for it go (roaming), and its
//! tunnel (boringtun's `Tunn`), made on first use, so a network of 60,000 leases holds tunnels
//! only for the peers this node talks to. [`super::peer_map`] finds peers and changes them.

use super::keys::{PresharedKey, PrivateKey, PublicKey};
use crate::log_limit::LogLimit;
use crate::wire::ip::IpPacket;
use arc_swap::ArcSwap;
use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::noise::{Tunn, TunnResult};
use boringtun::x25519;
use ipnet::{Ipv4Net, Ipv6Net};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Packets boringtun keeps for a peer while its handshake runs; it drops more without a word,
/// so twill counts them (`no_session`).
const MAX_STAGED: usize = 256;
/// Handshake responses from a peer that fail to authenticate in a row before the log says
/// so: one can be a forgery, two (the second a retry 5 s later) are the peer's.
const FAILED_RESPONSES_TO_WARN: u32 = 2;
/// How often, at most, the log says it again for one peer.
const FAILED_RESPONSES_WARN_EVERY: Duration = Duration::from_secs(600);

/// What a lease says about a WireGuard peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WgPeerSpec {
    /// The lease's subnet, which names the peer in every table, and its allowed IPv4 addresses
    /// on a device that carries IPv4: packets to it go to this peer, and its packets must come
    /// from inside it.
    pub subnet: Ipv4Net,
    /// A dual-stack lease's IPv6 subnet: its allowed IPv6 addresses, on a device that carries
    /// IPv6.
    pub subnet6: Option<Ipv6Net>,
    /// Where it listens (`PublicIP:Port`, `[PublicIPv6]:Port`); replies follow where it
    /// really sends from.
    pub endpoint: SocketAddr,
    pub public_key: PublicKey,
}

/// The inner families a WireGuard device carries, which its peers' allowed IPs hold: flannel's
/// Mode separate gives each family a device of its own, its other modes carry both on one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Families {
    Ipv4,
    Ipv6,
    Both,
}

impl Families {
    pub fn ipv4(self) -> bool {
        self != Families::Ipv6
    }

    pub fn ipv6(self) -> bool {
        self != Families::Ipv4
    }

    /// Whether `packet` is of a family this device carries.
    #[inline]
    pub fn carry<T: AsRef<[u8]>>(self, packet: &IpPacket<T>) -> bool {
        match packet {
            IpPacket::V4(_) => self.ipv4(),
            IpPacket::V6(_) => self.ipv6(),
        }
    }
}

/// What every tunnel of this node shares. Its `Debug` shows no key (theirs print as `..`).
#[derive(Debug, Clone)]
pub struct TunnelParams {
    pub private_key: PrivateKey,
    pub preshared_key: Option<PresharedKey>,
    /// Seconds between keepalives sent even when idle (flannel's PersistentKeepaliveInterval).
    pub keepalive: Option<u16>,
}

/// One peer's WireGuard state.
pub struct WgPeer {
    pub subnet: Ipv4Net,
    pub subnet6: Option<Ipv6Net>,
    pub public_key: PublicKey,
    index: u32,
    /// The endpoint its lease names; only the control plane reads and writes it.
    leased: Mutex<SocketAddr>,
    /// Where datagrams for it go: the leased endpoint until an authenticated datagram arrives
    /// from somewhere else (roaming). Read for every datagram and changed only when the peer
    /// moves, so a swap of a pointer: an IPv6 endpoint fits in no atomic integer.
    endpoint: ArcSwap<SocketAddr>,
    tunnel: Mutex<Option<Tunnel>>,
    /// Handshake responses from it that failed to authenticate since the last good one.
    failed_responses: AtomicU32,
    failed_responses_log: LogLimit,
}

impl std::fmt::Debug for WgPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgPeer")
            .field("subnet", &self.subnet)
            .field("public_key", &self.public_key)
            .field("endpoint", &self.endpoint())
            .finish_non_exhaustive()
    }
}

struct Tunnel {
    tunn: Box<Tunn>,
    /// Packets handed to boringtun while it had no session, since its queue was last drained.
    staged: usize,
}

/// What encrypting one packet for a peer gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sealed {
    /// A data message of this length is in the buffer.
    Data(usize),
    /// No session yet: the packet waits, and a handshake initiation of this length is in the
    /// buffer, to be sent.
    Handshake(usize),
    /// No session yet and a handshake is under way: the packet waits.
    Staged,
    /// No session and already [`MAX_STAGED`] packets waiting: boringtun dropped this one.
    Dropped,
}

/// What a timer tick asks of a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tick {
    Nothing,
    /// Send this many bytes of the buffer (a keepalive or a handshake initiation).
    Send(usize),
    /// The handshake gave up; this many waiting packets were thrown away.
    Expired(usize),
}

impl WgPeer {
    pub(super) fn new(spec: &WgPeerSpec, index: u32) -> WgPeer {
        WgPeer {
            subnet: spec.subnet,
            subnet6: spec.subnet6,
            public_key: spec.public_key,
            index,
            leased: Mutex::new(spec.endpoint),
            endpoint: ArcSwap::from_pointee(spec.endpoint),
            tunnel: Mutex::new(None),
            failed_responses: AtomicU32::new(0),
            failed_responses_log: LogLimit::new(FAILED_RESPONSES_WARN_EVERY),
        }
    }

    pub fn endpoint(&self) -> SocketAddr {
        **self.endpoint.load()
    }

    /// The peer's part of a message's receiver index (boringtun's: peer, session).
    pub(super) fn index(&self) -> u32 {
        self.index
    }

    /// Its lease names `endpoint`: send there from now on if that moved it, else keep sending
    /// where it roamed to.
    pub(super) fn follow_lease(&self, endpoint: SocketAddr) {
        let mut leased = self.leased.lock().unwrap_or_else(|e| e.into_inner());
        if std::mem::replace(&mut *leased, endpoint) != endpoint {
            self.endpoint.store(Arc::new(endpoint));
        }
    }

    /// Roaming: send to where this peer's last authenticated datagram came from. Returns
    /// whether that changed the endpoint (which alone costs an allocation).
    pub fn roam(&self, from: SocketAddr) -> bool {
        let moved = **self.endpoint.load() != from;
        if moved {
            self.endpoint.store(Arc::new(from));
        }
        moved
    }

    /// Notes how a handshake response from this peer fared. A response that passed the MAC
    /// keyed to our public key but does not decrypt comes from a node that read our initiation
    /// and used the right keys, but another preshared key: the log says so, once per peer
    /// while it lasts (and again every ten minutes at most).
    pub fn note_response(&self, authentic: bool) {
        if authentic {
            self.failed_responses.store(0, Relaxed);
            return;
        }
        let failed = self.failed_responses.fetch_add(1, Relaxed) + 1;
        if failed < FAILED_RESPONSES_TO_WARN {
            return;
        }
        if self.failed_responses_log.allow().is_some() {
            tracing::warn!(
                peer = %self.subnet,
                endpoint = %self.endpoint(),
                "WireGuard handshakes with peer {} keep failing: {failed} responses in a row \
                 do not authenticate. Do the nodes' pre-shared keys (PSK) differ?",
                self.subnet,
            );
        }
    }

    /// Whether a tunnel (sessions, handshake state) exists yet.
    pub fn has_tunnel(&self) -> bool {
        self.lock().is_some()
    }

    /// Encrypt `packet` into `dst`, which must hold `packet.len() + 32` and at least 148 bytes
    /// (a handshake initiation).
    pub fn seal(&self, params: &TunnelParams, packet: &[u8], dst: &mut [u8]) -> Sealed {
        let mut guard = self.lock();
        let tunnel = guard.get_or_insert_with(|| Tunnel::new(params, self));
        let waiting = tunnel.tunn.time_since_last_handshake().is_none();
        let result = tunnel.tunn.encapsulate(packet, dst);
        match (result, waiting) {
            (TunnResult::WriteToNetwork(out), false) => Sealed::Data(out.len()),
            (result, _) => {
                tunnel.staged += 1;
                match result {
                    _ if tunnel.staged > MAX_STAGED => Sealed::Dropped,
                    TunnResult::WriteToNetwork(out) => Sealed::Handshake(out.len()),
                    _ => Sealed::Staged,
                }
            }
        }
    }

    /// Run `f` on this peer's tunnel, made first if `create` (a handshake initiation from it);
    /// `None` when it has none.
    pub(crate) fn with_tunnel<T>(
        &self,
        params: &TunnelParams,
        create: bool,
        f: impl FnOnce(&mut Tunn) -> T,
    ) -> Option<T> {
        let mut guard = self.lock();
        if guard.is_none() && create {
            *guard = Some(Tunnel::new(params, self));
        }
        guard.as_mut().map(|t| f(&mut t.tunn))
    }

    /// The next packet boringtun kept while the handshake ran, now encrypted into `dst`: call
    /// after a handshake message was answered, until it gives `None`.
    pub fn next_staged(&self, dst: &mut [u8]) -> Option<usize> {
        let mut guard = self.lock();
        let tunnel = guard.as_mut()?;
        match tunnel.tunn.decapsulate(None, &[], dst) {
            TunnResult::WriteToNetwork(out) => Some(out.len()),
            _ => {
                tunnel.staged = 0;
                None
            }
        }
    }

    /// Handshake retries, rekeying and keepalives: boringtun's timers, run every 250 ms.
    pub fn tick(&self, dst: &mut [u8]) -> Tick {
        let mut guard = self.lock();
        let Some(tunnel) = guard.as_mut() else {
            return Tick::Nothing;
        };
        match tunnel.tunn.update_timers(dst) {
            TunnResult::WriteToNetwork(out) => Tick::Send(out.len()),
            TunnResult::Err(boringtun::noise::errors::WireGuardError::ConnectionExpired) => {
                Tick::Expired(std::mem::take(&mut tunnel.staged).min(MAX_STAGED))
            }
            _ => Tick::Nothing,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Tunnel>> {
        // A panic while holding it leaves boringtun's state as it was; going on is safe.
        self.tunnel.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Tunnel {
    fn new(params: &TunnelParams, peer: &WgPeer) -> Tunnel {
        // Handshake load is judged once for the node, before a message reaches a tunnel
        // (flood.rs). A tunnel's own limiter would hand out cookies of another secret, and a
        // peer holding one cookie could never satisfy both: so this one never sees load.
        let ours = x25519::PublicKey::from(params.private_key.public_key().0);
        let never_loaded = Arc::new(RateLimiter::new(&ours, u64::MAX));
        let tunn = Tunn::new(
            params.private_key.secret().clone(),
            x25519::PublicKey::from(peer.public_key.0),
            params.preshared_key.as_ref().map(|k| *k.bytes()),
            params.keepalive,
            peer.index,
            Some(never_loaded),
        );
        Tunnel {
            tunn: Box::new(tunn),
            staged: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_beyond_the_handshake_queue_are_dropped_and_counted() {
        let params = TunnelParams {
            private_key: PrivateKey::generate(),
            preshared_key: None,
            keepalive: None,
        };
        let peer = WgPeer::new(
            &WgPeerSpec {
                subnet: "10.5.1.0/24".parse().unwrap(),
                subnet6: None,
                endpoint: "10.200.0.1:51820".parse().unwrap(),
                public_key: PublicKey([1; 32]),
            },
            1,
        );
        let mut buf = [0u8; 256];
        let results: Vec<Sealed> = (0..MAX_STAGED + 2)
            .map(|_| peer.seal(&params, &[0; 20], &mut buf))
            .collect();
        assert!(matches!(results[0], Sealed::Handshake(_)));
        assert!(results[1..MAX_STAGED].iter().all(|r| *r == Sealed::Staged));
        assert_eq!(&results[MAX_STAGED..], [Sealed::Dropped, Sealed::Dropped]);
    }
}
