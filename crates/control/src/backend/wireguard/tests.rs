use super::*;
use twill_dataplane::engine::wireguard::PrivateKey;

const KEY: &str = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=";

fn config(mode: Mode) -> WireguardConfig {
    WireguardConfig {
        listen_port: 51820,
        listen_port_v6: 51821,
        mode,
        psk: None,
        keepalive: None,
        mtu: None,
    }
}

fn tunnel() -> TunnelParams {
    TunnelParams {
        private_key: PrivateKey::generate(),
        preshared_key: None,
        keepalive: None,
    }
}

/// Each planned device as (name, port, families, underlay).
fn planned(mode: Mode, dual_stack: bool) -> Vec<(&'static str, u16, Families, Families)> {
    let devices = plan(&config(mode), dual_stack, tunnel());
    let shown = |d: &DevicePlan| {
        let s = &d.settings;
        (d.name, s.listen_port, s.families, d.underlay)
    };
    devices.iter().map(shown).collect()
}

#[test]
fn each_mode_makes_flannels_devices() {
    use Families::{Both, Ipv4, Ipv6};
    assert_eq!(
        planned(Mode::Separate, true),
        [
            ("flannel-wg", 51820, Ipv4, Ipv4),
            ("flannel-wg-v6", 51821, Ipv6, Ipv6)
        ]
    );
    assert_eq!(
        planned(Mode::Ipv4, true),
        [("flannel-wg", 51820, Both, Ipv4)]
    );
    assert_eq!(
        planned(Mode::Ipv6, true),
        [("flannel-wg", 51820, Both, Ipv6)]
    );
    assert_eq!(
        planned(Mode::Auto, true),
        [("flannel-wg", 51820, Both, Both)]
    );
    for mode in [Mode::Separate, Mode::Ipv4, Mode::Auto] {
        assert_eq!(planned(mode, false), [("flannel-wg", 51820, Ipv4, Ipv4)]);
    }
    let devices = plan(&config(Mode::Separate), true, tunnel());
    assert_eq!(devices[0].device, Device::Main);
    assert_eq!(devices[1].device, Device::V6);
}

#[test]
fn a_device_gets_the_address_and_route_of_each_family_it_carries() {
    let addressing = Addressing {
        subnet: "10.5.1.0/24".parse().unwrap(),
        network: "10.5.0.0/16".parse().unwrap(),
        ipv6: Some((
            "fd10:0:0:1::/64".parse().unwrap(),
            "fd10::/48".parse().unwrap(),
        )),
    };
    let shown = |families| -> Vec<String> {
        let own = addressing.of_families(families);
        own.iter().map(|(a, n)| format!("{a} {n}")).collect()
    };
    assert_eq!(shown(Families::Ipv4), ["10.5.1.0/32 10.5.0.0/16"]);
    assert_eq!(shown(Families::Ipv6), ["fd10:0:0:1::/128 fd10::/48"]);
    assert_eq!(
        shown(Families::Both),
        ["10.5.1.0/32 10.5.0.0/16", "fd10:0:0:1::/128 fd10::/48"]
    );
    assert_eq!(addressing.address6(Families::Ipv4), None);
    assert_eq!(
        addressing.address6(Families::Both),
        Some("fd10:0:0:1::".parse().unwrap())
    );
    let v4_only = Addressing {
        ipv6: None,
        ..addressing
    };
    assert_eq!(v4_only.of_families(Families::Both).len(), 1);
}

#[test]
fn the_lease_is_flanneds_byte_for_byte() {
    let public_ip: std::net::Ipv4Addr = "10.200.0.1".parse().unwrap();
    let v4 = lease_attrs(PublicAddrs::V4(public_ip), KEY, &config(Mode::Separate));
    assert_eq!(
        v4.to_json(),
        format!(
            r#"{{"PublicIP":"10.200.0.1","PublicIPv6":null,"BackendType":"wireguard","BackendData":{{"PublicKey":"{KEY}","Port":51820}}}}"#
        )
    );
    let dual = PublicAddrs::Dual(public_ip, "fd00:200::1".parse().unwrap());
    let dual = lease_attrs(dual, KEY, &config(Mode::Ipv4));
    // flanneld's newSubnetAttrs: BackendV6Data names ListenPortV6 in every mode.
    assert_eq!(
        dual.to_json(),
        format!(
            r#"{{"PublicIP":"10.200.0.1","PublicIPv6":"fd00:200::1","BackendType":"wireguard","BackendData":{{"PublicKey":"{KEY}","Port":51820}},"BackendV6Data":{{"PublicKey":"{KEY}","Port":51821}}}}"#
        )
    );
}
