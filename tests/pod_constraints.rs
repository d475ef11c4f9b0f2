//! twill under kube-flannel.yml's securityContext, without a kubelet: `privileged: false` with
//! only NET_ADMIN and NET_RAW, /proc/sys and /sys read-only, no /dev/net/tun and no bpffs. vxlan
//! and host-gw run there and carry traffic; a backend that needs more says what in one line.

mod common;

use anyhow::{ensure, Context, Result};
use common::cluster::{cluster, Cluster};
use common::*;
use twill_lab::Proc;

/// What a pod of kube-flannel.yml's DaemonSet has, made in a mount namespace of twill's own.
const POD_MOUNTS: &str = "mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys \
     && mount -t tmpfs -o size=1m tmpfs /dev/net \
     && mount -o remount,ro /sys";

/// flanneld's command line on host `host`, as the DaemonSet's container runs it.
fn start_in_pod(c: &Cluster, host: usize) -> Result<Proc> {
    let file = c.subnet_file(host);
    let script = format!(
        "{POD_MOUNTS} && exec setpriv --bounding-set=-all,+net_admin,+net_raw --inh-caps=-all \
         --no-new-privs {TWILL} -etcd-endpoints={} -iface=eth0 -subnet-file={} -ip-masq",
        c.etcd.endpoint(),
        file.display()
    );
    let ns = &c.lab.host(host).ns;
    let env = [("RUST_LOG", "info")];
    ns.spawn_with(
        "unshare",
        &["-m", "--propagation", "private", "sh", "-c", &script],
        &env,
    )
}

fn runs_in_a_pod(tag: &str, config: &str) -> Result<()> {
    let mut c = cluster(tag, 2, config)?;
    let mut pod = start_in_pod(&c, 0)?;
    wait_ready(&c.lab.host(0).ns, &mut pod, &c.subnet_file(0))?;
    let _node1 = c.start(1)?;
    c.traffic_between_two_nodes()?;
    ensure!(pod.is_running(), "{}", pod.stderr());
    Ok(())
}

#[test]
fn vxlan_runs_with_net_admin_and_net_raw_alone() -> Result<()> {
    runs_in_a_pod(
        "podvx",
        r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan"}}"#,
    )
}

#[test]
fn host_gw_runs_with_net_admin_and_net_raw_alone() -> Result<()> {
    runs_in_a_pod(
        "podhg",
        r#"{"Network":"10.5.0.0/16","Backend":{"Type":"host-gw"}}"#,
    )
}

/// The userspace udp backend needs the TUN device, which the DaemonSet does not mount: one
/// line says so.
#[test]
fn udp_without_a_tun_device_says_what_it_needs() -> Result<()> {
    let c = cluster(
        "podudp",
        2,
        r#"{"Network":"10.5.0.0/16","Backend":{"Type":"udp"}}"#,
    )?;
    let mut pod = start_in_pod(&c, 0)?;
    let stderr = pod.failure_within(std::time::Duration::from_secs(20), "twill kept running")?;
    let last = stderr.lines().last().context("no output")?;
    ensure!(last.contains("/dev/net/tun"), "{stderr}");
    Ok(())
}
