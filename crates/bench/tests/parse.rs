//! Parsing of what iperf3, qperf, /proc/stat and flannel's subnet file print.

use serde_json::json;
use twill_bench::parse::*;

fn iperf_tcp_json(received_bps: f64) -> String {
    json!({
        "start": {"connected": []},
        "end": {
            "sum_sent": {"bits_per_second": received_bps * 1.01, "retransmits": 3},
            "sum_received": {"seconds": 10.0, "bytes": 1, "bits_per_second": received_bps}
        }
    })
    .to_string()
}

#[test]
fn tcp_throughput_is_the_receiver_sum_in_gbit() {
    let gbps = iperf_tcp_gbps(&iperf_tcp_json(22.2e9)).unwrap();
    assert!((gbps - 22.2).abs() < 1e-9, "{gbps}");
}

#[test]
fn tcp_bytes_are_what_the_receiver_got() {
    let out = json!({"end": {"sum_received": {"bytes": 1_250_000_000u64, "bits_per_second": 5e9}}});
    assert_eq!(iperf_tcp_bytes(&out.to_string()).unwrap(), 1_250_000_000);
    assert!(iperf_tcp_bytes(r#"{"end": {"sum_received": {}}}"#).is_err());
}

#[test]
fn a_devices_received_bytes_come_from_its_64_bit_counters() {
    // `ip -s -j link show dev flannel-v6.1` (iproute2 6.1, trimmed).
    let ip = r#"[{"ifindex":5,"ifname":"flannel-v6.1","mtu":1430,"stats64":{
        "rx":{"bytes":5368709120,"packets":81234,"errors":0},
        "tx":{"bytes":4312,"packets":51,"errors":0}}}]"#;
    assert_eq!(link_rx_bytes(ip).unwrap(), 5_368_709_120);
    assert!(link_rx_bytes(r#"[{"ifname":"eth0"}]"#).is_err());
    assert!(link_rx_bytes("[]").is_err());
    assert!(link_rx_bytes("5: eth0: <UP>").is_err());
}

#[test]
fn tcp_retransmits_are_the_senders_count() {
    assert_eq!(iperf_tcp_retransmits(&iperf_tcp_json(1e9)).unwrap(), 3.0);
    assert!(iperf_tcp_retransmits(r#"{"end": {}}"#).is_err());
}

#[test]
fn underlay_datagrams_come_from_the_clsact_qdisc() {
    // `tc -s -j qdisc show dev eth0` with a clsact qdisc and a filter (iproute2 6.1, trimmed).
    let tc = r#"[{"kind":"noqueue","handle":"0:","root":true,"bytes":0,"packets":0},
        {"kind":"clsact","handle":"ffff:","parent":"ffff:fff1","bytes":10456,"packets":103,
         "drops":0}]"#;
    assert_eq!(tc_clsact_packets(tc).unwrap(), 103);
    assert!(tc_clsact_packets(r#"[{"kind":"noqueue","packets":5}]"#).is_err());
    assert!(tc_clsact_packets(r#"[{"kind":"clsact"}]"#).is_err());
    assert!(tc_clsact_packets("qdisc noqueue 0: root").is_err());
}

#[test]
fn iperf_errors_are_reported_with_iperf_own_words() {
    let out = r#"{"start": {}, "intervals": [], "end": {},
        "error": "unable to connect to server: Connection refused"}"#;
    assert_eq!(
        iperf_error(out).as_deref(),
        Some("unable to connect to server: Connection refused")
    );
    let e = iperf_tcp_gbps(out).unwrap_err().to_string();
    assert!(e.contains("Connection refused"), "{e}");
    assert!(iperf_error("not json").is_none());
    assert!(iperf_tcp_gbps(r#"{"end": {}}"#).is_err());
}

#[test]
fn qperf_latency_in_any_unit_becomes_microseconds() {
    let plain = "tcp_lat:\n    latency  =  7.8 us\n";
    assert_eq!(qperf_latency_us(plain).unwrap(), 7.8);
    let verbose = "tcp_lat:\n    latency        =  900 ns\n    msg_rate       =  67.3 K/sec\n";
    assert!((qperf_latency_us(verbose).unwrap() - 0.9).abs() < 1e-12);
    assert_eq!(
        qperf_latency_us("tcp_lat:\n latency = 1.5 ms\n").unwrap(),
        1500.0
    );
    assert!(qperf_latency_us("tcp_lat:\n").is_err());
    assert!(qperf_latency_us("latency = 3 parsecs").is_err());
}

#[test]
fn cpu_use_counts_softirq_and_all_busy_time_of_the_whole_machine() {
    let two_cpus = "cpu0 1 2 3 4 5 6 7 8\ncpu1 1 2 3 4 5 6 7 8\ncpufreq 1\n";
    let before = cpu_times(&format!("cpu  100 0 50 800 50 0 0 0 0 0\n{two_cpus}")).unwrap();
    assert_eq!(before.cpus, 2);
    // +100 ticks: 30 user, 10 system, 20 softirq, 35 idle, 5 iowait.
    let after = cpu_times(&format!("cpu  130 0 60 835 55 0 20 0 0 0\n{two_cpus}")).unwrap();
    let used = after.since(&before).unwrap();
    assert!((used.busy_pct - 60.0).abs() < 1e-9, "{used:?}");
    assert!((used.softirq_pct - 20.0).abs() < 1e-9, "{used:?}");
    assert!(
        (used.busy_cpus - 1.2).abs() < 1e-9,
        "60 % of two CPUs: {used:?}"
    );
    assert!(before.since(&before).is_none(), "no ticks, no percentage");
    assert!(cpu_times("cpu0 1 2 3").is_err());
    assert!(cpu_times("cpu  1 2 3").is_err());
}

#[test]
fn flannel_mtu_comes_from_the_subnet_file() {
    let env = "FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.1.1/24\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=false\n";
    assert_eq!(subnet_env_mtu(env).unwrap(), 1472);
    assert!(subnet_env_mtu("FLANNEL_SUBNET=10.5.1.1/24\n").is_err());
}

#[test]
fn udp_counters_come_from_the_udp_lines_of_proc_net_snmp() {
    let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
                Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
                Udp: 789432 0 645764 120 645764 0\n\
                UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
                UdpLite: 7 0 0 0 0 0\n";
    assert_eq!(snmp_udp(snmp, "InDatagrams").unwrap(), 789432);
    assert_eq!(snmp_udp(snmp, "RcvbufErrors").unwrap(), 645764);
    assert_eq!(snmp_udp(snmp, "OutDatagrams").unwrap(), 120);
    assert!(snmp_udp(snmp, "NoSuchCounter").is_err());
    assert!(snmp_udp("Ip: Forwarding\nIp: 1\n", "InDatagrams").is_err());
    assert!(snmp_udp("Udp: InDatagrams\nUdp: many\n", "InDatagrams").is_err());
}
