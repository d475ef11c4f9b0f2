//! `--measure scale`: the control plane at K leases. A real etcd is filled with K synthetic
//! leases (see [`leases`]), or a real kube-apiserver with K synthetic Nodes (see [`nodes`]),
//! then one real twill daemon per backend joins on a lab host (through etcd, or with
//! `--kube-subnet-mgr`), and the bench measures its cold start, how fast a new lease reaches
//! its table or the kernel and how fast a removed one leaves, what an idle periodic reconcile
//! costs, its memory and CPU, and the registry requests it makes while idle.

pub mod ebpf;
pub mod kernel;
pub mod leases;
pub mod node;
pub mod nodes;
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
use twill_lab::{Etcd, Host, Lab, Proc};

/// The backends compared at scale: userspace udp, the kernel's vxlan and host-gw, and udp on
/// the eBPF dataplane (udp leases, `twill run --dataplane ebpf`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum ScaleBackend {
    Udp,
    Vxlan,
    HostGw,
    Ebpf,
}

impl ScaleBackend {
    pub fn name(self) -> &'static str {
        match self {
            ScaleBackend::Udp => "udp",
            ScaleBackend::Vxlan => "vxlan",
            ScaleBackend::HostGw => "host-gw",
            ScaleBackend::Ebpf => "ebpf",
        }
    }

    /// The network config's `Backend.Type`, which the leases are written for.
    pub fn backend_type(self) -> &'static str {
        match self {
            ScaleBackend::Ebpf => ScaleBackend::Udp.name(),
            backend => backend.name(),
        }
    }
}

/// Where the K leases live and twill reads them: flannel's etcd schema, or Nodes of a
/// Kubernetes API server (`twill run --kube-subnet-mgr`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum ScaleRegistry {
    #[default]
    Etcd,
    Kube,
}

impl ScaleRegistry {
    pub fn name(self) -> &'static str {
        match self {
            ScaleRegistry::Etcd => "etcd",
            ScaleRegistry::Kube => "kube",
        }
    }
}

#[derive(Debug, Clone)]
pub struct ScaleOptions {
    pub registries: Vec<ScaleRegistry>,
    /// The K values of etcd, each in a lab and an etcd of its own.
    pub leases: Vec<u32>,
    /// The K values of kube (Nodes), each in a lab and an etcd of its own, with an API server
    /// of its own per backend.
    pub nodes: Vec<u32>,
    pub backends: Vec<ScaleBackend>,
    /// Leases added one at a time (and then removed) to time propagation.
    pub samples: u32,
}

impl ScaleOptions {
    /// The K values measured with `registry`.
    pub fn ks(&self, registry: ScaleRegistry) -> &[u32] {
        match registry {
            ScaleRegistry::Etcd => &self.leases,
            ScaleRegistry::Kube => &self.nodes,
        }
    }
}

/// A first reconcile of 60,000 leases took minutes before twill's cost per lease was linear.
const START_LIMIT: Duration = Duration::from_secs(900);
const PROBE_LIMIT: Duration = Duration::from_secs(10);
/// twill reconciles every 60 s; the idle window waits for one, and lasts at least this long.
const IDLE_MIN: Duration = Duration::from_secs(30);
const IDLE_LIMIT: Duration = Duration::from_secs(90);

/// Every (registry, K, backend) in turn; a run that fails keeps its reason in the note.
pub fn run(opts: &ScaleOptions, twill: &Twill, progress: &Progress) -> Vec<ScaleResult> {
    let mut results = Vec::new();
    for &registry in &opts.registries {
        for &k in opts.ks(registry) {
            if let Err(e) = run_k(opts, registry, k, twill, progress, &mut results) {
                for &backend in &opts.backends {
                    if !results
                        .iter()
                        .any(|r| r.registry == registry && r.leases == k && r.backend == backend)
                    {
                        let failed = ScaleResult::failed(backend, k, format!("{e:#}"));
                        results.push(failed.in_registry(registry));
                    }
                }
            }
        }
    }
    progress.clear();
    results
}

/// One lab and one etcd for all backends at `k` leases of `registry`.
fn run_k(
    opts: &ScaleOptions,
    registry: ScaleRegistry,
    k: u32,
    twill: &Twill,
    progress: &Progress,
    results: &mut Vec<ScaleResult>,
) -> Result<()> {
    let what = match registry {
        ScaleRegistry::Etcd => format!("etcd at {k} leases"),
        ScaleRegistry::Kube => format!("kube at {k} Nodes"),
    };
    progress.show(&format!("scale: setting up a lab and etcd for {what}"));
    let lab = Lab::of("scale", 2)?;
    let host = lab.host(0);
    let etcd = Etcd::new(Some(&host.ns))?;
    let files = tempfile::tempdir()?;
    let file = files.path().join("subnet.env");
    host.ns.enter(|| {
        kernel::check_unrouted(host, Synthetic::Filler(0).public_ip())?;
        for &backend in &opts.backends {
            let say = |what: &str| {
                progress.show(&format!(
                    "scale: {} {backend:?} at {k} leases: {what}",
                    registry.name()
                ))
            };
            let run = Run {
                host,
                twill,
                file: &file,
                backend,
                k,
                samples: opts.samples,
            };
            let result = Store::open(registry, host, &etcd, files.path(), backend, &say)
                .and_then(|store| {
                    let result = run.measure(&store, &say);
                    run.clean_up(&store)?;
                    result
                })
                .unwrap_or_else(|e| ScaleResult::failed(backend, k, format!("{e:#}")));
            results.push(result.in_registry(registry));
        }
        Ok(())
    })
}

/// The registry of one backend's run: etcd and a client of it, or an API server of its own
/// and a client of it.
enum Store {
    Etcd {
        endpoint: String,
        writer: Box<Writer>,
    },
    Kube(Box<nodes::Cluster>),
}

impl Store {
    /// On the thread inside `host`'s namespace: clients connect from there.
    fn open(
        registry: ScaleRegistry,
        host: &Host,
        etcd: &Etcd,
        dir: &Path,
        backend: ScaleBackend,
        say: &dyn Fn(&str),
    ) -> Result<Store> {
        Ok(match registry {
            ScaleRegistry::Etcd => {
                let endpoint = etcd.endpoint();
                let writer = Box::new(Writer::connect(&endpoint)?);
                Store::Etcd { endpoint, writer }
            }
            ScaleRegistry::Kube => {
                say("starting kube-apiserver");
                Store::Kube(Box::new(nodes::Cluster::start(host, etcd, dir, backend)?))
            }
        })
    }

    fn registry(&self) -> ScaleRegistry {
        match self {
            Store::Etcd { .. } => ScaleRegistry::Etcd,
            Store::Kube(_) => ScaleRegistry::Kube,
        }
    }

    /// The network config and fillers `0..k` (with kube also the twill node's own Node).
    fn fill(&self, backend: ScaleBackend, k: u32) -> Result<()> {
        match self {
            Store::Etcd { writer, .. } => writer.fill(backend, k),
            Store::Kube(cluster) => cluster.fill(backend, k),
        }
    }

    /// `twill run` against this registry.
    fn spawn(&self, host: &Host, twill: &Twill, subnet_file: &Path) -> Result<Proc> {
        match self {
            Store::Etcd { endpoint, .. } => twill.spawn(host, endpoint, subnet_file, &[]),
            Store::Kube(cluster) => twill.spawn_kube(
                host,
                cluster.kubeconfig(),
                cluster.net_conf(),
                nodes::OWN_NODE,
                subnet_file,
            ),
        }
    }

    /// Writes `lease` (an etcd put, a Node create).
    fn put(&self, lease: Synthetic, backend: ScaleBackend) -> Result<()> {
        match self {
            Store::Etcd { writer, .. } => writer.put(lease, backend),
            Store::Kube(cluster) => cluster.create(lease, backend),
        }
    }

    fn delete(&self, lease: Synthetic) -> Result<()> {
        match self {
            Store::Etcd { writer, .. } => writer.delete(&lease.key()),
            Store::Kube(cluster) => cluster.delete(lease),
        }
    }

    /// The registry's count of requests served so far, and the field their rate goes in: all
    /// of etcd's RPCs, or the API server's requests on Nodes.
    fn requests(&self) -> Result<(ScaleField, f64)> {
        Ok(match self {
            Store::Etcd { endpoint, .. } => (ScaleField::EtcdRpm, etcd_rpcs(endpoint)?),
            Store::Kube(cluster) => (ScaleField::ApiRpm, cluster.node_requests()?),
        })
    }
}

/// One backend at K leases.
struct Run<'a> {
    host: &'a Host,
    twill: &'a Twill,
    file: &'a Path,
    backend: ScaleBackend,
    k: u32,
    samples: u32,
}

impl Run<'_> {
    fn measure(&self, store: &Store, say: &dyn Fn(&str)) -> Result<ScaleResult> {
        say(match store.registry() {
            ScaleRegistry::Etcd => "filling etcd",
            ScaleRegistry::Kube => "creating Nodes",
        });
        if self.backend == ScaleBackend::HostGw {
            kernel::reach_synthetic_peers(self.host)?;
        }
        let filling = Instant::now();
        store.fill(self.backend, self.k)?;
        let mut result = ScaleResult::new(self.backend, self.k);
        result.set(ScaleField::FillMs, ms(filling.elapsed()));
        say("cold start");
        // A fresh node: no subnet file, so with etcd it picks its subnet past all K leases
        // (with kube, its Node's podCIDR is there).
        let _ = std::fs::remove_file(self.file);
        let started = Instant::now();
        let mut node = Node::new(store.spawn(self.host, &self.backend_twill(), self.file)?);
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
        let probe = Probe::new(self.backend, self.host, &node)?;
        self.check_programmed(&node, &probe)?;
        say("propagation");
        let (added, removed, writes) = self.propagation(store, &mut node, &probe)?;
        result.set_percentiles(
            ScaleField::PropagationP50Ms,
            ScaleField::PropagationP99Ms,
            &added,
        );
        if let Some(p50) = crate::stats::percentile(&writes, 50.0) {
            result.set(ScaleField::WriteP50Ms, p50);
        }
        result.set_percentiles(ScaleField::RemovalP50Ms, ScaleField::RemovalP99Ms, &removed);
        say("idle (waiting for a periodic reconcile)");
        self.idle(store, &mut node, &probe, &mut result)?;
        let usage = node.usage()?;
        result.set(ScaleField::RssMb, usage.rss_mb);
        result.set(ScaleField::RssPeakMb, usage.peak_mb);
        if let Store::Kube(cluster) = store {
            let api = cluster.usage()?;
            result.set(ScaleField::ApiserverRssMb, api.rss_mb);
            result.set(ScaleField::ApiserverPeakMb, api.peak_mb);
        }
        node.stop()?;
        Ok(result)
    }

    /// `twill run` as this backend runs it: `udp` is the userspace engine, named, since the
    /// default (auto) would pick eBPF where it runs.
    fn backend_twill(&self) -> Twill {
        match self.backend {
            ScaleBackend::Ebpf => ebpf::twill(self.twill),
            ScaleBackend::Udp => self.twill.with_args(&["--dataplane", "tun"]),
            _ => self.twill.clone(),
        }
    }

    fn check_programmed(&self, node: &Node, probe: &Probe) -> Result<()> {
        if let Probe::Maps(maps) = probe {
            return maps.check_programmed(self.k);
        }
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
            backend => kernel::check_programmed(self.host, backend, self.k as usize),
        }
    }

    /// Adds the probe leases one at a time, each timed from its put (or Node create) until
    /// the node has it, then removes them the same way. Milliseconds: added, removed, and the
    /// puts alone.
    fn propagation(
        &self,
        store: &Store,
        node: &mut Node,
        probe: &Probe,
    ) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
        let (mut added, mut removed, mut writes) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..self.samples {
            let lease = Synthetic::Probe(i);
            let put = Instant::now();
            store.put(lease, self.backend)?;
            writes.push(ms(put.elapsed()));
            let seen = probe.wait(node, lease, self.k + i + 1, false)?;
            added.push(ms(seen.saturating_duration_since(put)));
        }
        for i in 0..self.samples {
            let lease = Synthetic::Probe(i);
            let deleted = Instant::now();
            store.delete(lease)?;
            let gone = probe.wait(node, lease, self.k + self.samples - i - 1, true)?;
            removed.push(ms(gone.saturating_duration_since(deleted)));
        }
        Ok((added, removed, writes))
    }

    /// Waits for one periodic reconcile while nothing changes, and counts what it cost.
    fn idle(
        &self,
        store: &Store,
        node: &mut Node,
        probe: &Probe,
        result: &mut ScaleResult,
    ) -> Result<()> {
        let (_, requests) = store.requests()?;
        let (cpu, since) = (node.usage()?.cpu, Instant::now());
        let reconciles = node.metrics()?.get("twill_reconciles_total");
        let every = Duration::from_millis(200);
        let m = node.wait("a periodic reconcile", IDLE_LIMIT, every, |m| {
            m.get("twill_reconciles_total") > reconciles && since.elapsed() >= IDLE_MIN
        })?;
        let minutes = since.elapsed().as_secs_f64() / 60.0;
        let cpu = node.usage()?.cpu.saturating_sub(cpu);
        let (field, requests_now) = store.requests()?;
        result.set(field, (requests_now - requests) / minutes);
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
        if let Probe::Kernel(monitor, _) = probe {
            result.set(ScaleField::KernelEventsIdle, monitor.drain() as f64);
        }
        Ok(())
    }

    /// Leaves the registry and the host as they were before this backend ran: with etcd the
    /// node's own lease and the probes go, the fillers stay for the next backend to overwrite
    /// (a kube run's API server goes with its store); the VXLAN device goes.
    fn clean_up(&self, store: &Store) -> Result<()> {
        if let Store::Etcd { writer, .. } = store {
            if let Ok(text) = std::fs::read_to_string(self.file) {
                let subnet = text
                    .lines()
                    .find_map(|l| l.strip_prefix("FLANNEL_SUBNET="))
                    .context("no FLANNEL_SUBNET in the subnet file")?;
                let subnet: twill_lab::Ipv4Net = subnet.parse()?;
                let _ = writer.delete(&leases::lease_key(subnet));
            }
            for i in 0..self.samples {
                let _ = writer.delete(&Synthetic::Probe(i).key());
            }
        }
        let _ = self.host.ns.ip(&["link", "del", kernel::VXLAN_DEV]);
        kernel::unreach_synthetic_peers(self.host);
        if self.backend == ScaleBackend::Ebpf {
            ebpf::clean_up(self.host, self.twill)?;
        }
        Ok(())
    }
}

/// How the bench sees that a lease arrived or left: in the userspace table (twill's count of
/// it, polled), in the kernel (`ip monitor`) or in the eBPF programs' maps (polled).
enum Probe {
    Table,
    Kernel(kernel::Monitor, ScaleBackend),
    Maps(Box<ebpf::Maps>),
}

impl Probe {
    fn new(backend: ScaleBackend, host: &Host, node: &Node) -> Result<Probe> {
        Ok(match backend {
            ScaleBackend::Udp => Probe::Table,
            ScaleBackend::Ebpf => Probe::Maps(Box::new(ebpf::Maps::open(node.pid())?)),
            backend => Probe::Kernel(kernel::Monitor::start(host)?, backend),
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
            Probe::Kernel(monitor, backend) => {
                monitor.wait_for(&kernel::peer_lines(*backend, lease, gone), PROBE_LIMIT)
            }
            Probe::Maps(maps) => maps.wait(lease, gone, PROBE_LIMIT),
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
