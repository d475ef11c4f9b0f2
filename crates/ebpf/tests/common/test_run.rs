//! One node's programs opened for BPF_PROG_TEST_RUN, with their real maps: a namespace with
//! twill's device and a stand-in underlay (both ifb, see add_device), the peer of 10.5.2.0/24
//! and fd10:0:0:2::/64 at PEER, and frames between a container here and one behind the peer.
//! No frame of these tests leaves the namespace: BPF_PROG_TEST_RUN only reports redirects.

use super::engine_model::Node;
use super::{Pins, DEVICE, DEVICE_MTU, PORT};
use anyhow::Result;
use ipnet::{Ipv4Net, Ipv6Net};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use twill_dataplane::icmp_limit::IcmpLimit;
use twill_ebpf::{AttachMode, Attachment, Dataplane, Opened, Takes, XdpChoice};
use twill_lab::Netns;

/// This node's underlay address and its peer's.
pub const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);
pub const PEER: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 2);
/// The same over the IPv6 underlay.
pub const LOCAL6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x200, 0, 0, 0, 0, 0, 1);
pub const PEER6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x200, 0, 0, 0, 0, 0, 2);
/// A container here and one behind the peer.
pub const HERE: Ipv4Addr = Ipv4Addr::new(10, 5, 1, 2);
pub const THERE: Ipv4Addr = Ipv4Addr::new(10, 5, 2, 7);
/// Their IPv6 addresses, on a dual-stack network.
pub const HERE6: Ipv6Addr = Ipv6Addr::new(0xfd10, 0, 0, 1, 0, 0, 0, 2);
pub const THERE6: Ipv6Addr = Ipv6Addr::new(0xfd10, 0, 0, 2, 0, 0, 0, 7);
pub const UDP: u8 = 17;
/// twill's device's own addresses here, the source of the programs' ICMP errors: the network
/// addresses of this node's subnets (10.5.1.0/24, fd10:0:0:1::/64).
pub const OWN: Ipv4Addr = Ipv4Addr::new(10, 5, 1, 0);
pub const OWN6: Ipv6Addr = Ipv6Addr::new(0xfd10, 0, 0, 1, 0, 0, 0, 0);

/// An ICMP limit no test's frames reach: answers are checked frame by frame, and the limit on
/// its own ([`test_bench_limited`]).
pub const UNLIMITED: IcmpLimit = IcmpLimit {
    per_second: u32::MAX,
    burst: u32::MAX,
};

pub fn peer_subnet() -> Ipv4Net {
    "10.5.2.0/24".parse().unwrap()
}

pub fn peer_subnet6() -> Ipv6Net {
    "fd10:0:0:2::/64".parse().unwrap()
}

/// Fields drop in order: the dataplane first, so that its claim on the pin directory is gone
/// when `_pins` removes it (a claimed directory is refused, and its bpffs stayed mounted).
pub struct TestBench {
    pub dataplane: Dataplane,
    _pins: Pins,
    /// twill's device's MAC: a decapsulated frame is addressed to it.
    pub device_mac: [u8; 6],
    /// Whether the node is on the IPv6 underlay (LOCAL6, its peer at PEER6).
    pub over_ipv6: bool,
    _ns: Netns,
}

/// The programs in a namespace of their own (named after `tag`), knowing one peer.
pub fn test_bench(tag: &str) -> Result<TestBench> {
    bench_on(tag, None, UNLIMITED)
}

/// [`test_bench`] answering within `limit`.
pub fn test_bench_limited(tag: &str, limit: IcmpLimit) -> Result<TestBench> {
    bench_on(tag, None, limit)
}

/// The same on the IPv6 underlay: the node at LOCAL6, its peer at PEER6.
pub fn test_bench6(tag: &str) -> Result<TestBench> {
    bench_on(tag, Some(LOCAL6), UNLIMITED)
}

fn bench_on(tag: &str, local_ip6: Option<Ipv6Addr>, icmp_limit: IcmpLimit) -> Result<TestBench> {
    let ns = Netns::new(tag)?;
    let mtu = DEVICE_MTU.to_string();
    ns.ip(&["link", "add", DEVICE, "mtu", &mtu, "type", "ifb"])?;
    ns.ip(&["link", "add", "eth0", "type", "ifb"])?;
    let pins = Pins::new(ns.name());
    let at = Attachment {
        device: DEVICE.into(),
        underlay: "eth0".into(),
        local_ip: LOCAL,
        local_ip6,
        port: PORT,
        attach: AttachMode::Auto,
        xdp: XdpChoice::On,
        segmenter: false,
        device_ip: Some(OWN),
        device_ip6: Some(OWN6),
        icmp_limit,
    };
    let (dataplane, opened) = ns.enter(|| Dataplane::open(pins.path(), &at))?;
    assert_eq!(opened, Opened::Fresh);
    let endpoint = match local_ip6 {
        Some(_) => SocketAddr::new(PEER6.into(), PORT),
        None => SocketAddr::new(PEER.into(), PORT),
    };
    dataplane.set_peer(
        peer_subnet(),
        Some(peer_subnet6()),
        endpoint,
        Takes::SuperPackets,
    )?;
    let device_mac = mac_of(&ns, DEVICE)?;
    Ok(TestBench {
        dataplane,
        _pins: pins,
        device_mac,
        over_ipv6: local_ip6.is_some(),
        _ns: ns,
    })
}

impl TestBench {
    /// The node as the engine's rules see it now, for engine_model: its peer's IPv6 subnet as
    /// the maps hold it.
    pub fn node(&self) -> Node {
        Node {
            over_ipv6: self.over_ipv6,
            device_mac: self.device_mac,
            peer_subnet6: self.dataplane.peer_subnets6().get(&peer_subnet()).copied(),
        }
    }

    /// Opens the pinned programs and maps again, as a restarted node adopts them.
    pub fn reopen(&self) -> Result<Opened> {
        self._ns.enter(|| self.dataplane.reopen())
    }
}

fn mac_of(ns: &Netns, device: &str) -> Result<[u8; 6]> {
    let out = ns.ip(&["-br", "link", "show", device])?;
    let mac = out.split_whitespace().nth(2).unwrap_or_default();
    let bytes: Vec<u8> = mac
        .split(':')
        .map(|b| u8::from_str_radix(b, 16))
        .collect::<Result<_, _>>()?;
    bytes
        .try_into()
        .map_err(|_| anyhow::anyhow!("no MAC in {out:?}"))
}

/// Whether this kernel loads the XDP program, so that its cases can run. One kernel is known to
/// refuse it, 6.18.44-fc (the helper bpf_xdp_adjust_meta, which the program's mark needs): a
/// node there runs without XDP (`Dataplane::left_out`, tested in forwarding.rs), and its cases
/// are not run, said on stderr. Any other refusal fails.
pub fn xdp_loads() -> Result<bool> {
    match twill_ebpf::probe_xdp()? {
        Ok(()) => Ok(true),
        Err(why) if why.contains("bpf_xdp_adjust_meta") => {
            eprintln!("this kernel refuses the XDP program ({why}): its cases are not run here");
            Ok(false)
        }
        Err(why) => anyhow::bail!("this kernel refuses the XDP program: {why}"),
    }
}

/// What twill_xdp_ingress puts in the metadata of a frame it decapsulated (a u32, "twDp"), as
/// BPF_PROG_TEST_RUN hands it back before the frame: from Linux 5.14 on, which copies out from
/// the metadata; Debian's 5.10 hands back the frame alone (so there the mark is seen only on
/// the wire path: forwarding.rs with XDP on).
pub fn xdp_mark_shown() -> &'static [u8] {
    const XDP_MARK: [u8; 4] = 0x7477_4470u32.to_ne_bytes();
    match aya::util::KernelVersion::current() {
        Ok(version) if version < aya::util::KernelVersion::new(5, 14, 0) => &[],
        _ => &XDP_MARK,
    }
}
