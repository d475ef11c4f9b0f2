//! Two hosts on a veth underlay, each running the programs with the other as its peer: ping
//! and TCP (sha256-checked) both ways between their containers, and on the wire exactly
//! flannel's udp: UDP 8285 to 8285 carrying the bare inner packet. Between eBPF nodes TCP
//! super-packets cross the veth whole; to a peer that reads datagrams they pass the segmenter
//! and leave one segment per frame; decapsulated at XDP, the inner TCP is coalesced by GRO.

mod common;

use anyhow::{ensure, Context, Result};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};
use twill_dataplane::stats::DropReason;
use twill_ebpf::{AttachMode, Ingress, Segmenter, Takes, XdpChoice};
use twill_lab::tcp_transfer_intact;

const MIB: usize = 1 << 20;

/// How a test's two nodes attach, decapsulate, and what each tells the other it takes.
struct Way {
    mode: AttachMode,
    xdp: XdpChoice,
    takes: Takes,
}

#[test]
fn over_tcx_super_packets_cross_the_veth_whole_between_ebpf_nodes() -> Result<()> {
    let way = Way {
        mode: AttachMode::Tcx,
        xdp: XdpChoice::Auto,
        takes: Takes::SuperPackets,
    };
    containers_talk_both_ways("ebpffwtx", way)
}

#[test]
fn over_classic_tc_with_xdp_containers_talk_over_flannels_udp_wire_in_both_directions() -> Result<()>
{
    let way = Way {
        mode: AttachMode::Tc,
        xdp: XdpChoice::On,
        takes: Takes::SuperPackets,
    };
    containers_talk_both_ways("ebpffwtc", way)
}

/// What goes to a peer that reads datagrams from a socket passes the segmenter: one segment
/// per frame on the wire, checksummed, as a NIC sends.
#[test]
fn to_peers_that_read_datagrams_the_segmenter_sends_one_segment_per_frame() -> Result<()> {
    let way = Way {
        mode: AttachMode::Auto,
        xdp: XdpChoice::Auto,
        takes: Takes::Datagrams,
    };
    containers_talk_both_ways("ebpffwsg", way)
}

fn containers_talk_both_ways(tag: &str, way: Way) -> Result<()> {
    let (lab, mut nodes) = common::lab_pair(tag, way.mode)?;
    for node in &mut nodes {
        node.attachment.xdp = way.xdp;
        node.takes = way.takes;
    }
    let dataplanes = common::open_pair(&lab, &nodes)?;
    let (a, b) = (&lab.host(0).containers()[0], &lab.host(1).containers()[0]);

    let dir = tempfile::tempdir()?;
    let pcap = dir.path().join("underlay.pcap");
    let path = pcap.to_str().context("pcap path")?;
    let host = &lab.host(0).ns;
    let mut tcpdump = host.spawn("tcpdump", &["-i", "eth0", "-n", "-U", "-w", path, "udp"])?;
    wait_for("tcpdump to capture", || pcap.exists())?;
    std::thread::sleep(Duration::from_millis(200));

    // 64 at the sender; each host forwards (-1) and each program routes (-1), as flanneld
    // decrements on send and on receive.
    assert_eq!(common::ping(&a.ns, b.ip, 3)?, vec![60; 3], "ping a -> b");
    assert_eq!(common::ping(&b.ns, a.ip, 3)?, vec![60; 3], "ping b -> a");
    std::thread::sleep(Duration::from_millis(200));
    tcpdump.stop()?;

    // Where the kernel refuses the XDP program, the node runs without it and says so.
    let at_xdp = way.xdp == XdpChoice::On && common::test_run::xdp_loads()?;
    for dataplane in &dataplanes {
        assert_eq!(
            dataplane.ingress() == Ingress::Xdp,
            at_xdp,
            "a veth takes native XDP"
        );
        let left_out = dataplane.left_out();
        assert_eq!(
            left_out.iter().any(|l| l.starts_with("XDP ingress: ")),
            way.xdp == XdpChoice::On && !at_xdp,
            "left out: {left_out:?}"
        );
    }
    let receiver = &lab.host(1).ns;
    let (frames, segments, delivered) = (
        host.device_counter("eth0", "tx_packets")?,
        dataplanes[1].counters()?.rx.packets,
        receiver.device_counter(&b.host_iface, "tx_packets")?,
    );
    tcp_transfer_intact(&a.ns, &b.ns, b.ip.into(), 4 * MIB)?;
    let frames = host.device_counter("eth0", "tx_packets")? - frames;
    let segments = dataplanes[1].counters()?.rx.packets - segments;
    let delivered = receiver.device_counter(&b.host_iface, "tx_packets")? - delivered;
    eprintln!(
        "4 MiB a -> b: {frames} underlay frames, {segments} segments in, {delivered} delivered"
    );
    match (at_xdp, way.takes) {
        // The receiver's XDP program makes its veth peer segment at transmit, as a NIC does:
        // one frame per segment on the wire. Decapsulated before GRO, the segments are
        // coalesced again: far fewer super-packets reach the container than segments came in.
        (true, _) => {
            ensure!(
                frames >= segments,
                "{segments} segments in {frames} frames: not split on the wire"
            );
            ensure!(
                delivered * 2 < segments,
                "{segments} segments delivered as {delivered}: GRO did not coalesce them"
            );
        }
        // Whole over the veth, and so to the container.
        (false, Takes::SuperPackets) => {
            ensure!(
                frames * 2 < segments,
                "{segments} segments in {frames} frames: super-packets were split"
            );
            ensure!(
                delivered * 2 < segments,
                "{segments} segments delivered as {delivered}: super-packets were split"
            );
        }
        // Through the segmenter: a frame per segment.
        (false, Takes::Datagrams) => ensure!(
            frames >= segments,
            "{segments} segments in {frames} frames: not split on the wire"
        ),
    }
    tcp_transfer_intact(&b.ns, &a.ns, a.ip.into(), 4 * MIB)?;

    // The 6 datagrams host 0 sent for the pings, every one checked (those it received were
    // decapsulated at XDP, before a capture sees them); tcpdump may miss the first few, never
    // most.
    let datagrams = flannel_datagrams(&std::fs::read(&pcap)?)?;
    ensure!(datagrams >= 3, "{datagrams} datagrams captured for 6 sent");

    for (i, dataplane) in dataplanes.iter().enumerate() {
        let counters = dataplane.counters()?;
        let peer = counters.peers[&nodes[1 - i].subnet];
        // 4 MiB each way plus the pings; super-packets count as their segments.
        for (what, traffic) in [("tx", peer.tx), ("rx", peer.rx)] {
            ensure!(
                traffic.bytes > 4 * MIB as u64,
                "host {i} {what}: {traffic:?}"
            );
        }
        assert_eq!(
            (counters.tx, counters.rx),
            (peer.tx, peer.rx),
            "host {i}: one peer"
        );
        for reason in [
            DropReason::UnknownPeer,
            DropReason::SpoofedSource,
            DropReason::Malformed,
            DropReason::NoRoute,
            DropReason::IoError,
        ] {
            assert_eq!(
                counters.drop_count(reason),
                0,
                "host {i}: {}",
                reason.as_str()
            );
        }
    }
    Ok(())
}

/// Checks every captured frame is flannel's udp wire between the two hosts, and counts them.
fn flannel_datagrams(file: &[u8]) -> Result<usize> {
    ensure!(file.len() >= 24, "pcap too short");
    let (mut at, mut count) = (24, 0);
    while at + 16 <= file.len() {
        let len = u32::from_le_bytes(file[at + 8..at + 12].try_into()?) as usize;
        let frame = file
            .get(at + 16..at + 16 + len)
            .context("frame cut short")?;
        at += 16 + len;
        check_wire(frame).with_context(|| format!("frame {count}: {frame:02x?}"))?;
        count += 1;
    }
    Ok(count)
}

fn check_wire(frame: &[u8]) -> Result<()> {
    let be16 = |b: &[u8], i: usize| usize::from(u16::from_be_bytes([b[i], b[i + 1]]));
    ensure!(be16(frame, 12) == 0x0800, "not IPv4");
    let outer = &frame[14..];
    ensure!(
        outer[0] == 0x45 && outer[9] == 17,
        "not a plain IPv4/UDP header"
    );
    ensure!(
        be16(outer, 6) == 0x4000,
        "outer flags/fragment {:#x}, not DF",
        be16(outer, 6)
    );
    let underlay = [Ipv4Addr::new(10, 200, 0, 1), Ipv4Addr::new(10, 200, 0, 2)];
    for addr in [&outer[12..16], &outer[16..20]] {
        let addr = Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3]);
        ensure!(underlay.contains(&addr), "outer address {addr}");
    }
    let udp = &outer[20..be16(outer, 2)];
    ensure!(be16(udp, 0) == 8285 && be16(udp, 2) == 8285, "ports");
    ensure!(
        be16(udp, 4) == udp.len(),
        "UDP length {} of {}",
        be16(udp, 4),
        udp.len()
    );
    let inner = &udp[8..];
    ensure!(inner[0] >> 4 == 4, "payload is not a bare IPv4 packet");
    ensure!(
        be16(inner, 2) == inner.len(),
        "inner length {}",
        be16(inner, 2)
    );
    ensure!(
        inner[12] == 10 && inner[13] == 5,
        "inner source outside 10.5.0.0/16"
    );
    Ok(())
}

fn wait_for(what: &str, done: impl Fn() -> bool) -> Result<()> {
    let start = Instant::now();
    while !done() {
        ensure!(
            start.elapsed() < Duration::from_secs(5),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// On a veth underlay a node makes its segmenter, a veth pair whose sending end checksums
/// (and so segments) in software, and runs twill_segmented at the other end; where no segmenter
/// is asked for (another underlay) none is made, and the underlay is left as it is. Where the
/// XDP program runs, GRO is on.
#[test]
fn a_veth_underlay_gets_a_segmenter_and_keeps_its_offloads() -> Result<()> {
    let (lab, mut nodes) = common::lab_pair("ebpfwire", AttachMode::Auto)?;
    nodes[1].attachment.segmenter = false;
    nodes[1].attachment.xdp = XdpChoice::On;
    let dataplanes = common::open_pair(&lab, &nodes)?;
    let segmenter = Segmenter::of(common::DEVICE);
    let shown = |i: usize, args: &[&str]| lab.host(i).ns.exec(args[0], &args[1..]);
    let send = shown(0, &["ethtool", "-k", &segmenter.send])?;
    ensure!(send.contains("tx-checksumming: off"), "{send}");
    // Checksumming turned on behind twill's back is noticed, and the reopen (the reconcile's
    // repair) turns it off again.
    shown(0, &["ethtool", "-K", &segmenter.send, "tx", "on"])?;
    ensure!(
        !lab.host(0).ns.enter(|| dataplanes[0].intact())?,
        "not noticed"
    );
    lab.host(0).ns.enter(|| dataplanes[0].reopen())?;
    let send = shown(0, &["ethtool", "-k", &segmenter.send])?;
    ensure!(send.contains("tx-checksumming: off"), "{send}");
    ensure!(
        lab.host(0).ns.enter(|| dataplanes[0].intact())?,
        "not put back"
    );
    let receive = shown(0, &["ip", "-d", "link", "show", &segmenter.receive])?;
    ensure!(
        receive.contains(&format!("{}@{}", segmenter.receive, segmenter.send)),
        "{receive}"
    );
    ensure!(
        shown(1, &["ip", "link", "show", &segmenter.send]).is_err(),
        "host 1 asked for no segmenter"
    );
    for (i, node) in nodes.iter().enumerate() {
        let underlay = shown(i, &["ethtool", "-k", &node.attachment.underlay])?;
        ensure!(
            underlay.contains("tx-checksumming: on"),
            "host {i}: {underlay}"
        );
    }
    let xdp_host = shown(1, &["ethtool", "-k", &nodes[1].attachment.underlay])?;
    ensure!(
        xdp_host.contains("generic-receive-offload: on"),
        "{xdp_host}"
    );
    Ok(())
}
