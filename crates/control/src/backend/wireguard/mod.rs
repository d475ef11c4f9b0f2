//! flannel's `wireguard` backend: the same config fields, lease data and key file as
//! flanneld's.

mod config;
pub mod keyfile;

pub use config::WireguardConfig;
