//! The compared paths. Each gets its own two-host lab, set up the way that path runs for real:
//! kernel paths with the `ip` commands flannel's backends amount to, twill with its own binary;
//! dual-stack (an IPv6 underlay, containers and network beside the IPv4 ones) when IPv6 is
//! measured on a path that carries it.

use crate::addressing::{pairs, subnet, subnet6, Family, NETWORK, NETWORK6, UNDERLAY_MTU};
use crate::endpoints::Ipv6End;
use crate::kernel_paths::{host_gw, ipip, vxlan, IPIP_MTU, VXLAN6_DEV};
pub use crate::kind::PathKind;
use crate::measure::{Endpoints, Servers};
use crate::parse;
use crate::wireguard_go;
use anyhow::{bail, ensure, Context, Result};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use twill_lab::{Etcd, Host, Ipv4Net, Ipv6Net, Lab, LabSpec, Proc, WireguardGo};

/// Per host namespace, so both hosts use the same address.
pub(crate) const TWILL_STATUS: &str = "127.0.0.1:9585";
/// `twill run`'s TUN (its default `--tun-name`): what the udp and batch engines write to.
const TWILL_TUN: &str = "twill0";
/// The device of twill-wireguard's IPv6 (flannel's default Mode separate).
const WIREGUARD6_DEV: &str = "flannel-wg-v6";
const TWILL_READY_TIMEOUT: Duration = Duration::from_secs(20);

/// The twill binary the twill paths run, and extra `twill run` arguments (e.g. `--no-offload`).
#[derive(Debug, Clone)]
pub struct Twill {
    pub binary: PathBuf,
    pub args: Vec<String>,
}

impl Twill {
    /// The same binary and arguments, and `more` after them.
    pub fn with_args(&self, more: &[&str]) -> Twill {
        let args = self.args.iter().cloned();
        Twill {
            binary: self.binary.clone(),
            args: args.chain(more.iter().map(|a| a.to_string())).collect(),
        }
    }

    /// `twill run` on `host` against `etcd`, with its status server on [`TWILL_STATUS`], logs
    /// without colour, and `env` besides.
    pub fn spawn(
        &self,
        host: &Host,
        etcd: &str,
        subnet_file: &Path,
        env: &[(&str, &str)],
    ) -> Result<Proc> {
        self.spawn_path(host, etcd, &[], subnet_file, env)
    }

    /// [`Twill::spawn`] with a path's own arguments (`extra`).
    fn spawn_path(
        &self,
        host: &Host,
        etcd: &str,
        extra: &[&str],
        subnet_file: &Path,
        env: &[(&str, &str)],
    ) -> Result<Proc> {
        let mut registry = vec!["--etcd-endpoints", etcd];
        registry.extend_from_slice(extra);
        self.spawn_with(host, &registry, subnet_file, env)
    }

    /// `twill run --kube-subnet-mgr` on `host` as Node `node_name`, reaching the API server
    /// through `kubeconfig`, with the network config `net_conf`; otherwise as [`Twill::spawn`].
    pub fn spawn_kube(
        &self,
        host: &Host,
        kubeconfig: &Path,
        net_conf: &Path,
        node_name: &str,
        subnet_file: &Path,
    ) -> Result<Proc> {
        let (kubeconfig, net_conf) = (kubeconfig.to_string_lossy(), net_conf.to_string_lossy());
        let registry = [
            "--kube-subnet-mgr",
            "--kubeconfig-file",
            &kubeconfig,
            "--net-config-path",
            &net_conf,
        ];
        let env = [("NODE_NAME", node_name)];
        self.spawn_with(host, &registry, subnet_file, &env)
    }

    /// `twill run` with `registry`'s flags (where the leases come from) and the common ones.
    fn spawn_with(
        &self,
        host: &Host,
        registry: &[&str],
        subnet_file: &Path,
        env: &[(&str, &str)],
    ) -> Result<Proc> {
        let file = subnet_file.to_string_lossy();
        let mut args = vec!["run"];
        args.extend_from_slice(registry);
        args.extend([
            "--iface",
            &host.iface,
            "--subnet-file",
            &file,
            "--status-addr",
            TWILL_STATUS,
        ]);
        args.extend(self.args.iter().map(String::as_str));
        let env: Vec<_> = [("NO_COLOR", "1")]
            .into_iter()
            .chain(env.iter().copied())
            .collect();
        host.ns
            .spawn_with(&self.binary.to_string_lossy(), &args, &env)
    }
}

/// Fails with twill's own last words once the daemon has exited.
pub(crate) fn still_running(daemon: &mut Proc) -> Result<()> {
    if let Some(status) = daemon.wait_timeout(Duration::ZERO)? {
        let stderr = daemon.stderr();
        let last = stderr.lines().rev().find(|l| !l.trim().is_empty());
        bail!("twill exited ({status}): {}", last.unwrap_or("no output"));
    }
    Ok(())
}

/// A path ready to measure: its lab, the daemons forwarding through it and the servers at the
/// far end. Everything stops and disappears on drop.
pub struct PathLab {
    kind: PathKind,
    /// Set up dual-stack: the underlay, the containers and the path carry IPv6 too.
    ipv6: bool,
    // Drop order: processes stop before the namespaces they run in are deleted.
    servers: Servers,
    daemons: Vec<Proc>,
    wireguard_go: Vec<WireguardGo>,
    _etcd: Option<Etcd>,
    lab: Lab,
    _files: tempfile::TempDir,
}

impl PathLab {
    /// The path's lab; `ipv6` sets it up dual-stack, which a path that carries no IPv6 refuses.
    pub fn new(kind: PathKind, twill: &Twill, ipv6: bool) -> Result<PathLab> {
        if let (true, Some(why)) = (ipv6, kind.no_ipv6()) {
            bail!("{kind} cannot be set up dual-stack: {why}");
        }
        let families: &[Family] = match ipv6 {
            true => &[Family::V4, Family::V6],
            false => &[Family::V4],
        };
        let mut lab = Lab::new(LabSpec {
            hosts: 2,
            underlay_mtu: UNDERLAY_MTU,
            tag: kind.name().replace('-', ""),
        })?;
        if ipv6 {
            lab = lab.with_ipv6_underlay()?;
        }
        // native runs host to host; every other path carries container traffic.
        if kind != PathKind::Native {
            for i in 0..2 {
                let host = lab.host_mut(i);
                match ipv6 {
                    true => host.add_dual_stack_container(subnet(i), subnet6(i))?,
                    false => host.add_container(subnet(i))?,
                };
            }
        }
        let files = tempfile::tempdir()?;
        let mut etcd = None;
        let mut go_daemons = Vec::new();
        let (daemons, container_mtu) = match kind {
            PathKind::Native => (Vec::new(), None),
            PathKind::HostGw => {
                host_gw(&lab, families)?;
                (Vec::new(), None)
            }
            PathKind::Vxlan => (Vec::new(), Some(vxlan(&lab, families)?)),
            PathKind::Ipip => {
                ipip(&lab)?;
                (Vec::new(), Some(IPIP_MTU))
            }
            PathKind::TwillUdp
            | PathKind::TwillEbpf
            | PathKind::TwillEbpfTc
            | PathKind::TwillEbpfXdp
            | PathKind::TwillEbpfTun
            | PathKind::TwillEbpfUnderlay6
            | PathKind::TwillBatch
            | PathKind::TwillWireguard => {
                let etcd = etcd.insert(etcd_for(&lab)?);
                start_twill(&lab, twill, kind, files.path(), etcd, ipv6)?
            }
            PathKind::WireguardGo => {
                go_daemons = wireguard_go::start(&lab, files.path())?;
                (Vec::new(), Some(wireguard_go::MTU))
            }
        };
        if let Some(mtu) = container_mtu {
            set_container_mtu(&lab, mtu)?;
        }
        let servers = Servers::start(endpoints(&lab).server)?;
        Ok(PathLab {
            kind,
            ipv6,
            servers,
            daemons,
            wireguard_go: go_daemons,
            _etcd: etcd,
            lab,
            _files: files,
        })
    }

    pub fn endpoints(&self) -> Endpoints<'_> {
        let daemons = self.daemons.iter().map(Proc::pid);
        let go = self.wireguard_go.iter().map(WireguardGo::pid);
        Endpoints {
            processes: daemons.chain(go).chain(self.servers.pids()).collect(),
            ipv6: self.ipv6_end(),
            ..endpoints(&self.lab)
        }
    }

    /// Whether the lab was set up dual-stack.
    pub fn has_ipv6(&self) -> bool {
        self.ipv6
    }

    /// The server's IPv6 address and the device where the path's IPv6 reaches the server's
    /// host: the tunnel's (vxlan) or the TUN twill writes to, else the underlay iface (native
    /// and host-gw route IPv6 as it is). None on a lab set up without IPv6.
    fn ipv6_end(&self) -> Option<Ipv6End<'_>> {
        let host = self.lab.host(1);
        let server_ip = match host.containers().first() {
            Some(container) => container.ipv6?,
            None => host.underlay_ipv6?,
        };
        let device = match self.kind {
            PathKind::Vxlan => VXLAN6_DEV,
            PathKind::TwillUdp | PathKind::TwillBatch => TWILL_TUN,
            PathKind::TwillWireguard => WIREGUARD6_DEV,
            _ => &host.iface,
        };
        Some(Ipv6End {
            server_ip,
            device: (&host.ns, device),
        })
    }

    /// `ping` output from client to server (the demo shows it); Err when no reply came.
    pub fn ping(&self) -> Result<String> {
        let ends = self.endpoints();
        let ip = ends.server_ip.to_string();
        // -w bounds the whole run even when nothing answers.
        ends.client
            .exec("ping", &["-c", "3", "-i", "0.2", "-w", "5", &ip])
    }
}

/// Host to host for native (no containers); container to container otherwise. No processes
/// and no IPv6 yet: [`PathLab::endpoints`] adds them.
fn endpoints(lab: &Lab) -> Endpoints<'_> {
    let server_host = lab.host(1);
    let client_host = lab.host(0);
    let underlay = (&client_host.ns, client_host.iface.as_str());
    match (
        lab.host(0).containers().first(),
        server_host.containers().first(),
    ) {
        (Some(client), Some(server)) => Endpoints {
            client: &client.ns,
            server: &server.ns,
            server_ip: server.ip,
            underlay,
            processes: Vec::new(),
            ipv6: None,
        },
        _ => Endpoints {
            client: &lab.host(0).ns,
            server: &server_host.ns,
            server_ip: server_host.underlay_ip,
            underlay,
            processes: Vec::new(),
            ipv6: None,
        },
    }
}

/// Containers get the overlay MTU on both veth ends, as docker does with `--mtu=$FLANNEL_MTU`.
fn set_container_mtu(lab: &Lab, mtu: u32) -> Result<()> {
    let mtu = mtu.to_string();
    for host in &lab.hosts {
        for c in host.containers() {
            c.ns.ip(&["link", "set", &c.iface, "mtu", &mtu])?;
            host.ns.ip(&["link", "set", &c.host_iface, "mtu", &mtu])?;
        }
    }
    Ok(())
}

/// A real etcd on host 0's underlay address, as flannel deployments have one.
fn etcd_for(lab: &Lab) -> Result<Etcd> {
    let host = lab.host(0);
    Etcd::listening(Some(&host.ns), host.underlay_ip)
}

/// `twill run --etcd-endpoints` on both hosts with `backend` in the network config (dual-stack
/// with `ipv6`); returns the daemons and the MTU they wrote to the subnet file (the containers'
/// MTU). The subnet files are written first, so each node takes the subnets its container was
/// given, as a restarted flannel node takes its old ones.
fn start_twill(
    lab: &Lab,
    twill: &Twill,
    kind: PathKind,
    dir: &Path,
    etcd: &Etcd,
    ipv6: bool,
) -> Result<(Vec<Proc>, Option<u32>)> {
    let backend = kind.twill_backend().context("a twill path")?;
    ensure!(
        twill.binary.is_file(),
        "no twill binary at {} (cargo build --release)",
        twill.binary.display()
    );
    let dual_stack = match ipv6 {
        true => format!(r#","EnableIPv6":true,"IPv6Network":"{NETWORK6}""#),
        false => String::new(),
    };
    let fields = kind.backend_fields();
    let config = format!(
        r#"{{"Network":"{NETWORK}"{dual_stack},"Backend":{{"Type":"{backend}"{fields}}}}}"#
    );
    etcd.etcdctl(&["put", "/coreos.com/network/config", &config])?;
    let endpoint = etcd.endpoint();
    let files: Vec<_> = (0..2)
        .map(|i| dir.join(format!("subnet-{i}.env")))
        .collect();
    let mut daemons = Vec::new();
    for (i, host, _) in pairs(lab) {
        std::fs::write(&files[i], leased_before(i, ipv6)?)?;
        // The wireguard backend's key; each host needs its own (they share the filesystem).
        let key = dir.join(format!("wgkey-{i}"));
        let env = [("WIREGUARD_KEY_FILE", &*key.to_string_lossy())];
        let extra = kind.twill_args(i);
        daemons.push(twill.spawn_path(host, &endpoint, extra, &files[i], &env)?);
    }
    for ((_, host, _), (daemon, file)) in pairs(lab).into_iter().zip(daemons.iter_mut().zip(&files))
    {
        wait_twill_ready(host, daemon, &twill.binary, file)?;
    }
    // Ready means the lease is written; wait until each node also follows the other's.
    for (_, host, _) in pairs(lab) {
        wait_peer_known(host, &twill.binary)?;
    }
    let mtu = parse::subnet_env_mtu(&std::fs::read_to_string(&files[0])?)?;
    Ok((daemons, Some(mtu)))
}

/// A subnet file naming host `i`'s subnets (both families' with `ipv6`) by their first host
/// address, as flanneld writes it.
fn leased_before(i: usize, ipv6: bool) -> Result<String> {
    let first = Ipv4Net::new(subnet(i).hosts().next().context("subnet")?, 24)?;
    let mut text = format!("FLANNEL_SUBNET={first}\n");
    if ipv6 {
        let first6 = u128::from(subnet6(i).network()) + 1;
        let first6 = Ipv6Net::new(first6.into(), subnet6(i).prefix_len())?;
        text += &format!("FLANNEL_IPV6_SUBNET={first6}\n");
    }
    Ok(text)
}

fn wait_peer_known(host: &Host, twill: &Path) -> Result<()> {
    let deadline = Instant::now() + TWILL_READY_TIMEOUT;
    let twill = twill.to_string_lossy();
    loop {
        let status = host.ns.exec(&twill, &["status", "--addr", TWILL_STATUS])?;
        let status: serde_json::Value = serde_json::from_str(&status)?;
        if status["peers"].as_array().is_some_and(|p| !p.is_empty()) {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "twill never learned its peer from etcd"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Ready = subnet file written and the status endpoint answering; a daemon that exits first
/// makes the path unavailable with twill's own last words as the reason.
fn wait_twill_ready(host: &Host, daemon: &mut Proc, twill: &Path, file: &Path) -> Result<()> {
    let deadline = Instant::now() + TWILL_READY_TIMEOUT;
    let twill = twill.to_string_lossy();
    loop {
        still_running(daemon)?;
        if file.exists()
            && host
                .ns
                .exec(&twill, &["status", "--addr", TWILL_STATUS])
                .is_ok()
        {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "twill not ready after {TWILL_READY_TIMEOUT:?}: {}",
            daemon.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
