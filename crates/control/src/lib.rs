//! twill's control plane: flannel-compatible leases in etcd (or a static peer list), the
//! subnet.env file, and the backends that turn leases into dataplane tables or kernel state.
//! It knows nothing of packet formats.

pub mod backend;
pub mod backend_kind;
pub mod blackhole;
pub mod config;
pub mod daemon;
pub mod host;
pub mod launch;
pub mod lease;
pub mod lease_check;
pub mod node;
pub mod peers;
pub mod ready;
pub mod registry;
pub mod shown;
pub mod small_file;
pub mod stack;
pub mod status;
pub mod subnet_env;
pub mod traffic;
