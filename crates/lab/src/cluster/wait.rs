//! Waiting on the cluster, bounded, and saying what was waited for when it does not come: the
//! Nodes, the pods and their container states, the latest events, and each kubelet's and
//! containerd's last lines.

use super::node::TAIL_LINES;
use super::node_config::KUBELET_EVICTS_BELOW;
use super::Cluster;
use anyhow::{bail, Result};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams};
use std::fmt::Write;
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(500);
/// The latest events a diagnosis shows.
const EVENTS: usize = 40;
/// The last lines of each unready container's log a diagnosis shows.
const POD_LOG_LINES: usize = 20;

impl Cluster {
    /// Calls `check` every half second until it gives Some, for at most `timeout`. On timeout,
    /// or as soon as a process of the cluster has ended, the error names `what`, the last error
    /// `check` gave, and [`Cluster::diagnose`]'s report.
    pub fn wait_for<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&Cluster) -> Result<Option<T>>,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        let mut last_error = None;
        loop {
            match check(self) {
                Ok(Some(value)) => return Ok(value),
                Ok(None) => {}
                Err(e) => last_error = Some(format!("{e:#}")),
            }
            let ended = self.ended();
            if !ended.is_empty() || Instant::now() > deadline {
                let why = match ended.is_empty() {
                    true => format!("not within {timeout:?}"),
                    false => "a process of the cluster ended".into(),
                };
                let last = last_error.map(|e| format!(" (last error: {e})"));
                bail!(
                    "{what}: {why}{}\n{}",
                    last.unwrap_or_default(),
                    self.diagnose()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits until every Node has registered and node IPAM has given it a podCIDR; the podCIDRs
    /// in node order.
    pub(super) fn wait_pod_cidrs(&mut self, timeout: Duration) -> Result<Vec<String>> {
        let names: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
        self.wait_for("every Node registered with a podCIDR", timeout, |c| {
            let nodes = c.list_nodes()?;
            let cidr = |name: &String| {
                let node = nodes
                    .iter()
                    .find(|n| n.metadata.name.as_ref() == Some(name))?;
                node.spec.as_ref()?.pod_cidr.clone()
            };
            Ok(names.iter().map(cidr).collect())
        })
    }

    /// Waits until every Node is Ready.
    pub fn wait_nodes_ready(&mut self, timeout: Duration) -> Result<()> {
        let count = self.nodes.len();
        self.wait_for("every Node Ready", timeout, |c| {
            let nodes = c.list_nodes()?;
            let ready = nodes
                .iter()
                .filter(|n| condition(n, "Ready") == Some("True"));
            Ok((nodes.len() == count && ready.count() == count).then_some(()))
        })
    }

    /// Waits until DaemonSet `namespace/name` has rolled out, as `kubectl rollout status` sees
    /// it: a pod on every node, all of the current template, all Ready and available (Ready
    /// for the DaemonSet's minReadySeconds).
    pub fn wait_daemonset(&mut self, namespace: &str, name: &str, timeout: Duration) -> Result<()> {
        let count = self.nodes.len() as i32;
        let what = format!("DaemonSet {namespace}/{name} Ready on every node");
        self.wait_for(&what, timeout, |c| {
            let ds = c.api.block_on(|client| async move {
                Ok(Api::<DaemonSet>::namespaced(client, namespace)
                    .get(name)
                    .await?)
            })?;
            let generation = ds.metadata.generation.unwrap_or_default();
            let Some(status) = ds.status else {
                return Ok(None);
            };
            let done = status.observed_generation.unwrap_or_default() >= generation
                && status.desired_number_scheduled == count
                && status.updated_number_scheduled == Some(count)
                && status.number_ready == count
                && status.number_available == Some(count);
            Ok(done.then_some(()))
        })
    }

    /// Waits until pod `namespace/name` is Ready; the pod then.
    pub fn wait_pod_ready(
        &mut self,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<Pod> {
        let what = format!("pod {namespace}/{name} Ready");
        self.wait_for(&what, timeout, |c| {
            let pod = c.pod(namespace, name)?;
            let ready = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|conditions| {
                    conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                });
            Ok(ready.then_some(pod))
        })
    }

    /// What the cluster looks like, for a failure message: parts of the control plane that
    /// stopped, every Node and pod, the latest events, and each node's kubelet and containerd
    /// logs' last lines.
    pub fn diagnose(&mut self) -> String {
        let mut report = self.ended();
        match self.describe_objects() {
            Ok(text) => report.push_str(&text),
            Err(e) => {
                let _ = writeln!(report, "cannot read the cluster's objects: {e:#}");
            }
        }
        for node in &self.nodes {
            let _ = writeln!(
                report,
                "--- kubelet of {} (last {TAIL_LINES} lines) ---\n{}\n\
                 --- containerd of {} ---\n{}",
                node.name,
                node.kubelet_log(),
                node.name,
                node.containerd_log()
            );
        }
        report
    }

    /// Which process of the cluster ended, with its last lines; empty while all run.
    fn ended(&mut self) -> String {
        let mut ended = self.control.failures();
        for node in &mut self.nodes {
            ended.push_str(&node.failures());
        }
        ended
    }

    fn list_nodes(&self) -> Result<Vec<Node>> {
        self.api.block_on(|client| async move {
            Ok(Api::<Node>::all(client)
                .list(&ListParams::default())
                .await?
                .items)
        })
    }

    fn describe_objects(&self) -> Result<String> {
        let (pods, mut events) = self.api.block_on(|client| async move {
            let all = ListParams::default();
            let pods = Api::<Pod>::all(client.clone()).list(&all).await?;
            let events = Api::<Event>::all(client).list(&all).await?;
            Ok((pods.items, events.items))
        })?;
        let mut text = format!("--- Nodes ({}) ---\n", self.kubelet_disk());
        for node in self.list_nodes()? {
            let spec = node.spec.unwrap_or_default();
            let conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
            let conditions: Vec<String> = conditions
                .iter()
                .map(|c| {
                    format!(
                        "{}={} {}",
                        c.type_,
                        c.status,
                        c.message.as_deref().unwrap_or("")
                    )
                })
                .collect();
            let taints: Vec<String> = (spec.taints.unwrap_or_default().iter())
                .map(|t| format!("{}:{}", t.key, t.effect))
                .collect();
            let _ = writeln!(
                text,
                "{} podCIDR {:?} taints {taints:?}\n  {}",
                node.metadata.name.unwrap_or_default(),
                spec.pod_cidr,
                conditions.join("\n  ")
            );
        }
        text.push_str("--- Pods ---\n");
        for pod in &pods {
            text.push_str(&describe_pod(pod));
            text.push_str(&self.unready_logs(pod));
        }
        // Core events carry lastTimestamp; those written through events.k8s.io, eventTime.
        events.sort_by_key(|e| {
            let last = e.last_timestamp.as_ref().map(|t| t.0);
            last.or(e.event_time.as_ref().map(|t| t.0))
        });
        let _ = writeln!(text, "--- the latest {EVENTS} events ---");
        for event in events.iter().rev().take(EVENTS).rev() {
            let object = &event.involved_object;
            let _ = writeln!(
                text,
                "{}/{} {}: {} {} (x{})",
                object.kind.as_deref().unwrap_or(""),
                object.name.as_deref().unwrap_or(""),
                event.type_.as_deref().unwrap_or(""),
                event.reason.as_deref().unwrap_or(""),
                event.message.as_deref().unwrap_or("").trim(),
                event.count.unwrap_or(1)
            );
        }
        Ok(text)
    }
}

impl Cluster {
    /// How full the disk under the kubelets is, beside the share below which they evict and
    /// taint their nodes (node_config.rs): a host short of disk shows as pods never scheduled.
    fn kubelet_disk(&self) -> String {
        let Some(node) = self.nodes.first() else {
            return "no node".into();
        };
        let dir = node.path("/var/lib/kubelet");
        match nix::sys::statvfs::statvfs(&dir) {
            Ok(fs) => {
                let gib = |blocks: u64| (blocks * fs.fragment_size()) as f64 / (1u64 << 30) as f64;
                let (free, size) = (gib(fs.blocks_available()), gib(fs.blocks()));
                format!(
                    "the disk under the kubelets: {free:.1} GiB free of {size:.1} GiB, {:.1}%; they evict below {KUBELET_EVICTS_BELOW}",
                    free / size * 100.0
                )
            }
            Err(e) => format!("{}: {e}", dir.display()),
        }
    }

    /// The last lines of each container of `pod` that has started but is not ready.
    fn unready_logs(&self, pod: &Pod) -> String {
        let (Some(namespace), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
            return String::new();
        };
        let status = pod.status.clone().unwrap_or_default();
        let containers = status.init_container_statuses.into_iter().flatten();
        let containers = containers.chain(status.container_statuses.into_iter().flatten());
        let mut text = String::new();
        for c in containers.filter(|c| !c.ready && c.container_id.is_some()) {
            let log = self.pod_log(namespace, name, &c.name, POD_LOG_LINES as i64);
            let log = log.unwrap_or_else(|e| format!("{e:#}"));
            let _ = writeln!(text, "  --- log of {} ---\n{log}", c.name);
        }
        text
    }
}

/// `ns/name on node: phase`, then each container's state.
fn describe_pod(pod: &Pod) -> String {
    let meta = &pod.metadata;
    let status = pod.status.clone().unwrap_or_default();
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let mut text = format!(
        "{}/{} on {}: {} {}\n",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or(""),
        node.as_deref().unwrap_or("(unscheduled)"),
        status.phase.as_deref().unwrap_or(""),
        status.message.as_deref().unwrap_or("")
    );
    let containers = status.init_container_statuses.into_iter().flatten();
    for c in containers.chain(status.container_statuses.into_iter().flatten()) {
        let state = c.state.unwrap_or_default();
        let state = match (state.running, state.waiting, state.terminated) {
            (Some(_), _, _) => "running".to_string(),
            (_, Some(w), _) => format!(
                "waiting {} {}",
                w.reason.unwrap_or_default(),
                w.message.unwrap_or_default()
            ),
            (_, _, Some(t)) => format!(
                "terminated {} (exit {}) {}",
                t.reason.unwrap_or_default(),
                t.exit_code,
                t.message.unwrap_or_default()
            ),
            _ => "unknown".to_string(),
        };
        let _ = writeln!(
            text,
            "  {}: {state}, ready {}, restarts {}",
            c.name, c.ready, c.restart_count
        );
    }
    text
}

/// The status of a Node's condition `type_`.
fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a str> {
    let conditions = node.status.as_ref()?.conditions.as_ref()?;
    let found = conditions.iter().find(|c| c.type_ == type_)?;
    Some(found.status.as_str())
}
