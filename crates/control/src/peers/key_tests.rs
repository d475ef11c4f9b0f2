use super::tests::admitted;
use super::*;
use crate::lease::{Created, LeaseAttrs, PublicAddrs, Subnets};

const KEY: &str = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=";
const OTHER: &str = "KCkqKywtLi8wMTIzNDU2Nzg5Ojs8PT4/QEFCQ0RFRkc=";

/// A wireguard lease at `10.5.<third>.0/24` with `key`, made at etcd revision `made`.
fn wg(third: u8, key: &str, made: i64) -> Lease {
    let subnet: ipnet::Ipv4Net = format!("10.5.{third}.0/24").parse().unwrap();
    let ip: std::net::Ipv4Addr = format!("10.200.0.{third}").parse().unwrap();
    Lease::new(subnet, LeaseAttrs::wireguard(ip, key, 51820)).with_created(Created::at(made))
}

fn peers() -> Peers {
    super::tests::peers_on(Some("wireguard"))
}

fn subnets<'a>(leases: impl Iterator<Item = &'a Lease>) -> Vec<String> {
    leases
        .map(|l| l.subnets.v4().unwrap().to_string())
        .collect()
}

fn refusal(peers: &Peers) -> Vec<(String, String)> {
    let refused = peers.refused();
    refused
        .map(|r| {
            (
                r.lease.subnets.v4().unwrap().to_string(),
                r.reason.to_string(),
            )
        })
        .collect()
}

#[test]
fn of_two_leases_with_one_key_the_first_made_is_the_peer_whatever_the_subnets() {
    let (real, copy) = (wg(3, KEY, 5), wg(0, KEY, 9));
    let mut peers = peers();
    let event = admitted(
        &mut peers,
        LeaseEvent::Snapshot(vec![copy.clone().into(), real.clone().into()]),
    );
    assert_eq!(event, Some(LeaseEvent::Snapshot(vec![real.clone().into()])));
    let why = format!(
        "its PublicKey \"{KEY}\" is already the key of the lease 10.5.3.0/24, made before it: \
         a WireGuard key can be only one peer"
    );
    assert_eq!(refusal(&peers), [("10.5.0.0/24".into(), why.clone())]);

    // The same, lease by lease, in either order.
    let mut in_order = self::peers();
    assert!(admitted(&mut in_order, LeaseEvent::Added(real.clone().into())).is_some());
    assert_eq!(
        admitted(&mut in_order, LeaseEvent::Added(copy.clone().into())),
        None
    );
    let mut reversed = self::peers();
    admitted(&mut reversed, LeaseEvent::Added(copy.clone().into()));
    let event = admitted(&mut reversed, LeaseEvent::Added(real.clone().into()));
    assert_eq!(event, Some(LeaseEvent::Snapshot(vec![real.clone().into()])));
    for p in [&in_order, &reversed] {
        assert_eq!(subnets(p.accepted()), ["10.5.3.0/24"]);
        assert_eq!(refusal(p), [("10.5.0.0/24".into(), why.clone())]);
    }
}

#[test]
fn when_the_first_goes_or_takes_another_key_the_next_in_line_is_the_peer() {
    let (first, second, third) = (wg(3, KEY, 5), wg(4, KEY, 7), wg(2, KEY, 9));
    let mut peers = peers();
    admitted(
        &mut peers,
        LeaseEvent::Snapshot(vec![
            third.clone().into(),
            second.clone().into(),
            first.clone().into(),
        ]),
    );
    let event = admitted(&mut peers, LeaseEvent::Removed(first.clone().into()));
    let swap = Some(LeaseEvent::Snapshot(vec![second.clone().into()]));
    assert_eq!(event, swap, "one event: the old peer out, the next one in");
    let left = refusal(&peers);
    assert_eq!(left.len(), 1);
    assert!(
        left[0].1.contains("key of the lease 10.5.4.0/24"),
        "{left:?}"
    );

    let rekeyed = wg(4, OTHER, 7);
    let event = admitted(&mut peers, LeaseEvent::Added(rekeyed.clone().into()));
    assert_eq!(
        event,
        Some(LeaseEvent::Snapshot(vec![third.into(), rekeyed.into()]))
    );
    assert!(peers.refused().next().is_none());
}

#[test]
fn an_update_that_keeps_its_key_is_one_event_and_other_backends_have_no_keys() {
    let mut peers = peers();
    let real = wg(3, KEY, 5);
    admitted(&mut peers, LeaseEvent::Added(real.clone().into()));
    let mut moved = real.clone();
    moved.public_addrs = PublicAddrs::V4("10.200.0.33".parse().unwrap());
    let event = admitted(&mut peers, LeaseEvent::Added(moved.clone().into()));
    assert_eq!(event, Some(LeaseEvent::Added(moved.into())));
    let udp = Lease::new(
        "10.5.9.0/24".parse::<ipnet::Ipv4Net>().unwrap(),
        LeaseAttrs::udp("10.200.0.9".parse::<std::net::Ipv4Addr>().unwrap()),
    );
    let twin = Lease {
        subnets: Subnets::V4("10.5.8.0/24".parse().unwrap()),
        public_addrs: PublicAddrs::V4("10.200.0.8".parse().unwrap()),
        ..udp.clone()
    };
    // On a udp node, two leases without keys never clash over one.
    let mut udp_peers = Peers::new(
        LeaseRules {
            backend_type: None,
            ..peers.rules.clone()
        },
        LeaseNamer::default(),
    );
    admitted(&mut udp_peers, LeaseEvent::Added(udp.into()));
    assert!(admitted(&mut udp_peers, LeaseEvent::Added(twin.into())).is_some());
    assert_eq!(udp_peers.accepted().count(), 2);
    // On this wireguard node, they are of another backend type.
    let refused = admitted(
        &mut peers,
        LeaseEvent::Added(
            Lease::new(
                "10.5.7.0/24".parse::<ipnet::Ipv4Net>().unwrap(),
                LeaseAttrs::udp("10.200.0.7".parse::<std::net::Ipv4Addr>().unwrap()),
            )
            .into(),
        ),
    );
    assert_eq!(refused, None);
    assert!(matches!(
        peers.refused().next().map(|r| &r.reason),
        Some(Rejection::BackendType { .. })
    ));
}
