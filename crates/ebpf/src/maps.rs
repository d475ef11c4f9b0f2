//! The maps the programs share with userspace. Every layout mirrors one in bpf/maps.h; a change
//! must be made in both. Addresses and ports are kept in network order, as in packets: a value
//! is built from the bytes in the order they appear on the wire.

use anyhow::Context;
use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{Array, HashMap, IterableMap, Map, MapData, PerCpuArray};
use aya::Ebpf;
use ipnet::Ipv6Net;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::AsFd;
use std::path::Path;
use twill_dataplane::icmp_limit::IcmpLimit;

/// The most peers the maps hold (bpf/maps.h MAX_PEERS): 60,000 leases with room to spare.
pub const MAX_PEERS: u32 = 65_536;

pub(crate) const MAP_NAMES: [&str; 16] = [
    "config",
    "segmenter",
    "config6",
    "own_addrs",
    "icmp_budget",
    "peers6",
    "endpoints6",
    "routes",
    "peers",
    "routes6",
    "peer_subnets6",
    "peer_traffic",
    "totals",
    "drops",
    "our_fragments",
    "our_fragments6",
];

/// `struct config`: what the programs know of this node.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Config {
    pub local_ip: u32,
    pub underlay_ifindex: u32,
    pub device_ifindex: u32,
    pub port: u16,
    pub mtu: u16,
    pub device_mac: [u8; 6],
    pub pad: [u8; 2],
}

/// `struct own_addrs`: twill's device's own addresses, where the programs' ICMP errors come
/// from (zero: none).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct OwnAddrs {
    pub ip: u32,
    pub ip6: [u8; 16],
}

/// `struct icmp_budget`: the ICMP limit as the programs spend it (twill_dataplane::icmp_limit),
/// and the answers it held back.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RawIcmpBudget {
    pub interval_ns: u64,
    pub slack_ns: u64,
    pub paid_until: u64,
    pub limited: u64,
}

/// `struct route`: the peer a destination subnet belongs to.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Route {
    pub endpoint: u32,
    pub port: u16,
    pub flags: u16,
    pub slot: u32,
}

/// `ROUTE_SUPER_PACKETS`: the peer takes what a veth hands it whole.
pub(crate) const ROUTE_SUPER_PACKETS: u16 = 1;

/// `struct peer`: a peer found by the outer source address of a datagram.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Peer {
    pub subnet: u32,
    pub mask: u32,
    pub port: u16,
    pub pad: u16,
    pub slot: u32,
}

/// `struct subnet6`: a peer's IPv6 subnet (host bits zero) and its mask.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Subnet6 {
    pub addr: [u8; 16],
    pub mask: [u8; 16],
}

impl Subnet6 {
    pub fn of(subnet: Ipv6Net) -> Subnet6 {
        Subnet6 {
            addr: subnet.network().octets(),
            mask: subnet.netmask().octets(),
        }
    }
}

/// `struct traffic`: one CPU's packets and bytes each way.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RawTraffic {
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
}

// SAFETY: plain `repr(C)` data with explicit padding fields, valid for any bit pattern.
unsafe impl aya::Pod for Config {}
unsafe impl aya::Pod for OwnAddrs {}
unsafe impl aya::Pod for RawIcmpBudget {}
unsafe impl aya::Pod for Route {}
unsafe impl aya::Pod for Peer {}
unsafe impl aya::Pod for Subnet6 {}
unsafe impl aya::Pod for RawTraffic {}

/// An address as the programs compare it: its octets in wire order.
pub(crate) fn wire_addr(addr: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(addr.octets())
}

pub(crate) fn addr_of(wire: u32) -> Ipv4Addr {
    Ipv4Addr::from(wire.to_ne_bytes())
}

pub(crate) fn wire_port(port: u16) -> u16 {
    u16::from_ne_bytes(port.to_be_bytes())
}

pub(crate) fn port_of(wire: u16) -> u16 {
    u16::from_be_bytes(wire.to_ne_bytes())
}

pub(crate) type RouteKey = Key<u32>;
/// `struct route_key6`: an IPv6 subnet, its address in wire order.
pub(crate) type RouteKey6 = Key<[u8; 16]>;

/// The CPUs a per-CPU map holds a value for.
pub(crate) fn possible_cpus() -> anyhow::Result<usize> {
    aya::util::nr_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))
}

/// Typed handles on the loaded object's maps.
pub(crate) struct Maps {
    pub config: Array<MapData, Config>,
    /// The segmenter's sending end's ifindex, or 0.
    pub segmenter: Array<MapData, u32>,
    pub routes: LpmTrie<MapData, u32, Route>,
    pub peers: HashMap<MapData, u32, Peer>,
    pub routes6: LpmTrie<MapData, [u8; 16], Route>,
    /// By the peer's slot.
    pub peer_subnets6: HashMap<MapData, u32, Subnet6>,
    /// The node's IPv6 underlay address over the IPv6 underlay, else zero.
    pub config6: Array<MapData, [u8; 16]>,
    pub own_addrs: Array<MapData, OwnAddrs>,
    pub icmp_budget: Array<MapData, RawIcmpBudget>,
    /// Peers by their IPv6 underlay address, over the IPv6 underlay.
    pub peers6: HashMap<MapData, [u8; 16], Peer>,
    /// Each peer's IPv6 underlay address by its slot, over the IPv6 underlay.
    pub endpoints6: HashMap<MapData, u32, [u8; 16]>,
    pub peer_traffic: PerCpuArray<MapData, RawTraffic>,
    pub totals: PerCpuArray<MapData, RawTraffic>,
    pub drops: PerCpuArray<MapData, u64>,
}

impl Maps {
    pub fn take(ebpf: &mut Ebpf) -> anyhow::Result<Maps> {
        let mut take = |name: &str| {
            ebpf.take_map(name)
                .with_context(|| format!("the eBPF object has no map {name}"))
        };
        Ok(Maps {
            config: take("config")?.try_into()?,
            segmenter: take("segmenter")?.try_into()?,
            routes: take("routes")?.try_into()?,
            peers: take("peers")?.try_into()?,
            routes6: take("routes6")?.try_into()?,
            peer_subnets6: take("peer_subnets6")?.try_into()?,
            config6: take("config6")?.try_into()?,
            own_addrs: take("own_addrs")?.try_into()?,
            icmp_budget: take("icmp_budget")?.try_into()?,
            peers6: take("peers6")?.try_into()?,
            endpoints6: take("endpoints6")?.try_into()?,
            peer_traffic: take("peer_traffic")?.try_into()?,
            totals: take("totals")?.try_into()?,
            drops: take("drops")?.try_into()?,
        })
    }

    pub fn write_config(&mut self, config: Config) -> anyhow::Result<()> {
        self.config
            .set(0, config, 0)
            .context("writing the config map")
    }

    /// The ifindex packets go out of to be segmented (None: no segmenter, 0 in the map).
    pub fn write_segmenter(&mut self, ifindex: Option<u32>) -> anyhow::Result<()> {
        self.segmenter
            .set(0, ifindex.unwrap_or(0), 0)
            .context("writing the segmenter map")
    }

    /// The node's IPv6 underlay address (None: the IPv4 underlay, all zero in the map).
    pub fn write_config6(&mut self, local: Option<Ipv6Addr>) -> anyhow::Result<()> {
        let octets = local.map_or([0; 16], |a| a.octets());
        self.config6
            .set(0, octets, 0)
            .context("writing the config6 map")
    }

    /// twill's device's own addresses, the source of the programs' ICMP errors (None: that
    /// family's are not answered).
    pub fn write_own_addrs(
        &mut self,
        ip: Option<Ipv4Addr>,
        ip6: Option<Ipv6Addr>,
    ) -> anyhow::Result<()> {
        let own = OwnAddrs {
            ip: ip.map_or(0, wire_addr),
            ip6: ip6.map_or([0; 16], |a| a.octets()),
        };
        self.own_addrs
            .set(0, own, 0)
            .context("writing the own_addrs map")
    }

    /// The ICMP limit the programs answer within. What an earlier run spent and held back
    /// stays, as its other counters do.
    pub fn write_icmp_limit(&mut self, limit: IcmpLimit) -> anyhow::Result<()> {
        let earlier = self.read_icmp_budget()?;
        let budget = RawIcmpBudget {
            interval_ns: limit.interval_ns(),
            slack_ns: limit.slack_ns(),
            ..earlier
        };
        self.icmp_budget
            .set(0, budget, 0)
            .context("writing the icmp_budget map")
    }

    pub fn read_icmp_budget(&self) -> anyhow::Result<RawIcmpBudget> {
        self.icmp_budget
            .get(&0, 0)
            .context("reading the icmp_budget map")
    }

    /// Every CPU's counters of the slots `0..slots`, slot by slot, read in a few batch
    /// syscalls rather than one per slot (see crate::batch), or one per slot on a kernel
    /// without batch lookups of per-CPU arrays (before 5.13: Debian's 5.10).
    pub fn peer_traffic_below(&self, slots: u32) -> anyhow::Result<Vec<RawTraffic>> {
        let map = self.peer_traffic.map().fd().as_fd();
        let batched = crate::batch::array_values(map, slots, possible_cpus()?)
            .context("reading the peers' counters")?;
        if let Some(values) = batched {
            return Ok(values);
        }
        let mut values = Vec::new();
        for slot in 0..slots {
            let per_cpu = self
                .peer_traffic
                .get(&slot, 0)
                .with_context(|| format!("reading peer slot {slot}'s counters"))?;
            values.extend(per_cpu.iter().copied());
        }
        Ok(values)
    }

    /// The config in a pinned config map, without loading anything.
    pub fn read_pinned_config(path: &Path) -> anyhow::Result<Config> {
        let map = MapData::from_pin(path).with_context(|| format!("opening {}", path.display()))?;
        let config: Array<MapData, Config> = Map::Array(map).try_into()?;
        config.get(&0, 0).context("reading the config map")
    }
}
