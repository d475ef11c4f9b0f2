//! flannel's iptables mode, its default: the chains FLANNEL-POSTRTG (nat, jumped to from
//! POSTROUTING) and FLANNEL-FWD (filter, jumped to from FORWARD) exactly as flanneld v0.28.9
//! writes them (flannel's pkg/trafficmngr/iptables), through the host's own iptables programs,
//! nf_tables-based or legacy (`tools.rs` decides which).
//!
//! Writing goes through `iptables-restore --noflush -w`, as flanneld's does; reading through
//! `iptables-save`. Neither runs while nothing changes: the keeper first compares a generation
//! read without a process (nf_tables' generation number for iptables-nft, a hash of the legacy
//! tables for iptables-legacy), and reads the rules only when it moved (docs/decisions.md).

mod legacy;
mod restore;
mod saved;
mod spec;
pub mod tools;

use super::failure::{explain, Failure};
use super::keeper::Dialect;
use super::nfnl::{Conn, Nftables};
use super::ruleset::{ChainKind, Family, Ruleset};
use saved::Saved;
use spec::ChainSpec;
use tools::Backend;

/// How a backend's generation is read.
pub enum Generation {
    /// iptables-nft: the nf_tables ruleset's generation, over this netlink socket.
    Nft(Nftables),
    /// iptables-legacy: a hash of the legacy tables.
    Legacy,
}

/// flannel's chains in one backend, for the families the network has.
pub struct IptablesRules {
    backend: Backend,
    generation: Generation,
    /// Each family the network has, IPv4's first, with the chains it wants.
    families: Vec<(Family, Vec<ChainSpec>)>,
}

impl IptablesRules {
    /// Where the generation of `backend` is read from, found usable: the first contact, before
    /// anything is written.
    pub async fn probe(backend: Backend, families: &[Family]) -> Result<Generation, Failure> {
        match backend {
            Backend::Nft => Ok(Generation::Nft(super::nftables::probe().await?)),
            Backend::Legacy => {
                legacy::fingerprint(families)?;
                Ok(Generation::Legacy)
            }
        }
    }

    pub fn new(backend: Backend, generation: Generation, rulesets: &[Ruleset]) -> IptablesRules {
        let families = rulesets.iter().map(|r| (r.family(), spec::chains(r)));
        IptablesRules {
            backend,
            generation,
            families: families.collect(),
        }
    }

    fn family_list(&self) -> Vec<Family> {
        self.families.iter().map(|(f, _)| *f).collect()
    }
}

impl Dialect for IptablesRules {
    fn mode(&self) -> String {
        self.backend.name().into()
    }

    fn places(&self) -> Vec<String> {
        let chains = self.families.iter().flat_map(|(family, chains)| {
            let command = tools::command(*family);
            let places = chains.iter().map(move |c| (command, c.names));
            places.map(|(command, n)| format!("{command} -t {} {}", n.table, n.chain))
        });
        chains.collect()
    }

    async fn generation(&mut self) -> Result<u64, Failure> {
        match &self.generation {
            Generation::Nft(nftables) => Ok(nftables.run(Conn::generation).await?.into()),
            Generation::Legacy => legacy::fingerprint(&self.family_list()),
        }
    }

    async fn intact(&mut self) -> Result<bool, Failure> {
        for (family, wanted) in &self.families {
            let saved = tools::save(self.backend, *family).await?;
            let unwanted = ChainKind::ALL
                .into_iter()
                .filter(|&k| !wanted.iter().any(|c| c.kind == k))
                .map(spec::names);
            if !wanted.iter().all(|c| saved.holds(c)) || unwanted.into_iter().any(|n| saved.has(&n))
            {
                return Ok(false);
            }
        }
        Ok(true)
    }

    async fn write(&mut self) -> Result<Vec<String>, Failure> {
        let mut found = Vec::new();
        for (family, wanted) in &self.families {
            let saved = tools::save(self.backend, *family).await?;
            found.extend(present(&saved, *family));
            let input = restore::replace(&saved, wanted);
            if !input.is_empty() {
                tools::restore(self.backend, *family, &input).await?;
            }
        }
        Ok(found)
    }

    async fn remove(&mut self) -> Result<(), Failure> {
        for (family, _) in &self.families {
            let saved = tools::save(self.backend, *family).await?;
            remove_shown(self.backend, *family, &saved).await?;
        }
        Ok(())
    }
}

/// flannel's chains in `saved`, as `iptables -t nat FLANNEL-POSTRTG`.
fn present(saved: &Saved, family: Family) -> Vec<String> {
    let names = ChainKind::ALL.into_iter().map(spec::names);
    let found = names.filter(|n| saved.has(n));
    let command = tools::command(family);
    found
        .map(|n| format!("{command} -t {} {}", n.table, n.chain))
        .collect()
}

/// Removes flannel's chains that `saved` shows in `backend`'s `family`, with the rules jumping
/// to them; whether there were any.
async fn remove_shown(backend: Backend, family: Family, saved: &Saved) -> Result<bool, Failure> {
    let input = restore::remove(saved);
    if input.is_empty() {
        return Ok(false);
    }
    tools::restore(backend, family, &input).await?;
    Ok(true)
}

/// Removes flannel's chains, in both families, from every backend but `except` whose programs
/// are installed: what flanneld (or twill) left in another mode or another backend. What was
/// removed, for the log.
pub async fn remove_leftovers(except: Option<Backend>) -> Vec<String> {
    let mut removed = Vec::new();
    for backend in Backend::ALL.into_iter().filter(|&b| Some(b) != except) {
        for family in Family::ALL {
            // Not installed, or a kernel without that subsystem: nothing to remove there.
            let saved = match tools::save(backend, family).await {
                Ok(saved) => saved,
                Err(f) => {
                    tracing::debug!("{}", explain(&f, "look for flannel's chains"));
                    continue;
                }
            };
            match remove_shown(backend, family, &saved).await {
                Ok(true) => removed.extend(
                    present(&saved, family)
                        .into_iter()
                        .map(|chain| format!("{chain} ({})", backend.name())),
                ),
                Ok(false) => {}
                Err(f) => tracing::warn!(
                    "{}",
                    explain(
                        &f,
                        &format!("remove flannel's chains from {}", backend.name())
                    )
                ),
            }
        }
    }
    removed
}
