//! TunReader's batching on a real TUN in a fresh namespace: packets come from a UDP socket whose
//! route leads into the TUN, and each one read is checked against what was sent.

use anyhow::{ensure, Result};
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::pin::pin;
use std::task::Poll;
use twill_dataplane::io::{Tun, TunConfig, TunReader};
use twill_lab::Netns;

const TUN_NAME: &str = "tw0";
/// Routed into the TUN; nothing answers there.
const INTO_TUN: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 5, 3, 3), 9);
/// IPv4 and UDP headers before the payload in a read packet.
const HEADERS: usize = 28;

#[test]
fn woken_reader_sends_first_while_sparse_and_drains_under_load() -> Result<()> {
    let ns = Netns::new("tunread")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let config = TunConfig {
        name: TUN_NAME.into(),
        mtu: 1500,
        address: Ipv4Addr::new(10, 5, 1, 0),
        offload: true,
        queues: 1,
        tx_queue_len: 1000,
    };
    // The TUN and socket stay bound to the namespace they were made in.
    let (tun, socket) = ns.enter(|| (Tun::open(&config), UdpSocket::bind("0.0.0.0:0")));
    let (tun, socket) = (tun?, socket?);
    ns.ip(&["route", "add", "10.5.0.0/16", "dev", TUN_NAME])?;
    let mut reader = {
        let _runtime = rt.enter();
        tun.reader(0)?
    };
    let mut sender = Sender { socket, next: 0 };
    rt.block_on(async {
        sender.send(1)?;
        let n = reader.read_batch().await?;
        ensure!(
            n == 1,
            "one queued packet, one read, got {n}: {:02x?}",
            reader.packet_mut(0)
        );
        check(&mut reader, 0..1)?;

        let n = woken_batch(&mut reader, &mut sender, 3).await?;
        ensure!(
            n == 1,
            "a wake after a one-read batch returns its first packet alone, got {n}"
        );
        check(&mut reader, 1..2)?;
        let n = reader.read_batch().await?;
        ensure!(
            n == 2,
            "the packets still queued are read together, got {n}"
        );
        check(&mut reader, 2..4)?;

        let n = woken_batch(&mut reader, &mut sender, 3).await?;
        ensure!(
            n == 3,
            "a wake after a batch of several reads drains the queue, got {n}"
        );
        check(&mut reader, 4..7)
    })
}

/// Let `reader` sleep on the empty TUN, queue `count` packets, then let it wake.
async fn woken_batch(reader: &mut TunReader, sender: &mut Sender, count: u32) -> Result<usize> {
    let mut read = pin!(reader.read_batch());
    let first = std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await;
    ensure!(first.is_pending(), "the TUN was not empty");
    sender.send(count)?;
    Ok(read.await?)
}

/// Numbers its datagrams, so each read packet can be matched to what was sent.
struct Sender {
    socket: UdpSocket,
    next: u32,
}

impl Sender {
    fn send(&mut self, count: u32) -> Result<()> {
        for _ in 0..count {
            self.socket.send_to(&self.next.to_be_bytes(), INTO_TUN)?;
            self.next += 1;
        }
        Ok(())
    }
}

/// The batch holds exactly the datagrams numbered `sent`, in order.
fn check(reader: &mut TunReader, sent: std::ops::Range<u32>) -> Result<()> {
    for (i, number) in sent.enumerate() {
        let packet = reader.packet_mut(i);
        ensure!(
            packet.get(HEADERS..) == Some(&number.to_be_bytes()[..]),
            "packet {i} of the batch is not datagram {number}: {packet:02x?}"
        );
    }
    Ok(())
}
