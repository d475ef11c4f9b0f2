//! The lease checks of a dual-stack node for a lease's IPv6 side: the IPv6 subnet has the
//! config's `IPv6SubnetLen`, lies inside `IPv6Network` and is not ours, `PublicIPv6` can be
//! another host's address, and a wireguard lease carries what this node's `Mode` needs of it.
//! The overlap with other peers' IPv6 subnets is settled with the IPv4 one, among all leases,
//! by the peers above it (a lease's IPv6 subnet is one of its [`super::Claim`]s).

use super::wireguard::LeaseReader;
use super::Rejection;
use crate::backend_kind::BackendKind;
use crate::config::{Config, Ipv6Config, Underlay};
use crate::lease::Lease;
use ipnet::Ipv6Net;
use std::net::Ipv6Addr;

/// What the IPv6 side of a peer lease must satisfy on a dual-stack node. A lease without an
/// IPv6 subnet is an IPv4-only peer, which flanneld accepts too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipv6Rules {
    pub network: Ipv6Net,
    pub subnet_len: u8,
    pub own_subnet: Option<Ipv6Net>,
    pub own_public_ip: Option<Ipv6Addr>,
    /// The network's datagrams go over IPv6 (`Backend.Underlay`), or it is IPv6-only: a peer
    /// is reached only at its PublicIPv6, so a lease must name one.
    pub needs_public_ip: bool,
    /// On a wireguard node, how its Mode reads a lease: one it cannot read is no peer.
    pub wireguard: Option<LeaseReader>,
}

impl Ipv6Rules {
    pub(super) fn new(config: &Config, v6: &Ipv6Config, own: &Lease) -> Ipv6Rules {
        Ipv6Rules {
            network: v6.network,
            subnet_len: v6.subnet_len,
            own_subnet: own.subnets.v6(),
            own_public_ip: own.public_addrs.v6(),
            needs_public_ip: config.backend.underlay == Underlay::Ipv6 || config.ipv4.is_none(),
            wireguard: LeaseReader::of_dual_stack_node(config, own),
        }
    }

    /// The checks of a lease's IPv6 subnet and PublicIPv6 on their own.
    pub(super) fn check(&self, lease: &Lease) -> Result<(), Rejection> {
        if let Some(subnet) = lease.subnets.v6() {
            if subnet.prefix_len() != self.subnet_len {
                return Err(Rejection::Ipv6PrefixLength {
                    got: subnet.prefix_len(),
                    want: self.subnet_len,
                });
            }
            if !self.network.contains(&subnet) {
                return Err(Rejection::OutsideIpv6Network(self.network));
            }
            if let Some(own) = self.own_subnet.filter(|own| overlaps_v6(subnet, *own)) {
                return Err(Rejection::OverlapsOwnIpv6(own));
            }
        }
        match lease.public_addrs.v6() {
            Some(ip) if self.network.contains(&ip) => {
                return Err(Rejection::PublicIpv6InNetwork {
                    ip,
                    network: self.network,
                })
            }
            Some(ip) => check_public_ipv6(ip, self.own_public_ip)?,
            None if self.needs_public_ip => return Err(Rejection::NoPublicIpv6),
            None => {}
        }
        let wireguard = lease.kind() == Some(BackendKind::Wireguard);
        match self.wireguard.as_ref().filter(|_| wireguard) {
            Some(reader) => reader
                .read(lease)
                .map(drop)
                .map_err(Rejection::WireguardData),
            None => Ok(()),
        }
    }
}

/// Whether two IPv6 subnets share an address.
pub fn overlaps_v6(a: Ipv6Net, b: Ipv6Net) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// A PublicIPv6 is where a peer's IPv6 underlay traffic goes: it must name another host.
fn check_public_ipv6(ip: Ipv6Addr, own: Option<Ipv6Addr>) -> Result<(), Rejection> {
    if Some(ip) == own {
        return Err(Rejection::OwnPublicIpv6(ip));
    }
    match unusable_ipv6(ip) {
        Some(why) => Err(Rejection::UnusablePublicIpv6 { ip, why }),
        None => Ok(()),
    }
}

/// What `ip` is, if it cannot be the address other hosts reach a node at (a PublicIPv6, or
/// `--public-ipv6`): unspecified, loopback, multicast, link-local (no scope says which link)
/// or IPv4-mapped.
pub fn unusable_ipv6(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_unspecified() {
        Some("unspecified")
    } else if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_multicast() {
        Some("multicast")
    } else if ip.is_unicast_link_local() {
        Some("link-local")
    } else if ip.to_ipv4_mapped().is_some() {
        Some("an IPv4-mapped address")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::lease::{BackendData, Lease, LeaseAttrs};
    use crate::lease_check::{Claim, LeaseRules, Rejection};

    /// A dual-stack host-gw node at 10.5.1.0/24 + fd10:0:0:1::/64.
    fn rules() -> LeaseRules {
        let config = Config::from_json(
            r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/48"}"#,
        )
        .unwrap();
        let own = lease(1, "fd10:0:0:1::/64", Some("fd00::1"));
        LeaseRules::new(&config, &own)
    }

    /// A host-gw lease at 10.5.<third>.0/24 with the IPv6 subnet and PublicIPv6 given.
    fn lease(third: u8, v6: &str, public_ipv6: Option<&str>) -> Lease {
        let ip: std::net::Ipv4Addr = format!("10.200.0.{third}").parse().unwrap();
        let mut attrs = LeaseAttrs::host_gw(ip);
        if let Some(public_ipv6) = public_ipv6 {
            attrs = attrs.with_ipv6(public_ipv6.parse().unwrap(), None);
        }
        Lease::new(
            format!("10.5.{third}.0/24")
                .parse::<ipnet::Ipv4Net>()
                .unwrap(),
            attrs,
        )
        .with_ipv6_subnet(v6.parse().unwrap())
    }

    #[test]
    fn rules_of_a_dual_stack_node_come_from_its_config_and_lease() {
        let v6 = rules().ipv6.unwrap();
        assert_eq!(v6.network, "fd10::/48".parse().unwrap());
        assert_eq!(v6.subnet_len, 64);
        assert_eq!(v6.own_subnet, Some("fd10:0:0:1::/64".parse().unwrap()));
        assert_eq!(v6.own_public_ip, Some("fd00::1".parse().unwrap()));
    }

    #[test]
    fn a_good_dual_stack_lease_and_an_ipv4_only_peer_pass() {
        assert_eq!(
            rules().check(&lease(2, "fd10:0:0:2::/64", Some("fd00::2"))),
            Ok(())
        );
        assert_eq!(rules().check(&lease(2, "fd10:0:0:2::/64", None)), Ok(()));
        let v4_only = Lease::new(
            "10.5.3.0/24".parse::<ipnet::Ipv4Net>().unwrap(),
            LeaseAttrs::host_gw("10.200.0.3".parse::<std::net::Ipv4Addr>().unwrap()),
        );
        assert_eq!(rules().check(&v4_only), Ok(()));
        assert_eq!(
            rules()
                .check(&lease(4, "2001:db8:0:ff::/64", Some("2001:db8::4")))
                .map_err(|e| e.to_string()),
            Err("its IPv6 subnet lies outside the IPv6Network fd10::/48".into())
        );
    }

    #[test]
    fn each_bad_ipv6_side_gets_its_reason() {
        let cases = [
            (
                lease(2, "fd10:0:0:2::/65", None),
                "its IPv6 subnet's prefix length /65 differs from the network's IPv6SubnetLen /64",
            ),
            (
                lease(2, "fd10:0:0:2::/56", None),
                "prefix length /56 differs",
            ),
            (
                lease(2, "fd11:0:0:2::/64", None),
                "its IPv6 subnet lies outside the IPv6Network fd10::/48",
            ),
            (
                lease(2, "fd10:0:0:1::/64", None),
                "its IPv6 subnet overlaps this node's own IPv6 subnet fd10:0:0:1::/64",
            ),
            (
                lease(2, "fd10:0:0:2::/64", Some("fd00::1")),
                "its PublicIPv6 fd00::1 is this node's own",
            ),
            (
                lease(2, "fd10:0:0:2::/64", Some("fe80::2")),
                "its PublicIPv6 fe80::2 is link-local, not a host's address",
            ),
            (
                lease(2, "fd10:0:0:2::/64", Some("ff02::1")),
                "ff02::1 is multicast",
            ),
            (lease(2, "fd10:0:0:2::/64", Some("::")), ":: is unspecified"),
            (lease(2, "fd10:0:0:2::/64", Some("::1")), "::1 is loopback"),
            (
                lease(2, "fd10:0:0:2::/64", Some("::ffff:10.200.0.2")),
                "is an IPv4-mapped address",
            ),
        ];
        for (lease, want) in cases {
            let got = rules().check(&lease).expect_err(want).to_string();
            assert!(got.contains(want), "{lease:?}: got {got:?}, want {want:?}");
        }
    }

    #[test]
    fn over_an_ipv6_underlay_a_lease_without_public_ipv6_is_refused() {
        let config = Config::from_json(
            r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/48",
                "Backend":{"Type":"udp","Underlay":"ipv6"}}"#,
        )
        .unwrap();
        let rules = LeaseRules::new(&config, &lease(1, "fd10:0:0:1::/64", Some("fd00::1")));
        let reachable = lease(2, "fd10:0:0:2::/64", Some("fd00::2"));
        assert_eq!(rules.check(&reachable), Ok(()));
        let got = rules.check(&lease(2, "fd10:0:0:2::/64", None));
        assert_eq!(got, Err(Rejection::NoPublicIpv6));
        assert!(got
            .unwrap_err()
            .to_string()
            .contains("names no PublicIPv6, and this network reaches peers over IPv6 (its Backend.Underlay is ipv6"));
    }

    #[test]
    fn a_wireguard_node_refuses_a_lease_its_mode_cannot_read() {
        const KEY: &str = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=";
        let wireguard = |mode: &str| {
            let config = Config::from_json(&format!(
                r#"{{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/48","Backend":{{"Type":"wireguard","Mode":"{mode}"}}}}"#
            ))
            .unwrap();
            let own = Lease {
                backend_type: Some("wireguard".into()),
                ..lease(1, "fd10:0:0:1::/64", Some("fd00::1"))
            };
            LeaseRules::new(&config, &own)
        };
        let peer = |v6_data: bool, public_ipv6: Option<&str>| {
            let ip: std::net::Ipv4Addr = "10.200.0.2".parse().unwrap();
            let attrs = LeaseAttrs::wireguard(ip, KEY, 51820);
            let attrs = LeaseAttrs {
                public_addrs: match public_ipv6 {
                    Some(v6) => attrs.public_addrs.with_v6(v6.parse().unwrap()),
                    None => attrs.public_addrs,
                },
                backend_v6_data: v6_data.then(|| BackendData::wireguard(KEY, 51821)),
                ..attrs
            };
            Lease::new("10.5.2.0/24".parse::<ipnet::Ipv4Net>().unwrap(), attrs)
                .with_ipv6_subnet("fd10:0:0:2::/64".parse().unwrap())
        };
        let separate = wireguard("separate");
        assert_eq!(separate.check(&peer(true, Some("fd00::2"))), Ok(()));
        let check = |rules: &LeaseRules, lease| rules.check(&lease).unwrap_err().to_string();
        assert_eq!(
            check(&separate, peer(false, Some("fd00::2"))),
            "it has an IPv6 subnet but no BackendV6Data.PublicKey, which flanneld writes on a \
             dual-stack network"
        );
        assert_eq!(
            check(&wireguard("ipv6"), peer(true, None)),
            "it has no PublicIPv6, and Mode ipv6 reaches peers over the IPv6 underlay"
        );
        // Another backend's lease is refused for its type, as before.
        let host_gw = lease(2, "fd10:0:0:2::/64", Some("fd00::2"));
        assert!(check(&separate, host_gw).contains("its backend type host-gw"));
    }

    #[test]
    fn an_ipv4_only_node_leaves_a_leases_ipv6_side_alone_as_flanneld_does() {
        let v4_only = LeaseRules {
            ipv6: None,
            ..rules()
        };
        let odd = lease(2, "fd99::/120", Some("fe80::2"));
        assert_eq!(v4_only.check(&odd), Ok(()));
        assert_eq!(
            v4_only.claims(&odd, None).as_slice(),
            [Claim::Subnet("10.5.2.0/24".parse().unwrap())],
            "nothing of its IPv6 side is claimed"
        );
        assert_eq!(
            rules().claims(&odd, None).as_slice(),
            [
                Claim::Subnet("10.5.2.0/24".parse().unwrap()),
                Claim::Ipv6Subnet("fd99::/120".parse().unwrap())
            ]
        );
    }
}
