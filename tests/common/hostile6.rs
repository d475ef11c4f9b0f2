//! The IPv6 side of the hostile suite: a dual-stack network of two twill nodes, a dual-stack
//! fake peer that host 0 accepts, and hand-made IPv6 datagrams sent to host 0 from the fake
//! peer's endpoint or a stranger's, over the IPv4 underlay or (with `Backend.Underlay` "ipv6")
//! the IPv6 one. Each is counted under its reason, and only the one good packet reaches host
//! 0's container (a socket there counts what arrives).

use super::cluster::{dual_stack_cluster, Cluster, PREFIX};
use super::{eventually, tcp_transfer6_intact, wait_for_drops};
use anyhow::{ensure, Context, Result};
use ipnet::Ipv4Net;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::Duration;
use twill_dataplane::wire::checksum;
use twill_dataplane::wire::ipv6::{Ipv6Repr, NEXT_HEADER_UDP};
use twill_lab::Proc;

/// The fake peer's underlay address (on host 1's eth0) and its IPv6 subnet: far above the
/// first 100 /64s of fd10::/56 a node draws its own from.
pub const FAKE_IP: &str = "10.200.0.3";
/// The fake peer's PublicIPv6, on host 1's eth0 too.
pub const FAKE_IPV6: &str = "fd00:200::3";
pub const FAKE_SUBNET6: &str = "fd10:0:0:ff::/64";
/// Where the good packets go in host 0's container.
const PORT: u16 = 5001;

/// A running dual-stack network with the fake peer in host 0's table.
pub struct Fake6 {
    pub cluster: Cluster,
    _nodes: [Proc; 2],
    /// The fake peer's IPv4 subnet (its lease key), unheld by the nodes.
    pub subnet: Ipv4Net,
    /// Host 0's container's IPv6 address: every packet is sent to it.
    pub target: Ipv6Addr,
    /// The network's `Backend.Underlay`: which of the fake's addresses datagrams come from.
    underlay: Underlay,
}

/// The family of the network's underlay (`Backend.Underlay`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Underlay {
    Ipv4,
    Ipv6,
}

/// Start two `backend` nodes on a dual-stack network, write the fake peer's lease and wait
/// until host 0 has it.
pub fn fake_dual_stack_peer(
    tag: &str,
    backend: &str,
    lease_fields: &str,
    underlay: Underlay,
) -> Result<Fake6> {
    fake_dual_stack_peer_with(tag, backend, lease_fields, underlay, &[])
}

/// [`fake_dual_stack_peer`] with `args` for both nodes (`--dataplane ebpf`).
pub fn fake_dual_stack_peer_with(
    tag: &str,
    backend: &str,
    lease_fields: &str,
    underlay: Underlay,
    args: &[&str],
) -> Result<Fake6> {
    let family = match underlay {
        Underlay::Ipv4 => "ipv4",
        Underlay::Ipv6 => "ipv6",
    };
    let config = format!(
        r#"{{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/56","Backend":{{"Type":"{backend}","Underlay":"{family}"}}}}"#
    );
    let mut c = dual_stack_cluster(tag, 2, &config)?;
    let nodes = [c.start_with(0, args, &[])?, c.start_with(1, args, &[])?];
    eventually("peers known", || Ok(c.peer_subnets(0)?.len() == 1))?;
    let subnet = c.unheld_subnet()?;
    let key = format!(
        "{PREFIX}/subnets/{}-{}&{}",
        subnet.network(),
        subnet.prefix_len(),
        FAKE_SUBNET6.replace('/', "-")
    );
    let lease = format!(r#"{{"PublicIP":"{FAKE_IP}","PublicIPv6":"{FAKE_IPV6}"{lease_fields}}}"#);
    c.etcd.etcdctl(&["put", &key, &lease])?;
    eventually("host 0 takes the fake peer", || {
        Ok(c.peer_subnets(0)?.len() == 2)
    })?;
    c.add_dual_stack_container(0)?;
    c.add_dual_stack_container(1)?;
    let target = c.container(0).ipv6.context("dual-stack container")?;
    c.lab
        .host(1)
        .ns
        .ip(&["addr", "add", &format!("{FAKE_IP}/24"), "dev", "eth0"])?;
    let ipv6 = format!("{FAKE_IPV6}/64");
    (c.lab.host(1).ns).ip(&["-6", "addr", "add", &ipv6, "dev", "eth0", "nodad"])?;
    Ok(Fake6 {
        cluster: c,
        _nodes: nodes,
        subnet,
        target,
        underlay,
    })
}

impl Fake6 {
    /// Send each datagram to host 0's `port` from the fake peer's endpoint (`true`) or a
    /// stranger's, then check the drops, that exactly `delivered` packets reached the
    /// container, and that TCP over IPv6 still runs both ways.
    pub fn attack(
        &self,
        port: u16,
        datagrams: &[(Vec<u8>, bool)],
        expected: &BTreeMap<&str, u64>,
        delivered: usize,
    ) -> Result<()> {
        let (host0, host1) = (&self.cluster.lab.host(0), &self.cluster.lab.host(1));
        let (to, from): (IpAddr, IpAddr) = match self.underlay {
            Underlay::Ipv4 => (host0.underlay_ip.into(), FAKE_IP.parse()?),
            Underlay::Ipv6 => (
                host0.underlay_ipv6.context("IPv6 underlay")?.into(),
                FAKE_IPV6.parse()?,
            ),
        };
        let to = SocketAddr::new(to, port);
        let container = self.cluster.container(0);
        let arrived = std::thread::scope(|s| -> Result<usize> {
            let receiver = s.spawn(|| container.ns.enter(|| count_arrivals(self.target)));
            std::thread::sleep(Duration::from_millis(200));
            host1.ns.enter(|| -> Result<()> {
                let peer = UdpSocket::bind((from, port))?;
                let stranger = UdpSocket::bind((from, 40000))?;
                for (datagram, from_peer) in datagrams {
                    let socket = if *from_peer { &peer } else { &stranger };
                    socket.send_to(datagram, to)?;
                }
                Ok(())
            })?;
            receiver.join().expect("receiver thread")
        })?;
        wait_for_drops(&host0.ns, expected)?;
        ensure!(
            arrived == delivered,
            "{arrived} packets reached the container, not {delivered}"
        );
        let (a, b) = (self.cluster.container(0), self.cluster.container(1));
        tcp_transfer6_intact(a, b, 8 << 20)?;
        tcp_transfer6_intact(b, a, 8 << 20)
    }

    /// [`ipv6_attack`]'s datagrams on flannel's udp port, each from the fake peer, and the good
    /// one again from a stranger's port: two spoofed, three malformed, one from an unknown
    /// peer, and one delivered.
    pub fn attack_udp_port(&self) -> Result<()> {
        let packets = ipv6_attack(self)?;
        let mut datagrams: Vec<(Vec<u8>, bool)> =
            packets.iter().map(|p| (p.clone(), true)).collect();
        datagrams.push((packets[5].clone(), false));
        let expected =
            BTreeMap::from([("spoofed_source", 2), ("malformed", 3), ("unknown_peer", 1)]);
        self.attack(8285, &datagrams, &expected, 1)
    }

    /// An address in host 1's real IPv6 subnet: a source the fake peer must not use.
    pub fn host1_address(&self) -> Result<Ipv6Addr> {
        let subnet6 = self.cluster.subnet6(1)?;
        Ok(Ipv6Addr::from(u128::from(subnet6.network()) | 9))
    }

    /// A UDP packet to host 0's container with a valid checksum, so the kernel would hand it
    /// to the socket if twill let it through.
    pub fn packet_from(&self, src: Ipv6Addr) -> Vec<u8> {
        udp6(src, self.target, PORT, b"hostile")
    }
}

/// Datagrams on `[target]:5001` until none has come for a second.
fn count_arrivals(target: Ipv6Addr) -> Result<usize> {
    let socket = UdpSocket::bind(SocketAddr::from((target, PORT)))?;
    socket.set_read_timeout(Some(Duration::from_secs(1)))?;
    let mut buf = [0u8; 2048];
    let mut arrived = 0;
    while socket.recv(&mut buf).is_ok() {
        arrived += 1;
        ensure!(arrived < 100, "a flood arrived");
    }
    Ok(arrived)
}

/// IPv6 datagrams on a dual-stack network, each from the fake dual-stack peer or a stranger:
/// a source outside the fake's IPv6 subnet (another node's, or outside the network) is
/// spoofed, a packet that is not one well-formed IPv6 packet is malformed, a good one from a
/// stranger's port is an unknown peer's; only the good one from the fake peer is delivered.
pub fn ipv6_attack(fake: &Fake6) -> Result<[Vec<u8>; 6]> {
    let own = FAKE_SUBNET6.parse::<ipnet::Ipv6Net>()?.network();
    let good = fake.packet_from(std::net::Ipv6Addr::from(u128::from(own) | 9));
    let [truncated, too_long, trailing] = malformed6(&good);
    Ok([
        fake.packet_from(fake.host1_address()?),
        fake.packet_from("2001:db8::9".parse()?),
        truncated,
        too_long,
        trailing,
        good,
    ])
}

/// An IPv6 UDP packet `src` -> `dst`:`port` carrying `payload`, checksums valid.
pub fn udp6(src: Ipv6Addr, dst: Ipv6Addr, port: u16, payload: &[u8]) -> Vec<u8> {
    let repr = Ipv6Repr {
        src,
        dst,
        next_header: NEXT_HEADER_UDP,
        hop_limit: 64,
        payload_len: 8 + payload.len(),
    };
    let mut p = vec![0u8; repr.total_len()];
    repr.emit(&mut p).expect("emit");
    let udp_len = (8 + payload.len()) as u16;
    p[40..42].copy_from_slice(&40000u16.to_be_bytes());
    p[42..44].copy_from_slice(&port.to_be_bytes());
    p[44..46].copy_from_slice(&udp_len.to_be_bytes());
    p[48..].copy_from_slice(payload);
    let sum = !checksum::fold(repr.pseudo_header_sum() + checksum::sum(&p[40..]));
    p[46..48].copy_from_slice(&sum.to_be_bytes());
    p
}

/// The IPv6 packets that are not one well-formed packet: cut inside the header, a payload
/// length past the end, and bytes after it.
pub fn malformed6(good: &[u8]) -> [Vec<u8>; 3] {
    let truncated = good[..30].to_vec();
    let mut too_long = good.to_vec();
    too_long[4..6].copy_from_slice(&500u16.to_be_bytes());
    let mut trailing = good.to_vec();
    trailing.extend_from_slice(&[0; 5]);
    [truncated, too_long, trailing]
}
