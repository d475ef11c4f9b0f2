//! twill nodes with flannel's wireguard backend through a real etcd. This kernel has no
//! WireGuard, so the userspace engine carries the traffic: ping and sha256-checked TCP both
//! ways, flannel's lease byte for byte, the key file kept across restarts, a new key re-keying
//! the peers, no key material in logs, status or metrics, and one peer's lease events leaving
//! the other peers' sessions alone.

mod common;

use anyhow::Result;
use common::wireguard::{self as wg, PSK};
use common::*;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;
use twill_dataplane::engine::wireguard::PrivateKey;
use twill_lab::Ipv4Net;

#[test]
fn two_nodes_carry_ping_and_tcp_both_ways_over_userspace_wireguard() -> Result<()> {
    let config = wg::config(PSK, "");
    let w = wg::connected("ewg", &config)?;
    let c = &w.c;
    let want = wg::lease_value(c.lab.host(0).underlay_ip, &wg::public_key(c, 0)?, wg::PORT);
    assert_eq!(wg::lease_of(c, 0)?, want);
    let stderr = w.nodes[0].stderr();
    assert!(
        stderr.contains("this kernel has no WireGuard (EOPNOTSUPP); twill's userspace WireGuard"),
        "{stderr}"
    );
    // flannel-wg, like the kernel's WireGuard device, leaves the TTL alone: 64 less one hop
    // into the tunnel on each host.
    let out = ping(c.container(0), c.container(1).ip, 3)?;
    assert!(
        out.contains("3 received") && out.contains("ttl=62"),
        "{out}"
    );
    let out = ping(c.container(1), c.container(0).ip, 3)?;
    assert!(out.contains("3 received"), "{out}");
    tcp_transfer_intact(c.container(0), c.container(1), 64 << 20)?;
    tcp_transfer_intact(c.container(1), c.container(0), 16 << 20)?;
    let status = status(w.ns(0))?;
    let tx = status["counters"]["peers"][0]["tx_bytes"]
        .as_u64()
        .unwrap_or(0);
    assert!(tx > 64 << 20, "peer tx counter {tx}: {status}");
    let link = w.ns(0).ip(&["-o", "addr", "show", "flannel-wg"])?;
    assert!(
        link.contains(&format!("{}/32", c.subnet(0)?.network())),
        "{link}"
    );
    let route = w.ns(0).ip(&["route", "show", "10.5.0.0/16"])?;
    assert!(route.contains("dev flannel-wg"), "{route}");
    Ok(())
}

#[test]
fn no_key_material_reaches_logs_status_or_metrics() -> Result<()> {
    let w = wg::connected("ewgkeys", &wg::config(PSK, ""))?;
    let secrets = [
        wg::private_key(&w.c, 0)?,
        wg::private_key(&w.c, 1)?,
        PSK.to_string(),
    ];
    for host in 0..2 {
        let shown = [
            w.nodes[host].stderr(),
            w.nodes[host].stdout(),
            status(w.ns(host))?.to_string(),
            wg::metrics(w.ns(host))?,
        ];
        assert!(shown[3].contains("twill_rx_packets_total"), "{}", shown[3]);
        for text in &shown {
            for secret in &secrets {
                assert!(
                    !text.contains(secret.as_str()),
                    "a key leaked into:\n{text}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn the_key_file_is_kept_across_restarts_and_a_new_key_rekeys_the_peers() -> Result<()> {
    let mut w = wg::connected("ewgkeep", &wg::config(PSK, ""))?;
    let file = wg::key_file(&w.c, 0);
    let mode = std::fs::metadata(&file)?.permissions().mode() & 0o777;
    assert_eq!(mode, 0o400, "{}", file.display());
    let lease = wg::lease_of(&w.c, 0)?;
    w.nodes[0].stop()?;
    w.nodes[0] = wg::start(&w.c, 0)?;
    assert_eq!(wg::lease_of(&w.c, 0)?, lease, "same key, same lease");
    // The restarted node learns its peer from etcd a moment after it is ready.
    eventually("traffic after the restart", || {
        Ok(w.try_ping(0, 1)?.contains("1 received"))
    })?;

    // Node 1 comes back with a new key: its lease changes, and node 0 must re-key to it.
    let old = wg::lease_of(&w.c, 1)?;
    w.nodes[1].stop()?;
    std::fs::remove_file(wg::key_file(&w.c, 1))?;
    w.nodes[1] = wg::start(&w.c, 1)?;
    // Its old subnet.env is there from the start, so "started" says nothing of the lease yet.
    eventually("node 1's lease with its new key", || {
        Ok(wg::lease_of(&w.c, 1)? != old)
    })?;
    let new = wg::lease_of(&w.c, 1)?;
    assert!(new.contains(&wg::public_key(&w.c, 1)?), "{new}");
    eventually("traffic on the new key", || {
        Ok(w.try_ping(0, 1)?.contains("1 received"))
    })?;
    tcp_transfer_intact(w.c.container(1), w.c.container(0), 8 << 20)
}

#[test]
fn a_lease_with_a_malformed_public_key_is_refused_with_one_warning() -> Result<()> {
    let w = wg::connected("ewgbadk", &wg::config(PSK, ""))?;
    let bad = wg::lease_value("10.200.0.9".parse()?, "c2hvcnQ=", wg::PORT);
    let unheld = w.c.put_unheld_lease(&bad)?;
    eventually("the lease refused", || {
        Ok(status(w.ns(0))?["rejected_leases"]
            .to_string()
            .contains(&unheld.to_string()))
    })?;
    let s = status(w.ns(0))?;
    let reason = s["rejected_leases"][0]["reason"]
        .as_str()
        .unwrap_or_default();
    let want =
        "its PublicKey \"c2hvcnQ=\" is not a WireGuard key: 5 bytes long, a WireGuard key has 32";
    assert_eq!(reason, want);
    // A reconcile (the lease put again unchanged) must not warn a second time.
    w.c.etcd.etcdctl(&["put", &w.c.lease_key(unheld), &bad])?;
    std::thread::sleep(std::time::Duration::from_millis(300));
    let warnings = w.nodes[0].stderr().matches("c2hvcnQ=").count();
    assert_eq!(warnings, 1, "{}", w.nodes[0].stderr());
    let out = ping(w.c.container(0), w.c.container(1).ip, 1)?;
    assert!(
        out.contains("1 received"),
        "the other peers carry on: {out}"
    );
    Ok(())
}

/// A lease added, changed (new key, new port) and removed for a third peer must leave the
/// session between the two real nodes as it is: host 0's underlay sees no handshake
/// initiation between them through it all, while each event for the third peer shows in the
/// initiations node 0 sends it.
#[test]
fn a_lease_event_for_one_peer_leaves_the_other_peers_session_alone() -> Result<()> {
    let w = wg::connected("ewgevent", &wg::config(PSK, ""))?;
    let c = &w.c;
    let (h0, h1) = (c.lab.host(0).underlay_ip, c.lab.host(1).underlay_ip);
    let taken = [c.subnet(0)?, c.subnet(1)?];
    let third: Ipv4Net = (200..=250)
        .map(|n| format!("10.5.{n}.0/24").parse())
        .find(|s| s.as_ref().is_ok_and(|s| !taken.contains(s)))
        .expect("a free /24")?;
    // The third node's PublicIP is a second address of host 1's, so that both nodes take it
    // as a peer; nothing listens there.
    let third_ip = Ipv4Addr::new(10, 200, 0, 77);
    c.lab
        .host(1)
        .ns
        .ip(&["addr", "add", &format!("{third_ip}/24"), "dev", "eth0"])?;
    let (key, lease_at) = (c.lease_key(third), |port: u16| {
        let public_key = PrivateKey::generate().public_key().to_string();
        wg::lease_value(third_ip, &public_key, port)
    });
    let behind_third = Ipv4Net::new(third.network(), 24)?
        .hosts()
        .nth(1)
        .expect("a host");
    // WireGuard's message type 1: a handshake initiation. A node that lost its session to the
    // other would send one at its next packet.
    let mut initiations = w
        .ns(0)
        .spawn("tcpdump", &["-i", "eth0", "-n", "-l", "udp and udp[8] = 1"])?;
    std::thread::sleep(Duration::from_millis(500));
    // Node 0 seals a packet for the third peer with what its lease says: an initiation to
    // its `port`.
    let third_is_at = |port: u16| -> Result<()> {
        let to = format!("{third_ip}.{port}: UDP");
        eventually_within(
            "an initiation to the third peer",
            Duration::from_secs(20),
            || {
                c.container(0)
                    .ns
                    .sh(&format!("ping -c 1 -W 1 {behind_third} || true"))?;
                Ok(initiations.stdout().contains(&to))
            },
        )
    };
    let known_to_both = |known: bool| -> Result<()> {
        eventually_within("the third lease", Duration::from_secs(20), || {
            let (a, b) = (c.peer_subnets(0)?, c.peer_subnets(1)?);
            let name = third.to_string();
            Ok(a.contains(&name) == known && b.contains(&name) == known)
        })
    };

    c.etcd.etcdctl(&["put", &key, &lease_at(51999)])?;
    known_to_both(true)?;
    anyhow::ensure!(w.try_ping(0, 2)?.contains("2 received"));
    third_is_at(51999)?;
    c.etcd.etcdctl(&["put", &key, &lease_at(51998)])?;
    third_is_at(51998)?;
    c.etcd.etcdctl(&["del", &key])?;
    known_to_both(false)?;

    for from in [0, 1] {
        let out = w.try_ping(from, 3)?;
        anyhow::ensure!(out.contains("3 received"), "{out}");
    }
    tcp_transfer_intact(c.container(0), c.container(1), 4 << 20)?;
    initiations.stop()?;
    let seen = initiations.stdout();
    let between_nodes = [
        format!("{h0}.{} > {h1}.{}:", wg::PORT, wg::PORT),
        format!("{h1}.{} > {h0}.{}:", wg::PORT, wg::PORT),
    ];
    let renewed: Vec<&str> = seen
        .lines()
        .filter(|l| between_nodes.iter().any(|b| l.contains(b.as_str())))
        .collect();
    assert!(
        renewed.is_empty(),
        "the nodes' session was renewed:\n{seen}"
    );
    Ok(())
}
