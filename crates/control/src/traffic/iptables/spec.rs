//! flannel's rules as iptables-save lines: the chains flanneld v0.28.9 writes (flannel's
//! pkg/trafficmngr/iptables), each rule in the exact words `iptables -S` prints it back in, so
//! what twill writes and what it reads can be compared as text.

use super::super::ruleset::{Action, ChainKind, Field, Match, Rule, Ruleset};

/// flannel's chain of `kind`, where it hangs, and the comment on each of its rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Names {
    /// The iptables table: `nat` or `filter`.
    pub table: &'static str,
    /// The built-in chain that jumps to flannel's: POSTROUTING or FORWARD.
    pub builtin: &'static str,
    /// FLANNEL-POSTRTG or FLANNEL-FWD.
    pub chain: &'static str,
    comment: &'static str,
}

pub fn names(kind: ChainKind) -> Names {
    match kind {
        ChainKind::Masquerade => Names {
            table: "nat",
            builtin: "POSTROUTING",
            chain: "FLANNEL-POSTRTG",
            comment: "flanneld masq",
        },
        ChainKind::Forward => Names {
            table: "filter",
            builtin: "FORWARD",
            chain: "FLANNEL-FWD",
            comment: "flanneld forward",
        },
    }
}

impl Names {
    /// The rule of the built-in chain that sends traffic through flannel's, as flanneld
    /// appends it: `-m comment --comment "flanneld masq" -j FLANNEL-POSTRTG`.
    pub fn jump(&self) -> String {
        format!(
            "-m comment --comment \"{}\" -j {}",
            self.comment, self.chain
        )
    }

    /// Whether the rule `spec` jumps to flannel's chain (the jump rule, or one like it).
    pub fn jumps_here(&self, spec: &str) -> bool {
        spec.strip_suffix(self.chain)
            .is_some_and(|s| s == "-j " || s.ends_with(" -j "))
    }
}

/// One of flannel's chains as it should read back: its names and its rules, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainSpec {
    pub kind: ChainKind,
    pub names: Names,
    pub rules: Vec<String>,
}

/// What `ruleset` wants, as iptables-save lines: one [`ChainSpec`] per wanted chain.
pub fn chains(ruleset: &Ruleset) -> Vec<ChainSpec> {
    let chains = ruleset.chains().into_iter().map(|chain| {
        let names = names(chain.kind);
        let rules = chain.rules.iter().map(|r| spec(&names, r)).collect();
        ChainSpec {
            kind: chain.kind,
            names,
            rules,
        }
    });
    chains.collect()
}

/// A rule as iptables prints it: addresses, the mark, flannel's comment, then the target.
fn spec(names: &Names, rule: &Rule) -> String {
    let mut words = Vec::new();
    for m in &rule.matches {
        if let Match::Address {
            field,
            negated,
            net,
        } = *m
        {
            let flag = match field {
                Field::Saddr => "-s",
                Field::Daddr => "-d",
            };
            let not = if negated { "! " } else { "" };
            words.push(format!("{not}{flag} {}", net.trunc()));
        }
    }
    for m in &rule.matches {
        if let Match::Mark { mark, mask } = *m {
            let mask = mask.map(|m| format!("/{m:#x}")).unwrap_or_default();
            words.push(format!("-m mark --mark {mark:#x}{mask}"));
        }
    }
    words.push(format!("-m comment --comment \"{}\"", names.comment));
    words.push(
        match rule.action {
            Action::Return => "-j RETURN",
            Action::Accept => "-j ACCEPT",
            Action::Masquerade { fully_random: true } => "-j MASQUERADE --random-fully",
            Action::Masquerade {
                fully_random: false,
            } => "-j MASQUERADE",
        }
        .into(),
    );
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::super::super::ruleset::Mode;
    use super::*;

    fn ruleset(network: &str, subnet: &str) -> Ruleset {
        Ruleset {
            mode: Mode::Iptables,
            network: network.parse().unwrap(),
            subnet: subnet.parse().unwrap(),
            masquerade: true,
            forward: true,
            fully_random: true,
        }
    }

    /// The lines flanneld v0.28.9 left, as `iptables -S` printed them
    /// (tests/data/flanneld-v0.28.9/iptables.txt with its placeholders filled in).
    fn recorded(file: &str, subnet: &str, network: &str) -> Vec<String> {
        let path = format!(
            "{}/../../tests/data/flanneld-v0.28.9/{file}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let text = text
            .replace("POD_SUBNET6", subnet)
            .replace("NETWORK6", network)
            .replace("POD_SUBNET", subnet)
            .replace("NETWORK", network);
        text.lines().map(String::from).collect()
    }

    /// The same lines from what twill writes.
    fn written(r: &Ruleset) -> Vec<String> {
        let mut lines = Vec::new();
        for chain in chains(r) {
            let n = chain.names;
            lines.push(format!("-A {} {}", n.builtin, n.jump()));
            lines.push(format!("-N {}", n.chain));
            lines.extend(chain.rules.iter().map(|s| format!("-A {} {s}", n.chain)));
        }
        lines
    }

    #[test]
    fn the_rules_are_flanneld_s_word_for_word() {
        // The policy lines are the host's, not flanneld's.
        let rules_of = |lines: Vec<String>| -> Vec<String> {
            lines
                .into_iter()
                .filter(|l| !l.starts_with("-P "))
                .collect()
        };
        let v4 = rules_of(recorded("iptables.txt", "10.5.19.0/24", "10.5.0.0/16"));
        assert_eq!(written(&ruleset("10.5.0.0/16", "10.5.19.0/24")), v4);
        let v6 = rules_of(recorded("ip6tables.txt", "fd10:0:0:3f::/64", "fd10::/56"));
        assert_eq!(written(&ruleset("fd10::/56", "fd10:0:0:3f::/64")), v6);
    }

    #[test]
    fn without_fully_random_masquerade_takes_no_option() {
        let mut r = ruleset("10.5.0.0/16", "10.5.19.0/24");
        r.fully_random = false;
        let rules = &chains(&r)[0].rules;
        assert!(rules[4].ends_with("-j MASQUERADE"), "{rules:?}");
        assert!(rules[5].ends_with("-j MASQUERADE"), "{rules:?}");
    }

    #[test]
    fn a_jump_is_told_from_a_rule_that_merely_mentions_the_chain() {
        let n = names(ChainKind::Masquerade);
        assert!(n.jumps_here(&n.jump()));
        assert!(n.jumps_here("-j FLANNEL-POSTRTG"));
        assert!(!n.jumps_here("-j XFLANNEL-POSTRTG"));
        assert!(!n.jumps_here("-m comment --comment FLANNEL-POSTRTG -j RETURN"));
    }
}
