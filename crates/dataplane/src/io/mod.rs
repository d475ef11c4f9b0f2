//! The two devices an engine moves packets between, each with a batch API in the style of
//! wireguard-go's `tun` and `conn`: a read returns as many packets as the kernel has ready, and a
//! write hands over many packets in as few syscalls as the kernel allows.

pub mod gro;
pub mod gso;
pub mod tun;
pub mod udp;

pub use tun::{Tun, TunConfig, TunReader, TunWriter, DEFAULT_TX_QUEUE_LEN};
pub use udp::{RecvBatch, UdpIo, DEFAULT_SOCKET_BUFFER};
