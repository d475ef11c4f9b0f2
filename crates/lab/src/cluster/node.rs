//! One Kubernetes node: a lab host's network namespace plus a private mount namespace in which
//! its own containerd and kubelet run.

use super::cgroups::CgroupRoot;
use super::image::Image;
use super::node_config::{self, KUBELET_SYSCTLS};
use crate::kube::{kube_part, KubeApiServer};
use crate::proc::{last_lines, run, temp_prefix, Proc};
use anyhow::{bail, Context, Result};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// The mounts take milliseconds; containerd starts in about a second on an idle machine.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Enough of a log to see why something failed.
pub(super) const TAIL_LINES: usize = 30;
const CTR_NAMESPACE: &str = "k8s.io";

/// A node of a [`super::Cluster`]: Node `name` at `ip`. Everything it started (its pods
/// included) is ended and its state removed on Drop.
#[derive(Debug)]
pub struct KubeNode {
    pub name: String,
    pub ip: Ipv4Addr,
    netns: String,
    // Drop order: the kubelet (it would restart what dies), then what its pods left, then
    // containerd and its shims, then the namespace holder, then the state they all wrote.
    kubelet: Option<Proc>,
    cgroups: Option<CgroupRoot>,
    containerd: Option<Proc>,
    holder: Option<Proc>,
    state: TempDir,
}

impl KubeNode {
    /// Makes the node's mount namespace in network namespace `netns`, starts containerd with
    /// `pause` as its sandbox image, imports it and `images`, and starts the kubelet, which
    /// registers Node `name` at `ip` with `api`.
    pub(super) fn start(
        name: &str,
        ip: Ipv4Addr,
        netns: &str,
        api: &KubeApiServer,
        pause: &Image,
        images: &[Image],
    ) -> Result<KubeNode> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let state = tempfile::Builder::new()
            .prefix(&format!("{}{name}-", temp_prefix()))
            .tempdir()?;
        let cgroup = format!(
            "{}{}-{name}",
            temp_prefix(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let mut node = KubeNode {
            name: name.into(),
            ip,
            netns: netns.into(),
            kubelet: None,
            cgroups: Some(CgroupRoot::create(&cgroup)?),
            containerd: None,
            holder: None,
            state,
        };
        node.write_config(api, pause)?;
        node.hold_mount_namespace()?;
        node.start_containerd()?;
        for image in std::iter::once(pause).chain(images) {
            node.import(image)?;
        }
        node.start_kubelet()?;
        Ok(node)
    }

    /// Where the node's own `path` (under one of its private directories: /run, /etc/cni/net.d,
    /// /opt/cni/bin, /var/lib/kubelet, ...) is seen from the host.
    pub fn path(&self, path: &str) -> PathBuf {
        self.state.path().join(path.trim_start_matches('/'))
    }

    /// The lab namespace the node's network lives in.
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// The last lines the kubelet logged.
    pub fn kubelet_log(&self) -> String {
        tail(self.kubelet.as_ref(), TAIL_LINES)
    }

    /// The last lines containerd logged.
    pub fn containerd_log(&self) -> String {
        tail(self.containerd.as_ref(), TAIL_LINES)
    }

    /// Which of the node's processes ended, with their last lines; empty while all run.
    pub(super) fn failures(&mut self) -> String {
        let mut failures = String::new();
        for (part, proc) in [
            ("kubelet", &mut self.kubelet),
            ("containerd", &mut self.containerd),
            ("the mount namespace holder", &mut self.holder),
        ] {
            let Some(proc) = proc.as_mut() else {
                continue;
            };
            if !proc.is_running() {
                let log = tail(Some(proc), TAIL_LINES);
                failures.push_str(&format!("{part} of {} ended:\n{log}\n", self.name));
            }
        }
        failures
    }

    /// Runs `ctr -n k8s.io ARGS` against the node's containerd; its stdout.
    pub fn ctr(&self, args: &[&str]) -> Result<String> {
        let socket = self.path("/run/containerd/containerd.sock");
        run(Command::new("ctr")
            .arg("--address")
            .arg(socket)
            .args(["--namespace", CTR_NAMESPACE])
            .args(args))
    }

    /// The pid of container `id` (a pod status's containerID without `containerd://`).
    pub fn container_pid(&self, id: &str) -> Result<u32> {
        let tasks = self.ctr(&["tasks", "ls"])?;
        tasks
            .lines()
            .find_map(|line| {
                let mut fields = line.split_whitespace();
                (fields.next() == Some(id)).then(|| fields.next()?.parse().ok())?
            })
            .with_context(|| format!("no running task {id} on {}:\n{tasks}", self.name))
    }

    /// A command run inside the node: its network and mount namespaces.
    fn command(&self, program: &str, args: &[&str]) -> Result<Command> {
        let holder = self
            .holder
            .as_ref()
            .context("the node has no mount namespace")?;
        let mut cmd = Command::new("nsenter");
        cmd.args([
            "--target",
            &holder.pid().to_string(),
            "--mount",
            "--net",
            "--",
        ])
        .arg(program)
        .args(args);
        Ok(cmd)
    }

    fn write_config(&self, api: &KubeApiServer, pause: &Image) -> Result<()> {
        let cgroup_root = self
            .cgroups
            .as_ref()
            .map(CgroupRoot::path)
            .unwrap_or_default();
        let sysctls = self.state.path().join("sysctl");
        std::fs::create_dir_all(&sysctls)?;
        for (key, value) in KUBELET_SYSCTLS {
            std::fs::write(sysctls.join(node_config::sysctl_file(key)), value)?;
        }
        let write = |file: &str, text: String| {
            let path = self.state.path().join(file);
            std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
        };
        write("containerd.toml", node_config::containerd_toml(&pause.name))?;
        write(
            "kubelet.yaml",
            node_config::kubelet_yaml(&cgroup_root, api.ca_file()),
        )?;
        let subject = format!("/O=system:nodes/CN=system:node:{}", self.name);
        api.write_cert_kubeconfig(&self.state.path().join("kubelet.kubeconfig"), &subject)?;
        // The CNI plugins a network add-on delegates to (flannel's: bridge, host-local,
        // portmap) and containerd's loopback, where a node image has them.
        let cni_bin = self.path("/opt/cni/bin");
        std::fs::create_dir_all(&cni_bin)?;
        for plugin in std::fs::read_dir(CNI_PLUGINS)
            .context(CNI_PLUGINS)?
            .flatten()
        {
            std::fs::copy(plugin.path(), cni_bin.join(plugin.file_name()))?;
        }
        Ok(())
    }

    fn hold_mount_namespace(&mut self) -> Result<()> {
        let script = node_config::mount_script(self.state.path());
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.netns))
            .args(["--", "unshare", "--mount", "--propagation", "private"])
            .args(["--", "sh", "-c", &script]);
        let holder = self.holder.insert(Proc::spawn(cmd)?);
        let mounted = self.state.path().join("mounted");
        wait_until(holder, "making the node's mount namespace", || {
            Ok(mounted.exists())
        })
    }

    fn start_containerd(&mut self) -> Result<()> {
        let config = self.state.path().join("containerd.toml");
        let cmd = self.command("containerd", &["--config", &config.to_string_lossy()])?;
        let socket = self.path("/run/containerd/containerd.sock");
        let containerd = self.containerd.insert(Proc::spawn(cmd)?);
        wait_until(containerd, "containerd's socket", || Ok(socket.exists()))
    }

    fn import(&self, image: &Image) -> Result<()> {
        let archive = image.archive.to_string_lossy();
        self.ctr(&["images", "import", &archive])
            .with_context(|| format!("cannot import {} into {}", image.name, self.name))?;
        Ok(())
    }

    fn start_kubelet(&mut self) -> Result<()> {
        let file = |name: &str| self.state.path().join(name).to_string_lossy().into_owned();
        let args = [
            format!("--config={}", file("kubelet.yaml")),
            format!("--kubeconfig={}", file("kubelet.kubeconfig")),
            format!("--hostname-override={}", self.name),
            format!("--node-ip={}", self.ip),
            "--v=2".into(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let cmd = self.command(&kube_part("kubelet")?.to_string_lossy(), &args)?;
        self.kubelet = Some(Proc::spawn(cmd)?);
        Ok(())
    }

    /// Every process still in the node's mount namespace: containerd's shims outlive it.
    fn kill_mount_namespace(&self) {
        let Some(holder) = self.holder.as_ref() else {
            return;
        };
        let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
        let Some(mine) = ns(&holder.pid().to_string()) else {
            return;
        };
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        for entry in entries.flatten() {
            let pid = entry.file_name().to_string_lossy().into_owned();
            if let Ok(number) = pid.parse::<u32>() {
                if number != holder.pid() && ns(&pid).as_ref() == Some(&mine) {
                    crate::proc::signal(number, nix::sys::signal::Signal::SIGKILL);
                }
            }
        }
    }
}

impl Drop for KubeNode {
    fn drop(&mut self) {
        drop(self.kubelet.take());
        drop(self.cgroups.take());
        drop(self.containerd.take());
        self.kill_mount_namespace();
        drop(self.holder.take());
    }
}

/// Debian's containernetworking-plugins.
const CNI_PLUGINS: &str = "/usr/lib/cni";
/// How often a start is looked at.
const POLL: Duration = Duration::from_millis(50);

/// Waits for `done` while `proc` runs, within [`START_TIMEOUT`].
fn wait_until(proc: &mut Proc, what: &str, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if done()? {
            return Ok(());
        }
        if let Some(status) = proc.wait_timeout(Duration::ZERO)? {
            bail!(
                "{what}: the process ended ({status}):\n{}",
                tail(Some(proc), TAIL_LINES)
            );
        }
        if Instant::now() > deadline {
            bail!(
                "{what}: not within {START_TIMEOUT:?}:\n{}",
                tail(Some(proc), TAIL_LINES)
            );
        }
        std::thread::sleep(POLL);
    }
}

/// The last `lines` lines of what `proc` wrote to stderr.
pub(super) fn tail(proc: Option<&Proc>, lines: usize) -> String {
    last_lines(&proc.map(Proc::stderr).unwrap_or_default(), lines)
}
