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
