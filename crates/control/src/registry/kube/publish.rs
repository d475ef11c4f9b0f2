//! What this node writes on its own Node: flanneld v0.28.9's `AcquireLease` annotations
//! (pkg/subnet/kube/kube.go), the IPv6 ones only where flanneld writes them.
//!
//! flanneld patches when any of its annotations differs from what it would write; twill patches
//! only the keys that differ, which leaves the Node as flanneld's patch would and sends nothing
//! when a restart finds the Node as it left it.

use super::annotations::Annotations;
use super::node_view::NodeView;
use crate::backend_kind::BackendKind;
use crate::lease::{BackendData, LeaseAttrs};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

impl Annotations {
    /// The annotations this node must carry for `attrs`, as flanneld writes them; an operator's
    /// `public-ip-overwrite` (`public-ipv6-overwrite`) on the Node wins over our own address.
    pub fn own(&self, attrs: &LeaseAttrs, node: &NodeView) -> BTreeMap<String, String> {
        let overwritten = |key: &str| {
            let value = node.annotation(key).filter(|ip| !ip.is_empty());
            value.map(str::to_string)
        };
        let public_ip = overwritten(&self.public_ip_overwrite);
        let mut own = BTreeMap::from([
            (
                self.backend_type.clone(),
                attrs.backend_type.as_deref().unwrap_or("").into(),
            ),
            (self.subnet_kube_managed.clone(), "true".into()),
        ]);
        // flanneld (kube.go) writes no backend-data nor public-ip for a vxlan node without
        // IPv4 backend data: an IPv6-only one.
        let vxlan = attrs.kind() == Some(BackendKind::Vxlan);
        if !vxlan || attrs.backend_data.is_some() {
            own.insert(self.backend_data.clone(), json(attrs.backend_data.as_ref()));
            // An IPv6-only host-gw node's public-ip is flanneld's 0.0.0.0.
            let ours = attrs.public_addrs.v4().unwrap_or(Ipv4Addr::UNSPECIFIED);
            own.insert(
                self.public_ip.clone(),
                public_ip.unwrap_or(ours.to_string()),
            );
        }
        if let Some((ip, data)) = ipv6_side(attrs) {
            let public_ipv6 = overwritten(&self.public_ipv6_overwrite);
            own.insert(self.backend_v6_data.clone(), data);
            own.insert(
                self.public_ipv6.clone(),
                public_ipv6.unwrap_or(ip.to_string()),
            );
        }
        own
    }

    /// Those of `wanted` that the Node does not already carry with the same value.
    pub fn missing(wanted: BTreeMap<String, String>, node: &NodeView) -> BTreeMap<String, String> {
        wanted
            .into_iter()
            .filter(|(k, v)| node.annotation(k) != Some(v.as_str()))
            .collect()
    }
}

/// The IPv6 address and `backend-v6-data` text a node publishes, when flanneld would: vxlan
/// and wireguard with IPv6 backend data, host-gw with a PublicIPv6 (its data is JSON null),
/// (kube.go: `attrs.BackendType == "vxlan" && string(v6Bd) != "null"`, `"wireguard" && … &&
/// attrs.PublicIPv6 != nil`, `"host-gw" && attrs.PublicIPv6 != nil`); and where only twill
/// runs IPv6: udp (flanneld's has no IPv6) and twill-batch with a PublicIPv6, since a peer on a
/// dual-stack network is read only with its `public-ipv6`. Never ipip.
fn ipv6_side(attrs: &LeaseAttrs) -> Option<(Ipv6Addr, String)> {
    let public_ipv6 = attrs.public_addrs.v6()?;
    let data = attrs.backend_v6_data.as_ref();
    let publishes = match attrs.kind() {
        Some(BackendKind::Vxlan | BackendKind::Wireguard) => data.is_some(),
        Some(BackendKind::HostGw | BackendKind::TwillBatch | BackendKind::Udp) => true,
        Some(BackendKind::Ipip) | None => false,
    };
    publishes.then(|| (public_ipv6, json(data)))
}

/// Backend data as flanneld marshals it: the JSON text, or `null` without any.
fn json(data: Option<&BackendData>) -> String {
    data.map_or("null".to_string(), |d| d.json().to_string())
}

#[cfg(test)]
mod tests {
    use super::super::annotations::tests::node;
    use super::super::annotations::DEFAULT_PREFIX;
    use super::super::node_cidrs::NodeCidrs;
    use super::*;

    const KEY: &str = "flannel.alpha.coreos.com/";

    fn own(attrs: &LeaseAttrs, annotations: &[(&str, &str)]) -> BTreeMap<String, String> {
        let a = Annotations::new(DEFAULT_PREFIX).unwrap();
        a.own(attrs, &node(&["10.244.1.0/24"], annotations))
    }

    /// The keys `own` writes, without the prefix.
    fn names(own: &BTreeMap<String, String>) -> Vec<&str> {
        own.keys().map(|k| k.strip_prefix(KEY).unwrap()).collect()
    }

    fn vxlan_dual() -> LeaseAttrs {
        let v6_data = serde_json::json!({"VNI": 1, "VtepMAC": "aa:bb:cc:dd:ee:66"});
        LeaseAttrs::vxlan(
            "10.200.0.1".parse::<Ipv4Addr>().unwrap(),
            1,
            "aa:bb:cc:dd:ee:ff",
        )
        .with_ipv6("fd00:200::1".parse().unwrap(), Some(v6_data.into()))
    }

    #[test]
    fn udp_nodes_carry_an_empty_type_and_null_data() {
        let attrs = LeaseAttrs::udp("10.200.0.1".parse::<Ipv4Addr>().unwrap());
        let own = own(&attrs, &[]);
        assert_eq!(own[&format!("{KEY}backend-type")], "");
        assert_eq!(own[&format!("{KEY}backend-data")], "null");
        assert_eq!(own[&format!("{KEY}public-ip")], "10.200.0.1");
        assert_eq!(own[&format!("{KEY}kube-subnet-manager")], "true");
    }

    #[test]
    fn an_ipv6_only_vxlan_node_publishes_its_ipv6_side_alone_as_flanneld() {
        let v6_data = serde_json::json!({"VNI": 1, "VtepMAC": "aa:bb:cc:dd:ee:66"});
        let ip: Ipv6Addr = "fd00:200::1".parse().unwrap();
        let attrs = LeaseAttrs::typed(ip, Some("vxlan"), None).with_ipv6(ip, Some(v6_data.into()));
        let published = own(&attrs, &[]);
        assert_eq!(
            names(&published),
            [
                "backend-type",
                "backend-v6-data",
                "kube-subnet-manager",
                "public-ipv6"
            ]
        );
        // host-gw writes its IPv4 keys as flanneld does: null data, PublicIP 0.0.0.0.
        let host_gw = LeaseAttrs::host_gw(ip).with_ipv6(ip, None);
        let published = own(&host_gw, &[]);
        assert_eq!(published[&format!("{KEY}public-ip")], "0.0.0.0");
        assert_eq!(published[&format!("{KEY}backend-data")], "null");
    }

    #[test]
    fn a_dual_stack_vxlan_node_publishes_its_ipv6_side() {
        let own = own(&vxlan_dual(), &[]);
        assert_eq!(
            names(&own),
            [
                "backend-data",
                "backend-type",
                "backend-v6-data",
                "kube-subnet-manager",
                "public-ip",
                "public-ipv6"
            ]
        );
        assert_eq!(own[&format!("{KEY}public-ipv6")], "fd00:200::1");
        assert_eq!(
            own[&format!("{KEY}backend-v6-data")],
            r#"{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:66"}"#
        );
    }

    #[test]
    fn a_dual_stack_host_gw_node_publishes_null_ipv6_data() {
        let attrs = LeaseAttrs::host_gw("10.200.0.1".parse::<Ipv4Addr>().unwrap())
            .with_ipv6("fd00:200::1".parse().unwrap(), None);
        let own = own(&attrs, &[]);
        assert_eq!(own[&format!("{KEY}backend-v6-data")], "null");
        assert_eq!(own[&format!("{KEY}public-ipv6")], "fd00:200::1");
    }

    #[test]
    fn ipv6_annotations_are_written_only_where_flanneld_writes_them() {
        let v4_only = [
            "backend-data",
            "backend-type",
            "kube-subnet-manager",
            "public-ip",
        ];
        let ip: Ipv4Addr = "10.200.0.1".parse().unwrap();
        let ipv6: Ipv6Addr = "fd00:200::1".parse().unwrap();
        let cases = [
            // IPv4-only networks: no PublicIPv6.
            LeaseAttrs::vxlan(ip, 1, "aa:bb:cc:dd:ee:ff"),
            LeaseAttrs::host_gw(ip),
            // vxlan without IPv6 data, and ipip, which carries no IPv6.
            LeaseAttrs::vxlan(ip, 1, "aa:bb:cc:dd:ee:ff").with_ipv6(ipv6, None),
            LeaseAttrs::ipip(ip).with_ipv6(ipv6, None),
            LeaseAttrs::udp(ip),
        ];
        for attrs in cases {
            assert_eq!(names(&own(&attrs, &[])), v4_only, "{attrs:?}");
        }
        // flanneld's wireguard publishes its IPv6 side with IPv6 data, as vxlan does.
        let key = "9Ob0FZcyJ9pcm0yYXaPfGVxZSbx4KaHqQa64D9gYFgU=";
        let data = serde_json::json!({"PublicKey": key, "Port": 51821});
        let wireguard = LeaseAttrs::wireguard(ip, key, 51820).with_ipv6(ipv6, Some(data.into()));
        let published = own(&wireguard, &[]);
        assert_eq!(published[&format!("{KEY}public-ipv6")], "fd00:200::1");
        let wireguard = LeaseAttrs::wireguard(ip, key, 51820).with_ipv6(ipv6, None);
        assert_eq!(names(&own(&wireguard, &[])), v4_only);
        // twill's userspace backends carry IPv6 where flanneld's udp does not: their peers
        // need the address.
        for attrs in [LeaseAttrs::udp(ip), LeaseAttrs::twill_batch(ip)] {
            let published = own(&attrs.with_ipv6(ipv6, None), &[]);
            assert_eq!(published[&format!("{KEY}public-ipv6")], "fd00:200::1");
            assert_eq!(published[&format!("{KEY}backend-v6-data")], "null");
        }
    }

    #[test]
    fn an_operators_overwrites_are_published() {
        let overwrites = [
            ("flannel.alpha.coreos.com/public-ip-overwrite", "192.0.2.7"),
            (
                "flannel.alpha.coreos.com/public-ipv6-overwrite",
                "2001:db8::7",
            ),
        ];
        let published = own(&vxlan_dual(), &overwrites);
        assert_eq!(published[&format!("{KEY}public-ip")], "192.0.2.7");
        assert_eq!(published[&format!("{KEY}public-ipv6")], "2001:db8::7");
        // An empty overwrite is none, as in flanneld.
        let empty = [("flannel.alpha.coreos.com/public-ipv6-overwrite", "")];
        let published = own(&vxlan_dual(), &empty);
        assert_eq!(published[&format!("{KEY}public-ipv6")], "fd00:200::1");
    }

    /// A restart that finds the Node as it left it writes nothing; one that finds an
    /// annotation changed writes that one back.
    #[test]
    fn a_restart_patches_only_what_differs() {
        let a = Annotations::new(DEFAULT_PREFIX).unwrap();
        let cidrs = ["10.244.1.0/24", "fd10:0:0:1::/64"];
        let wanted = a.own(&vxlan_dual(), &node(&cidrs, &[]));
        let pairs: Vec<(&str, &str)> = wanted
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let annotated = node(&cidrs, &pairs);
        assert!(NodeCidrs::of(&annotated).unwrap().v6.is_some());
        assert!(Annotations::missing(a.own(&vxlan_dual(), &annotated), &annotated).is_empty());

        let mut changed = pairs.clone();
        changed.retain(|(k, _)| !k.ends_with("/public-ipv6"));
        changed.push(("flannel.alpha.coreos.com/public-ipv6", "fd00:200::9"));
        let edited = node(&cidrs, &changed);
        let missing = Annotations::missing(a.own(&vxlan_dual(), &edited), &edited);
        assert_eq!(
            missing,
            BTreeMap::from([(format!("{KEY}public-ipv6"), "fd00:200::1".to_string())])
        );
    }
}
