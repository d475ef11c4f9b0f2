//! Where a measurement's clients run and whom they talk to, and the UDP counters read there;
//! shared by the iperf3/qperf measurements and the flood.

use crate::parse;
use anyhow::{bail, Result};
use std::net::{Ipv4Addr, Ipv6Addr};
use twill_lab::Netns;

/// Where the clients run and whom they talk to.
pub struct Endpoints<'a> {
    pub client: &'a Netns,
    pub server: &'a Netns,
    pub server_ip: Ipv4Addr,
    /// The namespace and the device where the underlay leaves the client's host: every
    /// path's datagrams pass its egress (the eBPF programs take theirs at the server's
    /// ingress before any tc filter could count them).
    pub underlay: (&'a Netns, &'a str),
    /// The path's long-running processes (daemons, servers), for the pinned run.
    pub processes: Vec<u32>,
    /// The server's IPv6 side, where the path was set up dual-stack.
    pub ipv6: Option<Ipv6End<'a>>,
}

/// The server's IPv6 address, and the namespace and device where the path's IPv6 reaches the
/// server's host: what arrives there over a run came through the path.
pub struct Ipv6End<'a> {
    pub server_ip: Ipv6Addr,
    pub device: (&'a Netns, &'a str),
}

/// UDP datagrams the client's namespace sent, and those that reached the server's namespace:
/// read by the application, or dropped because its socket was full.
pub(crate) struct UdpCounts {
    sent: u64,
    reached: u64,
}

impl UdpCounts {
    pub(crate) fn take(ends: &Endpoints) -> Result<UdpCounts> {
        let client = ends.client.exec("cat", &["/proc/net/snmp"])?;
        let server = ends.server.exec("cat", &["/proc/net/snmp"])?;
        Ok(UdpCounts {
            sent: parse::snmp_udp(&client, "OutDatagrams")?,
            reached: parse::snmp_udp(&server, "InDatagrams")?
                + parse::snmp_udp(&server, "RcvbufErrors")?,
        })
    }

    /// The share of datagrams sent since `before` that never reached the server's namespace.
    pub(crate) fn path_loss_pct(&self, before: &UdpCounts) -> Result<f64> {
        let sent = self.sent.saturating_sub(before.sent);
        if sent == 0 {
            bail!("the client sent no UDP datagrams");
        }
        let reached = self.reached.saturating_sub(before.reached);
        Ok((100.0 * (1.0 - reached as f64 / sent as f64)).max(0.0))
    }
}
