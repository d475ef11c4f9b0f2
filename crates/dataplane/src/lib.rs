//! twill's userspace dataplanes: packets in, packets out. Knows nothing of etcd.

pub mod engine;
pub mod icmp_limit;
pub mod io;
pub mod log_limit;
pub mod stats;
pub mod table;
pub mod wire;
