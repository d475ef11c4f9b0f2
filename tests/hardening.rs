//! Hardening 2: what a hostile review of a running node found, each repeated against the built
//! binary. Secrets stay out of logs, `/status` and `/metrics`; errors name the file or flag.

mod common;

use anyhow::{Context, Result};
use common::cluster::PREFIX;
use common::wireguard::{self, OTHER_PSK, PSK};
use common::*;

/// A changed network config is reported by field name; the pre-shared key, old or new, never
/// reaches the log, `/status` or `/metrics`.
#[test]
fn a_changed_psk_is_named_but_never_shown() -> Result<()> {
    let mut w = wireguard::connected("hard-psk", &wireguard::config(PSK, ""))?;
    let new = wireguard::config(OTHER_PSK, "");
    w.c.etcd
        .etcdctl(&["put", &format!("{PREFIX}/config"), &new])?;
    let ns = w.ns(0);
    eventually_within("restart_needed", std::time::Duration::from_secs(10), || {
        Ok(status(ns)?["restart_needed"].is_string())
    })?;
    let status = status(ns)?.to_string();
    assert!(
        status.contains("Backend.PSK <redacted> -> <redacted>"),
        "{status}"
    );
    let metrics = wireguard::metrics(ns)?;
    let log = w.nodes[0].stderr();
    assert!(log.contains("Backend.PSK"), "{log}");
    for (what, text) in [("status", &status), ("metrics", &metrics), ("log", &log)] {
        for secret in [PSK, OTHER_PSK] {
            assert!(
                !text.contains(secret),
                "{what} shows a pre-shared key:\n{text}"
            );
        }
    }
    w.nodes[0]
        .is_running()
        .then_some(())
        .context("node stopped")
}

/// The systemd unit keeps only CAP_NET_ADMIN (CapabilityBoundingSet) and sets NoNewPrivileges;
/// twill, flannel's rules (which it writes through iptables-restore) and its TUN work with
/// exactly that.
#[test]
fn runs_with_only_cap_net_admin_as_the_unit_allows() -> Result<()> {
    twill_lab::require_root()?;
    let mut lab = twill_lab::Lab::new(twill_lab::LabSpec {
        hosts: 2,
        tag: "hard-cap".into(),
        ..Default::default()
    })?;
    let subnets = ["10.5.1.0/24", "10.5.2.0/24"];
    for (host, subnet) in subnets.iter().enumerate() {
        lab.host_mut(host).add_container(subnet.parse()?)?;
    }
    let dir = scratch()?;
    let mut nodes = Vec::new();
    for host in 0..2 {
        let peer = format!("{}={}", subnets[1 - host], lab.host(1 - host).underlay_ip);
        let file = path_in(&dir, &format!("h{host}.env"));
        let file_arg = file.to_str().context("path")?;
        let twill = [
            TWILL,
            "run",
            "--iface=eth0",
            "--network=10.5.0.0/16",
            "--subnet",
            subnets[host],
            "--peer",
            &peer,
            "--ip-masq",
            "--subnet-file",
            file_arg,
        ];
        let args: Vec<&str> = NET_ADMIN_ONLY.iter().chain(&twill).copied().collect();
        let ns = &lab.host(host).ns;
        let mut node = ns.spawn_with("setpriv", &args, &[("RUST_LOG", "info")])?;
        wait_ready(ns, &mut node, &file)?;
        nodes.push(node);
    }
    let (a, b) = (&lab.host(0).containers()[0], &lab.host(1).containers()[0]);
    tcp_transfer_intact(a, b, 4 << 20)?;
    let masquerade = || {
        let ns = &lab.host(0).ns;
        ns.exec("iptables", &["-t", "nat", "-S", "FLANNEL-POSTRTG"])
    };
    let rules = masquerade()?;
    assert!(rules.contains("MASQUERADE"), "{rules}");

    // SIGHUP stops it as SIGTERM does: a log line, exit 0, flannel's rules left in place.
    let pid = nix::unistd::Pid::from_raw(nodes[0].pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP)?;
    let exit = nodes[0].wait_timeout(std::time::Duration::from_secs(5))?;
    assert!(
        exit.is_some_and(|s| s.success()),
        "{exit:?}: {}",
        nodes[0].stderr()
    );
    assert!(nodes[0].stderr().contains("SIGHUP: shutting down"));
    assert_eq!(masquerade()?, rules, "SIGHUP changed the rules");
    Ok(())
}

/// `--etcd-password` alone would be ignored by etcd's client: refused, naming both flags.
#[test]
fn a_password_without_a_user_is_refused() -> Result<()> {
    let out = std::process::Command::new(TWILL)
        .args([
            "run",
            "--etcd-endpoints=http://127.0.0.1:1",
            "--etcd-password=secret",
        ])
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--etcd-password") && stderr.contains("--etcd-username"),
        "{stderr}"
    );
    assert!(!stderr.contains("secret"), "{stderr}");
    Ok(())
}
