//! `--dataplane`: which engine carries the udp backend's wire on this node, the TUN engine in
//! userspace or the eBPF programs in the kernel. The wire and the lease are the same either way,
//! so the choice is per node and peers never see it.

use crate::backend_kind::BackendKind;
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
/// error; `auto` (the default) says at start which engine it picked and why.
pub fn choose(node: &Node) -> anyhow::Result<Dataplane> {
    let backend = &node.config.backend.backend_type;
    let bpf_dir = &node.options.bpf_dir;
    let runs = || {
        twill_ebpf::probe().map_err(|missing| missing.to_string())?;
        twill_ebpf::can_pin(bpf_dir)
    };
    let underlay = || Underlay::of(&node.iface.name);
    decide(node.options.dataplane, backend, runs, underlay)
}

/// What `auto` asks of the underlay once the kernel runs the programs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Underlay {
    /// A device that puts frames on a wire (a NIC, virtio's included): it segments and
    /// checksums what the eBPF programs send, as it does for any traffic.
    Wire,
    /// A veth, where the lab's clusters (and kind's) run, or a device on one (a bridge with a
    /// veth port): the programs run there too, with a segmenter for the peers that read
    /// datagrams (docs/decisions.md, "A veth underlay is not a wire").
    Veth(twill_ebpf::VethUnder),
    /// What it is could not be read (rtnetlink refused, the device is gone): `auto` keeps the
    /// engine that runs on any device.
    Unknown(String),
}

impl Underlay {
    fn of(iface: &str) -> Underlay {
        match twill_ebpf::veth_under(iface) {
            Ok(Some(veth)) => Underlay::Veth(veth),
            Ok(None) => Underlay::Wire,
            Err(e) => Underlay::Unknown(format!("{e:#}")),
        }
    }
}

/// The network's `backend` decides whether the eBPF programs can carry it: both families are
/// carried (an IPv6-only network is refused before, as on the TUN: the udp backend needs an
/// IPv4 subnet), over either underlay (`Backend.Underlay`).
fn decide<E: fmt::Display>(
    wanted: DataplaneChoice,
    backend: &str,
    probe: impl FnOnce() -> Result<(), E>,
    underlay: impl FnOnce() -> Underlay,
) -> anyhow::Result<Dataplane> {
    let on_ebpf = BackendKind::parse(backend).is_some_and(BackendKind::runs_on_ebpf);
    match wanted {
        DataplaneChoice::Tun => Ok(Dataplane::Tun),
        DataplaneChoice::Ebpf if !on_ebpf => bail!(
            "--dataplane ebpf carries flannel's udp wire only, and this network's backend is \
             {backend}: leave --dataplane out, or give tun"
        ),
        DataplaneChoice::Ebpf => match probe() {
            Ok(()) => Ok(Dataplane::Ebpf),
            Err(missing) => bail!("--dataplane ebpf cannot run here: {missing}"),
        },
        DataplaneChoice::Auto if !on_ebpf => Ok(Dataplane::Tun),
        DataplaneChoice::Auto => {
            if let Err(missing) = probe() {
                tracing::info!("dataplane: tun (--dataplane auto; eBPF cannot run: {missing})");
                return Ok(Dataplane::Tun);
            }
            match underlay() {
                Underlay::Wire => {
                    tracing::info!("dataplane: ebpf (--dataplane auto; this kernel runs it)");
                    Ok(Dataplane::Ebpf)
                }
                Underlay::Veth(veth) => {
                    tracing::info!(
                        "dataplane: ebpf (--dataplane auto; this kernel runs it; {veth}: a \
                         segmenter carries what TUN and flanneld peers read)"
                    );
                    Ok(Dataplane::Ebpf)
                }
                Underlay::Unknown(why) => {
                    tracing::info!(
                        "dataplane: tun (--dataplane auto; what the underlay is cannot be read: {why})"
                    );
                    Ok(Dataplane::Tun)
                }
            }
        }
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

    fn wire() -> Underlay {
        Underlay::Wire
    }

    #[test]
    fn the_flag_reads_three_words_and_names_them_when_wrong() {
        assert_eq!("auto".parse(), Ok(DataplaneChoice::Auto));
        assert_eq!("ebpf".parse(), Ok(DataplaneChoice::Ebpf));
        assert_eq!("tun".parse(), Ok(DataplaneChoice::Tun));
        let err = "epbf".parse::<DataplaneChoice>().unwrap_err();
        assert_eq!(err, r#""epbf" is not a dataplane; give tun, ebpf or auto"#);
    }

    #[test]
    fn ebpf_is_an_error_where_it_cannot_run_and_auto_falls_back() {
        let udp = "udp";
        assert_eq!(
            decide(DataplaneChoice::Ebpf, udp, runs, wire).unwrap(),
            Dataplane::Ebpf
        );
        let err = decide(DataplaneChoice::Ebpf, udp, lacks, wire)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "--dataplane ebpf cannot run here: the kernel has no tcx links and no clsact qdisc"
        );
        assert_eq!(
            decide(DataplaneChoice::Auto, udp, lacks, wire).unwrap(),
            Dataplane::Tun
        );
        assert_eq!(
            decide(DataplaneChoice::Auto, udp, runs, wire).unwrap(),
            Dataplane::Ebpf
        );
        assert_eq!(
            decide(DataplaneChoice::Tun, udp, runs, wire).unwrap(),
            Dataplane::Tun
        );
    }

    #[test]
    fn ebpf_with_another_backend_is_refused_and_auto_keeps_the_tun() {
        let vxlan = "vxlan";
        let err = decide(DataplaneChoice::Ebpf, vxlan, runs, wire)
            .unwrap_err()
            .to_string();
        assert!(err.contains("this network's backend is vxlan"), "{err}");
        assert_eq!(
            decide(DataplaneChoice::Auto, vxlan, runs, wire).unwrap(),
            Dataplane::Tun
        );
    }

    #[test]
    fn auto_runs_ebpf_on_a_veth_and_keeps_the_tun_on_an_unknown_underlay() {
        let udp = "udp";
        let veth = || {
            Underlay::Veth(twill_ebpf::VethUnder {
                underlay: "eth0".into(),
                veth: "eth0".into(),
            })
        };
        let unknown = || Underlay::Unknown("no device eth0 in this network namespace".into());
        assert_eq!(
            decide(DataplaneChoice::Auto, udp, runs, veth).unwrap(),
            Dataplane::Ebpf
        );
        assert_eq!(
            decide(DataplaneChoice::Auto, udp, runs, unknown).unwrap(),
            Dataplane::Tun
        );
        assert_eq!(
            decide(DataplaneChoice::Ebpf, udp, runs, unknown).unwrap(),
            Dataplane::Ebpf
        );
        // A kernel that cannot run the programs is the reason given, whatever the underlay.
        let never = || -> Underlay { panic!("the underlay was asked after the probe failed") };
        assert_eq!(
            decide(DataplaneChoice::Auto, udp, lacks, never).unwrap(),
            Dataplane::Tun
        );
    }
}
