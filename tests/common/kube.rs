//! A lab whose hosts are Nodes of a real kube-apiserver, for the `--kube-subnet-mgr` tests.
//! There is no kubelet or controller manager: the test creates each host's Node with its
//! podCIDR (or an IPv4 and an IPv6 one), as the node-IPAM controller would.

use super::*;
use anyhow::{Context, Result};
use std::path::PathBuf;
use twill_lab::{Etcd, Ipv4Net, Ipv6Net, KubeApiServer, Lab, Proc};

pub const NETWORK: &str = "10.5.0.0/16";
pub const IPV6_NETWORK: &str = "fd10::/56";
pub const PREFIX: &str = "flannel.alpha.coreos.com";

/// flannel's net-conf.json for one backend, with `extra` Backend fields.
pub fn net_conf(backend: &str, extra: &str) -> String {
    format!(r#"{{"Network":"{NETWORK}","Backend":{{"Type":"{backend}"{extra}}}}}"#)
}

/// A dual-stack net-conf.json for one backend: [`NETWORK`] and [`IPV6_NETWORK`].
pub fn dual_stack_net_conf(backend: &str) -> String {
    format!(
        r#"{{"Network":"{NETWORK}","EnableIPv6":true,"IPv6Network":"{IPV6_NETWORK}","Backend":{{"Type":"{backend}"}}}}"#
    )
}

/// Host `i` is Node `node-i` with podCIDR 10.5.(i+1).0/24 (and fd10:0:0:(i+1)::/64 if made
/// dual-stack). etcd and the API server run on the last host, at its underlay address.
pub struct KubeCluster {
    pub lab: Lab,
    pub api: KubeApiServer,
    pub etcd: Etcd,
    pub dir: tempfile::TempDir,
}

pub fn kube_cluster(tag: &str, hosts: usize, conf: &str) -> Result<KubeCluster> {
    kube_cluster_with(tag, hosts, conf, &[])
}

/// [`kube_cluster`] whose API server runs with the extra flags `api_args`.
pub fn kube_cluster_with(
    tag: &str,
    hosts: usize,
    conf: &str,
    api_args: &[&str],
) -> Result<KubeCluster> {
    kube_cluster_on(Lab::of(tag, hosts)?, hosts, conf, api_args)
}

/// [`kube_cluster`] whose hosts also have an IPv6 underlay (fd00:200::<n>/64 on eth0).
pub fn dual_stack_kube_cluster(tag: &str, hosts: usize, conf: &str) -> Result<KubeCluster> {
    kube_cluster_on(Lab::of(tag, hosts)?.with_ipv6_underlay()?, hosts, conf, &[])
}

fn kube_cluster_on(lab: Lab, hosts: usize, conf: &str, api_args: &[&str]) -> Result<KubeCluster> {
    let control = lab.host(hosts - 1);
    let etcd = Etcd::listening(Some(&control.ns), control.underlay_ip)?;
    let api = KubeApiServer::start_with(Some(&control.ns), control.underlay_ip, &etcd, api_args)?;
    let c = KubeCluster {
        lab,
        api,
        etcd,
        dir: scratch()?,
    };
    c.set_net_conf(conf)?;
    c.api
        .write_kubeconfig(&c.kubeconfig(), c.api.admin_token())?;
    Ok(c)
}

impl KubeCluster {
    pub fn node_name(host: usize) -> String {
        format!("node-{host}")
    }

    pub fn pod_cidr(host: usize) -> Ipv4Net {
        format!("10.5.{}.0/24", host + 1).parse().unwrap()
    }

    pub fn pod_cidr6(host: usize) -> Ipv6Net {
        format!("fd10:0:0:{}::/64", host + 1).parse().unwrap()
    }

    /// Creates host `host`'s Node with its podCIDR.
    pub fn add_node(&self, host: usize) -> Result<()> {
        let cidr = Self::pod_cidr(host).to_string();
        self.api
            .create_node(&Self::node_name(host), Some(&cidr), &[])
    }

    /// A Node annotated as a flanneld udp node would annotate it, at `public_ip`.
    pub fn flannel_node(&self, name: &str, cidr: &str, public_ip: &str) -> Result<()> {
        self.flannel_node_of(name, cidr, public_ip, "", "null")
    }

    /// [`KubeCluster::flannel_node`] with the backend-type and backend-data annotations given.
    pub fn flannel_node_of(
        &self,
        name: &str,
        cidr: &str,
        public_ip: &str,
        backend_type: &str,
        backend_data: &str,
    ) -> Result<()> {
        let managed = format!("{PREFIX}/kube-subnet-manager");
        let ip = format!("{PREFIX}/public-ip");
        let kind = format!("{PREFIX}/backend-type");
        let data = format!("{PREFIX}/backend-data");
        let annotations = [
            (managed.as_str(), "true"),
            (ip.as_str(), public_ip),
            (kind.as_str(), backend_type),
            (data.as_str(), backend_data),
        ];
        self.api.create_node(name, Some(cidr), &annotations)
    }

    /// Creates host `host`'s Node with its IPv4 and IPv6 podCIDRs.
    pub fn add_dual_stack_node(&self, host: usize) -> Result<()> {
        let cidrs = [
            Self::pod_cidr(host).to_string(),
            Self::pod_cidr6(host).to_string(),
        ];
        let cidrs = [cidrs[0].as_str(), cidrs[1].as_str()];
        self.api
            .create_node_with_cidrs(&Self::node_name(host), &cidrs, &[])
    }

    pub fn kubeconfig(&self) -> PathBuf {
        path_in(&self.dir, "kubeconfig")
    }

    pub fn net_conf_path(&self) -> PathBuf {
        path_in(&self.dir, "net-conf.json")
    }

    pub fn set_net_conf(&self, conf: &str) -> Result<()> {
        Ok(std::fs::write(self.net_conf_path(), conf)?)
    }

    pub fn subnet_file(&self, host: usize) -> PathBuf {
        path_in(&self.dir, &format!("h{host}.env"))
    }

    /// `twill run --kube-subnet-mgr` on `host` as its Node, with the admin kubeconfig.
    pub fn start(&self, host: usize, env: &[(&str, &str)]) -> Result<Proc> {
        let kubeconfig = self.kubeconfig();
        self.start_as(host, &["--kubeconfig-file", path_str(&kubeconfig)?], env)
    }

    /// `twill run --kube-subnet-mgr` on `host` with `auth` flags (how it reaches the server).
    pub fn start_as(&self, host: usize, auth: &[&str], env: &[(&str, &str)]) -> Result<Proc> {
        let conf = self.net_conf_path();
        let mut args = vec!["--kube-subnet-mgr", "--net-config-path", path_str(&conf)?];
        args.extend_from_slice(auth);
        let name = Self::node_name(host);
        let mut vars = vec![("NODE_NAME", name.as_str())];
        vars.extend_from_slice(env);
        start_twill_with_env(self.lab.host(host), &args, &vars, &self.subnet_file(host))
    }

    /// `twill run --kube-subnet-mgr` on `host` that must stop by itself; its stderr.
    pub fn failing_start(
        &self,
        host: usize,
        auth: &[&str],
        env: &[(&str, &str)],
    ) -> Result<String> {
        let conf = self.net_conf_path();
        let file = self.subnet_file(host);
        let mut args = vec!["run", "--iface", "eth0", "--kube-subnet-mgr"];
        args.extend([
            "--net-config-path",
            path_str(&conf)?,
            "--subnet-file",
            path_str(&file)?,
        ]);
        args.extend_from_slice(auth);
        let name = Self::node_name(host);
        let mut vars = vec![("NODE_NAME", name.as_str())];
        vars.extend_from_slice(env);
        let mut node = spawn_twill(&self.lab.host(host).ns, &args, &vars)?;
        node.failure_within(Duration::from_secs(20), "twill kept running")
    }

    pub fn peer_subnets(&self, host: usize) -> Result<Vec<String>> {
        peer_subnets(&self.lab.host(host).ns)
    }

    /// `rejected_leases` of a node's status, as (key, reason) pairs.
    pub fn rejected(&self, host: usize) -> Result<Vec<(String, String)>> {
        super::refusals::rejected(&self.lab.host(host).ns)
    }

    /// Waits until `host` has exactly `want` as its peers' subnets.
    pub fn wait_peers<T: ToString>(&self, host: usize, want: &[T]) -> Result<()> {
        let mut want: Vec<String> = want.iter().map(ToString::to_string).collect();
        want.sort();
        eventually_within(
            &format!("host {host} peers {want:?}"),
            Duration::from_secs(15),
            || {
                let mut have = self.peer_subnets(host)?;
                have.sort();
                Ok(have == want)
            },
        )
    }

    /// A container behind `host` in its podCIDR.
    pub fn add_container(&mut self, host: usize) -> Result<()> {
        self.lab
            .host_mut(host)
            .add_container(Self::pod_cidr(host))?;
        Ok(())
    }

    /// A container behind `host` in its IPv4 and IPv6 podCIDRs.
    pub fn add_dual_stack_container(&mut self, host: usize) -> Result<()> {
        let (subnet, subnet6) = (Self::pod_cidr(host), Self::pod_cidr6(host));
        let host = self.lab.host_mut(host);
        host.add_dual_stack_container(subnet, subnet6)?;
        Ok(())
    }

    pub fn container(&self, host: usize) -> &twill_lab::Container {
        &self.lab.host(host).containers()[0]
    }

    /// Ping, then `bytes` over TCP checked by sha256, from host `a`'s container to `b`'s.
    pub fn traffic(&self, a: usize, b: usize, bytes: usize) -> Result<()> {
        let out = ping(self.container(a), self.container(b).ip, 2)?;
        anyhow::ensure!(out.contains("2 received"), "{out}");
        tcp_transfer_intact(self.container(a), self.container(b), bytes)
    }
}

fn path_str(path: &std::path::Path) -> Result<&str> {
    path.to_str().context("non-UTF-8 path")
}
