//! Bad input gets one clear line and a non-zero exit, before anything is changed on the host.

mod common;

use anyhow::Result;
use common::TWILL;
use std::net::UdpSocket;
use std::process::Command;
use twill_lab::Lab;

/// Run twill in the first host of a fresh lab and return (success, stderr).
fn twill_in_lab(lab: &Lab, args: &[&str]) -> Result<(bool, String)> {
    let out = Command::new("ip")
        .args(["netns", "exec", lab.host(0).ns.name(), TWILL])
        .args(args)
        .output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into(),
    ))
}

const STATIC: [&str; 6] = [
    "run",
    "--network",
    "10.5.0.0/16",
    "--peer",
    "10.5.2.0/24=10.200.0.2",
    "--subnet-file=/dev/null/none",
];

fn assert_fails_with(lab: &Lab, extra: &[&str], expected: &str) -> Result<()> {
    let mut args = STATIC.to_vec();
    args.extend_from_slice(extra);
    let (ok, stderr) = twill_in_lab(lab, &args)?;
    assert!(!ok, "twill {args:?} succeeded");
    assert!(
        stderr.contains(expected),
        "expected {expected:?} in:\n{stderr}"
    );
    assert!(
        lab.host(0).ns.ip(&["link", "show", "twill0"]).is_err(),
        "a failed start left twill0 behind"
    );
    Ok(())
}

#[test]
fn bad_cidr_names_the_flag() -> Result<()> {
    let lab = Lab::of("cli-cidr", 2)?;
    assert_fails_with(
        &lab,
        &["--iface", "eth0", "--subnet", "10.5.1.0/33"],
        "--subnet",
    )
}

#[test]
fn tuning_flags_out_of_range_name_the_flag() -> Result<()> {
    let lab = Lab::of("cli-tune", 2)?;
    let base = ["--iface", "eth0", "--subnet", "10.5.1.0/24"];
    for bad in [["--udp-buffer", "4096"], ["--tun-txqueuelen", "0"]] {
        let args = [base.as_slice(), bad.as_slice()].concat();
        assert_fails_with(&lab, &args, bad[0])?;
    }
    Ok(())
}

#[test]
fn subnet_outside_the_network_is_refused() -> Result<()> {
    let lab = Lab::of("cli-out", 2)?;
    assert_fails_with(
        &lab,
        &["--iface", "eth0", "--subnet", "10.9.1.0/24"],
        "outside the network",
    )
}

#[test]
fn missing_iface_is_named() -> Result<()> {
    let lab = Lab::of("cli-if", 2)?;
    assert_fails_with(
        &lab,
        &["--iface", "nosuch0", "--subnet", "10.5.1.0/24"],
        "interface nosuch0 does not exist",
    )
}

/// On either dataplane: the default (eBPF, which holds the port though its programs take the
/// datagrams first) and the TUN engine (whose socket reads them).
#[test]
fn port_in_use_is_named() -> Result<()> {
    let lab = Lab::of("cli-port", 2)?;
    let host = lab.host(0);
    let blocker = host
        .ns
        .enter(|| UdpSocket::bind((host.underlay_ip, 8285)))?;
    let result = [&[][..], &["--dataplane", "tun"]]
        .iter()
        .try_for_each(|dataplane| {
            let args = [&["--iface", "eth0", "--subnet", "10.5.1.0/24"], *dataplane].concat();
            assert_fails_with(&lab, &args, "port 8285 is already in use")
        });
    drop(blocker);
    result
}

#[test]
fn without_net_admin_it_says_so() -> Result<()> {
    let lab = Lab::of("cli-cap", 2)?;
    let mut args = vec![
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        TWILL,
    ];
    args.extend_from_slice(&STATIC);
    args.extend(["--iface", "eth0", "--subnet", "10.5.1.0/24"]);
    let out = Command::new("ip")
        .args(["netns", "exec", lab.host(0).ns.name(), "setpriv"])
        .args(&args)
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("needs root or CAP_NET_ADMIN"), "{stderr}");
    Ok(())
}

#[test]
fn port_zero_is_refused() -> Result<()> {
    let lab = Lab::of("cli-p0", 2)?;
    assert_fails_with(
        &lab,
        &["--iface", "eth0", "--subnet", "10.5.1.0/24", "--port", "0"],
        "--port",
    )
}

#[test]
fn an_mtu_the_underlay_cannot_carry_is_refused() -> Result<()> {
    let lab = Lab::of("cli-mtu", 2)?;
    let base = ["--iface", "eth0", "--subnet", "10.5.1.0/24"];
    for (mtu, expected) in [
        (
            "9000",
            "--mtu 9000 does not fit: it must be between 576 and 1472 (eth0 has MTU 1500",
        ),
        ("1473", "--mtu 1473 does not fit"),
        ("0", "--mtu 0 does not fit"),
        ("67", "--mtu 67 does not fit"),
    ] {
        let args = [base.as_slice(), &["--mtu", mtu]].concat();
        assert_fails_with(&lab, &args, expected)?;
    }
    let (ok, stderr) = twill_in_lab(
        &lab,
        &[STATIC.as_slice(), &base, &["--mtu", "9000"]].concat(),
    )?;
    assert!(
        !ok && !stderr.contains("offloads"),
        "a misleading line: {stderr}"
    );
    Ok(())
}

#[test]
fn a_subnet_with_host_bits_is_refused() -> Result<()> {
    let lab = Lab::of("cli-host", 2)?;
    assert_fails_with(
        &lab,
        &["--iface", "eth0", "--subnet", "10.5.1.7/24"],
        "--subnet 10.5.1.7/24 has host bits set; the subnet is 10.5.1.0/24",
    )
}

#[test]
fn a_peer_at_our_own_address_is_refused() -> Result<()> {
    let lab = Lab::of("cli-self", 2)?;
    assert_fails_with(
        &lab,
        &[
            "--iface",
            "eth0",
            "--subnet",
            "10.5.1.0/24",
            "--peer",
            "10.5.3.0/24=10.200.0.1",
        ],
        "--peer 10.5.3.0/24=10.200.0.1: its PublicIP 10.200.0.1 is this node's own",
    )
}

#[test]
fn no_underlay_without_iface_or_default_route_is_named() -> Result<()> {
    let lab = Lab::of("cli-route", 2)?;
    let args = ["run", "--network", "10.5.0.0/16", "--subnet", "10.5.1.0/24"];
    let (ok, stderr) = twill_in_lab(&lab, &args)?;
    assert!(!ok);
    assert!(
        stderr.contains("no IPv4 default route") && stderr.contains("--iface"),
        "{stderr}"
    );
    Ok(())
}

/// An IPv4 network on an interface without an IPv4 address is named at start; only an
/// IPv6-only network runs there.
#[test]
fn an_interface_without_ipv4_is_named_on_an_ipv4_network() -> Result<()> {
    let lab = Lab::of("cli-noip4", 2)?;
    lab.host(0).ns.ip(&["-4", "addr", "flush", "dev", "eth0"])?;
    assert_fails_with(
        &lab,
        &["--iface", "eth0", "--subnet", "10.5.1.0/24"],
        "interface eth0 has no IPv4 address",
    )
}

/// Extra flags, environment, and the words expected on stderr.
type KubeCase<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);

/// `--kube-subnet-mgr` without a node name, with a bad annotation prefix, a missing
/// net-conf.json, or beside etcd flags: one line each, naming what to fix.
#[test]
fn kube_mode_flag_errors_are_named() -> Result<()> {
    let lab = Lab::of("cli-kube", 2)?;
    let dir = tempfile::tempdir()?;
    let net_conf = dir.path().join("net-conf.json");
    std::fs::write(
        &net_conf,
        r#"{"Network":"10.5.0.0/16","Backend":{"Type":"udp"}}"#,
    )?;
    let conf = format!("--net-config-path={}", net_conf.display());
    let kube = [
        "run",
        "--kube-subnet-mgr",
        "--iface",
        "eth0",
        "--kube-api-url",
        "https://127.0.0.1:1",
    ];
    let cases: [KubeCase; 5] = [
        (&[&conf], &[], "set NODE_NAME"),
        (
            &["--net-config-path=/nonexistent/net-conf.json"],
            &[("NODE_NAME", "n1")],
            "cannot read --net-config-path /nonexistent/net-conf.json",
        ),
        (
            &[&conf, "--kube-annotation-prefix=a/b/c"],
            &[("NODE_NAME", "n1")],
            "--kube-annotation-prefix",
        ),
        (
            &[&conf, "--etcd-endpoints=http://127.0.0.1:1"],
            &[("NODE_NAME", "n1")],
            "drop --etcd-endpoints",
        ),
        (
            &[&conf, "--kubeconfig-file=/nonexistent/kubeconfig"],
            &[("NODE_NAME", "n1")],
            "--kubeconfig-file /nonexistent/kubeconfig",
        ),
    ];
    for (extra, env, expected) in cases {
        let out = Command::new("ip")
            .args(["netns", "exec", lab.host(0).ns.name(), TWILL])
            .args(kube)
            .args(extra)
            .env_remove("NODE_NAME")
            .env_remove("POD_NAME")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .envs(env.iter().copied())
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} succeeded");
        assert!(
            stderr.contains(expected),
            "expected {expected:?} in:\n{stderr}"
        );
    }
    Ok(())
}

#[test]
fn an_unusable_public_ipv6_names_the_flag_and_what_it_is() -> Result<()> {
    let lab = Lab::of("cli-ipv6", 2)?;
    for (value, expected) in [
        (
            "fe80::1",
            "fe80::1 is link-local: other nodes cannot reach this one at it",
        ),
        ("ff02::1", "ff02::1 is multicast"),
        ("::", ":: is unspecified"),
        ("::1", "::1 is loopback"),
        ("10.200.0.1", "\"10.200.0.1\" is not an IPv6 address"),
    ] {
        let flag = format!("--public-ipv6={value}");
        assert_fails_with(&lab, &[&flag], expected)?;
        assert_fails_with(&lab, &[&flag], "--public-ipv6")?;
    }
    Ok(())
}

/// A mistyped `TWILL_DATAPLANE` stops `twill run` and flanneld's command line alike, naming
/// the value and the three it may be, before anything is changed on the host.
#[test]
fn a_mistyped_twill_dataplane_is_named_by_both_faces() -> Result<()> {
    for args in [&["run"][..], &["-etcd-endpoints=http://127.0.0.1:1"][..]] {
        let out = Command::new(TWILL)
            .args(args)
            .env("TWILL_DATAPLANE", "xdp")
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "twill {args:?} ran: {stderr}");
        assert!(
            stderr.contains(r#""xdp" is not a dataplane; give tun, ebpf or auto"#),
            "twill {args:?}: {stderr}"
        );
    }
    Ok(())
}

/// Under twill's own name an unknown subcommand is refused with a usage line and a suggestion,
/// starting nothing: taken as flanneld's command line (as before), `twill stauts` went on to
/// wait for etcd and would have taken a lease and made a device.
#[test]
fn a_mistyped_subcommand_exits_with_a_suggestion_and_starts_nothing() -> Result<()> {
    let lab = Lab::of("cli-typo", 2)?;
    // `cleanup` is `run --cleanup`, which clap does not guess: it gets the usage line alone.
    for (typo, suggested) in [("stauts", Some("status")), ("cleanup", None)] {
        let mut twill = lab.host(0).ns.spawn(TWILL, &[typo])?;
        let stderr = twill.failure_within(
            std::time::Duration::from_secs(10),
            &format!("twill {typo} kept running"),
        )?;
        assert!(
            stderr.contains(&format!("unrecognized subcommand '{typo}'"))
                && suggested.is_none_or(|s| stderr.contains(&format!("'{s}'")))
                && stderr.contains("Usage:"),
            "{stderr}"
        );
        let links = lab.host(0).ns.ip(&["-o", "link", "show"])?;
        assert!(
            !links.contains("flannel") && !links.contains("twill0"),
            "{links}"
        );
    }
    Ok(())
}
