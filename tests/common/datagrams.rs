//! Numbered UDP datagrams between containers: every arrival is checked whole, unique and of
//! the length it was sent with, so a test can count exactly what a path delivered.

use super::{bind_receiver, Pair};
use anyhow::{Context, Result};
use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::Duration;
use twill_lab::{Container, Netns};

/// Numbered datagrams from host 0's container to host 1's, in bursts. Every one that arrives
/// must be whole and unique, at least half must arrive, and host 1's TUN must have taken them
/// in fewer writes than datagrams: twill coalesced them into UDP GSO (USO) super-packets.
pub fn udp_bursts_arrive_intact_in_fewer_tun_writes(pair: &Pair) -> Result<()> {
    const DATAGRAMS: usize = 8192;
    let (from, to) = (pair.container(0), pair.container(1));
    let lens = vec![NUMBERED_LEN; DATAGRAMS];
    let writes_before = tun_rx_packets(&pair.host(1).ns)?;
    let arrived = exchange(from, to, 5003, &lens, |addr| send_in_bursts(addr, &lens))?;
    let writes = tun_rx_packets(&pair.host(1).ns)? - writes_before;
    anyhow::ensure!(
        arrived >= DATAGRAMS / 2,
        "only {arrived} of {DATAGRAMS} arrived"
    );
    anyhow::ensure!(
        writes < arrived as u64,
        "{arrived} datagrams took {writes} TUN writes: nothing was coalesced"
    );
    Ok(())
}

const NUMBERED_LEN: usize = 200;
const NUMBERED_BURST: usize = 64;

/// Datagram `n` of `len` bytes: its number, then bytes that depend on it and on their position.
pub fn numbered(n: u32, len: usize) -> Vec<u8> {
    let mut d = vec![0u8; len.max(4)];
    d[..4].copy_from_slice(&n.to_be_bytes());
    for (i, b) in d[4..].iter_mut().enumerate() {
        *b = (n as u8).wrapping_mul(31).wrapping_add(i as u8);
    }
    d
}

/// Receive in `to` on `port` while `send` runs in `from`; datagram `n` must be `lens[n]` long.
/// Returns how many arrived, each whole and once.
pub fn exchange(
    from: &Container,
    to: &Container,
    port: u16,
    lens: &[usize],
    send: impl FnOnce(SocketAddr) -> Result<()> + Send,
) -> Result<usize> {
    let addr = SocketAddr::from((to.ip, port));
    std::thread::scope(|s| -> Result<usize> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let receiver = s.spawn(|| to.ns.enter(|| collect_numbered(addr, lens, ready_tx)));
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .context("datagram receiver never bound")??;
        from.ns.enter(|| send(addr))?;
        receiver.join().expect("datagram receiver thread")
    })
}

/// Send datagram `n` with `lens[n]` bytes, one after the other.
pub fn send_numbered(addr: SocketAddr, lens: &[usize]) -> Result<()> {
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    for (n, &len) in lens.iter().enumerate() {
        socket.send_to(&numbered(n as u32, len), addr)?;
    }
    Ok(())
}

fn send_in_bursts(addr: SocketAddr, lens: &[usize]) -> Result<()> {
    for (i, burst) in lens.chunks(NUMBERED_BURST).enumerate() {
        let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
        for (j, &len) in burst.iter().enumerate() {
            let n = (i * NUMBERED_BURST + j) as u32;
            socket.send_to(&numbered(n, len), addr)?;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// Receive until every datagram arrived or none came for a second; the number that arrived.
fn collect_numbered(
    addr: SocketAddr,
    lens: &[usize],
    ready: std::sync::mpsc::Sender<Result<()>>,
) -> Result<usize> {
    let socket = bind_receiver(addr, Duration::from_secs(1), ready)?;
    let mut seen = vec![false; lens.len()];
    let mut arrived = 0;
    let mut buf = vec![0u8; 65536];
    while arrived < lens.len() {
        let len = match socket.recv(&mut buf) {
            Ok(len) => len,
            // A stop signal ends a receive with a timeout early (EINTR): not the end of the stream.
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            Err(e) => return Err(e.into()),
        };
        anyhow::ensure!(len >= 4, "a {len}-byte datagram arrived");
        let n = u32::from_be_bytes(buf[..4].try_into()?) as usize;
        anyhow::ensure!(n < lens.len(), "datagram number {n} was never sent");
        anyhow::ensure!(
            len == lens[n],
            "datagram {n} arrived with {len} of {} bytes",
            lens[n]
        );
        anyhow::ensure!(
            buf[..len] == numbered(n as u32, len),
            "datagram {n} arrived changed"
        );
        anyhow::ensure!(!seen[n], "datagram {n} arrived twice");
        seen[n] = true;
        arrived += 1;
    }
    Ok(arrived)
}

/// Packets twill0 took from its writer (one per write, a super-packet counts once).
fn tun_rx_packets(host: &Netns) -> Result<u64> {
    let out = host.ip(&["-s", "-j", "link", "show", "twill0"])?;
    let links: serde_json::Value = serde_json::from_str(&out)?;
    links[0]["stats64"]["rx"]["packets"]
        .as_u64()
        .context("no rx packet count for twill0")
}
