//! A twill vxlan node and a host set up exactly as flanneld v0.28.9 sets itself up share one
//! network, whichever way twill writes its own routes: what a flanneld peer sees of twill (the
//! lease, the VTEPs, the VXLAN packets) does not depend on it. Once on an IPv4 network, with
//! flanneld's flannel.1, and once on a dual-stack one, where flanneld also tunnels IPv6 through
//! flannel-v6.1 over the IPv6 underlay and its lease names both subnets in its key.
//! No flanneld binary builds here (one of its modules is refused by the module proxy), so the
//! peer is flanneld's kernel state written with `ip` and `bridge`, as ../shared/reference/
//! flannel.md and flannel's pkg/backend/vxlan give it.

mod common;

use anyhow::{ensure, Context, Result};
use common::cluster::*;
use common::*;
use ipnet::IpNet;
use std::net::IpAddr;
use twill_lab::{Container, Host, Netns};

const VXLAN: &str = r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan"}}"#;
const DUAL_STACK: &str = r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/56","IPv6SubnetLen":64,"Backend":{"Type":"vxlan"}}"#;
/// The flanneld-shaped host's lease. It is in etcd before twill starts, so twill draws its own
/// from the others.
const FLANNEL_SUBNET: &str = "10.5.77.0/24";
const FLANNEL_SUBNET6: &str = "fd10:0:0:77::/64";
/// flanneld's device MTU: the uplink's 1500 less 50, on flannel-v6.1 as on flannel.1 (though
/// VXLAN over IPv6 takes 70).
const FLANNEL_MTU: &str = "1450";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Network {
    Ipv4,
    DualStack,
}

#[test]
fn a_flanneld_shaped_vxlan_peer_and_twill_with_nexthop_objects_share_a_network() -> Result<()> {
    flanneld_peer("vxi", Network::Ipv4, RouteMode::Nexthops)
}

#[test]
fn a_flanneld_shaped_vxlan_peer_and_twill_with_gateway_routes_share_a_network() -> Result<()> {
    flanneld_peer("vxigw", Network::Ipv4, RouteMode::GatewayRoutes)
}

#[test]
fn a_dual_stack_flanneld_shaped_vxlan_peer_and_twill_with_nexthop_objects_share_a_network(
) -> Result<()> {
    flanneld_peer("vxi6", Network::DualStack, RouteMode::Nexthops)
}

#[test]
fn a_dual_stack_flanneld_shaped_vxlan_peer_and_twill_with_gateway_routes_share_a_network(
) -> Result<()> {
    flanneld_peer("vxi6gw", Network::DualStack, RouteMode::GatewayRoutes)
}

/// Host 1 is flanneld's node, host 0 twill's. Each side's lease is read by the other and turned
/// into flanneld's per-peer state; then ping and TCP both ways in each family of the network.
fn flanneld_peer(tag: &str, network: Network, mode: RouteMode) -> Result<()> {
    let mut c = match network {
        Network::Ipv4 => cluster(tag, 2, VXLAN)?,
        Network::DualStack => dual_stack_cluster(tag, 2, DUAL_STACK)?,
    };
    let flannel = flanneld_node(c.lab.host(1), network)?;
    c.etcd.etcdctl(&["put", &flannel.key(), &flannel.value()])?;

    let _twill = c.start_with_env(0, mode.env())?;
    eventually("twill knows the flanneld peer", || {
        Ok(c.peer_subnets(0)? == [flannel.v4.subnet.to_string()])
    })?;
    let twill = twills_lease_as_flanneld_writes_it(&c, network)?;
    // twill lists a peer once it accepts the lease, a moment before it writes the peer's state;
    // a state still wrong when the wait ends fails with what is missing.
    let host0 = &c.lab.host(0).ns;
    let state = || -> Result<()> {
        flannel
            .vteps()
            .try_for_each(|vtep| twills_state_for(host0, vtep, mode))
    };
    eventually("twill's state for flanneld's VTEPs", || Ok(state().is_ok()))
        .or_else(|_| state())?;
    for vtep in twill.vteps() {
        flanneld_writes_for(&c.lab.host(1).ns, vtep)?;
    }

    add_containers(&mut c, network)?;
    let (twills, flannels) = (c.container(0), c.container(1));
    traffic_intact(twills, flannels)?;
    traffic_intact(flannels, twills)
}

/// A container on each host in its node's subnets, dual-stack on a dual-stack network.
fn add_containers(c: &mut Cluster, network: Network) -> Result<()> {
    let flannels = FLANNEL_SUBNET.parse()?;
    match network {
        Network::Ipv4 => {
            c.add_container(0)?;
            c.lab.host_mut(1).add_container(flannels)?;
        }
        Network::DualStack => {
            c.add_dual_stack_container(0)?;
            let flannels6 = FLANNEL_SUBNET6.parse()?;
            c.lab
                .host_mut(1)
                .add_dual_stack_container(flannels, flannels6)?;
        }
    }
    Ok(())
}

/// Ping, then 16 MiB over TCP checked by sha256, to each address `to` has.
fn traffic_intact(from: &Container, to: &Container) -> Result<()> {
    let out = ping(from, to.ip, 2)?;
    ensure!(out.contains("2 received"), "IPv4: {out}");
    tcp_transfer_intact(from, to, 16 << 20)?;
    if let Some(to6) = to.ipv6 {
        let out = ping(from, to6, 2)?;
        ensure!(out.contains("2 received"), "IPv6: {out}");
        tcp_transfer6_intact(from, to, 16 << 20)?;
    }
    Ok(())
}

/// One family's end of a vxlan lease: the subnet, the underlay address its VXLAN arrives at,
/// and the device carrying it with that device's MAC (the lease's VtepMAC).
#[derive(Debug, Clone)]
struct Vtep {
    subnet: IpNet,
    public_ip: IpAddr,
    device: &'static str,
    mac: String,
}

impl Vtep {
    /// `subnet`'s end on `host`, with the MAC its device has now.
    fn on(host: &Host, subnet: IpNet) -> Result<Vtep> {
        let (device, public_ip) = device_for(host, subnet)?;
        Ok(Vtep {
            subnet,
            public_ip,
            device,
            mac: device_mac(&host.ns, device)?,
        })
    }

    /// The subnet as flannel's lease key names it: `10.5.1.0-24`, `fd10:0:0:1::-64`.
    fn key_part(&self) -> String {
        format!("{}-{}", self.subnet.network(), self.subnet.prefix_len())
    }

    /// BackendData (or BackendV6Data), as Go's encoding/json writes flannel's vxlanLeaseAttrs.
    fn backend_data(&self) -> String {
        format!(r#"{{"VNI":1,"VtepMAC":"{}"}}"#, self.mac)
    }
}

/// A vxlan node's lease: its IPv4 end, and its IPv6 end on a dual-stack network.
struct VxlanLease {
    v4: Vtep,
    v6: Option<Vtep>,
}

impl VxlanLease {
    /// `<prefix>/subnets/10.5.1.0-24`, or `…-24&fd10:0:0:1::-64` with an IPv6 end.
    fn key(&self) -> String {
        let parts: Vec<_> = self.vteps().map(Vtep::key_part).collect();
        format!("{PREFIX}/subnets/{}", parts.join("&"))
    }

    /// The value, byte for byte as flanneld writes it (Go's encoding/json of its LeaseAttrs):
    /// PublicIPv6 always present, `null` without an IPv6 end; BackendV6Data only with one.
    fn value(&self) -> String {
        let v4 = &self.v4;
        let (public_ipv6, v6_data) = match &self.v6 {
            Some(v6) => (
                format!("\"{}\"", v6.public_ip),
                format!(r#","BackendV6Data":{}"#, v6.backend_data()),
            ),
            None => ("null".into(), String::new()),
        };
        format!(
            r#"{{"PublicIP":"{}","PublicIPv6":{public_ipv6},"BackendType":"vxlan","BackendData":{}{v6_data}}}"#,
            v4.public_ip,
            v4.backend_data()
        )
    }

    fn vteps(&self) -> impl Iterator<Item = &Vtep> {
        std::iter::once(&self.v4).chain(&self.v6)
    }
}

/// `host` set up as flanneld sets up its node for FLANNEL_SUBNET (and on a dual-stack network
/// FLANNEL_SUBNET6): its devices, and the lease it writes for them.
fn flanneld_node(host: &Host, network: Network) -> Result<VxlanLease> {
    let v4 = flannel_device(host, FLANNEL_SUBNET.parse()?)?;
    let v6 = match network {
        Network::DualStack => Some(flannel_device(host, FLANNEL_SUBNET6.parse()?)?),
        Network::Ipv4 => None,
    };
    Ok(VxlanLease { v4, v6 })
}

/// The device carrying `subnet`'s family on `host`, and the underlay address it tunnels from:
/// flannel.1 over IPv4, flannel-v6.1 over IPv6.
fn device_for(host: &Host, subnet: IpNet) -> Result<(&'static str, IpAddr)> {
    Ok(match subnet {
        IpNet::V4(_) => ("flannel.1", host.underlay_ip.into()),
        IpNet::V6(_) => {
            let ip = host
                .underlay_ipv6
                .context("the host has no IPv6 underlay")?;
            ("flannel-v6.1", ip.into())
        }
    })
}

/// One of flanneld's vxlan devices for its lease's `subnet`, as its newVXLANDevice and
/// Configure make it: VNI 1 from the underlay address on eth0, port 0 (the kernel's 8472),
/// nolearning, MTU 1450, accept_ra off; then the subnet's network address as its only address
/// (/32 or /128), and up.
fn flannel_device(host: &Host, subnet: IpNet) -> Result<Vtep> {
    let (device, local) = device_for(host, subnet)?;
    let address = IpNet::new(subnet.network(), subnet.max_prefix_len())?;
    host.ns.sh(&format!(
        "ip link add {device} mtu {FLANNEL_MTU} type vxlan id 1 local {local} dev eth0 \
           dstport 8472 nolearning && \
         echo 0 > /proc/sys/net/ipv6/conf/{device}/accept_ra && \
         ip addr add {address} dev {device} && ip link set {device} up"
    ))?;
    Vtep::on(host, subnet)
}

fn device_mac(ns: &Netns, device: &str) -> Result<String> {
    let link = ns.ip(&["-j", "link", "show", device])?;
    let link: serde_json::Value = serde_json::from_str(&link)?;
    let mac = link[0]["address"].as_str();
    Ok(mac
        .with_context(|| format!("{device} has no MAC"))?
        .to_string())
}

/// twill's lease in etcd is byte for byte the one flanneld would write for twill's node.
fn twills_lease_as_flanneld_writes_it(c: &Cluster, network: Network) -> Result<VxlanLease> {
    let twill = twill_lease(c, network)?;
    let value = c
        .etcd
        .etcdctl(&["get", "--print-value-only", &twill.key()])?;
    ensure!(
        value.trim() == twill.value(),
        "twill's lease at {}: {value:?}; flanneld writes {}",
        twill.key(),
        twill.value()
    );
    Ok(twill)
}

/// The lease flanneld would write for twill's node (host 0): the subnets in its subnet file,
/// its devices' MACs.
fn twill_lease(c: &Cluster, network: Network) -> Result<VxlanLease> {
    let host = c.lab.host(0);
    let v4 = Vtep::on(host, c.subnet(0)?.into())?;
    let v6 = match network {
        Network::DualStack => Some(Vtep::on(host, c.subnet6(0)?.into())?),
        Network::Ipv4 => None,
    };
    Ok(VxlanLease { v4, v6 })
}

/// What flanneld writes through its device for a peer's `vtep`, in its order (neighbour, fdb,
/// route last so the kernel never resolves the gateway itself): the peer subnet's network
/// address as a permanent neighbour at the VtepMAC, the fdb entry (NeighSet: replace) sending
/// that MAC to the peer's public address, and the onlink route through the network address.
fn flanneld_writes_for(ns: &Netns, vtep: &Vtep) -> Result<()> {
    let Vtep {
        subnet,
        public_ip,
        device,
        mac,
    } = vtep;
    let gateway = subnet.network();
    ns.sh(&format!(
        "ip neigh replace {gateway} lladdr {mac} dev {device} nud permanent && \
         bridge fdb replace {mac} dev {device} dst {public_ip} self permanent && \
         ip route replace {subnet} via {gateway} dev {device} onlink"
    ))?;
    Ok(())
}

/// twill (on `ns`) holds for flanneld's `vtep` what flanneld would: the neighbour, the fdb entry
/// and the onlink route on the device of the VTEP's family, an IPv4 route written as `mode` says.
fn twills_state_for(ns: &Netns, vtep: &Vtep, mode: RouteMode) -> Result<()> {
    let Vtep {
        subnet,
        public_ip,
        device,
        mac,
    } = vtep;
    let gateway = subnet.network();
    let neighbours = ns.ip(&["neigh", "show", "dev", device])?;
    let neighbour = format!("{gateway} lladdr {mac} PERMANENT");
    ensure!(
        neighbours.contains(&neighbour),
        "{neighbour:?} not in\n{neighbours}"
    );
    let fdb = ns.exec("bridge", &["fdb", "show", "dev", device])?;
    let entry = format!("{mac} dst {public_ip} self permanent");
    ensure!(fdb.contains(&entry), "{entry:?} not in\n{fdb}");
    // twill's nexthop ids number IPv4 subnets: its IPv6 routes are gateway routes either way.
    let (family, mode) = match subnet {
        IpNet::V4(_) => ("-4", mode),
        IpNet::V6(_) => ("-6", RouteMode::GatewayRoutes),
    };
    let routes = ns.ip(&[family, "route", "show", &subnet.to_string()])?;
    let through = format!("via {gateway} dev {device} ");
    ensure!(
        routes.contains(&through) && routes.contains(" onlink") && mode.shows_in(&routes),
        "{mode:?}: no route {subnet} {through}onlink in\n{routes}"
    );
    Ok(())
}
