//! What a node's processes are given: the mounts that make a network namespace a node, and
//! containerd's and the kubelet's configuration.

use std::path::Path;

/// The directories each node has to itself, bound over the host's in its mount namespace: the
/// runtime's and kubelet's state, the CNI config and plugins (kube-flannel.yml's hostPaths),
/// pod logs (two kubelets sharing /var/log/pods would collect each other's) and /run (sockets,
/// pod network namespaces, /run/flannel).
pub(super) const PRIVATE_DIRS: [&str; 8] = [
    "run",
    "var/lib/kubelet",
    "var/lib/containerd",
    "var/lib/cni",
    "var/log/pods",
    "var/log/containers",
    "etc/cni/net.d",
    "opt/cni/bin",
];

/// The values the kubelet insists on for host-wide sysctls: a file holding each is bound over
/// the /proc/sys entry in the node's mount namespace, so the kubelet reads what it wants and
/// never writes the host's.
pub(super) const KUBELET_SYSCTLS: [(&str, &str); 6] = [
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// The shell script run by `nsenter --net=<node> unshare --mount --propagation private`: it
/// turns the new mount namespace into the node's, then touches `<state>/mounted` and sleeps,
/// holding the namespace for containerd and the kubelet to join.
///
/// `ip netns exec` would remount /sys without the cgroup hierarchies; instead the mounts under
/// /sys (cgroups, bpffs) are moved aside, a sysfs of the node's network namespace is mounted,
/// and they are moved back; then a fresh bpffs goes on /sys/fs/bpf.
pub(super) fn mount_script(state: &Path) -> String {
    let state = state.display();
    let mut lines = vec![
        "set -e".to_string(),
        format!("keep={state}/keep"),
        "sys=$(awk '$5 == \"/sys\" {id = $1} END {print id}' /proc/self/mountinfo)".into(),
        "subs=$(awk -v id=\"$sys\" '$2 == id {print $5}' /proc/self/mountinfo)".into(),
        "i=0; for m in $subs; do mkdir -p $keep/$i; mount --move $m $keep/$i; i=$((i+1)); done"
            .into(),
        "mount -t sysfs sysfs /sys".into(),
        "i=0; for m in $subs; do mount --move $keep/$i $m; i=$((i+1)); done".into(),
        // A bpffs of the node's own, as a booted node has one: what a pod pins there (twill's
        // eBPF dataplane) stays the node's, and outlives the pod.
        "mount -t bpf bpf /sys/fs/bpf".into(),
    ];
    for dir in PRIVATE_DIRS {
        lines.push(format!(
            "mkdir -p /{dir} {state}/{dir} && mount --bind {state}/{dir} /{dir}"
        ));
    }
    for (key, _) in KUBELET_SYSCTLS {
        lines.push(format!(
            "mount --bind {state}/sysctl/{} /proc/sys/{key}",
            sysctl_file(key)
        ));
    }
    lines.push(format!("touch {state}/mounted"));
    lines.push("exec sleep infinity".into());
    lines.join("\n")
}

/// The file under `<state>/sysctl` holding a value of [`KUBELET_SYSCTLS`].
pub(super) fn sysctl_file(key: &str) -> String {
    key.replace('/', ".")
}

/// containerd 1.6 (Debian 12's): CRI with runc and cgroupfs, the node's pause image as the
/// sandbox image, CNI at the standard paths.
pub(super) fn containerd_toml(pause_image: &str) -> String {
    let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
    format!(
        r#"version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
# What a test cluster never uses; fewer plugins, less noise in the log.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "/run/containerd/containerd.sock"

[{cri}]
  sandbox_image = "{pause_image}"
  # Without CAP_SYS_RESOURCE runc cannot lower oom_score_adj below the runtime's (the pause
  # container asks for -998) and fails every sandbox with "can't get final child's PID".
  restrict_oom_score_adj = true
  disable_apparmor = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
"#
    )
}

/// The kubelet's configuration: cgroupfs under the node's own cgroup root, containerd's socket,
/// x509 clients of the lab's CA only (the API server, for logs), authorized by the API server.
pub(super) fn kubelet_yaml(cgroup_root: &str, client_ca: &Path) -> String {
    let quote = |s: &str| serde_json::Value::from(s).to_string();
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: {root}
failSwapOn: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
readOnlyPort: 0
# Several kubelets share one disk, filled by whatever else the host holds: none removes the
# images the tests imported (no registry could give them back, the pause image included) ...
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# ... nor evicts for the others' use of it.
evictionHard:
  memory.available: 100Mi
  nodefs.available: {evicts}
  nodefs.inodesFree: {evicts}
  imagefs.available: {evicts}
"#,
        root = quote(cgroup_root),
        ca = quote(&client_ca.to_string_lossy()),
        evicts = KUBELET_EVICTS_BELOW,
    )
}

/// The share of the disk (and of its inodes) below which a kubelet evicts pods and taints its
/// node with disk-pressure.
pub(super) const KUBELET_EVICTS_BELOW: &str = "1%";
