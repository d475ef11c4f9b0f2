//! flannel's `--ip-masq` and `--iptables-forward-rules` (flannel's pkg/trafficmngr), written
//! where flanneld v0.28.9 writes them, so flannel's tools and its end-to-end suite find them:
//! iptables chains FLANNEL-POSTRTG and FLANNEL-FWD by default (`iptables/`), or with
//! `"EnableNFTables": true` in the network config the nftables tables `ip flannel-ipv4` and
//! `ip6 flannel-ipv6` (`nftables/`).
//!
//! The rules need the lease's subnets, so they are written once the lease is held; whatever of
//! flannel's was there (flanneld's, an earlier run's) is replaced, and the other mode's rules go
//! (`leftovers.rs`). Every `--iptables-resync` the keeper looks whether anything changed, and
//! repairs what did (`keeper.rs`). A node that stops leaves them in place, as flanneld does.

mod failure;
mod iptables;
mod keeper;
mod leftovers;
mod nfnl;
mod nftables;
mod ruleset;

use crate::config::Config;
use crate::lease::Lease;
use crate::status::{NodeStatus, RulesStatus};
use anyhow::anyhow;
use failure::{explain, explain_probe};
use iptables::tools::{self, Backend};
use iptables::{Generation, IptablesRules};
use keeper::{Dialect, Keeper};
use leftovers::Keep;
use nfnl::Nftables;
use nftables::NftablesRules;
use ruleset::{Family, Mode, Ruleset};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
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
    /// Masquerade with fully random source ports; off with `--ip-masq-fully-random-disable`.
    pub fully_random: bool,
    /// `--iptables-resync`: how often the rules are checked and repaired.
    pub resync: Duration,
}

/// flanneld's defaults: no masquerade, forward rules written, fully random, checked every 5 s.
impl Default for TrafficOptions {
    fn default() -> Self {
        TrafficOptions {
            ip_masq: false,
            forward_rules: true,
            fully_random: true,
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
    /// How they will be written; `None` when none are wanted.
    writer: Option<Writer>,
}

enum Writer {
    Nftables(Nftables),
    Iptables(Backend, Generation),
}

/// What an operator does when nftables mode cannot be.
const NFTABLES_FIX: &str = "set \"EnableNFTables\" to false in the network config to have \
                            flannel's iptables chains instead, or run with \
                            --iptables-forward-rules=false and without --ip-masq";

const IPTABLES_NFT: &str = "use iptables-nft for flannel's iptables chains";
const IPTABLES_NFT_FIX: &str = "install iptables-legacy (Debian's iptables package has it), or \
                                run with --iptables-forward-rules=false and without --ip-masq";

impl Rules {
    /// Checks, before the lease is taken, that the rules can be written in the mode the network
    /// config names (the kernel's nf_tables, or the host's iptables), with a clear error
    /// otherwise. When none are wanted, what an earlier run or flanneld left is removed.
    pub async fn prepare(
        options: TrafficOptions,
        config: &Config,
        status: Arc<NodeStatus>,
    ) -> anyhow::Result<Rules> {
        if !options.wanted() {
            leftovers::remove(Keep::Nothing).await;
            return Ok(Rules {
                options,
                status,
                writer: None,
            });
        }
        let families: Vec<Family> = [
            config.ipv4.as_ref().map(|_| Family::Ipv4),
            config.ipv6.as_ref().map(|_| Family::Ipv6),
        ]
        .into_iter()
        .flatten()
        .collect();
        let writer = match Mode::of(config.enable_nftables) {
            Mode::Nftables => {
                let what = "write flannel's nftables tables (\"EnableNFTables\": true in the \
                            network config)";
                let probed = nftables::probe().await;
                Writer::Nftables(
                    probed.map_err(|f| anyhow!(explain_probe(&f, what, NFTABLES_FIX)))?,
                )
            }
            Mode::Iptables => {
                let chosen = tools::choose(&families).await;
                let what = "write flannel's iptables chains";
                let backend = chosen.map_err(|f| anyhow!(explain(&f, what)))?;
                let generation = IptablesRules::probe(backend, &families).await;
                let generation = generation.map_err(|f| match backend {
                    Backend::Nft => anyhow!(explain_probe(&f, IPTABLES_NFT, IPTABLES_NFT_FIX)),
                    Backend::Legacy => anyhow!(explain(&f, "read iptables-legacy's tables")),
                })?;
                Writer::Iptables(backend, generation)
            }
        };
        Ok(Rules {
            options,
            status,
            writer: Some(writer),
        })
    }

    /// Writes the rules for `lease` in the network of `config` (both families on a dual-stack
    /// node), removes what the other mode left, and keeps them in place until
    /// [`Installed::leave`] or [`Installed::remove`].
    pub async fn install(mut self, config: &Config, lease: &Lease) -> anyhow::Result<Installed> {
        let Some(writer) = self.writer.take() else {
            return Ok(Installed(None));
        };
        let mode = match writer {
            Writer::Nftables(_) => Mode::Nftables,
            Writer::Iptables(..) => Mode::Iptables,
        };
        let options = &self.options;
        let ruleset = |network, subnet| Ruleset {
            mode,
            network,
            subnet,
            masquerade: options.ip_masq,
            forward: options.forward_rules,
            fully_random: options.fully_random,
        };
        let v4 = config.ipv4.as_ref().zip(lease.subnets.v4());
        let v4 = v4.map(|(v4, subnet)| ruleset(v4.network.into(), subnet.into()));
        let v6 = config.ipv6.as_ref().zip(lease.subnets.v6());
        let v6 = v6.map(|(v6, subnet)| ruleset(v6.network.into(), subnet.into()));
        let rulesets: Vec<Ruleset> = v4.into_iter().chain(v6).collect();
        let (installed, keep) = match writer {
            Writer::Nftables(nftables) => {
                let dialect = NftablesRules::new(nftables, rulesets);
                (self.keep(dialect).await?, Keep::Nftables)
            }
            Writer::Iptables(backend, generation) => {
                let dialect = IptablesRules::new(backend, generation, &rulesets);
                (self.keep(dialect).await?, Keep::Iptables(backend))
            }
        };
        leftovers::remove(keep).await;
        Ok(installed)
    }

    async fn keep<D: Dialect>(&self, dialect: D) -> anyhow::Result<Installed> {
        let shown = RulesStatus {
            ip_masq: self.options.ip_masq,
            forward_rules: self.options.forward_rules,
            fully_random: self.options.fully_random,
            ..RulesStatus::default()
        };
        let (mode, places) = (dialect.mode(), dialect.places());
        let started = Keeper::start(dialect, self.status.clone(), shown).await;
        let (keeper, found) = started.map_err(|f| anyhow!(explain(&f, "write flannel's rules")))?;
        if !found.is_empty() {
            tracing::info!(
                ?found,
                "replaced flannel's rules already there (flanneld's, or an earlier run's)"
            );
        }
        tracing::info!(
            mode,
            ?places,
            ip_masq = self.options.ip_masq,
            forward_rules = self.options.forward_rules,
            "flannel's rules in place"
        );
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(keeper.keep(self.options.resync, stopped));
        Ok(Installed(Some(Kept { task, stop })))
    }
}

/// Rules in place and kept there by a background task; `None` when no rules are wanted.
pub struct Installed(Option<Kept>);

struct Kept {
    task: JoinHandle<()>,
    stop: oneshot::Sender<()>,
}

impl Installed {
    /// Stops keeping the rules and leaves them in place, as flanneld does when it exits: pod
    /// traffic keeps its masquerade and its way through a FORWARD DROP while the node restarts.
    pub async fn leave(self) {
        let Some(kept) = self.0 else {
            return;
        };
        let _ = kept.stop.send(());
        let _ = kept.task.await;
    }
}
