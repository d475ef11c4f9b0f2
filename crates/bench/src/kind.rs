//! The compared paths by name, and what each carries.

use std::fmt;
use std::str::FromStr;

/// One compared path; `--paths` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    Native,
    HostGw,
    Vxlan,
    Ipip,
    TwillUdp,
    /// flannel's udp wire on twill's eBPF dataplane (`--dataplane ebpf`), attached as the
    /// kernel prefers (tcx from 6.6).
    TwillEbpf,
    /// The same programs on classic TC filters (`--bpf-attach tc`), as kernels before 6.6 run
    /// them.
    TwillEbpfTc,
    /// twill-ebpf decapsulating at XDP on the lab's veth underlay (`--bpf-xdp on`; `auto`
    /// leaves a veth to TC): against twill-ebpf, what XDP ingress gives there.
    TwillEbpfXdp,
    /// An eBPF node (host 0) and a TUN node (host 1), as in a cluster moving to twill's eBPF
    /// dataplane: what the eBPF node sends goes through its segmenter on the lab's veth, and
    /// `-R` carries the TUN node's GSO trains into it.
    TwillEbpfTun,
    /// twill-ebpf over the IPv6 underlay (`Backend.Underlay` "ipv6"): both families in outer
    /// IPv6, on a dual-stack network whichever numbers are measured.
    TwillEbpfUnderlay6,
    TwillBatch,
    TwillWireguard,
    /// The reference for twill-wireguard: wireguard-go on both hosts.
    WireguardGo,
}

impl PathKind {
    /// The `Backend.Type` a twill path runs.
    pub(crate) fn twill_backend(self) -> Option<&'static str> {
        match self {
            PathKind::TwillUdp
            | PathKind::TwillEbpf
            | PathKind::TwillEbpfTc
            | PathKind::TwillEbpfXdp
            | PathKind::TwillEbpfTun
            | PathKind::TwillEbpfUnderlay6 => Some("udp"),
            PathKind::TwillBatch => Some("twill-batch"),
            PathKind::TwillWireguard => Some("wireguard"),
            _ => None,
        }
    }

    /// Why the path carries no IPv6 (its IPv6 numbers read n/a), or None where it carries IPv6
    /// on a dual-stack network.
    pub fn no_ipv6(self) -> Option<&'static str> {
        match self {
            PathKind::Ipip => Some("ipip carries IPv4 only (flannel's ipip backend has no IPv6)"),
            PathKind::WireguardGo => {
                Some("the reference for twill-wireguard's IPv4 number, set up for IPv4 only")
            }
            _ => None,
        }
    }

    /// Whether the path runs only on a dual-stack network (its IPv4 numbers too).
    pub fn needs_ipv6(self) -> bool {
        self == PathKind::TwillEbpfUnderlay6
    }

    /// `Backend` fields of a twill path besides its `Type`, as JSON members.
    pub(crate) fn backend_fields(self) -> &'static str {
        match self {
            PathKind::TwillEbpfUnderlay6 => r#","Underlay":"ipv6""#,
            _ => "",
        }
    }

    /// `twill run` arguments of a twill path on host `host` besides the common ones.
    pub(crate) fn twill_args(self, host: usize) -> &'static [&'static str] {
        match self {
            PathKind::TwillEbpfTun if host == 0 => &["--dataplane", "ebpf"],
            PathKind::TwillEbpfTun => &["--dataplane", "tun"],
            PathKind::TwillUdp => &["--dataplane", "tun"],
            PathKind::TwillEbpf | PathKind::TwillEbpfUnderlay6 => &["--dataplane", "ebpf"],
            PathKind::TwillEbpfTc => &["--dataplane", "ebpf", "--bpf-attach", "tc"],
            PathKind::TwillEbpfXdp => &["--dataplane", "ebpf", "--bpf-xdp", "on"],
            _ => &[],
        }
    }

    pub const ALL: [PathKind; 13] = [
        PathKind::Native,
        PathKind::HostGw,
        PathKind::Vxlan,
        PathKind::Ipip,
        PathKind::TwillUdp,
        PathKind::TwillEbpf,
        PathKind::TwillEbpfTc,
        PathKind::TwillEbpfXdp,
        PathKind::TwillEbpfTun,
        PathKind::TwillEbpfUnderlay6,
        PathKind::TwillBatch,
        PathKind::TwillWireguard,
        PathKind::WireguardGo,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PathKind::Native => "native",
            PathKind::HostGw => "host-gw",
            PathKind::Vxlan => "vxlan",
            PathKind::Ipip => "ipip",
            PathKind::TwillUdp => "twill-udp",
            PathKind::TwillEbpf => "twill-ebpf",
            PathKind::TwillEbpfTc => "twill-ebpf-tc",
            PathKind::TwillEbpfXdp => "twill-ebpf-xdp",
            PathKind::TwillEbpfTun => "twill-ebpf-tun",
            PathKind::TwillEbpfUnderlay6 => "twill-ebpf-u6",
            PathKind::TwillBatch => "twill-batch",
            PathKind::TwillWireguard => "twill-wireguard",
            PathKind::WireguardGo => "wireguard-go",
        }
    }
}

impl fmt::Display for PathKind {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PathKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        PathKind::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = PathKind::ALL.iter().map(|p| p.name()).collect();
                format!("unknown path {s:?}; known: {}", names.join(","))
            })
    }
}
