//! flannel's end-to-end checks (flannel's e2e/: connectivity_test.go, resilience_test.go,
//! rules.go), ported to the lab's real cluster: for one variant of kube-flannel.yml (backend,
//! rules mode, dual-stack, dataplane), the DaemonSet rolls out, pods on the two nodes talk both
//! ways, each node's rules are flanneld v0.28.9's, and, for the resilience checks, the
//! DaemonSet's pods deleted and recreated keep FLANNEL_SUBNET and bring the pods' traffic back
//! (what they lose meanwhile counted), and a pod deleted and made again talks again.

use super::kube_flannel::{pod_cidr, pod_cidr6, rolls_out, Manifest, Variant, POD_TIMEOUT};
use super::pod_traffic::{pods_talk_across_nodes, PingersBothWays, Tally, TestPods};
use super::rules::{flannel_iptables_lines, iptables_text, nft_tables, nft_text, recorded};
use anyhow::{ensure, Context, Result};
use std::time::Duration;
use twill_lab::{Cluster, Image, Netns, CLUSTER_CIDR, CLUSTER_CIDR6};

/// How long the pingers go on once traffic is back, so what a restarted node does in its
/// first seconds (its first reconcile) is measured too.
pub const MEASURE_AFTER: Duration = Duration::from_secs(2);

/// What the pings between the test pods lost across a disturbance (a restart, a migration),
/// each way.
#[derive(Debug, Clone, Copy)]
pub struct PingLoss {
    /// pod-a (first node) to pod-b (second node), and back.
    pub ways: [Tally; 2],
}

impl std::fmt::Display for PingLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [a, b] = self.ways;
        write!(f, "pod-a to pod-b {a}, pod-b to pod-a {b}")
    }
}

/// Installs `variant` of kube-flannel.yml around `image` and runs [`e2e_checks`] on it.
pub fn flannel_e2e(
    cluster: &mut Cluster,
    image: &Image,
    variant: &Variant,
    resilience: bool,
) -> Result<Option<PingLoss>> {
    let manifest = variant.manifest(image)?;
    e2e_checks(cluster, &manifest, image, variant, resilience)
        .with_context(|| format!("flannel's e2e on {}", variant.name()))
}

/// Applies `manifest` (whose net-conf.json is `variant`'s), runs flannel's connectivity and
/// rules checks on it (and its resilience checks if `resilience`), and uninstalls it. The
/// restart's losses when the resilience checks ran.
pub fn e2e_checks(
    cluster: &mut Cluster,
    manifest: &Manifest,
    image: &Image,
    variant: &Variant,
    resilience: bool,
) -> Result<Option<PingLoss>> {
    rolls_out(cluster, manifest, image)?;
    let mut pods = TestPods::start(cluster)?;
    pods_talk_across_nodes(cluster, &pods)?;
    rules_are_flanneld_s(cluster, variant)?;
    let mut loss = None;
    if resilience {
        loss = Some(restart_flannel(cluster, manifest, &pods)?);
        pods.recreate(cluster, 0)?;
        pods_talk_across_nodes(cluster, &pods)?;
    }
    pods.delete(cluster)?;
    uninstall(cluster, manifest)?;
    Ok(loss)
}

/// Deletes the DaemonSet and waits until its pods are gone; the rest of the manifest stays, to
/// be applied again.
pub fn uninstall(cluster: &mut Cluster, manifest: &Manifest) -> Result<()> {
    cluster.delete_daemonset(manifest.namespace, manifest.daemonset, POD_TIMEOUT)
}

/// The lab host (network namespace) of the cluster's `k`th node: host 0 is the control plane.
pub fn node_host(cluster: &Cluster, k: usize) -> &Netns {
    &cluster.lab().host(k + 1).ns
}

/// Each node's masquerade and forward rules, in the variant's mode, byte for byte as flanneld
/// v0.28.9 left them (tests/data/flanneld-v0.28.9, read with the same commands as flannel's
/// e2e/rules.go), and nothing else: no rule of the other mode, no rule beside flannel's but
/// the kubelet's KUBE-* chains (as rules.go leaves out kube-proxy's) and the lab's
/// `ip twill-lab-services` table (the lab's stand-in for kube-proxy).
pub fn rules_are_flanneld_s(cluster: &Cluster, variant: &Variant) -> Result<()> {
    for (k, node) in cluster.nodes().iter().enumerate() {
        let ns = node_host(cluster, k);
        let subnet = pod_cidr(cluster, &node.name)?.to_string();
        let subnet6 = match variant.dual_stack {
            true => {
                let cidr6 = pod_cidr6(cluster, &node.name)?;
                Some(cidr6.context("no IPv6 podCIDR")?.to_string())
            }
            false => None,
        };
        node_rules(ns, variant.nftables, &subnet, subnet6.as_deref())
            .with_context(|| format!("{}'s rules", node.name))?;
    }
    Ok(())
}

fn node_rules(ns: &Netns, nftables: bool, subnet: &str, subnet6: Option<&str>) -> Result<()> {
    let compare = |what: &str, found: String, file: &str, subnet: &str, network: &str| {
        let expected = recorded(file, subnet, network)?;
        ensure!(
            found == expected,
            "{what} is not flanneld's ({file}):\n{found}\nexpected:\n{expected}"
        );
        Ok(())
    };
    if nftables {
        let v4 = nft_text(ns, "ip", "flannel-ipv4")?;
        compare("ip flannel-ipv4", v4, "nft-ipv4.txt", subnet, CLUSTER_CIDR)?;
        match subnet6 {
            Some(subnet6) => {
                let v6 = nft_text(ns, "ip6", "flannel-ipv6")?;
                compare(
                    "ip6 flannel-ipv6",
                    v6,
                    "nft-ipv6.txt",
                    subnet6,
                    CLUSTER_CIDR6,
                )?;
            }
            None => {
                // flanneld's nftables mode makes the IPv6 table on an IPv4 network too, empty.
                let table = ns.exec("nft", &["list", "table", "ip6", "flannel-ipv6"])?;
                let empty = "table ip6 flannel-ipv6 {\n\tcomment \"rules for flannel-ipv6\"\n}\n";
                ensure!(table == empty, "ip6 flannel-ipv6 is not empty:\n{table}");
            }
        }
        for command in ["iptables", "ip6tables"] {
            let lines = flannel_iptables_lines(ns, command)?;
            ensure!(
                lines.is_empty(),
                "{command} has flannel's chains: {lines:#?}"
            );
        }
    } else {
        let v4 = iptables_text(ns, "iptables")?;
        compare("iptables", v4, "iptables.txt", subnet, CLUSTER_CIDR)?;
        match subnet6 {
            Some(subnet6) => {
                let v6 = iptables_text(ns, "ip6tables")?;
                compare("ip6tables", v6, "ip6tables.txt", subnet6, CLUSTER_CIDR6)?;
            }
            None => {
                let lines = flannel_iptables_lines(ns, "ip6tables")?;
                ensure!(
                    lines.is_empty(),
                    "ip6tables has flannel's chains: {lines:#?}"
                );
            }
        }
    }
    nothing_else(ns, nftables)
}

/// Tables iptables-nft keeps its chains in, as `nft list tables` names them.
const IPTABLES_NFT_TABLES: [&str; 5] = ["filter", "nat", "mangle", "raw", "security"];

/// No nftables table but flannel's (in nftables mode), iptables-nft's and the lab's, and no
/// iptables rule but flannel's and the kubelet's.
fn nothing_else(ns: &Netns, nftables: bool) -> Result<()> {
    let mut allowed = vec!["table ip twill-lab-services".to_string()];
    for family in ["ip", "ip6"] {
        for table in IPTABLES_NFT_TABLES {
            allowed.push(format!("table {family} {table}"));
        }
    }
    if nftables {
        allowed.push("table ip flannel-ipv4".into());
        allowed.push("table ip6 flannel-ipv6".into());
    }
    let tables = nft_tables(ns)?;
    let others: Vec<&String> = tables.iter().filter(|t| !allowed.contains(t)).collect();
    ensure!(others.is_empty(), "tables beside flannel's: {others:?}");
    for command in ["iptables", "ip6tables"] {
        for table in IPTABLES_NFT_TABLES {
            let rules = ns.exec(command, &["-t", table, "-S"])?;
            let others: Vec<&str> = rules
                .lines()
                .filter(|l| !l.starts_with("-P ") && !l.contains("KUBE-"))
                .filter(|l| !l.contains("FLANNEL"))
                .collect();
            ensure!(
                others.is_empty(),
                "{command} -t {table} has rules beside flannel's and the kubelet's: {others:#?}"
            );
        }
    }
    Ok(())
}

/// The FLANNEL_SUBNET and FLANNEL_IPV6_SUBNET lines of each node's subnet.env.
fn subnet_lines(cluster: &Cluster) -> Result<Vec<Vec<String>>> {
    let mut all = Vec::new();
    for node in cluster.nodes() {
        let path = node.path("/run/flannel/subnet.env");
        let env = std::fs::read_to_string(&path)
            .with_context(|| format!("{}: no /run/flannel/subnet.env", node.name))?;
        let lines: Vec<String> = env
            .lines()
            .filter(|l| l.starts_with("FLANNEL_SUBNET=") || l.starts_with("FLANNEL_IPV6_SUBNET="))
            .map(String::from)
            .collect();
        ensure!(
            !lines.is_empty(),
            "{}: no FLANNEL_SUBNET:\n{env}",
            node.name
        );
        all.push(lines);
    }
    Ok(all)
}

/// flannel's e2e "preserves connectivity and subnet leases across a flannel DaemonSet restart":
/// every pod of the DaemonSet is deleted at once (each gets SIGTERM, as in a restart or an
/// upgrade), while the test pods ping each other every 10 ms; once the new pods are Ready on
/// every node and the pods' traffic is back, each node's subnet.env holds the same subnets.
/// What the pings lost in between.
pub fn restart_flannel(
    cluster: &mut Cluster,
    manifest: &Manifest,
    pods: &TestPods,
) -> Result<PingLoss> {
    let namespace = manifest.namespace;
    let before = subnet_lines(cluster)?;
    let old = cluster.pods(namespace)?;
    let pingers = PingersBothWays::start(pods);
    for pod in &old {
        cluster.delete_pod(namespace, pod)?;
    }
    let count = cluster.nodes().len();
    let what = format!("new pods of {} Ready on every node", manifest.daemonset);
    cluster.wait_for(&what, POD_TIMEOUT, |c| {
        let now = c.pods(namespace)?;
        if now.len() != count || now.iter().any(|p| old.contains(p)) {
            return Ok(None);
        }
        for pod in &now {
            let conditions = c.pod(namespace, pod)?.status.and_then(|s| s.conditions);
            let ready = (conditions.into_iter().flatten())
                .any(|c| c.type_ == "Ready" && c.status == "True");
            if !ready {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })?;
    // The traffic is back once a ping gets through each way; then a little more is measured.
    pods_talk_across_nodes(cluster, pods)?;
    std::thread::sleep(MEASURE_AFTER);
    let ways = pingers.finish()?;
    let after = subnet_lines(cluster)?;
    ensure!(
        after == before,
        "the subnets moved across the restart: {before:?} then {after:?}"
    );
    Ok(PingLoss { ways })
}
