//! flannel's Node annotations: the interface between twill and flanneld nodes in one cluster.
//!
//! A Node is a lease when it carries `<prefix>kube-subnet-manager: "true"`; its subnet is the
//! Node's IPv4 podCIDR and its attributes are the `public-ip`, `backend-type` and
//! `backend-data` annotations, written exactly as flanneld v0.28.9 writes them (`backend-type`
//! is empty for udp, `backend-data` is the JSON text `null` for backends without data). On a
//! dual-stack network its IPv6 side is the Node's IPv6 podCIDR with the `public-ipv6` and
//! `backend-v6-data` annotations. What this node writes on its own Node is in [`super::publish`].

use super::node_cidrs::NodeCidrs;
use super::node_view::NodeView;
use crate::lease::{BackendData, Created, Lease, LeaseAttrs};
use crate::stack::Stack;
use anyhow::bail;
use ipnet::Ipv6Net;
use std::net::{Ipv4Addr, Ipv6Addr};

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
    /// A dual-stack node's backend data for IPv6 (vxlan's second device's VNI and MAC).
    pub backend_v6_data: String,
    /// A dual-stack node's IPv6 underlay address.
    pub public_ipv6: String,
    /// The operator's override of `public-ipv6`, as `public-ip-overwrite` is of `public-ip`.
    pub public_ipv6_overwrite: String,
    /// Set by an operator on a Node to give the node its public address before it starts,
    /// as `--public-ip` would (flanneld's `node-public-ip`).
    pub node_public_ip: String,
    /// The same for IPv6 (`node-public-ipv6`).
    pub node_public_ipv6: String,
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
            backend_v6_data: key("backend-v6-data"),
            public_ipv6: key("public-ipv6"),
            public_ipv6_overwrite: key("public-ipv6-overwrite"),
            node_public_ip: key("node-public-ip"),
            node_public_ipv6: key("node-public-ipv6"),
        })
    }

    /// Reads a Node as a lease of the network's `stack`.
    pub fn node_lease(&self, node: &NodeView, stack: Stack) -> NodeLease {
        if node.annotation(&self.subnet_kube_managed) != Some("true") {
            return NodeLease::NotFlannel;
        }
        let read = NodeCidrs::of(node).and_then(|cidrs| match stack {
            Stack::Ipv4 => self.read_lease(node, cidrs),
            Stack::Dual => {
                let lease = self.read_lease(node, cidrs)?;
                let (subnet, public_ipv6, data) = self.read_ipv6_side(node, cidrs, stack)?;
                let attrs = lease.attrs().with_ipv6(public_ipv6, data);
                Ok(Lease::new(lease.subnets.with_v6(subnet), attrs))
            }
            // flanneld's `nodeToLease` reads no IPv4 podCIDR, `public-ip` or `backend-data`
            // on an IPv6-only network.
            Stack::Ipv6 => {
                let (subnet, public_ipv6, data) = self.read_ipv6_side(node, cidrs, stack)?;
                let attrs = LeaseAttrs::typed(public_ipv6, self.backend_type(node), None);
                Ok(Lease::new(subnet, attrs.with_ipv6(public_ipv6, data)))
            }
        });
        match read {
            Ok(lease) => NodeLease::Lease(lease.with_created(created(node))),
            Err(why) => NodeLease::Unreadable(format!("{why:#}")),
        }
    }

    /// The IPv4 lease, as flanneld's `nodeToLease` reads it.
    fn read_lease(&self, node: &NodeView, cidrs: NodeCidrs) -> anyhow::Result<Lease> {
        let Some(subnet) = cidrs.v4 else {
            bail!("it has no IPv4 podCIDR");
        };
        let ip_text = node.annotation(&self.public_ip).unwrap_or_default();
        let Ok(public_ip) = ip_text.parse::<Ipv4Addr>() else {
            bail!(
                "annotation {} {} is not an IPv4 address",
                self.public_ip,
                crate::shown::quoted(ip_text)
            );
        };
        let backend_data = backend_data(node, &self.backend_data)?;
        let attrs = LeaseAttrs::typed(public_ip, self.backend_type(node), backend_data);
        Ok(Lease::new(subnet, attrs))
    }

    /// The `backend-type` annotation; `None` (udp) when absent or empty.
    fn backend_type<'a>(&self, node: &'a NodeView) -> Option<&'a str> {
        node.annotation(&self.backend_type)
            .filter(|t| !t.is_empty())
    }

    /// A lease's IPv6 side on a dual-stack or IPv6-only network: its subnet, `public-ipv6` and
    /// `backend-v6-data`. flanneld's `nodeToLease` requires the IPv6 podCIDR and a
    /// `public-ipv6` there and ignores a Node without them, so twill does not take such a Node
    /// for an IPv4-only peer either.
    fn read_ipv6_side(
        &self,
        node: &NodeView,
        cidrs: NodeCidrs,
        stack: Stack,
    ) -> anyhow::Result<(Ipv6Net, Ipv6Addr, Option<BackendData>)> {
        let Some(subnet) = cidrs.v6 else {
            bail!("it has no IPv6 podCIDR, and the network is {stack}");
        };
        let ip_text = node.annotation(&self.public_ipv6).unwrap_or_default();
        let Ok(public_ipv6) = ip_text.parse::<Ipv6Addr>() else {
            bail!(
                "annotation {} {} is not an IPv6 address, and the network is {stack}",
                self.public_ipv6,
                crate::shown::quoted(ip_text)
            );
        };
        let data = backend_data(node, &self.backend_v6_data)?;
        Ok((subnet, public_ipv6, data))
    }
}

/// A `backend-data` or `backend-v6-data` annotation: `None` when absent, empty or `null`.
fn backend_data(node: &NodeView, key: &str) -> anyhow::Result<Option<BackendData>> {
    match node.annotation(key).map(str::trim) {
        None | Some("" | "null") => Ok(None),
        Some(json) => match serde_json::from_str::<serde_json::Value>(json) {
            Ok(value) => Ok(Some(BackendData::from(value))),
            Err(e) => bail!("annotation {key} is not JSON ({e})"),
        },
    }
}

/// A Node lease's creation order: the Node's creationTimestamp, ties broken by its name. The API
/// server sets both once, so every node reads the same order.
fn created(node: &NodeView) -> Created {
    Created::named(node.created_second(), node.name())
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
pub(super) mod tests {
    use super::super::node_view::PodCidrs;
    use super::*;
    use crate::config::Config;
    use crate::lease_check::{LeaseRules, Rejection};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::api::ObjectMeta;

    /// Node `n1` with `cidrs` as its podCIDRs (the first also as podCIDR) and `annotations`.
    pub fn node(cidrs: &[&str], annotations: &[(&str, &str)]) -> NodeView {
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
                pod_cidr: cidrs.first().map(|c| c.to_string()),
                pod_cidrs: Some(cidrs.iter().map(|c| c.to_string()).collect()),
            }),
        }
    }

    const MANAGED: (&str, &str) = ("flannel.alpha.coreos.com/kube-subnet-manager", "true");
    const IP: (&str, &str) = ("flannel.alpha.coreos.com/public-ip", "10.200.0.3");
    const IPV6: (&str, &str) = ("flannel.alpha.coreos.com/public-ipv6", "fd00:200::3");
    const VXLAN: (&str, &str) = ("flannel.alpha.coreos.com/backend-type", "vxlan");
    const DATA: (&str, &str) = (
        "flannel.alpha.coreos.com/backend-data",
        r#"{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:ff"}"#,
    );
    const V6_DATA: (&str, &str) = (
        "flannel.alpha.coreos.com/backend-v6-data",
        r#"{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:66"}"#,
    );
    const DUAL: [&str; 2] = ["10.244.3.0/24", "fd10:0:0:3::/64"];

    fn read(n: &NodeView, dual_stack: bool) -> NodeLease {
        let stack = if dual_stack { Stack::Dual } else { Stack::Ipv4 };
        read_as(n, stack)
    }

    fn read_as(n: &NodeView, stack: Stack) -> NodeLease {
        Annotations::new(DEFAULT_PREFIX)
            .unwrap()
            .node_lease(n, stack)
    }

    fn lease(read: NodeLease) -> Lease {
        match read {
            NodeLease::Lease(lease) => lease,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn prefixes_are_normalised_as_flanneld_does() {
        let keys = |p| Annotations::new(p).unwrap();
        assert_eq!(
            keys(DEFAULT_PREFIX).public_ip,
            "flannel.alpha.coreos.com/public-ip"
        );
        assert_eq!(keys("example.com/").public_ip, "example.com/public-ip");
        assert_eq!(
            keys("example.com/twill").public_ipv6,
            "example.com/twill-public-ipv6"
        );
        assert_eq!(
            keys("example.com/twill-").backend_v6_data,
            "example.com/twill-backend-v6-data"
        );
        assert_eq!(
            keys(DEFAULT_PREFIX).public_ipv6_overwrite,
            "flannel.alpha.coreos.com/public-ipv6-overwrite"
        );
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
        let n = node(&["10.244.3.0/24"], &[MANAGED, IP, VXLAN, DATA]);
        let want = LeaseAttrs::vxlan(
            "10.200.0.3".parse::<Ipv4Addr>().unwrap(),
            1,
            "aa:bb:cc:dd:ee:ff",
        );
        assert_eq!(
            read(&n, false),
            NodeLease::Lease(Lease::new(
                "10.244.3.0/24".parse::<ipnet::Ipv4Net>().unwrap(),
                want
            ))
        );
    }

    #[test]
    fn a_dual_stack_flannel_node_is_a_dual_stack_lease() {
        let n = node(&DUAL, &[MANAGED, IP, VXLAN, DATA, IPV6, V6_DATA]);
        let got = lease(read(&n, true));
        assert_eq!(got.subnets.v6(), Some("fd10:0:0:3::/64".parse().unwrap()));
        assert_eq!(got.public_addrs.v6(), Some("fd00:200::3".parse().unwrap()));
        let mac = got.backend_v6_data.as_ref().and_then(|d| d.get("VtepMAC"));
        assert_eq!(mac, Some("aa:bb:cc:dd:ee:66".into()));
        // An IPv4-only network reads the same Node as flanneld does: its IPv4 side alone.
        let v4 = lease(read(&n, false));
        assert_eq!((v4.subnets.v6(), v4.public_addrs.v6()), (None, None));
        assert_eq!(v4.backend_v6_data, None);
        // host-gw writes JSON null as its IPv6 data.
        let host_gw = [
            ("flannel.alpha.coreos.com/backend-type", "host-gw"),
            ("flannel.alpha.coreos.com/backend-v6-data", "null"),
        ];
        let n = node(&DUAL, &[MANAGED, IP, IPV6, host_gw[0], host_gw[1]]);
        let got = lease(read(&n, true));
        assert_eq!(got.backend_v6_data, None);
        assert!(got.ipv6_side().is_some());
    }

    /// flanneld's IPv6-only vxlan Node has no public-ip or backend-data; its lease is the
    /// IPv6 podCIDR, named by it, with no IPv4 subnet or PublicIP, whatever IPv4 podCIDR the
    /// Node has.
    #[test]
    fn an_ipv6_only_flannel_node_is_an_ipv6_only_lease() {
        let n = node(&DUAL, &[MANAGED, VXLAN, IPV6, V6_DATA]);
        let got = lease(read_as(&n, Stack::Ipv6));
        let subnet6 = "fd10:0:0:3::/64".parse().unwrap();
        assert_eq!(got.id(), crate::lease::SubnetId::V6(subnet6));
        assert_eq!((got.subnets.v4(), got.public_addrs.v4()), (None, None));
        assert_eq!(
            (got.backend_data.as_ref(), got.public_addrs.v6()),
            (None, Some("fd00:200::3".parse().unwrap()))
        );
        let mac = got.backend_v6_data.as_ref().and_then(|d| d.get("VtepMAC"));
        assert_eq!(mac, Some("aa:bb:cc:dd:ee:66".into()));
        let no_ipv6 = node(&["10.244.3.0/24"], &[MANAGED, VXLAN, IPV6, V6_DATA]);
        let NodeLease::Unreadable(why) = read_as(&no_ipv6, Stack::Ipv6) else {
            panic!("a Node without an IPv6 podCIDR is no IPv6-only lease");
        };
        assert_eq!(why, "it has no IPv6 podCIDR, and the network is IPv6-only");
    }

    #[test]
    fn a_node_without_its_ipv6_side_is_unreadable_on_a_dual_stack_network() {
        let cases = [
            (
                node(&["10.244.3.0/24"], &[MANAGED, IP, IPV6]),
                "it has no IPv6 podCIDR, and the network is dual-stack",
            ),
            (
                node(&DUAL, &[MANAGED, IP]),
                "annotation flannel.alpha.coreos.com/public-ipv6 \"\" is not an IPv6 address",
            ),
            (
                node(
                    &DUAL,
                    &[
                        MANAGED,
                        IP,
                        ("flannel.alpha.coreos.com/public-ipv6", "10.200.0.3"),
                    ],
                ),
                "\"10.200.0.3\" is not an IPv6 address",
            ),
            (
                node(
                    &DUAL,
                    &[
                        MANAGED,
                        IP,
                        IPV6,
                        ("flannel.alpha.coreos.com/backend-v6-data", "{oops"),
                    ],
                ),
                "backend-v6-data is not JSON",
            ),
        ];
        for (n, want) in cases {
            match read(&n, true) {
                NodeLease::Unreadable(why) => assert!(why.contains(want), "{why} lacks {want}"),
                other => panic!("{other:?} for {want}"),
            }
            assert!(matches!(read(&n, false), NodeLease::Lease(_)), "{want}");
        }
    }

    /// A dual-stack Node's lease passes the lease gate as an etcd lease of the same content
    /// does, and is refused for the same reasons.
    #[test]
    fn the_lease_gate_judges_a_dual_stack_node_as_an_etcd_lease() {
        let config = Config::from_json(
            r#"{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/56"}"#,
        )
        .unwrap();
        let own = Lease::new(
            "10.244.1.0/24".parse::<ipnet::Ipv4Net>().unwrap(),
            LeaseAttrs::vxlan(
                "10.200.0.1".parse::<Ipv4Addr>().unwrap(),
                1,
                "aa:bb:cc:dd:ee:01",
            )
            .with_ipv6("fd00:200::1".parse().unwrap(), None),
        )
        .with_ipv6_subnet("fd10:0:0:1::/64".parse().unwrap());
        let rules = LeaseRules::new(&config, &own);
        let peer = |v6: &str| {
            let n = node(
                &["10.244.3.0/24", v6],
                &[MANAGED, IP, VXLAN, DATA, IPV6, V6_DATA],
            );
            rules.check(&lease(read(&n, true)))
        };
        assert_eq!(peer("fd10:0:0:3::/64"), Ok(()));
        assert_eq!(
            peer("fd99:0:0:3::/64"),
            Err(Rejection::OutsideIpv6Network("fd10::/56".parse().unwrap()))
        );
        assert_eq!(
            peer("fd10:0:0:1::/64"),
            Err(Rejection::OverlapsOwnIpv6(
                "fd10:0:0:1::/64".parse().unwrap()
            ))
        );
    }

    #[test]
    fn a_node_lease_is_created_when_its_node_was_and_ties_go_by_name() {
        let made_at = |name: &str, second: i64| {
            let mut n = node(&["10.244.3.0/24"], &[MANAGED, IP]);
            n.metadata.name = Some(name.into());
            let at = k8s_openapi::jiff::Timestamp::from_second(second).unwrap();
            n.metadata.creation_timestamp = Some(Time(at));
            lease(read(&n, false)).created
        };
        assert_eq!(
            made_at("n1", 1_700_000_000),
            Created::named(1_700_000_000, "n1")
        );
        assert!(made_at("b", 5) < made_at("a", 6), "the older Node first");
        assert!(made_at("a", 5) < made_at("b", 5), "then by name");
    }

    #[test]
    fn bogus_nodes_are_unreadable_with_the_reason_and_others_are_not_leases() {
        let cases = [
            (node(&[], &[MANAGED, IP]), "no IPv4 podCIDR"),
            (
                node(&["fd10:0:0:3::/64"], &[MANAGED, IP]),
                "no IPv4 podCIDR",
            ),
            (node(&["10.244.3.1/24"], &[MANAGED, IP]), "host bits"),
            (node(&["nonsense"], &[MANAGED, IP]), "not a CIDR"),
            (
                node(&["10.244.3.0/24", "10.244.4.0/24"], &[MANAGED, IP]),
                "are of one IP family",
            ),
            (
                node(
                    &["10.244.3.0/24"],
                    &[MANAGED, ("flannel.alpha.coreos.com/public-ip", "x")],
                ),
                "public-ip \"x\" is not an IPv4",
            ),
            (
                node(
                    &["10.244.3.0/24"],
                    &[
                        MANAGED,
                        IP,
                        ("flannel.alpha.coreos.com/backend-data", "{oops"),
                    ],
                ),
                "backend-data is not JSON",
            ),
        ];
        for (n, want) in cases {
            match read(&n, false) {
                NodeLease::Unreadable(why) => assert!(why.contains(want), "{why} lacks {want}"),
                other => panic!("{other:?} for {want}"),
            }
        }
        assert_eq!(
            read(&node(&["10.244.3.0/24"], &[IP]), false),
            NodeLease::NotFlannel
        );
    }

    proptest::proptest! {
        /// Whatever another node (or anyone allowed to patch Nodes) writes into the
        /// annotations and podCIDRs, reading the Node never panics; it is a lease, unreadable
        /// with a reason, or not flannel's.
        #[test]
        fn any_annotations_read_without_panic(
            cidr in proptest::option::of(".{0,24}"),
            cidrs in proptest::collection::vec(".{0,24}", 0..4),
            ip in ".{0,20}",
            ipv6 in ".{0,40}",
            kind in ".{0,12}",
            data in ".{0,64}",
            v6_data in ".{0,64}",
            stack in proptest::sample::select(vec![Stack::Ipv4, Stack::Dual, Stack::Ipv6]),
        ) {
            let mut n = node(&[], &[
                MANAGED,
                ("flannel.alpha.coreos.com/public-ip", &ip),
                ("flannel.alpha.coreos.com/public-ipv6", &ipv6),
                ("flannel.alpha.coreos.com/backend-type", &kind),
                ("flannel.alpha.coreos.com/backend-data", &data),
                ("flannel.alpha.coreos.com/backend-v6-data", &v6_data),
            ]);
            n.spec = Some(PodCidrs { pod_cidr: cidr, pod_cidrs: Some(cidrs) });
            let read = read_as(&n, stack);
            proptest::prop_assert!(!matches!(read, NodeLease::NotFlannel));
        }
    }
}
