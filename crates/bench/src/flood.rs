//! The 64-byte flood: twill-bench's own generator, so that no sender limits what a path shows.
//!
//! A sender in the client's namespace offers 64-byte UDP datagrams with sendmmsg, paced to at most
//! [`RATE_PPS`] for a bounded time; a receiver in the server's namespace counts what arrives with
//! recvmmsg. The kernel's UDP counters of both namespaces say what the path lost, and a tc counter
//! on the server host's underlay device how many underlay datagrams carried the flood.

use crate::endpoints::{Endpoints, UdpCounts};
use anyhow::{bail, ensure, Context, Result};
use nix::sys::socket::{recvmmsg, sendmmsg, setsockopt, sockopt, ControlMessage, MsgFlags};
use nix::sys::socket::{MultiHeaders, SockaddrIn};
use std::io::{IoSlice, IoSliceMut};
use std::net::{SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};
use twill_lab::Netns;

/// UDP payload per datagram, as iperf3 `-l 64`.
const PAYLOAD: usize = 64;
const PORT: u16 = 5202;
/// Offered load: above what any path carries on this machine (about 1 µs of kernel work per
/// datagram at the sender alone), so the path is the limit, yet bounded.
pub const RATE_PPS: u64 = 1_000_000;
/// Datagrams per sendmmsg/recvmmsg.
const BATCH: usize = 64;
/// The receiver's socket buffer: a burst the path delivers at once must not overflow it.
const RECEIVE_BUFFER: usize = 32 << 20;
/// The receiver reads until nothing came for this long after the sender stopped.
const DRAIN_IDLE: Duration = Duration::from_millis(200);

/// What one flood measured.
pub struct Flood {
    /// Delivered packets per second, in thousands.
    pub kpps: f64,
    /// The share of sent datagrams the path lost.
    pub loss_pct: f64,
    /// Underlay datagrams per delivered packet.
    pub datagrams_per_packet: f64,
}

/// One flood of `seconds`, client to server.
pub fn run(ends: &Endpoints, seconds: u32) -> Result<Flood> {
    let to = SocketAddrV4::new(ends.server_ip, PORT);
    let receiver = ends.server.enter(|| receiver_socket(to))?;
    let sender = ends.client.enter(|| UdpSocket::bind("0.0.0.0:0"))?;
    sender.connect(to)?;
    let counter = UnderlayCounter::attach(ends.underlay.0, ends.underlay.1)?;
    let (before, underlay_before) = (UdpCounts::take(ends)?, counter.datagrams()?);
    let sending = AtomicBool::new(true);
    let duration = Duration::from_secs(u64::from(seconds));
    let (sent, delivered) = std::thread::scope(|scope| {
        let counting = scope.spawn(|| receive(&receiver, &sending));
        let sent = send(&sender, duration);
        sending.store(false, Relaxed);
        let delivered = counting.join().expect("the flood receiver panicked");
        (sent, delivered)
    });
    let (sent, delivered) = (sent?, delivered?);
    let underlay = counter.datagrams()? - underlay_before;
    let loss = UdpCounts::take(ends)?.path_loss_pct(&before)?;
    ensure!(delivered > 0, "none of {sent} flood datagrams arrived");
    Ok(Flood {
        kpps: delivered as f64 / duration.as_secs_f64() / 1e3,
        loss_pct: loss,
        datagrams_per_packet: underlay as f64 / delivered as f64,
    })
}

fn receiver_socket(at: SocketAddrV4) -> Result<UdpSocket> {
    let socket = UdpSocket::bind(at)?;
    setsockopt(&socket, sockopt::RcvBufForce, &RECEIVE_BUFFER)?;
    socket.set_read_timeout(Some(DRAIN_IDLE / 4))?;
    Ok(socket)
}

/// Offer datagrams at up to [`RATE_PPS`] for `duration`; returns how many the socket took.
fn send(socket: &UdpSocket, duration: Duration) -> Result<u64> {
    let payload = [0x64u8; PAYLOAD];
    let iovs: [[IoSlice; 1]; BATCH] = [[IoSlice::new(&payload)]; BATCH];
    let mut headers = MultiHeaders::<SockaddrIn>::preallocate(BATCH, None);
    let no_cmsgs: [ControlMessage; 0] = [];
    let started = Instant::now();
    let (mut offered, mut sent) = (0u64, 0u64);
    loop {
        let elapsed = started.elapsed();
        if elapsed >= duration {
            return Ok(sent);
        }
        let until_now = (elapsed.as_secs_f64() * RATE_PPS as f64) as u64;
        let due = until_now.saturating_sub(offered).min(BATCH as u64) as usize;
        offered += due as u64;
        if due == 0 {
            std::thread::sleep(Duration::from_micros(100));
            continue;
        }
        let result = sendmmsg(
            socket.as_raw_fd(),
            &mut headers,
            &iovs[..due],
            [None; BATCH],
            no_cmsgs,
            MsgFlags::empty(),
        );
        match result {
            Ok(done) => sent += done.count() as u64,
            // The container's own queue was full: the offer exceeds even the first hop.
            Err(nix::errno::Errno::ENOBUFS | nix::errno::Errno::EAGAIN) => {}
            Err(e) => bail!("flood sendmmsg: {e}"),
        }
    }
}

/// Count datagrams until the sender has stopped and nothing came for [`DRAIN_IDLE`].
fn receive(socket: &UdpSocket, sending: &AtomicBool) -> Result<u64> {
    let mut buf = vec![0u8; 2048 * BATCH];
    let mut headers = MultiHeaders::<SockaddrIn>::preallocate(BATCH, None);
    let mut received = 0u64;
    let mut last = Instant::now();
    loop {
        let mut chunks = buf.chunks_exact_mut(2048);
        let mut iovs: [[IoSliceMut; 1]; BATCH] = std::array::from_fn(|_| {
            [IoSliceMut::new(
                chunks.next().expect("one chunk per datagram"),
            )]
        });
        let got = recvmmsg(
            socket.as_raw_fd(),
            &mut headers,
            iovs.iter_mut(),
            MsgFlags::MSG_WAITFORONE,
            None,
        );
        match got {
            Ok(messages) => {
                received += messages.count() as u64;
                last = Instant::now();
            }
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {
                if !sending.load(Relaxed) && last.elapsed() >= DRAIN_IDLE {
                    return Ok(received);
                }
            }
            Err(e) => bail!("flood recvmmsg: {e}"),
        }
    }
}

/// A tc counter on a host's underlay device, egress: tc counts a GSO packet as the datagrams
/// it carries (its segments), where the device's own counters count it once. A clsact qdisc
/// already there (twill's eBPF dataplane on classic TC) is shared, not replaced: its count then
/// also has what comes in, which on the flood's sending host is next to nothing. What this
/// added is removed on drop.
struct UnderlayCounter<'a> {
    ns: &'a Netns,
    dev: &'a str,
    /// Whether the clsact qdisc is this counter's own, to delete on drop.
    own_qdisc: bool,
}

/// The counter's filter: its own priority, apart from any other filter on the qdisc.
const COUNTER_PRIO: &str = "49152";

impl<'a> UnderlayCounter<'a> {
    fn attach(ns: &'a Netns, dev: &'a str) -> Result<UnderlayCounter<'a>> {
        let qdiscs = ns.exec("tc", &["qdisc", "show", "dev", dev])?;
        let own_qdisc = !qdiscs.contains("clsact");
        if own_qdisc {
            ns.exec("tc", &["qdisc", "add", "dev", dev, "clsact"])?;
        }
        let counter = UnderlayCounter { ns, dev, own_qdisc };
        // clsact counts only while it has a filter; u32 matching everything is the simplest.
        let filter = ["filter", "add", "dev", dev, "egress", "protocol", "ip"];
        let all = ["prio", COUNTER_PRIO, "u32", "match", "u32", "0", "0"];
        ns.exec("tc", &[&filter[..], &all[..]].concat())
            .context("tc u32 filter (the kernel needs CONFIG_NET_CLS_U32)")?;
        Ok(counter)
    }

    /// IPv4 datagrams out since the counter was attached.
    fn datagrams(&self) -> Result<u64> {
        let json = self
            .ns
            .exec("tc", &["-s", "-j", "qdisc", "show", "dev", self.dev])?;
        crate::parse::tc_clsact_packets(&json)
    }
}

impl Drop for UnderlayCounter<'_> {
    fn drop(&mut self) {
        let (ns, dev) = (self.ns, self.dev);
        let _ = match self.own_qdisc {
            true => ns.exec("tc", &["qdisc", "del", "dev", dev, "clsact"]),
            false => ns.exec(
                "tc",
                &["filter", "del", "dev", dev, "egress", "prio", COUNTER_PRIO],
            ),
        };
    }
}
