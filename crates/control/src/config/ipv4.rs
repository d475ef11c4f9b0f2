//! flannel's IPv4 half of a network config: `Network`, `SubnetLen`, `SubnetMin`, `SubnetMax`,
//! read when `EnableIPv4` is true (flannel's default), with flanneld's defaults and checks.

use super::{as_number, field, invalid, ConfigError};
use crate::shown;
use ipnet::Ipv4Net;
use serde_json::{Map, Value};
use std::net::Ipv4Addr;

/// The IPv4 network of a config, with flannel's defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipv4Config {
    /// The whole container network; every lease lies inside it.
    pub network: Ipv4Net,
    /// Prefix length of one host's subnet.
    pub subnet_len: u8,
    /// Network address of the lowest subnet that may be leased.
    pub subnet_min: Ipv4Addr,
    /// Network address of the highest subnet that may be leased.
    pub subnet_max: Ipv4Addr,
}

impl Ipv4Config {
    /// Reads and checks the IPv4 fields of the config object.
    pub(super) fn read(obj: &Map<String, Value>) -> Result<Ipv4Config, ConfigError> {
        let network = parse_network(field(obj, "Network"))?;
        let subnet_len = parse_subnet_len(field(obj, "SubnetLen"), network)?;
        let subnet_min = parse_bound(obj, "SubnetMin", network, subnet_len)?
            .unwrap_or_else(|| second_subnet(network, subnet_len));
        let subnet_max = parse_bound(obj, "SubnetMax", network, subnet_len)?
            .unwrap_or_else(|| last_subnet(network, subnet_len));
        if subnet_min > subnet_max {
            return invalid(format!(
                "SubnetMin {subnet_min} is above SubnetMax {subnet_max}"
            ));
        }
        Ok(Ipv4Config {
            network,
            subnet_len,
            subnet_min,
            subnet_max,
        })
    }

    /// The fields as `(name, value)`, for naming what changed between two configs.
    pub(super) fn shown(config: Option<&Ipv4Config>) -> [(&'static str, String); 4] {
        let show = |f: fn(&Ipv4Config) -> String| config.map_or("(none)".into(), f);
        [
            ("Network", show(|c| c.network.to_string())),
            ("SubnetLen", show(|c| c.subnet_len.to_string())),
            ("SubnetMin", show(|c| c.subnet_min.to_string())),
            ("SubnetMax", show(|c| c.subnet_max.to_string())),
        ]
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

fn parse_network(value: Option<&Value>) -> Result<Ipv4Net, ConfigError> {
    let text = match value {
        Some(Value::String(s)) => s,
        Some(other) => return invalid(format!("Network must be a CIDR string, got {other}")),
        None => return invalid("Network is missing (e.g. \"Network\":\"10.5.0.0/16\")"),
    };
    // flannel masks host bits (Go's net.ParseCIDR), so "10.5.1.0/16" means 10.5.0.0/16.
    let network = text
        .parse::<Ipv4Net>()
        .map_err(|_| {
            ConfigError(format!(
                "Network {} is not an IPv4 CIDR",
                shown::quoted(text)
            ))
        })?
        .trunc();
    if network.prefix_len() == 0 {
        return invalid(format!("Network {network} is empty"));
    }
    if let Some((range, what)) = NOT_UNICAST.iter().find(|(r, _)| overlaps(network, r)) {
        return invalid(format!(
            "Network {network} holds {what} addresses ({range}), which no container can have: \
             give a unicast range, such as 10.5.0.0/16"
        ));
    }
    Ok(network)
}

/// Ranges whose addresses no host interface has: the kernel refuses routes and addresses there.
const NOT_UNICAST: [(Ipv4Net, &str); 4] = [
    (
        Ipv4Net::new_assert(Ipv4Addr::new(0, 0, 0, 0), 8),
        "\"this network\"",
    ),
    (
        Ipv4Net::new_assert(Ipv4Addr::new(127, 0, 0, 0), 8),
        "loopback",
    ),
    (
        Ipv4Net::new_assert(Ipv4Addr::new(224, 0, 0, 0), 4),
        "multicast",
    ),
    (
        Ipv4Net::new_assert(Ipv4Addr::new(240, 0, 0, 0), 4),
        "reserved and broadcast",
    ),
];

fn overlaps(a: Ipv4Net, b: &Ipv4Net) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
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
        Some(Value::String(s)) => s.parse::<Ipv4Addr>().map_err(|_| {
            ConfigError(format!(
                "{name} {} is not an IPv4 address",
                shown::quoted(s)
            ))
        })?,
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
