//! flannel's nftables mode (`"EnableNFTables": true`): the tables `ip flannel-ipv4` and
//! `ip6 flannel-ipv6` exactly as flanneld v0.28.9 writes them (flannel's
//! pkg/trafficmngr/nftables), over twill's netfilter netlink socket: no nft process.
//!
//! flanneld creates both tables whatever the network's families, with a comment each, and
//! fills in the chains of the families the network has. twill writes both tables in one
//! transaction that first deletes them, so what an earlier run (flanneld's or twill's) left is
//! replaced whole; it then keeps them as the kernel listed them right after the write.

pub mod encode;
mod listing;

use super::failure::Failure;
use super::keeper::Dialect;
use super::nfnl::{Conn, Nftables};
use super::ruleset::{Family, Ruleset};
use listing::Listing;
use std::fmt;

/// An nftables table twill knows by name: flannel's, or the one an earlier twill wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Table {
    pub family: Family,
    pub name: &'static str,
}

impl Table {
    /// flannel's table of `family`: `ip flannel-ipv4`, `ip6 flannel-ipv6`.
    pub fn flannel(family: Family) -> Table {
        let name = match family {
            Family::Ipv4 => "flannel-ipv4",
            Family::Ipv6 => "flannel-ipv6",
        };
        Table { family, name }
    }

    /// The table twill wrote its rules to before it wrote flannel's: `ip twill-ipv4`,
    /// `ip6 twill-ipv6`.
    pub fn earlier_twill(family: Family) -> Table {
        let name = match family {
            Family::Ipv4 => "twill-ipv4",
            Family::Ipv6 => "twill-ipv6",
        };
        Table { family, name }
    }
}

impl fmt::Display for Table {
    /// `ip flannel-ipv4`, as nft names the table.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.family.word(), self.name)
    }
}

/// flannel's two tables, written and kept as flanneld writes them.
pub struct NftablesRules {
    nftables: Nftables,
    /// The rules of each family the network has, IPv4's first.
    rulesets: Vec<Ruleset>,
    /// Both tables as the kernel listed them after the last write; `None` until the first
    /// look after a write.
    written: Option<Vec<Option<Listing>>>,
}

/// Which table to read back, with which of flannel's chains.
type Plan = Vec<(Table, Vec<&'static str>)>;

impl NftablesRules {
    pub fn new(nftables: Nftables, rulesets: Vec<Ruleset>) -> NftablesRules {
        NftablesRules {
            nftables,
            rulesets,
            written: None,
        }
    }

    fn ruleset(&self, family: Family) -> Option<&Ruleset> {
        self.rulesets.iter().find(|r| r.family() == family)
    }

    fn plan(&self) -> Plan {
        let chains = |family| {
            let chains = self.ruleset(family).map(Ruleset::chains);
            let names = chains
                .into_iter()
                .flatten()
                .map(|c| encode::chain_name(c.kind));
            names.collect()
        };
        let tables = Family::ALL.map(|f| (Table::flannel(f), chains(f)));
        tables.into()
    }
}

impl Dialect for NftablesRules {
    fn mode(&self) -> String {
        "nftables".into()
    }

    fn places(&self) -> Vec<String> {
        Family::ALL.map(|f| Table::flannel(f).to_string()).into()
    }

    async fn generation(&mut self) -> Result<u64, Failure> {
        let generation = self.nftables.run(Conn::generation).await?;
        Ok(generation.into())
    }

    async fn intact(&mut self) -> Result<bool, Failure> {
        let plan = self.plan();
        let listed = self.nftables.run(move |c| read_all(c, &plan)).await?;
        if listed.iter().any(Option::is_none) {
            return Ok(false);
        }
        // The first look after a write is what the kernel made of it: compared with the
        // kernel's own listing, its defaults and normal forms never look like a change.
        let written = self.written.get_or_insert_with(|| listed.clone());
        Ok(*written == listed)
    }

    async fn write(&mut self) -> Result<Vec<String>, Failure> {
        let families = Family::ALL;
        let ops: Vec<_> = families
            .iter()
            .flat_map(|&f| encode::replace(f, self.ruleset(f)))
            .collect();
        let found = self
            .nftables
            .run(move |conn| {
                let tables = families.map(Table::flannel);
                let mut found = Vec::new();
                for table in tables {
                    if listing::table(conn, table)?.is_some() {
                        found.push(table.to_string());
                    }
                }
                conn.transact(&ops)?;
                Ok(found)
            })
            .await?;
        self.written = None;
        Ok(found)
    }

    async fn remove(&mut self) -> Result<(), Failure> {
        remove_tables(&self.nftables, &Family::ALL.map(Table::flannel))
            .await
            .map(drop)
    }
}

/// Removes those of `tables` that exist, in one transaction; the ones removed.
pub async fn remove_tables(nftables: &Nftables, tables: &[Table]) -> Result<Vec<Table>, Failure> {
    let tables = tables.to_vec();
    nftables
        .run(move |conn| {
            let mut found = Vec::new();
            for table in tables {
                if listing::table(conn, table)?.is_some() {
                    found.push(table);
                }
            }
            let ops: Vec<_> = found.iter().flat_map(|&t| encode::remove(t)).collect();
            if !ops.is_empty() {
                conn.transact(&ops)?;
            }
            Ok(found)
        })
        .await
}

/// Every table of `plan` as the kernel lists it (`None` for one not there).
fn read_all(conn: &mut Conn, plan: &Plan) -> Result<Vec<Option<Listing>>, Failure> {
    let tables = plan
        .iter()
        .map(|(table, chains)| listing::read(conn, *table, chains));
    tables.collect()
}

/// The first contact with the kernel's nf_tables: the socket, and the ruleset's generation.
/// Fails on a kernel without nf_tables or without the privilege to use it.
pub async fn probe() -> Result<Nftables, Failure> {
    let nftables = Nftables::open()?;
    nftables.run(Conn::generation).await?;
    Ok(nftables)
}
