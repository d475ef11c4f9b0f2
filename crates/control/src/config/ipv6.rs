//! The IPv6 half of flannel's network config: `IPv6Network`, `IPv6SubnetLen`, `IPv6SubnetMin`
//! and `IPv6SubnetMax`, with the defaults and checks of flannel's `CheckNetworkConfig`.
//!
//! Reading happens in two steps, as in flanneld: the fields are decoded whatever `EnableIPv6`
//! says (flanneld's JSON decoding refuses a malformed `IPv6Network` even when IPv6 is off), and
//! only a config with `EnableIPv6` is checked for coherence and gets its defaults.

use super::{as_number, field, invalid, ConfigError};
use crate::shown;
use ipnet::Ipv6Net;
use serde_json::{Map, Value};
use std::net::Ipv6Addr;

/// The largest `IPv6SubnetLen`: a subnet needs room for a tunnel and a bridge address.
const LONGEST_SUBNET: u32 = 126;
/// The smallest `IPv6Network` flannel will split on its own: four subnets of four addresses.
const SHORTEST_DEFAULT_NETWORK: u8 = 124;
/// flannel gives each node a /64 when the network is large enough.
const DEFAULT_SUBNET_LEN: u8 = 64;

/// The IPv6 network of a dual-stack config, with flannel's defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipv6Config {
    /// `IPv6Network`: every IPv6 subnet lies inside it.
    pub network: Ipv6Net,
    /// `IPv6SubnetLen`: prefix length of one node's IPv6 subnet.
    pub subnet_len: u8,
    /// `IPv6SubnetMin`: network address of the lowest IPv6 subnet that may be leased.
    pub subnet_min: Ipv6Addr,
    /// `IPv6SubnetMax`: network address of the highest IPv6 subnet that may be leased.
    pub subnet_max: Ipv6Addr,
}

impl Ipv6Config {
    /// The fields as `(name, value)`, for naming what changed between two configs.
    pub(super) fn shown(config: Option<&Ipv6Config>) -> [(&'static str, String); 4] {
        let show = |f: fn(&Ipv6Config) -> String| config.map_or("(none)".into(), f);
        [
            ("IPv6Network", show(|c| c.network.to_string())),
            ("IPv6SubnetLen", show(|c| c.subnet_len.to_string())),
            ("IPv6SubnetMin", show(|c| c.subnet_min.to_string())),
            ("IPv6SubnetMax", show(|c| c.subnet_max.to_string())),
        ]
    }
}

/// The IPv6 fields as written, each `None` when absent (or flannel's zero value).
pub(super) struct Ipv6Fields {
    network: Option<Ipv6Net>,
    subnet_len: Option<u32>,
    subnet_min: Option<Ipv6Addr>,
    subnet_max: Option<Ipv6Addr>,
}

impl Ipv6Fields {
    /// Decodes the fields; a field of the wrong form is refused even with IPv6 off.
    pub(super) fn read(obj: &Map<String, Value>) -> Result<Ipv6Fields, ConfigError> {
        Ok(Ipv6Fields {
            network: parse_network(field(obj, "IPv6Network"))?,
            subnet_len: as_number::<u32>(field(obj, "IPv6SubnetLen"), "IPv6SubnetLen")?
                .filter(|&len| len > 0),
            subnet_min: parse_address(obj, "IPv6SubnetMin")?,
            subnet_max: parse_address(obj, "IPv6SubnetMax")?,
        })
    }

    /// flannel's checks of an IPv6-enabled config, and its defaults.
    pub(super) fn validate(self) -> Result<Ipv6Config, ConfigError> {
        let Some(network) = self.network else {
            return invalid(
                "EnableIPv6 is true but IPv6Network is missing (e.g. \"IPv6Network\":\"fd10::/48\")",
            );
        };
        let subnet_len = match self.subnet_len {
            Some(len) => check_subnet_len(len, network)?,
            None => default_subnet_len(network)?,
        };
        let bound = |value: Option<Ipv6Addr>, name| check_bound(value, name, network, subnet_len);
        let subnet_min = bound(self.subnet_min, "IPv6SubnetMin")?
            .unwrap_or_else(|| second_subnet(network, subnet_len));
        let subnet_max = bound(self.subnet_max, "IPv6SubnetMax")?
            .unwrap_or_else(|| last_subnet(network, subnet_len));
        if subnet_min > subnet_max {
            return invalid(format!(
                "IPv6SubnetMin {subnet_min} is above IPv6SubnetMax {subnet_max}"
            ));
        }
        Ok(Ipv6Config {
            network,
            subnet_len,
            subnet_min,
            subnet_max,
        })
    }
}

/// `IPv6Network`, host bits masked as Go's `net.ParseCIDR` does; `::/0` is flannel's "empty".
fn parse_network(value: Option<&Value>) -> Result<Option<Ipv6Net>, ConfigError> {
    let text = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s,
        Some(other) => return invalid(format!("IPv6Network must be a CIDR string, got {other}")),
    };
    let network = text
        .parse::<Ipv6Net>()
        .map_err(|_| {
            ConfigError::new(format!(
                "IPv6Network {} is not an IPv6 CIDR (an IPv6 address, \"/\", and a prefix \
                 length of at most 128)",
                shown::quoted(text)
            ))
        })?
        .trunc();
    Ok((network.prefix_len() > 0).then_some(network))
}

/// `IPv6SubnetMin` / `IPv6SubnetMax`: `None` when absent or `::` (flannel's zero means default).
fn parse_address(obj: &Map<String, Value>, name: &str) -> Result<Option<Ipv6Addr>, ConfigError> {
    let ip = match field(obj, name) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s.parse::<Ipv6Addr>().map_err(|_| {
            ConfigError::new(format!(
                "{name} {} is not an IPv6 address",
                shown::quoted(s)
            ))
        })?,
        Some(other) => {
            return invalid(format!(
                "{name} must be an IPv6 address string, got {other}"
            ))
        }
    };
    Ok((!ip.is_unspecified()).then_some(ip))
}

fn check_subnet_len(len: u32, network: Ipv6Net) -> Result<u8, ConfigError> {
    if len > LONGEST_SUBNET {
        return invalid(format!(
            "IPv6SubnetLen {len} is too long: it must be at most {LONGEST_SUBNET}"
        ));
    }
    let shortest = u32::from(network.prefix_len()) + 2;
    if len < shortest {
        return invalid(format!(
            "IPv6SubnetLen {len} is too short for IPv6Network {network}: it must be at least \
             {shortest} so the network holds four subnets"
        ));
    }
    Ok(len as u8)
}

fn default_subnet_len(network: Ipv6Net) -> Result<u8, ConfigError> {
    match network.prefix_len() {
        p if p > SHORTEST_DEFAULT_NETWORK => invalid(format!(
            "IPv6Network {network} is too small: the minimum useful prefix is \
             /{SHORTEST_DEFAULT_NETWORK}"
        )),
        p if p + 2 <= DEFAULT_SUBNET_LEN => Ok(DEFAULT_SUBNET_LEN),
        p => Ok(p + 2),
    }
}

fn check_bound(
    ip: Option<Ipv6Addr>,
    name: &str,
    network: Ipv6Net,
    subnet_len: u8,
) -> Result<Option<Ipv6Addr>, ConfigError> {
    let Some(ip) = ip else { return Ok(None) };
    if !network.contains(&ip) {
        return invalid(format!(
            "{name} {ip} is not in the range of the IPv6Network {network}"
        ));
    }
    if u128::from(ip) % subnet_size(subnet_len) != 0 {
        return invalid(format!(
            "{name} {ip} is not on an IPv6SubnetLen /{subnet_len} boundary"
        ));
    }
    Ok(Some(ip))
}

/// Addresses in one subnet; `subnet_len` is at least 2, so this never overflows.
fn subnet_size(subnet_len: u8) -> u128 {
    1u128 << (128 - u32::from(subnet_len))
}

/// The first subnet is skipped, as flannel does: its network address equals the network's.
fn second_subnet(network: Ipv6Net, subnet_len: u8) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(network.network()) + subnet_size(subnet_len))
}

fn last_subnet(network: Ipv6Net, subnet_len: u8) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(network.broadcast()) - subnet_size(subnet_len) + 1)
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const V4: &str = r#""Network":"10.5.0.0/16""#;

    fn dual(v6: &str) -> Config {
        let json = format!(r#"{{{V4},"EnableIPv6":true,{v6}}}"#);
        Config::from_json(&json).unwrap_or_else(|e| panic!("{json}: {e}"))
    }

    fn error(json: &str) -> String {
        let err = Config::from_json(json).expect_err(json).to_string();
        assert!(!err.contains('\n'), "multi-line error: {err}");
        assert!(err.starts_with("invalid network config: "), "{err}");
        err
    }

    #[test]
    fn flannels_dual_stack_config_with_its_defaults() {
        let c = dual(r#""IPv6Network":"fd10::/48""#);
        let v6 = c.ipv6.unwrap();
        assert_eq!(v6.network, "fd10::/48".parse().unwrap());
        assert_eq!(v6.subnet_len, 64);
        assert_eq!(
            v6.subnet_min,
            "fd10:0:0:1::".parse::<std::net::Ipv6Addr>().unwrap()
        );
        assert_eq!(
            v6.subnet_max,
            "fd10:0:0:ffff::".parse::<std::net::Ipv6Addr>().unwrap()
        );
        assert_eq!(
            c.ipv4.unwrap().network,
            "10.5.0.0/16".parse().unwrap(),
            "IPv4 half as before"
        );
    }

    #[test]
    fn small_networks_are_split_in_four_as_flannel_does() {
        let v6 = dual(r#""IPv6Network":"fd10::/100""#).ipv6.unwrap();
        assert_eq!(
            (
                v6.subnet_len,
                v6.subnet_min.to_string(),
                v6.subnet_max.to_string()
            ),
            (102, "fd10::400:0".into(), "fd10::c00:0".into())
        );
        let v6 = dual(r#""IPv6Network":"fd10::/62""#).ipv6.unwrap();
        assert_eq!(v6.subnet_len, 64);
        let v6 = dual(r#""IPv6Network":"fd10::/63""#).ipv6.unwrap();
        assert_eq!(v6.subnet_len, 65);
        let v6 = dual(r#""IPv6Network":"fd10::/124""#).ipv6.unwrap();
        assert_eq!(v6.subnet_len, 126);
    }

    #[test]
    fn explicit_fields_host_bits_and_zero_values() {
        let v6 = dual(
            r#""ipv6network":"fd10::77/48","IPv6SubnetLen":56,"IPv6SubnetMin":"fd10:0:0:200::",
            "IPv6SubnetMax":"::""#,
        )
        .ipv6
        .unwrap();
        assert_eq!(v6.network, "fd10::/48".parse().unwrap());
        assert_eq!(v6.subnet_len, 56);
        assert_eq!(v6.subnet_min.to_string(), "fd10:0:0:200::");
        assert_eq!(v6.subnet_max.to_string(), "fd10:0:0:ff00::");
        let v6 = dual(r#""IPv6Network":"fd10::/48","IPv6SubnetLen":0,"IPv6SubnetMin":null"#);
        assert_eq!(v6.ipv6.unwrap().subnet_len, 64);
    }

    #[test]
    fn a_network_at_the_top_of_the_address_space_does_not_overflow() {
        let v6 = dual(r#""IPv6Network":"ffff::/16""#).ipv6.unwrap();
        assert_eq!(v6.subnet_max.to_string(), "ffff:ffff:ffff:ffff::");
    }

    #[test]
    fn ipv6_fields_are_ignored_but_decoded_when_ipv6_is_off() {
        let off = r#"{"Network":"10.5.0.0/16","EnableIPv6":false,"IPv6Network":"::/0","IPv6SubnetLen":200}"#;
        let c = Config::from_json(off).unwrap();
        assert_eq!(c.ipv6, None);
        assert_eq!(c, Config::parse(r#"{"Network":"10.5.0.0/16"}"#).unwrap());
        let err = error(r#"{"Network":"10.5.0.0/16","IPv6Network":"banana"}"#);
        assert!(
            err.contains("IPv6Network \"banana\" is not an IPv6 CIDR"),
            "{err}"
        );
    }

    #[test]
    fn invalid_ipv6_configs_name_the_field() {
        let cases = [
            ("", "EnableIPv6 is true but IPv6Network is missing"),
            (r#","IPv6Network":"::/0""#, "IPv6Network is missing"),
            (
                r#","IPv6Network":"fd10::/129""#,
                "prefix length of at most 128",
            ),
            (
                r#","IPv6Network":"10.6.0.0/16""#,
                "\"10.6.0.0/16\" is not an IPv6 CIDR",
            ),
            (r#","IPv6Network":48"#, "IPv6Network must be a CIDR string"),
            (
                r#","IPv6Network":"fd10::/125""#,
                "IPv6Network fd10::/125 is too small",
            ),
            (
                r#","IPv6Network":"fd10::/48","IPv6SubnetLen":129"#,
                "IPv6SubnetLen 129 is too long: it must be at most 126",
            ),
            (
                r#","IPv6Network":"fd10::/48","IPv6SubnetLen":127"#,
                "IPv6SubnetLen 127 is too long",
            ),
            (
                r#","IPv6Network":"fd10::/48","IPv6SubnetLen":40"#,
                "IPv6SubnetLen 40 is too short for IPv6Network fd10::/48: it must be at least 50",
            ),
            (
                r#","IPv6Network":"fd10::/48","IPv6SubnetLen":49"#,
                "IPv6SubnetLen 49 is too short",
            ),
            (
                r#","IPv6Network":"fd10::/48","IPv6SubnetLen":-1"#,
                "IPv6SubnetLen -1 is not a valid number",
            ),
            (
                r#","IPv6Network":"fd10::/48","IPv6SubnetMin":"fd11::""#,
                "IPv6SubnetMin fd11:: is not in the range of the IPv6Network fd10::/48",
            ),
            (
                r#","IPv6Network":"fd10::/48","IPv6SubnetMax":"fd0f:ffff::""#,
                "IPv6SubnetMax fd0f:ffff:: is not in the range",
            ),
            (
                r#","IPv6Network":"fd10::/48","IPv6SubnetMax":"fd10:0:0:5::1""#,
                "IPv6SubnetMax fd10:0:0:5::1 is not on an IPv6SubnetLen /64 boundary",
            ),
            (
                r#","IPv6Network":"fd10::/48","IPv6SubnetMin":"10.5.1.0""#,
                "IPv6SubnetMin \"10.5.1.0\" is not an IPv6 address",
            ),
            (
                r#","IPv6Network":"fd10::/48","IPv6SubnetMin":5"#,
                "IPv6SubnetMin must be an IPv6 address string",
            ),
            (
                r#","IPv6Network":"fd10::/48","IPv6SubnetMin":"fd10:0:0:9::","IPv6SubnetMax":"fd10:0:0:3::""#,
                "IPv6SubnetMin fd10:0:0:9:: is above IPv6SubnetMax fd10:0:0:3::",
            ),
            (r#","EnableIPv4":"yes""#, "EnableIPv4 must be true or false"),
        ];
        for (fields, want) in cases {
            let json = format!(r#"{{{V4},"EnableIPv6":true{fields}}}"#);
            let err = error(&json);
            assert!(err.contains(want), "{json}: got {err:?}, want {want:?}");
        }
    }

    #[test]
    fn a_dual_stack_config_runs_on_five_backends_and_is_refused_elsewhere_naming_why() {
        for backend in ["vxlan", "host-gw", "udp", "twill-batch", "wireguard"] {
            let json = format!(
                r#"{{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/48","Backend":{{"Type":"{backend}"}}}}"#
            );
            let config = Config::parse(&json).unwrap_or_else(|e| panic!("{backend}: {e}"));
            assert_eq!(config.ipv6.unwrap().network, "fd10::/48".parse().unwrap());
        }
        let json = r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/48","Backend":{"Type":"ipip"}}"#;
        let err = Config::parse(json).unwrap_err().to_string();
        let want = "IPv6Network fd10::/48 (IPv6SubnetLen /64) is valid, but twill's ipip backend \
                    carries no IPv6 yet (dual-stack runs on vxlan, host-gw, udp, twill-batch, \
                    wireguard)";
        assert!(err.contains(want), "{err}");
    }

    #[test]
    fn an_ipv6_only_network_runs_on_vxlan_and_host_gw_and_is_refused_elsewhere() {
        let only = |backend: &str| {
            format!(
                r#"{{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd10::/48","Network":"bogus","Backend":{{"Type":"{backend}"}}}}"#
            )
        };
        for backend in ["vxlan", "host-gw"] {
            // flanneld does not read Network with EnableIPv4 false; neither does twill.
            let config = Config::parse(&only(backend)).unwrap();
            assert_eq!(config.ipv4, None);
            assert_eq!(config.ipv6.unwrap().network, "fd10::/48".parse().unwrap());
        }
        for backend in ["udp", "twill-batch", "wireguard", "ipip"] {
            let err = Config::parse(&only(backend)).unwrap_err().to_string();
            let want = format!(
                "invalid network config: EnableIPv4 is false: the IPv6-only network fd10::/48 is \
                 valid, but twill runs an IPv6-only network on vxlan and host-gw only, not on \
                 {backend}; choose one of those, or set EnableIPv4 to true with a Network"
            );
            assert_eq!(err, want);
        }
        let bad = r#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd10::/48","IPv6SubnetLen":130}"#;
        assert!(error(bad).contains("IPv6SubnetLen 130 is too long"));
        let neither = r#"{"Network":"10.5.0.0/16","EnableIPv4":false}"#;
        assert!(error(neither).contains("EnableIPv4 and EnableIPv6 are both false"));
    }

    #[test]
    fn a_changed_ipv6_network_is_named() {
        let running = dual(r#""IPv6Network":"fd10::/48""#);
        let now = dual(r#""IPv6Network":"fd10::/48","IPv6SubnetLen":56"#);
        assert_eq!(
            running.difference(&now).unwrap(),
            "IPv6SubnetLen 64 -> 56, IPv6SubnetMin fd10:0:0:1:: -> fd10:0:0:100::, \
             IPv6SubnetMax fd10:0:0:ffff:: -> fd10:0:0:ff00::"
        );
        let v4 = Config::from_json(&format!("{{{V4}}}")).unwrap();
        assert_eq!(
            v4.difference(&running).unwrap(),
            "IPv6Network (none) -> fd10::/48, IPv6SubnetLen (none) -> 64, \
             IPv6SubnetMin (none) -> fd10:0:0:1::, IPv6SubnetMax (none) -> fd10:0:0:ffff::"
        );
    }
}
