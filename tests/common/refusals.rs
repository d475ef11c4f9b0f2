//! What a node accepted and refused, as its `twill status` says: the tests of the duplicate
//! rule wait on these.

use crate::common::{eventually_within, status};
use anyhow::{Context, Result};
use std::time::Duration;
use twill_lab::Netns;

/// A peer of a node's `twill status`: its subnet and public IP.
pub fn peers(ns: &Netns) -> Result<Vec<(String, String)>> {
    let s = status(ns)?;
    let peers = s["peers"].as_array().context("peers")?;
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    Ok(peers
        .iter()
        .map(|p| (text(&p["subnet"]), text(&p["public_ip"])))
        .collect())
}

/// `rejected_leases` of a node's status, as (key, reason) pairs.
pub fn rejected(ns: &Netns) -> Result<Vec<(String, String)>> {
    let s = status(ns)?;
    let rejected = s["rejected_leases"].as_array().context("rejected_leases")?;
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    Ok(rejected
        .iter()
        .map(|r| (text(&r["key"]), text(&r["reason"])))
        .collect())
}

/// Waits until host `host` has exactly the peer `(subnet, ip)` and the refusals `refused`.
pub fn settled(ns: &Netns, peer: (&str, &str), refused: &[(&str, &str)]) -> Result<()> {
    let want_peer = vec![(peer.0.to_string(), peer.1.to_string())];
    let what = format!("peer {peer:?} and refusals {refused:?}");
    eventually_within(&what, Duration::from_secs(15), || {
        let got = rejected(ns)?;
        let refusals_match = got.len() == refused.len()
            && refused
                .iter()
                .all(|(key, why)| got.iter().any(|(k, r)| k == key && r.contains(why)));
        Ok(peers(ns)? == want_peer && refusals_match)
    })
    .with_context(|| format!("peers {:?}, rejected {:?}", peers(ns), rejected(ns)))
}
