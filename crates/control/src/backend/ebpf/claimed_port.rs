//! flannel's udp port on the underlay address, held by an eBPF node for as long as it runs,
//! though the programs take every datagram of flannel's wire before a socket could: so that a
//! flanneld or a TUN node still running on this host is refused here, as the TUN engine's bind
//! refuses it, rather than starved of its traffic, and a later one is refused in turn.
//!
//! What does reach the socket is what the programs left to the stack as not flannel's wire
//! (an IPv6 datagram with extension headers before its UDP header, which the programs do not
//! walk; flanneld and the TUN engine read it, the kernel having stripped them) or what arrived
//! while no program was attached. Left unread it would fill the socket's buffer unsaid; each
//! one is read, counted as malformed beside the programs' own count, and logged (the first at
//! warn, the rest at debug).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;
use twill_ebpf::Attachment;

pub struct ClaimedPort {
    /// Datagrams read from the socket since start.
    strays: Arc<AtomicU64>,
    /// The task reading them, which owns the socket: aborting it gives the port back.
    reader: JoinHandle<()>,
}

impl ClaimedPort {
    /// Binds the port on the underlay address the programs serve and starts reading it. Must
    /// run inside the daemon's runtime.
    pub fn claim(attachment: &Attachment) -> anyhow::Result<ClaimedPort> {
        let address: IpAddr = match attachment.local_ip6 {
            Some(ip6) => ip6.into(),
            None => attachment.local_ip.into(),
        };
        let at = SocketAddr::new(address, attachment.port);
        let bound = std::net::UdpSocket::bind(at)
            .and_then(|socket| {
                socket.set_nonblocking(true)?;
                UdpSocket::from_std(socket)
            })
            .map_err(|e| twill_dataplane::io::udp::bind_error(at, e))?;
        let strays = Arc::new(AtomicU64::new(0));
        let reader = tokio::spawn(read_strays(bound, strays.clone()));
        Ok(ClaimedPort { strays, reader })
    }

    /// The count of datagrams the socket read, which status adds to the programs' malformed.
    pub fn strays(&self) -> Arc<AtomicU64> {
        self.strays.clone()
    }
}

impl Drop for ClaimedPort {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

async fn read_strays(socket: UdpSocket, strays: Arc<AtomicU64>) {
    let mut buf = vec![0u8; 65536];
    loop {
        match socket.recv_from(&mut buf).await {
            Ok((len, from)) => {
                let count = strays.fetch_add(1, Relaxed) + 1;
                if count == 1 {
                    tracing::warn!(
                        %from, len,
                        "a datagram to flannel's port reached the eBPF node's socket, not its \
                         programs (extension headers, or no program attached): dropped, counted \
                         as malformed; later ones are logged at debug"
                    );
                } else {
                    tracing::debug!(%from, len, count, "a datagram to flannel's port reached the socket: dropped");
                }
            }
            // An ICMP error for a send of this socket (it sends none) or a transient failure:
            // nothing was taken from the queue; a pause keeps a lasting one from spinning.
            Err(e) => {
                tracing::debug!("reading flannel's port: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
