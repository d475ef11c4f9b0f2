//! flannel's network config, the JSON at `<prefix>/config`.
//!
//! Parsing follows flannel's `ParseConfig` + `CheckNetworkConfig` so that every config a flanneld
//! accepts is accepted here with the same defaults, and an invalid one is refused with a single
//! line that names the offending field (the operator reads it in a log, not in a debugger).
//! The IPv6 half (`EnableIPv6`, `IPv6Network`, ...) is read and checked in [`ipv6`].

mod ipv6;
mod underlay;

pub use ipv6::Ipv6Config;
pub use underlay::Underlay;

use ipnet::Ipv4Net;
use ipv6::Ipv6Fields;
use serde_json::{Map, Value};
use std::net::Ipv4Addr;

/// Backend type used when the config has no `Backend` object, as in flannel.
pub const DEFAULT_BACKEND: &str = "udp";

/// A validated network config with flannel's defaults filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The whole container network; every lease lies inside it.
    pub network: Ipv4Net,
    /// Prefix length of one host's subnet.
    pub subnet_len: u8,
    /// Network address of the lowest subnet that may be leased.
    pub subnet_min: Ipv4Addr,
    /// Network address of the highest subnet that may be leased.
    pub subnet_max: Ipv4Addr,
    /// The IPv6 network, when `EnableIPv6` is true (a dual-stack network).
    pub ipv6: Option<Ipv6Config>,
    pub backend: BackendConfig,
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

/// Why a config was refused. The message is one line and names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid network config: {0}")]
pub struct ConfigError(String);

impl ConfigError {
    /// For backends that read their own fields from [`BackendConfig::raw`].
    pub(crate) fn new(msg: impl Into<String>) -> ConfigError {
        ConfigError(msg.into())
    }
}

/// The backends that carry a dual-stack network's IPv6 side.
const DUAL_STACK_BACKENDS: [&str; 5] = ["vxlan", "host-gw", "udp", "twill-batch", "wireguard"];

/// Backend fields whose values are secrets: a change to one is named, its value never shown.
const SECRET_FIELDS: [&str; 1] = ["PSK"];

impl Config {
    /// How `now` differs from this config, in the fields a node cannot change while it runs;
    /// `None` when they match. Backend fields are compared one by one and a secret's value
    /// (`PSK`) is never written out, since the text goes to the log and `twill status`.
    pub fn difference(&self, now: &Config) -> Option<String> {
        let mut changed: Vec<String> = [
            ("Network", self.network.to_string(), now.network.to_string()),
            (
                "SubnetLen",
                self.subnet_len.to_string(),
                now.subnet_len.to_string(),
            ),
            (
                "SubnetMin",
                self.subnet_min.to_string(),
                now.subnet_min.to_string(),
            ),
            (
                "SubnetMax",
                self.subnet_max.to_string(),
                now.subnet_max.to_string(),
            ),
        ]
        .into_iter()
        .chain(
            Ipv6Config::shown(self.ipv6.as_ref())
                .into_iter()
                .zip(Ipv6Config::shown(now.ipv6.as_ref()))
                .map(|((name, old), (_, new))| (name, old, new)),
        )
        .filter(|(_, old, new)| old != new)
        .map(|(name, old, new)| format!("{name} {old} -> {new}"))
        .collect();
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
                Some(v) => v.to_string(),
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
    /// twill cannot run: a dual-stack one on a backend that carries no IPv6 yet
    /// ([`Config::from_json`] reads those).
    pub fn parse(json: &str) -> Result<Config, ConfigError> {
        let config = Config::from_json(json)?;
        let backend = config.backend.backend_type.as_str();
        match &config.ipv6 {
            Some(v6) if !DUAL_STACK_BACKENDS.contains(&backend) => invalid(format!(
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

    /// Parses and validates a config as flanneld does (`ParseConfig` + `CheckNetworkConfig`),
    /// dual-stack included. An IPv6-only network (`EnableIPv4` false) is checked, then refused:
    /// twill's leases need an IPv4 subnet.
    pub fn from_json(json: &str) -> Result<Config, ConfigError> {
        let value: Value =
            serde_json::from_str(json).map_err(|e| ConfigError(format!("not valid JSON ({e})")))?;
        let Value::Object(obj) = value else {
            return invalid("expected a JSON object");
        };
        let enable_ipv4 = bool_field(&obj, "EnableIPv4")?.unwrap_or(true);
        let enable_ipv6 = bool_field(&obj, "EnableIPv6")?.unwrap_or(false);
        let ipv6_fields = Ipv6Fields::read(&obj)?;
        if !enable_ipv4 {
            return refuse_ipv6_only(enable_ipv6.then(|| ipv6_fields.validate()).transpose()?);
        }
        let network = parse_network(field(&obj, "Network"))?;
        let subnet_len = parse_subnet_len(field(&obj, "SubnetLen"), network)?;
        let subnet_min = parse_bound(&obj, "SubnetMin", network, subnet_len)?
            .unwrap_or_else(|| second_subnet(network, subnet_len));
        let subnet_max = parse_bound(&obj, "SubnetMax", network, subnet_len)?
            .unwrap_or_else(|| last_subnet(network, subnet_len));
        if subnet_min > subnet_max {
            return invalid(format!(
                "SubnetMin {subnet_min} is above SubnetMax {subnet_max}"
            ));
        }
        let ipv6 = enable_ipv6.then(|| ipv6_fields.validate()).transpose()?;
        let backend = BackendConfig::parse(field(&obj, "Backend"))?;
        Ok(Config {
            network,
            subnet_len,
            subnet_min,
            subnet_max,
            ipv6,
            backend,
        })
    }

    /// A config for a network that is not stored in etcd (the static registry), with the same
    /// defaults and checks as one read from etcd.
    pub fn for_network(network: Ipv4Net, backend_type: &str) -> Result<Config, ConfigError> {
        let json =
            serde_json::json!({"Network": network.to_string(), "Backend": {"Type": backend_type}});
        Config::parse(&json.to_string())
    }

    /// Whether `subnet` is one this config may lease (flannel's `isSubnetConfigCompat`).
    pub fn is_leasable(&self, subnet: Ipv4Net) -> bool {
        subnet.prefix_len() == self.subnet_len
            && subnet.network() >= self.subnet_min
            && subnet.network() <= self.subnet_max
    }

    /// Every leasable subnet, lowest first.
    pub fn subnets(&self) -> impl Iterator<Item = Ipv4Net> + '_ {
        let step = subnet_size(self.subnet_len);
        (u32::from(self.subnet_min)..=u32::from(self.subnet_max))
            .step_by(step as usize)
            .map(move |ip| Ipv4Net::new(Ipv4Addr::from(ip), self.subnet_len).expect("len <= 30"))
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
            vni: number_field(obj, "VNI")?,
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

/// Looks a field up the way Go's encoding/json does: exact name first, then case-insensitively,
/// because flanneld accepts `"network"` as well as `"Network"`.
pub(crate) fn field<'a>(obj: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    obj.get(name).or_else(|| {
        obj.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

/// `EnableIPv4` false: flanneld runs an IPv6-only network (its `ipv6` when valid), twill not yet.
fn refuse_ipv6_only(ipv6: Option<Ipv6Config>) -> Result<Config, ConfigError> {
    match ipv6 {
        None => invalid("EnableIPv4 and EnableIPv6 are both false: the network has no addresses"),
        Some(v6) => invalid(format!(
            "EnableIPv4 is false: the IPv6-only network {} is valid, but twill cannot run it: \
             its leases, backends and engines need an IPv4 Network; set EnableIPv4 to true \
             with a Network",
            v6.network
        )),
    }
}

fn parse_network(value: Option<&Value>) -> Result<Ipv4Net, ConfigError> {
    let text = match value {
        Some(Value::String(s)) => s,
        Some(other) => return invalid(format!("Network must be a CIDR string, got {other}")),
        None => return invalid("Network is missing (e.g. \"Network\":\"10.5.0.0/16\")"),
    };
    // flannel masks host bits (Go's net.ParseCIDR), so "10.5.1.0/16" means 10.5.0.0/16.
    let network = text
        .parse::<Ipv4Net>()
        .map_err(|_| ConfigError(format!("Network {text:?} is not an IPv4 CIDR")))?
        .trunc();
    if network.prefix_len() == 0 {
        return invalid(format!("Network {network} is empty"));
    }
    Ok(network)
}

fn parse_subnet_len(value: Option<&Value>, network: Ipv4Net) -> Result<u8, ConfigError> {
    let prefix = network.prefix_len();
    let Some(len) = as_number::<u8>(value, "SubnetLen")?.filter(|&l| l > 0) else {
        return default_subnet_len(network);
    };
    if len > 30 {
        return invalid(format!(
            "SubnetLen {len} is too long: it must be at most 30"
        ));
    }
    if len < prefix + 2 {
        return invalid(format!(
            "SubnetLen {len} is too short for Network {network}: it must be at least {} so the network holds four subnets",
            prefix + 2
        ));
    }
    Ok(len)
}

fn default_subnet_len(network: Ipv4Net) -> Result<u8, ConfigError> {
    match network.prefix_len() {
        p if p > 28 => invalid(format!(
            "Network {network} is too small: the minimum useful prefix is /28"
        )),
        p if p <= 22 => Ok(24),
        p => Ok(p + 2),
    }
}

/// SubnetMin / SubnetMax: `None` when absent or "0.0.0.0" (flannel's zero value means default).
fn parse_bound(
    obj: &Map<String, Value>,
    name: &str,
    network: Ipv4Net,
    subnet_len: u8,
) -> Result<Option<Ipv4Addr>, ConfigError> {
    let ip = match field(obj, name) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s
            .parse::<Ipv4Addr>()
            .map_err(|_| ConfigError(format!("{name} {s:?} is not an IPv4 address")))?,
        Some(other) => {
            return invalid(format!(
                "{name} must be an IPv4 address string, got {other}"
            ))
        }
    };
    if ip.is_unspecified() {
        return Ok(None);
    }
    if !network.contains(&ip) {
        return invalid(format!(
            "{name} {ip} is not in the range of the Network {network}"
        ));
    }
    if u32::from(ip) % subnet_size(subnet_len) != 0 {
        return invalid(format!(
            "{name} {ip} is not on a SubnetLen /{subnet_len} boundary"
        ));
    }
    Ok(Some(ip))
}

fn subnet_size(subnet_len: u8) -> u32 {
    1u32 << (32 - u32::from(subnet_len))
}

/// The first subnet is skipped, as flannel does: its network address equals the Network's.
fn second_subnet(network: Ipv4Net, subnet_len: u8) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(network.network()) + subnet_size(subnet_len))
}

fn last_subnet(network: Ipv4Net, subnet_len: u8) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(network.broadcast()) - subnet_size(subnet_len) + 1)
}

fn number_field<T: TryFrom<u64>>(
    obj: &Map<String, Value>,
    name: &str,
) -> Result<Option<T>, ConfigError> {
    as_number(field(obj, name), &format!("Backend.{name}"))
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
