//! This node's own Node object: its podCIDR is our lease, and its annotations are what the
//! other nodes read about us.

use super::annotations::{assigned_pod_cidr, Annotations};
use super::node_view::NodeView;
use super::{retry, KubeTiming};
use crate::config::Config;
use crate::lease::{Lease, LeaseAttrs};
use anyhow::bail;
use kube::api::{Patch, PatchParams};
use kube::Api;
use std::collections::BTreeMap;
use std::time::Duration;

/// Longest wait between two looks at a Node that is not ready for us yet.
const WAIT_POLL_MAX: Duration = Duration::from_secs(2);

pub(super) struct OwnNode {
    pub nodes: Api<NodeView>,
    pub name: String,
    pub annotations: Annotations,
    pub attrs: LeaseAttrs,
    pub timing: KubeTiming,
}

/// What a change to our own Node means.
pub(super) enum OwnChange {
    /// Nothing that concerns us.
    None,
    /// Someone changed or removed our annotations: write these again.
    Annotate(BTreeMap<String, String>),
    /// Our podCIDR is no longer our lease.
    Lost(String),
}

impl OwnNode {
    /// Waits (saying so once) until the Node exists and has a podCIDR inside the network, then
    /// publishes our annotations. The podCIDR is the lease: twill never allocates in this mode.
    pub async fn acquire(&self, config: &Config) -> anyhow::Result<Lease> {
        let (node, subnet) = self.wait_for_pod_cidr().await?;
        if !config.network.contains(&subnet) {
            bail!(
                "the network {} in net-conf.json does not contain Node {}'s podCIDR {subnet}",
                config.network,
                self.name
            );
        }
        let wanted = self.annotations.own(&self.attrs, &node);
        self.annotate(Annotations::missing(wanted, &node)).await?;
        Ok(Lease::new(subnet, self.attrs.clone()))
    }

    async fn wait_for_pod_cidr(&self) -> anyhow::Result<(NodeView, ipnet::Ipv4Net)> {
        let resource = format!("nodes/{}", self.name);
        let mut said = None;
        let mut poll = super::Backoff::new(self.timing.backoff_min, WAIT_POLL_MAX);
        loop {
            let found = retry(&self.timing, "get", &resource, || {
                self.nodes.get_opt(&self.name)
            });
            let waiting_for = match found.await? {
                None => format!(
                    "Node {} does not exist yet (is NODE_NAME this node's name?)",
                    self.name
                ),
                Some(node) => match assigned_pod_cidr(&node) {
                    Ok(Some(subnet)) => return Ok((node, subnet)),
                    Ok(None) => format!(
                        "Node {} has no podCIDR yet (the controller manager assigns one with \
                         --allocate-node-cidrs)",
                        self.name
                    ),
                    Err(e) => bail!("Node {}: {e:#}", self.name),
                },
            };
            if said.as_ref() != Some(&waiting_for) {
                tracing::warn!("{waiting_for}; waiting");
                said = Some(waiting_for);
            }
            tokio::time::sleep(poll.next_delay()).await;
        }
    }

    /// Writes annotations through `nodes/status`, as flanneld does (its ClusterRole grants
    /// patching only there).
    pub async fn annotate(&self, changed: BTreeMap<String, String>) -> anyhow::Result<()> {
        if changed.is_empty() {
            return Ok(());
        }
        let patch = serde_json::json!({"metadata": {"annotations": changed}});
        self.patch_status(Patch::Merge(&patch)).await
    }

    /// Sets the Node's NetworkUnavailable condition to False, as flanneld does once it runs.
    pub async fn mark_network_available(&self) -> anyhow::Result<()> {
        let now = k8s_openapi::jiff::Timestamp::now();
        let patch = serde_json::json!({"status": {"conditions": [{
            "type": "NetworkUnavailable",
            "status": "False",
            "reason": "FlannelIsUp",
            "message": "twill (flannel-compatible) is running on this node",
            "lastTransitionTime": now,
            "lastHeartbeatTime": now,
        }]}});
        self.patch_status(Patch::Strategic(&patch)).await
    }

    async fn patch_status(&self, patch: Patch<&serde_json::Value>) -> anyhow::Result<()> {
        let resource = format!("nodes/{}/status", self.name);
        let params = PatchParams::default();
        let patched = retry(&self.timing, "patch", &resource, || {
            self.nodes.patch_status(&self.name, &params, &patch)
        });
        patched.await.map(drop)
    }

    /// Compares a new version of our Node with our lease.
    pub fn change(&self, node: &NodeView, lease: &Lease) -> OwnChange {
        match assigned_pod_cidr(node) {
            Ok(Some(cidr)) if cidr == lease.subnet => {}
            Ok(cidr) => {
                let now = cidr.map_or("none".to_string(), |c| c.to_string());
                return OwnChange::Lost(format!(
                    "Node {}'s podCIDR changed from {} to {now}",
                    self.name, lease.subnet
                ));
            }
            Err(e) => return OwnChange::Lost(format!("Node {}: {e:#}", self.name)),
        }
        let missing = Annotations::missing(self.annotations.own(&self.attrs, node), node);
        match missing.is_empty() {
            true => OwnChange::None,
            false => OwnChange::Annotate(missing),
        }
    }
}
