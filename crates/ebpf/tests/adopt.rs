//! The programs outlive the Dataplane that attached them, the next open adopts them with their
//! peers and counters while a ping stream runs on, and remove() leaves nothing behind: over tcx
//! links and over classic TC filters alike, and across a restart that changes between them.

mod common;

use anyhow::{ensure, Result};
use aya::programs::{SchedClassifier, TcAttachType};
use std::net::SocketAddrV4;
use std::time::Duration;
use twill_ebpf::{AttachMode, Opened};
use twill_lab::Host;

#[test]
fn over_tcx_a_reopen_adopts_without_a_gap_and_remove_leaves_nothing() -> Result<()> {
    reopen_adopts_without_a_gap("ebpfadtx", AttachMode::Tcx)
}

#[test]
fn over_classic_tc_a_reopen_adopts_without_a_gap_and_remove_leaves_nothing() -> Result<()> {
    reopen_adopts_without_a_gap("ebpfadtc", AttachMode::Tc)
}

fn reopen_adopts_without_a_gap(tag: &str, mode: AttachMode) -> Result<()> {
    let (lab, nodes) = common::lab_pair(tag, mode)?;
    let [first_a, first_b] = common::open_pair(&lab, &nodes)?;
    let (a, b) = (&lab.host(0).containers()[0], &lab.host(1).containers()[0]);
    assert_eq!(common::ping(&a.ns, b.ip, 2)?.len(), 2, "before");
    let sent = first_a.counters()?.tx;
    drop((first_a, first_b));

    // Nothing holds the programs but their pins now.
    assert_eq!(
        common::ping(&a.ns, b.ip, 2)?.len(),
        2,
        "with no Dataplane open"
    );

    // 100 pings 10 ms apart span the reopen.
    let mut stream = a.ns.spawn(
        "ping",
        &[
            "-n",
            "-q",
            "-c",
            "100",
            "-i",
            "0.01",
            "-W",
            "1",
            &b.ip.to_string(),
        ],
    )?;
    std::thread::sleep(Duration::from_millis(100));
    let (again, opened) = common::open(lab.host(0), &nodes[0])?;
    assert_eq!(opened, Opened::Adopted { peers: 1 });
    let endpoint = SocketAddrV4::new(nodes[1].attachment.local_ip, common::PORT);
    assert_eq!(again.peers()?, vec![(nodes[1].subnet, endpoint.into())]);
    let kept = again.counters()?.tx;
    ensure!(
        kept.packets >= sent.packets && kept.bytes >= sent.bytes,
        "{kept:?} < {sent:?}"
    );
    let status = stream.wait_timeout(Duration::from_secs(10))?;
    let summary = stream.stdout();
    ensure!(
        status.is_some_and(|s| s.success()),
        "ping stream: {summary}"
    );
    ensure!(
        summary.contains(" 0% packet loss"),
        "ping stream across the reopen: {summary}"
    );
    drop(again);

    for (i, node) in nodes.iter().enumerate() {
        attached_as(lab.host(i), node, mode)?;
        // In the host's namespace, as the daemon runs: a filter is found by its device.
        let remove = || twill_ebpf::remove(node.pins.path());
        lab.host(i).ns.enter(remove)?;
        ensure!(
            !node.pins.path().exists(),
            "{} left",
            node.pins.path().display()
        );
        lab.host(i).ns.enter(remove)?;
        nothing_attached(lab.host(i), &node.attachment.underlay)?;
    }
    let out =
        a.ns.exec("ping", &["-n", "-c", "2", "-W", "1", &b.ip.to_string()]);
    ensure!(out.is_err(), "ping still answered after remove: {out:?}");
    Ok(())
}

#[test]
fn a_restart_with_the_other_attachment_swaps_them_and_keeps_the_peers() -> Result<()> {
    let (lab, mut nodes) = common::lab_pair("ebpfswap", AttachMode::Tcx)?;
    let dataplanes = common::open_pair(&lab, &nodes)?;
    let (a, b) = (&lab.host(0).containers()[0], &lab.host(1).containers()[0]);
    assert_eq!(common::ping(&a.ns, b.ip, 2)?.len(), 2, "over tcx");
    drop(dataplanes);
    let endpoint = SocketAddrV4::new(nodes[1].attachment.local_ip, common::PORT);
    for mode in [AttachMode::Tc, AttachMode::Tcx] {
        nodes[0].attachment.attach = mode;
        let (again, _) = common::open(lab.host(0), &nodes[0])?;
        assert_eq!(
            again.peers()?,
            vec![(nodes[1].subnet, endpoint.into())],
            "{mode:?}"
        );
        attached_as(lab.host(0), &nodes[0], mode)?;
        assert_eq!(common::ping(&a.ns, b.ip, 2)?.len(), 2, "after {mode:?}");
    }
    Ok(())
}

#[test]
fn a_deleted_classic_filter_is_noticed_and_put_back() -> Result<()> {
    let (lab, nodes) = common::lab_pair("ebpfdelf", AttachMode::Tc)?;
    let dataplanes = common::open_pair(&lab, &nodes)?;
    let (a, b) = (&lab.host(0).containers()[0], &lab.host(1).containers()[0]);
    let host = lab.host(1);
    assert!(host.ns.enter(|| dataplanes[1].intact())?);
    // The egress filter: b's replies stop. (Without the ingress filter the XDP program's
    // checked and decapsulated packets would still come in, over the underlay device.)
    host.ns
        .exec("tc", &["filter", "del", "dev", common::DEVICE, "egress"])?;
    assert!(!host.ns.enter(|| dataplanes[1].intact())?, "filter deleted");
    let out =
        a.ns.exec("ping", &["-n", "-c", "1", "-W", "1", &b.ip.to_string()]);
    ensure!(out.is_err(), "ping answered without b's egress: {out:?}");
    host.ns.enter(|| dataplanes[1].reopen())?;
    assert!(host.ns.enter(|| dataplanes[1].intact())?, "put back");
    attached_as(host, &nodes[1], AttachMode::Tc)?;
    assert_eq!(common::ping(&a.ns, b.ip, 2)?.len(), 2, "after reopen");
    Ok(())
}

/// The programs run on `node`'s devices as `mode` attaches them, and through nothing else:
/// tcx links, or classic filters that `tc filter show` lists.
fn attached_as(host: &Host, node: &common::Node, mode: AttachMode) -> Result<()> {
    let at = &node.attachment;
    let places = [
        (common::DEVICE, "egress", "twill_egress"),
        (at.underlay.as_str(), "ingress", "twill_ingress"),
    ];
    for (device, hook, program) in places {
        let tcx = tcx_programs(host, device)?;
        let filters = host
            .ns
            .exec("tc", &["filter", "show", "dev", device, hook])?;
        match mode {
            AttachMode::Tc => {
                ensure!(tcx.is_empty(), "{device} runs {tcx:?} over tcx");
                ensure!(
                    filters.contains(program) && filters.contains("direct-action"),
                    "{device} {hook}: {filters}"
                );
            }
            _ => {
                ensure!(tcx.contains(&program.to_string()), "{device}: {tcx:?}");
                ensure!(filters.trim().is_empty(), "{device} {hook}: {filters}");
            }
        }
    }
    Ok(())
}

/// No tcx program and no tc filter on twill's device or the underlay.
fn nothing_attached(host: &Host, underlay: &str) -> Result<()> {
    for device in [common::DEVICE, underlay] {
        let programs = tcx_programs(host, device)?;
        ensure!(programs.is_empty(), "{device} still runs {programs:?}");
        for hook in ["ingress", "egress"] {
            let filters = host
                .ns
                .exec("tc", &["filter", "show", "dev", device, hook])?;
            ensure!(filters.trim().is_empty(), "{device} {hook}: {filters}");
        }
    }
    Ok(())
}

/// The names of the programs on `device`'s tcx hooks, both directions; none on a kernel
/// without tcx (before 6.6, where the query is refused with EINVAL).
fn tcx_programs(host: &Host, device: &str) -> Result<Vec<String>> {
    if aya::util::KernelVersion::current()? < aya::util::KernelVersion::new(6, 6, 0) {
        return Ok(Vec::new());
    }
    host.ns.enter(|| {
        let mut names = Vec::new();
        for hook in [TcAttachType::Ingress, TcAttachType::Egress] {
            let (_, programs) = SchedClassifier::query_tcx(device, hook)?;
            names.extend(
                programs
                    .iter()
                    .map(|p| p.name_as_str().unwrap_or("?").to_string()),
            );
        }
        Ok(names)
    })
}
