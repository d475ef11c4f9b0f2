//! Nexthop objects on the wire (linux/nexthop.h): `struct nhmsg` and the NHA_* attributes
//! twill reads and writes, as `ip nexthop` sends them. netlink-packet-route (0.34) has no
//! nexthop messages, so they are built here on netlink-packet-core, and [`RtnlMessage`] carries
//! them beside rtnetlink's own messages on one socket.

use std::net::Ipv4Addr;

use netlink_packet_core::{
    emit_u32, parse_u32, DecodeError, DefaultNla, Emitable, NetlinkDeserializable, NetlinkHeader,
    NetlinkPayload, NetlinkSerializable, Nla, NlaBuffer, NlasIterator, Parseable,
    ParseableParametrized,
};
use netlink_packet_route::RouteNetlinkMessage;

pub const RTM_NEWNEXTHOP: u16 = 104;
pub const RTM_DELNEXTHOP: u16 = 105;
pub const RTM_GETNEXTHOP: u16 = 106;

const NHA_ID: u16 = 1;
const NHA_OIF: u16 = 5;
const NHA_GATEWAY: u16 = 6;

/// `nh_flags`: the gateway is on the link whatever its address (`onlink`).
pub const RTNH_F_ONLINK: u32 = 4;
const AF_INET: u8 = libc::AF_INET as u8;
/// `struct nhmsg`: family, scope, protocol, a reserved byte, flags.
const HEADER_LEN: usize = 8;

/// `struct nhmsg`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NexthopHeader {
    pub family: u8,
    pub scope: u8,
    /// Who made it (an RTPROT_* value): how twill tells its own nexthops from others'.
    pub protocol: u8,
    pub flags: u32,
}

impl NexthopHeader {
    fn parse(buf: &[u8]) -> Result<Self, DecodeError> {
        let header = buf
            .get(..HEADER_LEN)
            .ok_or_else(|| DecodeError::from(format!("nhmsg of {} bytes", buf.len())))?;
        Ok(NexthopHeader {
            family: header[0],
            scope: header[1],
            protocol: header[2],
            flags: parse_u32(&header[4..8])?,
        })
    }

    fn emit(&self, buf: &mut [u8]) {
        buf[..4].copy_from_slice(&[self.family, self.scope, self.protocol, 0]);
        emit_u32(&mut buf[4..8], self.flags).expect("4 bytes");
    }
}

/// The NHA_* attributes of a single-gateway IPv4 nexthop; any other kept as it came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NexthopAttribute {
    Id(u32),
    Oif(u32),
    Gateway(Ipv4Addr),
    Other(DefaultNla),
}

impl Nla for NexthopAttribute {
    fn value_len(&self) -> usize {
        match self {
            NexthopAttribute::Id(_) | NexthopAttribute::Oif(_) | NexthopAttribute::Gateway(_) => 4,
            NexthopAttribute::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            NexthopAttribute::Id(_) => NHA_ID,
            NexthopAttribute::Oif(_) => NHA_OIF,
            NexthopAttribute::Gateway(_) => NHA_GATEWAY,
            NexthopAttribute::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buf: &mut [u8]) {
        match self {
            NexthopAttribute::Id(v) | NexthopAttribute::Oif(v) => {
                emit_u32(buf, *v).expect("4 bytes")
            }
            NexthopAttribute::Gateway(ip) => buf[..4].copy_from_slice(&ip.octets()),
            NexthopAttribute::Other(nla) => nla.emit_value(buf),
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for NexthopAttribute {
    fn parse(buf: &NlaBuffer<&'a T>) -> Result<Self, DecodeError> {
        let value = buf.value();
        Ok(match buf.kind() {
            NHA_ID => NexthopAttribute::Id(parse_u32(value)?),
            NHA_OIF => NexthopAttribute::Oif(parse_u32(value)?),
            // An IPv6 gateway (16 bytes) is not one of ours: kept as it came.
            NHA_GATEWAY if value.len() == 4 => {
                let octets: [u8; 4] = value.try_into().expect("4 bytes");
                NexthopAttribute::Gateway(Ipv4Addr::from(octets))
            }
            _ => NexthopAttribute::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// An `nhmsg` with its attributes: the body of RTM_{NEW,DEL,GET}NEXTHOP.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NexthopMessage {
    pub header: NexthopHeader,
    pub attributes: Vec<NexthopAttribute>,
}

impl NexthopMessage {
    /// `ip nexthop add id <id> via <gateway> dev <oif> [onlink] protocol <protocol>`.
    pub fn gateway(id: u32, gateway: Ipv4Addr, oif: u32, onlink: bool, protocol: u8) -> Self {
        NexthopMessage {
            header: NexthopHeader {
                family: AF_INET,
                protocol,
                flags: if onlink { RTNH_F_ONLINK } else { 0 },
                ..NexthopHeader::default()
            },
            attributes: vec![
                NexthopAttribute::Id(id),
                NexthopAttribute::Gateway(gateway),
                NexthopAttribute::Oif(oif),
            ],
        }
    }

    /// `ip nexthop del id <id>`, and the request for that one nexthop (`ip nexthop get id`).
    pub fn id(id: u32) -> Self {
        NexthopMessage {
            header: NexthopHeader::default(),
            attributes: vec![NexthopAttribute::Id(id)],
        }
    }

    fn parse(buf: &[u8]) -> Result<Self, DecodeError> {
        let header = NexthopHeader::parse(buf)?;
        let attributes = NlasIterator::new(&buf[HEADER_LEN..])
            .map(|nla| NexthopAttribute::parse(&nla?))
            .collect::<Result<_, _>>()?;
        Ok(NexthopMessage { header, attributes })
    }
}

impl Emitable for NexthopMessage {
    fn buffer_len(&self) -> usize {
        HEADER_LEN + self.attributes.as_slice().buffer_len()
    }

    fn emit(&self, buf: &mut [u8]) {
        self.header.emit(buf);
        self.attributes.as_slice().emit(&mut buf[HEADER_LEN..]);
    }
}

/// What the batch socket carries: rtnetlink's messages, and the nexthop messages it lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RtnlMessage {
    Route(RouteNetlinkMessage),
    NewNexthop(NexthopMessage),
    DelNexthop(NexthopMessage),
    GetNexthop(NexthopMessage),
}

impl RtnlMessage {
    fn nexthop(&self) -> Option<&NexthopMessage> {
        match self {
            RtnlMessage::Route(_) => None,
            RtnlMessage::NewNexthop(m)
            | RtnlMessage::DelNexthop(m)
            | RtnlMessage::GetNexthop(m) => Some(m),
        }
    }
}

impl NetlinkSerializable for RtnlMessage {
    fn message_type(&self) -> u16 {
        match self {
            RtnlMessage::Route(m) => m.message_type(),
            RtnlMessage::NewNexthop(_) => RTM_NEWNEXTHOP,
            RtnlMessage::DelNexthop(_) => RTM_DELNEXTHOP,
            RtnlMessage::GetNexthop(_) => RTM_GETNEXTHOP,
        }
    }

    fn buffer_len(&self) -> usize {
        match (self, self.nexthop()) {
            (_, Some(m)) => m.buffer_len(),
            (RtnlMessage::Route(m), None) => Emitable::buffer_len(m),
            _ => unreachable!("a route message has no nexthop"),
        }
    }

    fn serialize(&self, buf: &mut [u8]) {
        match (self, self.nexthop()) {
            (_, Some(m)) => m.emit(buf),
            (RtnlMessage::Route(m), None) => m.emit(buf),
            _ => unreachable!("a route message has no nexthop"),
        }
    }
}

impl NetlinkDeserializable for RtnlMessage {
    type Error = DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, DecodeError> {
        Ok(match header.message_type {
            RTM_NEWNEXTHOP => RtnlMessage::NewNexthop(NexthopMessage::parse(payload)?),
            RTM_DELNEXTHOP => RtnlMessage::DelNexthop(NexthopMessage::parse(payload)?),
            RTM_GETNEXTHOP => RtnlMessage::GetNexthop(NexthopMessage::parse(payload)?),
            kind => RtnlMessage::Route(RouteNetlinkMessage::parse_with_param(payload, kind)?),
        })
    }
}

impl From<RtnlMessage> for NetlinkPayload<RtnlMessage> {
    fn from(message: RtnlMessage) -> Self {
        NetlinkPayload::InnerMessage(message)
    }
}

impl From<RouteNetlinkMessage> for RtnlMessage {
    fn from(message: RouteNetlinkMessage) -> Self {
        RtnlMessage::Route(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::{
        NetlinkMessage, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE,
        NLM_F_REQUEST,
    };

    /// As twill sends it, with the sequence number `ip` used, so the bytes compare whole.
    fn wire(message: RtnlMessage, flags: u16) -> Vec<u8> {
        let mut message = NetlinkMessage::from(message);
        message.header.flags = flags;
        message.header.sequence_number = 0x6b07_a960;
        message.finalize();
        let mut buf = vec![0; message.buffer_len()];
        message.serialize(&mut buf);
        buf
    }

    // The bytes below are what iproute2 6.1 sent on this kernel, captured with
    // `strace -f -e trace=sendmsg -e write=3 -xx ip nexthop ...` in a scratch namespace where
    // flannel.1 had index 5 and eth0 index 4.

    #[test]
    fn an_onlink_nexthop_is_what_ip_nexthop_add_sends() {
        // ip nexthop add id 1946157058 via 10.5.2.0 dev flannel.1 onlink
        let ip = [
            0x30, 0x00, 0x00, 0x00, 0x68, 0x00, 0x05, 0x06, 0x60, 0xa9, 0x07, 0x6b, 0x00, 0x00,
            0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x08, 0x00, 0x01, 0x00,
            0x02, 0x00, 0x00, 0x74, 0x08, 0x00, 0x06, 0x00, 0x0a, 0x05, 0x02, 0x00, 0x08, 0x00,
            0x05, 0x00, 0x05, 0x00, 0x00, 0x00,
        ];
        let msg = NexthopMessage::gateway(1946157058, Ipv4Addr::new(10, 5, 2, 0), 5, true, 0);
        let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE;
        assert_eq!(wire(RtnlMessage::NewNexthop(msg), flags), ip);
    }

    #[test]
    fn a_replaced_nexthop_with_a_protocol_is_what_ip_nexthop_replace_sends() {
        // ip nexthop replace id 1946157059 via 10.200.0.2 dev eth0 protocol 116
        let ip = [
            0x30, 0x00, 0x00, 0x00, 0x68, 0x00, 0x05, 0x05, 0x60, 0xa9, 0x07, 0x6b, 0x00, 0x00,
            0x00, 0x00, 0x02, 0x00, 0x74, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0x00, 0x01, 0x00,
            0x03, 0x00, 0x00, 0x74, 0x08, 0x00, 0x06, 0x00, 0x0a, 0xc8, 0x00, 0x02, 0x08, 0x00,
            0x05, 0x00, 0x04, 0x00, 0x00, 0x00,
        ];
        let msg = NexthopMessage::gateway(1946157059, Ipv4Addr::new(10, 200, 0, 2), 4, false, 116);
        let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_REPLACE | NLM_F_CREATE;
        assert_eq!(wire(RtnlMessage::NewNexthop(msg), flags), ip);
    }

    #[test]
    fn a_delete_is_what_ip_nexthop_del_sends() {
        // ip nexthop del id 1946157059
        let ip = [
            0x20, 0x00, 0x00, 0x00, 0x69, 0x00, 0x05, 0x00, 0x60, 0xa9, 0x07, 0x6b, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0x00, 0x01, 0x00,
            0x03, 0x00, 0x00, 0x74,
        ];
        let msg = RtnlMessage::DelNexthop(NexthopMessage::id(1946157059));
        assert_eq!(wire(msg, NLM_F_REQUEST | NLM_F_ACK), ip);
    }

    #[test]
    fn a_dump_request_is_what_ip_nexthop_show_sends() {
        // ip nexthop show
        let ip = [
            0x18, 0x00, 0x00, 0x00, 0x6a, 0x00, 0x01, 0x03, 0x60, 0xa9, 0x07, 0x6b, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        ];
        let msg = RtnlMessage::GetNexthop(NexthopMessage::default());
        assert_eq!(wire(msg, NLM_F_REQUEST | NLM_F_DUMP), ip);
    }

    #[test]
    fn a_dumped_nexthop_parses_and_unknown_attributes_are_kept() {
        let mut message = NexthopMessage::gateway(7, Ipv4Addr::new(10, 5, 2, 0), 5, true, 116);
        // NHA_FDB (a flag) and an IPv6 gateway: parsed, not understood.
        let fdb = DefaultNla::new(11, Vec::new());
        let v6 = DefaultNla::new(NHA_GATEWAY, [0xfe, 0x80].repeat(8));
        message.attributes.push(NexthopAttribute::Other(fdb));
        message.attributes.push(NexthopAttribute::Other(v6));
        let mut buf = vec![0; message.buffer_len()];
        message.emit(&mut buf);
        let mut header = NetlinkHeader::default();
        header.message_type = RTM_NEWNEXTHOP;
        let parsed = RtnlMessage::deserialize(&header, &buf).unwrap();
        assert_eq!(parsed, RtnlMessage::NewNexthop(message));
        assert!(RtnlMessage::deserialize(&header, &buf[..5]).is_err());
    }

    #[test]
    fn route_messages_pass_through() {
        use netlink_packet_route::route::RouteMessage;
        let route = RouteNetlinkMessage::NewRoute(RouteMessage::default());
        let bytes = wire(RtnlMessage::Route(route.clone()), NLM_F_REQUEST);
        let parsed = NetlinkMessage::<RtnlMessage>::deserialize(&bytes).unwrap();
        assert_eq!(parsed.payload, NetlinkPayload::InnerMessage(route.into()));
    }
}
