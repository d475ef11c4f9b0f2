//! Can this kernel, and this process, run the eBPF dataplane? [`probe`] answers by doing what
//! the dataplane does, short of attaching: load the programs and decapsulate a datagram.

use crate::loaded::{Loaded, Verdict};
use crate::maps::{wire_addr, wire_port, Config};
use crate::object::Side;
use crate::peers::Takes;
use aya::programs::ProgramType;
use aya::sys::is_program_supported;
use ipnet::Ipv4Net;
use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddrV4};
use twill_dataplane::stats::DropReason;

/// What is missing; its Display is one line naming it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    #[error(
        "not allowed to load eBPF programs: run twill as root, or with CAP_BPF and CAP_NET_ADMIN"
    )]
    NotPrivileged,
    #[error("the kernel has no bpf() system call (CONFIG_BPF_SYSCALL)")]
    NoBpfSyscall,
    #[error("the kernel runs no TC eBPF programs: no tcx and no clsact (CONFIG_NET_CLS_ACT, CONFIG_NET_CLS_BPF)")]
    NoTc,
    #[error("kernel {found} cannot decapsulate in eBPF: bpf_skb_adjust_room refused to take the outer headers off")]
    KernelTooOld { found: String },
    #[error("the kernel refused twill's eBPF programs: {0}")]
    Refused(String),
}

/// Whether the eBPF dataplane runs here; `Err` names the first thing missing.
pub fn probe() -> Result<(), Unsupported> {
    if !privileged() {
        return Err(Unsupported::NotPrivileged);
    }
    match is_program_supported(ProgramType::SchedClassifier) {
        Ok(true) => {}
        Ok(false) => return Err(Unsupported::NoTc),
        Err(e) => {
            return Err(from_syscall(
                &e.to_string(),
                std::io::Error::last_os_error(),
            ))
        }
    }
    let mut loaded =
        Loaded::load(None, &Side::BOTH).map_err(|e| Unsupported::Refused(format!("{e:#}")))?;
    decapsulates(&mut loaded).map_err(|e| match e {
        Probed::Refused(why) => Unsupported::Refused(why),
        Probed::NoDecap => Unsupported::KernelTooOld {
            found: kernel_release(),
        },
    })
}

/// Whether this kernel loads the XDP ingress program; `Err` is the verifier's reason in one
/// line. A node runs without it where it is refused ([`crate::Dataplane::left_out`]), so this
/// is no part of [`probe`].
pub fn probe_xdp() -> anyhow::Result<Result<(), String>> {
    Loaded::load(None, &[])?.load_xdp()
}

enum Probed {
    Refused(String),
    NoDecap,
}

/// Decapsulate a datagram from a peer as the ingress program does on the wire.
fn decapsulates(loaded: &mut Loaded) -> Result<(), Probed> {
    let refused = |e: anyhow::Error| Probed::Refused(format!("{e:#}"));
    let (local, peer) = (Ipv4Addr::new(192, 0, 2, 1), Ipv4Addr::new(192, 0, 2, 2));
    let subnet = Ipv4Net::new(Ipv4Addr::new(10, 0, 2, 0), 24).map_err(|e| refused(e.into()))?;
    loaded
        .maps
        .write_config(Config {
            local_ip: wire_addr(local),
            port: wire_port(PORT),
            mtu: 1472,
            ..Config::default()
        })
        .map_err(refused)?;
    let Loaded { maps, peers, .. } = loaded;
    peers
        .set(
            maps,
            subnet,
            None,
            SocketAddrV4::new(peer, PORT).into(),
            Takes::Datagrams,
        )
        .map_err(refused)?;
    let frame = datagram(peer, local, Ipv4Addr::new(10, 0, 2, 5));
    let output = loaded.test_run(Side::Ingress, &frame).map_err(refused)?;
    if output.verdict == Verdict::Redirect {
        return Ok(());
    }
    let counters = loaded.counters().map_err(refused)?;
    match counters.drop_count(DropReason::IoError) {
        0 => Err(Probed::Refused(format!(
            "a well-formed datagram got {:?} from the ingress program",
            output.verdict
        ))),
        _ => Err(Probed::NoDecap),
    }
}

const PORT: u16 = 8285;

/// An Ethernet frame carrying flannel's udp wire: `outer_src` -> `outer_dst`, port 8285 both
/// ways, around a bare 20-byte IPv4 header from `inner_src`.
fn datagram(outer_src: Ipv4Addr, outer_dst: Ipv4Addr, inner_src: Ipv4Addr) -> Vec<u8> {
    let inner = ipv4(inner_src, Ipv4Addr::new(10, 0, 1, 5), 253, 20);
    let mut udp = [
        PORT.to_be_bytes(),
        PORT.to_be_bytes(),
        28u16.to_be_bytes(),
        [0; 2],
    ]
    .concat();
    udp.extend_from_slice(&inner);
    let outer = ipv4(outer_src, outer_dst, 17, 20 + udp.len());
    let mut frame = [[0u8; 12].as_slice(), &[0x08, 0x00]].concat();
    frame.extend_from_slice(&outer);
    frame.extend_from_slice(&udp);
    frame
}

/// A 20-byte IPv4 header (TTL 64, checksum filled) for a packet of `total_len` bytes.
fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, total_len: usize) -> [u8; 20] {
    let mut header = [0u8; 20];
    header[0] = 0x45;
    header[2..4].copy_from_slice(&(total_len as u16).to_be_bytes());
    header[8] = 64;
    header[9] = protocol;
    header[12..16].copy_from_slice(&src.octets());
    header[16..20].copy_from_slice(&dst.octets());
    let sum: u32 = header
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    let folded = (sum & 0xffff) + (sum >> 16);
    let checksum = !(((folded & 0xffff) + (folded >> 16)) as u16);
    header[10..12].copy_from_slice(&checksum.to_be_bytes());
    header
}

const NET_ADMIN: u32 = 12;
const SYS_ADMIN: u32 = 21;
const BPF: u32 = 39;

/// CAP_NET_ADMIN, and CAP_BPF or CAP_SYS_ADMIN, in the effective set.
fn privileged() -> bool {
    let has = effective_capabilities();
    has(NET_ADMIN) && (has(BPF) || has(SYS_ADMIN))
}

/// Whether this process may mount a bpffs (CAP_SYS_ADMIN, effective).
pub(crate) fn may_mount() -> bool {
    effective_capabilities()(SYS_ADMIN)
}

/// The process's effective capabilities, as a test of one; none if they cannot be read.
fn effective_capabilities() -> impl Fn(u32) -> bool {
    let effective = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .unwrap_or(0);
    move |cap: u32| effective & (1u64 << cap) != 0
}

fn from_syscall(what: &str, error: std::io::Error) -> Unsupported {
    match error.kind() {
        ErrorKind::PermissionDenied => Unsupported::NotPrivileged,
        _ if error.raw_os_error() == Some(libc::ENOSYS) => Unsupported::NoBpfSyscall,
        _ => Unsupported::Refused(what.to_string()),
    }
}

pub(crate) fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|r| r.trim().to_string())
        .unwrap_or_else(|_| "of unknown version".into())
}
