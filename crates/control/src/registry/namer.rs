//! How a registry names a lease to the operator: in logs and under `rejected_leases` in
//! `twill status`, a lease is named where the operator would look for it.

use crate::lease::SubnetId;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// Names a lease as the operator wrote it: its etcd key, the flag that gave it, or the
/// Kubernetes Node it was read from.
#[derive(Debug, Clone, Default)]
pub enum LeaseNamer {
    /// Leases given on the command line (`--peer`).
    #[default]
    Flag,
    /// `<prefix>/subnets/` of an etcd registry.
    EtcdKey(String),
    /// The Node each podCIDR was last read from, kept by the Kubernetes registry.
    KubeNode(Arc<NodeNames>),
}

/// podCIDR → Node name, written by the registry as it reads Nodes, read when naming.
#[derive(Debug, Default)]
pub struct NodeNames(RwLock<HashMap<SubnetId, String>>);

impl NodeNames {
    pub fn set(&self, subnet: SubnetId, node: &str) {
        self.0.write().unwrap().insert(subnet, node.to_string());
    }

    pub fn forget(&self, subnet: SubnetId) {
        self.0.write().unwrap().remove(&subnet);
    }

    pub fn replace(&self, names: HashMap<SubnetId, String>) {
        *self.0.write().unwrap() = names;
    }

    fn get(&self, subnet: SubnetId) -> Option<String> {
        self.0.read().unwrap().get(&subnet).cloned()
    }
}

impl LeaseNamer {
    pub fn name(&self, subnet: SubnetId) -> String {
        match self {
            LeaseNamer::Flag => format!("peer {subnet}"),
            LeaseNamer::EtcdKey(prefix) => match subnet {
                SubnetId::V4(v4) => format!("{prefix}{}-{}", v4.network(), v4.prefix_len()),
                // flanneld's key of an IPv6-only lease: an empty IPv4 part, then the IPv6 one.
                SubnetId::V6(v6) => {
                    format!("{prefix}0.0.0.0-0&{}-{}", v6.network(), v6.prefix_len())
                }
            },
            LeaseNamer::KubeNode(names) => match names.get(subnet) {
                Some(node) => node_key(&node),
                None => format!("node with podCIDR {subnet}"),
            },
        }
    }
}

/// How a Node is named wherever a lease key would stand.
pub fn node_key(node: &str) -> String {
    format!("node/{node}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_named_by_their_etcd_key() {
        let namer = LeaseNamer::EtcdKey("/coreos.com/network/subnets/".into());
        let subnet = SubnetId::V4("10.5.2.0/25".parse().unwrap());
        assert_eq!(
            namer.name(subnet),
            "/coreos.com/network/subnets/10.5.2.0-25"
        );
        let ipv6_only = SubnetId::V6("fd10:0:0:2::/64".parse().unwrap());
        assert_eq!(
            namer.name(ipv6_only),
            "/coreos.com/network/subnets/0.0.0.0-0&fd10:0:0:2::-64"
        );
    }

    #[test]
    fn kubernetes_leases_are_named_by_their_node() {
        let names = Arc::new(NodeNames::default());
        let namer = LeaseNamer::KubeNode(names.clone());
        let subnet = SubnetId::V4("10.5.2.0/24".parse().unwrap());
        assert_eq!(namer.name(subnet), "node with podCIDR 10.5.2.0/24");
        names.set(subnet, "worker-2");
        assert_eq!(namer.name(subnet), "node/worker-2");
    }
}
