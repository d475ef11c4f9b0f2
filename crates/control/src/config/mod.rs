//! flannel's network config, the JSON at `<prefix>/config`.
//!
//! Parsing follows flannel's `ParseConfig` + `CheckNetworkConfig` so that every config a flanneld
//! accepts is accepted here with the same defaults, and an invalid one is refused with a single
//! line that names the offending field (the operator reads it in a log, not in a debugger).
//! The IPv6 half (`EnableIPv6`, `IPv6Network`, ...) is read and checked in [`ipv6`].

mod fields;
mod ipv4;
mod ipv6;
mod underlay;

pub use ipv4::Ipv4Config;
pub use ipv6::Ipv6Config;
pub use underlay::Underlay;

use ipnet::Ipv4Net;
use ipv6::Ipv6Fields;
use serde_json::{Map, Value};

/// Backend type used when the config has no `Backend` object, as in flannel.
pub const DEFAULT_BACKEND: &str = "udp";

/// A validated network config with flannel's defaults filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The IPv4 network, when `EnableIPv4` is true (flannel's default); `None` on an IPv6-only
    /// network.
    pub ipv4: Option<Ipv4Config>,
    /// The IPv6 network, when `EnableIPv6` is true (a dual-stack or IPv6-only network).
    pub ipv6: Option<Ipv6Config>,
    pub backend: BackendConfig,
    /// Fields twill does not read for this network's backend (`X` or `Backend.X`): accepted, as
    /// flanneld accepts them, and named at start.
    pub unread: Vec<String>,
    /// `EnableNFTables`: flannel's masquerade and forward rules as nftables tables
    /// (`ip flannel-ipv4`, `ip6 flannel-ipv6`) instead of iptables chains (false, flannel's
    /// default).
    pub enable_nftables: bool,
}

/// The `Backend` object: the fields twill reads, plus the raw JSON for backend-specific extras.
/// Its `Debug` leaves out wireguard's `PSK`, so a logged config shows no secret.
#[derive(Clone, PartialEq)]
pub struct BackendConfig {
    /// `Type`: "udp", "vxlan", "host-gw", "ipip", "twill-batch", ...
    pub backend_type: String,
    pub port: Option<u16>,
    pub vni: Option<u32>,
    pub direct_routing: bool,
    pub mtu: Option<u32>,
    /// `Underlay` (twill's): the family udp and twill-batch datagrams go over.
    pub underlay: Underlay,
    /// The `Backend` object as found (`Value::Null` when absent), so a backend can read fields
    /// that this module does not know about.
    pub raw: Value,
}

/// Why a config was refused. The message is one line and names the field; a value written into
/// it (whoever may write the config key chose its length) is shown up to a bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid network config: {}", crate::shown::line(.0))]
pub struct ConfigError(String);

impl ConfigError {
    /// For backends that read their own fields from [`BackendConfig::raw`].
    pub(crate) fn new(msg: impl Into<String>) -> ConfigError {
        ConfigError(msg.into())
    }
}

/// The backends that carry a dual-stack network's IPv6 side.
const DUAL_STACK_BACKENDS: [&str; 5] = ["vxlan", "host-gw", "udp", "twill-batch", "wireguard"];

/// The backends that run an IPv6-only network (`EnableIPv4` false), as flannel's do.
const IPV6_ONLY_BACKENDS: [&str; 2] = ["vxlan", "host-gw"];

/// Backend fields whose values are secrets: a change to one is named, its value never shown.
const SECRET_FIELDS: [&str; 1] = ["PSK"];

impl Config {
    /// How `now` differs from this config, in the fields a node cannot change while it runs;
    /// `None` when they match. Backend fields are compared one by one and a secret's value
    /// (`PSK`) is never written out, since the text goes to the log and `twill status`.
    pub fn difference(&self, now: &Config) -> Option<String> {
        let mut changed: Vec<String> = Ipv4Config::shown(self.ipv4.as_ref())
            .into_iter()
            .zip(Ipv4Config::shown(now.ipv4.as_ref()))
            .map(|((name, old), (_, new))| (name, old, new))
            .chain(
                Ipv6Config::shown(self.ipv6.as_ref())
                    .into_iter()
                    .zip(Ipv6Config::shown(now.ipv6.as_ref()))
                    .map(|((name, old), (_, new))| (name, old, new)),
            )
            .filter(|(_, old, new)| old != new)
            .map(|(name, old, new)| format!("{name} {old} -> {new}"))
            .collect();
        if self.enable_nftables != now.enable_nftables {
            let (old, new) = (self.enable_nftables, now.enable_nftables);
            changed.push(format!("EnableNFTables {old} -> {new}"));
        }
        changed.extend(backend_difference(&self.backend.raw, &now.backend.raw));
        (!changed.is_empty()).then(|| changed.join(", "))
    }
}

fn backend_difference(running: &Value, now: &Value) -> Vec<String> {
    let empty = Map::new();
    let (old, new) = (
        running.as_object().unwrap_or(&empty),
        now.as_object().unwrap_or(&empty),
    );
    let mut names: Vec<&String> = old.keys().chain(new.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter(|name| old.get(*name) != new.get(*name))
        .map(|name| {
            let show = |v: Option<&Value>| match v {
                None => "(none)".to_string(),
                Some(_) if SECRET_FIELDS.contains(&name.as_str()) => "<redacted>".to_string(),
                Some(v) => crate::shown::value(&v.to_string()).owned(),
            };
            format!(
                "Backend.{name} {} -> {}",
                show(old.get(name)),
                show(new.get(name))
            )
        })
        .collect()
}

fn invalid<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

impl Config {
    /// Parses and validates the JSON stored at `<prefix>/config`, and refuses a network this
    /// twill cannot run: a dual-stack one on a backend that carries no IPv6 yet, an IPv6-only
    /// one on a backend other than vxlan and host-gw ([`Config::from_json`] reads those).
    pub fn parse(json: &str) -> Result<Config, ConfigError> {
        let config = Config::from_json(json)?;
        let backend = config.backend.backend_type.as_str();
        match (&config.ipv4, &config.ipv6) {
            (None, Some(v6)) if !IPV6_ONLY_BACKENDS.contains(&backend) => invalid(format!(
                "EnableIPv4 is false: the IPv6-only network {} is valid, but twill runs an \
                 IPv6-only network on {} only, not on {backend}; choose one of those, or set \
                 EnableIPv4 to true with a Network",
                v6.network,
                IPV6_ONLY_BACKENDS.join(" and ")
            )),
            (_, Some(v6)) if !DUAL_STACK_BACKENDS.contains(&backend) => invalid(format!(
                "EnableIPv6 is true: IPv6Network {} (IPv6SubnetLen /{}) is valid, but twill's \
                 {backend} backend carries no IPv6 yet (dual-stack runs on {}); set EnableIPv6 \
                 to false, choose one of those, or run flanneld",
                v6.network,
                v6.subnet_len,
                DUAL_STACK_BACKENDS.join(", ")
            )),
            _ => {
                (config.backend.underlay).check(backend, config.ipv6.is_some())?;
                Ok(config)
            }
        }
    }

    /// Parses and validates a config as flanneld does (`ParseConfig` + `CheckNetworkConfig`):
    /// IPv4-only, dual-stack, and IPv6-only (`EnableIPv4` false, where `Network` is not read).
    pub fn from_json(json: &str) -> Result<Config, ConfigError> {
        let value: Value =
            serde_json::from_str(json).map_err(|e| ConfigError(format!("not valid JSON ({e})")))?;
        let Value::Object(obj) = value else {
            return invalid("expected a JSON object");
        };
        let enable_ipv4 = bool_field(&obj, "EnableIPv4")?.unwrap_or(true);
        let enable_ipv6 = bool_field(&obj, "EnableIPv6")?.unwrap_or(false);
        let ipv6_fields = Ipv6Fields::read(&obj)?;
        if !enable_ipv4 && !enable_ipv6 {
            return invalid(
                "EnableIPv4 and EnableIPv6 are both false: the network has no addresses",
            );
        }
        let ipv4 = enable_ipv4.then(|| Ipv4Config::read(&obj)).transpose()?;
        let ipv6 = enable_ipv6.then(|| ipv6_fields.validate()).transpose()?;
        let backend = BackendConfig::parse(field(&obj, "Backend"))?;
        Ok(Config {
            ipv4,
            ipv6,
            unread: fields::unread(&obj, &backend.backend_type),
            backend,
            enable_nftables: bool_field(&obj, "EnableNFTables")?.unwrap_or(false),
        })
    }

    /// A config for a network that is not stored in etcd (the static registry), with the same
    /// defaults and checks as one read from etcd.
    pub fn for_network(network: Ipv4Net, backend_type: &str) -> Result<Config, ConfigError> {
        let json =
            serde_json::json!({"Network": network.to_string(), "Backend": {"Type": backend_type}});
        Config::parse(&json.to_string())
    }

    /// The IPv4 network, for what runs only on one (udp, twill-batch, wireguard, ipip, eBPF,
    /// `--peer` flags): an IPv6-only network is refused in one line naming `what`.
    pub fn need_ipv4(&self, what: &str) -> Result<&Ipv4Config, ConfigError> {
        self.ipv4.as_ref().ok_or_else(|| {
            ConfigError(format!(
                "EnableIPv4 is false: {what} needs an IPv4 Network, and this network is IPv6-only"
            ))
        })
    }
}

impl BackendConfig {
    fn parse(value: Option<&Value>) -> Result<BackendConfig, ConfigError> {
        let Some(raw) = value.filter(|v| !v.is_null()) else {
            return Ok(BackendConfig::of_type(DEFAULT_BACKEND));
        };
        let Value::Object(obj) = raw else {
            return invalid(format!("Backend must be a JSON object, got {raw}"));
        };
        let backend_type = match field(obj, "Type") {
            Some(Value::String(t)) if !t.is_empty() => t.clone(),
            Some(other) => {
                return invalid(format!(
                    "Backend.Type must be a non-empty string, got {other}"
                ))
            }
            None => return invalid("Backend.Type is missing"),
        };
        Ok(BackendConfig {
            backend_type,
            port: number_field(obj, "Port")?,
            vni: vni(obj)?,
            direct_routing: bool_field(obj, "DirectRouting")?.unwrap_or(false),
            mtu: number_field(obj, "MTU")?,
            underlay: Underlay::read(obj)?,
            raw: raw.clone(),
        })
    }

    fn of_type(backend_type: &str) -> BackendConfig {
        BackendConfig {
            backend_type: backend_type.to_string(),
            port: None,
            vni: None,
            direct_routing: false,
            mtu: None,
            underlay: Underlay::Ipv4,
            raw: Value::Null,
        }
    }
}

impl std::fmt::Debug for BackendConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut raw = self.raw.clone();
        if let Some(obj) = raw.as_object_mut() {
            obj.retain(|k, _| !k.eq_ignore_ascii_case("PSK"));
        }
        f.debug_struct("BackendConfig")
            .field("backend_type", &self.backend_type)
            .field("port", &self.port)
            .field("vni", &self.vni)
            .field("direct_routing", &self.direct_routing)
            .field("mtu", &self.mtu)
            .field("underlay", &self.underlay)
            .field("raw", &raw)
            .finish()
    }
}

/// A field of a JSON object (`Backend`'s raw value), as [`field`] finds it; `None` when `object`
/// is not an object.
pub(crate) fn field_of<'a>(object: &'a Value, name: &str) -> Option<&'a Value> {
    field(object.as_object()?, name)
}

/// Looks a field up the way Go's encoding/json does: exact name first, then case-insensitively,
/// because flanneld accepts `"network"` as well as `"Network"`.
pub(crate) fn field<'a>(obj: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    obj.get(name).or_else(|| {
        obj.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

fn number_field<T: TryFrom<u64>>(
    obj: &Map<String, Value>,
    name: &str,
) -> Result<Option<T>, ConfigError> {
    as_number(field(obj, name), &format!("Backend.{name}"))
}

/// The largest VXLAN network identifier: the header has 24 bits for it.
const MAX_VNI: u32 = (1 << 24) - 1;

/// `Backend.VNI`, checked here so that a number the kernel refuses is named by its field.
fn vni(obj: &Map<String, Value>) -> Result<Option<u32>, ConfigError> {
    match number_field::<u32>(obj, "VNI")? {
        Some(vni) if vni > MAX_VNI => invalid(format!(
            "Backend.VNI {vni} is out of range: a VXLAN network identifier has 24 bits, 0 to \
             {MAX_VNI}"
        )),
        vni => Ok(vni),
    }
}

fn as_number<T: TryFrom<u64>>(value: Option<&Value>, name: &str) -> Result<Option<T>, ConfigError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| T::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| ConfigError(format!("{name} {v} is not a valid number"))),
    }
}

fn bool_field(obj: &Map<String, Value>, name: &str) -> Result<Option<bool>, ConfigError> {
    match field(obj, name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => invalid(format!("{name} must be true or false, got {other}")),
    }
}

#[cfg(test)]
mod tests;
