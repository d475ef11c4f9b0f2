use crate::netns::Netns;
use crate::proc::run;
use anyhow::{ensure, Result};
use ipnet::Ipv4Net;
use std::net::Ipv4Addr;
use std::process::Command;

/// Underlay iface name inside each host, and container iface inside each container.
const ETH: &str = "eth0";
/// Leaves room in the 30-char namespace name for `tw<pid>-<counter>-` and `-h<i>c<j>`.
const MAX_TAG: usize = 8;

/// The shape of a [`Lab`]; `LabSpec { hosts: 3, tag: "mytest".into(), ..Default::default() }`.
#[derive(Debug, Clone)]
pub struct LabSpec {
    pub hosts: usize,
    pub underlay_mtu: u32,
    /// Short test name used in namespace names (first 8 chars kept).
    pub tag: String,
}

impl Default for LabSpec {
    fn default() -> Self {
        LabSpec {
            hosts: 2,
            underlay_mtu: 1500,
            tag: "lab".into(),
        }
    }
}

/// N hosts joined by an underlay 10.200.0.0/24. 2 hosts: one veth pair host1<->host2. More than
/// 2: a bridge namespace holding a Linux bridge, each host's veth plugged into it.
#[derive(Debug)]
pub struct Lab {
    // Drop order: hosts (with their containers) before the bridge they hang on.
    pub hosts: Vec<Host>,
    bridge: Option<Netns>,
}

/// A host namespace with forwarding on; its underlay iface holds `underlay_ip`/24.
#[derive(Debug)]
pub struct Host {
    // Drop order: containers before the host that holds their veth peers.
    containers: Vec<Container>,
    pub ns: Netns,
    pub underlay_ip: Ipv4Addr,
    pub iface: String,
    tag: String,
}

/// A namespace behind a host: `ip`/prefix on `iface`, default route via `gateway`, which sits on
/// `host_iface` in the host namespace.
#[derive(Debug)]
pub struct Container {
    pub ns: Netns,
    pub ip: Ipv4Addr,
    pub gateway: Ipv4Addr,
    pub subnet: Ipv4Net,
    pub iface: String,
    pub host_iface: String,
}

impl Lab {
    pub fn new(spec: LabSpec) -> Result<Lab> {
        ensure!(
            (2..=250).contains(&spec.hosts),
            "a lab needs 2..=250 hosts, got {}",
            spec.hosts
        );
        let tag: String = spec.tag.chars().take(MAX_TAG).collect();
        let hosts = (0..spec.hosts)
            .map(|i| Host::new(&tag, i))
            .collect::<Result<Vec<_>>>()?;
        let mut lab = Lab {
            hosts,
            bridge: None,
        };
        if spec.hosts == 2 {
            let (a, b) = (&lab.hosts[0].ns, &lab.hosts[1].ns);
            veth((a, ETH), (b, ETH), spec.underlay_mtu)?;
        } else {
            lab.bridge = Some(bridge(&tag, &lab.hosts, spec.underlay_mtu)?);
        }
        for host in &lab.hosts {
            host.address_underlay()?;
        }
        Ok(lab)
    }

    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }

    pub fn host_mut(&mut self, i: usize) -> &mut Host {
        &mut self.hosts[i]
    }

    /// The namespace holding the underlay bridge (labs of more than 2 hosts).
    pub fn bridge(&self) -> Option<&Netns> {
        self.bridge.as_ref()
    }
}

impl Host {
    fn new(tag: &str, i: usize) -> Result<Host> {
        let ns = Netns::new(&format!("{tag}-h{}", i + 1))?;
        ns.exec("sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
        Ok(Host {
            containers: Vec::new(),
            ns,
            underlay_ip: Ipv4Addr::new(10, 200, 0, i as u8 + 1),
            iface: ETH.into(),
            tag: format!("{tag}-h{}", i + 1),
        })
    }

    fn address_underlay(&self) -> Result<()> {
        let addr = format!("{}/24", self.underlay_ip);
        self.ns.ip(&["addr", "add", &addr, "dev", &self.iface])?;
        self.ns.ip(&["link", "set", &self.iface, "up"])?;
        Ok(())
    }

    /// Add a container namespace behind this host: veth pair, host side gets the subnet's first
    /// host address (gateway, e.g. 10.5.3.1/24), container side gets the second (10.5.3.2/24) and
    /// a default route via the gateway.
    pub fn add_container(&mut self, subnet: Ipv4Net) -> Result<&Container> {
        ensure!(
            subnet.prefix_len() <= 30,
            "container subnet {subnet} is too small"
        );
        let j = self.containers.len();
        let ns = Netns::new(&format!("{}c{j}", self.tag))?;
        let host_iface = format!("veth{j}");
        veth((&self.ns, &host_iface), (&ns, ETH), 1500)?;
        let first = u32::from(subnet.network());
        let container = Container {
            ns,
            ip: Ipv4Addr::from(first + 2),
            gateway: Ipv4Addr::from(first + 1),
            subnet,
            iface: ETH.into(),
            host_iface,
        };
        container.address(&self.ns)?;
        self.containers.push(container);
        Ok(&self.containers[j])
    }

    pub fn containers(&self) -> &[Container] {
        &self.containers
    }
}

impl Container {
    fn address(&self, host: &Netns) -> Result<()> {
        let len = self.subnet.prefix_len();
        let gateway = format!("{}/{len}", self.gateway);
        host.ip(&["addr", "add", &gateway, "dev", &self.host_iface])?;
        host.ip(&["link", "set", &self.host_iface, "up"])?;
        let ip = format!("{}/{len}", self.ip);
        self.ns.ip(&["addr", "add", &ip, "dev", &self.iface])?;
        self.ns.ip(&["link", "set", &self.iface, "up"])?;
        let gateway = self.gateway.to_string();
        self.ns.ip(&["route", "add", "default", "via", &gateway])?;
        Ok(())
    }
}

/// Created with both ends directly in their namespaces, so nothing shows up in the root one.
fn veth(a: (&Netns, &str), b: (&Netns, &str), mtu: u32) -> Result<()> {
    let mtu = mtu.to_string();
    let (a_ns, a_if) = (a.0.name(), a.1);
    let (b_ns, b_if) = (b.0.name(), b.1);
    run(Command::new("ip").args([
        "link", "add", a_if, "netns", a_ns, "mtu", &mtu, "type", "veth", "peer", "name", b_if,
        "netns", b_ns, "mtu", &mtu,
    ]))?;
    Ok(())
}

fn bridge(tag: &str, hosts: &[Host], mtu: u32) -> Result<Netns> {
    let ns = Netns::new(&format!("{tag}-br"))?;
    ns.ip(&["link", "add", "br0", "type", "bridge"])?;
    for (i, host) in hosts.iter().enumerate() {
        let port = format!("h{}", i + 1);
        veth((&host.ns, &host.iface), (&ns, &port), mtu)?;
        ns.ip(&["link", "set", &port, "master", "br0", "up"])?;
    }
    ns.ip(&["link", "set", "br0", "up"])?;
    Ok(ns)
}
