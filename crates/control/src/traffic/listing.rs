//! twill's table as the kernel lists it, to compare with what was written and to tell twill's
//! table from someone else's of that name.
//!
//! Objects are kept as their raw netlink attributes, minus the kernel's handle numbers: equal
//! rules compare equal whatever their handles, any other difference (a rule added, deleted or
//! changed, a chain's hook or policy) shows, and nothing needs to understand every expression
//! the kernel could hold.

use super::failure::Failure;
use super::nfnl::{Answer, Conn};
use super::ruleset::{Family, MARK};
use netlink_packet_core::NlasIterator;
use netlink_packet_netfilter::nftables::{
    ChainAttribute, ChainMessage, NfTablesMessage, RuleAttribute, RuleMessage, TableAttribute,
    TableMessage,
};

// include/uapi/linux/netfilter/nf_tables.h
const NFTA_TABLE_HANDLE: u16 = 4;
const NFTA_TABLE_USERDATA: u16 = 6;
const NFTA_CHAIN_HANDLE: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_HANDLE: u16 = 3;
/// The handle of the rule before it: a handle number too.
const NFTA_RULE_POSITION: u16 = 6;
/// libnftnl's userdata record type of a table's comment.
const NFTNL_UDATA_TABLE_COMMENT: u8 = 0;

/// One table, chain or rule: its `NFT_MSG_NEW*` type and its top-level attributes in the
/// kernel's order, handles left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    kind: u8,
    attributes: Vec<(u16, Vec<u8>)>,
}

/// twill's table, its chains and its rules, in the kernel's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    table: Object,
    chains: Vec<Option<Object>>,
    rules: Vec<Object>,
}

impl Listing {
    pub fn marked(&self) -> bool {
        self.table.marked()
    }
}

/// twill's table of `family` alone (`ip twill-ipv4`, `ip6 twill-ipv6`); `None` when there is
/// none.
pub fn table(conn: &mut Conn, family: Family) -> Result<Option<Object>, Failure> {
    let request = NfTablesMessage::GetTable(TableMessage {
        attributes: vec![TableAttribute::Name(family.table().into())],
    });
    let answers = conn.read(family, request, false, &format!("get table {family}"))?;
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
pub fn read(conn: &mut Conn, family: Family, chains: &[&str]) -> Result<Option<Listing>, Failure> {
    let Some(table) = table(conn, family)? else {
        return Ok(None);
    };
    let chains = chains
        .iter()
        .map(|name| chain(conn, family, name))
        .collect::<Result<_, _>>()?;
    let name = family.table();
    let rules = NfTablesMessage::GetRule(RuleMessage {
        attributes: vec![RuleAttribute::Table(name.into())],
    });
    // The kernel dumps only the rules of the table named; the filter here is for older ones.
    let what = format!("list the rules of {family}");
    let answers = conn.read(family, rules, true, &what)?.into_iter().flatten();
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

fn chain(conn: &mut Conn, family: Family, name: &str) -> Result<Option<Object>, Failure> {
    let request = NfTablesMessage::GetChain(ChainMessage {
        attributes: vec![
            ChainAttribute::Table(family.table().into()),
            ChainAttribute::Name(name.into()),
        ],
    });
    let answers = conn.read(
        family,
        request,
        false,
        &format!("get chain {family} {name}"),
    )?;
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

    /// Whether this table carries twill's comment.
    pub fn marked(&self) -> bool {
        self.attribute(NFTA_TABLE_USERDATA)
            .and_then(comment)
            .is_some_and(|c| c == MARK.as_bytes())
    }
}

/// The comment record of libnftnl userdata (records of type, length, value), without its NUL.
fn comment(mut userdata: &[u8]) -> Option<&[u8]> {
    while let [kind, len, rest @ ..] = userdata {
        let value = rest.get(..usize::from(*len))?;
        if *kind == NFTNL_UDATA_TABLE_COMMENT {
            return Some(value.strip_suffix(b"\0").unwrap_or(value));
        }
        userdata = &rest[value.len()..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::encode;
    use super::*;

    /// An attribute as the kernel lays it out: length, type, value, padding to 4 bytes.
    fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
        let len = 4 + value.len() as u16;
        let mut bytes = [&len.to_ne_bytes()[..], &kind.to_ne_bytes(), value].concat();
        bytes.resize(bytes.len().next_multiple_of(4), 0);
        bytes
    }

    fn table(handle: u64, userdata: Option<&[u8]>) -> Object {
        let mut attributes = [nla(1, b"twill-ipv4\0"), nla(4, &handle.to_be_bytes())].concat();
        if let Some(data) = userdata {
            attributes.extend(nla(NFTA_TABLE_USERDATA, data));
        }
        let answer = Answer {
            kind: 0,
            attributes,
        };
        Object::parse(answer, &[NFTA_TABLE_HANDLE]).unwrap()
    }

    #[test]
    fn handles_do_not_make_a_difference() {
        let mark = encode::comment(MARK);
        assert_eq!(table(3, Some(&mark)), table(97, Some(&mark)));
        assert_ne!(table(3, Some(&mark)), table(3, None));
    }

    #[test]
    fn only_twills_comment_marks_the_table() {
        assert!(table(1, Some(&encode::comment(MARK))).marked());
        assert!(!table(1, None).marked());
        assert!(!table(1, Some(&encode::comment("my own NAT"))).marked());
        // A record of another type first, then the comment.
        let both = [&[7u8, 2, 0, 0][..], &encode::comment(MARK)].concat();
        assert!(table(1, Some(&both)).marked());
        // Truncated userdata is no mark, and no panic.
        assert!(!table(1, Some(&[0, 200, b'm'])).marked());
    }

    #[test]
    fn a_dumped_rule_is_known_by_its_table_attribute() {
        let answer = Answer {
            kind: 6,
            attributes: [nla(1, b"twill-ipv4\0"), nla(2, b"postrtg\0")].concat(),
        };
        let rule = Object::parse(answer, &[NFTA_RULE_HANDLE]).unwrap();
        assert_eq!(rule.string(NFTA_RULE_TABLE), Some(Family::Ipv4.table()));
        assert_eq!(rule.string(2), Some("postrtg"));
    }
}
