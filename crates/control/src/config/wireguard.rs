//! flannel's wireguard `Backend` fields: `ListenPort`, `ListenPortV6`, `Mode`, `PSK`,
//! `PersistentKeepaliveInterval` and `MTU`, with flannel's defaults. A bad value is refused in
//! one line that names the field (and never repeats a key).

use super::{field, BackendConfig, Config, ConfigError};
use crate::backend_kind::BackendKind;
use serde_json::{Map, Value};
use std::fmt;
use twill_dataplane::engine::wireguard::PresharedKey;

/// flannel's default `ListenPortV6`: where `flannel-wg-v6` listens in Mode separate.
pub const DEFAULT_PORT_V6: u16 = 51821;

/// flannel's `Mode`: how a dual-stack network's two families cross (on an IPv4-only network
/// every mode but ipv6 is the one IPv4 device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// flannel's default: a device per family, `flannel-wg` for IPv4 over the IPv4 underlay
    /// and `flannel-wg-v6` for IPv6 over the IPv6 underlay, at `ListenPortV6`.
    #[default]
    Separate,
    /// One device, `flannel-wg`, for both families; each peer reached over the underlay
    /// flannel's `selectMode` picks for it.
    Auto,
    /// One device for both families; every peer reached at its PublicIP.
    Ipv4,
    /// One device for both families; every peer reached at its PublicIPv6.
    Ipv6,
}

impl Mode {
    const NAMES: [(&'static str, Mode); 4] = [
        ("separate", Mode::Separate),
        ("auto", Mode::Auto),
        ("ipv4", Mode::Ipv4),
        ("ipv6", Mode::Ipv6),
    ];
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = Mode::NAMES.iter().find(|(_, m)| m == self).map(|(n, _)| *n);
        f.write_str(name.unwrap_or_default())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireguardConfig {
    pub listen_port: u16,
    /// Where `flannel-wg-v6` listens (Mode separate); every mode names it in the lease.
    pub listen_port_v6: u16,
    pub mode: Mode,
    pub psk: Option<PresharedKey>,
    /// Seconds between keepalives on idle tunnels; `None` sends none (flannel's 0).
    pub keepalive: Option<u16>,
    /// `MTU`: the underlay MTU to plan for, when not the interface's.
    pub mtu: Option<u32>,
}

impl WireguardConfig {
    pub fn parse(backend: &BackendConfig) -> Result<WireguardConfig, ConfigError> {
        let empty = Map::new();
        let obj = backend.raw.as_object().unwrap_or(&empty);
        let listen_port = BackendKind::Wireguard
            .default_port()
            .expect("wireguard sends UDP: it has a default port");
        Ok(WireguardConfig {
            listen_port: port(obj, "ListenPort", listen_port)?,
            listen_port_v6: port(obj, "ListenPortV6", DEFAULT_PORT_V6)?,
            mode: mode(field(obj, "Mode"))?,
            psk: psk(field(obj, "PSK"))?,
            keepalive: keepalive(field(obj, "PersistentKeepaliveInterval"))?,
            mtu: backend.mtu,
        })
    }

    /// [`WireguardConfig::parse`] of a network's config, with what only the whole config
    /// tells: Mode ipv6 reaches peers at their PublicIPv6, which only a dual-stack network's
    /// leases carry (flanneld would make every peer an endpoint it cannot resolve).
    pub fn of_network(config: &Config) -> Result<WireguardConfig, ConfigError> {
        let parsed = WireguardConfig::parse(&config.backend)?;
        if parsed.mode == Mode::Ipv6 && config.ipv6.is_none() {
            return error(
                "Backend.Mode \"ipv6\" reaches every peer at its PublicIPv6, which only the \
                 leases of a dual-stack network carry: set EnableIPv6 with an IPv6Network, or \
                 choose Mode ipv4, auto or separate"
                    .into(),
            );
        }
        Ok(parsed)
    }
}

fn error<T>(msg: String) -> Result<T, ConfigError> {
    Err(ConfigError::new(msg))
}

fn mode(value: Option<&Value>) -> Result<Mode, ConfigError> {
    let Some(v) = value.filter(|v| !v.is_null()) else {
        return Ok(Mode::default());
    };
    let found = Mode::NAMES
        .iter()
        .find(|(name, _)| v.as_str() == Some(*name));
    found.map(|(_, mode)| *mode).ok_or_else(|| {
        ConfigError::new(format!(
            "Backend.Mode {v} is not one of flannel's modes: give separate (the default), auto, \
             ipv4 or ipv6"
        ))
    })
}

/// `ListenPort` or `ListenPortV6`: a port peers can reach, `default` when absent.
fn port(obj: &Map<String, Value>, name: &str, default: u16) -> Result<u16, ConfigError> {
    let Some(v) = field(obj, name).filter(|v| !v.is_null()) else {
        return Ok(default);
    };
    match v.as_u64().and_then(|p| u16::try_from(p).ok()) {
        Some(port) if port > 0 => Ok(port),
        _ => error(format!(
            "Backend.{name} {v} is not a UDP port: give 1 to 65535 (default {default})"
        )),
    }
}

fn psk(value: Option<&Value>) -> Result<Option<PresharedKey>, ConfigError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        // flannel treats an empty PSK as none.
        Some(Value::String(text)) if text.is_empty() => Ok(None),
        Some(Value::String(text)) => PresharedKey::from_base64(text).map(Some).or_else(|e| {
            error(format!(
                "Backend.PSK is not a WireGuard key (base64 of 32 bytes, as `wg genpsk` \
                 prints): {e}"
            ))
        }),
        Some(_) => error("Backend.PSK must be a string (base64 of 32 bytes)".into()),
    }
}

fn keepalive(value: Option<&Value>) -> Result<Option<u16>, ConfigError> {
    let Some(v) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match v.as_u64().and_then(|s| u16::try_from(s).ok()) {
        Some(0) => Ok(None),
        Some(seconds) => Ok(Some(seconds)),
        None => error(format!(
            "Backend.PersistentKeepaliveInterval {v} is not a number of seconds from 0 to 65535"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    const PSK: &str = "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MDA=";

    fn parse(backend: &str) -> Result<WireguardConfig, String> {
        let json = format!(r#"{{"Network":"10.5.0.0/16","Backend":{backend}}}"#);
        let config = Config::parse(&json).map_err(|e| e.to_string())?;
        WireguardConfig::parse(&config.backend).map_err(|e| e.to_string())
    }

    #[test]
    fn flannels_defaults() {
        let c = parse(r#"{"Type":"wireguard"}"#).unwrap();
        assert_eq!(
            c,
            WireguardConfig {
                listen_port: 51820,
                listen_port_v6: 51821,
                mode: Mode::Separate,
                psk: None,
                keepalive: None,
                mtu: None,
            }
        );
    }

    #[test]
    fn every_field() {
        let c = parse(&format!(
            r#"{{"Type":"wireguard","ListenPort":51999,"PSK":"{PSK}","PersistentKeepaliveInterval":25,"MTU":1400,"Mode":"separate","ListenPortV6":51998}}"#
        ))
        .unwrap();
        assert_eq!(
            (c.listen_port, c.listen_port_v6, c.keepalive, c.mtu),
            (51999, 51998, Some(25), Some(1400))
        );
        assert_eq!(c.psk, PresharedKey::from_base64(PSK).ok());
        let c = parse(r#"{"Type":"wireguard","PSK":"","PersistentKeepaliveInterval":0}"#).unwrap();
        assert_eq!((c.psk, c.keepalive), (None, None));
    }

    #[test]
    fn each_of_flannels_modes() {
        for (name, mode) in Mode::NAMES {
            let c = parse(&format!(r#"{{"Type":"wireguard","Mode":"{name}"}}"#)).unwrap();
            assert_eq!(c.mode, mode);
            assert_eq!(mode.to_string(), name);
        }
        assert_eq!(
            parse(r#"{"Type":"wireguard","Mode":null}"#).unwrap().mode,
            Mode::Separate
        );
    }

    #[test]
    fn mode_ipv6_needs_a_dual_stack_network() {
        let of = |network: &str| {
            let json = format!(r#"{{{network},"Backend":{{"Type":"wireguard","Mode":"ipv6"}}}}"#);
            let config = Config::parse(&json).unwrap();
            WireguardConfig::of_network(&config).map_err(|e| e.to_string())
        };
        let err = of(r#""Network":"10.5.0.0/16""#).unwrap_err();
        assert!(
            err.contains("Backend.Mode \"ipv6\" reaches every peer at its PublicIPv6")
                && err.contains("set EnableIPv6"),
            "{err}"
        );
        let dual = of(r#""Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/48""#);
        assert_eq!(dual.unwrap().mode, Mode::Ipv6);
    }

    #[test]
    fn bad_values_are_one_line_naming_the_field_and_never_the_key() {
        let cases = [
            (
                r#""Mode":"both""#,
                "Backend.Mode \"both\" is not one of flannel's modes: give separate (the \
                 default), auto, ipv4 or ipv6",
            ),
            (r#""Mode":"IPv6""#, "Backend.Mode \"IPv6\" is not one"),
            (r#""Mode":6"#, "Backend.Mode 6 is not one"),
            (
                r#""ListenPortV6":0"#,
                "Backend.ListenPortV6 0 is not a UDP port: give 1 to 65535 (default 51821)",
            ),
            (
                r#""ListenPort":0"#,
                "Backend.ListenPort 0 is not a UDP port",
            ),
            (r#""ListenPort":65536"#, "Backend.ListenPort 65536"),
            (r#""ListenPort":"x""#, "Backend.ListenPort \"x\""),
            (r#""PSK":"c2VjcmV0""#, "Backend.PSK is not a WireGuard key"),
            (r#""PSK":"not base64 at all!""#, "not base64"),
            (r#""PSK":7"#, "Backend.PSK must be a string"),
            (
                r#""PersistentKeepaliveInterval":-1"#,
                "Backend.PersistentKeepaliveInterval -1",
            ),
        ];
        for (fields, want) in cases {
            let err = parse(&format!(r#"{{"Type":"wireguard",{fields}}}"#)).unwrap_err();
            assert!(err.contains(want), "{fields}: {err}");
            assert!(!err.contains('\n') && !err.contains("c2VjcmV0"), "{err}");
        }
    }
}
