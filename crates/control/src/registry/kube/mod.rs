//! Leases from Kubernetes, as flanneld's `--kube-subnet-mgr` has them: this node's subnets are
//! its Node's podCIDRs (assigned by the controller manager; twill never allocates), an IPv4 one
//! and, on a dual-stack network, an IPv6 one; the peers are the other Nodes that carry
//! flannel's annotations, and the network config is `net-conf.json` from a ConfigMap.

mod annotations;
mod client;
mod follow;
mod history;
mod node_cidrs;
mod node_view;
mod own_node;
mod publish;
mod remembered;
mod watch_pace;

pub use annotations::{Annotations, NodeLease, DEFAULT_PREFIX};

use super::{Backoff, Registry, Remembered, EVENT_QUEUE};
use crate::config::Config;
use crate::lease::{Lease, LeaseAttrs};
use crate::lease::{LeaseEvent, LeaseNamer};
use anyhow::{anyhow, Context};
use client::Failure;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use node_view::NodeView;
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::mpsc;

/// flanneld's `--net-config-path` default.
pub const DEFAULT_NET_CONFIG_PATH: &str = "/etc/kube-flannel/net-conf.json";

/// flanneld's Kubernetes flags and environment.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// `--kube-api-url`: the API server, overriding the kubeconfig's or the pod's.
    pub api_url: Option<String>,
    /// `--kubeconfig-file`; without it (and without `api_url`), the pod's service account.
    pub kubeconfig: Option<PathBuf>,
    /// `--kube-annotation-prefix`.
    pub annotation_prefix: String,
    /// `--net-config-path`: flannel's network config, as the ConfigMap mounts it.
    pub net_config_path: PathBuf,
    /// Which Node this is.
    pub node: NodeIdentity,
    /// How many Node events may wait for the node (flanneld's `EVENT_QUEUE_DEPTH`).
    pub event_queue: usize,
    /// `--set-node-network-unavailable`: mark the Node's network available once forwarding.
    pub set_network_available: bool,
    pub timing: KubeTiming,
}

/// What flanneld's Kubernetes mode reads from its environment besides the flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeEnv {
    pub node: NodeIdentity,
    pub event_queue: usize,
}

/// The most Node events twill lets wait: at ~1 KB a lease, a queue this long is a gigabyte.
const MAX_EVENT_QUEUE: usize = 1_000_000;

impl KubeEnv {
    /// `NODE_NAME` (or `POD_NAME` and `POD_NAMESPACE`) and `EVENT_QUEUE_DEPTH`, read as
    /// flanneld reads them; `CONT_WHEN_CACHE_NOT_READY` is taken and said to be unneeded.
    pub fn read(get: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<KubeEnv> {
        let event_queue = match get("EVENT_QUEUE_DEPTH").filter(|v| !v.is_empty()) {
            None => EVENT_QUEUE,
            Some(text) => match text.parse::<i64>() {
                Ok(n) if n <= 0 => EVENT_QUEUE,
                Ok(n) if n as u64 <= MAX_EVENT_QUEUE as u64 => n as usize,
                _ => anyhow::bail!(
                    "EVENT_QUEUE_DEPTH={text:?} is not a number of events from 1 to \
                     {MAX_EVENT_QUEUE}"
                ),
            },
        };
        if let Some(value) = get("CONT_WHEN_CACHE_NOT_READY").filter(|v| !v.is_empty()) {
            tracing::info!(
                "CONT_WHEN_CACHE_NOT_READY={value} is not needed: twill has no start timeout to \
                 continue past; it waits for the API server while /readyz says so"
            );
        }
        Ok(KubeEnv {
            node: NodeIdentity::from_env(get)?,
            event_queue,
        })
    }
}

/// How the node finds its Node object, in flanneld's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeIdentity {
    /// `NODE_NAME`.
    Name(String),
    /// `POD_NAME` and `POD_NAMESPACE`: the Node the pod is scheduled on.
    Pod { namespace: String, name: String },
}

impl NodeIdentity {
    /// From flanneld's environment variables; a clear error when neither way is set.
    pub fn from_env(get: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<NodeIdentity> {
        let set = |name: &str| get(name).filter(|v| !v.is_empty());
        if let Some(name) = set("NODE_NAME") {
            return Ok(NodeIdentity::Name(name));
        }
        match (set("POD_NAMESPACE"), set("POD_NAME")) {
            (Some(namespace), Some(name)) => Ok(NodeIdentity::Pod { namespace, name }),
            _ => Err(anyhow!(
                "--kube-subnet-mgr needs this node's name: set NODE_NAME (or POD_NAME and \
                 POD_NAMESPACE, as the DaemonSet does)"
            )),
        }
    }
}

/// The registry's intervals; tests shorten them.
#[derive(Debug, Clone)]
pub struct KubeTiming {
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Connecting to and sending one request to the API server.
    pub request_timeout: Duration,
}

impl Default for KubeTiming {
    fn default() -> Self {
        KubeTiming {
            backoff_min: Duration::from_millis(200),
            backoff_max: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
        }
    }
}

impl KubeTiming {
    fn backoff(&self) -> Backoff {
        Backoff::new(self.backoff_min, self.backoff_max)
    }
}

/// A client for the API server, with the network config read and this node's name known.
pub struct KubeRegistry {
    client: Client,
    config: Config,
    node_name: String,
    annotations: Annotations,
    opts: KubeOptions,
}

impl KubeRegistry {
    /// Reads net-conf.json and builds the client. With `POD_NAME`, asks the API server which
    /// Node the pod runs on, retrying while it cannot be reached.
    pub async fn connect(opts: KubeOptions) -> anyhow::Result<KubeRegistry> {
        let annotations = Annotations::new(&opts.annotation_prefix)?;
        let config = read_net_config(&opts.net_config_path)?;
        let client = client::connect(&opts).await?;
        let node_name = match &opts.node {
            NodeIdentity::Name(name) => name.clone(),
            NodeIdentity::Pod { namespace, name } => {
                pod_node_name(&client, namespace, name, &opts.timing).await?
            }
        };
        Ok(KubeRegistry {
            client,
            config,
            node_name,
            annotations,
            opts,
        })
    }
}

/// flannel's net-conf.json, dual-stack or not ([`Config::parse`] refuses dual-stack on the
/// backends that carry no IPv6).
fn read_net_config(path: &std::path::Path) -> anyhow::Result<Config> {
    let json = crate::small_file::read_text(path, crate::small_file::CONFIG)
        .with_context(|| format!("cannot read --net-config-path {}", path.display()))?;
    Config::parse(&json).map_err(|e| anyhow!("{e} (--net-config-path {})", path.display()))
}

async fn pod_node_name(
    client: &Client,
    namespace: &str,
    name: &str,
    timing: &KubeTiming,
) -> anyhow::Result<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let what = format!("pods/{name} in namespace {namespace}");
    let pod = retry(timing, "get", &what, || pods.get(name)).await?;
    pod.spec
        .and_then(|s| s.node_name)
        .filter(|n| !n.is_empty())
        .with_context(|| format!("pod {namespace}/{name} is not scheduled on a node yet"))
}

/// Runs `request` until it succeeds, waiting out an unreachable API server with a warning per
/// attempt; a refusal (401, 403, 404, a bad request) ends it with one clear error.
async fn retry<T, F, Fut>(
    timing: &KubeTiming,
    verb: &str,
    resource: &str,
    mut request: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut backoff = timing.backoff();
    loop {
        match request().await {
            Ok(value) => return Ok(value),
            Err(e) => {
                match Failure::of(&e, verb, resource) {
                    Failure::Unreachable(why) => {
                        let delay = backoff.next_delay();
                        tracing::warn!("the Kubernetes API server is unreachable ({why}); retrying in {delay:?}");
                        tokio::time::sleep(delay).await;
                    }
                    Failure::Denied(why) | Failure::Refused(why) => return Err(anyhow!(why)),
                }
            }
        }
    }
}

impl Registry for KubeRegistry {
    fn config(&self) -> &Config {
        &self.config
    }

    fn lease_namer(&self) -> LeaseNamer {
        LeaseNamer::KubeNode
    }

    fn name(&self) -> String {
        format!("kubernetes (node {})", self.node_name)
    }

    /// The Node's `node-public-ip` annotations and the VtepMACs it published before.
    async fn remembered(&self) -> anyhow::Result<Remembered> {
        let nodes: Api<NodeView> = Api::all(self.client.clone());
        let (name, timing) = (&self.node_name, &self.opts.timing);
        let found = remembered::read(&nodes, name, &self.annotations, timing).await?;
        if let Some(ip) = found.public_ip {
            tracing::info!(
                "Node {name}'s {} annotation names the public IP {ip}",
                self.annotations.node_public_ip
            );
        }
        Ok(found)
    }

    /// Marks the Node's network available (`--set-node-network-unavailable`), once the node is
    /// ready: before, pods scheduled on it would find no subnet.env and no routes.
    fn on_ready(&self) -> Option<BoxFuture<'static, ()>> {
        if !self.opts.set_network_available {
            return None;
        }
        let nodes: Api<NodeView> = Api::all(self.client.clone());
        let (name, timing) = (self.node_name.clone(), self.opts.timing.clone());
        Some(Box::pin(async move {
            match own_node::mark_network_available(&nodes, &name, &timing).await {
                Ok(()) => tracing::info!("Node {name}: NetworkUnavailable set to False"),
                Err(e) => {
                    tracing::warn!("cannot set Node {name}'s NetworkUnavailable to False: {e:#}")
                }
            }
        }))
    }

    /// Waits for the Node's podCIDRs and publishes this node's annotations, then lists the
    /// Nodes; the watch that follows runs in the background.
    async fn start(self, attrs: LeaseAttrs) -> anyhow::Result<(Lease, mpsc::Receiver<LeaseEvent>)> {
        let nodes: Api<NodeView> = Api::all(self.client.clone());
        let own = own_node::OwnNode {
            nodes: nodes.clone(),
            name: self.node_name.clone(),
            annotations: self.annotations.clone(),
            attrs,
            config: self.config,
            timing: self.opts.timing.clone(),
        };
        let lease = own.acquire().await?;
        let (tx, rx) = mpsc::channel(self.opts.event_queue);
        let follower = follow::Follower::new(own, lease.clone(), tx);
        let watch = follower.list(nodes).await?;
        tokio::spawn(watch);
        Ok((lease, rx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dual_stack_net_conf_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("net-conf.json");
        let dual = r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/56","Backend":{"Type":"vxlan"}}"#;
        std::fs::write(&path, dual).unwrap();
        let v6 = read_net_config(&path).unwrap().ipv6.unwrap();
        assert_eq!(
            (v6.network, v6.subnet_len),
            ("fd10::/56".parse().unwrap(), 64)
        );
        // Backends without IPv6 are still refused, in one line naming the file.
        let ipip = dual.replace("vxlan", "ipip");
        std::fs::write(&path, ipip).unwrap();
        let err = read_net_config(&path).unwrap_err().to_string();
        assert!(
            !err.contains('\n') && err.contains("--net-config-path"),
            "{err}"
        );
        std::fs::write(
            &path,
            r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan"}}"#,
        )
        .unwrap();
        assert_eq!(
            read_net_config(&path).unwrap().ipv4.unwrap().network,
            "10.5.0.0/16".parse().unwrap()
        );
    }

    #[test]
    fn the_event_queue_depth_is_read_as_flanneld_reads_it() {
        let with = |depth: &'static str| {
            move |k: &str| match k {
                "EVENT_QUEUE_DEPTH" => Some(depth.to_string()),
                "NODE_NAME" => Some("w1".to_string()),
                _ => None,
            }
        };
        assert_eq!(KubeEnv::read(&with("5000")).unwrap().event_queue, 5000);
        assert_eq!(KubeEnv::read(&with("0")).unwrap().event_queue, EVENT_QUEUE);
        assert_eq!(KubeEnv::read(&with("")).unwrap().event_queue, EVENT_QUEUE);
        for bad in ["x", "1e3", "2000000"] {
            let err = KubeEnv::read(&with(bad)).unwrap_err().to_string();
            assert!(err.starts_with("EVENT_QUEUE_DEPTH="), "{err}");
        }
    }

    #[test]
    fn the_node_is_found_as_flanneld_finds_it() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            NodeIdentity::from_env(&env(&[("NODE_NAME", "w1"), ("POD_NAME", "p")])).unwrap(),
            NodeIdentity::Name("w1".into())
        );
        assert_eq!(
            NodeIdentity::from_env(&env(&[
                ("POD_NAME", "p"),
                ("POD_NAMESPACE", "kube-flannel")
            ]))
            .unwrap(),
            NodeIdentity::Pod {
                namespace: "kube-flannel".into(),
                name: "p".into()
            }
        );
        let err =
            NodeIdentity::from_env(&env(&[("POD_NAME", "p"), ("NODE_NAME", "")])).unwrap_err();
        assert!(err.to_string().contains("set NODE_NAME"), "{err}");
    }
}
