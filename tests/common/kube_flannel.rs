//! flannel's own kube-flannel.yml on a real cluster (twill_lab::Cluster: kubelet and containerd
//! on every node), with only its images swapped: what a user who adopts an image does. The
//! checks take the image as their one argument, so flanneld's image and twill's pass the same.

use anyhow::{ensure, Context, Result};
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use twill_lab::{Cluster, ClusterSpec, Image, Ipv4Net, CLUSTER_CIDR};

/// flannel v0.28.9's Documentation/kube-flannel.yml, as released.
pub const KUBE_FLANNEL: &str = include_str!("../data/kube-flannel-v0.28.9.yml");
const FLANNEL_IMAGE: &str = "ghcr.io/flannel-io/flannel:v0.28.9";
const CNI_PLUGIN_IMAGE: &str = "ghcr.io/flannel-io/flannel-cni-plugin:v1.9.1-flannel3";
pub const NAMESPACE: &str = "kube-flannel";
/// The name [`twill_image`] gives twill's image.
pub const TWILL_IMAGE: &str = "localhost/twill:test";
const DAEMONSET: &str = "kube-flannel-ds";
const CONFIG_MAP: &str = "kube-flannel-cfg";
/// The readinessProbe starts after 5 s and asks every 10 s; images are local.
const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(180);
const POD_TIMEOUT: Duration = Duration::from_secs(120);

/// twill's image as `scripts/image` lays it out around a given daemon, here the twill binary
/// under test, written into `dir`: what a user makes with `scripts/image` after a release build.
pub fn twill_image(dir: &Path) -> Result<Image> {
    let out = dir.join("twill.tar");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/image");
    let output = Command::new("bash")
        .arg(script)
        .args([
            "--flanneld",
            crate::common::TWILL,
            "--name",
            TWILL_IMAGE,
            "--out",
        ])
        .arg(&out)
        .output()
        .context("cannot run scripts/image")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(
        output.status.success(),
        "scripts/image failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(
        stdout.lines().last() == Some(&*out.to_string_lossy()),
        "scripts/image's last line is not the archive's path {}:\n{stdout}",
        out.display()
    );
    Image::from_archive(&out)
}

/// kube-flannel.yml with its two flannel image lines pointing at `flannel` and its CNI plugin
/// line at `cni_plugin`; nothing else changes. Fails if the manifest does not have exactly those
/// lines, so a different manifest cannot pass unchanged.
pub fn kube_flannel(flannel: &Image, cni_plugin: &Image) -> Result<String> {
    let mut manifest = KUBE_FLANNEL.to_string();
    for (from, to, count) in [
        (FLANNEL_IMAGE, &flannel.name, 2),
        (CNI_PLUGIN_IMAGE, &cni_plugin.name, 1),
    ] {
        let line = format!("image: {from}\n");
        let found = manifest.matches(&line).count();
        ensure!(
            found == count,
            "kube-flannel.yml has {found} lines `image: {from}`, expected {count}"
        );
        manifest = manifest.replace(&line, &format!("image: {to}\n"));
    }
    Ok(manifest)
}

/// A two-node cluster with no network add-on, whose nodes hold `flannel`, flannel's CNI plugin
/// image and the busybox test image.
pub fn cluster_for(tag: &str, flannel: &Image) -> Result<Cluster> {
    Cluster::start(ClusterSpec {
        tag: tag.into(),
        images: vec![
            flannel.clone(),
            Image::part("flannel-cni-plugin")?,
            Image::part("busybox")?,
        ],
        ..Default::default()
    })
}

/// Applies kube-flannel.yml (server-side, as `kubectl apply --server-side`) with `flannel` as its
/// image, and checks what the manifest promises: the DaemonSet rolls out with every pod Ready
/// through flannel's readinessProbe, the init containers install the CNI config and plugin, each
/// node's subnet.env holds its podCIDR, the Nodes lose NetworkUnavailable and go Ready, and pods
/// on the two nodes ping each other and carry bytes over TCP both ways, intact.
pub fn kube_flannel_holds(cluster: &mut Cluster, flannel: &Image) -> Result<()> {
    let manifest = kube_flannel(flannel, &Image::part("flannel-cni-plugin")?)?;
    cluster.api().apply_yaml(&manifest)?;
    cluster.wait_daemonset(NAMESPACE, DAEMONSET, ROLLOUT_TIMEOUT)?;
    for pod in cluster.pods(NAMESPACE)? {
        let status = cluster.pod(NAMESPACE, &pod)?.status.unwrap_or_default();
        let images: Vec<String> = (status.container_statuses.into_iter().flatten())
            .map(|c| c.image)
            .collect();
        ensure!(
            images == [flannel.name.clone()],
            "{pod} runs {images:?}, not {}",
            flannel.name
        );
    }

    let conf = cluster.api().config_map(NAMESPACE, CONFIG_MAP)?;
    let cni_conf = json(conf.get("cni-conf.json").context("no cni-conf.json")?)?;
    let names: Vec<String> = cluster.nodes().iter().map(|n| n.name.clone()).collect();
    for node in cluster.nodes() {
        let installed = node.path("/etc/cni/net.d/10-flannel.conflist");
        let installed = std::fs::read_to_string(&installed)
            .with_context(|| format!("{}: install-cni wrote no CNI config", node.name))?;
        ensure!(
            json(&installed)? == cni_conf,
            "{}: 10-flannel.conflist is not the ConfigMap's cni-conf.json:\n{installed}",
            node.name
        );
        ensure!(
            node.path("/opt/cni/bin/flannel").is_file(),
            "{}: install-cni-plugin copied no /opt/cni/bin/flannel",
            node.name
        );
        let cidr = pod_cidr(cluster, &node.name)?;
        let env = std::fs::read_to_string(node.path("/run/flannel/subnet.env"))
            .with_context(|| format!("{}: no /run/flannel/subnet.env", node.name))?;
        let subnet = format!("FLANNEL_SUBNET={}/{}", first_host(cidr), cidr.prefix_len());
        ensure!(
            env.contains(&format!("FLANNEL_NETWORK={CLUSTER_CIDR}\n")) && env.contains(&subnet),
            "{}: subnet.env does not hold {subnet} in {CLUSTER_CIDR}:\n{env}",
            node.name
        );
    }
    for name in &names {
        let what = format!("Node {name} NetworkUnavailable=False");
        cluster.wait_for(&what, POD_TIMEOUT, |c| {
            let condition = c.node_condition(name, "NetworkUnavailable")?;
            Ok(condition.filter(|(status, _)| status == "False").map(drop))
        })?;
    }
    cluster.wait_nodes_ready(POD_TIMEOUT)?;
    pods_talk_across_nodes(cluster, &names)
}

/// A busybox pod on each of the first two nodes; each pings the other and sends it 4 MiB over
/// TCP, hashed on both ends.
pub fn pods_talk_across_nodes(cluster: &mut Cluster, nodes: &[String]) -> Result<()> {
    let pods = ["pod-a", "pod-b"];
    for (pod, node) in pods.iter().zip(nodes) {
        cluster.api().apply_yaml(&busybox_pod(pod, node)?)?;
    }
    let mut ips = Vec::new();
    for (pod, node) in pods.iter().zip(nodes) {
        cluster.wait_pod_ready("default", pod, POD_TIMEOUT)?;
        let ip = cluster.pod_ip("default", pod)?;
        let cidr = pod_cidr(cluster, node)?;
        ensure!(
            cidr.contains(&ip),
            "{pod} on {node} has {ip}, not in {cidr}"
        );
        ips.push(ip);
    }
    let a = cluster.pod_netns("default", pods[0])?;
    let b = cluster.pod_netns("default", pods[1])?;
    for (from, to, to_ip) in [(&a, &b, ips[1]), (&b, &a, ips[0])] {
        from.exec("ping", &["-c", "3", "-W", "2", &to_ip.to_string()])
            .with_context(|| format!("ping {to_ip} from {}", from.name()))?;
        twill_lab::tcp_transfer_intact(from, to, to_ip.into(), 4 << 20)
            .with_context(|| format!("TCP to {to_ip} from {}", from.name()))?;
    }
    Ok(())
}

/// A pod that sleeps on node `node`, from the busybox image every cluster node holds.
pub fn busybox_pod(name: &str, node: &str) -> Result<String> {
    let image = Image::part("busybox")?.name;
    Ok(format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
spec:
  nodeSelector:
    kubernetes.io/hostname: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: {image}
    imagePullPolicy: Never
    command: [sleep, "2147483647"]
"#
    ))
}

/// Node `name`'s podCIDR.
pub fn pod_cidr(cluster: &Cluster, name: &str) -> Result<Ipv4Net> {
    let node = cluster.get_node(name)?;
    let cidr = node.spec.and_then(|s| s.pod_cidr);
    let cidr = cidr.with_context(|| format!("Node {name} has no podCIDR"))?;
    cidr.parse()
        .with_context(|| format!("Node {name}: podCIDR {cidr}"))
}

fn first_host(net: Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(net.network()) + 1)
}

fn json(text: &str) -> Result<serde_json::Value> {
    serde_json::from_str(text).with_context(|| format!("not JSON:\n{text}"))
}
