//! WireGuard's timers, run for every peer that has a tunnel every 250 ms as boringtun asks:
//! handshake retries (every 5 s until 90 s), rekeying (every 2 minutes), keepalives (after 10 s
//! of one-way traffic, and every PersistentKeepaliveInterval when set).

use super::peers::Tick;
use super::send::{send_one, HANDSHAKE_INIT_LEN};
use super::Wg;
use crate::stats::{DropReason, DropTally};
use std::time::Duration;

const TICK: Duration = Duration::from_millis(250);

pub(super) async fn run(wg: Wg) {
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut buf = [0u8; HANDSHAKE_INIT_LEN];
    let mut drops = DropTally::default();
    loop {
        interval.tick().await;
        wg.crypto.reset_rate_limit();
        let peers = wg.peers.load();
        for peer in peers.iter() {
            match peer.tick(&mut buf) {
                Tick::Nothing => {}
                Tick::Send(len) => send_one(&wg, peer.endpoint(), &buf[..len], &mut drops),
                Tick::Expired(lost) => drops.add(DropReason::NoSession, lost as u64),
            }
        }
        drops.publish(&wg.io.stats);
    }
}
