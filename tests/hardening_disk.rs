//! Hardening 4, finding 2: a full disk at restart no longer takes the node's network down. A
//! vxlan node whose subnet file lives on a full filesystem used to exit at start after removing
//! its rules; now it forwards, keeps its rules, says why once, answers `/readyz` 503 with the
//! reason, and writes the file (and becomes ready) once there is room. Real etcd, real devices,
//! a real tmpfs filled to the last byte.

mod common;

use anyhow::{ensure, Context, Result};
use common::cluster::*;
use common::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

const VXLAN: &str = r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan"}}"#;

/// A small tmpfs of the test's own, lazily unmounted on drop (also when the test fails).
struct Tmpfs(Unmount);

impl Tmpfs {
    fn mount(path: PathBuf) -> Result<Tmpfs> {
        std::fs::create_dir_all(&path)?;
        nix::mount::mount(
            Some("tmpfs"),
            &path,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=256k"),
        )
        .with_context(|| format!("mounting a tmpfs on {}", path.display()))?;
        Ok(Tmpfs(Unmount(path)))
    }

    /// Fills it to the last byte with one file, which [`Tmpfs::free`] removes.
    fn fill(&self) -> Result<()> {
        let filler = self.path().join("filler");
        let out = std::process::Command::new("dd")
            .args(["if=/dev/zero", "bs=4k"])
            .arg(format!("of={}", filler.display()))
            .output()?;
        let said = String::from_utf8_lossy(&out.stderr);
        ensure!(said.contains("No space left"), "dd did not fill it: {said}");
        Ok(())
    }

    fn free(&self) -> Result<()> {
        Ok(std::fs::remove_file(self.path().join("filler"))?)
    }

    fn path(&self) -> &Path {
        &self.0 .0
    }
}

/// `/readyz` of the node in `ns`: the status line and the body.
fn readyz(ns: &twill_lab::Netns) -> Result<String> {
    http_get(ns, "127.0.0.1:9585", "/readyz")
}

/// FLANNEL-FWD's and FLANNEL-POSTRTG's rules in `ns`, as iptables lists them.
fn flannel_rules(ns: &twill_lab::Netns) -> Result<String> {
    let fwd = ns.exec("iptables", &["-S", "FLANNEL-FWD"])?;
    let nat = ns.exec("iptables", &["-t", "nat", "-S", "FLANNEL-POSTRTG"])?;
    Ok(format!("{fwd}{nat}"))
}

#[test]
fn a_subnet_file_on_a_full_disk_takes_no_rule_or_route_down_and_is_written_once_there_is_room(
) -> Result<()> {
    let mut c = cluster("h4-disk", 2, VXLAN)?;
    let disk = Tmpfs::mount(path_in(&c.dir, "disk"))?;
    let file = disk.path().join("subnet.env");
    let file_arg = file.to_str().context("a UTF-8 path")?.to_string();
    let _node0 = c.start(0)?;
    let host1 = c.lab.host(1);
    let endpoint = c.etcd.endpoint();
    let args = ["--etcd-endpoints", endpoint.as_str(), "--ip-masq"];
    let mut node1 = start_twill(host1, &args, Path::new(&file_arg))?;
    std::fs::copy(&file, c.subnet_file(1))?;
    c.add_container(0)?;
    c.add_container(1)?;
    tcp_transfer_intact(c.container(0), c.container(1), 1 << 20)?;
    let rules_before = flannel_rules(&c.lab.host(1).ns)?;

    // The restart finds its filesystem full.
    node1.stop()?;
    disk.fill()?;
    let run = [
        "run",
        "--iface",
        "eth0",
        "--subnet-file",
        &file_arg,
        "--etcd-endpoints",
        &endpoint,
        "--ip-masq",
    ];
    let ns1 = &c.lab.host(1).ns;
    let mut node1 = spawn_twill(ns1, &run, &[("RUST_LOG", "info")])?;
    let why = format!("cannot write the subnet file {file_arg}");
    eventually_within(
        "readyz names the subnet file",
        Duration::from_secs(30),
        || {
            ensure!(node1.is_running(), "twill exited:\n{}", node1.stderr());
            Ok(readyz(ns1).is_ok_and(|r| r.starts_with("HTTP/1.1 503") && r.contains(&why)))
        },
    )?;
    let answer = readyz(ns1)?;
    ensure!(answer.contains("No space left on device"), "{answer}");
    ensure!(status(ns1)?["ready"] == false, "{}", status(ns1)?);
    ensure!(
        flannel_rules(ns1)? == rules_before,
        "the rules changed:\n{}\nbefore:\n{rules_before}",
        flannel_rules(ns1)?
    );
    let out = ping(c.container(0), c.container(1).ip, 3)?;
    ensure!(out.contains("3 received"), "{out}");
    tcp_transfer_intact(c.container(1), c.container(0), 1 << 20)?;
    tcp_transfer_intact(c.container(0), c.container(1), 1 << 20)?;
    // Said once, however often it is tried again.
    std::thread::sleep(Duration::from_secs(5));
    let log = node1.stderr();
    ensure!(log.matches(&why).count() == 1, "not said once:\n{log}");

    // Room again: written, and ready.
    disk.free()?;
    eventually_within("ready once written", Duration::from_secs(15), || {
        Ok(readyz(ns1).is_ok_and(|r| r.starts_with("HTTP/1.1 200")))
    })?;
    let written = std::fs::read_to_string(&file)?;
    let subnet = c.subnet(1)?;
    ensure!(
        written.contains(&format!("FLANNEL_SUBNET={}", first_host(subnet))),
        "{written}"
    );
    ensure!(node1.stderr().contains("at last"), "{}", node1.stderr());
    node1.stop()?;
    Ok(())
}

/// The first host address of `subnet`, as subnet.env names it.
fn first_host(subnet: twill_lab::Ipv4Net) -> std::net::Ipv4Addr {
    let n = u32::from(subnet.network()) + 1;
    n.into()
}
