//! The interface of the default route: flanneld's underlay when no flag names one (a
//! DaemonSet's usual arguments), read from the kernel's route tables in `/proc`.

use anyhow::Context;

/// The name of the interface of the IPv4 default route, or of the IPv6 one (`ipv6`), as
/// flanneld picks the underlay given neither `--iface` nor `--public-ip`; IPv6's for an
/// IPv6-only network.
pub fn default_route_interface(ipv6: bool) -> anyhow::Result<String> {
    let (path, pick): (&str, fn(&str) -> Option<String>) = match ipv6 {
        false => ("/proc/thread-self/net/route", default_route_in),
        // This thread's namespace: /proc/net is the main thread's, and a thread that entered
        // a namespace (setns is per thread) would read another host's routes.
        true => ("/proc/thread-self/net/ipv6_route", ipv6_default_route_in),
    };
    let table = std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?;
    let family = if ipv6 { "IPv6" } else { "IPv4" };
    pick(&table).with_context(|| {
        format!(
            "this host has no {family} default route, so twill cannot tell which interface is \
             the underlay: give --iface or --public-ip"
        )
    })
}

/// The interface of the lowest-metric IPv6 default route in a `/proc/net/ipv6_route` table:
/// per line destination and its prefix length, source and its prefix length, next hop,
/// metric, reference count, use count and flags (hex), and the device. The kernel's own
/// unreachable default on `lo` (RTF_REJECT) is no underlay.
fn ipv6_default_route_in(table: &str) -> Option<String> {
    const RTF_REJECT: u32 = 0x0200;
    table
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let default = f.first()?.bytes().all(|b| b == b'0') && *f.get(1)? == "00";
            let metric = u32::from_str_radix(f.get(5)?, 16).ok()?;
            let flags = u32::from_str_radix(f.get(8)?, 16).ok()?;
            let dev = f.get(9)?;
            (default && flags & RTF_REJECT == 0 && *dev != "lo").then(|| (metric, dev.to_string()))
        })
        .min()
        .map(|(_, name)| name)
}

/// The interface of the lowest-metric default route in a `/proc/net/route` table.
fn default_route_in(table: &str) -> Option<String> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let default = f.get(1) == Some(&"00000000") && f.get(7) == Some(&"00000000");
            let metric: u32 = f.get(6)?.parse().ok()?;
            default.then(|| (metric, f[0].to_string()))
        })
        .min()
        .map(|(_, name)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_route_with_the_lowest_metric_names_the_underlay() {
        let table =
            "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n\
            eth1\t00000000\t0100C80A\t0003\t0\t0\t200\t00000000\t0\t0\t0\n\
            eth0\t0000C80A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
            eth0\t00000000\t0100C80A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n";
        assert_eq!(default_route_in(table).as_deref(), Some("eth0"));
        let none = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n\
            eth0\t0000C80A\t00000000\t0001\t0\t0\t0\t00FFFFFF\n";
        assert_eq!(default_route_in(none), None);
    }

    /// Lines as the kernel writes them; the last default is the kernel's unreachable one on lo.
    #[test]
    fn the_ipv6_default_route_with_the_lowest_metric_names_the_underlay_of_an_ipv6_only_network() {
        let zero = "00000000000000000000000000000000";
        let line = |dest: &str, len: &str, metric: &str, flags: &str, dev: &str| {
            format!("{dest} {len} {zero} 00 fd000000000000000000000000000001 {metric} 00000001 00000000 {flags} {dev}\n")
        };
        let table = [
            line(
                "fd000000000000000000000000000000",
                "40",
                "00000100",
                "00000001",
                "eth0",
            ),
            line(zero, "00", "00000400", "00000003", "eth1"),
            line(zero, "00", "00000200", "00000003", "eth0"),
            line(zero, "00", "ffffffff", "00200200", "lo"),
        ]
        .concat();
        assert_eq!(ipv6_default_route_in(&table).as_deref(), Some("eth0"));
        let unreachable_only = line(zero, "00", "ffffffff", "00200200", "lo");
        assert_eq!(ipv6_default_route_in(&unreachable_only), None);
    }
}
