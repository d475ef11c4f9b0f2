//! twill's own command line: `twill run` (flanneld's flag names in GNU style, and twill's own
//! dataplane flags) and `twill status`.

use clap::builder::{FalseyValueParser, TypedValueParser};
use clap::{ArgAction, Args, Parser, Subcommand};
use ipnet::Ipv4Net;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;
use twill_control::backend::ebpf;
use twill_control::daemon::NodeOptions;
use twill_control::host::InterfaceChoice;
use twill_control::launch::{Launch, Leases, StaticNetwork};
use twill_control::lease_check;
use twill_control::node::{DataplaneChoice, DEFAULT_TUN_NAME};
use twill_control::registry::kube::{self, KubeEnv, KubeOptions, KubeTiming};
use twill_control::registry::{EtcdOptions, DEFAULT_PREFIX};
use twill_control::status::StatusAddr;
use twill_control::traffic::{self, TrafficOptions};
use twill_control::{status, subnet_env};
use twill_dataplane::io::{DEFAULT_SOCKET_BUFFER, DEFAULT_TX_QUEUE_LEN};

/// The subcommands, which tell this command line from flanneld's.
pub const RUN: &str = "run";
pub const STATUS: &str = "status";
pub const HELP: &str = "help";

#[derive(Parser)]
#[command(
    name = "twill",
    version = crate::VERSION,
    about = "flannel-compatible container network dataplane",
    after_help = "Started with no subcommand, or as `flanneld`, twill takes flanneld's command \
                  line (`twill -h` lists it)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Join the network and forward container traffic until SIGINT/SIGTERM.
    Run(Box<RunArgs>),
    /// Print a running node's lease, peers and counters.
    Status {
        /// The node's status address (`twill run --status-addr`).
        #[arg(long, default_value = status::DEFAULT_ADDR)]
        addr: SocketAddr,
    },
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    etcd: EtcdArgs,
    #[command(flatten)]
    kube: KubeArgs,
    #[command(flatten)]
    interface: InterfaceArgs,
    /// Backend for the static registry (udp, batch); with etcd the network config names it.
    #[arg(long)]
    backend: Option<String>,
    /// Address other nodes reach this one at.
    #[arg(long)]
    public_ip: Option<Ipv4Addr>,
    /// IPv6 address other nodes reach this one at, on a dual-stack network (flanneld's
    /// --public-ipv6).
    #[arg(long, value_name = "IPV6", value_parser = parse_public_ipv6)]
    public_ipv6: Option<Ipv6Addr>,
    /// Static registry: the whole container network.
    #[arg(long, value_name = "CIDR")]
    network: Option<Ipv4Net>,
    /// Static registry: this node's subnet.
    #[arg(long, value_name = "CIDR")]
    subnet: Option<Ipv4Net>,
    /// Static registry: another node, as SUBNET=PUBLIC_IP[:PORT]. Repeat for each.
    #[arg(long = "peer", value_name = "CIDR=IP[:PORT]")]
    peers: Vec<String>,
    /// flannel's subnet file, sourced by container runtimes.
    #[arg(long, default_value = subnet_env::DEFAULT_PATH)]
    subnet_file: PathBuf,
    /// UDP port of the userspace backends (flannel's Backend.Port).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    port: Option<u16>,
    #[arg(long, default_value = DEFAULT_TUN_NAME)]
    tun_name: String,
    /// TUN MTU; default: the interface MTU minus the encapsulation (udp 28, batch 42).
    #[arg(long)]
    mtu: Option<u16>,
    /// TUN queues, each served by its own task.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
    queues: u16,
    /// batch: let a not-full datagram wait this many µs for more packets (default: never wait).
    #[arg(long, value_name = "MICROS")]
    batch_delay: Option<u64>,
    /// Disable TUN offloads (virtio-net header, TSO/GRO), e.g. to measure what they bring.
    #[arg(long)]
    no_offload: bool,
    /// UDP socket send and receive buffer of the userspace backends, bytes each (at least
    /// 64 KiB: one GSO send).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_SOCKET_BUFFER,
          value_parser = clap::value_parser!(u32).range(65536..=1 << 30).map(|b| b as usize))]
    udp_buffer: usize,
    /// txqueuelen of the TUN device: packets the kernel holds for twill to read.
    #[arg(long, value_name = "PACKETS", default_value_t = DEFAULT_TX_QUEUE_LEN,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    tun_txqueuelen: u32,
    /// /metrics: also four series per peer (packets and bytes each way). Off by default: their
    /// number grows with the network; `twill status` shows them either way.
    #[arg(long)]
    metrics_per_peer: bool,
    /// Masquerade traffic from the container network to outside it, as flanneld does; also
    /// written to FLANNEL_IPMASQ.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value_t = false, default_missing_value = "true", action = ArgAction::Set)]
    ip_masq: bool,
    /// Masquerade without fully random source ports (--random-fully, fully-random).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value_t = false, default_missing_value = "true", action = ArgAction::Set)]
    ip_masq_fully_random_disable: bool,
    /// Accept forwarding to and from the container network (flannel's default: true).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value_t = true, default_missing_value = "true", action = ArgAction::Set)]
    iptables_forward_rules: bool,
    /// Check the masquerade and forward rules every this many seconds and repair them if
    /// changed.
    #[arg(long, value_name = "SECONDS", default_value_t = traffic::DEFAULT_RESYNC.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    iptables_resync: u64,
    /// Add a blackhole route for this node's subnet (flanneld's --ip-blackhole-route), kept in
    /// place every --iptables-resync.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value_t = false, default_missing_value = "true", action = ArgAction::Set)]
    ip_blackhole_route: bool,
    /// Serve /status, /metrics, /healthz and /readyz here (loopback: for this host's operator).
    #[arg(long, default_value = status::DEFAULT_ADDR)]
    status_addr: SocketAddr,
    /// flannel's health server: /healthz and /readyz, and nothing else, on
    /// --healthz-ip:PORT (0 = off, as in flannel).
    #[arg(long, default_value_t = 0)]
    healthz_port: u16,
    /// The address of --healthz-port (every address by default, as in flannel).
    #[arg(long, default_value = "0.0.0.0")]
    healthz_ip: IpAddr,
    /// vxlan, host-gw, ipip: give each peer a gateway route, as flanneld does, instead of a
    /// route through a nexthop object of its own (the default where the kernel has them,
    /// Linux 5.3+: linear instead of quadratic in the number of peers).
    #[arg(long, env = "TWILL_NO_NEXTHOP_OBJECTS", value_parser = FalseyValueParser::new())]
    no_nexthop_objects: bool,
    /// udp: the engine that carries flannel's wire: `tun` (twill's userspace engine), `ebpf`
    /// (TC programs in the kernel; fails with what the kernel lacks) or `auto` (ebpf where
    /// the kernel runs it, twill may pin it and the underlay is not a veth, else tun; said at
    /// start). The wire and the lease are the same.
    #[arg(
        long,
        env = "TWILL_DATAPLANE",
        value_name = "tun|ebpf|auto",
        default_value_t = DataplaneChoice::Auto
    )]
    dataplane: DataplaneChoice,
    /// Where the eBPF dataplane pins its programs, links and maps, so they outlive a restart
    /// (mounted as bpffs if it is not one).
    #[arg(long, env = "TWILL_BPF_DIR", value_name = "DIR", default_value = ebpf::DEFAULT_BPF_DIR)]
    bpf_dir: PathBuf,
    /// How the eBPF dataplane's programs attach: `tcx` (links, Linux 6.6+), `tc` (a clsact
    /// qdisc and a direct-action bpf filter, which `tc filter show` lists; any kernel from 5.10)
    /// or `auto` (tcx where the kernel has it, else tc).
    #[arg(long, value_name = "tcx|tc|auto", default_value = "auto")]
    bpf_attach: ebpf::AttachMode,
    /// Whether the eBPF dataplane decapsulates at XDP on the underlay, before GRO: `auto` where
    /// its driver takes native XDP but a veth (whose peer would then segment every
    /// super-packet), `on` where the driver takes it, a veth too, `off` never (TC alone).
    #[arg(long, value_name = "auto|on|off", default_value = "auto")]
    bpf_xdp: ebpf::XdpChoice,
    /// Remove what the eBPF dataplane leaves running on purpose (its pinned programs, links and
    /// maps under --bpf-dir, its device --tun-name and route), then exit. Refused while a twill
    /// runs on them.
    #[arg(long)]
    cleanup: bool,
    /// With --cleanup: remove them even while a twill runs on them (it puts them back at its
    /// next reconcile).
    #[arg(long, requires = "cleanup")]
    force: bool,
}

/// flanneld's etcd flags; `--etcd-endpoints` switches from the static registry to etcd.
#[derive(Args)]
struct EtcdArgs {
    /// Comma-separated etcd endpoints, e.g. http://127.0.0.1:2379.
    #[arg(long, value_name = "URLS")]
    etcd_endpoints: Option<String>,
    #[arg(long, default_value = DEFAULT_PREFIX)]
    etcd_prefix: String,
    #[arg(long)]
    etcd_cafile: Option<PathBuf>,
    #[arg(long)]
    etcd_certfile: Option<PathBuf>,
    #[arg(long)]
    etcd_keyfile: Option<PathBuf>,
    #[arg(long)]
    etcd_username: Option<String>,
    #[arg(long, env = "ETCD_PASSWORD")]
    etcd_password: Option<String>,
    /// Renew the lease this many minutes before it expires (flannel's default: 60).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=1439))]
    subnet_lease_renew_margin: u64,
}

/// flanneld's Kubernetes flags; `--kube-subnet-mgr` takes leases from Node objects.
#[derive(Args)]
struct KubeArgs {
    /// Take this node's subnet from its Node's podCIDR and the peers from the other Nodes,
    /// instead of etcd (the node is named by NODE_NAME, or POD_NAME and POD_NAMESPACE).
    #[arg(long)]
    kube_subnet_mgr: bool,
    /// The API server; not needed in a pod, which has its service account.
    #[arg(long, value_name = "URL")]
    kube_api_url: Option<String>,
    /// A kubeconfig file; not needed in a pod.
    #[arg(long, value_name = "PATH")]
    kubeconfig_file: Option<PathBuf>,
    /// Prefix of flannel's Node annotations.
    #[arg(long, default_value = kube::DEFAULT_PREFIX)]
    kube_annotation_prefix: String,
    /// flannel's network config (net-conf.json from the ConfigMap).
    #[arg(long, default_value = kube::DEFAULT_NET_CONFIG_PATH)]
    net_config_path: PathBuf,
    /// Set the Node's NetworkUnavailable condition to False once twill is ready.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value_t = true, default_missing_value = "true", action = ArgAction::Set)]
    set_node_network_unavailable: bool,
}

/// flanneld's interface flags, tried in this order: each --iface, each --iface-regex, then
/// --iface-can-reach.
#[derive(Args)]
struct InterfaceArgs {
    /// Underlay interface, by name or by one of its addresses; repeat to try several in order.
    #[arg(long, value_name = "NAME|IP")]
    iface: Vec<String>,
    /// A regular expression for the underlay interface's addresses, then its name; repeatable,
    /// tried after every --iface.
    #[arg(long, value_name = "REGEX")]
    iface_regex: Vec<String>,
    /// The interface a route to this address leaves by (`ip route get`).
    #[arg(long, value_name = "IP")]
    iface_can_reach: Option<IpAddr>,
}

/// `twill run` or `twill status`; the exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    crate::logging::init(&crate::logging::filter_for(0));
    match cli.command {
        Command::Run(args) => match launch(*args) {
            Ok(Some(launch)) => crate::run(launch),
            Ok(None) => 0,
            Err(e) => crate::exit_code(Err(e)),
        },
        Command::Status { addr } => crate::exit_code(print_status(addr)),
    }
}

/// The node the flags describe; `None` when the work (`--cleanup`) is done.
fn launch(args: RunArgs) -> anyhow::Result<Option<Launch>> {
    if args.cleanup {
        let runtime = tokio::runtime::Runtime::new()?;
        let (bpf_dir, device) = (&args.bpf_dir, &args.tun_name);
        match args.force {
            true => runtime.block_on(ebpf::cleanup_anyway(bpf_dir, device))?,
            false => runtime.block_on(ebpf::cleanup(bpf_dir, device))?,
        }
        return Ok(None);
    }
    let leases = match (kube_options(&args)?, etcd_options(&args)?) {
        (Some(kube), _) => Leases::Kube(kube),
        (None, Some(etcd)) => {
            if let Some(backend) = &args.backend {
                tracing::warn!(
                    "--backend {backend} ignored: with etcd the network config names the backend"
                );
            }
            Leases::Etcd(etcd)
        }
        (None, None) => Leases::Static(static_network(&args)?),
    };
    Ok(Some(Launch {
        leases,
        node: node_options(&args),
    }))
}

fn kube_options(args: &RunArgs) -> anyhow::Result<Option<KubeOptions>> {
    let k = &args.kube;
    if !k.kube_subnet_mgr {
        return Ok(None);
    }
    if args.etcd.etcd_endpoints.is_some() || args.network.is_some() || !args.peers.is_empty() {
        anyhow::bail!(
            "--kube-subnet-mgr takes the leases from Kubernetes: drop --etcd-endpoints, --network and --peer"
        );
    }
    let env = KubeEnv::read(&|name| std::env::var(name).ok())?;
    Ok(Some(KubeOptions {
        api_url: k.kube_api_url.clone(),
        kubeconfig: k.kubeconfig_file.clone(),
        annotation_prefix: k.kube_annotation_prefix.clone(),
        net_config_path: k.net_config_path.clone(),
        node: env.node,
        event_queue: env.event_queue,
        set_network_available: k.set_node_network_unavailable,
        timing: KubeTiming::default(),
    }))
}

fn etcd_options(args: &RunArgs) -> anyhow::Result<Option<EtcdOptions>> {
    let e = &args.etcd;
    let Some(endpoints) = &e.etcd_endpoints else {
        return Ok(None);
    };
    let mut options = EtcdOptions::new(endpoints);
    options.prefix = e.etcd_prefix.clone();
    options.cafile = e.etcd_cafile.clone();
    options.certfile = e.etcd_certfile.clone();
    options.keyfile = e.etcd_keyfile.clone();
    if e.etcd_password.is_some() && e.etcd_username.is_none() {
        anyhow::bail!(
            "--etcd-password (or ETCD_PASSWORD) is set but --etcd-username is not: give both, \
             or neither"
        );
    }
    options.username = e.etcd_username.clone();
    options.password = e.etcd_password.clone();
    options.timing.renew_margin = Duration::from_secs(60 * e.subnet_lease_renew_margin);
    Ok(Some(options))
}

fn static_network(args: &RunArgs) -> anyhow::Result<StaticNetwork> {
    use anyhow::Context;
    Ok(StaticNetwork {
        network: args.network.context("--network is required without etcd")?,
        subnet: args.subnet.context("--subnet is required without etcd")?,
        backend: args.backend.clone(),
        port: args.port,
        peers: args.peers.clone(),
    })
}

fn node_options(args: &RunArgs) -> NodeOptions {
    NodeOptions {
        interface: InterfaceChoice {
            ifaces: args.interface.iface.clone(),
            regexes: args.interface.iface_regex.clone(),
            can_reach: args.interface.iface_can_reach,
        },
        public_ip: args.public_ip,
        public_ipv6: args.public_ipv6,
        subnet_file: args.subnet_file.clone(),
        tun_name: args.tun_name.clone(),
        mtu: args.mtu,
        traffic: TrafficOptions {
            ip_masq: args.ip_masq,
            forward_rules: args.iptables_forward_rules,
            fully_random: !args.ip_masq_fully_random_disable,
            resync: Duration::from_secs(args.iptables_resync),
        },
        queues: usize::from(args.queues),
        no_offload: args.no_offload,
        udp_buffer: args.udp_buffer,
        tun_tx_queue_len: args.tun_txqueuelen,
        status_addrs: status_addrs(args),
        batch_delay: args
            .batch_delay
            .filter(|&us| us > 0)
            .map(Duration::from_micros),
        metrics_per_peer: args.metrics_per_peer,
        nexthop_objects: !args.no_nexthop_objects,
        dataplane: args.dataplane,
        bpf_dir: args.bpf_dir.clone(),
        bpf_attach: args.bpf_attach,
        bpf_xdp: args.bpf_xdp,
        blackhole_route: args.ip_blackhole_route,
    }
}

/// `--public-ipv6`: an IPv6 address another host can reach, as a lease's PublicIPv6 must be.
pub fn parse_public_ipv6(text: &str) -> Result<Ipv6Addr, String> {
    let ip: Ipv6Addr = text
        .parse()
        .map_err(|_| format!("{text:?} is not an IPv6 address"))?;
    match lease_check::unusable_ipv6(ip) {
        Some(why) => Err(format!(
            "{ip} is {why}: other nodes cannot reach this one at it"
        )),
        None => Ok(ip),
    }
}

/// `--status-addr` serves everything; flannel's `--healthz-ip`:`--healthz-port`, which listens
/// on every address by default, only the probes.
fn status_addrs(args: &RunArgs) -> Vec<StatusAddr> {
    status::addresses(
        args.status_addr,
        SocketAddr::new(args.healthz_ip, args.healthz_port),
    )
}

fn print_status(addr: SocketAddr) -> anyhow::Result<()> {
    let body = tokio::runtime::Runtime::new()?.block_on(status::fetch(addr))?;
    let mut out = std::io::stdout().lock();
    // `twill status | head` closes the pipe early: that ends the output, not in an error.
    match std::io::Write::write_all(&mut out, format!("{body}\n").as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        written => Ok(written?),
    }
}
