//! flannel's Node annotations: the interface between twill and flanneld nodes in one cluster.
//!
//! A Node is a lease when it carries `<prefix>kube-subnet-manager: "true"`; its subnet is the
//! Node's podCIDR and its attributes are the `public-ip`, `backend-type` and `backend-data`
//! annotations, written exactly as flanneld v0.28.9 writes them (`backend-type` is empty for
//! udp, `backend-data` is the JSON text `null` for backends without data).

use super::node_view::NodeView;
use crate::lease::{BackendData, Created, Lease, LeaseAttrs};
use anyhow::bail;
use ipnet::Ipv4Net;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

/// flanneld's `--kube-annotation-prefix` default.
pub const DEFAULT_PREFIX: &str = "flannel.alpha.coreos.com";

/// The annotation keys for one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Annotations {
    pub subnet_kube_managed: String,
    pub backend_data: String,
    pub backend_type: String,
    pub public_ip: String,
    /// Set by an operator to make peers reach this node at another address (flannel's NAT
    /// escape hatch); the node then publishes it as its `public-ip`.
    pub public_ip_overwrite: String,
}

/// What one Node is to the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeLease {
    /// No flannel (or twill) runs there, or it has not annotated the Node yet.
    NotFlannel,
    Lease(Lease),
    /// It claims to be a flannel node but its podCIDR or annotations cannot be read.
    Unreadable(String),
}

impl Annotations {
    /// The keys under `prefix`, normalised as flanneld does: a prefix without a slash gets one
    /// (`example.com` → `example.com/`), one with a name part gets a dash (`example.com/x` →
    /// `example.com/x-`). Refused unless it is `fqdn/[name-]`, which Kubernetes requires of keys.
    pub fn new(prefix: &str) -> anyhow::Result<Annotations> {
        let prefix = normalise(prefix)?;
        let key = |name: &str| format!("{prefix}{name}");
        Ok(Annotations {
            subnet_kube_managed: key("kube-subnet-manager"),
            backend_data: key("backend-data"),
            backend_type: key("backend-type"),
            public_ip: key("public-ip"),
            public_ip_overwrite: key("public-ip-overwrite"),
        })
    }

    /// Reads a Node as a lease.
    pub fn node_lease(&self, node: &NodeView) -> NodeLease {
        if node.annotation(&self.subnet_kube_managed) != Some("true") {
            return NodeLease::NotFlannel;
        }
        match self.read_lease(node) {
            Ok(lease) => NodeLease::Lease(lease),
            Err(why) => NodeLease::Unreadable(format!("{why:#}")),
        }
    }

    fn read_lease(&self, node: &NodeView) -> anyhow::Result<Lease> {
        let get = |key: &str| node.annotation(key);
        let subnet = pod_cidr(node)?;
        let ip_text = get(&self.public_ip).unwrap_or_default();
        let Ok(public_ip) = ip_text.parse::<Ipv4Addr>() else {
            bail!(
                "annotation {} {ip_text:?} is not an IPv4 address",
                self.public_ip
            );
        };
        let backend_type = get(&self.backend_type).filter(|t| !t.is_empty());
        let backend_data = match get(&self.backend_data).map(str::trim) {
            None | Some("" | "null") => None,
            Some(json) => match serde_json::from_str::<serde_json::Value>(json) {
                Ok(value) => Some(BackendData::from(value)),
                Err(e) => bail!("annotation {} is not JSON ({e})", self.backend_data),
            },
        };
        let attrs = LeaseAttrs {
            public_ip,
            public_ipv6: None,
            backend_type: backend_type.map(Arc::from),
            backend_data,
            backend_v6_data: None,
        };
        Ok(Lease::new(subnet, attrs).with_created(created(node)))
    }

    /// The annotations this node must carry for `attrs`, as flanneld writes them; an operator's
    /// `public-ip-overwrite` on the Node wins over our own address.
    pub fn own(&self, attrs: &LeaseAttrs, node: &NodeView) -> BTreeMap<String, String> {
        let overwrite = node.annotation(&self.public_ip_overwrite);
        let overwrite = overwrite.filter(|ip| !ip.is_empty()).map(str::to_string);
        let public_ip = overwrite.unwrap_or(attrs.public_ip.to_string());
        let data = attrs
            .backend_data
            .as_ref()
            .map_or("null".to_string(), |d| d.json().to_string());
        BTreeMap::from([
            (
                self.backend_type.clone(),
                attrs.backend_type.as_deref().unwrap_or("").into(),
            ),
            (self.backend_data.clone(), data),
            (self.public_ip.clone(), public_ip),
            (self.subnet_kube_managed.clone(), "true".into()),
        ])
    }

    /// Those of `wanted` that the Node does not already carry with the same value.
    pub fn missing(wanted: BTreeMap<String, String>, node: &NodeView) -> BTreeMap<String, String> {
        wanted
            .into_iter()
            .filter(|(k, v)| node.annotation(k) != Some(v.as_str()))
            .collect()
    }
}

/// A Node lease's creation order: the Node's creationTimestamp, ties broken by its name. The API
/// server sets both once, so every node reads the same order.
fn created(node: &NodeView) -> Created {
    Created::named(node.created_second(), node.name())
}

/// The Node's IPv4 pod CIDR: the first IPv4 entry of `spec.podCIDRs`, else `spec.podCIDR`.
/// `None` while the controller manager has not assigned one.
pub fn assigned_pod_cidr(node: &NodeView) -> anyhow::Result<Option<Ipv4Net>> {
    let Some(first) = node.pod_cidrs().find(|c| !c.contains(':')) else {
        return Ok(None);
    };
    let Ok(cidr) = first.parse::<Ipv4Net>() else {
        bail!("podCIDR {first:?} is not an IPv4 CIDR");
    };
    if cidr.trunc() != cidr {
        bail!("podCIDR {first} has host bits set");
    }
    Ok(Some(cidr))
}

fn pod_cidr(node: &NodeView) -> anyhow::Result<Ipv4Net> {
    match assigned_pod_cidr(node)? {
        Some(cidr) => Ok(cidr),
        None => bail!("it has no IPv4 podCIDR"),
    }
}

fn normalise(prefix: &str) -> anyhow::Result<String> {
    let mut prefix = prefix.to_string();
    match prefix.matches('/').count() {
        0 => prefix.push('/'),
        1 => {}
        _ => bail!("--kube-annotation-prefix {prefix:?} may contain at most one slash"),
    }
    if !prefix.ends_with('/') && !prefix.ends_with('-') {
        prefix.push('-');
    }
    let (domain, name) = prefix.split_once('/').expect("one slash");
    let word = |w: &str| {
        !w.is_empty()
            && w.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    };
    let labels: Vec<&str> = domain.split('.').collect();
    let name_ok = name.is_empty() || name.strip_suffix('-').is_some_and(word);
    if labels.len() < 2 || !labels.iter().all(|l| word(l)) || !name_ok {
        bail!(
            "--kube-annotation-prefix {prefix:?} must be a domain name, optionally followed by /name \
             (lowercase letters, digits, '-', '_'), e.g. flannel.alpha.coreos.com"
        );
    }
    Ok(prefix)
}

#[cfg(test)]
mod tests {
    use super::super::node_view::PodCidrs;
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::api::ObjectMeta;

    fn node(cidr: Option<&str>, annotations: &[(&str, &str)]) -> NodeView {
        let annotations = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()));
        NodeView {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                annotations: Some(annotations.collect()),
                ..Default::default()
            },
            spec: Some(PodCidrs {
                pod_cidr: cidr.map(str::to_string),
                pod_cidrs: cidr.map(|c| vec![c.to_string()]),
            }),
        }
    }

    #[test]
    fn prefixes_are_normalised_as_flanneld_does() {
        let keys = |p| Annotations::new(p).unwrap().public_ip;
        assert_eq!(keys(DEFAULT_PREFIX), "flannel.alpha.coreos.com/public-ip");
        assert_eq!(keys("example.com/"), "example.com/public-ip");
        assert_eq!(keys("example.com/twill"), "example.com/twill-public-ip");
        assert_eq!(keys("example.com/twill-"), "example.com/twill-public-ip");
        for bad in [
            "a/b/c",
            "nodomain",
            "Example.com",
            "example.com/Tw",
            "exa mple.com",
        ] {
            let err = Annotations::new(bad).unwrap_err().to_string();
            assert!(err.contains("--kube-annotation-prefix"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_flannel_node_is_a_lease() {
        let a = Annotations::new(DEFAULT_PREFIX).unwrap();
        let n = node(
            Some("10.244.3.0/24"),
            &[
                ("flannel.alpha.coreos.com/kube-subnet-manager", "true"),
                ("flannel.alpha.coreos.com/public-ip", "10.200.0.3"),
                ("flannel.alpha.coreos.com/backend-type", "vxlan"),
                (
                    "flannel.alpha.coreos.com/backend-data",
                    r#"{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:ff"}"#,
                ),
            ],
        );
        let want = LeaseAttrs::vxlan("10.200.0.3".parse().unwrap(), 1, "aa:bb:cc:dd:ee:ff");
        assert_eq!(
            a.node_lease(&n),
            NodeLease::Lease(Lease::new("10.244.3.0/24".parse().unwrap(), want))
        );
    }

    #[test]
    fn a_node_lease_is_created_when_its_node_was_and_ties_go_by_name() {
        let a = Annotations::new(DEFAULT_PREFIX).unwrap();
        let managed = [
            ("flannel.alpha.coreos.com/kube-subnet-manager", "true"),
            ("flannel.alpha.coreos.com/public-ip", "10.200.0.3"),
        ];
        let made_at = |name: &str, second: i64| {
            let mut n = node(Some("10.244.3.0/24"), &managed);
            n.metadata.name = Some(name.into());
            let at = k8s_openapi::jiff::Timestamp::from_second(second).unwrap();
            n.metadata.creation_timestamp = Some(Time(at));
            match a.node_lease(&n) {
                NodeLease::Lease(lease) => lease.created,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            made_at("n1", 1_700_000_000),
            Created::named(1_700_000_000, "n1")
        );
        assert!(made_at("b", 5) < made_at("a", 6), "the older Node first");
        assert!(made_at("a", 5) < made_at("b", 5), "then by name");
    }

    #[test]
    fn udp_nodes_carry_an_empty_type_and_null_data() {
        let a = Annotations::new(DEFAULT_PREFIX).unwrap();
        let attrs = LeaseAttrs::udp("10.200.0.1".parse().unwrap());
        let own = a.own(&attrs, &node(Some("10.244.1.0/24"), &[]));
        assert_eq!(own["flannel.alpha.coreos.com/backend-type"], "");
        assert_eq!(own["flannel.alpha.coreos.com/backend-data"], "null");
        assert_eq!(own["flannel.alpha.coreos.com/public-ip"], "10.200.0.1");
        assert_eq!(own["flannel.alpha.coreos.com/kube-subnet-manager"], "true");
        let pairs: Vec<(&str, &str)> = own.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let annotated = node(Some("10.244.1.0/24"), &pairs);
        assert!(Annotations::missing(own.clone(), &annotated).is_empty());
        assert_eq!(
            a.node_lease(&annotated),
            NodeLease::Lease(Lease::new("10.244.1.0/24".parse().unwrap(), attrs))
        );
    }

    #[test]
    fn an_operators_public_ip_overwrite_is_published() {
        let a = Annotations::new(DEFAULT_PREFIX).unwrap();
        let attrs = LeaseAttrs::host_gw("10.200.0.1".parse().unwrap());
        let n = node(
            None,
            &[("flannel.alpha.coreos.com/public-ip-overwrite", "192.0.2.7")],
        );
        assert_eq!(
            a.own(&attrs, &n)["flannel.alpha.coreos.com/public-ip"],
            "192.0.2.7"
        );
    }

    #[test]
    fn bogus_nodes_are_unreadable_with_the_reason_and_others_are_not_leases() {
        let a = Annotations::new(DEFAULT_PREFIX).unwrap();
        let managed = ("flannel.alpha.coreos.com/kube-subnet-manager", "true");
        let ip = ("flannel.alpha.coreos.com/public-ip", "10.200.0.3");
        let cases = [
            (node(None, &[managed, ip]), "no IPv4 podCIDR"),
            (node(Some("10.244.3.1/24"), &[managed, ip]), "host bits"),
            (node(Some("nonsense"), &[managed, ip]), "not an IPv4 CIDR"),
            (
                node(
                    Some("10.244.3.0/24"),
                    &[managed, ("flannel.alpha.coreos.com/public-ip", "x")],
                ),
                "public-ip \"x\" is not an IPv4",
            ),
            (
                node(
                    Some("10.244.3.0/24"),
                    &[
                        managed,
                        ip,
                        ("flannel.alpha.coreos.com/backend-data", "{oops"),
                    ],
                ),
                "backend-data is not JSON",
            ),
        ];
        for (n, want) in cases {
            match a.node_lease(&n) {
                NodeLease::Unreadable(why) => assert!(why.contains(want), "{why} lacks {want}"),
                other => panic!("{other:?} for {want}"),
            }
        }
        assert_eq!(
            a.node_lease(&node(Some("10.244.3.0/24"), &[ip])),
            NodeLease::NotFlannel
        );
    }

    #[test]
    fn dual_stack_nodes_yield_their_ipv4_cidr() {
        let mut n = node(Some("fd00:10:244:1::/64"), &[]);
        n.spec.as_mut().unwrap().pod_cidrs =
            Some(vec!["fd00:10:244:1::/64".into(), "10.244.1.0/24".into()]);
        assert_eq!(
            assigned_pod_cidr(&n).unwrap(),
            Some("10.244.1.0/24".parse().unwrap())
        );
    }

    proptest::proptest! {
        /// Whatever another node (or anyone allowed to patch Nodes) writes into the
        /// annotations and podCIDRs, reading the Node never panics; it is a lease, unreadable
        /// with a reason, or not flannel's.
        #[test]
        fn any_annotations_read_without_panic(
            cidr in proptest::option::of(".{0,24}"),
            cidrs in proptest::collection::vec(".{0,24}", 0..3),
            ip in ".{0,20}",
            kind in ".{0,12}",
            data in ".{0,64}",
        ) {
            let a = Annotations::new(DEFAULT_PREFIX).unwrap();
            let mut n = node(cidr.as_deref(), &[
                ("flannel.alpha.coreos.com/kube-subnet-manager", "true"),
                ("flannel.alpha.coreos.com/public-ip", &ip),
                ("flannel.alpha.coreos.com/backend-type", &kind),
                ("flannel.alpha.coreos.com/backend-data", &data),
            ]);
            n.spec.as_mut().unwrap().pod_cidrs = Some(cidrs);
            let read = a.node_lease(&n);
            proptest::prop_assert!(!matches!(read, NodeLease::NotFlannel));
        }
    }
}
