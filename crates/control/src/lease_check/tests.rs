use super::*;
use crate::lease::LeaseAttrs;
use serde_json::json;

fn net(s: &str) -> Ipv4Net {
    s.parse().unwrap()
}

fn rules() -> LeaseRules {
    LeaseRules {
        ipv4: Some(Ipv4Rules {
            network: net("10.5.0.0/16"),
            subnet_len: 24,
            own_subnet: net("10.5.1.0/24"),
            own_public_ip: Ipv4Addr::new(10, 200, 0, 1),
        }),
        own_key: Some(OWN_KEY.parse().unwrap()),
        backend_type: None,
        ipv6: None,
    }
}

/// The checks of `lease` on a node of its own backend type, for the tests of the other rules.
fn check(lease: &Lease) -> Result<(), Rejection> {
    let rules = LeaseRules {
        backend_type: lease.backend_type.clone(),
        ..rules()
    };
    rules.check(lease)
}

/// A network with IPv4 refuses a lease that has no IPv4 subnet, or no PublicIP (flanneld's
/// IPv6-only lease, `0.0.0.0-0&…` with PublicIP 0.0.0.0), by name.
#[test]
fn a_lease_without_its_ipv4_side_is_refused_on_a_network_with_ipv4() {
    let v6: ipnet::Ipv6Net = "fd10:0:0:2::/64".parse().unwrap();
    let ip6: Ipv6Addr = "fd00:200::2".parse().unwrap();
    let no_subnet = Lease::new(v6, LeaseAttrs::udp(ip6));
    assert_eq!(rules().check(&no_subnet), Err(Rejection::NoIpv4Subnet));
    let no_public_ip = Lease::new(net("10.5.2.0/24"), LeaseAttrs::udp(ip6));
    let got = rules().check(&no_public_ip).unwrap_err();
    assert_eq!(got, Rejection::NoPublicIp);
    assert!(got.to_string().contains("not a host address"), "{got}");
}

#[test]
fn a_lease_of_another_backend_type_is_refused_naming_both() {
    let vxlan = vxlan("10.5.2.0/24", json!("d6:60:f1:85:5a:fc"));
    let got = rules().check(&vxlan).unwrap_err();
    assert_eq!(
        got,
        Rejection::BackendType {
            got: "vxlan".into(),
            want: "udp".into()
        }
    );
    assert!(
        got.to_string()
            .contains("backend type vxlan is not this node's udp"),
        "{got}"
    );
    let on_vxlan = LeaseRules {
        backend_type: Some("vxlan".into()),
        ..rules()
    };
    assert!(on_vxlan.check(&udp("10.5.3.0/24", "10.200.0.3")).is_err());
    assert_eq!(on_vxlan.check(&vxlan), Ok(()));
    let mut named_udp = udp("10.5.4.0/24", "10.200.0.4");
    named_udp.backend_type = Some("udp".into());
    assert_eq!(rules().check(&named_udp), Ok(()));
}

fn udp(subnet: &str, ip: &str) -> Lease {
    Lease::new(
        net(subnet),
        LeaseAttrs::udp(ip.parse::<std::net::Ipv4Addr>().unwrap()),
    )
}

fn vxlan(subnet: &str, mac: serde_json::Value) -> Lease {
    let mut lease = udp(subnet, "10.200.0.2");
    lease.backend_type = Some("vxlan".into());
    lease.backend_data = Some(json!({"VNI": 1, "VtepMAC": mac}).into());
    lease
}

fn wireguard(subnet: &str, data: serde_json::Value) -> Lease {
    let mut lease = udp(subnet, "10.200.0.2");
    lease.backend_type = Some("wireguard".into());
    lease.backend_data = Some(data.into());
    lease
}

const KEY: &str = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=";
const OWN_KEY: &str = "KCkqKywtLi8wMTIzNDU2Nzg5Ojs8PT4/QEFCQ0RFRkc=";

#[test]
fn a_good_lease_passes() {
    assert_eq!(check(&udp("10.5.2.0/24", "10.200.0.2")), Ok(()));
    let good_mac = vxlan("10.5.2.0/24", json!("d6:60:f1:85:5a:fc"));
    assert_eq!(check(&good_mac), Ok(()));
    let good_key = wireguard("10.5.2.0/24", json!({"PublicKey": KEY, "Port": 51820}));
    assert_eq!(check(&good_key), Ok(()));
    let no_port = wireguard("10.5.2.0/24", json!({ "PublicKey": KEY }));
    assert_eq!(check(&no_port), Ok(()));
}

#[test]
fn each_bad_lease_gets_its_reason() {
    let cases = [
        (
            udp("10.5.2.0/25", "10.200.0.2"),
            "prefix length /25 differs from the network's SubnetLen /24",
        ),
        (
            udp("10.6.2.0/24", "10.200.0.2"),
            "outside the network 10.5.0.0/16",
        ),
        (
            udp("10.5.1.0/24", "10.200.0.9"),
            "overlaps this node's own lease 10.5.1.0/24",
        ),
        (
            udp("10.5.2.0/24", "10.200.0.1"),
            "PublicIP 10.200.0.1 is this node's own",
        ),
        (udp("10.5.2.0/24", "0.0.0.0"), "is not a host address"),
        (udp("10.5.2.0/24", "127.0.0.1"), "is not a host address"),
        (udp("10.5.2.0/24", "224.0.0.1"), "is not a host address"),
        (
            udp("10.5.2.0/24", "255.255.255.255"),
            "is not a host address",
        ),
        (
            vxlan("10.5.2.0/24", json!("ff:ff:ff:ff:ff:ff")),
            "VtepMAC ff:ff:ff:ff:ff:ff is not a unicast address",
        ),
        (
            vxlan("10.5.2.0/24", json!("00:00:00:00:00:00")),
            "not a unicast address",
        ),
        (
            vxlan("10.5.2.0/24", json!("01:00:5e:00:00:01")),
            "not a unicast address",
        ),
        (
            vxlan("10.5.2.0/24", json!("banana")),
            "VtepMAC \"banana\" is not a MAC address",
        ),
        (vxlan("10.5.2.0/24", json!(7)), "no BackendData.VtepMAC"),
        (
            wireguard("10.5.2.0/24", json!({"PublicKey": "c2hvcnQ="})),
            "its PublicKey \"c2hvcnQ=\" is not a WireGuard key: 5 bytes long",
        ),
        (
            wireguard("10.5.2.0/24", json!({"PublicKey": "not base64!"})),
            "is not a WireGuard key: not base64",
        ),
        (
            wireguard("10.5.2.0/24", json!({})),
            "no BackendData.PublicKey",
        ),
        (
            wireguard("10.5.2.0/24", json!({"PublicKey": KEY, "Port": 0})),
            "its Port 0 is not a UDP port",
        ),
        (
            wireguard(
                "10.5.2.0/24",
                json!({"PublicKey": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}),
            ),
            "its PublicKey \"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\" is not a WireGuard \
             key: all zero",
        ),
        (
            wireguard("10.5.2.0/24", json!({ "PublicKey": OWN_KEY })),
            "its PublicKey \"KCkqKywtLi8wMTIzNDU2Nzg5Ojs8PT4/QEFCQ0RFRkc=\" is this node's own",
        ),
    ];
    for (lease, want) in cases {
        let got = check(&lease).expect_err(want).to_string();
        assert!(got.contains(want), "{lease:?}: got {got:?}, want {want:?}");
    }
}

#[test]
fn a_lease_claims_its_subnet_and_where_peers_are_known_by_address_its_endpoint() {
    let udp_lease = udp("10.5.2.0/24", "10.200.0.2");
    let endpoint = |port| Claim::Endpoint {
        ip: "10.200.0.2".parse().unwrap(),
        port,
    };
    assert_eq!(
        rules().claims(&udp_lease, None).as_slice(),
        [Claim::Subnet(net("10.5.2.0/24")), endpoint(None)]
    );
    // twill-batch leases name their port: two nodes on one address are two peers.
    let batch = LeaseRules {
        backend_type: BackendKind::TwillBatch.lease_type().map(Into::into),
        ..rules()
    };
    let batch_lease = Lease::new(
        net("10.5.3.0/24"),
        LeaseAttrs::typed(
            "10.200.0.2".parse::<std::net::Ipv4Addr>().unwrap(),
            BackendKind::TwillBatch.lease_type(),
            Some(json!({"Port": 8287, "Version": 1}).into()),
        ),
    );
    assert_eq!(
        batch.claims(&batch_lease, None).as_slice(),
        [Claim::Subnet(net("10.5.3.0/24")), endpoint(Some(8287))]
    );
    // A kernel backend knows a peer by its subnet, wireguard by its key: nodes behind one NAT
    // may share an address there.
    let key: PublicKey = OWN_KEY.parse().unwrap();
    let wireguard = LeaseRules {
        backend_type: BackendKind::Wireguard.lease_type().map(Into::into),
        ..rules()
    };
    let wg_lease = udp("10.5.4.0/24", "10.200.0.2");
    assert_eq!(
        wireguard.claims(&wg_lease, Some(key)).as_slice(),
        [Claim::Subnet(net("10.5.4.0/24")), Claim::Key(key)]
    );
    let host_gw = LeaseRules {
        backend_type: BackendKind::HostGw.lease_type().map(Into::into),
        ..rules()
    };
    assert_eq!(
        host_gw.claims(&wg_lease, None).as_slice(),
        [Claim::Subnet(net("10.5.4.0/24"))]
    );
}

#[test]
fn claims_clash_by_overlap_for_subnets_and_by_equality_for_the_rest() {
    let wide = Claim::Subnet(net("10.5.4.0/23"));
    assert!(wide.clashes(&Claim::Subnet(net("10.5.5.0/24"))));
    assert!(Claim::Subnet(net("10.5.5.0/24")).clashes(&wide));
    assert!(!wide.clashes(&Claim::Subnet(net("10.5.6.0/24"))));
    let v6 = |s: &str| Claim::Ipv6Subnet(s.parse().unwrap());
    assert!(v6("fd10::/48").clashes(&v6("fd10:0:0:2::/64")));
    assert!(!v6("fd10:0:0:3::/64").clashes(&v6("fd10:0:0:2::/64")));
    let at = |ip: &str, port| Claim::Endpoint {
        ip: ip.parse().unwrap(),
        port,
    };
    assert!(at("10.200.0.2", None).clashes(&at("10.200.0.2", None)));
    assert!(!at("10.200.0.2", Some(1)).clashes(&at("10.200.0.2", Some(2))));
    assert!(!wide.clashes(&at("10.5.4.0", None)));
}
