//! etcd with TLS client certificates, and etcd with user/password auth.

mod common;

use common::Etcd;
use std::time::Duration;
use twill_control::lease::LeaseEvent;
use twill_control::lease::{Lease, LeaseAttrs};
use twill_control::registry::{EtcdRegistry, Registry};

const CONFIG: &str = r#"{"Network":"10.5.0.0/16"}"#;

#[tokio::test]
async fn tls_with_client_certificates() {
    let etcd = Etcd::start_tls();
    etcd.put_config(CONFIG).await;
    let opts = etcd.options();
    assert!(opts.endpoints[0].starts_with("https://"));
    let registry = tokio::time::timeout(Duration::from_secs(10), EtcdRegistry::connect(opts))
        .await
        .expect("TLS connect hangs")
        .unwrap();
    let (lease, _events) = registry
        .start(LeaseAttrs::udp(
            "127.0.0.1".parse::<std::net::Ipv4Addr>().unwrap(),
        ))
        .await
        .unwrap();
    let mut client = etcd.client().await;
    let stored = common::get(&mut client, &lease.key(common::PREFIX)).await;
    assert_eq!(stored.map(|(value, _)| value), Some(lease.to_json()));
}

/// Also across an etcd restart and with auth tokens that expire after a second (etcd's default
/// is 5 minutes, far less than the 23 h between renewals): the registry must log in again rather
/// than fail every request from then on.
#[tokio::test]
async fn username_and_password() {
    let mut etcd = Etcd::start_with(&["--auth-token-ttl", "1"]);
    etcd.put_config(CONFIG).await;
    let mut admin = etcd.client().await;
    admin.user_add("root", "rootpw", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();

    let mut opts = etcd.options();
    opts.username = Some("root".into());
    opts.password = Some("rootpw".into());
    opts.timing.lease_ttl = Duration::from_secs(4);
    opts.timing.renew_margin = Duration::from_secs(2);
    let registry = EtcdRegistry::connect(opts.clone()).await.unwrap();
    let (own, mut events) = registry
        .start(LeaseAttrs::udp(
            "127.0.0.1".parse::<std::net::Ipv4Addr>().unwrap(),
        ))
        .await
        .unwrap();
    common::next_event(&mut events, Duration::from_secs(5)).await;
    etcd.stop();
    etcd.launch();

    let root = etcd_client::ConnectOptions::new()
        .with_user("root", "rootpw")
        .with_auto_token_refresh(true);
    let mut admin = etcd_client::Client::connect([etcd.endpoint()], Some(root))
        .await
        .unwrap();
    let peer = Lease::new(
        "10.5.99.0/24".parse::<ipnet::Ipv4Net>().unwrap(),
        LeaseAttrs::udp("127.0.0.2".parse::<std::net::Ipv4Addr>().unwrap()),
    );
    admin
        .put(peer.key(common::PREFIX), peer.to_json(), None)
        .await
        .unwrap();
    // The registry sees the new peer through its watch, or in a re-list if its watch broke
    // with the restart (which one depends on where the restart caught it).
    common::wait_for(&mut events, Duration::from_secs(15), |e| match e {
        LeaseEvent::Added(added) => **added == peer,
        LeaseEvent::Snapshot(all) => all.iter().any(|lease| **lease == peer),
        _ => false,
    })
    .await;
    // Renewals 2 s apart, each long after the token expired: the key must survive 3 TTLs.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(
        common::get(&mut admin, &own.key(common::PREFIX))
            .await
            .is_some(),
        "lease expired"
    );

    opts.password = Some("wrong".into());
    let refused = tokio::time::timeout(Duration::from_secs(10), EtcdRegistry::connect(opts))
        .await
        .expect("bad credentials must fail at once, not be retried");
    let err = format!(
        "{:#}",
        refused
            .err()
            .expect("connect with a wrong password succeeded")
    );
    assert!(
        !err.contains('\n') && err.contains("authentication failed"),
        "{err}"
    );
}

/// A TLS file that is not what its flag says is named at start, with what is wrong; a client
/// certificate etcd does not trust ends the start with a TLS error, not endless retries as if
/// etcd were unreachable.
#[tokio::test]
async fn bad_tls_files_are_named_and_a_refused_handshake_says_so() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let etcd = Etcd::start_tls();
    etcd.put_config(CONFIG).await;
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let connect = |opts| async {
        tokio::time::timeout(Duration::from_secs(15), EtcdRegistry::connect(opts))
            .await
            .expect("a bad TLS setup must fail, not retry forever")
            .err()
            .map(|e| format!("{e:#}"))
            .expect("connected with a bad TLS setup")
    };
    let mut opts = etcd.options();
    opts.cafile = Some(junk.clone());
    let err = connect(opts).await;
    let want = format!("--etcd-cafile {}: no PEM certificate in it", junk.display());
    assert!(err.contains(&want), "{err}");
    let mut opts = etcd.options();
    opts.keyfile = Some(junk.clone());
    let err = connect(opts).await;
    let want = format!("--etcd-keyfile {}: no PEM private key", junk.display());
    assert!(err.contains(&want), "{err}");

    let other = dir.path().join("other");
    let other = twill_lab::certs::write_identity(&other, "127.0.0.1".parse().unwrap()).unwrap();
    let mut opts = etcd.options();
    opts.certfile = Some(other.cert);
    opts.keyfile = Some(other.key);
    let err = connect(opts).await;
    assert!(err.contains("TLS handshake with etcd failed"), "{err}");
}
