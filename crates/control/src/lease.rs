//! Lease keys and values, exactly flannel's JSON.
//! TODO(control helper): key parsing/formatting, JSON (de)serialisation, tests.

use ipnet::Ipv4Net;
use std::net::Ipv4Addr;

/// One node's claim on a subnet, as stored at `<prefix>/subnets/<net>-<len>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub subnet: Ipv4Net,
    pub public_ip: Ipv4Addr,
    /// `None` for flannel's udp backend, which writes no BackendType.
    pub backend_type: Option<String>,
    /// Backend-specific data, kept as raw JSON (e.g. vxlan's `{"VNI":1,"VtepMAC":"…"}`).
    pub backend_data: Option<serde_json::Value>,
}
