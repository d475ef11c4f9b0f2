use crate::certs::{self, Identity};
use crate::netns::{command_in, Netns};
use crate::proc::run;
use crate::proc::{temp_prefix, Proc};
use anyhow::{bail, Result};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};
use tempfile::TempDir;

const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// What etcd answers a request without a user once auth is enabled.
const AUTH_REFUSED: &str = "user name is empty";
/// Another process may take a probed port before etcd binds it; new ports are tried then.
const START_ATTEMPTS: usize = 3;

/// How a lab etcd serves: plain HTTP (the default), or TLS with client certificates.
#[derive(Debug, Clone, Default)]
pub struct EtcdSetup {
    /// Serve clients over TLS only and require a certificate signed by the etcd's own CA
    /// ([`Etcd::identity`], which its clients present too).
    pub tls: bool,
    /// More flags, e.g. `--auth-token-ttl=1`.
    pub args: Vec<String>,
}

/// A real single-member `etcd` on 127.0.0.1 (in a namespace or the root one), on free ports, with
/// its data in a temp dir. Killed and its dir removed on Drop.
#[derive(Debug)]
pub struct Etcd {
    // Drop order: the process before the data dir it writes to.
    proc: Option<Proc>,
    ns: Option<String>,
    /// The address etcd listens on; loopback unless other namespaces must reach it.
    ip: Ipv4Addr,
    client_port: u16,
    peer_port: u16,
    /// With [`EtcdSetup::tls`]: its CA and the certificate it serves with.
    identity: Option<Identity>,
    args: Vec<String>,
    dir: TempDir,
}

impl Etcd {
    /// Starts etcd inside `ns` (the root namespace for None) and waits until it is healthy.
    /// The Etcd must not outlive `ns`.
    pub fn new(ns: Option<&Netns>) -> Result<Etcd> {
        Self::listening(ns, Ipv4Addr::LOCALHOST)
    }

    /// Like [`Etcd::new`], but listening on `ip` in `ns` (e.g. a host's underlay address), so
    /// nodes in other namespaces of the lab can reach it.
    pub fn listening(ns: Option<&Netns>, ip: Ipv4Addr) -> Result<Etcd> {
        Self::started(Self::made(ns, ip, EtcdSetup::default())?, ns)
    }

    /// An etcd on 127.0.0.1 in the root namespace, serving as `setup` says.
    pub fn with(setup: EtcdSetup) -> Result<Etcd> {
        Self::started(Self::made(None, Ipv4Addr::LOCALHOST, setup)?, None)
    }

    /// Like [`Etcd::with`], but not started: its ports and data dir exist, so a client can be
    /// pointed at it before it runs ([`Etcd::start`]).
    pub fn unstarted(setup: EtcdSetup) -> Result<Etcd> {
        let mut etcd = Self::made(None, Ipv4Addr::LOCALHOST, setup)?;
        [etcd.client_port, etcd.peer_port] = probe_ports(None)?;
        Ok(etcd)
    }

    fn made(ns: Option<&Netns>, ip: Ipv4Addr, setup: EtcdSetup) -> Result<Etcd> {
        let dir = tempfile::Builder::new().prefix(&temp_prefix()).tempdir()?;
        let identity = match setup.tls {
            true => Some(certs::write_identity(&dir.path().join("tls"), ip)?),
            false => None,
        };
        Ok(Etcd {
            proc: None,
            ns: ns.map(|ns| ns.name().to_string()),
            ip,
            client_port: 0,
            peer_port: 0,
            identity,
            args: setup.args,
            dir,
        })
    }

    /// Starts `etcd` on free ports, trying new ones when another process took them first.
    fn started(mut etcd: Etcd, ns: Option<&Netns>) -> Result<Etcd> {
        let mut attempt = 1;
        loop {
            [etcd.client_port, etcd.peer_port] = probe_ports(ns)?;
            match etcd.start() {
                Err(e)
                    if attempt < START_ATTEMPTS
                        && e.to_string().contains("address already in use") =>
                {
                    attempt += 1
                }
                result => return result.map(|()| etcd),
            }
        }
    }

    /// `http://IP:PORT`, or `https://` with TLS.
    pub fn endpoint(&self) -> String {
        let scheme = if self.identity.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}:{}", self.ip, self.client_port)
    }

    /// With TLS: the CA it trusts and the certificate it serves with, which its clients may
    /// present too (it serves and is a client).
    pub fn identity(&self) -> Option<&Identity> {
        self.identity.as_ref()
    }

    /// Runs `etcdctl --endpoints <endpoint> args...` in etcd's namespace and returns stdout.
    pub fn etcdctl(&self, args: &[&str]) -> Result<String> {
        let endpoints = format!("--endpoints={}", self.endpoint());
        let mut all = vec![
            endpoints.as_str(),
            "--dial-timeout=1s",
            "--command-timeout=2s",
        ];
        let tls = self.identity.iter().flat_map(|id| {
            [
                ("--cacert", &id.ca),
                ("--cert", &id.cert),
                ("--key", &id.key),
            ]
            .map(|(flag, path)| format!("{flag}={}", path.display()))
        });
        let tls: Vec<String> = tls.collect();
        all.extend(tls.iter().map(String::as_str));
        all.extend_from_slice(args);
        run(command_in(self.ns.as_deref(), "etcdctl", &all).env("ETCDCTL_API", "3"))
    }

    pub fn is_running(&mut self) -> bool {
        self.proc.as_mut().is_some_and(Proc::is_running)
    }

    /// SIGTERM (SIGKILL after 5 s); the data dir and ports are kept for [`Etcd::start`].
    pub fn stop(&mut self) -> Result<()> {
        if let Some(mut proc) = self.proc.take() {
            proc.stop()?;
        }
        Ok(())
    }

    /// SIGKILL: clients see their connections cut, not closed; the data dir and ports are kept.
    pub fn kill(&mut self) {
        if let Some(mut proc) = self.proc.take() {
            proc.kill9();
        }
    }

    /// (Re)starts with the same data dir and ports and waits until healthy; no-op if running.
    pub fn start(&mut self) -> Result<()> {
        if self.is_running() {
            return Ok(());
        }
        self.proc = Some(Proc::spawn(command_in(
            self.ns.as_deref(),
            "etcd",
            &self.args().iter().map(String::as_str).collect::<Vec<_>>(),
        ))?);
        self.wait_healthy()
    }

    /// Stops etcd, removes everything it stored and starts it again, empty, on the same ports:
    /// a member that lost its disk. Its revisions start over, below any a client has seen.
    pub fn lose_data(&mut self) -> Result<()> {
        self.stop()?;
        let data = self.dir.path().join("data");
        std::fs::remove_dir_all(&data)
            .map_err(|e| anyhow::anyhow!("cannot remove {}: {e}", data.display()))?;
        self.start()
    }

    /// Logs of the current run; empty after [`Etcd::stop`].
    pub fn stderr(&self) -> String {
        self.proc.as_ref().map(Proc::stderr).unwrap_or_default()
    }

    fn args(&self) -> Vec<String> {
        let client = self.endpoint();
        let peer = format!("http://{}:{}", self.ip, self.peer_port);
        let data = self.dir.path().join("data").display().to_string();
        let tls = self.identity.iter().flat_map(|id| {
            [
                format!("--cert-file={}", id.cert.display()),
                format!("--key-file={}", id.key.display()),
                format!("--trusted-ca-file={}", id.ca.display()),
                "--client-cert-auth".into(),
            ]
        });
        let setup: Vec<String> = tls.chain(self.args.iter().cloned()).collect();
        let common: Vec<String> = [
            "--name=lab".into(),
            format!("--data-dir={data}"),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster=lab={peer}"),
            "--logger=zap".into(),
            "--log-outputs=stderr".into(),
        ]
        .into();
        [common, setup].concat()
    }

    fn wait_healthy(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let Some(proc) = self.proc.as_mut() else {
                bail!("etcd is not started");
            };
            if let Some(status) = proc.wait_timeout(Duration::ZERO)? {
                bail!("etcd exited ({status}) during startup: {}", proc.stderr());
            }
            match self.etcdctl(&["endpoint", "health"]) {
                Ok(_) => return Ok(()),
                // With auth enabled (a test's doing) the health read is refused for want of a
                // user: it went through the server's request path, as etcdctl's own
                // "permission denied counts as healthy" rule has it.
                Err(e) if format!("{e:#}").contains(AUTH_REFUSED) => return Ok(()),
                Err(_) => {}
            }
            if Instant::now() > deadline {
                bail!(
                    "etcd not healthy after {READY_TIMEOUT:?}: {}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Probed where etcd will listen: each namespace has its own loopback.
fn probe_ports(ns: Option<&Netns>) -> Result<[u16; 2]> {
    let ports = match ns {
        Some(ns) => ns.enter(|| crate::free_tcp_ports(2))?,
        None => crate::free_tcp_ports(2)?,
    };
    Ok([ports[0], ports[1]])
}
