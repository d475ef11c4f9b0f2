//! deploy/kubernetes/twill.yml against a real kube-apiserver: it passes server-side dry run,
//! and twill runs under exactly the ClusterRole it grants, with a real service-account token,
//! both from a kubeconfig and in-cluster (the token, CA and namespace files where a pod has
//! them, and KUBERNETES_SERVICE_HOST/PORT).

mod common;

use anyhow::{Context, Result};
use common::kube::{kube_cluster, net_conf, KubeCluster};
use common::*;
use twill_lab::Proc;

const MANIFEST: &str = include_str!("../deploy/kubernetes/twill.yml");
const NAMESPACE: &str = "kube-twill";
const SERVICE_ACCOUNT: &str = "twill";
const SECRETS: &str = "/run/secrets/kubernetes.io/serviceaccount";

#[test]
fn manifest_passes_dry_run_and_twill_runs_under_its_cluster_role() -> Result<()> {
    let mut c = kube_cluster("kube-man", 2, &net_conf("vxlan", ""))?;
    c.api.apply_yaml_dry_run(MANIFEST)?;
    c.api.apply_yaml(MANIFEST)?;
    c.add_node(0)?;
    c.add_node(1)?;
    let token = c.api.service_account_token(NAMESPACE, SERVICE_ACCOUNT)?;

    // Node 0 from a kubeconfig holding the service account's token.
    let kubeconfig = c.dir.path().join("twill-sa");
    c.api.write_kubeconfig(&kubeconfig, &token)?;
    let path = kubeconfig.to_str().context("path")?;
    let node0 = c.start_as(0, &["--kubeconfig-file", path], &[])?;
    // Node 1 in-cluster, as the DaemonSet runs it: no flag names the server.
    let node1 = start_in_cluster(&c, 1, &token)?;

    c.wait_peers(0, &[KubeCluster::pod_cidr(1)])?;
    c.wait_peers(1, &[KubeCluster::pod_cidr(0)])?;
    c.add_container(0)?;
    c.add_container(1)?;
    c.traffic(0, 1, 4 << 20)?;
    for (i, mut node) in [node0, node1].into_iter().enumerate() {
        let log = node.stderr();
        anyhow::ensure!(node.is_running(), "node {i} stopped:\n{log}");
        // The API server's refusal is a 403 with reason Forbidden; a bare "403" would also
        // match a resourceVersion in the debug log.
        let lower = log.to_lowercase();
        anyhow::ensure!(
            !lower.contains("forbidden") && !lower.contains("may not"),
            "node {i}:\n{log}"
        );
    }
    Ok(())
}

/// twill on `host` in a mount namespace of its own where the service account's files are at
/// the path a pod has them, found through KUBERNETES_SERVICE_HOST and _PORT.
fn start_in_cluster(c: &KubeCluster, host: usize, token: &str) -> Result<Proc> {
    let files = c.dir.path().join("serviceaccount");
    std::fs::create_dir_all(&files)?;
    std::fs::write(files.join("token"), token)?;
    std::fs::write(files.join("namespace"), NAMESPACE)?;
    std::fs::copy(c.api.ca_file(), files.join("ca.crt"))?;
    let url = c.api.url();
    let (host_ip, port) = url
        .trim_start_matches("https://")
        .rsplit_once(':')
        .context("API URL")?;
    let conf = c.net_conf_path();
    let subnet_file = c.subnet_file(host);
    // A tmpfs over /run in this process's own mount namespace: nothing is created on the host.
    let script = format!(
        "mount -t tmpfs tmpfs /run && mkdir -p {SECRETS} && cp {}/* {SECRETS}/ && \
         exec {TWILL} run --kube-subnet-mgr --iface eth0 --net-config-path {} --subnet-file {}",
        files.display(),
        conf.display(),
        subnet_file.display()
    );
    let name = KubeCluster::node_name(host);
    let env = [
        ("NODE_NAME", name.as_str()),
        ("KUBERNETES_SERVICE_HOST", host_ip),
        ("KUBERNETES_SERVICE_PORT", port),
        ("RUST_LOG", "info,twill=debug"),
    ];
    let args = ["--mount", "--propagation", "private", "sh", "-c", &script];
    let ns = &c.lab.host(host).ns;
    let mut proc = ns.spawn_with("unshare", &args, &env)?;
    wait_ready(ns, &mut proc, &subnet_file)?;
    Ok(proc)
}
