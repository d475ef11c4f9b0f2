use std::time::Duration;
use twill_lab::{Ipv4Net, Lab, LabSpec, Netns};

fn ping(from: &Netns, to: impl ToString) -> anyhow::Result<String> {
    from.exec(
        "ping",
        &["-c", "2", "-W", "1", "-i", "0.2", &to.to_string()],
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
    Lab::new(LabSpec {
        hosts,
        tag: tag.into(),
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn two_hosts_reach_each_other_and_their_containers() {
    let mut lab = lab("two", 2);
    for (i, subnet) in ["10.5.1.0/24", "10.5.2.0/24"].iter().enumerate() {
        let c = lab.hosts[i].add_container(subnet.parse().unwrap()).unwrap();
        assert_eq!(c.gateway.to_string(), subnet.replace(".0/24", ".1"));
        assert_eq!(c.ip.to_string(), subnet.replace(".0/24", ".2"));
    }
    ping(&lab.host(0).ns, lab.host(1).underlay_ip).unwrap();
    ping(&lab.host(1).ns, lab.host(0).underlay_ip).unwrap();
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
