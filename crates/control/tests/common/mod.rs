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
use twill_control::lease::LeaseEvent;
use twill_control::lease::{Lease, LeaseAttrs};
use twill_control::registry::{EtcdOptions, EtcdRegistry, Registry, Timing};

pub const ETCD_BIN: &str = "/usr/bin/etcd";
pub const PREFIX: &str = "/coreos.com/network";

pub struct Etcd {
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    /// Serve clients over TLS and require client certificates (certs in `tls_dir`).
    tls: bool,
    extra_args: Vec<String>,
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
            tls: false,
            extra_args: vec![],
        }
    }

    /// An etcd started with additional command-line flags.
    pub fn start_with(args: &[&str]) -> Etcd {
        let mut etcd = Etcd::unstarted();
        etcd.extra_args = args.iter().map(|a| a.to_string()).collect();
        etcd.launch();
        etcd
    }

    /// An etcd that speaks only TLS and wants a client certificate signed by its test CA.
    pub fn start_tls() -> Etcd {
        let mut etcd = Etcd::unstarted();
        etcd.tls = true;
        make_certs(&etcd.tls_dir());
        etcd.launch();
        etcd
    }

    /// ca.pem, and cert.pem/key.pem valid for 127.0.0.1 as server and as client.
    pub fn tls_dir(&self) -> PathBuf {
        self.dir.path().join("tls")
    }

    pub fn start() -> Etcd {
        let mut etcd = Etcd::unstarted();
        etcd.launch();
        etcd
    }

    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
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
        let secure_before = self.log().matches(SECURE_READY).count();
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
            .args(self.tls_args())
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start /usr/bin/etcd (Debian package etcd-server)");
        self.child = Some(child);
        self.wait_healthy(secure_before);
    }

    fn tls_args(&self) -> Vec<String> {
        if !self.tls {
            return vec![];
        }
        let file = |name: &str| self.tls_dir().join(name).display().to_string();
        vec![
            "--cert-file".into(),
            file("cert.pem"),
            "--key-file".into(),
            file("key.pem"),
            "--trusted-ca-file".into(),
            file("ca.pem"),
            "--client-cert-auth".into(),
        ]
    }

    fn wait_healthy(&mut self, secure_before: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("etcd exited with {status}:\n{}", self.log());
            }
            if self.healthy(secure_before) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("etcd not healthy after 30 s:\n{}", self.log());
    }

    fn healthy(&self, secure_before: usize) -> bool {
        if self.tls {
            return self.log().matches(SECURE_READY).count() > secure_before;
        }
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
        let mut options = etcd_client::ConnectOptions::new();
        if self.tls {
            let read = |name: &str| std::fs::read(self.tls_dir().join(name)).unwrap();
            let tls = etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(read("ca.pem")))
                .identity(etcd_client::Identity::from_pem(
                    read("cert.pem"),
                    read("key.pem"),
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
        if self.tls {
            opts.cafile = Some(self.tls_dir().join("ca.pem"));
            opts.certfile = Some(self.tls_dir().join("cert.pem"));
            opts.keyfile = Some(self.tls_dir().join("key.pem"));
        }
        opts
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What etcd logs once it accepts TLS clients (it has no plain /health to poll then).
const SECURE_READY: &str = "serving client traffic securely";

/// A throwaway CA and one certificate for 127.0.0.1, made with the openssl CLI.
pub fn make_certs(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    openssl(
        dir,
        &[
            &["req", "-x509"],
            &ec[..],
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "1",
                "-subj",
                "/CN=twill-test-ca",
            ],
        ]
        .concat(),
    );
    openssl(
        dir,
        &[
            &["req"],
            &ec[..],
            &[
                "-keyout",
                "key.pem",
                "-out",
                "cert.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
        ]
        .concat(),
    );
    std::fs::write(
        dir.join("ext"),
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "cert.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "cert.pem",
            "-days",
            "1",
            "-extfile",
            "ext",
        ],
    );
}

fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
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
        LeaseEvent::Snapshot(leases) => leases,
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
