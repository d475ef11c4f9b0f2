//! Clients of the lab's API server and the synchronous helpers tests call.

use super::KubeApiServer;
use anyhow::{Context, Result};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, NodeSpec, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

/// Bounds every helper; a healthy lab server answers in milliseconds.
const OP_TIMEOUT: Duration = Duration::from_secs(30);
/// Short, so the readiness loop notices a ready server soon.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Kubelets set it; flanneld panics on a Node without annotations.
const TTL_ANNOTATION: (&str, &str) = ("node.alpha.kubernetes.io/ttl", "0");

impl KubeApiServer {
    /// An admin client. It connects from the thread that polls it and belongs to the runtime
    /// that created it: use it inside a runtime whose threads are in the server's namespace
    /// (e.g. built inside [`crate::Netns::enter`]).
    pub async fn client(&self) -> Result<Client> {
        self.client_as(&self.token).await
    }

    /// Like [`KubeApiServer::client`], authenticating with `token`; built from the kubeconfig
    /// [`KubeApiServer::write_kubeconfig`] writes.
    pub async fn client_as(&self, token: &str) -> Result<Client> {
        let kubeconfig = Kubeconfig::from_yaml(&self.kubeconfig(token))?;
        let options = KubeConfigOptions::default();
        let config = Config::from_custom_kubeconfig(kubeconfig, &options).await?;
        Ok(Client::try_from(config)?)
    }

    /// Creates a Node with `pod_cidr` (spec.podCIDR and podCIDRs) and `annotations`, plus
    /// `node.alpha.kubernetes.io/ttl: "0"` as kubelets set it.
    pub fn create_node(
        &self,
        name: &str,
        pod_cidr: Option<&str>,
        annotations: &[(&str, &str)],
    ) -> Result<()> {
        self.create_node_with_cidrs(name, pod_cidr.as_slice(), annotations)
    }

    /// [`KubeApiServer::create_node`] with `pod_cidrs` as spec.podCIDRs (the first also as
    /// spec.podCIDR), e.g. an IPv4 and an IPv6 one as a dual-stack cluster's node IPAM gives.
    pub fn create_node_with_cidrs(
        &self,
        name: &str,
        pod_cidrs: &[&str],
        annotations: &[(&str, &str)],
    ) -> Result<()> {
        let annotations = std::iter::once(TTL_ANNOTATION)
            .chain(annotations.iter().copied())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let node = new_node(name, pod_cidrs, annotations, None);
        self.block_on(|client| async move {
            nodes(client).create(&PostParams::default(), &node).await?;
            Ok(())
        })
        .with_context(|| format!("cannot create Node {name}"))
    }

    pub fn node(&self, name: &str) -> Result<Node> {
        self.block_on(|client| async move { Ok(nodes(client).get(name).await?) })
            .with_context(|| format!("cannot get Node {name}"))
    }

    pub fn delete_node(&self, name: &str) -> Result<()> {
        self.block_on(|client| async move {
            nodes(client).delete(name, &DeleteParams::default()).await?;
            Ok(())
        })
        .with_context(|| format!("cannot delete Node {name}"))
    }

    /// Gives Node `name` the pod CIDR `cidr`. The API server lets spec.podCIDR go from unset to
    /// set but never change, as node IPAM does it; so a Node that has another one is deleted and
    /// recreated with the same labels, annotations and spec (not status), which watchers see as
    /// a delete and an add.
    pub fn set_pod_cidr(&self, name: &str, cidr: &str) -> Result<()> {
        self.block_on(|client| async move {
            let api = nodes(client);
            let node = api.get(name).await?;
            let spec = node.spec.unwrap_or_default();
            match spec.pod_cidr.as_deref() {
                Some(current) if current == cidr => {}
                None => {
                    let patch = serde_json::json!({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}});
                    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await?;
                }
                Some(_) => {
                    let meta = node.metadata;
                    let annotations = meta.annotations.unwrap_or_default();
                    let mut fresh = new_node(name, &[], annotations, meta.labels);
                    fresh.spec = Some(spec);
                    set_cidrs(&mut fresh, &[cidr]);
                    api.delete(name, &DeleteParams::default()).await?;
                    api.create(&PostParams::default(), &fresh).await?;
                }
            }
            Ok(())
        })
        .with_context(|| format!("cannot set the pod CIDR of Node {name} to {cidr}"))
    }

    /// Merge-patches Node annotations: Some sets a value, None deletes the key.
    pub fn patch_node_annotations(
        &self,
        name: &str,
        changes: &[(&str, Option<&str>)],
    ) -> Result<()> {
        let annotations: serde_json::Map<_, _> = changes
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
            .collect();
        let patch = serde_json::json!({"metadata": {"annotations": annotations}});
        self.block_on(|client| async move {
            nodes(client)
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            Ok(())
        })
        .with_context(|| format!("cannot patch the annotations of Node {name}"))
    }

    /// Creates Namespace `namespace` and ServiceAccount `name` in it, unless they exist.
    pub fn create_service_account(&self, namespace: &str, name: &str) -> Result<()> {
        self.block_on(|client| async move {
            let ns = Namespace {
                metadata: meta(namespace),
                ..Default::default()
            };
            ignore_conflict(
                Api::all(client.clone())
                    .create(&PostParams::default(), &ns)
                    .await,
            )?;
            let sa = ServiceAccount {
                metadata: meta(name),
                ..Default::default()
            };
            let api = Api::namespaced(client, namespace);
            ignore_conflict(api.create(&PostParams::default(), &sa).await)
        })
        .with_context(|| format!("cannot create ServiceAccount {namespace}/{name}"))
    }

    /// The data of ConfigMap `namespace/name`.
    pub fn config_map(&self, namespace: &str, name: &str) -> Result<BTreeMap<String, String>> {
        self.block_on(|client| async move {
            let map: ConfigMap = Api::namespaced(client, namespace).get(name).await?;
            Ok(map.data.unwrap_or_default())
        })
        .with_context(|| format!("cannot get ConfigMap {namespace}/{name}"))
    }

    /// Whether ServiceAccount `namespace/name` exists.
    pub fn has_service_account(&self, namespace: &str, name: &str) -> Result<bool> {
        self.block_on(|client| async move {
            let api: Api<ServiceAccount> = Api::namespaced(client, namespace);
            Ok(api.get_opt(name).await?.is_some())
        })
    }

    /// A one-hour token of ServiceAccount `namespace/name` from the TokenRequest API, as the
    /// kubelet would project into a pod.
    pub fn service_account_token(&self, namespace: &str, name: &str) -> Result<String> {
        let request = TokenRequest {
            spec: TokenRequestSpec {
                expiration_seconds: Some(3600),
                ..Default::default()
            },
            ..Default::default()
        };
        self.block_on(|client| async move {
            let api: Api<ServiceAccount> = Api::namespaced(client, namespace);
            let answer = api
                .create_token_request(name, &PostParams::default(), &request)
                .await?;
            answer
                .status
                .map(|s| s.token)
                .context("no token in the answer")
        })
        .with_context(|| format!("cannot get a token of ServiceAccount {namespace}/{name}"))
    }

    /// `GET /readyz` as admin; Err until every post-start hook (RBAC bootstrap, ...) has run.
    pub(super) fn readyz(&self) -> Result<()> {
        let request = kube::core::Request::new("").get("readyz", &Default::default())?;
        self.block_on_within(PROBE_TIMEOUT, |client| async move {
            client.request_text(request).await?;
            Ok(())
        })
    }

    /// Runs `op` with an admin client, bounded by [`OP_TIMEOUT`].
    pub(crate) fn block_on<T, F>(&self, op: impl FnOnce(Client) -> F + Send) -> Result<T>
    where
        T: Send,
        F: Future<Output = Result<T>>,
    {
        self.block_on_within(OP_TIMEOUT, op)
    }

    /// Runs `op` on a fresh current-thread runtime on a fresh thread in the server's namespace:
    /// a client connects from the namespace of the thread polling it, and this works whether or
    /// not the caller is itself inside a runtime.
    fn block_on_within<T, F>(
        &self,
        timeout: Duration,
        op: impl FnOnce(Client) -> F + Send,
    ) -> Result<T>
    where
        T: Send,
        F: Future<Output = Result<T>>,
    {
        in_netns(self.ns.as_deref(), || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let run = async { op(self.client().await?).await };
                tokio::time::timeout(timeout, run)
                    .await
                    .with_context(|| format!("no answer within {timeout:?}"))?
            })
        })
    }
}

/// Runs `f` on a new thread that has joined network namespace `ns` (stays put for None).
fn in_netns<T: Send>(ns: Option<&str>, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    std::thread::scope(|scope| {
        let thread = scope.spawn(|| {
            if let Some(ns) = ns {
                let path = format!("/var/run/netns/{ns}");
                let file = std::fs::File::open(&path).with_context(|| format!("open {path}"))?;
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .with_context(|| format!("setns into {path}"))?;
            }
            f()
        });
        thread
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

fn nodes(client: Client) -> Api<Node> {
    Api::all(client)
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    }
}

fn new_node(
    name: &str,
    pod_cidrs: &[&str],
    annotations: BTreeMap<String, String>,
    labels: Option<BTreeMap<String, String>>,
) -> Node {
    let mut node = Node {
        metadata: ObjectMeta {
            annotations: Some(annotations),
            labels,
            ..meta(name)
        },
        spec: Some(NodeSpec::default()),
        ..Default::default()
    };
    if !pod_cidrs.is_empty() {
        set_cidrs(&mut node, pod_cidrs);
    }
    node
}

/// Both fields: podCIDRs[0] must equal podCIDR.
fn set_cidrs(node: &mut Node, cidrs: &[&str]) {
    let spec = node.spec.get_or_insert_with(Default::default);
    spec.pod_cidr = cidrs.first().map(|c| c.to_string());
    spec.pod_cidrs = Some(cidrs.iter().map(|c| c.to_string()).collect());
}

fn ignore_conflict<T>(result: kube::Result<T>) -> Result<()> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        other => other.map(drop).map_err(Into::into),
    }
}
