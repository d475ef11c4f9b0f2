//! `--dataplane`: which engine carries the udp backend's wire on this node, the TUN engine in
//! userspace or the eBPF programs in the kernel. The wire and the lease are the same either way,
//! so the choice is per node and peers never see it.

use crate::backend_kind::BackendKind;
use crate::config::Underlay;
use crate::node::{DataplaneChoice, Node};
use anyhow::bail;
use std::fmt;

/// The engine that runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dataplane {
    Tun,
    Ebpf,
}

/// Decides the engine for this node's backend, checking the kernel where eBPF is wanted.
/// `--dataplane ebpf` on a kernel that cannot run it, or with a backend other than udp, is an
/// error; `auto` says at start which engine it picked and why.
pub fn choose(node: &Node) -> anyhow::Result<Dataplane> {
    let network = Network {
        backend: &node.config.backend.backend_type,
        underlay: node.config.backend.underlay,
    };
    let bpf_dir = &node.options.bpf_dir;
    let runs = || {
        twill_ebpf::probe().map_err(|missing| missing.to_string())?;
        twill_ebpf::can_pin(bpf_dir)
    };
    decide(node.options.dataplane, network, runs)
}

/// What of the network decides whether the eBPF programs can carry it. Both families are
/// carried (an IPv6-only network is refused before, as on the TUN: the udp backend needs an
/// IPv4 subnet), over the IPv4 underlay only.
#[derive(Debug, Clone, Copy)]
struct Network<'a> {
    backend: &'a str,
    underlay: Underlay,
}

fn decide<E: fmt::Display>(
    wanted: DataplaneChoice,
    network: Network,
    probe: impl FnOnce() -> Result<(), E>,
) -> anyhow::Result<Dataplane> {
    let Network { backend, underlay } = network;
    let ipv6_underlay = underlay == Underlay::Ipv6;
    let on_ebpf = BackendKind::parse(backend).is_some_and(BackendKind::runs_on_ebpf);
    match wanted {
        DataplaneChoice::Tun => Ok(Dataplane::Tun),
        DataplaneChoice::Ebpf if !on_ebpf => bail!(
            "--dataplane ebpf carries flannel's udp wire only, and this network's backend is \
             {backend}: leave --dataplane out, or give tun"
        ),
        DataplaneChoice::Ebpf if ipv6_underlay => bail!(
            "--dataplane ebpf sends over the IPv4 underlay only, and this network's \
             Backend.Underlay is ipv6: leave --dataplane out, or give tun"
        ),
        DataplaneChoice::Ebpf => match probe() {
            Ok(()) => Ok(Dataplane::Ebpf),
            Err(missing) => bail!("--dataplane ebpf cannot run here: {missing}"),
        },
        DataplaneChoice::Auto if !on_ebpf => Ok(Dataplane::Tun),
        DataplaneChoice::Auto if ipv6_underlay => {
            tracing::info!(
                "dataplane: tun (--dataplane auto; the eBPF dataplane sends over the IPv4 \
                 underlay only, and this network's Backend.Underlay is ipv6)"
            );
            Ok(Dataplane::Tun)
        }
        DataplaneChoice::Auto => match probe() {
            Ok(()) => {
                tracing::info!("dataplane: ebpf (--dataplane auto; this kernel runs it)");
                Ok(Dataplane::Ebpf)
            }
            Err(missing) => {
                tracing::info!("dataplane: tun (--dataplane auto; eBPF cannot run: {missing})");
                Ok(Dataplane::Tun)
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs() -> Result<(), String> {
        Ok(())
    }

    fn lacks() -> Result<(), String> {
        Err("the kernel has no tcx links and no clsact qdisc".into())
    }

    #[test]
    fn the_flag_reads_three_words_and_names_them_when_wrong() {
        assert_eq!("auto".parse(), Ok(DataplaneChoice::Auto));
        assert_eq!("ebpf".parse(), Ok(DataplaneChoice::Ebpf));
        assert_eq!("tun".parse(), Ok(DataplaneChoice::Tun));
        let err = "epbf".parse::<DataplaneChoice>().unwrap_err();
        assert_eq!(err, r#""epbf" is not a dataplane; give tun, ebpf or auto"#);
    }

    fn net(backend: &str, underlay: Underlay) -> Network<'_> {
        Network { backend, underlay }
    }

    #[test]
    fn ebpf_is_an_error_where_it_cannot_run_and_auto_falls_back() {
        let udp = net("udp", Underlay::Ipv4);
        assert_eq!(
            decide(DataplaneChoice::Ebpf, udp, runs).unwrap(),
            Dataplane::Ebpf
        );
        let err = decide(DataplaneChoice::Ebpf, udp, lacks)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "--dataplane ebpf cannot run here: the kernel has no tcx links and no clsact qdisc"
        );
        assert_eq!(
            decide(DataplaneChoice::Auto, udp, lacks).unwrap(),
            Dataplane::Tun
        );
        assert_eq!(
            decide(DataplaneChoice::Auto, udp, runs).unwrap(),
            Dataplane::Ebpf
        );
        assert_eq!(
            decide(DataplaneChoice::Tun, udp, runs).unwrap(),
            Dataplane::Tun
        );
    }

    #[test]
    fn ebpf_with_another_backend_or_the_ipv6_underlay_is_refused_and_auto_keeps_the_tun() {
        let vxlan = net("vxlan", Underlay::Ipv4);
        let err = decide(DataplaneChoice::Ebpf, vxlan, runs)
            .unwrap_err()
            .to_string();
        assert!(err.contains("this network's backend is vxlan"), "{err}");
        assert_eq!(
            decide(DataplaneChoice::Auto, vxlan, runs).unwrap(),
            Dataplane::Tun
        );
        let over_ipv6 = net("udp", Underlay::Ipv6);
        let err = decide(DataplaneChoice::Ebpf, over_ipv6, runs)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("IPv4 underlay only, and this network's Backend.Underlay is ipv6"),
            "{err}"
        );
        assert_eq!(
            decide(DataplaneChoice::Auto, over_ipv6, runs).unwrap(),
            Dataplane::Tun
        );
    }
}
