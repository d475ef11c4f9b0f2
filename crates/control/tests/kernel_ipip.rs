//! The ipip backend on this kernel, which has no ipip module: a clear error, and nothing left
//! behind.

mod kernel_common;

use kernel_common::{Mode, Netns};
use twill_control::backend::ipip::IpipDevice;

#[test]
fn missing_ipip_module_gives_one_clear_line() {
    let a = Netns::new("ipip", Mode::Nexthops);
    a.sh("ip link add eth0 type veth peer name eth1 && ip addr add 10.200.0.1/24 dev eth0");
    let (has_ipip, _) =
        a.try_sh("ip link add probe0 type ipip local 10.200.0.1 && ip link del probe0");
    if has_ipip {
        eprintln!("this kernel has ipip; the missing-module error cannot be shown here");
        return;
    }
    let config = a.config(false);
    let err = a.block_on(move || async move { IpipDevice::ensure(&config).await.err() });
    let msg = format!(
        "{:#}",
        err.expect("creating flannel.ipip must fail on this kernel")
    );
    assert_eq!(msg.lines().count(), 1, "{msg}");
    for needle in ["CONFIG_NET_IPIP", "udp", "batch", "vxlan", "host-gw"] {
        assert!(msg.contains(needle), "{needle} missing from: {msg}");
    }
    assert!(
        !a.try_sh("ip link show flannel.ipip").0,
        "nothing may be left behind"
    );
}
