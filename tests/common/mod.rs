//! Shared pieces of the integration tests: twill nodes on lab hosts, traffic checked end to end.
#![allow(dead_code)] // each test binary uses its own subset

use anyhow::{bail, Context, Result};
use rand::{rngs::StdRng, RngCore, SeedableRng};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use twill_lab::{Container, Host, Netns, Proc};

pub const TWILL: &str = env!("CARGO_BIN_EXE_twill");

/// Start `twill run ARGS` on a host and wait until its status endpoint answers.
pub fn start_twill(host: &Host, args: &[&str], subnet_file: &Path) -> Result<Proc> {
    let file = subnet_file.to_str().context("subnet file path")?;
    let mut all = vec!["run", "--iface", &host.iface, "--subnet-file", file];
    all.extend_from_slice(args);
    let mut proc = host
        .ns
        .spawn_with(TWILL, &all, &[("RUST_LOG", "info,twill=debug")])?;
    wait_ready(&host.ns, &mut proc, subnet_file)?;
    Ok(proc)
}

fn wait_ready(ns: &Netns, proc: &mut Proc, subnet_file: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if !proc.is_running() {
            bail!("twill exited early:\n{}", proc.stderr());
        }
        if subnet_file.exists() && status(ns).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("twill did not become ready in 20 s:\n{}", proc.stderr())
}

/// `twill status` on a host, parsed.
pub fn status(ns: &Netns) -> Result<serde_json::Value> {
    let out = ns.exec(TWILL, &["status"])?;
    Ok(serde_json::from_str(&out)?)
}

/// A drop counter from `twill status`.
pub fn drops(ns: &Netns, reason: &str) -> Result<u64> {
    let s = status(ns)?;
    s["counters"]["drops"][reason]
        .as_u64()
        .with_context(|| format!("no drop counter {reason} in {s}"))
}

/// Wait (bounded) until `f` holds, for counters published once per batch.
pub fn eventually(what: &str, mut f: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if f()? {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `ping -c COUNT` from one container to an address; returns ping's output.
pub fn ping(from: &Container, to: Ipv4Addr, count: u32) -> Result<String> {
    let c = count.to_string();
    from.ns
        .exec("ping", &["-c", &c, "-i", "0.2", "-W", "2", &to.to_string()])
}

/// Send `bytes` of seeded random data over TCP from `from` to `to`, and return the sha256 of
/// what was sent and of what arrived.
pub fn tcp_transfer(from: &Container, to: &Container, bytes: usize) -> Result<(String, String)> {
    let port = 5001;
    let listen = SocketAddr::from((to.ip, port));
    std::thread::scope(|s| {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let receiver = s.spawn(|| to.ns.enter(|| receive(listen, ready_tx)));
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .context("receiver never listened")??;
        let sent = from.ns.enter(|| send(listen, bytes))?;
        let received = receiver.join().expect("receiver thread")?;
        Ok((sent, received))
    })
}

fn receive(addr: SocketAddr, ready: std::sync::mpsc::Sender<Result<()>>) -> Result<String> {
    let listener = match TcpListener::bind(addr) {
        Ok(l) => l,
        Err(e) => {
            let _ = ready.send(Err(e.into()));
            bail!("bind {addr}");
        }
    };
    let _ = ready.send(Ok(()));
    let (mut stream, _) = listener.accept()?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(hex::encode(hasher.finalize()));
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

/// A per-test scratch directory for subnet files.
pub fn scratch() -> Result<tempfile::TempDir> {
    Ok(tempfile::tempdir()?)
}

pub fn path_in(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}
