//! twill's tables as nf_tables netlink messages (netlink-packet-netfilter's types), each rule
//! encoded as nft 1.0 encodes the same rule (`nft --debug=netlink`), so `nft list table` prints
//! flannel's rules in their usual words.

use super::ruleset::{Action, Chain, Family, Field, Hook, Match, Rule, Ruleset, MARK};
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

/// The operations that replace whatever twill's table of the ruleset's family holds (an
/// earlier run killed with SIGKILL left one, or an operator's table of that name) with exactly
/// this ruleset: `add table; delete table; add table; add chain ...; add rule ...`.
pub fn replace(ruleset: &Ruleset) -> Vec<Op> {
    let family = ruleset.family();
    let mut ops = remove(family);
    ops.push(add_table(family));
    for chain in ruleset.chains() {
        ops.push(add_chain(family, &chain));
        for (i, rule) in chain.rules.iter().enumerate() {
            ops.push(add_rule(family, chain.name, i + 1, rule));
        }
    }
    ops
}

/// The operations that remove twill's table of `family`, whether or not it exists: adding it
/// first makes the delete succeed when there is none.
pub fn remove(family: Family) -> Vec<Op> {
    let delete = Op {
        family,
        message: NfTablesMessage::DeleteTable(TableMessage {
            attributes: vec![TableAttribute::Name(family.table().into())],
        }),
        flags: NLM_F_REQUEST | NLM_F_ACK,
        what: format!("delete table {family}"),
    };
    vec![add_table(family), delete]
}

/// twill's table, carrying [`MARK`] as nft stores a table comment.
fn add_table(family: Family) -> Op {
    Op {
        family,
        message: NfTablesMessage::NewTable(TableMessage {
            attributes: vec![
                TableAttribute::Name(family.table().into()),
                TableAttribute::Flags(TableFlags::empty()),
                TableAttribute::UserData(comment(MARK)),
            ],
        }),
        flags: NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE,
        what: format!("add table {family}"),
    }
}

/// libnftnl's userdata: type-length-value records of one byte each for type and length. Type 0
/// of a table is its comment, a NUL-terminated string.
pub fn comment(text: &str) -> Vec<u8> {
    const NFTNL_UDATA_TABLE_COMMENT: u8 = 0;
    let value = [text.as_bytes(), b"\0"].concat();
    let len = u8::try_from(value.len()).expect("a comment of at most 255 bytes");
    [vec![NFTNL_UDATA_TABLE_COMMENT, len], value].concat()
}

fn add_chain(family: Family, chain: &Chain) -> Op {
    let hook = match chain.hook {
        Hook::Forward => InetHookNumber::Forward,
        Hook::Postrouting => InetHookNumber::PostRouting,
    };
    Op {
        family,
        message: NfTablesMessage::NewChain(ChainMessage {
            attributes: vec![
                ChainAttribute::Table(family.table().into()),
                ChainAttribute::Name(chain.name.into()),
                ChainAttribute::Hook(vec![
                    HookAttribute::Number(hook.into()),
                    // The kernel reads the priority as a signed 32-bit number.
                    HookAttribute::Priority(chain.priority as u32),
                ]),
                // Never a drop policy: the chain must only ever add to what the host allows.
                ChainAttribute::Policy(NF_ACCEPT),
                ChainAttribute::Type(chain.kind.into()),
            ],
        }),
        flags: NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE,
        what: format!("add chain {family} {}", chain.name),
    }
}

/// Appended: the transaction adds a chain's rules in order.
fn add_rule(family: Family, chain: &str, number: usize, rule: &Rule) -> Op {
    Op {
        family,
        message: NfTablesMessage::NewRule(RuleMessage {
            attributes: vec![
                RuleAttribute::Table(family.table().into()),
                RuleAttribute::Chain(chain.into()),
                RuleAttribute::Expressions(expressions(rule)),
            ],
        }),
        flags: NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_APPEND,
        what: format!("add rule {number} of chain {family} {chain} ({rule})"),
    }
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
        Match::MarkSet(mark) => {
            // A mark is a host-order number in the register, as nft writes it.
            let mark = mark.to_ne_bytes().to_vec();
            vec![
                Expressions::Meta(vec![
                    Meta::DestinationRegister(Register::Reg1),
                    Meta::Key(MetaKey::Mark),
                ]),
                mask(mark.clone()),
                compare(false, mark),
            ]
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
        // The crate has no type for it; nft sends exactly this one attribute.
        Action::Masquerade => {
            return Expressions::Other {
                expression_type: "masq".into(),
                attributes: vec![DefaultNla::new(
                    MASQ_FLAGS,
                    RANDOM_FULLY.to_be_bytes().to_vec(),
                )],
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
    use super::*;

    fn ruleset() -> Ruleset {
        Ruleset {
            network: "10.5.0.0/16".parse().unwrap(),
            subnet: "10.5.1.0/24".parse().unwrap(),
            masquerade: true,
            forward: true,
        }
    }

    #[test]
    fn an_install_starts_by_replacing_the_table_and_a_removal_leaves_none() {
        let whats: Vec<String> = replace(&ruleset()).into_iter().map(|op| op.what).collect();
        let table = "table ip twill-ipv4";
        assert_eq!(
            whats[..3],
            [
                format!("add {table}"),
                format!("delete {table}"),
                format!("add {table}")
            ]
        );
        assert!(!whats[3..].iter().any(|w| w.starts_with("delete")));
        assert_eq!(whats[3], "add chain ip twill-ipv4 postrtg");
        assert_eq!(whats[10], "add chain ip twill-ipv4 forward");
        assert_eq!(whats.len(), 3 + 1 + 6 + 1 + 2);
        let removal: Vec<String> = remove(Family::Ipv4).into_iter().map(|op| op.what).collect();
        assert_eq!(removal, [format!("add {table}"), format!("delete {table}")]);
    }

    #[test]
    fn the_table_carries_twills_mark_as_an_nft_comment() {
        // `nft add table ip t { comment "ab"; }` sends this userdata.
        assert_eq!(comment("ab"), [0, 3, b'a', b'b', 0]);
        let NfTablesMessage::NewTable(table) = add_table(Family::Ipv4).message else {
            panic!("not a table");
        };
        assert!(table
            .attributes
            .contains(&TableAttribute::UserData(comment(MARK))));
    }

    #[test]
    fn chains_never_drop() {
        for op in replace(&ruleset()) {
            if let NfTablesMessage::NewChain(chain) = op.message {
                assert!(chain.attributes.contains(&ChainAttribute::Policy(1)));
            }
        }
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
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
    fn an_ipv6_ruleset_goes_to_twills_ip6_table() {
        let v6 = Ruleset {
            network: net("fd10::/56"),
            subnet: net("fd10:0:0:1::/64"),
            masquerade: true,
            forward: true,
        };
        let ops = replace(&v6);
        assert!(ops.iter().all(|op| op.family == Family::Ipv6));
        assert_eq!(ops[0].what, "add table ip6 twill-ipv6");
        assert_eq!(ops[3].what, "add chain ip6 twill-ipv6 postrtg");
    }

    #[test]
    fn masquerade_is_fully_random() {
        let Expressions::Other {
            expression_type,
            attributes,
        } = action(Action::Masquerade)
        else {
            panic!("not masq");
        };
        assert_eq!(expression_type, "masq");
        assert_eq!(attributes, [DefaultNla::new(1, vec![0, 0, 0, 0x10])]);
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
