//! TCP over IPv6 goes through the path it is reported for: on a dual-stack vxlan lab, IPv6
//! through flannel-v6.1 and IPv4 through flannel.1, each counted on the server host's device
//! (root). A path that carries no IPv6 is not set up dual-stack.

use twill_bench::measure::{Field, Measurement, Timing};
use twill_bench::parse::link_rx_bytes;
use twill_bench::paths::{PathKind, PathLab, Twill};
use twill_lab::Netns;

/// The kernel paths run no twill.
fn no_twill() -> Twill {
    Twill {
        binary: "/nonexistent/twill".into(),
        args: Vec::new(),
    }
}

fn rx_bytes(ns: &Netns, dev: &str) -> f64 {
    let out = ns.ip(&["-s", "-j", "link", "show", "dev", dev]).unwrap();
    link_rx_bytes(&out).unwrap() as f64
}

fn value(values: &[(Field, f64)], field: Field) -> f64 {
    values.iter().find(|(f, _)| *f == field).unwrap().1
}

#[test]
fn vxlan_carries_tcp6_through_flannel_v6_and_tcp_through_flannel_1() {
    let lab = PathLab::new(PathKind::Vxlan, &no_twill(), true).unwrap();
    let ends = lab.endpoints();
    let v6 = ends.ipv6.as_ref().expect("a dual-stack lab's IPv6 end");
    let (server_host, device) = v6.device;
    assert_eq!(device, "flannel-v6.1");
    // The container's address in the IPv6 network, fd10::/56.
    assert_eq!(v6.server_ip.segments()[..3], [0xfd10, 0, 0]);
    let timing = Timing {
        duration: 1,
        warmup: 0,
    };
    let devices = ["flannel.1", "flannel-v6.1"];
    let counts = || devices.map(|dev| rx_bytes(server_host, dev));

    let before = counts();
    let tcp6 = Measurement::Tcp6.run(&ends, &timing).unwrap();
    let [v4_dev, v6_dev] = [0, 1].map(|d| counts()[d] - before[d]);
    let received = value(&tcp6, Field::Tcp6Bytes);
    assert!(value(&tcp6, Field::Tcp6Gbps) > 0.0, "{tcp6:?}");
    assert!(received > 1e6, "{tcp6:?}");
    assert!(
        v6_dev >= received,
        "flannel-v6.1 got {v6_dev}, iperf3 {received}"
    );
    assert!(
        v4_dev < received / 100.0,
        "flannel.1 got {v4_dev} during tcp6"
    );

    let before = counts();
    let tcp = Measurement::Tcp.run(&ends, &timing).unwrap();
    let [v4_dev, v6_dev] = [0, 1].map(|d| counts()[d] - before[d]);
    let gbit = value(&tcp, Field::TcpGbps);
    // One second of it, at least half of it counted on flannel.1 and next to none on v6.
    assert!(
        v4_dev * 8.0 / 1e9 > gbit / 2.0,
        "flannel.1 got {v4_dev} at {gbit} Gbit/s"
    );
    assert!(
        v6_dev < v4_dev / 100.0,
        "flannel-v6.1 got {v6_dev} during tcp"
    );
}

#[test]
fn a_path_without_ipv6_is_refused_dual_stack_with_its_reason() {
    for kind in [PathKind::Ipip, PathKind::WireguardGo] {
        let why = kind.no_ipv6().expect("no IPv6");
        let e = PathLab::new(kind, &no_twill(), true).err().unwrap();
        assert_eq!(
            e.to_string(),
            format!("{kind} cannot be set up dual-stack: {why}")
        );
    }
    for kind in [
        PathKind::Native,
        PathKind::HostGw,
        PathKind::Vxlan,
        PathKind::TwillUdp,
        PathKind::TwillBatch,
        PathKind::TwillWireguard,
        PathKind::TwillEbpf,
        PathKind::TwillEbpfUnderlay6,
    ] {
        assert_eq!(kind.no_ipv6(), None, "{kind}");
    }
}
