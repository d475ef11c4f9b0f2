//! A real two-node Kubernetes cluster (twill_lab::Cluster: the lab's kube-apiserver, a
//! controller manager and a scheduler; on each node its own containerd and kubelet v1.33) and
//! flannel's own kube-flannel.yml v0.28.9 on it, first with flanneld v0.28.9's image (built from
//! flannel's source by scripts/kube-parts), which proves the cluster and the checks, then with
//! only the image swapped for twill's (scripts/image): the same checks (common::kube_flannel).
//! twill's own deploy/kubernetes/twill.yml passes them too, in tests/cluster_e2e.rs.

mod common;

use anyhow::Result;
use common::kube_flannel::{cluster_for, kube_flannel_holds, twill_image};
use std::time::Duration;
use twill_lab::{Cluster, ClusterSpec, Image};

const TIMEOUT: Duration = Duration::from_secs(120);

/// A host-network DaemonSet whose readinessProbe is an HTTP GET the kubelet sends to the pod.
const PROBED_DAEMONSET: &str = r#"apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: probed
  namespace: default
spec:
  selector:
    matchLabels: {app: probed}
  template:
    metadata:
      labels: {app: probed}
    spec:
      hostNetwork: true
      terminationGracePeriodSeconds: 1
      containers:
      - name: httpd
        image: IMAGE
        imagePullPolicy: Never
        command: [sh, -c, "mkdir -p /www && echo ok > /www/index.html && echo serving on $NODE_NAME && exec httpd -f -p 18080 -h /www"]
        env:
        - name: NODE_NAME
          valueFrom:
            fieldRef: {fieldPath: spec.nodeName}
        readinessProbe:
          httpGet: {path: /index.html, port: 18080}
          periodSeconds: 1
"#;

#[test]
fn cluster_comes_up_and_runs_a_probed_daemonset_on_every_node() -> Result<()> {
    let busybox = Image::part("busybox")?;
    let mut cluster = Cluster::start(ClusterSpec {
        tag: "up".into(),
        images: vec![busybox.clone()],
        bridge_cni: true,
        ..Default::default()
    })?;
    cluster.wait_nodes_ready(TIMEOUT)?;
    for node in cluster.nodes() {
        let reported = cluster
            .get_node(&node.name)?
            .status
            .and_then(|s| s.node_info);
        let version = reported
            .map(|info| info.kubelet_version)
            .unwrap_or_default();
        anyhow::ensure!(
            version == "v1.33.13",
            "{} reports kubelet {version}",
            node.name
        );
    }
    cluster
        .api()
        .apply_yaml(&PROBED_DAEMONSET.replace("IMAGE", &busybox.name))?;
    cluster.wait_daemonset("default", "probed", TIMEOUT)?;
    // Logs come from each node's kubelet through the API server, as `kubectl logs` reads them.
    for pod in cluster.pods("default")? {
        let log = cluster.pod_log("default", &pod, "httpd", 10)?;
        anyhow::ensure!(log.contains("serving on node-"), "{pod} logged {log:?}");
    }
    // What a failure prints: every pod, and how much disk the kubelets have left, for a host
    // short of it shows only as pods that never leave Pending.
    let report = cluster.diagnose();
    anyhow::ensure!(
        report.contains("GiB free of") && report.contains("they evict below 1%"),
        "{report}"
    );
    anyhow::ensure!(report.contains("default/probed-"), "{report}");
    Ok(())
}

#[test]
fn kube_flannel_yml_runs_flanneld_on_a_real_cluster() -> Result<()> {
    let flannel = Image::part("flannel")?;
    let mut cluster = cluster_for("flannel", &flannel)?;
    kube_flannel_holds(&mut cluster, &flannel)
}

#[test]
fn kube_flannel_yml_runs_twill_on_a_real_cluster() -> Result<()> {
    // The image as a user makes it, around the twill binary under test.
    let dir = tempfile::tempdir()?;
    let twill = twill_image(dir.path())?;
    let mut cluster = cluster_for("twill", &twill)?;
    kube_flannel_holds(&mut cluster, &twill)
}
