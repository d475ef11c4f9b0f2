//! Hardening 3, the Node watch against a real kube-apiserver: it lists again when the API
//! server comes back on an etcd that lost its data (its resourceVersions now below twill's),
//! notices a connection that died silently within seconds, and a watch forbidden at start
//! stops twill in one line.

mod common;

use anyhow::{ensure, Context, Result};
use common::kube::{kube_cluster, net_conf, KubeCluster, PREFIX};
use common::*;
use std::time::{Duration, Instant};
use twill_lab::Ipv4Net;

fn net(cidr: &str) -> Ipv4Net {
    cidr.parse().unwrap()
}

/// Waits until `host` has exactly `want` as its peers' subnets, for as long as `bound`.
fn peers_within(c: &KubeCluster, host: usize, want: &[Ipv4Net], bound: Duration) -> Result<()> {
    let mut want: Vec<String> = want.iter().map(ToString::to_string).collect();
    want.sort();
    let what = format!("host {host} peers {want:?}");
    eventually_within(&what, bound, || {
        let mut have = c.peer_subnets(host)?;
        have.sort();
        Ok(have == want)
    })
    .with_context(|| format!("host {host} has {:?}", c.peer_subnets(host)))
}

/// Finding 4: the API server restarts on an etcd that lost everything, whose revisions start
/// below what node 0's watch had seen. Node 0 lists again, writes its annotations on its
/// Node as the kubelet registers it again, follows the Nodes made since, and drops the one
/// that did not come back.
#[test]
fn after_the_api_server_loses_its_data_the_watch_lists_again_and_annotates_the_new_node(
) -> Result<()> {
    let mut c = kube_cluster("h3-wipe", 3, &net_conf("udp", ""))?;
    c.add_node(0)?;
    c.add_node(1)?;
    let mut nodes = [c.start(0, &[])?, c.start(1, &[])?];
    c.flannel_node("stale", "10.5.80.0/24", "10.200.0.80")?;
    let stale = [KubeCluster::pod_cidr(1), net("10.5.80.0/24")];
    peers_within(&c, 0, &stale, Duration::from_secs(15))?;

    // Take etcd's revision, and node 0's watch with it, far past what a fresh etcd reaches
    // while an API server starts on it.
    let control = &c.lab.host(2).ns;
    let bump = format!(
        "for i in $(seq 400); do ETCDCTL_API=3 etcdctl --endpoints={} put /bump $i \
         >/dev/null || exit 1; done",
        c.etcd.endpoint()
    );
    control.sh(&bump)?;
    // A change node 0 sees at that revision: the stale Node moves.
    let ip = format!("{PREFIX}/public-ip");
    c.api
        .patch_node_annotations("stale", &[(&ip, Some("10.200.0.88"))])?;
    eventually_within("node 0 saw the move", Duration::from_secs(10), || {
        Ok(status(&c.lab.host(0).ns)?["peers"]
            .to_string()
            .contains("10.200.0.88"))
    })?;

    c.api.stop()?;
    c.etcd.lose_data()?;
    c.api.start_again()?;
    // The kubelets register their Nodes again (node IPAM gives them their old podCIDRs), and
    // a flannel node joins.
    c.add_node(0)?;
    c.add_node(1)?;
    c.flannel_node("after", "10.5.81.0/24", "10.200.0.81")?;
    let now = [KubeCluster::pod_cidr(1), net("10.5.81.0/24")];
    let started = Instant::now();
    peers_within(&c, 0, &now, Duration::from_secs(60))
        .with_context(|| format!("node 0's log:\n{}", nodes[0].stderr()))?;
    eprintln!(
        "node 0 followed the Nodes of the new history {:?} after they were made",
        started.elapsed()
    );
    let managed = format!("{PREFIX}/kube-subnet-manager");
    let node = c.api.node("node-0")?;
    let annotations = node.metadata.annotations.unwrap_or_default();
    ensure!(
        annotations.get(&managed).map(String::as_str) == Some("true"),
        "node-0 not annotated again: {annotations:?}"
    );
    let log = nodes[0].stderr();
    ensure!(log.contains("listing the Nodes again"), "{log}");
    for node in &mut nodes {
        ensure!(node.is_running(), "{}", node.stderr());
    }
    Ok(())
}

/// Finding 5: every packet between node 0 and the API server is dropped, and meanwhile the
/// server's end of node 0's connections goes away (the reset it sends is dropped too), as when
/// the path fails while the server's host restarts; a Node is made, then the path comes back.
/// Node 0's watch connection died without a word, and node 0 notices it within seconds (TCP
/// keepalive), not after the watch's five-minute idle timeout.
#[test]
fn a_watch_connection_that_died_silently_is_noticed_within_seconds() -> Result<()> {
    let c = kube_cluster("h3-dead", 3, &net_conf("udp", ""))?;
    c.add_node(0)?;
    c.add_node(1)?;
    let nodes = [c.start(0, &[])?, c.start(1, &[])?];
    c.wait_peers(0, &[KubeCluster::pod_cidr(1)])?;

    let (node0, control) = (c.lab.host(0).underlay_ip, c.lab.host(2).underlay_ip);
    let url = c.api.url();
    let port = url.rsplit(':').next().context("port")?;
    let cut = format!(
        "nft add table inet kubedrop; \
         nft add chain inet kubedrop out '{{ type filter hook output priority 0; }}'; \
         nft add chain inet kubedrop in '{{ type filter hook input priority 0; }}'; \
         nft add rule inet kubedrop out ip daddr {control} tcp dport {port} drop; \
         nft add rule inet kubedrop in ip saddr {control} tcp sport {port} drop"
    );
    c.lab.host(0).ns.sh(&cut)?;
    let forget = format!("ss -K -tn 'src {control} and sport = :{port} and dst {node0}'");
    c.lab.host(2).ns.sh(&forget)?;
    c.flannel_node("while-cut", "10.5.90.0/24", "10.200.0.90")?;
    c.wait_peers(1, &[KubeCluster::pod_cidr(0), net("10.5.90.0/24")])?;
    c.lab.host(0).ns.sh("nft delete table inet kubedrop")?;
    let restored = Instant::now();
    let want = [KubeCluster::pod_cidr(1), net("10.5.90.0/24")];
    peers_within(&c, 0, &want, Duration::from_secs(45))?;
    eprintln!(
        "node 0 saw the Node made while cut off {:?} after the path came back",
        restored.elapsed()
    );
    for mut node in nodes {
        ensure!(node.is_running(), "{}", node.stderr());
    }
    Ok(())
}

/// What twill's ClusterRole grants, less `watch`.
const MAY_NOT_WATCH: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: twill-lister}
rules:
- {apiGroups: [""], resources: [nodes], verbs: [get, list]}
- {apiGroups: [""], resources: [nodes/status], verbs: [patch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: twill-lister}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: twill-lister}
subjects:
- {kind: ServiceAccount, name: lister, namespace: kube-twill}
"#;

/// Finding 8: a service account that may list the Nodes but not watch them stops twill at
/// start with one line naming the verb, instead of running on with a table that never changes.
#[test]
fn a_watch_forbidden_at_start_stops_twill_in_one_line() -> Result<()> {
    let c = kube_cluster("h3-nowatch", 2, &net_conf("udp", ""))?;
    c.add_node(0)?;
    c.api.create_service_account("kube-twill", "lister")?;
    c.api.apply_yaml(MAY_NOT_WATCH)?;
    let token = c.api.service_account_token("kube-twill", "lister")?;
    let kubeconfig = c.dir.path().join("lister");
    c.api.write_kubeconfig(&kubeconfig, &token)?;
    let auth = ["--kubeconfig-file", kubeconfig.to_str().context("path")?];
    // The binding reaches the server's authorizer a moment after it is made (seconds on a
    // loaded machine): try again until then, within a bound.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    while Instant::now() < deadline {
        let stderr = c.failing_start(0, &auth, &[])?;
        last = stderr.lines().last().unwrap_or_default().to_string();
        if !last.contains("may not get nodes/node-0") {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    ensure!(
        last.contains("twill's service account may not watch nodes (403 Forbidden"),
        "{last}"
    );
    Ok(())
}
