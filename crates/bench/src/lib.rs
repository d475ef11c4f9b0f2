//! twill-bench: builds a netns lab per path (native underlay, host-gw, kernel VXLAN and IPIP set
//! up the flannel way, twill udp, batch and wireguard, wireguard-go), runs iperf3, qperf and its
//! own 64-byte flood container to container through each, and reports medians as a table, JSON
//! and a PNG, each path relative to kernel VXLAN and to native. `--measure scale` measures the
//! control plane at thousands of leases instead.

mod addressing;
mod bars;
pub mod endpoints;
pub mod flood;
mod kernel_paths;
mod kind;
pub mod measure;
pub mod parse;
pub mod paths;
pub mod pin;
pub mod plot;
pub mod report;
pub mod run;
pub mod scale;
pub mod stats;
mod wireguard_go;
