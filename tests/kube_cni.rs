//! Pods get their addresses the way flannel's users get them: flannel's own CNI plugin
//! (containernetworking/plugins meta/flannel v0.9.1, unchanged) driven by cnitool with
//! kube-flannel.yml's `cni-conf.json`, reading the subnet file twill writes in
//! `--kube-subnet-mgr` mode, and delegating to Debian's bridge, host-local and portmap plugins.
//! Each host's pod gets an address in its Node's podCIDR, and the two pods talk across hosts
//! through twill.
//!
//! What v0.9.1 hands the bridge plugin is checked from the delegate config it saves in its
//! `dataDir`. Its `ipMasq` is the negation of the subnet file's `FLANNEL_IPMASQ`
//! (plugins/meta/flannel/flannel_linux.go:82-86):
//!
//! ```go
//! if !hasKey(n.Delegate, "ipMasq") {
//!     // if flannel is not doing ipmasq, we should
//!     ipmasq := !*fenv.ipmasq
//!     n.Delegate["ipMasq"] = ipmasq
//! }
//! ```
//!
//! and `FLANNEL_IPMASQ` is true only when it is exactly the string `true` (flannel.go:154,
//! `ipmasq := parts[1] == "true"`; if the line is missing, ADD fails). So a node running without
//! `--ip-masq` (FLANNEL_IPMASQ=false) gets a bridge that masquerades every pod's traffic
//! leaving the pod's own /24, pod-to-pod traffic to other nodes included: the far pod sees the
//! sending node's overlay address, not the pod's. kube-flannel.yml (and our DaemonSet) run with
//! `--ip-masq`, so there the delegate's ipMasq is false and pod addresses survive. The udp round
//! runs as the DaemonSet does; the vxlan round without `--ip-masq`, to pin the other branch.

mod common;

use anyhow::{ensure, Context, Result};
use common::kube::{kube_cluster, net_conf, KubeCluster, NETWORK};
use common::status;
use serde_json::Value;
use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use twill_lab::{kube_part, Ipv4Net, Netns, Proc};

/// kube-flannel.yml's `cni-conf.json` (flannel v0.28.9), as written to every node's
/// /etc/cni/net.d/10-flannel.conflist.
const KUBE_FLANNEL_CNI_CONF: &str = r#"{
  "name": "cbr0",
  "cniVersion": "0.3.1",
  "plugins": [
    {
      "type": "flannel",
      "delegate": {
        "hairpinMode": true,
        "isDefaultGateway": true
      }
    },
    {
      "type": "portmap",
      "capabilities": {
        "portMappings": true
      }
    }
  ]
}"#;
const MANIFEST: &str = include_str!("../deploy/kubernetes/twill.yml");
/// Where host-local keeps its reservations, one directory per network name.
const HOST_LOCAL: &str = "/var/lib/cni/networks";
/// libcni's cache of ADD results (cnitool sets no cache dir of its own).
const CNI_CACHE: &str = "/var/lib/cni/results";
const CNI_DIR: &str = "/var/lib/cni";
/// Debian's containernetworking-plugins.
const DEBIAN_PLUGINS: &str = "/usr/lib/cni";
const BOUND: Duration = Duration::from_secs(20);
const BYTES: u64 = 8 << 20;

struct Round {
    backend: &'static str,
    /// Extra `twill run` flags.
    flags: &'static [&'static str],
    /// The overlay device on each host that the traffic must cross.
    device: &'static str,
    /// Whether twill's dataplane (and so its per-peer counters) carries the packets.
    userspace: bool,
}

const ROUNDS: [Round; 2] = [
    // As kube-flannel.yml and deploy/kubernetes/twill.yml run it.
    Round {
        backend: "udp",
        flags: &["--ip-masq"],
        device: "twill0",
        userspace: true,
    },
    Round {
        backend: "vxlan",
        flags: &[],
        device: "flannel.1",
        userspace: false,
    },
];

#[test]
fn flannels_cni_plugin_gives_pods_addresses_from_twills_subnet_file() -> Result<()> {
    assert_eq!(
        manifest_cni_conf()?,
        serde_json::from_str::<Value>(KUBE_FLANNEL_CNI_CONF)?,
        "deploy/kubernetes/twill.yml's cni-conf.json is not kube-flannel.yml's"
    );
    let c = kube_cluster("kube-cni", 2, &net_conf("udp", ""))?;
    c.add_node(0)?;
    c.add_node(1)?;
    // Declared after the cluster: dropped (host-local state removed) before its namespaces go.
    let cni = Cni::new()?;
    for round in &ROUNDS {
        pods_talk(&c, &cni, round).with_context(|| format!("backend {}", round.backend))?;
    }
    drop(cni);
    assert_nothing_left()?;
    Ok(())
}

fn pods_talk(c: &KubeCluster, cni: &Cni, round: &Round) -> Result<()> {
    c.set_net_conf(&net_conf(round.backend, ""))?;
    let kubeconfig = c.kubeconfig();
    let mut auth = vec!["--kubeconfig-file", kubeconfig.to_str().context("path")?];
    auth.extend_from_slice(round.flags);
    let nodes: Vec<Proc> = vec![c.start_as(0, &auth, &[])?, c.start_as(1, &auth, &[])?];
    c.wait_peers(0, &[KubeCluster::pod_cidr(1)])?;
    c.wait_peers(1, &[KubeCluster::pod_cidr(0)])?;

    // Declared after `nodes`, so a failing round deletes its pods while twill still runs.
    let mut pods = Vec::new();
    for host in 0..2 {
        pods.push(Pod::add(c, cni, host, round)?);
    }
    let (a, b) = (&pods[0], &pods[1]);

    let far = b.ip.to_string();
    let out = a.ns.exec("ping", &["-c2", "-i0.2", "-W2", "-w5", &far])?;
    ensure!(out.contains("2 received"), "{out}");

    let (h0, h1) = (&c.lab.host(0).ns, &c.lab.host(1).ns);
    let tx_before = h0.device_counter(round.device, "tx_bytes")?;
    let rx_before = h1.device_counter(round.device, "rx_bytes")?;
    let peer_tx_before = peer_tx_bytes(h0)?;
    let twill_lab::Transfer {
        sent,
        received,
        source,
    } = twill_lab::tcp_transfer(&a.ns, &b.ns, b.ip.into(), BYTES as usize)?;
    ensure!(
        sent == received,
        "sha256 sent {sent} != received {received}"
    );
    let tx = h0.device_counter(round.device, "tx_bytes")? - tx_before;
    let rx = h1.device_counter(round.device, "rx_bytes")? - rx_before;
    ensure!(
        tx >= BYTES && rx >= BYTES,
        "{BYTES} bytes between the pods, but {} sent {tx} and received {rx} bytes",
        round.device
    );
    if round.userspace {
        let peer_tx = peer_tx_bytes(h0)? - peer_tx_before;
        ensure!(
            peer_tx >= BYTES,
            "twill's peer tx counter grew by {peer_tx}"
        );
    }

    // The masquerade the plugin asked the bridge for (or not): see the module comment.
    if a.delegate_ip_masq {
        let overlay = device_addr(h0, round.device)?;
        ensure!(
            source == overlay,
            "pod {} reached the far pod as {source}, not as node 0's {} address {overlay}",
            a.ip,
            round.device
        );
    } else {
        ensure!(
            source == a.ip,
            "pod {} reached the far pod as {source}",
            a.ip
        );
    }

    for pod in &mut pods {
        pod.del()?;
    }
    drop(pods);
    drop(nodes);
    for host in 0..2 {
        let ns = &c.lab.host(host).ns;
        let peer = KubeCluster::pod_cidr(1 - host).to_string();
        ns.sh(&format!(
            "ip link del flannel.1 2>/dev/null; ip route flush {peer}; \
             ip route flush {NETWORK} exact; true"
        ))?;
    }
    Ok(())
}

/// The CNI side of every host: a NETCONFPATH dir holding the conflist and a flannel `dataDir`,
/// under a temp dir named like the lab's so a crashed run's is swept. The network name carries
/// the pid and the host, as all hosts here share one /var/lib/cni. On Drop, host-local's state
/// and libcni's cached results of these networks are removed.
struct Cni {
    dir: tempfile::TempDir,
    flannel: PathBuf,
    cnitool: PathBuf,
}

impl Cni {
    fn new() -> Result<Cni> {
        let cnitool = kube_part("cnitool")?;
        let flannel = kube_part("flannel")?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("twill-lab-{}-", std::process::id()))
            .tempdir()?;
        Ok(Cni {
            dir,
            flannel,
            cnitool,
        })
    }

    fn network(host: usize) -> String {
        format!("cbr0-{}-h{host}", std::process::id())
    }

    fn conf_dir(&self, host: usize) -> PathBuf {
        self.dir.path().join(format!("net.d-h{host}"))
    }

    fn data_dir(&self, host: usize) -> PathBuf {
        self.dir.path().join(format!("flannel-h{host}"))
    }

    /// kube-flannel's conflist with this run's network name, and the plugin pointed at the
    /// host's twill subnet file and at a data dir of this run.
    fn write_conf(&self, c: &KubeCluster, host: usize) -> Result<()> {
        let mut conf: Value = serde_json::from_str(KUBE_FLANNEL_CNI_CONF)?;
        conf["name"] = Self::network(host).into();
        let flannel = &mut conf["plugins"][0];
        flannel["subnetFile"] = path_str(&c.subnet_file(host))?.into();
        flannel["dataDir"] = path_str(&self.data_dir(host))?.into();
        let dir = self.conf_dir(host);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            dir.join("10-flannel.conflist"),
            serde_json::to_string_pretty(&conf)?,
        )?;
        Ok(())
    }

    /// `cnitool CMD <network> <pod netns>` in the host's namespace, bounded; its stdout.
    fn cnitool(&self, host_ns: &Netns, host: usize, cmd: &str, pod: &Netns) -> Result<String> {
        let plugins = self.flannel.parent().context("flannel's dir")?;
        let cni_path = format!("{}:{DEBIAN_PLUGINS}", path_str(plugins)?);
        let conf_dir = self.conf_dir(host);
        let netns = format!("/var/run/netns/{}", pod.name());
        let network = Self::network(host);
        let mut proc = host_ns.spawn_with(
            path_str(&self.cnitool)?,
            &[cmd, &network, &netns],
            &[
                ("CNI_PATH", &cni_path),
                ("NETCONFPATH", path_str(&conf_dir)?),
            ],
        )?;
        let status = proc
            .wait_timeout(BOUND)?
            .with_context(|| format!("cnitool {cmd} {network} still running after {BOUND:?}"))?;
        ensure!(
            status.success(),
            "cnitool {cmd} {network} {netns} failed ({status}): {}{}",
            proc.stdout(),
            proc.stderr()
        );
        Ok(proc.stdout())
    }
}

impl Drop for Cni {
    fn drop(&mut self) {
        for host in 0..2 {
            let network = Self::network(host);
            let _ = std::fs::remove_dir_all(Path::new(HOST_LOCAL).join(&network));
            let cached = std::fs::read_dir(CNI_CACHE).into_iter().flatten().flatten();
            for entry in cached {
                if entry
                    .file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{network}-"))
                {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        // Only when empty: this test made them (no other test uses CNI).
        for dir in [HOST_LOCAL, CNI_CACHE, CNI_DIR] {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// A pod namespace that cnitool added to its host's network; deleted from it (cnitool del) on
/// Drop if the test did not, before the namespace itself goes.
struct Pod<'a> {
    cni: &'a Cni,
    host_ns: &'a Netns,
    host: usize,
    added: bool,
    ip: Ipv4Addr,
    delegate_ip_masq: bool,
    ns: Netns,
}

impl<'a> Pod<'a> {
    /// Writes the host's conflist, makes a pod namespace, runs cnitool add and checks what the
    /// plugin chain did against the host's subnet file.
    fn add(c: &'a KubeCluster, cni: &'a Cni, host: usize, round: &Round) -> Result<Pod<'a>> {
        cni.write_conf(c, host)?;
        let env = subnet_env(&c.subnet_file(host))?;
        let cidr = KubeCluster::pod_cidr(host);
        let mut pod = Pod {
            cni,
            host_ns: &c.lab.host(host).ns,
            host,
            // Set before the ADD: a failed or timed-out one may have done half its work.
            added: true,
            ip: Ipv4Addr::UNSPECIFIED,
            delegate_ip_masq: false,
            ns: Netns::new(&format!("cni-{}-pod{host}", round.backend))?,
        };
        let out = cni.cnitool(pod.host_ns, host, "add", &pod.ns)?;
        let result: Value =
            serde_json::from_str(&out).with_context(|| format!("cnitool add printed {out:?}"))?;
        let what = || format!("host {host}: {result}");

        // The result: one IPv4 address in the Node's podCIDR, gateway .1, route to the network.
        let ips = result["ips"].as_array().with_context(what)?;
        ensure!(ips.len() == 1, "{}", what());
        let address: Ipv4Net = ips[0]["address"]
            .as_str()
            .with_context(what)?
            .parse()
            .with_context(what)?;
        ensure!(
            address.trunc() == cidr && address.addr() != cidr.network(),
            "pod address {address} outside podCIDR {cidr}"
        );
        let gateway = Ipv4Addr::from(u32::from(cidr.network()) + 1);
        ensure!(ips[0]["gateway"] == gateway.to_string(), "{}", what());
        let routes = result["routes"].as_array().with_context(what)?;
        ensure!(
            routes.iter().any(|r| r["dst"] == NETWORK),
            "no route to {NETWORK}: {}",
            what()
        );
        pod.ip = address.addr();

        // The pod's eth0 carries it, with the subnet file's MTU.
        let addr = pod.ns.ip(&["-4", "-o", "addr", "show", "dev", "eth0"])?;
        ensure!(addr.contains(&format!("inet {address} ")), "{addr}");
        let link = pod.ns.ip(&["-o", "link", "show", "dev", "eth0"])?;
        ensure!(
            link.contains(&format!(" mtu {} ", env["FLANNEL_MTU"])),
            "{link} (subnet file {env:?})"
        );

        // What the plugin handed the bridge plugin, as it saved it for DEL.
        let delegate = pod.delegate_conf()?;
        let ipmasq = env["FLANNEL_IPMASQ"] == "true";
        ensure!(
            delegate["ipMasq"] == !ipmasq,
            "FLANNEL_IPMASQ={ipmasq} yet delegate ipMasq {}",
            delegate["ipMasq"]
        );
        pod.delegate_ip_masq = !ipmasq;
        let mtu: u64 = env["FLANNEL_MTU"].parse()?;
        for (key, want) in [
            ("type", Value::from("bridge")),
            ("name", Value::from(Cni::network(host))),
            ("mtu", mtu.into()),
            ("isGateway", true.into()),
            ("hairpinMode", true.into()),
            ("isDefaultGateway", true.into()),
        ] {
            ensure!(delegate[key] == want, "delegate {key}: {delegate}");
        }
        ensure!(
            delegate["ipam"]["type"] == "host-local"
                && delegate["ipam"]["ranges"][0][0]["subnet"] == cidr.to_string(),
            "delegate ipam: {delegate}"
        );

        // The bridge's masquerade rule for this pod exists exactly when it was asked for.
        let nat = pod
            .host_ns
            .exec("iptables", &["-t", "nat", "-S", "POSTROUTING"])?;
        let source = format!("-A POSTROUTING -s {}/32 ", pod.ip);
        let masq = nat
            .lines()
            .any(|l| l.starts_with(&source) && l.contains(" -j CNI-"));
        ensure!(
            masq == pod.delegate_ip_masq,
            "ipMasq {} but POSTROUTING is:\n{nat}",
            pod.delegate_ip_masq
        );
        Ok(pod)
    }

    /// The delegate netconf the plugin saved in its dataDir: the only file there.
    fn delegate_conf(&self) -> Result<Value> {
        let files = files_in(&self.cni.data_dir(self.host))?;
        ensure!(files.len() == 1, "flannel dataDir holds {files:?}");
        Ok(serde_json::from_slice(&std::fs::read(&files[0])?)?)
    }

    /// cnitool del, then checks that the pod's addresses and the host's records of it are gone.
    fn del(&mut self) -> Result<()> {
        self.added = false;
        self.cni
            .cnitool(self.host_ns, self.host, "del", &self.ns)
            .context("cnitool del")?;
        let links = self.ns.ip(&["-o", "link"])?;
        ensure!(!links.contains("eth0"), "pod still has eth0: {links}");
        let ports = self.host_ns.ip(&["-o", "link", "show", "master", "cni0"])?;
        ensure!(ports.trim().is_empty(), "cni0 still has ports: {ports}");
        let files = files_in(&self.cni.data_dir(self.host))?;
        ensure!(files.is_empty(), "flannel dataDir still holds {files:?}");
        let reserved = files_in(&Path::new(HOST_LOCAL).join(Cni::network(self.host)))?;
        ensure!(
            !reserved.iter().any(|f| f
                .file_name()
                .is_some_and(|n| n.to_string_lossy().parse::<Ipv4Addr>().is_ok())),
            "host-local still reserves {reserved:?}"
        );
        let nat = self.host_ns.exec("iptables", &["-t", "nat", "-S"])?;
        ensure!(!nat.contains("-j CNI-"), "masquerade rules left:\n{nat}");
        Ok(())
    }
}

impl Drop for Pod<'_> {
    fn drop(&mut self) {
        if self.added {
            if let Err(e) = self.cni.cnitool(self.host_ns, self.host, "del", &self.ns) {
                eprintln!("cleanup: {e:#}");
            }
        }
    }
}

/// The subnet file's variables.
fn subnet_env(path: &Path) -> Result<HashMap<String, String>> {
    let text = std::fs::read_to_string(path)?;
    let env: HashMap<String, String> = text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
    for key in ["FLANNEL_MTU", "FLANNEL_IPMASQ"] {
        ensure!(
            env.contains_key(key),
            "{} lacks {key}:\n{text}",
            path.display()
        );
    }
    Ok(env)
}

/// `cni-conf.json` of the kube-twill-cfg ConfigMap in deploy/kubernetes/twill.yml.
fn manifest_cni_conf() -> Result<Value> {
    let mut lines = MANIFEST
        .lines()
        .skip_while(|l| l.trim() != "cni-conf.json: |");
    let key = lines.next().context("no cni-conf.json in the manifest")?;
    let indent = key.len() - key.trim_start().len();
    let block: Vec<&str> = lines
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
        .collect();
    Ok(serde_json::from_str(&block.join("\n"))?)
}

/// The IPv4 address on a device in a namespace.
fn device_addr(ns: &Netns, device: &str) -> Result<Ipv4Addr> {
    let out = ns.ip(&["-4", "-o", "addr", "show", "dev", device])?;
    let net: Ipv4Net = out
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .with_context(|| format!("no address on {device}: {out}"))?
        .parse()?;
    Ok(net.addr())
}

/// Bytes twill's dataplane sent to its peers, over all peers.
fn peer_tx_bytes(ns: &Netns) -> Result<u64> {
    let s = status(ns)?;
    Ok(s["counters"]["peers"]
        .as_array()
        .map(|peers| peers.iter().filter_map(|p| p["tx_bytes"].as_u64()).sum())
        .unwrap_or(0))
}

fn files_in(dir: &Path) -> Result<Vec<PathBuf>> {
    match std::fs::read_dir(dir) {
        Ok(entries) => Ok(entries
            .map(|e| Ok(e?.path()))
            .collect::<std::io::Result<_>>()?),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// After the test: no host-local state or cached result of this run's networks remains.
fn assert_nothing_left() -> Result<()> {
    for host in 0..2 {
        let network = Cni::network(host);
        let dir = Path::new(HOST_LOCAL).join(&network);
        ensure!(!dir.exists(), "{} left behind", dir.display());
        let cached = files_in(Path::new(CNI_CACHE))?;
        ensure!(
            !cached
                .iter()
                .any(|f| f.to_string_lossy().contains(&format!("/{network}-"))),
            "cached results left: {cached:?}"
        );
    }
    Ok(())
}

fn path_str(path: &Path) -> Result<&str> {
    path.to_str().context("non-UTF-8 path")
}
