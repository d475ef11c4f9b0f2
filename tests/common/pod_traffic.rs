//! Pods on a real cluster's nodes and the traffic between them, as flannel's end-to-end suite
//! checks it (e2e/connectivity_test.go, resilience_test.go): a test pod pinned to each of two
//! nodes, pings both ways, TCP checked by a hash of the bytes, and what a disturbance loses
//! while they ping each other every 10 ms.

use super::kube_flannel::{pod_cidr, pod_cidr6, POD_TIMEOUT};
use super::ping_from;
use anyhow::{ensure, Context, Result};
use std::net::IpAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use twill_lab::{Cluster, Image, Netns};

/// The namespace the test pods run in.
const NAMESPACE: &str = "default";
/// Bytes each TCP check carries.
const TCP_BYTES: usize = 4 << 20;
/// A first ping that waits for the path to come up (flannel's e2e waitForPing gives a minute).
const FIRST_PING_TIMEOUT: Duration = Duration::from_secs(60);

/// A busybox pod on each of the first two nodes, with their addresses and network namespaces.
pub struct TestPods {
    pub names: [&'static str; 2],
    pub nodes: [String; 2],
    pub ips: [IpAddr; 2],
    /// The pods' IPv6 addresses on a dual-stack cluster.
    pub ipv6: Option<[IpAddr; 2]>,
    netns: Vec<Netns>,
}

impl TestPods {
    /// Starts pod-a on the first node and pod-b on the second and waits until both are Ready
    /// with an address in their node's podCIDR (and IPv6 podCIDR, if it has one).
    pub fn start(cluster: &mut Cluster) -> Result<TestPods> {
        let names = ["pod-a", "pod-b"];
        let nodes: Vec<String> = cluster.nodes().iter().map(|n| n.name.clone()).collect();
        ensure!(nodes.len() >= 2, "the cluster has fewer than two nodes");
        let nodes = [nodes[0].clone(), nodes[1].clone()];
        for (pod, node) in names.iter().zip(&nodes) {
            cluster.api().apply_yaml(&busybox_pod(pod, node)?)?;
        }
        let mut pods = TestPods {
            names,
            nodes,
            ips: [IpAddr::from([0, 0, 0, 0]); 2],
            ipv6: None,
            netns: Vec::new(),
        };
        for i in 0..2 {
            pods.ready(cluster, i)?;
        }
        Ok(pods)
    }

    /// Waits until pod `i` is Ready, then reads its addresses and checks them against its
    /// node's podCIDRs.
    fn ready(&mut self, cluster: &mut Cluster, i: usize) -> Result<()> {
        let (pod, node) = (self.names[i], self.nodes[i].as_str());
        cluster.wait_pod_ready(NAMESPACE, pod, POD_TIMEOUT)?;
        let ip = cluster.pod_ip(NAMESPACE, pod)?;
        let cidr = pod_cidr(cluster, node)?;
        ensure!(
            cidr.contains(&ip),
            "{pod} on {node} has {ip}, not in {cidr}"
        );
        self.ips[i] = ip.into();
        if let Some(cidr6) = pod_cidr6(cluster, node)? {
            let ip6 = cluster.pod_ipv6(NAMESPACE, pod)?;
            ensure!(
                cidr6.contains(&ip6),
                "{pod} on {node} has {ip6}, not in {cidr6}"
            );
            let mut both = self.ipv6.unwrap_or([IpAddr::from([0u16; 8]); 2]);
            both[i] = ip6.into();
            self.ipv6 = Some(both);
        }
        let netns = cluster.pod_netns(NAMESPACE, pod)?;
        match self.netns.get_mut(i) {
            Some(slot) => *slot = netns,
            None => self.netns.push(netns),
        }
        Ok(())
    }

    /// The network namespace of pod `i`.
    pub fn ns(&self, i: usize) -> &Netns {
        &self.netns[i]
    }

    /// Deletes pod `i`, waits until it is gone, makes it again on the same node and waits
    /// until it is Ready with an address in its node's podCIDR: flannel's e2e "recovers pod
    /// connectivity after a pod is deleted and recreated" (host-local may give the same
    /// address again, so what counts is the connectivity).
    pub fn recreate(&mut self, cluster: &mut Cluster, i: usize) -> Result<()> {
        let (pod, node) = (self.names[i], self.nodes[i].clone());
        cluster.delete_pod(NAMESPACE, pod)?;
        cluster.wait_pod_gone(NAMESPACE, pod, POD_TIMEOUT)?;
        cluster.api().apply_yaml(&busybox_pod(pod, &node)?)?;
        self.ready(cluster, i)
    }

    /// Deletes both pods and waits until they are gone.
    pub fn delete(self, cluster: &mut Cluster) -> Result<()> {
        let TestPods { names, netns, .. } = self;
        drop(netns);
        for pod in names {
            cluster.delete_pod(NAMESPACE, pod)?;
        }
        for pod in names {
            cluster.wait_pod_gone(NAMESPACE, pod, POD_TIMEOUT)?;
        }
        Ok(())
    }

    /// (from, to, to's address) for both directions, over IPv4 or IPv6.
    fn directions(&self, ipv6: bool) -> Result<[(usize, usize, IpAddr); 2]> {
        let ips = match ipv6 {
            false => self.ips,
            true => self.ipv6.context("the pods have no IPv6 addresses")?,
        };
        Ok([(0, 1, ips[1]), (1, 0, ips[0])])
    }
}

/// Each pod pings the other (once the path is up, a few times more, as flannel's e2e pings),
/// then sends it 4 MiB over TCP, sha256 checked on both ends; over IPv6 too when the pods have
/// IPv6 addresses.
pub fn pods_talk_across_nodes(cluster: &mut Cluster, pods: &TestPods) -> Result<()> {
    let families = match pods.ipv6 {
        Some(_) => vec![false, true],
        None => vec![false],
    };
    for ipv6 in families {
        for (from, to, to_ip) in pods.directions(ipv6)? {
            let (from_ns, to_ns) = (pods.ns(from), pods.ns(to));
            let what = format!("{} pinging {} at {to_ip}", pods.names[from], pods.names[to]);
            cluster.wait_for(&what, FIRST_PING_TIMEOUT, |_| {
                Ok(ping_from(from_ns, to_ip, 1).is_ok().then_some(()))
            })?;
            ping_from(from_ns, to_ip, 3).with_context(|| what.clone())?;
            twill_lab::tcp_transfer_intact(from_ns, to_ns, to_ip, TCP_BYTES)
                .with_context(|| format!("TCP from {} to {to_ip}", pods.names[from]))?;
        }
    }
    Ok(())
}

/// A pod that sleeps on node `node`, from the busybox image every cluster node holds.
pub fn busybox_pod(name: &str, node: &str) -> Result<String> {
    let image = Image::part("busybox")?.name;
    Ok(format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {NAMESPACE}
spec:
  nodeSelector:
    kubernetes.io/hostname: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: {image}
    imagePullPolicy: Never
    command: [sleep, "2147483647"]
"#
    ))
}

/// Echo requests sent and replies received.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub sent: u64,
    pub received: u64,
}

impl Tally {
    pub fn lost(&self) -> u64 {
        self.sent.saturating_sub(self.received)
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} of {} lost", self.lost(), self.sent)
    }
}

/// Probes per window, one every [`INTERVAL`]: a window is one `ping` run, which ends on its
/// own (waiting at most [`REPLY_WAIT`] for its last reply), so nothing is counted lost for
/// having been cut off.
const WINDOW: u32 = 100;
const INTERVAL: &str = "0.01";
const REPLY_WAIT: &str = "1";
/// A pinger left running stops by itself after this long.
const MAX_PINGING: Duration = Duration::from_secs(300);

/// Pings from a namespace to an address every 10 ms, in back-to-back windows of 100, on a
/// thread of its own, until [`Pinger::finish`]: what a disturbance in between lost.
pub struct Pinger {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<Tally>>,
}

impl Pinger {
    /// Starts pinging `to` from `ns`, which must outlive the pinger.
    pub fn start(ns: &Netns, to: IpAddr) -> Pinger {
        let stop = Arc::new(AtomicBool::new(false));
        let (ns, flag) = (ns.name().to_string(), stop.clone());
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            let mut tally = Tally::default();
            while !flag.load(Ordering::Relaxed) && started.elapsed() < MAX_PINGING {
                let window = ping_window(&ns, to)?;
                tally.sent += window.sent;
                tally.received += window.received;
            }
            Ok(tally)
        });
        Pinger { stop, thread }
    }

    /// Stops after the current window and says what all windows sent and received.
    pub fn finish(self) -> Result<Tally> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.join() {
            Ok(tally) => tally,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// One window: `ping -q -c 100 -i 0.01 -W 1`, whose summary says what it sent and got back
/// (it exits 1 when replies were missing, which is what is measured, not a failure).
fn ping_window(ns: &str, to: IpAddr) -> Result<Tally> {
    let count = WINDOW.to_string();
    let to = to.to_string();
    let args = ["-q", "-c", &count, "-i", INTERVAL, "-W", REPLY_WAIT, &to];
    let output = Command::new("ip")
        .args(["netns", "exec", ns, "ping"])
        .args(args)
        .output()
        .context("cannot run ping")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summary = stdout.lines().find(|l| l.contains("packets transmitted"));
    let summary = summary.with_context(|| {
        format!(
            "ping {to} in {ns} printed no summary ({}): {stdout}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )
    })?;
    // "100 packets transmitted, 97 received, +3 errors, 3% packet loss, time 1005ms"
    let number = |field: &str| -> Result<u64> {
        let part = summary.split(", ").find(|p| p.ends_with(field));
        let part = part.with_context(|| format!("no `{field}` in {summary:?}"))?;
        let digits = part.split_whitespace().next().unwrap_or_default();
        digits
            .parse()
            .with_context(|| format!("`{field}` in {summary:?}"))
    };
    Ok(Tally {
        sent: number("packets transmitted")?,
        received: number("received")?,
    })
}

/// Pingers both ways between the two test pods.
pub struct PingersBothWays([Pinger; 2]);

impl PingersBothWays {
    pub fn start(pods: &TestPods) -> PingersBothWays {
        PingersBothWays([
            Pinger::start(pods.ns(0), pods.ips[1]),
            Pinger::start(pods.ns(1), pods.ips[0]),
        ])
    }

    /// [`Pinger::finish`] for both: (pod-a to pod-b, pod-b to pod-a).
    pub fn finish(self) -> Result<[Tally; 2]> {
        let [a, b] = self.0;
        Ok([a.finish()?, b.finish()?])
    }
}
