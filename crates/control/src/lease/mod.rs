//! Lease keys and values, exactly as flanneld writes them.
//!
//! A twill lease must be indistinguishable from a flanneld one: the same key
//! (`<prefix>/subnets/10.5.8.0-24`, see [`key`]) and the same JSON, byte for byte, field order
//! included (flanneld marshals its Go `LeaseAttrs` struct: PublicIP, PublicIPv6, BackendType,
//! BackendData, BackendV6Data).
//!
//! A dual-stack lease is one lease: its IPv6 subnet rides in the key beside the IPv4 one, its
//! `PublicIPv6` and `BackendV6Data` in the JSON beside `PublicIP` and `BackendData`.

mod key;
mod wire;

pub use key::{lease_key, parse_lease_key, parse_subnet_key, subnet_key, subnets_prefix, KeyError};

use crate::shown;
use ipnet::{Ipv4Net, Ipv6Net};
use serde_json::value::RawValue;
use serde_json::Value;
use std::net::{Ipv4Addr, Ipv6Addr};
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
    /// A dual-stack lease's IPv6 subnet, from the key's part after `&`.
    pub ipv6_subnet: Option<Ipv6Net>,
    pub public_ip: Ipv4Addr,
    /// `PublicIPv6`: the node's IPv6 underlay address, on a node that has one.
    pub public_ipv6: Option<Ipv6Addr>,
    /// `None` for flannel's udp backend, which writes no BackendType.
    pub backend_type: Option<Arc<str>>,
    /// Backend-specific data (e.g. vxlan's `{"VNI":1,"VtepMAC":"…"}`).
    pub backend_data: Option<BackendData>,
    /// `BackendV6Data`: the backend's data for IPv6 (e.g. vxlan's `flannel-v6` device's MAC).
    pub backend_v6_data: Option<BackendData>,
    /// When the registry created it, relative to the other leases.
    pub created: Created,
}

impl PartialEq for Lease {
    fn eq(&self, other: &Lease) -> bool {
        self.subnet == other.subnet
            && self.ipv6_subnet == other.ipv6_subnet
            && self.attrs() == other.attrs()
    }
}

/// A lease key's IPv4 part as a subnet: `None` for flanneld's empty one, `0.0.0.0/0`
/// (`0.0.0.0-0`), which an IPv6-only lease has.
pub fn ipv4_part(subnet: Ipv4Net) -> Option<Ipv4Net> {
    Some(subnet).filter(|s| s.prefix_len() > 0)
}

/// What names a lease among the others: its IPv4 subnet, or, on an IPv6-only network (whose
/// leases flanneld keys as `0.0.0.0-0&<v6>-<len>`, the same IPv4 part for every node), its IPv6
/// subnet. Leases on one network are all of one kind, so the order is the subnets' order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SubnetId {
    V4(Ipv4Net),
    V6(Ipv6Net),
}

impl std::fmt::Display for SubnetId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubnetId::V4(subnet) => subnet.fmt(f),
            SubnetId::V6(subnet) => subnet.fmt(f),
        }
    }
}

impl From<Ipv4Net> for SubnetId {
    fn from(subnet: Ipv4Net) -> Self {
        SubnetId::V4(subnet)
    }
}

/// Where a lease stands in the order its registry created the leases, the same on every node:
/// of two leases that cannot both be peers (one subnet, one PublicIP, one WireGuard key), every
/// node keeps the older one, whatever order it heard of them in. Compared by `at`, then by
/// `name`. Registry metadata: never part of flannel's lease JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Created {
    /// etcd: the key's create_revision. Kubernetes: the Node's creationTimestamp, in seconds
    /// since 1970. Static registry: the `--peer` flag's position. 0 where it is not known.
    pub at: i64,
    /// The Node's name in Kubernetes, which also breaks ties of `at` (its timestamps have only
    /// seconds) and is the lease's [`LeaseOrigin`]. Empty elsewhere.
    pub name: Arc<str>,
}

/// Which entry of its registry a lease is: the Kubernetes Node it was read from, else its
/// subnets, which name an etcd key or a `--peer` flag. Two leases of one origin are two
/// versions of one lease; two of different origins are two leases, even for one subnet (an
/// impostor's Node with another Node's podCIDR, an etcd key with another key's IPv4 subnet).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LeaseOrigin {
    Node(Arc<str>),
    Key(Ipv4Net, Option<Ipv6Net>),
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
    pub public_ipv6: Option<Ipv6Addr>,
    pub backend_type: Option<Arc<str>>,
    pub backend_data: Option<BackendData>,
    pub backend_v6_data: Option<BackendData>,
}

/// A lease's BackendData as the JSON text it was written with; fields are parsed when asked
/// for. A parsed JSON map per lease took some 700 bytes, the text takes about 40.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendData(Arc<str>);

impl BackendData {
    /// wireguard's BackendData, and its BackendV6Data: the node's public key (base64) and a
    /// listen port, in the order of flannel's Go struct (PublicKey, then Port).
    pub fn wireguard(public_key: &str, port: u16) -> BackendData {
        serde_json::json!({"PublicKey": public_key, "Port": port}).into()
    }

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
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("invalid lease value: {0}")]
    Value(#[from] serde_json::Error),
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

    /// wireguard: BackendData carries the node's public key and listen port
    /// ([`BackendData::wireguard`]).
    pub fn wireguard(public_ip: Ipv4Addr, public_key: &str, port: u16) -> Self {
        let data = BackendData::wireguard(public_key, port);
        Self::typed(public_ip, Some(backend_type::WIREGUARD), Some(data))
    }

    /// A lease of `backend_type` (`None`: flannel's udp) whose BackendData is `backend_data`.
    pub fn typed(
        public_ip: Ipv4Addr,
        backend_type: Option<&str>,
        backend_data: Option<BackendData>,
    ) -> Self {
        LeaseAttrs {
            public_ip,
            public_ipv6: None,
            backend_type: backend_type.map(Arc::from),
            backend_data,
            backend_v6_data: None,
        }
    }

    /// The same attributes with a dual-stack node's IPv6 address and IPv6 backend data.
    pub fn with_ipv6(self, public_ipv6: Ipv6Addr, backend_v6_data: Option<BackendData>) -> Self {
        LeaseAttrs {
            public_ipv6: Some(public_ipv6),
            backend_v6_data,
            ..self
        }
    }
}

impl Lease {
    pub fn new(subnet: Ipv4Net, attrs: LeaseAttrs) -> Self {
        Lease {
            subnet,
            ipv6_subnet: None,
            public_ip: attrs.public_ip,
            public_ipv6: attrs.public_ipv6,
            backend_type: attrs.backend_type,
            backend_data: attrs.backend_data,
            backend_v6_data: attrs.backend_v6_data,
            created: Created::default(),
        }
    }

    /// An IPv6-only network's lease: flanneld's empty IPv4 subnet, `0.0.0.0/0`, beside the IPv6
    /// one.
    pub fn ipv6_only(ipv6_subnet: Ipv6Net, attrs: LeaseAttrs) -> Self {
        Lease::new(Ipv4Net::default(), attrs).with_ipv6_subnet(ipv6_subnet)
    }

    /// The lease's IPv4 subnet; `None` for an IPv6-only lease, whose key says `0.0.0.0-0`.
    pub fn ipv4_subnet(&self) -> Option<Ipv4Net> {
        ipv4_part(self.subnet)
    }

    /// What names this lease among the others: see [`SubnetId`].
    pub fn id(&self) -> SubnetId {
        match (self.ipv4_subnet(), self.ipv6_subnet) {
            (None, Some(v6)) => SubnetId::V6(v6),
            _ => SubnetId::V4(self.subnet),
        }
    }

    /// Which entry of its registry this lease is: see [`LeaseOrigin`].
    pub fn origin(&self) -> LeaseOrigin {
        match self.created.name.is_empty() {
            true => LeaseOrigin::Key(self.subnet, self.ipv6_subnet),
            false => LeaseOrigin::Node(self.created.name.clone()),
        }
    }

    /// The same lease with an IPv6 subnet: a dual-stack lease.
    pub fn with_ipv6_subnet(self, ipv6_subnet: Ipv6Net) -> Lease {
        Lease {
            ipv6_subnet: Some(ipv6_subnet),
            ..self
        }
    }

    /// A dual-stack lease's IPv6 side: its IPv6 subnet and the PublicIPv6 it is reached at.
    /// `None` for a lease that has either without the other (the lease gate refuses those on
    /// a dual-stack node).
    pub fn ipv6_side(&self) -> Option<(Ipv6Net, Ipv6Addr)> {
        self.ipv6_subnet.zip(self.public_ipv6)
    }

    /// The same lease, created at `created`.
    pub fn with_created(self, created: Created) -> Lease {
        Lease { created, ..self }
    }

    pub fn attrs(&self) -> LeaseAttrs {
        LeaseAttrs {
            public_ip: self.public_ip,
            public_ipv6: self.public_ipv6,
            backend_type: self.backend_type.clone(),
            backend_data: self.backend_data.clone(),
            backend_v6_data: self.backend_v6_data.clone(),
        }
    }

    /// The etcd key under `prefix` (e.g. `/coreos.com/network/subnets/10.5.8.0-24`, or
    /// `…/10.5.8.0-24&fd10:0:0:8::-64` for a dual-stack lease).
    pub fn key(&self, prefix: &str) -> String {
        lease_key(prefix, self.subnet, self.ipv6_subnet)
    }

    /// The etcd value; see [`LeaseAttrs::to_json`].
    pub fn to_json(&self) -> String {
        self.attrs().to_json()
    }

    /// A wireguard lease's BackendData: its `PublicKey`, and its `Port` if it names one
    /// (flannel before leases carried `Port` did not). [`crate::lease_check`] refuses leases
    /// where this fails, with the reason it gives.
    pub fn wireguard_data(&self) -> Result<(PublicKey, Option<u16>), String> {
        let data = self.backend_data.as_ref();
        let none = || String::from("it has no BackendData.PublicKey");
        wireguard_fields(data, "").ok_or_else(none)?
    }

    /// The same of its BackendV6Data, which flanneld writes on a dual-stack network (the key
    /// again, and `ListenPortV6`); `Ok(None)` when it has none.
    pub fn wireguard_v6_data(&self) -> Result<Option<(PublicKey, Option<u16>)>, String> {
        let data = self.backend_v6_data.as_ref();
        wireguard_fields(data, "BackendV6Data.").transpose()
    }

    /// Rebuilds a lease from an etcd key and value.
    pub fn from_kv(prefix: &str, key: &str, value: &str) -> Result<Self, LeaseError> {
        let (subnet, ipv6_subnet) = parse_lease_key(prefix, key)?;
        Ok(Lease {
            ipv6_subnet,
            ..Lease::new(subnet, LeaseAttrs::from_json(value)?)
        })
    }
}

/// A wireguard `PublicKey` and `Port` from `data`; `None` when it has no `PublicKey`. A reason
/// names a field as `{prefix}PublicKey`.
fn wireguard_fields(
    data: Option<&BackendData>,
    prefix: &str,
) -> Option<Result<(PublicKey, Option<u16>), String>> {
    let fields = data.and_then(BackendData::fields)?;
    let key = match fields.get("PublicKey")? {
        Value::String(text) => text.parse::<PublicKey>().map_err(|e| {
            let text = shown::quoted(text);
            format!("its {prefix}PublicKey {text} is not a WireGuard key: {e}")
        }),
        other => Err(format!(
            "its {prefix}PublicKey {} is not a string",
            shown::value(&other.to_string())
        )),
    };
    let port = match fields.get("Port") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .filter(|&p| p > 0)
            .map(Some)
            .ok_or_else(|| {
                let v = shown::value(&v.to_string()).owned();
                format!("its {prefix}Port {v} is not a UDP port")
            }),
    };
    Some(key.and_then(|key| Ok((key, port?))))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFIX: &str = "/coreos.com/network";

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn a_dual_stack_lease_is_one_key_and_round_trips() {
        let attrs = LeaseAttrs::host_gw("10.200.0.1".parse().unwrap())
            .with_ipv6("fd00:200::1".parse().unwrap(), None);
        let lease = Lease::new(net("10.5.1.0/24"), attrs)
            .with_ipv6_subnet("fd10:0:0:1::/64".parse().unwrap());
        let key = lease.key(PREFIX);
        assert_eq!(
            key,
            "/coreos.com/network/subnets/10.5.1.0-24&fd10:0:0:1::-64"
        );
        let back = Lease::from_kv(PREFIX, &key, &lease.to_json()).unwrap();
        assert_eq!(back, lease);
        assert_ne!(
            back,
            Lease {
                ipv6_subnet: None,
                ..lease.clone()
            }
        );
        assert_ne!(
            back,
            Lease {
                public_ipv6: None,
                ..lease
            }
        );
    }

    #[test]
    fn an_ipv4_lease_has_no_ipv6_side() {
        let key = "/coreos.com/network/subnets/10.5.8.0-24";
        let lease = Lease::from_kv(
            PREFIX,
            key,
            r#"{"PublicIP":"10.200.0.1","PublicIPv6":null}"#,
        )
        .unwrap();
        assert_eq!((lease.ipv6_subnet, lease.public_ipv6), (None, None));
        assert_eq!(lease.backend_v6_data, None);
        assert_eq!(lease.key(PREFIX), key);
        let err = Lease::from_kv(PREFIX, "/coreos.com/network/subnets/10.5.8.0-24&x-64", "{}")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("not a subnet lease key: "), "{err}");
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
