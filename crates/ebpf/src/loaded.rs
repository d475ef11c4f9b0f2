//! The object loaded into the kernel: the programs asked for, its maps and the peers in them. Both
//! the attached dataplane and the probe hold one; `test_run` runs a program on a frame through
//! BPF_PROG_TEST_RUN without any device.

use crate::counters::{self, Counters};
use crate::maps::Maps;
use crate::object::{self, Side};
use crate::peers::PeerSet;
use aya::programs::{ProgramError, TestRun as _, TestRunOptions, TestRunResult};
use aya::Ebpf;
use std::path::Path;

/// What a program decided for a frame (its TC action).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// TC_ACT_OK: the stack takes the frame as it is.
    Pass,
    /// TC_ACT_SHOT: dropped (and counted under a reason).
    Drop,
    /// TC_ACT_REDIRECT: sent on, encapsulated to the underlay or decapsulated into the device.
    Redirect,
    Other(u32),
}

impl Verdict {
    fn of(action: u32) -> Verdict {
        match action {
            0 => Verdict::Pass,
            2 => Verdict::Drop,
            7 => Verdict::Redirect,
            other => Verdict::Other(other),
        }
    }
}

/// A program's verdict on one frame and the frame as it left the program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestOutput {
    pub verdict: Verdict,
    pub frame: Vec<u8>,
}

/// Room the egress program may add to a frame.
const GROWTH: usize = 64;

pub(crate) struct Loaded {
    pub ebpf: Ebpf,
    pub maps: Maps,
    pub peers: PeerSet,
}

impl Loaded {
    /// Load the object and the TC programs of `sides`; with `pins`, on the maps pinned there
    /// (see object::load).
    pub fn load(pins: Option<&Path>, sides: &[Side]) -> anyhow::Result<Loaded> {
        let mut ebpf = object::load(pins, sides)?;
        let mut maps = Maps::take(&mut ebpf)?;
        let peers = PeerSet::read(&mut maps)?;
        Ok(Loaded { ebpf, maps, peers })
    }

    pub fn counters(&self) -> anyhow::Result<Counters> {
        counters::read(&self.maps, &self.peers)
    }

    pub fn totals(&self) -> anyhow::Result<Counters> {
        counters::read_totals(&self.maps)
    }

    /// Run one TC program on `frame` (an Ethernet frame) with BPF_PROG_TEST_RUN: its counters
    /// and maps are the real ones, its redirects are only reported.
    pub fn test_run(&mut self, side: Side, frame: &[u8]) -> anyhow::Result<TestOutput> {
        object::load_tc(&mut self.ebpf, side)?;
        let program = object::program(&mut self.ebpf, side)?;
        let (action, frame) = run(side.program_name(), frame, |o| program.test_run(o))?;
        Ok(TestOutput {
            verdict: Verdict::of(action),
            frame,
        })
    }

    /// Load the XDP program if it is not (`Ok(Err(why))`: the kernel refused it).
    pub fn load_xdp(&mut self) -> anyhow::Result<Result<(), String>> {
        object::load_xdp(&mut self.ebpf)
    }

    /// [`Loaded::test_run`] for the XDP program (loaded now if it is not); its verdicts read as
    /// the TC ones: XDP_PASS is [`Verdict::Pass`] (the frame, decapsulated or not, goes up the
    /// stack).
    pub fn test_run_xdp(&mut self, frame: &[u8]) -> anyhow::Result<TestOutput> {
        self.load_xdp()?.map_err(anyhow::Error::msg)?;
        let program = object::xdp_program(&mut self.ebpf)?;
        let (action, frame) = run(object::XDP_INGRESS, frame, |o| program.test_run(o))?;
        let verdict = match action {
            1 => Verdict::Drop,
            2 => Verdict::Pass,
            other => Verdict::Other(other),
        };
        Ok(TestOutput { verdict, frame })
    }
}

/// One BPF_PROG_TEST_RUN of the program `name` on `frame`: its return value and the frame it
/// left.
fn run(
    name: &str,
    frame: &[u8],
    test_run: impl FnOnce(TestRunOptions<'_>) -> Result<TestRunResult, ProgramError>,
) -> anyhow::Result<(u32, Vec<u8>)> {
    let mut out = vec![0u8; frame.len() + GROWTH];
    let result = test_run(TestRunOptions {
        data_in: Some(frame),
        data_out: Some(&mut out),
        ..TestRunOptions::default()
    })
    .map_err(|e| {
        let why = match &e {
            ProgramError::SyscallError(s) => s.io_error.to_string(),
            other => other.to_string(),
        };
        anyhow::anyhow!("BPF_PROG_TEST_RUN of {name}: {why}")
    })?;
    out.truncate(result.data_size_out as usize);
    Ok((result.return_value, out))
}
