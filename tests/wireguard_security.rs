//! WireGuard's promises, on real nodes through etcd: a wrong key or a wrong preshared key
//! carries nothing, a replayed or changed datagram is dropped, the wire shows no plaintext, and
//! every refusal is counted.

mod common;

use anyhow::{Context, Result};
use common::wireguard::{self as wg, PSK};
use common::*;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::net::{Ipv4Addr, SocketAddrV4};
use twill_dataplane::engine::wireguard::PrivateKey;
use twill_lab::Netns;

#[test]
fn a_wrong_key_in_a_lease_carries_nothing_and_is_counted() -> Result<()> {
    let w = wg::connected("swkey", &wg::config(PSK, ""))?;
    let (key, real) = (w.c.lease_key(w.c.subnet(1)?), wg::lease_of(&w.c, 1)?);
    // Node 1's lease is rewritten with a key that is not its own; node 1 runs on.
    let impostor = PrivateKey::generate().public_key().to_string();
    let forged = wg::lease_value(w.c.lab.host(1).underlay_ip, &impostor, wg::PORT);
    w.c.etcd.etcdctl(&["put", &key, &forged])?;
    std::thread::sleep(std::time::Duration::from_millis(500));
    // Node 0's handshakes now go to the wrong key: node 1 refuses their MAC.
    let out = w.try_ping(0, 3)?;
    assert!(out.contains(" 0 received"), "{out}");
    eventually("bad_mac at node 1", || Ok(drops(w.ns(1), "bad_mac")? > 0))?;
    // Node 1's packets are for a session (and a key) node 0 no longer has.
    let out = w.try_ping(1, 3)?;
    assert!(out.contains(" 0 received"), "{out}");
    eventually("unknown_peer at node 0", || {
        Ok(drops(w.ns(0), "unknown_peer")? > 0)
    })?;
    // The real key back in the lease, and traffic flows again.
    w.c.etcd.etcdctl(&["put", &key, &real])?;
    eventually("traffic on the real key", || {
        Ok(w.try_ping(0, 1)?.contains(" 1 received"))
    })
}

#[test]
fn a_wrong_preshared_key_carries_nothing_and_is_counted() -> Result<()> {
    let (c, _nodes) = wg::mismatched_psk("swpsk")?;
    for (from, to) in [(0, 1), (1, 0)] {
        let target = c.container(to).ip.to_string();
        let out = c
            .container(from)
            .ns
            .sh(&format!("ping -c 3 -i 0.2 -W 1 {target} || true"))?;
        assert!(out.contains(" 0 received"), "{out}");
        // The preshared key enters the handshake response: the initiator can not open it.
        let ns = &c.lab.host(from).ns;
        eventually("bad_mac at the initiator", || Ok(drops(ns, "bad_mac")? > 0))?;
    }
    Ok(())
}

#[test]
fn a_replayed_or_changed_datagram_is_dropped_and_counted() -> Result<()> {
    let w = wg::connected("swreplay", &wg::config(PSK, ""))?;
    let (host0, host1) = (w.ns(0), w.ns(1));
    let marker = "7477696c6c2d7767"; // "twill-wg", repeated over the ping payload
    let to = w.c.container(1).ip.to_string();
    let packet = capture(
        host1,
        w.c.dir.path(),
        "udp and dst host 10.200.0.2 and dst port 51820 and greater 300",
        || {
            let out =
                w.c.container(0)
                    .ns
                    .exec("ping", &["-c", "1", "-s", "300", "-p", marker, &to])?;
            anyhow::ensure!(out.contains("1 received"), "{out}");
            Ok(())
        },
    )?;
    let mut packet = packet;
    let ihl = usize::from(packet[0] & 0x0f) * 4;
    // The capture may hold a checksum the sending veth left for offload to fill; 0 means none
    // in UDP over IPv4, and leaves the datagram's content as it was.
    packet[ihl + 6..ihl + 8].fill(0);
    let message = ihl + 8;
    assert_eq!(packet[message], 4, "a WireGuard data message");
    assert!(
        !packet.windows(8).any(|w| w == b"twill-wg"),
        "the payload crossed the underlay in clear"
    );
    let rx = || -> Result<u64> {
        status(host1)?["counters"]["rx_packets"]
            .as_u64()
            .context("rx_packets")
    };
    let delivered = rx()?;

    // The very datagram again, from the same source.
    send_raw(host0, &packet)?;
    eventually("replay counted", || Ok(drops(host1, "replay")? == 1))?;

    // Changed on the way: one bit of ciphertext. Its counter is moved ahead too, or it would be
    // turned away as a replay before its tag is checked.
    let mut changed = packet.clone();
    let counter = message + 8;
    let n = u64::from_le_bytes(changed[counter..counter + 8].try_into()?) + 1_000_000;
    changed[counter..counter + 8].copy_from_slice(&n.to_le_bytes());
    changed[message + 16 + 40] ^= 0x01;
    send_raw(host0, &changed)?;
    eventually("bad_mac counted", || Ok(drops(host1, "bad_mac")? == 1))?;
    assert_eq!(rx()?, delivered, "nothing of either reached the container");
    let out = ping(w.c.container(0), w.c.container(1).ip, 1)?;
    assert!(out.contains("1 received"), "the session survives: {out}");
    Ok(())
}

/// Send an IPv4 packet, header and all, as it is (a raw socket with IPPROTO_RAW).
fn send_raw(ns: &Netns, packet: &[u8]) -> Result<()> {
    let dst = Ipv4Addr::from(<[u8; 4]>::try_from(&packet[16..20])?);
    ns.enter(|| -> Result<()> {
        let socket = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(IPPROTO_RAW)))?;
        socket.send_to(packet, &SockAddr::from(SocketAddrV4::new(dst, 0)))?;
        Ok(())
    })
}

/// The caller supplies the IP header.
const IPPROTO_RAW: i32 = 255;
