//! flannel's end-to-end suite (flannel's e2e/: connectivity_test.go, resilience_test.go,
//! rules.go), ported to the lab's real two-node cluster (kubelet and containerd on each node)
//! and run on twill's image in kube-flannel.yml v0.28.9, rendered as flannel's e2e renders it:
//! every backend flannel's e2e runs that this kernel has, twill-batch and udp on the eBPF
//! dataplane, in both rules modes; dual-stack on vxlan and host-gw; twill's own
//! deploy/kubernetes/twill.yml; and the migration from flanneld's image to twill's. As in
//! flannel's e2e, one cluster runs a whole list of variants, flannel uninstalled between them.

mod common;

use anyhow::{ensure, Context, Result};
use common::flannel_e2e::{e2e_checks, flannel_e2e, uninstall};
use common::in_parallel;
use common::kube_flannel::{cluster_with, twill_image, twill_yml, Dataplane, Variant, POD_TIMEOUT};
use common::migration::migrate;
use tempfile::TempDir;
use twill_lab::{Cluster, Image};

/// flannel's e2e backends this kernel has (vxlan, host-gw, wireguard, udp; ipip is checked to
/// fail in one line), twill-batch, and udp on the eBPF dataplane, each in the given mode.
fn backends(nftables: bool) -> Vec<Variant> {
    let mut variants: Vec<Variant> = ["vxlan", "host-gw", "wireguard", "udp", "twill-batch"]
        .into_iter()
        .map(Variant::new)
        .collect();
    variants.push(Variant {
        dataplane: Dataplane::Ebpf,
        ..Variant::new("udp")
    });
    for v in &mut variants {
        v.nftables = nftables;
    }
    variants
}

/// Whether a restart of the DaemonSet must lose nothing: where the dataplane lives in the
/// kernel (vxlan, host-gw, eBPF), which goes on forwarding while twill restarts. The
/// userspace dataplanes (udp and twill-batch on a TUN, wireguard in userspace on this kernel)
/// lose what arrives while no twill runs.
fn in_the_kernel(variant: &Variant) -> bool {
    variant.dataplane == Dataplane::Ebpf || matches!(variant.backend, "vxlan" | "host-gw")
}

/// A cluster whose nodes hold twill's image, on which variants run in turn.
struct E2e {
    cluster: Cluster,
    twill: Image,
    _image_dir: TempDir,
}

impl E2e {
    fn new(tag: &str, dual_stack: bool) -> Result<E2e> {
        let dir = tempfile::tempdir()?;
        let twill = twill_image(dir.path())?;
        Ok(E2e {
            cluster: cluster_with(tag, &[&twill], dual_stack)?,
            twill,
            _image_dir: dir,
        })
    }

    /// Each variant in turn, with the resilience checks if `resilience`: a restart of twill
    /// where the dataplane is in the kernel must lose nothing.
    fn run(&mut self, variants: &[Variant], resilience: bool) -> Result<()> {
        for variant in variants {
            let loss = flannel_e2e(&mut self.cluster, &self.twill, variant, resilience)?;
            let Some(loss) = loss else { continue };
            eprintln!("restart of {}: {loss}", variant.name());
            ensure!(
                !in_the_kernel(variant) || loss.ways.iter().all(|w| w.lost() == 0),
                "a restart of twill on {} lost packets: {loss}",
                variant.name()
            );
        }
        Ok(())
    }
}

/// flannel's e2e with its resilience checks on the backends whose dataplane is in the kernel,
/// in iptables mode (flannel's default): a restart of the DaemonSet loses nothing; and ipip,
/// which this kernel lacks, stops in one line.
#[test]
fn flannel_e2e_on_the_kernel_backends_in_iptables_mode() -> Result<()> {
    let variants: Vec<Variant> = backends(false).into_iter().filter(in_the_kernel).collect();
    let mut e2e = E2e::new("e2e-kern", false)?;
    e2e.run(&variants, true)?;
    ipip_fails_in_one_line(&mut e2e.cluster, &e2e.twill)
}

/// The same on the userspace backends, whose restarts' losses are counted.
#[test]
fn flannel_e2e_on_the_userspace_backends_in_iptables_mode() -> Result<()> {
    let variants: Vec<Variant> = backends(false)
        .into_iter()
        .filter(|v| !in_the_kernel(v))
        .collect();
    E2e::new("e2e-user", false)?.run(&variants, true)
}

/// flannel's e2e connectivity and rules checks on every backend with `EnableNFTables`.
#[test]
fn flannel_e2e_on_every_backend_in_nftables_mode() -> Result<()> {
    E2e::new("e2e-nft", false)?.run(&backends(true), false)
}

/// flannel's dual-stack matrix on the backends both flanneld and twill run dual-stack in the
/// kernel: pods ping and carry TCP over IPv6 too, and the IPv6 rules are flanneld's; vxlan in
/// iptables mode, host-gw in nftables mode, each with its resilience checks.
#[test]
fn flannel_e2e_dual_stack_on_vxlan_and_host_gw() -> Result<()> {
    let variants = [
        Variant {
            dual_stack: true,
            ..Variant::new("vxlan")
        },
        Variant {
            dual_stack: true,
            nftables: true,
            ..Variant::new("host-gw")
        },
    ];
    E2e::new("e2e-dual", true)?.run(&variants, true)
}

/// twill's own deploy/kubernetes/twill.yml, its image lines pointed at the image under test as
/// its README says: the checks kube-flannel.yml passes (its readinessProbe on /readyz), then
/// flannel's e2e checks on its own net-conf.json (vxlan, iptables mode): flanneld's rules, and
/// a restart that keeps the subnets and, the dataplane being the kernel's, loses nothing.
#[test]
fn flannel_e2e_on_twill_yml() -> Result<()> {
    let mut e2e = E2e::new("e2e-yml", false)?;
    let manifest = twill_yml(&e2e.twill)?;
    let vxlan = Variant::new("vxlan");
    let loss = e2e_checks(&mut e2e.cluster, &manifest, &e2e.twill, &vxlan, true)?;
    let loss = loss.context("no restart was measured")?;
    eprintln!("restart of twill.yml on vxlan: {loss}");
    ensure!(
        loss.ways.iter().all(|w| w.lost() == 0),
        "a restart of twill.yml's DaemonSet on vxlan lost packets: {loss}"
    );
    Ok(())
}

/// ipip on a kernel without it: the DaemonSet's pod stops with one line naming what is
/// missing, which the pod's log ends with.
fn ipip_fails_in_one_line(cluster: &mut Cluster, twill: &Image) -> Result<()> {
    let manifest = Variant::new("ipip").manifest(twill)?;
    cluster.api().apply_yaml(&manifest.text)?;
    let namespace = manifest.namespace;
    let line = cluster.wait_for("ipip's pod logging why it stopped", POD_TIMEOUT, |c| {
        for pod in c.pods(namespace)? {
            let log = c.pod_log(namespace, &pod, "kube-flannel", 5)?;
            if let Some(last) = log.lines().last().filter(|l| l.contains("ipip")) {
                return Ok(Some(last.to_string()));
            }
        }
        Ok(None)
    })?;
    ensure!(
        line.contains("this kernel has no IPIP tunnel support (CONFIG_NET_IPIP, module ipip)"),
        "ipip's pod ended with {line:?}"
    );
    uninstall(cluster, &manifest)
}

/// The migration from flanneld to twill a user makes: kube-flannel.yml on flanneld v0.28.9's
/// own image, then its image lines changed to twill's and applied, the DaemonSet's rolling
/// update going node by node, while pods on the two nodes ping each other every 10 ms; halfway,
/// a mixed cluster (one node on flanneld, the other on twill) whose pods ping both ways and
/// carry TCP. twill takes flanneld's device, VtepMAC, routes and rules over as they are, so on
/// the kernel backends the update loses nothing; udp loses what arrives while a node has no
/// daemon holding its TUN. Each backend on a cluster of its own, where flanneld has run only
/// that backend (flanneld leaves another backend's routes in place), the three at once.
#[test]
fn migration_from_flanneld_node_by_node() -> Result<()> {
    let flanneld = Image::part("flannel")?;
    let dir = tempfile::tempdir()?;
    let twill = twill_image(dir.path())?;
    in_parallel(&["vxlan", "host-gw", "udp"], |backend| {
        let tag = format!("e2e-m{}", &backend[..2]);
        let mut cluster = cluster_with(&tag, &[&flanneld, &twill], false)?;
        let loss = migrate(&mut cluster, &flanneld, &twill, backend)?;
        eprintln!("migration of {backend} from flanneld to twill: {loss}");
        ensure!(
            *backend == "udp" || loss.ways.iter().all(|w| w.lost() == 0),
            "migrating {backend} from flanneld to twill lost packets: {loss}"
        );
        Ok(())
    })
}
