//! The compiled programs (build.rs builds bpf/udp.bpf.c on every build) and how they load:
//! with a pin directory the maps are the ones pinned there, created and pinned when absent, so
//! a second load shares the first one's peers and counters.

use crate::maps::MAP_NAMES;
use anyhow::Context;
use aya::programs::{SchedClassifier, TcAttachType, Xdp};
use aya::{Ebpf, EbpfLoader};
use std::path::Path;

/// The object clang built, aligned as the ELF parser wants it.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/udp.bpf.o"));

/// Which of the TC programs: they run on different devices and hooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Encapsulation, at the egress of twill's device.
    Egress,
    /// Decapsulation, at the ingress of the underlay.
    Ingress,
    /// Either, for what comes back from the segmenter, at the ingress of its receiving end
    /// (crate::segmenter; on a veth underlay only).
    Segmented,
}

impl Side {
    /// The two every node runs.
    pub const BOTH: [Side; 2] = [Side::Egress, Side::Ingress];
    pub const ALL: [Side; 3] = [Side::Egress, Side::Ingress, Side::Segmented];

    /// The program's function name in bpf/udp.bpf.c (also the name clsact filters carry).
    pub fn program_name(self) -> &'static str {
        match self {
            Side::Egress => "twill_egress",
            Side::Ingress => "twill_ingress",
            Side::Segmented => "twill_segmented",
        }
    }

    pub(crate) fn attach_type(self) -> TcAttachType {
        match self {
            Side::Egress => TcAttachType::Egress,
            Side::Ingress | Side::Segmented => TcAttachType::Ingress,
        }
    }
}

/// The XDP program that decapsulates on the underlay before GRO (twill_ingress at TC moves what
/// it decapsulated into the device, and does the whole job where it is not attached).
pub(crate) const XDP_INGRESS: &str = "twill_xdp_ingress";

/// Parse the object, create (or, with `pins`, open) its maps and load its four programs.
pub(crate) fn load(pins: Option<&Path>) -> anyhow::Result<Ebpf> {
    let mut loader = EbpfLoader::new();
    if let Some(dir) = pins {
        for name in MAP_NAMES {
            loader.map_pin_path(name, dir.join(name));
        }
    }
    let mut ebpf = loader.load(OBJECT).context("loading the eBPF object")?;
    for side in Side::ALL {
        let program = program(&mut ebpf, side)?;
        program
            .load()
            .with_context(|| format!("the verifier refused {}", side.program_name()))?;
    }
    xdp_program(&mut ebpf)?
        .load()
        .with_context(|| format!("the verifier refused {XDP_INGRESS}"))?;
    Ok(ebpf)
}

/// One of the object's programs.
pub(crate) fn program(ebpf: &mut Ebpf, side: Side) -> anyhow::Result<&mut SchedClassifier> {
    let name = side.program_name();
    let program = ebpf
        .program_mut(name)
        .with_context(|| format!("the eBPF object has no program {name}"))?;
    Ok(program.try_into()?)
}

/// The object's XDP program.
pub(crate) fn xdp_program(ebpf: &mut Ebpf) -> anyhow::Result<&mut Xdp> {
    let program = ebpf
        .program_mut(XDP_INGRESS)
        .with_context(|| format!("the eBPF object has no program {XDP_INGRESS}"))?;
    Ok(program.try_into()?)
}
