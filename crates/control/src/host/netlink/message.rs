//! Between the plain values of [`super::state`] and rtnetlink's messages: the messages twill
//! sends, and the parts of the kernel's replies it reads.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{
    InfoData, InfoIpTunnel, InfoKind, InfoTun, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo,
    LinkMessage,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteProtocol, RouteScope,
    RouteType,
};
use netlink_packet_route::AddressFamily;
use rtnetlink::packet_core::Nla;
use rtnetlink::{LinkIpIp, LinkVxlan, RouteMessageBuilder};

use super::nexthop::{NexthopAttribute, NexthopMessage, RTNH_F_ONLINK};
use super::state::*;

/// The message that creates a VXLAN device the way flanneld does.
pub fn vxlan_link_message(name: &str, p: &VxlanParams, mtu: u32, mac: MacAddr) -> LinkMessage {
    let mut b = LinkVxlan::new(name, p.vni).learning(p.learning);
    if p.gbp {
        b = b.gbp();
    }
    if let Some(dev) = p.dev {
        b = b.dev(dev);
    }
    match p.local {
        Some(IpAddr::V4(local)) => b = b.local(local),
        Some(IpAddr::V6(local)) => b = b.local6(local),
        None => {}
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

/// The message that installs `route` as flanneld does (proto boot, scope universe); through
/// its nexthop object, when it has one, as `ip route add <dst> nhid <id>` does.
pub fn route_message(route: &Route) -> RouteMessage {
    let mut msg = RouteMessageBuilder::<IpAddr>::new()
        .protocol(RouteProtocol::Boot)
        .build();
    let dst = route.dst.network();
    msg.header.address_family = family_of(dst);
    msg.header.destination_prefix_length = route.dst.prefix_len();
    msg.attributes.push(RouteAttribute::Destination(dst.into()));
    if let Some(id) = route.nhid {
        // The kernel refuses a gateway or device beside a nexthop id: they are the nexthop's.
        msg.attributes.push(RouteAttribute::NhId(id));
        return msg;
    }
    msg.attributes.push(RouteAttribute::Oif(route.oif));
    match route.gateway {
        Some(gw) => msg.attributes.push(RouteAttribute::Gateway(gw.into())),
        None => msg.header.scope = RouteScope::Link,
    }
    if route.onlink {
        msg.header.flags.insert(RouteFlags::Onlink);
    }
    msg
}

/// The address family of `ip`: which routing and neighbour table an entry for it goes in.
pub(super) fn family_of(ip: IpAddr) -> AddressFamily {
    match ip {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

/// The message that makes `nh`, tagged with `protocol` as its maker.
pub(super) fn nexthop_message(nh: &Nexthop, protocol: u8) -> NexthopMessage {
    NexthopMessage::gateway(nh.id, nh.gateway, nh.oif, nh.onlink, protocol)
}

/// A listed nexthop; `None` without an id (no kernel lists one so).
pub(super) fn parse_nexthop(msg: &NexthopMessage) -> Option<ListedNexthop> {
    let (mut id, mut gateway, mut oif) = (None, None, None);
    for attr in &msg.attributes {
        match attr {
            NexthopAttribute::Id(v) => id = Some(*v),
            NexthopAttribute::Gateway(ip) => gateway = Some(*ip),
            NexthopAttribute::Oif(v) => oif = Some(*v),
            NexthopAttribute::Other(_) => {}
        }
    }
    let id = id?;
    let inet = msg.header.family == libc::AF_INET as u8;
    let single = gateway.zip(oif).filter(|_| inet);
    Some(ListedNexthop {
        id,
        protocol: msg.header.protocol,
        gateway: single.map(|(gateway, oif)| Nexthop {
            id,
            gateway,
            oif,
            onlink: msg.header.flags & RTNH_F_ONLINK != 0,
        }),
    })
}

pub(crate) fn parse_link(msg: LinkMessage) -> Link {
    let mut link = Link {
        index: msg.header.index,
        name: String::new(),
        mtu: 0,
        mac: None,
        kind: LinkKind::Other(None),
        up: msg.header.flags.contains(LinkFlags::Up),
    };
    let (mut infos, mut carrier) = (Vec::new(), false);
    for attr in msg.attributes {
        match attr {
            LinkAttribute::IfName(name) => link.name = name,
            LinkAttribute::Mtu(mtu) => link.mtu = mtu,
            LinkAttribute::Address(bytes) => link.mac = MacAddr::from_slice(&bytes),
            LinkAttribute::LinkInfo(i) => infos = i,
            LinkAttribute::Carrier(on) => carrier = on != 0,
            _ => {}
        }
    }
    link.kind = parse_kind(infos, carrier);
    link
}

/// `carrier`: a TUN has carrier while a process holds a queue of it, whether it is up or down.
pub(super) fn parse_kind(infos: Vec<LinkInfo>, carrier: bool) -> LinkKind {
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
        (Some(InfoKind::Tun), data) => LinkKind::Tun {
            held: data
                .and_then(tun_queues)
                .map_or(carrier, |queues| queues > 0),
        },
        (kind, _) => LinkKind::Other(kind),
    }
}

pub(super) fn parse_vxlan(data: Vec<InfoVxlan>) -> VxlanParams {
    let mut p = VxlanParams::default();
    for item in data {
        match item {
            InfoVxlan::Id(vni) => p.vni = vni,
            InfoVxlan::Local(ip) => {
                p.local = Some(ip.into()).filter(|ip: &IpAddr| !ip.is_unspecified())
            }
            InfoVxlan::Local6(ip) => {
                p.local = Some(ip.into()).filter(|ip: &IpAddr| !ip.is_unspecified())
            }
            InfoVxlan::Link(dev) => p.dev = Some(dev).filter(|&dev| dev != 0),
            InfoVxlan::Port(port) => p.port = port,
            InfoVxlan::Learning(on) => p.learning = on,
            InfoVxlan::Gbp => p.gbp = true,
            _ => {}
        }
    }
    p
}

/// IFLA_TUN_NUM_QUEUES (linux/if_link.h), which netlink-packet-route leaves unparsed: the
/// queues processes hold open on a multi-queue TUN (the kernel reports it for those only).
const IFLA_TUN_NUM_QUEUES: u16 = 8;

fn tun_queues(data: InfoData) -> Option<u32> {
    let InfoData::Tun(items) = data else {
        return None;
    };
    items.iter().find_map(|item| match item {
        InfoTun::Other(nla) if nla.kind() == IFLA_TUN_NUM_QUEUES => {
            let mut value = [0; 4];
            (nla.value_len() == value.len()).then(|| {
                nla.emit_value(&mut value);
                u32::from_ne_bytes(value)
            })
        }
        _ => None,
    })
}

pub(super) fn parse_ipip(data: Vec<InfoIpTunnel>) -> IpipParams {
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

pub(super) fn address_of(msg: &AddressMessage) -> Option<Ipv4Net> {
    // IFA_LOCAL is the interface's own address; IFA_ADDRESS differs from it on point-to-point links.
    let local = msg.attributes.iter().find_map(|a| match a {
        AddressAttribute::Local(IpAddr::V4(ip)) => Some(*ip),
        _ => None,
    })?;
    Ipv4Net::new(local, msg.header.prefix_len).ok()
}

/// An IPv6 address of a link. IPv6 addresses carry IFA_ADDRESS only (no IFA_LOCAL).
pub(super) fn ipv6_address_of(msg: &AddressMessage) -> Option<Ipv6Net> {
    let ip = msg.attributes.iter().find_map(|a| match a {
        AddressAttribute::Address(IpAddr::V6(ip)) => Some(*ip),
        _ => None,
    })?;
    Ipv6Net::new(ip, msg.header.prefix_len).ok()
}

pub(super) fn parse_boot_route(msg: &RouteMessage) -> Option<Route> {
    let h = &msg.header;
    let ours = matches!(h.address_family, AddressFamily::Inet | AddressFamily::Inet6)
        && h.table == RouteHeader::RT_TABLE_MAIN
        && h.protocol == RouteProtocol::Boot
        && h.kind == RouteType::Unicast;
    if !ours {
        return None;
    }
    let mut dst = match h.address_family {
        AddressFamily::Inet => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        _ => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let mut gateway = None;
    let mut oif = None;
    let mut nhid = None;
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = (*ip).into(),
            RouteAttribute::Destination(RouteAddress::Inet6(ip)) => dst = (*ip).into(),
            RouteAttribute::Gateway(RouteAddress::Inet(ip)) => gateway = Some((*ip).into()),
            RouteAttribute::Gateway(RouteAddress::Inet6(ip)) => gateway = Some((*ip).into()),
            RouteAttribute::Oif(index) => oif = Some(*index),
            RouteAttribute::NhId(id) => nhid = Some(*id),
            _ => {}
        }
    }
    // Through a nexthop object, the kernel lists its gateway and device too, unless
    // net.ipv4.nexthop_compat_mode is 0: then the device is unknown here (0) until the
    // nexthop's is filled in from the nexthop list.
    let oif = oif.or(nhid.map(|_| 0))?;
    Some(Route {
        dst: IpNet::new(dst, h.destination_prefix_length).ok()?,
        gateway,
        oif,
        onlink: h.flags.contains(RouteFlags::Onlink),
        nhid,
    })
}

pub(super) fn neighbour_fields(msg: &NeighbourMessage) -> (Option<IpAddr>, Option<MacAddr>) {
    let mut ip = None;
    let mut mac = None;
    for attr in &msg.attributes {
        match attr {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => ip = Some((*a).into()),
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => ip = Some((*a).into()),
            // In AF_BRIDGE (fdb) messages the parser can't know the address family of NDA_DST:
            // its length says it.
            NeighbourAttribute::Destination(NeighbourAddress::Other(bytes)) => {
                ip = untyped_address(bytes)
            }
            NeighbourAttribute::LinkLayerAddress(bytes) => mac = MacAddr::from_slice(bytes),
            _ => {}
        }
    }
    (ip, mac)
}

fn untyped_address(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes)
            .ok()
            .map(|b| Ipv4Addr::from(b).into()),
        16 => <[u8; 16]>::try_from(bytes)
            .ok()
            .map(|b| Ipv6Addr::from(b).into()),
        _ => None,
    }
}

/// fdb entries report NUD_PERMANENT together with NUD_NOARP, so test the bit.
pub(super) fn is_permanent(msg: &NeighbourMessage) -> bool {
    let permanent = u16::from(NeighbourState::Permanent);
    u16::from(msg.header.state) & permanent == permanent
}

pub(super) fn parse_neighbour(msg: &NeighbourMessage) -> Option<Neighbour> {
    let (ip, mac) = neighbour_fields(msg);
    is_permanent(msg).then_some(Neighbour { ip: ip?, mac: mac? })
}

pub(super) fn parse_fdb(msg: &NeighbourMessage) -> Option<FdbEntry> {
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
    fn vxlan_message_omits_port_zero_and_sets_nolearning() {
        let p = VxlanParams {
            vni: 1,
            local: Some(Ipv4Addr::new(10, 200, 0, 1).into()),
            dev: Some(7),
            port: 0,
            learning: false,
            gbp: false,
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
        let gbp = VxlanParams {
            gbp: true,
            learning: true,
            ..p.clone()
        };
        let message = vxlan_link_message("flannel.1", &gbp, 1450, MacAddr::random());
        assert_eq!(parse_link(message).kind, LinkKind::Vxlan(gbp));
        assert!(matches!(
            parse_link(with_port).kind,
            LinkKind::Vxlan(VxlanParams { port: 4789, .. })
        ));
    }

    #[test]
    fn a_tun_is_held_while_a_process_has_a_queue_of_it() {
        use rtnetlink::packet_core::DefaultNla;
        let tun = |queues: Option<u32>, carrier: u8| {
            let mut msg = LinkMessage::default();
            let data = queues.map(|q| {
                let nla = DefaultNla::new(IFLA_TUN_NUM_QUEUES, q.to_ne_bytes().to_vec());
                LinkInfo::Data(InfoData::Tun(vec![InfoTun::Other(nla)]))
            });
            let infos = [LinkInfo::Kind(InfoKind::Tun)].into_iter().chain(data);
            msg.attributes = vec![
                LinkAttribute::LinkInfo(infos.collect()),
                LinkAttribute::Carrier(carrier),
            ];
            parse_link(msg).kind
        };
        // Single-queue TUNs report no queue count: their carrier says it.
        assert_eq!(tun(None, 1), LinkKind::Tun { held: true });
        assert_eq!(tun(None, 0), LinkKind::Tun { held: false });
        assert_eq!(tun(Some(2), 1), LinkKind::Tun { held: true });
        assert_eq!(tun(Some(0), 1), LinkKind::Tun { held: false });
    }

    #[test]
    fn route_message_carries_onlink_gateway_and_proto_boot() {
        let route = Route {
            dst: "10.5.2.0/24".parse().unwrap(),
            gateway: Some(Ipv4Addr::new(10, 5, 2, 0).into()),
            oif: 4,
            onlink: true,
            nhid: None,
        };
        let msg = route_message(&route);
        assert_eq!(parse_boot_route(&msg), Some(route));
        assert_eq!(msg.header.scope, RouteScope::Universe);
    }

    #[test]
    fn a_route_through_a_nexthop_is_what_ip_route_add_nhid_sends() {
        use rtnetlink::packet_core::{
            NetlinkMessage, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST,
        };
        // `ip route add 10.5.2.0/24 nhid 1946157058`, captured as the nexthop messages were
        // (see nexthop.rs); twill only gives the route a gateway and device to read back.
        let ip = [
            0x2c, 0x00, 0x00, 0x00, 0x18, 0x00, 0x05, 0x06, 0x60, 0xa9, 0x07, 0x6b, 0x00, 0x00,
            0x00, 0x00, 0x02, 0x18, 0x00, 0x00, 0xfe, 0x03, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,
            0x08, 0x00, 0x01, 0x00, 0x0a, 0x05, 0x02, 0x00, 0x08, 0x00, 0x1e, 0x00, 0x02, 0x00,
            0x00, 0x74,
        ];
        let route = Route {
            dst: "10.5.2.0/24".parse().unwrap(),
            gateway: Some(Ipv4Addr::new(10, 5, 2, 0).into()),
            oif: 5,
            onlink: true,
            nhid: Some(1946157058),
        };
        let payload = netlink_packet_route::RouteNetlinkMessage::NewRoute(route_message(&route));
        let mut msg = NetlinkMessage::from(payload);
        msg.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE;
        msg.header.sequence_number = 0x6b07_a960;
        msg.finalize();
        let mut buf = vec![0; msg.buffer_len()];
        msg.serialize(&mut buf);
        assert_eq!(buf, ip);
    }

    #[test]
    fn a_route_through_a_nexthop_parses_with_or_without_compat_fields() {
        let route = Route {
            dst: "10.5.2.0/24".parse().unwrap(),
            gateway: None,
            oif: 0,
            onlink: false,
            nhid: Some(9),
        };
        // As sent (and as listed with nexthop_compat_mode 0): the id alone.
        assert_eq!(parse_boot_route(&route_message(&route)), Some(route));
        let mut listed = route_message(&route);
        listed.attributes.push(RouteAttribute::Oif(5));
        listed
            .attributes
            .push(RouteAttribute::Gateway(RouteAddress::Inet(Ipv4Addr::new(
                10, 5, 2, 0,
            ))));
        listed.header.flags = RouteFlags::Onlink;
        let parsed = parse_boot_route(&listed).unwrap();
        assert_eq!((parsed.oif, parsed.onlink, parsed.nhid), (5, true, Some(9)));
    }

    #[test]
    fn listed_nexthops_say_whether_they_are_one_ipv4_gateway() {
        let nh = Nexthop {
            id: 7,
            gateway: Ipv4Addr::new(10, 5, 2, 0),
            oif: 5,
            onlink: true,
        };
        let msg = nexthop_message(&nh, 116);
        let listed = parse_nexthop(&msg).unwrap();
        let want = ListedNexthop {
            id: 7,
            protocol: 116,
            gateway: Some(nh),
        };
        assert_eq!(listed, want);
        let mut group = msg.clone();
        group
            .attributes
            .retain(|a| matches!(a, NexthopAttribute::Id(_)));
        let group = parse_nexthop(&group).unwrap();
        assert_eq!((group.id, group.gateway), (7, None));
        let mut v6 = msg;
        v6.header.family = libc::AF_INET6 as u8;
        assert_eq!(parse_nexthop(&v6).unwrap().gateway, None);
        assert_eq!(parse_nexthop(&NexthopMessage::default()), None);
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
            dst: Ipv4Addr::new(10, 200, 0, 3).into(),
        };
        assert_eq!(parse_fdb(&msg), Some(entry));
        msg.header.state = NeighbourState::Reachable;
        assert_eq!(parse_fdb(&msg), None, "only permanent entries are ours");
    }
}
