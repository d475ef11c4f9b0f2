use twill_lab::{Etcd, Netns};

#[test]
fn etcd_in_a_namespace_keeps_data_across_restart() {
    let ns = Netns::new("etcd").unwrap();
    let mut etcd = Etcd::new(Some(&ns)).unwrap();
    assert!(etcd.endpoint().starts_with("http://127.0.0.1:"));
    etcd.etcdctl(&["put", "/coreos.com/network/config", "{}"])
        .unwrap();
    etcd.stop().unwrap();
    assert!(etcd
        .etcdctl(&["get", "/coreos.com/network/config"])
        .is_err());
    etcd.start().unwrap();
    let got = etcd
        .etcdctl(&["get", "--print-value-only", "/coreos.com/network/config"])
        .unwrap();
    assert_eq!(got.trim(), "{}");
}

#[test]
fn etcd_in_the_root_namespace_answers_on_loopback() {
    let etcd = Etcd::new(None).unwrap();
    let port = etcd
        .endpoint()
        .rsplit(':')
        .next()
        .unwrap()
        .parse::<u16>()
        .unwrap();
    std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    etcd.etcdctl(&["put", "k", "v"]).unwrap();
    assert_eq!(
        etcd.etcdctl(&["get", "--print-value-only", "k"])
            .unwrap()
            .trim(),
        "v"
    );
}
