//! flannel's masquerade and forward rules (pkg/trafficmngr/nftables), as plain values: what the
//! rules mean, independent of how they reach the kernel (`encode.rs`).
//!
//! Everything lives in a table of twill's own per address family, `ip twill-ipv4` (and on a
//! dual-stack node `ip6 twill-ipv6`), as flannel keeps its rules in `ip flannel-ipv4` and
//! `ip6 flannel-ipv6`: chain `postrtg` (nat, postrouting, srcnat) for `--ip-masq`, chain
//! `forward` (filter, forward, filter priority, policy accept) for `--iptables-forward-rules`.
//! docs/ip-masq.md lists them side by side with flannel's.

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use std::fmt;

/// The address family of one of twill's tables; nothing else of twill's touches nftables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    Ipv4,
    Ipv6,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::Ipv4, Family::Ipv6];

    /// twill's table of this family.
    pub fn table(self) -> &'static str {
        match self {
            Family::Ipv4 => "twill-ipv4",
            Family::Ipv6 => "twill-ipv6",
        }
    }

    /// nft's word for the family, in `nft list table ip6 …` and in `ip6 saddr …`.
    pub fn word(self) -> &'static str {
        match self {
            Family::Ipv4 => "ip",
            Family::Ipv6 => "ip6",
        }
    }

    fn of(net: IpNet) -> Family {
        match net {
            IpNet::V4(_) => Family::Ipv4,
            IpNet::V6(_) => Family::Ipv6,
        }
    }

    /// Multicast destinations, which `--ip-masq` leaves alone.
    fn multicast(self) -> IpNet {
        match self {
            Family::Ipv4 => Ipv4Net::new(std::net::Ipv4Addr::new(224, 0, 0, 0), 4).map(IpNet::V4),
            Family::Ipv6 => {
                Ipv6Net::new(std::net::Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8).map(IpNet::V6)
            }
        }
        .expect("a valid multicast prefix")
    }
}

impl fmt::Display for Family {
    /// `ip twill-ipv4`, as nft names the table.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.word(), self.table())
    }
}
/// The comment twill's table carries (`nft list table` shows it), so a table of that name that
/// lacks it is known not to be twill's.
pub const MARK: &str = "managed by twill";
pub(super) const POSTROUTING: &str = "postrtg";
pub(super) const FORWARD: &str = "forward";

/// kube-proxy marks packets it already masquerades; flannel leaves them alone (no double NAT).
const KUBE_PROXY_MARK: u32 = 0x4000;
/// nftables' `srcnat` and `filter` priorities.
const SRCNAT_PRIORITY: i32 = 100;
const FILTER_PRIORITY: i32 = 0;

/// Which of flannel's rules a node wants, for the container network `network` and this node's
/// lease `subnet`, of one family: IPv4's, or a dual-stack node's IPv6 ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ruleset {
    pub network: IpNet,
    pub subnet: IpNet,
    /// `--ip-masq`: the `postrtg` chain.
    pub masquerade: bool,
    /// `--iptables-forward-rules`: the `forward` chain.
    pub forward: bool,
}

/// A base chain of twill's table, where flannel hooks its own. Its policy is always accept:
/// the chain must only ever add to what the host allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub name: &'static str,
    /// nftables' chain type: `nat` or `filter`.
    pub kind: &'static str,
    pub hook: Hook,
    pub priority: i32,
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Forward,
    Postrouting,
}

/// One rule: all matches must hold, then the action is taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub matches: Vec<Match>,
    pub action: Action,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    /// `ip saddr|daddr [!=] NET`.
    Address {
        field: Field,
        negated: bool,
        net: IpNet,
    },
    /// `meta mark & MARK == MARK`.
    MarkSet(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Saddr,
    Daddr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Return,
    Accept,
    /// `masquerade fully-random`, as flannel does where the kernel supports it (every kernel
    /// with nftables NAT does).
    Masquerade,
}

impl Ruleset {
    /// The family of its table: its network's.
    pub fn family(&self) -> Family {
        Family::of(self.network)
    }

    /// The chains this ruleset wants, each with its rules in flannel's order.
    pub fn chains(&self) -> Vec<Chain> {
        let mut chains = Vec::new();
        if self.masquerade {
            chains.push(Chain {
                name: POSTROUTING,
                kind: "nat",
                hook: Hook::Postrouting,
                priority: SRCNAT_PRIORITY,
                rules: self.masquerade_rules(),
            });
        }
        if self.forward {
            chains.push(Chain {
                name: FORWARD,
                kind: "filter",
                hook: Hook::Forward,
                priority: FILTER_PRIORITY,
                rules: self.forward_rules(),
            });
        }
        chains
    }

    /// flannel's `postrtg` chain, in flannel's order; N is the network, S this node's subnet.
    fn masquerade_rules(&self) -> Vec<Rule> {
        let (n, s) = (self.network.trunc(), self.subnet.trunc());
        let multicast = self.family().multicast();
        let (is, not) = (false, true);
        vec![
            // Marked by kube-proxy, which masquerades it itself.
            rule(vec![Match::MarkSet(KUBE_PROXY_MARK)], Action::Return),
            // Container to container inside the network, both ways: keep the addresses.
            rule(vec![saddr(is, s), daddr(is, n)], Action::Return),
            rule(vec![saddr(is, n), daddr(is, s)], Action::Return),
            // From outside to this node's containers: keep the client's address.
            rule(vec![saddr(not, n), daddr(is, s)], Action::Return),
            // Containers to outside the network, except multicast.
            rule(
                vec![saddr(is, n), daddr(not, multicast)],
                Action::Masquerade,
            ),
            // From outside the network (e.g. this host) to another node's containers.
            rule(vec![saddr(not, n), daddr(is, n)], Action::Masquerade),
        ]
    }

    /// flannel's `forward` chain: accept forwarding to and from the network.
    fn forward_rules(&self) -> Vec<Rule> {
        let n = self.network.trunc();
        vec![
            rule(vec![saddr(false, n)], Action::Accept),
            rule(vec![daddr(false, n)], Action::Accept),
        ]
    }
}

fn rule(matches: Vec<Match>, action: Action) -> Rule {
    Rule { matches, action }
}

fn saddr(negated: bool, net: IpNet) -> Match {
    Match::Address {
        field: Field::Saddr,
        negated,
        net,
    }
}

fn daddr(negated: bool, net: IpNet) -> Match {
    Match::Address {
        field: Field::Daddr,
        negated,
        net,
    }
}

/// As `nft list table` prints the rule, so tests and logs read like docs/ip-masq.md.
impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for m in &self.matches {
            write!(f, "{m} ")?;
        }
        write!(f, "{}", self.action)
    }
}

impl fmt::Display for Match {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
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
                write!(f, "{} {field} {op}{net}", Family::of(net).word())
            }
            Match::MarkSet(mark) => write!(f, "meta mark & {mark:#010x} == {mark:#010x}"),
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Return => "return",
            Action::Accept => "accept",
            Action::Masquerade => "masquerade fully-random",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ruleset(masquerade: bool, forward: bool) -> Ruleset {
        Ruleset {
            network: "10.5.0.0/16".parse().unwrap(),
            subnet: "10.5.1.0/24".parse().unwrap(),
            masquerade,
            forward,
        }
    }

    fn rules_as_text(ruleset: &Ruleset, chain: &str) -> Vec<String> {
        let chains = ruleset.chains();
        let Some(chain) = chains.iter().find(|c| c.name == chain) else {
            return Vec::new();
        };
        chain.rules.iter().map(Rule::to_string).collect()
    }

    #[test]
    fn masquerade_rules_are_flannels_in_flannels_order() {
        assert_eq!(
            rules_as_text(&ruleset(true, false), POSTROUTING),
            [
                "meta mark & 0x00004000 == 0x00004000 return",
                "ip saddr 10.5.1.0/24 ip daddr 10.5.0.0/16 return",
                "ip saddr 10.5.0.0/16 ip daddr 10.5.1.0/24 return",
                "ip saddr != 10.5.0.0/16 ip daddr 10.5.1.0/24 return",
                "ip saddr 10.5.0.0/16 ip daddr != 224.0.0.0/4 masquerade fully-random",
                "ip saddr != 10.5.0.0/16 ip daddr 10.5.0.0/16 masquerade fully-random",
            ]
        );
        assert!(rules_as_text(&ruleset(true, false), FORWARD).is_empty());
    }

    #[test]
    fn ipv6_rules_are_flannels_in_its_ip6_words_with_ipv6_multicast() {
        let v6 = Ruleset {
            network: "fd10::/56".parse().unwrap(),
            subnet: "fd10:0:0:1::/64".parse().unwrap(),
            masquerade: true,
            forward: true,
        };
        assert_eq!(v6.family(), Family::Ipv6);
        assert_eq!(v6.family().to_string(), "ip6 twill-ipv6");
        assert_eq!(
            rules_as_text(&v6, POSTROUTING)[1..],
            [
                "ip6 saddr fd10:0:0:1::/64 ip6 daddr fd10::/56 return",
                "ip6 saddr fd10::/56 ip6 daddr fd10:0:0:1::/64 return",
                "ip6 saddr != fd10::/56 ip6 daddr fd10:0:0:1::/64 return",
                "ip6 saddr fd10::/56 ip6 daddr != ff00::/8 masquerade fully-random",
                "ip6 saddr != fd10::/56 ip6 daddr fd10::/56 masquerade fully-random",
            ]
        );
        assert_eq!(
            rules_as_text(&v6, FORWARD),
            ["ip6 saddr fd10::/56 accept", "ip6 daddr fd10::/56 accept"]
        );
    }

    #[test]
    fn forward_rules_accept_to_and_from_the_network() {
        let r = ruleset(false, true);
        assert_eq!(
            rules_as_text(&r, FORWARD),
            ["ip saddr 10.5.0.0/16 accept", "ip daddr 10.5.0.0/16 accept"]
        );
        assert!(rules_as_text(&r, POSTROUTING).is_empty());
    }

    #[test]
    fn chains_hook_where_flannels_do() {
        let chains = ruleset(true, true).chains();
        let hooks: Vec<_> = chains
            .iter()
            .map(|c| (c.name, c.kind, c.hook, c.priority))
            .collect();
        assert_eq!(
            hooks,
            [
                ("postrtg", "nat", Hook::Postrouting, 100),
                ("forward", "filter", Hook::Forward, 0),
            ]
        );
        assert!(ruleset(false, false).chains().is_empty());
    }

    #[test]
    fn host_bits_of_a_lease_do_not_reach_the_rules() {
        let mut r = ruleset(true, false);
        r.subnet = "10.5.1.7/24".parse().unwrap();
        let rules = rules_as_text(&r, POSTROUTING);
        assert!(rules[1].starts_with("ip saddr 10.5.1.0/24"), "{rules:?}");
    }
}
