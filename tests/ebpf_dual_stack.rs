//! The eBPF dataplane on a dual-stack network, on real etcd in a lab with an IPv4 and an IPv6
//! underlay: IPv4 and IPv6 inner packets over the IPv4 underlay and over the IPv6 one
//! (`Backend.Underlay` "ipv6"), between two eBPF nodes (over tcx links and over classic TC) and
//! between an eBPF node and a TUN node, with the underlay's offloads left as the kernel sets
//! them; traffic checked by sha256 both ways. Hostile IPv6
//! datagrams counted under the userspace engine's reasons, and the device's IPv6 address and
//! route repaired as the TUN's are.

mod common;

use anyhow::{ensure, Context, Result};
use common::cluster::*;
use common::hostile6::{fake_dual_stack_peer_with, Underlay, FAKE_IPV6, FAKE_SUBNET6};
use common::*;
use std::collections::BTreeMap;
use std::net::{Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

/// A dual-stack udp network, datagrams over the IPv4 underlay (flannel's udp default).
const CONFIG: &str = r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/56","Backend":{"Type":"udp"}}"#;

/// The same over the IPv6 underlay.
const CONFIG_OVER_IPV6: &str = r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/56","Backend":{"Type":"udp","Underlay":"ipv6"}}"#;

/// twill's device, as the tests name it (`--tun-name`).
const DEVICE: &str = "twill0";

fn ebpf(attach: &'static str) -> [&'static str; 4] {
    ["--dataplane", "ebpf", "--bpf-attach", attach]
}

const TUN: [&str; 2] = ["--dataplane", "tun"];

/// Host `host` runs the eBPF dataplane with both networks routed to its device, which has the
/// lease's IPv6 network address, and counted the transfers of both families to and from its
/// peer (16 MiB each way at least: 8 of each family).
fn ebpf_carried_both_families(c: &Cluster, host: usize) -> Result<()> {
    let ns = &c.lab.host(host).ns;
    let s = status(ns)?;
    ensure!(s["dataplane"] == "ebpf", "not the eBPF dataplane: {s}");
    let peer = &s["counters"]["peers"][0];
    for field in ["tx_bytes", "rx_bytes"] {
        let bytes = peer[field].as_u64().unwrap_or(0);
        ensure!(
            bytes > 16 << 20,
            "peer {field} {bytes} below the 16 MiB sent: {s}"
        );
    }
    let routes = ns.ip(&["-6", "route", "show", "root", "fd10::/56"])?;
    ensure!(
        routes.contains(&format!("fd10::/56 dev {DEVICE}")),
        "{routes}"
    );
    let address = format!("{}/128", c.subnet6(host)?.network());
    let addresses = ns.ip(&["-6", "addr", "show", "dev", DEVICE])?;
    ensure!(addresses.contains(&address), "no {address}: {addresses}");
    ensure!(
        !addresses.contains("fe80"),
        "a link-local address: {addresses}"
    );
    Ok(())
}

/// Two eBPF nodes attached by `attach`, carrying both families to each other over the
/// `underlay`. Over the IPv6 one each reaches the other at its PublicIPv6, its device leaves
/// room for an outer IPv6 header, and every datagram each sends is IPv6 with a UDP checksum of
/// zero.
fn two_ebpf_nodes(tag: &str, attach: &'static str, underlay: Underlay) -> Result<()> {
    let over_ipv6 = underlay == Underlay::Ipv6;
    let config = if over_ipv6 { CONFIG_OVER_IPV6 } else { CONFIG };
    let mut c = dual_stack_cluster(tag, 2, config)?;
    let args = ebpf(attach);
    let _nodes = [c.start_with(0, &args, &[])?, c.start_with(1, &args, &[])?];
    let sent = transfers(&mut c)?;
    // Each node's lease says it takes super-packets: they cross the veth whole.
    ensure!(
        sent.frames * 2 < sent.segments,
        "{sent:?}: super-packets were split on the way to an eBPF peer"
    );
    for host in 0..2 {
        ebpf_carried_both_families(&c, host)?;
    }
    if over_ipv6 {
        for host in 0..2 {
            peers_reached_over_ipv6(&c, host)?;
            // The underlay's 1500 less an outer IPv6 and UDP header, as the TUN engine's.
            let link = c.lab.host(host).ns.ip(&["link", "show", DEVICE])?;
            ensure!(link.contains("mtu 1452 "), "{link}");
        }
        only_ipv6_datagrams(&c, [true, true])?;
    }
    c.nothing_dropped_but_the_kernels_own()?;
    the_far_node_answers_both_families(&c)
}

/// A TTL (hop limit) that runs out at the far node is answered from its own address, for both
/// families: the answer goes back out through the tunnel the packet it is about came in by,
/// over either underlay.
fn the_far_node_answers_both_families(c: &Cluster) -> Result<()> {
    let (a, b) = (c.container(0), c.container(1));
    let (far, far6) = (c.subnet(1)?.network(), c.subnet6(1)?.network());
    // TTL 3: host 0's kernel and twill each take one; host 1's twill has none to take.
    let out = a.ns.sh(&format!("ping -c 1 -W 2 -t 3 {} || true", b.ip))?;
    let want = format!("From {far} icmp_seq=1 Time to live exceeded");
    ensure!(out.contains(&want), "{out}");
    let to6 = b.ipv6.context("dual-stack container")?;
    let out = a.ns.sh(&format!("ping -c 1 -W 2 -t 3 {to6} || true"))?;
    let want = format!("From {far6} icmp_seq=1 Time exceeded: Hop limit");
    ensure!(out.contains(&want), "{out}");
    Ok(())
}

/// What host 0, an eBPF node, sent while its container sent 8 MiB of IPv4 TCP to host 1's.
#[derive(Debug)]
struct Sent {
    /// Frames out of its underlay.
    frames: u64,
    /// Packets its dataplane counted: a super-packet counts as its segments.
    segments: u64,
}

/// Host 0's underlay frames and its dataplane's transmitted packets, so far.
fn sent_so_far(c: &Cluster) -> Result<Sent> {
    let host = c.lab.host(0);
    // A super-packet is one.
    let frames = host.ns.device_counter(&host.iface, "tx_packets")?;
    let s = status(&host.ns)?;
    let segments = s["counters"]["tx_packets"].as_u64().context("tx_packets")?;
    Ok(Sent { frames, segments })
}

/// Both families both ways between the containers of the running nodes of `c`; what host 0
/// sent for the first transfer.
fn transfers(c: &mut Cluster) -> Result<Sent> {
    eventually("peers known", || {
        Ok(c.peer_subnets(0)?.len() == 1 && c.peer_subnets(1)?.len() == 1)
    })?;
    c.dual_stack_containers_ping_each_other()?;
    let (a, b) = (c.container(0), c.container(1));
    let before = sent_so_far(c)?;
    tcp_transfer_intact(a, b, 8 << 20)?;
    let after = sent_so_far(c)?;
    tcp_transfer_intact(b, a, 8 << 20)?;
    tcp_transfer6_intact(a, b, 8 << 20)?;
    tcp_transfer6_intact(b, a, 8 << 20)?;
    let sent = Sent {
        frames: after.frames - before.frames,
        segments: after.segments - before.segments,
    };
    eprintln!("8 MiB of IPv4 from host 0: {sent:?}");
    Ok(sent)
}

#[test]
fn over_tcx_two_ebpf_nodes_carry_both_families_over_the_ipv4_underlay() -> Result<()> {
    two_ebpf_nodes("eds4x", "tcx", Underlay::Ipv4)
}

#[test]
fn over_classic_tc_two_ebpf_nodes_carry_both_families_over_the_ipv4_underlay() -> Result<()> {
    two_ebpf_nodes("eds4c", "tc", Underlay::Ipv4)
}

/// Host `host`'s peer is reached at its PublicIPv6.
fn peers_reached_over_ipv6(c: &Cluster, host: usize) -> Result<()> {
    let s = status(&c.lab.host(host).ns)?;
    let endpoint = s["counters"]["peers"][0]["endpoint"]
        .as_str()
        .unwrap_or_default();
    let other = c
        .lab
        .host(1 - host)
        .underlay_ipv6
        .context("IPv6 underlay")?;
    ensure!(
        endpoint == format!("[{other}]:8285"),
        "host {host}'s peer at {endpoint}: {s}"
    );
    Ok(())
}

/// While the containers ping each other in both families, each host sends flannel's datagrams
/// over IPv6 only, with a UDP checksum of zero from an eBPF node (`ebpf[host]`), as the TUN
/// engine's socket never sends. Each host's capture counts what it sends: what it receives an
/// XDP program takes before any capture sees it.
fn only_ipv6_datagrams(c: &Cluster, ebpf: [bool; 2]) -> Result<()> {
    let mut captures = Vec::new();
    for host in 0..2 {
        let pcap = c.dir.path().join(format!("underlay{host}.pcap"));
        let path = pcap.to_str().context("path")?;
        let args = ["-i", "eth0", "-n", "-U", "-w", path, "udp port 8285"];
        let tcpdump = c.lab.host(host).ns.spawn("tcpdump", &args)?;
        eventually("tcpdump capturing", || Ok(pcap.exists()))?;
        captures.push((pcap, tcpdump));
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (a, b) = (c.container(0), c.container(1));
    for (from, to) in [(a, b), (b, a)] {
        ensure!(ping(from, to.ip, 3)?.contains("3 received"), "IPv4 ping");
        let to6 = to.ipv6.context("dual-stack container")?;
        ensure!(ping(from, to6, 3)?.contains("3 received"), "IPv6 ping");
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    for (host, (pcap, mut tcpdump)) in captures.into_iter().enumerate() {
        tcpdump.stop()?;
        let own = c
            .lab
            .host(host)
            .underlay_ipv6
            .context("IPv6 underlay")?
            .octets();
        let mut sent = 0;
        for frame in pcap_frames(&std::fs::read(&pcap)?)? {
            let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
            ensure!(
                ethertype == 0x86dd,
                "host {host}: a datagram not over IPv6, ethertype {ethertype:#06x}"
            );
            let ip = frame.get(14..14 + 48).context("IPv6 datagram cut short")?;
            if ip[8..24] != own {
                continue;
            }
            sent += 1;
            let checksum = u16::from_be_bytes([ip[46], ip[47]]);
            ensure!(
                (checksum == 0) == ebpf[host],
                "host {host} sent a UDP checksum of {checksum:#06x}"
            );
        }
        // 12 pings out or back; tcpdump may miss the first under load, never most.
        ensure!(sent >= 6, "host {host} sent {sent} datagrams over IPv6");
    }
    Ok(())
}

/// The frames of a pcap file (Ethernet, as tcpdump writes a veth's).
fn pcap_frames(file: &[u8]) -> Result<Vec<&[u8]>> {
    ensure!(file.len() >= 24, "pcap too short");
    let (mut at, mut frames) = (24, Vec::new());
    while at + 16 <= file.len() {
        let len = u32::from_le_bytes(file[at + 8..at + 12].try_into()?) as usize;
        let frame = file
            .get(at + 16..at + 16 + len)
            .context("frame cut short")?;
        ensure!(
            frame.len() >= 14,
            "a frame shorter than its Ethernet header"
        );
        frames.push(frame);
        at += 16 + len;
    }
    Ok(frames)
}

#[test]
fn over_tcx_two_ebpf_nodes_carry_both_families_over_the_ipv6_underlay() -> Result<()> {
    two_ebpf_nodes("eds6x", "tcx", Underlay::Ipv6)
}

#[test]
fn over_classic_tc_two_ebpf_nodes_carry_both_families_over_the_ipv6_underlay() -> Result<()> {
    two_ebpf_nodes("eds6c", "tc", Underlay::Ipv6)
}

/// Over the IPv6 underlay an eBPF node's datagrams (UDP checksum zero) reach a TUN node, whose
/// socket takes them (UDP_NO_CHECK6_RX), and the TUN node's reach the eBPF node.
#[test]
fn an_ebpf_node_and_a_tun_node_carry_both_families_over_the_ipv6_underlay() -> Result<()> {
    let mut c = dual_stack_cluster("eds6tun", 2, CONFIG_OVER_IPV6)?;
    let args = ebpf("auto");
    let _nodes = [c.start_with(0, &args, &[])?, c.start_with(1, &TUN, &[])?];
    through_the_segmenter(transfers(&mut c)?)?;
    ebpf_carried_both_families(&c, 0)?;
    peers_reached_over_ipv6(&c, 0)?;
    peers_reached_over_ipv6(&c, 1)?;
    let tun = status(&c.lab.host(1).ns)?;
    ensure!(tun["dataplane"] == "tun", "{tun}");
    only_ipv6_datagrams(&c, [true, false])?;
    c.nothing_dropped_but_the_kernels_own()
}

/// A TUN node's lease says nothing of super-packets: what the eBPF node sends it passes the
/// segmenter and leaves a segment per frame (a few more frames: pings, ARP).
fn through_the_segmenter(sent: Sent) -> Result<()> {
    ensure!(
        sent.frames >= sent.segments,
        "{sent:?}: super-packets reached a TUN peer whole"
    );
    Ok(())
}

/// flannel's wire is the same whichever dataplane carries it: an eBPF node and a TUN node
/// carry both families to each other, the veth between them as the kernel set it up.
#[test]
fn an_ebpf_node_and_a_tun_node_carry_both_families() -> Result<()> {
    let mut c = dual_stack_cluster("edstun", 2, CONFIG)?;
    let args = ebpf("auto");
    let _nodes = [c.start_with(0, &args, &[])?, c.start_with(1, &TUN, &[])?];
    through_the_segmenter(transfers(&mut c)?)?;
    ebpf_carried_both_families(&c, 0)?;
    let tun = status(&c.lab.host(1).ns)?;
    ensure!(tun["dataplane"] == "tun", "{tun}");
    c.nothing_dropped_but_the_kernels_own()
}

/// The hostile IPv6 datagrams the TUN engine counts (tests/hostile.rs), at an eBPF node: a
/// source outside the sending peer's IPv6 subnet is `spoofed_source`, a packet that is not one
/// well-formed IPv6 packet `malformed`, a stranger's port `unknown_peer`; only the good one
/// reaches the container.
#[test]
fn hostile_ipv6_datagrams_are_counted_by_the_ebpf_programs_and_never_delivered() -> Result<()> {
    hostile_ipv6_at_an_ebpf_node("eds6h", Underlay::Ipv4)
}

/// The same over the IPv6 underlay: the fake peer's datagrams come from its PublicIPv6.
#[test]
fn over_the_ipv6_underlay_hostile_ipv6_datagrams_are_counted_by_the_ebpf_programs() -> Result<()> {
    hostile_ipv6_at_an_ebpf_node("eds6h6", Underlay::Ipv6)
}

fn hostile_ipv6_at_an_ebpf_node(tag: &str, underlay: Underlay) -> Result<()> {
    let args = ebpf("auto");
    let fake = fake_dual_stack_peer_with(tag, "udp", "", underlay, &args)?;
    let s = status(&fake.cluster.lab.host(0).ns)?;
    ensure!(s["dataplane"] == "ebpf", "not the eBPF dataplane: {s}");
    fake.attack_udp_port()
}

/// Over the IPv6 underlay, a good datagram from the fake peer with a Destination Options
/// header before its UDP header: the programs do not walk extension headers and leave it to
/// the stack, which hands it to the node's socket on flannel's port. The node reads it and
/// counts it as malformed (once, nothing else), and leaves nothing in the socket's buffer.
#[test]
fn over_the_ipv6_underlay_a_datagram_with_extension_headers_is_counted_not_kept() -> Result<()> {
    let fake = fake_dual_stack_peer_with("eds6eh", "udp", "", Underlay::Ipv6, &ebpf("auto"))?;
    let host0 = fake.cluster.lab.host(0);
    let to = SocketAddr::new(host0.underlay_ipv6.context("IPv6 underlay")?.into(), 8285);
    let own = FAKE_SUBNET6.parse::<ipnet::Ipv6Net>()?.network();
    let packet = fake.packet_from(Ipv6Addr::from(u128::from(own) | 9));
    fake.cluster.lab.host(1).ns.enter(|| -> Result<()> {
        let socket = UdpSocket::bind((FAKE_IPV6.parse::<Ipv6Addr>()?, 8285))?;
        with_destination_options(&socket)?;
        socket.send_to(&packet, to)?;
        Ok(())
    })?;
    wait_for_drops(&host0.ns, &BTreeMap::from([("malformed", 1)]))?;
    let queued = host0.ns.sh("ss -uanH 'sport = :8285'")?;
    let recv_q = queued.split_whitespace().nth(1);
    ensure!(recv_q == Some("0"), "left in the socket: {queued}");
    Ok(())
}

/// Every datagram `socket` sends carries a Destination Options header (RFC 8200 4.6) of one
/// PadN option: 8 bytes, the next header filled in by the kernel.
fn with_destination_options(socket: &UdpSocket) -> Result<()> {
    let header: [u8; 8] = [0, 0, 1, 4, 0, 0, 0, 0];
    // SAFETY: the option value is `header`, read by the kernel for its length.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_DSTOPTS,
            header.as_ptr().cast(),
            header.len() as libc::socklen_t,
        )
    };
    ensure!(rc == 0, "IPV6_DSTOPTS: {}", std::io::Error::last_os_error());
    Ok(())
}

/// What the TUN's upkeep gives a dual-stack TUN, the eBPF device gets too: its IPv6 network
/// route and its IPv6 address, deleted, come back, and IPv6 flows again.
#[test]
fn the_ebpf_devices_ipv6_route_and_address_come_back_when_deleted() -> Result<()> {
    let mut c = dual_stack_cluster("eds6up", 2, CONFIG)?;
    let args = ebpf("auto");
    let _nodes = [c.start_with(0, &args, &[])?, c.start_with(1, &args, &[])?];
    eventually("peers known", || {
        Ok(c.peer_subnets(0)?.len() == 1 && c.peer_subnets(1)?.len() == 1)
    })?;
    c.add_dual_stack_container(0)?;
    c.add_dual_stack_container(1)?;
    let ns = &c.lab.host(0).ns;
    deleted_route_comes_back(ns, "fd10::/56", DEVICE)?;
    let own6 = format!("{}/128", c.subnet6(0)?.network());
    ns.ip(&["-6", "addr", "del", &own6, "dev", DEVICE])?;
    eventually("the address back", || {
        Ok(ns
            .ip(&["-6", "addr", "show", "dev", DEVICE])?
            .contains(&own6))
    })?;
    tcp_transfer6_intact(c.container(0), c.container(1), 1 << 20)?;
    tcp_transfer6_intact(c.container(1), c.container(0), 1 << 20)
}
