//! What a start of the eBPF dataplane made and no reconcile has proven yet, and how a start
//! that fails takes it back: the device it created, the programs it loaded fresh, the network
//! routes it replaced. An adopted device or dataplane is a running node's, and stays.

use super::device;
use crate::host::netlink::{Netlink, Route, Write};
use anyhow::Context;
use std::path::Path;

/// Takes back what a failed start made (the device it created, the programs it loaded fresh)
/// and gives back the error that failed it.
pub(super) async fn undo(
    nl: &Netlink,
    made: device::Made,
    fresh: Option<twill_ebpf::Dataplane>,
    error: anyhow::Error,
) -> anyhow::Error {
    if let Some(dataplane) = fresh {
        if let Err(e) = dataplane.remove() {
            tracing::warn!("removing the programs of a failed start: {e:#}");
        }
    }
    if made.created {
        if let Err(e) = nl.delete_link(made.link.index).await {
            tracing::warn!("removing the device of a failed start: {e:#}");
        }
    }
    error
}

/// What a start made that nothing has proven yet: until the first reconcile, the node is not
/// forwarding, and a start that fails before it takes these away again. From the first
/// reconcile on, they outlive the daemon by design.
#[derive(Debug, Default)]
pub(super) struct Unproven {
    /// The device, if this start created it.
    pub device: Option<String>,
    /// The programs and pins, if this start loaded them fresh.
    pub pins: bool,
    /// The networks' routes before this start took them.
    pub replaced: Vec<Route>,
}

impl Unproven {
    /// Takes back what is still unproven, with the pins under `pin_dir`. Runs when the backend
    /// is dropped, inside the daemon's runtime, which cannot be blocked on: a thread of its
    /// own, with a runtime of its own, does the work.
    pub(super) fn take_back(self, pin_dir: &Path) {
        if self.device.is_none() && !self.pins && self.replaced.is_empty() {
            return;
        }
        let unproven = self;
        let undone = std::thread::scope(|s| {
            s.spawn(|| -> anyhow::Result<()> {
                if unproven.pins {
                    twill_ebpf::remove_anyway(pin_dir)?;
                }
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(async {
                    let nl = Netlink::connect().context("opening rtnetlink")?;
                    if let Some(device) = &unproven.device {
                        device::remove(&nl, device).await?;
                    }
                    for route in unproven.replaced {
                        let given_back = nl.write_one(Write::ReplaceRoute(route)).await;
                        given_back.context("giving the network's route back")?;
                    }
                    Ok(())
                })
            })
            .join()
        });
        match undone {
            Ok(Ok(())) => tracing::info!("took back what the failed start made"),
            Ok(Err(e)) => tracing::warn!("taking back what the failed start made: {e:#}"),
            Err(_) => tracing::warn!("taking back what the failed start made panicked"),
        }
    }
}
