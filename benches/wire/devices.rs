//! What the kernel side costs: a TUN round trip, and UDP send+receive one datagram per syscall,
//! with sendmmsg/recvmmsg, and with GSO/GRO. Needs root; everything happens in a fresh network
//! namespace, so nothing touches the host.

use super::udp_packet;
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use nix::sys::socket::{recvmmsg, sendmmsg, ControlMessage, MsgFlags, MultiHeaders, SockaddrIn};
use std::io::{IoSlice, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use twill_dataplane::io::{
    RecvBatch, Tun, TunConfig, TunReader, TunWriter, UdpIo, DEFAULT_SOCKET_BUFFER,
};
use twill_lab::Netns;

/// Datagrams per iteration: as many as one GSO send of 1400-byte datagrams carries (46).
const BURST: usize = 32;
const TUN_NAME: &str = "tw0";
const TUN_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 5, 1, 0);
const LOOPBACK: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0);

type Group<'a> = BenchmarkGroup<'a, WallTime>;

pub fn bench(c: &mut Criterion) {
    if let Err(e) = twill_lab::require_root() {
        println!("skipping the TUN and UDP socket benchmarks: {e:#}");
        return;
    }
    let ns = Netns::new("wirebench").expect("create a network namespace");
    // The TUN round trip is the kernel forwarding a packet back out of the TUN it came in on:
    // forwarding must be on, and a redirect for each packet would land in the TUN too.
    for setting in [
        "net.ipv4.ip_forward=1",
        "net.ipv4.conf.all.send_redirects=0",
        "net.ipv4.conf.default.send_redirects=0",
    ] {
        ns.exec("sysctl", &["-qw", setting]).expect("sysctl");
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let sandbox = Sandbox { ns: &ns, rt: &rt };
    tun_round_trip(c, &sandbox);
    udp_loopback(c, &sandbox);
}

/// The namespace and the runtime the devices are registered with. Criterion cannot move to
/// another thread, so devices are opened on a thread inside the namespace (they stay bound to it)
/// and criterion drives them from this one.
struct Sandbox<'a> {
    ns: &'a Netns,
    rt: &'a Runtime,
}

impl Sandbox<'_> {
    fn open<T: Send>(&self, open: impl FnOnce() -> T + Send) -> T {
        self.ns.enter(|| {
            let _runtime = self.rt.enter();
            open()
        })
    }
}

/// One TUN, a route for 10.5.0.0/16 into it, and packets written to it for 10.5.3.3: the kernel
/// forwards each back into the TUN, where the reader picks it up. So one iteration is a TUN
/// write (twill's TunWriter, with its GRO), the kernel's forwarding, and a TUN read (TunReader).
fn tun_round_trip(c: &mut Criterion, sandbox: &Sandbox) {
    let config = TunConfig {
        name: TUN_NAME.into(),
        mtu: 1500,
        address: TUN_ADDRESS,
        offload: true,
        queues: 1,
        tx_queue_len: 1000,
    };
    let tun = sandbox.open(|| Tun::open(&config)).expect("open TUN");
    sandbox
        .ns
        .ip(&["route", "add", "10.5.0.0/16", "dev", TUN_NAME])
        .expect("route into the TUN");
    let (mut reader, mut writer) = {
        let _runtime = sandbox.rt.enter();
        let reader = tun.reader(0).expect("TUN reader");
        (reader, tun.writer(0).expect("TUN writer"))
    };
    let src = SocketAddrV4::new(Ipv4Addr::new(10, 5, 2, 2), 5201);
    let dst = SocketAddrV4::new(Ipv4Addr::new(10, 5, 3, 3), 5201);
    let mut group = c.benchmark_group("tun");
    for (size, count) in [(super::BULK, 1), (super::BULK, BURST), (64, BURST)] {
        let packet = udp_packet(src, dst, size);
        group.throughput(Throughput::Elements(count as u64));
        group.bench_function(format!("write+forward+read/{count}x{size}B"), |b| {
            b.iter_custom(|iters| {
                sandbox
                    .rt
                    .block_on(round_trips(&mut reader, &mut writer, &packet, count, iters))
            })
        });
    }
    group.finish();
}

async fn round_trips(
    reader: &mut TunReader,
    writer: &mut TunWriter,
    packet: &[u8],
    count: usize,
    iters: u64,
) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        for _ in 0..count {
            writer.push(packet);
        }
        writer.flush().expect("TUN write");
        let mut read = 0;
        while read < count {
            read += reader.read_batch().await.expect("TUN read");
        }
    }
    start.elapsed()
}

fn udp_loopback(c: &mut Criterion, sandbox: &Sandbox) {
    let mut group = c.benchmark_group("udp_loopback");
    group.throughput(Throughput::Elements(BURST as u64));
    for size in [super::BULK, 64] {
        per_syscall(&mut group, sandbox, size);
        mmsg(&mut group, sandbox, size);
        gso_gro(&mut group, sandbox, size);
    }
    group.finish();
}

fn local(addr: std::io::Result<SocketAddr>) -> SocketAddr {
    addr.expect("a bound socket's address")
}

fn std_pair(sandbox: &Sandbox) -> (UdpSocket, UdpSocket, SocketAddr) {
    let bind = || UdpSocket::bind(LOOPBACK).expect("bind");
    let (tx, rx) = sandbox.open(|| (bind(), bind()));
    let to = local(rx.local_addr());
    (tx, rx, to)
}

fn per_syscall(group: &mut Group<'_>, sandbox: &Sandbox, size: usize) {
    let (tx, rx, to) = std_pair(sandbox);
    let payload = vec![0xab; size];
    let mut buf = [0; 2048];
    group.bench_function(format!("send_to+recv_from/{size}B"), |b| {
        b.iter(|| {
            for _ in 0..BURST {
                tx.send_to(&payload, to).expect("send_to");
            }
            for _ in 0..BURST {
                rx.recv_from(&mut buf).expect("recv_from");
            }
        })
    });
}

fn mmsg(group: &mut Group<'_>, sandbox: &Sandbox, size: usize) {
    let (tx, rx, to) = std_pair(sandbox);
    let SocketAddr::V4(to) = to else {
        panic!("a socket bound on IPv4 loopback has an IPv4 address")
    };
    let to = SockaddrIn::from(to);
    let payload = vec![0xab; size];
    let mut buf = vec![0; 2048 * BURST];
    let mut send_headers = MultiHeaders::<SockaddrIn>::preallocate(BURST, None);
    let mut recv_headers = MultiHeaders::<SockaddrIn>::preallocate(BURST, None);
    group.bench_function(format!("sendmmsg+recvmmsg/{size}B"), |b| {
        b.iter(|| {
            let iovs: [[IoSlice; 1]; BURST] = [[IoSlice::new(&payload)]; BURST];
            let no_cmsgs: [ControlMessage; 0] = [];
            let sent = sendmmsg(
                tx.as_raw_fd(),
                &mut send_headers,
                &iovs,
                [Some(to); BURST],
                no_cmsgs,
                MsgFlags::empty(),
            )
            .expect("sendmmsg")
            .count();
            assert_eq!(sent, BURST);
            let mut chunks = buf.chunks_exact_mut(2048);
            let mut iovs: [[IoSliceMut; 1]; BURST] = std::array::from_fn(|_| {
                [IoSliceMut::new(
                    chunks.next().expect("one chunk per datagram"),
                )]
            });
            // Blocking and without a timeout, recvmmsg returns once all BURST have arrived.
            let received = recvmmsg(
                rx.as_raw_fd(),
                &mut recv_headers,
                iovs.iter_mut(),
                MsgFlags::empty(),
                None,
            )
            .expect("recvmmsg")
            .count();
            assert_eq!(received, BURST);
        })
    });
}

/// twill's own socket: one sendmsg with UDP_SEGMENT carries the burst, and with UDP_GRO the
/// receiver gets it back as one train in one recvmsg.
fn gso_gro(group: &mut Group<'_>, sandbox: &Sandbox, size: usize) {
    let bind = || UdpIo::bind(LOOPBACK.into(), DEFAULT_SOCKET_BUFFER).expect("bind UdpIo");
    let (tx, rx) = sandbox.open(|| (bind(), bind()));
    let to = local(rx.local_addr());
    let rx = {
        let _runtime = sandbox.rt.enter();
        rx.receiver().expect("UDP receiver")
    };
    assert!(
        tx.segments_per_send(size) >= BURST,
        "no UDP GSO on loopback"
    );
    let train = vec![0xab; size * BURST];
    let mut batch = RecvBatch::default();
    group.bench_function(format!("gso_send+gro_recv/{size}B"), |b| {
        b.iter_custom(|iters| {
            sandbox.rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    tx.send(to, &train, size).expect("GSO send");
                    let mut received = 0;
                    while received < BURST {
                        rx.recv(&mut batch).await.expect("GRO recv");
                        received += batch.messages().map(|(_, d)| d.count()).sum::<usize>();
                    }
                }
                start.elapsed()
            })
        })
    });
}
