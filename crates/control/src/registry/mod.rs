//! Lease registries: etcd (flannel schema) and static.
