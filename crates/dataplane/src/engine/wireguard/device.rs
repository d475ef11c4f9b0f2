//! What a WireGuard engine opens besides its `flannel-wg` TUN and socket, before it starts:
//! Mode separate's `flannel-wg-v6` (a TUN and an IPv6 socket of its own), and Mode auto's
//! second socket for `flannel-wg`. Each socket has its own path MTU; the engine's table and
//! counters are shared.

use super::open::Crypto;
use super::peer_map::WgPeers;
use super::{directions, Wg, WgDeviceConfig, WgEngineConfig, OVERHEAD};
use crate::engine::directions::Direction;
use crate::engine::path_mtu::PathMtu;
use crate::engine::Shared;
use crate::io::udp::udp_ip_headers;
use crate::io::{Tun, UdpIo};
use std::io;
use std::net::{Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// A bound socket, before the engine's I/O exists.
pub(super) struct Socket {
    udp: Arc<UdpIo>,
    /// The outer IP and UDP headers of its family.
    headers: usize,
}

impl Socket {
    pub fn bind(at: SocketAddr, buffer: usize) -> anyhow::Result<Socket> {
        Ok(Socket {
            udp: Arc::new(UdpIo::bind(at, buffer)?),
            headers: udp_ip_headers(at.ip()),
        })
    }

    /// The engine's I/O `main` as seen through this socket, with its own path MTU and `own6`
    /// as the source of ICMPv6 errors.
    pub fn shared(self, main: &Shared, own6: Option<Ipv6Addr>) -> Shared {
        Shared {
            udp: self.udp,
            own6,
            path: Arc::new(PathMtu::new(main.mtu + OVERHEAD, self.headers)),
            ..main.clone()
        }
    }
}

/// A second device beside `flannel-wg` (Mode separate's `flannel-wg-v6`): its own TUN,
/// socket, peers and handshake limit, run by the same engine.
pub(super) struct Beside {
    tun: Arc<Tun>,
    socket: Socket,
    address6: Option<Ipv6Addr>,
    pub peers: Arc<WgPeers>,
    crypto: Arc<Crypto>,
}

impl Beside {
    pub fn open(device: &WgDeviceConfig, engine: &WgEngineConfig) -> anyhow::Result<Beside> {
        let socket = Socket::bind(device.bind, engine.socket_buffer)?;
        let tun = Tun::open_dual(&device.tun, device.address6)?;
        Ok(Beside {
            tun: Arc::new(tun),
            socket,
            address6: device.address6,
            peers: Arc::default(),
            crypto: Arc::new(Crypto::new(engine.tunnel.clone(), device.families)),
        })
    }

    /// Its directions, sharing the table and counters of `main`'s.
    pub fn directions(self, main: &Shared) -> io::Result<Vec<Direction>> {
        let wg = Wg {
            io: self.socket.shared(main, self.address6),
            io6: None,
            peers: self.peers,
            crypto: self.crypto,
        };
        directions(&self.tun, &wg, "wg6 ")
    }
}
