//! The lease watch and the lease keeper against a real etcd: peers coming and going, our own key
//! deleted, renewal, etcd going away and coming back, and history compaction.

mod common;

use common::{
    assert_reacquired_after_its_key_is_deleted, assert_renewed_under_its_key, get, ip, next_event,
    snapshot, start_with, wait_for, Etcd, Logs, PREFIX, SECOND,
};
use etcd_client::{CompactionOptions, GetOptions};
use futures::stream::{self, StreamExt};
use std::net::Ipv4Addr;
use tokio::sync::mpsc::Receiver;
use twill_control::lease::LeaseEvent;
use twill_control::lease::{Lease, LeaseAttrs};

/// The nodes draw their subnets below 10.5.200.0, where the tests write leases of their own.
const CONFIG: &str =
    r#"{"Network":"10.5.0.0/16","SubnetMax":"10.5.199.0","Backend":{"Type":"vxlan"}}"#;

async fn start(etcd: &Etcd, last: u8) -> (Lease, Receiver<LeaseEvent>) {
    let mac = format!("aa:aa:aa:aa:aa:{last:02x}");
    start_with(etcd.options(), LeaseAttrs::vxlan(ip(last), 1, &mac))
        .await
        .unwrap()
}

#[tokio::test]
async fn peers_are_reported_and_our_own_lease_is_not() {
    let etcd = Etcd::start();
    etcd.put_config(CONFIG).await;
    let (a, mut a_events) = start(&etcd, 1).await;
    assert_eq!(
        snapshot(next_event(&mut a_events, 5 * SECOND).await),
        vec![]
    );

    let (b, mut b_events) = start(&etcd, 2).await;
    assert_eq!(
        next_event(&mut a_events, 5 * SECOND).await,
        LeaseEvent::Added(b.clone().into())
    );
    assert_eq!(
        snapshot(next_event(&mut b_events, 5 * SECOND).await),
        vec![a.clone()]
    );

    // A lease exactly as flanneld writes it (reference/flannel.md) is understood.
    let flanneld = r#"{"PublicIP":"10.200.0.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"d6:60:f1:85:5a:fc"}}"#;
    let key = format!("{PREFIX}/subnets/10.5.200.0-24");
    let mut client = etcd.client().await;
    client.put(key.clone(), flanneld, None).await.unwrap();
    let added = match next_event(&mut a_events, 5 * SECOND).await {
        LeaseEvent::Added(lease) => lease,
        other => panic!("expected Added, got {other:?}"),
    };
    assert_eq!(
        added.subnets.v4().unwrap(),
        "10.5.200.0/24".parse().unwrap()
    );
    assert_eq!(
        added.backend_data.as_ref().unwrap().get("VtepMAC").unwrap(),
        "d6:60:f1:85:5a:fc"
    );

    client.delete(key, None).await.unwrap();
    assert_eq!(
        next_event(&mut a_events, 5 * SECOND).await,
        LeaseEvent::Removed(added)
    );
}

#[tokio::test]
async fn deleted_own_key_is_reacquired_with_the_same_subnet() {
    let etcd = Etcd::start();
    etcd.put_config(CONFIG).await;
    let (a, mut events) = start(&etcd, 1).await;
    snapshot(next_event(&mut events, 5 * SECOND).await);
    assert_reacquired_after_its_key_is_deleted(&etcd, &a, &mut events).await;
}

#[tokio::test]
async fn own_subnet_taken_by_another_node_is_reported_and_no_other_subnet_is_taken() {
    let etcd = Etcd::start();
    etcd.put_config(CONFIG).await;
    let (a, mut events) = start(&etcd, 1).await;
    snapshot(next_event(&mut events, 5 * SECOND).await);
    let intruder = Lease::new(a.subnets.v4().unwrap(), LeaseAttrs::host_gw(ip(9)));
    let mut client = etcd.client().await;
    client
        .put(a.key(PREFIX), intruder.to_json(), None)
        .await
        .unwrap();

    let event = wait_for(&mut events, 5 * SECOND, |e| {
        matches!(e, LeaseEvent::OwnLeaseTaken(_) | LeaseEvent::OwnLease(_))
    })
    .await;
    assert_eq!(event, LeaseEvent::OwnLeaseTaken(intruder.clone()));
    // Give a wrong re-acquisition time to happen: the intruder's key stays the only one.
    tokio::time::sleep(SECOND).await;
    let leases = client
        .get(
            format!("{PREFIX}/subnets/"),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let values: Vec<&str> = leases
        .kvs()
        .iter()
        .map(|kv| kv.value_str().unwrap())
        .collect();
    assert_eq!(values, [intruder.to_json()]);
}

#[tokio::test]
async fn a_changed_config_is_reported_once_and_again_when_it_is_back() {
    let etcd = Etcd::start();
    etcd.put_config(CONFIG).await;
    let (_, mut events) = start(&etcd, 1).await;
    snapshot(next_event(&mut events, 5 * SECOND).await);
    let changed = CONFIG.replace("10.5.", "10.6.");
    let mut client = etcd.client().await;
    let key = format!("{PREFIX}/config");
    client
        .put(key.clone(), changed.clone(), None)
        .await
        .unwrap();
    let event = next_event(&mut events, 5 * SECOND).await;
    let LeaseEvent::ConfigChanged(Some(what)) = event else {
        panic!("expected ConfigChanged, got {event:?}");
    };
    assert!(
        what.contains("Network 10.5.0.0/16 -> 10.6.0.0/16"),
        "{what}"
    );
    // The same change written again is not news.
    client.put(key.clone(), changed, None).await.unwrap();
    client.put(key.clone(), "{bad", None).await.unwrap();
    let event = next_event(&mut events, 5 * SECOND).await;
    let LeaseEvent::ConfigChanged(Some(what)) = event else {
        panic!("expected ConfigChanged, got {event:?}");
    };
    assert!(what.contains("no longer valid"), "{what}");
    client.put(key, CONFIG, None).await.unwrap();
    assert_eq!(
        next_event(&mut events, 5 * SECOND).await,
        LeaseEvent::ConfigChanged(None)
    );
}

#[tokio::test]
async fn lease_is_renewed_with_a_new_etcd_lease_before_it_expires() {
    let etcd = Etcd::start();
    etcd.put_config(CONFIG).await;
    let peer = LeaseAttrs::vxlan(ip(2), 1, "aa:aa:aa:aa:aa:02");
    assert_renewed_under_its_key(&etcd, LeaseAttrs::udp(ip(1)), peer).await;
}

#[tokio::test]
async fn watch_resyncs_after_etcd_is_gone_for_a_while() {
    let mut etcd = Etcd::start();
    etcd.put_config(CONFIG).await;
    let (a, mut events) = start(&etcd, 1).await;
    let (b, _b_events) = start(&etcd, 2).await;
    wait_for(&mut events, 5 * SECOND, |e| {
        *e == LeaseEvent::Added(b.clone().into())
    })
    .await;

    etcd.stop();
    tokio::time::sleep(3 * SECOND).await;
    if let Ok(event) = events.try_recv() {
        panic!("no event expected while etcd is down, got {event:?}");
    }
    assert!(
        !events.is_closed(),
        "the registry must outlive an etcd outage"
    );
    etcd.launch();

    let resync = wait_for(&mut events, 10 * SECOND, |e| {
        matches!(e, LeaseEvent::Snapshot(_))
    })
    .await;
    assert_eq!(snapshot(resync), vec![b.clone()]);
    let (c, _c_events) = start(&etcd, 3).await;
    wait_for(&mut events, 5 * SECOND, |e| {
        *e == LeaseEvent::Added(c.clone().into())
    })
    .await;
    assert!(get(&mut etcd.client().await, &a.key(PREFIX))
        .await
        .is_some());
}

/// Puts `count` peer leases, one revision each (etcd buffers a slow watcher's changes per
/// revision), with `pad` bytes of BackendData each so that they fill the watch stream's buffers.
async fn put_many(etcd: &Etcd, first: u32, count: u32, pad: usize) -> Vec<Lease> {
    let client = etcd.client().await;
    let padding = "x".repeat(pad);
    let leases: Vec<Lease> = (first..first + count)
        .map(|i| {
            let subnet: ipnet::Ipv4Net = format!("10.{}.{}.0/24", 6 + i / 256, i % 256)
                .parse()
                .unwrap();
            let mut attrs = LeaseAttrs::host_gw(Ipv4Addr::from(0x0a00_0000 + i));
            attrs.backend_data = Some(serde_json::json!({ "pad": padding }).into());
            Lease::new(subnet, attrs)
        })
        .collect();
    stream::iter(&leases)
        .for_each_concurrent(16, |lease| {
            let mut client = client.clone();
            async move {
                // etcd answers "request timed out" when its disk falls behind (a loaded CI
                // machine): this harness's own writes try again, a few times.
                let mut attempts = 0;
                while let Err(e) = client.put(lease.key(PREFIX), lease.to_json(), None).await {
                    attempts += 1;
                    assert!(attempts < 5, "put {}: {e}", lease.key(PREFIX));
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
            }
        })
        .await;
    leases
}

/// A consumer that stops reading makes the watch fall behind; compacting the history then makes
/// etcd cancel the watch. The registry must re-list once, deliver a complete snapshot, and go on
/// watching, without the hot loop of flannel #2470.
#[tokio::test]
async fn compaction_behind_the_watch_is_recovered_without_a_hot_loop() {
    let etcd = Etcd::start();
    etcd.put_config(r#"{"Network":"10.0.0.0/8"}"#).await;
    let (logs, _guard) = Logs::capture();
    let (_, mut events) = start_with(etcd.options(), LeaseAttrs::udp(ip(1)))
        .await
        .unwrap();
    snapshot(next_event(&mut events, 5 * SECOND).await);

    // Not reading `events` now: about 8 MB of changes pile up behind the watch.
    let leases = put_many(&etcd, 0, 4000, 2000).await;
    let mut client = etcd.client().await;
    let head = client
        .get("x", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    client
        .compact(head, Some(CompactionOptions::new().with_physical()))
        .await
        .unwrap();

    let resync = wait_for(&mut events, 60 * SECOND, |e| {
        matches!(e, LeaseEvent::Snapshot(_))
    })
    .await;
    assert_eq!(snapshot(resync).len(), leases.len());
    assert!(
        logs.text().contains("watch history was compacted"),
        "re-listed for another reason:\n{}",
        logs.text()
    );
    let quiet = tokio::time::timeout(3 * SECOND, async {
        loop {
            match events.recv().await {
                Some(LeaseEvent::Snapshot(_)) => return "another snapshot",
                Some(_) => continue,
                None => return "channel closed",
            }
        }
    })
    .await;
    assert!(
        quiet.is_err(),
        "after one re-list the watch must stay put, got {quiet:?}"
    );

    let late = put_many(&etcd, 20_000, 1, 10).await;
    wait_for(&mut events, 5 * SECOND, |e| {
        *e == LeaseEvent::Added(late[0].clone().into())
    })
    .await;
}
