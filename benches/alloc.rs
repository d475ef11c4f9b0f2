//! Checks that twill's engines allocate nothing per packet: two real engines (udp, twill-batch,
//! WireGuard), one per host of a two-host lab, forward traffic both ways, over IPv4 and over
//! IPv6 (the engines run dual-stack), while a counting global allocator watches the whole
//! process (engine threads included). After a warm-up, allocations are counted over a window and
//! divided by the packets the engines delivered to TUN in it; more than 0.01 per packet fails.
//!
//! Run with `sudo cargo bench --bench alloc`; without root it prints a note and does nothing.
//! Engine names after `--` (`udp`, `batch`, `wireguard`) run those alone.

use std::alloc::{GlobalAlloc, Layout, System};
use std::backtrace::Backtrace;
use std::cell::Cell;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};
use twill_dataplane::engine::wireguard::{
    self, Device, Families, PrivateKey, TunnelParams, WgDeviceConfig, WgEngineConfig, WgPeerSpec,
    WireGuard,
};
use twill_dataplane::engine::{Engine, EngineConfig, EngineKind};
use twill_dataplane::io::{TunConfig, DEFAULT_SOCKET_BUFFER, DEFAULT_TX_QUEUE_LEN};
use twill_dataplane::table::PeerSpec;
use twill_dataplane::wire::{batch, flannel};
use twill_lab::{Lab, LabSpec};

/// Counts every allocation and reallocation (frees are not the question), and when armed keeps
/// the backtrace of the next one, so a failing run names the code that allocated.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static CAPTURE_NEXT: AtomicBool = AtomicBool::new(false);
static CAPTURED: Mutex<Option<Backtrace>> = Mutex::new(None);

thread_local! {
    /// Set while this thread captures a backtrace, whose own allocations are not counted.
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    if CAPTURING.get() {
        return;
    }
    ALLOCATIONS.fetch_add(1, Relaxed);
    if CAPTURE_NEXT.swap(false, Relaxed) {
        CAPTURING.set(true);
        let trace = Backtrace::force_capture();
        *CAPTURED.lock().unwrap_or_else(PoisonError::into_inner) = Some(trace);
        CAPTURING.set(false);
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        System.alloc_zeroed(layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        System.realloc(ptr, layout, new_size)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const LIMIT_PER_PACKET: f64 = 0.01;
const NETWORK: &str = "10.5.0.0/16";
const NETWORK6: &str = "fd10::/56";
const APP_PORT: u16 = 5201;
/// A bulk inner packet of 1400 bytes: the app's UDP payload plus the IP and UDP headers.
const PACKET: usize = 1400;
const BURST: usize = 32;
const WARM_UP_BURSTS: usize = 500;
const MEASURED_BURSTS: usize = 5_000;
const TCP_WARM_UP: Duration = Duration::from_secs(1);
const TCP_MEASURED: Duration = Duration::from_secs(3);
/// Longer than any healthy pause: past it the engines have stopped forwarding, and the bench
/// fails instead of hanging.
const STALL: Duration = Duration::from_secs(2);

fn main() {
    if let Err(e) = twill_lab::require_root() {
        println!("skipping the allocation benchmark: {e:#}");
        return;
    }
    let engines = [
        ("udp", Kind::Engine(EngineKind::FlannelUdp)),
        ("batch", Kind::Engine(EngineKind::Batch { delay: None })),
        ("wireguard", Kind::WireGuard),
    ];
    // cargo passes `--bench`; any other word names an engine to run.
    let named: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let failed = engines
        .into_iter()
        .filter(|(name, _)| named.is_empty() || named.iter().any(|n| n == name))
        .flat_map(|engine| [Family::V4, Family::V6].map(|underlay| (engine, underlay)))
        .flat_map(|((name, kind), underlay)| under_load(name, kind, underlay))
        .filter(|window| !window.passes())
        .count();
    assert!(
        failed == 0,
        "steady-state allocations exceed {LIMIT_PER_PACKET} per packet under {failed} load(s)"
    );
}

/// An engine the bench runs.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Engine(EngineKind),
    /// Userspace WireGuard, one device carrying both families (flannel's Modes but separate).
    WireGuard,
}

impl Kind {
    fn port(self) -> u16 {
        match self {
            Kind::Engine(EngineKind::FlannelUdp) => flannel::DEFAULT_PORT,
            Kind::Engine(EngineKind::Batch { .. }) => batch::DEFAULT_PORT,
            Kind::WireGuard => wireguard::DEFAULT_PORT,
        }
    }

    fn overhead(self, underlay: IpAddr) -> usize {
        match self {
            Kind::Engine(kind) => kind.overhead(underlay),
            Kind::WireGuard => wireguard::OVERHEAD,
        }
    }
}

/// The family an app's traffic uses.
#[derive(Debug, Clone, Copy)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn udp_payload(self) -> usize {
        match self {
            Family::V4 => PACKET - 28,
            Family::V6 => PACKET - 48,
        }
    }
}

/// Both loads in both families on a fresh two-host lab running engines of one kind.
/// The four loads on two `kind` engines whose datagrams go over `underlay`.
fn under_load(name: &str, kind: Kind, underlay: Family) -> [Window; 4] {
    let lab = Lab::new(LabSpec {
        hosts: 2,
        tag: format!("al{name}{underlay:?}"),
        ..Default::default()
    })
    .expect("two-host lab");
    let lab = match underlay {
        Family::V4 => lab,
        Family::V6 => lab.with_ipv6_underlay().expect("an IPv6 underlay"),
    };
    let keys = [0, 1].map(|_| PrivateKey::generate());
    let nodes = [0, 1].map(|i| Node::start(&lab, kind, i, underlay, &keys));
    let name = format!("{name} over {underlay:?}");
    [
        udp_bursts(&lab, &nodes, &name, Family::V4),
        tcp_stream(&lab, &nodes, &name, Family::V4),
        udp_bursts(&lab, &nodes, &name, Family::V6),
        tcp_stream(&lab, &nodes, &name, Family::V6),
    ]
}

/// A host running a real engine, whose TUN holds the lease's network addresses as flanneld's
/// does; apps bind to those, so their traffic to the other host crosses both engines.
struct Node {
    running: Running,
    address: Ipv4Addr,
    address6: Ipv6Addr,
}

enum Running {
    Engine(Engine),
    WireGuard(WireGuard),
}

impl Node {
    /// Host `i`'s engine of `kind`, with the other host as its one peer (WireGuard's keys are
    /// `keys[i]`, the peer's public key that of `keys[1 - i]`).
    fn start(lab: &Lab, kind: Kind, i: usize, underlay: Family, keys: &[PrivateKey; 2]) -> Node {
        let (host, peer) = (lab.host(i), lab.host(1 - i));
        let port = kind.port();
        let address = |h: &twill_lab::Host| -> IpAddr {
            match underlay {
                Family::V4 => h.underlay_ip.into(),
                Family::V6 => h.underlay_ipv6.expect("an IPv6 underlay").into(),
            }
        };
        let bind = SocketAddr::new(address(host), port);
        let tun = TunConfig {
            name: "twill0".into(),
            mtu: 1500 - kind.overhead(bind.ip()) as u16,
            address: subnet(i).addr(),
            offload: true,
            queues: 1,
            tx_queue_len: DEFAULT_TX_QUEUE_LEN,
        };
        // The engine's threads are spawned here, inside the host's namespace.
        let running = host
            .ns
            .enter(|| match kind {
                Kind::Engine(kind) => Engine::start(&EngineConfig {
                    kind,
                    tun,
                    subnet: subnet(i),
                    subnet6: Some(subnet6(i)),
                    bind,
                    socket_buffer: DEFAULT_SOCKET_BUFFER,
                })
                .map(Running::Engine),
                Kind::WireGuard => WireGuard::start(WgEngineConfig {
                    main: WgDeviceConfig {
                        tun,
                        address6: Some(subnet6(i).network()),
                        families: Families::Both,
                        bind,
                        bind6: None,
                    },
                    v6: None,
                    socket_buffer: DEFAULT_SOCKET_BUFFER,
                    tunnel: TunnelParams {
                        private_key: keys[i].clone(),
                        preshared_key: None,
                        keepalive: None,
                    },
                })
                .map(Running::WireGuard),
            })
            .expect("start the engine");
        for network in [NETWORK, NETWORK6] {
            host.ns
                .ip(&["route", "add", network, "dev", "twill0"])
                .expect("route the network into the TUN");
        }
        let (peer_subnet, peer_subnet6) = (subnet(1 - i).trunc(), subnet6(1 - i));
        let endpoint = SocketAddr::new(address(peer), port);
        match &running {
            Running::Engine(engine) => engine.table().set_peers(&[PeerSpec {
                subnet: peer_subnet,
                subnet6: Some(peer_subnet6),
                endpoint,
                version: batch::HIGHEST_VERSION,
            }]),
            Running::WireGuard(wg) => wg.set_peers(
                Device::Main,
                &[WgPeerSpec {
                    subnet: peer_subnet,
                    subnet6: Some(peer_subnet6),
                    endpoint,
                    public_key: keys[1 - i].public_key(),
                }],
            ),
        }
        Node {
            running,
            address: subnet(i).addr(),
            address6: subnet6(i).network(),
        }
    }

    fn engine(&self) -> &Engine {
        match &self.running {
            Running::Engine(engine) => engine,
            Running::WireGuard(wg) => wg.engine(),
        }
    }

    fn app(&self, family: Family) -> SocketAddr {
        let ip: IpAddr = match family {
            Family::V4 => self.address.into(),
            Family::V6 => self.address6.into(),
        };
        SocketAddr::new(ip, APP_PORT)
    }
}

fn subnet(i: usize) -> ipnet::Ipv4Net {
    ipnet::Ipv4Net::new(Ipv4Addr::new(10, 5, i as u8 + 1, 0), 24).expect("valid prefix")
}

fn subnet6(i: usize) -> ipnet::Ipv6Net {
    let network = Ipv6Addr::new(0xfd10, 0, 0, i as u16 + 1, 0, 0, 0, 0);
    ipnet::Ipv6Net::new(network, 64).expect("valid prefix")
}

/// Inner packets the engines checked and wrote to TUN: each one was also read from the other
/// host's TUN, routed and sent, so it has crossed the whole hot path once.
fn delivered(nodes: &[Node]) -> u64 {
    nodes.iter().map(|n| n.engine().stats().rx.packets()).sum()
}

struct Window {
    load: String,
    allocations: u64,
    packets: u64,
    elapsed: Duration,
    first_site: Option<Backtrace>,
}

impl Window {
    fn measure(load: String, nodes: &[Node], run: impl FnOnce()) -> Window {
        let (allocations, packets) = (ALLOCATIONS.load(Relaxed), delivered(nodes));
        CAPTURE_NEXT.store(true, Relaxed);
        let start = Instant::now();
        run();
        let elapsed = start.elapsed();
        CAPTURE_NEXT.store(false, Relaxed);
        Window {
            load,
            allocations: ALLOCATIONS.load(Relaxed) - allocations,
            packets: delivered(nodes) - packets,
            elapsed,
            first_site: CAPTURED
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        }
    }

    /// Prints the result, and where the first allocation came from if there were too many.
    fn passes(&self) -> bool {
        println!("{self}");
        let passes = self.per_packet() <= LIMIT_PER_PACKET;
        if let (false, Some(site)) = (passes, &self.first_site) {
            println!("first allocation in that window:\n{site}");
        }
        passes
    }

    fn per_packet(&self) -> f64 {
        assert!(
            self.packets > 0,
            "{}: no packet crossed the engines",
            self.load
        );
        self.allocations as f64 / self.packets as f64
    }
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} allocations over {} packets in {:.1} s = {:.4} allocations/packet",
            self.load,
            self.allocations,
            self.packets,
            self.elapsed.as_secs_f64(),
            self.per_packet()
        )
    }
}

/// Bursts of 1400-byte datagrams, one way then back, each burst drained before the next: the
/// engines see full batches without the sockets ever overflowing.
fn udp_bursts(lab: &Lab, nodes: &[Node; 2], engine: &str, family: Family) -> Window {
    let sockets: Vec<UdpSocket> = (0..2)
        .map(|i| lab.host(i).ns.enter(|| app_socket(nodes[i].app(family))))
        .collect();
    let exchange = |bursts: usize| {
        let (payload, mut buf) = ([0xab; PACKET], [0; 2048]);
        let payload = &payload[..family.udp_payload()];
        for _ in 0..bursts {
            for (from, to) in [(0, 1), (1, 0)] {
                for _ in 0..BURST {
                    let sent = sockets[from].send_to(payload, nodes[to].app(family));
                    sent.expect("send into the TUN");
                }
                for _ in 0..BURST {
                    sockets[to]
                        .recv(&mut buf)
                        .expect("a datagram through the engines");
                }
            }
        }
    };
    exchange(WARM_UP_BURSTS);
    let load = format!("{engine} engine, {family:?} UDP bursts of {BURST} x {PACKET} B both ways");
    Window::measure(load, nodes, || exchange(MEASURED_BURSTS))
}

fn app_socket(addr: SocketAddr) -> UdpSocket {
    let socket = UdpSocket::bind(addr).expect("bind the app socket");
    socket.set_read_timeout(Some(STALL)).expect("read timeout");
    socket
}

/// One TCP stream from host 1 to host 2: the kernel hands the TUN 64 KB super-packets that the
/// engine splits, and the receiving engine coalesces (GRO) before its TUN write.
fn tcp_stream(lab: &Lab, nodes: &[Node; 2], engine: &str, family: Family) -> Window {
    let listener = lab
        .host(1)
        .ns
        .enter(|| TcpListener::bind(nodes[1].app(family)));
    let listener = listener.expect("listen");
    let sender = lab.host(0).ns.enter(|| {
        let socket = TcpStream::connect_timeout(&nodes[1].app(family), Duration::from_secs(5));
        socket.expect("connect through the engines")
    });
    let (receiver, _) = listener.accept().expect("accept");
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| send_until(sender, &stop));
        scope.spawn(|| drain(receiver));
        std::thread::sleep(TCP_WARM_UP);
        let load = format!("{engine} engine, one {family:?} TCP stream");
        let window = Window::measure(load, nodes, || std::thread::sleep(TCP_MEASURED));
        stop.store(true, Relaxed);
        window
    })
}

fn send_until(mut stream: TcpStream, stop: &AtomicBool) {
    stream
        .set_write_timeout(Some(STALL))
        .expect("write timeout");
    let chunk = [0x5a; 64 * 1024];
    while !stop.load(Relaxed) {
        stream
            .write_all(&chunk)
            .expect("TCP write through the engines");
    }
}

fn drain(mut stream: TcpStream) {
    stream.set_read_timeout(Some(STALL)).expect("read timeout");
    let mut buf = [0; 64 * 1024];
    while stream.read(&mut buf).expect("TCP read through the engines") > 0 {}
}
