//! A real etcd for the registry tests: the Debian binary on 127.0.0.1, free ports, a temp dir.
//! Killed and removed on drop, so also when a test panics.

#![allow(dead_code)] // each test binary uses a different part of this helper

use etcd_client::Client;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use twill_control::registry::{EtcdOptions, LeaseEvent, Timing};

pub const ETCD_BIN: &str = "/usr/bin/etcd";
pub const PREFIX: &str = "/coreos.com/network";

pub struct Etcd {
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Etcd {
    /// Ports and a data dir, but no process yet (to test a registry that starts first).
    pub fn unstarted() -> Etcd {
        Etcd {
            dir: tempfile::tempdir().unwrap(),
            client_port: free_port(),
            peer_port: free_port(),
            child: None,
        }
    }

    pub fn start() -> Etcd {
        let mut etcd = Etcd::unstarted();
        etcd.launch();
        etcd
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    /// Starts etcd (again, with the same data and ports) and waits until it is healthy.
    pub fn launch(&mut self) {
        assert!(self.child.is_none(), "etcd already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new(ETCD_BIN)
            .args(["--name", "twill-test", "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &self.endpoint(),
                "--advertise-client-urls",
                &self.endpoint(),
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("twill-test={peer}")])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start /usr/bin/etcd (Debian package etcd-server)");
        self.child = Some(child);
        self.wait_healthy();
    }

    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("etcd exited with {status}:\n{}", self.log());
            }
            if self.healthy() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("etcd not healthy after 30 s:\n{}", self.log());
    }

    fn healthy(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.client_port)) else {
            return false;
        };
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut body = String::new();
        s.write_all(b"GET /health HTTP/1.0\r\n\r\n").is_ok()
            && s.read_to_string(&mut body).is_ok()
            && body.contains("\"health\":\"true\"")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Kills etcd hard (no graceful close of client connections), keeping its data.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub async fn client(&self) -> Client {
        Client::connect([self.endpoint()], None).await.unwrap()
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
        opts
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
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
