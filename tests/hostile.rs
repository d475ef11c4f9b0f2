//! The hostile-input suite: every class of bad input found by probing twill as an attacker
//! would, sent at running nodes. Each case checks three things: the daemon is alive, every drop
//! is counted under its reason (exactly), and legitimate traffic still passes, checked by sha256.
//! Floods are bounded in count and time. The IPv6 cases run on a dual-stack network
//! ([`common::hostile6`]).

mod common;

use anyhow::Result;
use common::cluster::*;
use common::hostile6::{self, fake_dual_stack_peer, ipv6_attack, Underlay};
use common::*;
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};
use twill_dataplane::wire::batch::BatchWriter;
use twill_dataplane::wire::chunk::{ChunkRepr, CHUNK_HEADER_LEN};
use twill_dataplane::wire::virtio::{GSO_TCPV4, GSO_UDP_L4};
use twill_lab::Netns;

/// A third, fake peer 10.5.3.0/24 at 10.200.0.3, on host 1's underlay; host 0 knows it.
const FAKE_PEER: &str = "10.5.3.0/24=10.200.0.3";
const FAKE_IP: &str = "10.200.0.3";
/// Datagrams in the junk flood from a stranger.
const FLOOD: u64 = 5_000;

/// What one attacker sends to host 0, and the drops it must cost there.
struct Attack {
    /// (datagram, sent from the fake peer's port rather than a stranger's)
    datagrams: Vec<(Vec<u8>, bool)>,
    expected: BTreeMap<&'static str, u64>,
    /// Where the junk flood is counted: the batch port checks its magic before the sender.
    flood_reason: &'static str,
}

/// Start a pair with the fake peer, send the attack from host 1's extra address, flood junk,
/// and check the counts, liveness and a clean transfer both ways.
fn survive(
    tag: &str,
    args: &[&str],
    port: u16,
    attack: impl FnOnce(&Pair) -> Attack,
) -> Result<()> {
    let pair = start_pair(tag, args, Some(FAKE_PEER))?;
    let (host_a, host_b) = (&pair.host(0).ns, &pair.host(1).ns);
    host_b.ip(&["addr", "add", &format!("{FAKE_IP}/24"), "dev", "eth0"])?;
    let target = SocketAddrV4::new(pair.host(0).underlay_ip, port);
    let Attack {
        datagrams,
        mut expected,
        flood_reason,
    } = attack(&pair);
    let before = udp_receive_errors(host_a)?;
    host_b.enter(|| -> Result<()> {
        let peer = UdpSocket::bind((FAKE_IP, port))?;
        let stranger = UdpSocket::bind((FAKE_IP, 40000))?;
        for (datagram, from_peer) in &datagrams {
            let socket = if *from_peer { &peer } else { &stranger };
            socket.send_to(datagram, target)?;
        }
        flood(&stranger, target)
    })?;
    // A flood that overflowed the receive buffer never reached twill: count what arrived.
    let overflowed = udp_receive_errors(host_a)? - before;
    *expected.entry(flood_reason).or_default() += FLOOD - overflowed;
    wait_for_drops(host_a, &expected)?;
    tcp_transfer_intact(pair.container(0), pair.container(1), 8 << 20)?;
    tcp_transfer_intact(pair.container(1), pair.container(0), 8 << 20)?;
    Ok(())
}

/// `FLOOD` junk datagrams in bursts, within two seconds.
fn flood(socket: &UdpSocket, target: SocketAddrV4) -> Result<()> {
    let start = Instant::now();
    for i in 0..FLOOD {
        socket.send_to(&i.to_be_bytes(), target)?;
        if i % 500 == 499 {
            std::thread::sleep(Duration::from_millis(5));
        }
        anyhow::ensure!(start.elapsed() < Duration::from_secs(10), "flood too slow");
    }
    Ok(())
}

/// The kernel's count of UDP datagrams it dropped for a full receive buffer, in `ns`.
fn udp_receive_errors(ns: &Netns) -> Result<u64> {
    twill_lab::snmp_udp(&ns.exec("cat", &["/proc/net/snmp"])?, "RcvbufErrors")
}

fn inner(src: [u8; 4], pair: &Pair) -> Vec<u8> {
    inner_packet(Ipv4Addr::from(src), pair.container(0).ip)
}

/// A well-formed IPv6 packet as a dual-stack flanneld peer's container would send one. The
/// network here is IPv4-only, so no peer has an IPv6 subnet and any IPv6 source is spoofed:
/// counted, never written to TUN, whatever its addresses.
fn ipv6_inner() -> Vec<u8> {
    let src = "fd10:0:0:3::9".parse().expect("address");
    hostile6::udp6(src, "fd10:0:0:1::2".parse().expect("address"), 5001, &[])
}

/// flannel's udp port: one datagram of each kind an attacker can send. The IPv6 inner packet is
/// read as IPv6 by the TUN engine and the eBPF programs alike: no peer has an IPv6 subnet here,
/// so its source is spoofed.
fn udp_port_attack(pair: &Pair) -> Attack {
    let good_from_fake = inner([10, 5, 3, 9], pair);
    let spoofed = inner([10, 5, 2, 9], pair);
    let mut truncated = good_from_fake.clone();
    truncated.truncate(12);
    let mut wrong_version = good_from_fake.clone();
    wrong_version[0] = 0x65;
    let mut bad_length = good_from_fake.clone();
    bad_length.extend_from_slice(&[0; 7]);
    let expected = BTreeMap::from([("spoofed_source", 2), ("malformed", 4), ("unknown_peer", 2)]);
    Attack {
        datagrams: vec![
            (spoofed, true),
            (truncated, true),
            (wrong_version, true),
            (bad_length, true),
            (Vec::new(), true),
            (ipv6_inner(), true),
            (Vec::new(), false),
            (good_from_fake, false),
        ],
        expected,
        flood_reason: "unknown_peer",
    }
}

#[test]
fn hostile_datagrams_on_the_udp_port_are_counted_and_change_nothing() -> Result<()> {
    survive("hudp", &["--backend", "udp"], 8285, udp_port_attack)
}

/// The same attack at a node whose udp wire runs in the eBPF programs: each datagram is
/// counted by the programs under the TUN engine's reasons, and shown the same way.
#[test]
fn hostile_datagrams_at_an_ebpf_node_are_counted_and_change_nothing() -> Result<()> {
    let ebpf = ["--backend", "udp", "--dataplane", "ebpf"];
    survive("hebpf", &ebpf, 8285, udp_port_attack)
}

#[test]
fn hostile_datagrams_on_the_batch_port_are_counted_and_change_nothing() -> Result<()> {
    survive("hbatch", &["--backend", "batch"], 8286, |pair| {
        let fake: ipnet::Ipv4Net = "10.5.3.0/24".parse().expect("subnet");
        let good = inner([10, 5, 3, 9], pair);
        let spoofed = inner([10, 5, 2, 9], pair);
        let mut mixed = batch_datagram(fake, &[&good, &spoofed]);
        // A record whose length runs past the end of the datagram.
        mixed.extend_from_slice(&[0, 100, 1, 2, 3]);
        let mut bad_magic = batch_datagram(fake, &[&good]);
        bad_magic[..4].copy_from_slice(b"TWLX");
        let mut bad_version = batch_datagram(fake, &[&good]);
        bad_version[4] = 3;
        let other: ipnet::Ipv4Net = "10.5.9.0/24".parse().expect("subnet");
        Attack {
            datagrams: vec![
                (bad_magic, true),
                (bad_version, true),
                (batch_datagram(other, &[&good]), true),
                (mixed, true),
                (chunk(fake, GSO_UDP_L4), true),
                (chunk(other, GSO_TCPV4), true),
                (Vec::new(), true),
                (vec![0x54], true),
                (batch_datagram(fake, &[&ipv6_inner()]), true),
                (batch_datagram(fake, &[&good]), false),
            ],
            expected: BTreeMap::from([
                ("bad_magic", 1),
                ("bad_version", 1),
                ("unknown_peer", 3),
                ("spoofed_source", 2),
                ("malformed", 4),
            ]),
            flood_reason: "bad_magic",
        }
    })
}

#[test]
fn hostile_ipv6_datagrams_on_the_udp_port_are_counted_and_never_delivered() -> Result<()> {
    udp_port_ipv6_attack("h6udp", Underlay::Ipv4)
}

#[test]
fn over_the_ipv6_underlay_hostile_udp_datagrams_are_counted_and_never_delivered() -> Result<()> {
    udp_port_ipv6_attack("h6udp6", Underlay::Ipv6)
}

#[test]
fn hostile_ipv6_records_on_the_batch_port_are_counted_and_never_delivered() -> Result<()> {
    batch_port_ipv6_attack("h6bat", Underlay::Ipv4)
}

#[test]
fn over_the_ipv6_underlay_hostile_batch_records_are_counted_and_never_delivered() -> Result<()> {
    batch_port_ipv6_attack("h6bat6", Underlay::Ipv6)
}

fn udp_port_ipv6_attack(tag: &str, underlay: Underlay) -> Result<()> {
    fake_dual_stack_peer(tag, "udp", "", underlay)?.attack_udp_port()
}

fn batch_port_ipv6_attack(tag: &str, underlay: Underlay) -> Result<()> {
    let batch = r#","BackendType":"twill-batch","BackendData":{"Port":8286,"Version":1}"#;
    let fake = fake_dual_stack_peer(tag, "twill-batch", batch, underlay)?;
    let packets = ipv6_attack(&fake)?;
    let records: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
    let other: ipnet::Ipv4Net = "10.5.250.0/24".parse()?;
    let datagrams = vec![
        (batch_datagram(fake.subnet, &records), true),
        (batch_datagram(fake.subnet, &[&packets[5]]), false),
        (batch_datagram(other, &[&packets[5]]), true),
    ];
    let expected = BTreeMap::from([("spoofed_source", 2), ("malformed", 3), ("unknown_peer", 2)]);
    fake.attack(8286, &datagrams, &expected, 1)
}

/// A batch datagram from `sender` carrying `packets`.
fn batch_datagram(sender: ipnet::Ipv4Net, packets: &[&[u8]]) -> Vec<u8> {
    let mut buf = vec![0u8; 1472];
    let mut writer = BatchWriter::new(&mut buf, sender);
    for packet in packets {
        assert!(writer.push(packet));
    }
    let len = writer.finish();
    buf.truncate(len);
    buf
}

/// The first chunk of a super-packet from `sender`, with a GSO type of the sender's choosing.
fn chunk(sender: ipnet::Ipv4Net, gso_type: u8) -> Vec<u8> {
    let mut wire = vec![0x45; CHUNK_HEADER_LEN + 100];
    ChunkRepr {
        sender,
        seq: 0,
        total: 1000,
        offset: 0,
        gso_size: 500,
        gso_type,
        stream: 0,
    }
    .emit(&mut wire);
    wire
}

/// The nodes draw their subnets below 10.5.200.0, where the bogus leases are written: a bogus
/// lease on a node's own key would take its lease over.
const VXLAN: &str =
    r#"{"Network":"10.5.0.0/16","SubnetMax":"10.5.199.0","Backend":{"Type":"vxlan"}}"#;

/// Leases that a buggy or hostile node could write, put next to two real vxlan nodes.
#[test]
fn corrupt_leases_in_etcd_never_touch_the_kernel() -> Result<()> {
    let mut c = cluster("hlease", 2, VXLAN)?;
    let _nodes = [c.start(0)?, c.start(1)?];
    eventually("peers known", || Ok(c.peer_subnets(0)?.len() == 1))?;
    let host0 = &c.lab.host(0).ns;
    let state = || -> Result<String> {
        let neigh = host0.ip(&["neigh", "show", "dev", "flannel.1"])?;
        let fdb = host0.exec("bridge", &["fdb", "show", "dev", "flannel.1"])?;
        let routes = host0.ip(&["route", "show", "root", "10.0.0.0/8"])?;
        Ok(format!("{neigh}{fdb}{routes}"))
    };
    let before = state()?;
    let real = c.subnet(1)?;
    let lease = |ip: &str, mac: &str| {
        format!(
            r#"{{"PublicIP":"{ip}","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"{mac}"}}}}"#
        )
    };
    let good_mac = "02:00:00:00:00:66";
    let key = |name: &str| format!("{PREFIX}/subnets/{name}");
    let shadow = key(&format!("{}-25", real.network()));
    let bogus = [
        (
            shadow.clone(),
            lease("10.200.0.66", good_mac),
            "prefix length /25",
        ),
        (
            key("10.5.200.0-24"),
            lease("10.200.0.66", "ff:ff:ff:ff:ff:ff"),
            "not a unicast address",
        ),
        (
            key("10.5.201.0-24"),
            lease("10.200.0.66", "00:00:00:00:00:00"),
            "not a unicast address",
        ),
        (
            key("10.9.0.0-24"),
            lease("10.200.0.66", good_mac),
            "outside the network",
        ),
        (
            key("10.5.203.0-24"),
            lease("10.200.0.1", good_mac),
            "is this node's own",
        ),
        (
            key("10.5.204.0-24"),
            lease("0.0.0.0", good_mac),
            "not a host address",
        ),
        (
            key("10.5.205.0-24"),
            "not json".to_string(),
            "invalid lease value",
        ),
        // A flanneld udp node in a vxlan network: not a peer, and listed with the reason.
        (
            key("10.5.206.0-24"),
            r#"{"PublicIP":"10.200.0.66","PublicIPv6":null}"#.to_string(),
            "backend type udp is not this node's vxlan",
        ),
    ];
    for (key, value, _) in &bogus {
        c.etcd.etcdctl(&["put", key, value])?;
    }
    eventually("every bogus lease refused in twill status", || {
        let rejected = status(host0)?["rejected_leases"].clone();
        let rejected = rejected.as_array().cloned().unwrap_or_default();
        Ok(bogus.iter().all(|(key, _, reason)| {
            rejected.iter().any(|r| {
                r["key"] == key.as_str() && r["reason"].as_str().is_some_and(|w| w.contains(reason))
            })
        }))
    })?;
    let metrics = http_get(host0, "127.0.0.1:9585", "/metrics")?;
    let counted = format!("\ntwill_rejected_leases {}\n", bogus.len());
    anyhow::ensure!(metrics.contains(&counted), "{metrics}");
    anyhow::ensure!(
        state()? == before,
        "kernel state changed:\n{before}\nvs\n{}",
        state()?
    );
    // The bogus lease that shadowed the real peer goes: the real peer is untouched, at once.
    c.etcd.etcdctl(&["del", &shadow])?;
    eventually("shadow gone from status", || {
        let s = status(host0)?;
        Ok(s["rejected_leases"]
            .as_array()
            .is_some_and(|r| r.len() == bogus.len() - 1))
    })?;
    anyhow::ensure!(state()? == before, "kernel state changed after the delete");
    c.traffic_between_two_nodes()
}

/// On either dataplane of the udp backend (one check serves both).
#[test]
fn a_config_with_port_0_is_refused_in_one_line() -> Result<()> {
    let c = cluster(
        "hport0",
        2,
        r#"{"Network":"10.5.0.0/16","Backend":{"Type":"udp","Port":0}}"#,
    )?;
    for dataplane in ["tun", "ebpf"] {
        let line = c.failing_start_with_env(0, &[("TWILL_DATAPLANE", dataplane)])?;
        anyhow::ensure!(
            line.contains("Backend.Port 0 is not a port peers can reach"),
            "{dataplane}: {line}"
        );
    }
    Ok(())
}
