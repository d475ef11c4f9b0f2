//! The compiled programs (build.rs builds bpf/udp.bpf.c on every build) and how they load:
//! with a pin directory the maps are the ones pinned there, created and pinned when absent, so
//! a second load shares the first one's peers and counters.

use crate::maps::MAP_NAMES;
use anyhow::Context;
use aya::programs::{ProgramError, SchedClassifier, TcAttachType, Xdp};
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

/// Parse the object, create (or, with `pins`, open) its maps and load the TC programs of
/// `sides`, the ones that will be attached: a program this kernel refuses costs only itself,
/// where it is one a node can run without (the XDP program: [`load_xdp`]).
pub(crate) fn load(pins: Option<&Path>, sides: &[Side]) -> anyhow::Result<Ebpf> {
    let mut loader = EbpfLoader::new();
    if let Some(dir) = pins {
        for name in MAP_NAMES {
            loader.map_pin_path(name, dir.join(name));
        }
    }
    let mut ebpf = loader.load(OBJECT).context("loading the eBPF object")?;
    for &side in sides {
        load_tc(&mut ebpf, side)?;
    }
    Ok(ebpf)
}

/// Load the TC program of `side` (a no-op once loaded).
pub(crate) fn load_tc(ebpf: &mut Ebpf, side: Side) -> anyhow::Result<()> {
    let program = program(ebpf, side)?;
    if program.fd().is_ok() {
        return Ok(());
    }
    program
        .load()
        .map_err(|e| anyhow::anyhow!("{}", refusal(side.program_name(), &e)))
}

/// Load the XDP program (a no-op once loaded). `Ok(Err(why))` when the kernel refuses it: the
/// verifier's reason in one line, for a node that then decapsulates at TC alone.
pub(crate) fn load_xdp(ebpf: &mut Ebpf) -> anyhow::Result<Result<(), String>> {
    let program = xdp_program(ebpf)?;
    if program.fd().is_ok() {
        return Ok(Ok(()));
    }
    Ok(program.load().map_err(|e| refusal(XDP_INGRESS, &e)))
}

/// One line naming the program and why the kernel refused it: the verifier's own last word
/// (its log ends with statistics, which say nothing of why), else the error.
fn refusal(name: &str, error: &ProgramError) -> String {
    let ProgramError::LoadError {
        io_error,
        verifier_log,
    } = error
    else {
        return format!("loading {name}: {error}");
    };
    let log = verifier_log.to_string();
    let why = log
        .lines()
        .map(str::trim)
        .rfind(|line| !line.is_empty() && !is_statistics(line));
    match why {
        Some(why) => format!("the verifier refused {name}: {why}"),
        None => format!("the kernel refused {name}: {io_error}"),
    }
}

/// The lines a verifier log ends with whatever it decided.
fn is_statistics(line: &str) -> bool {
    [
        "processed ",
        "verification time",
        "stack depth",
        "max_states_per_insn",
        "-- END PROG LOAD LOG --",
    ]
    .iter()
    .any(|start| line.starts_with(start))
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
