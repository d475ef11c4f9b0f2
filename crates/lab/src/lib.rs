//! A network lab on one machine: hosts and containers are network namespaces joined by veth
//! pairs (and a bridge for more than two hosts), plus helpers to run processes inside them, a
//! real etcd, a real kube-apiserver, and a real Kubernetes cluster of nodes with their own
//! containerd and kubelet, and Debian's own kernels booted under QEMU to run commands on
//! ([`guest`]). Everything created here carries the creating pid in its name, is removed on
//! Drop, and is swept by [`cleanup_stale`] once its creator has died.

pub mod certs;
mod cluster;
mod etcd;
pub mod guest;
mod kube;
mod lab;
mod netns;
mod ports;
mod proc;
mod snmp;
mod stale;
mod tcp;
pub mod wireguard_go;

pub use cluster::{Cluster, ClusterSpec, Image, KubeNode, CLUSTER_CIDR, CLUSTER_CIDR6};
pub use etcd::{Etcd, EtcdSetup};
pub use guest::{run_in_guest, run_in_guest_with, GuestRun, GuestSpec, Kernel};
pub use ipnet::{Ipv4Net, Ipv6Net};
// `self::`: the module, not the kube crate.
pub use self::kube::front::{Answer, ApiFront};
pub use self::kube::{kube_part, yaml_documents, KubeApiServer};
pub use lab::{Container, Host, Lab, LabSpec};
pub use netns::Netns;
pub use ports::{free_tcp_port, free_tcp_ports};
pub use proc::Proc;
pub use snmp::snmp_udp;
pub use stale::cleanup_stale;
pub use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
pub use tcp::{tcp_transfer, tcp_transfer_intact, Transfer};
pub use wireguard_go::WireguardGo;

/// Namespaces, veths and setns all need CAP_SYS_ADMIN/CAP_NET_ADMIN; say so instead of letting
/// `ip` fail with a mount error.
pub fn require_root() -> anyhow::Result<()> {
    anyhow::ensure!(
        nix::unistd::geteuid().is_root(),
        "twill-lab needs root (it creates network namespaces and veth pairs); \
         run the tests as root, e.g. `sudo -E cargo test`"
    );
    Ok(())
}
