//! The pinned latency run's affinity change on a real process: every thread on CPU 0, and back.

use std::process::{Command, Stdio};
use twill_bench::pin::Pinned;

fn allowed_cpus(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list:"))
        .unwrap();
    line.split_whitespace().nth(1).unwrap().to_string()
}

#[test]
fn a_pinned_process_runs_on_cpu_0_until_the_pin_is_dropped() {
    let mut child = Command::new("sleep")
        .arg("30")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let before = allowed_cpus(pid);
    {
        let _pinned = Pinned::to_cpu0(&[pid]).unwrap();
        assert_eq!(allowed_cpus(pid), "0");
    }
    assert_eq!(allowed_cpus(pid), before);
    assert!(Pinned::to_cpu0(&[u32::MAX / 2]).is_err(), "no such process");
    child.kill().unwrap();
    child.wait().unwrap();
}
