use crate::netns::{command_in, Netns};
use crate::proc::run;
use crate::proc::{temp_prefix, Proc};
use anyhow::{bail, Result};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};
use tempfile::TempDir;

const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Another process may take a probed port before etcd binds it; new ports are tried then.
const START_ATTEMPTS: usize = 3;

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
        let mut etcd = Etcd {
            proc: None,
            ns: ns.map(|ns| ns.name().to_string()),
            ip,
            client_port: 0,
            peer_port: 0,
            dir: tempfile::Builder::new().prefix(&temp_prefix()).tempdir()?,
        };
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

    /// `http://IP:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}:{}", self.ip, self.client_port)
    }

    /// Runs `etcdctl --endpoints <endpoint> args...` in etcd's namespace and returns stdout.
    pub fn etcdctl(&self, args: &[&str]) -> Result<String> {
        let endpoints = format!("--endpoints={}", self.endpoint());
        let mut all = vec![
            endpoints.as_str(),
            "--dial-timeout=1s",
            "--command-timeout=2s",
        ];
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
        [
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
        .into()
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
            if self.etcdctl(&["endpoint", "health"]).is_ok() {
                return Ok(());
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
