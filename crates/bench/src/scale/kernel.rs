//! The kernel's side of a vxlan or host-gw node: `ip monitor` tells when each route, neighbour
//! and fdb entry appeared or went, and counts of what is installed check a cold start.

use super::leases::{Synthetic, UNROUTED};
use super::ScaleBackend;
use anyhow::{ensure, Context, Result};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};
use twill_lab::{Host, Ipv4Net};

pub const VXLAN_DEV: &str = "flannel.1";
/// The lab host's underlay device, where host-gw's routes go.
const UNDERLAY: &str = "eth0";

/// `ip monitor route neigh` in a host's namespace; every line it prints, with when it was read.
/// fdb entries come as neighbour lines of the VXLAN device. Killed on drop.
pub struct Monitor {
    child: Child,
    lines: Receiver<(Instant, String)>,
}

impl Monitor {
    pub fn start(host: &Host) -> Result<Monitor> {
        let mut child = Command::new("ip")
            .args(["-n", host.ns.name(), "monitor", "route", "neigh"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start `ip monitor`")?;
        let stdout = child.stdout.take().context("ip monitor stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        // ip subscribes before it prints anything; give it that moment.
        std::thread::sleep(Duration::from_millis(200));
        let monitor = Monitor { child, lines };
        monitor.drain();
        Ok(monitor)
    }

    /// Lines printed since the last call, dropped; how many there were.
    pub fn drain(&self) -> usize {
        self.lines.try_iter().count()
    }

    /// Waits until a line starting with each of `wanted` was printed; when the last one was.
    pub fn wait_for(&self, wanted: &[String], limit: Duration) -> Result<Instant> {
        let deadline = Instant::now() + limit;
        let mut missing: Vec<&String> = wanted.iter().collect();
        let mut last = Instant::now();
        while !missing.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            let (at, line) = match self.lines.recv_timeout(left) {
                Ok(seen) => seen,
                Err(RecvTimeoutError::Timeout) => {
                    anyhow::bail!("the kernel never reported {missing:?} within {limit:?}")
                }
                Err(RecvTimeoutError::Disconnected) => anyhow::bail!("ip monitor stopped"),
            };
            // A route through a nexthop object shows its id first: set aside, the rest is
            // the gateway route's line.
            let line = without_nhid(&line);
            let before = missing.len();
            missing.retain(|w| !line.starts_with(w.as_str()));
            if missing.len() < before {
                last = at;
            }
        }
        Ok(last)
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `ip monitor`'s line with ` nhid <id>` taken out.
fn without_nhid(line: &str) -> String {
    match line.split_once(" nhid ") {
        Some((head, rest)) => {
            let tail = rest.split_once(' ').map_or("", |(_, tail)| tail);
            format!("{head} {tail}")
        }
        None => line.to_string(),
    }
}

/// How the lines `ip monitor` prints when a peer's kernel state appears (or, with `deleted`,
/// goes) begin: host-gw's route; vxlan's route, neighbour and fdb entry. A deleted neighbour
/// has no lladdr left (it shows FAILED).
pub fn peer_lines(backend: ScaleBackend, lease: Synthetic, deleted: bool) -> Vec<String> {
    let subnet: Ipv4Net = lease.subnet();
    if backend == ScaleBackend::HostGw {
        let prefix = if deleted { "Deleted " } else { "" };
        let via = lease.public_ip();
        return vec![format!("{prefix}{subnet} via {via} dev {UNDERLAY}")];
    }
    let gateway = subnet.network();
    let mac = lease.vtep_mac();
    let (prefix, neighbour) = match deleted {
        true => ("Deleted ", format!("{gateway} dev {VXLAN_DEV} ")),
        false => ("", format!("{gateway} dev {VXLAN_DEV} lladdr {mac}")),
    };
    vec![
        format!("{prefix}{subnet} via {gateway} dev {VXLAN_DEV} onlink"),
        format!("{prefix}{neighbour}"),
        format!("{prefix}{} dev {VXLAN_DEV} lladdr {mac}", lease.public_ip()),
    ]
}

/// Checks that the kernel holds what each of `peers` peers needs: a route via its PublicIP on
/// the underlay (host-gw); a route, a permanent neighbour and an fdb entry on the VXLAN
/// device (vxlan).
pub fn check_programmed(host: &Host, backend: ScaleBackend, peers: usize) -> Result<()> {
    let count = |text: String, pattern: &str| text.lines().filter(|l| l.contains(pattern)).count();
    if backend == ScaleBackend::HostGw {
        let routes = host.ns.ip(&["-4", "route", "show", "dev", UNDERLAY])?;
        let n = count(routes, " via 198.1");
        ensure!(
            n == peers,
            "{n} routes via a peer on {UNDERLAY}, not {peers}"
        );
        return Ok(());
    }
    let routes = host.ns.ip(&["route", "show", "dev", VXLAN_DEV])?;
    let neighbours = host
        .ns
        .ip(&["neigh", "show", "dev", VXLAN_DEV, "nud", "permanent"])?;
    let fdb = host.ns.exec("bridge", &["fdb", "show", "dev", VXLAN_DEV])?;
    let found = [
        ("routes", count(routes, " onlink")),
        ("neighbours", count(neighbours, " lladdr ")),
        ("fdb entries", count(fdb, " dst ")),
    ];
    for (what, n) in found {
        ensure!(n == peers, "{n} {what} on {VXLAN_DEV}, not {peers}");
    }
    Ok(())
}

/// host-gw's peers must be on the underlay's segment: the lab host gets the synthetic
/// PublicIPs' range as a second address of its underlay, whose only other end is the lab's
/// second host (nothing is sent there: no traffic goes to the peers' subnets).
pub fn reach_synthetic_peers(host: &Host) -> Result<()> {
    host.ns.ip(&["addr", "add", UNROUTED, "dev", UNDERLAY])?;
    Ok(())
}

/// Takes [`reach_synthetic_peers`]'s address away again (if it is there).
pub fn unreach_synthetic_peers(host: &Host) {
    let _ = host.ns.ip(&["addr", "del", UNROUTED, "dev", UNDERLAY]);
}

/// Nothing may ever be sent to the synthetic PublicIPs: the lab host must have no route there.
pub fn check_unrouted(host: &Host, ip: std::net::Ipv4Addr) -> Result<()> {
    let route = host.ns.ip(&["route", "get", &ip.to_string()]);
    ensure!(
        route.is_err(),
        "the lab host has a route to the synthetic address {ip}: {}",
        route.unwrap_or_default()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_through_a_nexthop_matches_as_its_gateway_route() {
        let probe = Synthetic::Probe(3);
        let [route, ..] = &peer_lines(ScaleBackend::Vxlan, probe, false)[..] else {
            panic!("no route line");
        };
        let through = "10.254.3.0/24 nhid 1946157059 via 10.254.3.0 dev flannel.1 onlink ";
        assert!(without_nhid(through).starts_with(route.as_str()), "{route}");
        let plain = "10.254.3.0/24 via 10.254.3.0 dev flannel.1 onlink ";
        assert_eq!(without_nhid(plain), plain);
        let host_gw = peer_lines(ScaleBackend::HostGw, probe, true);
        let deleted = "Deleted 10.254.3.0/24 nhid 7 via 198.19.128.4 dev eth0 proto boot";
        assert!(
            without_nhid(deleted).starts_with(host_gw[0].as_str()),
            "{host_gw:?}"
        );
    }
}
