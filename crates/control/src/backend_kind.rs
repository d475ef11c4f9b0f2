//! The backends twill runs, each one value: its name (the config's `Backend.Type`, the lease's
//! `BackendType`), the networks it runs, the config fields it reads and how its peers are
//! reached. Every other module asks a [`BackendKind`] instead of comparing names,
//! so a new backend is its module under `backend/` plus one variant here: each `match` on the
//! kind that must know it (the daemon's start, the lease gate's data checks, the sweep, the
//! upkeep, the Kubernetes annotations) then fails to compile until it does.

use std::fmt;
use twill_dataplane::engine::wireguard;
use twill_dataplane::wire::{batch, flannel};

/// The port the kernel gives a VXLAN device created without one (flannel's `Port` 0 or
/// none), not IANA's 4789.
pub const KERNEL_VXLAN_PORT: u16 = 8472;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// flannel's `vxlan`: the kernel's VXLAN device `flannel.<VNI>` (and `flannel-v6.<VNI>`).
    Vxlan,
    /// flannel's `host-gw`: a route to each peer via its PublicIP.
    HostGw,
    /// flannel's `udp`: flannel's wire from a TUN, in userspace or in eBPF.
    Udp,
    /// twill's own batching wire from a TUN.
    TwillBatch,
    /// flannel's `wireguard`: `flannel-wg`, the kernel's or twill's userspace WireGuard.
    Wireguard,
    /// flannel's `ipip`: the kernel's `flannel.ipip`.
    Ipip,
}

impl BackendKind {
    /// Every backend twill runs, in the order the messages list them.
    pub const ALL: [BackendKind; 6] = [
        BackendKind::Vxlan,
        BackendKind::HostGw,
        BackendKind::Udp,
        BackendKind::TwillBatch,
        BackendKind::Wireguard,
        BackendKind::Ipip,
    ];

    /// The backend of a config without a `Backend` object, as in flannel.
    pub const DEFAULT: BackendKind = BackendKind::Udp;

    /// Its `Backend.Type` and `BackendType`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Vxlan => "vxlan",
            BackendKind::HostGw => "host-gw",
            BackendKind::Udp => "udp",
            BackendKind::TwillBatch => "twill-batch",
            BackendKind::Wireguard => "wireguard",
            BackendKind::Ipip => "ipip",
        }
    }

    /// The backend named `name`, if twill runs it (flannel has others: `alloc`, `extension`).
    pub fn parse(name: &str) -> Option<BackendKind> {
        BackendKind::ALL
            .into_iter()
            .find(|kind| kind.name() == name)
    }

    /// The backend a lease's `BackendType` names: flannel's udp backend writes none.
    pub fn of_lease(backend_type: Option<&str>) -> Option<BackendKind> {
        backend_type.map_or(Some(BackendKind::Udp), BackendKind::parse)
    }

    /// The `BackendType` its leases carry: none for udp, as flanneld writes none.
    pub fn lease_type(self) -> Option<&'static str> {
        (self != BackendKind::Udp).then(|| self.name())
    }

    /// The UDP port its datagrams go to when the config names none (`Backend.Port`,
    /// wireguard's `ListenPort`); none for a backend that sends no UDP of its own.
    pub fn default_port(self) -> Option<u16> {
        match self {
            BackendKind::Udp => Some(flannel::DEFAULT_PORT),
            BackendKind::TwillBatch => Some(batch::DEFAULT_PORT),
            BackendKind::Vxlan => Some(KERNEL_VXLAN_PORT),
            BackendKind::Wireguard => Some(wireguard::DEFAULT_PORT),
            BackendKind::HostGw | BackendKind::Ipip => None,
        }
    }

    /// Whether it carries a dual-stack network's IPv6 side.
    pub fn runs_dual_stack(self) -> bool {
        self != BackendKind::Ipip
    }

    /// Whether it runs an IPv6-only network (`EnableIPv4` false), as flannel's do.
    pub fn runs_ipv6_only(self) -> bool {
        matches!(self, BackendKind::Vxlan | BackendKind::HostGw)
    }

    /// Whether its datagrams come from a userspace engine on a TUN, which knows each peer by
    /// its address and port and may send over the IPv6 underlay (`Backend.Underlay`).
    pub fn userspace(self) -> bool {
        matches!(self, BackendKind::Udp | BackendKind::TwillBatch)
    }

    /// Whether the eBPF dataplane carries its wire (`--dataplane ebpf`).
    pub fn runs_on_ebpf(self) -> bool {
        self == BackendKind::Udp
    }

    /// The `Backend` fields it reads, besides `Type`.
    pub fn config_fields(self) -> &'static [&'static str] {
        match self {
            BackendKind::Udp | BackendKind::TwillBatch => &["Port", "Underlay"],
            BackendKind::Vxlan => &["VNI", "Port", "GBP", "Learning", "DirectRouting", "MTU"],
            BackendKind::Ipip => &["DirectRouting"],
            BackendKind::Wireguard => &[
                "ListenPort",
                "ListenPortV6",
                "PSK",
                "PersistentKeepaliveInterval",
                "Mode",
                "MTU",
            ],
            BackendKind::HostGw => &[],
        }
    }

    /// The names of those of [`BackendKind::ALL`] that `keep` keeps, joined by `sep`.
    pub fn names(keep: impl Fn(BackendKind) -> bool, sep: &str) -> String {
        let names: Vec<&str> = BackendKind::ALL
            .into_iter()
            .filter(|k| keep(*k))
            .map(BackendKind::name)
            .collect();
        names.join(sep)
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::BackendKind;

    #[test]
    fn default_ports_are_flannels() {
        let port = |kind: BackendKind| kind.default_port();
        assert_eq!(port(BackendKind::Udp), Some(8285));
        assert_eq!(port(BackendKind::Vxlan), Some(8472));
        assert_eq!(port(BackendKind::Wireguard), Some(51820));
        assert_eq!(port(BackendKind::HostGw), None);
        assert_eq!(port(BackendKind::Ipip), None);
        assert!(port(BackendKind::TwillBatch).is_some());
    }

    #[test]
    fn names_read_back() {
        for kind in BackendKind::ALL {
            assert_eq!(BackendKind::parse(kind.name()), Some(kind));
        }
        assert_eq!(BackendKind::parse("alloc"), None);
        assert_eq!(BackendKind::parse("UDP"), None);
    }

    #[test]
    fn a_lease_without_a_type_is_udp() {
        assert_eq!(BackendKind::of_lease(None), Some(BackendKind::Udp));
        assert_eq!(BackendKind::of_lease(Some("udp")), Some(BackendKind::Udp));
        assert_eq!(BackendKind::of_lease(Some("extension")), None);
        assert_eq!(BackendKind::Udp.lease_type(), None);
        assert_eq!(BackendKind::Vxlan.lease_type(), Some("vxlan"));
    }

    #[test]
    fn networks_each_runs() {
        let dual = BackendKind::names(BackendKind::runs_dual_stack, ", ");
        assert_eq!(dual, "vxlan, host-gw, udp, twill-batch, wireguard");
        let v6 = BackendKind::names(BackendKind::runs_ipv6_only, " and ");
        assert_eq!(v6, "vxlan and host-gw");
    }
}
