//! The underlay path MTU as the kernel's route reports it, learned anew when a send is refused
//! as too big.

use crate::io::udp::MAX_GSO_BYTES;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The underlay path MTU. One for all peers: flannel gives the whole network one MTU, and the
/// TUN, whose MTU bounds every packet, is shared by all peers too.
pub(crate) struct PathMtu {
    mtu: AtomicUsize,
    /// The outer IP and UDP headers of the underlay's family: a datagram's payload may be the
    /// path MTU minus these.
    headers: usize,
}

impl PathMtu {
    pub fn new(mtu: usize, headers: usize) -> PathMtu {
        PathMtu {
            mtu: AtomicUsize::new(mtu),
            headers,
        }
    }

    /// The path MTU: the largest outer IP packet.
    pub fn get(&self) -> usize {
        self.mtu.load(Relaxed)
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
                    tracing::warn!(%dst, old, new = mtu, "path MTU lowered after EMSGSIZE");
                }
            }
            Err(e) => tracing::debug!(%dst, "cannot read the route MTU: {e}"),
        }
    }
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
