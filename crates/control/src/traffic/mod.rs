//! flannel's `--ip-masq` and `--iptables-forward-rules` (flannel's pkg/trafficmngr), in one
//! nftables table of twill's own.
//!
//! The rules need the lease's subnet, so they are written once the lease is held, in one
//! transaction that replaces whatever the table held (a restart after SIGKILL leaves exactly
//! one set). Every `--iptables-resync` the table is read back and compared with what was
//! written; if someone changed or removed it, it is written again. A clean shutdown removes it.

mod nft;
mod ruleset;

pub use ruleset::{Ruleset, TABLE};

use crate::lease::Lease;
use crate::node::Node;
use crate::status::NodeStatus;
use anyhow::anyhow;
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// flannel's default `--iptables-resync`.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(5);

/// Which rules a node wants (the `twill run` flags).
#[derive(Debug, Clone)]
pub struct TrafficOptions {
    /// `--ip-masq`: masquerade what leaves the network (also written to FLANNEL_IPMASQ).
    pub ip_masq: bool,
    /// `--iptables-forward-rules`: accept forwarding to and from the network.
    pub forward_rules: bool,
    /// `--iptables-resync`: how often the table is checked and repaired.
    pub resync: Duration,
}

/// flanneld's defaults: no masquerade, forward rules written, checked every 5 s.
impl Default for TrafficOptions {
    fn default() -> Self {
        TrafficOptions {
            ip_masq: false,
            forward_rules: true,
            resync: DEFAULT_RESYNC,
        }
    }
}

impl TrafficOptions {
    fn wanted(&self) -> bool {
        self.ip_masq || self.forward_rules
    }
}

/// What `twill status` shows of the rules.
#[derive(Debug, Clone, Serialize)]
pub struct RulesStatus {
    pub table: String,
    pub ip_masq: bool,
    pub forward_rules: bool,
    /// The table holds exactly what twill wrote, as of the last check.
    pub in_place: bool,
    /// How often the table had to be written again since start.
    pub repairs: u64,
    /// Why the last check or repair failed, if it did.
    pub error: Option<String>,
}

/// The rules this node wants, found possible before anything changed on the host.
pub struct Rules {
    options: TrafficOptions,
    status: Arc<NodeStatus>,
}

impl Rules {
    /// Checks, before the lease is taken, that nft runs and the kernel has nf_tables when rules
    /// are wanted; a clear error otherwise. When none are wanted, a table that an earlier run
    /// left (killed, or started with other flags) is removed.
    pub async fn prepare(node: &Node) -> anyhow::Result<Rules> {
        let options = node.options.traffic.clone();
        if options.wanted() {
            nft::list_table(&ruleset::table())
                .await
                .map_err(|f| anyhow!(nft::explain_probe(&f)))?;
        } else if let Err(f) = nft::apply(&ruleset::remove()).await {
            tracing::debug!("{}", nft::explain(&f, "remove a leftover nftables table"));
        }
        Ok(Rules {
            options,
            status: node.status.clone(),
        })
    }

    /// Writes the rules for `lease` in `network` and keeps them in place until
    /// [`Installed::remove`].
    pub async fn install(
        self,
        network: ipnet::Ipv4Net,
        lease: &Lease,
    ) -> anyhow::Result<Installed> {
        if !self.options.wanted() {
            return Ok(Installed(None));
        }
        let ruleset = Ruleset {
            network,
            subnet: lease.subnet,
            masquerade: self.options.ip_masq,
            forward: self.options.forward_rules,
        };
        let mut keeper = Keeper::new(ruleset, self.status);
        keeper
            .write()
            .await
            .map_err(|f| anyhow!(nft::explain(&f, "write twill's nftables table")))?;
        tracing::info!(
            table = TABLE,
            ip_masq = self.options.ip_masq,
            forward_rules = self.options.forward_rules,
            "nftables rules in place"
        );
        let status = keeper.status.clone();
        let task = tokio::spawn(keeper.keep(self.options.resync));
        Ok(Installed(Some((task, status))))
    }
}

/// Rules in place and kept there by a background task; `None` when no rules are wanted.
pub struct Installed(Option<(JoinHandle<()>, Arc<NodeStatus>)>);

impl Installed {
    /// Stops keeping the rules and removes twill's table.
    pub async fn remove(self) {
        let Some((task, status)) = self.0 else {
            return;
        };
        task.abort();
        let _ = task.await;
        match nft::apply(&ruleset::remove()).await {
            Ok(()) => tracing::info!(table = TABLE, "nftables rules removed"),
            Err(f) => tracing::warn!("{}", nft::explain(&f, "remove twill's nftables table")),
        }
        status.update_rules(|s| s.in_place = false);
    }
}

/// Writes the ruleset, remembers how nft lists it, and puts it back when the listing changes.
struct Keeper {
    ruleset: Ruleset,
    /// The table as nft listed it right after the last write; `None` before the first.
    written: Option<Vec<serde_json::Value>>,
    status: Arc<NodeStatus>,
}

impl Keeper {
    fn new(ruleset: Ruleset, status: Arc<NodeStatus>) -> Keeper {
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
            written: None,
            status,
        }
    }

    async fn write(&mut self) -> Result<(), nft::Failure> {
        nft::apply(&self.ruleset.install()).await?;
        // Compared as nft lists it, so nft's own normal form (e.g. how it prints a prefix)
        // can never look like a change.
        self.written = nft::list_table(&ruleset::table()).await?;
        self.status.update_rules(|s| {
            s.in_place = true;
            s.error = None;
        });
        Ok(())
    }

    async fn keep(mut self, every: Duration) {
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
        let listed = nft::list_table(&ruleset::table())
            .await
            .map_err(|f| nft::explain(&f, "check twill's nftables table"))?;
        if listed.is_some() && listed == self.written {
            return Ok(());
        }
        tracing::warn!(
            table = TABLE,
            "twill's nftables table was changed or removed; writing it again"
        );
        self.write()
            .await
            .map_err(|f| nft::explain(&f, "repair twill's nftables table"))?;
        self.status.update_rules(|s| s.repairs += 1);
        Ok(())
    }
}
