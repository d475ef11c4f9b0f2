use std::time::Duration;
use twill_lab::{tcp_transfer_intact, IpAddr, Ipv4Net, Lab, LabSpec, Netns};

fn ping(from: &Netns, to: impl Into<IpAddr>) -> anyhow::Result<String> {
    let to = to.into();
    let family = if to.is_ipv6() { "-6" } else { "-4" };
    from.exec(
        "ping",
        &[family, "-c", "2", "-W", "1", "-i", "0.2", &to.to_string()],
    )
}

fn netns_list() -> String {
    std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap()
}

fn lab(tag: &str, hosts: usize) -> Lab {
    Lab::of(tag, hosts).unwrap()
}

#[test]
fn two_hosts_reach_each_other_and_their_containers() {
    let mut lab = lab("two", 2);
    for (i, subnet) in ["10.5.1.0/24", "10.5.2.0/24"].iter().enumerate() {
        let c = lab.hosts[i].add_container(subnet.parse().unwrap()).unwrap();
        assert_eq!(c.gateway.to_string(), subnet.replace(".0/24", ".1"));
        assert_eq!(c.ip.to_string(), subnet.replace(".0/24", ".2"));
        assert_eq!((c.ipv6, c.gateway6, c.subnet6), (None, None, None));
    }
    ping(&lab.host(0).ns, lab.host(1).underlay_ip).unwrap();
    ping(&lab.host(1).ns, lab.host(0).underlay_ip).unwrap();
    assert!(lab.hosts.iter().all(|h| h.underlay_ipv6.is_none()));
    for host in &lab.hosts {
        let c = &host.containers()[0];
        ping(&c.ns, c.gateway).unwrap();
        ping(&host.ns, c.ip).unwrap();
        let forward = host
            .ns
            .exec("sysctl", &["-n", "net.ipv4.ip_forward"])
            .unwrap();
        assert_eq!(forward.trim(), "1");
    }
}

#[test]
fn three_hosts_on_a_bridge_all_reach_each_other() {
    let lab = lab("bridge", 3);
    assert!(lab.bridge().is_some());
    for a in &lab.hosts {
        for b in lab.hosts.iter().filter(|b| b.underlay_ip != a.underlay_ip) {
            ping(&a.ns, b.underlay_ip).unwrap();
        }
    }
}

#[test]
fn underlay_mtu_is_applied() {
    let lab = Lab::new(LabSpec {
        hosts: 2,
        underlay_mtu: 1400,
        tag: "mtu".into(),
    })
    .unwrap();
    let link = lab.host(0).ns.ip(&["link", "show", "eth0"]).unwrap();
    assert!(link.contains("mtu 1400"), "{link}");
}

#[test]
fn enter_sees_the_namespace_interfaces() {
    let names = || -> Vec<String> {
        nix::net::if_::if_nameindex()
            .unwrap()
            .iter()
            .map(|i| i.name().to_string_lossy().into_owned())
            .collect()
    };
    let lab = lab("enter", 2);
    let inside = lab.host(0).ns.enter(names);
    assert_eq!(inside, ["lo", "eth0"]);
    assert_ne!(inside, names());
}

#[test]
fn dropping_a_lab_removes_its_namespaces() {
    let mut lab = lab("drop", 3);
    lab.hosts[0]
        .add_container("10.5.9.0/24".parse::<Ipv4Net>().unwrap())
        .unwrap();
    let mut names: Vec<String> = lab.hosts.iter().map(|h| h.ns.name().to_string()).collect();
    names.push(lab.bridge().unwrap().name().to_string());
    names.push(lab.host(0).containers()[0].ns.name().to_string());
    let before = netns_list();
    assert!(
        names.iter().all(|n| before.contains(n.as_str())),
        "{before}"
    );
    drop(lab);
    let after = netns_list();
    assert!(names.iter().all(|n| !after.contains(n.as_str())), "{after}");
}

#[test]
fn a_panic_removes_the_lab_namespaces() {
    let mut names = Vec::new();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let lab = lab("panic", 2);
        names.extend(lab.hosts.iter().map(|h| h.ns.name().to_string()));
        panic!("test failure while the lab is up");
    }));
    assert!(result.is_err());
    let after = netns_list();
    assert!(names.len() == 2 && names.iter().all(|n| !after.contains(n.as_str())));
}

#[test]
fn exec_errors_carry_command_and_stderr() {
    let ns = Netns::new("err").unwrap();
    let err = ns.sh("echo oops >&2; exit 3").unwrap_err().to_string();
    assert!(err.contains("exit 3") && err.contains("oops"), "{err}");
}

#[test]
fn proc_is_killed_on_drop_and_logs_are_captured() {
    let ns = Netns::new("proc").unwrap();
    let mut proc = ns
        .spawn_with(
            "sh",
            &["-c", "echo $GREETING; echo err >&2; exec sleep 600"],
            &[("GREETING", "hi")],
        )
        .unwrap();
    let pid = proc.pid();
    assert!(proc
        .wait_timeout(Duration::from_millis(300))
        .unwrap()
        .is_none());
    assert!(proc.is_running());
    assert_eq!(proc.stdout(), "hi\n");
    assert_eq!(proc.stderr(), "err\n");
    drop(proc);
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
}

#[test]
fn proc_stop_and_kill9() {
    let ns = Netns::new("stop").unwrap();
    let mut proc = ns.spawn("sleep", &["600"]).unwrap();
    let status = proc.stop().unwrap();
    assert!(!status.success());
    assert!(!proc.is_running());
    let mut proc = ns.spawn("sleep", &["600"]).unwrap();
    proc.kill9();
    assert!(!proc.is_running());
}

#[test]
fn stale_namespaces_of_dead_pids_are_removed() {
    // The owner pid is above the kernel's largest pid_max, so never alive; our pid as the
    // counter keeps parallel test processes apart.
    let name = format!("tw4194399-{}-stale", std::process::id());
    let add = std::process::Command::new("ip")
        .args(["netns", "add", &name])
        .status()
        .unwrap();
    assert!(add.success());
    twill_lab::cleanup_stale().unwrap();
    assert!(!netns_list().contains(&name));
}

fn sysctl(ns: &Netns, name: &str) -> String {
    ns.exec("sysctl", &["-n", name]).unwrap().trim().to_string()
}

#[test]
fn hosts_on_an_ipv6_underlay_reach_each_other_over_ipv6() {
    for hosts in [2, 3] {
        let lab = lab(&format!("v6u{hosts}"), hosts)
            .with_ipv6_underlay()
            .unwrap();
        for (i, a) in lab.hosts.iter().enumerate() {
            let ip = a.underlay_ipv6.unwrap();
            assert_eq!(ip.to_string(), format!("fd00:200::{}", i + 1));
            let addr = a.ns.ip(&["-6", "addr", "show", "eth0"]).unwrap();
            assert!(addr.contains(&format!("{ip}/64")), "{addr}");
            assert_eq!(sysctl(&a.ns, "net.ipv6.conf.all.forwarding"), "1");
            for b in lab.hosts.iter().filter(|b| b.underlay_ip != a.underlay_ip) {
                ping(&a.ns, b.underlay_ipv6.unwrap()).unwrap();
            }
        }
    }
}

#[test]
fn a_dual_stack_container_reaches_its_host_over_both_families() {
    let mut lab = lab("v6c", 2).with_ipv6_underlay().unwrap();
    let host = lab.host_mut(0);
    let c = host
        .add_dual_stack_container(
            "10.5.1.0/24".parse().unwrap(),
            "fd00:5:1::/64".parse().unwrap(),
        )
        .unwrap();
    assert_eq!(c.ipv6.unwrap().to_string(), "fd00:5:1::2");
    assert_eq!(c.gateway6.unwrap().to_string(), "fd00:5:1::1");
    assert_eq!(c.subnet6.unwrap().to_string(), "fd00:5:1::/64");
    assert_eq!(c.ip.to_string(), "10.5.1.2");
    let route = c.ns.ip(&["-6", "route", "show", "default"]).unwrap();
    assert!(route.contains("via fd00:5:1::1 dev eth0"), "{route}");
    ping(&c.ns, c.gateway6.unwrap()).unwrap();
    ping(&c.ns, c.gateway).unwrap();
    let host = lab.host(0);
    let c = &host.containers()[0];
    ping(&host.ns, c.ipv6.unwrap()).unwrap();
    ping(&host.ns, c.ip).unwrap();
    // Out of its /64 through the host: the host's underlay address sits on another iface.
    ping(&c.ns, host.underlay_ipv6.unwrap()).unwrap();
    let host_side = format!("net.ipv6.conf.{}.forwarding", c.host_iface);
    assert_eq!(sysctl(&host.ns, &host_side), "1");
}

#[test]
fn a_dual_stack_container_subnet6_too_small_is_refused() {
    let mut lab = lab("v6small", 2);
    let err = lab
        .host_mut(0)
        .add_dual_stack_container(
            "10.5.1.0/24".parse().unwrap(),
            "fd00:5:1::/127".parse().unwrap(),
        )
        .unwrap_err()
        .to_string();
    assert_eq!(err, "container subnet6 fd00:5:1::/127 is too small");
    assert!(lab.host(0).containers().is_empty());
}

/// Host routes written by the test stand in for what a dataplane would program: each host
/// reaches the other's container /64 via the other's underlay IPv6 address.
#[test]
fn dual_stack_containers_on_two_hosts_exchange_tcp_over_ipv6() {
    let mut lab = lab("v6tcp", 2).with_ipv6_underlay().unwrap();
    for (i, (subnet, subnet6)) in [
        ("10.5.1.0/24", "fd00:5:1::/64"),
        ("10.5.2.0/24", "fd00:5:2::/64"),
    ]
    .iter()
    .enumerate()
    {
        lab.host_mut(i)
            .add_dual_stack_container(subnet.parse().unwrap(), subnet6.parse().unwrap())
            .unwrap();
    }
    for (a, b) in [(0, 1), (1, 0)] {
        let (a, b) = (lab.host(a), lab.host(b));
        let subnet6 = b.containers()[0].subnet6.unwrap().to_string();
        let via = b.underlay_ipv6.unwrap().to_string();
        a.ns.ip(&["-6", "route", "add", &subnet6, "via", &via])
            .unwrap();
    }
    let (c0, c1) = (&lab.host(0).containers()[0], &lab.host(1).containers()[0]);
    ping(&c0.ns, c1.ipv6.unwrap()).unwrap();
    tcp_transfer_intact(&c0.ns, &c1.ns, c1.ipv6.unwrap().into(), 4 << 20).unwrap();
    tcp_transfer_intact(&c1.ns, &c0.ns, c0.ipv6.unwrap().into(), 4 << 20).unwrap();
}
