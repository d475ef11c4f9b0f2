//! The kernel's paths as flannel's backends set them up, with the `ip` and `bridge` commands
//! they amount to: host-gw, vxlan and ipip, for twill-bench to compare twill with. On a
//! dual-stack lab host-gw and vxlan carry IPv6 as well, set up as twill's dual-stack backends
//! set it up (crates/control/src/backend/host_gw.rs, vxlan.rs): host-gw routes each peer's IPv6
//! subnet via its PublicIPv6, vxlan adds flannel-v6.1 over the IPv6 underlay.

use crate::addressing::{pairs, Family, UNDERLAY_MTU};
use anyhow::{anyhow, Context, Result};
use ipnet::IpNet;
use twill_lab::{Host, Lab};

const VXLAN_DEV: &str = "flannel.1";
/// The IPv6 twin of flannel.1 on a dual-stack lab.
pub(crate) const VXLAN6_DEV: &str = "flannel-v6.1";
/// flannel: iface MTU - 50 (outer IPv4 + UDP + VXLAN + inner Ethernet).
pub(crate) const VXLAN_MTU: u32 = UNDERLAY_MTU - 50;
/// A dual-stack node's, for both devices and the containers: flannel-v6.1's outer IPv6 header
/// is 20 bytes longer, and twill gives every device the smaller MTU so that containers have one
/// for both families (flanneld gives flannel-v6.1 the IPv4 device's 1450, 20 bytes over what
/// one underlay packet holds).
const VXLAN_DUAL_STACK_MTU: u32 = UNDERLAY_MTU - 70;
const IPIP_DEV: &str = "flannel.ipip";
pub(crate) const IPIP_MTU: u32 = UNDERLAY_MTU - 20;

/// flannel's host-gw backend: a plain route to the peer's subnet via its underlay address, in
/// each of `families`.
pub(crate) fn host_gw(lab: &Lab, families: &[Family]) -> Result<()> {
    for &family in families {
        for (i, host, peer) in pairs(lab) {
            let theirs = family.subnet(1 - i).to_string();
            let via = family.underlay_ip(peer)?.to_string();
            host.ns
                .ip(&["route", "add", &theirs, "via", &via, "dev", &host.iface])?;
        }
    }
    Ok(())
}

/// flannel's vxlan backend: a VXLAN device per family of `families` (flannel.1 over IPv4,
/// flannel-v6.1 over IPv6), each set up by [`vxlan_device`]. Returns the containers' MTU.
pub(crate) fn vxlan(lab: &Lab, families: &[Family]) -> Result<u32> {
    let mtu = match families.contains(&Family::V6) {
        true => VXLAN_DUAL_STACK_MTU,
        false => VXLAN_MTU,
    };
    for &family in families {
        vxlan_device(lab, family, mtu)?;
    }
    Ok(mtu)
}

/// One family's VXLAN device (VNI 1, port 8472, nolearning, over that family's underlay
/// address), then per peer a permanent neighbour and fdb entry for its VTEP and an onlink
/// route via its subnet's network address.
fn vxlan_device(lab: &Lab, family: Family, mtu: u32) -> Result<()> {
    let dev = match family {
        Family::V4 => VXLAN_DEV,
        Family::V6 => VXLAN6_DEV,
    };
    for (i, host, _) in pairs(lab) {
        let local = family.underlay_ip(host)?.to_string();
        host.ns.ip(&[
            "link",
            "add",
            dev,
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
        if family == Family::V6 {
            // As flanneld and twill do: no router advertisement through the tunnel configures
            // the host. The slashes let the device's dot through.
            let knob = format!("net/ipv6/conf/{dev}/accept_ra=0");
            host.ns.exec("sysctl", &["-qw", &knob])?;
        }
        device_up(host, dev, mtu, family.device_address(i))?;
    }
    for (i, host, peer) in pairs(lab) {
        let mac = link_mac(peer, dev)?;
        let theirs = family.subnet(1 - i);
        let (net, dst) = (
            theirs.network().to_string(),
            family.underlay_ip(peer)?.to_string(),
        );
        host.ns.ip(&[
            "neigh",
            "replace",
            &net,
            "lladdr",
            &mac,
            "dev",
            dev,
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
                dev,
                "dst",
                &dst,
                "self",
                "permanent",
            ],
        )?;
        onlink_route(host, theirs, &net, dev)?;
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
        device_up(host, IPIP_DEV, IPIP_MTU, Family::V4.device_address(i))?;
    }
    for (i, host, peer) in pairs(lab) {
        let theirs = Family::V4.subnet(1 - i);
        onlink_route(host, theirs, &peer.underlay_ip.to_string(), IPIP_DEV)?;
    }
    Ok(())
}

/// As flannel does for its devices: MTU, the lease's network address (`addr`), up.
fn device_up(host: &Host, dev: &str, mtu: u32, addr: IpNet) -> Result<()> {
    let addr = addr.to_string();
    host.ns.ip(&["link", "set", dev, "mtu", &mtu.to_string()])?;
    host.ns.ip(&["addr", "add", &addr, "dev", dev])?;
    host.ns.ip(&["link", "set", dev, "up"])?;
    Ok(())
}

fn onlink_route(host: &Host, to: IpNet, via: &str, dev: &str) -> Result<()> {
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
