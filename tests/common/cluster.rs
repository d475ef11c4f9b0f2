//! A lab whose hosts share a real etcd, for control-plane tests.

use super::*;
use anyhow::{Context, Result};
use std::path::PathBuf;
use twill_lab::{Etcd, Ipv4Net, Lab, Proc};

pub const PREFIX: &str = "/coreos.com/network";
pub const UDP_CONFIG: &str = r#"{"Network":"10.5.0.0/16","Backend":{"Type":"udp"}}"#;

/// How a kernel backend (vxlan, host-gw) writes its peers' routes, as the environment of
/// `twill run` sets it: the kernel-state tests run in both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteMode {
    /// Each peer's route through a nexthop object of its own: the default.
    Nexthops,
    /// flanneld's gateway routes (`--no-nexthop-objects`).
    GatewayRoutes,
}

impl RouteMode {
    pub fn env(self) -> &'static [(&'static str, &'static str)] {
        match self {
            RouteMode::Nexthops => &[],
            RouteMode::GatewayRoutes => &[("TWILL_NO_NEXTHOP_OBJECTS", "1")],
        }
    }

    /// Whether `ip route` output of a peer's route shows this mode (`nhid` or not).
    pub fn shows_in(self, routes: &str) -> bool {
        routes.contains(" nhid ") == (self == RouteMode::Nexthops)
    }
}

/// A lab whose first host also runs etcd on its underlay address.
pub struct Cluster {
    pub lab: Lab,
    pub etcd: Etcd,
    pub dir: tempfile::TempDir,
}

pub fn cluster(tag: &str, hosts: usize, config: &str) -> Result<Cluster> {
    cluster_on(Lab::of(tag, hosts)?, config)
}

/// [`cluster`] whose hosts also have an IPv6 underlay (fd00:200::<n>/64 on eth0).
pub fn dual_stack_cluster(tag: &str, hosts: usize, config: &str) -> Result<Cluster> {
    cluster_on(Lab::of(tag, hosts)?.with_ipv6_underlay()?, config)
}

fn cluster_on(lab: Lab, config: &str) -> Result<Cluster> {
    let etcd = Etcd::listening(Some(&lab.host(0).ns), lab.host(0).underlay_ip)?;
    etcd.etcdctl(&["put", &format!("{PREFIX}/config"), config])?;
    Ok(Cluster {
        lab,
        etcd,
        dir: scratch()?,
    })
}

impl Cluster {
    pub fn subnet_file(&self, host: usize) -> PathBuf {
        path_in(&self.dir, &format!("h{host}.env"))
    }

    pub fn start(&self, host: usize) -> Result<Proc> {
        self.start_with_env(host, &[])
    }

    /// [`Cluster::start`] with extra environment variables.
    pub fn start_with_env(&self, host: usize, env: &[(&str, &str)]) -> Result<Proc> {
        self.start_with(host, &[], env)
    }

    /// [`Cluster::start`] with extra flags and environment variables.
    pub fn start_with(&self, host: usize, args: &[&str], env: &[(&str, &str)]) -> Result<Proc> {
        let endpoint = self.etcd.endpoint();
        let mut all = vec!["--etcd-endpoints", &endpoint];
        all.extend_from_slice(args);
        start_twill_with_env(self.lab.host(host), &all, env, &self.subnet_file(host))
    }

    /// The subnet a node wrote to its subnet file (FLANNEL_SUBNET is the first host address).
    pub fn subnet(&self, host: usize) -> Result<Ipv4Net> {
        let text = std::fs::read_to_string(self.subnet_file(host))?;
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("FLANNEL_SUBNET="))
            .context("no FLANNEL_SUBNET")?;
        Ok(line.parse::<Ipv4Net>()?.trunc())
    }

    /// The IPv6 subnet a dual-stack node wrote to its subnet file (FLANNEL_IPV6_SUBNET is its
    /// first host address, as flanneld writes it).
    pub fn subnet6(&self, host: usize) -> Result<twill_lab::Ipv6Net> {
        let text = std::fs::read_to_string(self.subnet_file(host))?;
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("FLANNEL_IPV6_SUBNET="))
            .with_context(|| format!("no FLANNEL_IPV6_SUBNET in\n{text}"))?;
        Ok(line.parse::<twill_lab::Ipv6Net>()?.trunc())
    }

    /// A TUN or eBPF udp node on a dual-stack network carried all it was given without one
    /// drop but the kernel's own: its device keeps IPv6 on, and the host, a router, reports its
    /// all-routers group (MLD to ff02::16, twice by MLD's robustness) into it when it comes up.
    /// No peer owns ff02::16, so those are `no_route` (and never answered: RFC 4443 forbids
    /// errors about multicast).
    pub fn nothing_dropped_but_the_kernels_own(&self) -> Result<()> {
        for host in 0..self.lab.hosts.len() {
            let status = status(&self.lab.host(host).ns)?;
            let counted = status["counters"]["drops"]
                .as_object()
                .context("drop counters")?;
            let unexpected: Vec<_> = counted
                .iter()
                .filter(|(reason, n)| {
                    let allowed = if *reason == "no_route" { 2 } else { 0 };
                    n.as_u64().is_none_or(|n| n > allowed)
                })
                .collect();
            anyhow::ensure!(unexpected.is_empty(), "host {host} dropped: {unexpected:?}");
        }
        Ok(())
    }

    /// A container in each of the node's leased subnets, IPv4 and IPv6.
    pub fn add_dual_stack_container(&mut self, host: usize) -> Result<()> {
        let (subnet, subnet6) = (self.subnet(host)?, self.subnet6(host)?);
        let host = self.lab.host_mut(host);
        host.add_dual_stack_container(subnet, subnet6)?;
        Ok(())
    }

    /// A dual-stack container on hosts 0 and 1, pinged twice each way over both families.
    pub fn dual_stack_containers_ping_each_other(&mut self) -> Result<()> {
        self.add_dual_stack_container(0)?;
        self.add_dual_stack_container(1)?;
        self.dual_stack_containers_reach_each_other()
    }

    /// Hosts 0's and 1's dual-stack containers ping each other twice each way over both
    /// families.
    pub fn dual_stack_containers_reach_each_other(&self) -> Result<()> {
        let (a, b) = (self.container(0), self.container(1));
        for (from, to) in [(a, b), (b, a)] {
            let out = ping(from, to.ip, 2)?;
            anyhow::ensure!(out.contains("2 received"), "IPv4: {out}");
            let out = ping(from, to.ipv6.context("dual-stack container")?, 2)?;
            anyhow::ensure!(out.contains("2 received"), "IPv6: {out}");
        }
        Ok(())
    }

    pub fn lease_key(&self, subnet: Ipv4Net) -> String {
        format!(
            "{PREFIX}/subnets/{}-{}",
            subnet.network(),
            subnet.prefix_len()
        )
    }

    /// A /24 of the 10.5.0.0/16 network that no lease in etcd holds, for a lease a test writes
    /// itself: the nodes draw their subnets at random, so a fixed one is now and then a node's
    /// own, and the test's write then takes that node's lease over.
    pub fn unheld_subnet(&self) -> Result<Ipv4Net> {
        let held = self.etcd.etcdctl(&[
            "get",
            "--prefix",
            "--keys-only",
            &format!("{PREFIX}/subnets/"),
        ])?;
        (1..=254u8)
            .rev()
            .filter_map(|i| Ipv4Net::new(std::net::Ipv4Addr::new(10, 5, i, 0), 24).ok())
            .find(|s| {
                let key = self.lease_key(*s);
                // A dual-stack lease's key goes on with `&` and its IPv6 subnet.
                !held
                    .lines()
                    .any(|k| k == key || k.starts_with(&format!("{key}&")))
            })
            .context("every subnet of 10.5.0.0/16 is held")
    }

    /// Writes `lease` (its JSON) for an [`unheld_subnet`](Cluster::unheld_subnet), as another
    /// node would; the subnet it took.
    pub fn put_unheld_lease(&self, lease: &str) -> Result<Ipv4Net> {
        let unheld = self.unheld_subnet()?;
        self.etcd
            .etcdctl(&["put", &self.lease_key(unheld), lease])?;
        Ok(unheld)
    }

    pub fn add_container(&mut self, host: usize) -> Result<()> {
        let subnet = self.subnet(host)?;
        self.lab.host_mut(host).add_container(subnet)?;
        Ok(())
    }

    pub fn container(&self, host: usize) -> &twill_lab::Container {
        &self.lab.host(host).containers()[0]
    }

    pub fn peer_subnets(&self, host: usize) -> Result<Vec<String>> {
        peer_subnets(&self.lab.host(host).ns)
    }

    /// Start a node that must refuse to run, and return the last line it printed.
    pub fn failing_start(&self, host: usize) -> Result<String> {
        self.failing_start_with_env(host, &[])
    }

    /// [`Cluster::failing_start`] with extra environment variables.
    pub fn failing_start_with_env(&self, host: usize, env: &[(&str, &str)]) -> Result<String> {
        let endpoint = self.etcd.endpoint();
        let file = self.subnet_file(host);
        let args = [
            "run",
            "--etcd-endpoints",
            &endpoint,
            "--iface",
            "eth0",
            "--subnet-file",
            file.to_str().context("path")?,
        ];
        let mut node = spawn_twill(&self.lab.host(host).ns, &args, env)?;
        let stderr =
            node.failure_within(std::time::Duration::from_secs(30), "twill kept running")?;
        Ok(stderr.lines().last().unwrap_or_default().to_string())
    }

    /// Containers on hosts 0 and 1 in their leased subnets; ping, then 64 MiB checked by sha256.
    pub fn traffic_between_two_nodes(&mut self) -> Result<()> {
        self.add_container(0)?;
        self.add_container(1)?;
        eventually("peers known", || Ok(self.peer_subnets(0)?.len() == 1))?;
        let out = ping(self.container(0), self.container(1).ip, 2)?;
        anyhow::ensure!(out.contains("2 received"), "{out}");
        tcp_transfer_intact(self.container(0), self.container(1), 64 << 20)
    }
}
