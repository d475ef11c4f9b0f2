//! Lease acquisition against a real etcd: flannel's order, and the races flanneld loses.

mod common;

use common::{get, ip, start_with, Etcd, Logs, PREFIX};
use ipnet::Ipv4Net;
use std::net::Ipv4Addr;
use twill_control::lease::LeaseEvent;
use twill_control::lease::{Lease, LeaseAttrs};

const CONFIG: &str = r#"{"Network":"10.5.0.0/16","Backend":{"Type":"host-gw"}}"#;

fn net(s: &str) -> Ipv4Net {
    s.parse().unwrap()
}

async fn start(etcd: &Etcd, attrs: LeaseAttrs) -> (Lease, tokio::sync::mpsc::Receiver<LeaseEvent>) {
    start_preferring(etcd, attrs, None).await.unwrap()
}

async fn start_preferring(
    etcd: &Etcd,
    attrs: LeaseAttrs,
    previous: Option<Ipv4Net>,
) -> anyhow::Result<(Lease, tokio::sync::mpsc::Receiver<LeaseEvent>)> {
    let mut opts = etcd.options();
    opts.previous_subnet = previous;
    start_with(opts, attrs).await
}

#[tokio::test]
async fn two_registries_get_distinct_leases_in_flannels_format() {
    let etcd = Etcd::start();
    etcd.put_config(CONFIG).await;
    let (a, _a_events) = start(&etcd, LeaseAttrs::host_gw(ip(1))).await;
    let (b, _b_events) = start(&etcd, LeaseAttrs::host_gw(ip(2))).await;
    assert_ne!(a.subnets.v4().unwrap(), b.subnets.v4().unwrap());
    for lease in [&a, &b] {
        assert_eq!(lease.subnets.v4().unwrap().prefix_len(), 24);
        assert!(
            net("10.5.0.0/16").contains(&lease.subnets.v4().unwrap())
                && lease.subnets.v4().unwrap() != net("10.5.0.0/24")
        );
        let key = format!(
            "{PREFIX}/subnets/{}-24",
            lease.subnets.v4().unwrap().network()
        );
        let (value, etcd_lease) = get(&mut etcd.client().await, &key)
            .await
            .expect("lease key written");
        let want = format!(
            r#"{{"PublicIP":"{}","PublicIPv6":null,"BackendType":"host-gw"}}"#,
            lease.public_addrs.v4().unwrap()
        );
        assert_eq!(value, want);
        let ttl = etcd
            .client()
            .await
            .lease_time_to_live(etcd_lease, None)
            .await
            .unwrap();
        assert!(
            ttl.ttl() > 50 && ttl.granted_ttl() == 60,
            "key must carry the configured TTL"
        );
    }
}

#[tokio::test]
async fn restarted_registry_keeps_its_subnet_with_a_fresh_ttl() {
    let etcd = Etcd::start();
    etcd.put_config(CONFIG).await;
    let (first, events) = start(&etcd, LeaseAttrs::vxlan(ip(1), 1, "aa:aa:aa:aa:aa:01")).await;
    let key = first.key(PREFIX);
    let (_, first_etcd_lease) = get(&mut etcd.client().await, &key).await.unwrap();
    drop(events);
    // Fill the network a little so that a fresh random pick would likely differ.
    let (_, _other) = start(&etcd, LeaseAttrs::host_gw(ip(2))).await;

    let (again, _events) = start(&etcd, LeaseAttrs::vxlan(ip(1), 1, "aa:aa:aa:aa:aa:02")).await;
    assert_eq!(again.subnets.v4().unwrap(), first.subnets.v4().unwrap());
    let (value, etcd_lease) = get(&mut etcd.client().await, &key).await.unwrap();
    assert_ne!(
        etcd_lease, first_etcd_lease,
        "a reused lease gets a new etcd lease (new TTL)"
    );
    assert!(
        value.contains("aa:aa:aa:aa:aa:02"),
        "reuse writes the new attributes: {value}"
    );
}

#[tokio::test]
async fn subnet_file_subnet_is_preferred_when_free() {
    let etcd = Etcd::start();
    etcd.put_config(CONFIG).await;
    let wanted = net("10.5.77.0/24");
    let (a, _a) = start_preferring(&etcd, LeaseAttrs::host_gw(ip(1)), Some(wanted))
        .await
        .unwrap();
    assert_eq!(a.subnets.v4().unwrap(), wanted);
    let (b, _b) = start_preferring(&etcd, LeaseAttrs::host_gw(ip(2)), Some(wanted))
        .await
        .unwrap();
    assert_ne!(
        b.subnets.v4().unwrap(),
        wanted,
        "a taken subnet-file subnet is not stolen"
    );
    let outside = net("10.9.1.0/24");
    let (c, _c) = start_preferring(&etcd, LeaseAttrs::host_gw(ip(3)), Some(outside))
        .await
        .unwrap();
    assert!(net("10.5.0.0/16").contains(&c.subnets.v4().unwrap()));
}

#[tokio::test]
async fn lease_of_our_ip_outside_the_config_is_replaced() {
    let etcd = Etcd::start();
    etcd.put_config(r#"{"Network":"10.5.0.0/16","SubnetMin":"10.5.10.0"}"#)
        .await;
    let mut client = etcd.client().await;
    let stale = format!("{PREFIX}/subnets/10.5.3.0-24");
    client
        .put(stale.clone(), LeaseAttrs::udp(ip(1)).to_json(), None)
        .await
        .unwrap();
    let (lease, _events) = start(&etcd, LeaseAttrs::udp(ip(1))).await;
    assert!(lease.subnets.v4().unwrap().network() >= "10.5.10.0".parse::<Ipv4Addr>().unwrap());
    assert_eq!(
        get(&mut client, &stale).await,
        None,
        "flannel deletes the incompatible lease"
    );
}

/// Two nodes that both prefer the same subnet and list at the same moment: one create txn
/// loses. flanneld exits there; twill must retry and end with two distinct leases.
#[tokio::test]
async fn lost_create_race_is_retried() {
    let etcd = Etcd::start();
    // Exactly two leasable subnets: 10.5.0.4/30 and 10.5.0.8/30.
    etcd.put_config(r#"{"Network":"10.5.0.0/28","SubnetLen":30,"SubnetMax":"10.5.0.8"}"#)
        .await;
    let (logs, _guard) = Logs::capture();
    let contested = net("10.5.0.4/30");
    let mut client = etcd.client().await;
    for round in 0..20 {
        let (a, b) = tokio::join!(
            start_preferring(&etcd, LeaseAttrs::udp(ip(1)), Some(contested)),
            start_preferring(&etcd, LeaseAttrs::udp(ip(2)), Some(contested)),
        );
        let (a, b) = (a.unwrap().0, b.unwrap().0);
        assert_ne!(
            a.subnets.v4().unwrap(),
            b.subnets.v4().unwrap(),
            "round {round}"
        );
        if logs.text().contains("lost the race for 10.5.0.4/30") {
            return;
        }
        let opts = etcd_client::DeleteOptions::new().with_prefix();
        client
            .delete(format!("{PREFIX}/subnets/"), Some(opts))
            .await
            .unwrap();
    }
    panic!(
        "the two acquirers never raced in 20 rounds; logs:\n{}",
        logs.text()
    );
}

#[tokio::test]
async fn with_one_free_subnet_one_contender_wins_and_the_other_says_why() {
    let etcd = Etcd::start();
    etcd.put_config(r#"{"Network":"10.5.0.0/28","SubnetLen":30,"SubnetMax":"10.5.0.4"}"#)
        .await;
    let (a, b) = tokio::join!(
        start_preferring(&etcd, LeaseAttrs::udp(ip(1)), None),
        start_preferring(&etcd, LeaseAttrs::udp(ip(2)), None),
    );
    let (won, lost) = match (a, b) {
        (Ok(w), Err(l)) | (Err(l), Ok(w)) => (w.0, l),
        (a, b) => panic!(
            "expected exactly one winner, got {:?} and {:?}",
            a.map(|x| x.0),
            b.map(|x| x.0)
        ),
    };
    assert_eq!(won.subnets.v4().unwrap(), net("10.5.0.4/30"));
    assert_eq!(
        lost.to_string(),
        "no free subnet left between SubnetMin 10.5.0.4 and SubnetMax 10.5.0.4 of network 10.5.0.0/28"
    );
}
