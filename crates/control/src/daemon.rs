//! The node's lifecycle: acquire a lease, start the backend, write subnet.env, follow the other
//! leases until told to stop.

use crate::backend::host_gw::HostGwBackend;
use crate::backend::ipip::IpipDevice;
use crate::backend::kernel::KernelConfig;
use crate::backend::userspace::{self, Userspace};
use crate::backend::vxlan::{VxlanConfig, VxlanDevice};
use crate::backend::Backend;
use crate::config::Config;
use crate::host::{self, Interface};
use crate::lease::{backend_type, Lease, LeaseAttrs};
use crate::registry::{LeaseEvent, Registry};
use crate::status::{self, NodeStatus};
use crate::subnet_env::SubnetEnv;
use anyhow::{bail, Context};
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use twill_dataplane::engine::{Engine, EngineConfig, EngineKind};
use twill_dataplane::io::TunConfig;

/// How this node joins the network, independent of where leases live.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// The underlay interface; found from `public_ip` when absent.
    pub iface: Option<String>,
    /// The address peers reach us at; the interface's first IPv4 address when absent.
    pub public_ip: Option<Ipv4Addr>,
    pub subnet_file: PathBuf,
    pub tun_name: String,
    /// TUN MTU; the interface MTU minus the encapsulation overhead when absent.
    pub mtu: Option<u16>,
    pub ip_masq: bool,
    /// TUN queues, one reader task each.
    pub queues: usize,
    /// Turn TUN and UDP offloads off, for comparisons and for kernels that misbehave.
    pub no_offload: bool,
    /// The userspace backends' UDP socket buffers, bytes each way.
    pub udp_buffer: usize,
    /// The TUN device's txqueuelen: packets the kernel queues for the engine to read.
    pub tun_tx_queue_len: u32,
    /// Where `/status`, `/metrics` and `/healthz` are served (flannel's `--healthz-*` too).
    pub status_addrs: Vec<SocketAddr>,
    /// twill-batch: how long a not-full datagram may wait for more packets; `None` never waits.
    pub batch_delay: Option<Duration>,
}

/// Where this node's network stands, for the subnet file and `twill status`.
struct Node {
    iface: Interface,
    public_ip: Ipv4Addr,
    status: Arc<NodeStatus>,
}

/// Run a node until `shutdown` completes. A clean shutdown leaves the lease in the registry, as
/// flanneld does, so a restart keeps the subnet; the TUN and its route go with the process.
pub async fn run<R: Registry>(
    registry: R,
    options: NodeOptions,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    host::require_net_admin()?;
    let node = resolve_node(&options)?;
    let status = Arc::new(NodeStatus::default());
    for addr in &options.status_addrs {
        status::serve(*addr, status.clone()).await?;
    }
    let config = registry.config().clone();
    let node = Node { status, ..node };
    match config.backend.backend_type.as_str() {
        "udp" => run_userspace(registry, &options, &node, EngineKind::FlannelUdp, shutdown).await,
        backend_type::TWILL_BATCH => {
            let kind = EngineKind::Batch {
                delay: options.batch_delay,
            };
            run_userspace(registry, &options, &node, kind, shutdown).await
        }
        backend_type::VXLAN => run_vxlan(registry, &options, &node, shutdown).await,
        backend_type::IPIP => run_ipip(registry, &options, &node, shutdown).await,
        backend_type::HOST_GW => run_host_gw(registry, &options, &node, shutdown).await,
        other => bail!(
            "backend type {other:?} is not supported; supported: udp, twill-batch, vxlan, ipip, host-gw"
        ),
    }
}

fn kernel_config(config: &Config, node: &Node) -> KernelConfig {
    KernelConfig {
        iface: node.iface.name.clone(),
        network: config.network,
        direct_routing: config.backend.direct_routing,
    }
}

/// flanneld's order: the device first, since the lease must carry its VtepMAC.
async fn run_vxlan<R: Registry>(
    registry: R,
    options: &NodeOptions,
    node: &Node,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let config = registry.config().clone();
    let defaults = VxlanConfig::default();
    let vxlan = VxlanConfig {
        vni: config.backend.vni.unwrap_or(defaults.vni),
        port: config.backend.port.unwrap_or(defaults.port),
    };
    let device = VxlanDevice::ensure(&kernel_config(&config, node), vxlan).await?;
    let attrs = LeaseAttrs::vxlan(node.public_ip, vxlan.vni, &device.mac().to_string());
    let (lease, events) = registry.start(attrs).await?;
    let backend = device.attach(&lease).await?;
    serve(backend, &config, options, node, lease, events, shutdown).await
}

/// The device first, so a kernel without ipip fails before a subnet is claimed.
async fn run_ipip<R: Registry>(
    registry: R,
    options: &NodeOptions,
    node: &Node,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let config = registry.config().clone();
    let device = IpipDevice::ensure(&kernel_config(&config, node)).await?;
    let (lease, events) = registry.start(LeaseAttrs::ipip(node.public_ip)).await?;
    let backend = device.attach(&lease).await?;
    serve(backend, &config, options, node, lease, events, shutdown).await
}

async fn run_host_gw<R: Registry>(
    registry: R,
    options: &NodeOptions,
    node: &Node,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let config = registry.config().clone();
    let (lease, events) = registry.start(LeaseAttrs::host_gw(node.public_ip)).await?;
    let backend = HostGwBackend::connect(&kernel_config(&config, node), &lease).await?;
    serve(backend, &config, options, node, lease, events, shutdown).await
}

/// What every backend does once it has its lease: publish the subnet file and status, then
/// follow the other leases.
async fn serve<B: Backend>(
    mut backend: B,
    config: &Config,
    options: &NodeOptions,
    node: &Node,
    lease: Lease,
    events: mpsc::Receiver<LeaseEvent>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    write_subnet_env(options, config, &lease, backend.mtu())?;
    tracing::info!(subnet = %lease.subnet, public_ip = %node.public_ip, "lease acquired; forwarding");
    node.status.set_lease(&lease, &config.backend.backend_type);
    follow(&mut backend, events, &node.status, &lease, shutdown).await
}

fn resolve_node(options: &NodeOptions) -> anyhow::Result<Node> {
    let iface = match (&options.iface, options.public_ip) {
        (Some(name), _) => host::interface(name)?,
        (None, Some(ip)) => host::interface_with_address(ip)?,
        (None, None) => bail!("give --iface or --public-ip so twill knows the underlay"),
    };
    let public_ip = options.public_ip.unwrap_or(iface.address);
    Ok(Node {
        iface,
        public_ip,
        status: Arc::default(),
    })
}

async fn run_userspace<R: Registry>(
    registry: R,
    options: &NodeOptions,
    node: &Node,
    kind: EngineKind,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let config = registry.config().clone();
    let port = config.backend.port.unwrap_or(kind.default_port());
    let attrs = userspace::lease_attrs(kind, node.public_ip, port);
    let (lease, events) = registry.start(attrs).await?;
    let mtu = options
        .mtu
        .unwrap_or_else(|| tun_mtu(&node.iface, kind.overhead()));
    let engine = Engine::start(&EngineConfig {
        kind,
        subnet: lease.subnet,
        tun: TunConfig {
            name: options.tun_name.clone(),
            mtu,
            address: lease.subnet.network(),
            offload: !options.no_offload,
            queues: options.queues,
            tx_queue_len: options.tun_tx_queue_len,
        },
        bind: SocketAddrV4::new(node.iface.address, port),
        socket_buffer: options.udp_buffer,
    })?;
    host::route_network_to(config.network, &options.tun_name).await?;
    node.status.set_engine(&engine);
    let backend = Userspace::new(&engine, kind, port);
    serve(backend, &config, options, node, lease, events, shutdown).await
}

fn tun_mtu(iface: &Interface, overhead: usize) -> u16 {
    let mtu = iface.mtu.saturating_sub(overhead as u32);
    u16::try_from(mtu).unwrap_or(u16::MAX)
}

fn write_subnet_env(
    options: &NodeOptions,
    config: &Config,
    lease: &Lease,
    mtu: u32,
) -> anyhow::Result<()> {
    SubnetEnv {
        network: config.network,
        subnet: lease.subnet,
        mtu,
        ipmasq: options.ip_masq,
    }
    .write(&options.subnet_file)
    .with_context(|| format!("cannot write {}", options.subnet_file.display()))
}

/// How often the backend's state is compared with the leases and repaired, besides at start:
/// it undoes what a person or another program changed behind our back.
const RECONCILE_EVERY: Duration = Duration::from_secs(60);

/// Apply lease events to the backend until shutdown or until the registry goes away.
async fn follow<B: Backend>(
    backend: &mut B,
    mut events: mpsc::Receiver<LeaseEvent>,
    status: &NodeStatus,
    own: &Lease,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    tokio::pin!(shutdown);
    let mut peers = PeerSet::default();
    let mut reconcile = tokio::time::interval(RECONCILE_EVERY);
    reconcile.tick().await;
    loop {
        let event = tokio::select! {
            () = &mut shutdown => return Ok(()),
            _ = reconcile.tick() => LeaseEvent::Snapshot(peers.leases()),
            event = events.recv() => event.context("the lease registry stopped")?,
        };
        if let LeaseEvent::OwnLease(lease) = &event {
            check_own_subnet(own, lease)?;
        }
        if let Err(e) = apply(backend, &event).await {
            tracing::warn!("applying {event:?} failed: {e:#}");
        }
        peers.apply(&event);
        status.set_peers(peers.leases());
    }
}

/// Devices, routes and the subnet file all carry our subnet; if the registry had to move us to
/// another one, exit so the supervisor restarts twill cleanly on the new lease.
fn check_own_subnet(own: &Lease, reacquired: &Lease) -> anyhow::Result<()> {
    if reacquired.subnet != own.subnet {
        bail!(
            "our lease moved from {} to {} (the old subnet was taken); restart twill to use it",
            own.subnet,
            reacquired.subnet
        );
    }
    tracing::info!(subnet = %own.subnet, "own lease re-acquired");
    Ok(())
}

/// The peer leases as the events describe them, for status.
#[derive(Default)]
struct PeerSet(std::collections::BTreeMap<ipnet::Ipv4Net, Lease>);

impl PeerSet {
    fn leases(&self) -> Vec<Lease> {
        self.0.values().cloned().collect()
    }

    fn apply(&mut self, event: &LeaseEvent) {
        match event {
            LeaseEvent::Snapshot(all) => {
                self.0 = all.iter().map(|l| (l.subnet, l.clone())).collect()
            }
            LeaseEvent::Added(l) => {
                self.0.insert(l.subnet, l.clone());
            }
            LeaseEvent::Removed(l) => {
                self.0.remove(&l.subnet);
            }
            LeaseEvent::OwnLease(_) => {}
        }
    }
}

async fn apply<B: Backend>(backend: &mut B, event: &LeaseEvent) -> anyhow::Result<()> {
    match event {
        LeaseEvent::Snapshot(leases) => backend.reconcile(leases).await,
        LeaseEvent::Added(lease) => backend.add_peer(lease).await,
        LeaseEvent::Removed(lease) => backend.remove_peer(lease).await,
        LeaseEvent::OwnLease(_) => Ok(()),
    }
}
