//! `Backend.Underlay`: the address family the userspace engines (udp, twill-batch) send their
//! datagrams over. twill's own field: flanneld's udp backend has no IPv6 and ignores it.
//!
//! One family for the whole network, as a flannel network has one `Backend`: every node binds
//! its socket on an address of that family and sends to its peers' address of that family
//! (`PublicIP`, or `PublicIPv6`), so two nodes never wait on each other in different families.

use super::{field, ConfigError};
use crate::backend_kind::BackendKind;
use serde_json::{Map, Value};
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Underlay {
    /// To peers' `PublicIP`, as flanneld does.
    #[default]
    Ipv4,
    /// To peers' `PublicIPv6`, on a dual-stack network.
    Ipv6,
}

impl fmt::Display for Underlay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Underlay::Ipv4 => "ipv4",
            Underlay::Ipv6 => "ipv6",
        })
    }
}

impl Underlay {
    /// The field's value, if it is one of the two.
    pub(super) fn read(backend: &Map<String, Value>) -> Result<Underlay, ConfigError> {
        match field(backend, "Underlay") {
            None | Some(Value::Null) => Ok(Underlay::Ipv4),
            Some(Value::String(s)) if s == "ipv4" => Ok(Underlay::Ipv4),
            Some(Value::String(s)) if s == "ipv6" => Ok(Underlay::Ipv6),
            Some(other) => Err(ConfigError::new(format!(
                "Backend.Underlay {other} is not an underlay: give \"ipv4\" (the default) or \
                 \"ipv6\""
            ))),
        }
    }

    /// Whether a network of `backend` runs on this underlay: IPv6 needs a userspace backend
    /// (the kernel backends follow flannel: each family over its own) and a dual-stack network
    /// (only there do leases name a `PublicIPv6`).
    pub(super) fn check(self, backend: &str, dual_stack: bool) -> Result<(), ConfigError> {
        if self == Underlay::Ipv4 {
            return Ok(());
        }
        if !BackendKind::parse(backend).is_some_and(BackendKind::userspace) {
            return Err(ConfigError::new(format!(
                "Backend.Underlay \"ipv6\" is for the udp and twill-batch backends; the {backend} \
                 backend sends each family over its own, as flannel's does: leave it out"
            )));
        }
        if !dual_stack {
            return Err(ConfigError::new(
                "Backend.Underlay \"ipv6\" needs a dual-stack network (EnableIPv6 true, with an \
                 IPv6Network): only there do leases name the PublicIPv6 peers are sent to",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Underlay;
    use crate::config::Config;

    const DUAL: &str = r#""EnableIPv6":true,"IPv6Network":"fd10::/48""#;

    fn parse(fields: &str, backend: &str) -> Result<Underlay, String> {
        let json = format!(r#"{{"Network":"10.5.0.0/16",{fields}"Backend":{backend}}}"#);
        let config = Config::parse(&json).map_err(|e| e.to_string())?;
        Ok(config.backend.underlay)
    }

    #[test]
    fn ipv4_unless_a_userspace_backend_on_a_dual_stack_network_asks_for_ipv6() {
        let dual = format!("{DUAL},");
        assert_eq!(parse("", r#"{"Type":"udp"}"#), Ok(Underlay::Ipv4));
        assert_eq!(
            parse("", r#"{"Type":"udp","Underlay":"ipv4"}"#),
            Ok(Underlay::Ipv4)
        );
        for backend in ["udp", "twill-batch"] {
            let json = format!(r#"{{"Type":"{backend}","Underlay":"ipv6"}}"#);
            assert_eq!(parse(&dual, &json), Ok(Underlay::Ipv6), "{backend}");
        }
    }

    #[test]
    fn a_bad_or_misplaced_underlay_is_refused_in_one_line_naming_the_field() {
        let dual = format!("{DUAL},");
        let cases = [
            (
                "",
                r#"{"Type":"udp","Underlay":"ipv7"}"#,
                "Backend.Underlay \"ipv7\" is not an underlay",
            ),
            (
                "",
                r#"{"Type":"udp","Underlay":6}"#,
                "Backend.Underlay 6 is not an underlay",
            ),
            (
                "",
                r#"{"Type":"udp","Underlay":"ipv6"}"#,
                "needs a dual-stack network",
            ),
            (
                &dual,
                r#"{"Type":"vxlan","Underlay":"ipv6"}"#,
                "is for the udp and twill-batch backends; the vxlan backend",
            ),
        ];
        for (fields, backend, want) in cases {
            let err = parse(fields, backend).expect_err(backend);
            assert!(err.contains(want), "{backend}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }
}
