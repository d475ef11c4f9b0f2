//! The running backend's device, kept as the backend set it up: up, with its address, its MTU
//! and, for the backends that send the whole network into it (udp, twill-batch, wireguard),
//! the route `<network> dev <device>`.
//!
//! `ip link set twill0 down; ip link set twill0 up` is enough to lose that route for good: the
//! kernel flushes every route through a link that goes down and restores none when it comes
//! back. The node cannot forward then, so `/healthz` says so, with the device's name, until the
//! guard has repaired it. A device someone sets down stays down until the next reconcile: that
//! may be deliberate, and the periodic reconcile is soon enough to undo it if it was not. A
//! device that comes back up, or whose address, MTU or route changed, is repaired at once.

use anyhow::Context;
use ipnet::Ipv4Net;
use std::time::Duration;
use tracing::{info, warn};

use super::netlink::{Link, Netlink, Route};
use super::tunnel::ensure_mtu;
use crate::host;
use crate::status::NodeStatus;

/// What the device must look like.
#[derive(Debug, Clone)]
pub struct DeviceSpec {
    pub name: String,
    /// The lease's network address as a /32, as every flannel backend gives its device.
    pub address: Ipv4Net,
    pub mtu: u32,
    /// The whole network, routed into the device (`None`: the backend routes per peer).
    pub network_route: Option<Ipv4Net>,
    /// The periodic reconcile's period, for what `/healthz` says.
    pub reconcile_every: Duration,
}

/// Checks and repairs one device, and reports in `/healthz` while it cannot forward.
pub struct DeviceGuard {
    nl: Netlink,
    spec: DeviceSpec,
    index: u32,
    /// What was wrong at the last check, while something is.
    problem: Option<String>,
}

impl DeviceGuard {
    pub async fn new(nl: Netlink, spec: DeviceSpec) -> anyhow::Result<DeviceGuard> {
        let link = nl.link_by_name(&spec.name).await?;
        let index = link
            .with_context(|| format!("device {} not found", spec.name))?
            .index;
        Ok(DeviceGuard {
            nl,
            spec,
            index,
            problem: None,
        })
    }

    /// The device's index, to pick its notices from the kernel's.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Repairs what can be repaired (a device that is down too, when `bring_up`) and reports
    /// the rest in the status. Whether the device can forward now.
    pub async fn check(&mut self, bring_up: bool, status: &NodeStatus) -> bool {
        let problem = match self.repair(bring_up).await {
            Ok(problem) => problem,
            Err(e) => Some(format!(
                "device {} cannot be repaired: {e:#}",
                self.spec.name
            )),
        };
        let usable = problem.is_none();
        self.report(problem, status);
        usable
    }

    /// `Ok(Some(why))` when the device cannot forward and was left so.
    async fn repair(&self, bring_up: bool) -> anyhow::Result<Option<String>> {
        let name = &self.spec.name;
        let Some(link) = self.nl.link_by_name(name).await? else {
            return Ok(Some(format!("device {name} is gone")));
        };
        if !link.up {
            if !bring_up {
                return Ok(Some(format!("device {name} is down")));
            }
            let set = self.nl.set_up(link.index).await;
            set.with_context(|| format!("setting {name} up"))?;
            info!(device = %name, "the device was down: set it up again");
        }
        self.restore_address(&link).await?;
        self.restore_mtu(link.clone()).await?;
        self.restore_route(&link).await?;
        Ok(None)
    }

    async fn restore_address(&self, link: &Link) -> anyhow::Result<()> {
        let addrs = self.nl.ipv4_addresses(link.index).await?;
        if !addrs.contains(&self.spec.address) {
            let added = self
                .nl
                .add_address(link.index, self.spec.address.into())
                .await;
            added.with_context(|| format!("adding {} to {}", self.spec.address, link.name))?;
            info!(device = %link.name, address = %self.spec.address, "restored the address");
        }
        Ok(())
    }

    async fn restore_mtu(&self, link: Link) -> anyhow::Result<()> {
        let (name, was) = (link.name.clone(), link.mtu);
        ensure_mtu(&self.nl, link, self.spec.mtu).await?;
        if was != self.spec.mtu {
            info!(device = %name, was, mtu = self.spec.mtu, "restored the MTU");
        }
        Ok(())
    }

    async fn restore_route(&self, link: &Link) -> anyhow::Result<()> {
        let Some(network) = self.spec.network_route else {
            return Ok(());
        };
        let route = Route {
            dst: network.into(),
            gateway: None,
            oif: link.index,
            onlink: false,
            nhid: None,
        };
        let routes = self.nl.boot_routes().await.context("listing routes")?;
        if !routes.contains(&route) {
            host::route_network_via(&self.nl, network, link.index, &link.name).await?;
            info!(device = %link.name, "restored the route {network} dev {}", link.name);
        }
        Ok(())
    }

    /// Logs and publishes a change of state only: the check runs on every notice.
    fn report(&mut self, problem: Option<String>, status: &NodeStatus) {
        if problem == self.problem {
            return;
        }
        let every = self.spec.reconcile_every;
        match &problem {
            Some(why) => warn!(
                "{why}: this node cannot forward to other hosts; twill repairs it as soon as the \
                 device is up again, and sets it up at the next reconcile (every {every:?})"
            ),
            None => info!(device = %self.spec.name, "the device forwards again"),
        }
        let health = problem.as_ref().map(|why| unhealthy(why, every));
        status.set_unhealthy(health);
        self.problem = problem;
    }
}

/// What `/healthz` answers while the device cannot forward.
fn unhealthy(why: &str, every: Duration) -> String {
    format!(
        "{why}: traffic to other hosts is not forwarded; twill repairs it within {}s",
        every.as_secs()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_health_reason_names_the_device_and_when_it_is_repaired() {
        let why = unhealthy("device twill0 is down", Duration::from_secs(60));
        assert!(why.starts_with("device twill0 is down"), "{why}");
        assert!(why.contains("within 60s"), "{why}");
        assert!(!why.contains('\n'));
    }
}
