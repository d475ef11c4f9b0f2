//! The log: to stderr (journald or the container runtime collects it), filtered by `RUST_LOG`
//! when set, else by the face's verbosity (flanneld's `-v`).

/// Third-party crates that stay quiet below warn whatever the verbosity: kube-rs logs each
/// failed connection attempt itself, at error level, on every retry, where twill's Kubernetes
/// registry says once what failed and what it does about it.
const QUIET: &str = "kube_client=off,kube_runtime=off";

/// twill's own crates, which `-v` turns up.
const OURS: [&str; 4] = ["twill", "twill_control", "twill_dataplane", "twill_ebpf"];

/// The filter for klog's verbosity `v` (flanneld's `-v`): 0 info, 1 to 4 debug for twill's
/// crates, 5 and more trace (klog's levels 5+ are flanneld's per-packet and per-request ones).
pub fn filter_for(v: i64) -> String {
    let level = match v {
        ..=0 => return format!("info,{QUIET}"),
        1..=4 => "debug",
        _ => "trace",
    };
    let ours: Vec<String> = OURS.iter().map(|c| format!("{c}={level}")).collect();
    format!("info,{},{QUIET}", ours.join(","))
}

/// Starts the log with `RUST_LOG`, else `default`.
pub fn init(default: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default.into()),
        )
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: in journald or a log file they are noise.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn klog_verbosity_maps_onto_twill_levels() {
        assert_eq!(filter_for(0), "info,kube_client=off,kube_runtime=off");
        let debug = filter_for(2);
        assert!(debug.contains("twill_control=debug") && debug.starts_with("info,"));
        assert!(filter_for(6).contains("twill_dataplane=trace"));
        for v in [-1, 0, 3, 9] {
            let filter = filter_for(v);
            assert!(
                filter.parse::<tracing_subscriber::EnvFilter>().is_ok(),
                "{filter}"
            );
        }
    }
}
