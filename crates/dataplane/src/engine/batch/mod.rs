//! The batch engine: many inner packets per UDP datagram, as docs/batch-protocol.md specifies.
//!
//! Each TUN read is a drain: its packets are grouped by peer, kept in order, and packed into as
//! few datagrams as fit under the path MTU. Nothing waits for packets that have not arrived
//! (unless `--batch-delay` asks), so batching grows with load and a lone packet leaves at once.
//! One peer's datagrams are written back to back, so a run of equal sizes (full datagrams and a
//! shorter last one: the common case) leaves in one UDP GSO send.

mod held;
mod reassembly;
mod receiver;
mod sender;

use super::directions::Direction;
use super::train::Counts;
use super::Shared;
use crate::io::gso;
use crate::io::Tun;
use ipnet::Ipv4Net;
use receiver::Receiver;
use sender::Sender;
use std::io;
use std::sync::Arc;
use std::time::Duration;

/// TUN -> UDP for each queue, and UDP -> TUN.
pub(crate) fn directions(
    tun: &Arc<Tun>,
    io: &Shared,
    subnet: Ipv4Net,
    delay: Option<Duration>,
) -> io::Result<Vec<Direction>> {
    let mut directions = Vec::new();
    for q in 0..tun.queues() {
        let sender = Sender::new(io.clone(), subnet, delay, q as u8);
        let (tun, icmp) = (tun.clone(), tun.writer(q)?);
        directions.push(Direction::new(format!("twill tun{q}>udp"), move || {
            let mut reader = tun.reader(q)?;
            reader.keep_whole(true);
            Ok(sender::tun_to_udp(reader, icmp, sender))
        }));
    }
    let (writer, rx) = (tun.writer(0)?, Receiver::new(io.clone()));
    directions.push(Direction::new("twill udp>tun", move || {
        Ok(receiver::udp_to_tun(rx.io.udp.receiver()?, writer, rx))
    }));
    Ok(directions)
}

/// A super-packet counts as the segments the kernel cuts it into, so counters agree whether
/// it travels whole or split.
fn super_counts(packet: &[u8], gso_type: u8, gso_size: u16) -> Counts {
    let ip_len = gso::tcp_ip_header_len(packet, gso_type);
    let headers = ip_len.and_then(|len| gso::tcp_headers_end(packet, len));
    let headers = headers.unwrap_or(packet.len());
    Counts {
        datagrams: 0,
        super_packets: 1,
        packets: (packet.len() - headers)
            .div_ceil(usize::from(gso_size).max(1))
            .max(1) as u64,
        bytes: packet.len() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::virtio::{GSO_TCPV4, GSO_TCPV6};

    #[test]
    fn super_packets_count_as_their_segments() {
        let mut packet = vec![0u8; 40 + 2500];
        packet[0] = 0x45;
        packet[32] = 5 << 4;
        packet[9] = 6;
        let counts = super_counts(&packet, GSO_TCPV4, 1000);
        assert_eq!(
            (counts.packets, counts.bytes, counts.super_packets),
            (3, 2540, 1)
        );
        let mut packet6 = vec![0u8; 60 + 2500];
        (packet6[0], packet6[6], packet6[52]) = (0x60, 6, 5 << 4);
        let counts = super_counts(&packet6, GSO_TCPV6, 1000);
        assert_eq!((counts.packets, counts.bytes), (3, 2560));
    }
}
