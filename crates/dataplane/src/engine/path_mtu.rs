//! The underlay path MTU as the kernel's route reports it, learned anew when a send is refused
//! as too big, and raised back as the kernel's route allows more again (an underlay whose MTU
//! grew back, a learned path MTU that expired), asked at most once a second while it is low.

use crate::io::udp::MAX_GSO_BYTES;
use crate::log_limit::epoch;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

/// How often the kernel's route is asked again while the path MTU is below its start.
const RECHECK: Duration = Duration::from_secs(1);

/// The underlay path MTU. One for all peers: flannel gives the whole network one MTU, and the
/// TUN, whose MTU bounds every packet, is shared by all peers too.
pub(crate) struct PathMtu {
    mtu: AtomicUsize,
    /// The path MTU at start (what the TUN's MTU leaves room for): never raised beyond.
    start: usize,
    /// The outer IP and UDP headers of the underlay's family: a datagram's payload may be the
    /// path MTU minus these.
    headers: usize,
    /// While the path MTU is low: the route it was learned from, asked again after
    /// `recheck_at_ms` (milliseconds since the packet path's [`epoch`]).
    lowered_by: Mutex<Option<(IpAddr, SocketAddr)>>,
    recheck_at_ms: AtomicU64,
}

impl PathMtu {
    pub fn new(mtu: usize, headers: usize) -> PathMtu {
        PathMtu {
            mtu: AtomicUsize::new(mtu),
            start: mtu,
            headers,
            lowered_by: Mutex::new(None),
            recheck_at_ms: AtomicU64::new(0),
        }
    }

    /// The path MTU: the largest outer IP packet.
    pub fn get(&self) -> usize {
        let mtu = self.mtu.load(Relaxed);
        match mtu < self.start {
            true => self.recheck(mtu),
            false => mtu,
        }
    }

    /// The most a datagram's payload may hold.
    pub fn capacity(&self) -> usize {
        (self.get() - self.headers).min(MAX_GSO_BYTES)
    }

    /// A send was refused as too big: adopt what the kernel's route to `dst` allows now, if less.
    pub fn lower(&self, local: IpAddr, dst: SocketAddr) {
        match route_mtu(local, dst) {
            Ok(mtu) => {
                let old = self.mtu.fetch_min(mtu, Relaxed);
                if mtu < old {
                    *self.lowered_by.lock().unwrap_or_else(|e| e.into_inner()) = Some((local, dst));
                    self.recheck_at_ms.store(now_ms() + ms(RECHECK), Relaxed);
                    tracing::warn!(%dst, old, new = mtu, "path MTU lowered after EMSGSIZE");
                }
            }
            Err(e) => tracing::debug!(%dst, "cannot read the route MTU: {e}"),
        }
    }

    /// The path MTU `mtu`, below its start: once a second, raised to what the route it was
    /// learned from allows now (up to the start). One thread asks; the others go on with `mtu`.
    fn recheck(&self, mtu: usize) -> usize {
        let (now, at) = (now_ms(), self.recheck_at_ms.load(Relaxed));
        if now < at
            || self
                .recheck_at_ms
                .compare_exchange(at, now + ms(RECHECK), Relaxed, Relaxed)
                .is_err()
        {
            return mtu;
        }
        let lowered_by = *self.lowered_by.lock().unwrap_or_else(|e| e.into_inner());
        let Some((local, dst)) = lowered_by else {
            return mtu;
        };
        match route_mtu(local, dst) {
            Ok(allowed) if allowed.min(self.start) > mtu => {
                let raised = allowed.min(self.start);
                self.mtu.fetch_max(raised, Relaxed);
                tracing::info!(%dst, old = mtu, new = raised, "path MTU raised: the route allows more again");
                raised
            }
            Ok(_) => mtu,
            Err(e) => {
                tracing::debug!(%dst, "cannot read the route MTU: {e}");
                mtu
            }
        }
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

fn now_ms() -> u64 {
    ms(epoch().elapsed())
}

/// The engine's socket is not connected, so ask a connected throwaway socket (IP_MTU or
/// IPV6_MTU): it sees the route's MTU, learned PMTU included.
fn route_mtu(local: IpAddr, dst: SocketAddr) -> io::Result<usize> {
    use nix::sys::socket::{getsockopt, sockopt};
    let probe = std::net::UdpSocket::bind((local, 0))?;
    probe.connect(dst)?;
    let mtu = match dst {
        SocketAddr::V4(_) => getsockopt(&probe, sockopt::IpMtu)?,
        SocketAddr::V6(_) => ipv6_mtu(&probe)?,
    };
    usize::try_from(mtu).map_err(|_| io::Error::other("negative route MTU"))
}

/// IPV6_MTU of a connected socket: nix has IP_MTU but not its IPv6 twin.
fn ipv6_mtu(socket: &std::net::UdpSocket) -> io::Result<libc::c_int> {
    use std::os::fd::AsRawFd;
    let mut mtu: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the descriptor is open for the call, and `mtu` and `len` are valid for writes of
    // the size `len` gives.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU,
            (&mut mtu as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(mtu)
    } else {
        Err(io::Error::last_os_error())
    }
}
