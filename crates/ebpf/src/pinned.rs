//! A running dataplane's peers, read through its pins by another process: the bench's scale
//! probe sees a lease's route arrive in (and leave) the maps the programs use, and counts them.

use crate::maps::{addr_of, port_of, Peer, Route};
use crate::peers::route_key;
use anyhow::Context;
use aya::maps::lpm_trie::LpmTrie;
use aya::maps::{HashMap, Map, MapData, MapError};
use ipnet::Ipv4Net;
use std::net::SocketAddrV4;
use std::path::Path;

/// The routes and peers maps pinned in a dataplane's pin directory; only read here.
pub struct PinnedPeers {
    routes: LpmTrie<MapData, u32, Route>,
    peers: HashMap<MapData, u32, Peer>,
}

impl PinnedPeers {
    /// The maps pinned in `pin_dir` (the `--bpf-dir` of a node and its device's name).
    pub fn open(pin_dir: &Path) -> anyhow::Result<PinnedPeers> {
        let open = |name: &str| {
            let path = pin_dir.join(name);
            MapData::from_pin(&path).with_context(|| format!("opening {}", path.display()))
        };
        Ok(PinnedPeers {
            routes: Map::LpmTrie(open("routes")?).try_into()?,
            peers: Map::HashMap(open("peers")?).try_into()?,
        })
    }

    /// Where the programs send a packet for `subnet` (the longest route matching it), if
    /// anywhere.
    pub fn route(&self, subnet: Ipv4Net) -> anyhow::Result<Option<SocketAddrV4>> {
        match self.routes.get(&route_key(subnet.trunc()), 0) {
            Ok(route) => Ok(Some(SocketAddrV4::new(
                addr_of(route.endpoint),
                port_of(route.port),
            ))),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(e).context("looking up the routes map"),
        }
    }

    /// How many routes and how many peers the maps hold.
    pub fn count(&self) -> anyhow::Result<(usize, usize)> {
        let routes = self.routes.keys().try_fold(0, |n, k| k.map(|_| n + 1));
        let peers = self.peers.keys().try_fold(0, |n, k| k.map(|_| n + 1));
        Ok((
            routes.context("listing the routes map")?,
            peers.context("listing the peers map")?,
        ))
    }
}
