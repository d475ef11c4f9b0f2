//! WireGuard in userspace, for kernels without it.

pub mod keys;
mod peers;

pub use keys::{KeyError, PresharedKey, PrivateKey, PublicKey};
pub use peers::{PeerMap, Sealed, TunnelParams, WgPeer, WgPeerSpec, WgPeers};

/// flannel's default `ListenPort`.
pub const DEFAULT_PORT: u16 = 51820;
