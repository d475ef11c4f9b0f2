//! One set of flannel's rules on a host: what the mode twill does not run left goes, at start.
//! flanneld's other mode (its iptables chains, or its nftables tables), flannel's chains in the
//! iptables backend not used, and the tables `ip twill-ipv4` / `ip6 twill-ipv6` earlier twills
//! wrote. A host where flanneld ran is taken over quietly: each removal is an info line.

use super::failure::explain;
use super::iptables::{self, tools::Backend};
use super::nfnl::Nftables;
use super::nftables::{self, Table};
use super::ruleset::Family;

/// The rules a node keeps; everything else of flannel's (and of earlier twills) goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// No rules are wanted.
    Nothing,
    Nftables,
    Iptables(Backend),
}

/// Removes what `keep` does not cover, logging each removal; failures are logged, never fatal:
/// the node's own rules are what it needs.
pub async fn remove(keep: Keep) {
    let earlier_twill = Family::ALL.map(Table::earlier_twill);
    let flannel = Family::ALL.map(Table::flannel);
    let mut tables = earlier_twill.to_vec();
    if keep != Keep::Nftables {
        tables.extend(flannel);
    }
    remove_tables(&tables).await;
    let except = match keep {
        Keep::Iptables(backend) => Some(backend),
        Keep::Nothing | Keep::Nftables => None,
    };
    for chain in iptables::remove_leftovers(except).await {
        tracing::info!(
            chain,
            "removed flannel's iptables chain and the rules jumping to it"
        );
    }
}

async fn remove_tables(tables: &[Table]) {
    // A kernel without nf_tables has no tables to remove.
    let removed = match Nftables::open() {
        Ok(nftables) => nftables::remove_tables(&nftables, tables).await,
        Err(f) => Err(f),
    };
    match removed {
        Ok(removed) => {
            for table in removed {
                let whose = if table == Table::flannel(table.family) {
                    "flannel's nftables mode"
                } else {
                    "an earlier twill"
                };
                tracing::info!(table = %table, "removed the nftables table {whose} wrote");
            }
        }
        Err(f) => tracing::debug!("{}", explain(&f, "look for leftover nftables tables")),
    }
}
