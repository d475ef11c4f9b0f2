use super::*;
use crate::config::Config;
use crate::lease::LeaseAttrs;

/// A dual-stack udp lease at 10.5.<third>.0/24 with the IPv6 subnet `v6`.
fn lease(third: u8, v6: &str) -> Lease {
    let ip = format!("10.200.0.{third}").parse().unwrap();
    Lease::new(
        format!("10.5.{third}.0/24").parse().unwrap(),
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
    assert!(peers.admit(LeaseEvent::Added(first.clone())).is_some());
    assert_eq!(peers.admit(LeaseEvent::Added(copy.clone())), None);
    let refused: Vec<String> = peers.refused().map(|r| r.reason.to_string()).collect();
    assert_eq!(
        refused,
        ["its IPv6 subnet overlaps fd10:0:0:2::/64, the IPv6 subnet of the peer lease 10.5.2.0/24"]
    );
    // The holder renews with the same IPv6 subnet: still its own.
    let renewed = Lease {
        public_ip: "10.200.0.22".parse().unwrap(),
        ..first.clone()
    };
    assert!(peers.admit(LeaseEvent::Added(renewed.clone())).is_some());
    assert_eq!(peers.admit(LeaseEvent::Added(copy.clone())), None);
    peers.admit(LeaseEvent::Removed(renewed));
    assert_eq!(
        peers.admit(LeaseEvent::Added(copy.clone())),
        Some(LeaseEvent::Added(copy.clone()))
    );
    // A snapshot starts the index afresh: the first made keeps the subnet.
    let all = vec![first.clone(), copy];
    assert_eq!(
        peers.admit(LeaseEvent::Snapshot(all)),
        Some(LeaseEvent::Snapshot(vec![first]))
    );
}
