//! The flannel-udp dataplane on two lab hosts with static peers: real TUN devices, real
//! namespaces, real packets checked end to end.

mod common;

use anyhow::Result;
use common::*;
use std::net::UdpSocket;
use std::time::Duration;

fn pair(tag: &str, extra_peer: Option<&str>) -> Result<Pair> {
    start_pair(tag, &["--backend", "udp"], extra_peer)
}

#[test]
fn ping_both_ways_with_flannels_ttl() -> Result<()> {
    ping_both_ways_with_ttl_60(&pair("uping", None)?)
}

#[test]
fn udp_bursts_arrive_intact_coalesced_into_fewer_tun_writes() -> Result<()> {
    datagrams::udp_bursts_arrive_intact_in_fewer_tun_writes(&pair("uuso", None)?)
}

/// A full GSO train and a shorter packet after it, read from TUN in one drain: all must leave.
/// The run limit was once taken from the shorter packet's length, so 44 x 1472 + 1272 bytes
/// went to the kernel as one 66,040-byte send, refused whole (EMSGSIZE): 45 packets lost.
#[test]
fn a_full_train_and_a_shorter_packet_after_it_all_arrive() -> Result<()> {
    let pair = pair("utrain", None)?;
    let (a, b) = (pair.container(0), pair.container(1));
    let sending = pair.nodes[0].pid();
    // A burst first, so the TUN reader is in its busy mode, where a wake-up drains the queue.
    let warm_up = vec![100; 10];
    let arrived = while_stopped(sending, || {
        datagrams::exchange(a, b, 5004, &warm_up, |to| {
            datagrams::send_numbered(to, &warm_up)
        })
    })?;
    anyhow::ensure!(arrived == warm_up.len(), "warm-up: {arrived} arrived");
    let before = status(&pair.host(0).ns)?["counters"].clone();
    let mut lens = vec![1444; 44];
    lens.push(1272);
    let arrived = while_stopped(sending, || {
        datagrams::exchange(a, b, 5005, &lens, |to| datagrams::send_numbered(to, &lens))
    })?;
    let after = status(&pair.host(0).ns)?["counters"].clone();
    let delta = |key: &str| after[key].as_u64().unwrap_or(0) - before[key].as_u64().unwrap_or(0);
    let io_errors = after["drops"]["io_error"].as_u64().unwrap_or(0);
    anyhow::ensure!(
        arrived == lens.len() && io_errors == 0 && delta("tx_packets") == lens.len() as u64,
        "{arrived} of {} arrived, io_error {io_errors}, tx_packets +{}",
        lens.len(),
        delta("tx_packets")
    );
    Ok(())
}

/// Run `f` with the process stopped (SIGSTOP), so what it sends queues up in the TUN, and let
/// the process go on (SIGCONT) after a moment, while `f`'s receiver still waits.
fn while_stopped<T: Send>(pid: u32, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    use nix::sys::signal::{kill, Signal};
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    kill(pid, Signal::SIGSTOP)?;
    std::thread::scope(|s| {
        let resume = s.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            kill(pid, Signal::SIGCONT)
        });
        let result = f();
        resume.join().expect("resume thread")?;
        result
    })
}

#[test]
fn tcp_transfer_of_64_mib_arrives_intact() -> Result<()> {
    transfer_64_mib_intact(&pair("utcp", None)?)
}

#[test]
fn datagram_on_the_wire_is_the_bare_inner_packet_on_port_8285() -> Result<()> {
    let pair = pair("uwire", None)?;
    let (a, b) = (pair.container(0), pair.container(1));
    let host_b = &pair.lab.host(1).ns;
    let marker = b"twill-wire-format-check";
    let outer = capture(host_b, pair.dir.path(), "udp dst port 8285", || {
        a.ns.enter(|| -> Result<()> {
            let socket = UdpSocket::bind((a.ip, 40001))?;
            socket.send_to(marker, (b.ip, 40002))?;
            Ok(())
        })
    })?;
    assert_eq!(outer[9], 17, "outer protocol is UDP");
    let udp = &outer[20..];
    assert_eq!(u16::from_be_bytes([udp[0], udp[1]]), 8285, "source port");
    assert_eq!(
        u16::from_be_bytes([udp[2], udp[3]]),
        8285,
        "destination port"
    );
    let payload = &udp[8..usize::from(u16::from_be_bytes([udp[4], udp[5]]))];
    // The payload is exactly one IPv4 packet from container a to container b, nothing around it.
    assert_eq!(payload[0] >> 4, 4);
    assert_eq!(
        usize::from(u16::from_be_bytes([payload[2], payload[3]])),
        payload.len()
    );
    assert_eq!(&payload[12..16], &a.ip.octets());
    assert_eq!(&payload[16..20], &b.ip.octets());
    assert_eq!(&payload[payload.len() - marker.len()..], marker);
    Ok(())
}

#[test]
fn udp_buffer_and_tun_txqueuelen_flags_reach_the_kernel() -> Result<()> {
    let args = [
        "--backend",
        "udp",
        "--udp-buffer",
        "1048576",
        "--tun-txqueuelen",
        "777",
    ];
    let pair = start_pair("utune", &args, None)?;
    let host = &pair.host(0).ns;
    let link = host.sh("ip -o link show twill0")?;
    assert!(link.contains("qlen 777"), "{link}");
    // The kernel doubles a requested socket buffer for its own bookkeeping.
    let socket = host.sh("ss -uamnH 'sport = :8285'")?;
    assert!(
        socket.contains("rb2097152") && socket.contains("tb2097152"),
        "{socket}"
    );
    let out = ping(pair.container(0), pair.container(1).ip, 2)?;
    assert!(out.contains("2 received"), "{out}");
    Ok(())
}

#[test]
fn packets_to_unleased_subnets_get_net_unreachable() -> Result<()> {
    let pair = pair("uunre", None)?;
    let out = pair
        .container(0)
        .ns
        .sh("ping -c 1 -W 2 10.5.77.1 || true")?;
    assert!(out.contains("Destination Net Unreachable"), "{out}");
    assert!(drops(&pair.lab.host(0).ns, "no_route")? >= 1);
    Ok(())
}

#[test]
fn sigterm_removes_the_tun_device() -> Result<()> {
    let mut pair = pair("uterm", None)?;
    let host = &pair.lab.host(0).ns;
    assert!(host.ip(&["link", "show", "twill0"]).is_ok());
    let status = pair.nodes[0].stop()?;
    assert!(status.success(), "twill exited with {status}");
    assert!(
        host.ip(&["link", "show", "twill0"]).is_err(),
        "twill0 is still there"
    );
    Ok(())
}

#[test]
fn metrics_and_healthz_are_served() -> Result<()> {
    let pair = start_pair_with(
        "umetr",
        [&["--healthz-port", "8471", "--metrics-per-peer"], &[]],
        None,
    )?;
    let host = pair.host(0);
    let out = pair
        .container(0)
        .ns
        .sh("ping -c 1 -W 2 10.5.77.1 || true")?;
    assert!(out.contains("Unreachable"), "{out}");
    let metrics = http_get(&host.ns, "127.0.0.1:9585", "/metrics")?;
    assert!(
        metrics.contains("twill_drops_total{reason=\"no_route\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("twill_peer_packets_total{peer=\"10.5.2.0/24\""),
        "{metrics}"
    );
    assert!(metrics.contains("twill_table_peers 1"), "{metrics}");
    let bounded = http_get(&pair.host(1).ns, "127.0.0.1:9585", "/metrics")?;
    assert!(!bounded.contains("twill_peer_"), "{bounded}");
    assert!(bounded.contains("twill_tx_packets_total"), "{bounded}");
    let health = http_get(&host.ns, &format!("{}:8471", host.underlay_ip), "/healthz")?;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    Ok(())
}
