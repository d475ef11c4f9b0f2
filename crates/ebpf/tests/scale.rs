//! 60,000 leases are 60,000 peers in the maps: how long filling, listing, counting and
//! emptying them takes (printed; bounded loosely, the machine is shared), a packet counted as
//! its own peer's among them all, and one peer per endpoint address and per IPv6 subnet. The
//! peers are dual-stack: each has an IPv6 subnet too.

mod common;

use anyhow::Result;
use common::frames::{ethernet, udp, Ip, ETH_IP};
use common::{Pins, DEVICE, PORT};
use ipnet::{Ipv4Net, Ipv6Net};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4};
use std::time::{Duration, Instant};
use twill_dataplane::icmp_limit::IcmpLimit;
use twill_ebpf::{
    AttachMode, Attachment, Dataplane, PeerTraffic, Side, Takes, Traffic, Verdict, XdpChoice,
};
use twill_lab::Netns;

const PEERS: u32 = 60_000;

fn peer(i: u32) -> (Ipv4Net, SocketAddrV4) {
    let [_, _, hi, lo] = i.to_be_bytes();
    let subnet = Ipv4Net::new(Ipv4Addr::new(10, hi, lo, 0), 24).unwrap();
    let endpoint = SocketAddrV4::new(Ipv4Addr::new(172, 16, hi, lo), PORT);
    (subnet, endpoint)
}

fn subnet6(i: u32) -> Ipv6Net {
    Ipv6Net::new(Ipv6Addr::new(0xfd10, 0, 0, i as u16, 0, 0, 0, 0), 64).unwrap()
}

#[test]
fn sixty_thousand_peers_fit_and_are_quick() -> Result<()> {
    let ns = Netns::new("ebpf-scale")?;
    ns.ip(&["link", "add", DEVICE, "type", "ifb"])?;
    ns.ip(&["link", "add", "eth0", "type", "ifb"])?;
    let pins = Pins::new(ns.name());
    let at = Attachment {
        device: DEVICE.into(),
        underlay: "eth0".into(),
        local_ip: Ipv4Addr::new(172, 31, 0, 1),
        local_ip6: None,
        port: PORT,
        attach: AttachMode::Auto,
        xdp: XdpChoice::Auto,
        segmenter: false,
        device_ip: None,
        device_ip6: None,
        icmp_limit: IcmpLimit::LINUX_DEFAULT,
    };
    let (dataplane, _) = ns.enter(|| Dataplane::open(pins.path(), &at))?;

    let fill = timed(|| (0..PEERS).try_for_each(|i| set(&dataplane, i)))?;
    let list = timed(|| {
        dataplane
            .peers()
            .map(|p| assert_eq!(p.len(), PEERS as usize))
    })?;
    let count = timed(|| {
        dataplane
            .counters()
            .map(|c| assert_eq!(c.peers.len(), PEERS as usize))
    })?;
    counted_as_its_peers(&dataplane, 40_000)?;
    let empty = timed(|| (0..PEERS).try_for_each(|i| dataplane.remove_peer(peer(i).0)))?;
    eprintln!(
        "{PEERS} peers: set {fill:?}, peers() {list:?}, counters() {count:?}, removed {empty:?}"
    );
    assert!(dataplane.peers()?.is_empty());
    assert!(fill < Duration::from_secs(10), "filling took {fill:?}");
    one_peer_per_endpoint(&dataplane)
}

/// A packet to the `i`-th peer's subnet counts as that peer's traffic and no other's: the
/// counters are read back by slot, and the slots are many.
fn counted_as_its_peers(dataplane: &Dataplane, i: u32) -> Result<()> {
    let (subnet, _) = peer(i);
    let dst = subnet.hosts().nth(4).unwrap();
    let packet = Ip::new(Ipv4Addr::new(10, 255, 255, 2), dst, 17).packet(&udp(4000, 5000, b"one"));
    let sent = dataplane.test_run(Side::Egress, &ethernet(ETH_IP, &packet))?;
    assert_eq!(sent.verdict, Verdict::Redirect);
    let counters = dataplane.counters()?;
    let moved: Vec<_> = counters
        .peers
        .iter()
        .filter(|(_, traffic)| **traffic != PeerTraffic::default())
        .collect();
    let tx = Traffic {
        packets: 1,
        bytes: packet.len() as u64,
    };
    let want = PeerTraffic {
        tx,
        rx: Traffic::default(),
    };
    assert_eq!(moved, vec![(&subnet, &want)]);
    Ok(())
}

/// As in the userspace table: an endpoint belongs to one subnet's peer, and a peer may move.
fn one_peer_per_endpoint(dataplane: &Dataplane) -> Result<()> {
    let ((first, endpoint), (second, moved)) = (peer(1), peer(2));
    dataplane.set_peer(first, Some(subnet6(1)), endpoint, Takes::SuperPackets)?;
    let err = dataplane
        .set_peer(second, None, endpoint, Takes::SuperPackets)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        format!("peer {second} left out: its endpoint {endpoint} belongs to the peer of {first}")
    );
    let err = dataplane
        .set_peer(second, Some(subnet6(1)), moved, Takes::SuperPackets)
        .unwrap_err()
        .to_string();
    let taken = subnet6(1);
    assert_eq!(
        err,
        format!("peer {second} left out: its IPv6 subnet {taken} belongs to the peer of {first}")
    );
    dataplane.set_peer(first, Some(subnet6(3)), moved, Takes::SuperPackets)?;
    dataplane.set_peer(second, Some(subnet6(1)), endpoint, Takes::SuperPackets)?;
    assert_eq!(
        dataplane.peers()?,
        vec![(first, moved.into()), (second, endpoint.into())]
    );
    let subnets6 = dataplane.peer_subnets6();
    assert_eq!(subnets6.get(&first), Some(&subnet6(3)));
    assert_eq!(subnets6.get(&second), Some(&subnet6(1)));
    dataplane.set_peer(second, None, endpoint, Takes::SuperPackets)?;
    assert_eq!(dataplane.peer_subnets6().get(&second), None);
    Ok(())
}

fn set(dataplane: &Dataplane, i: u32) -> Result<()> {
    let (subnet, endpoint) = peer(i);
    dataplane.set_peer(subnet, Some(subnet6(i)), endpoint, Takes::SuperPackets)
}

fn timed(f: impl FnOnce() -> Result<()>) -> Result<Duration> {
    let start = Instant::now();
    f()?;
    Ok(start.elapsed())
}
