//! A node where /proc/sys is read-only, as in a pod without privileges (kube-flannel.yml runs
//! flannel so): its devices are set up as on a host, over rtnetlink. The kernel makes no
//! link-local address on the TUN, on the eBPF dataplane's device or on the segmenter's ends
//! (its router solicitations and MLD reports there would only be dropped, and counted), and
//! the TUN takes in twill's own ICMP errors (accept_local). Without rtnetlink both were left
//! to /proc/sys, and a pod had neither. A link-local address an adopted device kept from an
//! older twill is removed.

mod common;

use anyhow::{ensure, Result};
use common::bpffs::EBPF;
use common::*;
use twill_lab::Netns;

const TUN: &[&str] = &["--backend", "udp", "--dataplane", "tun"];

/// `device` has no IPv6 address (no link-local one made by the kernel) and /proc/sys is
/// writable outside the node's mount namespace, where the test reads it.
fn no_ipv6_address(ns: &Netns, device: &str) -> Result<()> {
    let addresses = ns.ip(&["-6", "-o", "addr", "show", "dev", device])?;
    ensure!(addresses.trim().is_empty(), "{device} has {addresses}");
    Ok(())
}

/// Host 0's node could not write /proc/sys; that it really could not is checked from its log.
fn ran_read_only(pair: &Pair) -> Result<()> {
    let ns = &pair.host(0).ns;
    let own = ns.sh(&format!(
        "grep ' /proc/sys ' /proc/{}/mounts",
        pair.nodes[0].pid()
    ))?;
    ensure!(
        own.contains(" ro,"),
        "/proc/sys is not read-only to twill: {own}"
    );
    Ok(())
}

#[test]
fn a_tun_node_with_read_only_proc_sys_keeps_its_tun_quiet_and_accepts_local_sources() -> Result<()>
{
    let pair = start_pair_launched("rosystun", [TUN, TUN], [READ_ONLY_PROC_SYS, &[]], None)?;
    ran_read_only(&pair)?;
    let ns = &pair.host(0).ns;
    no_ipv6_address(ns, "twill0")?;
    let accept_local = ns.sh("cat /proc/sys/net/ipv4/conf/twill0/accept_local")?;
    ensure!(accept_local.trim() == "1", "accept_local {accept_local}");
    ping_both_ways_with_ttl_60(&pair)?;
    tcp_transfer_intact(pair.container(0), pair.container(1), 1 << 20)
}

/// The eBPF dataplane's device and the segmenter's ends, which outlive a node.
const EBPF_DEVICES: [&str; 3] = ["twill0", "twill0-segs", "twill0-segr"];

#[test]
fn an_ebpf_node_with_read_only_proc_sys_keeps_its_device_and_segmenter_quiet() -> Result<()> {
    let pair = start_pair_launched("rosysbpf", [EBPF, TUN], [READ_ONLY_PROC_SYS, &[]], None)?;
    ran_read_only(&pair)?;
    let ns = &pair.host(0).ns;
    for device in EBPF_DEVICES {
        no_ipv6_address(ns, device)?;
    }
    ping_both_ways_with_ttl_60(&pair)?;
    tcp_transfer_intact(pair.container(0), pair.container(1), 1 << 20)?;
    tcp_transfer_intact(pair.container(1), pair.container(0), 1 << 20)
}

/// A device made before twill stopped the kernel from making link-local addresses (by an
/// older twill) keeps the one it got; a restart that adopts the device and the segmenter takes
/// it off, in a pod too.
#[test]
fn an_ebpf_node_restarted_with_read_only_proc_sys_removes_link_local_addresses_left() -> Result<()>
{
    let mut pair = start_pair_launched("rosysll", [EBPF, TUN], [READ_ONLY_PROC_SYS, &[]], None)?;
    pair.nodes[0].stop()?;
    for device in EBPF_DEVICES {
        let ns = &pair.host(0).ns;
        ns.ip(&["-6", "addr", "add", "fe80::77/64", "dev", device])?;
    }
    pair.restart_launched(0, READ_ONLY_PROC_SYS, EBPF)?;
    ran_read_only(&pair)?;
    for device in EBPF_DEVICES {
        no_ipv6_address(&pair.host(0).ns, device)?;
    }
    ping_both_ways_with_ttl_60(&pair)?;
    tcp_transfer_intact(pair.container(0), pair.container(1), 1 << 20)
}
