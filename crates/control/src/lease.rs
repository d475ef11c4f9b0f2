//! Lease keys and values, exactly as flanneld writes them.
//!
//! A twill lease must be indistinguishable from a flanneld one: the same key
//! (`<prefix>/subnets/10.5.8.0-24`) and the same JSON, byte for byte, field order included
//! (flanneld marshals its Go `LeaseAttrs` struct: PublicIP, PublicIPv6, BackendType, BackendData).

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use std::net::Ipv4Addr;
use std::sync::Arc;
use twill_dataplane::engine::wireguard::PublicKey;

/// `BackendType` values that flanneld and twill write. flannel's udp backend writes none.
pub mod backend_type {
    pub const VXLAN: &str = "vxlan";
    pub const HOST_GW: &str = "host-gw";
    pub const IPIP: &str = "ipip";
    /// twill's own batching dataplane; flanneld nodes skip leases of a type they do not run.
    pub const TWILL_BATCH: &str = "twill-batch";
    pub const WIREGUARD: &str = "wireguard";
}

/// One node's claim on a subnet, as stored at `<prefix>/subnets/<net>-<len>`.
///
/// A node holds every lease of the network two or three times over (the registry's view, the
/// checked peers, events in flight), so the text parts are shared, not copied: a clone costs
/// two reference counts, and 60,000 leases fit in a few MB.
///
/// Two leases are equal when their subnet and attributes are: `created` is left out, because
/// it says where a lease stands among the others, not what it says (a renewal that changes
/// nothing is no change), and a lease built from flags has none.
#[derive(Debug, Clone, Eq)]
pub struct Lease {
    pub subnet: Ipv4Net,
    pub public_ip: Ipv4Addr,
    /// `None` for flannel's udp backend, which writes no BackendType.
    pub backend_type: Option<Arc<str>>,
    /// Backend-specific data (e.g. vxlan's `{"VNI":1,"VtepMAC":"…"}`).
    pub backend_data: Option<BackendData>,
    /// When the registry created it, relative to the other leases.
    pub created: Created,
}

impl PartialEq for Lease {
    fn eq(&self, other: &Lease) -> bool {
        self.subnet == other.subnet
            && self.public_ip == other.public_ip
            && self.backend_type == other.backend_type
            && self.backend_data == other.backend_data
    }
}

/// Where a lease stands in the order its registry created the leases, the same on every node:
/// of two leases that cannot both be peers (one WireGuard key, say), every node keeps the
/// older one, whatever order it heard of them in. Compared by `at`, then by `name`.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Created {
    /// etcd: the key's create_revision. Kubernetes: the Node's creationTimestamp, in seconds
    /// since 1970. Static registry: the `--peer` flag's position. 0 where it is not known.
    pub at: i64,
    /// Breaks ties of `at`: the Node's name in Kubernetes, whose timestamps have only seconds.
    /// Empty elsewhere.
    pub name: Arc<str>,
}

impl Created {
    /// An etcd key's create_revision, or a static peer's position: unique per lease.
    pub fn at(at: i64) -> Created {
        Created {
            at,
            name: Arc::default(),
        }
    }

    /// A Kubernetes Node's creationTimestamp and name.
    pub fn named(at: i64, name: &str) -> Created {
        Created {
            at,
            name: Arc::from(name),
        }
    }
}

/// What a node publishes about itself, i.e. a lease without its subnet. The registry picks the
/// subnet; the backend decides these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseAttrs {
    pub public_ip: Ipv4Addr,
    pub backend_type: Option<Arc<str>>,
    pub backend_data: Option<BackendData>,
}

/// A lease's BackendData as the JSON text it was written with; fields are parsed when asked
/// for. A parsed JSON map per lease took some 700 bytes, the text takes about 40.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendData(Arc<str>);

impl BackendData {
    /// The field's value, if the data is an object that has it.
    pub fn get(&self, field: &str) -> Option<Value> {
        self.fields()?.remove(field)
    }

    /// Every field, if the data is an object: one parse for a caller that reads several.
    pub fn fields(&self) -> Option<serde_json::Map<String, Value>> {
        match serde_json::from_str(&self.0) {
            Ok(Value::Object(map)) => Some(map),
            _ => None,
        }
    }

    /// The JSON text.
    pub fn json(&self) -> &str {
        &self.0
    }

    fn raw(&self) -> Box<RawValue> {
        RawValue::from_string(self.0.to_string()).expect("BackendData always holds valid JSON")
    }
}

impl From<Value> for BackendData {
    fn from(value: Value) -> Self {
        BackendData(value.to_string().into())
    }
}

/// Why a key or value could not be read as a lease.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("not a subnet lease key: {0:?}")]
    Key(String),
    #[error("invalid lease value: {0}")]
    Value(#[from] serde_json::Error),
}

/// The wire form of [`LeaseAttrs`]: field names, order and null/omit rules of flannel's Go
/// struct (`PublicIPv6 *ip.IP6` is always written, as `null` for IPv4-only nodes;
/// `BackendType`/`BackendData` are `omitempty`).
#[derive(Serialize, Deserialize)]
struct Wire {
    #[serde(rename = "PublicIP")]
    public_ip: Ipv4Addr,
    /// Read but ignored: twill is IPv4-only. Kept as a value so any flannel dual-stack lease parses.
    #[serde(rename = "PublicIPv6", default, serialize_with = "always_null")]
    public_ipv6: Value,
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
}

fn always_null<S: serde::Serializer>(_: &Value, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_none()
}

impl LeaseAttrs {
    /// flannel's udp backend: no BackendType at all.
    pub fn udp(public_ip: Ipv4Addr) -> Self {
        Self::typed(public_ip, None, None)
    }

    /// vxlan: BackendData carries the VNI and the MAC of the local `flannel.<VNI>` device.
    pub fn vxlan(public_ip: Ipv4Addr, vni: u32, vtep_mac: &str) -> Self {
        let data = serde_json::json!({"VNI": vni, "VtepMAC": vtep_mac});
        Self::typed(public_ip, Some(backend_type::VXLAN), Some(data.into()))
    }

    pub fn host_gw(public_ip: Ipv4Addr) -> Self {
        Self::typed(public_ip, Some(backend_type::HOST_GW), None)
    }

    pub fn ipip(public_ip: Ipv4Addr) -> Self {
        Self::typed(public_ip, Some(backend_type::IPIP), None)
    }

    pub fn twill_batch(public_ip: Ipv4Addr) -> Self {
        Self::typed(public_ip, Some(backend_type::TWILL_BATCH), None)
    }

    /// wireguard: BackendData carries the node's public key (base64) and listen port, in the
    /// order of flannel's Go struct (PublicKey, then Port).
    pub fn wireguard(public_ip: Ipv4Addr, public_key: &str, port: u16) -> Self {
        let data = serde_json::json!({"PublicKey": public_key, "Port": port});
        Self::typed(public_ip, Some(backend_type::WIREGUARD), Some(data.into()))
    }

    fn typed(
        public_ip: Ipv4Addr,
        backend_type: Option<&str>,
        backend_data: Option<BackendData>,
    ) -> Self {
        LeaseAttrs {
            public_ip,
            backend_type: backend_type.map(Arc::from),
            backend_data,
        }
    }

    /// The etcd value, exactly as flanneld would write it for the same attributes.
    pub fn to_json(&self) -> String {
        let wire = Wire {
            public_ip: self.public_ip,
            public_ipv6: Value::Null,
            // Go's omitempty drops an empty string, so an empty type is no type.
            backend_type: self
                .backend_type
                .as_deref()
                .filter(|t| !t.is_empty())
                .map(str::to_string),
            backend_data: self.backend_data.as_ref().map(BackendData::raw),
        };
        serde_json::to_string(&wire).expect("lease attributes always serialise")
    }

    /// Reads an etcd value written by flanneld or twill; unknown fields are ignored.
    pub fn from_json(json: &str) -> Result<Self, LeaseError> {
        let wire: Wire = serde_json::from_str(json)?;
        Ok(LeaseAttrs {
            public_ip: wire.public_ip,
            backend_type: wire
                .backend_type
                .filter(|t| !t.is_empty())
                .map(|t| Arc::from(t.as_str())),
            backend_data: wire
                .backend_data
                .filter(|d| d.get() != "null")
                .map(|d| BackendData(Arc::from(d.get()))),
        })
    }
}

impl Lease {
    pub fn new(subnet: Ipv4Net, attrs: LeaseAttrs) -> Self {
        Lease {
            subnet,
            public_ip: attrs.public_ip,
            backend_type: attrs.backend_type,
            backend_data: attrs.backend_data,
            created: Created::default(),
        }
    }

    /// The same lease, created at `created`.
    pub fn with_created(self, created: Created) -> Lease {
        Lease { created, ..self }
    }

    pub fn attrs(&self) -> LeaseAttrs {
        LeaseAttrs {
            public_ip: self.public_ip,
            backend_type: self.backend_type.clone(),
            backend_data: self.backend_data.clone(),
        }
    }

    /// The etcd key under `prefix` (e.g. `/coreos.com/network/subnets/10.5.8.0-24`).
    pub fn key(&self, prefix: &str) -> String {
        subnet_key(prefix, self.subnet)
    }

    /// The etcd value; see [`LeaseAttrs::to_json`].
    pub fn to_json(&self) -> String {
        self.attrs().to_json()
    }

    /// A wireguard lease's BackendData: its `PublicKey`, and its `Port` if it names one
    /// (flannel before leases carried `Port` did not). [`crate::lease_check`] refuses leases
    /// where this fails, with the reason it gives.
    pub fn wireguard_data(&self) -> Result<(PublicKey, Option<u16>), String> {
        let fields = self.backend_data.as_ref().and_then(BackendData::fields);
        let field = |name: &str| fields.as_ref()?.get(name);
        let key = match field("PublicKey") {
            Some(Value::String(text)) => text
                .parse::<PublicKey>()
                .map_err(|e| format!("its PublicKey {text:?} is not a WireGuard key: {e}"))?,
            Some(other) => return Err(format!("its PublicKey {other} is not a string")),
            None => return Err("it has no BackendData.PublicKey".into()),
        };
        let port = match field("Port") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_u64()
                    .and_then(|p| u16::try_from(p).ok())
                    .filter(|&p| p > 0)
                    .ok_or_else(|| format!("its Port {v} is not a UDP port"))?,
            ),
        };
        Ok((key, port))
    }

    /// Rebuilds a lease from an etcd key and value.
    pub fn from_kv(prefix: &str, key: &str, value: &str) -> Result<Self, LeaseError> {
        Ok(Lease::new(
            parse_subnet_key(prefix, key)?,
            LeaseAttrs::from_json(value)?,
        ))
    }
}

/// `<prefix>/subnets/` — every lease lives below it.
pub fn subnets_prefix(prefix: &str) -> String {
    format!("{}/subnets/", prefix.trim_end_matches('/'))
}

/// The etcd key of `subnet` under `prefix`: network address, dash, prefix length.
pub fn subnet_key(prefix: &str, subnet: Ipv4Net) -> String {
    format!(
        "{}{}-{}",
        subnets_prefix(prefix),
        subnet.network(),
        subnet.prefix_len()
    )
}

/// Parses a lease key. A dual-stack flannel key (`10.5.8.0-24&fc00::-64`) yields its IPv4 part.
pub fn parse_subnet_key(prefix: &str, key: &str) -> Result<Ipv4Net, LeaseError> {
    let bad = || LeaseError::Key(key.to_string());
    let name = key.strip_prefix(&subnets_prefix(prefix)).ok_or_else(bad)?;
    let v4 = name.split('&').next().unwrap_or_default();
    let (addr, len) = v4.split_once('-').ok_or_else(bad)?;
    let addr: Ipv4Addr = addr.parse().map_err(|_| bad())?;
    let len: u8 = len.parse().map_err(|_| bad())?;
    let subnet = Ipv4Net::new(addr, len).map_err(|_| bad())?;
    // A key with host bits set is not one flannel writes; refusing it avoids two keys per subnet.
    if subnet.trunc() != subnet {
        return Err(bad());
    }
    Ok(subnet)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFIX: &str = "/coreos.com/network";

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn key_format_and_parse() {
        let key = subnet_key(PREFIX, net("10.5.8.0/24"));
        assert_eq!(key, "/coreos.com/network/subnets/10.5.8.0-24");
        assert_eq!(parse_subnet_key(PREFIX, &key).unwrap(), net("10.5.8.0/24"));
        assert_eq!(
            subnet_key("/p/", net("10.5.8.0/24")),
            "/p/subnets/10.5.8.0-24"
        );
    }

    #[test]
    fn dual_stack_key_yields_ipv4_part() {
        let key = "/coreos.com/network/subnets/10.5.8.0-24&fc00::-64";
        assert_eq!(parse_subnet_key(PREFIX, key).unwrap(), net("10.5.8.0/24"));
    }

    #[test]
    fn bad_keys_are_refused() {
        for key in [
            "/coreos.com/network/config",
            "/other/subnets/10.5.8.0-24",
            "/coreos.com/network/subnets/10.5.8.0",
            "/coreos.com/network/subnets/10.5.8.0-33",
            "/coreos.com/network/subnets/10.5.8.1-24",
            "/coreos.com/network/subnets/x-24",
        ] {
            assert!(parse_subnet_key(PREFIX, key).is_err(), "{key}");
        }
    }

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
            LeaseAttrs::udp("10.200.0.2".parse().unwrap())
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

    #[test]
    fn lease_round_trips_through_key_and_value() {
        let lease = Lease::new(
            net("10.5.8.0/24"),
            LeaseAttrs::host_gw("10.200.0.1".parse().unwrap()),
        );
        let back = Lease::from_kv(PREFIX, &lease.key(PREFIX), &lease.to_json()).unwrap();
        assert_eq!(back, lease);
    }

    #[test]
    fn equality_is_of_what_a_lease_says_not_of_when_it_was_made() {
        let lease = Lease::new(
            net("10.5.8.0/24"),
            LeaseAttrs::host_gw("10.200.0.1".parse().unwrap()),
        );
        let later = lease.clone().with_created(Created::at(42));
        assert_eq!(later, lease);
        assert_ne!(later.created, lease.created);
        let mut moved = later.clone();
        moved.public_ip = "10.200.0.2".parse().unwrap();
        assert_ne!(moved, later);
        let order = [
            Created::default(),
            Created::at(7),
            Created::named(9, "node-a"),
            Created::named(9, "node-b"),
        ];
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
    }
}
