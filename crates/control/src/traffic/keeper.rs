//! Keeping flannel's rules in place, in either mode: written once, then every resync a cheap
//! look at whether anything in the kernel's rules changed at all, and only if something did, a
//! read of flannel's rules and a repair if they are no longer what was written.
//!
//! The cheap look is the whole point: it starts no process and reads a handful of bytes, so a
//! host whose rules do not change costs nothing every `--iptables-resync` (docs/decisions.md).

use super::failure::{explain, Failure};
use crate::status::{NodeStatus, RulesStatus};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// One way of holding flannel's rules in the kernel: nftables tables, or iptables chains
/// through one of iptables' backends.
pub trait Dialect: Send + 'static {
    /// What `twill status` calls the mode: `nftables`, `iptables-nft`, `iptables-legacy`.
    fn mode(&self) -> String;

    /// Where the rules are, as an operator would look for them.
    fn places(&self) -> Vec<String>;

    /// A number that changes whenever the kernel's rules may have changed (nf_tables'
    /// generation, a hash of the legacy tables): the same number means nothing to read.
    /// Starts no process.
    fn generation(&mut self) -> impl Future<Output = Result<u64, Failure>> + Send;

    /// Whether flannel's rules are in the kernel exactly as written.
    fn intact(&mut self) -> impl Future<Output = Result<bool, Failure>> + Send;

    /// Writes the rules, replacing whatever of flannel's the kernel holds (and removing a
    /// chain of a kind not wanted); what of flannel's was there before, by name.
    fn write(&mut self) -> impl Future<Output = Result<Vec<String>, Failure>> + Send;

    /// Removes flannel's rules.
    fn remove(&mut self) -> impl Future<Output = Result<(), Failure>> + Send;
}

/// Writes the rules and keeps them as written.
pub struct Keeper<D> {
    dialect: D,
    /// [`Dialect::generation`] when the rules were last known intact.
    generation: u64,
    status: Arc<NodeStatus>,
}

impl<D: Dialect> Keeper<D> {
    /// Writes the rules for the first time; the keeper, and what of flannel's was there.
    pub async fn start(
        dialect: D,
        status: Arc<NodeStatus>,
        shown: RulesStatus,
    ) -> Result<(Keeper<D>, Vec<String>), Failure> {
        status.set_rules(RulesStatus {
            mode: dialect.mode(),
            places: dialect.places(),
            ..shown
        });
        let mut keeper = Keeper {
            dialect,
            generation: 0,
            status,
        };
        match keeper.write().await {
            Ok(found) => Ok((keeper, found)),
            Err(failure) => {
                // Whatever part got written goes: a start that fails leaves no rules.
                let _ = keeper.dialect.remove().await;
                Err(failure)
            }
        }
    }

    /// Writes the rules, notes the generation, and checks that they read back as written.
    async fn write(&mut self) -> Result<Vec<String>, Failure> {
        let found = self.dialect.write().await?;
        self.generation = self.dialect.generation().await?;
        if !self.dialect.intact().await? {
            return Err(Failure::Unexpected(
                "the rules just written do not read back as written".into(),
            ));
        }
        self.status.update_rules(|s| {
            s.in_place = true;
            s.error = None;
        });
        Ok(found)
    }

    /// Checks every `every` until `stop` fires (or its sender drops), then leaves the rules in
    /// place, as flanneld does when it exits: pod traffic keeps flowing while the node restarts.
    pub async fn keep(mut self, every: Duration, mut stop: oneshot::Receiver<()>) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            // A check runs to its end: stopping never cuts a repair in half.
            tokio::select! {
                _ = tick.tick() => self.check_and_say().await,
                _ = &mut stop => {
                    tracing::info!(mode = self.dialect.mode(), "flannel's rules left in place");
                    return;
                }
            }
        }
    }

    async fn check_and_say(&mut self) {
        match self.check().await {
            Ok(()) => {}
            Err(e) => {
                tracing::warn!("{e}");
                self.status.update_rules(|s| {
                    s.in_place = false;
                    s.error = Some(e);
                });
            }
        }
    }

    async fn check(&mut self) -> Result<(), String> {
        let doing = "check flannel's rules";
        let now = self.dialect.generation().await;
        let now = now.map_err(|f| explain(&f, doing))?;
        self.status.update_rules(|s| s.checks += 1);
        if now == self.generation {
            return Ok(());
        }
        if self
            .dialect
            .intact()
            .await
            .map_err(|f| explain(&f, doing))?
        {
            self.generation = now;
            return Ok(());
        }
        tracing::warn!(
            mode = self.dialect.mode(),
            "flannel's rules were changed or removed; writing them again"
        );
        self.write()
            .await
            .map_err(|f| explain(&f, "repair flannel's rules"))?;
        self.status.update_rules(|s| s.repairs += 1);
        Ok(())
    }
}
