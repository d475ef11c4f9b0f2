//! Hardening 3, the eBPF dataplane: a running eBPF node can no longer be torn down by a second
//! start. A second twill on its device or pin directory, and `--cleanup`, are refused in one
//! line while it runs; `--cleanup --force`, or its device deleted, is put back by the running
//! node at its next reconcile; a start that fails takes back what it made.

mod common;

use anyhow::{ensure, Context, Result};
use common::bpffs::{BpfFs, EBPF};
use common::*;
use std::time::Duration;
use twill_lab::{Lab, LabSpec, Netns, Proc};

/// The nodes reconcile every 2 s, so that a repair comes within the test's patience.
const FAST_RECONCILE: (&str, &str) = ("TWILL_RECONCILE_INTERVAL", "2");

/// Three lab hosts: host 0 (10.5.1.0/24) and host 1 (10.5.2.0/24) with a container each, host 2
/// (10.5.3.0/24) with none; a bpffs of the test's own for the pins.
struct Hosts {
    lab: Lab,
    dir: tempfile::TempDir,
    bpf: BpfFs,
}

const SUBNETS: [&str; 3] = ["10.5.1.0/24", "10.5.2.0/24", "10.5.3.0/24"];

fn hosts(tag: &str) -> Result<Hosts> {
    twill_lab::require_root()?;
    let mut lab = Lab::new(LabSpec {
        hosts: 3,
        tag: tag.into(),
        ..Default::default()
    })?;
    for (host, subnet) in SUBNETS[..2].iter().enumerate() {
        lab.host_mut(host).add_container(subnet.parse()?)?;
    }
    let dir = scratch()?;
    let bpf = BpfFs::mount(path_in(&dir, "bpf"))?;
    Ok(Hosts { lab, dir, bpf })
}

impl Hosts {
    /// `--network`, host `i`'s `--subnet` and its peer (host 1 for hosts 0 and 2, host 0 for
    /// host 1), then `extra`.
    fn args(&self, i: usize, extra: &[&str]) -> Vec<String> {
        let other = if i == 1 { 0 } else { 1 };
        let peer = format!("{}={}", SUBNETS[other], self.lab.host(other).underlay_ip);
        let mut args: Vec<String> = ["--network", "10.5.0.0/16", "--subnet", SUBNETS[i]]
            .map(String::from)
            .into();
        args.extend(["--peer".to_string(), peer]);
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    }

    /// [`EBPF`] pinning in the test's bpffs.
    fn ebpf(&self) -> Vec<&str> {
        self.bpf.ebpf_args()
    }

    /// Host `i`'s node, ready.
    fn start(&self, i: usize, extra: &[&str]) -> Result<Proc> {
        let args = self.args(i, extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let file = path_in(&self.dir, &format!("h{i}.env"));
        start_twill_with_env(self.lab.host(i), &args, &[FAST_RECONCILE], &file)
    }

    /// A second `twill run` on host `i` (its own status port and subnet file, no nftables
    /// rules, which are another concern) that must stop within 10 s: its last line.
    fn refused(&self, i: usize, extra: &[&str]) -> Result<String> {
        let file = path_in(&self.dir, &format!("second-h{i}.env"));
        self.refused_writing(i, extra, file.to_str().context("path")?)
    }

    /// [`Hosts::refused`] with `file` as its subnet file.
    fn refused_writing(&self, i: usize, extra: &[&str], file: &str) -> Result<String> {
        let file = file.to_string();
        let mut args = vec!["run".to_string(), "--iface".into(), "eth0".into()];
        args.extend(["--status-addr", "127.0.0.1:9586", "--subnet-file"].map(String::from));
        args.push(file);
        args.push("--iptables-forward-rules=false".into());
        args.extend(self.args(i, extra));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut node = spawn_twill(&self.lab.host(i).ns, &args, &[])?;
        let stderr = node.failure_within(Duration::from_secs(30), "a second node ran")?;
        Ok(stderr.lines().last().unwrap_or_default().to_string())
    }

    fn ns(&self, i: usize) -> &Netns {
        &self.lab.host(i).ns
    }

    /// Pings from host 0's container to host 1's get through.
    fn carries(&self) -> Result<()> {
        let (a, b) = (
            &self.lab.host(0).containers()[0],
            &self.lab.host(1).containers()[0],
        );
        let out = ping(a, b.ip, 2)?;
        ensure!(out.contains("2 received"), "{out}");
        Ok(())
    }

    /// Whether host 0's eBPF dataplane is in place: device, pins, traffic.
    fn ebpf_in_place(&self) -> Result<bool> {
        let device = self.ns(0).ip(&["link", "show", "twill0"]).is_ok();
        let pinned = self.bpf.path.join("twill0").join("link_egress").exists();
        Ok(device && pinned && self.carries().is_ok())
    }
}

#[test]
fn while_an_ebpf_node_runs_a_second_node_and_a_cleanup_are_refused_in_one_line() -> Result<()> {
    let h = hosts("h3-ebpf2")?;
    let mut first = h.start(0, &h.ebpf())?;
    let _peer = h.start(1, &["--backend", "udp"])?;
    h.carries()?;
    let owner = format!("a running twill (pid {})", first.pid());

    let last = h.refused(0, &h.ebpf())?;
    let want = format!("the eBPF dataplane on device twill0 is already run by {owner}");
    ensure!(last.contains(&want), "{last}");
    // A TUN node of that --tun-name would first remove what an eBPF run left.
    let last = h.refused(0, &["--backend", "udp"])?;
    let want = format!("the eBPF dataplane on device twill0 belongs to {owner}");
    ensure!(last.contains(&want), "{last}");
    let args = ["run", "--cleanup", "--bpf-dir", h.bpf.arg()];
    let mut cleanup = spawn_twill(h.ns(0), &args, &[])?;
    let stderr = cleanup.failure_within(Duration::from_secs(30), "the cleanup ran")?;
    ensure!(stderr.contains(&want), "{stderr}");
    ensure!(
        stderr.contains("--cleanup --force"),
        "the way out is named: {stderr}"
    );
    ensure!(h.ebpf_in_place()?, "{:?}", h.bpf.entries());

    // Another network namespace has a twill0 of its own, but not the pins in this directory.
    let last = h.refused(2, &h.ebpf())?;
    let pins = h.bpf.path.join("twill0");
    let want = format!(
        "{} holds the pins of a running twill's eBPF dataplane",
        pins.display()
    );
    ensure!(last.contains(&want), "{last}");
    nothing_left(h.ns(2), "twill0", None)?;

    ensure!(h.ebpf_in_place()?, "{:?}", h.bpf.entries());
    ensure!(first.is_running(), "{}", first.stderr());
    let status = status(h.ns(0))?;
    ensure!(status["unhealthy"].is_null(), "{status}");
    Ok(())
}

/// No device `device` in `ns`, and the network's route where it was: `route` (e.g.
/// "dev twill0"), or none.
fn nothing_left(ns: &Netns, device: &str, route: Option<&str>) -> Result<()> {
    // The device, and the segmenter named after it (the lab's underlay is a veth).
    for left in [
        device.to_string(),
        format!("{device}-segs"),
        format!("{device}-segr"),
    ] {
        ensure!(
            ns.ip(&["link", "show", &left]).is_err(),
            "{left} left behind"
        );
    }
    let routes = ns.ip(&["route", "show", "10.5.0.0/16"])?;
    let kept = match route {
        Some(route) => routes.contains(route),
        None => routes.trim().is_empty(),
    };
    ensure!(kept, "the network's route is now: {routes}");
    Ok(())
}

#[test]
fn an_ebpf_start_that_fails_takes_back_what_it_made() -> Result<()> {
    let h = hosts("h3-ebpffail")?;
    // A TUN node runs on host 0; each failed start below is another twill beside it, on a port
    // of its own (an eBPF node holds its port as the TUN node does, and would be refused first).
    let mut tun = h.start(0, &["--backend", "udp"])?;
    let _peer = h.start(1, &["--backend", "udp"])?;
    h.carries()?;

    // Pins cannot be made on a read-only bpffs: the device made before is taken back, and the
    // network's route never left twill0.
    let ro = path_in(&h.dir, "ro-bpf");
    std::fs::create_dir_all(&ro)?;
    nix::mount::mount(
        Some("bpffs"),
        &ro,
        Some("bpf"),
        nix::mount::MsFlags::MS_RDONLY,
        None::<&str>,
    )?;
    let _unmount = Unmount(ro.clone());
    let ro_arg = ro.to_str().context("path")?;
    let beside = ["--tun-name", "twill9", "--port", "8286"];
    let args = [EBPF, &beside, &["--bpf-dir", ro_arg]].concat();
    let last = h.refused(0, &args)?;
    ensure!(last.contains("Read-only file system"), "{last}");
    nothing_left(h.ns(0), "twill9", Some("dev twill0"))?;
    h.carries()?;

    ensure!(tun.is_running(), "{}", tun.stderr());
    Ok(())
}

#[test]
fn what_a_forced_cleanup_or_a_deletion_takes_the_running_node_puts_back() -> Result<()> {
    let h = hosts("h3-ebpffix")?;
    let mut node = h.start(0, &h.ebpf())?;
    let _peer = h.start(1, &["--backend", "udp"])?;
    h.carries()?;

    let args = ["run", "--cleanup", "--force", "--bpf-dir", h.bpf.arg()];
    h.ns(0).exec(TWILL, &args)?;
    ensure!(
        h.ns(0).ip(&["link", "show", "twill0"]).is_err(),
        "--force removed nothing"
    );
    let bound = Duration::from_secs(20);
    eventually_within("the forced cleanup undone", bound, || h.ebpf_in_place())?;

    h.ns(0).ip(&["link", "del", "twill0"])?;
    eventually_within("the deleted device back", bound, || h.ebpf_in_place())?;
    eventually_within("healthy again", bound, || {
        Ok(status(h.ns(0))?["unhealthy"].is_null())
    })?;
    tcp_transfer_intact(
        &h.lab.host(0).containers()[0],
        &h.lab.host(1).containers()[0],
        4 << 20,
    )?;
    let log = node.stderr();
    ensure!(log.contains("put it back"), "{log}");
    ensure!(node.is_running(), "{log}");
    Ok(())
}

/// Another tool's TC program, compiled here from C: it passes every packet (TC_ACT_OK).
fn foreign_object(dir: &std::path::Path) -> Result<String> {
    let source = dir.join("other_tool.c");
    std::fs::write(
        &source,
        "__attribute__((section(\"tc\"), used)) int other_tool(void *skb) { return 0; }\n\
         char _license[] __attribute__((section(\"license\"), used)) = \"GPL\";\n",
    )?;
    let object = dir.join("other_tool.o");
    let (source, object) = (
        source.to_str().context("path")?,
        object.to_str().context("path")?,
    );
    let built = std::process::Command::new("clang")
        .args(["-O2", "-target", "bpf", "-c", source, "-o", object])
        .output()?;
    ensure!(built.status.success(), "clang: {built:?}");
    Ok(object.to_string())
}

/// The underlay's ingress filters on host 0, as `tc` lists them.
fn ingress_filters(h: &Hosts) -> Result<String> {
    h.ns(0)
        .exec("tc", &["filter", "show", "dev", "eth0", "ingress"])
}

#[test]
fn another_tools_tc_filter_at_twills_place_is_never_replaced() -> Result<()> {
    let h = hosts("h4-tcother")?;
    let object = foreign_object(h.dir.path())?;
    let put = |verb: &str| {
        let args = [
            "filter", verb, "dev", "eth0", "ingress", "pref", "1", "handle", "1",
        ];
        let mut args = args.to_vec();
        args.extend(["bpf", "da", "obj", &object, "sec", "tc"]);
        h.ns(0).exec("tc", &args)
    };
    h.ns(0)
        .exec("tc", &["qdisc", "add", "dev", "eth0", "clsact"])?;
    put("add")?;
    let mut args = h.ebpf();
    args.extend(["--bpf-attach", "tc"]);

    // At start: refused in one line naming the filter, which stays.
    let last = h.refused(0, &args)?;
    ensure!(
        last.contains("eth0's ingress hook already has a bpf filter at pref 1 handle 0:1")
            && last.contains("other_tool")
            && last.contains("twill did not put there"),
        "{last}"
    );
    ensure!(
        ingress_filters(&h)?.contains("other_tool"),
        "the filter went"
    );

    // Once twill runs, the tool puts its filter back in twill's place: twill leaves it, says so
    // once, and is not ready until the place is free again; then it attaches its own.
    h.ns(0)
        .exec("tc", &["filter", "del", "dev", "eth0", "ingress"])?;
    let node = h.start(0, &args)?;
    let _peer = h.start(1, &["--backend", "udp"])?;
    h.carries()?;
    put("replace")?;
    let readyz = || http_get(h.ns(0), "127.0.0.1:9585", "/readyz");
    eventually("/readyz naming the other filter", || {
        let answer = readyz()?;
        Ok(answer.contains("503") && answer.contains("other_tool"))
    })?;
    // Three reconciles (every 2 s) later, the filter is still the other tool's.
    std::thread::sleep(Duration::from_secs(6));
    ensure!(
        ingress_filters(&h)?.contains("other_tool"),
        "twill replaced it"
    );
    let said = node.stderr().matches("twill did not put there").count();
    ensure!(said == 1, "said {said} times:\n{}", node.stderr());

    h.ns(0)
        .exec("tc", &["filter", "del", "dev", "eth0", "ingress"])?;
    eventually("ready again", || Ok(readyz()?.starts_with("HTTP/1.1 200")))?;
    ensure!(
        ingress_filters(&h)?.contains("twill_ingress"),
        "not put back"
    );
    h.carries()?;
    ensure!(node.stderr().contains("the reconcile succeeds again"));
    Ok(())
}
