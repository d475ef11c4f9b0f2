//! A thin layer over rtnetlink for the kernel backends: links, addresses, routes, neighbours and
//! VXLAN fdb entries, IPv4 only, as flanneld programs them.
//!
//! Every call returns `io::Result` with the kernel's errno intact, so callers can tell "already
//! there" or "module missing" apart from real failures. Adds use replace semantics and deletes of
//! something already gone succeed, which keeps every operation idempotent.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use futures::{Stream, TryStreamExt};
use ipnet::Ipv4Net;
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{
    InfoData, InfoIpTunnel, InfoKind, InfoVxlan, LinkAttribute, LinkInfo, LinkMessage,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteProtocol, RouteScope,
    RouteType,
};
use netlink_packet_route::AddressFamily;
use netlink_packet_route::RouteNetlinkMessage;
use rtnetlink::proto::ConnectionHandle;
use rtnetlink::{Handle, LinkIpIp, LinkUnspec, LinkVxlan, RouteMessageBuilder};

mod write;
pub use write::Write;

/// The port the kernel uses when a VXLAN device is created without one (flannel's "Port 0").
pub const KERNEL_VXLAN_PORT: u16 = 8472;

/// An Ethernet address, written the way flannel writes VtepMAC (`d6:60:f1:85:5a:fc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// A random unicast, locally administered address. flanneld sets its own instead of the
    /// kernel's because udev (MACAddressPolicy=persistent) may otherwise rewrite a kernel-chosen
    /// one after creation, leaving a stale VtepMAC in the lease.
    pub fn random() -> Self {
        let mut bytes: [u8; 6] = rand::random();
        bytes[0] = (bytes[0] & 0xfe) | 0x02;
        MacAddr(bytes)
    }

    fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(MacAddr)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl FromStr for MacAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("invalid MAC address {s:?}");
        let parts: Vec<u8> = s
            .split(':')
            .map(|p| {
                (p.len() == 2)
                    .then(|| u8::from_str_radix(p, 16).ok())
                    .flatten()
            })
            .collect::<Option<_>>()
            .ok_or_else(bad)?;
        MacAddr::from_slice(&parts).ok_or_else(bad)
    }
}

/// VXLAN settings, both as requested on creation and as the kernel reports them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VxlanParams {
    pub vni: u32,
    pub local: Option<Ipv4Addr>,
    /// Index of the underlay device (`dev <iface>`).
    pub dev: Option<u32>,
    /// 0 = not set, the kernel then uses [`KERNEL_VXLAN_PORT`].
    pub port: u16,
    pub learning: bool,
}

/// IPIP tunnel settings, both as requested on creation and as the kernel reports them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IpipParams {
    pub local: Option<Ipv4Addr>,
    pub remote: Option<Ipv4Addr>,
}

/// What a link is, as far as the backends care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkKind {
    Vxlan(VxlanParams),
    Ipip(IpipParams),
    Other(Option<InfoKind>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mtu: u32,
    pub mac: Option<MacAddr>,
    pub kind: LinkKind,
}

/// A unicast IPv4 route in the main table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Route {
    pub dst: Ipv4Net,
    pub gateway: Option<Ipv4Addr>,
    pub oif: u32,
    pub onlink: bool,
}

/// An IPv4 neighbour (ARP) entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Neighbour {
    pub ip: Ipv4Addr,
    pub mac: MacAddr,
}

/// A VXLAN forwarding entry: frames for `mac` are tunnelled to `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FdbEntry {
    pub mac: MacAddr,
    pub dst: Ipv4Addr,
}

/// The message that creates a VXLAN device the way flanneld does.
pub fn vxlan_link_message(name: &str, p: &VxlanParams, mtu: u32, mac: MacAddr) -> LinkMessage {
    let mut b = LinkVxlan::new(name, p.vni).learning(p.learning);
    if let Some(dev) = p.dev {
        b = b.dev(dev);
    }
    if let Some(local) = p.local {
        b = b.local(local);
    }
    // flanneld leaves the port out when it is 0 so the kernel picks its default.
    if p.port != 0 {
        b = b.port(p.port);
    }
    b.mtu(mtu).address(mac.0.to_vec()).build()
}

/// The message that creates an IPIP tunnel device the way flanneld does.
pub fn ipip_link_message(name: &str, p: &IpipParams, mtu: u32) -> LinkMessage {
    let mut b = LinkIpIp::new(name);
    if let Some(local) = p.local {
        b = b.local(local);
    }
    if let Some(remote) = p.remote {
        b = b.remote(remote);
    }
    b.mtu(mtu).build()
}

/// The message that installs `route` as flanneld does (proto boot, scope universe).
pub fn route_message(route: &Route) -> RouteMessage {
    let mut b = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(route.dst.network(), route.dst.prefix_len())
        .output_interface(route.oif)
        .protocol(RouteProtocol::Boot);
    if let Some(gw) = route.gateway {
        b = b.gateway(gw);
    } else {
        b = b.scope(RouteScope::Link);
    }
    if route.onlink {
        b = b.onlink();
    }
    b.build()
}

/// Connections to the kernel's routing netlink, serviced by tasks on the current tokio runtime:
/// one for reads and device set-up, one that sends per-peer changes in batches ([`Write`]).
#[derive(Clone)]
pub struct Netlink {
    handle: Handle,
    batches: ConnectionHandle<RouteNetlinkMessage>,
    /// Requests that change kernel state, for status: an idle reconcile must make none.
    writes: Arc<AtomicU64>,
}

impl Netlink {
    /// Connects in the network namespace of the calling thread. Needs a tokio runtime.
    pub fn connect() -> io::Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        let (connection, handle, _) = rtnetlink::new_connection()?;
        runtime.spawn(connection);
        Ok(Netlink {
            handle,
            batches: write::connect(&runtime)?,
            writes: Arc::default(),
        })
    }

    /// Requests sent so far that change kernel state.
    pub fn writes(&self) -> u64 {
        self.writes.load(Relaxed)
    }

    fn wrote(&self) {
        self.writes.fetch_add(1, Relaxed);
    }

    pub async fn link_by_name(&self, name: &str) -> io::Result<Option<Link>> {
        let found = self
            .handle
            .link()
            .get()
            .match_name(name)
            .execute()
            .try_next()
            .await;
        match found.map_err(io_error) {
            Ok(msg) => Ok(msg.map(parse_link)),
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Fails with the kernel's errno, e.g. EEXIST or EOPNOTSUPP (no such link type).
    pub async fn create_link(&self, msg: LinkMessage) -> io::Result<()> {
        self.wrote();
        self.handle
            .link()
            .add(msg)
            .execute()
            .await
            .map_err(io_error)
    }

    pub async fn delete_link(&self, index: u32) -> io::Result<()> {
        self.wrote();
        let deleted = self.handle.link().del(index).execute().await;
        tolerate(deleted.map_err(io_error), &[libc::ENODEV])
    }

    pub async fn set_up(&self, index: u32) -> io::Result<()> {
        self.change_link(LinkUnspec::new_with_index(index).up().build())
            .await
    }

    pub async fn set_mtu(&self, index: u32, mtu: u32) -> io::Result<()> {
        self.change_link(LinkUnspec::new_with_index(index).mtu(mtu).build())
            .await
    }

    async fn change_link(&self, msg: LinkMessage) -> io::Result<()> {
        self.wrote();
        self.handle
            .link()
            .change(msg)
            .execute()
            .await
            .map_err(io_error)
    }

    pub async fn ipv4_addresses(&self, index: u32) -> io::Result<Vec<Ipv4Net>> {
        let msgs = self.address_messages(index).await?;
        Ok(msgs.iter().filter_map(address_of).collect())
    }

    pub async fn add_address(&self, index: u32, addr: Ipv4Net) -> io::Result<()> {
        self.wrote();
        let req = self
            .handle
            .address()
            .add(index, IpAddr::V4(addr.addr()), addr.prefix_len());
        req.replace().execute().await.map_err(io_error)
    }

    pub async fn delete_address(&self, index: u32, addr: Ipv4Net) -> io::Result<()> {
        let msgs = self.address_messages(index).await?;
        for msg in msgs.into_iter().filter(|m| address_of(m) == Some(addr)) {
            self.wrote();
            let deleted = self.handle.address().del(msg).execute().await;
            tolerate(deleted.map_err(io_error), &[libc::EADDRNOTAVAIL])?;
        }
        Ok(())
    }

    async fn address_messages(&self, index: u32) -> io::Result<Vec<AddressMessage>> {
        let req = self.handle.address().get().set_link_index_filter(index);
        collect(req.execute()).await
    }

    /// IPv4 unicast routes of the main table installed as proto boot: the netlink default that
    /// flanneld and twill write. Kernel, DHCP and routing-daemon routes never show up here, so a
    /// backend cleaning up cannot touch them.
    pub async fn boot_routes(&self) -> io::Result<Vec<Route>> {
        let filter = RouteMessageBuilder::<Ipv4Addr>::new().build();
        let msgs = collect(self.handle.route().get(filter).execute()).await?;
        Ok(msgs.iter().filter_map(parse_boot_route).collect())
    }

    /// Permanent IPv4 neighbour entries on `index`.
    pub async fn permanent_neighbours(&self, index: u32) -> io::Result<Vec<Neighbour>> {
        let msgs = self.neighbour_messages(AddressFamily::Inet, index).await?;
        Ok(msgs.iter().filter_map(parse_neighbour).collect())
    }

    /// Permanent fdb entries with an IPv4 destination on `index` (`bridge fdb show dev`).
    pub async fn fdb(&self, index: u32) -> io::Result<Vec<FdbEntry>> {
        let msgs = self
            .neighbour_messages(AddressFamily::Bridge, index)
            .await?;
        Ok(msgs.iter().filter_map(parse_fdb).collect())
    }

    async fn neighbour_messages(
        &self,
        family: AddressFamily,
        index: u32,
    ) -> io::Result<Vec<NeighbourMessage>> {
        let req = self.handle.neighbours().get().set_address_family(family);
        let msgs = collect(req.execute()).await?;
        Ok(msgs
            .into_iter()
            .filter(|m| m.header.ifindex == index)
            .collect())
    }
}

fn io_error(e: rtnetlink::Error) -> io::Error {
    match e {
        rtnetlink::Error::NetlinkError(msg) => msg.to_io(),
        other => io::Error::other(other),
    }
}

/// Treats the listed errnos as success: the state is already what the caller wanted.
fn tolerate(result: io::Result<()>, errnos: &[i32]) -> io::Result<()> {
    match result {
        Err(e) if e.raw_os_error().is_some_and(|code| errnos.contains(&code)) => Ok(()),
        other => other,
    }
}

async fn collect<T>(stream: impl Stream<Item = Result<T, rtnetlink::Error>>) -> io::Result<Vec<T>> {
    stream.try_collect().await.map_err(io_error)
}

pub(crate) fn parse_link(msg: LinkMessage) -> Link {
    let mut link = Link {
        index: msg.header.index,
        name: String::new(),
        mtu: 0,
        mac: None,
        kind: LinkKind::Other(None),
    };
    for attr in msg.attributes {
        match attr {
            LinkAttribute::IfName(name) => link.name = name,
            LinkAttribute::Mtu(mtu) => link.mtu = mtu,
            LinkAttribute::Address(bytes) => link.mac = MacAddr::from_slice(&bytes),
            LinkAttribute::LinkInfo(infos) => link.kind = parse_kind(infos),
            _ => {}
        }
    }
    link
}

fn parse_kind(infos: Vec<LinkInfo>) -> LinkKind {
    let mut kind = None;
    let mut data = None;
    for info in infos {
        match info {
            LinkInfo::Kind(k) => kind = Some(k),
            LinkInfo::Data(d) => data = Some(d),
            _ => {}
        }
    }
    match (kind, data) {
        (Some(InfoKind::Vxlan), Some(InfoData::Vxlan(d))) => LinkKind::Vxlan(parse_vxlan(d)),
        (Some(InfoKind::IpIp), Some(InfoData::IpTunnel(d))) => LinkKind::Ipip(parse_ipip(d)),
        (kind, _) => LinkKind::Other(kind),
    }
}

fn parse_vxlan(data: Vec<InfoVxlan>) -> VxlanParams {
    let mut p = VxlanParams::default();
    for item in data {
        match item {
            InfoVxlan::Id(vni) => p.vni = vni,
            InfoVxlan::Local(ip) => p.local = Some(ip).filter(|ip| !ip.is_unspecified()),
            InfoVxlan::Link(dev) => p.dev = Some(dev).filter(|&dev| dev != 0),
            InfoVxlan::Port(port) => p.port = port,
            InfoVxlan::Learning(on) => p.learning = on,
            _ => {}
        }
    }
    p
}

fn parse_ipip(data: Vec<InfoIpTunnel>) -> IpipParams {
    let v4 = |ip: IpAddr| match ip {
        IpAddr::V4(v4) if !v4.is_unspecified() => Some(v4),
        _ => None,
    };
    let mut p = IpipParams::default();
    for item in data {
        match item {
            InfoIpTunnel::Local(ip) => p.local = v4(ip),
            InfoIpTunnel::Remote(ip) => p.remote = v4(ip),
            _ => {}
        }
    }
    p
}

fn address_of(msg: &AddressMessage) -> Option<Ipv4Net> {
    // IFA_LOCAL is the interface's own address; IFA_ADDRESS differs from it on point-to-point links.
    let local = msg.attributes.iter().find_map(|a| match a {
        AddressAttribute::Local(IpAddr::V4(ip)) => Some(*ip),
        _ => None,
    })?;
    Ipv4Net::new(local, msg.header.prefix_len).ok()
}

fn parse_boot_route(msg: &RouteMessage) -> Option<Route> {
    let h = &msg.header;
    let ours = h.address_family == AddressFamily::Inet
        && h.table == RouteHeader::RT_TABLE_MAIN
        && h.protocol == RouteProtocol::Boot
        && h.kind == RouteType::Unicast;
    if !ours {
        return None;
    }
    let mut dst = Ipv4Addr::UNSPECIFIED;
    let mut gateway = None;
    let mut oif = None;
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = *ip,
            RouteAttribute::Gateway(RouteAddress::Inet(ip)) => gateway = Some(*ip),
            RouteAttribute::Oif(index) => oif = Some(*index),
            _ => {}
        }
    }
    Some(Route {
        dst: Ipv4Net::new(dst, h.destination_prefix_length).ok()?,
        gateway,
        oif: oif?,
        onlink: h.flags.contains(RouteFlags::Onlink),
    })
}

fn neighbour_fields(msg: &NeighbourMessage) -> (Option<Ipv4Addr>, Option<MacAddr>) {
    let mut ip = None;
    let mut mac = None;
    for attr in &msg.attributes {
        match attr {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => ip = Some(*a),
            // In AF_BRIDGE (fdb) messages the parser can't know the address family of NDA_DST.
            NeighbourAttribute::Destination(NeighbourAddress::Other(bytes)) => {
                ip = <[u8; 4]>::try_from(bytes.as_slice())
                    .ok()
                    .map(Ipv4Addr::from)
            }
            NeighbourAttribute::LinkLayerAddress(bytes) => mac = MacAddr::from_slice(bytes),
            _ => {}
        }
    }
    (ip, mac)
}

/// fdb entries report NUD_PERMANENT together with NUD_NOARP, so test the bit.
fn is_permanent(msg: &NeighbourMessage) -> bool {
    let permanent = u16::from(NeighbourState::Permanent);
    u16::from(msg.header.state) & permanent == permanent
}

fn parse_neighbour(msg: &NeighbourMessage) -> Option<Neighbour> {
    let (ip, mac) = neighbour_fields(msg);
    is_permanent(msg).then_some(Neighbour { ip: ip?, mac: mac? })
}

fn parse_fdb(msg: &NeighbourMessage) -> Option<FdbEntry> {
    let (dst, mac) = neighbour_fields(msg);
    is_permanent(msg).then_some(FdbEntry {
        mac: mac?,
        dst: dst?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_round_trips_in_flannels_format() {
        let mac: MacAddr = "d6:60:f1:85:5a:fc".parse().unwrap();
        assert_eq!(mac.0, [0xd6, 0x60, 0xf1, 0x85, 0x5a, 0xfc]);
        assert_eq!(mac.to_string(), "d6:60:f1:85:5a:fc");
        for bad in [
            "",
            "d6:60:f1:85:5a",
            "d6:60:f1:85:5a:fc:00",
            "d6:60:f1:85:5a:zz",
            "d6:60:f1:85:5a:fcc",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn random_mac_is_unicast_and_locally_administered() {
        for _ in 0..64 {
            let first = MacAddr::random().0[0];
            assert_eq!(first & 0x01, 0, "multicast bit set");
            assert_eq!(first & 0x02, 0x02, "local bit clear");
        }
    }

    #[test]
    fn vxlan_message_omits_port_zero_and_sets_nolearning() {
        let p = VxlanParams {
            vni: 1,
            local: Some(Ipv4Addr::new(10, 200, 0, 1)),
            dev: Some(7),
            port: 0,
            learning: false,
        };
        let msg = vxlan_link_message("flannel.1", &p, 1450, MacAddr([2, 0, 0, 0, 0, 1]));
        let link = parse_link(msg.clone());
        assert_eq!(link.kind, LinkKind::Vxlan(p.clone()));
        assert_eq!((link.name.as_str(), link.mtu), ("flannel.1", 1450));
        assert_eq!(link.mac, Some(MacAddr([2, 0, 0, 0, 0, 1])));
        let has_port = format!("{msg:?}").contains("Port(");
        assert!(!has_port, "port 0 must be left to the kernel");

        let with_port = vxlan_link_message(
            "flannel.1",
            &VxlanParams { port: 4789, ..p },
            1450,
            MacAddr::random(),
        );
        assert!(matches!(
            parse_link(with_port).kind,
            LinkKind::Vxlan(VxlanParams { port: 4789, .. })
        ));
    }

    #[test]
    fn route_message_carries_onlink_gateway_and_proto_boot() {
        let route = Route {
            dst: "10.5.2.0/24".parse().unwrap(),
            gateway: Some(Ipv4Addr::new(10, 5, 2, 0)),
            oif: 4,
            onlink: true,
        };
        let msg = route_message(&route);
        assert_eq!(parse_boot_route(&msg), Some(route));
        assert_eq!(msg.header.scope, RouteScope::Universe);
    }

    #[test]
    fn fdb_entries_parse_with_noarp_state_and_untyped_destination() {
        // As the kernel dumps `bridge fdb ... self permanent` on a vxlan device.
        let mut msg = NeighbourMessage::default();
        msg.header.family = AddressFamily::Bridge;
        msg.header.state = NeighbourState::Other(0xc0);
        msg.attributes = vec![
            NeighbourAttribute::LinkLayerAddress(vec![0xaa, 0xbb, 0xcc, 0, 0, 3]),
            NeighbourAttribute::Destination(NeighbourAddress::Other(vec![10, 200, 0, 3])),
        ];
        let entry = FdbEntry {
            mac: MacAddr([0xaa, 0xbb, 0xcc, 0, 0, 3]),
            dst: Ipv4Addr::new(10, 200, 0, 3),
        };
        assert_eq!(parse_fdb(&msg), Some(entry));
        msg.header.state = NeighbourState::Reachable;
        assert_eq!(parse_fdb(&msg), None, "only permanent entries are ours");
    }
}
