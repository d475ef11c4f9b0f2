//! WireGuard in userspace, for kernels without it: boringtun's protocol (handshakes, sessions,
//! anti-replay, timers) driven over twill's batched TUN and UDP I/O, one tunnel per lease and
//! device. Inner packets are IPv4 and, on a dual-stack network, IPv6.
//!
//! The wire format is WireGuard's own, so a twill node talks to the kernel's WireGuard, to
//! wireguard-go and to another twill alike. Each device's three loops (TUN -> UDP per TUN
//! queue, UDP -> TUN, timers) are plain async fns, declared as directions in [`directions`]
//! and run each on its own thread ([`crate::engine::directions`]); flannel's Mode separate
//! has two devices, `flannel-wg` and `flannel-wg-v6`, in one engine.

mod device;
mod flood;
pub mod keys;
mod open;
pub mod pair;
mod peer_map;
mod peering;
mod peers;
mod recv;
mod send;
mod timers;

pub use keys::{KeyError, PresharedKey, PrivateKey, PublicKey};
pub use open::{Crypto, Opened};
pub use peer_map::{KeyTaken, PeerMap, WgPeers};
pub use peering::{Peering, Refused};
pub use peers::{Families, Sealed, TunnelParams, WgPeer, WgPeerSpec};
pub use send::{DATA_OVERHEAD, HANDSHAKE_INIT_LEN};

use super::directions::Direction;
use super::{Engine, Shared};
use crate::io::{Tun, TunConfig};
use device::{Beside, Socket};
use ipnet::Ipv4Net;
use std::io;
use std::net::{Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// flannel's default `ListenPort`.
pub const DEFAULT_PORT: u16 = 51820;
/// What flannel takes off the underlay MTU for WireGuard: an IPv6 outer header (40, the larger
/// of the two), UDP (8) and WireGuard's data header and tag (32). TUN MTU = underlay - this.
pub const OVERHEAD: usize = 80;

/// Which of a node's WireGuard devices: `flannel-wg`, or Mode separate's `flannel-wg-v6`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Device {
    Main,
    V6,
}

/// One WireGuard device: its TUN, the socket its peers send to, the families it carries.
#[derive(Debug, Clone)]
pub struct WgDeviceConfig {
    pub tun: TunConfig,
    /// The TUN's IPv6 address on a dual-stack network (the lease's IPv6 subnet's network
    /// address), the source of the device's ICMPv6 errors.
    pub address6: Option<Ipv6Addr>,
    pub families: Families,
    /// Where to bind: this node's address and the device's listen port.
    pub bind: SocketAddr,
    /// Mode auto's second socket, on the IPv6 underlay (`bind` is then on the IPv4 one): its
    /// peers are reached over either.
    pub bind6: Option<SocketAddr>,
}

#[derive(Debug, Clone)]
pub struct WgEngineConfig {
    /// `flannel-wg`.
    pub main: WgDeviceConfig,
    /// Mode separate's `flannel-wg-v6`, on a dual-stack network.
    pub v6: Option<WgDeviceConfig>,
    pub socket_buffer: usize,
    /// The node's one key, for every device, as flannel's devices share its key file.
    pub tunnel: TunnelParams,
}

/// A running WireGuard engine: one or two devices, forwarding on threads of their own, counted
/// and routed by one table (every lease is a peer in it, with both its subnets). Dropping it
/// stops its threads and removes the TUNs.
pub struct WireGuard {
    engine: Engine,
    peering: Peering,
    /// `flannel-wg-v6`'s peers.
    v6: Option<Arc<WgPeers>>,
}

impl WireGuard {
    /// Open the TUNs and the sockets and start forwarding, each loop on its own thread.
    pub fn start(config: WgEngineConfig) -> anyhow::Result<WireGuard> {
        let buffer = config.socket_buffer;
        let v6 = config.v6.as_ref();
        let v6 = v6.map(|d| Beside::open(d, &config)).transpose()?;
        let peers6 = v6.as_ref().map(|device| device.peers.clone());
        let main = &config.main;
        let socket6 = main.bind6.map(|at| Socket::bind(at, buffer)).transpose()?;
        let peers = Arc::new(WgPeers::default());
        let crypto = Arc::new(Crypto::new(config.tunnel.clone(), main.families));
        let (tun, address6) = (&main.tun, main.address6);
        let engine = Engine::launch(tun, address6, main.bind, buffer, OVERHEAD, |tun, io| {
            let wg = Wg {
                io: io.clone(),
                io6: socket6.map(|socket| socket.shared(io, io.own6)),
                peers: peers.clone(),
                crypto,
            };
            let mut all = directions(tun, &wg, "wg")?;
            if let Some(v6) = v6 {
                all.extend(v6.directions(io)?);
            }
            Ok(all)
        })?;
        let peering = Peering::new(peers, engine.table().clone());
        Ok(WireGuard {
            engine,
            peering,
            v6: peers6,
        })
    }

    /// Make the peers of `device` exactly `specs`: the WireGuard state (a peer whose key changed
    /// is re-keyed) and, for `flannel-wg`, the routing table the engine's counters hang on.
    /// O(K), for a reconcile.
    pub fn set_peers(&self, device: Device, specs: &[WgPeerSpec]) {
        match (device, &self.v6) {
            (Device::Main, _) => self.peering.set_all(specs),
            (Device::V6, Some(peers)) => peers.set(specs),
            (Device::V6, None) => {}
        }
    }

    /// Add or update the peer of one lease on `device`, touching no other. O(log K).
    pub fn set_peer(&self, device: Device, spec: &WgPeerSpec) -> Result<(), Refused> {
        match (device, &self.v6) {
            (Device::Main, _) => self.peering.set(spec),
            (Device::V6, Some(peers)) => Ok(peers.set_peer(spec)?),
            (Device::V6, None) => Err(Refused::NoDevice),
        }
    }

    /// Remove the peer of one lease from `device`. O(log K).
    pub fn remove_peer(&self, device: Device, subnet: Ipv4Net) {
        match (device, &self.v6) {
            (Device::Main, _) => self.peering.remove(subnet),
            (Device::V6, Some(peers)) => {
                peers.remove_peer(subnet);
            }
            (Device::V6, None) => {}
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

/// What every direction of one WireGuard device shares.
#[derive(Clone)]
pub(crate) struct Wg {
    io: Shared,
    /// Mode auto's socket on the IPv6 underlay, beside `io`'s on the IPv4 one.
    io6: Option<Shared>,
    peers: Arc<WgPeers>,
    crypto: Arc<Crypto>,
}

impl Wg {
    /// The I/O that reaches `to`: the socket of its family, where the device has two.
    fn underlay(&self, to: SocketAddr) -> &Shared {
        match (to, &self.io6) {
            (SocketAddr::V6(_), Some(io6)) => io6,
            _ => &self.io,
        }
    }
}

/// TUN -> UDP for each queue, UDP -> TUN for each socket, and the timers, of the device
/// `name`d in its threads' names (`wg`, `wg6 `: Linux keeps 15 bytes of a thread's name).
fn directions(tun: &Arc<Tun>, wg: &Wg, name: &str) -> io::Result<Vec<Direction>> {
    let mut directions = Vec::new();
    for q in 0..tun.queues() {
        let (tun, icmp, wg) = (tun.clone(), tun.writer(q)?, wg.clone());
        directions.push(Direction::new(format!("twill {name}{q}>udp"), move || {
            Ok(send::tun_to_udp(tun.reader(q)?, icmp, wg))
        }));
    }
    let name = name.trim_end();
    for (udp, socket) in std::iter::once(&wg.io).chain(&wg.io6).zip(["udp", "udp6"]) {
        let (udp, writer, rx) = (udp.udp.clone(), tun.writer(0)?, wg.clone());
        directions.push(Direction::new(
            format!("twill {socket}>{name}"),
            move || Ok(recv::udp_to_tun(udp.receiver()?, writer, rx)),
        ));
    }
    let timers = wg.clone();
    directions.push(Direction::new(format!("twill {name} timer"), move || {
        Ok(timers::run(timers))
    }));
    Ok(directions)
}
