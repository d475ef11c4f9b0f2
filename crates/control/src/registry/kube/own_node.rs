//! This node's own Node object: its podCIDRs are our lease, and its annotations are what the
//! other nodes read about us.

use super::annotations::Annotations;
use super::node_cidrs::NodeCidrs;
use super::node_view::NodeView;
use super::{retry, KubeTiming};
use crate::config::Config;
use crate::lease::{Lease, LeaseAttrs, Subnets};
use anyhow::{bail, Context};
use ipnet::{Ipv4Net, Ipv6Net};
use kube::api::{Patch, PatchParams};
use kube::Api;
use std::collections::BTreeMap;
use std::fmt::Display;
use std::time::Duration;

/// Longest wait between two looks at a Node that is not ready for us yet.
const WAIT_POLL_MAX: Duration = Duration::from_secs(2);

pub(super) struct OwnNode {
    pub nodes: Api<NodeView>,
    pub name: String,
    pub annotations: Annotations,
    pub attrs: LeaseAttrs,
    /// net-conf.json: the networks our podCIDRs must lie in, and whether it is dual-stack.
    pub config: Config,
    pub timing: KubeTiming,
}

/// What a change to our own Node means.
pub(super) enum OwnChange {
    /// Nothing that concerns us.
    None,
    /// Someone changed or removed our annotations: write these again.
    Annotate(BTreeMap<String, String>),
    /// Our Node has no podCIDR (for now): nothing to publish until it has one.
    Unassigned,
    /// Our podCIDR is no longer our lease.
    Lost(String),
}

impl OwnNode {
    /// Waits (saying so once) until the Node exists and has a podCIDR inside the network, then
    /// publishes our annotations. The podCIDRs are the lease: twill never allocates in this
    /// mode.
    pub async fn acquire(&self) -> anyhow::Result<Lease> {
        let (node, cidrs) = self.wait_for_pod_cidrs().await?;
        let (subnet, subnet6) = own_subnets(&self.config, &self.name, cidrs)?;
        if self.config.ipv6.is_some() && subnet6.is_none() {
            tracing::warn!(
                "Node {} has no IPv6 podCIDR: its lease is IPv4 only on this dual-stack network, \
                 as flanneld's is (the vxlan backend then refuses to run, host-gw carries IPv4 \
                 alone)",
                self.name
            );
        }
        let wanted = self.annotations.own(&self.attrs, &node);
        self.annotate(Annotations::missing(wanted, &node)).await?;
        let subnets = Subnets::from_parts(subnet, subnet6)
            .context("the network config enables neither IPv4 nor IPv6")?;
        Ok(Lease::new(subnets, self.attrs.clone()))
    }

    async fn wait_for_pod_cidrs(&self) -> anyhow::Result<(NodeView, NodeCidrs)> {
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
                Some(node) => match NodeCidrs::of(&node) {
                    Ok(cidrs) if !cidrs.is_empty() => return Ok((node, cidrs)),
                    Ok(_) => format!(
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

    async fn patch_status(&self, patch: Patch<&serde_json::Value>) -> anyhow::Result<()> {
        patch_status(&self.nodes, &self.name, &self.timing, patch).await
    }

    /// Compares a new version of our Node with our lease.
    pub fn change(&self, node: &NodeView, lease: &Lease) -> OwnChange {
        // A Node registered anew (a kubelet after the API server lost its data) has no podCIDR
        // until the controller manager gives it one, most likely ours again: wait for it.
        if NodeCidrs::of(node).is_ok_and(|cidrs| cidrs.is_empty()) {
            return OwnChange::Unassigned;
        }
        if let Some(why) = self.moved(node, lease) {
            return OwnChange::Lost(why);
        }
        let missing = Annotations::missing(self.annotations.own(&self.attrs, node), node);
        match missing.is_empty() {
            true => OwnChange::None,
            false => OwnChange::Annotate(missing),
        }
    }

    /// Why the Node's podCIDRs are no longer our lease's subnets, if they are not.
    fn moved(&self, node: &NodeView, lease: &Lease) -> Option<String> {
        let cidrs = match NodeCidrs::of(node) {
            Ok(cidrs) => cidrs,
            Err(e) => return Some(format!("Node {}: {e:#}", self.name)),
        };
        let v4 = cidrs.v4.filter(|_| self.config.ipv4.is_some());
        if v4 != lease.subnets.v4() {
            return Some(format!(
                "Node {}'s podCIDR changed from {} to {}",
                self.name,
                shown(lease.subnets.v4()),
                shown(v4)
            ));
        }
        let v6 = cidrs.v6.filter(|_| self.config.ipv6.is_some());
        (v6 != lease.subnets.v6()).then(|| {
            format!(
                "Node {}'s IPv6 podCIDR changed from {} to {}",
                self.name,
                shown(lease.subnets.v6()),
                shown(v6)
            )
        })
    }
}

/// Our lease's subnets from our Node's podCIDRs: the IPv4 one, which must lie in `Network`,
/// and on a dual-stack network the IPv6 one, if the Node has it, which must lie in
/// `IPv6Network` (flanneld's `AcquireLease` checks both). Its prefix length must also be
/// `IPv6SubnetLen`: twill's lease gate takes every peer's IPv6 subnet to be that long. On an
/// IPv6-only network the IPv6 one alone, which the Node must have.
fn own_subnets(
    config: &Config,
    name: &str,
    cidrs: NodeCidrs,
) -> anyhow::Result<(Option<Ipv4Net>, Option<Ipv6Net>)> {
    let subnet = match &config.ipv4 {
        Some(v4) => Some(own_ipv4_subnet(v4.network, name, cidrs)?),
        None if cidrs.v6.is_none() => bail!(
            "Node {name}'s podCIDRs have no IPv6 CIDR (only {}), and the network is IPv6-only",
            shown(cidrs.v4)
        ),
        None => None,
    };
    let (Some(v6), Some(subnet6)) = (&config.ipv6, cidrs.v6) else {
        return Ok((subnet, None));
    };
    if !v6.network.contains(&subnet6) {
        bail!(
            "the IPv6Network {} in net-conf.json does not contain Node {name}'s IPv6 podCIDR \
             {subnet6}",
            v6.network
        );
    }
    if subnet6.prefix_len() != v6.subnet_len {
        bail!(
            "Node {name}'s IPv6 podCIDR {subnet6} is a /{}, but net-conf.json's IPv6SubnetLen \
             is {}: set \"IPv6SubnetLen\":{} in net-conf.json (twill takes every node's IPv6 \
             podCIDR to be that long)",
            subnet6.prefix_len(),
            v6.subnet_len,
            subnet6.prefix_len()
        );
    }
    Ok((subnet, Some(subnet6)))
}

/// The IPv4 podCIDR, which must lie in `network`.
fn own_ipv4_subnet(network: Ipv4Net, name: &str, cidrs: NodeCidrs) -> anyhow::Result<Ipv4Net> {
    let Some(subnet) = cidrs.v4 else {
        bail!(
            "Node {name}'s podCIDRs have no IPv4 CIDR (only {}): twill's lease needs one",
            shown(cidrs.v6)
        );
    };
    if !network.contains(&subnet) {
        bail!("the network {network} in net-conf.json does not contain Node {name}'s podCIDR {subnet}");
    }
    Ok(subnet)
}

fn shown(cidr: Option<impl Display>) -> String {
    cidr.map_or("none".to_string(), |c| c.to_string())
}

/// Sets Node `name`'s NetworkUnavailable condition to False, as flanneld does once subnet.env is
/// written and the rules are in place.
pub(super) async fn mark_network_available(
    nodes: &Api<NodeView>,
    name: &str,
    timing: &KubeTiming,
) -> anyhow::Result<()> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let patch = serde_json::json!({"status": {"conditions": [{
        "type": "NetworkUnavailable",
        "status": "False",
        "reason": "FlannelIsUp",
        "message": "twill (flannel-compatible) is running on this node",
        "lastTransitionTime": now,
        "lastHeartbeatTime": now,
    }]}});
    patch_status(nodes, name, timing, Patch::Strategic(&patch)).await
}

/// Patches Node `name` through `nodes/status`, retrying while the API server is unreachable.
async fn patch_status(
    nodes: &Api<NodeView>,
    name: &str,
    timing: &KubeTiming,
    patch: Patch<&serde_json::Value>,
) -> anyhow::Result<()> {
    let resource = format!("nodes/{name}/status");
    let params = PatchParams::default();
    let patched = retry(timing, "patch", &resource, || {
        nodes.patch_status(name, &params, &patch)
    });
    patched.await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUAL: &str = r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/56"}"#;
    const V4: &str = r#"{"Network":"10.5.0.0/16"}"#;

    fn subnets(config: &str, cidrs: &[&str]) -> anyhow::Result<(Option<Ipv4Net>, Option<Ipv6Net>)> {
        let config = Config::from_json(config).unwrap();
        let cidrs = NodeCidrs {
            v4: cidrs
                .iter()
                .find(|c| !c.contains(':'))
                .map(|c| c.parse().unwrap()),
            v6: cidrs
                .iter()
                .find(|c| c.contains(':'))
                .map(|c| c.parse().unwrap()),
        };
        own_subnets(&config, "node-0", cidrs)
    }

    fn err(config: &str, cidrs: &[&str]) -> String {
        let e = subnets(config, cidrs).unwrap_err().to_string();
        assert!(!e.contains('\n'), "{e}");
        e
    }

    #[test]
    fn a_dual_stack_node_leases_both_podcidrs() {
        let (v4, v6) = subnets(DUAL, &["10.5.1.0/24", "fd10:0:0:1::/64"]).unwrap();
        assert_eq!(v4, Some("10.5.1.0/24".parse().unwrap()));
        assert_eq!(v6, Some("fd10:0:0:1::/64".parse().unwrap()));
    }

    #[test]
    fn without_an_ipv6_podcidr_or_ipv6_config_the_lease_is_ipv4_only() {
        let v4 = subnets(DUAL, &["10.5.1.0/24"]).unwrap();
        assert_eq!(v4, (Some("10.5.1.0/24".parse().unwrap()), None));
        // flanneld on an IPv4-only network ignores the Node's IPv6 podCIDR.
        let ignored = subnets(V4, &["10.5.1.0/24", "fd99::/64"]).unwrap();
        assert_eq!(ignored, v4);
    }

    #[test]
    fn podcidrs_outside_the_networks_are_refused_naming_the_node() {
        let e = err(DUAL, &["10.5.1.0/24", "fd99:0:0:1::/64"]);
        assert_eq!(
            e,
            "the IPv6Network fd10::/56 in net-conf.json does not contain Node node-0's IPv6 \
             podCIDR fd99:0:0:1::/64"
        );
        let e = err(DUAL, &["10.9.1.0/24", "fd10:0:0:1::/64"]);
        assert!(
            e.contains("does not contain Node node-0's podCIDR 10.9.1.0/24"),
            "{e}"
        );
    }

    #[test]
    fn an_ipv6_podcidr_of_another_length_than_ipv6_subnet_len_is_refused_with_the_fix() {
        let e = err(DUAL, &["10.5.1.0/24", "fd10:0:0:1::/80"]);
        assert!(
            e.contains("fd10:0:0:1::/80 is a /80, but net-conf.json's IPv6SubnetLen is 64")
                && e.contains(r#"set "IPv6SubnetLen":80"#),
            "{e}"
        );
        let long = r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/56","IPv6SubnetLen":80}"#;
        assert!(subnets(long, &["10.5.1.0/24", "fd10:0:0:1::/80"]).is_ok());
    }

    #[test]
    fn a_node_with_only_an_ipv6_podcidr_is_refused() {
        let e = err(DUAL, &["fd10:0:0:1::/64"]);
        assert!(
            e.contains("Node node-0's podCIDRs have no IPv4 CIDR (only fd10:0:0:1::/64)"),
            "{e}"
        );
    }

    #[test]
    fn an_ipv6_only_node_leases_its_ipv6_podcidr_alone() {
        let only = r#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd10::/56"}"#;
        let (v4, v6) = subnets(only, &["10.5.1.0/24", "fd10:0:0:1::/64"]).unwrap();
        assert_eq!((v4, v6), (None, Some("fd10:0:0:1::/64".parse().unwrap())));
        let e = err(only, &["10.5.1.0/24"]);
        assert_eq!(
            e,
            "Node node-0's podCIDRs have no IPv6 CIDR (only 10.5.1.0/24), and the network is \
             IPv6-only"
        );
        let e = err(only, &["fd99:0:0:1::/64"]);
        assert!(
            e.contains("does not contain Node node-0's IPv6 podCIDR"),
            "{e}"
        );
    }
}
