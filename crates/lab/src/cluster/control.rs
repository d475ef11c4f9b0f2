//! The rest of the control plane beside the lab's API server: kube-controller-manager (node
//! IPAM, DaemonSets, service accounts, the root CA ConfigMap) and kube-scheduler.

use super::node::tail;
use super::{CLUSTER_CIDR, CLUSTER_CIDR6, NODE_CIDR_MASK, NODE_CIDR_MASK6};
use crate::kube::{kube_part, KubeApiServer};
use crate::netns::command_in;
use crate::Proc;
use anyhow::Result;
use std::path::Path;

#[derive(Debug)]
pub(super) struct ControlPlane {
    controller_manager: Proc,
    scheduler: Proc,
}

impl ControlPlane {
    /// Starts both in namespace `ns` as the API server's admin, with a kubeconfig written in
    /// `dir`. Neither elects a leader: each is alone. With `dual_stack`, node IPAM gives each
    /// Node an IPv6 podCIDR too.
    pub(super) fn start(
        ns: &str,
        api: &KubeApiServer,
        dir: &Path,
        dual_stack: bool,
    ) -> Result<ControlPlane> {
        let kubeconfig = dir.join("admin.kubeconfig");
        api.write_kubeconfig(&kubeconfig, api.admin_token())?;
        let kubeconfig = format!("--kubeconfig={}", kubeconfig.display());
        let controller_manager = [
            kubeconfig.clone(),
            "--leader-elect=false".into(),
            // Node IPAM: each Node gets a podCIDR, as flannel's --kube-subnet-mgr needs.
            "--allocate-node-cidrs=true".into(),
            format!("--node-cidr-mask-size-ipv4={NODE_CIDR_MASK}"),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            // Published as the kube-root-ca.crt ConfigMap every service-account volume mounts.
            format!("--root-ca-file={}", api.ca_file().display()),
            "--use-service-account-credentials=false".into(),
            // No serving: nothing scrapes it, and two clusters would want the same port.
            "--secure-port=0".into(),
        ];
        // The IPv6 mask is refused on a single-stack cluster.
        let mut controller_manager = controller_manager.to_vec();
        controller_manager.extend(match dual_stack {
            false => vec![format!("--cluster-cidr={CLUSTER_CIDR}")],
            true => vec![
                format!("--cluster-cidr={CLUSTER_CIDR},{CLUSTER_CIDR6}"),
                format!("--node-cidr-mask-size-ipv6={NODE_CIDR_MASK6}"),
            ],
        });
        let scheduler = [
            kubeconfig,
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
        ];
        Ok(ControlPlane {
            controller_manager: spawn(ns, "kube-controller-manager", &controller_manager)?,
            scheduler: spawn(ns, "kube-scheduler", &scheduler)?,
        })
    }

    /// Which part ended, with its last lines; empty while both run.
    pub(super) fn failures(&mut self) -> String {
        let mut failures = String::new();
        for (name, proc) in [
            ("kube-controller-manager", &mut self.controller_manager),
            ("kube-scheduler", &mut self.scheduler),
        ] {
            if !proc.is_running() {
                let log = tail(Some(proc), super::node::TAIL_LINES);
                failures.push_str(&format!("{name} ended:\n{log}\n"));
            }
        }
        failures
    }
}

fn spawn(ns: &str, part: &str, args: &[String]) -> Result<Proc> {
    let binary = kube_part(part)?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Proc::spawn(command_in(Some(ns), &binary.to_string_lossy(), &args))
}
