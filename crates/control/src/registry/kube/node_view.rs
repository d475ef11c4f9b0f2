//! The part of a Node that flannel reads: its name, creation time, annotations and pod CIDRs.
//!
//! The registry reads Nodes into this view rather than into k8s-openapi's whole `Node`. A
//! kubelet's Node carries `status.images` and `managedFields`, tens of kilobytes of which twill
//! reads nothing; serde skips unknown fields without building them, so a list of thousands of
//! Nodes costs the parse and not the objects.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::ClusterResourceScope;
use kube::api::ObjectMeta;
use kube::Resource;
use serde::{Deserialize, Deserializer};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// A Node as the registry sees it; the API server's `nodes` resource.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeView {
    #[serde(deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<PodCidrs>,
}

/// `spec.podCIDR` and `spec.podCIDRs`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodCidrs {
    #[serde(default, rename = "podCIDR")]
    pub pod_cidr: Option<String>,
    #[serde(default, rename = "podCIDRs")]
    pub pod_cidrs: Option<Vec<String>>,
}

impl NodeView {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        let annotations = self.metadata.annotations.as_ref()?;
        annotations.get(key).map(String::as_str)
    }

    /// The Node's pod CIDRs as flanneld reads them: `podCIDRs`, or `podCIDR` alone when that
    /// list is empty (a Node written before dual-stack). The API server keeps `podCIDR` equal
    /// to `podCIDRs[0]`, so the list says everything when it is there.
    pub fn pod_cidrs(&self) -> Vec<&str> {
        let Some(spec) = self.spec.as_ref() else {
            return Vec::new();
        };
        match spec.pod_cidrs.as_deref() {
            Some(listed) if !listed.is_empty() => listed.iter().map(String::as_str).collect(),
            _ => spec.pod_cidr.as_deref().into_iter().collect(),
        }
    }

    /// Seconds since the epoch at which the API server created the Node (0 if unknown).
    pub fn created_second(&self) -> i64 {
        let at = self.metadata.creation_timestamp.as_ref();
        at.map_or(0, |t| t.0.as_second())
    }
}

impl Resource for NodeView {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Node".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "nodes".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The metadata fields the registry and the watch use; the rest (managedFields above all) is
/// skipped unparsed into values.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimMeta {
    name: Option<String>,
    resource_version: Option<String>,
    uid: Option<String>,
    creation_timestamp: Option<Time>,
    annotations: Option<BTreeMap<String, String>>,
}

fn slim_meta<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ObjectMeta, D::Error> {
    let slim = SlimMeta::deserialize(deserializer)?;
    Ok(ObjectMeta {
        name: slim.name,
        resource_version: slim.resource_version,
        uid: slim.uid,
        creation_timestamp: slim.creation_timestamp,
        annotations: slim.annotations,
        ..ObjectMeta::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Node as a kubelet and the API server write it (trimmed), with the parts twill reads
    /// and the large parts it does not.
    const NODE: &str = r#"{
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": "w1", "uid": "8d0c", "resourceVersion": "812",
            "creationTimestamp": "2026-11-20T10:00:00Z",
            "labels": {"kubernetes.io/os": "linux"},
            "annotations": {"flannel.alpha.coreos.com/public-ip": "10.200.0.3"},
            "managedFields": [{"manager": "kubelet", "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:status": {"f:images": {}}}}]
        },
        "spec": {"podCIDR": "10.244.3.0/24", "podCIDRs": ["10.244.3.0/24", "fd00::/64"],
                 "providerID": "kind://w1"},
        "status": {"images": [{"names": ["registry.k8s.io/pause:3.10"], "sizeBytes": 320368}],
                   "conditions": [{"type": "Ready", "status": "True"}]}
    }"#;

    #[test]
    fn a_whole_node_reads_into_the_view_with_what_flannel_needs() {
        let node: NodeView = serde_json::from_str(NODE).unwrap();
        assert_eq!(node.name(), "w1");
        assert_eq!(node.metadata.resource_version.as_deref(), Some("812"));
        assert_eq!(
            node.annotation("flannel.alpha.coreos.com/public-ip"),
            Some("10.200.0.3")
        );
        assert_eq!(node.pod_cidrs(), ["10.244.3.0/24", "fd00::/64"]);
        assert_eq!(node.created_second(), 1_795_168_800);
        assert!(node.metadata.managed_fields.is_none() && node.metadata.labels.is_none());
    }

    #[test]
    fn a_node_without_spec_or_annotations_reads_empty() {
        let node: NodeView = serde_json::from_str(r#"{"metadata": {"name": "w2"}}"#).unwrap();
        assert!(node.pod_cidrs().is_empty());
        assert_eq!(node.annotation("x"), None);
        assert_eq!(node.created_second(), 0);
    }

    #[test]
    fn a_node_without_pod_cidrs_has_its_pod_cidr_as_flanneld_reads_it() {
        for spec in [
            r#"{"podCIDR": "10.244.3.0/24"}"#,
            r#"{"podCIDR": "10.244.3.0/24", "podCIDRs": []}"#,
        ] {
            let json = format!(r#"{{"metadata": {{"name": "w3"}}, "spec": {spec}}}"#);
            let node: NodeView = serde_json::from_str(&json).unwrap();
            assert_eq!(node.pod_cidrs(), ["10.244.3.0/24"], "{spec}");
        }
    }

    #[test]
    fn the_view_is_the_nodes_resource() {
        assert_eq!(NodeView::url_path(&(), None), "/api/v1/nodes");
        assert_eq!(NodeView::api_version(&()), "v1");
    }
}
