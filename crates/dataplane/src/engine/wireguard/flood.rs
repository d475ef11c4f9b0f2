//! Handshake messages under load, met as the kernel's WireGuard meets them. A handshake costs
//! Diffie-Hellman work, and anyone who knows a node's public key (it is in every lease) can make
//! initiations that pass the first MAC, so their number must be bounded before that work:
//! - up to [`HANDSHAKES_PER_SECOND`] a second, every handshake message is taken up;
//! - beyond that the node is under load: a message without a cookie gets a cookie reply instead
//!   of an answer, which only its sender's real address receives, so that answering it proves
//!   the address, and a message whose cookie proves its address is taken up;
//! - under load, each source address (an IPv6 one by its /64) has a token bucket
//!   ([`SOURCE_PER_SECOND`], bursts of [`SOURCE_BURST`], the kernel's figures), and a message
//!   from an address with no token left is dropped before any cryptography. The kernel spends those tokens on messages with a
//!   cookie only, and answers every other with a cookie on whichever of its CPUs is free; twill
//!   opens datagrams on one thread, where a cookie for every datagram of a flood would starve
//!   the data messages behind them. The price: while the node is under load, an attacker who
//!   forges a peer's address can spend that peer's tokens.
//!
//! Every message not taken up is counted as `handshake_flood`. Data messages never pass here:
//! an established session's traffic does not wait on handshakes.

use crate::stats::DropReason;
use boringtun::noise::errors::WireGuardError;
use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::noise::{Packet, TunnResult};
use boringtun::x25519;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Handshake messages this node takes up each second before it asks for cookies (boringtun's
/// device uses the same figure).
pub const HANDSHAKES_PER_SECOND: u64 = 100;
/// Handshake messages one address may send per second while the node is under load, each
/// answered or given a cookie.
pub const SOURCE_PER_SECOND: u64 = 20;
/// How many of those may come at once.
pub const SOURCE_BURST: u64 = 5;
/// Addresses tracked at once. One is forgotten at the next second's start once its bucket is
/// full again (a quarter of a second idle), so filling this takes some 16,000 new addresses a
/// second; a new one beyond it gets nothing until then, as in the kernel's table.
const MAX_SOURCES: usize = 16_384;

const NANOS_PER_TOKEN: u64 = 1_000_000_000 / SOURCE_PER_SECOND;
const FULL_BUCKET: u64 = NANOS_PER_TOKEN * SOURCE_BURST;

/// What becomes of one handshake message.
pub enum Verdict<'a> {
    Pass(Packet<'a>),
    /// Under load and without a cookie: not taken up, and this many bytes of the buffer are a
    /// cookie reply for its sender.
    Cookie(usize),
    Dropped(DropReason),
}

/// The node's handshake admission: one for all peers, so that there is one cookie secret.
pub struct Gate {
    /// Checks mac1, counts the second's messages and, under load, checks or hands out cookies.
    limiter: RateLimiter,
    /// The messages with a good mac1 this second, counted as `limiter` counts them: whether the
    /// node is under load is not told otherwise.
    this_second: AtomicU64,
    last_reset: Mutex<Instant>,
    /// Buckets by source: an IPv4 address, or an IPv6 /64 (as the kernel's ratelimiter keys
    /// them: one host holds a whole /64, and would otherwise have a bucket per address).
    sources: Mutex<HashMap<IpAddr, Bucket>>,
}

impl Gate {
    pub fn new(public: &x25519::PublicKey) -> Gate {
        Gate {
            limiter: RateLimiter::new(public, HANDSHAKES_PER_SECOND),
            this_second: AtomicU64::new(0),
            last_reset: Mutex::new(Instant::now()),
            sources: Mutex::new(HashMap::new()),
        }
    }

    /// Starts a new second when the last one is over, and forgets idle addresses; call a few
    /// times a second.
    pub fn tick(&self) {
        let mut last = lock(&self.last_reset);
        if last.elapsed() < Duration::from_secs(1) {
            return;
        }
        // The limiter keeps its own second, which starts when it resets: it resets first and
        // ours starts after, so whenever ours is over, so is the limiter's.
        self.limiter.reset_count();
        self.this_second.store(0, Relaxed);
        *last = Instant::now();
        let now = *last;
        lock(&self.sources).retain(|_, bucket| !bucket.is_full(now));
    }

    /// Admits a handshake initiation or response from `from`; a cookie reply goes to `dst`.
    pub fn check<'a>(&self, from: SocketAddr, datagram: &'a [u8], dst: &mut [u8]) -> Verdict<'a> {
        // Under load, an address past its share gets nothing, before any cryptography: a
        // cookie costs as much as forwarding dozens of packets, and one address flooding
        // must cost this node a table lookup per datagram, not a cookie.
        let under_load = self.this_second.load(Relaxed) >= HANDSHAKES_PER_SECOND;
        if under_load && !self.source_may(source(from.ip())) {
            return Verdict::Dropped(DropReason::HandshakeFlood);
        }
        let verified = self.limiter.verify_packet(Some(from.ip()), datagram, dst);
        // Counted as the limiter counts: every message whose mac1 is good.
        let counted = || self.this_second.fetch_add(1, Relaxed);
        match verified {
            Ok(packet) => {
                counted();
                Verdict::Pass(packet)
            }
            Err(TunnResult::WriteToNetwork(cookie)) => {
                counted();
                Verdict::Cookie(cookie.len())
            }
            Err(TunnResult::Err(WireGuardError::InvalidMac)) => {
                Verdict::Dropped(DropReason::BadMac)
            }
            Err(_) => Verdict::Dropped(DropReason::Malformed),
        }
    }

    /// Takes a token from `source`'s bucket, if it has one.
    fn source_may(&self, source: IpAddr) -> bool {
        let now = Instant::now();
        let mut sources = lock(&self.sources);
        let full = sources.len() >= MAX_SOURCES;
        match sources.get_mut(&source) {
            Some(bucket) => bucket.take(now),
            None if full => false,
            None => {
                let mut bucket = Bucket::new(now);
                let taken = bucket.take(now);
                sources.insert(source, bucket);
                taken
            }
        }
    }
}

/// The bucket `ip` spends from: its own for IPv4, its /64's for IPv6.
fn source(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX))),
    }
}

/// Tokens of one address, as nanoseconds of credit: one token per [`NANOS_PER_TOKEN`].
struct Bucket {
    nanos: u64,
    last: Instant,
}

impl Bucket {
    fn new(now: Instant) -> Bucket {
        Bucket {
            nanos: FULL_BUCKET,
            last: now,
        }
    }

    fn take(&mut self, now: Instant) -> bool {
        self.nanos = self.credit(now);
        self.last = now;
        let taken = self.nanos >= NANOS_PER_TOKEN;
        if taken {
            self.nanos -= NANOS_PER_TOKEN;
        }
        taken
    }

    fn credit(&self, now: Instant) -> u64 {
        let earned = now.saturating_duration_since(self.last).as_nanos();
        let earned = u64::try_from(earned).unwrap_or(u64::MAX);
        self.nanos.saturating_add(earned).min(FULL_BUCKET)
    }

    fn is_full(&self, now: Instant) -> bool {
        self.credit(now) == FULL_BUCKET
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // What a panic left behind is counters and clocks: going on with them is safe.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_gets_its_burst_then_a_token_per_share_of_a_second() {
        let start = Instant::now();
        let mut bucket = Bucket::new(start);
        let burst = (0..10).filter(|_| bucket.take(start)).count();
        assert_eq!(burst as u64, SOURCE_BURST);
        let later = start + Duration::from_nanos(NANOS_PER_TOKEN);
        assert!(bucket.take(later));
        assert!(!bucket.take(later));
        assert!(bucket.is_full(later + Duration::from_secs(1)));
    }

    #[test]
    fn an_ipv6_source_spends_from_its_64s_bucket() {
        let host = |s: &str| source(s.parse().unwrap());
        assert_eq!(host("fd00:200::1"), host("fd00:200::ffff:1"));
        assert_ne!(host("fd00:200::1"), host("fd00:200:0:1::1"));
        assert_eq!(host("10.200.0.1"), "10.200.0.1".parse::<IpAddr>().unwrap());
    }
}
