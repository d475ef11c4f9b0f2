//! flannel's `wireguard` backend: the same config fields, lease data, key file, device names,
//! addresses, routes and peers as flanneld's, carried by the kernel's WireGuard where the
//! kernel has it and by twill's userspace WireGuard engine (on TUNs of the same names) where
//! it does not. Either way the wire is WireGuard's, so both kinds of node, and flanneld nodes,
//! form one encrypted network.
//!
//! On a dual-stack network flannel's `Mode` decides the devices: separate (the default) has
//! `flannel-wg` for IPv4 over the IPv4 underlay and `flannel-wg-v6` for IPv6 over the IPv6
//! underlay; auto, ipv4 and ipv6 have `flannel-wg` alone, for both families, over the
//! underlay the mode picks per peer ([`crate::lease_check::wireguard`]).

mod kernel;
pub mod keyfile;
mod path;
mod peers;

use super::userspace::{mtu_source, tun_mtu, Overhead};
use super::{Backend, Setup};
use crate::config::wireguard::{Mode, WireguardConfig};
use crate::lease::{BackendData, Lease, LeaseAttrs, PublicAddrs};
use crate::lease_check::wireguard::LeaseReader;
use crate::node::Node;
use anyhow::Context;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use path::{Chosen, Path};
use peers::{Change, PeerBook};
use std::net::Ipv6Addr;
use twill_dataplane::engine::wireguard::{self, Device, Families, TunnelParams};
use twill_dataplane::engine::Engine;

/// flanneld's device names; the userspace engine's TUNs get them too.
pub const DEVICE: &str = "flannel-wg";
pub const DEVICE_V6: &str = "flannel-wg-v6";

/// What a device (kernel or userspace) is configured with.
#[derive(Debug, Clone)]
pub struct DeviceSettings {
    /// Our key, the preshared key and the keepalive, as the userspace engine takes them too.
    pub tunnel: TunnelParams,
    pub listen_port: u16,
    /// The inner families it carries: its peers' allowed IPs, its addresses and routes.
    pub families: Families,
}

/// One of this node's devices, as its Mode plans it.
#[derive(Debug, Clone)]
pub struct DevicePlan {
    pub device: Device,
    pub name: &'static str,
    pub settings: DeviceSettings,
    /// The underlay families its peers are reached over.
    pub underlay: Families,
}

/// flannel's devices for this node: on a dual-stack network Mode separate makes one per
/// family, the others one for both; an IPv4-only network has `flannel-wg` for IPv4 alone.
fn plan(config: &WireguardConfig, dual_stack: bool, tunnel: TunnelParams) -> Vec<DevicePlan> {
    let device = |device, name, listen_port, families, underlay| DevicePlan {
        device,
        name,
        settings: DeviceSettings {
            tunnel: tunnel.clone(),
            listen_port,
            families,
        },
        underlay,
    };
    let main =
        |families, underlay| device(Device::Main, DEVICE, config.listen_port, families, underlay);
    let port6 = config.listen_port_v6;
    match (config.mode, dual_stack) {
        (_, false) => vec![main(Families::Ipv4, Families::Ipv4)],
        (Mode::Separate, true) => vec![
            main(Families::Ipv4, Families::Ipv4),
            device(Device::V6, DEVICE_V6, port6, Families::Ipv6, Families::Ipv6),
        ],
        (Mode::Ipv4, true) => vec![main(Families::Both, Families::Ipv4)],
        (Mode::Ipv6, true) => vec![main(Families::Both, Families::Ipv6)],
        (Mode::Auto, true) => vec![main(Families::Both, Families::Both)],
    }
}

/// What the devices are given once the lease is known: its subnets, and the networks routed
/// through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addressing {
    pub subnet: Ipv4Net,
    pub network: Ipv4Net,
    /// The lease's IPv6 subnet and the IPv6Network, on a dual-stack network.
    pub ipv6: Option<(Ipv6Net, Ipv6Net)>,
}

impl Addressing {
    /// A device's own address (the subnet's network address, as /32 or /128) and the network
    /// routed through it, for each family in `families`, as flannel's `Configure` and
    /// `ConfigureV6` set them.
    pub fn of_families(&self, families: Families) -> Vec<(IpNet, IpNet)> {
        let v4 = families.ipv4().then(|| {
            let own = Ipv4Net::new(self.subnet.network(), 32).expect("32 is a prefix");
            (own.into(), self.network.into())
        });
        let v6 = self
            .ipv6
            .filter(|_| families.ipv6())
            .map(|(subnet, network)| {
                let own = Ipv6Net::new(subnet.network(), 128).expect("128 is a prefix");
                (own.into(), network.into())
            });
        v4.into_iter().chain(v6).collect()
    }

    /// The IPv6 address a device carrying `families` has, if any.
    fn address6(&self, families: Families) -> Option<Ipv6Addr> {
        self.ipv6
            .filter(|_| families.ipv6())
            .map(|(subnet, _)| subnet.network())
    }
}

/// The backend before our lease: the key is loaded, the devices planned and the path chosen
/// (the kernel's devices exist, or the userspace engine is planned: its TUNs need the
/// lease's addresses).
pub struct WireguardSetup {
    config: WireguardConfig,
    public_key: String,
    /// On a dual-stack network, this node's PublicIPv6.
    public_ipv6: Option<Ipv6Addr>,
    network: Ipv4Net,
    network6: Option<Ipv6Net>,
    mtu: u32,
    path: Chosen,
}

impl WireguardSetup {
    pub async fn new(node: &Node) -> anyhow::Result<WireguardSetup> {
        let config = WireguardConfig::of_network(&node.config)?;
        let tunnel = TunnelParams {
            private_key: keyfile::load_or_create(&keyfile::path())?,
            preshared_key: config.psk.clone(),
            keepalive: config.keepalive,
        };
        let public_key = tunnel.private_key.public_key().to_string();
        let devices = plan(&config, node.public_addrs.v6().is_some(), tunnel);
        let mtu = device_mtu(node, &config)?;
        let path = Chosen::new(node, devices, mtu).await?;
        Ok(WireguardSetup {
            public_ipv6: node.public_addrs.v6(),
            network: node.config.need_ipv4("the wireguard backend")?.network,
            network6: node.config.ipv6.as_ref().map(|v6| v6.network),
            config,
            public_key,
            mtu,
            path,
        })
    }
}

/// flannel's device MTU, which is also the containers' (FLANNEL_MTU): the underlay's (the
/// config's `MTU`, else the interface's) less flannel's 80 bytes ([`wireguard::OVERHEAD`]).
/// `--mtu` overrides it up to what WireGuard leaves over the underlays the Mode may send on
/// (IPv4 or IPv6, UDP and WireGuard's own 32 bytes: 60 over IPv4, 80 over IPv6), which the
/// error names along with where the underlay's MTU comes from.
fn device_mtu(node: &Node, config: &WireguardConfig) -> anyhow::Result<u32> {
    let (underlay, source) = match config.mtu {
        Some(mtu) => (mtu, format!("Backend.MTU is {mtu}")),
        None => (node.iface.mtu, mtu_source(&node.iface)),
    };
    let ip_header = match (node.public_addrs.v6(), config.mode) {
        (Some(_), Mode::Ipv4) | (None, _) => 20,
        (Some(_), _) => 40,
    };
    let overhead = Overhead {
        default: wireguard::OVERHEAD,
        least: ip_header + 8 + wireguard::DATA_OVERHEAD,
    };
    let mtu = tun_mtu(node.options.mtu, underlay, &source, overhead)?;
    Ok(u32::from(mtu))
}

/// flanneld's lease: BackendData names our key and ListenPort; on a dual-stack network the
/// lease also carries our PublicIPv6, and BackendV6Data names the key and ListenPortV6.
fn lease_attrs(public_addrs: PublicAddrs, key: &str, config: &WireguardConfig) -> LeaseAttrs {
    let attrs = LeaseAttrs::wireguard(public_addrs, key, config.listen_port);
    match public_addrs.v6() {
        Some(ip) => attrs.with_ipv6(ip, Some(BackendData::wireguard(key, config.listen_port_v6))),
        None => attrs,
    }
}

impl Setup for WireguardSetup {
    type Backend = Wireguard;

    fn lease_attrs(&self, public_addrs: PublicAddrs) -> LeaseAttrs {
        lease_attrs(public_addrs, &self.public_key, &self.config)
    }

    /// Each device gets the lease's addresses of its families and a route for each network.
    async fn attach(self, lease: &Lease) -> anyhow::Result<Wireguard> {
        let subnet = lease.subnets.v4();
        let addressing = Addressing {
            subnet: subnet
                .context("the wireguard backend needs an IPv4 subnet; our lease has none")?,
            network: self.network,
            ipv6: lease.subnets.v6().zip(self.network6),
        };
        let path = self.path.attach(&addressing).await?;
        let reader = LeaseReader::new(&self.config, self.public_ipv6);
        Ok(Wireguard {
            book: PeerBook::new(reader),
            out_of_step: false,
            path,
            mtu: self.mtu,
        })
    }
}

/// One WireGuard peer per wireguard lease on each device, on whichever path runs.
pub struct Wireguard {
    book: PeerBook,
    path: Path,
    mtu: u32,
    /// A change the kernel refused: the devices no longer match the book, so the next
    /// reconcile writes every peer instead of what changed.
    out_of_step: bool,
}

impl Wireguard {
    /// Every change is tried; the first refusal is reported.
    async fn apply(&mut self, changes: Vec<(Device, Change)>) -> anyhow::Result<()> {
        let mut applied = Ok(());
        for (device, change) in changes {
            let result = self.path.apply(device, change).await;
            self.out_of_step |= result.is_err();
            applied = applied.and(result);
        }
        applied
    }
}

impl Backend for Wireguard {
    fn mtu(&self) -> u32 {
        self.mtu
    }

    fn engine(&self) -> Option<&Engine> {
        self.path.engine()
    }

    async fn add_peer(&mut self, lease: &Lease) -> anyhow::Result<()> {
        let changes = self.book.add(lease);
        self.apply(changes).await
    }

    async fn remove_peer(&mut self, lease: &Lease) -> anyhow::Result<()> {
        let changes = self.book.remove(lease);
        self.apply(changes).await
    }

    /// The kernel devices get only what changed: replacing all of their peers would drop
    /// every session and make each peer handshake again, every minute.
    async fn reconcile(&mut self, leases: &[Lease]) -> anyhow::Result<()> {
        let changes = self.book.reconcile(leases);
        if self.path.is_kernel() && !self.out_of_step {
            return self.apply(changes).await;
        }
        self.path.replace_peers(&self.book).await?;
        self.out_of_step = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
