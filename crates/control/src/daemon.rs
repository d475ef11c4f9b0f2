//! The node's lifecycle: acquire a lease, start the backend, write subnet.env, follow the other
//! leases until told to stop.

use crate::backend::userspace::{self, Userspace};
use crate::backend::Backend;
use crate::config::Config;
use crate::host::{self, Interface};
use crate::lease::{backend_type, Lease};
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
        other => bail!(
            "backend type {other:?} is not supported by this build; supported: udp, twill-batch"
        ),
    }
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
            tx_queue_len: 10_000,
        },
        bind: SocketAddrV4::new(node.iface.address, port),
    })?;
    host::route_network_to(config.network, &options.tun_name).await?;
    write_subnet_env(options, &config, &lease, u32::from(mtu))?;
    tracing::info!(subnet = %lease.subnet, public_ip = %node.public_ip, "lease acquired; forwarding");
    node.status.set_lease(&lease, &config.backend.backend_type);
    node.status.set_engine(&engine);
    let mut backend = Userspace::new(&engine, kind, port);
    follow(&mut backend, events, &node.status, shutdown).await
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

/// Apply lease events to the backend until shutdown or until the registry goes away.
async fn follow<B: Backend>(
    backend: &mut B,
    mut events: mpsc::Receiver<LeaseEvent>,
    status: &NodeStatus,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    tokio::pin!(shutdown);
    let mut peers = PeerSet::default();
    loop {
        let event = tokio::select! {
            () = &mut shutdown => return Ok(()),
            event = events.recv() => event.context("the lease registry stopped")?,
        };
        if let Err(e) = apply(backend, &event).await {
            tracing::warn!("applying {event:?} failed: {e:#}");
        }
        peers.apply(&event);
        status.set_peers(peers.0.values().cloned().collect());
    }
}

/// The peer leases as the events describe them, for status.
#[derive(Default)]
struct PeerSet(std::collections::BTreeMap<ipnet::Ipv4Net, Lease>);

impl PeerSet {
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
        LeaseEvent::OwnLease(lease) => {
            tracing::warn!(subnet = %lease.subnet, "own lease re-acquired");
            Ok(())
        }
    }
}
