//! The running backend's devices (one; vxlan's two on a dual-stack node), kept as the backend
//! set them up: up, with their address, their MTU and, for the backends that send the whole
//! network into their device (udp, twill-batch, wireguard), the route `<network> dev <device>`
//! (and the IPv6Network's, on a dual-stack node).
//!
//! `ip link set twill0 down; ip link set twill0 up` is enough to lose that route for good: the
//! kernel flushes every route through a link that goes down and restores none when it comes
//! back. The node cannot forward then, so `/healthz` says so, with the device's name, until the
//! guard has repaired it. A device someone sets down stays down until the next reconcile: that
//! may be deliberate, and the periodic reconcile is soon enough to undo it if it was not. A
//! device that comes back up, or whose address, MTU or route changed, is repaired at once. A
//! device whose MTU stays within its underlay's ([`MtuCeiling`], the eBPF dataplane's) follows
//! the underlay's MTU at once too.

use anyhow::Context;
use ipnet::IpNet;
use std::time::Duration;
use tracing::{info, warn};

use super::tunnel::ensure_mtu;
use crate::host;
use crate::host::netlink::{Link, Netlink, Route};
use crate::status::NodeStatus;

/// What a device must look like.
#[derive(Debug, Clone)]
pub struct DeviceSpec {
    pub name: String,
    /// The lease's network address as a /32, as every flannel backend gives its device, and the
    /// IPv6 subnet's network address as a /128 where the device carries IPv6 (vxlan's IPv6
    /// device has only that one).
    pub addresses: Vec<IpNet>,
    pub mtu: u32,
    /// The underlay whose MTU (less what encapsulation adds) the device's stays within, below
    /// `mtu`, as the underlay's changes; None: the device keeps `mtu`.
    pub within: Option<MtuCeiling>,
    /// The networks routed whole into the device: the Network, and the IPv6Network where the
    /// device carries IPv6 (none: the backend routes per peer).
    pub network_routes: Vec<IpNet>,
}

/// A device whose packets leave encapsulated over `underlay`, and what that adds.
#[derive(Debug, Clone)]
pub struct MtuCeiling {
    pub underlay: String,
    pub overhead: u32,
}

/// A device and its index, to pick its notices from the kernel's; no index while it is gone,
/// when any link's notice may be the device made again (the eBPF backend makes its own again).
struct Guarded {
    spec: DeviceSpec,
    index: Option<u32>,
    /// The underlay's index, when the device's MTU follows it: its MTU changes are noticed.
    underlay: Option<u32>,
}

/// Checks and repairs the backend's devices, and reports in `/healthz` while one cannot
/// forward.
pub struct DeviceGuard {
    nl: Netlink,
    devices: Vec<Guarded>,
    /// The periodic reconcile's period, for what `/healthz` says.
    reconcile_every: Duration,
    /// What was wrong at the last check, while something is.
    problem: Option<String>,
}

impl DeviceGuard {
    pub async fn new(
        nl: Netlink,
        specs: Vec<DeviceSpec>,
        reconcile_every: Duration,
    ) -> anyhow::Result<DeviceGuard> {
        let mut devices = Vec::with_capacity(specs.len());
        for spec in specs {
            let link = nl.link_by_name(&spec.name).await?;
            let link = link.with_context(|| format!("device {} not found", spec.name))?;
            let underlay = match &spec.within {
                Some(ceiling) => nl.link_by_name(&ceiling.underlay).await?.map(|l| l.index),
                None => None,
            };
            devices.push(Guarded {
                spec,
                index: Some(link.index),
                underlay,
            });
        }
        Ok(DeviceGuard {
            nl,
            devices,
            reconcile_every,
            problem: None,
        })
    }

    /// Whether the kernel's notice about link `index` concerns a guarded device.
    pub fn watches(&self, index: u32) -> bool {
        self.devices
            .iter()
            .any(|d| d.index.is_none_or(|i| i == index) || d.underlay == Some(index))
    }

    /// Repairs what can be repaired (a device that is down too, when `bring_up`) and reports
    /// the rest in the status. Whether every device can forward now.
    pub async fn check(&mut self, bring_up: bool, status: &NodeStatus) -> bool {
        let mut problem = None;
        for i in 0..self.devices.len() {
            let spec = &self.devices[i].spec;
            let (index, found) = match self.repair(spec, bring_up).await {
                Ok(found) => found,
                Err(e) => (
                    self.devices[i].index,
                    Some(format!("device {} cannot be repaired: {e:#}", spec.name)),
                ),
            };
            self.devices[i].index = index;
            problem = problem.or(found);
        }
        let usable = problem.is_none();
        self.report(problem, status);
        usable
    }

    /// The device's index now (`None`: gone), and `Some(why)` when it cannot forward and was
    /// left so.
    async fn repair(
        &self,
        spec: &DeviceSpec,
        bring_up: bool,
    ) -> anyhow::Result<(Option<u32>, Option<String>)> {
        let name = &spec.name;
        let Some(link) = self.nl.link_by_name(name).await? else {
            return Ok((None, Some(format!("device {name} is gone"))));
        };
        let index = Some(link.index);
        if !link.up {
            if !bring_up {
                return Ok((index, Some(format!("device {name} is down"))));
            }
            let set = self.nl.set_up(link.index).await;
            set.with_context(|| format!("setting {name} up"))?;
            info!(device = %name, "the device was down: set it up again");
        }
        self.restore_addresses(spec, &link).await?;
        self.restore_mtu(spec, link.clone()).await?;
        self.restore_routes(spec, &link).await?;
        Ok((index, None))
    }

    async fn restore_addresses(&self, spec: &DeviceSpec, link: &Link) -> anyhow::Result<()> {
        for &address in &spec.addresses {
            let present = match address {
                IpNet::V4(v4) => self.nl.ipv4_addresses(link.index).await?.contains(&v4),
                IpNet::V6(v6) => self.nl.ipv6_addresses(link.index).await?.contains(&v6),
            };
            if !present {
                let added = self.nl.add_address(link.index, address).await;
                added.with_context(|| format!("adding {address} to {}", link.name))?;
                info!(device = %link.name, %address, "restored the address");
            }
        }
        Ok(())
    }

    async fn restore_mtu(&self, spec: &DeviceSpec, link: Link) -> anyhow::Result<()> {
        let (name, was) = (link.name.clone(), link.mtu);
        let mtu = self.mtu_of(spec).await?;
        ensure_mtu(&self.nl, link, mtu).await?;
        if was != mtu && mtu < spec.mtu {
            info!(device = %name, was, mtu, "the underlay's MTU shrank: the device's follows it");
        } else if was != mtu {
            info!(device = %name, was, mtu, "restored the MTU");
        }
        Ok(())
    }

    /// The MTU the device should have now: its spec's, or less where the underlay's leaves
    /// less room.
    async fn mtu_of(&self, spec: &DeviceSpec) -> anyhow::Result<u32> {
        let Some(MtuCeiling { underlay, overhead }) = &spec.within else {
            return Ok(spec.mtu);
        };
        let link = self.nl.link_by_name(underlay).await?;
        let link = link.with_context(|| format!("the underlay {underlay} is gone"))?;
        Ok(spec.mtu.min(link.mtu.saturating_sub(*overhead)))
    }

    async fn restore_routes(&self, spec: &DeviceSpec, link: &Link) -> anyhow::Result<()> {
        if spec.network_routes.is_empty() {
            return Ok(());
        }
        let routes = self.nl.boot_routes().await.context("listing routes")?;
        for &network in &spec.network_routes {
            let route = Route {
                dst: network,
                gateway: None,
                oif: link.index,
                onlink: false,
                nhid: None,
            };
            if !routes.contains(&route) {
                host::route_network_via(&self.nl, network, link.index, &link.name).await?;
                info!(device = %link.name, "restored the route {network} dev {}", link.name);
            }
        }
        Ok(())
    }

    /// Logs and publishes a change of state only: the check runs on every notice.
    fn report(&mut self, problem: Option<String>, status: &NodeStatus) {
        if problem == self.problem {
            return;
        }
        let every = self.reconcile_every;
        match &problem {
            Some(why) => warn!(
                "{why}: this node cannot forward to other hosts; twill repairs it as soon as the \
                 device is up again, and sets it up at the next reconcile (every {every:?})"
            ),
            None => info!("the backend's devices forward again"),
        }
        let health = problem.as_ref().map(|why| unhealthy(why, every));
        status.set_unhealthy(health);
        self.problem = problem;
    }
}

/// What `/readyz` answers while the device cannot forward.
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
