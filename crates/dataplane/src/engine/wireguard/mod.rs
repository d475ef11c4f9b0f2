//! WireGuard in userspace, for kernels without it: boringtun's protocol (handshakes, sessions,
//! anti-replay, timers) driven over twill's batched TUN and UDP I/O, one tunnel per lease.
//!
//! The wire format is WireGuard's own, so a twill node talks to the kernel's WireGuard, to
//! wireguard-go and to another twill alike. The engine's three loops (TUN -> UDP per TUN queue,
//! UDP -> TUN, timers) are plain async fns, declared as directions in [`directions`] and run
//! each on its own thread ([`crate::engine::directions`]).

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
pub use peers::{Sealed, TunnelParams, WgPeer, WgPeerSpec};
pub use send::{DATA_OVERHEAD, HANDSHAKE_INIT_LEN};

use super::directions::Direction;
use super::{Engine, Shared};
use crate::io::{Tun, TunConfig};
use ipnet::Ipv4Net;
use std::io;
use std::net::SocketAddrV4;
use std::sync::Arc;

/// flannel's default `ListenPort`.
pub const DEFAULT_PORT: u16 = 51820;
/// What flannel takes off the underlay MTU for WireGuard: an IPv6 outer header (40, the larger
/// of the two), UDP (8) and WireGuard's data header and tag (32). TUN MTU = underlay - this.
pub const OVERHEAD: usize = 80;

#[derive(Debug, Clone)]
pub struct WgEngineConfig {
    pub tun: TunConfig,
    /// Where to bind: this node's address and ListenPort.
    pub bind: SocketAddrV4,
    pub socket_buffer: usize,
    pub tunnel: TunnelParams,
}

/// A running WireGuard engine. Dropping it stops its threads and removes the TUN.
pub struct WireGuard {
    engine: Engine,
    peering: Peering,
}

impl WireGuard {
    /// Open the TUN and the socket and start forwarding, each loop on its own thread.
    pub fn start(config: WgEngineConfig) -> anyhow::Result<WireGuard> {
        let peers = Arc::new(WgPeers::default());
        let crypto = Arc::new(Crypto::new(config.tunnel));
        let (tun, bind, buffer) = (&config.tun, config.bind, config.socket_buffer);
        let engine = Engine::launch(tun, None, bind.into(), buffer, OVERHEAD, |tun, io| {
            let wg = Wg {
                io: io.clone(),
                peers: peers.clone(),
                crypto,
            };
            directions(tun, &wg)
        })?;
        let peering = Peering::new(peers, engine.table().clone());
        Ok(WireGuard { engine, peering })
    }

    /// Make the peers exactly `specs`: the WireGuard state (a peer whose key changed is
    /// re-keyed) and the routing table the engine's counters hang on. O(K), for a reconcile.
    pub fn set_peers(&self, specs: &[WgPeerSpec]) {
        self.peering.set_all(specs);
    }

    /// Add or update the peer of one lease, touching no other. O(log K).
    pub fn set_peer(&self, spec: &WgPeerSpec) -> Result<(), Refused> {
        self.peering.set(spec)
    }

    /// Remove the peer of one lease. O(log K).
    pub fn remove_peer(&self, subnet: Ipv4Net) {
        self.peering.remove(subnet);
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

/// What every direction of one WireGuard engine shares.
#[derive(Clone)]
pub(crate) struct Wg {
    io: Shared,
    peers: Arc<WgPeers>,
    crypto: Arc<Crypto>,
}

/// TUN -> UDP for each queue, UDP -> TUN, and the timers.
fn directions(tun: &Arc<Tun>, wg: &Wg) -> io::Result<Vec<Direction>> {
    let mut directions = Vec::new();
    for q in 0..tun.queues() {
        let (tun, icmp, wg) = (tun.clone(), tun.writer(q)?, wg.clone());
        directions.push(Direction::new(format!("twill wg{q}>udp"), move || {
            Ok(send::tun_to_udp(tun.reader(q)?, icmp, wg))
        }));
    }
    let (writer, rx) = (tun.writer(0)?, wg.clone());
    directions.push(Direction::new("twill udp>wg", move || {
        Ok(recv::udp_to_tun(rx.io.udp.receiver()?, writer, rx))
    }));
    let timers = wg.clone();
    directions.push(Direction::new("twill wg timers", move || {
        Ok(timers::run(timers))
    }));
    Ok(directions)
}
