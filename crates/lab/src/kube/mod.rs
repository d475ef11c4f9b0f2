//! A real kube-apiserver (built from source by `scripts/kube-parts`) for the kube-mode tests:
//! flannel's `--kube-subnet-mgr` talks to the API server, so a fake would only test our idea of it.

mod api;
mod apply;
pub mod front;
pub use apply::yaml_documents;

use crate::netns::{command_in, Netns};
use crate::proc::{last_lines, temp_prefix, Proc};
use crate::{certs, Etcd};
use anyhow::{bail, ensure, Context, Result};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// Cold start on a 2-core machine takes a few seconds; the bound only catches a hung server.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Another process may take the probed port before the server binds it; a new one is tried then.
const START_ATTEMPTS: usize = 3;
const PARTS_ENV: &str = "TWILL_KUBE_PARTS";
/// `scripts/kube-parts` links its versioned cache here.
const DEFAULT_PARTS: &str = "/var/cache/twill/kube";
const TOKENS: &str = "tokens.csv";
/// Enough of the server's log to see why it failed, without flooding the test output.
const TAIL_LINES: usize = 40;

/// The path of a part built by `scripts/kube-parts` (`kube-apiserver`, `kubelet`, `flanneld`,
/// `flannel`, `cnitool`, `images/pause.tar`, ...), found in `$TWILL_KUBE_PARTS` or else
/// `/var/cache/twill/kube`.
pub fn kube_part(name: &str) -> Result<PathBuf> {
    let dir = std::env::var_os(PARTS_ENV).map_or_else(|| DEFAULT_PARTS.into(), PathBuf::from);
    let path = dir.join(name);
    ensure!(
        path.is_file(),
        "{} not found: run scripts/kube-parts (builds the Kubernetes and flannel parts from \
         source once, and the images; needs Go) or point {PARTS_ENV} at the directory it prints",
        path.display()
    );
    Ok(path)
}

/// A real kube-apiserver on `ip` (in a namespace or the root one) and a free port, backed by an
/// [`Etcd`] under a prefix of its own, with a fresh CA, serving certificate, service-account key
/// and admin token in a temp dir. Killed and its dir removed on Drop.
///
/// Its synchronous helpers (`create_node`, `apply_yaml`, ...) each run on a private runtime on a
/// thread inside the namespace, so they work from any test, async or not.
#[derive(Debug)]
pub struct KubeApiServer {
    // Drop order: the process before the dir holding its certificates.
    proc: Option<Proc>,
    ns: Option<String>,
    ip: Ipv4Addr,
    port: u16,
    etcd: String,
    binary: PathBuf,
    extra: Vec<String>,
    token: String,
    ca: PathBuf,
    dir: TempDir,
}

impl KubeApiServer {
    /// Starts kube-apiserver inside `ns` (the root namespace for None) on `ip` against `etcd`,
    /// and waits until `/readyz` answers. It must not outlive `ns` or `etcd`.
    pub fn start(ns: Option<&Netns>, ip: Ipv4Addr, etcd: &Etcd) -> Result<KubeApiServer> {
        Self::start_with(ns, ip, etcd, &[])
    }

    /// [`KubeApiServer::start`] with extra kube-apiserver flags, e.g. `--watch-cache=false`
    /// so that watches go to etcd and an expired resourceVersion gets 410 Gone.
    pub fn start_with(
        ns: Option<&Netns>,
        ip: Ipv4Addr,
        etcd: &Etcd,
        extra: &[&str],
    ) -> Result<KubeApiServer> {
        let binary = kube_part("kube-apiserver")?;
        let dir = tempfile::Builder::new().prefix(&temp_prefix()).tempdir()?;
        certs::write(dir.path(), ip)?;
        let token = certs::random_hex(16)?;
        std::fs::write(
            dir.path().join(TOKENS),
            format!("{token},admin,admin,system:masters\n"),
        )?;
        let mut server = KubeApiServer {
            proc: None,
            ns: ns.map(|ns| ns.name().to_string()),
            ip,
            port: 0,
            etcd: etcd.endpoint(),
            binary,
            extra: extra.iter().map(|a| a.to_string()).collect(),
            token,
            ca: dir.path().join(certs::CA_CERT),
            dir,
        };
        for attempt in 1.. {
            server.port = probe_port(ns)?;
            match server.start_again() {
                Err(e) if attempt < START_ATTEMPTS && is_port_taken(&e) => continue,
                result => return result.map(|()| server),
            }
        }
        unreachable!("the loop returns")
    }

    /// `https://IP:PORT`.
    pub fn url(&self) -> String {
        format!("https://{}:{}", self.ip, self.port)
    }

    /// The port it serves on, at its address.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The CA that signed the serving certificate (PEM).
    pub fn ca_file(&self) -> &Path {
        &self.ca
    }

    /// A static token of user `admin` in group `system:masters`.
    pub fn admin_token(&self) -> &str {
        &self.token
    }

    /// Writes a kubeconfig for this server authenticating with `token`, as flanneld's
    /// `--kubeconfig-file` and kube-rs' `Kubeconfig::read_from` read it.
    pub fn write_kubeconfig(&self, path: &Path, token: &str) -> Result<()> {
        std::fs::write(path, self.kubeconfig(token))
            .with_context(|| format!("cannot write {}", path.display()))
    }

    pub fn is_running(&mut self) -> bool {
        self.proc.as_mut().is_some_and(Proc::is_running)
    }

    /// SIGTERM (SIGKILL after 5 s); certificates, etcd data and port are kept for
    /// [`KubeApiServer::start_again`].
    pub fn stop(&mut self) -> Result<()> {
        if let Some(mut proc) = self.proc.take() {
            proc.stop()?;
        }
        Ok(())
    }

    /// (Re)starts with the same port, certificates and etcd prefix and waits until ready; no-op
    /// if running.
    pub fn start_again(&mut self) -> Result<()> {
        if self.is_running() {
            return Ok(());
        }
        let args = self.args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let program = self.binary.to_string_lossy();
        self.proc = Some(Proc::spawn(command_in(
            self.ns.as_deref(),
            &program,
            &args,
        ))?);
        self.wait_ready()
    }

    /// Logs of the current run; empty after [`KubeApiServer::stop`].
    pub fn stderr(&self) -> String {
        self.proc.as_ref().map(Proc::stderr).unwrap_or_default()
    }

    /// The server's pid, e.g. to read its memory use; None when stopped.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(Proc::pid)
    }

    fn args(&self) -> Vec<String> {
        let file = |name: &str| self.dir.path().join(name).display().to_string();
        let sa_key = file(certs::SA_KEY);
        let kubelet_client = file(certs::KUBELET_CLIENT);
        [
            format!("--bind-address={}", self.ip),
            format!("--advertise-address={}", self.ip),
            format!("--secure-port={}", self.port),
            format!("--etcd-servers={}", self.etcd),
            // One etcd may serve several servers; the temp dir's name is unique and survives a
            // restart.
            format!("--etcd-prefix=/{}", self.dir_name()),
            format!("--token-auth-file={}", file(TOKENS)),
            // Node: kubelets (user system:node:NAME in system:nodes) may do what a node does.
            "--authorization-mode=Node,RBAC".into(),
            format!("--client-ca-file={}", file(certs::CA_CERT)),
            format!("--tls-cert-file={}", file(certs::SERVER_CERT)),
            format!("--tls-private-key-file={}", file(certs::SERVER_KEY)),
            // Never the default /var/run/kubernetes.
            format!("--cert-dir={}", file("cert-dir")),
            format!("--kubelet-client-certificate={kubelet_client}.crt"),
            format!("--kubelet-client-key={kubelet_client}.key"),
            // Kubelets are reached at the address they report, not a name no resolver knows.
            "--kubelet-preferred-address-types=InternalIP".into(),
            format!("--service-account-key-file={sa_key}"),
            format!("--service-account-signing-key-file={sa_key}"),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            // No other masters.
            "--endpoint-reconciler-type=none".into(),
            // flannel's DaemonSet runs privileged containers; without this it fails validation.
            "--allow-privileged=true".into(),
            // Lighter on a small machine; tests send few requests.
            "--enable-priority-and-fairness=false".into(),
            "--profiling=false".into(),
        ]
        .into_iter()
        .chain(self.extra.iter().cloned())
        .collect()
    }

    fn dir_name(&self) -> String {
        let name = self.dir.path().file_name().unwrap_or_default();
        name.to_string_lossy().into_owned()
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let proc = self
                .proc
                .as_mut()
                .context("kube-apiserver is not started")?;
            if let Some(status) = proc.wait_timeout(Duration::ZERO)? {
                bail!(
                    "kube-apiserver exited ({status}) during startup:\n{}",
                    tail(&proc.stderr())
                );
            }
            let probe = self.readyz();
            if probe.is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "kube-apiserver not ready after {READY_TIMEOUT:?} ({:#}):\n{}",
                    probe.unwrap_err(),
                    tail(&self.stderr())
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Writes a client certificate signed by this server's CA for `subject` (e.g.
    /// `/O=system:nodes/CN=system:node:node-1`: group and user) and a kubeconfig at `path` that
    /// authenticates with it, as a kubelet's.
    pub fn write_cert_kubeconfig(&self, path: &Path, subject: &str) -> Result<()> {
        let name = format!("client-{}", certs::random_hex(8)?);
        certs::write_client(self.dir.path(), &name, subject)?;
        let file = |ext: &str| self.dir.path().join(format!("{name}.{ext}"));
        let user = [
            ("client-certificate", file("crt")),
            ("client-key", file("key")),
        ];
        let user = user.map(|(key, path)| (key, path.to_string_lossy().into_owned()));
        std::fs::write(path, self.kubeconfig_with(&user))
            .with_context(|| format!("cannot write {}", path.display()))
    }

    fn kubeconfig(&self, token: &str) -> String {
        self.kubeconfig_with(&[("token", token.to_string())])
    }

    /// A kubeconfig whose user has the fields `user` (token, or client-certificate and key).
    fn kubeconfig_with(&self, user: &[(&str, String)]) -> String {
        // JSON strings are YAML strings, and quote whatever a path or token holds.
        let quote = |s: &str| serde_json::Value::from(s).to_string();
        let user: String = user
            .iter()
            .map(|(key, value)| format!("    {key}: {}\n", quote(value)))
            .collect();
        format!(
            "apiVersion: v1\nkind: Config\n\
             clusters:\n- name: lab\n  cluster:\n    server: {}\n    certificate-authority: {}\n\
             users:\n- name: lab\n  user:\n{user}\
             contexts:\n- name: lab\n  context:\n    cluster: lab\n    user: lab\n\
             current-context: lab\n",
            quote(&self.url()),
            quote(&self.ca_file().to_string_lossy()),
        )
    }
}

/// Probed where the server will listen: each namespace has its own ports.
fn probe_port(ns: Option<&Netns>) -> Result<u16> {
    match ns {
        Some(ns) => ns.enter(crate::free_tcp_port),
        None => crate::free_tcp_port(),
    }
}

fn is_port_taken(e: &anyhow::Error) -> bool {
    format!("{e:#}").contains("address already in use")
}

fn tail(log: &str) -> String {
    last_lines(log, TAIL_LINES)
}
