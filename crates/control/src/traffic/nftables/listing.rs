//! flannel's tables as the kernel lists them, to compare with what was written.
//!
//! Objects are kept as their raw netlink attributes, minus the kernel's handle numbers: equal
//! rules compare equal whatever their handles, any other difference (a rule added, deleted or
//! changed, a chain's hook or policy) shows, and nothing needs to understand every expression
//! the kernel could hold.

use super::super::failure::Failure;
use super::super::nfnl::{Answer, Conn};
use super::Table;
use netlink_packet_core::NlasIterator;
use netlink_packet_netfilter::nftables::{
    ChainAttribute, ChainMessage, NfTablesMessage, RuleAttribute, RuleMessage, TableAttribute,
    TableMessage,
};

// include/uapi/linux/netfilter/nf_tables.h
const NFTA_TABLE_HANDLE: u16 = 4;
const NFTA_CHAIN_HANDLE: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_HANDLE: u16 = 3;
/// The handle of the rule before it: a handle number too.
const NFTA_RULE_POSITION: u16 = 6;

/// One table, chain or rule: its `NFT_MSG_NEW*` type and its top-level attributes in the
/// kernel's order, handles left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    kind: u8,
    attributes: Vec<(u16, Vec<u8>)>,
}

/// A table, its chains and its rules, in the kernel's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    table: Object,
    chains: Vec<Option<Object>>,
    rules: Vec<Object>,
}

/// The table alone; `None` when there is none.
pub fn table(conn: &mut Conn, table: Table) -> Result<Option<Object>, Failure> {
    let request = NfTablesMessage::GetTable(TableMessage {
        attributes: vec![TableAttribute::Name(table.name.into())],
    });
    let what = format!("get table {table}");
    let answers = conn.read(table.family, request, false, &what)?;
    let Some(answer) = answers.into_iter().flatten().next() else {
        return Ok(None);
    };
    Object::parse(answer, &[NFTA_TABLE_HANDLE]).map(Some)
}

/// The whole table: itself, the chains named `chains` (`None` for one not there), and all its
/// rules; `None` when there is no table.
///
/// Chains are asked for by name: a chain dump would hold every chain of every `ip` table, which
/// on a node of iptables-nft and kube-proxy runs to thousands. A chain someone else added still
/// shows, as the table's use count (its chains and sets) and in the rules.
pub fn read(conn: &mut Conn, of: Table, chains: &[&str]) -> Result<Option<Listing>, Failure> {
    let Some(table) = table(conn, of)? else {
        return Ok(None);
    };
    let chains = chains
        .iter()
        .map(|name| chain(conn, of, name))
        .collect::<Result<_, _>>()?;
    let name = of.name;
    let rules = NfTablesMessage::GetRule(RuleMessage {
        attributes: vec![RuleAttribute::Table(name.into())],
    });
    // The kernel dumps only the rules of the table named; the filter here is for older ones.
    let what = format!("list the rules of {of}");
    let answers = conn
        .read(of.family, rules, true, &what)?
        .into_iter()
        .flatten();
    let volatile = [NFTA_RULE_HANDLE, NFTA_RULE_POSITION];
    let mut ours = Vec::new();
    for answer in answers {
        let rule = Object::parse(answer, &volatile)?;
        if rule.string(NFTA_RULE_TABLE) == Some(name) {
            ours.push(rule);
        }
    }
    Ok(Some(Listing {
        table,
        chains,
        rules: ours,
    }))
}

fn chain(conn: &mut Conn, table: Table, name: &str) -> Result<Option<Object>, Failure> {
    let request = NfTablesMessage::GetChain(ChainMessage {
        attributes: vec![
            ChainAttribute::Table(table.name.into()),
            ChainAttribute::Name(name.into()),
        ],
    });
    let what = format!("get chain {table} {name}");
    let answers = conn.read(table.family, request, false, &what)?;
    let Some(answer) = answers.into_iter().flatten().next() else {
        return Ok(None);
    };
    Object::parse(answer, &[NFTA_CHAIN_HANDLE]).map(Some)
}

impl Object {
    fn parse(answer: Answer, volatile: &[u16]) -> Result<Object, Failure> {
        let mut attributes = Vec::new();
        for nla in NlasIterator::new(&answer.attributes[..]) {
            let nla = nla.map_err(|e| Failure::Garbled(e.to_string()))?;
            if !volatile.contains(&nla.kind()) {
                attributes.push((nla.kind(), nla.value().to_vec()));
            }
        }
        Ok(Object {
            kind: answer.kind,
            attributes,
        })
    }

    fn attribute(&self, kind: u16) -> Option<&[u8]> {
        let mut found = self.attributes.iter().filter(|(k, _)| *k == kind);
        found.next().map(|(_, value)| &value[..])
    }

    /// A NUL-terminated string attribute.
    fn string(&self, kind: u16) -> Option<&str> {
        let value = self.attribute(kind)?;
        std::str::from_utf8(value.strip_suffix(b"\0").unwrap_or(value)).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::ruleset::Family;
    use super::super::encode;
    use super::*;

    /// An attribute as the kernel lays it out: length, type, value, padding to 4 bytes.
    fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
        let len = 4 + value.len() as u16;
        let mut bytes = [&len.to_ne_bytes()[..], &kind.to_ne_bytes(), value].concat();
        bytes.resize(bytes.len().next_multiple_of(4), 0);
        bytes
    }

    /// `NFTA_TABLE_USERDATA`.
    const USERDATA: u16 = 6;

    fn table(handle: u64, comment: &str) -> Object {
        let userdata = encode::userdata_comment(comment);
        let attributes = [
            nla(1, b"flannel-ipv4\0"),
            nla(NFTA_TABLE_HANDLE, &handle.to_be_bytes()),
            nla(USERDATA, &userdata),
        ]
        .concat();
        let answer = Answer {
            kind: 0,
            attributes,
        };
        Object::parse(answer, &[NFTA_TABLE_HANDLE]).unwrap()
    }

    #[test]
    fn handles_do_not_make_a_difference_and_anything_else_does() {
        let comment = "rules for flannel-ipv4";
        assert_eq!(table(3, comment), table(97, comment));
        assert_ne!(table(3, comment), table(3, "my own"));
    }

    #[test]
    fn a_dumped_rule_is_known_by_its_table_attribute() {
        let answer = Answer {
            kind: 6,
            attributes: [nla(1, b"flannel-ipv4\0"), nla(2, b"postrtg\0")].concat(),
        };
        let rule = Object::parse(answer, &[NFTA_RULE_HANDLE]).unwrap();
        let name = Table::flannel(Family::Ipv4).name;
        assert_eq!(rule.string(NFTA_RULE_TABLE), Some(name));
        assert_eq!(rule.string(2), Some("postrtg"));
    }
}
