//! Hardening 2, the status server: flannel's `--healthz-port` serves `/healthz` alone, as
//! flanneld does, and the status address survives thousands of idle connections (timeouts, a
//! cap on connections) while the node's other work goes on: the rules' repair (forking
//! iptables-restore), the lease
//! watch, `twill status`. Nodes run with the 1024 open files systemd gives a service.

mod common;

use anyhow::{bail, ensure, Context, Result};
use common::cluster::*;
use common::*;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};
use twill_control::status::{HEADER_READ_TIMEOUT, MAX_CONNECTIONS};
use twill_lab::{Host, Lab, Netns, Proc};

const STATUS_ADDR: &str = "127.0.0.1:9585";
/// flannel's forward chain, which the node writes with the default flags: `-N` and two rules.
fn forward_chain_whole(ns: &Netns) -> bool {
    let chain = ns.exec("iptables", &["-S", "FLANNEL-FWD"]);
    chain.is_ok_and(|c| c.lines().count() == 3)
}

/// `twill run ARGS` on `host` under `prlimit --nofile=NOFILE` (soft:hard open files), ready.
fn start_limited(host: &Host, nofile: &str, args: &[&str], subnet_file: &Path) -> Result<Proc> {
    let file = subnet_file.to_str().context("subnet file path")?;
    let limit = format!("--nofile={nofile}");
    let mut all = vec![&*limit, "--", TWILL, "run", "--iface", &host.iface];
    all.extend(["--subnet-file", file]);
    all.extend_from_slice(args);
    // prlimit and `ip netns exec` both exec: the process is twill's.
    let mut node = host
        .ns
        .spawn_with("prlimit", &all, &[("RUST_LOG", "info")])?;
    wait_ready(&host.ns, &mut node, subnet_file)?;
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", node.pid()))?;
    ensure!(comm.trim() == "twill", "pid {} is {comm:?}", node.pid());
    Ok(node)
}

/// The soft and hard limits on open files of process `pid`.
fn open_files_limit(pid: u32) -> Result<(u64, u64)> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits"))?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .context("no open files limit")?;
    let mut numbers = line.split_whitespace().filter_map(|w| w.parse().ok());
    Ok((
        numbers.next().context("soft")?,
        numbers.next().context("hard")?,
    ))
}

/// Files process `pid` has open.
fn open_files(pid: u32) -> Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count())
}

#[test]
fn the_healthz_port_serves_the_probes_alone() -> Result<()> {
    let lab = Lab::of("shealthz", 2)?;
    let dir = scratch()?;
    let host = lab.host(0);
    let port = host.ns.enter(twill_lab::free_tcp_port)?.to_string();
    let peer = format!("10.5.2.0/24={}", lab.host(1).underlay_ip);
    let args = ["--network", "10.5.0.0/16", "--subnet", "10.5.1.0/24"];
    let mut args = args.to_vec();
    args.extend(["--peer", &peer, "--healthz-port", &port]);
    // Soft 1024 as systemd gives a service: twill raises it to the hard limit.
    let node = start_limited(host, "1024:4096", &args, &path_in(&dir, "h0.env"))?;
    let limit = open_files_limit(node.pid())?;
    ensure!(limit == (4096, 4096), "open files limit {limit:?}");

    let healthz = format!("{}:{port}", host.underlay_ip);
    let get = |addr: &str, path: &str| http_get(&host.ns, addr, path);
    let answer = get(&healthz, "/healthz")?;
    ensure!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    ensure!(answer.ends_with("\r\n\r\nok\n"), "{answer}");
    let answer = get(&healthz, "/readyz")?;
    ensure!(answer.ends_with("\r\n\r\nready\n"), "{answer}");
    for path in ["/status", "/metrics", "/", "/debug/pprof/"] {
        let answer = get(&healthz, path)?;
        ensure!(
            answer.starts_with("HTTP/1.1 404"),
            "{path} on {healthz}: {answer}"
        );
    }
    for path in ["/healthz", "/readyz", "/status", "/metrics"] {
        let answer = get(STATUS_ADDR, path)?;
        ensure!(
            answer.starts_with("HTTP/1.1 200"),
            "{path} on {STATUS_ADDR}: {answer}"
        );
    }
    let metrics = get(STATUS_ADDR, "/metrics")?;
    ensure!(
        metrics.contains("\ntwill_status_connections_evicted_total 0\n"),
        "{metrics}"
    );
    let s = status(&host.ns)?;
    ensure!(s["lease"]["subnet"] == "10.5.1.0/24", "{s}");
    // `twill status` into a pipe whose reader is gone (`| head` after its lines) ends quietly:
    // the first write fails with EPIPE (it used to panic, exit 101).
    let piped = host.ns.exec(
        "bash",
        &[
            "-c",
            &format!("{TWILL} status | true; echo \"exit ${{PIPESTATUS[0]}}\""),
        ],
    )?;
    ensure!(piped.trim() == "exit 0", "{piped}");
    // `twill status` pointed at the healthz port says what it reached.
    let wrong = host.ns.exec(TWILL, &["status", "--addr", &healthz]);
    let wrong = format!(
        "{:#}",
        wrong.err().context("twill status read the healthz port")?
    );
    ensure!(wrong.contains("404"), "{wrong}");

    // A body framed by both Transfer-Encoding and Content-Length (the shape of request
    // smuggling) is refused with 400 and the connection closed, so the request hidden after
    // it is never answered; on both addresses, each counted.
    let smuggling = "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\
                     Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /readyz HTTP/1.1\r\nHost: x\r\n\r\n";
    for addr in [&healthz, STATUS_ADDR] {
        let answer = http_exchange(&host.ns, addr, smuggling, Duration::from_secs(5))?;
        ensure!(answer.starts_with("HTTP/1.1 400"), "{addr}: {answer}");
        ensure!(answer.matches("HTTP/1.1").count() == 1, "{addr}: {answer}");
    }
    let metrics = get(STATUS_ADDR, "/metrics")?;
    ensure!(
        metrics.contains("\ntwill_status_requests_refused_total 2\n"),
        "{metrics}"
    );

    // /readyz means the same on both: 503 with the reason while the TUN is down; /healthz
    // stays 200 throughout, so a liveness probe does not restart a node that repairs itself.
    host.ns.ip(&["link", "set", "twill0", "down"])?;
    let answers = |path: &str, wanted: &dyn Fn(&str) -> bool| {
        [&healthz, STATUS_ADDR]
            .iter()
            .all(|addr| get(addr, path).is_ok_and(|a| wanted(&a)))
    };
    let ok = |a: &str| a.starts_with("HTTP/1.1 200");
    eventually("/readyz failing on both addresses", || {
        Ok(answers("/readyz", &|a| {
            a.starts_with("HTTP/1.1 503") && a.contains("device twill0 is down")
        }))
    })?;
    ensure!(
        answers("/healthz", &ok),
        "/healthz failed with the TUN down"
    );
    host.ns.ip(&["link", "set", "twill0", "up"])?;
    eventually("/readyz ok again on both addresses", || {
        Ok(answers("/readyz", &ok))
    })?;
    Ok(())
}

/// Idle connections the test holds open, when the last was opened, and how many connects
/// timed out (the backlog full for a moment: a debug build accepts slower than a client
/// connects).
struct Idle {
    streams: Vec<TcpStream>,
    opened: Instant,
    failed: usize,
}

/// `n` connections to `addr` from inside `ns`: every other one sends half a request, the rest
/// nothing. Each connect waits at most 2 s; more than 20 that fail end the flood.
fn flood(ns: &Netns, addr: &str, n: usize) -> Result<Idle> {
    let socket: SocketAddr = addr.parse()?;
    ns.enter(|| {
        let mut streams = Vec::with_capacity(n);
        let mut failed = Vec::new();
        for i in 0..n {
            match TcpStream::connect_timeout(&socket, Duration::from_secs(2)) {
                Ok(mut stream) => {
                    if i % 2 == 1 {
                        // A refused write means the server already closed it: fine.
                        let _ = stream.write_all(b"GET /status HTTP/1.1\r\nHost: 127.0");
                    }
                    streams.push(stream);
                }
                Err(e) => failed.push(e),
            }
            if failed.len() > 20 {
                bail!(
                    "{} of {} connects failed, lately: {}",
                    failed.len(),
                    i + 1,
                    failed[failed.len() - 1]
                );
            }
        }
        Ok(Idle {
            streams,
            opened: Instant::now(),
            failed: failed.len(),
        })
    })
}

/// How many connections of `flood` the server has not closed (EOF or reset, after whatever it
/// wrote first) by `deadline`.
fn still_open_at(flood: &Idle, deadline: Instant) -> Result<usize> {
    let mut open = 0;
    let mut buf = [0u8; 1024];
    for mut stream in &flood.streams {
        let left = deadline.saturating_duration_since(Instant::now());
        stream.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
        loop {
            match stream.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    open += 1;
                    break;
                }
                Err(_) => break,
            }
        }
    }
    Ok(open)
}

/// Raises this test process's own open files limit to at least `n` (the flood's connections).
fn raise_own_open_files(n: u64) -> Result<()> {
    let pid = std::process::id();
    let (soft, hard) = open_files_limit(pid)?;
    if soft < n {
        let to = n.max(hard);
        let limit = format!("--nofile={to}:{to}");
        let out = std::process::Command::new("prlimit")
            .args(["--pid", &pid.to_string(), &limit])
            .output()?;
        ensure!(out.status.success(), "prlimit: {out:?}");
    }
    Ok(())
}

#[test]
fn two_thousand_idle_connections_take_nothing_from_the_node() -> Result<()> {
    const CONNECTIONS: usize = 2000;
    raise_own_open_files(CONNECTIONS as u64 + 1000)?;
    let c = cluster("sflood", 2, UDP_CONFIG)?;
    let host = c.lab.host(0);
    let ns = &host.ns;
    let endpoint = c.etcd.endpoint();
    let args = ["--etcd-endpoints", &endpoint, "--iptables-resync", "1"];
    // 1024 open files, soft and hard: systemd's soft limit for a service, with no room to
    // raise it. The connection cap alone must keep the node's descriptors.
    let node = start_limited(host, "1024:1024", &args, &c.subnet_file(0))?;
    let pid = node.pid();
    eventually("flannel's forward chain in place", || {
        Ok(forward_chain_whole(ns))
    })?;
    let before = open_files(pid)?;

    let started = Instant::now();
    let flood = flood(ns, STATUS_ADDR, CONNECTIONS)?;
    let took = started.elapsed();
    // Displaced connections are closed by their own tasks, a moment after the accept.
    let bound = before + MAX_CONNECTIONS + 32;
    let mut files = open_files(pid)?;
    let settled = eventually_within("twill's files settled", Duration::from_secs(2), || {
        files = open_files(pid)?;
        Ok(files <= bound)
    });
    settled.with_context(|| {
        format!(
            "twill holds {files} files with {} connections open (before: {before})",
            flood.streams.len()
        )
    })?;

    // /healthz answers at once: the probe's connection displaces an idle one.
    let started = Instant::now();
    eventually_within("/healthz during the flood", Duration::from_secs(15), || {
        let answer = http_get_within(ns, STATUS_ADDR, "/healthz", Duration::from_secs(2));
        Ok(answer.is_ok_and(|a| a.starts_with("HTTP/1.1 200")))
    })?;
    let healthz_took = started.elapsed();
    status(ns).context("twill status during the flood")?;

    // The rules' repair still runs (it starts iptables-save and iptables-restore)...
    ns.exec("iptables", &["-F", "FLANNEL-FWD"])?;
    let deleted = Instant::now();
    eventually_within("the chain repaired", Duration::from_secs(5), || {
        Ok(forward_chain_whole(ns))
    })?;
    let repair_took = deleted.elapsed();
    let s = status(ns)?;
    ensure!(s["rules"]["repairs"].as_u64() >= Some(1), "{s}");

    // ...and so does the lease watch.
    let lease = r#"{"PublicIP":"10.200.0.77","PublicIPv6":null,"BackendType":"udp"}"#;
    let unheld = c.put_unheld_lease(lease)?;
    eventually_within(
        "the new peer in twill status",
        Duration::from_secs(10),
        || Ok(c.peer_subnets(0)?.contains(&unheld.to_string())),
    )?;

    // Every idle or half-sent connection is closed by the server: displaced, or after the
    // header timeout.
    let deadline = flood.opened + HEADER_READ_TIMEOUT + Duration::from_secs(5);
    let open = still_open_at(&flood, deadline)?;
    ensure!(
        open == 0,
        "{open} idle connections still open after the header timeout"
    );
    let files_after = open_files(pid)?;
    ensure!(
        files_after <= before + 16,
        "{files_after} files open, {before} before the flood"
    );

    let metrics = http_get(ns, STATUS_ADDR, "/metrics")?;
    let evicted: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("twill_status_connections_evicted_total "))
        .context("no eviction counter")?
        .parse()?;
    ensure!(
        evicted >= (CONNECTIONS - MAX_CONNECTIONS) as u64 / 2,
        "{evicted} evicted\n{metrics}"
    );
    // One warning for the whole flood: the line is rate-limited to one a minute.
    let warned = node
        .stderr()
        .matches("closed the oldest to make room")
        .count();
    ensure!(warned == 1, "warned {warned} times:\n{}", node.stderr());
    eprintln!(
        "{CONNECTIONS} connections in {took:?} ({} timed out); twill held {files} files \
         (before {before}); /healthz in {healthz_took:?}; chain repaired in {repair_took:?}; \
         {evicted} evicted",
        flood.failed
    );
    drop(flood);
    Ok(())
}
