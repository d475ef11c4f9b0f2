//! flannel's wireguard backend on a dual-stack network, two twill nodes through a real etcd on
//! a lab with an IPv4 and an IPv6 underlay. This kernel has no WireGuard, so twill's userspace
//! WireGuard carries both families: ping, ping6 and sha256-checked TCP over IPv4 and IPv6 both
//! ways, in each of flannel's modes, over the underlay the mode names; flanneld's leases byte
//! for byte; ICMPv6 errors for what cannot be forwarded; an IPv6 packet from outside its
//! sender's IPv6 subnet, sent through a real session, counted and not delivered; and what a
//! node refuses, in one line or as a refused lease with its reason.

mod common;

use anyhow::{ensure, Context, Result};
use common::cluster::{cluster, PREFIX};
use common::wireguard::{self as wg, PSK};
use common::*;
use std::net::IpAddr;

/// Both containers reach each other over both families, and TCP of each family arrives intact
/// both ways.
fn both_families_both_ways(w: &wg::Connected) -> Result<()> {
    let (a, b) = (w.c.container(0), w.c.container(1));
    for (from, to) in [(a, b), (b, a)] {
        let to6 = to.ipv6.context("a dual-stack container")?;
        for ip in [IpAddr::from(to.ip), IpAddr::from(to6)] {
            let out = ping(from, ip, 3)?;
            ensure!(out.contains("3 received"), "{ip}: {out}");
        }
        tcp_transfer_intact(from, to, 16 << 20)?;
        tcp_transfer6_intact(from, to, 16 << 20)?;
    }
    Ok(())
}

/// An IPv6 packet to an IPv6 subnet no lease holds is answered as a router would, from the
/// device's IPv6 address (the udp engine's ICMPv6 errors).
fn unleased_ipv6_gets_no_route(w: &wg::Connected) -> Result<()> {
    let own6 = w.c.subnet6(0)?.network();
    let out =
        w.c.container(0)
            .ns
            .sh("ping -c 1 -W 2 fd10:0:0:fe::1 || true")?;
    let want = format!("From {own6} icmp_seq=1 Destination unreachable: No route");
    ensure!(out.contains(&want), "{out}");
    Ok(())
}

/// Each node's lease is one key with both subnets and flanneld's dual-stack JSON.
fn leases_are_flanneds(w: &wg::Connected) -> Result<()> {
    let c = &w.c;
    for host in 0..2 {
        let subnet6 = c.subnet6(host)?;
        let key = format!(
            "{}&{}-{}",
            c.lease_key(c.subnet(host)?),
            subnet6.network(),
            subnet6.prefix_len()
        );
        let got = c.etcd.etcdctl(&["get", "--print-value-only", &key])?;
        let lab_host = c.lab.host(host);
        let public_ipv6 = lab_host.underlay_ipv6.context("an IPv6 underlay")?;
        let want =
            wg::dual_lease_value(lab_host.underlay_ip, public_ipv6, &wg::public_key(c, host)?);
        ensure!(got.trim() == want, "{key}:\n got  {got}\n want {want}");
    }
    Ok(())
}

/// The first WireGuard datagram host 1 receives while container 0 pings container 1 over
/// `family` ("-4" or "-6"): its IP version says which underlay carried it.
fn underlay_version(w: &wg::Connected, family: &str, filter: &str) -> Result<u8> {
    let to = w.c.container(1);
    let to = match family {
        "-6" => IpAddr::from(to.ipv6.context("dual-stack")?),
        _ => IpAddr::from(to.ip),
    };
    let packet = capture(w.ns(1), w.c.dir.path(), filter, || {
        let out = ping(w.c.container(0), to, 1)?;
        ensure!(out.contains("1 received"), "{out}");
        Ok(())
    })?;
    Ok(packet[0] >> 4)
}

#[test]
fn mode_ipv4_carries_both_families_over_the_ipv4_underlay() -> Result<()> {
    let w = wg::dual_connected("wgds4", "ipv4")?;
    leases_are_flanneds(&w)?;
    both_families_both_ways(&w)?;
    unleased_ipv6_gets_no_route(&w)?;
    // One device for both families, holding both lease addresses and both network routes.
    let host0 = w.ns(0);
    let link = host0.ip(&["-o", "addr", "show", "flannel-wg"])?;
    let own6 = w.c.subnet6(0)?.network();
    ensure!(link.contains(&format!("{own6}/128")), "{link}");
    let routes = host0.ip(&["-6", "route", "show", "fd10::/56"])?;
    ensure!(routes.contains("dev flannel-wg"), "{routes}");
    ensure!(host0.ip(&["link", "show", "flannel-wg-v6"]).is_err());
    let filter = "udp and dst port 51820 and greater 100";
    for family in ["-4", "-6"] {
        let version = underlay_version(&w, family, filter)?;
        ensure!(
            version == 4,
            "ping {family} crossed an IPv{version} underlay"
        );
    }
    Ok(())
}

/// A host's listening UDP sockets, as `ss` lists them (`addr:port`, IPv6 in brackets).
fn bound(w: &wg::Connected, host: usize) -> Result<String> {
    w.ns(host).exec("ss", &["-u", "-l", "-n", "-H"])
}

#[test]
fn mode_separate_carries_each_family_on_its_own_device_and_underlay() -> Result<()> {
    let w = wg::dual_connected("wgdssep", "separate")?;
    leases_are_flanneds(&w)?;
    both_families_both_ways(&w)?;
    unleased_ipv6_gets_no_route(&w)?;
    for host in 0..2 {
        let n = host + 1;
        let sockets = bound(&w, host)?;
        let want = [format!("10.200.0.{n}:51820"), "[::]:51821".to_string()];
        ensure!(
            want.iter().all(|s| sockets.contains(s)),
            "host {host}: {sockets}"
        );
    }
    // flannel-wg: IPv4 alone; flannel-wg-v6: the IPv6 /128 and route, and no IPv4 address.
    let host0 = w.ns(0);
    let (own, own6) = (w.c.subnet(0)?.network(), w.c.subnet6(0)?.network());
    let v4 = host0.ip(&["-o", "addr", "show", "flannel-wg"])?;
    ensure!(
        v4.contains(&format!("{own}/32")) && !v4.contains("inet6"),
        "{v4}"
    );
    let v6 = host0.ip(&["-o", "addr", "show", "flannel-wg-v6"])?;
    ensure!(
        v6.contains(&format!("{own6}/128")) && !v6.contains("inet "),
        "{v6}"
    );
    let routes = host0.ip(&["-6", "route", "show", "fd10::/56"])?;
    ensure!(routes.contains("dev flannel-wg-v6"), "{routes}");
    deleted_route_comes_back(host0, "fd10::/56", "flannel-wg-v6")?;
    let v4_version = underlay_version(&w, "-4", "udp and dst port 51820 and greater 100")?;
    let v6_version = underlay_version(&w, "-6", "udp and dst port 51821 and greater 100")?;
    ensure!(
        (v4_version, v6_version) == (4, 6),
        "{v4_version}, {v6_version}"
    );
    Ok(())
}

/// Pings of both families leave on port 51820 over the IPv6 underlay (captured).
fn both_families_cross_the_ipv6_underlay(w: &wg::Connected) -> Result<()> {
    let filter = "udp and dst port 51820 and greater 100";
    for family in ["-4", "-6"] {
        let version = underlay_version(w, family, filter)?;
        ensure!(
            version == 6,
            "ping {family} crossed an IPv{version} underlay"
        );
    }
    Ok(())
}

#[test]
fn mode_ipv6_carries_both_families_over_the_ipv6_underlay() -> Result<()> {
    let w = wg::dual_connected("wgds6", "ipv6")?;
    leases_are_flanneds(&w)?;
    both_families_both_ways(&w)?;
    for host in 0..2 {
        let sockets = bound(&w, host)?;
        let on_ipv6 = sockets.contains("[::]:51820");
        ensure!(
            on_ipv6 && !sockets.contains("10.200.0."),
            "host {host}: {sockets}"
        );
    }
    both_families_cross_the_ipv6_underlay(&w)
}

/// Mode auto reaches each peer over the underlay flannel's selectMode picks: with the lab's
/// private IPv4 addresses and, given by --public-ipv6, public-looking IPv6 ones
/// (2001:db8::/64) at both ends, IPv6. Its one device listens on both underlays.
#[test]
fn mode_auto_reaches_peers_over_the_underlay_flannel_picks() -> Result<()> {
    let mut c = common::cluster::dual_stack_cluster("wgdsauto", 2, &wg::dual_config("auto"))?;
    let mut nodes = Vec::new();
    for host in 0..2 {
        let public = format!("2001:db8::{}", host + 1);
        let ns = &c.lab.host(host).ns;
        ns.ip(&[
            "-6",
            "addr",
            "add",
            &format!("{public}/64"),
            "dev",
            "eth0",
            "nodad",
        ])?;
        let key_file = wg::key_file(&c, host);
        let key_file = key_file.to_str().context("key file path")?;
        let env = [("WIREGUARD_KEY_FILE", key_file)];
        nodes.push(c.start_with(host, &["--public-ipv6", &public], &env)?);
    }
    c.add_dual_stack_container(0)?;
    c.add_dual_stack_container(1)?;
    eventually("peers known", || {
        Ok(c.peer_subnets(0)?.len() == 1 && c.peer_subnets(1)?.len() == 1)
    })?;
    let w = wg::Connected { c, nodes };
    both_families_both_ways(&w)?;
    let sockets = bound(&w, 0)?;
    ensure!(
        sockets.contains("10.200.0.1:51820") && sockets.contains("[::]:51820"),
        "{sockets}"
    );
    both_families_cross_the_ipv6_underlay(&w)
}

/// Host 1 sends, through its real session with host 0 in Mode `mode`, IPv6 packets whose source
/// lies outside its IPv6 subnet (WireGuard checks sources where packets arrive, not where they
/// leave). Host 0 counts them `spoofed_source` and delivers none; host 1's own packets still
/// arrive.
fn spoofed_ipv6_is_counted_and_not_delivered(tag: &str, mode: &str) -> Result<()> {
    let w = wg::dual_connected(tag, mode)?;
    let (host0, host1) = (w.ns(0), w.ns(1));
    // Inside the IPv6Network (so host 1 routes it into its device), outside host 1's subnet.
    let outside = "fd10:0:0:ff::1";
    ensure!(!w
        .c
        .subnet6(1)?
        .contains(&outside.parse::<std::net::Ipv6Addr>()?));
    host1.ip(&["-6", "addr", "add", &format!("{outside}/128"), "dev", "lo"])?;
    let delivered = || -> Result<u64> {
        status(host0)?["counters"]["rx_packets"]
            .as_u64()
            .context("rx_packets")
    };
    let before = (drops(host0, "spoofed_source")?, delivered()?);
    let to = w.c.container(0).ipv6.context("dual-stack")?;
    let spoofed = format!("ping -6 -c 3 -i 0.2 -W 1 -I {outside} {to} || true");
    let out = host1.sh(&spoofed)?;
    ensure!(out.contains(" 0 received"), "{out}");
    eventually("spoofed packets counted", || {
        Ok(drops(host0, "spoofed_source")? >= before.0 + 3)
    })?;
    ensure!(
        delivered()? == before.1,
        "a spoofed packet reached container 0"
    );
    let out = ping(w.c.container(1), to, 2)?;
    ensure!(
        out.contains("2 received"),
        "the real session carries on: {out}"
    );
    Ok(())
}

#[test]
fn a_spoofed_ipv6_packet_over_the_ipv4_underlay_is_counted_and_not_delivered() -> Result<()> {
    spoofed_ipv6_is_counted_and_not_delivered("wgds6spoof", "ipv4")
}

/// The same through flannel-wg-v6, whose drops count in the node's one set of counters.
#[test]
fn a_spoofed_ipv6_packet_on_flannel_wg_v6_is_counted_and_not_delivered() -> Result<()> {
    spoofed_ipv6_is_counted_and_not_delivered("wgds6spsep", "separate")
}

/// What a node refuses to start with, each in one line: a dual-stack network on a node whose
/// interface has no IPv6 address (every mode: flanneld's rule too), Mode ipv6 on an IPv4-only
/// network, a Mode flannel has not, and a ListenPortV6 that is no port.
#[test]
fn configs_a_node_cannot_run_are_refused_in_one_line() -> Result<()> {
    let c = cluster("wgdsno", 2, &wg::dual_config("separate"))?;
    let refused = |config: &str, want: &str| -> Result<()> {
        c.etcd
            .etcdctl(&["put", &format!("{PREFIX}/config"), config])?;
        let last = c.failing_start(0)?;
        ensure!(last.contains(want), "{config}:\n{last}");
        Ok(())
    };
    refused(
        &wg::dual_config("separate"),
        "interface eth0 has no IPv6 address other hosts can reach",
    )?;
    refused(&wg::dual_config("ipv4"), "add one or give --public-ipv6")?;
    refused(
        &wg::config(PSK, r#","Mode":"ipv6""#),
        "Backend.Mode \"ipv6\" reaches every peer at its PublicIPv6, which only the leases of a \
         dual-stack network carry",
    )?;
    refused(
        &wg::config(PSK, r#","Mode":"both""#),
        "Backend.Mode \"both\" is not one of flannel's modes: give separate (the default), auto, \
         ipv4 or ipv6",
    )?;
    refused(
        &wg::config(PSK, r#","ListenPortV6":70000"#),
        "Backend.ListenPortV6 70000 is not a UDP port",
    )
}

/// A dual-stack lease without what the node's Mode (ipv6) needs of it is no peer: the lease
/// gate refuses it, status shows why, and the real peer carries on.
#[test]
fn a_dual_stack_lease_lacking_its_ipv6_data_is_refused_and_shown() -> Result<()> {
    let w = wg::dual_connected("wgdsbad", "ipv6")?;
    let c = &w.c;
    let generate = || twill_dataplane::engine::wireguard::PrivateKey::generate().public_key();
    let (key, other) = (generate().to_string(), generate().to_string());
    let full = wg::dual_lease_value("10.200.0.9".parse()?, "fd00:200::9".parse()?, &key);
    let cases = [
        (
            r#","BackendV6Data":{"PublicKey":"KEY","Port":51821}"#.replace("KEY", &key),
            String::new(),
            "it has an IPv6 subnet but no BackendV6Data.PublicKey, which flanneld writes on a \
             dual-stack network"
                .to_string(),
        ),
        (
            format!(r#""PublicKey":"{key}","Port":51821}}"#),
            format!(r#""PublicKey":"{other}","Port":51821}}"#),
            format!(
                "its BackendV6Data.PublicKey \"{other}\" is not its BackendData.PublicKey \
                 \"{key}\": flanneld writes its node's one key in both"
            ),
        ),
        (
            r#""PublicIPv6":"fd00:200::9""#.to_string(),
            r#""PublicIPv6":null"#.to_string(),
            "it has no PublicIPv6, and Mode ipv6 reaches peers over the IPv6 underlay".to_string(),
        ),
    ];
    let subnet = c.unheld_subnet()?;
    let lease_key = format!(
        "{}&fd10:0:0:{:x}::-64",
        c.lease_key(subnet),
        subnet.network().octets()[2]
    );
    for (from, to, reason) in cases {
        let forged = full.replace(&from, &to);
        ensure!(forged != full, "{from} not in {full}");
        c.etcd.etcdctl(&["put", &lease_key, &forged])?;
        eventually("the lease refused", || {
            let rejected = wg::rejected(w.ns(0))?;
            Ok(rejected.iter().any(|(_, why)| *why == reason))
        })?;
        ensure!(c.peer_subnets(0)?.len() == 1, "only the real peer");
    }
    let out = ping(
        c.container(0),
        c.container(1).ipv6.context("dual-stack")?,
        2,
    )?;
    ensure!(out.contains("2 received"), "{out}");
    Ok(())
}
