//! Dual-stack lease acquisition against a real etcd, as flanneld v0.28.9 does it: an IPv4 and an
//! IPv6 subnet in one key, reused while they fit the config and replaced when they do not.

mod common;

use common::{get, ip, start_with, Etcd, PREFIX};
use ipnet::{Ipv4Net, Ipv6Net};
use std::net::Ipv6Addr;
use tokio::sync::mpsc::Receiver;
use twill_control::lease::LeaseEvent;
use twill_control::lease::{Lease, LeaseAttrs};

const CONFIG: &str = r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/48","Backend":{"Type":"host-gw"}}"#;

fn ip6(last: u16) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x200, 0, 0, 0, 0, 0, last)
}

fn dual(last: u8) -> LeaseAttrs {
    LeaseAttrs::host_gw(ip(last)).with_ipv6(ip6(last.into()), None)
}

fn net6(s: &str) -> Ipv6Net {
    s.parse().unwrap()
}

async fn start(etcd: &Etcd, attrs: LeaseAttrs) -> (Lease, Receiver<LeaseEvent>) {
    start_with(etcd.options(), attrs).await.unwrap()
}

/// The keys under `<prefix>/subnets/`, without the prefix.
async fn lease_keys(etcd: &Etcd) -> Vec<String> {
    let opts = etcd_client::GetOptions::new()
        .with_prefix()
        .with_keys_only();
    let resp = etcd
        .client()
        .await
        .get(format!("{PREFIX}/subnets/"), Some(opts))
        .await
        .unwrap();
    let names = resp
        .kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap().to_string());
    let prefix = format!("{PREFIX}/subnets/");
    names
        .map(|k| k.strip_prefix(&prefix).unwrap().into())
        .collect()
}

/// `10.5.8.0-24&fd10:0:0:8::-64`: the key name of a lease, as flanneld writes it.
fn key_name(lease: &Lease) -> String {
    let v6 = lease.subnets.v6().expect("a dual-stack lease");
    format!(
        "{}-{}&{}-{}",
        lease.subnets.v4().unwrap().network(),
        lease.subnets.v4().unwrap().prefix_len(),
        v6.network(),
        v6.prefix_len()
    )
}

#[tokio::test]
async fn dual_stack_nodes_get_distinct_subnets_of_both_families_in_one_key() {
    let etcd = Etcd::start();
    etcd.put_config(CONFIG).await;
    let (a, _a_events) = start(&etcd, dual(1)).await;
    let (b, _b_events) = start(&etcd, dual(2)).await;
    let (a6, b6) = (a.subnets.v6().unwrap(), b.subnets.v6().unwrap());
    assert_ne!(a.subnets.v4().unwrap(), b.subnets.v4().unwrap());
    assert_ne!(a6, b6);
    for (lease, v6) in [(&a, a6), (&b, b6)] {
        assert_eq!(lease.subnets.v4().unwrap().prefix_len(), 24);
        assert_eq!(v6.prefix_len(), 64);
        assert!(
            net6("fd10::/48").contains(&v6) && v6 != net6("fd10::/64"),
            "{v6}: not between IPv6SubnetMin and IPv6SubnetMax"
        );
    }
    let mut names = lease_keys(&etcd).await;
    names.sort();
    let mut want = vec![key_name(&a), key_name(&b)];
    want.sort();
    assert_eq!(names, want, "one key per node, both subnets in it");
    let (value, etcd_lease) = get(&mut etcd.client().await, &a.key(PREFIX)).await.unwrap();
    assert_eq!(
        value,
        r#"{"PublicIP":"127.0.0.1","PublicIPv6":"fd00:200::1","BackendType":"host-gw"}"#
    );
    let ttl = etcd
        .client()
        .await
        .lease_time_to_live(etcd_lease, None)
        .await
        .unwrap();
    assert_eq!(ttl.granted_ttl(), 60, "the key carries the configured TTL");
}

#[tokio::test]
async fn a_restart_with_the_same_public_ip_reuses_both_subnets() {
    let etcd = Etcd::start();
    etcd.put_config(CONFIG).await;
    let (first, events) = start(&etcd, dual(1)).await;
    drop(events);
    let (_, _other) = start(&etcd, dual(2)).await;
    let moved = LeaseAttrs::host_gw(ip(1)).with_ipv6(ip6(0x11), None);
    let (again, _events) = start(&etcd, moved).await;
    assert_eq!(
        (again.subnets.v4().unwrap(), again.subnets.v6()),
        (first.subnets.v4().unwrap(), first.subnets.v6())
    );
    let (value, _) = get(&mut etcd.client().await, &first.key(PREFIX))
        .await
        .expect("the same key");
    assert!(value.contains(r#""PublicIPv6":"fd00:200::11""#), "{value}");
    assert_eq!(lease_keys(&etcd).await.len(), 2);
}

#[tokio::test]
async fn the_previous_subnets_are_preferred_as_a_pair_when_free() {
    let etcd = Etcd::start();
    etcd.put_config(CONFIG).await;
    let mut opts = etcd.options();
    opts.previous_subnet = Some("10.5.77.0/24".parse().unwrap());
    opts.previous_ipv6_subnet = Some(net6("fd10:0:0:77::/64"));
    let (a, _a) = start_with(opts.clone(), dual(1)).await.unwrap();
    assert_eq!(key_name(&a), "10.5.77.0-24&fd10:0:0:77::-64");
    // Taken now: the next node with the same subnet.env draws others.
    let (b, _b) = start_with(opts.clone(), dual(2)).await.unwrap();
    assert_ne!(b.subnets.v4().unwrap(), a.subnets.v4().unwrap());
    assert_ne!(b.subnets.v6(), a.subnets.v6());
    // Without its IPv6 half the pair does not fit a dual-stack network (flanneld ignores it);
    // 10.5.200.0 lies past the first 100 free subnets, so a random pick never lands on it.
    opts.previous_subnet = Some("10.5.200.0/24".parse().unwrap());
    opts.previous_ipv6_subnet = None;
    let (c, _c) = start_with(opts, dual(3)).await.unwrap();
    assert_ne!(
        c.subnets.v4().unwrap(),
        "10.5.200.0/24".parse::<Ipv4Net>().unwrap()
    );
}

#[tokio::test]
async fn a_changed_ipv6_network_makes_the_old_lease_misfit_and_it_is_replaced() {
    let etcd = Etcd::start();
    etcd.put_config(CONFIG).await;
    let (old, events) = start(&etcd, dual(1)).await;
    drop(events);
    etcd.put_config(&CONFIG.replace("fd10::/48", "fd20::/48"))
        .await;
    let (new, _events) = start(&etcd, dual(1)).await;
    assert!(
        net6("fd20::/48").contains(&new.subnets.v6().unwrap()),
        "{new:?}"
    );
    assert_eq!(
        lease_keys(&etcd).await,
        [key_name(&new)],
        "the old key {} is deleted",
        key_name(&old)
    );
}

#[tokio::test]
async fn a_lease_of_our_ip_in_the_other_stack_is_replaced() {
    let etcd = Etcd::start();
    let mut client = etcd.client().await;
    // IPv4-only key of our IP on a dual-stack network: no IPv6 subnet, so it does not fit.
    etcd.put_config(CONFIG).await;
    let v4_only = format!("{PREFIX}/subnets/10.5.3.0-24");
    client
        .put(v4_only.clone(), LeaseAttrs::host_gw(ip(1)).to_json(), None)
        .await
        .unwrap();
    let (lease, events) = start(&etcd, dual(1)).await;
    drop(events);
    assert!(lease.subnets.v6().is_some());
    assert_eq!(lease_keys(&etcd).await, [key_name(&lease)]);
    // And back: a dual-stack key of our IP on an IPv4-only network does not fit either.
    etcd.put_config(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"host-gw"}}"#)
        .await;
    let (v4, _events) = start_with(etcd.options(), LeaseAttrs::host_gw(ip(1)))
        .await
        .unwrap();
    assert_eq!(v4.subnets.v6(), None);
    assert_eq!(
        lease_keys(&etcd).await,
        [format!("{}-24", v4.subnets.v4().unwrap().network())]
    );
}

#[tokio::test]
async fn running_out_of_ipv6_subnets_says_so() {
    let etcd = Etcd::start();
    // Plenty of IPv4 subnets, exactly one IPv6 subnet.
    etcd.put_config(&CONFIG.replace(
        r#""IPv6Network":"fd10::/48""#,
        r#""IPv6Network":"fd10::/48","IPv6SubnetMin":"fd10:0:0:5::","IPv6SubnetMax":"fd10:0:0:5::""#,
    ))
    .await;
    let (a, _a) = start(&etcd, dual(1)).await;
    assert_eq!(a.subnets.v6(), Some(net6("fd10:0:0:5::/64")));
    let err = start_with(etcd.options(), dual(2)).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "no free IPv6 subnet left between IPv6SubnetMin fd10:0:0:5:: and IPv6SubnetMax \
         fd10:0:0:5:: of IPv6Network fd10::/48"
    );
    assert_eq!(lease_keys(&etcd).await.len(), 1, "no half lease written");
}

#[tokio::test]
async fn a_dual_stack_lease_needs_a_public_ipv6() {
    let etcd = Etcd::start();
    etcd.put_config(CONFIG).await;
    let err = start_with(etcd.options(), LeaseAttrs::host_gw(ip(1)))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the network config enables IPv6 (IPv6Network fd10::/48), but this node's lease has \
         no PublicIPv6: give --public-ipv6 or an IPv6 address on the interface"
    );
    assert!(lease_keys(&etcd).await.is_empty());
}
