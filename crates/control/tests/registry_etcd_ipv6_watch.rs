//! The lease watch and keeper on a dual-stack network against a real etcd: flanneld's
//! dual-stack leases read, peers' leases added and removed with their IPv6 subnets, and our own
//! lease renewed and re-acquired under the key of both its subnets.

mod common;

use common::{
    assert_reacquired_after_its_key_is_deleted, assert_renewed_under_its_key, ip, next_event,
    snapshot, start_with, Etcd, PREFIX, SECOND,
};
use std::net::Ipv6Addr;
use tokio::sync::mpsc::Receiver;
use twill_control::lease::LeaseEvent;
use twill_control::lease::{Lease, LeaseAttrs};

/// The nodes draw from 10.5.10.0 and fd10:0:0:10:: up, below what the tests write themselves.
const CONFIG: &str = r#"{"Network":"10.5.0.0/16","SubnetMin":"10.5.10.0","EnableIPv6":true,"IPv6Network":"fd10::/48","IPv6SubnetMin":"fd10:0:0:10::","Backend":{"Type":"vxlan"}}"#;

/// A dual-stack vxlan lease exactly as flanneld v0.28.9 writes it: the key of both subnets, and
/// BackendV6Data for its flannel-v6 device.
const FLANNELD_KEY: &str = "10.5.1.0-24&fd10:0:0:1::-64";
const FLANNELD_VALUE: &str = r#"{"PublicIP":"10.200.0.1","PublicIPv6":"fd00:200::9","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"d6:60:f1:85:5a:fc"},"BackendV6Data":{"VNI":1,"VtepMAC":"d6:60:f1:85:5a:fd"}}"#;

fn dual(last: u8) -> LeaseAttrs {
    let mac = format!("aa:aa:aa:aa:aa:{last:02x}");
    let ip6 = Ipv6Addr::new(0xfd00, 0x200, 0, 0, 0, 0, 0, last.into());
    LeaseAttrs::vxlan(ip(last), 1, &mac).with_ipv6(ip6, None)
}

async fn start(etcd: &Etcd, last: u8) -> (Lease, Receiver<LeaseEvent>) {
    start_with(etcd.options(), dual(last)).await.unwrap()
}

#[tokio::test]
async fn flanneld_dual_stack_leases_are_read_and_their_put_and_delete_reach_the_watcher() {
    let etcd = Etcd::start();
    etcd.put_config(CONFIG).await;
    let mut client = etcd.client().await;
    let key = format!("{PREFIX}/subnets/{FLANNELD_KEY}");
    client.put(key.clone(), FLANNELD_VALUE, None).await.unwrap();
    let (_, mut events) = start(&etcd, 1).await;

    let listed = snapshot(next_event(&mut events, 5 * SECOND).await);
    let [flanneld] = &listed[..] else {
        panic!("expected flanneld's lease alone, got {listed:?}");
    };
    assert_eq!(
        flanneld.subnets.v4().unwrap(),
        "10.5.1.0/24".parse().unwrap()
    );
    assert_eq!(
        flanneld.subnets.v6(),
        Some("fd10:0:0:1::/64".parse().unwrap())
    );
    assert_eq!(
        flanneld.public_addrs.v6(),
        Some("fd00:200::9".parse().unwrap())
    );
    let v6_data = flanneld.backend_v6_data.as_ref().expect("BackendV6Data");
    assert_eq!(v6_data.get("VtepMAC").unwrap(), "d6:60:f1:85:5a:fd");
    assert_eq!(
        flanneld.key(PREFIX),
        key,
        "read back to the key it lives at"
    );
    assert_eq!(
        flanneld.to_json(),
        FLANNELD_VALUE,
        "and to flanneld's bytes"
    );

    // Another one put while we watch, then the first deleted.
    let second_key = format!("{PREFIX}/subnets/10.5.2.0-24&fd10:0:0:2::-64");
    let second_value = FLANNELD_VALUE.replace("10.200.0.1", "10.200.0.2");
    client
        .put(second_key.clone(), second_value, None)
        .await
        .unwrap();
    let LeaseEvent::Added(added) = next_event(&mut events, 5 * SECOND).await else {
        panic!("expected Added");
    };
    assert_eq!(added.subnets.v6(), Some("fd10:0:0:2::/64".parse().unwrap()));
    assert_eq!(added.key(PREFIX), second_key);
    client.delete(key, None).await.unwrap();
    assert_eq!(
        next_event(&mut events, 5 * SECOND).await,
        LeaseEvent::Removed(flanneld.clone().into())
    );
    client.delete(second_key, None).await.unwrap();
    assert_eq!(
        next_event(&mut events, 5 * SECOND).await,
        LeaseEvent::Removed(added)
    );
}

#[tokio::test]
async fn dual_stack_peers_are_reported_with_their_ipv6_subnets() {
    let etcd = Etcd::start();
    etcd.put_config(CONFIG).await;
    let (a, mut a_events) = start(&etcd, 1).await;
    assert_eq!(snapshot(next_event(&mut a_events, 5 * SECOND).await), []);
    let (b, mut b_events) = start(&etcd, 2).await;
    assert!(b.subnets.v6().is_some());
    assert_eq!(
        next_event(&mut a_events, 5 * SECOND).await,
        LeaseEvent::Added(b.clone().into())
    );
    assert_eq!(snapshot(next_event(&mut b_events, 5 * SECOND).await), [a]);
    etcd.client()
        .await
        .delete(b.key(PREFIX), None)
        .await
        .unwrap();
    assert_eq!(
        next_event(&mut a_events, 5 * SECOND).await,
        LeaseEvent::Removed(b.into())
    );
}

#[tokio::test]
async fn a_dual_stack_lease_is_renewed_under_its_key() {
    let etcd = Etcd::start();
    etcd.put_config(CONFIG).await;
    assert_renewed_under_its_key(&etcd, dual(1), dual(2)).await;
}

#[tokio::test]
async fn a_deleted_dual_stack_key_is_reacquired_with_both_subnets() {
    let etcd = Etcd::start();
    etcd.put_config(CONFIG).await;
    let (a, mut events) = start(&etcd, 1).await;
    snapshot(next_event(&mut events, 5 * SECOND).await);
    assert!(a.subnets.v6().is_some(), "{a:?}");
    assert_reacquired_after_its_key_is_deleted(&etcd, &a, &mut events).await;
}

#[tokio::test]
async fn a_changed_ipv6_network_is_reported() {
    let etcd = Etcd::start();
    etcd.put_config(CONFIG).await;
    let (_, mut events) = start(&etcd, 1).await;
    snapshot(next_event(&mut events, 5 * SECOND).await);
    etcd.put_config(&CONFIG.replace("fd10:", "fd20:")).await;
    let event = next_event(&mut events, 5 * SECOND).await;
    let LeaseEvent::ConfigChanged(Some(what)) = event else {
        panic!("expected ConfigChanged, got {event:?}");
    };
    assert!(
        what.contains("IPv6Network fd10::/48 -> fd20::/48"),
        "{what}"
    );
    etcd.put_config(CONFIG).await;
    assert_eq!(
        next_event(&mut events, 5 * SECOND).await,
        LeaseEvent::ConfigChanged(None)
    );
}
