//! The underlay interface and its addresses, chosen in a real network namespace as flanneld
//! chooses them: by `--iface` (names and addresses, in order), `--iface-regex`,
//! `--iface-can-reach`, else the default route; a dual-stack node's PublicIPv6 is an address
//! a peer can reach, never a link-local or deprecated one, and `--public-ipv6` first.

mod kernel_common;

use kernel_common::{Mode, Netns};
use std::net::{IpAddr, Ipv6Addr};
use twill_control::config::Config;
use twill_control::host::{Interface, InterfaceChoice};
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

fn on_eth0() -> InterfaceChoice {
    InterfaceChoice {
        ifaces: vec!["eth0".into()],
        ..InterfaceChoice::default()
    }
}

fn options(interface: InterfaceChoice, public_ipv6: Option<Ipv6Addr>) -> NodeOptions {
    NodeOptions {
        interface,
        public_ipv6,
        subnet_file: "/nonexistent/subnet.env".into(),
        status_addrs: Vec::new(),
        ..NodeOptions::default()
    }
}

/// `Node::resolve` in `ns` for `config`: the node's interface and PublicIPv6, or the error
/// as one line.
fn node_in(
    ns: &Netns,
    config: &str,
    interface: InterfaceChoice,
    public_ipv6: Option<Ipv6Addr>,
) -> Result<(Interface, Option<Ipv6Addr>), String> {
    let config = Config::from_json(config).unwrap();
    ns.block_on(move || async move {
        Node::resolve(
            options(interface, public_ipv6),
            config,
            Default::default(),
            Default::default(),
        )
        .await
        .map(|node| (node.iface, node.public_addrs.v6()))
        .map_err(|e| format!("{e:#}"))
    })
}

/// A dual-stack node on eth0: its PublicIPv6, or the error.
fn resolve(
    ns: &Netns,
    config: &str,
    public_ipv6: Option<Ipv6Addr>,
) -> Result<Option<Ipv6Addr>, String> {
    node_in(ns, config, on_eth0(), public_ipv6).map(|(_, v6)| v6)
}

#[test]
fn the_reachable_address_is_picked_not_a_link_local_or_deprecated_one() {
    let ns = host_with("v6pick", &["fe80::1/64", "fd00:200::5/64 preferred_lft 0"]);
    let err = resolve(&ns, DUAL, None).unwrap_err();
    assert!(
        err.contains("no IPv6 address other hosts can reach"),
        "{err}"
    );
    ns.sh("ip -6 addr add 2001:db8::7/64 dev eth0 nodad");
    assert_eq!(
        resolve(&ns, DUAL, None),
        Ok(Some("2001:db8::7".parse().unwrap()))
    );
    let gone = InterfaceChoice {
        ifaces: vec!["no-such-device".into()],
        ..InterfaceChoice::default()
    };
    let err = node_in(&ns, DUAL, gone, None).unwrap_err();
    assert!(
        err.contains("interface no-such-device does not exist"),
        "{err}"
    );
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

const V4: &str = r#"{"Network":"10.5.0.0/16"}"#;

/// A host with two links: eth0 (10.200.0.1/24, the lab's underlay) and mgmt
/// (192.168.7.1/24 and .9, which holds the default route), as a multi-homed host has.
fn multi_homed(test: &str) -> Netns {
    let ns = host_with(test, &[]);
    ns.sh("ip link add mgmt type veth peer name mgmt-peer && ip link set mgmt up");
    ns.sh("ip link set mgmt-peer up && ip addr add 192.168.7.1/24 dev mgmt");
    ns.sh("ip addr add 192.168.7.9/24 dev mgmt");
    ns.sh("ip route add default via 192.168.7.254 dev mgmt");
    ns
}

/// The interface name and IPv4 address `choice` gives on an IPv4 network, or the error.
fn chosen(ns: &Netns, choice: InterfaceChoice) -> Result<(String, String), String> {
    let (iface, _) = node_in(ns, V4, choice, None)?;
    let address = iface.address.map(|a| a.to_string()).unwrap_or_default();
    Ok((iface.name, address))
}

fn pair(name: &str, address: &str) -> Result<(String, String), String> {
    Ok((name.into(), address.into()))
}

#[test]
fn a_multi_homed_host_s_underlay_is_chosen_as_flanneld_chooses_it() {
    let ns = multi_homed("ifchoice");
    let choice = |ifaces: &[&str], regexes: &[&str], can_reach: Option<&str>| InterfaceChoice {
        ifaces: ifaces.iter().map(|s| s.to_string()).collect(),
        regexes: regexes.iter().map(|s| s.to_string()).collect(),
        can_reach: can_reach.map(|ip| ip.parse::<IpAddr>().unwrap()),
    };
    // Nothing named: the default route's interface and its first address.
    assert_eq!(
        chosen(&ns, choice(&[], &[], None)),
        pair("mgmt", "192.168.7.1")
    );
    // An address names its interface and is the address used.
    assert_eq!(
        chosen(&ns, choice(&["192.168.7.9"], &[], None)),
        pair("mgmt", "192.168.7.9")
    );
    // Each --iface in turn: the first that exists wins.
    let names = choice(&["wlan0", "10.9.9.9", "eth0", "mgmt"], &[], None);
    assert_eq!(chosen(&ns, names), pair("eth0", "10.200.0.1"));
    // A regex matches addresses first, then names; tried after every --iface.
    let by_address = choice(&["wlan0"], &[r"^10\.200\."], None);
    assert_eq!(chosen(&ns, by_address), pair("eth0", "10.200.0.1"));
    assert_eq!(
        chosen(&ns, choice(&[], &["^mgmt$"], None)),
        pair("mgmt", "192.168.7.1")
    );
    assert_eq!(
        chosen(&ns, choice(&[], &[r"\.7\.9$"], None)),
        pair("mgmt", "192.168.7.9")
    );
    // The interface the kernel routes an address by, with the route's source address.
    let reach = choice(&[], &["^nothing"], Some("10.200.0.2"));
    assert_eq!(chosen(&ns, reach), pair("eth0", "10.200.0.1"));
    assert_eq!(
        chosen(&ns, choice(&[], &[], Some("198.51.100.1"))),
        pair("mgmt", "192.168.7.1"),
        "by the default route"
    );
    let none = chosen(&ns, choice(&["wlan0"], &["^nothing"], None)).unwrap_err();
    for named in [
        "--iface wlan0",
        "--iface-regex ^nothing",
        "eth0 [10.200.0.1 ",
        "mgmt [192",
    ] {
        assert!(none.contains(named), "{named} not in: {none}");
    }
    assert!(!none.contains('\n'), "{none}");
}
