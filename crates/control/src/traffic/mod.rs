//! flannel's `--ip-masq` and `--iptables-forward-rules` (flannel's pkg/trafficmngr), in
//! nftables tables of twill's own: `ip twill-ipv4`, and on a dual-stack node `ip6 twill-ipv6`.
//!
//! The rules need the lease's subnets, so they are written once the lease is held, in one
//! transaction that replaces whatever the tables held (a restart after SIGKILL leaves exactly
//! one set). Every `--iptables-resync` the table is read back and compared with what was
//! written; if someone changed or removed it, it is written again. A clean shutdown removes it.
//!
//! All of it goes over a netfilter netlink socket of twill's own (`nfnl.rs`): no nft process is
//! started, so a resync costs a few netlink messages, not two forks (docs/decisions.md).

mod encode;
mod failure;
mod keeper;
mod listing;
mod nfnl;
mod ruleset;

pub use ruleset::{Family, Ruleset, MARK};

use crate::config::Config;
use crate::lease::Lease;
use crate::status::NodeStatus;
use anyhow::anyhow;
use failure::{explain, explain_probe};
use keeper::Keeper;
use nfnl::Nftables;
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

/// The rules this node wants, found possible before anything changed on the host.
pub struct Rules {
    options: TrafficOptions,
    status: Arc<NodeStatus>,
    /// The socket, opened and tried when rules are wanted.
    nftables: Option<Nftables>,
}

impl Rules {
    /// Checks, before the lease is taken, that the kernel's nf_tables answers when rules are
    /// wanted; a clear error otherwise. When none are wanted, a table that an earlier run left
    /// (killed, or started with other flags) is removed.
    pub async fn prepare(
        options: TrafficOptions,
        status: Arc<NodeStatus>,
    ) -> anyhow::Result<Rules> {
        let nftables = if options.wanted() {
            Some(probe().await.map_err(|f| anyhow!(explain_probe(&f)))?)
        } else {
            if let Err(f) = remove_leftover().await {
                tracing::debug!("{}", explain(&f, "remove a leftover nftables table"));
            }
            None
        };
        Ok(Rules {
            options,
            status,
            nftables,
        })
    }

    /// Writes the rules for `lease` in the network of `config` (both families on a dual-stack
    /// node) and keeps them in place until [`Installed::remove`].
    pub async fn install(self, config: &Config, lease: &Lease) -> anyhow::Result<Installed> {
        let Some(nftables) = self.nftables else {
            return Ok(Installed(None));
        };
        let ruleset = |network, subnet| Ruleset {
            network,
            subnet,
            masquerade: self.options.ip_masq,
            forward: self.options.forward_rules,
        };
        let v4 = config.ipv4.as_ref().zip(lease.ipv4_subnet());
        let v4 = v4.map(|(v4, subnet)| ruleset(v4.network.into(), subnet.into()));
        let v6 = config.ipv6.as_ref().zip(lease.ipv6_subnet);
        let v6 = v6.map(|(v6, subnet)| ruleset(v6.network.into(), subnet.into()));
        let rulesets: Vec<Ruleset> = v4.into_iter().chain(v6).collect();
        let families: Vec<Family> = rulesets.iter().map(Ruleset::family).collect();
        let mut keeper = Keeper::new(rulesets, nftables.clone(), self.status);
        keeper
            .first_write()
            .await
            .map_err(|f| anyhow!(explain(&f, "write twill's nftables tables")))?;
        tracing::info!(
            tables = ?families.iter().map(|f| f.to_string()).collect::<Vec<_>>(),
            ip_masq = self.options.ip_masq,
            forward_rules = self.options.forward_rules,
            "nftables rules in place"
        );
        let status = keeper.status();
        let task = tokio::spawn(keeper.keep(self.options.resync));
        Ok(Installed(Some(Kept {
            task,
            status,
            nftables,
            families,
        })))
    }
}

/// Opens the socket and reads twill's table: the first contact, which fails clearly on a
/// kernel without nf_tables or without privileges.
async fn probe() -> Result<Nftables, failure::Failure> {
    let nftables = Nftables::open()?;
    nftables.run(|c| listing::table(c, Family::Ipv4)).await?;
    Ok(nftables)
}

/// With no rules wanted: whatever twill's tables an earlier run left go, with a warning for one
/// that does not look like twill's.
async fn remove_leftover() -> Result<(), failure::Failure> {
    let nftables = Nftables::open()?;
    for family in Family::ALL {
        let Some(found) = nftables.run(move |c| listing::table(c, family)).await? else {
            continue;
        };
        keeper::warn_if_foreign(family, &found, "removing it");
        nftables
            .run(move |c| c.transact(&encode::remove(family)))
            .await?;
        tracing::info!(table = %family, "leftover nftables table removed");
    }
    Ok(())
}

/// Rules in place and kept there by a background task; `None` when no rules are wanted.
pub struct Installed(Option<Kept>);

struct Kept {
    task: JoinHandle<()>,
    status: Arc<NodeStatus>,
    nftables: Nftables,
    /// The families whose tables were written.
    families: Vec<Family>,
}

impl Installed {
    /// Stops keeping the rules and removes twill's tables.
    pub async fn remove(self) {
        let Some(kept) = self.0 else {
            return;
        };
        kept.task.abort();
        let _ = kept.task.await;
        let ops: Vec<_> = kept
            .families
            .iter()
            .flat_map(|&f| encode::remove(f))
            .collect();
        match kept.nftables.run(move |c| c.transact(&ops)).await {
            Ok(()) => tracing::info!(tables = ?kept.families, "nftables rules removed"),
            Err(f) => tracing::warn!("{}", explain(&f, "remove twill's nftables tables")),
        }
        kept.status.update_rules(|s| s.in_place = false);
    }
}
