//! Becoming ready: subnet.env written, then `/readyz` 200, systemd's READY=1 and the
//! registry's own announcement. A subnet file that cannot be written (a full disk, a read-only
//! mount) never takes the node's rules or routes down: the node forwards meanwhile, says why
//! once, answers `/readyz` 503 with the reason, and writes the file again every
//! [`WRITE_RETRY`] until it can. flanneld v0.28.9 logs "Failed to write subnet file" and stays
//! up; it never writes it again.

use crate::lease::Lease;
use crate::node::Node;
use crate::status::NodeStatus;
use crate::subnet_env::{Ipv4Env, Ipv6Env, SubnetEnv};
use futures::future::BoxFuture;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::task::AbortOnDropHandle;

/// How often a subnet file that could not be written is tried again.
const WRITE_RETRY: Duration = Duration::from_secs(2);

/// Writes subnet.env and becomes ready; where it cannot be written yet, the handle of the task
/// that keeps trying (dropping it stops the task).
pub fn publish(
    node: &Node,
    lease: &Lease,
    mtu: u32,
    on_ready: Option<BoxFuture<'static, ()>>,
) -> Option<AbortOnDropHandle<()>> {
    let file = SubnetFile {
        env: subnet_env(node, lease, mtu),
        path: node.options.subnet_file.clone(),
    };
    let status = Arc::clone(&node.status);
    let Err(why) = file.write() else {
        announce(&status, on_ready);
        return None;
    };
    tracing::warn!(
        "{why}; forwarding meanwhile, not ready until it is written (trying again every \
         {WRITE_RETRY:?})"
    );
    status.set_waiting(Some(why));
    Some(AbortOnDropHandle::new(tokio::spawn(async move {
        loop {
            tokio::time::sleep(WRITE_RETRY).await;
            if let Err(why) = file.write() {
                status.set_waiting(Some(why));
                continue;
            }
            tracing::info!("wrote {} at last", file.path.display());
            status.set_waiting(None);
            announce(&status, on_ready);
            return;
        }
    })))
}

struct SubnetFile {
    env: SubnetEnv,
    path: PathBuf,
}

impl SubnetFile {
    /// Writes it, or says why not in one line.
    fn write(&self) -> Result<(), String> {
        let path = self.path.display();
        self.env
            .write(&self.path)
            .map_err(|e| format!("cannot write the subnet file {path}: {e:#}"))
    }
}

/// subnet.env is written and the rules are in place: ready, as flanneld is then (`/readyz`,
/// systemd's READY=1 for a `Type=notify` unit, and the registry's own announcement).
fn announce(status: &NodeStatus, on_ready: Option<BoxFuture<'static, ()>>) {
    status.set_ready();
    tracing::info!("ready: subnet.env written and the rules in place");
    // Outside systemd (no NOTIFY_SOCKET) this does nothing; a failure only costs the unit's
    // start notification, which systemd then reports itself.
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        tracing::warn!("cannot tell systemd that twill is ready (READY=1): {e}");
    }
    if let Some(announcement) = on_ready {
        tokio::spawn(announcement);
    }
}

fn subnet_env(node: &Node, lease: &Lease, mtu: u32) -> SubnetEnv {
    SubnetEnv {
        ipv4: ipv4_env(node, lease),
        mtu,
        ipmasq: node.options.traffic.ip_masq,
        ipv6: ipv6_env(node, lease),
    }
}

/// subnet.env's IPv4 lines, on a node whose network has IPv4.
fn ipv4_env(node: &Node, lease: &Lease) -> Option<Ipv4Env> {
    Some(Ipv4Env {
        network: node.config.ipv4.as_ref()?.network,
        subnet: lease.subnets.v4()?,
    })
}

/// subnet.env's IPv6 lines, on a dual-stack node whose lease has its IPv6 subnet.
fn ipv6_env(node: &Node, lease: &Lease) -> Option<Ipv6Env> {
    Some(Ipv6Env {
        network: node.config.ipv6.as_ref()?.network,
        subnet: lease.subnets.v6()?,
    })
}
