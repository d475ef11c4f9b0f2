//! The underlay UDP socket: big buffers, recvmmsg with UDP GRO, sendmsg with UDP GSO.
//!
//! quinn-udp does the cmsg work and detects at run time whether GSO works on this path (EIO or
//! EINVAL switch it off); we add the buffer sizes and a batch API.
//!
//! Sends go straight to the kernel from the sending thread, through a descriptor no reactor
//! watches (see [`super::wait`]); receives wait in the runtime of the thread that made the
//! [`UdpReceiver`], on a duplicate descriptor registered for readability only.

use super::wait;
use arrayvec::ArrayVec;
use nix::{getsockopt_impl, setsockopt_impl, sockopt_impl};
use quinn_udp::{RecvMeta, Transmit, UdpSocketState, BATCH_SIZE};
use socket2::{Domain, Protocol, Socket, Type};
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, OwnedFd};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// wireguard-go's choice: 7 MB each way absorbs bursts of 64 KB sends without drops.
pub const DEFAULT_SOCKET_BUFFER: usize = 7 << 20;
/// Largest GRO read or GSO send: one 64 KB IP datagram's worth.
pub const MAX_DATAGRAM_TRAIN: usize = 65535;
/// A GSO send must fit one IP datagram: 65535 minus the outer IPv4 and UDP headers (an IPv6
/// datagram may hold 20 bytes more; one limit for both keeps the engines simple).
pub const MAX_GSO_BYTES: usize = 65535 - 28;

/// The outer IP and UDP headers of a datagram sent from or to `addr`: what the underlay adds
/// to every datagram, 28 bytes over IPv4 and 48 over IPv6.
pub fn udp_ip_headers(addr: IpAddr) -> usize {
    match addr {
        IpAddr::V4(_) => 20 + 8,
        IpAddr::V6(_) => 40 + 8,
    }
}

/// The bound socket: sends from any thread, and makes the receivers.
pub struct UdpIo {
    socket: Socket,
    state: UdpSocketState,
}

/// Why the node's port could not be bound: a port in use is another flanneld's or twill's most
/// likely, and said so, by the TUN engine's socket and by the eBPF node's claim alike.
pub fn bind_error(addr: SocketAddr, e: io::Error) -> anyhow::Error {
    if e.kind() == io::ErrorKind::AddrInUse {
        anyhow::anyhow!(
            "cannot bind UDP {addr}: port {} is already in use (another flanneld or twill on \
             this host?)",
            addr.port()
        )
    } else {
        anyhow::anyhow!("cannot bind UDP {addr}: {e}")
    }
}

impl UdpIo {
    /// Bind on `addr` (flanneld binds iface_ip:port) with `buffer` bytes of send and of
    /// receive buffer. An IPv6 address makes an IPv6-only socket: the underlay is one family.
    /// It takes datagrams whose UDP checksum is zero, which an eBPF node sends over IPv6 as the
    /// kernel's VXLAN does with udp6zerocsumtx (RFC 6935/6936 allow it for tunnels; the inner
    /// packet keeps its own checksum, and the peer is checked by its address as ever).
    pub fn bind(addr: SocketAddr, buffer: usize) -> anyhow::Result<UdpIo> {
        let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
        if addr.is_ipv6() {
            socket.set_only_v6(true)?;
            nix::sys::socket::setsockopt(&socket, UdpNoCheck6Rx, &true)
                .map_err(|e| anyhow::anyhow!("cannot set UDP_NO_CHECK6_RX on {addr}: {e}"))?;
        }
        set_buffers(&socket, buffer);
        socket.bind(&addr.into()).map_err(|e| bind_error(addr, e))?;
        socket.set_nonblocking(true)?;
        let state = UdpSocketState::new((&socket).into())?;
        tracing::info!(
            %addr,
            gso_segments = state.max_gso_segments(),
            gro_segments = state.gro_segments(),
            "UDP socket bound ({})",
            if state.max_gso_segments() > 1 { "GSO/GRO" } else { "plain sendmsg, no GSO" }
        );
        Ok(UdpIo { socket, state })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("UDP socket bound to a non-IP address"))
    }

    /// A receiver woken by the runtime this is called in: call it on the thread that will
    /// receive.
    pub fn receiver(&self) -> io::Result<UdpReceiver> {
        let socket = OwnedFd::from(self.socket.try_clone()?);
        let state = UdpSocketState::new((&socket).into())?;
        let socket = super::register(socket, Interest::READABLE)?;
        Ok(UdpReceiver { socket, state })
    }

    pub fn max_gso_segments(&self) -> usize {
        self.state.max_gso_segments()
    }

    /// How many equal segments one GSO send may carry at this segment size.
    pub fn segments_per_send(&self, segment: usize) -> usize {
        segments_per_send(self.state.max_gso_segments(), segment)
    }

    /// Send `contents` to `dst` as datagrams of `segment` bytes (the last may be shorter), in
    /// one syscall where the kernel allows it. The caller keeps `contents` within
    /// [`UdpIo::segments_per_send`]. A train the kernel refuses whole (too big for one send, or
    /// a device without segmentation offload) is sent again one datagram at a time, so one bad
    /// send never costs the whole train; the error then says how many datagrams still went.
    pub fn send(&self, dst: SocketAddr, contents: &[u8], segment: usize) -> Result<(), SendError> {
        let segment = segment.max(1);
        let Err(error) = self.send_once(dst, contents, segment) else {
            return Ok(());
        };
        let datagrams = contents.len().div_ceil(segment);
        if datagrams == 1 || !refuses_train(&error) {
            return Err(SendError::whole(datagrams, error));
        }
        self.send_each(dst, contents, segment)
    }

    fn send_once(&self, dst: SocketAddr, contents: &[u8], segment: usize) -> io::Result<()> {
        let transmit = Transmit {
            destination: dst,
            ecn: None,
            contents,
            segment_size: (contents.len() > segment).then_some(segment),
            src_ip: None,
        };
        wait::until_writable(self.socket.as_fd(), || {
            self.state.try_send((&self.socket).into(), &transmit)
        })
    }

    /// The datagrams of a refused train, one send each; the first error is kept.
    fn send_each(&self, dst: SocketAddr, contents: &[u8], segment: usize) -> Result<(), SendError> {
        let mut failed = 0u128;
        let mut first_error = None;
        for (i, datagram) in contents.chunks(segment).enumerate() {
            if let Err(e) = self.send_once(dst, datagram, segment) {
                failed |= 1 << i;
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            None => Ok(()),
            Some(error) => Err(SendError { failed, error }),
        }
    }
}

/// The receiving side of a [`UdpIo`], registered with one thread's runtime.
pub struct UdpReceiver {
    socket: AsyncFd<OwnedFd>,
    state: UdpSocketState,
}

impl UdpReceiver {
    /// Wait for datagrams and read as many as are ready, with GRO trains, into `batch`.
    pub async fn recv(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        let mut slices: ArrayVec<IoSliceMut<'_>, BATCH_SIZE> = batch
            .buf
            .chunks_exact_mut(MAX_DATAGRAM_TRAIN)
            .map(IoSliceMut::new)
            .collect();
        let meta = &mut batch.meta;
        let n = self
            .socket
            .async_io(Interest::READABLE, |socket| {
                self.state.recv(socket.into(), &mut slices, meta)
            })
            .await?;
        batch.len = n;
        Ok(n)
    }
}

/// How many `segment`-byte datagrams fit one send: at most `max_gso_segments`, and all of
/// them within one IP datagram's 65,507 bytes of UDP payload.
pub fn segments_per_send(max_gso_segments: usize, segment: usize) -> usize {
    max_gso_segments.min(MAX_GSO_BYTES / segment.max(1)).max(1)
}

/// Errors with which the kernel refuses a GSO train as a whole, though its datagrams may go
/// one by one: EMSGSIZE (more than one send may carry), EIO and EINVAL (no segmentation offload
/// on the route's device; quinn-udp turns GSO off after them).
fn refuses_train(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMSGSIZE | libc::EIO | libc::EINVAL)
    )
}

/// A send the kernel refused, in whole or in part.
#[derive(Debug)]
pub struct SendError {
    /// Bit `i` set: datagram `i` of the train did not go out. A train holds at most 64
    /// datagrams (UDP_MAX_SEGMENTS), so every one has a bit.
    pub failed: u128,
    /// The first error the kernel gave.
    pub error: io::Error,
}

impl SendError {
    fn whole(datagrams: usize, error: io::Error) -> SendError {
        let failed = u128::MAX.checked_shr(128 - datagrams as u32).unwrap_or(0);
        SendError { failed, error }
    }

    /// How many datagrams did not go out.
    pub fn lost(&self) -> usize {
        self.failed.count_ones() as usize
    }

    /// Whether datagram `i` of the train went out.
    pub fn was_sent(&self, i: usize) -> bool {
        i >= 128 || self.failed & (1 << i) == 0
    }
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({} datagrams lost)", self.error, self.lost())
    }
}

nix::sockopt_impl!(
    /// UDP_NO_CHECK6_RX: an IPv6 datagram with a zero UDP checksum is taken, not dropped.
    UdpNoCheck6Rx,
    Both,
    libc::IPPROTO_UDP,
    libc::UDP_NO_CHECK6_RX,
    bool
);

/// Force the buffers past rmem_max/wmem_max when root; otherwise take what the limits allow.
fn set_buffers(socket: &Socket, bytes: usize) {
    use nix::sys::socket::{setsockopt, sockopt};
    let forced = setsockopt(socket, sockopt::SndBufForce, &bytes)
        .and_then(|_| setsockopt(socket, sockopt::RcvBufForce, &bytes));
    if let Err(e) = forced {
        tracing::debug!("SO_*BUFFORCE refused ({e}); using SO_*BUF within sysctl limits");
        let _ = socket.set_send_buffer_size(bytes);
        let _ = socket.set_recv_buffer_size(bytes);
    }
}

/// Buffers for one recvmmsg: up to BATCH_SIZE messages, each possibly a GRO train.
pub struct RecvBatch {
    buf: Vec<u8>,
    meta: [RecvMeta; BATCH_SIZE],
    len: usize,
}

impl Default for RecvBatch {
    fn default() -> Self {
        RecvBatch {
            buf: vec![0; MAX_DATAGRAM_TRAIN * BATCH_SIZE],
            meta: [RecvMeta::default(); BATCH_SIZE],
            len: 0,
        }
    }
}

impl RecvBatch {
    /// The messages of the last recv: the sender and its datagrams, split at the GRO stride.
    pub fn messages(&mut self) -> impl Iterator<Item = (SocketAddr, GroTrain<'_>)> {
        let meta = &self.meta[..self.len];
        self.buf
            .chunks_exact_mut(MAX_DATAGRAM_TRAIN)
            .zip(meta)
            .map(|(buf, m)| (m.addr, GroTrain::new(&mut buf[..m.len], m.stride)))
    }
}

/// Datagrams coalesced by GRO: all `stride` bytes long but the last. A zero-length datagram
/// is a message of its own, never coalesced, and is yielded as one empty datagram so that it
/// is counted like any other.
pub struct GroTrain<'a> {
    chunks: std::slice::ChunksMut<'a, u8>,
    empty: Option<&'a mut [u8]>,
}

impl<'a> GroTrain<'a> {
    fn new(buf: &'a mut [u8], stride: usize) -> Self {
        if buf.is_empty() {
            return GroTrain {
                chunks: [].chunks_mut(1),
                empty: Some(buf),
            };
        }
        GroTrain {
            chunks: buf.chunks_mut(stride.max(1)),
            empty: None,
        }
    }
}

impl<'a> Iterator for GroTrain<'a> {
    type Item = &'a mut [u8];
    fn next(&mut self) -> Option<Self::Item> {
        self.empty.take().or_else(|| self.chunks.next())
    }
}

/// A received datagram's sender as peers' endpoints are written: an IPv4-mapped address as
/// IPv4, an IPv6 one without flow label or scope, so it compares equal to the lease's address.
pub fn sender(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V4(_) => addr,
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(ip) => SocketAddr::V4(SocketAddrV4::new(ip, v6.port())),
            None => SocketAddr::V6(SocketAddrV6::new(*v6.ip(), v6.port(), 0, 0)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_length_datagram_is_one_empty_datagram() {
        let mut buf = [0u8; 0];
        let datagrams: Vec<usize> = GroTrain::new(&mut buf, 1472).map(|d| d.len()).collect();
        assert_eq!(datagrams, [0]);
    }

    #[test]
    fn a_gro_train_splits_at_its_stride() {
        let mut buf = [0u8; 2500];
        let datagrams: Vec<usize> = GroTrain::new(&mut buf, 1000).map(|d| d.len()).collect();
        assert_eq!(datagrams, [1000, 1000, 500]);
    }
}
