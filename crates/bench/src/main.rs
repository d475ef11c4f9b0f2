//! `twill-bench`: the command line; the work is in the library.

use anyhow::{Context, Result};
use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;
use twill_bench::measure::{Measurement, Timing};
use twill_bench::paths::{PathKind, PathLab, Twill};
use twill_bench::run::{measure, prepare, Options, Prepared, Progress};
use twill_bench::scale::{self, ScaleBackend, ScaleOptions, ScaleRegistry};
use twill_bench::{plot, report};

/// Throughput, packet rate, latency and CPU of twill against the kernel's paths, container to
/// container across two lab hosts (network namespaces). Needs root.
#[derive(Parser)]
#[command(name = "twill-bench", version)]
struct Cli {
    /// Paths to measure, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "native,host-gw,vxlan,ipip,twill-udp,twill-ebpf,twill-ebpf-tc,twill-ebpf-xdp,twill-ebpf-tun,twill-ebpf-u6,twill-batch,twill-wireguard,wireguard-go"
    )]
    paths: Vec<PathKind>,
    /// Measurements to make, comma-separated [default: all but scale]; not with --quick, which
    /// checks that every number is there. `scale` is the control plane at thousands of leases
    /// (--scale-registries, --scale-leases, --scale-nodes), with its own table; it runs after
    /// any path measurements.
    #[arg(long, value_delimiter = ',', conflicts_with = "quick")]
    measure: Vec<Measurement>,
    /// scale: where the leases live, comma-separated: etcd (--scale-leases), kube (Nodes of a
    /// real kube-apiserver, `twill run --kube-subnet-mgr`; --scale-nodes; needs the parts
    /// scripts/kube-parts builds).
    #[arg(long, value_delimiter = ',', default_value = "etcd,kube")]
    scale_registries: Vec<ScaleRegistry>,
    /// scale: the numbers of synthetic leases in etcd, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000,60000")]
    scale_leases: Vec<u32>,
    /// scale: the numbers of synthetic Nodes in the kube-apiserver, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "5000")]
    scale_nodes: Vec<u32>,
    /// scale: the backends, comma-separated (ebpf: udp leases, `twill run --dataplane ebpf`).
    #[arg(long, value_delimiter = ',', default_value = "udp,vxlan")]
    scale_backends: Vec<ScaleBackend>,
    /// scale: leases added (and removed) one at a time to time propagation.
    #[arg(long, default_value_t = 200)]
    scale_samples: u32,
    /// Runs per measurement; the median is reported [default: 5; --quick 1; --demo 1].
    #[arg(long)]
    repeat: Option<u32>,
    /// Seconds per iperf3/qperf run [default: 10; --quick 2; --demo 5].
    #[arg(short = 't', long = "time")]
    duration: Option<u32>,
    /// iperf3 warm-up seconds left out of the result (-O) [default: 2; --quick 0; --demo 1].
    #[arg(short = 'O', long = "omit")]
    warmup: Option<u32>,
    /// CI smoke run: short runs, exit non-zero unless every number of every available path is
    /// present and non-zero. No speed thresholds.
    #[arg(long, conflicts_with = "demo")]
    quick: bool,
    /// The README's demo: ping through twill udp, then the comparison with short runs.
    #[arg(long)]
    demo: bool,
    /// Write the results as a JSON array to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw the results as a PNG bar chart to this file.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// The twill binary [default: `twill` next to this executable].
    #[arg(long)]
    twill: Option<PathBuf>,
    /// Extra argument for `twill run`, e.g. --twill-arg=--no-offload. Repeat for more.
    #[arg(long = "twill-arg", allow_hyphen_values = true)]
    twill_args: Vec<String>,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("twill-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Ok(false) when the demo's ping or the --quick check failed (the report is still written).
fn run(cli: Cli) -> Result<bool> {
    twill_lab::require_root()?;
    let opts = options(&cli)?;
    let progress = Progress::new();
    let mut ok = true;
    let mut results = Vec::new();
    if !opts.measurements.is_empty() {
        let prepared = prepare(&opts, &progress);
        ok &= !cli.demo || demo_ping(&prepared, &progress);
        results = measure(&prepared, &opts, &progress);
        // The labs go at the end of this block, before the (slow to read) report is printed.
    }
    let scale = scale_options(&cli).map(|s| scale::run(&s, &opts.twill, &progress));
    let scale = scale.unwrap_or_default();
    let t = opts.timing;
    let mut title = match results.is_empty() {
        false => format!(
            "twill-bench: medians of {} run(s) of {} s (+{} s warm-up); native host to host, others container to container; {}",
            opts.repeat, t.duration, t.warmup, machine()
        ),
        true => "twill-bench: control-plane scale".to_string(),
    };
    if !cli.twill_args.is_empty() {
        title += &format!("; twill run {}", cli.twill_args.join(" "));
    }
    if !results.is_empty() {
        println!(
            "{title}\n×vxlan, ×native: single-stream TCP relative to those paths; \
             retr: segments its sender sent again; tcp6: single-stream TCP over IPv6 between \
             the same endpoints (dual-stack labs; n/a: the path carries no IPv6), ×ipv4: tcp6 \
             against tcp; flood: 64-byte UDP datagrams offered at up to {} kpps \
             (sendmmsg), kpps delivered (recvmmsg), loss: share that never reached the receiving \
             namespace (kernel counters), dgram/pkt: underlay datagrams per delivered packet; \
             lat: qperf tcp_lat, one way (half a 1-byte round trip), pinned: with every process of \
             the path on CPU 0; cpu: the whole machine (both hosts) over the single stream, \
             s/Gbit: CPU seconds per Gbit moved\n",
            twill_bench::flood::RATE_PPS / 1000
        );
        print!("{}", report::table(&results));
    }
    if !scale.is_empty() {
        println!(
            "\ncontrol-plane scale: one twill per backend against K synthetic leases in a real etcd, \
             or K synthetic Nodes in a real kube-apiserver (kube: twill run --kube-subnet-mgr); \
             prop: put in etcd or Node created -> userspace table entry, kernel route+neighbour+fdb, \
             or (ebpf: udp on --dataplane ebpf) the route in the programs' map; \
             write: the put or create alone; rm: delete -> gone; idle: one periodic reconcile with nothing to change, and the window \
             around it (etcd rpm: all etcd RPCs; api rpm: API requests on Nodes); apisrv: \
             kube-apiserver's RSS; fill: writing the K leases or Nodes\n"
        );
        print!("{}", scale::report::table(&scale));
    }
    if let Some(path) = &cli.json {
        let mut doc = report::json(&results);
        if let Some(array) = doc.as_array_mut() {
            array.extend(scale::report::json(&scale));
        }
        let text = serde_json::to_string_pretty(&doc)?;
        std::fs::write(path, text + "\n").with_context(|| format!("write {}", path.display()))?;
    }
    if let Some(path) = &cli.plot {
        plot::draw(&results, &scale, &opts.measurements, &title, path)?;
    }
    if cli.quick {
        if let Err(e) = report::check_complete(&results) {
            eprintln!("twill-bench --quick: {e:#}");
            ok = false;
        }
    }
    Ok(ok)
}

/// `--measure scale`'s options, if it was asked for.
fn scale_options(cli: &Cli) -> Option<ScaleOptions> {
    cli.measure
        .contains(&Measurement::Scale)
        .then(|| ScaleOptions {
            registries: cli.scale_registries.clone(),
            leases: cli.scale_leases.clone(),
            nodes: cli.scale_nodes.clone(),
            backends: cli.scale_backends.clone(),
            samples: cli.scale_samples.max(1),
        })
}

/// Mode defaults, overridden by explicit flags.
fn options(cli: &Cli) -> Result<Options> {
    let (repeat, duration, warmup) = match (cli.quick, cli.demo) {
        (true, _) => (1, 2, 0),
        (_, true) => (1, 5, 1),
        _ => (5, 10, 2),
    };
    let binary = match &cli.twill {
        Some(path) => path.clone(),
        None => std::env::current_exe()?.with_file_name("twill"),
    };
    Ok(Options {
        paths: cli.paths.clone(),
        measurements: if cli.measure.is_empty() {
            Measurement::ALL.to_vec()
        } else {
            let paths = cli.measure.iter().filter(|m| **m != Measurement::Scale);
            paths.copied().collect()
        },
        repeat: cli.repeat.unwrap_or(repeat).max(1),
        timing: Timing {
            duration: cli.duration.unwrap_or(duration).max(1),
            warmup: cli.warmup.unwrap_or(warmup),
        },
        twill: Twill {
            binary,
            args: cli.twill_args.clone(),
        },
    })
}

/// Shows container-to-container ping through twill udp; false if it got no reply.
fn demo_ping(prepared: &[Prepared], progress: &Progress) -> bool {
    let Some(p) = prepared.iter().find(|p| p.kind == PathKind::TwillUdp) else {
        return true;
    };
    progress.clear();
    let result = p
        .lab
        .as_ref()
        .map_err(|e| anyhow::anyhow!("{e}"))
        .and_then(PathLab::ping);
    match result {
        Ok(out) => {
            println!(
                "ping, container on host 1 -> container on host 2, through twill udp \
                 (leases in a real etcd on host 1):\n{out}"
            );
            true
        }
        Err(e) => {
            println!("twill udp does not work here: {e:#}\n");
            false
        }
    }
}

/// The kernel, and the TCP congestion control every lab namespace starts with (the machine's
/// default: a new namespace takes the initial one's), which moves single-stream TCP more than
/// most paths differ (docs/performance.md).
fn machine() -> String {
    let read = |path: &str| {
        std::fs::read_to_string(path).map_or_else(|e| format!("? ({e})"), |s| s.trim().to_string())
    };
    format!(
        "kernel {}, TCP congestion control {}",
        read("/proc/sys/kernel/osrelease"),
        read("/proc/sys/net/ipv4/tcp_congestion_control")
    )
}
