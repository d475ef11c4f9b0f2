//! `--measure scale`: the control plane at K leases. A real etcd is filled with K synthetic
//! leases (see [`leases`]), then one real twill daemon per backend joins on a lab host, and the
//! bench measures its cold start, how fast a new lease reaches its table or the kernel and how
//! fast a removed one leaves, what an idle periodic reconcile costs, its memory and CPU, and
//! the etcd RPCs it makes while idle.

pub mod kernel;
pub mod leases;
pub mod node;
pub mod plot;
pub mod report;

use crate::paths::Twill;
use crate::run::Progress;
use anyhow::{ensure, Context, Result};
use leases::{Synthetic, Writer};
use node::{etcd_rpcs, Metrics, Node};
use report::{ScaleField, ScaleResult};
use std::path::Path;
use std::time::{Duration, Instant};
use twill_lab::{Etcd, Host, Lab, LabSpec};

/// The backends compared at scale: one userspace, one kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum ScaleBackend {
    Udp,
    Vxlan,
}

impl ScaleBackend {
    pub fn name(self) -> &'static str {
        match self {
            ScaleBackend::Udp => "udp",
            ScaleBackend::Vxlan => "vxlan",
        }
    }
}

#[derive(Debug, Clone)]
pub struct ScaleOptions {
    /// The K values, each in a lab and an etcd of its own.
    pub leases: Vec<u32>,
    pub backends: Vec<ScaleBackend>,
    /// Leases added one at a time (and then removed) to time propagation.
    pub samples: u32,
}

/// A first reconcile of 60,000 leases took minutes before twill's cost per lease was linear.
const START_LIMIT: Duration = Duration::from_secs(900);
const PROBE_LIMIT: Duration = Duration::from_secs(10);
/// twill reconciles every 60 s; the idle window waits for one, and lasts at least this long.
const IDLE_MIN: Duration = Duration::from_secs(30);
const IDLE_LIMIT: Duration = Duration::from_secs(90);

/// Every (K, backend) in turn; a run that fails keeps its reason in the note.
pub fn run(opts: &ScaleOptions, twill: &Twill, progress: &Progress) -> Vec<ScaleResult> {
    let mut results = Vec::new();
    for &k in &opts.leases {
        if let Err(e) = run_k(opts, k, twill, progress, &mut results) {
            for &backend in &opts.backends {
                if !results
                    .iter()
                    .any(|r| r.leases == k && r.backend == backend)
                {
                    results.push(ScaleResult::failed(backend, k, format!("{e:#}")));
                }
            }
        }
    }
    progress.clear();
    results
}

/// One lab and one etcd for all backends at `k` leases.
fn run_k(
    opts: &ScaleOptions,
    k: u32,
    twill: &Twill,
    progress: &Progress,
    results: &mut Vec<ScaleResult>,
) -> Result<()> {
    progress.show(&format!("scale: setting up a lab and etcd for {k} leases"));
    let lab = Lab::new(LabSpec {
        hosts: 2,
        tag: "scale".into(),
        ..Default::default()
    })?;
    let host = lab.host(0);
    let etcd = Etcd::new(Some(&host.ns))?;
    let files = tempfile::tempdir()?;
    let file = files.path().join("subnet.env");
    host.ns.enter(|| {
        let writer = Writer::connect(&etcd.endpoint())?;
        kernel::check_unrouted(host, Synthetic::Filler(0).public_ip())?;
        for &backend in &opts.backends {
            progress.show(&format!("scale: {backend:?} at {k} leases: filling etcd"));
            let run = Run {
                host,
                etcd: &etcd,
                writer: &writer,
                twill,
                file: &file,
                backend,
                k,
                samples: opts.samples,
            };
            let result = run
                .measure(progress)
                .unwrap_or_else(|e| ScaleResult::failed(backend, k, format!("{e:#}")));
            results.push(result);
            run.clean_up()?;
        }
        Ok(())
    })
}

/// One backend at K leases.
struct Run<'a> {
    host: &'a Host,
    etcd: &'a Etcd,
    writer: &'a Writer,
    twill: &'a Twill,
    file: &'a Path,
    backend: ScaleBackend,
    k: u32,
    samples: u32,
}

impl Run<'_> {
    fn measure(&self, progress: &Progress) -> Result<ScaleResult> {
        self.writer.fill(self.backend, self.k)?;
        let mut result = ScaleResult::new(self.backend, self.k);
        let say = |what: &str| {
            progress.show(&format!(
                "scale: {:?} at {} leases: {what}",
                self.backend, self.k
            ))
        };
        say("cold start");
        // A fresh node: no subnet file, so it picks its subnet past all K leases.
        let _ = std::fs::remove_file(self.file);
        let started = Instant::now();
        let mut node = Node::start(self.host, self.twill, &self.etcd.endpoint(), self.file)?;
        let every = Duration::from_millis(20);
        node.wait("the first reconcile", START_LIMIT, every, |m| {
            m.get("twill_reconciles_total") >= 1.0
        })?;
        let start = started.elapsed();
        let cpu = node.usage()?.cpu;
        result.set(ScaleField::StartMs, ms(start));
        result.set(
            ScaleField::CpuPct,
            100.0 * cpu.as_secs_f64() / start.as_secs_f64(),
        );
        self.check_programmed(&node)?;
        say("propagation");
        let probe = Probe::new(self.backend, self.host)?;
        let (added, removed) = self.propagation(&mut node, &probe)?;
        result.set_percentiles(
            ScaleField::PropagationP50Ms,
            ScaleField::PropagationP99Ms,
            &added,
        );
        result.set_percentiles(ScaleField::RemovalP50Ms, ScaleField::RemovalP99Ms, &removed);
        say("idle (waiting for a periodic reconcile)");
        self.idle(&mut node, &probe, &mut result)?;
        let usage = node.usage()?;
        result.set(ScaleField::RssMb, usage.rss_mb);
        result.set(ScaleField::RssPeakMb, usage.peak_mb);
        node.stop()?;
        Ok(result)
    }

    fn check_programmed(&self, node: &Node) -> Result<()> {
        match self.backend {
            ScaleBackend::Udp => {
                let table = node.metrics()?.get("twill_table_peers");
                ensure!(
                    table == f64::from(self.k),
                    "{table} peers in the table, not {}",
                    self.k
                );
                Ok(())
            }
            ScaleBackend::Vxlan => kernel::check_programmed(self.host, self.k as usize),
        }
    }

    /// Adds the probe leases one at a time, each timed from its put until the node has it,
    /// then removes them the same way. Milliseconds.
    fn propagation(&self, node: &mut Node, probe: &Probe) -> Result<(Vec<f64>, Vec<f64>)> {
        let (mut added, mut removed) = (Vec::new(), Vec::new());
        for i in 0..self.samples {
            let lease = Synthetic::Probe(i);
            let put = Instant::now();
            self.writer.put(lease, self.backend)?;
            let seen = probe.wait(node, lease, self.k + i + 1, false)?;
            added.push(ms(seen.saturating_duration_since(put)));
        }
        for i in 0..self.samples {
            let lease = Synthetic::Probe(i);
            let deleted = Instant::now();
            self.writer.delete(&lease.key())?;
            let gone = probe.wait(node, lease, self.k + self.samples - i - 1, true)?;
            removed.push(ms(gone.saturating_duration_since(deleted)));
        }
        Ok((added, removed))
    }

    /// Waits for one periodic reconcile while nothing changes, and counts what it cost.
    fn idle(&self, node: &mut Node, probe: &Probe, result: &mut ScaleResult) -> Result<()> {
        let endpoint = self.etcd.endpoint();
        let (rpcs, cpu, since) = (etcd_rpcs(&endpoint)?, node.usage()?.cpu, Instant::now());
        let reconciles = node.metrics()?.get("twill_reconciles_total");
        let every = Duration::from_millis(200);
        let m = node.wait("a periodic reconcile", IDLE_LIMIT, every, |m| {
            m.get("twill_reconciles_total") > reconciles && since.elapsed() >= IDLE_MIN
        })?;
        let minutes = since.elapsed().as_secs_f64() / 60.0;
        let cpu = node.usage()?.cpu.saturating_sub(cpu);
        result.set(
            ScaleField::EtcdRpm,
            (etcd_rpcs(&endpoint)? - rpcs) / minutes,
        );
        result.set(
            ScaleField::IdleCpuPct,
            100.0 * cpu.as_secs_f64() / (minutes * 60.0),
        );
        result.set(
            ScaleField::ReconcileIdleMs,
            1e3 * m.get("twill_reconcile_last_seconds"),
        );
        result.set(
            ScaleField::ReconcileIdleWrites,
            m.get("twill_reconcile_last_writes"),
        );
        if let Probe::Kernel(monitor) = probe {
            result.set(ScaleField::KernelEventsIdle, monitor.drain() as f64);
        }
        Ok(())
    }

    /// Leaves etcd and the host as they were before this backend ran: the node's own lease
    /// and device go, the fillers stay for the next backend to overwrite.
    fn clean_up(&self) -> Result<()> {
        if let Ok(text) = std::fs::read_to_string(self.file) {
            let subnet = text
                .lines()
                .find_map(|l| l.strip_prefix("FLANNEL_SUBNET="))
                .context("no FLANNEL_SUBNET in the subnet file")?;
            let subnet: twill_lab::Ipv4Net = subnet.parse()?;
            let _ = self.writer.delete(&leases::lease_key(subnet));
        }
        for i in 0..self.samples {
            let _ = self.writer.delete(&Synthetic::Probe(i).key());
        }
        let _ = self.host.ns.ip(&["link", "del", kernel::VXLAN_DEV]);
        Ok(())
    }
}

/// How the bench sees that a lease arrived or left: in the userspace table (twill's count of
/// it, polled) or in the kernel (`ip monitor`).
enum Probe {
    Table,
    Kernel(kernel::Monitor),
}

impl Probe {
    fn new(backend: ScaleBackend, host: &Host) -> Result<Probe> {
        Ok(match backend {
            ScaleBackend::Udp => Probe::Table,
            ScaleBackend::Vxlan => Probe::Kernel(kernel::Monitor::start(host)?),
        })
    }

    /// When `lease` was seen in place (or, with `gone`, seen gone); the table then holds `peers`.
    fn wait(&self, node: &mut Node, lease: Synthetic, peers: u32, gone: bool) -> Result<Instant> {
        match self {
            Probe::Table => {
                let every = Duration::from_micros(500);
                let want = f64::from(peers);
                let has = |m: &Metrics| m.get("twill_table_peers") == want;
                node.wait("the table change", PROBE_LIMIT, every, has)?;
                Ok(Instant::now())
            }
            Probe::Kernel(monitor) => {
                monitor.wait_for(&kernel::peer_lines(lease, gone), PROBE_LIMIT)
            }
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
