//! The node's lifecycle: acquire a lease, start the backend, write subnet.env, follow the other
//! leases until told to stop.
//!
//! Every backend goes the same way ([`join`]): make what must exist before the lease
//! ([`Setup`]), acquire the lease with the attributes the setup names, attach the backend to
//! it, then follow the other leases. Besides the peers, the node keeps the backend's device as
//! it was set up and removes what other backends left in the network ([`Upkeep`]), at start,
//! at every reconcile, and (the device) whenever the kernel reports a change to it.

use crate::backend::ebpf::{self, Dataplane, EbpfSetup};
use crate::backend::host_gw::HostGwSetup;
use crate::backend::ipip::IpipDevice;
use crate::backend::kernel::KernelConfig;
use crate::backend::upkeep::{DeviceMtu, Upkeep};
use crate::backend::userspace::UserspaceSetup;
use crate::backend::vxlan::{VtepMacs, VxlanConfig, VxlanDevice};
use crate::backend::wireguard::{self, WireguardSetup};
use crate::backend::{Backend, Setup};
use crate::backend_kind::BackendKind;
use crate::lease::Lease;
use crate::lease::LeaseEvent;
use crate::lease_check::LeaseRules;
use crate::node::Node;
pub use crate::node::NodeOptions;
use crate::peers::{Admitted, Gate, Peers};
use crate::registry::Registry;
use crate::status::NodeStatus;
use crate::{blackhole, host};
use crate::{ready, traffic};
use anyhow::{bail, Context};
use ipnet::IpNet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use twill_dataplane::engine::directions::Ended;
use twill_dataplane::engine::{Engine, EngineKind};

/// Run a node until `shutdown` completes. A clean shutdown leaves the lease in the registry, as
/// flanneld does, so a restart keeps the subnet; the TUN and its route go with the process.
///
/// `status` is already served (`launch`), so the probes answer while the node starts.
pub async fn run<R: Registry>(
    registry: R,
    options: NodeOptions,
    status: Arc<NodeStatus>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    host::require_net_admin()?;
    let every = reconcile_every()?;
    tokio::pin!(shutdown);
    // Waits for the API server as long as it takes; a stop signal must still end it.
    let remembered = tokio::select! {
        remembered = registry.remembered() => remembered?,
        () = &mut shutdown => {
            tracing::info!("stopped before the registry answered");
            return Ok(());
        }
    };
    let options = NodeOptions {
        public_ip: remembered.public_ip.or(options.public_ip),
        public_ipv6: remembered.public_ipv6.or(options.public_ipv6),
        ..options
    };
    let config = registry.config().clone();
    for field in &config.unread {
        tracing::warn!(
            "network config field {field} has no effect: twill's {} backend does not read it",
            config.backend.backend_type
        );
    }
    let node = Node::resolve(options, config, status, remembered).await?;
    let node = &node;
    let tun_fix = "stop it first, or give this node another --tun-name";
    let dataplane = ebpf::choose(node)?;
    if dataplane == Dataplane::Tun {
        // What an eBPF run left would go on intercepting the underlay's udp port and hold the
        // device name a TUN needs.
        ebpf::cleanup(&node.options.bpf_dir, &node.options.tun_name).await?;
    }
    let Some(kind) = node.config.backend.kind() else {
        bail!(
            "backend type {:?} is not supported; supported: {}",
            node.config.backend.backend_type,
            BackendKind::names(|_| true, ", ")
        )
    };
    match kind {
        BackendKind::Udp => match dataplane {
            Dataplane::Ebpf => {
                let setup = EbpfSetup::new(node)?;
                join(registry, node, setup, every, shutdown).await
            }
            Dataplane::Tun => {
                host::ensure_tun_unclaimed(&node.options.tun_name, tun_fix).await?;
                let setup = UserspaceSetup::new(node, EngineKind::FlannelUdp)?;
                join(registry, node, setup, every, shutdown).await
            }
        },
        BackendKind::TwillBatch => {
            host::ensure_tun_unclaimed(&node.options.tun_name, tun_fix).await?;
            let delay = node.options.batch_delay;
            let setup = UserspaceSetup::new(node, EngineKind::Batch { delay })?;
            join(registry, node, setup, every, shutdown).await
        }
        BackendKind::Vxlan => {
            let config = KernelConfig::of(node);
            let macs = VtepMacs {
                v4: node.remembered.vtep_mac,
                v6: node.remembered.vtep_mac_v6,
            };
            let device = VxlanDevice::ensure(&config, VxlanConfig::of(node)?, macs).await?;
            join(registry, node, device, every, shutdown).await
        }
        BackendKind::Ipip => {
            let device = IpipDevice::ensure(&KernelConfig::of(node)).await?;
            join(registry, node, device, every, shutdown).await
        }
        BackendKind::HostGw => {
            let setup = HostGwSetup(KernelConfig::of(node));
            join(registry, node, setup, every, shutdown).await
        }
        BackendKind::Wireguard => {
            // Without this the setup would replace the device under the node that holds it.
            let fix = "stop it first: the wireguard backend's device is always flannel-wg";
            host::ensure_tun_unclaimed(wireguard::DEVICE, fix).await?;
            let setup = WireguardSetup::new(node).await?;
            join(registry, node, setup, every, shutdown).await
        }
    }
}

/// Acquire the lease the setup describes, attach the backend to it, write flannel's masquerade
/// and forward rules, publish the subnet file and status, then follow the other leases until
/// shutdown (which leaves the rules in place, as flanneld does).
async fn join<R: Registry, S: Setup>(
    registry: R,
    node: &Node,
    setup: S,
    every: Duration,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    tokio::pin!(shutdown);
    let namer = registry.lease_namer();
    let on_ready = registry.on_ready();
    node.status.set_registry(registry.name());
    let traffic = node.options.traffic.clone();
    let rules = traffic::Rules::prepare(traffic, &node.config, node.status.clone()).await?;
    // Acquiring waits for etcd as long as it takes; a stop signal must still end it.
    let (lease, events) = tokio::select! {
        started = registry.start(setup.lease_attrs(node.public_addrs)) => started?,
        () = &mut shutdown => {
            tracing::info!("stopped before a lease was held");
            return Ok(());
        }
    };
    let mut backend = setup.attach(&lease).await?;
    let mtu = DeviceMtu {
        mtu: backend.mtu(),
        overhead: backend.encapsulation_overhead(),
    };
    let mut upkeep = Upkeep::start(node, &lease, mtu, every).await?;
    // Before traffic is ours: another backend's routes would carry it around this one.
    upkeep.sweep().await;
    let rules = rules.install(&node.config, &lease).await?;
    let blackholes = node.options.blackhole_route.then(|| {
        let subnets = lease.subnets.v4().map(IpNet::V4).into_iter();
        let subnets = subnets.chain(lease.subnets.v6().map(IpNet::V6)).collect();
        blackhole::keep(subnets, node.options.traffic.resync)
    });
    tracing::info!(
        subnet = %lease.id(),
        ipv6_subnet = ?lease.subnets.v6(),
        public_ip = %node.public_addrs,
        "lease acquired; forwarding"
    );
    let _writing = ready::publish(node, &lease, backend.mtu(), on_ready);
    // The node's peers live here; status only reads them.
    let gate = Gate::new(Peers::new(LeaseRules::new(&node.config, &lease), namer));
    node.status
        .set_lease(&lease, &node.config.backend.backend_type, gate.view());
    if let Some(view) = backend.engine_view() {
        node.status.set_engine(view);
    }
    let mut following = Following {
        backend: &mut backend,
        upkeep: &mut upkeep,
        gate,
        node,
        own: &lease,
        every,
        reconcile_failing: None,
    };
    let followed = following.follow(events, shutdown).await;
    if let Some(task) = blackholes {
        task.abort();
    }
    rules.leave().await;
    followed
}

/// How often the backend's state is compared with the leases and repaired, besides at start:
/// it undoes what a person or another program changed behind our back.
const RECONCILE_EVERY: Duration = Duration::from_secs(60);

/// Overrides [`RECONCILE_EVERY`], in whole seconds (1 to 3600), read once at start. Not a flag
/// and not documented for operators, who have no reason to change it: it is for tests, which
/// cannot wait a minute for the periodic repair.
const RECONCILE_ENV: &str = "TWILL_RECONCILE_INTERVAL";

fn reconcile_every() -> anyhow::Result<Duration> {
    match std::env::var(RECONCILE_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(RECONCILE_EVERY),
        Ok(value) => parse_reconcile_every(&value),
        Err(std::env::VarError::NotUnicode(value)) => parse_reconcile_every(&format!("{value:?}")),
    }
}

fn parse_reconcile_every(value: &str) -> anyhow::Result<Duration> {
    let seconds = value.parse::<u64>().ok().filter(|s| (1..=3600).contains(s));
    let seconds = seconds.with_context(|| {
        format!("{RECONCILE_ENV}={value:?} is not a whole number of seconds from 1 to 3600")
    })?;
    Ok(Duration::from_secs(seconds))
}

/// A node with its lease held and its backend attached, following the other leases.
struct Following<'a, B> {
    backend: &'a mut B,
    upkeep: &'a mut Upkeep,
    /// The peers: every lease event passes here on its way to the backend.
    gate: Gate,
    node: &'a Node,
    own: &'a Lease,
    /// How often the node reconciles.
    every: Duration,
    /// Why the last reconcile failed, while they fail: said once, not at every reconcile.
    reconcile_failing: Option<String>,
}

/// What the node does next.
enum Step {
    /// What the gate let through of a registry event, or a periodic reconcile.
    Lease(Admitted),
    /// The kernel reported a change to the backend's device.
    DeviceChanged,
}

impl<B: Backend> Following<'_, B> {
    /// Apply lease events to the backend until shutdown or until the registry goes away. Every
    /// event passes the lease checks first ([`Gate::admit`]).
    async fn follow(
        &mut self,
        mut events: mpsc::Receiver<LeaseEvent>,
        shutdown: impl Future<Output = ()>,
    ) -> anyhow::Result<()> {
        tokio::pin!(shutdown);
        let node = self.node;
        let dataplane = self.backend.engine().map(Engine::ended);
        let mut reconcile = tokio::time::interval(self.every);
        reconcile.tick().await;
        loop {
            let step = tokio::select! {
                () = &mut shutdown => return Ok(()),
                direction = first_ended(dataplane.as_ref()) => bail!(
                    "the dataplane stopped forwarding: its thread '{direction}' ended (the log \
                     above says why); twill exits so that its service manager starts it again"
                ),
                _ = reconcile.tick() => Step::Lease(Admitted::Reconcile),
                () = self.upkeep.changed() => Step::DeviceChanged,
                event = events.recv() => {
                    let event = event.context("the lease registry stopped")?;
                    let Some(admitted) = self.gate.admit(event) else { continue };
                    Step::Lease(admitted)
                }
            };
            match step {
                Step::Lease(Admitted::Node(event)) => {
                    if let Some(result) = on_node_event(node, self.own, &event) {
                        return result;
                    }
                }
                Step::Lease(Admitted::Reconcile) => self.reconcile().await,
                Step::Lease(Admitted::Added(lease)) => {
                    let added = self.backend.add_peer(&lease).await;
                    self.recorded(added, || format!("adding {lease:?}"));
                }
                Step::Lease(Admitted::Removed(lease)) => {
                    let removed = self.backend.remove_peer(&lease).await;
                    self.recorded(removed, || format!("removing {lease:?}"));
                }
                Step::DeviceChanged => self.device_changed().await,
            }
        }
    }

    /// A reconcile repairs the device first, so that the backend can program routes through
    /// it, and sweeps what other backends left last.
    async fn reconcile(&mut self) {
        self.upkeep.repair(&self.node.status).await;
        self.reconcile_recorded().await;
        self.upkeep.sweep().await;
    }

    /// A device that can forward again gets back what the kernel flushed when it went down:
    /// the backend's reconcile puts back the peers' routes (vxlan, ipip), and writes nothing
    /// when nothing is missing.
    async fn device_changed(&mut self) {
        if self.upkeep.recheck(&self.node.status).await {
            self.reconcile_recorded().await;
        }
    }

    /// Reconciles the backend with the accepted leases and records what it cost in the
    /// status: its wall time and kernel writes (0 when nothing had drifted).
    async fn reconcile_recorded(&mut self) {
        let leases = self.gate.accepted_leases();
        let (started, writes_before) = (Instant::now(), self.backend.kernel_writes());
        let reconciled = self.backend.reconcile(&leases).await;
        let (took, made) = (
            started.elapsed(),
            self.backend.kernel_writes() - writes_before,
        );
        tracing::debug!(peers = leases.len(), ?took, writes = made, "reconciled");
        self.node.status.record_reconcile(took, made);
        let peers = leases.len();
        drop(leases);
        self.reconcile_outcome(reconciled.map_err(|e| format!("{e:#}")), peers);
        self.node
            .status
            .set_kernel_writes(self.backend.kernel_writes());
    }

    /// A failed reconcile is said when reconciles start failing or fail for another reason, and
    /// `/readyz` answers 503 with the reason until one succeeds: the kernel may not hold what
    /// the leases ask meanwhile (an eBPF dataplane that cannot be put back, a route refused).
    fn reconcile_outcome(&mut self, outcome: Result<(), String>, peers: usize) {
        let status = &self.node.status;
        match outcome {
            Ok(()) => {
                if self.reconcile_failing.take().is_some() {
                    tracing::info!("the reconcile succeeds again");
                    status.set_unreconciled(None);
                }
            }
            Err(why) => {
                if self.reconcile_failing.as_ref() != Some(&why) {
                    tracing::warn!(
                        "the reconcile with {peers} leases failed: {why}; twill tries again at \
                         every reconcile (every {:?}) and says so when it succeeds",
                        self.every
                    );
                }
                status.set_unreconciled(Some(format!(
                    "the reconcile failed: {why}; twill tries again within {}s",
                    self.every.as_secs()
                )));
                self.reconcile_failing = Some(why);
            }
        }
    }

    /// Logs what failed, and records the kernel writes so far in the status.
    fn recorded(&self, result: anyhow::Result<()>, what: impl FnOnce() -> String) {
        if let Err(e) = result {
            tracing::warn!("{} failed: {e:#}", what());
        }
        self.node
            .status
            .set_kernel_writes(self.backend.kernel_writes());
    }
}

/// The name of the first direction of the dataplane to end; never, for a kernel backend.
async fn first_ended(dataplane: Option<&Ended>) -> String {
    match dataplane {
        Some(ended) => ended.first().await,
        None => std::future::pending().await,
    }
}

/// Handles the events about this node rather than its peers; `Some` ends the node.
fn on_node_event(node: &Node, own: &Lease, event: &LeaseEvent) -> Option<anyhow::Result<()>> {
    match event {
        LeaseEvent::OwnLease(_) => tracing::info!(subnet = %own.id(), "own lease re-acquired"),
        // Devices, routes and the subnet file all carry our subnet, and so do this host's
        // containers: a node that lost it cannot carry on, and must not take another.
        LeaseEvent::OwnLeaseTaken(holder) => {
            return Some(Err(anyhow::anyhow!(
                "our lease {} was taken over by the node at {}; this host's containers are numbered from it, so twill stops instead of taking another subnet (restart it to acquire a new one, and restart the containers)",
                own.id(),
                holder.public_addrs
            )))
        }
        LeaseEvent::OwnLeaseGone(why) => {
            return Some(Err(anyhow::anyhow!(
                "our lease {} is gone: {why}; this host's containers are numbered from it, so twill stops (restart it to join with the new subnet, and restart the containers)",
                own.id()
            )))
        }
        LeaseEvent::ConfigChanged(Some(change)) => {
            tracing::warn!(
                "the network config changed ({change}); twill keeps running with the config it started with: restart twill to apply the new one"
            );
            node.status.set_restart_needed(Some(change.clone()));
        }
        LeaseEvent::ConfigChanged(None) => {
            tracing::info!("the network config matches the one twill runs with again");
            node.status.set_restart_needed(None);
        }
        _ => {}
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reconcile_interval_from_the_environment_is_checked() {
        assert_eq!(parse_reconcile_every("2").unwrap(), Duration::from_secs(2));
        for bad in ["0", "3601", "1.5", "-1", "", "60s"] {
            let err = parse_reconcile_every(bad).unwrap_err().to_string();
            assert!(err.contains("TWILL_RECONCILE_INTERVAL"), "{err}");
        }
    }
}
