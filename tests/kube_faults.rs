//! `--kube-subnet-mgr` under change and failure, against a real kube-apiserver: Nodes added,
//! corrupted, moved and deleted, the API server stopped, the watch cut while Nodes change,
//! refused credentials, an unreachable server at start. Traffic between the healthy nodes is
//! pinged throughout and must lose nothing.

mod common;

use anyhow::{Context, Result};
use common::kube::{kube_cluster, kube_cluster_with, net_conf, KubeCluster, PREFIX};
use common::*;
use std::time::Duration;
use twill_lab::{Answer, ApiFront, Ipv4Net, Proc};

fn net(cidr: &str) -> Ipv4Net {
    cidr.parse().unwrap()
}

/// A ping from host `a`'s container to host `b`'s that runs in the background for `count`
/// × 50 ms; [`no_loss`] reads its result.
fn background_ping(c: &KubeCluster, a: usize, b: usize, count: u32) -> Result<Proc> {
    let to = c.container(b).ip.to_string();
    let count = count.to_string();
    c.container(a)
        .ns
        .spawn("ping", &["-c", &count, "-i", "0.05", "-W", "1", &to])
}

fn no_loss(mut ping: Proc) -> Result<()> {
    ping.wait_timeout(Duration::from_secs(60))?
        .context("ping did not finish")?;
    let out = ping.stdout();
    anyhow::ensure!(
        out.contains(" 0% packet loss"),
        "traffic between healthy nodes stopped:\n{out}"
    );
    Ok(())
}

/// Three twill nodes; while node 0 pings node 1 without a loss, a flanneld-like Node comes,
/// is corrupted, repaired, moved and deleted, and node 2's own podCIDR is changed under it.
#[test]
fn peers_follow_node_changes_while_traffic_flows() -> Result<()> {
    let mut c = kube_cluster("kube-chg", 3, &net_conf("udp", ""))?;
    for host in 0..3 {
        c.add_node(host)?;
    }
    let mut nodes: Vec<Proc> = (0..3).map(|h| c.start(h, &[])).collect::<Result<_>>()?;
    c.add_container(0)?;
    c.add_container(1)?;
    c.wait_peers(0, &[KubeCluster::pod_cidr(1), KubeCluster::pod_cidr(2)])?;
    c.traffic(0, 1, 4 << 20)?;
    let ping = background_ping(&c, 0, 1, 300)?;

    c.flannel_node("flannel-x", "10.5.50.0/24", "10.200.0.50")?;
    let all = |extra: &str| {
        [
            KubeCluster::pod_cidr(1),
            KubeCluster::pod_cidr(2),
            net(extra),
        ]
    };
    c.wait_peers(0, &all("10.5.50.0/24"))?;

    let ip = format!("{PREFIX}/public-ip");
    c.api
        .patch_node_annotations("flannel-x", &[(&ip, Some("not-an-ip"))])?;
    c.wait_peers(0, &[KubeCluster::pod_cidr(1), KubeCluster::pod_cidr(2)])?;
    let rejected = c.rejected(0)?;
    anyhow::ensure!(
        rejected
            .iter()
            .any(|(key, why)| key == "node/flannel-x" && why.contains("not-an-ip")),
        "{rejected:?}"
    );
    c.api
        .patch_node_annotations("flannel-x", &[(&ip, Some("10.200.0.50"))])?;
    c.wait_peers(0, &all("10.5.50.0/24"))?;
    eventually("rejection cleared", || Ok(c.rejected(0)?.is_empty()))?;

    c.api.set_pod_cidr("flannel-x", "10.5.51.0/24")?;
    c.wait_peers(0, &all("10.5.51.0/24"))?;
    c.api.delete_node("flannel-x")?;
    c.wait_peers(0, &[KubeCluster::pod_cidr(1), KubeCluster::pod_cidr(2)])?;

    // Node 2's podCIDR changes: its containers are numbered from the old one, so it stops
    // and says why; the others follow the Node to its new subnet.
    c.api.set_pod_cidr("node-2", "10.5.60.0/24")?;
    let stderr = nodes[2].failure_within(Duration::from_secs(15), "node 2 kept running")?;
    anyhow::ensure!(
        stderr.contains("podCIDR changed from 10.5.3.0/24"),
        "{stderr}"
    );
    c.wait_peers(0, &[KubeCluster::pod_cidr(1), net("10.5.60.0/24")])?;
    c.wait_peers(1, &[KubeCluster::pod_cidr(0), net("10.5.60.0/24")])?;

    no_loss(ping)?;
    for node in &mut nodes[..2] {
        anyhow::ensure!(node.is_running(), "{}", node.stderr());
    }
    Ok(())
}

/// The API server goes away and comes back; then the watch of one node is cut (its
/// connections reset) while Nodes come and go and etcd's history is compacted, so the watch
/// it resumes has expired (410 Gone: the API server runs without its watch cache, so watches
/// go to etcd). Forwarding goes on, and the node catches up on every change, by a fresh list.
#[test]
fn api_server_outage_and_a_cut_watch_miss_nothing() -> Result<()> {
    let no_cache = ["--watch-cache=false"];
    let mut c = kube_cluster_with("kube-out", 3, &net_conf("udp", ""), &no_cache)?;
    c.add_node(0)?;
    c.add_node(1)?;
    let nodes: Vec<Proc> = (0..2).map(|h| c.start(h, &[])).collect::<Result<_>>()?;
    c.add_container(0)?;
    c.add_container(1)?;
    c.wait_peers(0, &[KubeCluster::pod_cidr(1)])?;
    c.traffic(0, 1, 4 << 20)?;
    c.flannel_node("gone-soon", "10.5.70.0/24", "10.200.0.70")?;
    c.wait_peers(0, &[KubeCluster::pod_cidr(1), net("10.5.70.0/24")])?;

    let ping = background_ping(&c, 0, 1, 200)?;
    c.api.stop()?;
    std::thread::sleep(Duration::from_secs(3));
    c.api.start_again()?;
    c.flannel_node("after-outage", "10.5.71.0/24", "10.200.0.71")?;
    let three = [
        KubeCluster::pod_cidr(1),
        net("10.5.70.0/24"),
        net("10.5.71.0/24"),
    ];
    c.wait_peers(0, &three)?;
    c.wait_peers(
        1,
        &[
            KubeCluster::pod_cidr(0),
            net("10.5.70.0/24"),
            net("10.5.71.0/24"),
        ],
    )?;
    no_loss(ping)?;

    // Cut node 0 off the API server (every packet to it answered with a TCP reset), then
    // restart the server so that node 0's watch ends, change Nodes it cannot see, and compact
    // etcd: the watch it resumes from its last resourceVersion has expired.
    let control = c.lab.host(2).underlay_ip;
    let url = c.api.url();
    let port = url.rsplit(':').next().context("port")?;
    let cut = format!(
        "nft add table inet kubecut; \
         nft add chain inet kubecut out '{{ type filter hook output priority 0; }}'; \
         nft add rule inet kubecut out ip daddr {control} tcp dport {port} reject with tcp reset"
    );
    c.lab.host(0).ns.sh(&cut)?;
    let ping = background_ping(&c, 0, 1, 200)?;
    c.api.stop()?;
    c.api.start_again()?;
    c.api.delete_node("gone-soon")?;
    c.flannel_node("during-cut", "10.5.72.0/24", "10.200.0.72")?;
    c.wait_peers(
        1,
        &[
            KubeCluster::pod_cidr(0),
            net("10.5.71.0/24"),
            net("10.5.72.0/24"),
        ],
    )?;
    compact_etcd(&c)?;
    c.lab.host(0).ns.sh("nft delete table inet kubecut")?;
    c.wait_peers(
        0,
        &[
            KubeCluster::pod_cidr(1),
            net("10.5.71.0/24"),
            net("10.5.72.0/24"),
        ],
    )?;
    no_loss(ping)?;
    let log = nodes[0].stderr();
    anyhow::ensure!(
        log.contains("provided watch is too old"),
        "the watch never expired:\n{log}"
    );
    for mut node in nodes {
        anyhow::ensure!(node.is_running(), "{}", node.stderr());
    }
    Ok(())
}

/// Compacts etcd to its current revision, so a watch resuming from before it must list again.
fn compact_etcd(c: &KubeCluster) -> Result<()> {
    let status = c.etcd.etcdctl(&["endpoint", "status", "-w", "json"])?;
    let json: serde_json::Value = serde_json::from_str(&status)?;
    let revision = json[0]["Status"]["header"]["revision"]
        .as_u64()
        .with_context(|| format!("no revision in {status}"))?;
    c.etcd.etcdctl(&["compact", &revision.to_string()])?;
    Ok(())
}

/// A token the server rejects (401) and one whose service account lacks the permission (403):
/// each stops twill at start with one line naming the verb and resource.
#[test]
fn refused_credentials_name_the_verb_and_resource() -> Result<()> {
    let c = kube_cluster("kube-auth", 2, &net_conf("udp", ""))?;
    c.add_node(0)?;
    let kubeconfig = c.dir.path().join("bad-token");
    c.api.write_kubeconfig(&kubeconfig, "not-a-token")?;
    let bad = ["--kubeconfig-file", kubeconfig.to_str().context("path")?];
    let stderr = c.failing_start(0, &bad, &[])?;
    anyhow::ensure!(
        stderr.contains("401 Unauthorized") && stderr.contains("get nodes/node-0"),
        "{stderr}"
    );

    c.api.create_service_account("kube-twill", "nobody")?;
    let token = c.api.service_account_token("kube-twill", "nobody")?;
    let kubeconfig = c.dir.path().join("nobody");
    c.api.write_kubeconfig(&kubeconfig, &token)?;
    let nobody = ["--kubeconfig-file", kubeconfig.to_str().context("path")?];
    let stderr = c.failing_start(0, &nobody, &[])?;
    anyhow::ensure!(
        stderr.contains("may not get nodes/node-0 (403 Forbidden")
            && stderr.contains("system:serviceaccount:kube-twill:nobody"),
        "{stderr}"
    );
    Ok(())
}

/// An API server that does not answer at start: twill retries with a clear line, and SIGTERM
/// still ends it at once.
#[test]
fn unreachable_api_server_at_start_is_retried_and_sigterm_still_stops() -> Result<()> {
    let c = kube_cluster("kube-unr", 2, &net_conf("udp", ""))?;
    let closed = twill_lab::free_tcp_port()?;
    let url = format!("https://127.0.0.1:{closed}");
    let kubeconfig = c.kubeconfig();
    let args = [
        "--kubeconfig-file",
        kubeconfig.to_str().context("path")?,
        "--kube-api-url",
        &url,
    ];
    let conf = c.net_conf_path();
    let mut all = vec![
        "run",
        "--iface",
        "eth0",
        "--kube-subnet-mgr",
        "--net-config-path",
    ];
    all.push(conf.to_str().context("path")?);
    all.extend(args);
    let mut node = spawn_twill(&c.lab.host(0).ns, &all, &[("NODE_NAME", "node-0")])?;
    eventually_within("the retry line", Duration::from_secs(10), || {
        Ok(node
            .stderr()
            .contains("the Kubernetes API server is unreachable"))
    })?;
    let pid = nix::unistd::Pid::from_raw(node.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
    let exit = node.wait_timeout(Duration::from_secs(2))?;
    anyhow::ensure!(
        exit.is_some_and(|s| s.success()),
        "{exit:?}\n{}",
        node.stderr()
    );
    Ok(())
}

/// Hardening 4, finding 4: an API server address that answers 200 with an empty body (a watch
/// that ends at once) or with JSON cut short (a proxy cutting responses) is a failure, not an
/// answer: the node backs off (a few dozen requests in 10 s at most, where it made tens of
/// thousands), says so once per episode with the first bytes, keeps forwarding, and follows
/// the Nodes again once the answers are right.
#[test]
fn answers_that_are_not_what_the_api_promises_back_off_and_are_said_once() -> Result<()> {
    let mut c = kube_cluster("kube-bad", 3, &net_conf("udp", ""))?;
    c.add_node(0)?;
    c.add_node(1)?;
    let front = ApiFront::start(&c.api, c.lab.host(2).underlay_ip)?;
    let kubeconfig = path_in(&c.dir, "front.kubeconfig");
    std::fs::write(&kubeconfig, front.kubeconfig())?;
    let auth = ["--kubeconfig-file", kubeconfig.to_str().context("path")?];
    let mut node0 = c.start_as(0, &auth, &[])?;
    let _node1 = c.start(1, &[])?;
    c.add_container(0)?;
    c.add_container(1)?;
    c.wait_peers(0, &[KubeCluster::pod_cidr(1)])?;
    for (n, answer) in [Answer::Empty, Answer::Truncated].into_iter().enumerate() {
        let count = || {
            let answered = front.answered();
            let watches = answered.watches.load(std::sync::atomic::Ordering::Relaxed);
            watches + answered.others.load(std::sync::atomic::Ordering::Relaxed)
        };
        let before = count();
        front.set(answer);
        let ping = background_ping(&c, 0, 1, 200)?;
        std::thread::sleep(Duration::from_secs(10));
        let requests = count() - before;
        anyhow::ensure!(
            requests <= 40,
            "{answer:?}: {requests} requests in 10 s:\n{}",
            node0.stderr()
        );
        no_loss(ping)?;
        front.set(Answer::Forward);
        let name = format!("after-{n}");
        let cidr = format!("10.5.{}.0/24", 80 + n);
        c.flannel_node(&name, &cidr, &format!("10.200.0.{}", 80 + n))?;
        let mut want = vec![KubeCluster::pod_cidr(1)];
        want.extend((0..=n).map(|i| net(&format!("10.5.{}.0/24", 80 + i))));
        c.wait_peers(0, &want)?;
    }
    let log = node0.stderr();
    let said = "the API server ended a watch at once, without an event";
    anyhow::ensure!(
        log.matches(said).count() == 2,
        "not said once an episode:\n{log}"
    );
    anyhow::ensure!(
        log.contains(r#"(it sent 0 bytes: "")"#) && log.contains(r#"{\"type\":\"ADDED\""#),
        "the first bytes not quoted:\n{log}"
    );
    anyhow::ensure!(node0.is_running(), "{log}");
    Ok(())
}
