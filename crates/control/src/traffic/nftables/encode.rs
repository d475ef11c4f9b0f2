//! flannel's tables as nf_tables netlink messages (netlink-packet-netfilter's types), each
//! object encoded as nft 1.0 encodes what flanneld's knftables sends (`nft --debug=netlink`),
//! so `nft list` prints exactly flanneld's tables: their comments, chains and rules.

use super::super::ruleset::{Action, Chain, ChainKind, Family, Field, Match, Rule, Ruleset};
use super::Table;
use ipnet::IpNet;
use netlink_packet_core::{DefaultNla, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_REQUEST};
use netlink_packet_netfilter::nftables::{
    Bitwise, ChainAttribute, ChainMessage, Cmp, DataAttribute, ExpressionAttribute, Expressions,
    Hook as HookAttribute, Immediate, InetHookNumber, ListAttribute, Meta, MetaKey,
    NfTablesMessage, Operator, Payload, Register, RuleAttribute, RuleMessage, TableAttribute,
    TableFlags, TableMessage, Verdict, VerdictAttribute,
};

/// One message of a transaction, with what it does in words for an error naming it.
#[derive(Debug)]
pub struct Op {
    /// The family of the table it concerns (the message's `nfgenmsg` family).
    pub family: Family,
    pub message: NfTablesMessage,
    pub flags: u16,
    pub what: String,
}

/// The operations that replace whatever flannel's table of `family` holds with exactly the
/// table flanneld writes: its comment, and the chains of `ruleset` (none where the network has
/// no such family: flanneld creates both tables whatever the network).
/// `add table; delete table; add table; add chain ...; add rule ...`.
pub fn replace(family: Family, ruleset: Option<&Ruleset>) -> Vec<Op> {
    let table = Table::flannel(family);
    let mut ops = remove(table);
    ops.push(add_table(table));
    for chain in ruleset.iter().flat_map(|r| r.chains()) {
        ops.push(add_chain(table, &chain));
        for (i, rule) in chain.rules.iter().enumerate() {
            ops.push(add_rule(table, chain.kind, i + 1, rule));
        }
    }
    ops
}

/// The operations that remove `table`, whether or not it exists: adding it first makes the
/// delete succeed when there is none.
pub fn remove(table: Table) -> Vec<Op> {
    let delete = Op {
        family: table.family,
        message: NfTablesMessage::DeleteTable(TableMessage {
            attributes: vec![TableAttribute::Name(table.name.into())],
        }),
        flags: NLM_F_REQUEST | NLM_F_ACK,
        what: format!("delete table {table}"),
    };
    vec![add_table(table), delete]
}

/// The table with flanneld's comment, `rules for <name>`.
fn add_table(table: Table) -> Op {
    let comment = format!("rules for {}", table.name);
    Op {
        family: table.family,
        message: NfTablesMessage::NewTable(TableMessage {
            attributes: vec![
                TableAttribute::Name(table.name.into()),
                TableAttribute::Flags(TableFlags::empty()),
                TableAttribute::UserData(userdata_comment(&comment)),
            ],
        }),
        flags: NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE,
        what: format!("add table {table}"),
    }
}

/// libnftnl's userdata: type-length-value records of one byte each for type and length. Type 0
/// of a table's or a chain's userdata is its comment, a NUL-terminated string.
pub fn userdata_comment(text: &str) -> Vec<u8> {
    const NFTNL_UDATA_COMMENT: u8 = 0;
    let value = [text.as_bytes(), b"\0"].concat();
    let len = u8::try_from(value.len()).expect("a comment of at most 255 bytes");
    [vec![NFTNL_UDATA_COMMENT, len], value].concat()
}

/// The chain's name in flanneld's tables.
pub fn chain_name(kind: ChainKind) -> &'static str {
    match kind {
        ChainKind::Masquerade => "postrtg",
        ChainKind::Forward => "forward",
    }
}

/// flanneld's chain comment.
fn chain_comment(kind: ChainKind) -> &'static str {
    match kind {
        ChainKind::Masquerade => "chain to manage traffic masquerading by flannel",
        ChainKind::Forward => "chain to accept flannel traffic",
    }
}

/// nftables' `srcnat` and `filter` priorities.
const SRCNAT_PRIORITY: i32 = 100;
const FILTER_PRIORITY: i32 = 0;

fn add_chain(table: Table, chain: &Chain) -> Op {
    let (hook, kind, priority) = match chain.kind {
        ChainKind::Masquerade => (InetHookNumber::PostRouting, "nat", SRCNAT_PRIORITY),
        ChainKind::Forward => (InetHookNumber::Forward, "filter", FILTER_PRIORITY),
    };
    let name = chain_name(chain.kind);
    Op {
        family: table.family,
        message: NfTablesMessage::NewChain(ChainMessage {
            attributes: vec![
                ChainAttribute::Table(table.name.into()),
                ChainAttribute::Name(name.into()),
                ChainAttribute::Hook(vec![
                    HookAttribute::Number(hook.into()),
                    // The kernel reads the priority as a signed 32-bit number.
                    HookAttribute::Priority(priority as u32),
                ]),
                // Never a drop policy: the chain must only ever add to what the host allows.
                ChainAttribute::Policy(NF_ACCEPT),
                ChainAttribute::Type(kind.into()),
                ChainAttribute::UserData(userdata_comment(chain_comment(chain.kind))),
            ],
        }),
        flags: NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE,
        what: format!("add chain {table} {name}"),
    }
}

/// Appended: the transaction adds a chain's rules in order.
fn add_rule(table: Table, kind: ChainKind, number: usize, rule: &Rule) -> Op {
    let chain = chain_name(kind);
    Op {
        family: table.family,
        message: NfTablesMessage::NewRule(RuleMessage {
            attributes: vec![
                RuleAttribute::Table(table.name.into()),
                RuleAttribute::Chain(chain.into()),
                RuleAttribute::Expressions(expressions(rule)),
            ],
        }),
        flags: NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_APPEND,
        what: format!(
            "add rule {number} of chain {table} {chain} ({})",
            words(rule)
        ),
    }
}

/// The rule as `nft list` prints it, for errors and logs.
pub fn words(rule: &Rule) -> String {
    let mut text = String::new();
    for m in &rule.matches {
        text += &match *m {
            Match::Address {
                field,
                negated,
                net,
            } => {
                let field = match field {
                    Field::Saddr => "saddr",
                    Field::Daddr => "daddr",
                };
                let op = if negated { "!= " } else { "" };
                format!("{} {field} {op}{net} ", Family::of(net).word())
            }
            Match::Mark { mark, mask: None } => format!("meta mark {mark:#010x} "),
            Match::Mark {
                mark,
                mask: Some(mask),
            } => format!("meta mark & {mask:#010x} == {mark:#010x} "),
        };
    }
    text += match rule.action {
        Action::Return => "return",
        Action::Accept => "accept",
        Action::Masquerade { fully_random: true } => "masquerade fully-random",
        Action::Masquerade {
            fully_random: false,
        } => "masquerade",
    };
    text
}

/// Linux's `NF_ACCEPT`, as a chain policy and as a verdict.
const NF_ACCEPT: u32 = 1;
/// `NFT_PAYLOAD_NETWORK_HEADER`: offsets count from the IP header.
const NETWORK_HEADER: u32 = 1;
/// `NFTA_MASQ_FLAGS` and `NF_NAT_RANGE_PROTO_RANDOM_FULLY`.
const MASQ_FLAGS: u16 = 1;
const RANDOM_FULLY: u32 = 0x10;

/// The rule's expressions: each match loads a value into register 1 and compares it, then the
/// action.
pub fn expressions(rule: &Rule) -> Vec<ListAttribute<ExpressionAttribute>> {
    let mut exprs: Vec<Expressions> = rule.matches.iter().flat_map(match_exprs).collect();
    exprs.push(action(rule.action));
    exprs.into_iter().map(Into::into).collect()
}

fn match_exprs(m: &Match) -> Vec<Expressions> {
    match *m {
        Match::Address {
            field,
            negated,
            net,
        } => address(field, negated, net),
        Match::Mark { mark, mask } => {
            // A mark is a host-order number in the register, as nft writes it.
            let load = Expressions::Meta(vec![
                Meta::DestinationRegister(Register::Reg1),
                Meta::Key(MetaKey::Mark),
            ]);
            let masked = mask.map(|m| self::mask(m.to_ne_bytes().to_vec()));
            let compared = compare(false, mark.to_ne_bytes().to_vec());
            [Some(load), masked, Some(compared)]
                .into_iter()
                .flatten()
                .collect()
        }
    }
}

/// `ip|ip6 saddr|daddr [!=] NET` as nft encodes a prefix: a prefix on a byte boundary loads
/// just its bytes and compares them; any other loads the address and masks it first. The
/// address sits at its place in the IPv4 or the IPv6 header.
fn address(field: Field, negated: bool, net: IpNet) -> Vec<Expressions> {
    let (offset, octets, netmask) = match net {
        IpNet::V4(v4) => {
            let offset = match field {
                Field::Saddr => 12,
                Field::Daddr => 16,
            };
            let octets = v4.network().octets().to_vec();
            (offset, octets, v4.netmask().octets().to_vec())
        }
        IpNet::V6(v6) => {
            let offset = match field {
                Field::Saddr => 8,
                Field::Daddr => 24,
            };
            let octets = v6.network().octets().to_vec();
            (offset, octets, v6.netmask().octets().to_vec())
        }
    };
    let bits = net.prefix_len();
    if bits.is_multiple_of(8) && bits > 0 {
        let bytes = &octets[..usize::from(bits / 8)];
        return vec![load(offset, bytes.len()), compare(negated, bytes.to_vec())];
    }
    vec![
        load(offset, octets.len()),
        mask(netmask),
        compare(negated, octets),
    ]
}

fn load(offset: u32, len: usize) -> Expressions {
    Expressions::Payload(vec![
        Payload::DestinationRegister(Register::Reg1),
        Payload::Base(NETWORK_HEADER),
        Payload::Offset(offset),
        Payload::Len(len as u32),
    ])
}

/// `reg1 = (reg1 & mask) ^ 0`.
fn mask(mask: Vec<u8>) -> Expressions {
    let zero = vec![0; mask.len()];
    Expressions::Bitwise(vec![
        Bitwise::SourceRegister(Register::Reg1),
        Bitwise::DestinationRegister(Register::Reg1),
        Bitwise::Length(mask.len() as u32),
        Bitwise::Mask(DataAttribute::Value(mask)),
        Bitwise::Xor(DataAttribute::Value(zero)),
    ])
}

fn compare(negated: bool, value: Vec<u8>) -> Expressions {
    let op = if negated {
        Operator::NotEqual
    } else {
        Operator::Equal
    };
    Expressions::Cmp(vec![
        Cmp::SourceRegister(Register::Reg1),
        Cmp::Op(op),
        Cmp::Data(DataAttribute::Value(value)),
    ])
}

fn action(action: Action) -> Expressions {
    let verdict = match action {
        Action::Return => Verdict::Return,
        Action::Accept => Verdict::Other(NF_ACCEPT),
        // The crate has no type for it; nft sends the flags attribute only when there are
        // flags (`masquerade` alone sends none).
        Action::Masquerade { fully_random } => {
            let flags = DefaultNla::new(MASQ_FLAGS, RANDOM_FULLY.to_be_bytes().to_vec());
            return Expressions::Other {
                expression_type: "masq".into(),
                attributes: fully_random.then_some(flags).into_iter().collect(),
            };
        }
    };
    Expressions::Immediate(vec![
        Immediate::DestinationRegister(Register::Verdict),
        Immediate::Data(DataAttribute::Verdict(vec![VerdictAttribute::Code(
            verdict,
        )])),
    ])
}

#[cfg(test)]
mod tests {
    use super::super::super::ruleset::Mode;
    use super::*;

    fn ruleset() -> Ruleset {
        Ruleset {
            mode: Mode::Nftables,
            network: "10.5.0.0/16".parse().unwrap(),
            subnet: "10.5.1.0/24".parse().unwrap(),
            masquerade: true,
            forward: true,
            fully_random: true,
        }
    }

    #[test]
    fn an_install_starts_by_replacing_the_table_and_a_removal_leaves_none() {
        let whats: Vec<String> = replace(Family::Ipv4, Some(&ruleset()))
            .into_iter()
            .map(|op| op.what)
            .collect();
        let table = "table ip flannel-ipv4";
        assert_eq!(
            whats[..3],
            [
                format!("add {table}"),
                format!("delete {table}"),
                format!("add {table}")
            ]
        );
        assert!(!whats[3..].iter().any(|w| w.starts_with("delete")));
        assert_eq!(whats[3], "add chain ip flannel-ipv4 postrtg");
        assert_eq!(whats[10], "add chain ip flannel-ipv4 forward");
        assert_eq!(whats.len(), 3 + 1 + 6 + 1 + 2);
        let removal: Vec<String> = remove(Table::flannel(Family::Ipv4))
            .into_iter()
            .map(|op| op.what)
            .collect();
        assert_eq!(removal, [format!("add {table}"), format!("delete {table}")]);
    }

    #[test]
    fn a_family_the_network_lacks_still_gets_flanneds_empty_table() {
        let ops = replace(Family::Ipv6, None);
        let whats: Vec<&str> = ops.iter().map(|op| op.what.as_str()).collect();
        assert_eq!(
            whats,
            [
                "add table ip6 flannel-ipv6",
                "delete table ip6 flannel-ipv6",
                "add table ip6 flannel-ipv6"
            ]
        );
    }

    #[test]
    fn tables_and_chains_carry_flanneds_comments() {
        // `nft add table ip t { comment "ab"; }` sends this userdata.
        assert_eq!(userdata_comment("ab"), [0, 3, b'a', b'b', 0]);
        let ops = replace(Family::Ipv4, Some(&ruleset()));
        let NfTablesMessage::NewTable(table) = &ops[2].message else {
            panic!("not a table");
        };
        assert!(table
            .attributes
            .contains(&TableAttribute::UserData(userdata_comment(
                "rules for flannel-ipv4"
            ))));
        let NfTablesMessage::NewChain(chain) = &ops[3].message else {
            panic!("not a chain");
        };
        assert!(chain
            .attributes
            .contains(&ChainAttribute::UserData(userdata_comment(
                "chain to manage traffic masquerading by flannel"
            ))));
    }

    #[test]
    fn chains_never_drop() {
        for op in replace(Family::Ipv4, Some(&ruleset())) {
            if let NfTablesMessage::NewChain(chain) = op.message {
                assert!(chain.attributes.contains(&ChainAttribute::Policy(1)));
            }
        }
    }

    #[test]
    fn rules_read_as_flanneld_writes_them() {
        let chains = ruleset().chains();
        let text: Vec<String> = chains[0].rules.iter().map(words).collect();
        assert_eq!(
            text,
            [
                "meta mark 0x00004000 return",
                "ip saddr 10.5.1.0/24 ip daddr 10.5.0.0/16 return",
                "ip saddr 10.5.0.0/16 ip daddr 10.5.1.0/24 return",
                "ip saddr != 10.5.1.0/24 ip daddr 10.5.0.0/16 return",
                "ip saddr 10.5.0.0/16 ip daddr != 224.0.0.0/4 masquerade fully-random",
                "ip saddr != 10.5.0.0/16 ip daddr 10.5.0.0/16 masquerade fully-random",
            ]
        );
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn the_kube_proxy_mark_is_compared_whole() {
        // nft: meta mark 0x4000 -> [ meta load mark => reg 1 ] [ cmp eq reg 1 0x00004000 ]
        let exprs = match_exprs(&Match::Mark {
            mark: 0x4000,
            mask: None,
        });
        assert_eq!(exprs.len(), 2);
        assert_eq!(exprs[1], compare(false, 0x4000u32.to_ne_bytes().to_vec()));
    }

    #[test]
    fn a_prefix_on_a_byte_boundary_compares_only_its_bytes() {
        // nft: [ payload load 3b @ network header + 12 => reg 1 ] [ cmp eq reg 1 0x0001050a ]
        let exprs = address(Field::Saddr, false, net("10.5.1.0/24"));
        assert_eq!(
            exprs,
            [load(12, 3), compare(false, vec![10, 5, 1])],
            "{exprs:?}"
        );
    }

    #[test]
    fn any_other_prefix_is_masked_first() {
        // nft: [ payload load 4b @ network header + 16 => reg 1 ]
        //      [ bitwise reg 1 = ( reg 1 & 0x000000f0 ) ^ 0x00000000 ]
        //      [ cmp neq reg 1 0x000000e0 ]
        let exprs = address(Field::Daddr, true, net("224.0.0.0/4"));
        assert_eq!(
            exprs,
            [
                load(16, 4),
                mask(vec![0xf0, 0, 0, 0]),
                compare(true, vec![224, 0, 0, 0])
            ]
        );
    }

    #[test]
    fn ipv6_addresses_are_loaded_from_the_ipv6_header() {
        // nft: ip6 saddr fd10::/56 -> [ payload load 7b @ network header + 8 => reg 1 ] [ cmp ]
        let exprs = address(Field::Saddr, false, net("fd10::/56"));
        let prefix = vec![0xfd, 0x10, 0, 0, 0, 0, 0];
        assert_eq!(exprs, [load(8, 7), compare(false, prefix)]);
        // ip6 daddr != ff00::/8: one byte at + 24.
        let exprs = address(Field::Daddr, true, net("ff00::/8"));
        assert_eq!(exprs, [load(24, 1), compare(true, vec![0xff])]);
        // fd10::/60 is off a byte boundary: all 16 bytes, masked.
        let exprs = address(Field::Daddr, false, net("fd10::/60"));
        let mut netmask = vec![0xff; 7];
        netmask.push(0xf0);
        netmask.resize(16, 0);
        let mut octets = vec![0xfd, 0x10];
        octets.resize(16, 0);
        assert_eq!(exprs, [load(24, 16), mask(netmask), compare(false, octets)]);
    }

    #[test]
    fn masquerade_sends_its_flags_only_when_fully_random() {
        let masq = |fully_random| match action(Action::Masquerade { fully_random }) {
            Expressions::Other {
                expression_type,
                attributes,
            } => (expression_type, attributes),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            masq(true),
            ("masq".into(), vec![DefaultNla::new(1, vec![0, 0, 0, 0x10])])
        );
        assert_eq!(masq(false), ("masq".into(), vec![]));
    }

    #[test]
    fn return_and_accept_are_verdicts() {
        let verdict = |a| match action(a) {
            Expressions::Immediate(attrs) => attrs,
            other => panic!("{other:?}"),
        };
        let code = |v| Immediate::Data(DataAttribute::Verdict(vec![VerdictAttribute::Code(v)]));
        assert!(verdict(Action::Return).contains(&code(Verdict::Return)));
        assert!(verdict(Action::Accept).contains(&code(Verdict::Other(1))));
    }
}
