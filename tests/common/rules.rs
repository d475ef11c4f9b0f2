//! flannel's masquerade and forward rules as the host's own tools show them, next to what a
//! real flanneld v0.28.9 left (tests/data/flanneld-v0.28.9/, read as its README says), and
//! flanneld's leftovers written back into a lab host as flanneld would have left them.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use twill_lab::Netns;

/// A file of tests/data/flanneld-v0.28.9 with its placeholders filled in: `subnet` for the
/// node's subnet, `network` for the network's (POD_SUBNET/NETWORK, or their IPv6 forms).
pub fn recorded(file: &str, subnet: &str, network: &str) -> Result<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/flanneld-v0.28.9")
        .join(file);
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    Ok(text
        .replace("POD_SUBNET6", subnet)
        .replace("NETWORK6", network)
        .replace("POD_SUBNET", subnet)
        .replace("NETWORK", network))
}

/// flannel's iptables rules as the recording read them: the FLANNEL lines of
/// `-t nat -S POSTROUTING`, `-t nat -S FLANNEL-POSTRTG`, `-S FORWARD`, `-S FLANNEL-FWD`, with
/// `command` (`iptables`, `ip6tables`, or a backend's own, `iptables-legacy`).
pub fn iptables_text(ns: &Netns, command: &str) -> Result<String> {
    let postrouting = ns.exec(command, &["-t", "nat", "-S", "POSTROUTING"])?;
    let mut text: String = postrouting
        .lines()
        .filter(|l| l.contains("FLANNEL"))
        .map(|l| format!("{l}\n"))
        .collect();
    text += &ns.exec(command, &["-t", "nat", "-S", "FLANNEL-POSTRTG"])?;
    text += &ns.exec(command, &["-S", "FORWARD"])?;
    text += &ns.exec(command, &["-S", "FLANNEL-FWD"])?;
    Ok(text)
}

/// Every line of `command -S` and `-t nat -S` that names a flannel chain: empty when flannel
/// has nothing there.
pub fn flannel_iptables_lines(ns: &Netns, command: &str) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    for table in ["nat", "filter"] {
        let out = ns.exec(command, &["-t", table, "-S"])?;
        lines.extend(
            out.lines()
                .filter(|l| l.contains("FLANNEL"))
                .map(String::from),
        );
    }
    Ok(lines)
}

/// flannel's nftables chains as the recording read them: `nft list chain <family> <table>
/// postrtg`, then `... forward`.
pub fn nft_text(ns: &Netns, family: &str, table: &str) -> Result<String> {
    let mut text = ns.exec("nft", &["list", "chain", family, table, "postrtg"])?;
    text += &ns.exec("nft", &["list", "chain", family, table, "forward"])?;
    Ok(text)
}

/// The nftables tables of a host, as `nft list tables` names them (`table ip flannel-ipv4`).
pub fn nft_tables(ns: &Netns) -> Result<Vec<String>> {
    let out = ns.exec("nft", &["list", "tables"])?;
    Ok(out.lines().map(|l| l.trim().to_string()).collect())
}

/// Writes what flanneld's iptables mode leaves for `subnet` in `network` (the recorded rules
/// of `file`: iptables.txt or ip6tables.txt), through `restore` (`iptables-restore`,
/// `ip6tables-legacy-restore`, ...), as flanneld's own iptables-restore wrote them.
pub fn write_flanneld_iptables(
    ns: &Netns,
    restore: &str,
    file: &str,
    subnet: &str,
    network: &str,
) -> Result<()> {
    let rules = recorded(file, subnet, network)?;
    let lines = |pattern: &str| -> String {
        rules
            .lines()
            .filter(|l| l.starts_with("-A ") && l.contains(pattern))
            .map(|l| format!("{l}\n"))
            .collect()
    };
    let input = format!(
        "*nat\n:FLANNEL-POSTRTG - [0:0]\n{}COMMIT\n*filter\n:FLANNEL-FWD - [0:0]\n{}COMMIT\n",
        lines("POSTRTG"),
        lines("FLANNEL-FWD")
    );
    let script = format!("{restore} --noflush -w <<'EOF'\n{input}EOF\n");
    ns.sh(&script).map(drop)
}

/// Writes what flanneld's nftables mode leaves (the recorded tables of `file`, nft-ipv4.txt or
/// nft-ipv6.txt, whose listing nft reads back as input), with flanneld's table comment.
pub fn write_flanneld_nft(ns: &Netns, file: &str, subnet: &str, network: &str) -> Result<()> {
    let tables = recorded(file, subnet, network)?;
    let (family, table) = if file.contains("ipv6") {
        ("ip6", "flannel-ipv6")
    } else {
        ("ip", "flannel-ipv4")
    };
    let script = format!(
        "nft -f - <<'EOF'\ntable {family} {table} {{ comment \"rules for {table}\"; }}\n{tables}EOF\n"
    );
    ns.sh(&script).map(drop)
}

/// A directory of stand-ins for the programs twill may start (`nft`, and the save and restore
/// programs of both iptables backends and families), each logging its command line to
/// `log` and running the real one: put first on twill's PATH, the log counts what twill ran.
pub struct Spies {
    pub dir: tempfile::TempDir,
    pub log: PathBuf,
}

impl Spies {
    pub fn new() -> Result<Spies> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("ran.log");
        let mut programs = vec!["nft".to_string()];
        for iptables in ["iptables", "ip6tables"] {
            for backend in ["nft", "legacy"] {
                for job in ["save", "restore"] {
                    programs.push(format!("{iptables}-{backend}-{job}"));
                }
            }
        }
        for program in programs {
            let real = which(&program)?;
            let spy = dir.path().join(&program);
            let script = format!(
                "#!/bin/sh\necho \"{program} $*\" >> {}\nexec {} \"$@\"\n",
                log.display(),
                real.display()
            );
            std::fs::write(&spy, script)?;
            std::fs::set_permissions(&spy, std::fs::Permissions::from_mode(0o755))?;
        }
        Ok(Spies { dir, log })
    }

    /// PATH with the spies first.
    pub fn path(&self) -> Result<String> {
        Ok(format!(
            "{}:{}",
            self.dir.path().display(),
            std::env::var("PATH")?
        ))
    }

    /// The programs run so far, one command line each.
    pub fn ran(&self) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().map(String::from).collect()
    }
}

fn which(program: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .with_context(|| format!("{program} is not installed (scripts/setup installs iptables)"))
}

/// The flags that make host `i` of a [`super::Pair`] the node [`super::start_pair`] starts:
/// its subnet, and the other host as its peer.
pub fn pair_flags(pair: &super::Pair, i: usize) -> Vec<String> {
    let other = 1 - i;
    let peer = format!(
        "{}={}",
        super::PAIR_SUBNETS[other],
        pair.host(other).underlay_ip
    );
    let flags = [
        "--network",
        "10.5.0.0/16",
        "--subnet",
        super::PAIR_SUBNETS[i],
        "--peer",
    ];
    flags.iter().map(|f| f.to_string()).chain([peer]).collect()
}

/// Waits until `node` says it holds its lease and forwards, which it says once its rules are
/// written: a restarted node's status answers, and its old subnet file is there, before that.
pub fn forwarding(node: &twill_lab::Proc) -> Result<()> {
    super::eventually_within(
        "the node forwarding",
        std::time::Duration::from_secs(20),
        || Ok(node.stderr().contains("lease acquired; forwarding")),
    )
    .with_context(|| node.stderr())
}
