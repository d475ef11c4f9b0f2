//! How a registry names a lease to the operator: in logs and under `rejected_leases` in
//! `twill status`, a lease is named where the operator would look for it.

use super::{key_name, Lease, LeaseOrigin};

/// Names a lease as the operator wrote it: its etcd key, the flag that gave it, or the
/// Kubernetes Node it was read from.
#[derive(Debug, Clone, Default)]
pub enum LeaseNamer {
    /// Leases given on the command line (`--peer`).
    #[default]
    Flag,
    /// `<prefix>/subnets/` of an etcd registry.
    EtcdKey(String),
    /// Nodes of a Kubernetes registry, each read as a lease.
    KubeNode,
}

impl LeaseNamer {
    /// The lease in full: its etcd key, its Node, or its flag.
    pub fn name(&self, lease: &Lease) -> String {
        match (self, lease.origin()) {
            (_, LeaseOrigin::Node(node)) => node_key(&node),
            (LeaseNamer::EtcdKey(prefix), LeaseOrigin::Key(subnets)) => {
                format!("{prefix}{}", key_name(subnets))
            }
            (LeaseNamer::KubeNode, LeaseOrigin::Key(..)) => {
                format!("node with podCIDR {}", lease.id())
            }
            (LeaseNamer::Flag, LeaseOrigin::Key(..)) => format!("peer {}", lease.id()),
        }
    }

    /// An accepted lease named in another's refusal: its Node, or its subnet, which no other
    /// accepted lease has.
    pub fn holder(&self, lease: &Lease) -> String {
        match lease.origin() {
            LeaseOrigin::Node(node) => node_key(&node),
            LeaseOrigin::Key(..) => lease.id().to_string(),
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
    use crate::lease::{Created, LeaseAttrs};

    fn lease(subnet: &str) -> Lease {
        Lease::new(
            subnet.parse::<ipnet::Ipv4Net>().unwrap(),
            LeaseAttrs::udp("10.200.0.2".parse::<std::net::Ipv4Addr>().unwrap()),
        )
    }

    #[test]
    fn leases_are_named_by_their_etcd_key() {
        let namer = LeaseNamer::EtcdKey("/coreos.com/network/subnets/".into());
        let v4 = lease("10.5.2.0/25");
        assert_eq!(namer.name(&v4), "/coreos.com/network/subnets/10.5.2.0-25");
        assert_eq!(namer.holder(&v4), "10.5.2.0/25");
        let dual = v4.with_ipv6_subnet("fd10:0:0:2::/64".parse().unwrap());
        assert_eq!(
            namer.name(&dual),
            "/coreos.com/network/subnets/10.5.2.0-25&fd10:0:0:2::-64"
        );
        let ipv6_only = Lease::new(
            "fd10:0:0:2::/64".parse::<ipnet::Ipv6Net>().unwrap(),
            LeaseAttrs::udp("fd00::2".parse::<std::net::Ipv6Addr>().unwrap()),
        );
        assert_eq!(
            namer.name(&ipv6_only),
            "/coreos.com/network/subnets/0.0.0.0-0&fd10:0:0:2::-64"
        );
    }

    #[test]
    fn kubernetes_leases_are_named_by_their_node() {
        let namer = LeaseNamer::KubeNode;
        let nameless = lease("10.5.2.0/24");
        assert_eq!(namer.name(&nameless), "node with podCIDR 10.5.2.0/24");
        let read = nameless.with_created(Created::named(1_700_000_000, "worker-2"));
        assert_eq!(namer.name(&read), "node/worker-2");
        assert_eq!(namer.holder(&read), "node/worker-2");
    }
}
