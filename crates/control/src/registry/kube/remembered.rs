//! What this node's own Node keeps of it before the node starts, as flanneld reads it
//! (`GetStoredPublicIP`, `GetStoredMacAddresses`): the public addresses an operator put on the
//! Node (`node-public-ip`, `node-public-ipv6`), and the VtepMACs the node published before
//! (`backend-data`, `backend-v6-data`), which a vxlan device made again must take so that the
//! peers' fdb and neighbour entries stay right across a restart.

use super::annotations::Annotations;
use super::node_view::NodeView;
use super::{retry, KubeTiming};
use crate::host::netlink::MacAddr;
use crate::registry::Remembered;
use anyhow::Context;
use kube::Api;

/// Reads Node `name`; a Node that does not exist yet remembers nothing. Waits while the API
/// server is unreachable, as the rest of the start does.
pub(super) async fn read(
    nodes: &Api<NodeView>,
    name: &str,
    annotations: &Annotations,
    timing: &KubeTiming,
) -> anyhow::Result<Remembered> {
    let resource = format!("nodes/{name}");
    let node = retry(timing, "get", &resource, || nodes.get_opt(name)).await?;
    match node {
        Some(node) => remembered(&node, annotations).with_context(|| format!("Node {name}")),
        None => Ok(Remembered::default()),
    }
}

fn remembered(node: &NodeView, keys: &Annotations) -> anyhow::Result<Remembered> {
    Ok(Remembered {
        public_ip: address(node, &keys.node_public_ip, "an IPv4 address")?,
        public_ipv6: address(node, &keys.node_public_ipv6, "an IPv6 address")?,
        vtep_mac: vtep_mac(node, &keys.backend_data),
        vtep_mac_v6: vtep_mac(node, &keys.backend_v6_data),
    })
}

/// The address an annotation holds, if it is set.
fn address<T: std::str::FromStr>(
    node: &NodeView,
    key: &str,
    what: &str,
) -> anyhow::Result<Option<T>> {
    match node.annotation(key).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(text) => text
            .parse()
            .map(Some)
            .map_err(|_| anyhow::anyhow!("annotation {key} {} is not {what}", shown(text))),
    }
}

/// The VtepMAC of a `backend-data` annotation, when it holds a usable one (unicast, not zero);
/// anything else is not this node's device and is left for a new MAC.
fn vtep_mac(node: &NodeView, key: &str) -> Option<MacAddr> {
    let text = node.annotation(key)?;
    let data: serde_json::Value = serde_json::from_str(text).ok()?;
    let mac: MacAddr = data.get("VtepMAC")?.as_str()?.parse().ok()?;
    let usable = mac.0 != [0; 6] && mac.0[0] & 1 == 0;
    if !usable {
        tracing::info!(
            "annotation {key} holds VtepMAC {mac}, which no device can have; a new one is made"
        );
    }
    usable.then_some(mac)
}

/// An annotation's value in a log line: whatever its size, a bounded part of it.
fn shown(text: &str) -> String {
    const MAX: usize = 64;
    match text.char_indices().nth(MAX) {
        None => format!("{text:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes)", &text[..cut], text.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn node(annotations: &[(&str, &str)]) -> NodeView {
        let mut node = NodeView::default();
        let map: BTreeMap<String, String> = annotations
            .iter()
            .map(|(k, v)| (format!("flannel.alpha.coreos.com/{k}"), v.to_string()))
            .collect();
        node.metadata.annotations = Some(map);
        node
    }

    fn read(annotations: &[(&str, &str)]) -> anyhow::Result<Remembered> {
        remembered(
            &node(annotations),
            &Annotations::new("flannel.alpha.coreos.com").unwrap(),
        )
    }

    #[test]
    fn the_operator_s_addresses_and_the_published_macs_are_remembered() {
        let got = read(&[
            ("node-public-ip", "192.0.2.7"),
            ("node-public-ipv6", "2001:db8::7"),
            ("backend-data", r#"{"VNI":1,"VtepMAC":"d6:60:f1:85:5a:fc"}"#),
            (
                "backend-v6-data",
                r#"{"VNI":1,"VtepMAC":"01:00:5e:00:00:01"}"#,
            ),
        ])
        .unwrap();
        assert_eq!(got.public_ip, Some("192.0.2.7".parse().unwrap()));
        assert_eq!(got.public_ipv6, Some("2001:db8::7".parse().unwrap()));
        assert_eq!(got.vtep_mac, Some("d6:60:f1:85:5a:fc".parse().unwrap()));
        assert_eq!(got.vtep_mac_v6, None, "a multicast MAC is no device's");
        assert_eq!(read(&[]).unwrap(), Remembered::default());
        assert_eq!(
            read(&[("backend-data", "null")]).unwrap(),
            Remembered::default()
        );
    }

    #[test]
    fn a_bad_address_is_refused_naming_the_annotation_with_a_bounded_value() {
        let long = "x".repeat(200_000);
        let err = read(&[("node-public-ip", &long)]).unwrap_err().to_string();
        assert!(
            err.contains("flannel.alpha.coreos.com/node-public-ip"),
            "{err}"
        );
        assert!(err.len() < 300 && err.contains("200000 bytes"), "{err}");
        let err = read(&[("node-public-ipv6", "10.0.0.1x")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("node-public-ipv6"), "{err}");
    }
}
