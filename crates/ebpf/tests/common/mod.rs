//! Shared pieces of twill-ebpf's tests: crafted frames, and lab hosts running the programs.
#![allow(dead_code)] // each test binary uses its own subset

pub mod engine_model;
pub mod frames;
pub mod mutation;
pub mod test_run;

use anyhow::{Context, Result};
use ipnet::Ipv4Net;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use twill_dataplane::icmp_limit::IcmpLimit;
use twill_ebpf::{AttachMode, Attachment, Dataplane, Opened, Takes, XdpChoice};
use twill_lab::{Host, Lab, LabSpec};

pub const PORT: u16 = 8285;
pub const DEVICE: &str = "flannel0";
/// flannel's udp MTU on a 1500-byte underlay.
pub const DEVICE_MTU: u16 = 1472;

/// A pin directory on a bpffs of its own, removed with everything in it on Drop (the test's
/// cleanup even when it fails).
#[derive(Debug)]
pub struct Pins(pub PathBuf);

impl Pins {
    pub fn new(name: &str) -> Pins {
        Pins(PathBuf::from("/run/twill-ebpf-tests").join(name))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        if let Err(e) = twill_ebpf::remove(&self.0) {
            eprintln!("cleanup: {e:#}");
            // What is still pinned goes with its bpffs: a removal that failed half-way (a test
            // that failed while opening) leaves no mount behind.
            let unmounted = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
            if !unmounted.is_ok_and(|s| s.success()) || std::fs::remove_dir(&self.0).is_err() {
                eprintln!("cleanup: {} left mounted", self.0.display());
            }
        }
    }
}

/// One lab host with twill's dummy device, the network routed to it, and a container.
#[derive(Debug)]
pub struct Node {
    pub pins: Pins,
    pub attachment: Attachment,
    pub subnet: Ipv4Net,
    /// What the node takes, as its peer is told (an eBPF node's lease says super-packets).
    pub takes: Takes,
}

/// The flannel network of the tests; host i owns 10.5.(i+1).0/24.
pub fn subnet_of(i: usize) -> Ipv4Net {
    Ipv4Net::new(Ipv4Addr::new(10, 5, i as u8 + 1, 0), 24).unwrap()
}

/// Two hosts on a veth underlay, each with a container in its subnet and twill's device, to
/// which the network is routed; no programs yet, which will attach as `attach` says.
pub fn lab_pair(tag: &str, attach: AttachMode) -> Result<(Lab, [Node; 2])> {
    let spec = LabSpec {
        hosts: 2,
        tag: tag.into(),
        ..LabSpec::default()
    };
    let mut lab = Lab::new(spec)?;
    let mut nodes = Vec::new();
    for i in 0..2 {
        let subnet = subnet_of(i);
        lab.host_mut(i).add_container(subnet)?;
        let host = lab.host(i);
        add_device(host, subnet)?;
        nodes.push(Node {
            pins: Pins::new(host.ns.name()),
            attachment: Attachment {
                device: DEVICE.into(),
                underlay: host.iface.clone(),
                local_ip: host.underlay_ip,
                local_ip6: None,
                port: PORT,
                attach,
                xdp: XdpChoice::Auto,
                segmenter: true,
                device_ip: Some(subnet.network()),
                device_ip6: None,
                icmp_limit: IcmpLimit::LINUX_DEFAULT,
            },
            subnet,
            takes: Takes::SuperPackets,
        });
    }
    let [a, b]: [Node; 2] = nodes.try_into().expect("two nodes");
    Ok((lab, [a, b]))
}

/// twill's device as the daemon makes it on an IPv4 network: MTU underlay - 28, the lease's
/// network address, taking in its own ICMP errors (accept_local), its IPv6 off (else the
/// kernel's router solicitations would be counted as `no_route`, as the userspace engine
/// counts them), up, and the whole flannel network routed to it. This machine's kernel has no dummy devices
/// (CONFIG_DUMMY is off); an ifb is the same to the programs: Ethernet, no ARP, and what is
/// not redirected is dropped.
fn add_device(host: &Host, subnet: Ipv4Net) -> Result<()> {
    let mtu = DEVICE_MTU.to_string();
    let address = format!("{}/32", subnet.network());
    host.ns
        .ip(&["link", "add", DEVICE, "mtu", &mtu, "type", "ifb"])?;
    host.ns.ip(&["addr", "add", &address, "dev", DEVICE])?;
    let ipv6_off = format!("net.ipv6.conf.{DEVICE}.disable_ipv6=1");
    host.ns.exec("sysctl", &["-q", "-w", &ipv6_off])?;
    // The programs' ICMP errors enter the device from its own address.
    let accept_local = format!("net.ipv4.conf.{DEVICE}.accept_local=1");
    host.ns.exec("sysctl", &["-q", "-w", &accept_local])?;
    host.ns.ip(&["link", "set", DEVICE, "up"])?;
    host.ns
        .ip(&["route", "add", "10.5.0.0/16", "dev", DEVICE])?;
    Ok(())
}

/// Open the dataplane of `node` inside its host's namespace.
pub fn open(host: &Host, node: &Node) -> Result<(Dataplane, Opened)> {
    let (pins, at) = (node.pins.path(), &node.attachment);
    host.ns
        .enter(|| Dataplane::open(pins, at))
        .with_context(|| format!("opening the dataplane in {}", host.ns.name()))
}

/// Open both nodes and give each the other as its peer.
pub fn open_pair(lab: &Lab, nodes: &[Node; 2]) -> Result<[Dataplane; 2]> {
    let mut dataplanes = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let (dataplane, opened) = open(lab.host(i), node)?;
        assert_eq!(opened, Opened::Fresh, "host {i} had nothing pinned");
        let other = &nodes[1 - i];
        let endpoint = SocketAddrV4::new(other.attachment.local_ip, PORT);
        dataplane.set_peer(other.subnet, None, endpoint, other.takes)?;
        dataplanes.push(dataplane);
    }
    Ok(dataplanes
        .try_into()
        .map_err(|_| ())
        .expect("two dataplanes"))
}

/// `ping -c count` from a container to an address; the TTLs of the replies.
pub fn ping(from: &twill_lab::Netns, to: Ipv4Addr, count: u32) -> Result<Vec<u8>> {
    let out = from.exec(
        "ping",
        &[
            "-n",
            "-c",
            &count.to_string(),
            "-i",
            "0.2",
            "-W",
            "2",
            &to.to_string(),
        ],
    )?;
    Ok(out
        .lines()
        .filter_map(|l| l.split("ttl=").nth(1))
        .filter_map(|t| t.split_whitespace().next()?.parse().ok())
        .collect())
}
