use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::Mutex;

/// Ports already handed out by this process: the kernel may give a port back as soon as the probe
/// socket closes, and a stopped etcd must find its ports still free when it restarts.
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A TCP port on 127.0.0.1 that nothing listens on now and that this process has not handed out
/// before. Call it inside [`crate::Netns::enter`] to probe a namespace's own loopback.
pub fn free_tcp_port() -> anyhow::Result<u16> {
    Ok(free_tcp_ports(1)?[0])
}

/// `n` distinct ports with the guarantees of [`free_tcp_port`].
pub fn free_tcp_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let handed_out = handed_out.get_or_insert_with(HashSet::new);
    // Keep every probe socket open until all ports are chosen so the kernel cannot repeat one.
    let mut probes = Vec::new();
    let mut ports = Vec::with_capacity(n);
    while ports.len() < n {
        let probe = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let port = probe.local_addr()?.port();
        if handed_out.insert(port) {
            ports.push(port);
        }
        probes.push(probe);
    }
    Ok(ports)
}
