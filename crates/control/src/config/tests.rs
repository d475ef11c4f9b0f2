use super::*;
use std::net::Ipv4Addr;

fn parse(json: &str) -> Config {
    Config::parse(json).unwrap_or_else(|e| panic!("{json}: {e}"))
}

fn error(json: &str) -> String {
    let err = Config::parse(json).expect_err(json).to_string();
    assert!(!err.contains('\n'), "multi-line error: {err}");
    assert!(err.starts_with("invalid network config: "), "{err}");
    err
}

fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

#[test]
fn flannel_reference_config() {
    let c = parse(
        r#"{"Network":"10.5.0.0/16","SubnetLen":24,"SubnetMin":"10.5.1.0","SubnetMax":"10.5.254.0","Backend":{"Type":"udp","Port":8285}}"#,
    );
    assert_eq!(
        c.ipv4.as_ref().unwrap().network,
        "10.5.0.0/16".parse().unwrap()
    );
    assert_eq!(c.ipv4.as_ref().unwrap().subnet_len, 24);
    assert_eq!(
        (
            c.ipv4.as_ref().unwrap().subnet_min,
            c.ipv4.as_ref().unwrap().subnet_max
        ),
        (ip("10.5.1.0"), ip("10.5.254.0"))
    );
    assert_eq!(c.backend.backend_type, "udp");
    assert_eq!(c.backend.port, Some(8285));
    assert_eq!(c.backend.raw["Port"], 8285);
}

#[test]
fn defaults_for_a_large_network() {
    let c = parse(r#"{"Network":"10.5.0.0/16"}"#);
    assert_eq!(c.ipv4.as_ref().unwrap().subnet_len, 24);
    assert_eq!(c.ipv4.as_ref().unwrap().subnet_min, ip("10.5.1.0"));
    assert_eq!(c.ipv4.as_ref().unwrap().subnet_max, ip("10.5.255.0"));
    assert_eq!(c.backend.backend_type, DEFAULT_BACKEND);
    assert_eq!(c.backend.raw, Value::Null);
}

#[test]
fn defaults_for_networks_smaller_than_22() {
    let c = parse(r#"{"Network":"10.5.0.0/22"}"#);
    assert_eq!(c.ipv4.as_ref().unwrap().subnet_len, 24);
    let c = parse(r#"{"Network":"10.5.0.0/25"}"#);
    assert_eq!(c.ipv4.as_ref().unwrap().subnet_len, 27);
    assert_eq!(
        (
            c.ipv4.as_ref().unwrap().subnet_min,
            c.ipv4.as_ref().unwrap().subnet_max
        ),
        (ip("10.5.0.32"), ip("10.5.0.96"))
    );
    assert_eq!(c.ipv4.as_ref().unwrap().subnets().count(), 3);
}

#[test]
fn unknown_fields_and_lowercase_names_are_tolerated() {
    let c = parse(
        r#"{"network":"10.6.0.0/16","EnableIPv4":true,"EnableNFTables":false,"Future":{"x":1},
        "Backend":{"Type":"vxlan","VNI":7,"Port":4789,"DirectRouting":true,"MTU":1400,"GBP":true}}"#,
    );
    assert_eq!(
        c.ipv4.as_ref().unwrap().network,
        "10.6.0.0/16".parse().unwrap()
    );
    let b = &c.backend;
    assert_eq!(
        (b.backend_type.as_str(), b.vni, b.port, b.mtu),
        ("vxlan", Some(7), Some(4789), Some(1400))
    );
    assert!(b.direct_routing);
    assert_eq!(b.raw["GBP"], true);
}

#[test]
fn host_bits_of_network_are_masked_like_flannel() {
    assert_eq!(
        parse(r#"{"Network":"10.5.3.7/16"}"#).ipv4.unwrap().network,
        "10.5.0.0/16".parse().unwrap()
    );
}

#[test]
fn zero_bounds_mean_default() {
    let c = parse(r#"{"Network":"10.5.0.0/16","SubnetLen":0,"SubnetMin":"0.0.0.0"}"#);
    assert_eq!(
        (
            c.ipv4.as_ref().unwrap().subnet_len,
            c.ipv4.as_ref().unwrap().subnet_min
        ),
        (24, ip("10.5.1.0"))
    );
}

#[test]
fn invalid_configs_name_the_field() {
    let cases = [
        ("{}", "Network is missing"),
        (
            r#"{"Network":"banana"}"#,
            "Network \"banana\" is not an IPv4 CIDR",
        ),
        (r#"{"Network":16}"#, "Network must be a CIDR string"),
        (
            r#"{"Network":"fc00::/48"}"#,
            "Network \"fc00::/48\" is not an IPv4 CIDR",
        ),
        (
            r#"{"Network":"10.5.0.0/29"}"#,
            "Network 10.5.0.0/29 is too small",
        ),
        (
            r#"{"Network":"10.5.0.0/16","SubnetLen":33}"#,
            "SubnetLen 33 is too long",
        ),
        (
            r#"{"Network":"10.5.0.0/16","SubnetLen":17}"#,
            "SubnetLen 17 is too short",
        ),
        (
            r#"{"Network":"10.5.0.0/16","SubnetLen":-1}"#,
            "SubnetLen -1 is not a valid number",
        ),
        (
            r#"{"Network":"10.5.0.0/16","SubnetMin":"10.6.1.0"}"#,
            "SubnetMin 10.6.1.0 is not in the range",
        ),
        (
            r#"{"Network":"10.5.0.0/16","SubnetMax":"10.5.1.7"}"#,
            "SubnetMax 10.5.1.7 is not on a SubnetLen /24 boundary",
        ),
        (
            r#"{"Network":"10.5.0.0/16","SubnetMin":"x"}"#,
            "SubnetMin \"x\" is not an IPv4 address",
        ),
        (
            r#"{"Network":"10.5.0.0/16","SubnetMin":"10.5.9.0","SubnetMax":"10.5.3.0"}"#,
            "SubnetMin 10.5.9.0 is above SubnetMax",
        ),
        (
            r#"{"Network":"10.5.0.0/16","Backend":{"Port":1}}"#,
            "Backend.Type is missing",
        ),
        (
            r#"{"Network":"10.5.0.0/16","Backend":"udp"}"#,
            "Backend must be a JSON object",
        ),
        (
            r#"{"Network":"10.5.0.0/16","Backend":{"Type":"udp","Port":70000}}"#,
            "Backend.Port 70000",
        ),
        (
            r#"{"Network":"10.5.0.0/16","EnableIPv6":true}"#,
            "EnableIPv6",
        ),
        (
            r#"{"Network":"10.5.0.0/16","EnableIPv4":false}"#,
            "EnableIPv4",
        ),
        ("[1]", "expected a JSON object"),
        ("{", "not valid JSON"),
        (
            r#"{"Network":"224.0.0.0/4"}"#,
            "Network 224.0.0.0/4 holds multicast addresses (224.0.0.0/4)",
        ),
        (
            r#"{"Network":"127.1.0.0/16"}"#,
            "Network 127.1.0.0/16 holds loopback addresses",
        ),
        (
            r#"{"Network":"192.0.0.0/2"}"#,
            "Network 192.0.0.0/2 holds multicast addresses",
        ),
        (
            r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan","VNI":16777216}}"#,
            "Backend.VNI 16777216 is out of range: a VXLAN network identifier has 24 bits",
        ),
    ];
    for (json, want) in cases {
        let err = error(json);
        assert!(err.contains(want), "{json}: got {err:?}, want {want:?}");
    }
}

#[test]
fn leasable_subnets() {
    let c = parse(r#"{"Network":"10.5.0.0/16","SubnetMin":"10.5.2.0","SubnetMax":"10.5.4.0"}"#);
    let all: Vec<String> = c
        .ipv4
        .as_ref()
        .unwrap()
        .subnets()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(all, ["10.5.2.0/24", "10.5.3.0/24", "10.5.4.0/24"]);
    assert!(c
        .ipv4
        .as_ref()
        .unwrap()
        .is_leasable("10.5.3.0/24".parse().unwrap()));
    assert!(!c
        .ipv4
        .as_ref()
        .unwrap()
        .is_leasable("10.5.1.0/24".parse().unwrap()));
    assert!(!c
        .ipv4
        .as_ref()
        .unwrap()
        .is_leasable("10.5.3.0/25".parse().unwrap()));
}

#[test]
fn debug_output_leaves_out_the_preshared_key() {
    let c = parse(
        r#"{"Network":"10.5.0.0/16","Backend":{"Type":"wireguard","PSK":"c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MDA="}}"#,
    );
    let shown = format!("{c:?}");
    assert!(
        shown.contains("wireguard") && !shown.contains("c2VjcmV0"),
        "{shown}"
    );
}

#[test]
fn for_network_applies_defaults() {
    let c = Config::for_network("10.7.0.0/16".parse().unwrap(), "twill-batch").unwrap();
    assert_eq!(
        (
            c.ipv4.as_ref().unwrap().subnet_len,
            c.backend.backend_type.as_str()
        ),
        (24, "twill-batch")
    );
}

#[test]
fn a_changed_config_names_its_fields_and_never_a_secret() {
    let psk = "vKo36JW5OcxFHeIUTgqMMwbIJg3HLZXtIC0B9lxF6Eo=";
    let other = "SAioU7qy9DTNFP+Z0s1bAniVyo36BbAQIjeXifQn4Ho=";
    let conf = |net: &str, psk: &str, port: u16| {
        Config::parse(&format!(
            r#"{{"Network":"{net}","Backend":{{"Type":"wireguard","PSK":"{psk}","ListenPort":{port}}}}}"#
        ))
        .unwrap()
    };
    let running = conf("10.5.0.0/16", psk, 51820);
    assert_eq!(running.difference(&running.clone()), None);
    let changed = running
        .difference(&conf("10.6.0.0/16", other, 51821))
        .unwrap();
    assert_eq!(
        changed,
        "Network 10.5.0.0/16 -> 10.6.0.0/16, SubnetMin 10.5.1.0 -> 10.6.1.0, \
         SubnetMax 10.5.255.0 -> 10.6.255.0, Backend.ListenPort 51820 -> 51821, \
         Backend.PSK <redacted> -> <redacted>"
    );
    assert!(!changed.contains(psk) && !changed.contains(other));
}

#[test]
fn the_largest_vni_and_a_network_below_multicast_are_fine() {
    let c = parse(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan","VNI":16777215}}"#);
    assert_eq!(c.backend.vni, Some(16_777_215));
    parse(r#"{"Network":"192.168.0.0/16"}"#);
    parse(r#"{"Network":"128.0.0.0/2"}"#);
}

#[test]
fn a_value_of_any_length_is_shown_cut_with_its_size() {
    let long = "A".repeat(500_000);
    let err = error(&format!(r#"{{"Network":"{long}"}}"#));
    assert!(err.len() < 2000, "{} bytes", err.len());
    assert!(err.contains("(500000 bytes)"), "{err}");
    let running = parse(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"udp"}}"#);
    let now = parse(&format!(
        r#"{{"Network":"10.5.0.0/16","Backend":{{"Type":"udp","Extra":"{long}"}}}}"#
    ));
    let change = running.difference(&now).unwrap();
    assert!(change.len() < 200 && change.contains("bytes)"), "{change}");
}

#[test]
fn enable_nftables_is_read_as_flannel_reads_it() {
    assert!(!parse(r#"{"Network":"10.5.0.0/16"}"#).enable_nftables);
    assert!(parse(r#"{"Network":"10.5.0.0/16","EnableNFTables":true}"#).enable_nftables);
    // Go's encoding/json matches field names case-insensitively.
    assert!(parse(r#"{"Network":"10.5.0.0/16","enablenftables":true}"#).enable_nftables);
    let err = error(r#"{"Network":"10.5.0.0/16","EnableNFTables":"yes"}"#);
    assert!(
        err.contains("EnableNFTables must be true or false"),
        "{err}"
    );
    let (iptables, nftables) = (
        parse(r#"{"Network":"10.5.0.0/16"}"#),
        parse(r#"{"Network":"10.5.0.0/16","EnableNFTables":true}"#),
    );
    assert_eq!(
        iptables.difference(&nftables).as_deref(),
        Some("EnableNFTables false -> true")
    );
}
