//! Shared pieces of the integration tests: twill nodes on lab hosts, traffic checked end to end.
#![allow(dead_code)] // each test binary uses its own subset

pub mod bpffs;
pub mod cluster;
pub mod datagrams;
pub mod flannel_e2e;
mod flood;
pub mod hostile6;
pub mod kube;
pub mod kube_flannel;
pub mod migration;
mod pair;
pub mod pod_traffic;
pub mod refusals;
pub mod rules;
pub mod wireguard;

pub use flood::*;
pub use pair::*;

use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use twill_lab::{Container, Host, Netns, Proc};

pub const TWILL: &str = env!("CARGO_BIN_EXE_twill");

/// `setpriv` arguments that run the command after them as root with CAP_NET_ADMIN alone.
pub const NET_ADMIN_ONLY: [&str; 3] = [
    "--bounding-set=-all,+net_admin",
    "--inh-caps=-all",
    "--no-new-privs",
];

/// How long a started twill may take to write its subnet file and say it is ready.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// Start `twill run ARGS` on a host and wait until `twill status` says it is ready.
pub fn start_twill(host: &Host, args: &[&str], subnet_file: &Path) -> Result<Proc> {
    start_twill_with_env(host, args, &[], subnet_file)
}

/// [`start_twill`] with extra environment variables.
pub fn start_twill_with_env(
    host: &Host,
    args: &[&str],
    env: &[(&str, &str)],
    subnet_file: &Path,
) -> Result<Proc> {
    start_twill_launched(host, &[], args, env, subnet_file)
}

/// [`start_twill_with_env`], twill run by `launcher` (a program and its arguments, which end
/// by running the command line after them), or directly when it is empty.
pub fn start_twill_launched(
    host: &Host,
    launcher: &[&str],
    args: &[&str],
    env: &[(&str, &str)],
    subnet_file: &Path,
) -> Result<Proc> {
    let file = subnet_file.to_str().context("subnet file path")?;
    let mut all = vec!["run", "--iface", &host.iface, "--subnet-file", file];
    all.extend_from_slice(args);
    let mut vars = vec![("RUST_LOG", "info,twill=debug")];
    vars.extend_from_slice(env);
    let mut proc = spawn_twill_launched(&host.ns, launcher, &all, &vars)?;
    wait_ready(&host.ns, &mut proc, subnet_file)?;
    Ok(proc)
}

/// Every `twill` the tests run: `args` in `ns`, with `env` over [`TUN_UNLESS_NAMED`].
pub fn spawn_twill(ns: &Netns, args: &[&str], env: &[(&str, &str)]) -> Result<Proc> {
    spawn_twill_launched(ns, &[], args, env)
}

/// [`spawn_twill`] through `launcher` (a program and its arguments, which end by running the
/// command line after them), or directly when it is empty.
fn spawn_twill_launched(
    ns: &Netns,
    launcher: &[&str],
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<Proc> {
    let mut vars = vec![TUN_UNLESS_NAMED];
    vars.extend_from_slice(env);
    match launcher {
        [] => ns.spawn_with(TWILL, args, &vars),
        [program, launcher_args @ ..] => {
            let mut with_twill = launcher_args.to_vec();
            with_twill.push(TWILL);
            with_twill.extend_from_slice(args);
            ns.spawn_with(program, &with_twill, &vars)
        }
    }
}

/// The lab's udp nodes run the TUN engine unless a test names the dataplane: most tests here
/// are about the TUN engine, which `auto`, the default, does not pick where the kernel runs
/// eBPF. It is `--dataplane`'s environment variable, so the flag on a test's command line wins,
/// and so does a test's own TWILL_DATAPLANE (set after this one); the tests of the default and
/// of eBPF name theirs.
const TUN_UNLESS_NAMED: (&str, &str) = ("TWILL_DATAPLANE", "tun");

/// A launcher ([`start_twill_launched`]) that runs twill with /proc/sys read-only, as in a pod
/// without privileges (kube-flannel.yml runs flannel so): in its own mount namespace, where
/// /proc/sys is bound onto itself read-only.
pub const READ_ONLY_PROC_SYS: &[&str] = &[
    "unshare",
    "--mount",
    "--propagation",
    "private",
    "sh",
    "-c",
    "mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec \"$@\"",
    "read-only-proc-sys",
];

/// The bound is generous: on a loaded 2-core machine (CI with builds beside it) a start that
/// takes seconds alone once took over 20 s.
pub fn wait_ready(ns: &Netns, proc: &mut Proc, subnet_file: &Path) -> Result<()> {
    let deadline = Instant::now() + READY_WITHIN * time_scale();
    while Instant::now() < deadline {
        if !proc.is_running() {
            bail!("twill exited early:\n{}", proc.stderr());
        }
        // Ready, not merely answering: a restarted node finds its last run's subnet file in
        // place before it has written anything.
        if subnet_file.exists() && status(ns).is_ok_and(|s| s["ready"] == true) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The status server answers from the first second: what it says names the stage that hung.
    let said = ns
        .exec(TWILL, &["status"])
        .unwrap_or_else(|e| format!("(no status: {e:#})"));
    bail!(
        "twill did not become ready in {:?} (subnet file written: {}):\n{}\nstatus: {said}",
        READY_WITHIN * time_scale(),
        subnet_file.exists(),
        proc.stderr()
    )
}

/// `twill status` on a host, parsed.
pub fn status(ns: &Netns) -> Result<serde_json::Value> {
    let out = ns.exec(TWILL, &["status"])?;
    Ok(serde_json::from_str(&out)?)
}

/// The subnets of the peers in `twill status` on a host: the leases its gate accepted.
pub fn peer_subnets(ns: &Netns) -> Result<Vec<String>> {
    subnets_at(&status(ns)?["peers"])
}

/// The subnets in a userspace engine's table on a host (`counters.peers` of `twill status`):
/// what it forwards to, which the backend sets just after the gate accepts a lease.
pub fn engine_peer_subnets(ns: &Netns) -> Result<Vec<String>> {
    subnets_at(&status(ns)?["counters"]["peers"])
}

fn subnets_at(peers: &serde_json::Value) -> Result<Vec<String>> {
    Ok(peers
        .as_array()
        .with_context(|| format!("no peer list: {peers}"))?
        .iter()
        .filter_map(|p| p["subnet"].as_str().map(str::to_string))
        .collect())
}

/// A drop counter from `twill status`.
pub fn drops(ns: &Netns, reason: &str) -> Result<u64> {
    let s = status(ns)?;
    s["counters"]["drops"][reason]
        .as_u64()
        .with_context(|| format!("no drop counter {reason} in {s}"))
}

/// Wait until `twill status` counts exactly `expected` drops for each of its reasons.
pub fn wait_for_drops(ns: &Netns, expected: &std::collections::BTreeMap<&str, u64>) -> Result<()> {
    let counted = eventually("drop counters", || {
        let s = status(ns)?;
        Ok(expected
            .iter()
            .all(|(reason, n)| s["counters"]["drops"][reason].as_u64() == Some(*n)))
    });
    counted.with_context(|| format!("want {expected:?}, have {}", status(ns).unwrap_or_default()))
}

/// Delete the route `network dev device` in `ns` and wait until the node put it back: a guarded
/// device's route comes back at the kernel's notice, long before the minute's reconcile.
pub fn deleted_route_comes_back(ns: &twill_lab::Netns, network: &str, device: &str) -> Result<()> {
    let family = if network.contains(':') { "-6" } else { "-4" };
    ns.ip(&[family, "route", "del", network, "dev", device])?;
    eventually("the route back", || {
        let routes = ns.ip(&[family, "route", "show", network])?;
        Ok(routes.contains(&format!("dev {device}")))
    })
}

/// Wait (bounded) until `f` holds, for counters published once per batch.
pub fn eventually(what: &str, f: impl FnMut() -> Result<bool>) -> Result<()> {
    eventually_within(what, Duration::from_secs(5), f)
}

/// How much longer waits may take than on the host: `TWILL_TEST_TIME_SCALE`, which the guest
/// kernels' runner sets (under QEMU's emulator every exec and every start is many times slower);
/// 1 where it is unset.
pub fn time_scale() -> u32 {
    std::env::var("TWILL_TEST_TIME_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1)
}

/// [`eventually`] with its own bound, for what crosses a control plane.
pub fn eventually_within(
    what: &str,
    bound: Duration,
    mut f: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let bound = bound * time_scale();
    let deadline = Instant::now() + bound;
    loop {
        if f()? {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("timed out after {bound:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `ping -c COUNT` from one container to an address of either family; returns ping's output.
pub fn ping(from: &Container, to: impl Into<IpAddr>, count: u32) -> Result<String> {
    ping_from(&from.ns, to.into(), count)
}

/// [`ping`] from any namespace (a pod's, entered by its path): 0.2 s apart, each reply awaited
/// up to 2 s.
pub fn ping_from(ns: &Netns, to: IpAddr, count: u32) -> Result<String> {
    let c = count.to_string();
    let to = to.to_string();
    ns.exec("ping", &["-c", &c, "-i", "0.2", "-W", "2", &to])
}

/// Send `bytes` of seeded random data over TCP from `from` to `to`, and return the sha256 of
/// what was sent and of what arrived.
pub fn tcp_transfer(from: &Container, to: &Container, bytes: usize) -> Result<(String, String)> {
    let done = twill_lab::tcp_transfer(&from.ns, &to.ns, to.ip.into(), bytes)?;
    Ok((done.sent, done.received))
}

/// [`tcp_transfer`], failing unless the sha256 of what arrived equals that of what was sent.
pub fn tcp_transfer_intact(from: &Container, to: &Container, bytes: usize) -> Result<()> {
    twill_lab::tcp_transfer_intact(&from.ns, &to.ns, to.ip.into(), bytes)
}

/// [`tcp_transfer_intact`] over IPv6, to the IPv6 address of `to`, a dual-stack container.
pub fn tcp_transfer6_intact(from: &Container, to: &Container, bytes: usize) -> Result<()> {
    let ip = to
        .ipv6
        .with_context(|| format!("container {} has no IPv6 address", to.ns.name()))?;
    twill_lab::tcp_transfer_intact(&from.ns, &to.ns, ip.into(), bytes)
}

/// A plain HTTP/1.1 GET from inside a namespace; returns the whole response.
pub fn http_get(ns: &Netns, addr: &str, path: &str) -> Result<String> {
    http_get_within(ns, addr, path, Duration::from_secs(5))
}

/// [`http_get`] that gives up after `bound`, connect included.
pub fn http_get_within(ns: &Netns, addr: &str, path: &str, bound: Duration) -> Result<String> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    http_exchange(ns, addr, &request, bound)
}

/// Writes `request` as it is to `addr` from inside `ns` and reads until the server closes the
/// connection; gives up after `bound`, connect included.
pub fn http_exchange(ns: &Netns, addr: &str, request: &str, bound: Duration) -> Result<String> {
    let socket: SocketAddr = addr.parse()?;
    ns.enter(|| {
        let mut stream = TcpStream::connect_timeout(&socket, bound)?;
        stream.set_read_timeout(Some(bound))?;
        stream.set_write_timeout(Some(bound))?;
        stream.write_all(request.as_bytes())?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response)
    })
}

/// The IP packet of the first datagram tcpdump sees on `ns`'s eth0 that matches `filter`,
/// while `trigger` runs.
pub fn capture(
    ns: &Netns,
    dir: &Path,
    filter: &str,
    trigger: impl FnOnce() -> Result<()>,
) -> Result<Vec<u8>> {
    let pcap = dir.join(format!("capture-{}.pcap", rand::random::<u32>()));
    let path = pcap.to_str().context("pcap path")?;
    let mut tcpdump = ns.spawn(
        "tcpdump",
        &["-i", "eth0", "-n", "-U", "-c", "1", "-w", path, filter],
    )?;
    std::thread::sleep(Duration::from_millis(500));
    trigger()?;
    tcpdump
        .wait_timeout(Duration::from_secs(5))?
        .with_context(|| format!("tcpdump saw nothing matching {filter:?}"))?;
    let file = std::fs::read(&pcap)?;
    Ok(first_pcap_frame(&file)?[14..].to_vec())
}

/// The first frame of a pcap file (classic format, Ethernet link type).
pub fn first_pcap_frame(file: &[u8]) -> Result<&[u8]> {
    anyhow::ensure!(file.len() > 40, "pcap too short");
    let caplen = u32::from_le_bytes(file[32..36].try_into()?) as usize;
    file.get(40..40 + caplen).context("pcap frame truncated")
}

/// A per-test scratch directory for subnet files.
/// Unmounts a scratch mount when the test ends, however it ends.
pub struct Unmount(pub PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

pub fn scratch() -> Result<tempfile::TempDir> {
    Ok(tempfile::tempdir()?)
}

pub fn path_in(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}

/// A UDP packet from `src` to `dst` with a valid IPv4 header, for hand-made datagrams.
pub fn inner_packet(src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
    use twill_dataplane::wire::ipv4::{Ipv4Repr, PROTO_UDP};
    let repr = Ipv4Repr {
        src,
        dst,
        protocol: PROTO_UDP,
        ttl: 64,
        payload_len: 12,
    };
    let mut buf = vec![0u8; repr.total_len()];
    repr.emit(&mut buf).expect("emit");
    buf
}

/// Runs `f` on every item at once, each on a thread of its own (e.g. a cluster each, which
/// mostly wait), and fails with every failure, each named by its item.
pub fn in_parallel<T: Sync + std::fmt::Display>(
    items: &[T],
    f: impl Fn(&T) -> Result<()> + Sync,
) -> Result<()> {
    let f = &f;
    let failures: Vec<String> = std::thread::scope(|s| {
        let running: Vec<_> = items
            .iter()
            .map(|item| (item.to_string(), s.spawn(move || f(item))))
            .collect();
        running
            .into_iter()
            .filter_map(|(name, thread)| {
                let result = thread
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                result.err().map(|e| format!("{name}: {e:?}"))
            })
            .collect()
    });
    anyhow::ensure!(failures.is_empty(), "{}", failures.join("\n\n"));
    Ok(())
}
