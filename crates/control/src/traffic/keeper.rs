//! Keeping twill's tables in place (IPv4's, and a dual-stack node's IPv6 one): written once in
//! one transaction, read back every resync, written again when what the kernel holds is no
//! longer what twill wrote.

use super::encode;
use super::failure::{explain, Failure};
use super::listing::{self, Listing, Object};
use super::nfnl::Conn;
use super::nfnl::Nftables;
use super::ruleset::{Family, Ruleset, MARK};
use crate::status::NodeStatus;
use crate::status::RulesStatus;
use std::sync::Arc;
use std::time::Duration;

/// Writes the ruleset, remembers how the kernel lists it, and puts it back when the listing
/// changes.
pub struct Keeper {
    /// One per family, IPv4's first.
    rulesets: Vec<Ruleset>,
    nftables: Nftables,
    /// The tables as the kernel listed them right after the last write, in the order of
    /// `rulesets`; empty before the first.
    written: Vec<Option<Listing>>,
    status: Arc<NodeStatus>,
}

/// Which chains of which family's table to read back.
type Plan = Vec<(Family, Vec<&'static str>)>;

/// Warns that a table named like twill's is about to go although twill did not write it: an
/// operator's own, or one a twill from before the mark left. The name is twill's, so it goes,
/// but the operator must hear of it.
pub fn warn_if_foreign(family: Family, table: &Object, doing: &str) {
    if !table.marked() {
        tracing::warn!(
            "nftables table {family} is not marked as twill's (no comment \"{MARK}\"): an \
             operator's own table of that name, or one an older twill left; {doing}, as the name \
             is twill's (give a table of your own another name)"
        );
    }
}

impl Keeper {
    /// Keeps `rulesets`, one per family, IPv4's first; its options (masquerade, forward) are
    /// the same for each.
    pub fn new(rulesets: Vec<Ruleset>, nftables: Nftables, status: Arc<NodeStatus>) -> Keeper {
        let tables: Vec<String> = rulesets.iter().map(|r| r.family().to_string()).collect();
        status.set_rules(RulesStatus {
            table: tables.join(", "),
            ip_masq: rulesets.iter().any(|r| r.masquerade),
            forward_rules: rulesets.iter().any(|r| r.forward),
            in_place: false,
            repairs: 0,
            error: None,
        });
        Keeper {
            rulesets,
            nftables,
            written: Vec::new(),
            status,
        }
    }

    pub fn status(&self) -> Arc<NodeStatus> {
        self.status.clone()
    }

    /// The write at start, which replaces whatever tables of those names there are.
    pub async fn first_write(&mut self) -> Result<(), Failure> {
        let families: Vec<Family> = self.rulesets.iter().map(Ruleset::family).collect();
        let found = self
            .nftables
            .run(move |conn| {
                let tables = families.iter().map(|&f| Ok((f, listing::table(conn, f)?)));
                tables.collect::<Result<Vec<_>, Failure>>()
            })
            .await?;
        for (family, table) in found {
            if let Some(table) = table {
                warn_if_foreign(family, &table, "replacing it");
            }
        }
        self.write().await
    }

    /// Each table and the chains its ruleset has, to be listed.
    fn plan(&self) -> Plan {
        let chains = |r: &Ruleset| r.chains().iter().map(|c| c.name).collect();
        self.rulesets
            .iter()
            .map(|r| (r.family(), chains(r)))
            .collect()
    }

    async fn write(&mut self) -> Result<(), Failure> {
        let ops: Vec<_> = self.rulesets.iter().flat_map(encode::replace).collect();
        let plan = self.plan();
        // Compared as the kernel lists it, so whatever the kernel adds or normalizes (its
        // defaults, a reference count) can never look like a change.
        self.written = self
            .nftables
            .run(move |conn| {
                conn.transact(&ops)?;
                read_all(conn, &plan)
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
        let plan = self.plan();
        let listed = self
            .nftables
            .run(move |conn| read_all(conn, &plan))
            .await
            .map_err(|f| explain(&f, "check twill's nftables tables"))?;
        let changed = listed.iter().zip(&self.written).zip(&self.rulesets);
        let Some(((table, _), ruleset)) = changed
            .into_iter()
            .find(|((now, then), _)| now.is_none() || now != then)
        else {
            return Ok(());
        };
        let family = ruleset.family().to_string();
        match table {
            Some(table) if !table.marked() => tracing::warn!(
                table = family,
                "twill's nftables table was replaced by one without twill's mark; writing \
                 twill's again"
            ),
            _ => tracing::warn!(
                table = family,
                "twill's nftables table was changed or removed; writing it again"
            ),
        }
        self.write()
            .await
            .map_err(|f| explain(&f, "repair twill's nftables tables"))?;
        self.status.update_rules(|s| s.repairs += 1);
        Ok(())
    }
}

/// Every table of `plan` as the kernel lists it (`None` for one not there).
fn read_all(conn: &mut Conn, plan: &Plan) -> Result<Vec<Option<Listing>>, Failure> {
    let tables = plan
        .iter()
        .map(|(family, chains)| listing::read(conn, *family, chains));
    tables.collect()
}
