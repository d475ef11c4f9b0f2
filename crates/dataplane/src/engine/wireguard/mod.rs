//! WireGuard in userspace, for kernels without it.

pub mod keys;

pub use keys::{KeyError, PresharedKey, PrivateKey, PublicKey};

/// flannel's default `ListenPort`.
pub const DEFAULT_PORT: u16 = 51820;
