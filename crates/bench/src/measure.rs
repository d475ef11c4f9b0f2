//! One measurement (iperf3 TCP over IPv4 and IPv6, qperf latency, the 64-byte flood, CPU)
//! between two endpoints of any path.

pub use crate::endpoints::Endpoints;
use crate::pin::Pinned;
use crate::{flood, parse};
use anyhow::{bail, ensure, Context, Result};
use std::net::IpAddr;
use std::time::{Duration, Instant};
use twill_lab::{Netns, Proc};

const IPERF_PORT: &str = "5201";
const QPERF_PORT: &str = "19765";
/// Connecting, iperf3's result exchange and qperf's set-up come on top of the run time.
const SLACK: Duration = Duration::from_secs(20);

/// Every number the bench reports, each with its JSON key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Field {
    TcpGbps,
    TcpRetransmits,
    TcpP4Gbps,
    TcpRevGbps,
    Tcp6Gbps,
    /// TCP payload iperf3 received over IPv6.
    Tcp6Bytes,
    /// Bytes the path's IPv6 device on the server's host received over that run.
    Tcp6DeviceBytes,
    Flood64Kpps,
    Flood64LossPct,
    Flood64DatagramsPerPacket,
    LatencyUs,
    LatencyPinnedUs,
    CpuPct,
    CpuSoftirqPct,
    CpuPerGbit,
}

impl Field {
    pub const ALL: [Field; 15] = [
        Field::TcpGbps,
        Field::TcpRetransmits,
        Field::TcpP4Gbps,
        Field::TcpRevGbps,
        Field::Tcp6Gbps,
        Field::Tcp6Bytes,
        Field::Tcp6DeviceBytes,
        Field::Flood64Kpps,
        Field::Flood64LossPct,
        Field::Flood64DatagramsPerPacket,
        Field::LatencyUs,
        Field::LatencyPinnedUs,
        Field::CpuPct,
        Field::CpuSoftirqPct,
        Field::CpuPerGbit,
    ];

    pub fn key(self) -> &'static str {
        match self {
            Field::TcpGbps => "tcp_gbps",
            Field::TcpRetransmits => "tcp_retransmits",
            Field::TcpP4Gbps => "tcp_p4_gbps",
            Field::TcpRevGbps => "tcp_rev_gbps",
            Field::Tcp6Gbps => "tcp6_gbps",
            Field::Tcp6Bytes => "tcp6_bytes",
            Field::Tcp6DeviceBytes => "tcp6_device_bytes",
            Field::Flood64Kpps => "flood64_kpps",
            Field::Flood64LossPct => "flood64_loss_pct",
            Field::Flood64DatagramsPerPacket => "flood64_datagrams_per_packet",
            Field::LatencyUs => "latency_us",
            Field::LatencyPinnedUs => "latency_pinned_us",
            Field::CpuPct => "cpu_pct",
            Field::CpuSoftirqPct => "cpu_softirq_pct",
            Field::CpuPerGbit => "cpu_per_gbit",
        }
    }

    /// No loss, no retransmits and (on an idle path) no softirq time are real results, not
    /// missing ones.
    pub fn may_be_zero(self) -> bool {
        matches!(
            self,
            Field::TcpRetransmits | Field::Flood64LossPct | Field::CpuSoftirqPct
        )
    }

    /// Measured over IPv6, so only on the paths that carry it.
    pub fn is_ipv6(self) -> bool {
        Measurement::Tcp6.fields().contains(&self)
    }
}

/// The runs made for every path, in this order (`--measure` picks some).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Measurement {
    /// Single-stream TCP, with whole-machine CPU use over the run.
    Tcp,
    /// Single-stream TCP over IPv6 between the same endpoints, on the paths that carry IPv6
    /// (their labs are then set up dual-stack).
    Tcp6,
    /// Four TCP streams.
    #[value(name = "tcp-p4")]
    TcpP4,
    /// Single-stream TCP, server to client.
    #[value(name = "tcp-rev")]
    TcpReverse,
    /// 64-byte UDP datagrams from twill-bench's own sendmmsg generator, counted by recvmmsg.
    Flood64,
    /// qperf tcp_lat: one-way latency, half of a 1-byte TCP round trip.
    Latency,
    /// qperf tcp_lat with every process of the path's lab (and its threads) on CPU 0.
    #[value(name = "latency-pinned")]
    LatencyPinned,
    /// The control plane at thousands of leases (not a path measurement; see `scale`).
    Scale,
}

impl Measurement {
    pub const ALL: [Measurement; 7] = [
        Measurement::Tcp,
        Measurement::Tcp6,
        Measurement::TcpP4,
        Measurement::TcpReverse,
        Measurement::Flood64,
        Measurement::Latency,
        Measurement::LatencyPinned,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Measurement::Tcp => "tcp single stream + cpu",
            Measurement::Tcp6 => "tcp over IPv6",
            Measurement::TcpP4 => "tcp -P 4",
            Measurement::TcpReverse => "tcp -R",
            Measurement::Flood64 => "64 B flood",
            Measurement::Latency => "tcp_lat",
            Measurement::LatencyPinned => "tcp_lat on CPU 0",
            Measurement::Scale => "control-plane scale",
        }
    }

    /// The fields a run of this measurement yields.
    pub fn fields(self) -> &'static [Field] {
        match self {
            Measurement::Tcp => &[
                Field::TcpGbps,
                Field::TcpRetransmits,
                Field::CpuPct,
                Field::CpuSoftirqPct,
                Field::CpuPerGbit,
            ],
            Measurement::Tcp6 => &[Field::Tcp6Gbps, Field::Tcp6Bytes, Field::Tcp6DeviceBytes],
            Measurement::TcpP4 => &[Field::TcpP4Gbps],
            Measurement::TcpReverse => &[Field::TcpRevGbps],
            Measurement::Flood64 => &[
                Field::Flood64Kpps,
                Field::Flood64LossPct,
                Field::Flood64DatagramsPerPacket,
            ],
            Measurement::Latency => &[Field::LatencyUs],
            Measurement::LatencyPinned => &[Field::LatencyPinnedUs],
            Measurement::Scale => &[],
        }
    }

    /// How long one run takes (qperf and the flood have no warm-up), for the progress line.
    pub fn seconds(self, timing: &Timing) -> u32 {
        match self {
            Measurement::Latency | Measurement::LatencyPinned | Measurement::Flood64 => {
                timing.duration
            }
            Measurement::Scale => 0,
            _ => timing.duration + timing.warmup,
        }
    }

    /// Runs once from `ends.client` to `ends.server_ip` (tcp6: the server's IPv6 address) and
    /// returns the values it yields.
    pub fn run(self, ends: &Endpoints, timing: &Timing) -> Result<Vec<(Field, f64)>> {
        let server = IpAddr::from(ends.server_ip);
        match self {
            Measurement::Tcp => {
                let before = cpu_now()?;
                let out = iperf(ends.client, server, timing, &[])?;
                let cpu = cpu_now()?.since(&before).context("no CPU ticks passed")?;
                let gbps = parse::iperf_tcp_gbps(&out)?;
                Ok(vec![
                    (Field::TcpGbps, gbps),
                    (Field::TcpRetransmits, parse::iperf_tcp_retransmits(&out)?),
                    (Field::CpuPct, cpu.busy_pct),
                    (Field::CpuSoftirqPct, cpu.softirq_pct),
                    // CPU seconds per second over Gbit per second: CPU seconds per Gbit.
                    (Field::CpuPerGbit, cpu.busy_cpus / gbps),
                ])
            }
            Measurement::Tcp6 => tcp6(ends, timing),
            Measurement::TcpP4 => {
                let out = iperf(ends.client, server, timing, &["-P", "4"])?;
                Ok(vec![(Field::TcpP4Gbps, parse::iperf_tcp_gbps(&out)?)])
            }
            Measurement::TcpReverse => {
                let out = iperf(ends.client, server, timing, &["-R"])?;
                Ok(vec![(Field::TcpRevGbps, parse::iperf_tcp_gbps(&out)?)])
            }
            Measurement::Flood64 => {
                let flood = flood::run(ends, timing.duration)?;
                Ok(vec![
                    (Field::Flood64Kpps, flood.kpps),
                    (Field::Flood64LossPct, flood.loss_pct),
                    (Field::Flood64DatagramsPerPacket, flood.datagrams_per_packet),
                ])
            }
            Measurement::Latency => {
                let out = qperf_latency(ends, timing, &[])?;
                Ok(vec![(Field::LatencyUs, out)])
            }
            Measurement::LatencyPinned => {
                let _pinned = Pinned::to_cpu0(&ends.processes)?;
                let out = qperf_latency(ends, timing, &["taskset", "-c", "0"])?;
                Ok(vec![(Field::LatencyPinnedUs, out)])
            }
            Measurement::Scale => bail!("scale is measured per backend, not per path"),
        }
    }
}

/// Single-stream TCP to the server's IPv6 address, with the bytes iperf3 received and those
/// that reached the server's host on the path's IPv6 device meanwhile. Fewer there than iperf3
/// received means the traffic went some other way, and the run fails.
fn tcp6(ends: &Endpoints, timing: &Timing) -> Result<Vec<(Field, f64)>> {
    let v6 = ends
        .ipv6
        .as_ref()
        .context("the path was set up without IPv6")?;
    let (ns, dev) = v6.device;
    let before = rx_bytes(ns, dev)?;
    let out = iperf(ends.client, v6.server_ip.into(), timing, &[])?;
    let arrived = rx_bytes(ns, dev)?.saturating_sub(before);
    let received = parse::iperf_tcp_bytes(&out)?;
    ensure!(
        arrived >= received,
        "IPv6 did not come through {dev}: {arrived} bytes arrived there, iperf3 received {received}"
    );
    Ok(vec![
        (Field::Tcp6Gbps, parse::iperf_tcp_gbps(&out)?),
        (Field::Tcp6Bytes, received as f64),
        (Field::Tcp6DeviceBytes, arrived as f64),
    ])
}

/// Bytes `dev` in `ns` has received.
fn rx_bytes(ns: &Netns, dev: &str) -> Result<u64> {
    parse::link_rx_bytes(&ns.ip(&["-s", "-j", "link", "show", "dev", dev])?)
}

/// One-way latency by `qperf tcp_lat` from the client, started through `wrapper` (a command
/// line that runs the one after it, or nothing).
fn qperf_latency(ends: &Endpoints, timing: &Timing, wrapper: &[&str]) -> Result<f64> {
    let secs = timing.duration.to_string();
    let ip = ends.server_ip.to_string();
    let qperf = ["qperf", "-t", &secs, "-lp", QPERF_PORT, &ip, "tcp_lat"];
    let line = [wrapper, &qperf[..]].concat();
    let out = run_bounded(ends.client, line[0], &line[1..], timing.limit())?;
    parse::qperf_latency_us(&out)
}

/// Run length of each iperf3/qperf client in seconds; `warmup` is iperf3's `-O`.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub duration: u32,
    pub warmup: u32,
}

impl Timing {
    fn limit(&self) -> Duration {
        Duration::from_secs(u64::from(self.duration + self.warmup)) + SLACK
    }
}

/// The iperf3 and qperf servers of one path; killed on drop.
pub struct Servers {
    iperf: Proc,
    qperf: Proc,
}

impl Servers {
    pub fn pids(&self) -> [u32; 2] {
        [self.iperf.pid(), self.qperf.pid()]
    }

    /// Starts both servers in `ns` and waits until they listen.
    pub fn start(ns: &Netns) -> Result<Servers> {
        // --idle-timeout: a client killed mid-test must not leave the server stuck for later runs.
        let iperf = ns.spawn("iperf3", &["-s", "-p", IPERF_PORT, "--idle-timeout", "30"])?;
        let qperf = ns.spawn("qperf", &["-lp", QPERF_PORT])?;
        wait_listening(ns, &[IPERF_PORT, QPERF_PORT])?;
        Ok(Servers { iperf, qperf })
    }
}

fn wait_listening(ns: &Netns, ports: &[&str]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let listening = ns.exec("ss", &["-Hltn"])?;
        if ports.iter().all(|p| listening.contains(&format!(":{p} "))) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("servers not listening on {ports:?}: {listening}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An iperf3 client in `client` against the server at `to`.
fn iperf(client: &Netns, to: IpAddr, timing: &Timing, extra: &[&str]) -> Result<String> {
    let (ip, secs, warmup) = (
        to.to_string(),
        timing.duration.to_string(),
        timing.warmup.to_string(),
    );
    let mut args = vec!["-c", &ip, "-p", IPERF_PORT, "-J", "-t", &secs];
    args.extend(["-O", &warmup, "--connect-timeout", "3000"]);
    args.extend_from_slice(extra);
    run_bounded(client, "iperf3", &args, timing.limit())
}

/// Runs a client to completion within `limit` (killed otherwise, by Proc's drop) and returns
/// its stdout.
fn run_bounded(ns: &Netns, program: &str, args: &[&str], limit: Duration) -> Result<String> {
    let mut proc = ns.spawn(program, args)?;
    let Some(status) = proc.wait_timeout(limit)? else {
        bail!("`{program}` did not finish within {limit:?}");
    };
    if !status.success() {
        bail!("`{program}` failed ({status}): {}", failure_reason(&proc));
    }
    Ok(proc.stdout())
}

/// iperf3 -J reports errors in its JSON on stdout, qperf prints them to stdout too; stderr for
/// everything else. One line, as it ends up in a table note.
fn failure_reason(proc: &Proc) -> String {
    let (stdout, stderr) = (proc.stdout(), proc.stderr());
    let text = parse::iperf_error(&stdout).unwrap_or_else(|| match stderr.trim() {
        "" => stdout,
        _ => stderr,
    });
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn cpu_now() -> Result<parse::CpuTimes> {
    parse::cpu_times(&std::fs::read_to_string("/proc/stat")?)
}
