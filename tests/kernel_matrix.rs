//! The kernels users run: Debian's own 5.10, 6.1 and 6.12, booted under QEMU (twill_lab::guest),
//! each running a set of this suite's own tests in one boot. On all three: the programs on
//! crafted frames (BPF_PROG_TEST_RUN), two eBPF nodes (one on `--dataplane auto`) and an eBPF node
//! beside a TUN node over a veth, `--cleanup`, attached by classic TC where the kernel has no
//! tcx. On 5.10 and 6.12 also random frames and adoption by a reopen; on 6.1 instead the rows the
//! host kernel cannot run at all: ipip (beside a real flanneld) and the kernel's WireGuard
//! (tests/kernel_tunnels.rs). Not yet within CI's time, `#[ignore]`d and run by hand: vxlan and
//! host-gw as controls and a daemon restart under traffic, on 5.10. A kernel that is not cached,
//! or a QEMU that is missing, fails the test in one line: scripts/kernels prepares them.
//!
//! Each named test must report `ok` in the guest's output: a name that matches nothing, a test
//! that panics or a guest that never finishes fails here, with the guest's output.

use anyhow::{ensure, Context, Result};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use twill_lab::guest::{run_in_guest, Kernel};

/// One test binary and the tests of it to run (`ignored`: they are `#[ignore]`d on the host).
struct Row {
    /// The test target's name (its binary is `<name>-<hash>` beside this one).
    binary: &'static str,
    /// Where cargo runs it from: its package's directory, relative to this one's.
    package: &'static str,
    ignored: bool,
    tests: &'static [&'static str],
}

/// The eBPF dataplane's rows on every kernel: the verifier's verdict and the programs' on
/// crafted frames, and whole nodes carrying traffic.
const EBPF: &[Row] = &[
    Row {
        binary: "prog_test_run",
        package: "crates/ebpf",
        ignored: false,
        tests: &[
            "every_crafted_frame_gets_its_verdict_and_counter",
            "the_xdp_program_gives_every_ingress_frame_the_tc_programs_verdict",
            "the_segmented_program_gives_every_frame_its_tc_programs_verdict",
            "over_the_ipv6_underlay_every_crafted_frame_gets_its_verdict_and_counter",
            "a_peer_without_an_ipv6_subnet_gets_no_ipv6_either_way",
            // Not answers_beyond_the_icmp_limit_are_held_back_and_counted: a rate in real time,
            // which a guest starved beside the host's tests failed on 5.10 (one run).
        ],
    },
    Row {
        binary: "ebpf_udp",
        package: ".",
        ignored: false,
        tests: &[
            "two_ebpf_nodes_carry_each_others_traffic",
            "an_ebpf_node_and_a_tun_node_share_flannels_wire",
            "over_classic_tc_cleanup_removes_what_the_stopped_dataplane_left",
        ],
    },
];

/// The eBPF rows that ask less of a kernel's particulars (random frames through the same
/// programs; a reopen adopting what is attached), on the oldest and the newest kernel: 6.1,
/// between them, carries the tunnels instead, so that no guest is the long pole.
const EBPF_BESIDE: &[Row] = &[
    Row {
        binary: "random_frames",
        package: "crates/ebpf",
        ignored: false,
        tests: &[
            "random_bytes_get_a_verdict_and_at_most_one_count",
            "mutated_flannel_frames_get_a_verdict_and_at_most_one_count",
        ],
    },
    Row {
        binary: "adopt",
        package: "crates/ebpf",
        ignored: false,
        tests: &["over_classic_tc_a_reopen_adopts_without_a_gap_and_remove_leaves_nothing"],
    },
];

/// A daemon restart under traffic, adopting what the last run attached.
const RESTART: Row = Row {
    binary: "ebpf_udp",
    package: ".",
    ignored: false,
    tests: &["over_classic_tc_traffic_keeps_flowing_while_the_daemon_restarts"],
};

/// The kernel tunnels the host lacks (`#[ignore]`d there).
const TUNNELS: Row = Row {
    binary: "kernel_tunnels",
    package: ".",
    ignored: true,
    tests: &[
        "ipip_twill_nodes_and_a_real_flanneld_share_a_network",
        "ipip_with_direct_routing_routes_a_same_subnet_peer_over_the_underlay",
        "kernel_and_userspace_wireguard_nodes_share_a_dual_stack_network",
    ],
};

/// The kernel hand-offs the host runs too, as controls.
const CONTROLS: Row = Row {
    binary: "etcd_kernel",
    package: ".",
    ignored: false,
    tests: &[
        "vxlan_nodes_program_flannels_state_and_carry_traffic",
        "host_gw_nodes_route_via_each_other_and_carry_traffic",
    ],
};

/// Under QEMU's emulator every wait of the tests is this many times longer.
const TIME_SCALE: u32 = 20;
/// random_frames' frames per program and kind in a guest (2,000 on the host): 2,000 took 243 s
/// of a 6.x guest's time; the programs are the same object on every kernel, and what a kernel
/// could change (a helper, the verifier's view) shows in any frame that reaches it.
const RANDOM_FRAMES: u32 = 400;
/// A whole boot's bound: far beyond what the rows take, short of CI's own limit.
const GUEST_TIMEOUT: Duration = Duration::from_secs(2400);

#[test]
fn debian_5_10_runs_the_ebpf_dataplane() -> Result<()> {
    on_kernel("5.10", EBPF.iter().chain(EBPF_BESIDE))
}

#[test]
fn debian_6_1_runs_the_ebpf_dataplane_ipip_and_the_kernels_wireguard() -> Result<()> {
    on_kernel("6.1", EBPF.iter().chain([&TUNNELS]))
}

#[test]
fn debian_6_12_runs_the_ebpf_dataplane() -> Result<()> {
    on_kernel("6.12", EBPF.iter().chain(EBPF_BESIDE))
}

/// Not yet within CI's time: on 5.10 the two controls had not finished 630 s after the eBPF
/// rows (one run, three guests at once), and the restart took 476 s of a 6.12 guest.
#[test]
#[ignore = "too slow for CI under QEMU's emulator yet: run by hand with --ignored"]
fn debian_5_10_runs_vxlan_and_host_gw_and_a_restart_under_traffic() -> Result<()> {
    on_kernel("5.10", [&CONTROLS, &RESTART].into_iter())
}

fn on_kernel<'a>(series: &str, rows: impl Iterator<Item = &'a Row>) -> Result<()> {
    let kernel = Kernel::find(series)?;
    let rows: Vec<&Row> = rows.collect();
    let commands = rows
        .iter()
        .map(|row| command(row))
        .collect::<Result<Vec<_>>>()?;
    // flanneld (kernel_tunnels' peer) refuses to start without br_netfilter's sysctls.
    let script = format!(
        "echo \"== Linux $(uname -r)\"\nmodprobe br_netfilter\n{}",
        commands.join("\n")
    );
    let started = Instant::now();
    let run = run_in_guest(&kernel, &script, GUEST_TIMEOUT)?;
    eprintln!(
        "Linux {}: booted in {:.1} s, {:.1} s in all",
        kernel.release(),
        run.boot_secs,
        run.total_secs
    );
    for line in run.output.lines().filter(|l| l.starts_with("== ")) {
        eprintln!("  {line}");
    }
    ensure!(
        run.output
            .contains(&format!("== Linux {}\n", kernel.release())),
        "the guest did not run Linux {}:\n{}",
        kernel.release(),
        run.output
    );
    let missing: Vec<String> = rows
        .iter()
        .flat_map(|row| row.tests.iter().map(move |t| (row.binary, t)))
        .filter(|(_, test)| !run.output.contains(&format!("test {test} ... ok")))
        .map(|(binary, test)| format!("{binary}::{test}"))
        .collect();
    ensure!(
        missing.is_empty() && run.status == 0,
        "on Linux {} (after {:?}), not ok: {missing:?}; the guest's status {}, its output:\n{}",
        kernel.release(),
        started.elapsed(),
        run.status,
        run.output
    );
    Ok(())
}

/// The shell lines that run one row in the guest, timed, and say how it went.
fn command(row: &Row) -> Result<String> {
    let binary = test_binary(row.binary)?;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(row.package);
    let ignored = if row.ignored { " --ignored" } else { "" };
    Ok(format!(
        "cd {dir} && start=$(date +%s) && \
         TWILL_TEST_TIME_SCALE={TIME_SCALE} TWILL_RANDOM_FRAMES={RANDOM_FRAMES} {binary} --exact --test-threads 2{ignored} {tests}; \
         echo \"== {name}: exit $? in $(( $(date +%s) - start )) s\"",
        dir = dir.display(),
        binary = binary.display(),
        tests = row.tests.join(" "),
        name = row.binary,
    ))
}

/// The newest build of the test target `name`, beside this test's own binary (cargo builds
/// every test target before it runs any).
fn test_binary(name: &str) -> Result<PathBuf> {
    let me = std::env::current_exe()?;
    let deps = me.parent().context("the test binary's directory")?;
    let prefix = format!("{name}-");
    let mut builds: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(deps)?
        .filter_map(|entry| entry.ok())
        .filter(|entry| {
            let file = entry.file_name();
            let file = file.to_string_lossy();
            file.strip_prefix(&prefix)
                .is_some_and(|hash| hash.chars().all(|c| c.is_ascii_hexdigit()))
        })
        .filter_map(|entry| Some((entry.metadata().ok()?.modified().ok()?, entry.path())))
        .collect();
    builds.sort();
    builds.pop().map(|(_, path)| path).with_context(|| {
        format!(
            "no build of the test {name} in {}: build every test first (cargo test --workspace \
             --no-run)",
            deps.display()
        )
    })
}
