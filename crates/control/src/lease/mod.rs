//! Lease keys and values, exactly as flanneld writes them.
//!
//! A twill lease must be indistinguishable from a flanneld one: the same key
//! (`<prefix>/subnets/10.5.8.0-24`, see [`key`]) and the same JSON, byte for byte, field order
//! included (flanneld marshals its Go `LeaseAttrs` struct: PublicIP, PublicIPv6, BackendType,
//! BackendData, BackendV6Data).
//!
//! A dual-stack lease is one lease: its IPv6 subnet rides in the key beside the IPv4 one, its
//! `PublicIPv6` and `BackendV6Data` in the JSON beside `PublicIP` and `BackendData`.
//!
//! A lease holds its subnets and public addresses per family ([`Subnets`], [`PublicAddrs`]):
//! IPv4, IPv6 or both. flanneld's stand-ins for a missing IPv4 part (the key's `0.0.0.0-0`,
//! `"PublicIP":"0.0.0.0"`) are read and written only by [`key`] and [`wire`].

mod event;
mod families;
mod key;
mod namer;
mod wire;

pub use event::LeaseEvent;
pub use families::{Families, PublicAddrs, Subnets};
pub use key::{key_name, lease_key, parse_lease_key, subnet_key, subnets_prefix, KeyError};
pub use namer::{node_key, LeaseNamer};

use crate::backend_kind::BackendKind;
use crate::shown;
use anyhow::Context;
use ipnet::{Ipv4Net, Ipv6Net};
use serde_json::value::RawValue;
use serde_json::Value;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use twill_dataplane::engine::wireguard::PublicKey;

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
    /// Its IPv4 subnet, its IPv6 subnet (the key's part after `&`), or both.
    pub subnets: Subnets,
    /// `PublicIP`, `PublicIPv6` (the node's IPv6 underlay address), or both.
    pub public_addrs: PublicAddrs,
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
        self.subnets == other.subnets && self.attrs() == other.attrs()
    }
}

/// What names a lease among the others: its IPv4 subnet, or, on an IPv6-only network, its IPv6
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
    Key(Subnets),
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
    pub public_addrs: PublicAddrs,
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
    /// The backend its `BackendType` names, if twill runs it.
    pub fn kind(&self) -> Option<BackendKind> {
        BackendKind::of_lease(self.backend_type.as_deref())
    }

    /// flannel's udp backend: no BackendType at all.
    pub fn udp(public_addrs: impl Into<PublicAddrs>) -> Self {
        Self::typed(public_addrs, None, None)
    }

    /// vxlan: BackendData carries the VNI and the MAC of the local `flannel.<VNI>` device.
    pub fn vxlan(public_addrs: impl Into<PublicAddrs>, vni: u32, vtep_mac: &str) -> Self {
        let data = serde_json::json!({"VNI": vni, "VtepMAC": vtep_mac});
        Self::typed(
            public_addrs,
            BackendKind::Vxlan.lease_type(),
            Some(data.into()),
        )
    }

    pub fn host_gw(public_addrs: impl Into<PublicAddrs>) -> Self {
        Self::typed(public_addrs, BackendKind::HostGw.lease_type(), None)
    }

    pub fn ipip(public_addrs: impl Into<PublicAddrs>) -> Self {
        Self::typed(public_addrs, BackendKind::Ipip.lease_type(), None)
    }

    pub fn twill_batch(public_addrs: impl Into<PublicAddrs>) -> Self {
        Self::typed(public_addrs, BackendKind::TwillBatch.lease_type(), None)
    }

    /// wireguard: BackendData carries the node's public key and listen port
    /// ([`BackendData::wireguard`]).
    pub fn wireguard(public_addrs: impl Into<PublicAddrs>, public_key: &str, port: u16) -> Self {
        let data = BackendData::wireguard(public_key, port);
        Self::typed(
            public_addrs,
            BackendKind::Wireguard.lease_type(),
            Some(data),
        )
    }

    /// A lease of `backend_type` (`None`: flannel's udp) whose BackendData is `backend_data`.
    pub fn typed(
        public_addrs: impl Into<PublicAddrs>,
        backend_type: Option<&str>,
        backend_data: Option<BackendData>,
    ) -> Self {
        LeaseAttrs {
            public_addrs: public_addrs.into(),
            backend_type: backend_type.map(Arc::from),
            backend_data,
            backend_v6_data: None,
        }
    }

    /// The same attributes with the node's IPv6 address and IPv6 backend data.
    pub fn with_ipv6(self, public_ipv6: Ipv6Addr, backend_v6_data: Option<BackendData>) -> Self {
        LeaseAttrs {
            public_addrs: self.public_addrs.with_v6(public_ipv6),
            backend_v6_data,
            ..self
        }
    }
}

impl Lease {
    /// The backend its `BackendType` names, if twill runs it.
    pub fn kind(&self) -> Option<BackendKind> {
        BackendKind::of_lease(self.backend_type.as_deref())
    }

    /// A lease of `subnets`: an [`Ipv4Net`], an [`Ipv6Net`] (an IPv6-only network's lease), or
    /// [`Subnets`].
    pub fn new(subnets: impl Into<Subnets>, attrs: LeaseAttrs) -> Self {
        Lease {
            subnets: subnets.into(),
            public_addrs: attrs.public_addrs,
            backend_type: attrs.backend_type,
            backend_data: attrs.backend_data,
            backend_v6_data: attrs.backend_v6_data,
            created: Created::default(),
        }
    }

    /// What names this lease among the others: see [`SubnetId`].
    pub fn id(&self) -> SubnetId {
        match self.subnets {
            Subnets::V4(v4) | Subnets::Dual(v4, _) => SubnetId::V4(v4),
            Subnets::V6(v6) => SubnetId::V6(v6),
        }
    }

    /// Which entry of its registry this lease is: see [`LeaseOrigin`].
    pub fn origin(&self) -> LeaseOrigin {
        match self.created.name.is_empty() {
            true => LeaseOrigin::Key(self.subnets),
            false => LeaseOrigin::Node(self.created.name.clone()),
        }
    }

    /// The same lease with an IPv6 subnet: a dual-stack lease.
    pub fn with_ipv6_subnet(self, ipv6_subnet: Ipv6Net) -> Lease {
        Lease {
            subnets: self.subnets.with_v6(ipv6_subnet),
            ..self
        }
    }

    /// The IPv4 side an IPv4 route to the lease's node needs: its IPv4 subnet and PublicIP.
    /// An error for a lease without either (the lease gate lets none through on a network with
    /// IPv4, so a backend that runs only there meets none).
    pub fn ipv4_side(&self) -> anyhow::Result<(Ipv4Net, Ipv4Addr)> {
        let side = self.subnets.v4().zip(self.public_addrs.v4());
        side.with_context(|| format!("the lease of {} has no IPv4 subnet and PublicIP", self.id()))
    }

    /// A dual-stack lease's IPv6 side: its IPv6 subnet and the PublicIPv6 it is reached at.
    /// `None` for a lease that has either without the other (the lease gate refuses those on
    /// a dual-stack node).
    pub fn ipv6_side(&self) -> Option<(Ipv6Net, Ipv6Addr)> {
        self.subnets.v6().zip(self.public_addrs.v6())
    }

    /// The same lease, created at `created`.
    pub fn with_created(self, created: Created) -> Lease {
        Lease { created, ..self }
    }

    pub fn attrs(&self) -> LeaseAttrs {
        LeaseAttrs {
            public_addrs: self.public_addrs,
            backend_type: self.backend_type.clone(),
            backend_data: self.backend_data.clone(),
            backend_v6_data: self.backend_v6_data.clone(),
        }
    }

    /// The etcd key under `prefix` (e.g. `/coreos.com/network/subnets/10.5.8.0-24`, or
    /// `…/10.5.8.0-24&fd10:0:0:8::-64` for a dual-stack lease).
    pub fn key(&self, prefix: &str) -> String {
        lease_key(prefix, self.subnets)
    }

    /// The etcd value; see [`LeaseAttrs::to_json`].
    pub fn to_json(&self) -> String {
        self.attrs().to_json()
    }

    /// A wireguard lease's BackendData: its `PublicKey`, and its `Port` if it names one
    /// (flannel before leases carried `Port` did not). The lease gate refuses leases
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
        let subnets = parse_lease_key(prefix, key)?;
        Ok(Lease::new(subnets, LeaseAttrs::from_json(value)?))
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
    use proptest::prelude::*;

    const PREFIX: &str = "/coreos.com/network";

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn a_dual_stack_lease_is_one_key_and_round_trips() {
        let attrs = LeaseAttrs::host_gw("10.200.0.1".parse::<Ipv4Addr>().unwrap())
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
                subnets: Subnets::V4(net("10.5.1.0/24")),
                ..lease.clone()
            }
        );
        assert_ne!(
            back,
            Lease {
                public_addrs: PublicAddrs::V4("10.200.0.1".parse().unwrap()),
                ..lease
            }
        );
    }

    #[test]
    fn an_ipv6_only_lease_is_one_key_and_round_trips() {
        let ip: Ipv6Addr = "fd00:200::9".parse().unwrap();
        let v6: Ipv6Net = "fd10:0:0:9::/64".parse().unwrap();
        let lease = Lease::new(v6, LeaseAttrs::host_gw(ip).with_ipv6(ip, None));
        let key = lease.key(PREFIX);
        assert_eq!(key, "/coreos.com/network/subnets/0.0.0.0-0&fd10:0:0:9::-64");
        let json = lease.to_json();
        assert_eq!(
            json,
            r#"{"PublicIP":"0.0.0.0","PublicIPv6":"fd00:200::9","BackendType":"host-gw"}"#
        );
        let back = Lease::from_kv(PREFIX, &key, &json).unwrap();
        assert_eq!(back, lease);
        assert_eq!((back.subnets.v4(), back.public_addrs.v4()), (None, None));
        assert_eq!(back.id(), SubnetId::V6(v6));
        assert_eq!(back.origin(), LeaseOrigin::Key(Subnets::V6(v6)));
        assert_eq!(back.ipv6_side(), Some((v6, ip)));
    }

    #[test]
    fn a_half_empty_lease_that_flanneld_does_not_write_is_refused() {
        let cases = [
            (
                "/coreos.com/network/subnets/0.0.0.0-0",
                r#"{"PublicIP":"10.200.0.1","PublicIPv6":null}"#,
                "the empty IPv4 subnet 0.0.0.0-0 without an IPv6 subnet",
            ),
            (
                "/coreos.com/network/subnets/10.5.8.0-24",
                r#"{"PublicIP":"0.0.0.0","PublicIPv6":null}"#,
                "PublicIP 0.0.0.0 is not a host address, and there is no PublicIPv6",
            ),
        ];
        for (key, value, why) in cases {
            let err = Lease::from_kv(PREFIX, key, value).unwrap_err().to_string();
            assert!(err.contains(why), "{key} {value}: {err}");
        }
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
        assert_eq!((lease.subnets.v6(), lease.public_addrs.v6()), (None, None));
        assert_eq!(lease.backend_v6_data, None);
        assert_eq!(lease.key(PREFIX), key);
        let err = Lease::from_kv(PREFIX, "/coreos.com/network/subnets/10.5.8.0-24&x-64", "{}")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("not a subnet lease key: "), "{err}");
    }

    /// `V4`, `V6` or `Dual` of the two strategies' values.
    fn families<A, B>(
        v4: impl Strategy<Value = A> + Clone,
        v6: impl Strategy<Value = B> + Clone,
    ) -> impl Strategy<Value = Families<A, B>>
    where
        A: Clone + std::fmt::Debug,
        B: Clone + std::fmt::Debug,
    {
        prop_oneof![
            v4.clone().prop_map(Families::V4),
            v6.clone().prop_map(Families::V6),
            (v4, v6).prop_map(|(a, b)| Families::Dual(a, b)),
        ]
    }

    fn any_lease() -> impl Strategy<Value = Lease> {
        let net4 = (any::<u32>(), 1u8..=32)
            .prop_map(|(a, len)| Ipv4Net::new(a.into(), len).unwrap().trunc());
        let net6 = (any::<u128>(), 0u8..=128)
            .prop_map(|(a, len)| Ipv6Net::new(a.into(), len).unwrap().trunc());
        let ip4 = (1..=u32::MAX).prop_map(Ipv4Addr::from);
        let ip6 = any::<u128>().prop_map(Ipv6Addr::from);
        let kind = prop_oneof![Just(None), Just(Some("vxlan")), Just(Some("host-gw"))];
        (families(net4, net6), families(ip4, ip6), kind).prop_map(|(subnets, addrs, kind)| {
            let attrs = LeaseAttrs::typed(addrs, kind, None);
            Lease::new(subnets, attrs)
        })
    }

    /// Key names shaped as flanneld's, of every family, empty IPv4 part and /0 included; some
    /// with host bits set.
    fn key_names() -> impl Strategy<Value = String> {
        let v4 = (any::<u32>(), 0u8..=32, any::<bool>()).prop_map(|(a, len, trunc)| {
            let net = Ipv4Net::new(Ipv4Addr::from(a), len).unwrap();
            let net = if trunc { net.trunc() } else { net };
            format!("{}-{len}", net.addr())
        });
        let v4 = prop_oneof![v4, Just("0.0.0.0-0".to_string())];
        let v6 = (any::<u128>(), 0u8..=128)
            .prop_map(|(a, len)| Ipv6Net::new(Ipv6Addr::from(a), len).unwrap().trunc())
            .prop_map(|net| format!("{}-{}", net.network(), net.prefix_len()));
        (v4, proptest::option::of(v6)).prop_map(|(v4, v6)| match v6 {
            Some(v6) => format!("{v4}&{v6}"),
            None => v4,
        })
    }

    proptest::proptest! {
        /// Every lease of any family is written as flanneld writes it (an IPv6-only one as the
        /// key `0.0.0.0-0&<v6>` with PublicIP 0.0.0.0) and read back as itself.
        #[test]
        fn every_lease_round_trips_through_flanneld_bytes(lease in any_lease()) {
            let (key, json) = (lease.key(PREFIX), lease.to_json());
            let name = key.strip_prefix("/coreos.com/network/subnets/").unwrap();
            let v4 = lease.subnets.v4().map_or("0.0.0.0-0".into(), |s| {
                format!("{}-{}", s.network(), s.prefix_len())
            });
            prop_assert!(name.starts_with(&v4), "{name}");
            prop_assert_eq!(name.contains('&'), lease.subnets.v6().is_some());
            let public_ip = lease.public_addrs.v4().unwrap_or(Ipv4Addr::UNSPECIFIED);
            let head = format!(r#"{{"PublicIP":"{public_ip}","PublicIPv6":"#);
            prop_assert!(json.starts_with(&head), "{json}");
            let back = Lease::from_kv(PREFIX, &key, &json).unwrap();
            prop_assert_eq!(&back, &lease);
            prop_assert_eq!(back.subnets, lease.subnets);
        }

        /// Whatever is written under `<prefix>/subnets/`, reading it never panics, and what
        /// reads as a lease is written back as the same lease.
        #[test]
        fn any_key_and_value_read_without_panic(
            name in prop_oneof![
                "[0-9.]{0,16}-[0-9]{0,3}(&[0-9a-f:]{0,24}-[0-9]{0,3})?",
                key_names(),
            ],
            public_ip in prop_oneof![
                "[0-9.]{0,16}",
                Just("0.0.0.0".to_string()),
                any::<u32>().prop_map(|a| Ipv4Addr::from(a).to_string()),
            ],
            public_ipv6 in proptest::option::of(prop_oneof![
                "[0-9a-f:.]{0,24}",
                any::<u128>().prop_map(|a| Ipv6Addr::from(a).to_string()),
            ]),
        ) {
            let key = format!("{PREFIX}/subnets/{name}");
            let public_ipv6 = public_ipv6.map_or("null".into(), |ip| format!("{ip:?}"));
            let value = format!(r#"{{"PublicIP":"{public_ip}","PublicIPv6":{public_ipv6}}}"#);
            if let Ok(lease) = Lease::from_kv(PREFIX, &key, &value) {
                let again = Lease::from_kv(PREFIX, &lease.key(PREFIX), &lease.to_json());
                prop_assert_eq!(again.unwrap(), lease);
            }
        }
    }

    #[test]
    fn lease_round_trips_through_key_and_value() {
        let lease = Lease::new(
            net("10.5.8.0/24"),
            LeaseAttrs::host_gw("10.200.0.1".parse::<Ipv4Addr>().unwrap()),
        );
        let back = Lease::from_kv(PREFIX, &lease.key(PREFIX), &lease.to_json()).unwrap();
        assert_eq!(back, lease);
    }

    #[test]
    fn equality_is_of_what_a_lease_says_not_of_when_it_was_made() {
        let lease = Lease::new(
            net("10.5.8.0/24"),
            LeaseAttrs::host_gw("10.200.0.1".parse::<Ipv4Addr>().unwrap()),
        );
        let later = lease.clone().with_created(Created::at(42));
        assert_eq!(later, lease);
        assert_ne!(later.created, lease.created);
        let mut moved = later.clone();
        moved.public_addrs = PublicAddrs::V4("10.200.0.2".parse().unwrap());
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
