//! Hardening 3, bounds and small defects: a value of any length written into a lease, a key or
//! an annotation is cut in the log and in `twill status`, with its size named; a file named by
//! a flag that never ends (/dev/zero, a FIFO) is refused at once in one line; a subnet file
//! that is a device is refused and left alone; config errors name the field; a Node whose
//! public-ip lies inside the network is refused.

mod common;

use anyhow::{ensure, Context, Result};
use common::cluster::*;
use common::kube::{kube_cluster, net_conf, PREFIX as ANNOTATIONS};
use common::*;
use std::time::{Duration, Instant};
use twill_lab::{Netns, Proc};

/// `rejected_leases` of a node's status, as (key, reason) pairs, and the status's size.
fn rejected(ns: &Netns) -> Result<(Vec<(String, String)>, usize)> {
    let text = ns.exec(TWILL, &["status"])?;
    let s: serde_json::Value = serde_json::from_str(&text)?;
    let rejected = s["rejected_leases"].as_array().context("rejected_leases")?;
    let text_of = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    let pairs = rejected
        .iter()
        .map(|r| (text_of(&r["key"]), text_of(&r["reason"])))
        .collect();
    Ok((pairs, text.len()))
}

/// Waits until `ns`'s status rejects every `(key starting with, reason containing)` in `want`.
fn refused_within_bounds(ns: &Netns, node: &mut Proc, want: &[(&str, &str)]) -> Result<()> {
    eventually_within("the refusals", Duration::from_secs(15), || {
        let (got, _) = rejected(ns)?;
        Ok(want.iter().all(|(key, why)| {
            got.iter()
                .any(|(k, r)| k.starts_with(key) && r.contains(why))
        }))
    })
    .with_context(|| format!("{:?}", rejected(ns).map(|r| r.0)))?;
    let (got, size) = rejected(ns)?;
    ensure!(size < 16 << 10, "twill status is {size} bytes: {got:?}");
    let log = node.stderr();
    ensure!(log.len() < 64 << 10, "the log is {} bytes", log.len());
    ensure!(node.is_running(), "{log}");
    Ok(())
}

/// Runs `sh` in `ns` with a file of `len` letters A at `$BIG`.
fn with_big_file(ns: &Netns, dir: &tempfile::TempDir, len: usize, sh: &str) -> Result<()> {
    let big = path_in(dir, "big");
    std::fs::write(&big, "A".repeat(len))?;
    let big = big.to_str().context("path")?;
    ns.sh(&format!("BIG={big}; {sh}"))?;
    Ok(())
}

#[test]
fn a_lease_with_a_huge_backend_type_and_a_huge_key_are_cut_with_their_size() -> Result<()> {
    let c = cluster("h3-bigetcd", 2, UDP_CONFIG)?;
    let mut node = c.start(0)?;
    let etcdctl = format!("ETCDCTL_API=3 etcdctl --endpoints={}", c.etcd.endpoint());
    let key = c.lease_key(c.unheld_subnet()?);
    // Values go through a file: one argument may not be longer than 128 KiB.
    let value = format!(
        r#"printf '{{"PublicIP":"10.200.0.77","BackendType":"%s"}}' "$(cat $BIG)" | \
           {etcdctl} put {key}"#
    );
    with_big_file(&c.lab.host(0).ns, &c.dir, 500_000, &value)?;
    let junk = format!("{PREFIX}/subnets/{}", "B".repeat(100_000));
    c.etcd.etcdctl(&["put", &junk, "{}"])?;
    let cut = format!("{PREFIX}/subnets/BBBB");
    refused_within_bounds(
        &c.lab.host(0).ns,
        &mut node,
        &[
            (key.as_str(), "its backend type AAAAAAAA"),
            (key.as_str(), "(500000 bytes)"),
            (cut.as_str(), "not a subnet lease key"),
        ],
    )?;
    let (got, _) = rejected(&c.lab.host(0).ns)?;
    ensure!(
        got.iter()
            .any(|(k, _)| k.starts_with(&cut) && k.ends_with("(100028 bytes)")),
        "{got:?}"
    );
    let log = node.stderr();
    ensure!(log.contains("(500000 bytes)"), "{log}");
    Ok(())
}

#[test]
fn a_node_with_a_huge_annotation_or_its_public_ip_inside_the_network_is_refused() -> Result<()> {
    let c = kube_cluster("h3-bigkube", 2, &net_conf("udp", ""))?;
    c.add_node(0)?;
    let mut node = c.start(0, &[])?;
    let ip = format!("{ANNOTATIONS}/public-ip");
    c.flannel_node("big", "10.5.20.0/24", "10.200.0.20")?;
    c.api
        .patch_node_annotations("big", &[(&ip, Some(&"A".repeat(200_000)))])?;
    // A Node reached at an address inside its own podCIDR: its datagrams would be routed back
    // into the tunnel.
    c.flannel_node("looped", "10.5.21.0/24", "10.5.21.1")?;
    let looped = "its PublicIP 10.5.21.1 lies inside the network 10.5.0.0/16";
    refused_within_bounds(
        &c.lab.host(0).ns,
        &mut node,
        &[
            ("node/big", "is not an IPv4 address"),
            ("node/big", "(200000 bytes)"),
            ("node/looped", looped),
        ],
    )?;
    ensure!(c.peer_subnets(0)?.is_empty(), "{:?}", c.peer_subnets(0)?);
    Ok(())
}

/// `twill run ARGS` (with `env`) on host 0 of `lab` under a 2 GiB address-space limit: it
/// must stop within 10 s; its last line.
fn stops_at_once(ns: &Netns, args: &[&str], env: &[(&str, &str)]) -> Result<String> {
    let mut all = vec!["--as=2147483648", "--", TWILL, "run", "--iface", "eth0"];
    all.extend_from_slice(args);
    let started = Instant::now();
    let mut node = ns.spawn_with("prlimit", &all, env)?;
    let stderr = node.failure_within(Duration::from_secs(30), "twill kept running")?;
    ensure!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    Ok(stderr.lines().last().unwrap_or_default().to_string())
}

#[test]
fn a_file_that_never_ends_is_refused_at_once_naming_its_flag() -> Result<()> {
    let c = kube_cluster("h3-files", 2, &net_conf("udp", ""))?;
    let ns = &c.lab.host(0).ns;
    let fifo = path_in(&c.dir, "fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))?;
    let fifo = fifo.to_str().context("path")?;
    let (conf, kubeconfig) = (c.net_conf_path(), c.kubeconfig());
    let (conf, kubeconfig) = (
        conf.to_str().context("path")?,
        kubeconfig.to_str().context("path")?,
    );
    let subnet_file = path_in(&c.dir, "h0.env");
    let subnet_file = subnet_file.to_str().context("path")?;
    let kube = |net_conf: &str, kubeconfig: &str| {
        [
            "--kube-subnet-mgr",
            "--net-config-path",
            net_conf,
            "--kubeconfig-file",
            kubeconfig,
            "--subnet-file",
            subnet_file,
        ]
        .map(String::from)
        .to_vec()
    };
    let etcd = |file_flag: &str, file: &str, subnet_file: &str| {
        [
            "--etcd-endpoints",
            "http://127.0.0.1:9",
            file_flag,
            file,
            "--subnet-file",
            subnet_file,
        ]
        .map(String::from)
        .to_vec()
    };
    let char_device = "it is a character device, not a regular file";
    let cases = [
        (
            kube("/dev/zero", kubeconfig),
            "--net-config-path /dev/zero",
            char_device,
        ),
        (
            kube(fifo, kubeconfig),
            "--net-config-path",
            "it is a FIFO, not a regular file",
        ),
        (
            kube(conf, "/dev/zero"),
            "--kubeconfig-file /dev/zero",
            char_device,
        ),
        (
            etcd("--etcd-cafile", "/dev/zero", subnet_file),
            "--etcd-cafile /dev/zero",
            char_device,
        ),
        (
            [
                etcd("--etcd-certfile", "/dev/zero", subnet_file),
                ["--etcd-keyfile", "/dev/zero"].map(String::from).to_vec(),
            ]
            .concat(),
            "--etcd-certfile /dev/zero",
            char_device,
        ),
        (
            etcd("--etcd-prefix", "/p", "/dev/zero"),
            "the subnet file /dev/zero",
            char_device,
        ),
    ];
    for (args, flag, why) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let last = stops_at_once(ns, &args, &[("NODE_NAME", "node-0")])?;
        ensure!(
            last.contains(flag) && last.contains(why),
            "{args:?}: {last}"
        );
    }
    Ok(())
}

#[test]
fn a_subnet_file_that_is_a_device_is_refused_and_left_a_device() -> Result<()> {
    use nix::sys::stat::{makedev, mknod, Mode, SFlag};
    let c = cluster("h3-subdev", 2, UDP_CONFIG)?;
    let device = path_in(&c.dir, "null");
    mknod(
        &device,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o666),
        makedev(1, 3),
    )?;
    let endpoint = c.etcd.endpoint();
    let path = device.to_str().context("path")?;
    let args = ["--etcd-endpoints", &endpoint, "--subnet-file", path];
    let last = stops_at_once(&c.lab.host(0).ns, &args, &[])?;
    let want = format!("the subnet file {path}: it is a character device, not a regular file");
    ensure!(last.contains(&want), "{last}");
    let kind = std::fs::metadata(&device)?.file_type();
    use std::os::unix::fs::FileTypeExt;
    ensure!(kind.is_char_device(), "the device was replaced: {kind:?}");
    Ok(())
}

#[test]
fn a_network_or_vni_the_kernel_refuses_is_named_by_its_field() -> Result<()> {
    let c = cluster("h3-conf", 2, UDP_CONFIG)?;
    let key = format!("{PREFIX}/config");
    for (config, want) in [
        (
            r#"{"Network":"224.0.0.0/4","Backend":{"Type":"udp"}}"#,
            "Network 224.0.0.0/4 holds multicast addresses (224.0.0.0/4)",
        ),
        (
            r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan","VNI":16777216}}"#,
            "Backend.VNI 16777216 is out of range",
        ),
    ] {
        c.etcd.etcdctl(&["put", &key, config])?;
        let last = c.failing_start(0)?;
        ensure!(last.contains(want) && last.contains(&key), "{last}");
    }
    Ok(())
}
