//! A real Kubernetes cluster on one machine, for the tests: the lab's kube-apiserver with a
//! kube-controller-manager and kube-scheduler on a control-plane host, and nodes that are each
//! a lab host (a network namespace) plus a private mount namespace running its own containerd
//! and kubelet, all built by `scripts/kube-parts`. No registry and no Docker: images are OCI
//! archives imported into each node's containerd. No kube-proxy either: each node routes the
//! `kubernetes` Service's address to the API server itself, so in-cluster clients reach it.

pub(crate) mod cgroups;
mod control;
mod image;
mod node;
mod node_config;
mod wait;

pub use image::Image;
pub use node::KubeNode;

use crate::kube::KubeApiServer;
use crate::proc::temp_prefix;
use crate::{Etcd, Host, Lab, Netns};
use anyhow::{ensure, Context, Result};
use control::ControlPlane;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, LogParams};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::time::Duration;
use tempfile::TempDir;

/// The pod network node IPAM carves podCIDRs from: kube-flannel.yml's `Network`.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
const NODE_CIDR_MASK: u8 = 24;
/// A dual-stack cluster's IPv6 pod network (flannel's e2e suite's `IPv6Network`), carved into
/// a /64 per node.
pub const CLUSTER_CIDR6: &str = "fd00:10:244::/56";
const NODE_CIDR_MASK6: u8 = 64;
/// The `kubernetes` Service's ClusterIP (the first of the lab API server's 10.96.0.0/16) and
/// port, which the kubelet gives every pod as KUBERNETES_SERVICE_HOST and _PORT.
const KUBERNETES_SERVICE: (&str, u16) = ("10.96.0.1", 443);
/// A kubelet registers within seconds and node IPAM answers at once; the bound catches a
/// kubelet that cannot start.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(90);
/// The most nodes the underlay's addresses and a 2-core machine make sense for.
const MAX_NODES: usize = 8;

/// The shape of a [`Cluster`].
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// Short test name, in namespace names.
    pub tag: String,
    /// Nodes `node-1`..`node-N`.
    pub nodes: usize,
    /// Imported into every node's containerd before its kubelet starts (the pause image always
    /// is); pods run them with `imagePullPolicy: Never` or a tag other than `latest`.
    pub images: Vec<Image>,
    /// Gives each node a plain bridge CNI config (host-local addresses from its podCIDR, no
    /// routes between nodes) once it has its podCIDR, so Nodes go Ready without a network
    /// add-on. Without it, Nodes stay NotReady until an add-on such as flannel installs one.
    pub bridge_cni: bool,
    /// An IPv6 underlay beside the IPv4 one (fd00:200::<n>/64, default routes of both
    /// families), and node IPAM giving each Node an IPv6 podCIDR from [`CLUSTER_CIDR6`] too.
    pub dual_stack: bool,
}

impl Default for ClusterSpec {
    fn default() -> Self {
        ClusterSpec {
            tag: "cluster".into(),
            nodes: 2,
            images: Vec::new(),
            bridge_cni: false,
            dual_stack: false,
        }
    }
}

/// The control plane on lab host 0 (10.200.0.1: etcd, kube-apiserver, kube-controller-manager,
/// kube-scheduler) and node `node-i` on lab host i (10.200.0.(i+1), default route via host 0).
/// Started by [`Cluster::start`]; on Drop every process, pod, namespace, cgroup and file it made
/// is gone, whether the test passed or failed.
#[derive(Debug)]
pub struct Cluster {
    // Drop order: nodes (and their pods) first, then the control plane, then the lab under it.
    nodes: Vec<KubeNode>,
    control: ControlPlane,
    api: KubeApiServer,
    _etcd: Etcd,
    _dir: TempDir,
    lab: Lab,
}

impl Cluster {
    /// Starts the control plane and the nodes, imports the images, and waits until every Node
    /// has registered and has its podCIDR (and a CNI config, with `bridge_cni`).
    pub fn start(spec: ClusterSpec) -> Result<Cluster> {
        crate::require_root()?;
        ensure!(
            (1..=MAX_NODES).contains(&spec.nodes),
            "a cluster has 1..={MAX_NODES} nodes, got {}",
            spec.nodes
        );
        let mut lab = Lab::of(&spec.tag, spec.nodes + 1)?;
        if spec.dual_stack {
            lab = lab.with_ipv6_underlay()?;
        }
        let control_host = lab.host(0);
        let etcd = Etcd::new(Some(&control_host.ns))?;
        let api = KubeApiServer::start(Some(&control_host.ns), control_host.underlay_ip, &etcd)?;
        let dir = tempfile::Builder::new().prefix(&temp_prefix()).tempdir()?;
        let control =
            ControlPlane::start(control_host.ns.name(), &api, dir.path(), spec.dual_stack)?;
        let pause = Image::part("pause")?;
        let mut nodes = Vec::new();
        for i in 1..=spec.nodes {
            let host = lab.host(i);
            route_services(host, control_host, api.port(), dir.path())?;
            let name = format!("node-{i}");
            nodes.push(KubeNode::start(
                &name,
                host.underlay_ip,
                host.ns.name(),
                &api,
                &pause,
                &spec.images,
            )?);
        }
        let mut cluster = Cluster {
            nodes,
            control,
            api,
            _etcd: etcd,
            _dir: dir,
            lab,
        };
        let cidrs = cluster.wait_pod_cidrs(REGISTER_TIMEOUT)?;
        // Pods without a serviceAccountName are refused until the controller manager has made
        // the namespace's `default`.
        cluster.wait_for(
            "ServiceAccount default/default (kube-controller-manager)",
            REGISTER_TIMEOUT,
            |c| {
                Ok(c.api
                    .has_service_account("default", "default")?
                    .then_some(()))
            },
        )?;
        if spec.bridge_cni {
            for (node, cidr) in cluster.nodes.iter().zip(&cidrs) {
                write_bridge_cni(node, cidr)?;
            }
        }
        Ok(cluster)
    }

    pub fn api(&self) -> &KubeApiServer {
        &self.api
    }

    pub fn nodes(&self) -> &[KubeNode] {
        &self.nodes
    }

    /// Node `name`.
    pub fn node(&self, name: &str) -> Result<&KubeNode> {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .with_context(|| format!("no node {name} in the cluster"))
    }

    /// The lab under the cluster (host 0 is the control plane, host i node `node-i`).
    pub fn lab(&self) -> &Lab {
        &self.lab
    }

    /// Node `name` as the API server has it.
    pub fn get_node(&self, name: &str) -> Result<Node> {
        self.api
            .block_on(|client| async move { Ok(Api::<Node>::all(client).get(name).await?) })
            .with_context(|| format!("cannot get Node {name}"))
    }

    /// Pod `namespace/name` as the API server has it.
    pub fn pod(&self, namespace: &str, name: &str) -> Result<Pod> {
        self.api
            .block_on(|client| async move {
                Ok(Api::<Pod>::namespaced(client, namespace).get(name).await?)
            })
            .with_context(|| format!("cannot get Pod {namespace}/{name}"))
    }

    /// The names of the pods in `namespace`.
    pub fn pods(&self, namespace: &str) -> Result<Vec<String>> {
        let pods = self.api.block_on(|client| async move {
            let all = ListParams::default();
            Ok(Api::<Pod>::namespaced(client, namespace).list(&all).await?)
        });
        let pods = pods.with_context(|| format!("cannot list the pods in {namespace}"))?;
        Ok(pods
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect())
    }

    /// The last `lines` lines container `container` of pod `namespace/name` logged, as
    /// `kubectl logs` reads them: the API server asks the pod's kubelet.
    pub fn pod_log(
        &self,
        namespace: &str,
        name: &str,
        container: &str,
        lines: i64,
    ) -> Result<String> {
        let params = LogParams {
            container: Some(container.into()),
            tail_lines: Some(lines),
            ..Default::default()
        };
        self.api
            .block_on(|client| async move {
                let pods = Api::<Pod>::namespaced(client, namespace);
                Ok(pods.logs(name, &params).await?)
            })
            .with_context(|| format!("cannot read the log of {namespace}/{name} {container}"))
    }

    /// Pod `namespace/name`'s IPv4 address; an error until it has one.
    pub fn pod_ip(&self, namespace: &str, name: &str) -> Result<Ipv4Addr> {
        let ips = self.pod_ips(namespace, name)?;
        ips.iter()
            .find_map(|ip| match ip {
                IpAddr::V4(v4) => Some(*v4),
                IpAddr::V6(_) => None,
            })
            .with_context(|| format!("pod {namespace}/{name} has no IPv4 address: {ips:?}"))
    }

    /// Pod `namespace/name`'s IPv6 address (a dual-stack pod's); an error until it has one.
    pub fn pod_ipv6(&self, namespace: &str, name: &str) -> Result<Ipv6Addr> {
        let ips = self.pod_ips(namespace, name)?;
        ips.iter()
            .find_map(|ip| match ip {
                IpAddr::V6(v6) => Some(*v6),
                IpAddr::V4(_) => None,
            })
            .with_context(|| format!("pod {namespace}/{name} has no IPv6 address: {ips:?}"))
    }

    /// Every address of pod `namespace/name` (status.podIPs); an error until it has one.
    pub fn pod_ips(&self, namespace: &str, name: &str) -> Result<Vec<IpAddr>> {
        let pod = self.pod(namespace, name)?;
        let ips = pod.status.and_then(|s| s.pod_ips).unwrap_or_default();
        ensure!(!ips.is_empty(), "pod {namespace}/{name} has no address yet");
        ips.into_iter()
            .map(|ip| {
                ip.ip
                    .parse()
                    .with_context(|| format!("pod {namespace}/{name}: address {}", ip.ip))
            })
            .collect()
    }

    /// Deletes pod `namespace/name` as `kubectl delete pod` does: its containers get SIGTERM
    /// and their grace period. Returns at once; [`Cluster::wait_pod_gone`] waits for the end.
    pub fn delete_pod(&self, namespace: &str, name: &str) -> Result<()> {
        self.api
            .block_on(|client| async move {
                let pods = Api::<Pod>::namespaced(client, namespace);
                pods.delete(name, &DeleteParams::default()).await?;
                Ok(())
            })
            .with_context(|| format!("cannot delete pod {namespace}/{name}"))
    }

    /// Waits until pod `namespace/name` no longer exists.
    pub fn wait_pod_gone(&mut self, namespace: &str, name: &str, timeout: Duration) -> Result<()> {
        let what = format!("pod {namespace}/{name} gone");
        self.wait_for(&what, timeout, |c| {
            Ok((!c.pods(namespace)?.iter().any(|p| p == name)).then_some(()))
        })
    }

    /// Deletes DaemonSet `namespace/name` and waits until its pods are gone, as flannel's
    /// end-to-end suite uninstalls flannel before installing it anew.
    pub fn delete_daemonset(
        &mut self,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<()> {
        let background = DeleteParams::background();
        self.api
            .block_on(|client| async move {
                let sets = Api::<DaemonSet>::namespaced(client, namespace);
                sets.delete(name, &background).await?;
                Ok(())
            })
            .with_context(|| format!("cannot delete DaemonSet {namespace}/{name}"))?;
        let what = format!("the pods of DaemonSet {namespace}/{name} gone");
        self.wait_for(&what, timeout, |c| {
            Ok(c.pods(namespace)?.is_empty().then_some(()))
        })
    }

    /// Node `name`'s condition `type_` (e.g. `NetworkUnavailable`) as (status, reason); None
    /// if the Node has no such condition.
    pub fn node_condition(&self, name: &str, type_: &str) -> Result<Option<(String, String)>> {
        let node = self.get_node(name)?;
        let conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
        Ok(conditions
            .into_iter()
            .find(|c| c.type_ == type_)
            .map(|c| (c.status, c.reason.unwrap_or_default())))
    }

    /// The network namespace of running pod `namespace/name`, found through its first
    /// container's process on its node, named so the lab's helpers (exec, TCP transfers) run in
    /// it. Dropping it leaves the pod alone.
    pub fn pod_netns(&self, namespace: &str, name: &str) -> Result<Netns> {
        let pod = self.pod(namespace, name)?;
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let node = self.node(node.as_deref().context("the pod is not scheduled")?)?;
        let id = pod
            .status
            .and_then(|s| s.container_statuses?.into_iter().next()?.container_id)
            .with_context(|| format!("pod {namespace}/{name} has no container yet"))?;
        let id = id.strip_prefix("containerd://").unwrap_or(&id);
        Netns::attach(&format!("pod-{name}"), node.container_pid(id)?)
    }
}

/// Node `host` reaches the control plane through its default route (one of each family on an
/// IPv6 underlay), and the `kubernetes` Service's address at the API server: a DNAT for the
/// node's own connections (host-network pods) and for those it forwards (pods), as kube-proxy's
/// rules would do. The rules go through a file in `dir`.
fn route_services(host: &Host, control_host: &Host, api_port: u16, dir: &Path) -> Result<()> {
    let control = control_host.underlay_ip;
    host.ns
        .ip(&["route", "add", "default", "via", &control.to_string()])?;
    if let Some(gateway) = control_host.underlay_ipv6 {
        host.ns
            .ip(&["-6", "route", "add", "default", "via", &gateway.to_string()])?;
    }
    let (service, port) = KUBERNETES_SERVICE;
    let dnat = format!("ip daddr {service} tcp dport {port} dnat to {control}:{api_port}");
    let rules = format!(
        "table ip twill-lab-services {{\n\
         chain output {{ type nat hook output priority -100; {dnat}; }}\n\
         chain prerouting {{ type nat hook prerouting priority -100; {dnat}; }}\n\
         }}\n"
    );
    let file = dir.join(format!("{}.nft", host.ns.name()));
    std::fs::write(&file, rules)?;
    host.ns.exec("nft", &["-f", &file.to_string_lossy()])?;
    Ok(())
}

/// A bridge and host-local addresses from the node's podCIDR, as a minimal network add-on.
fn write_bridge_cni(node: &KubeNode, cidr: &str) -> Result<()> {
    let config = serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "lab-bridge",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}]
                }
            },
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    });
    let path = node.path("/etc/cni/net.d/10-lab-bridge.conflist");
    std::fs::write(&path, serde_json::to_string_pretty(&config)?)
        .with_context(|| format!("cannot write {}", path.display()))
}
