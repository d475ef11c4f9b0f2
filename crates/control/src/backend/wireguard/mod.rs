//! flannel's `wireguard` backend: the same config fields, lease data, key file and peers as
//! flanneld's, handed to the kernel's WireGuard over generic netlink where the kernel has it.

mod config;
mod kernel;
pub mod keyfile;
mod peers;

pub use config::WireguardConfig;

use twill_dataplane::engine::wireguard::{PresharedKey, PrivateKey};

/// What the device is configured with.
#[derive(Debug, Clone)]
pub struct DeviceSettings {
    pub private_key: PrivateKey,
    pub listen_port: u16,
    pub psk: Option<PresharedKey>,
    pub keepalive: Option<u16>,
}
