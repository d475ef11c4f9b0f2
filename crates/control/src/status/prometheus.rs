//! `/metrics` in Prometheus' text format. Its size does not grow with the number of peers
//! unless `--metrics-per-peer` asks for four series per peer; `twill status` has the per-peer
//! view either way.

use super::{Counted, NodeStatus};
use crate::peers::{Peers, PeersView};
use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;
use twill_dataplane::stats::EngineStats;
use twill_dataplane::table::SharedTable;

impl NodeStatus {
    pub(super) fn to_prometheus(&self) -> String {
        let mut out = String::new();
        let counted = match self.per_peer_metrics {
            true => Counted::PerPeer,
            false => Counted::Totals,
        };
        if let Some(engine) = self.engine_now(counted) {
            let attach = engine.attach.unwrap_or("");
            let _ = writeln!(
                out,
                "# TYPE twill_dataplane_info gauge\ntwill_dataplane_info{{dataplane=\"{}\",attach=\"{attach}\"}} 1",
                engine.name
            );
            write_engine_totals(&mut out, &engine.stats);
            gauge(
                &mut out,
                "twill_table_peers",
                engine.table.load().len() as u64,
            );
            if self.per_peer_metrics {
                write_peer_series(&mut out, &engine.table);
            }
        }
        let view = self.peers.read().unwrap().clone();
        let peers = view.as_ref().map(PeersView::read);
        let count = |f: fn(&Peers) -> usize| peers.as_deref().map_or(0, f) as u64;
        gauge(&mut out, "twill_peers", count(|p| p.accepted().len()));
        gauge(
            &mut out,
            "twill_rejected_leases",
            count(|p| p.refused().len() + p.unreadable().len()),
        );
        let restart = self.restart_needed.read().unwrap().is_some();
        gauge(&mut out, "twill_restart_needed", u64::from(restart));
        if let Some(rules) = self.rules.read().unwrap().as_ref() {
            gauge(&mut out, "twill_rules_in_place", u64::from(rules.in_place));
            counter(&mut out, "twill_rules_repairs_total", rules.repairs);
        }
        let reconciles = self.reconciles();
        counter(&mut out, "twill_reconciles_total", reconciles.count);
        let _ = writeln!(
            out,
            "# TYPE twill_reconcile_last_seconds gauge\ntwill_reconcile_last_seconds {}",
            reconciles.last.as_secs_f64()
        );
        gauge(
            &mut out,
            "twill_reconcile_last_writes",
            reconciles.last_writes,
        );
        counter(
            &mut out,
            "twill_kernel_writes_total",
            self.kernel_writes.load(Relaxed),
        );
        counter(
            &mut out,
            "twill_status_connections_evicted_total",
            self.connections_evicted.load(Relaxed),
        );
        counter(
            &mut out,
            "twill_status_requests_refused_total",
            self.requests_refused.load(Relaxed),
        );
        out
    }
}

fn gauge(out: &mut String, name: &str, value: u64) {
    let _ = writeln!(out, "# TYPE {name} gauge\n{name} {value}");
}

fn counter(out: &mut String, name: &str, value: u64) {
    let _ = writeln!(out, "# TYPE {name} counter\n{name} {value}");
}

/// The engine's totals and its drops by reason: a fixed number of series.
fn write_engine_totals(out: &mut String, stats: &EngineStats) {
    let totals = [
        ("twill_tx_packets_total", stats.tx.packets()),
        ("twill_tx_bytes_total", stats.tx.bytes()),
        ("twill_rx_packets_total", stats.rx.packets()),
        ("twill_rx_bytes_total", stats.rx.bytes()),
        ("twill_tx_datagrams_total", stats.tx_datagrams.load(Relaxed)),
        ("twill_rx_datagrams_total", stats.rx_datagrams.load(Relaxed)),
        (
            "twill_tx_super_packets_total",
            stats.tx_super_packets.load(Relaxed),
        ),
        (
            "twill_rx_super_packets_total",
            stats.rx_super_packets.load(Relaxed),
        ),
        (
            "twill_icmp_rate_limited_total",
            stats.icmp_rate_limited.load(Relaxed),
        ),
    ];
    for (name, value) in totals {
        counter(out, name, value);
    }
    let _ = writeln!(out, "# TYPE twill_drops_total counter");
    for (reason, n) in stats.drops() {
        let _ = writeln!(
            out,
            "twill_drops_total{{reason=\"{}\"}} {n}",
            reason.as_str()
        );
    }
}

/// Packets and bytes each way for every peer: four series per peer.
fn write_peer_series(out: &mut String, table: &SharedTable) {
    for name in ["packets", "bytes"] {
        let _ = writeln!(out, "# TYPE twill_peer_{name}_total counter");
    }
    for peer in table.load().peers().iter() {
        let labels = format!(
            "peer=\"{}\",endpoint=\"{}\"",
            peer.spec.subnet, peer.spec.endpoint
        );
        let s = &peer.stats;
        for (dir, flow) in [("tx", &s.tx), ("rx", &s.rx)] {
            let _ = writeln!(
                out,
                "twill_peer_packets_total{{{labels},dir=\"{dir}\"}} {}\ntwill_peer_bytes_total{{{labels},dir=\"{dir}\"}} {}",
                flow.packets(),
                flow.bytes()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddrV4};
    use std::sync::Arc;
    use twill_dataplane::table::PeerSpec;

    /// A node with `peers` peers in its table, each with some traffic.
    fn node(peers: u32, per_peer: bool) -> NodeStatus {
        let table = Arc::new(SharedTable::default());
        let specs: Vec<PeerSpec> = (0..peers)
            .map(|i| PeerSpec {
                subnet: ipnet::Ipv4Net::new(Ipv4Addr::from(0x0a00_0000 + (i << 8)), 24).unwrap(),
                subnet6: None,
                endpoint: SocketAddrV4::new(Ipv4Addr::from(0xc612_0000 + i), 8285).into(),
                version: 1,
            })
            .collect();
        table.set_peers(&specs);
        for peer in table.load().peers().iter() {
            peer.stats.tx.add(1_000_000, 1_400_000_000);
            peer.stats.rx.add(1_000_000, 1_400_000_000);
        }
        let status = NodeStatus::new(per_peer);
        status.set_engine(crate::status::EngineView {
            name: "tun",
            attach: None,
            ingress: None,
            left_out: Vec::new(),
            table,
            stats: Arc::new(EngineStats::default()),
            refresh: None,
        });
        status
    }

    #[test]
    fn metrics_stay_small_at_5000_peers_by_default() {
        let text = node(5000, false).to_prometheus();
        assert!(text.len() < 100_000, "{} bytes", text.len());
        assert!(!text.contains("twill_peer_packets_total{"), "{text}");
        assert!(text.contains("twill_table_peers 5000"), "{text}");
        assert!(
            text.contains("twill_dataplane_info{dataplane=\"tun\",attach=\"\"} 1"),
            "{text}"
        );
        assert!(text.contains("twill_drops_total{reason=\"no_route\"} 0"));
    }

    #[test]
    fn per_peer_series_only_when_asked() {
        let text = node(3, true).to_prometheus();
        let series = text
            .lines()
            .filter(|l| l.starts_with("twill_peer_"))
            .count();
        assert_eq!(series, 3 * 4, "{text}");
        assert!(text.contains(
            "twill_peer_bytes_total{peer=\"10.0.2.0/24\",endpoint=\"198.18.0.2:8285\",dir=\"rx\"} 1400000000"
        ));
    }
}
