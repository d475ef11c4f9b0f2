//! A dual-stack node's PublicIPv6 from its interface, read in a real network namespace: the
//! address a peer can reach, never a link-local or deprecated one, and `--public-ipv6` first.

mod kernel_common;

use kernel_common::{Mode, Netns};
use std::net::Ipv6Addr;
use twill_control::config::Config;
use twill_control::host::{self, InterfaceChoice};
use twill_control::node::{Node, NodeOptions};

const DUAL: &str = r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/48"}"#;

/// A namespace with `eth0` (one end of a veth pair, up, with an IPv4 address) and the IPv6
/// addresses `ip addr add` takes in `addresses`, each without duplicate detection.
fn host_with(test: &str, addresses: &[&str]) -> Netns {
    let ns = Netns::new(test, Mode::Nexthops);
    ns.sh("ip link add eth0 type veth peer name peer0 && ip addr add 10.200.0.1/24 dev eth0");
    ns.sh("ip link set eth0 up && ip link set peer0 up");
    for address in addresses {
        ns.sh(&format!("ip -6 addr add {address} dev eth0 nodad"));
    }
    ns
}

fn ipv6_of_eth0(ns: &Netns) -> Option<Ipv6Addr> {
    ns.block_on(|| async { host::ipv6_address("eth0").unwrap() })
}

fn options(public_ipv6: Option<Ipv6Addr>) -> NodeOptions {
    NodeOptions {
        interface: InterfaceChoice {
            ifaces: vec!["eth0".into()],
            ..InterfaceChoice::default()
        },
        public_ipv6,
        subnet_file: "/nonexistent/subnet.env".into(),
        status_addrs: Vec::new(),
        ..NodeOptions::default()
    }
}

/// `Node::resolve` in `ns` for `config`: the PublicIPv6, or the error as one line.
fn resolve(
    ns: &Netns,
    config: &str,
    public_ipv6: Option<Ipv6Addr>,
) -> Result<Option<Ipv6Addr>, String> {
    let config = Config::from_json(config).unwrap();
    ns.block_on(move || async move {
        Node::resolve(options(public_ipv6), config, Default::default())
            .map(|node| node.public_ipv6)
            .map_err(|e| format!("{e:#}"))
    })
}

#[test]
fn the_reachable_address_is_picked_not_a_link_local_or_deprecated_one() {
    let ns = host_with("v6pick", &["fe80::1/64", "fd00:200::5/64 preferred_lft 0"]);
    assert_eq!(ipv6_of_eth0(&ns), None, "link-local and deprecated only");
    ns.sh("ip -6 addr add 2001:db8::7/64 dev eth0 nodad");
    assert_eq!(ipv6_of_eth0(&ns), Some("2001:db8::7".parse().unwrap()));
    assert_eq!(host::ipv6_address("no-such-device").unwrap(), None);
}

#[test]
fn a_dual_stack_node_takes_public_ipv6_else_the_interfaces_address() {
    let ns = host_with("v6node", &["fd00:200::1/64"]);
    assert_eq!(
        resolve(&ns, DUAL, None),
        Ok(Some("fd00:200::1".parse().unwrap()))
    );
    let given: Ipv6Addr = "2001:db8::9".parse().unwrap();
    assert_eq!(resolve(&ns, DUAL, Some(given)), Ok(Some(given)));
    let v4_only = r#"{"Network":"10.5.0.0/16"}"#;
    assert_eq!(
        resolve(&ns, v4_only, Some(given)),
        Ok(None),
        "ignored, as flanneld does"
    );
}

#[test]
fn a_dual_stack_node_without_a_usable_ipv6_address_names_the_interface_and_the_flag() {
    let ns = host_with("v6none", &["fe80::1/64"]);
    assert_eq!(
        resolve(&ns, DUAL, None),
        Err(
            "the network config enables IPv6 (IPv6Network fd10::/48), but interface eth0 has \
             no IPv6 address other hosts can reach (global or unique-local, not deprecated): \
             add one or give --public-ipv6"
                .into()
        )
    );
    let v4_only = r#"{"Network":"10.5.0.0/16"}"#;
    assert_eq!(resolve(&ns, v4_only, None), Ok(None));
}
