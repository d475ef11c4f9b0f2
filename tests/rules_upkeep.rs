//! Keeping flannel's rules costs nothing while nothing changes: every `--iptables-resync` twill
//! reads a generation (nf_tables' number for iptables-nft, a hash of the tables for
//! iptables-legacy) and starts no process unless it moved; a repair runs iptables-restore.
//! What twill runs is counted by stand-ins first on its PATH that log and run the real
//! programs (tests/common/rules.rs).

mod common;

use anyhow::{ensure, Result};
use common::rules::*;
use common::*;
use std::time::Duration;

const MASQ: &[&str] = &["--ip-masq", "--iptables-resync", "1"];
const NETWORK: &str = "10.5.0.0/16";

/// A pair whose host 0's node runs with the stand-ins first on its PATH (`prepare` runs on the
/// host before that node starts).
fn spied(tag: &str, prepare: impl FnOnce(&Pair) -> Result<()>) -> Result<(Pair, Spies)> {
    let mut pair = start_pair(tag, MASQ, None)?;
    pair.nodes[0].stop()?;
    prepare(&pair)?;
    let spies = Spies::new()?;
    let mut args = pair_flags(&pair, 0);
    args.extend(MASQ.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let env = [("PATH", spies.path()?)];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let subnet_file = path_in(&pair.dir, "h0.env");
    pair.nodes[0] = start_twill_with_env(pair.host(0), &args, &env, &subnet_file)?;
    forwarding(&pair.nodes[0])?;
    Ok((pair, spies))
}

fn rules_status(pair: &Pair) -> Result<serde_json::Value> {
    Ok(status(&pair.host(0).ns)?["rules"].clone())
}

fn checks(pair: &Pair) -> Result<u64> {
    Ok(rules_status(pair)?["checks"].as_u64().unwrap_or(0))
}

/// Four more checks, and not one process started meanwhile; what had run before.
fn steady(pair: &Pair, spies: &Spies) -> Result<Vec<String>> {
    let before = spies.ran();
    let from = checks(pair)?;
    eventually_within("four more checks", Duration::from_secs(15), || {
        Ok(checks(pair)? >= from + 4)
    })?;
    let after = spies.ran();
    ensure!(
        after == before,
        "checks that found nothing changed started {:?}",
        &after[before.len().min(after.len())..]
    );
    Ok(before)
}

/// A rule deleted with `command` is put back by a repair, which runs `restore`.
fn repaired(pair: &Pair, spies: &Spies, command: &str, restore: &str) -> Result<()> {
    let before = spies.ran().len();
    let rule = format!(
        "{command} -t nat -D FLANNEL-POSTRTG -s {} -d {NETWORK} -m comment \
         --comment 'flanneld masq' -j RETURN",
        PAIR_SUBNETS[0]
    );
    pair.host(0).ns.sh(&rule)?;
    eventually("the rule repaired", || {
        Ok(rules_status(pair)?["repairs"] == 1 && rules_status(pair)?["in_place"] == true)
    })?;
    let ran = spies.ran();
    ensure!(
        ran[before..].iter().any(|r| r.starts_with(restore)),
        "the repair ran {:?}",
        &ran[before..]
    );
    let expected = recorded("iptables.txt", PAIR_SUBNETS[0], NETWORK)?;
    ensure!(iptables_text(&pair.host(0).ns, command)? == expected);
    Ok(())
}

#[test]
fn iptables_nft_checks_start_no_process_and_a_repair_restores() -> Result<()> {
    let (pair, spies) = spied("up-nft", |_| Ok(()))?;
    ensure!(rules_status(&pair)?["mode"] == "iptables-nft");
    ensure!(
        spies
            .ran()
            .iter()
            .any(|r| r.starts_with("iptables-nft-restore")),
        "the start wrote nothing through the spies: {:?}",
        spies.ran()
    );
    steady(&pair, &spies)?;
    repaired(&pair, &spies, "iptables", "iptables-nft-restore")?;
    steady(&pair, &spies)?;
    Ok(())
}

/// A host whose iptables is legacy (kubelet's hint chain is in the legacy tables): flannel's
/// chains go there, the ones an earlier run left in iptables-nft go, and the checks read the
/// legacy tables through getsockopt, starting nothing.
#[test]
fn iptables_legacy_is_used_where_the_host_uses_it_and_checked_without_a_process() -> Result<()> {
    let (pair, spies) = spied("up-legacy", |pair| {
        let ns = &pair.host(0).ns;
        ensure!(!flannel_iptables_lines(ns, "iptables-nft")?.is_empty());
        let hint = ["-t", "mangle", "-N", "KUBE-IPTABLES-HINT"];
        ns.exec("iptables-legacy", &hint).map(drop)
    })?;
    let ns = &pair.host(0).ns;
    let rules = rules_status(&pair)?;
    ensure!(rules["mode"] == "iptables-legacy", "{rules}");
    let expected = recorded("iptables.txt", PAIR_SUBNETS[0], NETWORK)?;
    ensure!(iptables_text(ns, "iptables-legacy")? == expected);
    let left = flannel_iptables_lines(ns, "iptables-nft")?;
    ensure!(left.is_empty(), "the nf_tables backend kept {left:#?}");
    let log = pair.nodes[0].stderr();
    ensure!(log.contains("removed flannel's iptables chain"), "{log}");

    steady(&pair, &spies)?;
    // Counters move with traffic; the check zeroes them, so traffic is no change.
    ping(pair.container(0), pair.container(1).ip, 3)?;
    steady(&pair, &spies)?;
    repaired(&pair, &spies, "iptables-legacy", "iptables-legacy-restore")?;
    steady(&pair, &spies)?;
    Ok(())
}

/// A stop leaves the rules and starts nothing either.
#[test]
fn a_stop_starts_no_process() -> Result<()> {
    let (mut pair, spies) = spied("up-stop", |_| Ok(()))?;
    let before = spies.ran();
    pair.nodes[0].stop()?;
    ensure!(spies.ran() == before, "{:?}", spies.ran());
    let expected = recorded("iptables.txt", PAIR_SUBNETS[0], NETWORK)?;
    ensure!(iptables_text(&pair.host(0).ns, "iptables")? == expected);
    Ok(())
}
