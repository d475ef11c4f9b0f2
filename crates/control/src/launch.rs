//! Starting a node from its options, whichever face gave them (`twill run`'s flags or
//! flanneld's command line): the probes first, so that they answer from the first second, then
//! the registry, which may wait for etcd or the API server as long as it takes, then the node.

use crate::backend_kind::BackendKind;
use crate::config::Config;
use crate::daemon;
use crate::node::NodeOptions;
use crate::registry::{parse_peer, EtcdOptions, EtcdRegistry, KubeOptions, KubeRegistry};
use crate::registry::{Registry, StaticRegistry};
use crate::status::{self, NodeStatus};
use crate::subnet_env;
use ipnet::Ipv4Net;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Where the node's lease and its peers' come from.
#[derive(Debug, Clone)]
pub enum Leases {
    /// etcd in flannel's schema (`--etcd-endpoints`).
    Etcd(EtcdOptions),
    /// Kubernetes Nodes (`--kube-subnet-mgr`).
    Kube(KubeOptions),
    /// A fixed network given on the command line (`twill run --network --subnet --peer`).
    Static(StaticNetwork),
}

/// `twill run`'s registry without etcd: the network, this node's subnet and its peers.
#[derive(Debug, Clone)]
pub struct StaticNetwork {
    pub network: Ipv4Net,
    pub subnet: Ipv4Net,
    /// `udp` (the default) or `batch`.
    pub backend: Option<String>,
    pub port: Option<u16>,
    /// `SUBNET=PUBLIC_IP[:PORT]`, one per peer.
    pub peers: Vec<String>,
}

impl StaticNetwork {
    fn registry(&self) -> anyhow::Result<StaticRegistry> {
        let backend = match self.backend.as_deref() {
            Some("batch") => BackendKind::TwillBatch.name(),
            other => other.unwrap_or(BackendKind::DEFAULT.name()),
        };
        let mut config = Config::for_network(self.network, backend)?;
        if self.port.is_some() {
            config.backend.port = self.port;
        }
        let peers = self.peers.iter().map(|p| parse_peer(p, &config));
        let peers = peers.collect::<anyhow::Result<Vec<_>>>()?;
        StaticRegistry::new(config, self.subnet, peers)
    }
}

/// A node to start: where its leases come from and how it joins.
#[derive(Debug, Clone)]
pub struct Launch {
    pub leases: Leases,
    pub node: NodeOptions,
}

impl Launch {
    /// Serves the status addresses, connects to the registry and runs the node until `stop`.
    pub async fn run(self, stop: CancellationToken) -> anyhow::Result<()> {
        let Launch { leases, node } = self;
        let status = Arc::new(NodeStatus::new(node.metrics_per_peer));
        for addr in &node.status_addrs {
            status::serve(*addr, status.clone()).await?;
        }
        match leases {
            Leases::Kube(options) => {
                let connect = KubeRegistry::connect(options);
                let Some(registry) = until_stopped(connect, &stop).await? else {
                    return Ok(());
                };
                run_node(registry, node, status, stop).await
            }
            Leases::Etcd(mut options) => {
                (options.previous_subnet, options.previous_ipv6_subnet) =
                    subnet_env::previous_subnets(&node.subnet_file)?;
                let connect = EtcdRegistry::connect(options);
                let Some(registry) = until_stopped(connect, &stop).await? else {
                    return Ok(());
                };
                run_node(registry, node, status, stop).await
            }
            Leases::Static(network) => {
                let registry = network.registry()?;
                run_node(registry, node, status, stop).await
            }
        }
    }
}

/// Waits for `connecting`; `None` when `stop` comes first (a stop while etcd or the API server
/// is unreachable is a clean exit).
async fn until_stopped<R>(
    connecting: impl std::future::Future<Output = anyhow::Result<R>>,
    stop: &CancellationToken,
) -> anyhow::Result<Option<R>> {
    tokio::select! {
        registry = connecting => registry.map(Some),
        () = stop.cancelled() => Ok(None),
    }
}

async fn run_node<R: Registry>(
    registry: R,
    node: NodeOptions,
    status: Arc<NodeStatus>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    daemon::run(registry, node, status, stop.cancelled_owned()).await
}
