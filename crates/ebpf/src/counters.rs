//! The programs' counters, summed over the CPUs: totals, drops by the userspace engine's
//! reasons, and each peer's traffic by its subnet.

use crate::maps::{Maps, RawTraffic};
use crate::peers::PeerSet;
use anyhow::Context;
use ipnet::Ipv4Net;
use std::collections::HashMap;
use twill_dataplane::stats::DropReason;

/// Packets and bytes in one direction. Bytes are the inner packets', as the userspace engine
/// counts them; a TCP super-packet counts as the segments it carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    pub packets: u64,
    pub bytes: u64,
}

/// One peer's traffic: `tx` sent to it, `rx` received from it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerTraffic {
    pub tx: Traffic,
    pub rx: Traffic,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// Inner packets encapsulated and sent to a peer.
    pub tx: Traffic,
    /// Inner packets received from peers and handed to the stack.
    pub rx: Traffic,
    /// Every reason, in `DropReason::ALL`'s order, with its count (zero for those the programs
    /// never count).
    pub drops: Vec<(DropReason, u64)>,
    /// ICMP errors the programs did not answer with, held back by the node's ICMP limit.
    pub icmp_rate_limited: u64,
    /// The peers in the maps now; a peer's counters start at zero when it is added or changed.
    pub peers: HashMap<Ipv4Net, PeerTraffic>,
}

impl Counters {
    pub fn drop_count(&self, reason: DropReason) -> u64 {
        self.drops
            .iter()
            .find(|(r, _)| *r == reason)
            .map_or(0, |(_, count)| *count)
    }
}

/// The totals and drops alone: a few map reads whatever the number of peers.
pub(crate) fn read_totals(maps: &Maps) -> anyhow::Result<Counters> {
    let totals = summed(
        maps.totals
            .get(&0, 0)
            .context("reading the totals map")?
            .iter(),
    );
    let mut drops = Vec::with_capacity(DropReason::ALL.len());
    for reason in DropReason::ALL {
        let per_cpu = maps
            .drops
            .get(&(reason as u32), 0)
            .with_context(|| format!("reading the drops map ({})", reason.as_str()))?;
        drops.push((reason, per_cpu.iter().sum()));
    }
    Ok(Counters {
        tx: totals.tx,
        rx: totals.rx,
        drops,
        icmp_rate_limited: maps.read_icmp_budget()?.limited,
        peers: HashMap::new(),
    })
}

/// [`read_totals`] and every peer's traffic.
pub(crate) fn read(maps: &Maps, peers: &PeerSet) -> anyhow::Result<Counters> {
    let mut counters = read_totals(maps)?;
    // Slots are handed out lowest first: reading up to the highest held one reads little else.
    let below = peers.slots().map(|(_, slot)| slot + 1).max().unwrap_or(0);
    let per_slot = maps.peer_traffic_below(below)?;
    let cpus = per_slot.len() / below.max(1) as usize;
    counters.peers.reserve(peers.len());
    for (subnet, slot) in peers.slots() {
        let at = slot as usize * cpus;
        counters
            .peers
            .insert(subnet, summed(per_slot[at..at + cpus].iter()));
    }
    Ok(counters)
}

fn summed<'a>(per_cpu: impl Iterator<Item = &'a RawTraffic>) -> PeerTraffic {
    per_cpu.fold(PeerTraffic::default(), |sum, cpu| PeerTraffic {
        tx: Traffic {
            packets: sum.tx.packets + cpu.tx_packets,
            bytes: sum.tx.bytes + cpu.tx_bytes,
        },
        rx: Traffic {
            packets: sum.rx.packets + cpu.rx_packets,
            bytes: sum.rx.bytes + cpu.rx_bytes,
        },
    })
}
