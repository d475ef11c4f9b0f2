//! Properties of the IPv6 path: the packet view never reads outside its buffer, the table's
//! IPv6 longest-prefix match agrees with a linear scan, an inbound IPv6 packet passes exactly
//! when its source lies in the sending peer's IPv6 subnet, and every ICMPv6 error twill writes
//! parses, fits 1280 bytes and carries a valid checksum.

use ipnet::{Ipv4Net, Ipv6Net};
use proptest::prelude::*;
use std::net::{Ipv6Addr, SocketAddrV4};
use std::sync::Arc;
use twill_dataplane::engine::{accept_inbound, route_outbound};
use twill_dataplane::stats::DropReason;
use twill_dataplane::table::{Peer, PeerSpec, PeerTable};
use twill_dataplane::wire::checksum;
use twill_dataplane::wire::icmpv6::{self, Icmpv6Error};
use twill_dataplane::wire::ip::IpPacket;
use twill_dataplane::wire::ipv6::{self, Ipv6Packet, Ipv6Repr, NEXT_HEADER_UDP};

fn packet(src: Ipv6Addr, dst: Ipv6Addr, payload: usize, hop_limit: u8) -> Vec<u8> {
    let repr = Ipv6Repr {
        src,
        dst,
        next_header: NEXT_HEADER_UDP,
        hop_limit,
        payload_len: payload,
    };
    let mut buf = vec![0xab; repr.total_len()];
    repr.emit(&mut buf).unwrap();
    buf
}

fn peer(index: u32, subnet6: Option<Ipv6Net>) -> PeerSpec {
    PeerSpec {
        subnet: Ipv4Net::new((0x0a05_0000 + (index << 8)).into(), 24).unwrap(),
        subnet6,
        endpoint: SocketAddrV4::new((0xc000_0200 + index).into(), 8285).into(),
        version: 1,
    }
}

/// Subnets of lengths 32..=128 under fd00::/8, possibly nested.
fn subnets() -> impl Strategy<Value = Vec<Ipv6Net>> {
    let one = (any::<u128>(), 32u8..=128).prop_map(|(bits, len)| {
        let addr = Ipv6Addr::from((0xfd << 120) | (bits >> 8));
        Ipv6Net::new(addr, len).unwrap().trunc()
    });
    prop::collection::vec(one, 1..24)
}

proptest! {
    #[test]
    fn the_view_never_reads_outside_its_buffer(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let mut bytes = bytes;
        if let Some(first) = bytes.first_mut() {
            *first = 0x60 | (*first & 0x0f);
        }
        if let Ok(ip) = Ipv6Packet::new_checked(&bytes[..]) {
            prop_assert!(ip.total_len() <= bytes.len());
            prop_assert_eq!(ip.packet().len(), ip.total_len());
            let _ = (ip.src_addr(), ip.dst_addr(), ip.payload().len());
        }
        let _ = IpPacket::new_checked(&bytes[..]).map(|ip| ip.packet().len());
    }

    #[test]
    fn ipv6_lookup_is_the_longest_matching_prefix(nets in subnets(), probe in any::<u128>()) {
        let specs: Vec<PeerSpec> = nets
            .iter()
            .enumerate()
            .map(|(i, net)| peer(i as u32, Some(*net)))
            .collect();
        let table = PeerTable::new(&specs);
        // A probe inside one of the subnets half the time.
        let base = nets[probe as usize % nets.len()];
        let host_bits = u128::MAX.checked_shr(u32::from(base.prefix_len())).unwrap_or(0);
        let dst = if probe & 1 == 0 {
            Ipv6Addr::from(u128::from(base.network()) | (probe & host_bits))
        } else {
            Ipv6Addr::from(probe)
        };
        let table_says = table
            .route6(dst)
            .map(|i| table.peers()[i].spec.subnet6.unwrap());
        let mut placed: Vec<Ipv6Net> = Vec::new();
        for net in &nets {
            if !placed.contains(net) {
                placed.push(*net);
            }
        }
        let longest = placed
            .iter()
            .filter(|n| n.contains(&dst))
            .max_by_key(|n| n.prefix_len())
            .copied();
        prop_assert_eq!(table_says, longest);
    }

    #[test]
    fn an_inbound_packet_passes_exactly_from_inside_the_peers_ipv6_subnet(
        src in any::<u128>(),
        inside in any::<bool>(),
        dual in any::<bool>(),
        hop_limit in 0u8..=255,
    ) {
        let subnet6: Ipv6Net = "fd10:0:0:2::/64".parse().unwrap();
        let src = if inside {
            Ipv6Addr::from(u128::from(subnet6.network()) | (src & u128::from(u64::MAX)))
        } else {
            Ipv6Addr::from(src)
        };
        let from = Peer { spec: peer(2, dual.then_some(subnet6)), stats: Arc::default() };
        let mut p = packet(src, "fd10:0:0:1::5".parse().unwrap(), 20, hop_limit);
        let got = accept_inbound(&mut p, &from, 1500);
        let spoofed = !(dual && subnet6.contains(&src));
        let want = if spoofed {
            Err(DropReason::SpoofedSource)
        } else if hop_limit <= 1 {
            Err(DropReason::TtlExceeded)
        } else {
            Ok(())
        };
        prop_assert_eq!(got, want);
        if want.is_ok() {
            prop_assert_eq!(p[7], hop_limit - 1);
        }
    }

    #[test]
    fn outbound_ipv6_goes_to_the_owner_or_is_no_route(low in any::<u64>(), third in 0u16..4) {
        let table = PeerTable::new(&[
            peer(1, Some("fd10:0:0:1::/64".parse().unwrap())),
            peer(2, None),
            peer(3, Some("fd10:0:0:3::/64".parse().unwrap())),
        ]);
        let dst = Ipv6Addr::from((0xfd10_0000_0000_0000u128 | u128::from(third)) << 64 | u128::from(low));
        let mut p = packet("fd10:0:0:9::1".parse().unwrap(), dst, 8, 64);
        let want = match third {
            1 => Ok(0),
            3 => Ok(2),
            _ => Err(DropReason::NoRoute),
        };
        prop_assert_eq!(route_outbound(&mut p, &table), want);
    }

    #[test]
    fn every_icmpv6_error_parses_fits_and_checks(
        payload in 0usize..3000,
        kind in 0u8..3,
        dst in any::<u128>(),
    ) {
        let offender = packet("fd10:0:0:1::2".parse().unwrap(), dst.into(), payload, 9);
        let view = Ipv6Packet::new_checked(&offender[..]).unwrap();
        let error = match kind {
            0 => Icmpv6Error::NoRoute,
            1 => Icmpv6Error::HopLimitExceeded,
            _ => Icmpv6Error::PacketTooBig { mtu: 1400 },
        };
        let mut out = [0u8; icmpv6::MAX_ERROR_LEN];
        let own: Ipv6Addr = "fd10:0:0:7::".parse().unwrap();
        let Some(len) = icmpv6::reply(&view, error, own, &mut out).unwrap() else {
            prop_assert!(Ipv6Addr::from(dst).is_multicast());
            return Ok(());
        };
        let reply = Ipv6Packet::new_checked(&out[..len]).unwrap();
        prop_assert!(len <= 1280);
        prop_assert_eq!(reply.total_len(), len);
        prop_assert_eq!(&reply.payload()[8..], &offender[..(len - 48)]);
        let pseudo = ipv6::pseudo_header_sum(&own, &reply.dst_addr(), 58, reply.payload_len());
        prop_assert_eq!(checksum::fold(pseudo + checksum::sum(reply.payload())), 0xffff);
    }
}
