//! The CI smoke run against a real lab: `twill-bench --quick --paths native,vxlan` (root),
//! dual-stack since --quick measures TCP over IPv6 too.

use std::process::Command;

#[test]
fn quick_run_measures_native_and_vxlan_and_writes_json() {
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("quick.json");
    let out = Command::new(env!("CARGO_BIN_EXE_twill-bench"))
        .args(["--quick", "--paths", "native,vxlan", "--json"])
        .arg(&json_path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("×vxlan") && stdout.contains("tcp6 Gbit/s"),
        "{stdout}"
    );
    assert!(
        stderr.contains("vxlan: tcp -P 4"),
        "progress line: {stderr}"
    );

    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let paths = doc.as_array().unwrap();
    let names: Vec<_> = paths.iter().map(|p| p["path"].as_str().unwrap()).collect();
    assert_eq!(names, ["native", "vxlan"]);
    for p in paths {
        assert_eq!(p["available"], true, "{p}");
        for key in [
            "tcp_gbps",
            "tcp_p4_gbps",
            "tcp_rev_gbps",
            "tcp6_gbps",
            "tcp6_vs_tcp",
            "flood64_kpps",
            "flood64_datagrams_per_packet",
            "latency_us",
            "latency_pinned_us",
            "cpu_pct",
            "cpu_per_gbit",
        ] {
            assert!(p[key].as_f64().unwrap() > 0.0, "{key} in {p}");
        }
        assert!(p["flood64_loss_pct"].as_f64().unwrap() >= 0.0, "{p}");
        // IPv6 bytes arrived, and at least as many reached the server host's IPv6 device on
        // the path (native's underlay iface, vxlan's flannel-v6.1).
        let received = p["tcp6_bytes"].as_f64().unwrap();
        assert!(received > 0.0, "{p}");
        assert!(p["tcp6_device_bytes"].as_f64().unwrap() >= received, "{p}");
        assert!(p["no_ipv6"].is_null(), "{p}");
    }
    assert_eq!(paths[1]["tcp_vs_vxlan"], 1.0);
}
