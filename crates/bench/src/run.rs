//! Orchestration: set every path up, then measure in rounds (each round visits every path once,
//! so slow drift of a shared, noisy machine spreads over all paths instead of biasing one).

use crate::measure::{Field, Measurement, Timing};
use crate::paths::{PathKind, PathLab, Twill};
use crate::report::PathResult;
use std::collections::BTreeMap;
use std::io::IsTerminal;

#[derive(Debug, Clone)]
pub struct Options {
    pub paths: Vec<PathKind>,
    pub measurements: Vec<Measurement>,
    pub repeat: u32,
    pub timing: Timing,
    pub twill: Twill,
}

/// A path after set-up: ready to measure, or the reason it cannot be.
pub struct Prepared {
    pub kind: PathKind,
    pub lab: Result<PathLab, String>,
}

/// Builds every selected path's lab, dual-stack where IPv6 is measured and the path carries
/// it, or where the path needs it; a path that cannot be set up is kept with its reason.
pub fn prepare(opts: &Options, progress: &Progress) -> Vec<Prepared> {
    opts.paths
        .iter()
        .map(|&kind| {
            progress.show(&format!("setting up {kind}"));
            let ipv6 = kind.needs_ipv6() || (opts.measures_ipv6() && kind.no_ipv6().is_none());
            let lab = PathLab::new(kind, &opts.twill, ipv6).map_err(|e| format!("{e:#}"));
            Prepared { kind, lab }
        })
        .collect()
}

impl Options {
    fn measures_ipv6(&self) -> bool {
        self.measurements.contains(&Measurement::Tcp6)
    }
}

/// `repeat` rounds of every measurement on every ready path (tcp6 on those set up dual-stack).
pub fn measure(prepared: &[Prepared], opts: &Options, progress: &Progress) -> Vec<PathResult> {
    let mut results: Vec<PathResult> = prepared.iter().map(|p| initial_result(p, opts)).collect();
    for round in 1..=opts.repeat {
        for (p, result) in prepared.iter().zip(&mut results) {
            let Ok(lab) = &p.lab else { continue };
            let measurements = opts.measurements.iter();
            for &m in measurements.filter(|m| **m != Measurement::Tcp6 || lab.has_ipv6()) {
                progress.show(&format!(
                    "[round {round}/{}] {}: {} ({} s)",
                    opts.repeat,
                    p.kind,
                    m.label(),
                    m.seconds(&opts.timing)
                ));
                record(result, m, m.run(&lab.endpoints(), &opts.timing));
            }
        }
    }
    progress.clear();
    results
}

/// No samples yet; the reason the path is unavailable, and why it has no IPv6 numbers where
/// they are measured and it carries none.
fn initial_result(p: &Prepared, opts: &Options) -> PathResult {
    let no_ipv6 = opts.measures_ipv6().then(|| p.kind.no_ipv6()).flatten();
    PathResult {
        path: p.kind.name().to_string(),
        available: p.lab.is_ok(),
        note: p
            .lab
            .as_ref()
            .err()
            .map(|why| format!("unavailable: {why}"))
            .unwrap_or_default(),
        no_ipv6: no_ipv6.map(str::to_string),
        samples: BTreeMap::new(),
    }
}

/// Keeps the values of a run; of failures only the first per measurement, for the note.
fn record(result: &mut PathResult, m: Measurement, outcome: anyhow::Result<Vec<(Field, f64)>>) {
    match outcome {
        Ok(values) => {
            for (field, value) in values {
                result.samples.entry(field).or_default().push(value);
            }
        }
        Err(e) if !result.note.contains(m.label()) => {
            let sep = if result.note.is_empty() { "" } else { "; " };
            result.note += &format!("{sep}{} failed: {e:#}", m.label());
        }
        Err(_) => {}
    }
}

/// One status line on stderr: rewritten in place on a terminal, one line per step otherwise
/// (CI logs).
pub struct Progress {
    tty: bool,
}

impl Progress {
    pub fn new() -> Progress {
        Progress {
            tty: std::io::stderr().is_terminal(),
        }
    }

    pub fn show(&self, msg: &str) {
        if self.tty {
            eprint!("\r\x1b[2K{msg}");
        } else {
            eprintln!("{msg}");
        }
    }

    pub fn clear(&self) {
        if self.tty {
            eprint!("\r\x1b[2K");
        }
    }
}

impl Default for Progress {
    fn default() -> Self {
        Progress::new()
    }
}
