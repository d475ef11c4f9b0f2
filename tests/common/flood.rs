//! Bounded UDP floods between containers, counted at the receiver.

use anyhow::{bail, Context, Result};
use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};
use twill_lab::Container;

/// What a bounded UDP flood from one container to another achieved.
#[derive(Debug, Clone, Copy)]
pub struct Flood {
    pub sent: u64,
    pub received: u64,
    /// From the first arrival to the last.
    pub elapsed: Duration,
}

impl Flood {
    pub fn received_per_second(&self) -> f64 {
        self.received as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Send UDP packets of `ip_len` bytes (IPv4 header included) from `from` to `to` as fast as
/// `senders` threads can, until each has sent `max_packets` or `max_time` has passed, and count
/// what arrives.
pub fn udp_flood(
    from: &Container,
    to: &Container,
    ip_len: usize,
    senders: usize,
    max_packets: u64,
    max_time: Duration,
) -> Result<Flood> {
    let addr = SocketAddr::from((to.ip, 5002));
    let payload = vec![0x5a; ip_len - 28];
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let receiver = s.spawn(|| to.ns.enter(|| count_arrivals(addr, ready_tx, &done)));
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .context("flood receiver never bound")??;
        let sent = from.ns.enter(|| {
            std::thread::scope(|s| {
                let threads: Vec<_> = (0..senders)
                    .map(|_| s.spawn(|| blast(addr, &payload, max_packets, max_time)))
                    .collect();
                threads
                    .into_iter()
                    .map(|t| t.join().expect("flood sender thread"))
                    .sum::<Result<u64>>()
            })
        });
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let (received, elapsed) = receiver.join().expect("flood receiver thread")?;
        Ok(Flood {
            sent: sent?,
            received,
            elapsed,
        })
    })
}

fn blast(addr: SocketAddr, payload: &[u8], max_packets: u64, max_time: Duration) -> Result<u64> {
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    let start = Instant::now();
    let (mut sent, mut tries) = (0u64, 0u64);
    while sent < max_packets && (tries % 1024 != 0 || start.elapsed() < max_time) {
        tries += 1;
        // A full TUN queue refuses some sends (ENOBUFS); that is the load we want, not an error.
        if socket.send_to(payload, addr).is_ok() {
            sent += 1;
        }
    }
    Ok(sent)
}

/// Bind a receiving socket with a read timeout and tell the sender whether it is ready.
/// The test receivers' socket buffer: 8192 small datagrams at about 1 KB of kernel memory each.
const RECEIVER_BUFFER: usize = 16 << 20;

pub fn bind_receiver(
    addr: SocketAddr,
    timeout: Duration,
    ready: std::sync::mpsc::Sender<Result<()>>,
) -> Result<UdpSocket> {
    let bound = UdpSocket::bind(addr).and_then(|s| {
        s.set_read_timeout(Some(timeout))?;
        // Room for a whole test's datagrams: a receiver starved of CPU on a loaded machine
        // must not turn into loss the test would blame on twill.
        // SO_RCVBUFFORCE (the tests run as root): rmem_max would cap a plain SO_RCVBUF.
        nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::RcvBufForce, &RECEIVER_BUFFER)
            .map_err(std::io::Error::from)?;
        Ok(s)
    });
    match bound {
        Ok(socket) => {
            let _ = ready.send(Ok(()));
            Ok(socket)
        }
        Err(e) => {
            let _ = ready.send(Err(anyhow::anyhow!("bind {addr}: {e}")));
            bail!("bind {addr}: {e}");
        }
    }
}

fn count_arrivals(
    addr: SocketAddr,
    ready: std::sync::mpsc::Sender<Result<()>>,
    done: &std::sync::atomic::AtomicBool,
) -> Result<(u64, Duration)> {
    let socket = bind_receiver(addr, Duration::from_millis(300), ready)?;
    let mut buf = [0u8; 2048];
    let (mut received, mut first, mut last) = (0u64, None, Instant::now());
    loop {
        match socket.recv(&mut buf) {
            Ok(_) => {
                received += 1;
                last = Instant::now();
                first.get_or_insert(last);
            }
            // A stop signal ends a receive with a timeout early (EINTR): not the end of the stream.
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if done.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok((received, first.map_or(Duration::ZERO, |f| last - f)))
}
