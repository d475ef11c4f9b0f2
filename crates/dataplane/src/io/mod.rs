//! The two devices an engine moves packets between, each with a batch API in the style of
//! wireguard-go's `tun` and `conn`: a read returns as many packets as the kernel has ready, and a
//! write hands over many packets in as few syscalls as the kernel allows.

pub mod devconf;
pub mod gro;
pub mod gso;
pub mod rtnetlink;
pub mod tun;
pub mod udp;
mod wait;

pub use tun::{Tun, TunConfig, TunReader, TunWriter, DEFAULT_TX_QUEUE_LEN};
pub use udp::{RecvBatch, UdpIo, UdpReceiver, DEFAULT_SOCKET_BUFFER};

use std::os::fd::OwnedFd;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Register `fd` with the current thread's runtime, for `interest` only: a reader registered
/// for writability too would also be woken whenever the kernel frees what a writer sent.
fn register(fd: OwnedFd, interest: Interest) -> std::io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd keeps its descriptor open, and always returns that one from
    // as_raw_fd, for as long as it lives, which is as long as the AsyncFd owning it.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(|e| e.into_parts().1)
}
