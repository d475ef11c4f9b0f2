//! twill's userspace dataplanes: packets in, packets out. Knows nothing of etcd.

pub mod wire;
