use super::*;
use crate::lease::{BackendData, LeaseAttrs};

const KEY: &str = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=";
const OTHER_KEY: &str = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";

/// A dual-stack node at fd00:200::1 running `mode`, with flannel's default ports.
fn reader(mode: Mode) -> LeaseReader {
    LeaseReader {
        mode,
        listen_port: 51820,
        listen_port_v6: 51821,
        own_public_ipv6: Some("fd00:200::1".parse().unwrap()),
    }
}

/// A dual-stack lease as flanneld writes it, at 10.200.0.2 and `public_ipv6`, with the ports
/// 51999 and 51998.
fn dual(public_ip: &str, public_ipv6: &str) -> Lease {
    let attrs = LeaseAttrs::wireguard(public_ip.parse::<std::net::Ipv4Addr>().unwrap(), KEY, 51999)
        .with_ipv6(
            public_ipv6.parse().unwrap(),
            Some(BackendData::wireguard(KEY, 51998)),
        );
    Lease::new("10.5.2.0/24".parse::<ipnet::Ipv4Net>().unwrap(), attrs)
        .with_ipv6_subnet("fd10:0:0:2::/64".parse().unwrap())
}

fn lease() -> Lease {
    dual("10.200.0.2", "fd00:200::2")
}

fn endpoints(peers: LeasePeers) -> (String, Option<String>) {
    let v6 = peers.v6.map(|p| p.endpoint.to_string());
    (peers.main.endpoint.to_string(), v6)
}

#[test]
fn separate_puts_each_family_on_its_own_device_and_underlay() {
    let peers = reader(Mode::Separate).read(&lease()).unwrap();
    assert_eq!(
        endpoints(peers),
        (
            "10.200.0.2:51999".into(),
            Some("[fd00:200::2]:51998".into())
        )
    );
    let v6 = peers.v6.unwrap();
    assert_eq!(
        (v6.subnet, v6.subnet6),
        (peers.main.subnet, peers.main.subnet6)
    );
    assert_eq!(v6.subnet6, Some("fd10:0:0:2::/64".parse().unwrap()));
    assert_eq!(v6.public_key.to_string(), KEY);
    // An IPv4-only peer of a dual-stack network: flannel-wg alone.
    let v4_only = Lease::new(
        "10.5.3.0/24".parse::<ipnet::Ipv4Net>().unwrap(),
        LeaseAttrs::wireguard(
            "10.200.0.3".parse::<std::net::Ipv4Addr>().unwrap(),
            KEY,
            51820,
        ),
    );
    let peers = reader(Mode::Separate).read(&v4_only).unwrap();
    assert_eq!(endpoints(peers), ("10.200.0.3:51820".into(), None));
    assert_eq!(peers.main.subnet6, None);
}

#[test]
fn one_device_modes_carry_both_subnets_to_the_address_the_mode_names() {
    for (mode, want) in [
        (Mode::Ipv4, "10.200.0.2:51999"),
        // The port its one device listens on, BackendData's, for either family.
        (Mode::Ipv6, "[fd00:200::2]:51999"),
        (Mode::Auto, "10.200.0.2:51999"),
    ] {
        let peers = reader(mode).read(&lease()).unwrap();
        assert_eq!(endpoints(peers), (want.into(), None), "{mode}");
        assert_eq!(peers.main.subnet6, lease().subnets.v6(), "{mode}");
    }
}

#[test]
fn auto_picks_ipv6_only_where_flannels_select_mode_does() {
    let own_global = LeaseReader {
        own_public_ipv6: Some("2001:db8::1".parse().unwrap()),
        ..reader(Mode::Auto)
    };
    let cases = [
        // A private IPv4 address and public IPv6 ones at both ends.
        (
            &own_global,
            dual("10.200.0.2", "2001:db8::2"),
            "[2001:db8::2]:51999",
        ),
        // A public IPv4 address wins.
        (
            &own_global,
            dual("192.0.2.2", "2001:db8::2"),
            "192.0.2.2:51999",
        ),
        // Unique-local IPv6 at either end: IPv4.
        (
            &own_global,
            dual("10.200.0.2", "fd00:200::2"),
            "10.200.0.2:51999",
        ),
        (
            &reader(Mode::Auto),
            dual("172.16.0.2", "2001:db8::2"),
            "172.16.0.2:51999",
        ),
    ];
    for (reader, lease, want) in cases {
        let got = reader.read(&lease).unwrap().main.endpoint.to_string();
        assert_eq!(got, want, "{lease:?}");
    }
}

#[test]
fn a_lease_without_ports_is_reached_at_ours() {
    let attrs = LeaseAttrs {
        backend_data: Some(serde_json::json!({ "PublicKey": KEY }).into()),
        backend_v6_data: Some(serde_json::json!({ "PublicKey": KEY }).into()),
        ..lease().attrs()
    };
    let old = Lease::new(lease().subnets, attrs);
    let peers = reader(Mode::Separate).read(&old).unwrap();
    assert_eq!(
        endpoints(peers),
        (
            "10.200.0.2:51820".into(),
            Some("[fd00:200::2]:51821".into())
        )
    );
}

#[test]
fn a_lease_lacking_what_the_mode_needs_is_refused_with_the_reason() {
    let without = |change: fn(&mut Lease)| {
        let mut lease = lease();
        change(&mut lease);
        lease
    };
    let cases = [
        (
            Mode::Separate,
            without(|l| l.backend_v6_data = None),
            "it has an IPv6 subnet but no BackendV6Data.PublicKey, which flanneld writes on a \
             dual-stack network",
        ),
        (
            Mode::Ipv4,
            without(|l| l.backend_v6_data = Some(BackendData::wireguard(OTHER_KEY, 51821))),
            "its BackendV6Data.PublicKey \"yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=\" is not \
             its BackendData.PublicKey \"HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=\": flanneld \
             writes its node's one key in both",
        ),
        (
            Mode::Separate,
            without(|l| l.backend_v6_data = Some(BackendData::wireguard(KEY, 0))),
            "its BackendV6Data.Port 0 is not a UDP port",
        ),
        (
            Mode::Separate,
            without(|l| l.public_addrs = l.public_addrs.without_v6().unwrap()),
            "it has no PublicIPv6, and Mode separate's flannel-wg-v6 reaches peers over the IPv6 \
             underlay",
        ),
        (
            Mode::Ipv6,
            Lease::new(
                "10.5.3.0/24".parse::<ipnet::Ipv4Net>().unwrap(),
                LeaseAttrs::wireguard(
                    "10.200.0.3".parse::<std::net::Ipv4Addr>().unwrap(),
                    KEY,
                    51820,
                ),
            ),
            "it has no PublicIPv6, and Mode ipv6 reaches peers over the IPv6 underlay",
        ),
    ];
    for (mode, lease, want) in cases {
        assert_eq!(reader(mode).read(&lease), Err(want.to_string()), "{mode}");
    }
}

#[test]
fn an_ipv4_only_node_leaves_a_leases_ipv6_side_alone() {
    let v4_only = LeaseReader {
        own_public_ipv6: None,
        ..reader(Mode::Separate)
    };
    let mut lease = lease();
    lease.backend_v6_data = None;
    let peers = v4_only.read(&lease).unwrap();
    assert_eq!(endpoints(peers), ("10.200.0.2:51999".into(), None));
    assert_eq!(peers.main.subnet6, None);
}
