//! flannel's masquerade and forward rules (pkg/trafficmngr/nftables), as nftables JSON objects.
//!
//! Everything lives in one table of twill's own, `ip twill-ipv4`, as flannel keeps its rules in
//! `ip flannel-ipv4`: chain `postrtg` (nat, postrouting, srcnat) for `--ip-masq`, chain `forward`
//! (filter, forward, filter priority, policy accept) for `--iptables-forward-rules`.
//! docs/ip-masq.md lists them side by side with flannel's.

use ipnet::Ipv4Net;
use nftables::batch::Batch;
use nftables::expr::{BinaryOperation, Expression, Meta, MetaKey, NamedExpression, Payload};
use nftables::expr::{PayloadField, Prefix};
use nftables::schema::{Chain, NfListObject, Nftables, Rule, Table};
use nftables::stmt::{Accept, Match, Operator, Return, Statement, NAT};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};
use std::borrow::Cow;
use std::collections::HashSet;

/// twill's table (family `ip`); nothing else of twill's touches nftables.
pub const TABLE: &str = "twill-ipv4";
const POSTROUTING: &str = "postrtg";
const FORWARD: &str = "forward";

/// A base chain of twill's table, where flannel hooks its own.
#[derive(Clone, Copy)]
struct BaseChain {
    name: &'static str,
    kind: NfChainType,
    hook: NfHook,
    priority: i32,
}

const POSTROUTING_CHAIN: BaseChain = BaseChain {
    name: POSTROUTING,
    kind: NfChainType::NAT,
    hook: NfHook::Postrouting,
    priority: SRCNAT_PRIORITY,
};
const FORWARD_CHAIN: BaseChain = BaseChain {
    name: FORWARD,
    kind: NfChainType::Filter,
    hook: NfHook::Forward,
    priority: FILTER_PRIORITY,
};
/// kube-proxy marks packets it already masquerades; flannel leaves them alone (no double NAT).
const KUBE_PROXY_MARK: u32 = 0x4000;
/// nftables' `srcnat` and `filter` priorities.
const SRCNAT_PRIORITY: i32 = 100;
const FILTER_PRIORITY: i32 = 0;

/// Which of flannel's rules a node wants, for the container network `network` and this node's
/// lease `subnet`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ruleset {
    pub network: Ipv4Net,
    pub subnet: Ipv4Net,
    /// `--ip-masq`: the `postrtg` chain.
    pub masquerade: bool,
    /// `--iptables-forward-rules`: the `forward` chain.
    pub forward: bool,
}

impl Ruleset {
    /// One transaction that replaces whatever twill's table holds (an earlier run killed with
    /// SIGKILL left one) with exactly this ruleset.
    pub fn install(&self) -> Nftables<'static> {
        let mut batch = replace_table();
        let chains = [
            (self.masquerade, POSTROUTING_CHAIN, self.masquerade_rules()),
            (self.forward, FORWARD_CHAIN, self.forward_rules()),
        ];
        for (_, chain, rules) in chains.into_iter().filter(|(wanted, ..)| *wanted) {
            add_chain(&mut batch, chain, rules);
        }
        batch.to_nftables()
    }

    /// flannel's `postrtg` chain, in flannel's order; N is the network, S this node's subnet.
    fn masquerade_rules(&self) -> Vec<Vec<Statement<'static>>> {
        let (n, s) = (self.network.trunc(), self.subnet.trunc());
        let multicast: Ipv4Net = "224.0.0.0/4".parse().expect("multicast prefix");
        vec![
            // Marked by kube-proxy, which masquerades it itself.
            vec![mark_set(KUBE_PROXY_MARK), ret()],
            // Container to container inside the network, both ways: keep the addresses.
            vec![saddr(Operator::EQ, s), daddr(Operator::EQ, n), ret()],
            vec![saddr(Operator::EQ, n), daddr(Operator::EQ, s), ret()],
            // From outside to this node's containers: keep the client's address.
            vec![saddr(Operator::NEQ, n), daddr(Operator::EQ, s), ret()],
            // Containers to outside the network, except multicast.
            vec![
                saddr(Operator::EQ, n),
                daddr(Operator::NEQ, multicast),
                masquerade(),
            ],
            // From outside the network (e.g. this host) to another node's containers.
            vec![
                saddr(Operator::NEQ, n),
                daddr(Operator::EQ, n),
                masquerade(),
            ],
        ]
    }

    /// flannel's `forward` chain: accept forwarding to and from the network.
    fn forward_rules(&self) -> Vec<Vec<Statement<'static>>> {
        let n = self.network.trunc();
        vec![
            vec![saddr(Operator::EQ, n), accept()],
            vec![daddr(Operator::EQ, n), accept()],
        ]
    }
}

/// The transaction that removes twill's table, whether or not it exists.
pub fn remove() -> Nftables<'static> {
    delete_table().to_nftables()
}

/// The listing command's table, to compare what is in the kernel with what was installed.
pub fn table() -> Table<'static> {
    Table {
        family: NfFamily::IP,
        name: TABLE.into(),
        handle: None,
    }
}

/// `add table; delete table`: adding first makes the delete succeed when there is no table.
fn delete_table() -> Batch<'static> {
    let mut batch = Batch::new();
    batch.add(NfListObject::Table(table()));
    batch.delete(NfListObject::Table(table()));
    batch
}

/// [`delete_table`], then a new empty table: the start of every install, so the table ends
/// up holding only what follows in the same transaction.
fn replace_table() -> Batch<'static> {
    let mut batch = delete_table();
    batch.add(NfListObject::Table(table()));
    batch
}

impl BaseChain {
    fn chain(self) -> Chain<'static> {
        Chain {
            family: NfFamily::IP,
            table: TABLE.into(),
            name: self.name.into(),
            _type: Some(self.kind),
            hook: Some(self.hook),
            prio: Some(self.priority),
            // Never a drop policy: the chain must only ever add to what the host allows.
            policy: Some(NfChainPolicy::Accept),
            ..Chain::default()
        }
    }
}

/// The chain, then its rules in order.
fn add_chain(batch: &mut Batch<'static>, chain: BaseChain, rules: Vec<Vec<Statement<'static>>>) {
    batch.add(NfListObject::Chain(chain.chain()));
    for expr in rules {
        batch.add(NfListObject::Rule(Rule {
            family: NfFamily::IP,
            table: TABLE.into(),
            chain: chain.name.into(),
            expr: Cow::Owned(expr),
            ..Rule::default()
        }));
    }
}

fn saddr(op: Operator, net: Ipv4Net) -> Statement<'static> {
    address_match("saddr", op, net)
}

fn daddr(op: Operator, net: Ipv4Net) -> Statement<'static> {
    address_match("daddr", op, net)
}

/// `ip saddr|daddr [!=] NET`.
fn address_match(field: &'static str, op: Operator, net: Ipv4Net) -> Statement<'static> {
    Statement::Match(Match {
        left: Expression::Named(NamedExpression::Payload(Payload::PayloadField(
            PayloadField {
                protocol: "ip".into(),
                field: field.into(),
            },
        ))),
        right: Expression::Named(NamedExpression::Prefix(Prefix {
            addr: Box::new(Expression::String(net.network().to_string().into())),
            len: u32::from(net.prefix_len()),
        })),
        op,
    })
}

/// `meta mark & MARK == MARK`.
fn mark_set(mark: u32) -> Statement<'static> {
    Statement::Match(Match {
        left: Expression::BinaryOperation(Box::new(BinaryOperation::AND(
            Expression::Named(NamedExpression::Meta(Meta { key: MetaKey::Mark })),
            Expression::Number(mark),
        ))),
        right: Expression::Number(mark),
        op: Operator::EQ,
    })
}

fn ret() -> Statement<'static> {
    Statement::Return(None::<Return>)
}

fn accept() -> Statement<'static> {
    Statement::Accept(None::<Accept>)
}

/// `masquerade fully-random`, as flannel does where the kernel supports it (every kernel with
/// nftables NAT does).
fn masquerade() -> Statement<'static> {
    Statement::Masquerade(Some(NAT {
        addr: None,
        family: None,
        port: None,
        flags: Some(HashSet::from([nftables::stmt::NATFlag::FullyRandom])),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn ruleset(masquerade: bool, forward: bool) -> Ruleset {
        Ruleset {
            network: "10.5.0.0/16".parse().unwrap(),
            subnet: "10.5.1.0/24".parse().unwrap(),
            masquerade,
            forward,
        }
    }

    /// The rules of `chain` in the transaction, each in nft's own text syntax, so the test
    /// reads like flannel's rule list.
    fn rules_as_text(batch: &Nftables, chain: &str) -> Vec<String> {
        let json = serde_json::to_value(batch).unwrap();
        json["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|cmd| cmd["add"]["rule"].as_object())
            .filter(|rule| rule["chain"] == chain)
            .map(|rule| rule["expr"].as_array().unwrap().iter().map(text).collect())
            .map(|words: Vec<String>| words.join(" "))
            .collect()
    }

    fn text(stmt: &Value) -> String {
        if let Some(m) = stmt.get("match") {
            let left = match &m["left"] {
                Value::Object(o) if o.contains_key("payload") => {
                    format!("ip {}", o["payload"]["field"].as_str().unwrap())
                }
                other => format!("meta mark & {}", other["&"][1]),
            };
            let right = match &m["right"] {
                Value::Object(o) => format!(
                    "{}/{}",
                    o["prefix"]["addr"].as_str().unwrap(),
                    o["prefix"]["len"]
                ),
                other => other.to_string(),
            };
            return format!("{left} {} {right}", m["op"].as_str().unwrap());
        }
        if let Some(nat) = stmt.get("masquerade") {
            return format!("masquerade {}", nat["flags"][0].as_str().unwrap());
        }
        stmt.as_object().unwrap().keys().next().unwrap().clone()
    }

    #[test]
    fn masquerade_rules_are_flannels_in_flannels_order() {
        let rules = rules_as_text(&ruleset(true, false).install(), POSTROUTING);
        assert_eq!(
            rules,
            [
                "meta mark & 16384 == 16384 return",
                "ip saddr == 10.5.1.0/24 ip daddr == 10.5.0.0/16 return",
                "ip saddr == 10.5.0.0/16 ip daddr == 10.5.1.0/24 return",
                "ip saddr != 10.5.0.0/16 ip daddr == 10.5.1.0/24 return",
                "ip saddr == 10.5.0.0/16 ip daddr != 224.0.0.0/4 masquerade fully-random",
                "ip saddr != 10.5.0.0/16 ip daddr == 10.5.0.0/16 masquerade fully-random",
            ]
        );
        assert!(rules_as_text(&ruleset(true, false).install(), FORWARD).is_empty());
    }

    #[test]
    fn forward_rules_accept_to_and_from_the_network() {
        let batch = ruleset(false, true).install();
        assert_eq!(
            rules_as_text(&batch, FORWARD),
            [
                "ip saddr == 10.5.0.0/16 accept",
                "ip daddr == 10.5.0.0/16 accept"
            ]
        );
        assert!(rules_as_text(&batch, POSTROUTING).is_empty());
    }

    fn commands(batch: &Nftables) -> Vec<Value> {
        let json = serde_json::to_value(batch).unwrap();
        json["nftables"].as_array().unwrap().clone()
    }

    #[test]
    fn an_install_starts_by_replacing_the_table_and_a_removal_leaves_none() {
        let table = json!({"table": {"family": "ip", "name": TABLE}});
        let (add, delete) = (json!({"add": table}), json!({"delete": table}));
        let install = commands(&ruleset(true, true).install());
        assert_eq!(install[..3], [add.clone(), delete.clone(), add.clone()]);
        assert_eq!(
            install[3..]
                .iter()
                .filter(|c| c.get("delete").is_some())
                .count(),
            0
        );
        assert_eq!(commands(&remove()), [add, delete]);
    }

    #[test]
    fn chains_hook_where_flannels_do_and_never_drop() {
        let json = serde_json::to_value(ruleset(true, true).install()).unwrap();
        let chains: Vec<&Value> = json["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|cmd| cmd["add"].get("chain"))
            .collect();
        let expected = [
            json!({"family": "ip", "table": TABLE, "name": "postrtg", "type": "nat",
                   "hook": "postrouting", "prio": 100, "policy": "accept"}),
            json!({"family": "ip", "table": TABLE, "name": "forward", "type": "filter",
                   "hook": "forward", "prio": 0, "policy": "accept"}),
        ];
        assert_eq!(chains, expected.iter().collect::<Vec<_>>());
    }

    #[test]
    fn host_bits_of_a_lease_do_not_reach_the_rules() {
        let mut r = ruleset(true, false);
        r.subnet = "10.5.1.7/24".parse().unwrap();
        let rules = rules_as_text(&r.install(), POSTROUTING);
        assert!(rules[1].starts_with("ip saddr == 10.5.1.0/24"), "{rules:?}");
    }
}
