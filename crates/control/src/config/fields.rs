//! Which fields of a network config twill reads, so that none is ignored without a word: a field
//! twill does not read (a newer flannel's, a misspelt one, one of a backend other than the
//! config's) is named in a warning at start. flanneld ignores them silently (Go's
//! encoding/json); twill still accepts the config, since another version's fields are expected
//! in a network shared with it, but says which fields have no effect here.

use crate::backend_kind::BackendKind;
use serde_json::{Map, Value};

/// The top-level fields of flannel's config (its pkg/subnet/config.go).
const NETWORK_FIELDS: [&str; 12] = [
    "Network",
    "SubnetLen",
    "SubnetMin",
    "SubnetMax",
    "EnableIPv4",
    "EnableIPv6",
    "IPv6Network",
    "IPv6SubnetLen",
    "IPv6SubnetMin",
    "IPv6SubnetMax",
    "EnableNFTables",
    "Backend",
];

/// The fields of `config` (the whole object) twill does not read for a network on
/// `backend_type`, as `Backend.X` or `X`, in the order they appear. Names match as Go matches
/// them: exactly, else ignoring case.
pub fn unread(config: &Map<String, Value>, backend_type: &str) -> Vec<String> {
    let known = |name: &str, fields: &[&str]| fields.iter().any(|f| f.eq_ignore_ascii_case(name));
    let mut unread: Vec<String> = config
        .keys()
        .filter(|k| !known(k, &NETWORK_FIELDS))
        .cloned()
        .collect();
    let backend = config
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("Backend"))
        .and_then(|(_, v)| v.as_object());
    if let Some(backend) = backend {
        let fields = BackendKind::parse(backend_type).map_or(&[][..], BackendKind::config_fields);
        let extra = backend
            .keys()
            .filter(|k| !k.eq_ignore_ascii_case("Type") && !known(k, fields));
        unread.extend(extra.map(|k| format!("Backend.{k}")));
    }
    unread
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unread_in(json: &str) -> Vec<String> {
        let Value::Object(config) = serde_json::from_str(json).unwrap() else {
            panic!("not an object");
        };
        let backend_type = config["Backend"]["Type"]
            .as_str()
            .unwrap_or("udp")
            .to_string();
        unread(&config, &backend_type)
    }

    #[test]
    fn every_field_twill_does_not_read_is_named() {
        assert_eq!(
            unread_in(
                r#"{"Network":"10.5.0.0/16","EnableNFTables":true,"Backend":{"Type":"vxlan","VNI":2,"GBP":true,"Learning":true,"MTU":1400,"directRouting":true}}"#
            ),
            Vec::<String>::new()
        );
        assert_eq!(
            unread_in(
                r#"{"network":"10.5.0.0/16","SubnetLength":24,"Backend":{"type":"udp","Port":8285,"VNI":1}}"#
            ),
            ["SubnetLength", "Backend.VNI"],
            "a misspelt field and another backend's"
        );
        assert_eq!(
            unread_in(
                r#"{"Network":"10.5.0.0/16","Backend":{"Type":"host-gw","DirectRouting":true}}"#
            ),
            ["Backend.DirectRouting"]
        );
    }
}
