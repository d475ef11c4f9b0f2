//! flanneld's `--ip-blackhole-route`: a blackhole route for this node's subnets, so that traffic
//! to an address of ours that no container holds is dropped here instead of following a
//! default route back out (where no bridge owns the subnet, as with Canal). Added at start,
//! checked every `--iptables-resync`, added again when gone; left in place at exit, as flanneld
//! leaves it.

use crate::host::netlink::Netlink;
use ipnet::IpNet;
use std::time::Duration;
use tokio::task::JoinHandle;

/// Keeps a blackhole route to each of `subnets` until the task is aborted.
pub fn keep(subnets: Vec<IpNet>, every: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        // The last failure logged per subnet: a failure that repeats every resync is said once.
        let mut failed: Vec<Option<String>> = vec![None; subnets.len()];
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let netlink = match Netlink::connect() {
                Ok(netlink) => netlink,
                Err(e) => {
                    tracing::warn!("blackhole routes: cannot open rtnetlink: {e}");
                    continue;
                }
            };
            for (subnet, failed) in subnets.iter().zip(&mut failed) {
                match netlink.ensure_blackhole(*subnet).await {
                    Ok(true) => tracing::info!("blackhole route {subnet} added"),
                    Ok(false) => {}
                    Err(e) => {
                        let why = e.to_string();
                        if failed.as_ref() != Some(&why) {
                            tracing::warn!("cannot add the blackhole route {subnet}: {why}");
                        }
                        *failed = Some(why);
                        continue;
                    }
                }
                *failed = None;
            }
        }
    })
}
