//! The registry tests' helpers: the lab's etcd (the Debian binary on 127.0.0.1, free ports, a
//! temp dir, killed and removed on drop, so also when a test panics) with a client and registry
//! options for it, and waits on lease events.

#![allow(dead_code)] // each test binary uses a different part of this helper

use etcd_client::Client;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use twill_control::lease::LeaseEvent;
use twill_control::lease::{Lease, LeaseAttrs};
use twill_control::registry::{EtcdOptions, EtcdRegistry, Registry, Timing};
use twill_lab::EtcdSetup;

pub const PREFIX: &str = "/coreos.com/network";

/// The lab's etcd, as the registry tests reach it.
pub struct Etcd(twill_lab::Etcd);

impl Etcd {
    /// Ports and a data dir, but no process yet (to test a registry that starts first).
    pub fn unstarted() -> Etcd {
        Etcd(twill_lab::Etcd::unstarted(EtcdSetup::default()).expect("an etcd's ports and dir"))
    }

    fn with(setup: EtcdSetup) -> Etcd {
        Etcd(twill_lab::Etcd::with(setup).expect("start etcd (Debian package etcd-server)"))
    }

    pub fn start() -> Etcd {
        Etcd::with(EtcdSetup::default())
    }

    /// An etcd started with additional command-line flags.
    pub fn start_with(args: &[&str]) -> Etcd {
        let args = args.iter().map(|a| a.to_string()).collect();
        Etcd::with(EtcdSetup { tls: false, args })
    }

    /// An etcd that speaks only TLS and wants a client certificate signed by its test CA.
    pub fn start_tls() -> Etcd {
        Etcd::with(EtcdSetup {
            tls: true,
            args: vec![],
        })
    }

    pub fn endpoint(&self) -> String {
        self.0.endpoint()
    }

    /// Starts etcd (again, with the same data and ports) and waits until it is healthy.
    pub fn launch(&mut self) {
        self.0.start().expect("start etcd again");
    }

    /// Kills etcd hard (no graceful close of client connections), keeping its data.
    pub fn stop(&mut self) {
        self.0.kill();
    }

    pub async fn client(&self) -> Client {
        let mut options = etcd_client::ConnectOptions::new();
        if let Some(id) = self.0.identity() {
            let read = |path: &std::path::Path| std::fs::read(path).unwrap();
            let tls = etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(read(&id.ca)))
                .identity(etcd_client::Identity::from_pem(
                    read(&id.cert),
                    read(&id.key),
                ));
            options = options.with_tls(tls);
        }
        Client::connect([self.endpoint()], Some(options))
            .await
            .unwrap()
    }

    pub async fn put_config(&self, json: &str) {
        self.client()
            .await
            .put(format!("{PREFIX}/config"), json, None)
            .await
            .unwrap();
    }

    /// Registry options for this etcd with intervals short enough for tests.
    pub fn options(&self) -> EtcdOptions {
        let mut opts = EtcdOptions::new(&self.endpoint());
        opts.timing = fast_timing();
        if let Some(id) = self.0.identity() {
            opts.cafile = Some(id.ca.clone());
            opts.certfile = Some(id.cert.clone());
            opts.keyfile = Some(id.key.clone());
        }
        opts
    }
}

pub fn fast_timing() -> Timing {
    Timing {
        lease_ttl: Duration::from_secs(60),
        renew_margin: Duration::from_secs(10),
        retry_interval: Duration::from_millis(300),
        backoff_min: Duration::from_millis(50),
        backoff_max: Duration::from_millis(500),
        request_timeout: Duration::from_secs(1),
    }
}

pub const SECOND: Duration = Duration::from_secs(1);

/// A node's public IP: 127.0.0.`last`, where the registry tests' etcd listens.
pub fn ip(last: u8) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(127, 0, 0, last)
}

/// A registry connected with `opts` and started with `attrs`: our lease and the events.
pub async fn start_with(
    opts: EtcdOptions,
    attrs: LeaseAttrs,
) -> anyhow::Result<(Lease, mpsc::Receiver<LeaseEvent>)> {
    EtcdRegistry::connect(opts).await?.start(attrs).await
}

/// The leases of a snapshot event; fails the test on any other event.
pub fn snapshot(event: LeaseEvent) -> Vec<Lease> {
    match event {
        LeaseEvent::Snapshot(leases) => leases.into_iter().map(Arc::unwrap_or_clone).collect(),
        other => panic!("expected a snapshot, got {other:?}"),
    }
}

/// Deletes `own`'s key behind the registry's back: the registry must say it re-acquired
/// exactly that lease and write the same value under the same key again.
pub async fn assert_reacquired_after_its_key_is_deleted(
    etcd: &Etcd,
    own: &Lease,
    events: &mut mpsc::Receiver<LeaseEvent>,
) {
    let mut client = etcd.client().await;
    client.delete(own.key(PREFIX), None).await.unwrap();
    let event = wait_for(events, 5 * SECOND, |e| matches!(e, LeaseEvent::OwnLease(_))).await;
    assert_eq!(event, LeaseEvent::OwnLease(own.clone()));
    let (value, _) = get(&mut client, &own.key(PREFIX))
        .await
        .expect("our key written again");
    assert_eq!(value, own.to_json());
}

/// Starts a node publishing `own` on a 3 s TTL beside a peer publishing `peer`: after three
/// TTLs its key must still hold its lease, on a new etcd lease, with no second key written,
/// and the peer must never have seen it go.
pub async fn assert_renewed_under_its_key(etcd: &Etcd, own: LeaseAttrs, peer: LeaseAttrs) {
    let mut opts = etcd.options();
    opts.timing.lease_ttl = 3 * SECOND;
    opts.timing.renew_margin = 2 * SECOND;
    let (a, _events) = start_with(opts, own).await.unwrap();
    let (_, mut peer_events) = start_with(etcd.options(), peer).await.unwrap();
    snapshot(next_event(&mut peer_events, 5 * SECOND).await);
    let mut client = etcd.client().await;
    let (_, first) = get(&mut client, &a.key(PREFIX)).await.unwrap();

    // Three TTLs: without renewal the key would be gone.
    tokio::time::sleep(9 * SECOND).await;
    let (value, now) = get(&mut client, &a.key(PREFIX))
        .await
        .expect("renewed key still there");
    assert_eq!(value, a.to_json());
    assert_ne!(now, first, "each renewal puts the key on a new etcd lease");
    let opts = etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    let count = client
        .get(format!("{PREFIX}/subnets/"), Some(opts))
        .await
        .unwrap()
        .count();
    assert_eq!(count, 2, "renewal wrote no second key");
    while let Ok(event) = peer_events.try_recv() {
        assert!(
            !matches!(event, LeaseEvent::Removed(_)),
            "peer saw our lease vanish: {event:?}"
        );
    }
}

/// The next event, failing the test if none comes within `within`.
pub async fn next_event(rx: &mut mpsc::Receiver<LeaseEvent>, within: Duration) -> LeaseEvent {
    tokio::time::timeout(within, rx.recv())
        .await
        .unwrap_or_else(|_| panic!("no lease event within {within:?}"))
        .expect("registry closed its event channel")
}

/// Skips events until one matches; fails the test after `within`.
pub async fn wait_for(
    rx: &mut mpsc::Receiver<LeaseEvent>,
    within: Duration,
    mut pred: impl FnMut(&LeaseEvent) -> bool,
) -> LeaseEvent {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = next_event(rx, left).await;
        if pred(&event) {
            return event;
        }
    }
}

/// The value and etcd lease id stored at `key`, if any.
pub async fn get(client: &mut Client, key: &str) -> Option<(String, i64)> {
    let resp = client.get(key, None).await.unwrap();
    resp.kvs()
        .first()
        .map(|kv| (kv.value_str().unwrap().to_string(), kv.lease()))
}

/// Log lines of the current thread, for tests that check what the registry told the operator.
/// Thread-local on purpose: `#[tokio::test]` runs the test and the tasks it spawns on one
/// thread, and tests running in parallel must not see each other's lines.
#[derive(Clone, Default)]
pub struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Logs {
    pub fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
