//! Medians, ratios, the table, the JSON and the --quick completeness check.

use std::collections::BTreeMap;
use twill_bench::measure::{Field, Measurement};
use twill_bench::plot;
use twill_bench::report::{check_complete, json, table, PathResult};
use twill_bench::scale::report::{ScaleField, ScaleResult};
use twill_bench::scale::ScaleBackend;
use twill_bench::stats::{median, percentile, ratio};

#[test]
fn median_of_odd_even_and_empty_sample_sets() {
    assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
    assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    assert_eq!(median(&[29.4, 38.6, 31.0, 1.0, 35.0]), Some(31.0));
    assert_eq!(median(&[]), None);
}

#[test]
fn percentiles_are_nearest_rank() {
    let samples: Vec<f64> = (1..=200).rev().map(f64::from).collect();
    assert_eq!(percentile(&samples, 50.0), Some(100.0));
    assert_eq!(percentile(&samples, 99.0), Some(198.0));
    assert_eq!(percentile(&samples, 100.0), Some(200.0));
    assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
    assert_eq!(percentile(&[], 50.0), None);
}

#[test]
fn ratio_needs_both_values_and_a_positive_base() {
    assert_eq!(ratio(Some(11.1), Some(22.2)), Some(0.5));
    assert_eq!(ratio(None, Some(1.0)), None);
    assert_eq!(ratio(Some(1.0), None), None);
    assert_eq!(ratio(Some(1.0), Some(0.0)), None);
}

/// An available path: samples 1, 2, 3 for every field, `tcp` for single-stream TCP.
fn measured(path: &str, tcp: &[f64]) -> PathResult {
    let mut samples = BTreeMap::new();
    for field in Field::ALL {
        samples.insert(field, vec![1.0, 2.0, 3.0]);
    }
    samples.insert(Field::TcpGbps, tcp.to_vec());
    PathResult {
        path: path.into(),
        available: true,
        note: String::new(),
        no_ipv6: None,
        samples,
    }
}

fn unavailable(path: &str) -> PathResult {
    PathResult {
        path: path.into(),
        note: "unavailable: kernel lacks ipip".into(),
        ..Default::default()
    }
}

fn sample_run() -> Vec<PathResult> {
    vec![
        measured("native", &[30.0, 40.0, 35.0]),
        measured("vxlan", &[20.0, 21.0, 100.0]),
        unavailable("ipip"),
        measured("twill-udp", &[10.5, 1.0, 99.0]),
    ]
}

#[test]
fn json_holds_medians_ratios_and_unavailable_paths() {
    let doc = json(&sample_run());
    let paths = doc.as_array().unwrap();
    assert_eq!(paths.len(), 4);
    let twill = &paths[3];
    assert_eq!(twill["path"], "twill-udp");
    assert_eq!(twill["available"], true);
    assert_eq!(twill["tcp_gbps"], 10.5);
    assert_eq!(twill["tcp_vs_vxlan"], 0.5);
    assert_eq!(twill["tcp_vs_native"], 0.3);
    assert_eq!(twill["latency_us"], 2.0);
    assert_eq!(twill["samples"]["tcp_gbps"].as_array().unwrap().len(), 3);
    for key in [
        "note",
        "tcp_p4_gbps",
        "tcp_rev_gbps",
        "flood64_kpps",
        "flood64_loss_pct",
        "flood64_datagrams_per_packet",
        "latency_pinned_us",
        "cpu_pct",
        "cpu_per_gbit",
    ] {
        assert!(twill.get(key).is_some(), "{key} missing");
    }
    let ipip = &paths[2];
    assert_eq!(ipip["available"], false);
    assert_eq!(ipip["note"], "unavailable: kernel lacks ipip");
    assert!(ipip["tcp_gbps"].is_null());
}

#[test]
fn table_has_a_row_per_path_with_ratios_and_reasons() {
    let text = table(&sample_run());
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("path"), "{text}");
    assert!(
        lines[0].contains("×vxlan") && lines[0].contains("cpu %"),
        "{text}"
    );
    let twill = lines.iter().find(|l| l.starts_with("twill-udp")).unwrap();
    assert!(twill.contains("10.50") && twill.contains("0.50") && twill.contains("0.30"));
    let ipip = lines.iter().find(|l| l.starts_with("ipip")).unwrap();
    assert!(ipip.contains("unavailable: kernel lacks ipip"), "{text}");
    // Columns line up: every full row is as wide as the header.
    let width = lines[0].chars().count();
    let vxlan = lines.iter().find(|l| l.starts_with("vxlan")).unwrap();
    assert_eq!(vxlan.chars().count(), width, "{text}");
}

#[test]
fn quick_check_wants_every_number_of_available_paths_but_allows_zero_loss() {
    let mut run = sample_run();
    check_complete(&run).unwrap();
    run[1].samples.insert(Field::Flood64LossPct, vec![0.0]);
    run[1].samples.insert(Field::TcpRetransmits, vec![0.0]);
    check_complete(&run).unwrap();
    run[1].samples.insert(Field::LatencyUs, vec![0.0]);
    let e = check_complete(&run).unwrap_err().to_string();
    assert!(e.contains("vxlan latency_us"), "{e}");
    run[1].samples.remove(&Field::LatencyUs);
    assert!(check_complete(&run).is_err());
    run[1].samples.insert(Field::LatencyUs, vec![1.0]);
    for new in [
        Field::LatencyPinnedUs,
        Field::Flood64Kpps,
        Field::Flood64DatagramsPerPacket,
        Field::CpuPerGbit,
    ] {
        let mut missing = run.clone();
        missing[3].samples.remove(&new);
        let e = check_complete(&missing).unwrap_err().to_string();
        assert!(e.contains(&format!("twill-udp {}", new.key())), "{e}");
        missing[3].samples.insert(new, vec![0.0]);
        assert!(
            check_complete(&missing).is_err(),
            "{} = 0 passed",
            new.key()
        );
    }
    assert!(check_complete(&[unavailable("ipip")]).is_err());
}

/// A run that measured IPv6: twill-ebpf carries none, so it has no IPv6 samples and a reason.
fn run_with_ipv6() -> Vec<PathResult> {
    let mut run = sample_run();
    run[1].samples.insert(Field::Tcp6Gbps, vec![42.0]);
    let mut ebpf = measured("twill-ebpf", &[18.0]);
    for field in Field::ALL.into_iter().filter(|f| f.is_ipv6()) {
        ebpf.samples.remove(&field);
    }
    ebpf.no_ipv6 = Some("the programs carry IPv4 only".into());
    run.push(ebpf);
    run
}

#[test]
fn ipv6_tcp_sits_beside_ipv4_and_a_path_without_ipv6_reads_n_a_with_the_reason() {
    let run = run_with_ipv6();
    let text = table(&run);
    let lines: Vec<&str> = text.lines().collect();
    let header: Vec<&str> = lines[0].split(" | ").map(str::trim).collect();
    let column = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (tcp6, vs_ipv4) = (column("tcp6 Gbit/s"), column("×ipv4"));
    let cells = |path: &str| -> Vec<String> {
        let line = lines.iter().find(|l| l.starts_with(path)).unwrap();
        line.split(" | ").map(|c| c.trim().to_string()).collect()
    };
    let vxlan = cells("vxlan");
    assert_eq!(
        (vxlan[tcp6].as_str(), vxlan[vs_ipv4].as_str()),
        ("42.00", "2.00")
    );
    let ebpf = cells("twill-ebpf");
    assert_eq!(
        (ebpf[tcp6].as_str(), ebpf[vs_ipv4].as_str()),
        ("n/a", "n/a")
    );
    assert_eq!(ebpf[1], "18.00", "{text}");
    assert!(
        text.contains("note: twill-ebpf: IPv6 n/a: the programs carry IPv4 only"),
        "{text}"
    );
    // An unavailable path has one reason, its own, not an IPv6 note besides.
    assert!(!text.contains("ipip: IPv6"), "{text}");

    let doc = json(&run);
    let (vxlan, ebpf) = (&doc[1], &doc[4]);
    assert_eq!(vxlan["tcp6_gbps"], 42.0);
    assert_eq!(vxlan["tcp6_vs_tcp"], 2.0);
    assert!(vxlan["no_ipv6"].is_null());
    assert!(ebpf["tcp6_gbps"].is_null() && ebpf["tcp6_vs_tcp"].is_null());
    assert_eq!(ebpf["no_ipv6"], "the programs carry IPv4 only");
}

#[test]
fn quick_check_wants_ipv6_numbers_only_from_paths_that_carry_ipv6() {
    let mut run = run_with_ipv6();
    check_complete(&run).unwrap();
    for field in [Field::Tcp6Gbps, Field::Tcp6Bytes, Field::Tcp6DeviceBytes] {
        let mut missing = run.clone();
        missing[1].samples.remove(&field);
        let e = check_complete(&missing).unwrap_err().to_string();
        assert_eq!(e, format!("missing or zero: vxlan {} = None", field.key()));
    }
    run[4].no_ipv6 = None;
    let e = check_complete(&run).unwrap_err().to_string();
    assert!(e.contains("twill-ebpf tcp6_gbps = None"), "{e}");
}

#[test]
fn plot_is_a_png_with_unavailable_and_failed_paths_in_it() {
    let mut run = sample_run();
    run[3].samples.remove(&Field::LatencyUs);
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("perf.png");
    plot::draw(&run, &[], &Measurement::ALL, "test run", &png).unwrap();
    assert_eq!(png_size(&png), (1600, 1400));
}

#[test]
fn plot_has_a_row_of_scale_panels_below_or_instead_of_the_paths() {
    let mut scale = Vec::new();
    for (backend, start) in [(ScaleBackend::Udp, 50.0), (ScaleBackend::Vxlan, 1300.0)] {
        let mut r = ScaleResult::new(backend, 5000);
        r.set(ScaleField::StartMs, start);
        r.set(ScaleField::RssMb, 30.0);
        scale.push(r);
    }
    scale.push(ScaleResult::failed(
        ScaleBackend::Vxlan,
        60000,
        "timeout".into(),
    ));
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("scale.png");
    plot::draw(&[], &scale, &[Measurement::Scale], "scale", &png).unwrap();
    assert_eq!(png_size(&png), (1600, 520));
    plot::draw(&sample_run(), &scale, &Measurement::ALL, "both", &png).unwrap();
    assert_eq!(png_size(&png), (1600, 1920));
}

/// Width and height from a PNG's header.
fn png_size(path: &std::path::Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    let word = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    (word(16), word(20))
}
