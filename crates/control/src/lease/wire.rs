//! A lease's value in etcd: flannel's Go `LeaseAttrs` struct as `encoding/json` writes it.

use super::{BackendData, LeaseAttrs, LeaseError, PublicAddrs};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

/// The wire form of [`LeaseAttrs`]: field names, order and null/omit rules of flannel's Go
/// struct (`PublicIPv6 *ip.IP6` is always written, as `null` for IPv4-only nodes;
/// `BackendType`/`BackendData`/`BackendV6Data` are `omitempty`).
#[derive(Serialize, Deserialize)]
struct Wire {
    #[serde(rename = "PublicIP")]
    public_ip: Ipv4Addr,
    #[serde(rename = "PublicIPv6", default, deserialize_with = "ipv6_or_null")]
    public_ipv6: Option<Ipv6Addr>,
    #[serde(
        rename = "BackendType",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    backend_type: Option<String>,
    #[serde(
        rename = "BackendData",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    backend_data: Option<Box<RawValue>>,
    #[serde(
        rename = "BackendV6Data",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    backend_v6_data: Option<Box<RawValue>>,
}

/// `PublicIPv6`: `null` or an IPv6 address. flanneld's parser would take an IPv4 address here
/// too (as `::ffff:a.b.c.d`), but no flanneld writes one, so it is refused by name.
fn ipv6_or_null<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Ipv6Addr>, D::Error> {
    let Some(text) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    text.parse().map(Some).map_err(|_| {
        let text = crate::shown::quoted(&text);
        serde::de::Error::custom(format!("PublicIPv6 {text} is not an IPv6 address"))
    })
}

/// BackendData / BackendV6Data as read: `null` is no data, as for flanneld.
fn data_of(raw: Option<Box<RawValue>>) -> Option<BackendData> {
    raw.filter(|d| d.get() != "null")
        .map(|d| BackendData(Arc::from(d.get())))
}

impl LeaseAttrs {
    /// The etcd value, exactly as flanneld would write it for the same attributes: an
    /// IPv6-only node's PublicIP is `0.0.0.0`.
    pub fn to_json(&self) -> String {
        let wire = Wire {
            public_ip: self.public_addrs.v4().unwrap_or(Ipv4Addr::UNSPECIFIED),
            public_ipv6: self.public_addrs.v6(),
            // Go's omitempty drops an empty string, so an empty type is no type.
            backend_type: self
                .backend_type
                .as_deref()
                .filter(|t| !t.is_empty())
                .map(str::to_string),
            backend_data: self.backend_data.as_ref().map(BackendData::raw),
            backend_v6_data: self.backend_v6_data.as_ref().map(BackendData::raw),
        };
        serde_json::to_string(&wire).expect("lease attributes always serialise")
    }

    /// Reads an etcd value written by flanneld or twill; unknown fields are ignored. A
    /// PublicIP of `0.0.0.0` is no IPv4 address, as an IPv6-only flanneld writes it; a value
    /// that names no address at all is refused.
    pub fn from_json(json: &str) -> Result<Self, LeaseError> {
        let wire: Wire = serde_json::from_str(json)?;
        let public_ip = Some(wire.public_ip).filter(|ip| !ip.is_unspecified());
        let public_addrs =
            PublicAddrs::from_parts(public_ip, wire.public_ipv6).ok_or_else(|| {
                <serde_json::Error as serde::de::Error>::custom(
                    "PublicIP 0.0.0.0 is not a host address, and there is no PublicIPv6",
                )
            })?;
        Ok(LeaseAttrs {
            public_addrs,
            backend_type: wire
                .backend_type
                .filter(|t| !t.is_empty())
                .map(|t| Arc::from(t.as_str())),
            backend_data: data_of(wire.backend_data),
            backend_v6_data: data_of(wire.backend_v6_data),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    #[test]
    fn exact_json_per_backend() {
        let ip: Ipv4Addr = "10.200.0.1".parse().unwrap();
        let cases = [
            (
                LeaseAttrs::udp(ip),
                r#"{"PublicIP":"10.200.0.1","PublicIPv6":null}"#,
            ),
            (
                LeaseAttrs::vxlan(ip, 1, "d6:60:f1:85:5a:fc"),
                r#"{"PublicIP":"10.200.0.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"d6:60:f1:85:5a:fc"}}"#,
            ),
            (
                LeaseAttrs::host_gw(ip),
                r#"{"PublicIP":"10.200.0.1","PublicIPv6":null,"BackendType":"host-gw"}"#,
            ),
            (
                LeaseAttrs::ipip(ip),
                r#"{"PublicIP":"10.200.0.1","PublicIPv6":null,"BackendType":"ipip"}"#,
            ),
            (
                LeaseAttrs::twill_batch(ip),
                r#"{"PublicIP":"10.200.0.1","PublicIPv6":null,"BackendType":"twill-batch"}"#,
            ),
            (
                LeaseAttrs::wireguard(ip, "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=", 51820),
                r#"{"PublicIP":"10.200.0.1","PublicIPv6":null,"BackendType":"wireguard","BackendData":{"PublicKey":"HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=","Port":51820}}"#,
            ),
        ];
        for (attrs, want) in cases {
            assert_eq!(attrs.to_json(), want);
            assert_eq!(LeaseAttrs::from_json(want).unwrap(), attrs);
        }
    }

    #[test]
    fn reads_values_of_other_flannel_versions() {
        let old = r#"{"PublicIP":"10.200.0.2"}"#;
        assert_eq!(
            LeaseAttrs::from_json(old).unwrap(),
            LeaseAttrs::udp("10.200.0.2".parse::<Ipv4Addr>().unwrap())
        );
        let dual = r#"{"PublicIP":"10.200.0.2","PublicIPv6":"fc00::2","BackendType":"vxlan",
            "BackendData":{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:ff"},"BackendV6Data":{"VNI":1}}"#;
        let attrs = LeaseAttrs::from_json(dual).unwrap();
        let data = attrs.backend_data.unwrap();
        assert_eq!(data.get("VtepMAC").unwrap(), "aa:bb:cc:dd:ee:ff");
        assert_eq!(data.json(), r#"{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:ff"}"#);
        let null = r#"{"PublicIP":"10.200.0.2","BackendData":null}"#;
        assert_eq!(LeaseAttrs::from_json(null).unwrap().backend_data, None);
        assert!(LeaseAttrs::from_json(r#"{"PublicIPv6":null}"#).is_err());
    }

    const DUAL_VXLAN: &str = r#"{"PublicIP":"10.200.0.2","PublicIPv6":"fd00:200::2","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:01"},"BackendV6Data":{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:02"}}"#;

    #[test]
    fn a_dual_stack_lease_reads_and_writes_as_flanneld_does() {
        let attrs = LeaseAttrs::from_json(DUAL_VXLAN).unwrap();
        assert_eq!(
            attrs.public_addrs.v6(),
            Some("fd00:200::2".parse().unwrap())
        );
        let v6 = attrs.backend_v6_data.as_ref().unwrap();
        assert_eq!(v6.get("VtepMAC").unwrap(), "aa:bb:cc:dd:ee:02");
        assert_eq!(attrs.to_json(), DUAL_VXLAN);
        let built = LeaseAttrs::vxlan(
            "10.200.0.2".parse::<Ipv4Addr>().unwrap(),
            1,
            "aa:bb:cc:dd:ee:01",
        )
        .with_ipv6(
            "fd00:200::2".parse().unwrap(),
            Some(serde_json::json!({"VNI": 1, "VtepMAC": "aa:bb:cc:dd:ee:02"}).into()),
        );
        assert_eq!(built, attrs);
        assert_eq!(built.to_json(), DUAL_VXLAN);
    }

    #[test]
    fn absent_and_null_ipv6_fields_as_flanneld_writes_them() {
        let ip: Ipv4Addr = "10.200.0.3".parse().unwrap();
        // host-gw and udp write no BackendV6Data; an IPv6-only node writes PublicIP 0.0.0.0.
        let cases = [
            (
                r#"{"PublicIP":"10.200.0.3","PublicIPv6":"fd00::3","BackendType":"host-gw"}"#,
                LeaseAttrs::host_gw(ip).with_ipv6("fd00::3".parse().unwrap(), None),
            ),
            (
                r#"{"PublicIP":"10.200.0.3","PublicIPv6":null,"BackendType":"host-gw","BackendV6Data":null}"#,
                LeaseAttrs::host_gw(ip),
            ),
            (r#"{"PublicIP":"10.200.0.3"}"#, LeaseAttrs::udp(ip)),
            (
                r#"{"PublicIP":"0.0.0.0","PublicIPv6":"fd00::3"}"#,
                LeaseAttrs::udp(Ipv6Addr::from_str("fd00::3").unwrap()),
            ),
        ];
        for (json, want) in &cases {
            assert_eq!(&LeaseAttrs::from_json(json).unwrap(), want, "{json}");
        }
        assert_eq!(cases[3].1.public_addrs.v4(), None);
        assert_eq!(
            cases[0].1.to_json(),
            r#"{"PublicIP":"10.200.0.3","PublicIPv6":"fd00::3","BackendType":"host-gw"}"#
        );
    }

    #[test]
    fn an_ipv6_only_value_round_trips_as_flanneld_writes_it() {
        let json = r#"{"PublicIP":"0.0.0.0","PublicIPv6":"fd00:200::4","BackendType":"vxlan","BackendV6Data":{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:04"}}"#;
        let attrs = LeaseAttrs::from_json(json).unwrap();
        let ip: Ipv6Addr = "fd00:200::4".parse().unwrap();
        assert_eq!(attrs.public_addrs, PublicAddrs::V6(ip));
        assert_eq!(attrs.to_json(), json);
        let built = LeaseAttrs::typed(ip, Some("vxlan"), None).with_ipv6(
            ip,
            Some(serde_json::json!({"VNI": 1, "VtepMAC": "aa:bb:cc:dd:ee:04"}).into()),
        );
        assert_eq!(built, attrs);
    }

    #[test]
    fn bogus_ipv6_values_are_refused_by_name() {
        let cases = [
            (
                r#"{"PublicIP":"10.200.0.3","PublicIPv6":"10.0.0.1"}"#,
                "PublicIPv6 \"10.0.0.1\" is not an IPv6 address",
            ),
            (
                r#"{"PublicIP":"10.200.0.3","PublicIPv6":"banana"}"#,
                "PublicIPv6 \"banana\" is not an IPv6 address",
            ),
            (
                r#"{"PublicIP":"10.200.0.3","PublicIPv6":""}"#,
                "PublicIPv6 \"\" is not",
            ),
            (
                r#"{"PublicIP":"10.200.0.3","PublicIPv6":7}"#,
                "invalid type",
            ),
            (
                r#"{"PublicIP":"10.200.0.3","BackendV6Data":{"#,
                "invalid lease value",
            ),
            (r#"{"PublicIPv6":"fd00::3"}"#, "missing field `PublicIP`"),
            (
                r#"{"PublicIP":"0.0.0.0","PublicIPv6":null,"BackendType":"vxlan"}"#,
                "PublicIP 0.0.0.0 is not a host address, and there is no PublicIPv6",
            ),
            (
                r#"{"PublicIP":"0.0.0.0"}"#,
                "PublicIP 0.0.0.0 is not a host address, and there is no PublicIPv6",
            ),
        ];
        for (json, want) in cases {
            let err = LeaseAttrs::from_json(json).expect_err(json).to_string();
            assert!(
                err.starts_with("invalid lease value: ") && err.contains(want),
                "{json}: got {err:?}, want {want:?}"
            );
        }
    }
}
