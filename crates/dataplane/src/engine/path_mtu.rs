//! The underlay path MTU as the kernel's route reports it, learned anew when a send is refused
//! as too big.

use std::io;
use std::net::{IpAddr, SocketAddrV4};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Outer IPv4 and UDP headers: a datagram's payload may be PMTU minus this.
pub(crate) const UDP_IP_HEADERS: usize = 20 + 8;
/// The largest UDP payload IPv4 can carry.
const MAX_PAYLOAD: usize = 65535 - UDP_IP_HEADERS;

/// The underlay path MTU. One for all peers: flannel gives the whole network one MTU, and the
/// TUN, whose MTU bounds every packet, is shared by all peers too.
pub(crate) struct PathMtu(AtomicUsize);

impl PathMtu {
    pub fn new(mtu: usize) -> PathMtu {
        PathMtu(AtomicUsize::new(mtu))
    }

    /// The path MTU: the largest outer IPv4 packet.
    pub fn get(&self) -> usize {
        self.0.load(Relaxed)
    }

    /// The most a datagram's payload may hold.
    pub fn capacity(&self) -> usize {
        (self.0.load(Relaxed) - UDP_IP_HEADERS).min(MAX_PAYLOAD)
    }

    /// A send was refused as too big: adopt what the kernel's route to `dst` allows now, if less.
    pub fn lower(&self, local: IpAddr, dst: SocketAddrV4) {
        match route_mtu(local, dst) {
            Ok(mtu) => {
                let old = self.0.fetch_min(mtu, Relaxed);
                if mtu < old {
                    tracing::warn!(%dst, old, new = mtu, "path MTU lowered after EMSGSIZE");
                }
            }
            Err(e) => tracing::debug!(%dst, "cannot read the route MTU: {e}"),
        }
    }
}

/// The engine's socket is not connected, so ask a connected throwaway socket (IP_MTU): it sees
/// the route's MTU, learned PMTU included.
fn route_mtu(local: IpAddr, dst: SocketAddrV4) -> io::Result<usize> {
    use nix::sys::socket::{getsockopt, sockopt};
    let probe = std::net::UdpSocket::bind((local, 0))?;
    probe.connect(dst)?;
    let mtu = getsockopt(&probe, sockopt::IpMtu)?;
    usize::try_from(mtu).map_err(|_| io::Error::other("negative IP_MTU"))
}
