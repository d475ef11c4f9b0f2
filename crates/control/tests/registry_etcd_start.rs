//! Connecting to etcd: what the operator sees when the config is wrong or etcd is not up yet.

mod common;

use common::{Etcd, Logs, PREFIX};
use std::time::{Duration, Instant};
use twill_control::lease::LeaseAttrs;
use twill_control::registry::{EtcdOptions, EtcdRegistry, Registry};

async fn connect_error(opts: EtcdOptions) -> String {
    let result = tokio::time::timeout(Duration::from_secs(10), EtcdRegistry::connect(opts)).await;
    match result.expect("a config error must not be retried forever") {
        Ok(_) => panic!("connect succeeded"),
        Err(e) => {
            let text = format!("{e:#}");
            assert!(!text.contains('\n'), "error must be one line: {text}");
            text
        }
    }
}

#[tokio::test]
async fn invalid_config_gives_a_one_line_error_naming_the_field() {
    let etcd = Etcd::start();
    etcd.put_config(r#"{"Network":"10.5.0.0/16","SubnetLen":33}"#)
        .await;
    assert_eq!(
        connect_error(etcd.options()).await,
        "invalid network config: SubnetLen 33 is too long: it must be at most 30 \
         (etcd key /coreos.com/network/config)"
    );
}

/// A node started before the operator writes the config waits for it, as flanneld does: it
/// says once which key to create, looks again every second, and goes on once it is there.
#[tokio::test]
async fn missing_config_is_waited_for_and_said_once() {
    let etcd = Etcd::start();
    let (logs, _guard) = Logs::capture();
    let connecting = tokio::spawn(EtcdRegistry::connect(etcd.options()));
    let said = "flannel network config not found: etcd key /coreos.com/network/config does not \
                exist";
    let deadline = Instant::now() + Duration::from_secs(30);
    while !logs.text().contains(said) {
        assert!(
            !connecting.is_finished(),
            "connect gave up without a config"
        );
        assert!(
            Instant::now() < deadline,
            "not said in 30 s:\n{}",
            logs.text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Three more looks at least, none of them said again.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert!(
        !connecting.is_finished(),
        "connect gave up without a config"
    );
    assert_eq!(logs.text().matches(said).count(), 1, "{}", logs.text());

    etcd.put_config(r#"{"Network":"10.5.0.0/16"}"#).await;
    let registry = tokio::time::timeout(Duration::from_secs(10), connecting)
        .await
        .expect("connect did not go on once the config was there")
        .unwrap()
        .unwrap();
    assert_eq!(
        registry.config().ipv4.as_ref().unwrap().network,
        "10.5.0.0/16".parse().unwrap()
    );
}

#[tokio::test]
async fn missing_tls_file_fails_at_once() {
    let etcd = Etcd::start();
    let mut opts = etcd.options();
    opts.cafile = Some("/nonexistent/ca.pem".into());
    let err = connect_error(opts).await;
    assert!(
        err.starts_with("--etcd-cafile /nonexistent/ca.pem"),
        "{err}"
    );
}

#[tokio::test]
async fn unreachable_etcd_at_start_is_retried_until_it_comes_up() {
    let mut etcd = Etcd::unstarted();
    // Prepare the config on disk, then take etcd away before the node starts.
    etcd.launch();
    etcd.put_config(r#"{"Network":"10.5.0.0/16"}"#).await;
    etcd.stop();

    let (logs, _guard) = Logs::capture();
    let started = Instant::now();
    let connecting = tokio::spawn(EtcdRegistry::connect(etcd.options()));
    // Waits for the attempts however slow the machine is; a connect that gives up, or that
    // never retries, fails the wait.
    let attempts = |logs: &Logs| logs.text().matches("is unreachable").count();
    let deadline = started + Duration::from_secs(30);
    while attempts(&logs) < 5 {
        assert!(
            !connecting.is_finished(),
            "connect gave up while etcd was down"
        );
        assert!(
            Instant::now() < deadline,
            "fewer than 5 attempts in 30 s:\n{}",
            logs.text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (took, text) = (started.elapsed(), logs.text());
    // The delays double from 50 ms (fast_timing). A loaded machine only stretches them, so the
    // fifth attempt cannot come before the four delays before it: 750 ms.
    for delay in ["50ms", "100ms", "200ms", "400ms"] {
        let said = format!("retrying in {delay}");
        assert!(text.contains(&said), "no \"{said}\":\n{text}");
    }
    assert!(
        took >= Duration::from_millis(750),
        "5 attempts in {took:?}, sooner than the backoff allows:\n{text}"
    );
    assert!(
        !connecting.is_finished(),
        "connect gave up while etcd was down"
    );

    etcd.launch();
    let registry = tokio::time::timeout(Duration::from_secs(10), connecting)
        .await
        .expect("connect did not succeed after etcd came up")
        .unwrap()
        .unwrap();
    assert_eq!(
        registry.config().ipv4.as_ref().unwrap().network,
        "10.5.0.0/16".parse().unwrap()
    );
    let (lease, _events) = registry
        .start(LeaseAttrs::udp(
            "127.0.0.1".parse::<std::net::Ipv4Addr>().unwrap(),
        ))
        .await
        .unwrap();
    assert_eq!(lease.subnets.v4().unwrap().prefix_len(), 24);
}

/// Hardening 4, finding 3: with a dead endpoint first (flanneld's default order where only
/// 2379 is up: `http://127.0.0.1:4001,http://…:2379`), every start has its lease within 2 s,
/// as flanneld does: a request fails over to the live endpoint at once, not after backoff.
/// The default timing, as a node runs.
#[tokio::test]
async fn a_dead_first_endpoint_costs_no_time() {
    let etcd = Etcd::start();
    etcd.put_config(r#"{"Network":"10.5.0.0/16"}"#).await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_port = dead.local_addr().unwrap().port();
    drop(dead);
    let mut opts = etcd.options();
    opts.timing = Default::default();
    opts.endpoints
        .insert(0, format!("http://127.0.0.1:{dead_port}"));
    for start in 0..10u8 {
        let started = Instant::now();
        let attrs = LeaseAttrs::udp(common::ip(10 + start));
        let (lease, _events) = tokio::time::timeout(
            Duration::from_secs(30),
            common::start_with(opts.clone(), attrs),
        )
        .await
        .expect("no lease in 30 s")
        .unwrap();
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(2),
            "start {start}: lease {} after {took:?}",
            lease.subnets
        );
    }
}

/// Waits until `logs` say `what`.
async fn said(logs: &Logs, what: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while !logs.text().contains(what) {
        assert!(
            Instant::now() < deadline,
            "not said in {within:?}: {what}\n{}",
            logs.text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The pool follows the endpoints while the node runs: etcd gone, every endpoint is tried (the
/// dead one too, said once); etcd back, requests go to it alone again, and the watch delivers.
#[tokio::test]
async fn the_pool_follows_etcd_going_and_coming_back() {
    let (logs, _guard) = Logs::capture();
    let mut etcd = Etcd::start();
    etcd.put_config(r#"{"Network":"10.5.0.0/16"}"#).await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let mut opts = etcd.options();
    opts.endpoints.insert(0, dead_url.clone());
    let (_lease, mut events) = common::start_with(opts, LeaseAttrs::udp(common::ip(10)))
        .await
        .unwrap();

    etcd.stop();
    let every = "no etcd endpoint answers";
    said(&logs, every, Duration::from_secs(20)).await;
    etcd.launch();
    let back = format!("etcd at {dead_url} does not answer: no requests go to it");
    said(&logs, &back, Duration::from_secs(20)).await;
    assert_eq!(logs.text().matches(every).count(), 1, "{}", logs.text());

    let mut client = etcd.client().await;
    let peer = format!("{PREFIX}/subnets/10.5.77.0-24");
    client
        .put(peer.as_str(), r#"{"PublicIP":"127.0.0.77"}"#, None)
        .await
        .unwrap();
    common::wait_for(&mut events, Duration::from_secs(30), |event| {
        format!("{event:?}").contains("10.5.77.0")
    })
    .await;
}
