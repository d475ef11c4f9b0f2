//! flannel's own kube-flannel.yml on a real cluster (twill_lab::Cluster: kubelet and containerd
//! on every node), with only its images swapped: what a user who adopts an image does; and the
//! variants flannel's end-to-end suite renders from it (e2e/flannel.go: the network config's
//! backend and mode, udp privileged), plus twill's own deploy/kubernetes/twill.yml. The checks
//! take the image as an argument, so flanneld's image and twill's pass the same.

use super::pod_traffic::{pods_talk_across_nodes, TestPods};
use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use twill_lab::{Cluster, ClusterSpec, Image, Ipv4Net, Ipv6Net, CLUSTER_CIDR, CLUSTER_CIDR6};

/// flannel v0.28.9's Documentation/kube-flannel.yml, as released.
pub const KUBE_FLANNEL: &str = include_str!("../data/kube-flannel-v0.28.9.yml");
/// twill's own manifest.
pub const TWILL_YML: &str = include_str!("../../deploy/kubernetes/twill.yml");
const FLANNEL_IMAGE: &str = "ghcr.io/flannel-io/flannel:v0.28.9";
const CNI_PLUGIN_IMAGE: &str = "ghcr.io/flannel-io/flannel-cni-plugin:v1.9.1-flannel3";
/// The image twill.yml names, for a user to replace.
const TWILL_YML_IMAGE: &str = "twill:0.1.0";
/// The name [`twill_image`] gives twill's image.
pub const TWILL_IMAGE: &str = "localhost/twill:test";
/// The readinessProbe starts after 5 s and asks every 10 s; images are local.
pub const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(180);
pub const POD_TIMEOUT: Duration = Duration::from_secs(120);

/// A manifest and where what it deploys lives.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub text: String,
    pub namespace: &'static str,
    pub daemonset: &'static str,
    pub config_map: &'static str,
}

impl Manifest {
    /// Where kube-flannel.yml puts flannel.
    fn kube_flannel(text: String) -> Manifest {
        Manifest {
            text,
            namespace: "kube-flannel",
            daemonset: "kube-flannel-ds",
            config_map: "kube-flannel-cfg",
        }
    }
}

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

/// `manifest` with each `image: <from>` line pointing at `to`, failing unless it has exactly
/// `count` such lines, so a different manifest cannot pass unchanged.
fn swap_images(manifest: &str, swaps: [(&str, &str, usize); 2]) -> Result<String> {
    let mut manifest = manifest.to_string();
    for (from, to, count) in swaps {
        let line = format!("image: {from}\n");
        let found = manifest.matches(&line).count();
        ensure!(
            found == count,
            "the manifest has {found} lines `image: {from}`, expected {count}"
        );
        manifest = manifest.replace(&line, &format!("image: {to}\n"));
    }
    Ok(manifest)
}

/// kube-flannel.yml with its two flannel image lines pointing at `flannel` and its CNI plugin
/// line at flannel's CNI plugin image; nothing else changes.
pub fn kube_flannel(flannel: &Image) -> Result<Manifest> {
    let cni_plugin = Image::part("flannel-cni-plugin")?;
    let swaps = [
        (FLANNEL_IMAGE, flannel.name.as_str(), 2),
        (CNI_PLUGIN_IMAGE, cni_plugin.name.as_str(), 1),
    ];
    Ok(Manifest::kube_flannel(swap_images(KUBE_FLANNEL, swaps)?))
}

/// deploy/kubernetes/twill.yml with its two twill image lines pointing at `twill` and its CNI
/// plugin line at flannel's CNI plugin image, as its README tells a user to do.
pub fn twill_yml(twill: &Image) -> Result<Manifest> {
    let cni_plugin = Image::part("flannel-cni-plugin")?;
    let swaps = [
        (TWILL_YML_IMAGE, twill.name.as_str(), 2),
        (CNI_PLUGIN_IMAGE, cni_plugin.name.as_str(), 1),
    ];
    Ok(Manifest {
        text: swap_images(TWILL_YML, swaps)?,
        namespace: "kube-twill",
        daemonset: "kube-twill-ds",
        config_map: "kube-twill-cfg",
    })
}

/// The dataplane a run of the DaemonSet's container uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dataplane {
    /// flanneld's command line, as kube-flannel.yml runs it: the backend's own dataplane.
    Flanneld,
    /// udp in the kernel: twill's own command line with `--dataplane ebpf`, the node's bpffs
    /// mounted and the BPF and SYS_ADMIN capabilities added, as deploy/kubernetes/twill.yml
    /// has them.
    Ebpf,
}

/// One run of flannel's end-to-end matrix: what flannel's e2e (e2e/flannel.go) changes in
/// kube-flannel.yml besides the image.
#[derive(Debug, Clone, Copy)]
pub struct Variant {
    /// net-conf.json's Backend.Type.
    pub backend: &'static str,
    /// net-conf.json's EnableNFTables.
    pub nftables: bool,
    /// net-conf.json's EnableIPv6 with [`CLUSTER_CIDR6`] as IPv6Network.
    pub dual_stack: bool,
    pub dataplane: Dataplane,
    /// The DaemonSet's minReadySeconds: how long an updated pod must stay Ready before a
    /// rolling update moves on to the next node.
    pub min_ready_seconds: u32,
}

impl Variant {
    pub fn new(backend: &'static str) -> Variant {
        Variant {
            backend,
            nftables: false,
            dual_stack: false,
            dataplane: Dataplane::Flanneld,
            min_ready_seconds: 0,
        }
    }

    /// A name for messages: `udp (ebpf, nftables)`.
    pub fn name(&self) -> String {
        let mut parts = Vec::new();
        if self.dataplane == Dataplane::Ebpf {
            parts.push("ebpf");
        }
        if self.nftables {
            parts.push("nftables");
        }
        if self.dual_stack {
            parts.push("dual-stack");
        }
        match parts.is_empty() {
            true => self.backend.to_string(),
            false => format!("{} ({})", self.backend, parts.join(", ")),
        }
    }

    /// Whether the DaemonSet's container runs privileged, as flannel's e2e runs udp (for
    /// /dev/net/tun): every backend on a TUN, which on this kernel (no WireGuard module)
    /// includes wireguard; the eBPF dataplane needs no TUN.
    fn privileged(&self) -> bool {
        self.dataplane == Dataplane::Flanneld
            && matches!(self.backend, "udp" | "twill-batch" | "wireguard")
    }

    /// net-conf.json as flannel's e2e writes it.
    fn net_conf(&self) -> String {
        let mut conf = json!({
            "Network": CLUSTER_CIDR,
            "EnableNFTables": self.nftables,
            "Backend": {"Type": self.backend},
        });
        if self.dual_stack {
            conf["EnableIPv6"] = true.into();
            conf["IPv6Network"] = CLUSTER_CIDR6.into();
        }
        conf.to_string()
    }

    /// kube-flannel.yml around `image`, rendered for this variant.
    pub fn manifest(&self, image: &Image) -> Result<Manifest> {
        let base = kube_flannel(image)?;
        let mut docs = twill_lab::yaml_documents(&base.text)?;
        for doc in &mut docs {
            match doc["kind"].as_str() {
                Some("ConfigMap") if doc["metadata"]["name"] == base.config_map => {
                    doc["data"]["net-conf.json"] = self.net_conf().into();
                }
                Some("DaemonSet") => self.patch_daemonset(doc)?,
                _ => {}
            }
        }
        let text: Vec<String> = docs.iter().map(Value::to_string).collect();
        Ok(Manifest::kube_flannel(text.join("\n---\n")))
    }

    fn patch_daemonset(&self, ds: &mut Value) -> Result<()> {
        if self.min_ready_seconds > 0 {
            ds["spec"]["minReadySeconds"] = self.min_ready_seconds.into();
        }
        let pod = &mut ds["spec"]["template"]["spec"];
        let container = pod["containers"]
            .get_mut(0)
            .context("kube-flannel.yml's DaemonSet has no container")?;
        if self.privileged() {
            container["securityContext"]["privileged"] = true.into();
        }
        if self.dataplane == Dataplane::Ebpf {
            container["command"] = json!(["/usr/bin/twill"]);
            container["args"] = json!([
                "run",
                "--kube-subnet-mgr",
                "--ip-masq",
                "--healthz-port=8081",
                "--dataplane",
                "ebpf"
            ]);
            let add = &mut container["securityContext"]["capabilities"]["add"];
            let add = add
                .as_array_mut()
                .context("kube-flannel.yml's container adds no capabilities")?;
            // SYS_ADMIN: a restarted twill adopts the programs still attached, which takes
            // bpf_prog_get_fd_by_id.
            add.extend(["BPF".into(), "SYS_ADMIN".into()]);
            push(
                container,
                "volumeMounts",
                json!({"name": "bpffs", "mountPath": "/sys/fs/bpf"}),
            )?;
            let volume =
                json!({"name": "bpffs", "hostPath": {"path": "/sys/fs/bpf", "type": "Directory"}});
            push(pod, "volumes", volume)?;
        }
        Ok(())
    }
}

fn push(object: &mut Value, list: &str, item: Value) -> Result<()> {
    object[list]
        .as_array_mut()
        .with_context(|| format!("kube-flannel.yml's DaemonSet has no {list}"))?
        .push(item);
    Ok(())
}

/// A two-node cluster with no network add-on, whose nodes hold `images`, flannel's CNI plugin
/// image and the busybox test image.
pub fn cluster_with(tag: &str, images: &[&Image], dual_stack: bool) -> Result<Cluster> {
    let mut all: Vec<Image> = images.iter().map(|i| (*i).clone()).collect();
    all.push(Image::part("flannel-cni-plugin")?);
    all.push(Image::part("busybox")?);
    Cluster::start(ClusterSpec {
        tag: tag.into(),
        images: all,
        dual_stack,
        ..Default::default()
    })
}

/// [`cluster_with`] one flannel image, IPv4 only.
pub fn cluster_for(tag: &str, flannel: &Image) -> Result<Cluster> {
    cluster_with(tag, &[flannel], false)
}

/// kube-flannel.yml with only its images swapped, applied: [`rolls_out`], then pods on the two
/// nodes ping each other and carry bytes over TCP both ways, intact.
pub fn kube_flannel_holds(cluster: &mut Cluster, flannel: &Image) -> Result<()> {
    rolls_out(cluster, &kube_flannel(flannel)?, flannel)?;
    let pods = TestPods::start(cluster)?;
    pods_talk_across_nodes(cluster, &pods)
}

/// Applies `manifest` (server-side, as `kubectl apply --server-side`) and checks what it
/// promises: the DaemonSet rolls out with every pod Ready (through its readinessProbe) running
/// `image`, the init containers install the CNI config and plugin, each node's subnet.env holds
/// its podCIDRs, the Nodes lose NetworkUnavailable and go Ready.
pub fn rolls_out(cluster: &mut Cluster, manifest: &Manifest, image: &Image) -> Result<()> {
    cluster.api().apply_yaml(&manifest.text)?;
    cluster.wait_daemonset(manifest.namespace, manifest.daemonset, ROLLOUT_TIMEOUT)?;
    for pod in cluster.pods(manifest.namespace)? {
        let status = cluster.pod(manifest.namespace, &pod)?.status;
        let images: Vec<String> = (status.and_then(|s| s.container_statuses).into_iter())
            .flatten()
            .map(|c| c.image)
            .collect();
        ensure!(
            images == [image.name.clone()],
            "{pod} runs {images:?}, not {}",
            image.name
        );
    }

    let conf = cluster
        .api()
        .config_map(manifest.namespace, manifest.config_map)?;
    let cni_conf = json_text(conf.get("cni-conf.json").context("no cni-conf.json")?)?;
    let names: Vec<String> = cluster.nodes().iter().map(|n| n.name.clone()).collect();
    for node in cluster.nodes() {
        let installed = node.path("/etc/cni/net.d/10-flannel.conflist");
        let installed = std::fs::read_to_string(&installed)
            .with_context(|| format!("{}: install-cni wrote no CNI config", node.name))?;
        ensure!(
            json_text(&installed)? == cni_conf,
            "{}: 10-flannel.conflist is not the ConfigMap's cni-conf.json:\n{installed}",
            node.name
        );
        ensure!(
            node.path("/opt/cni/bin/flannel").is_file(),
            "{}: install-cni-plugin copied no /opt/cni/bin/flannel",
            node.name
        );
    }
    for name in &names {
        let what = format!("{name}'s subnet.env holding its podCIDRs");
        cluster.wait_for(&what, POD_TIMEOUT, |c| subnet_env_holds_pod_cidrs(c, name))?;
        let what = format!("Node {name} NetworkUnavailable=False");
        cluster.wait_for(&what, POD_TIMEOUT, |c| {
            let condition = c.node_condition(name, "NetworkUnavailable")?;
            Ok(condition.filter(|(status, _)| status == "False").map(drop))
        })?;
    }
    cluster.wait_nodes_ready(POD_TIMEOUT)
}

/// Some(()) once node `name`'s /run/flannel/subnet.env names the network and the node's
/// podCIDR (and, on a dual-stack cluster, the IPv6 network and podCIDR) as flannel writes
/// them: the first address of each as FLANNEL_SUBNET / FLANNEL_IPV6_SUBNET.
fn subnet_env_holds_pod_cidrs(cluster: &Cluster, name: &str) -> Result<Option<()>> {
    let Ok(env) = std::fs::read_to_string(cluster.node(name)?.path("/run/flannel/subnet.env"))
    else {
        return Ok(None);
    };
    let cidr = pod_cidr(cluster, name)?;
    let mut lines = vec![
        format!("FLANNEL_NETWORK={CLUSTER_CIDR}"),
        format!("FLANNEL_SUBNET={}/{}", first_host(cidr), cidr.prefix_len()),
    ];
    if let Some(cidr6) = pod_cidr6(cluster, name)? {
        let first6 = Ipv6Addr::from(u128::from(cidr6.network()) + 1);
        lines.push(format!("FLANNEL_IPV6_NETWORK={CLUSTER_CIDR6}"));
        lines.push(format!(
            "FLANNEL_IPV6_SUBNET={first6}/{}",
            cidr6.prefix_len()
        ));
    }
    let missing: Vec<&String> = lines
        .iter()
        .filter(|l| !env.lines().any(|e| e == l.as_str()))
        .collect();
    ensure!(
        missing.is_empty(),
        "{name}: subnet.env lacks {missing:?}:\n{env}"
    );
    Ok(Some(()))
}

/// Node `name`'s IPv4 podCIDR.
pub fn pod_cidr(cluster: &Cluster, name: &str) -> Result<Ipv4Net> {
    let cidrs = pod_cidrs(cluster, name)?;
    let v4 = cidrs.iter().find_map(|c| c.parse().ok());
    v4.with_context(|| format!("Node {name} has no IPv4 podCIDR: {cidrs:?}"))
}

/// Node `name`'s IPv6 podCIDR, on a dual-stack cluster.
pub fn pod_cidr6(cluster: &Cluster, name: &str) -> Result<Option<Ipv6Net>> {
    Ok(pod_cidrs(cluster, name)?
        .iter()
        .find_map(|c| c.parse().ok()))
}

fn pod_cidrs(cluster: &Cluster, name: &str) -> Result<Vec<String>> {
    let node = cluster.get_node(name)?;
    let cidrs = node.spec.and_then(|s| s.pod_cidrs).unwrap_or_default();
    ensure!(!cidrs.is_empty(), "Node {name} has no podCIDR");
    Ok(cidrs)
}

fn first_host(net: Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(net.network()) + 1)
}

fn json_text(text: &str) -> Result<Value> {
    serde_json::from_str(text).with_context(|| format!("not JSON:\n{text}"))
}
