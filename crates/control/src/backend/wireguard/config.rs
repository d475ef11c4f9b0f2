//! flannel's wireguard `Backend` fields: `ListenPort`, `PSK`, `PersistentKeepaliveInterval`,
//! `MTU` and `Mode`, with flannel's defaults. A bad value is refused in one line that names the
//! field (and never repeats a key).

use crate::config::{field, BackendConfig, ConfigError};
use serde_json::{Map, Value};
use twill_dataplane::engine::wireguard::{PresharedKey, DEFAULT_PORT};

/// The only `Mode` twill runs: flannel's default, one device per address family, IPv4 here.
pub const MODE_SEPARATE: &str = "separate";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireguardConfig {
    pub listen_port: u16,
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
        check_mode(field(obj, "Mode"))?;
        Ok(WireguardConfig {
            listen_port: listen_port(field(obj, "ListenPort"))?,
            psk: psk(field(obj, "PSK"))?,
            keepalive: keepalive(field(obj, "PersistentKeepaliveInterval"))?,
            mtu: backend.mtu,
        })
    }
}

fn error<T>(msg: String) -> Result<T, ConfigError> {
    Err(ConfigError::new(msg))
}

fn check_mode(value: Option<&Value>) -> Result<(), ConfigError> {
    match value {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) if m == MODE_SEPARATE => Ok(()),
        Some(other) => error(format!(
            "Backend.Mode {other} is not supported: twill's wireguard backend runs Mode \
             \"{MODE_SEPARATE}\" (IPv4) only"
        )),
    }
}

fn listen_port(value: Option<&Value>) -> Result<u16, ConfigError> {
    let Some(v) = value.filter(|v| !v.is_null()) else {
        return Ok(DEFAULT_PORT);
    };
    match v.as_u64().and_then(|p| u16::try_from(p).ok()) {
        Some(port) if port > 0 => Ok(port),
        _ => error(format!(
            "Backend.ListenPort {v} is not a UDP port: give 1 to 65535 (default {DEFAULT_PORT})"
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
                psk: None,
                keepalive: None,
                mtu: None,
            }
        );
    }

    #[test]
    fn every_field() {
        let c = parse(&format!(
            r#"{{"Type":"wireguard","ListenPort":51999,"PSK":"{PSK}","PersistentKeepaliveInterval":25,"MTU":1400,"Mode":"separate","ListenPortV6":51821}}"#
        ))
        .unwrap();
        assert_eq!(
            (c.listen_port, c.keepalive, c.mtu),
            (51999, Some(25), Some(1400))
        );
        assert_eq!(c.psk, PresharedKey::from_base64(PSK).ok());
        let c = parse(r#"{"Type":"wireguard","PSK":"","PersistentKeepaliveInterval":0}"#).unwrap();
        assert_eq!((c.psk, c.keepalive), (None, None));
    }

    #[test]
    fn bad_values_are_one_line_naming_the_field_and_never_the_key() {
        let cases = [
            (r#""Mode":"auto""#, "Backend.Mode \"auto\" is not supported"),
            (r#""Mode":"ipv6""#, "Backend.Mode"),
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
