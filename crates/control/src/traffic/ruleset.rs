//! flannel's masquerade and forward rules (flannel's pkg/trafficmngr), as plain values: what
//! each rule matches and does, in the two modes flanneld writes them in. How they reach the
//! kernel is `nftables/` (tables `ip flannel-ipv4`, `ip6 flannel-ipv6`) and `iptables/`
//! (chains FLANNEL-POSTRTG and FLANNEL-FWD). docs/ip-masq.md lists them side by side.

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use std::fmt;

/// Where flanneld keeps its rules: the network config's `EnableNFTables`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// flannel's default: chains of iptables (whichever backend the host's iptables uses).
    Iptables,
    /// `"EnableNFTables": true`: tables of nftables, written over netlink.
    Nftables,
}

impl Mode {
    pub fn of(enable_nftables: bool) -> Mode {
        if enable_nftables {
            Mode::Nftables
        } else {
            Mode::Iptables
        }
    }
}

/// An address family: each has its own rules (IPv4's, and a dual-stack node's IPv6 ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    Ipv4,
    Ipv6,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::Ipv4, Family::Ipv6];

    /// nft's word for the family, in `nft list table ip6 …` and in `ip6 saddr …`.
    pub fn word(self) -> &'static str {
        match self {
            Family::Ipv4 => "ip",
            Family::Ipv6 => "ip6",
        }
    }

    pub fn of(net: IpNet) -> Family {
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
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::Ipv4 => "IPv4",
            Family::Ipv6 => "IPv6",
        })
    }
}

/// kube-proxy marks packets it masquerades itself; flannel leaves them alone (no double NAT).
pub const KUBE_PROXY_MARK: u32 = 0x4000;

/// Which of flannel's rules a node wants for one family: the container network `network`, this
/// node's lease `subnet`, and the flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ruleset {
    pub mode: Mode,
    pub network: IpNet,
    pub subnet: IpNet,
    /// `--ip-masq`: the masquerade chain.
    pub masquerade: bool,
    /// `--iptables-forward-rules`: the forward chain.
    pub forward: bool,
    /// Masquerade with fully random source ports (off: `--ip-masq-fully-random-disable`).
    pub fully_random: bool,
}

/// flannel's two chains: what `--ip-masq` and `--iptables-forward-rules` each write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainKind {
    /// nftables `postrtg`, iptables FLANNEL-POSTRTG: at postrouting, in the nat table.
    Masquerade,
    /// nftables `forward`, iptables FLANNEL-FWD: at forward, in the filter table.
    Forward,
}

impl ChainKind {
    pub const ALL: [ChainKind; 2] = [ChainKind::Masquerade, ChainKind::Forward];
}

/// One of flannel's chains with its rules, in flannel's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub kind: ChainKind,
    pub rules: Vec<Rule>,
}

/// One rule: all matches must hold, then the action is taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub matches: Vec<Match>,
    pub action: Action,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    /// `ip saddr|daddr [!=] NET`, `[!] -s|-d NET`.
    Address {
        field: Field,
        negated: bool,
        net: IpNet,
    },
    /// The packet's mark: equal to `mark` (nftables mode's `meta mark 0x4000`), or with the
    /// bits of `mask` equal to `mark`'s (iptables mode's `-m mark --mark 0x4000/0x4000`).
    Mark { mark: u32, mask: Option<u32> },
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
    /// `masquerade [fully-random]`, `-j MASQUERADE [--random-fully]`.
    Masquerade {
        fully_random: bool,
    },
}

impl Ruleset {
    /// The family of its rules: its network's.
    pub fn family(&self) -> Family {
        Family::of(self.network)
    }

    /// Whether `kind`'s chain is wanted.
    pub fn wants(&self, kind: ChainKind) -> bool {
        match kind {
            ChainKind::Masquerade => self.masquerade,
            ChainKind::Forward => self.forward,
        }
    }

    /// The chains this ruleset wants, masquerade first (as flanneld writes them), each with
    /// its rules in flannel's order.
    pub fn chains(&self) -> Vec<Chain> {
        let rules = |kind| match kind {
            ChainKind::Masquerade => self.masquerade_rules(),
            ChainKind::Forward => self.forward_rules(),
        };
        ChainKind::ALL
            .into_iter()
            .filter(|&kind| self.wants(kind))
            .map(|kind| Chain {
                kind,
                rules: rules(kind),
            })
            .collect()
    }

    /// flannel's masquerade chain, in flannel's order; N is the network, S this node's subnet.
    /// The two modes differ in the mark match and in rule 4, as flanneld's code does.
    fn masquerade_rules(&self) -> Vec<Rule> {
        let (n, s) = (self.network.trunc(), self.subnet.trunc());
        let multicast = self.family().multicast();
        let (is, not) = (false, true);
        let masquerade = Action::Masquerade {
            fully_random: self.fully_random,
        };
        let (mark_mask, from_outside_to_here) = match self.mode {
            // `meta mark 0x4000 return`; `ip saddr != S ip daddr N return`.
            Mode::Nftables => (None, vec![saddr(not, s), daddr(is, n)]),
            // `-m mark --mark 0x4000/0x4000 -j RETURN`; `! -s N -d S -j RETURN`.
            Mode::Iptables => (Some(KUBE_PROXY_MARK), vec![saddr(not, n), daddr(is, s)]),
        };
        let kube_proxy = Match::Mark {
            mark: KUBE_PROXY_MARK,
            mask: mark_mask,
        };
        vec![
            // Marked by kube-proxy, which masquerades it itself.
            rule(vec![kube_proxy], Action::Return),
            // Container to container inside the network, both ways: keep the addresses.
            rule(vec![saddr(is, s), daddr(is, n)], Action::Return),
            rule(vec![saddr(is, n), daddr(is, s)], Action::Return),
            // Traffic from outside that a node owning the pod's address passes on: keep it.
            rule(from_outside_to_here, Action::Return),
            // Containers to outside the network, except multicast.
            rule(vec![saddr(is, n), daddr(not, multicast)], masquerade),
            // From outside the network (e.g. this host) to another node's containers.
            rule(vec![saddr(not, n), daddr(is, n)], masquerade),
        ]
    }

    /// flannel's forward chain: accept forwarding to and from the network.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ruleset(mode: Mode) -> Ruleset {
        Ruleset {
            mode,
            network: "10.5.0.0/16".parse().unwrap(),
            subnet: "10.5.1.7/24".parse().unwrap(),
            masquerade: true,
            forward: true,
            fully_random: true,
        }
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn rule_4_and_the_mark_differ_between_the_modes_as_in_flanneld() {
        let nft = ruleset(Mode::Nftables).chains();
        let ipt = ruleset(Mode::Iptables).chains();
        let (s, n) = (net("10.5.1.0/24"), net("10.5.0.0/16"));
        assert_eq!(nft[0].rules[3].matches, [saddr(true, s), daddr(false, n)]);
        assert_eq!(ipt[0].rules[3].matches, [saddr(true, n), daddr(false, s)]);
        let mark = |mask| Match::Mark { mark: 0x4000, mask };
        assert_eq!(nft[0].rules[0].matches, [mark(None)]);
        assert_eq!(ipt[0].rules[0].matches, [mark(Some(0x4000))]);
        // Everything else is the same.
        for i in [1, 2, 4, 5] {
            assert_eq!(nft[0].rules[i], ipt[0].rules[i]);
        }
        assert_eq!(nft[1], ipt[1]);
    }

    #[test]
    fn chains_follow_their_flags_masquerade_first() {
        let mut r = ruleset(Mode::Iptables);
        let kinds = |r: &Ruleset| r.chains().iter().map(|c| c.kind).collect::<Vec<_>>();
        assert_eq!(kinds(&r), [ChainKind::Masquerade, ChainKind::Forward]);
        r.masquerade = false;
        assert_eq!(kinds(&r), [ChainKind::Forward]);
        r.forward = false;
        assert!(kinds(&r).is_empty());
    }

    #[test]
    fn masquerade_is_fully_random_unless_disabled_and_spares_multicast() {
        let mut r = ruleset(Mode::Nftables);
        let last_two = |r: &Ruleset| r.chains()[0].rules[4..].to_vec();
        assert!(last_two(&r)
            .iter()
            .all(|rule| rule.action == Action::Masquerade { fully_random: true }));
        r.fully_random = false;
        assert!(last_two(&r).iter().all(|rule| rule.action
            == Action::Masquerade {
                fully_random: false
            }));
        assert_eq!(last_two(&r)[0].matches[1], daddr(true, net("224.0.0.0/4")));
        r.network = net("fd10::/56");
        r.subnet = net("fd10:0:0:1::/64");
        assert_eq!(r.family(), Family::Ipv6);
        assert_eq!(last_two(&r)[0].matches[1], daddr(true, net("ff00::/8")));
    }

    #[test]
    fn host_bits_of_a_lease_do_not_reach_the_rules() {
        let chains = ruleset(Mode::Iptables).chains();
        assert_eq!(
            chains[0].rules[1].matches[0],
            saddr(false, net("10.5.1.0/24"))
        );
    }
}
