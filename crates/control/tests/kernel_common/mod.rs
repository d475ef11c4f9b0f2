//! Hosts for the kernel backend tests: network namespaces joined by a veth pair, removed again
//! when the test ends, also when it panics.
//!
//! Backend code runs on a thread that has entered the namespace (`setns` is per thread) with its
//! own current-thread tokio runtime, so its rtnetlink socket lives in that namespace. Each call
//! starts afresh, which is also how a restarted daemon meets the kernel state.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::fs::File;
use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use nix::sched::{setns, CloneFlags};
use twill_control::backend::kernel::{Ipv6Side, KernelConfig};
use twill_control::lease::{Lease, LeaseAttrs};

/// Bounds every piece of backend work in a namespace.
const WORK_TIMEOUT: Duration = Duration::from_secs(30);
/// Bounds every shell command (ping's own limits are far lower).
const COMMAND_TIMEOUT_SECS: u32 = 20;

pub const NETWORK: &str = "10.5.0.0/16";
/// The IPv6Network of the dual-stack tests.
pub const IPV6_NETWORK: &str = "fd10::/56";

/// How a node writes its peers' routes: through nexthop objects of their own (the default),
/// or as gateway routes (`--no-nexthop-objects`, and kernels without nexthop objects). Every
/// test runs in both ([`in_both_modes`]) and expects the same state, with `nhid` set aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Nexthops,
    GatewayRoutes,
}

/// Runs each named test function (`fn name(mode: Mode)`) once per [`Mode`], as
/// `nexthop_objects::name` and `gateway_routes::name`.
#[macro_export]
macro_rules! in_both_modes {
    ($($name:ident),* $(,)?) => {
        mod nexthop_objects {
            $(#[test]
            fn $name() {
                super::$name(super::kernel_common::Mode::Nexthops)
            })*
        }
        mod gateway_routes {
            $(#[test]
            fn $name() {
                super::$name(super::kernel_common::Mode::GatewayRoutes)
            })*
        }
    };
}

/// A network namespace that is deleted when dropped, and the mode its nodes run in.
pub struct Netns {
    name: String,
    mode: Mode,
}

impl Netns {
    /// `test` keeps names readable; the pid and a counter keep them unique across parallel tests
    /// and concurrent test processes.
    pub fn new(test: &str, mode: Mode) -> Netns {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("twk-{}-{test}-{n}", std::process::id());
        run_ok(&format!("ip netns add {name}"));
        let ns = Netns { name, mode };
        ns.sh("ip link set lo up");
        ns
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// What a node in this namespace is configured with.
    pub fn config(&self, direct_routing: bool) -> KernelConfig {
        KernelConfig {
            iface: "eth0".into(),
            network: Some(NETWORK.parse().unwrap()),
            direct_routing,
            nexthop_objects: self.mode == Mode::Nexthops,
            ipv6: None,
        }
    }

    /// [`Netns::config`] on a dual-stack network, for the node at `public_ipv6`.
    pub fn dual_stack_config(&self, direct_routing: bool, public_ipv6: &str) -> KernelConfig {
        KernelConfig {
            ipv6: Some(Ipv6Side {
                network: IPV6_NETWORK.parse().unwrap(),
                public_ip: public_ipv6.parse().unwrap(),
            }),
            ..self.config(direct_routing)
        }
    }

    /// Every IPv6 route inside [`IPV6_NETWORK`] but the kernel's own (a device's address),
    /// sorted and without the defaults iproute2 adds (metric 1024, pref medium).
    pub fn ipv6_routes(&self) -> Vec<String> {
        let routes = self.sh(&format!("ip -6 route show root {IPV6_NETWORK}"));
        let ours = routes.lines().filter(|l| !l.contains("proto kernel"));
        let ours = ours.map(|l| l.replace(" metric 1024", "").replace(" pref medium", ""));
        sorted_lines(&[ours.collect::<Vec<_>>().join("\n")])
    }

    /// Runs a shell command inside the namespace and returns its stdout; panics on failure.
    pub fn sh(&self, cmd: &str) -> String {
        run_ok(&self.wrap(cmd))
    }

    /// Runs a shell command inside the namespace; returns whether it succeeded, and its output.
    pub fn try_sh(&self, cmd: &str) -> (bool, String) {
        run(&self.wrap(cmd))
    }

    fn wrap(&self, cmd: &str) -> String {
        let quoted = cmd.replace('\'', r"'\''");
        format!("ip netns exec {} sh -c '{quoted}'", self.name)
    }

    /// Runs `work` on a fresh thread inside the namespace with a fresh tokio runtime.
    pub fn block_on<F, Fut, T>(&self, work: F) -> T
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T>,
        T: Send + 'static,
    {
        let path = format!("/var/run/netns/{}", self.name);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let outcome = panic::catch_unwind(AssertUnwindSafe(|| enter_and_run(&path, work)));
            let _ = tx.send(outcome);
        });
        match rx.recv_timeout(WORK_TIMEOUT + Duration::from_secs(5)) {
            Ok(Ok(value)) => value,
            Ok(Err(panic)) => panic::resume_unwind(panic),
            Err(_) => panic!("work in {} did not finish", self.name),
        }
    }

    /// Every IPv4 route inside [`NETWORK`], sorted: all the state host-gw owns.
    pub fn network_routes(&self) -> Vec<String> {
        sorted_lines(&[self.routes()])
    }

    /// The state a tunnel backend owns, sorted: neighbours and fdb entries on its device `dev`,
    /// and every IPv4 route inside [`NETWORK`].
    pub fn tunnel_state(&self, dev: &str) -> Vec<String> {
        let neigh = self.sh(&format!("ip neigh show dev {dev}"));
        let fdb = self.sh(&format!("bridge fdb show dev {dev}"));
        sorted_lines(&[neigh, fdb, self.routes()])
    }

    /// The routes inside [`NETWORK`] as flannel's gateway routes, once checked against the
    /// mode: with nexthop objects, each of twill's (proto boot) goes through a nexthop of
    /// twill's with the same gateway and device, and twill holds no other nexthop; without,
    /// none does, and twill holds no nexthop at all.
    fn routes(&self) -> String {
        let routes = self.sh(&format!("ip -4 route show root {NETWORK}"));
        let twills = self.sh("ip nexthop show protocol 116");
        // `id <id> via <gateway> dev <dev> [onlink]`, as a route through it shows it.
        let nexthops: Vec<String> = twills
            .lines()
            .map(|l| l.replace(" scope link", "").replace(" proto 116", ""))
            .map(|l| l.trim().to_string())
            .collect();
        let mut through = Vec::new();
        let mut plain = Vec::new();
        for line in routes.lines().filter(|l| !l.trim().is_empty()) {
            match line.split_once(" nhid ") {
                Some((dst, rest)) => {
                    let (id, via) = rest.split_once(' ').expect("nhid <id> via ...");
                    let nexthop = format!("id {id} {}", via.trim());
                    assert!(
                        nexthops.contains(&nexthop),
                        "{line}: no nexthop of twill's `{nexthop}` in\n{twills}"
                    );
                    through.push(format!("{dst} {via}"));
                }
                None => plain.push(line.to_string()),
            }
        }
        let boot = plain.iter().filter(|l| !l.contains(" proto "));
        match self.mode {
            Mode::Nexthops => {
                let gateway_routes: Vec<_> = boot.filter(|l| l.contains(" via ")).collect();
                assert!(
                    gateway_routes.is_empty(),
                    "not through a nexthop: {gateway_routes:?}"
                );
                assert_eq!(twills.lines().count(), through.len(), "{twills}");
            }
            Mode::GatewayRoutes => {
                assert!(through.is_empty(), "through nexthops: {through:?}");
                assert_eq!(twills, "", "twill's nexthops left");
            }
        }
        through.extend(plain);
        through.join("\n")
    }

    pub fn ping(&self, args: &str) -> bool {
        self.try_sh(&format!("ping -c 2 -W 1 {args}")).0
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        run(&format!("ip netns del {}", self.name));
    }
}

fn sorted_lines(outputs: &[String]) -> Vec<String> {
    let all = outputs.iter().flat_map(|out| out.lines());
    let mut lines: Vec<String> = all
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    lines.sort();
    lines
}

fn enter_and_run<F, Fut, T>(path: &str, work: F) -> T
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = T>,
{
    let ns = File::open(path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
    setns(ns, CloneFlags::CLONE_NEWNET).expect("setns");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let bounded = rt.block_on(async { tokio::time::timeout(WORK_TIMEOUT, work()).await });
    bounded.expect("backend work timed out")
}

fn run(cmd: &str) -> (bool, String) {
    let out = Command::new("timeout")
        .args([COMMAND_TIMEOUT_SECS.to_string().as_str(), "sh", "-c", cmd])
        .output()
        .expect("spawning sh");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn run_ok(cmd: &str) -> String {
    let (ok, out) = run(cmd);
    assert!(ok, "`{cmd}` failed:\n{out}");
    out
}

/// Two hosts on one L2 segment: `eth0` with 10.200.0.1/24 and 10.200.0.2/24.
pub fn two_hosts(test: &str, mode: Mode) -> (Netns, Netns) {
    let (a, b) = (Netns::new(test, mode), Netns::new(test, mode));
    let (na, nb) = (a.name(), b.name());
    run_ok(&format!(
        "ip link add eth0 netns {na} type veth peer name eth0 netns {nb}"
    ));
    a.sh("ip addr add 10.200.0.1/24 dev eth0 && ip link set eth0 up");
    b.sh("ip addr add 10.200.0.2/24 dev eth0 && ip link set eth0 up");
    (a, b)
}

/// [`two_hosts`] whose `eth0` also has fd00:200::1/64 and fd00:200::2/64: an IPv6 underlay.
pub fn two_dual_stack_hosts(test: &str, mode: Mode) -> (Netns, Netns) {
    let (a, b) = two_hosts(test, mode);
    a.sh("ip -6 addr add fd00:200::1/64 dev eth0 nodad");
    b.sh("ip -6 addr add fd00:200::2/64 dev eth0 nodad");
    (a, b)
}

/// `lease` with an IPv6 side: its IPv6 subnet and PublicIPv6.
pub fn dual_stack(lease: Lease, ipv6_subnet: &str, public_ipv6: &str) -> Lease {
    let attrs = lease.attrs();
    let attrs = attrs.with_ipv6(public_ipv6.parse().unwrap(), lease.backend_v6_data.clone());
    Lease::new(lease.subnets.with_v6(ipv6_subnet.parse().unwrap()), attrs)
}

pub fn lease(subnet: &str, public_ip: &str, backend_type: Option<&str>) -> Lease {
    let public_ip: std::net::Ipv4Addr = public_ip.parse().unwrap();
    let attrs = LeaseAttrs::typed(public_ip, backend_type, None);
    Lease::new(subnet.parse::<ipnet::Ipv4Net>().unwrap(), attrs)
}

/// Sorted lines, for comparing with [`Netns::tunnel_state`] and [`Netns::network_routes`].
pub fn lines(expected: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}
