//! flannel's `wireguard` backend: the same config fields, lease data, key file, device name,
//! addresses, route and peers as flanneld's, carried by the kernel's WireGuard where the kernel
//! has it and by twill's userspace WireGuard engine (on a TUN of the same name) where it does
//! not. Either way the wire is WireGuard's, so both kinds of node, and flanneld nodes, form one
//! encrypted network.

mod config;
mod kernel;
pub mod keyfile;
mod peers;

pub use config::WireguardConfig;

use super::userspace::{mtu_source, tun_mtu, Overhead};
use super::{Backend, Setup};
use crate::host;
use crate::lease::{backend_type, Lease, LeaseAttrs};
use crate::node::Node;
use anyhow::Context;
use ipnet::Ipv4Net;
use kernel::KernelDevice;
use peers::{Change, PeerBook};
use std::net::{Ipv4Addr, SocketAddrV4};
use twill_dataplane::engine::wireguard::{self, TunnelParams, WgEngineConfig, WireGuard};
use twill_dataplane::engine::Engine;
use twill_dataplane::io::TunConfig;

/// flanneld's device name; the userspace engine's TUN gets it too.
pub const DEVICE: &str = "flannel-wg";

/// What the device (kernel or userspace) is configured with.
#[derive(Debug, Clone)]
pub struct DeviceSettings {
    /// Our key, the preshared key and the keepalive, as the userspace engine takes them too.
    pub tunnel: TunnelParams,
    pub listen_port: u16,
}

/// The backend before our lease: the key is loaded and the path chosen (the kernel's device
/// exists, or the userspace engine is planned: its TUN needs the lease's address).
pub struct WireguardSetup {
    settings: DeviceSettings,
    mtu: u32,
    network: Ipv4Net,
    path: Planned,
}

enum Planned {
    Kernel(KernelDevice),
    Userspace(WgEngineConfig),
}

impl WireguardSetup {
    pub async fn new(node: &Node) -> anyhow::Result<WireguardSetup> {
        let config = WireguardConfig::parse(&node.config.backend)?;
        let settings = DeviceSettings {
            tunnel: TunnelParams {
                private_key: keyfile::load_or_create(&keyfile::path())?,
                preshared_key: config.psk.clone(),
                keepalive: config.keepalive,
            },
            listen_port: config.listen_port,
        };
        let mtu = device_mtu(node, &config)?;
        let path = match kernel::create(DEVICE, mtu, settings.clone()).await? {
            Some(device) => {
                tracing::info!(
                    device = DEVICE,
                    mtu,
                    "wireguard: the kernel's WireGuard carries the traffic"
                );
                Planned::Kernel(device)
            }
            None => {
                tracing::info!(
                    device = DEVICE,
                    mtu,
                    "wireguard: this kernel has no WireGuard (EOPNOTSUPP); twill's userspace WireGuard carries the traffic"
                );
                Planned::Userspace(engine_config(node, &settings, mtu))
            }
        };
        Ok(WireguardSetup {
            settings,
            mtu,
            network: node.config.network,
            path,
        })
    }
}

/// flannel's device MTU, which is also the containers' (FLANNEL_MTU): the underlay's (the
/// config's `MTU`, else the interface's) less flannel's 80 bytes ([`wireguard::OVERHEAD`]).
/// `--mtu` overrides it up to what WireGuard over IPv4 leaves (IPv4, UDP and WireGuard's own
/// 32 bytes: 60), which the error names along with where the underlay's MTU comes from.
fn device_mtu(node: &Node, config: &WireguardConfig) -> anyhow::Result<u32> {
    let (underlay, source) = match config.mtu {
        Some(mtu) => (mtu, format!("Backend.MTU is {mtu}")),
        None => (node.iface.mtu, mtu_source(&node.iface)),
    };
    let overhead = Overhead {
        default: wireguard::OVERHEAD,
        least: 20 + 8 + wireguard::DATA_OVERHEAD,
    };
    let mtu = tun_mtu(node.options.mtu, underlay, &source, overhead)?;
    Ok(u32::from(mtu))
}

fn engine_config(node: &Node, settings: &DeviceSettings, mtu: u32) -> WgEngineConfig {
    let options = &node.options;
    WgEngineConfig {
        tun: TunConfig {
            name: DEVICE.to_string(),
            mtu: u16::try_from(mtu).unwrap_or(u16::MAX),
            address: Ipv4Addr::UNSPECIFIED,
            offload: !options.no_offload,
            queues: options.queues,
            tx_queue_len: options.tun_tx_queue_len,
        },
        bind: SocketAddrV4::new(node.iface.address, settings.listen_port),
        socket_buffer: options.udp_buffer,
        tunnel: settings.tunnel.clone(),
    }
}

impl Setup for WireguardSetup {
    type Backend = Wireguard;

    fn lease_attrs(&self, public_ip: Ipv4Addr) -> LeaseAttrs {
        let key = self.settings.tunnel.private_key.public_key().to_string();
        LeaseAttrs::wireguard(public_ip, &key, self.settings.listen_port)
    }

    /// The device gets the lease's network address as /32 and a route for the whole network.
    async fn attach(self, lease: &Lease) -> anyhow::Result<Wireguard> {
        let path = match self.path {
            Planned::Kernel(device) => {
                device.attach(lease.subnet, self.network).await?;
                Path::Kernel(device)
            }
            Planned::Userspace(mut config) => {
                config.tun.address = lease.subnet.network();
                let engine = WireGuard::start(config)?;
                host::route_network_to(self.network, DEVICE).await?;
                Path::Userspace(engine)
            }
        };
        Ok(Wireguard {
            book: PeerBook::new(self.settings.listen_port),
            out_of_step: false,
            path,
            mtu: self.mtu,
        })
    }
}

/// One WireGuard peer per wireguard lease, on whichever path runs.
pub struct Wireguard {
    book: PeerBook,
    path: Path,
    mtu: u32,
    /// A change the kernel refused: the device no longer matches the book, so the next
    /// reconcile writes every peer instead of what changed.
    out_of_step: bool,
}

enum Path {
    Kernel(KernelDevice),
    /// Owns the engine: dropping the backend stops forwarding and removes the TUN.
    Userspace(WireGuard),
}

impl Wireguard {
    async fn apply(&mut self, change: Change) -> anyhow::Result<()> {
        let applied = self.apply_to_path(change).await;
        self.out_of_step |= applied.is_err();
        applied
    }

    /// One peer changes, on either path: O(log K) in the engine, and one netlink message to
    /// the kernel's device.
    async fn apply_to_path(&mut self, change: Change) -> anyhow::Result<()> {
        match (&mut self.path, change) {
            (_, Change::Unchanged) => Ok(()),
            (Path::Userspace(engine), Change::Set { new, .. }) => engine
                .set_peer(&new)
                .with_context(|| format!("peer {} left out", new.subnet)),
            (Path::Userspace(engine), Change::Removed(old)) => {
                engine.remove_peer(old.subnet);
                Ok(())
            }
            (Path::Kernel(device), Change::Set { old, new }) => {
                device.set_peer(old.as_ref(), &new).await
            }
            (Path::Kernel(device), Change::Removed(old)) => device.remove_peer(&old).await,
        }
    }
}

impl Backend for Wireguard {
    fn backend_type(&self) -> Option<&'static str> {
        Some(backend_type::WIREGUARD)
    }

    fn mtu(&self) -> u32 {
        self.mtu
    }

    fn engine(&self) -> Option<&Engine> {
        match &self.path {
            Path::Userspace(engine) => Some(engine.engine()),
            Path::Kernel(_) => None,
        }
    }

    async fn add_peer(&mut self, lease: &Lease) -> anyhow::Result<()> {
        let change = self.book.add(lease);
        self.apply(change).await
    }

    async fn remove_peer(&mut self, lease: &Lease) -> anyhow::Result<()> {
        let change = self.book.remove(lease);
        self.apply(change).await
    }

    /// The kernel device gets only what changed: replacing all of its peers would drop every
    /// session and make each peer handshake again, every minute.
    async fn reconcile(&mut self, leases: &[Lease]) -> anyhow::Result<()> {
        let changes = self.book.reconcile(leases);
        match &mut self.path {
            Path::Userspace(engine) => engine.set_peers(&self.book.specs()),
            Path::Kernel(device) if self.out_of_step => {
                device.replace_peers(&self.book.specs()).await?;
                self.out_of_step = false;
            }
            Path::Kernel(_) => {
                // Every change is tried; the first refusal is reported.
                let mut applied = Ok(());
                for change in changes {
                    let result = self.apply(change).await;
                    applied = applied.and(result);
                }
                return applied;
            }
        }
        Ok(())
    }
}
