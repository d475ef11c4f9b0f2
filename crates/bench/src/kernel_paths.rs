//! The kernel's paths as flannel's backends set them up, with the `ip` and `bridge` commands
//! they amount to: host-gw, vxlan and ipip, for twill-bench to compare twill with.

use crate::addressing::{pairs, subnet, UNDERLAY_MTU};
use anyhow::{anyhow, Context, Result};
use twill_lab::{Host, Ipv4Net, Lab};

const VXLAN_DEV: &str = "flannel.1";
/// flannel: iface MTU - 50 (outer IPv4 + UDP + VXLAN + inner Ethernet).
pub(crate) const VXLAN_MTU: u32 = UNDERLAY_MTU - 50;
const IPIP_DEV: &str = "flannel.ipip";
pub(crate) const IPIP_MTU: u32 = UNDERLAY_MTU - 20;

/// flannel's host-gw backend: a plain route to the peer's subnet via its underlay address.
pub(crate) fn host_gw(lab: &Lab) -> Result<()> {
    for (i, host, peer) in pairs(lab) {
        let (theirs, via) = (subnet(1 - i).to_string(), peer.underlay_ip.to_string());
        host.ns
            .ip(&["route", "add", &theirs, "via", &via, "dev", &host.iface])?;
    }
    Ok(())
}

/// flannel's vxlan backend: flannel.1 (VNI 1, port 8472, nolearning), then per peer a permanent
/// neighbour and fdb entry for its VTEP and an onlink route via its subnet's network address.
pub(crate) fn vxlan(lab: &Lab) -> Result<()> {
    for (i, host, _) in pairs(lab) {
        let local = host.underlay_ip.to_string();
        host.ns.ip(&[
            "link",
            "add",
            VXLAN_DEV,
            "type",
            "vxlan",
            "id",
            "1",
            "dstport",
            "8472",
            "nolearning",
            "local",
            &local,
            "dev",
            &host.iface,
        ])?;
        device_up(host, VXLAN_DEV, VXLAN_MTU, i)?;
    }
    for (i, host, peer) in pairs(lab) {
        let mac = link_mac(peer, VXLAN_DEV)?;
        let (net, dst) = (
            subnet(1 - i).network().to_string(),
            peer.underlay_ip.to_string(),
        );
        host.ns.ip(&[
            "neigh",
            "replace",
            &net,
            "lladdr",
            &mac,
            "dev",
            VXLAN_DEV,
            "nud",
            "permanent",
        ])?;
        host.ns.exec(
            "bridge",
            &[
                "fdb",
                "append",
                &mac,
                "dev",
                VXLAN_DEV,
                "dst",
                &dst,
                "self",
                "permanent",
            ],
        )?;
        onlink_route(host, subnet(1 - i), &net, VXLAN_DEV)?;
    }
    Ok(())
}

/// flannel's ipip backend: flannel.ipip and an onlink route per peer via its underlay address.
pub(crate) fn ipip(lab: &Lab) -> Result<()> {
    for (i, host, _) in pairs(lab) {
        let local = host.underlay_ip.to_string();
        host.ns
            .ip(&["link", "add", IPIP_DEV, "type", "ipip", "local", &local])
            .map_err(|e| match e.to_string() {
                m if m.contains("Unknown device type") || m.contains("not supported") => {
                    anyhow!("kernel lacks ipip")
                }
                _ => e,
            })?;
        device_up(host, IPIP_DEV, IPIP_MTU, i)?;
    }
    for (i, host, peer) in pairs(lab) {
        onlink_route(host, subnet(1 - i), &peer.underlay_ip.to_string(), IPIP_DEV)?;
    }
    Ok(())
}

/// As flannel does for its devices: MTU, the lease's network address as /32, up.
fn device_up(host: &Host, dev: &str, mtu: u32, i: usize) -> Result<()> {
    let addr = format!("{}/32", subnet(i).network());
    host.ns.ip(&["link", "set", dev, "mtu", &mtu.to_string()])?;
    host.ns.ip(&["addr", "add", &addr, "dev", dev])?;
    host.ns.ip(&["link", "set", dev, "up"])?;
    Ok(())
}

fn onlink_route(host: &Host, to: Ipv4Net, via: &str, dev: &str) -> Result<()> {
    let to = to.to_string();
    host.ns
        .ip(&["route", "replace", &to, "via", via, "dev", dev, "onlink"])?;
    Ok(())
}

fn link_mac(host: &Host, dev: &str) -> Result<String> {
    let json = host.ns.ip(&["-j", "link", "show", "dev", dev])?;
    let links: serde_json::Value = serde_json::from_str(&json)?;
    links[0]["address"]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("no MAC for {dev} in {json}"))
}
