//! Bytes carried over TCP between two namespaces, checked end to end: the sender streams seeded
//! random data and both sides hash what passed through them.

use crate::netns::Netns;
use anyhow::{bail, ensure, Context, Result};
use rand::{rngs::StdRng, RngCore, SeedableRng};
use sha2::{Digest, Sha256};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

const PORT: u16 = 5001;
/// How long the receiver waits for the sender to connect: a sender that failed must not leave
/// it waiting for good.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(10);

/// What one transfer carried: the sha256 of what was sent and of what arrived, and the source
/// address the receiver saw (a masquerade shows there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    pub sent: String,
    pub received: String,
    pub source: IpAddr,
}

/// Send `bytes` of seeded random data over TCP from namespace `from` to a listener on
/// `to_ip` in namespace `to` (either family).
pub fn tcp_transfer(from: &Netns, to: &Netns, to_ip: IpAddr, bytes: usize) -> Result<Transfer> {
    let listen = SocketAddr::new(to_ip, PORT);
    std::thread::scope(|s| {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let receiver = s.spawn(|| to.enter(|| receive(listen, ready_tx)));
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .context("receiver never listened")??;
        let sent = from.enter(|| send(listen, bytes));
        let received = receiver.join().expect("receiver thread");
        let (received, source) = received?;
        Ok(Transfer {
            sent: sent?,
            received,
            source,
        })
    })
}

/// [`tcp_transfer`], failing unless the sha256 of what arrived equals that of what was sent.
pub fn tcp_transfer_intact(from: &Netns, to: &Netns, to_ip: IpAddr, bytes: usize) -> Result<()> {
    let Transfer { sent, received, .. } = tcp_transfer(from, to, to_ip, bytes)?;
    ensure!(
        sent == received,
        "sha256 sent {sent} != received {received}"
    );
    Ok(())
}

fn receive(addr: SocketAddr, ready: Sender<Result<()>>) -> Result<(String, IpAddr)> {
    let listener = match TcpListener::bind(addr).and_then(|l| {
        l.set_nonblocking(true)?;
        Ok(l)
    }) {
        Ok(l) => l,
        Err(e) => {
            let _ = ready.send(Err(anyhow::anyhow!("bind {addr}: {e}")));
            bail!("bind {addr}: {e}");
        }
    };
    let _ = ready.send(Ok(()));
    let deadline = Instant::now() + ACCEPT_TIMEOUT;
    let (mut stream, source) = loop {
        match listener.accept() {
            Ok(accepted) => break accepted,
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => bail!("accept on {addr}: {e}"),
        }
    };
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        // A socket with a receive timeout is not restarted after a stop signal (a freezer, a
        // debugger): EINTR says nothing about the transfer, so the read is made again.
        let n = match stream.read(&mut buf) {
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            read => read?,
        };
        if n == 0 {
            return Ok((hex::encode(hasher.finalize()), source.ip()));
        }
        hasher.update(&buf[..n]);
    }
}

fn send(addr: SocketAddr, bytes: usize) -> Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    stream.set_write_timeout(Some(Duration::from_secs(30)))?;
    let mut rng = StdRng::seed_from_u64(bytes as u64);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len());
        rng.fill_bytes(&mut buf[..n]);
        stream.write_all(&buf[..n])?;
        hasher.update(&buf[..n]);
        left -= n;
    }
    stream.shutdown(std::net::Shutdown::Write)?;
    Ok(hex::encode(hasher.finalize()))
}
