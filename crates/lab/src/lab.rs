use crate::netns::Netns;
use crate::proc::run;
use anyhow::{ensure, Result};
use ipnet::{Ipv4Net, Ipv6Net};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
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

/// N hosts joined by an underlay 10.200.0.0/24 (plus fd00:200::/64 after
/// [`Lab::with_ipv6_underlay`]). 2 hosts: one veth pair host1<->host2. More than
/// 2: a bridge namespace holding a Linux bridge, each host's veth plugged into it.
#[derive(Debug)]
pub struct Lab {
    // Drop order: hosts (with their containers) before the bridge they hang on.
    pub hosts: Vec<Host>,
    bridge: Option<Netns>,
}

/// A host namespace with forwarding on; its underlay iface holds `underlay_ip`/24, and
/// `underlay_ipv6`/64 once the lab has an IPv6 underlay.
#[derive(Debug)]
pub struct Host {
    // Drop order: containers before the host that holds their veth peers.
    containers: Vec<Container>,
    pub ns: Netns,
    pub underlay_ip: Ipv4Addr,
    pub underlay_ipv6: Option<Ipv6Addr>,
    pub iface: String,
    tag: String,
}

/// A namespace behind a host: `ip`/prefix on `iface`, default route via `gateway`, which sits on
/// `host_iface` in the host namespace. A dual-stack container has the same over IPv6: `ipv6` in
/// `subnet6`, default route via `gateway6`; the three are all None for an IPv4-only one.
#[derive(Debug)]
pub struct Container {
    pub ns: Netns,
    pub ip: Ipv4Addr,
    pub gateway: Ipv4Addr,
    pub subnet: Ipv4Net,
    pub ipv6: Option<Ipv6Addr>,
    pub gateway6: Option<Ipv6Addr>,
    pub subnet6: Option<Ipv6Net>,
    pub iface: String,
    pub host_iface: String,
}

impl Lab {
    /// A lab of `hosts` hosts on a 1500-byte underlay, its namespaces named after `tag`; says
    /// plainly that it needs root when not run as root.
    pub fn of(tag: &str, hosts: usize) -> Result<Lab> {
        crate::require_root()?;
        Lab::new(LabSpec {
            hosts,
            tag: tag.into(),
            ..Default::default()
        })
    }

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

    /// Gives every host's underlay iface fd00:200::<n>/64 (n as in its 10.200.0.<n>) and turns
    /// IPv6 forwarding on in every host: `Lab::new(spec)?.with_ipv6_underlay()?`.
    pub fn with_ipv6_underlay(mut self) -> Result<Lab> {
        for (i, host) in self.hosts.iter_mut().enumerate() {
            host.address_underlay_ipv6(underlay_ipv6(i))?;
        }
        Ok(self)
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
        // No duplicate address detection on the links added later: a forwarding host solicits
        // neighbours from its link-local address, which would stay tentative for a second or two.
        let no_dad = "net.ipv6.conf.default.accept_dad=0";
        ns.exec("sysctl", &["-qw", "net.ipv4.ip_forward=1", no_dad])?;
        Ok(Host {
            containers: Vec::new(),
            ns,
            underlay_ip: Ipv4Addr::new(10, 200, 0, i as u8 + 1),
            underlay_ipv6: None,
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

    fn address_underlay_ipv6(&mut self, ip: Ipv6Addr) -> Result<()> {
        self.forward_ipv6()?;
        add_address(&self.ns, &self.iface, ip.into(), 64)?;
        self.underlay_ipv6 = Some(ip);
        Ok(())
    }

    /// A host routes IPv6 for its containers and peers once it has any IPv6 address.
    fn forward_ipv6(&self) -> Result<()> {
        // `all` also sets `default`, so veths added later forward too.
        self.ns
            .exec("sysctl", &["-qw", "net.ipv6.conf.all.forwarding=1"])?;
        Ok(())
    }

    /// Add a container namespace behind this host: veth pair, host side gets the subnet's first
    /// host address (gateway, e.g. 10.5.3.1/24), container side gets the second (10.5.3.2/24) and
    /// a default route via the gateway.
    pub fn add_container(&mut self, subnet: Ipv4Net) -> Result<&Container> {
        self.add(subnet, None)
    }

    /// [`Host::add_container`] over both families: the IPv6 side likewise gets `subnet6`'s ::1 on
    /// the host (gateway6) and ::2 in the container (ipv6) with a default route via ::1, and the
    /// host forwards IPv6.
    pub fn add_dual_stack_container(
        &mut self,
        subnet: Ipv4Net,
        subnet6: Ipv6Net,
    ) -> Result<&Container> {
        ensure!(
            subnet6.prefix_len() <= 126,
            "container subnet6 {subnet6} is too small"
        );
        self.forward_ipv6()?;
        self.add(subnet, Some(subnet6))
    }

    fn add(&mut self, subnet: Ipv4Net, subnet6: Option<Ipv6Net>) -> Result<&Container> {
        ensure!(
            subnet.prefix_len() <= 30,
            "container subnet {subnet} is too small"
        );
        let j = self.containers.len();
        let ns = Netns::new(&format!("{}c{j}", self.tag))?;
        let host_iface = format!("veth{j}");
        veth((&self.ns, &host_iface), (&ns, ETH), 1500)?;
        let first = u32::from(subnet.network());
        let first6 = subnet6.map(|s| u128::from(s.network()));
        let container = Container {
            ns,
            ip: Ipv4Addr::from(first + 2),
            gateway: Ipv4Addr::from(first + 1),
            subnet,
            ipv6: first6.map(|f| Ipv6Addr::from(f + 2)),
            gateway6: first6.map(|f| Ipv6Addr::from(f + 1)),
            subnet6,
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
    /// Each family: its gateway on the host side, its ip in the container; then the links go up
    /// and each family's default route goes via its gateway.
    fn address(&self, host: &Netns) -> Result<()> {
        let families = self.families();
        for &(ip, gateway, len) in &families {
            add_address(host, &self.host_iface, gateway, len)?;
            add_address(&self.ns, &self.iface, ip, len)?;
        }
        host.ip(&["link", "set", &self.host_iface, "up"])?;
        self.ns.ip(&["link", "set", &self.iface, "up"])?;
        for &(_, gateway, _) in &families {
            let gateway = gateway.to_string();
            self.ns.ip(&["route", "add", "default", "via", &gateway])?;
        }
        Ok(())
    }

    /// (ip, gateway, prefix length) of each family the container has.
    fn families(&self) -> Vec<(IpAddr, IpAddr, u8)> {
        let v4 = (
            self.ip.into(),
            self.gateway.into(),
            self.subnet.prefix_len(),
        );
        let v6 = match (self.ipv6, self.gateway6, self.subnet6) {
            (Some(ip), Some(gateway), Some(subnet)) => {
                Some((ip.into(), gateway.into(), subnet.prefix_len()))
            }
            _ => None,
        };
        std::iter::once(v4).chain(v6).collect()
    }
}

/// `ip addr add ADDR/LEN dev IFACE`; IPv6 ones with nodad, usable at once rather than tentative
/// for the second or so duplicate address detection takes.
fn add_address(ns: &Netns, iface: &str, addr: IpAddr, len: u8) -> Result<()> {
    let cidr = format!("{addr}/{len}");
    let mut args = vec!["addr", "add", &cidr, "dev", iface];
    if addr.is_ipv6() {
        args.push("nodad");
    }
    ns.ip(&args)?;
    Ok(())
}

/// fd00:200::<n>, the IPv6 twin of host i's 10.200.0.<n>.
fn underlay_ipv6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x200, 0, 0, 0, 0, 0, i as u16 + 1)
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
