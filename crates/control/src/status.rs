//! What a running node tells operators: `/healthz` (flannel's), Prometheus `/metrics`, and
//! `/status` (JSON, what `twill status` prints).

mod prometheus;

use crate::lease::Lease;
use crate::peers::{Peers, Refused};
use crate::registry::{LeaseEvent, LeaseNamer};
use crate::traffic::RulesStatus;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use twill_dataplane::stats::EngineStats;
use twill_dataplane::table::SharedTable;

/// Default address of the status server; loopback, since it is for this host's operator.
pub const DEFAULT_ADDR: &str = "127.0.0.1:9585";

/// The node's state as the daemon last saw it. The peer leases live here, not in a copy, so
/// a lease event costs the same however many peers there are.
#[derive(Default)]
pub struct NodeStatus {
    /// `/metrics` writes four series per peer only when asked (`--metrics-per-peer`): at
    /// thousands of peers they would swamp a Prometheus server.
    per_peer_metrics: bool,
    lease: RwLock<Option<Lease>>,
    peers: RwLock<Option<Peers>>,
    backend: RwLock<String>,
    /// Where the leases come from: etcd, Kubernetes or flags.
    registry: RwLock<String>,
    engine: RwLock<Option<(Arc<SharedTable>, Arc<EngineStats>)>>,
    /// Why the node cannot forward now (its device is down, its route gone), while it cannot:
    /// `/healthz` fails with it, so a liveness probe or an operator sees it.
    unhealthy: RwLock<Option<String>>,
    /// Why the running config no longer matches the network's, once it does not.
    restart_needed: RwLock<Option<String>>,
    rules: RwLock<Option<RulesStatus>>,
    reconciles: RwLock<Reconciles>,
    /// Requests that changed kernel state (routes, neighbours, fdb, devices), since start.
    kernel_writes: AtomicU64,
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

impl NodeStatus {
    pub fn new(per_peer_metrics: bool) -> NodeStatus {
        NodeStatus {
            per_peer_metrics,
            ..NodeStatus::default()
        }
    }

    /// Our lease is held: from now on peer leases are admitted against it.
    pub fn set_lease(&self, lease: &Lease, backend: &str, peers: Peers) {
        *self.lease.write().unwrap() = Some(lease.clone());
        *self.backend.write().unwrap() = backend.to_string();
        *self.peers.write().unwrap() = Some(peers);
    }

    /// `Some(why)` while the node cannot forward, `None` once it can again.
    pub fn set_unhealthy(&self, why: Option<String>) {
        *self.unhealthy.write().unwrap() = why;
    }

    /// `/healthz`: 200 "ok", or 503 with the reason the node cannot forward.
    fn health(&self) -> (axum::http::StatusCode, String) {
        match self.unhealthy.read().unwrap().as_ref() {
            None => (axum::http::StatusCode::OK, "ok\n".into()),
            Some(why) => (
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                format!("{why}\n"),
            ),
        }
    }

    pub fn set_registry(&self, name: String) {
        *self.registry.write().unwrap() = name;
    }

    /// Passes a registry event through the lease checks ([`Peers::admit`]); what comes out is
    /// what the backend must do.
    pub fn admit(&self, event: LeaseEvent) -> Option<LeaseEvent> {
        // Before our lease is held nothing can be checked, and no backend is listening.
        self.peers.write().unwrap().as_mut()?.admit(event)
    }

    /// The peer leases the backend was given.
    pub fn accepted_leases(&self) -> Vec<Lease> {
        let peers = self.peers.read().unwrap();
        peers.iter().flat_map(|p| p.accepted()).cloned().collect()
    }

    pub fn set_restart_needed(&self, why: Option<String>) {
        *self.restart_needed.write().unwrap() = why;
    }

    pub fn set_engine(&self, table: &Arc<SharedTable>, stats: &Arc<EngineStats>) {
        *self.engine.write().unwrap() = Some((table.clone(), stats.clone()));
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
        let engine = self.engine.read().unwrap();
        let peers = self.peers.read().unwrap();
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
            "unhealthy": *self.unhealthy.read().unwrap(),
            "reconcile": reconciles_json(&self.reconciles()),
            "kernel_writes": self.kernel_writes.load(Relaxed),
            "counters": engine.as_ref().map(|(table, stats)| counters_json(table, stats)),
            "nftables": *self.rules.read().unwrap(),
        })
    }
}

fn lease_json(lease: &Lease) -> Value {
    json!({
        "subnet": lease.subnet.to_string(),
        "public_ip": lease.public_ip.to_string(),
        "backend_type": lease.backend_type.as_deref(),
    })
}

fn refused_json(namer: &LeaseNamer, refused: &Refused) -> Value {
    json!({
        "key": namer.name(refused.lease.subnet),
        "subnet": refused.lease.subnet.to_string(),
        "public_ip": refused.lease.public_ip.to_string(),
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
        "drops": drops,
        "peers": peers,
    })
}

/// Serve the status endpoints on `addr` until the runtime stops.
pub async fn serve(addr: SocketAddr, status: Arc<NodeStatus>) -> anyhow::Result<()> {
    let app = Router::new()
        .route(
            "/healthz",
            get(|State(s): State<Arc<NodeStatus>>| async move { s.health() }),
        )
        .route(
            "/metrics",
            get(|State(s): State<Arc<NodeStatus>>| async move { s.to_prometheus() }),
        )
        .route(
            "/status",
            get(|State(s): State<Arc<NodeStatus>>| async move { Json(s.to_json()) }),
        )
        .with_state(status);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr} for status: {e}"))?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!("status server stopped: {e}");
        }
    });
    Ok(())
}

/// GET `/status` from a running node and pretty-print it, for `twill status`.
pub async fn fetch(addr: SocketAddr) -> anyhow::Result<String> {
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
    let body = response.into_body().collect().await?.to_bytes();
    let value: Value = serde_json::from_slice(&body).context("status is not JSON")?;
    Ok(serde_json::to_string_pretty(&value)?)
}
