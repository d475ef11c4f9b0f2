//! flannel's rules in both of flanneld's modes, as flannel's own tools (and its e2e suite, in
//! e2e/rules.go) see them: nodes on real etcd, whose network config says the mode
//! (`"EnableNFTables": true`, else iptables), IPv4 and dual-stack, compared byte for byte with
//! what a real flanneld v0.28.9 left (tests/data/flanneld-v0.28.9, read as its README says);
//! flanneld's leftovers taken over, and a mode change across a restart leaving one set.

mod common;

use anyhow::{ensure, Result};
use common::cluster::*;
use common::rules::*;
use common::*;
use twill_lab::Netns;

const NETWORK: &str = "10.5.0.0/16";
const NETWORK6: &str = "fd10::/56";
const MASQ: &[&str] = &["--ip-masq", "--iptables-resync", "1"];

/// A host-gw network, dual-stack if `dual`, in nftables mode if `nftables`.
fn config(dual: bool, nftables: bool) -> String {
    let v6 = if dual {
        format!(r#","EnableIPv6":true,"IPv6Network":"{NETWORK6}""#)
    } else {
        String::new()
    };
    format!(
        r#"{{"Network":"{NETWORK}"{v6},"EnableNFTables":{nftables},"Backend":{{"Type":"host-gw"}}}}"#
    )
}

/// A lab of two hosts (the smallest there is), of which the tests run host 0's node alone.
fn one_node(tag: &str, dual: bool, nftables: bool) -> Result<Cluster> {
    let json = config(dual, nftables);
    if dual {
        dual_stack_cluster(tag, 2, &json)
    } else {
        cluster(tag, 2, &json)
    }
}

fn rules(c: &Cluster) -> Result<serde_json::Value> {
    Ok(status(&c.lab.host(0).ns)?["rules"].clone())
}

/// `nft list table ip6 flannel-ipv6` as flanneld leaves it on an IPv4-only network: the table
/// with its comment, no chain.
fn empty_table(family: &str, name: &str) -> String {
    format!("table {family} {name} {{\n\tcomment \"rules for {name}\"\n}}\n")
}

fn no_iptables_chains(ns: &Netns) -> Result<()> {
    for command in ["iptables", "ip6tables"] {
        let lines = flannel_iptables_lines(ns, command)?;
        ensure!(lines.is_empty(), "{command}: {lines:#?}");
    }
    Ok(())
}

fn no_flannel_tables(ns: &Netns) -> Result<()> {
    let tables = nft_tables(ns)?;
    let ours = ["flannel-ipv4", "flannel-ipv6", "twill-ipv4", "twill-ipv6"];
    let left: Vec<_> = tables
        .iter()
        .filter(|t| ours.iter().any(|o| t.ends_with(o)))
        .collect();
    ensure!(left.is_empty(), "{left:?}");
    Ok(())
}

#[test]
fn nftables_mode_writes_flanneld_s_tables_byte_for_byte() -> Result<()> {
    let c = one_node("fr-nft", false, true)?;
    let _node = c.start_with(0, MASQ, &[])?;
    let ns = &c.lab.host(0).ns;
    let subnet = c.subnet(0)?.to_string();
    let expected = recorded("nft-ipv4.txt", &subnet, NETWORK)?;
    ensure!(
        nft_text(ns, "ip", "flannel-ipv4")? == expected,
        "{}",
        nft_text(ns, "ip", "flannel-ipv4")?
    );
    let table = ns.exec("nft", &["list", "table", "ip", "flannel-ipv4"])?;
    ensure!(
        table.starts_with(
            "table ip flannel-ipv4 {\n\tcomment \"rules for flannel-ipv4\"\n\tchain postrtg {"
        ),
        "{table}"
    );
    // flanneld creates the IPv6 table whatever the network's families.
    let ip6 = ns.exec("nft", &["list", "table", "ip6", "flannel-ipv6"])?;
    ensure!(ip6 == empty_table("ip6", "flannel-ipv6"), "{ip6}");
    let r = rules(&c)?;
    ensure!(r["mode"] == "nftables" && r["in_place"] == true, "{r}");
    no_iptables_chains(ns)
}

/// Host 0 of a dual-stack network in either mode: both families' rules byte for byte, and
/// nothing of the other mode.
fn dual_stack_rules(tag: &str, nftables: bool) -> Result<()> {
    let c = one_node(tag, true, nftables)?;
    let _node = c.start_with(0, MASQ, &[])?;
    let ns = &c.lab.host(0).ns;
    let (subnet, subnet6) = (c.subnet(0)?.to_string(), c.subnet6(0)?.to_string());
    let (v4, v6) = if nftables {
        let v4 = nft_text(ns, "ip", "flannel-ipv4")?;
        (v4, nft_text(ns, "ip6", "flannel-ipv6")?)
    } else {
        (
            iptables_text(ns, "iptables")?,
            iptables_text(ns, "ip6tables")?,
        )
    };
    let files = if nftables {
        ["nft-ipv4.txt", "nft-ipv6.txt"]
    } else {
        ["iptables.txt", "ip6tables.txt"]
    };
    ensure!(v4 == recorded(files[0], &subnet, NETWORK)?, "{v4}");
    ensure!(v6 == recorded(files[1], &subnet6, NETWORK6)?, "{v6}");
    let places = rules(&c)?["places"].as_array().map(Vec::len);
    ensure!(places == Some(if nftables { 2 } else { 4 }), "{places:?}");
    if nftables {
        no_iptables_chains(ns)
    } else {
        no_flannel_tables(ns)
    }
}

#[test]
fn nftables_mode_on_a_dual_stack_network() -> Result<()> {
    dual_stack_rules("fr-nft6", true)
}

#[test]
fn iptables_mode_on_a_dual_stack_network() -> Result<()> {
    dual_stack_rules("fr-ipt6", false)
}

#[test]
fn nftables_mode_without_fully_random_and_checks_that_start_nothing() -> Result<()> {
    let c = one_node("fr-nftrand", false, true)?;
    let spies = Spies::new()?;
    let mut args = MASQ.to_vec();
    args.push("--ip-masq-fully-random-disable");
    let _node = c.start_with(0, &args, &[("PATH", &spies.path()?)])?;
    let ns = &c.lab.host(0).ns;
    let subnet = c.subnet(0)?.to_string();
    let expected = recorded("nft-ipv4.txt", &subnet, NETWORK)?.replace(" fully-random", "");
    ensure!(nft_text(ns, "ip", "flannel-ipv4")? == expected);

    // nftables mode writes and reads over netlink: it never runs nft; at start it only looked
    // for iptables leftovers.
    let ran = spies.ran();
    ensure!(ran.iter().all(|r| r.contains("-save")), "{ran:?}");
    let checks = || Ok::<_, anyhow::Error>(rules(&c)?["checks"].as_u64().unwrap_or(0));
    let from = checks()?;
    eventually_within("checks", std::time::Duration::from_secs(15), || {
        Ok(checks()? >= from + 3)
    })?;
    ns.exec("nft", &["delete", "table", "ip", "flannel-ipv4"])?;
    eventually("the table repaired", || {
        Ok(rules(&c)?["repairs"] == 1
            && nft_text(ns, "ip", "flannel-ipv4").ok() == Some(expected.clone()))
    })?;
    ensure!(spies.ran() == ran, "{:?}", spies.ran());
    Ok(())
}

/// A host where flanneld ran in both modes (and an earlier twill wrote its own table): twill
/// takes it over quietly and leaves one set of rules, its mode's; changing the mode across a
/// restart swaps one set for the other.
#[test]
fn flanneld_s_leftovers_and_a_mode_change_leave_one_set() -> Result<()> {
    let c = one_node("fr-switch", false, false)?;
    let ns = &c.lab.host(0).ns;
    let stale = "10.5.19.0/24";
    write_flanneld_iptables(ns, "iptables-restore", "iptables.txt", stale, NETWORK)?;
    write_flanneld_nft(ns, "nft-ipv4.txt", stale, NETWORK)?;
    write_flanneld_nft(ns, "nft-ipv6.txt", "fd10:0:0:3f::/64", NETWORK6)?;
    ns.exec("nft", &["add", "table", "ip", "twill-ipv4"])?;

    let mut node = c.start_with(0, MASQ, &[])?;
    let subnet = c.subnet(0)?.to_string();
    let iptables = recorded("iptables.txt", &subnet, NETWORK)?;
    ensure!(
        iptables_text(ns, "iptables")? == iptables,
        "{}",
        iptables_text(ns, "iptables")?
    );
    no_flannel_tables(ns)?;
    let log = node.stderr();
    ensure!(
        log.contains("removed the nftables table flannel's nftables mode wrote"),
        "{log}"
    );
    ensure!(
        log.contains("removed the nftables table an earlier twill wrote"),
        "{log}"
    );
    // Taken over quietly: info lines, no warning about flannel's rules.
    let about_rules = |l: &&str| ["flannel", "table", "chain"].iter().any(|w| l.contains(w));
    ensure!(
        !log.lines().filter(about_rules).any(|l| l.contains("WARN")),
        "{log}"
    );

    // To nftables mode: flanneld's iptables chains (now twill's) go, the tables come.
    node.stop()?;
    c.etcd
        .etcdctl(&["put", &format!("{PREFIX}/config"), &config(false, true)])?;
    let mut node = c.start_with(0, MASQ, &[])?;
    forwarding(&node)?;
    ensure!(c.subnet(0)?.to_string() == subnet, "the lease moved");
    ensure!(nft_text(ns, "ip", "flannel-ipv4")? == recorded("nft-ipv4.txt", &subnet, NETWORK)?);
    no_iptables_chains(ns)?;
    ensure!(
        node.stderr().contains("removed flannel's iptables chain"),
        "{}",
        node.stderr()
    );

    // And back.
    node.stop()?;
    c.etcd
        .etcdctl(&["put", &format!("{PREFIX}/config"), &config(false, false)])?;
    let node = c.start_with(0, MASQ, &[])?;
    forwarding(&node)?;
    ensure!(iptables_text(ns, "iptables")? == iptables);
    no_flannel_tables(ns)
}
