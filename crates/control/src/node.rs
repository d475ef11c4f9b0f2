//! This node as every part of the daemon sees it: how it was told to run, the network it joins,
//! and the interface it joins by. Built once at start and passed around as one value.

use crate::config::Config;
use crate::host::{self, Interface, InterfaceChoice};
use crate::lease::PublicAddrs;
use crate::lease_check::unusable_ipv6;
use crate::registry::Remembered;
use crate::status::{NodeStatus, StatusAddr};
use crate::traffic::TrafficOptions;
use anyhow::Context;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// How this node joins the network, independent of where leases live (the `twill run` flags,
/// or flanneld's).
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// How the underlay interface is chosen (`--iface`, `--iface-regex`, `--iface-can-reach`);
    /// with none of them, the interface holding `public_ip`, else the default route's.
    pub interface: InterfaceChoice,
    /// The address peers reach us at; the interface's first IPv4 address when absent.
    pub public_ip: Option<Ipv4Addr>,
    /// `--public-ipv6`: the IPv6 address peers reach us at, on a dual-stack network.
    pub public_ipv6: Option<Ipv6Addr>,
    pub subnet_file: PathBuf,
    pub tun_name: String,
    /// TUN MTU; the interface MTU minus the encapsulation overhead when absent.
    pub mtu: Option<u16>,
    /// `--ip-masq` and `--iptables-forward-rules`: flannel's masquerade and forward rules.
    pub traffic: TrafficOptions,
    /// TUN queues, one reader task each.
    pub queues: usize,
    /// Turn TUN and UDP offloads off, for comparisons and for kernels that misbehave.
    pub no_offload: bool,
    /// The userspace backends' UDP socket buffers, bytes each way.
    pub udp_buffer: usize,
    /// The TUN device's txqueuelen: packets the kernel queues for the engine to read.
    pub tun_tx_queue_len: u32,
    /// Where `/status`, `/metrics` and `/healthz` are served, and where `/healthz` alone is
    /// (flannel's `--healthz-*`).
    pub status_addrs: Vec<StatusAddr>,
    /// twill-batch: how long a not-full datagram may wait for more packets; `None` never waits.
    pub batch_delay: Option<Duration>,
    /// `/metrics` also writes four series per peer (off: their number grows with the network).
    pub metrics_per_peer: bool,
    /// vxlan, host-gw, ipip: each peer's route through a nexthop object of its own, where the
    /// kernel has them (off: `--no-nexthop-objects`).
    pub nexthop_objects: bool,
    /// `--dataplane`: the udp backend's engine, the TUN's or the eBPF programs.
    pub dataplane: DataplaneChoice,
    /// `--bpf-dir`: where the eBPF dataplane pins its programs, links and maps (a bpffs;
    /// mounted there if it is not one).
    pub bpf_dir: PathBuf,
    /// `--bpf-attach`: the eBPF dataplane's programs on tcx links or classic TC filters.
    pub bpf_attach: twill_ebpf::AttachMode,
    /// `--bpf-xdp`: whether the eBPF dataplane decapsulates at XDP on the underlay.
    pub bpf_xdp: twill_ebpf::XdpChoice,
    /// `--ip-blackhole-route`: a blackhole route for this node's subnets, so that traffic to an
    /// address of ours no container holds is dropped here rather than sent back out.
    pub blackhole_route: bool,
}

/// twill's defaults, which both command lines start from.
impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            interface: InterfaceChoice::default(),
            public_ip: None,
            public_ipv6: None,
            subnet_file: crate::subnet_env::DEFAULT_PATH.into(),
            tun_name: DEFAULT_TUN_NAME.into(),
            mtu: None,
            traffic: TrafficOptions::default(),
            queues: 1,
            no_offload: false,
            udp_buffer: twill_dataplane::io::DEFAULT_SOCKET_BUFFER,
            tun_tx_queue_len: twill_dataplane::io::DEFAULT_TX_QUEUE_LEN,
            status_addrs: vec![StatusAddr::Status(
                crate::status::DEFAULT_ADDR
                    .parse()
                    .expect("a socket address"),
            )],
            batch_delay: None,
            metrics_per_peer: false,
            nexthop_objects: true,
            dataplane: DataplaneChoice::default(),
            bpf_dir: DEFAULT_BPF_DIR.into(),
            bpf_attach: twill_ebpf::AttachMode::default(),
            bpf_xdp: twill_ebpf::XdpChoice::Auto,
            blackhole_route: false,
        }
    }
}

/// The TUN (or eBPF device) of the userspace backends, `--tun-name`.
pub const DEFAULT_TUN_NAME: &str = "twill0";

/// `--bpf-dir`'s default, on the bpffs systemd mounts at /sys/fs/bpf. Here, beside the other
/// defaults, so that the options need not import the eBPF backend, which imports them.
pub const DEFAULT_BPF_DIR: &str = "/sys/fs/bpf/twill";

/// A node with its options resolved against the host and the network config.
pub struct Node {
    pub options: NodeOptions,
    /// The network config every node shares.
    pub config: Config,
    pub iface: Interface,
    /// The addresses peers reach us at: on a network with IPv4, `--public-ip`, else the
    /// interface's address; on one with IPv6, `--public-ipv6`, else the interface's
    /// ([`Interface::ipv6`]).
    pub public_addrs: PublicAddrs,
    pub status: Arc<NodeStatus>,
    /// What the registry kept of this node from before (its vxlan VtepMACs).
    pub remembered: Remembered,
}

impl Node {
    /// Finds the underlay interface the options name ([`host::choose_interface`]).
    pub async fn resolve(
        options: NodeOptions,
        config: Config,
        status: Arc<NodeStatus>,
        remembered: Remembered,
    ) -> anyhow::Result<Node> {
        let choice = &options.interface;
        let iface = host::choose_interface(
            choice,
            options.public_ip,
            options.public_ipv6,
            config.stack(),
        )
        .await?;
        tracing::info!(
            interface = %iface.name,
            address = ?iface.address,
            ipv6 = ?iface.ipv6.filter(|_| config.ipv6.is_some()),
            "underlay interface"
        );
        let public_ip = public_ip(&options, &config, &iface)?;
        let public_ipv6 = public_ipv6(&options, &config, &iface)?;
        let public_addrs = PublicAddrs::from_parts(public_ip, public_ipv6)
            .context("the network config enables neither IPv4 nor IPv6")?;
        Ok(Node {
            status,
            remembered,
            options,
            config,
            iface,
            public_addrs,
        })
    }
}

/// The PublicIP of our lease: `--public-ip`, else the interface's address; none on an
/// IPv6-only network.
fn public_ip(
    options: &NodeOptions,
    config: &Config,
    iface: &Interface,
) -> anyhow::Result<Option<Ipv4Addr>> {
    if config.ipv4.is_some() {
        return options.public_ip.map_or_else(|| iface.ipv4(), Ok).map(Some);
    }
    if let Some(ip) = options.public_ip {
        tracing::warn!(
            "--public-ip {ip} is ignored: the network config is IPv6-only (EnableIPv4 false)"
        );
    }
    Ok(None)
}

/// A dual-stack node's PublicIPv6: `--public-ipv6`, else the interface's IPv6 address, as
/// flanneld's `--iface` gives both families.
fn public_ipv6(
    options: &NodeOptions,
    config: &Config,
    iface: &Interface,
) -> anyhow::Result<Option<Ipv6Addr>> {
    let Some(v6) = &config.ipv6 else {
        if let Some(ip) = options.public_ipv6 {
            // flanneld ignores it too; said once, so the operator knows it has no effect.
            tracing::warn!(
                "--public-ipv6 {ip} is ignored: the network config does not enable IPv6"
            );
        }
        return Ok(None);
    };
    if let Some(ip) = options.public_ipv6 {
        return Ok(Some(ip));
    }
    match iface.ipv6.filter(|&ip| unusable_ipv6(ip).is_none()) {
        Some(ip) => Ok(Some(ip)),
        None => anyhow::bail!(
            "the network config enables IPv6 (IPv6Network {}), but interface {} has no IPv6 \
             address other hosts can reach (global or unique-local, not deprecated): add one \
             or give --public-ipv6",
            v6.network,
            iface.name
        ),
    }
}

/// `--dataplane`: which engine the operator asked to carry the udp backend's wire (the
/// decision, with the kernel's say, is `backend::ebpf::choose`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DataplaneChoice {
    /// The userspace engine on a TUN (twill's udp as it ran before eBPF).
    Tun,
    /// The eBPF programs, or a one-line error naming what the kernel lacks.
    Ebpf,
    /// eBPF where the kernel runs it, this process may load and pin it, the network is udp
    /// over the IPv4 underlay and the underlay is not a veth; the TUN engine otherwise, with
    /// one line at start saying why.
    #[default]
    Auto,
}

impl FromStr for DataplaneChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "tun" => Ok(DataplaneChoice::Tun),
            "ebpf" => Ok(DataplaneChoice::Ebpf),
            "auto" => Ok(DataplaneChoice::Auto),
            other => Err(format!(
                "{other:?} is not a dataplane; give tun, ebpf or auto"
            )),
        }
    }
}

impl fmt::Display for DataplaneChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DataplaneChoice::Tun => "tun",
            DataplaneChoice::Ebpf => "ebpf",
            DataplaneChoice::Auto => "auto",
        })
    }
}
