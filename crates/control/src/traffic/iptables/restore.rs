//! The input of `iptables-restore --noflush` that puts flannel's chains in place, or takes
//! them away, given what `iptables-save` showed just before.
//!
//! It does what flanneld's bootstrap does (flannel's ipTablesCleanAndBuild): the chain is
//! created or emptied (a chain line of `--noflush` input does either), the jump rules to it are
//! deleted and one is appended again, then the chain's rules are appended in order. Each table
//! is one block, which iptables applies whole or not at all.

use super::super::ruleset::ChainKind;
use super::saved::Saved;
use super::spec::{names, ChainSpec, Names};
use std::fmt::Write;

/// The input that leaves exactly `wanted` of flannel's chains, each as it should be, and none
/// of the others; empty when there is nothing to do.
pub fn replace(saved: &Saved, wanted: &[ChainSpec]) -> String {
    let mut input = String::new();
    for kind in ChainKind::ALL {
        let names = names(kind);
        match wanted.iter().find(|c| c.kind == kind) {
            Some(chain) => write_chain(&mut input, saved, chain),
            None if saved.has(&names) => remove_chain(&mut input, saved, &names),
            None => {}
        }
    }
    input
}

/// The input that removes every chain of flannel's there is, with the rules that jump to it;
/// empty when there is none.
pub fn remove(saved: &Saved) -> String {
    replace(saved, &[])
}

fn write_chain(input: &mut String, saved: &Saved, chain: &ChainSpec) {
    let n = &chain.names;
    let _ = writeln!(input, "*{}\n:{} - [0:0]", n.table, n.chain);
    delete_jumps(input, saved, n);
    let _ = writeln!(input, "-A {} {}", n.builtin, n.jump());
    for rule in &chain.rules {
        let _ = writeln!(input, "-A {} {rule}", n.chain);
    }
    input.push_str("COMMIT\n");
}

fn remove_chain(input: &mut String, saved: &Saved, n: &Names) {
    let _ = writeln!(input, "*{}\n:{} - [0:0]", n.table, n.chain);
    delete_jumps(input, saved, n);
    let _ = writeln!(input, "-X {}\nCOMMIT", n.chain);
}

/// Every rule that jumps to flannel's chain goes: one jump is appended again, and a chain must
/// be unreferenced to be deleted.
fn delete_jumps(input: &mut String, saved: &Saved, n: &Names) {
    for (chain, spec) in saved.jumps_to(n) {
        let _ = writeln!(input, "-D {chain} {spec}");
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::ruleset::{Mode, Ruleset};
    use super::super::spec::chains;
    use super::*;

    fn wanted(masquerade: bool, forward: bool) -> Vec<ChainSpec> {
        chains(&Ruleset {
            mode: Mode::Iptables,
            network: "10.5.0.0/16".parse().unwrap(),
            subnet: "10.5.1.0/24".parse().unwrap(),
            masquerade,
            forward,
            fully_random: true,
        })
    }

    #[test]
    fn a_first_write_creates_both_chains_and_their_jumps() {
        let input = replace(&Saved::default(), &wanted(true, true));
        let lines: Vec<&str> = input.lines().collect();
        assert_eq!(
            lines[..4],
            [
                "*nat",
                ":FLANNEL-POSTRTG - [0:0]",
                "-A POSTROUTING -m comment --comment \"flanneld masq\" -j FLANNEL-POSTRTG",
                "-A FLANNEL-POSTRTG -m mark --mark 0x4000/0x4000 -m comment --comment \
                 \"flanneld masq\" -j RETURN",
            ]
        );
        assert_eq!(lines[9..12], ["COMMIT", "*filter", ":FLANNEL-FWD - [0:0]"]);
        assert_eq!(lines.last(), Some(&"COMMIT"));
        assert_eq!(lines.len(), 4 + 5 + 1 + 3 + 2 + 1);
    }

    #[test]
    fn a_repair_deletes_every_jump_before_appending_one() {
        let saved = Saved::parse(
            "*filter\n:FORWARD DROP [0:0]\n:FLANNEL-FWD - [0:0]\n\
             -A FORWARD -m comment --comment \"flanneld forward\" -j FLANNEL-FWD\n\
             -A FORWARD -j FLANNEL-FWD\n\
             -A FORWARD -j DOCKER-USER\nCOMMIT\n",
        );
        let input = replace(&saved, &wanted(false, true));
        let lines: Vec<&str> = input.lines().collect();
        assert_eq!(
            lines[..5],
            [
                "*filter",
                ":FLANNEL-FWD - [0:0]",
                "-D FORWARD -m comment --comment \"flanneld forward\" -j FLANNEL-FWD",
                "-D FORWARD -j FLANNEL-FWD",
                "-A FORWARD -m comment --comment \"flanneld forward\" -j FLANNEL-FWD",
            ]
        );
        assert!(!input.contains("DOCKER-USER"));
    }

    #[test]
    fn a_chain_no_longer_wanted_goes_with_its_jumps_and_nothing_else_is_touched() {
        let saved = Saved::parse(
            "*nat\n:POSTROUTING ACCEPT [0:0]\n:FLANNEL-POSTRTG - [0:0]\n\
             -A POSTROUTING -m comment --comment \"flanneld masq\" -j FLANNEL-POSTRTG\n\
             -A FLANNEL-POSTRTG -j RETURN\nCOMMIT\n",
        );
        let input = replace(&saved, &wanted(false, true));
        assert!(input.starts_with(
            "*nat\n:FLANNEL-POSTRTG - [0:0]\n\
             -D POSTROUTING -m comment --comment \"flanneld masq\" -j FLANNEL-POSTRTG\n\
             -X FLANNEL-POSTRTG\nCOMMIT\n*filter\n"
        ));
        assert_eq!(
            remove(&saved),
            "*nat\n:FLANNEL-POSTRTG - [0:0]\n\
             -D POSTROUTING -m comment --comment \"flanneld masq\" -j FLANNEL-POSTRTG\n\
             -X FLANNEL-POSTRTG\nCOMMIT\n"
        );
        assert_eq!(remove(&Saved::default()), "");
    }
}
