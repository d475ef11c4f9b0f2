use super::tests::admitted;
use super::*;
use crate::config::Config;
use crate::lease::{LeaseAttrs, PublicAddrs, Subnets};
use ipnet::{Ipv4Net, Ipv6Net};
use std::net::{Ipv4Addr, Ipv6Addr};

/// A dual-stack udp lease at 10.5.<third>.0/24 with the IPv6 subnet `v6`.
fn lease(third: u8, v6: &str) -> Lease {
    let ip: Ipv4Addr = format!("10.200.0.{third}").parse().unwrap();
    Lease::new(
        format!("10.5.{third}.0/24").parse::<Ipv4Net>().unwrap(),
        LeaseAttrs::udp(ip),
    )
    .with_ipv6_subnet(v6.parse().unwrap())
}

fn peers() -> Peers {
    let config = Config::from_json(
        r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/48"}"#,
    )
    .unwrap();
    let rules = LeaseRules::new(&config, &lease(1, "fd10:0:0:1::/64"));
    Peers::new(rules, LeaseNamer::default())
}

#[test]
fn an_ipv6_subnet_is_one_peers_until_it_goes() {
    let mut peers = peers();
    let first = lease(2, "fd10:0:0:2::/64");
    let copy = lease(3, "fd10:0:0:2::/64");
    assert!(admitted(&mut peers, LeaseEvent::Added(first.clone().into())).is_some());
    assert_eq!(
        admitted(&mut peers, LeaseEvent::Added(copy.clone().into())),
        None
    );
    let refused: Vec<String> = peers.refused().map(|r| r.reason.to_string()).collect();
    assert_eq!(
        refused,
        [
            "its IPv6 subnet overlaps fd10:0:0:2::/64, the IPv6 subnet of the lease 10.5.2.0/24, \
          made before it: of two leases that claim one subnet, every node keeps the older"
        ]
    );
    // The holder renews with the same IPv6 subnet: still its own.
    let renewed = Lease {
        public_addrs: PublicAddrs::V4("10.200.0.22".parse().unwrap()),
        ..first.clone()
    };
    assert!(admitted(&mut peers, LeaseEvent::Added(renewed.clone().into())).is_some());
    assert_eq!(
        admitted(&mut peers, LeaseEvent::Added(copy.clone().into())),
        None
    );
    admitted(&mut peers, LeaseEvent::Removed(renewed.into()));
    assert_eq!(
        admitted(&mut peers, LeaseEvent::Added(copy.clone().into())),
        Some(LeaseEvent::Added(copy.clone().into()))
    );
    // A snapshot starts the index afresh: the first made keeps the subnet.
    let all = vec![first.clone().into(), copy.into()];
    assert_eq!(
        admitted(&mut peers, LeaseEvent::Snapshot(all)),
        Some(LeaseEvent::Snapshot(vec![first.into()]))
    );
}

/// An IPv6-only vxlan lease, as flanneld writes one: no IPv4 subnet or PublicIP, the
/// VtepMAC in BackendV6Data.
fn ipv6_only_lease(n: u8) -> Lease {
    let data = serde_json::json!({"VNI": 1, "VtepMAC": format!("0a:00:00:00:00:{n:02x}")});
    let ip: Ipv6Addr = format!("fd00:200::{n}").parse().unwrap();
    let attrs = LeaseAttrs::typed(ip, Some("vxlan"), None).with_ipv6(ip, Some(data.into()));
    Lease::new(
        format!("fd10:0:0:{n}::/64").parse::<Ipv6Net>().unwrap(),
        attrs,
    )
}

fn ipv6_only_peers() -> Peers {
    let json = r#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd10::/48","Backend":{"Type":"vxlan"}}"#;
    let config = Config::parse(json).unwrap();
    let rules = LeaseRules::new(&config, &ipv6_only_lease(1));
    Peers::new(rules, LeaseNamer::EtcdKey("/p/subnets/".into()))
}

/// No lease of an IPv6-only network has an IPv4 subnet: each is still a peer of its own,
/// named by its IPv6 subnet, and one goes without taking the others along.
#[test]
fn ipv6_only_leases_are_peers_of_their_own() {
    let mut peers = ipv6_only_peers();
    let (two, three) = (ipv6_only_lease(2), ipv6_only_lease(3));
    assert_eq!(two.id(), SubnetId::V6("fd10:0:0:2::/64".parse().unwrap()));
    for lease in [&two, &three] {
        let added = admitted(&mut peers, LeaseEvent::Added(lease.clone().into()));
        assert_eq!(added, Some(LeaseEvent::Added(lease.clone().into())));
    }
    assert_eq!(peers.accepted().count(), 2);
    assert_eq!(peers.refused().count(), 0);
    // Our own subnet, and one overlapping a peer's, are refused like any IPv6 subnet.
    let mut own = ipv6_only_lease(9);
    own.subnets = Subnets::V6("fd10:0:0:1::/64".parse().unwrap());
    let mut wide = ipv6_only_lease(8);
    wide.subnets = Subnets::V6("fd10:0:0:2::/63".parse().unwrap());
    wide.public_addrs = PublicAddrs::V6("fd00:200::8".parse().unwrap());
    assert_eq!(admitted(&mut peers, LeaseEvent::Added(own.into())), None);
    let removed = admitted(&mut peers, LeaseEvent::Removed(two.clone().into()));
    assert_eq!(removed, Some(LeaseEvent::Removed(two.into())));
    assert_eq!(peers.accepted().collect::<Vec<_>>(), [&three]);
    assert_eq!(admitted(&mut peers, LeaseEvent::Added(wide.into())), None);
    let refused: Vec<String> = peers.refused().map(|r| r.reason.to_string()).collect();
    assert!(
        refused
            .iter()
            .any(|r| r.contains("overlaps this node's own IPv6 subnet")),
        "{refused:?}"
    );
    assert!(
        refused.iter().any(|r| r.contains("prefix length /63")),
        "{refused:?}"
    );
}

/// On an IPv6-only network, a lease with an IPv4 subnet (with an IPv6 one or without), or
/// without a PublicIPv6 or an IPv6 VtepMAC, is refused with the reason. (A key without
/// either subnet, flanneld's `0.0.0.0-0` alone, is no lease: see `lease::key`.)
#[test]
fn an_ipv6_only_network_refuses_leases_it_cannot_carry() {
    let mut peers = ipv6_only_peers();
    let with_ipv4 = ipv6_only_lease(4);
    let with_ipv4 = Lease {
        subnets: Subnets::Dual(
            "10.5.4.0/24".parse().unwrap(),
            with_ipv4.subnets.v6().unwrap(),
        ),
        ..with_ipv4
    };
    let without_ipv6 = Lease {
        subnets: Subnets::V4("10.5.5.0/24".parse().unwrap()),
        ..ipv6_only_lease(5)
    };
    let without_public_ipv6 = Lease {
        public_addrs: PublicAddrs::V4("10.200.0.6".parse().unwrap()),
        ..ipv6_only_lease(6)
    };
    let without_mac = Lease {
        backend_v6_data: None,
        ..ipv6_only_lease(7)
    };
    for lease in [with_ipv4, without_ipv6, without_public_ipv6, without_mac] {
        assert_eq!(admitted(&mut peers, LeaseEvent::Added(lease.into())), None);
    }
    let mut refused: Vec<String> = peers
        .refused()
        .map(|r| format!("{}: {}", peers.namer().name(&r.lease), r.reason))
        .collect();
    refused.sort();
    assert_eq!(
        refused,
        [
            "/p/subnets/0.0.0.0-0&fd10:0:0:6::-64: it names no PublicIPv6, and this network \
             reaches peers over IPv6 (its Backend.Underlay is ipv6, or it is IPv6-only): there \
             is no address to send its traffic to",
            "/p/subnets/0.0.0.0-0&fd10:0:0:7::-64: it has no BackendV6Data.VtepMAC",
            "/p/subnets/10.5.4.0-24&fd10:0:0:4::-64: it has the IPv4 subnet 10.5.4.0/24, and \
             this network is IPv6-only (EnableIPv4 false)",
            "/p/subnets/10.5.5.0-24: it has the IPv4 subnet 10.5.5.0/24, and this network is \
             IPv6-only (EnableIPv4 false)",
        ]
    );
}
