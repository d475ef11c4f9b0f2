//! Which WireGuard carries a node's devices: the kernel's, where the kernel has it (all of the
//! devices, made before the lease), or twill's userspace engine on TUNs of the same names
//! (one engine for all of them, started once the lease gives their addresses).

use super::kernel::{self, KernelDevice};
use super::peers::{Change, PeerBook};
use super::{Addressing, DevicePlan, DEVICE_V6};
use crate::host;
use crate::host::netlink::Netlink;
use crate::node::{DataplaneChoice, Node};
use anyhow::Context;
use ipnet::Ipv4Net;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use twill_dataplane::engine::wireguard::{Device, WgDeviceConfig, WgEngineConfig, WireGuard};
use twill_dataplane::engine::Engine;
use twill_dataplane::io::TunConfig;

/// The path chosen before the lease.
pub enum Chosen {
    Kernel(Vec<(DevicePlan, KernelDevice)>),
    /// The engine's config, but for the addresses the lease gives.
    Userspace(Vec<DevicePlan>, Box<WgEngineConfig>),
}

impl Chosen {
    /// The kernel's devices, made now (replacing any of their names), or the userspace
    /// engine's plan where the kernel refuses the first with EOPNOTSUPP or `--dataplane tun`
    /// asks for it.
    pub async fn new(node: &Node, devices: Vec<DevicePlan>, mtu: u32) -> anyhow::Result<Chosen> {
        let Some(first) = devices.first() else {
            anyhow::bail!("no WireGuard device planned");
        };
        let names = || {
            devices
                .iter()
                .map(|d| d.name)
                .collect::<Vec<_>>()
                .join(" and ")
        };
        // `--dataplane tun` asks for the userspace engine where the kernel has WireGuard too
        // (a kernel whose module an operator will not load, or a mixed network under test).
        let wanted_userspace = node.options.dataplane == DataplaneChoice::Tun;
        let made = match wanted_userspace {
            true => None,
            false => kernel::create(first.name, mtu, first.settings.clone()).await?,
        };
        let Some(made) = made else {
            let why = match wanted_userspace {
                true => "wireguard: --dataplane tun; twill's userspace WireGuard carries the traffic",
                false => "wireguard: this kernel has no WireGuard (EOPNOTSUPP); twill's userspace WireGuard carries the traffic",
            };
            tracing::info!(devices = names(), mtu, "{why}");
            let who = "the wireguard backend on twill's userspace WireGuard";
            twill_dataplane::io::tun::require_device(who)?;
            if devices.iter().any(|d| d.device == Device::V6) {
                let fix = "stop it first: Mode separate's IPv6 device is always flannel-wg-v6";
                host::ensure_tun_unclaimed(DEVICE_V6, fix).await?;
            }
            let config = engine_config(node, &devices, mtu)?;
            return Ok(Chosen::Userspace(devices, Box::new(config)));
        };
        let mut kernel = vec![made];
        for plan in &devices[1..] {
            let made = kernel::create(plan.name, mtu, plan.settings.clone()).await?;
            kernel.push(made.with_context(|| format!("the kernel refused {}", plan.name))?);
        }
        tracing::info!(
            devices = names(),
            mtu,
            "wireguard: the kernel's WireGuard carries the traffic"
        );
        Ok(Chosen::Kernel(devices.into_iter().zip(kernel).collect()))
    }

    /// The devices given the lease's addresses and routes, and forwarding.
    pub async fn attach(self, addressing: &Addressing) -> anyhow::Result<Path> {
        match self {
            Chosen::Kernel(devices) => {
                for (_, device) in &devices {
                    device.attach(addressing).await?;
                }
                let devices = devices.into_iter().map(|(p, d)| (p.device, d)).collect();
                Ok(Path::Kernel(devices))
            }
            Chosen::Userspace(devices, mut config) => {
                let own = addressing.subnet.network();
                let configs = std::iter::once(&mut config.main).chain(config.v6.as_mut());
                for device in configs {
                    device.tun.address = own;
                    device.address6 = addressing.address6(device.families);
                }
                let engine = WireGuard::start(*config)?;
                for plan in &devices {
                    let families = plan.settings.families;
                    for (_, network) in addressing.of_families(families) {
                        host::route_network_to(network, plan.name).await?;
                    }
                    if !families.ipv4() {
                        let own = Ipv4Net::new(own, 32).expect("32 is a prefix");
                        drop_ipv4(plan.name, own).await?;
                    }
                }
                Ok(Path::Userspace(engine))
            }
        }
    }
}

/// The TUN of a device that carries no IPv4 (`flannel-wg-v6`) loses the IPv4 address every
/// TUN twill opens is made with, as flannel's device has none.
async fn drop_ipv4(name: &str, address: Ipv4Net) -> anyhow::Result<()> {
    let nl = Netlink::connect().context("opening rtnetlink")?;
    let link = nl.link_by_name(name).await?;
    let link = link.with_context(|| format!("device {name} does not exist"))?;
    let deleted = nl.delete_address(link.index, address.into()).await;
    deleted.with_context(|| format!("removing {address} from {name}"))
}

/// The userspace engine's config for `devices`, but for the lease's addresses: each TUN named
/// as flannel's device, its sockets on the underlays the device sends over. An IPv4 socket
/// binds the interface's address, as flanneld's udp backend does; an IPv6 one every address,
/// as the kernel's WireGuard binds, so that replies leave from the address the kernel picks
/// for each peer.
fn engine_config(node: &Node, devices: &[DevicePlan], mtu: u32) -> anyhow::Result<WgEngineConfig> {
    let options = &node.options;
    let address = node.iface.ipv4()?;
    let device = |plan: &DevicePlan| {
        let port = plan.settings.listen_port;
        let v4 = SocketAddr::new(address.into(), port);
        let v6 = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port);
        let (bind, bind6) = match (plan.underlay.ipv4(), plan.underlay.ipv6()) {
            (true, true) => (v4, Some(v6)),
            (false, _) => (v6, None),
            (true, false) => (v4, None),
        };
        WgDeviceConfig {
            tun: TunConfig {
                name: plan.name.to_string(),
                mtu: u16::try_from(mtu).unwrap_or(u16::MAX),
                address: Ipv4Addr::UNSPECIFIED,
                offload: !options.no_offload,
                queues: options.queues,
                tx_queue_len: options.tun_tx_queue_len,
            },
            address6: None,
            families: plan.settings.families,
            bind,
            bind6,
        }
    };
    Ok(WgEngineConfig {
        main: device(&devices[0]),
        v6: devices.get(1).map(device),
        socket_buffer: options.udp_buffer,
        tunnel: devices[0].settings.tunnel.clone(),
    })
}

/// The devices forwarding.
pub enum Path {
    Kernel(Vec<(Device, KernelDevice)>),
    /// Owns the engine: dropping the backend stops forwarding and removes the TUNs.
    Userspace(WireGuard),
}

impl Path {
    pub fn is_kernel(&self) -> bool {
        matches!(self, Path::Kernel(_))
    }

    pub fn engine(&self) -> Option<&Engine> {
        match self {
            Path::Userspace(engine) => Some(engine.engine()),
            Path::Kernel(_) => None,
        }
    }

    /// One peer of one device changes: O(log K) in the engine, and one netlink message to the
    /// kernel's device.
    pub async fn apply(&mut self, device: Device, change: Change) -> anyhow::Result<()> {
        match (self, change) {
            (Path::Userspace(engine), Change::Set { new, .. }) => engine
                .set_peer(device, &new)
                .with_context(|| format!("peer {} left out", new.subnet)),
            (Path::Userspace(engine), Change::Removed(old)) => {
                engine.remove_peer(device, old.subnet);
                Ok(())
            }
            (Path::Kernel(devices), change) => {
                let kernel = kernel_device(devices, device)?;
                match change {
                    Change::Set { old, new } => kernel.set_peer(old.as_ref(), &new).await,
                    Change::Removed(old) => kernel.remove_peer(&old).await,
                }
            }
        }
    }

    /// Every device's peers made exactly the book's.
    pub async fn replace_peers(&mut self, book: &PeerBook) -> anyhow::Result<()> {
        match self {
            Path::Userspace(engine) => {
                for device in [Device::Main, Device::V6] {
                    engine.set_peers(device, &book.specs(device));
                }
            }
            Path::Kernel(devices) => {
                for (device, kernel) in devices {
                    kernel.replace_peers(&book.specs(*device)).await?;
                }
            }
        }
        Ok(())
    }
}

fn kernel_device(
    devices: &mut [(Device, KernelDevice)],
    device: Device,
) -> anyhow::Result<&mut KernelDevice> {
    let found = devices.iter_mut().find(|(d, _)| *d == device);
    found
        .map(|(_, kernel)| kernel)
        .with_context(|| format!("no kernel device runs as {device:?}"))
}
