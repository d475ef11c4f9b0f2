//! Keeping twill's table in place: written once, read back every resync, written again when
//! what the kernel holds is no longer what twill wrote.

use super::encode;
use super::failure::{explain, Failure};
use super::listing::{self, Listing, Object};
use super::nfnl::Nftables;
use super::ruleset::{Ruleset, MARK, TABLE};
use crate::status::NodeStatus;
use crate::status::RulesStatus;
use std::sync::Arc;
use std::time::Duration;

/// Writes the ruleset, remembers how the kernel lists it, and puts it back when the listing
/// changes.
pub struct Keeper {
    ruleset: Ruleset,
    nftables: Nftables,
    /// The table as the kernel listed it right after the last write; `None` before the first.
    written: Option<Listing>,
    status: Arc<NodeStatus>,
}

/// Warns that a table named like twill's is about to go although twill did not write it: an
/// operator's own, or one a twill from before the mark left. The name is twill's, so it goes,
/// but the operator must hear of it.
pub fn warn_if_foreign(table: &Object, doing: &str) {
    if !table.marked() {
        tracing::warn!(
            "nftables table ip {TABLE} is not marked as twill's (no comment \"{MARK}\"): an \
             operator's own table of that name, or one an older twill left; {doing}, as the name \
             is twill's (give a table of your own another name)"
        );
    }
}

impl Keeper {
    pub fn new(ruleset: Ruleset, nftables: Nftables, status: Arc<NodeStatus>) -> Keeper {
        status.set_rules(RulesStatus {
            table: format!("ip {TABLE}"),
            ip_masq: ruleset.masquerade,
            forward_rules: ruleset.forward,
            in_place: false,
            repairs: 0,
            error: None,
        });
        Keeper {
            ruleset,
            nftables,
            written: None,
            status,
        }
    }

    pub fn status(&self) -> Arc<NodeStatus> {
        self.status.clone()
    }

    /// The write at start, which replaces whatever table of that name there is.
    pub async fn first_write(&mut self) -> Result<(), Failure> {
        if let Some(found) = self.nftables.run(listing::table).await? {
            warn_if_foreign(&found, "replacing it");
        }
        self.write().await
    }

    /// The chains the ruleset has, by name, to be listed.
    fn chains(&self) -> Vec<&'static str> {
        self.ruleset.chains().iter().map(|c| c.name).collect()
    }

    async fn write(&mut self) -> Result<(), Failure> {
        let ops = encode::replace(&self.ruleset);
        let chains = self.chains();
        // Compared as the kernel lists it, so whatever the kernel adds or normalizes (its
        // defaults, a reference count) can never look like a change.
        self.written = self
            .nftables
            .run(move |conn| {
                conn.transact(&ops)?;
                listing::read(conn, &chains)
            })
            .await?;
        self.status.update_rules(|s| {
            s.in_place = true;
            s.error = None;
        });
        Ok(())
    }

    pub async fn keep(mut self, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            if let Err(e) = self.check().await {
                tracing::warn!("{e}");
                self.status.update_rules(|s| {
                    s.in_place = false;
                    s.error = Some(e);
                });
            }
        }
    }

    async fn check(&mut self) -> Result<(), String> {
        let chains = self.chains();
        let listed = self
            .nftables
            .run(move |conn| listing::read(conn, &chains))
            .await
            .map_err(|f| explain(&f, "check twill's nftables table"))?;
        if listed.is_some() && listed == self.written {
            return Ok(());
        }
        match &listed {
            Some(table) if !table.marked() => tracing::warn!(
                table = TABLE,
                "twill's nftables table was replaced by one without twill's mark; writing \
                 twill's again"
            ),
            _ => tracing::warn!(
                table = TABLE,
                "twill's nftables table was changed or removed; writing it again"
            ),
        }
        self.write()
            .await
            .map_err(|f| explain(&f, "repair twill's nftables table"))?;
        self.status.update_rules(|s| s.repairs += 1);
        Ok(())
    }
}
