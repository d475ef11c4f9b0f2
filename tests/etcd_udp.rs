//! twill nodes sharing a real etcd in flannel's schema, with the udp backend: leases, joins,
//! leaves, restarts and an etcd outage, with traffic checked end to end.

mod common;

use anyhow::{Context, Result};
use common::cluster::*;
use common::*;
use std::time::{Duration, Instant};

#[test]
fn two_nodes_get_distinct_flannel_leases_and_carry_traffic() -> Result<()> {
    let mut c = cluster("eudp", 2, UDP_CONFIG)?;
    let _nodes = [c.start(0)?, c.start(1)?];
    let (s0, s1) = (c.subnet(0)?, c.subnet(1)?);
    assert_ne!(s0, s1);
    let value = c
        .etcd
        .etcdctl(&["get", "--print-value-only", &c.lease_key(s0)])?;
    assert_eq!(
        value.trim(),
        r#"{"PublicIP":"10.200.0.1","PublicIPv6":null}"#
    );
    c.traffic_between_two_nodes()
}

#[test]
fn a_joining_node_is_routed_to_within_a_second_and_a_leaving_one_is_removed() -> Result<()> {
    let mut c = cluster("ejoin", 3, UDP_CONFIG)?;
    let _first = [c.start(0)?, c.start(1)?];
    let mut third = c.start(2)?;
    let joined = Instant::now();
    let s2 = c.subnet(2)?.to_string();
    while !engine_peer_subnets(&c.lab.host(0).ns)?.contains(&s2) {
        assert!(
            joined.elapsed() < Duration::from_secs(1),
            "not routed within 1 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    c.add_container(0)?;
    c.add_container(2)?;
    let out = ping(c.container(0), c.container(2).ip, 1)?;
    assert!(out.contains("1 received"), "{out}");
    // A clean shutdown keeps the lease, as flanneld's does; the lease going away removes it.
    third.stop()?;
    c.etcd.etcdctl(&["del", &c.lease_key(c.subnet(2)?)])?;
    // The engine's table, not the gate's leases: the backend takes the peer out just after.
    let host0 = &c.lab.host(0).ns;
    eventually("peer removed", || {
        Ok(!engine_peer_subnets(host0)?.contains(&s2))
    })?;
    let out = c
        .container(0)
        .ns
        .sh(&format!("ping -c 1 -W 2 {} || true", c.container(2).ip))?;
    assert!(
        out.contains("Destination Net Unreachable"),
        "{out}\nstatus: {}",
        status(host0)?
    );
    Ok(())
}

#[test]
fn a_restarted_node_keeps_its_subnet_even_after_kill_9() -> Result<()> {
    let c = cluster("ekeep", 2, UDP_CONFIG)?;
    let mut node = c.start(0)?;
    let before = c.subnet(0)?;
    node.stop()?;
    let mut node = c.start(0)?;
    assert_eq!(c.subnet(0)?, before);
    node.kill9();
    c.lab.host(0).ns.ip(&["link", "del", "twill0"]).ok();
    let _node = c.start(0)?;
    assert_eq!(c.subnet(0)?, before);
    Ok(())
}

#[test]
fn a_node_whose_tun_is_deleted_exits_with_the_reason_instead_of_running_on() -> Result<()> {
    let c = cluster("etundel", 2, UDP_CONFIG)?;
    let mut node = c.start(0)?;
    c.lab.host(0).ns.ip(&["link", "del", "twill0"])?;
    let stderr = node.failure_within(
        Duration::from_secs(10),
        "twill kept running without its TUN device",
    )?;
    anyhow::ensure!(
        stderr.contains("TUN device gone")
            && stderr
                .contains("the dataplane stopped forwarding: its thread 'twill tun0>udp' ended"),
        "{stderr}"
    );
    Ok(())
}

#[test]
fn a_node_whose_key_is_deleted_reacquires_it() -> Result<()> {
    let c = cluster("edel", 2, UDP_CONFIG)?;
    let _node = c.start(0)?;
    let key = c.lease_key(c.subnet(0)?);
    c.etcd.etcdctl(&["del", &key])?;
    eventually("lease re-acquired", || {
        Ok(!c
            .etcd
            .etcdctl(&["get", "--print-value-only", &key])?
            .trim()
            .is_empty())
    })
}

#[test]
fn a_node_whose_subnet_is_taken_over_stops_without_taking_another() -> Result<()> {
    let c = cluster("etaken", 2, UDP_CONFIG)?;
    let mut node = c.start(0)?;
    let key = c.lease_key(c.subnet(0)?);
    let intruder = r#"{"PublicIP":"10.200.0.99","PublicIPv6":null}"#;
    c.etcd.etcdctl(&["put", &key, intruder])?;
    let stderr = node.failure_within(
        Duration::from_secs(10),
        "twill kept running on a subnet another node holds",
    )?;
    anyhow::ensure!(
        stderr.contains("was taken over by the node at 10.200.0.99")
            && stderr.contains("twill stops instead of taking another subnet"),
        "{stderr}"
    );
    let leases = c.etcd.etcdctl(&[
        "get",
        "--prefix",
        "--print-value-only",
        &format!("{PREFIX}/subnets/"),
    ])?;
    anyhow::ensure!(
        leases.trim() == intruder,
        "a second lease was taken: {leases}"
    );
    Ok(())
}

#[test]
fn a_changed_network_config_is_reported_and_traffic_goes_on() -> Result<()> {
    let mut c = cluster("ecfg", 2, UDP_CONFIG)?;
    let nodes = [c.start(0)?, c.start(1)?];
    let changed = UDP_CONFIG.replace("udp", "vxlan");
    c.etcd
        .etcdctl(&["put", &format!("{PREFIX}/config"), &changed])?;
    eventually("restart_needed in twill status", || {
        let s = status(&c.lab.host(0).ns)?;
        Ok(s["restart_needed"]
            .as_str()
            .is_some_and(|why| why.contains(r#"Backend.Type "udp" -> "vxlan""#)))
    })?;
    anyhow::ensure!(
        nodes[0]
            .stderr()
            .contains("restart twill to apply the new one"),
        "{}",
        nodes[0].stderr()
    );
    c.traffic_between_two_nodes()
}

#[test]
fn traffic_survives_an_etcd_outage_and_the_watch_resyncs() -> Result<()> {
    let mut c = cluster("eout", 2, UDP_CONFIG)?;
    let _nodes = [c.start(0)?, c.start(1)?];
    c.add_container(0)?;
    c.add_container(1)?;
    eventually("peers known", || Ok(c.peer_subnets(0)?.len() == 1))?;
    let outage = Instant::now();
    c.etcd.stop()?;
    tcp_transfer_intact(c.container(0), c.container(1), 64 << 20)?;
    std::thread::sleep(Duration::from_secs(10).saturating_sub(outage.elapsed()));
    c.etcd.start()?;
    // A lease written after etcd returns must reach the node through the re-established watch.
    let unheld = c.put_unheld_lease(r#"{"PublicIP":"10.200.0.9","PublicIPv6":null}"#)?;
    let deadline = Instant::now() + Duration::from_secs(15);
    while !c.peer_subnets(0)?.contains(&unheld.to_string()) {
        assert!(Instant::now() < deadline, "watch did not resync");
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = ping(c.container(1), c.container(0).ip, 1)?;
    assert!(out.contains("1 received"), "{out}");
    Ok(())
}

#[test]
fn a_compaction_under_the_watch_is_recovered() -> Result<()> {
    let c = cluster("ecomp", 2, UDP_CONFIG)?;
    let _node = c.start(0)?;
    for i in 0..5 {
        c.etcd.etcdctl(&["put", "/unrelated", &i.to_string()])?;
    }
    let rev = c.etcd.etcdctl(&["get", "/unrelated", "-w", "json"])?;
    let rev: serde_json::Value = serde_json::from_str(&rev)?;
    let rev = rev["header"]["revision"].as_u64().context("revision")?;
    c.etcd.etcdctl(&["compact", &rev.to_string()])?;
    let unheld = c.put_unheld_lease(r#"{"PublicIP":"10.200.0.9","PublicIPv6":null}"#)?;
    eventually("lease seen after compaction", || {
        Ok(c.peer_subnets(0)?.contains(&unheld.to_string()))
    })
}

#[test]
fn an_invalid_config_is_one_clear_line_naming_the_field() -> Result<()> {
    let c = cluster("ebad", 2, r#"{"Network":"10.5.0.0/16","SubnetLen":33}"#)?;
    let last = c.failing_start(0)?;
    assert!(last.contains("SubnetLen"), "{last}");
    Ok(())
}

/// etcd answers the config read, then goes away before the lease is held: the acquisition
/// retries for as long as etcd is gone, and a stop signal must still end it (it once retried
/// forever, and systemd had to SIGKILL twill after its stop timeout).
#[test]
fn a_stop_while_acquiring_the_lease_ends_the_node() -> Result<()> {
    use twill_control::daemon::{self, NodeOptions};
    use twill_control::host::InterfaceChoice;
    use twill_control::registry::{EtcdOptions, EtcdRegistry};
    let mut c = cluster("eacqstop", 2, UDP_CONFIG)?;
    let endpoint = c.etcd.endpoint();
    let options = NodeOptions {
        interface: InterfaceChoice {
            ifaces: vec!["eth0".into()],
            ..InterfaceChoice::default()
        },
        subnet_file: c.subnet_file(1),
        status_addrs: Vec::new(),
        ..NodeOptions::default()
    };
    let etcd = &mut c.etcd;
    let outcome = c.lab.host(1).ns.enter(|| {
        let runtime = tokio::runtime::Runtime::new()?;
        runtime.block_on(async {
            let registry = EtcdRegistry::connect(EtcdOptions::new(&endpoint)).await?;
            etcd.stop()?;
            let stop = tokio::time::sleep(Duration::from_secs(2));
            let status = std::sync::Arc::new(twill_control::status::NodeStatus::new(false));
            let run = daemon::run(registry, options, status, stop);
            let started = Instant::now();
            let result = tokio::time::timeout(Duration::from_secs(20), run).await;
            anyhow::Ok((result, started.elapsed()))
        })
    });
    let (result, took) = outcome?;
    let result = result.context("the node ignored the stop while acquiring its lease")?;
    result.context("a stop is a clean exit")?;
    anyhow::ensure!(took < Duration::from_secs(10), "took {took:?} to stop");
    Ok(())
}
