//! The lease values twill writes, checked against the ones flanneld v0.28.9 writes: same field names, same order, same JSON types, and readable as flannel's.

use serde_json::{Map, Value};
use std::net::Ipv4Addr;
use twill_control::lease::LeaseAttrs;

/// Lease values as flanneld v0.28.9 writes them, byte for byte.
const FLANNEL_UDP: &str = r#"{"PublicIP":"10.200.0.1","PublicIPv6":null}"#;
const FLANNEL_VXLAN: &str = r#"{"PublicIP":"10.200.0.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"d6:60:f1:85:5a:fc"}}"#;
const FLANNEL_HOST_GW: &str =
    r#"{"PublicIP":"10.200.0.1","PublicIPv6":null,"BackendType":"host-gw"}"#;
const FLANNEL_IPIP: &str = r#"{"PublicIP":"…","BackendType":"ipip"}"#;

fn public_ip() -> Ipv4Addr {
    "10.200.0.1".parse().unwrap()
}

fn object(json: &str) -> Map<String, Value> {
    // serde_json keeps keys sorted unless told otherwise, so the order is read from the text.
    match serde_json::from_str(json).unwrap() {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

/// Field names in the order they appear in the text.
fn field_order(json: &str) -> Vec<String> {
    let mut names: Vec<(usize, String)> = object(json)
        .keys()
        .map(|k| (json.find(&format!("\"{k}\":")).unwrap(), k.clone()))
        .collect();
    names.sort();
    names.into_iter().map(|(_, k)| k).collect()
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Same names, order and types, recursively (BackendData included).
fn assert_same_shape(twill: &str, flannel: &str) {
    assert_eq!(
        field_order(twill),
        field_order(flannel),
        "field names/order\n twill:   {twill}\n flannel: {flannel}"
    );
    let (t, f) = (object(twill), object(flannel));
    for (name, fv) in &f {
        let tv = &t[name];
        assert_eq!(
            json_type(tv),
            json_type(fv),
            "type of {name}\n twill:   {twill}\n flannel: {flannel}"
        );
        if let (Value::Object(_), Value::Object(_)) = (tv, fv) {
            assert_same_shape(&tv.to_string(), &fv.to_string());
        }
    }
}

/// What flanneld's Go `LeaseAttrs` unmarshal demands: PublicIP a dotted IPv4 string,
/// PublicIPv6 null or a string, BackendType a string, BackendData any JSON (kept raw).
fn assert_parses_as_flannels(json: &str) {
    let obj = object(json);
    let ip = obj["PublicIP"].as_str().expect("PublicIP is a string");
    ip.parse::<Ipv4Addr>().expect("PublicIP is an IPv4 address");
    assert!(matches!(
        obj.get("PublicIPv6"),
        None | Some(Value::Null) | Some(Value::String(_))
    ));
    assert!(matches!(
        obj.get("BackendType"),
        None | Some(Value::String(_))
    ));
    let known = [
        "PublicIP",
        "PublicIPv6",
        "BackendType",
        "BackendData",
        "BackendV6Data",
    ];
    assert!(
        obj.keys().all(|k| known.contains(&k.as_str())),
        "field flanneld does not know: {json}"
    );
}

#[test]
fn udp_vxlan_and_host_gw_match_flanneld_byte_for_byte() {
    let cases = [
        (LeaseAttrs::udp(public_ip()), FLANNEL_UDP),
        (
            LeaseAttrs::vxlan(public_ip(), 1, "d6:60:f1:85:5a:fc"),
            FLANNEL_VXLAN,
        ),
        (LeaseAttrs::host_gw(public_ip()), FLANNEL_HOST_GW),
    ];
    for (attrs, flannel) in cases {
        let twill = attrs.to_json();
        assert_same_shape(&twill, flannel);
        assert_parses_as_flannels(&twill);
        assert_eq!(twill, flannel);
        assert_eq!(
            LeaseAttrs::from_json(flannel).unwrap(),
            attrs,
            "twill reads flanneld's value"
        );
    }
}

/// flannel.md abbreviates the ipip value. flanneld marshals the same Go struct for every backend,
/// and its `PublicIPv6 *ip.IP6` has no omitempty, so it writes `"PublicIPv6":null` for ipip too;
/// twill does the same. Every field the reference shows is there, in its order, with its type.
#[test]
fn ipip_has_every_field_flannel_md_shows_in_order() {
    let twill = LeaseAttrs::ipip(public_ip()).to_json();
    assert_parses_as_flannels(&twill);
    let order = field_order(&twill);
    let shown = field_order(FLANNEL_IPIP);
    let positions: Vec<usize> = shown
        .iter()
        .map(|f| order.iter().position(|o| o == f).unwrap())
        .collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "order differs: {twill} vs {FLANNEL_IPIP}"
    );
    let (t, f) = (object(&twill), object(FLANNEL_IPIP));
    for (name, fv) in &f {
        assert_eq!(json_type(&t[name]), json_type(fv), "type of {name}");
    }
    assert_eq!(t["BackendType"], "ipip");
    assert_eq!(t["PublicIPv6"], Value::Null);
}

#[test]
fn twill_batch_is_shaped_like_flannels_values() {
    let twill = LeaseAttrs::twill_batch(public_ip()).to_json();
    assert_parses_as_flannels(&twill);
    assert_same_shape(&twill, FLANNEL_HOST_GW);
}

/// Guards the literals above against drifting from the reference, where the reference is at
/// hand (next to the repository, as in CI).
#[test]
fn literals_are_the_ones_in_flannel_md() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/reference/flannel.md"
    );
    let Ok(reference) = std::fs::read_to_string(path) else {
        eprintln!("{path} not found; skipping the cross-check");
        return;
    };
    for literal in [FLANNEL_UDP, FLANNEL_VXLAN, FLANNEL_HOST_GW, FLANNEL_IPIP] {
        assert!(
            reference.contains(literal),
            "{literal} is not in flannel.md"
        );
    }
}
