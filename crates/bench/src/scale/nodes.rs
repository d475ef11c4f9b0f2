//! Synthetic Nodes in a real kube-apiserver, as flanneld's `--kube-subnet-mgr` nodes leave them:
//! each [`Synthetic`] lease is a Node whose podCIDR is its subnet and whose flannel annotations
//! carry its PublicIP and backend, plus `node.alpha.kubernetes.io/ttl: "0"` as kubelets set it.
//! There is no kubelet or controller manager: the bench creates every Node with its podCIDR, as
//! the node-IPAM controller would, including the Node of the twill under test (without
//! annotations: twill writes its own).

use super::leases::{self, Synthetic};
use super::node::{usage, Metrics, Usage};
use super::ScaleBackend;
use anyhow::{ensure, Context, Result};
use futures::{stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams};
use kube::Client;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::runtime::Runtime;
use twill_lab::{Etcd, Host, Ipv4Net, KubeApiServer};

/// The Node of the twill under test (`NODE_NAME`).
pub const OWN_NODE: &str = "twill-under-test";
/// flanneld's `--kube-annotation-prefix` default.
const PREFIX: &str = "flannel.alpha.coreos.com";
/// Kubelets set it; flanneld panics on a Node without annotations.
const TTL_ANNOTATION: (&str, &str) = ("node.alpha.kubernetes.io/ttl", "0");
/// Creates in flight while filling: one request at a time would take minutes at 5,000.
const CREATES_IN_FLIGHT: usize = 32;
/// Bounds every single request; a healthy lab server answers in milliseconds.
const REQUEST_LIMIT: Duration = Duration::from_secs(30);
/// Bounds a whole fill (5,000 Nodes took 3 to 7 s on 2 cores).
const FILL_LIMIT: Duration = Duration::from_secs(1200);

/// The Node name of a synthetic lease.
pub fn node_name(lease: Synthetic) -> String {
    match lease {
        Synthetic::Filler(i) => format!("filler-{i}"),
        Synthetic::Probe(i) => format!("probe-{i}"),
    }
}

/// The Node of a flanneld node of `backend` holding `lease`: the annotations exactly as
/// flanneld v0.28 writes them (`backend-type` empty and `backend-data` the JSON `null` for
/// udp; vxlan's data is its VNI and VTEP MAC, as in the etcd lease).
pub fn node(lease: Synthetic, backend: ScaleBackend) -> Node {
    let (backend_type, backend_data) = match backend {
        ScaleBackend::Udp | ScaleBackend::Ebpf => (String::new(), "null".to_string()),
        ScaleBackend::Vxlan => (
            "vxlan".to_string(),
            format!(r#"{{"VNI":1,"VtepMAC":"{}"}}"#, lease.vtep_mac()),
        ),
        ScaleBackend::HostGw => ("host-gw".to_string(), "null".to_string()),
    };
    let key = |name: &str| format!("{PREFIX}/{name}");
    let annotations = BTreeMap::from([
        (TTL_ANNOTATION.0.to_string(), TTL_ANNOTATION.1.to_string()),
        (key("kube-subnet-manager"), "true".to_string()),
        (key("public-ip"), lease.public_ip().to_string()),
        (key("backend-type"), backend_type),
        (key("backend-data"), backend_data),
    ]);
    new_node(&node_name(lease), lease.subnet(), annotations)
}

/// A Node with `pod_cidr` in both spec fields (podCIDRs[0] must equal podCIDR).
fn new_node(name: &str, pod_cidr: Ipv4Net, annotations: BTreeMap<String, String>) -> Node {
    let cidr = pod_cidr.to_string();
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: Some(cidr.clone()),
            pod_cidrs: Some(vec![cidr]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A fresh kube-apiserver (on the lab's etcd, under a prefix of its own) with an admin client,
/// the kubeconfig and net-conf.json the twill under test reads. Built and used on a thread
/// inside the lab host's namespace: the client connects from there. Stopped on drop.
pub struct Cluster {
    // Drop order: the client and its runtime before the server.
    client: Client,
    runtime: Runtime,
    api: KubeApiServer,
    kubeconfig: PathBuf,
    net_conf: PathBuf,
}

impl Cluster {
    /// Starts the API server on `host`'s underlay address and writes the twill node's files
    /// for `backend` into `dir`.
    pub fn start(host: &Host, etcd: &Etcd, dir: &Path, backend: ScaleBackend) -> Result<Cluster> {
        let api = KubeApiServer::start(Some(&host.ns), host.underlay_ip, etcd)?;
        let kubeconfig = dir.join("kubeconfig");
        api.write_kubeconfig(&kubeconfig, api.admin_token())?;
        let net_conf = dir.join("net-conf.json");
        std::fs::write(&net_conf, leases::config(backend))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let client = runtime.block_on(api.client())?;
        Ok(Cluster {
            client,
            runtime,
            api,
            kubeconfig,
            net_conf,
        })
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    pub fn net_conf(&self) -> &Path {
        &self.net_conf
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// Creates fillers `0..count` for `backend`, [`CREATES_IN_FLIGHT`] at a time over the one
    /// client, then the twill node's own Node with the subnet past them (where a node joining
    /// an etcd of `count` leases would land).
    pub fn fill(&self, backend: ScaleBackend, count: u32) -> Result<()> {
        let nodes = self.nodes();
        let creates = (0..count).map(|i| {
            let (nodes, node) = (nodes.clone(), node(Synthetic::Filler(i), backend));
            async move { create(&nodes, &node).await }
        });
        let all = stream::iter(creates)
            .buffer_unordered(CREATES_IN_FLIGHT)
            .try_for_each(|()| async { Ok(()) });
        self.runtime
            .block_on(async {
                tokio::time::timeout(FILL_LIMIT, all)
                    .await
                    .with_context(|| format!("not within {FILL_LIMIT:?}"))?
            })
            .with_context(|| format!("cannot create {count} Nodes"))?;
        let own = new_node(OWN_NODE, Synthetic::Filler(count).subnet(), BTreeMap::new());
        self.block_on(create(&nodes, &own))
    }

    /// Creates the Node of `lease`.
    pub fn create(&self, lease: Synthetic, backend: ScaleBackend) -> Result<()> {
        self.block_on(create(&self.nodes(), &node(lease, backend)))
    }

    /// Deletes the Node of `lease`.
    pub fn delete(&self, lease: Synthetic) -> Result<()> {
        let name = node_name(lease);
        let nodes = self.nodes();
        let deleted = async move {
            nodes.delete(&name, &DeleteParams::default()).await?;
            Ok(())
        };
        self.block_on(deleted)
            .with_context(|| format!("cannot delete Node {}", node_name(lease)))
    }

    /// Requests on Nodes the API server has served so far (`apiserver_request_total` with
    /// `resource="nodes"`, every verb and client). Nothing in a bare API server touches Nodes
    /// (no kubelets, no controller manager): they are the twill node's and the bench's.
    pub fn node_requests(&self) -> Result<f64> {
        let request = kube::core::Request::new("").get("metrics", &Default::default())?;
        let client = self.client.clone();
        let text = self.block_on(async move { Ok(client.request_text(request).await?) })?;
        let metrics = Metrics::parse(&text);
        let served = metrics.sum_labelled("apiserver_request_total", r#"resource="nodes""#);
        // At least the fill's creates were served: none means the metric is not read right.
        ensure!(
            served > 0.0,
            "no apiserver_request_total{{resource=\"nodes\"}} in the API server's /metrics"
        );
        Ok(served)
    }

    /// kube-apiserver's CPU time and memory so far.
    pub fn usage(&self) -> Result<Usage> {
        usage(self.api.pid().context("kube-apiserver is not running")?)
    }

    /// Runs one request, bounded by [`REQUEST_LIMIT`].
    fn block_on<T>(&self, request: impl Future<Output = Result<T>>) -> Result<T> {
        self.runtime.block_on(async {
            tokio::time::timeout(REQUEST_LIMIT, request)
                .await
                .with_context(|| format!("no answer within {REQUEST_LIMIT:?}"))?
        })
    }
}

async fn create(nodes: &Api<Node>, node: &Node) -> Result<()> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let params = PostParams::default();
    tokio::time::timeout(REQUEST_LIMIT, nodes.create(&params, node))
        .await
        .with_context(|| format!("no answer within {REQUEST_LIMIT:?}"))?
        .with_context(|| format!("cannot create Node {name}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_carry_flanneld_s_annotations_and_the_lease_s_pod_cidr() {
        let n = node(Synthetic::Probe(3), ScaleBackend::Vxlan);
        assert_eq!(n.metadata.name.as_deref(), Some("probe-3"));
        let spec = n.spec.unwrap();
        assert_eq!(spec.pod_cidr.as_deref(), Some("10.254.3.0/24"));
        assert_eq!(spec.pod_cidrs, Some(vec!["10.254.3.0/24".to_string()]));
        let a = n.metadata.annotations.unwrap();
        let get = |k: &str| a.get(k).map(String::as_str);
        assert_eq!(get("node.alpha.kubernetes.io/ttl"), Some("0"));
        assert_eq!(
            get("flannel.alpha.coreos.com/kube-subnet-manager"),
            Some("true")
        );
        assert_eq!(get("flannel.alpha.coreos.com/backend-type"), Some("vxlan"));
        assert_eq!(
            get("flannel.alpha.coreos.com/backend-data"),
            Some(r#"{"VNI":1,"VtepMAC":"0e:01:00:00:00:03"}"#)
        );
        assert_eq!(
            get("flannel.alpha.coreos.com/public-ip"),
            Some(Synthetic::Probe(3).public_ip().to_string().as_str())
        );
        let udp = node(Synthetic::Filler(0), ScaleBackend::Udp);
        let a = udp.metadata.annotations.unwrap();
        assert_eq!(a["flannel.alpha.coreos.com/backend-type"], "");
        assert_eq!(a["flannel.alpha.coreos.com/backend-data"], "null");
    }
}
