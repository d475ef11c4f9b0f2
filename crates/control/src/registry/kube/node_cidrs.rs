//! A Node's pod CIDRs by family, as flanneld v0.28.9 splits them (pkg/subnet/kube/kube.go,
//! `AcquireLease` and `nodeToLease`): `spec.podCIDRs` (else `spec.podCIDR`), at most two, one
//! IPv4 and one IPv6.

use super::node_view::NodeView;
use crate::config::Config;
use anyhow::bail;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// The pod CIDRs the controller manager gave a Node, one per family.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeCidrs {
    pub v4: Option<Ipv4Net>,
    pub v6: Option<Ipv6Net>,
}

impl NodeCidrs {
    /// Splits the Node's pod CIDRs by family. More than two, or two of one family, is refused
    /// with the list (flanneld refuses more than two, "pod cidrs should be IPv4/IPv6 only or
    /// dualstack"; of two of one family it keeps one or the other depending on where it reads
    /// them, so twill refuses those too, as the API server does).
    pub fn of(node: &NodeView) -> anyhow::Result<NodeCidrs> {
        let listed = node.pod_cidrs();
        if listed.len() > 2 {
            bail!(
                "its podCIDRs {listed:?} are more than two: a Node has one IPv4 podCIDR, one \
                 IPv6 podCIDR, or one of each"
            );
        }
        let mut cidrs = NodeCidrs::default();
        for text in &listed {
            let twice = match parse(text)? {
                IpNet::V4(net) => cidrs.v4.replace(net).is_some(),
                IpNet::V6(net) => cidrs.v6.replace(net).is_some(),
            };
            if twice {
                bail!(
                    "its podCIDRs {listed:?} are of one IP family: a Node has one IPv4 podCIDR, \
                     one IPv6 podCIDR, or one of each"
                );
            }
        }
        Ok(cidrs)
    }

    /// Whether the Node has no pod CIDR yet (the controller manager has not assigned one).
    pub fn is_empty(&self) -> bool {
        self.v4.is_none() && self.v6.is_none()
    }
}

fn parse(text: &str) -> anyhow::Result<IpNet> {
    let Ok(cidr) = text.parse::<IpNet>() else {
        bail!("podCIDR {} is not a CIDR", crate::shown::quoted(text));
    };
    if cidr.trunc() != cidr {
        bail!("podCIDR {text} has host bits set");
    }
    Ok(cidr)
}

/// The address families of a network, which say what a Node's lease has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stack {
    Ipv4,
    Dual,
    Ipv6,
}

impl Stack {
    pub fn of(config: &Config) -> Stack {
        match (&config.ipv4, &config.ipv6) {
            (_, None) => Stack::Ipv4,
            (Some(_), Some(_)) => Stack::Dual,
            (None, Some(_)) => Stack::Ipv6,
        }
    }
}

impl std::fmt::Display for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stack::Ipv4 => "IPv4-only",
            Stack::Dual => "dual-stack",
            Stack::Ipv6 => "IPv6-only",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::node_view::PodCidrs;
    use super::*;

    fn node(cidrs: &[&str]) -> NodeView {
        NodeView {
            spec: Some(PodCidrs {
                pod_cidr: cidrs.first().map(|c| c.to_string()),
                pod_cidrs: Some(cidrs.iter().map(|c| c.to_string()).collect()),
            }),
            ..Default::default()
        }
    }

    fn split(cidrs: &[&str]) -> anyhow::Result<NodeCidrs> {
        NodeCidrs::of(&node(cidrs))
    }

    #[test]
    fn one_cidr_per_family_in_either_order() {
        let v4 = Some("10.5.1.0/24".parse().unwrap());
        let v6 = Some("fd10:0:0:1::/64".parse().unwrap());
        let both = NodeCidrs { v4, v6 };
        assert_eq!(split(&["10.5.1.0/24", "fd10:0:0:1::/64"]).unwrap(), both);
        assert_eq!(split(&["fd10:0:0:1::/64", "10.5.1.0/24"]).unwrap(), both);
        assert_eq!(split(&["10.5.1.0/24"]).unwrap(), NodeCidrs { v4, v6: None });
        assert_eq!(
            split(&["fd10:0:0:1::/64"]).unwrap(),
            NodeCidrs { v4: None, v6 }
        );
        let none = split(&[]).unwrap();
        assert!(none.is_empty() && !both.is_empty());
    }

    #[test]
    fn three_cidrs_or_two_of_a_family_are_refused_with_the_list() {
        let cases: [(&[&str], &str); 3] = [
            (
                &["10.5.1.0/24", "fd10:0:0:1::/64", "10.5.2.0/24"],
                "are more than two",
            ),
            (&["10.5.1.0/24", "10.5.2.0/24"], "are of one IP family"),
            (
                &["fd10:0:0:1::/64", "fd10:0:0:2::/64"],
                "are of one IP family",
            ),
        ];
        for (cidrs, want) in cases {
            let err = split(cidrs).unwrap_err().to_string();
            assert!(err.contains(want) && err.contains(cidrs[1]), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn a_cidr_that_is_none_or_has_host_bits_is_refused() {
        let err = split(&["nonsense"]).unwrap_err().to_string();
        assert!(err.contains("\"nonsense\" is not a CIDR"), "{err}");
        let err = split(&["10.5.1.0/24", "fd10::1/64"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("fd10::1/64 has host bits set"), "{err}");
    }
}
