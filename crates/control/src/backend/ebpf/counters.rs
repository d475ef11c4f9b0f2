//! The eBPF dataplane's counters as status shows every engine's: its maps are summed over the
//! CPUs and copied into the same totals and per-peer counters the userspace engine counts into,
//! each time status or metrics are read. Datagrams read from flannel's port, which the
//! programs left to the stack, are added to their malformed.

use crate::status::{Counted, EngineView};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use twill_dataplane::stats::{DropReason, EngineStats, Flow};
use twill_dataplane::table::SharedTable;
use twill_ebpf::{Dataplane, Traffic};

pub fn view(
    dataplane: &Arc<Dataplane>,
    table: &Arc<SharedTable>,
    stats: &Arc<EngineStats>,
    strays: Arc<AtomicU64>,
) -> EngineView {
    let (dataplane, into_table, into_stats) = (dataplane.clone(), table.clone(), stats.clone());
    EngineView {
        name: "ebpf",
        attach: Some(dataplane.hook().name()),
        ingress: Some(dataplane.ingress().name()),
        left_out: dataplane.left_out(),
        table: table.clone(),
        stats: stats.clone(),
        refresh: Some(Arc::new(move |counted| {
            let strays = strays.load(Relaxed);
            copy(&dataplane, counted, strays, &into_table, &into_stats)
        })),
    }
}

/// A metrics scrape wants only the totals: reading 60,000 peers' per-CPU counters on every
/// scrape would cost ~0.1 s and hold the maps' lock against the reconcile.
fn copy(
    dataplane: &Dataplane,
    counted: Counted,
    strays: u64,
    table: &SharedTable,
    stats: &EngineStats,
) {
    let read = match counted {
        Counted::Totals => dataplane.totals(),
        Counted::PerPeer => dataplane.counters(),
    };
    let counters = match read {
        Ok(counters) => counters,
        Err(e) => {
            tracing::warn!("reading the eBPF dataplane's counters: {e:#}");
            return;
        }
    };
    set(&stats.tx, counters.tx);
    set(&stats.rx, counters.rx);
    // One datagram per packet on flannel's wire.
    stats.tx_datagrams.store(counters.tx.packets, Relaxed);
    stats.rx_datagrams.store(counters.rx.packets, Relaxed);
    stats
        .icmp_rate_limited
        .store(counters.icmp_rate_limited, Relaxed);
    for (reason, count) in counters.drops {
        let count = match reason {
            DropReason::Malformed => count + strays,
            _ => count,
        };
        stats.set_drop_count(reason, count);
    }
    if counted == Counted::Totals {
        return;
    }
    let peers = table.load();
    for peer in peers.peers().iter() {
        let of = counters
            .peers
            .get(&peer.spec.subnet)
            .copied()
            .unwrap_or_default();
        set(&peer.stats.tx, of.tx);
        set(&peer.stats.rx, of.rx);
    }
}

fn set(flow: &Flow, traffic: Traffic) {
    flow.packets.store(traffic.packets, Relaxed);
    flow.bytes.store(traffic.bytes, Relaxed);
}
