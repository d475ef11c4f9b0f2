//! What a running node tells operators: `/healthz` and `/readyz` (flannel's probes), Prometheus
//! `/metrics`, and `/status` (JSON, what `twill status` prints). `server` serves them.
//!
//! The probes answer what kubelet acts on, as flanneld's do: `/healthz` is 200 for as long as the
//! process runs (a liveness probe that failed would restart the pod, which repairs nothing twill
//! is not already repairing); `/readyz` is 503 until subnet.env is written and the rules are in
//! place, then 200, and 503 again, with the reason, while the node cannot forward (its device
//! down or its route gone, which twill repairs itself).

mod prometheus;
mod server;

pub use server::{
    raise_open_files_limit, HEADER_READ_TIMEOUT, MAX_CONNECTIONS, MAX_CONNECTION_TIME,
};

use crate::lease::Lease;
use crate::lease::LeaseNamer;
use crate::peers::{PeersView, Refused};
use serde::Serialize;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use twill_dataplane::stats::EngineStats;
use twill_dataplane::table::SharedTable;

/// Default address of the status server; loopback, since it is for this host's operator.
pub const DEFAULT_ADDR: &str = "127.0.0.1:9585";

/// One address the status server listens on, and what it answers there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusAddr {
    /// `--status-addr`: `/status`, `/metrics`, `/healthz` and `/readyz`.
    Status(SocketAddr),
    /// flannel's `--healthz-ip`:`--healthz-port`: `/healthz` and `/readyz` alone, as flanneld
    /// serves there (404 for anything else). It listens on every address by default, so the
    /// node's peers, leases and counters are not served on it.
    Healthz(SocketAddr),
}

/// The addresses to serve: everything on `status`, and flannel's probes alone on `healthz`
/// unless its port is 0 (flannel's "off") or it is `status` itself, which the operator put
/// there on purpose and which is served once, with everything.
pub fn addresses(status: SocketAddr, healthz: SocketAddr) -> Vec<StatusAddr> {
    let mut addrs = vec![StatusAddr::Status(status)];
    if healthz.port() != 0 && healthz != status {
        addrs.push(StatusAddr::Healthz(healthz));
    }
    addrs
}

impl StatusAddr {
    pub fn addr(&self) -> SocketAddr {
        match *self {
            StatusAddr::Status(addr) | StatusAddr::Healthz(addr) => addr,
        }
    }
}

/// What status shows of a dataplane: its table, whose peers carry their own counters, and its
/// totals. The userspace engines count into these as they go; the eBPF dataplane counts in its
/// maps, and `refresh` copies them in before they are read, so both look the same.
#[derive(Clone)]
pub struct EngineView {
    /// `tun` or `ebpf`.
    pub name: &'static str,
    /// How the eBPF programs attach (`tcx` or `tc`); `None` for the userspace engines.
    pub attach: Option<&'static str>,
    /// Where the eBPF dataplane decapsulates (`xdp` or `tc`); `None` for the userspace engines.
    pub ingress: Option<&'static str>,
    /// What the eBPF dataplane runs without on this kernel (tcx links, the XDP program), a
    /// line each; empty for the userspace engines.
    pub left_out: Vec<String>,
    pub table: Arc<SharedTable>,
    pub stats: Arc<EngineStats>,
    pub refresh: Option<Arc<dyn Fn(Counted) + Send + Sync>>,
}

/// What a reader of the counters needs brought up to date.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// The totals and drops (`/metrics` without per-peer series): cheap at any size.
    Totals,
    /// Those and every peer's traffic (`/status`, per-peer metrics).
    PerPeer,
}

/// The node's state as the daemon last saw it. The peer leases are not kept here: status reads
/// the node's own ([`PeersView`]), so a lease event costs the same however many peers there are.
#[derive(Default)]
pub struct NodeStatus {
    /// `/metrics` writes four series per peer only when asked (`--metrics-per-peer`): at
    /// thousands of peers they would swamp a Prometheus server.
    per_peer_metrics: bool,
    lease: RwLock<Option<Lease>>,
    peers: RwLock<Option<PeersView>>,
    backend: RwLock<String>,
    /// Where the leases come from: etcd, Kubernetes or flags.
    registry: RwLock<String>,
    engine: RwLock<Option<EngineView>>,
    /// Whether subnet.env is written and the rules are in place (flanneld's readiness).
    ready: AtomicBool,
    /// Why the node is not ready yet, where it knows (subnet.env cannot be written).
    waiting: RwLock<Option<String>>,
    /// Why the node cannot forward now (its device is down, its route gone), while it cannot:
    /// `/readyz` fails with it, so a readiness probe or an operator sees it.
    unhealthy: RwLock<Option<String>>,
    /// Why the last reconcile failed, until one succeeds: the kernel may not hold what the
    /// leases ask, and `/readyz` fails with it.
    unreconciled: RwLock<Option<String>>,
    /// Why the running config no longer matches the network's, once it does not.
    restart_needed: RwLock<Option<String>>,
    rules: RwLock<Option<RulesStatus>>,
    reconciles: RwLock<Reconciles>,
    /// Requests that changed kernel state (routes, neighbours, fdb, devices), since start.
    kernel_writes: AtomicU64,
    /// Status server connections closed to keep their number at [`MAX_CONNECTIONS`].
    connections_evicted: AtomicU64,
    /// Status requests answered 400 for framing a body with Transfer-Encoding.
    requests_refused: AtomicU64,
}

/// The backend's reconciles so far: at start, after every re-list and periodically.
#[derive(Debug, Default, Clone, Copy)]
pub struct Reconciles {
    pub count: u64,
    /// Wall time of the last one.
    pub last: Duration,
    /// Kernel writes the last one made: 0 when the kernel already matched the leases.
    pub last_writes: u64,
}

/// What `twill status` shows of flannel's masquerade and forward rules (the traffic module
/// keeps it current).
#[derive(Debug, Clone, Default, Serialize)]
pub struct RulesStatus {
    /// `nftables` (`"EnableNFTables": true`), else `iptables-nft` or `iptables-legacy`.
    pub mode: String,
    /// Where the rules are: nftables tables, or iptables chains.
    pub places: Vec<String>,
    pub ip_masq: bool,
    pub forward_rules: bool,
    /// MASQUERADE with fully random ports (off: `--ip-masq-fully-random-disable`).
    pub fully_random: bool,
    /// The rules are in place as written, as of the last check.
    pub in_place: bool,
    /// Checks since start (one every `--iptables-resync`).
    pub checks: u64,
    /// How often the rules had to be written again since start.
    pub repairs: u64,
    /// Why the last check or repair failed, if it did.
    pub error: Option<String>,
}

impl NodeStatus {
    pub fn new(per_peer_metrics: bool) -> NodeStatus {
        NodeStatus {
            per_peer_metrics,
            ..NodeStatus::default()
        }
    }

    /// Our lease is held: from now on the node admits peer leases against it, into `peers`.
    pub fn set_lease(&self, lease: &Lease, backend: &str, peers: PeersView) {
        *self.lease.write().unwrap() = Some(lease.clone());
        *self.backend.write().unwrap() = backend.to_string();
        *self.peers.write().unwrap() = Some(peers);
    }

    /// `Some(why)` while the node cannot forward, `None` once it can again.
    pub fn set_unhealthy(&self, why: Option<String>) {
        *self.unhealthy.write().unwrap() = why;
    }

    /// `Some(why)` while reconciles fail, `None` once one succeeds.
    pub fn set_unreconciled(&self, why: Option<String>) {
        *self.unreconciled.write().unwrap() = why;
    }

    /// subnet.env is written and the rules are in place: `/readyz` answers 200 from now on,
    /// unless the node cannot forward.
    pub fn set_ready(&self) {
        self.ready.store(true, Relaxed);
    }

    /// `Some(why)` while the node cannot become ready (subnet.env cannot be written).
    pub fn set_waiting(&self, why: Option<String>) {
        *self.waiting.write().unwrap() = why;
    }

    /// `/readyz`: 503 until the node is ready (with the reason where it is known), 200 once it
    /// is, 503 with the reason while it cannot forward or its reconciles fail.
    fn readiness_answer(&self) -> (axum::http::StatusCode, String) {
        use axum::http::StatusCode;
        if !self.ready.load(Relaxed) {
            let why = match self.waiting.read().unwrap().as_ref() {
                Some(why) => format!("not ready: {why}"),
                None => "not ready: subnet.env and the rules are not in place yet".to_string(),
            };
            return (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n"));
        }
        let unhealthy = self.unhealthy.read().unwrap().clone();
        match unhealthy.or_else(|| self.unreconciled.read().unwrap().clone()) {
            None => (StatusCode::OK, "ready\n".into()),
            Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        }
    }

    pub fn set_registry(&self, name: String) {
        *self.registry.write().unwrap() = name;
    }

    pub fn set_restart_needed(&self, why: Option<String>) {
        *self.restart_needed.write().unwrap() = why;
    }

    pub fn set_engine(&self, view: EngineView) {
        *self.engine.write().unwrap() = Some(view);
    }

    /// The dataplane's view with `counted` brought up to date, if there is a dataplane.
    pub(crate) fn engine_now(&self, counted: Counted) -> Option<EngineView> {
        let view = self.engine.read().unwrap().clone()?;
        if let Some(refresh) = &view.refresh {
            refresh(counted);
        }
        Some(view)
    }

    pub fn record_reconcile(&self, took: Duration, writes: u64) {
        let mut reconciles = self.reconciles.write().unwrap();
        reconciles.count += 1;
        reconciles.last = took;
        reconciles.last_writes = writes;
    }

    pub fn reconciles(&self) -> Reconciles {
        *self.reconciles.read().unwrap()
    }

    pub fn set_kernel_writes(&self, total: u64) {
        self.kernel_writes.store(total, Relaxed);
    }

    pub fn set_rules(&self, rules: RulesStatus) {
        *self.rules.write().unwrap() = Some(rules);
    }

    /// Changes the rules' status in place; nothing when no rules were set.
    pub fn update_rules(&self, change: impl FnOnce(&mut RulesStatus)) {
        if let Some(rules) = self.rules.write().unwrap().as_mut() {
            change(rules);
        }
    }

    fn to_json(&self) -> Value {
        let lease = self.lease.read().unwrap().clone();
        let engine = self.engine_now(Counted::PerPeer);
        let view = self.peers.read().unwrap().clone();
        let peers = view.as_ref().map(PeersView::read);
        let accepted: Vec<Value> = peers
            .iter()
            .flat_map(|p| p.accepted())
            .map(lease_json)
            .collect();
        let refused = peers
            .iter()
            .flat_map(|p| p.refused().map(|r| refused_json(p.namer(), r)));
        let unreadable = peers.iter().flat_map(|p| {
            p.unreadable()
                .map(|(key, why)| json!({"key": key, "reason": why}))
        });
        let rejected: Vec<Value> = refused.chain(unreadable).collect();
        json!({
            "registry": *self.registry.read().unwrap(),
            "backend": *self.backend.read().unwrap(),
            "lease": lease.as_ref().map(lease_json),
            "peers": accepted,
            "rejected_leases": rejected,
            "restart_needed": *self.restart_needed.read().unwrap(),
            "ready": self.ready.load(Relaxed),
            "unhealthy": *self.unhealthy.read().unwrap(),
            "unreconciled": *self.unreconciled.read().unwrap(),
            "reconcile": reconciles_json(&self.reconciles()),
            "kernel_writes": self.kernel_writes.load(Relaxed),
            "dataplane": engine.as_ref().map(|e| e.name),
            "dataplane_attach": engine.as_ref().and_then(|e| e.attach),
            "dataplane_ingress": engine.as_ref().and_then(|e| e.ingress),
            "dataplane_left_out": engine.as_ref().map(|e| e.left_out.clone()).unwrap_or_default(),
            "counters": engine.as_ref().map(|e| counters_json(&e.table, &e.stats)),
            "rules": *self.rules.read().unwrap(),
        })
    }
}

fn lease_json(lease: &Lease) -> Value {
    json!({
        "subnet": lease.id().to_string(),
        "public_ip": lease.public_addrs.v4().map(|ip| ip.to_string()),
        "backend_type": lease.backend_type.as_deref(),
    })
}

fn refused_json(namer: &LeaseNamer, refused: &Refused) -> Value {
    json!({
        "key": namer.name(&refused.lease),
        "subnet": refused.lease.id().to_string(),
        "public_ip": refused.lease.public_addrs.v4().map(|ip| ip.to_string()),
        "reason": refused.reason.to_string(),
    })
}

fn reconciles_json(r: &Reconciles) -> Value {
    json!({
        "count": r.count,
        "last_ms": r.last.as_secs_f64() * 1e3,
        "last_writes": r.last_writes,
    })
}

fn counters_json(table: &SharedTable, stats: &EngineStats) -> Value {
    let drops: serde_json::Map<String, Value> = stats
        .drops()
        .map(|(r, n)| (r.as_str().to_string(), json!(n)))
        .collect();
    let peers: Vec<Value> = table
        .load()
        .peers()
        .iter()
        .map(|p| {
            json!({
                "subnet": p.spec.subnet.to_string(),
                "endpoint": p.spec.endpoint.to_string(),
                "tx_packets": p.stats.tx.packets(), "tx_bytes": p.stats.tx.bytes(),
                "rx_packets": p.stats.rx.packets(), "rx_bytes": p.stats.rx.bytes(),
            })
        })
        .collect();
    json!({
        "tx_packets": stats.tx.packets(), "tx_bytes": stats.tx.bytes(),
        "rx_packets": stats.rx.packets(), "rx_bytes": stats.rx.bytes(),
        "tx_datagrams": stats.tx_datagrams.load(Relaxed),
        "rx_datagrams": stats.rx_datagrams.load(Relaxed),
        "tx_super_packets": stats.tx_super_packets.load(Relaxed),
        "rx_super_packets": stats.rx_super_packets.load(Relaxed),
        "icmp_rate_limited": stats.icmp_rate_limited.load(Relaxed),
        "drops": drops,
        "peers": peers,
    })
}

/// Serve the status endpoints on `addr` (all of them, or `/healthz` alone) until the runtime
/// stops. Fails only when `addr` cannot be listened on.
pub async fn serve(addr: StatusAddr, status: Arc<NodeStatus>) -> anyhow::Result<()> {
    server::serve(addr, status).await
}

/// How long `twill status` waits for the node's answer.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// GET `/status` from a running node and pretty-print it, for `twill status`.
pub async fn fetch(addr: SocketAddr) -> anyhow::Result<String> {
    use anyhow::Context;
    let body = tokio::time::timeout(FETCH_TIMEOUT, get_status(addr))
        .await
        .map_err(|_| {
            anyhow::anyhow!("the node on {addr} did not answer within {FETCH_TIMEOUT:?}")
        })??;
    let value: Value = serde_json::from_slice(&body).context("status is not JSON")?;
    Ok(serde_json::to_string_pretty(&value)?)
}

async fn get_status(addr: SocketAddr) -> anyhow::Result<axum::body::Bytes> {
    use anyhow::Context;
    use http_body_util::{BodyExt, Empty};
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("no twill node answers on {addr} (is `twill run` running?)"))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let request = hyper::Request::get("/status")
        .header("host", addr.to_string())
        .body(Empty::<axum::body::Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let code = response.status();
    if !code.is_success() {
        anyhow::bail!(
            "{addr} answered {code} to GET /status (a --healthz-port serves /healthz alone: \
             give the node's --status-addr)"
        );
    }
    Ok(response.into_body().collect().await?.to_bytes())
}
