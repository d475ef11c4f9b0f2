//! The programs decode network input, so, as every decoder of twill's, they are run on input
//! no one crafted: random bytes, and flannel datagrams and inner packets mutated at random
//! (truncated, bytes flipped, lengths, versions, IHL, next header and fragment bits changed,
//! bytes added, over the IPv6 underlay a Fragment header put in: tests/common/mutation.rs),
//! through BPF_PROG_TEST_RUN with their real maps. The seed is fixed, so every run (and CI)
//! tries the same frames.
//!
//! Whatever the frame, the program gives a verdict; the kernel refuses only frames too short
//! for it to build an skb of (EINVAL). The counters move by at most one thing: a passed frame
//! counts nothing and comes back byte for byte, a dropped one counts one drop, a carried one
//! one packet of its direction (the XDP program passes what it carries up, decapsulated and
//! marked for the TC program), an answered one one drop, its answer the ICMP or ICMPv6 error
//! the userspace engine answers with (the XDP program leaves those to the TC one). And a frame is carried exactly when the userspace engine's own
//! checks (twill_dataplane; tests/common/engine_model.rs) would carry it, and leaves as they
//! would have it leave: from the underlay only a whole datagram from the peer whose inner
//! packet decodes and comes from inside the peer's subnet of its family. Inner packets are IPv4 and IPv6, over the IPv4 underlay
//! and over the IPv6 one (outer IPv6/UDP from the peer's IPv6 address, zero UDP checksum).

mod common;

use anyhow::anyhow;
use common::engine_model::{answered_by_userspace, carried_by_userspace, ethertype_of};
use common::frames::{datagram, datagram6, ethernet, hex, Ip, Ip6, ETH_IP, ETH_IPV6};
use common::mutation::{mutation, Underlay, FIRST_IP};
use common::test_run::{
    peer_subnet, test_bench, test_bench6, TestBench, HERE, HERE6, LOCAL, LOCAL6, PEER, PEER6, UDP,
};
use common::{DEVICE_MTU, PORT};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use std::cell::RefCell;
use std::net::{Ipv4Addr, Ipv6Addr};
use twill_ebpf::{Counters, PeerTraffic, Side, Traffic, Verdict};

/// Frames per program and per kind of input: `TWILL_RANDOM_FRAMES` where set (the guest
/// kernels' runner, tests/kernel_matrix.rs, runs fewer under QEMU's emulator), else this.
const CASES: u32 = 2_000;

fn cases() -> u32 {
    std::env::var("TWILL_RANDOM_FRAMES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CASES)
}
/// Longer than the device's MTU allows (1472 + 28 + 14), well short of the page
/// BPF_PROG_TEST_RUN's frame must fit in.
const MAX_FRAME: usize = 1_600;
const IPV4_HEADER: usize = 20;
const IPV6_HEADER: usize = 40;

/// A frame as a test input, shown as hex when a case fails.
#[derive(Clone)]
struct Frame(Vec<u8>);

impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes: {}", self.0.len(), hex(&self.0))
    }
}

/// Which program a frame goes through: a TC one, or the XDP one on the underlay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Program {
    Tc(Side),
    Xdp,
}

impl Program {
    const ALL: [Program; 3] = [
        Program::Tc(Side::Egress),
        Program::Tc(Side::Ingress),
        Program::Xdp,
    ];

    /// The ones this kernel loads (common::test_run::xdp_loads).
    fn loaded() -> anyhow::Result<Vec<Program>> {
        let xdp = common::test_run::xdp_loads()?;
        Ok(Program::ALL
            .into_iter()
            .filter(|&p| xdp || p != Program::Xdp)
            .collect())
    }

    /// The direction it carries in.
    fn side(self) -> Side {
        match self {
            Program::Tc(side) => side,
            Program::Xdp => Side::Ingress,
        }
    }
}

#[test]
fn random_bytes_get_a_verdict_and_at_most_one_count() -> anyhow::Result<()> {
    random_bytes(&test_bench("ebpf-randbytes")?, Underlay::V4, 1)
}

#[test]
fn mutated_flannel_frames_get_a_verdict_and_at_most_one_count() -> anyhow::Result<()> {
    mutated(&test_bench("ebpf-mutated")?, Underlay::V4, 2)
}

#[test]
fn over_the_ipv6_underlay_random_bytes_get_a_verdict_and_at_most_one_count() -> anyhow::Result<()> {
    random_bytes(&test_bench6("ebpf-randbytes6")?, Underlay::V6, 3)
}

#[test]
fn over_the_ipv6_underlay_mutated_flannel_frames_get_a_verdict_and_at_most_one_count(
) -> anyhow::Result<()> {
    mutated(&test_bench6("ebpf-mutated6")?, Underlay::V6, 4)
}

/// Random frames through every program of a node on `underlay`.
fn random_bytes(bench: &TestBench, underlay: Underlay, seed: u8) -> anyhow::Result<()> {
    for program in Program::loaded()? {
        run(bench, program, random_frames(underlay), seed)?;
    }
    Ok(())
}

/// Mutated frames of flannel's wire through every program of a node on `underlay`.
fn mutated(bench: &TestBench, underlay: Underlay, seed: u8) -> anyhow::Result<()> {
    for program in Program::loaded()? {
        let frames = mutated_frames(program.side(), underlay);
        run(bench, program, frames, seed)?.reached_every_outcome(program)?;
    }
    Ok(())
}

/// [`cases`] frames of `frames` through `program`, from a seed of its own.
fn run(
    bench: &TestBench,
    program: Program,
    frames: impl Strategy<Value = Frame>,
    seed: u8,
) -> anyhow::Result<Tally> {
    let config = Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]);
    let mut runner = TestRunner::new_with_rng(config, rng);
    let tally = RefCell::new(Tally::default());
    runner
        .run(&frames, |frame| {
            let outcome = check(bench, program, &frame.0).map_err(TestCaseError::fail)?;
            tally.borrow_mut().add(outcome);
            Ok(())
        })
        .map_err(|e| anyhow!("{program:?}: {e}"))?;
    Ok(tally.into_inner())
}

/// What became of a run's frames.
#[derive(Debug, Default)]
struct Tally {
    carried: u32,
    dropped: u32,
    answered: u32,
    passed: u32,
    refused: u32,
}

impl Tally {
    fn add(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Carried => self.carried += 1,
            Outcome::Dropped => self.dropped += 1,
            Outcome::Answered => self.answered += 1,
            Outcome::Passed => self.passed += 1,
            Outcome::Refused => self.refused += 1,
        }
    }

    /// Mutated frames of flannel's wire must reach every outcome a program has (egress passes
    /// nothing on): else the mutations, not the programs, decided the run.
    fn reached_every_outcome(&self, program: Program) -> anyhow::Result<()> {
        let passes = program.side() == Side::Ingress;
        if self.carried == 0 || self.dropped == 0 || (passes && self.passed == 0) {
            anyhow::bail!("{program:?}: not every outcome reached: {self:?}");
        }
        eprintln!("{program:?}: {self:?}");
        Ok(())
    }
}

/// What a program did with a frame.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    Carried,
    Dropped,
    /// Dropped, and answered with an ICMP or ICMPv6 error into the device.
    Answered,
    Passed,
    Refused,
}

/// (a) Random bytes: a whole frame, behind IPv4's or IPv6's ethertype, or inside a datagram
/// from the peer over `underlay`.
fn random_frames(underlay: Underlay) -> impl Strategy<Value = Frame> {
    let bytes = || vec(any::<u8>(), 0..MAX_FRAME);
    prop_oneof![
        bytes(),
        bytes().prop_map(|b| ethernet(ETH_IP, &b)),
        bytes().prop_map(|b| ethernet(ETH_IPV6, &b)),
        bytes().prop_map(move |b| from_peer(underlay, &b)),
    ]
    .prop_map(Frame)
}

/// (b) What `side`'s program carries when all is well (an IPv4 or IPv6 packet for the peer's
/// subnet; a datagram from the peer around a packet from its subnet), mutated up to three
/// times.
fn mutated_frames(side: Side, underlay: Underlay) -> impl Strategy<Value = Frame> {
    let from_there = side == Side::Ingress;
    let mutations = vec(mutation(side, underlay), 0..=3);
    let packet = prop_oneof![packet(from_there), packet6(from_there)];
    (packet, mutations).prop_map(move |(packet, mutations)| {
        let mut frame = match side {
            Side::Egress => ethernet(ethertype_of(&packet), &packet),
            Side::Ingress => from_peer(underlay, &packet),
            Side::Segmented => unreachable!("twill_segmented runs the other two's code"),
        };
        for m in &mutations {
            m.apply(&mut frame);
        }
        Frame(frame)
    })
}

/// A datagram from the peer to this node on flannel's port around `inner`, over `underlay`.
fn from_peer(underlay: Underlay, inner: &[u8]) -> Vec<u8> {
    match underlay {
        Underlay::V4 => datagram(&Ip::new(PEER, LOCAL, UDP), (PORT, PORT), inner),
        Underlay::V6 => datagram6(&Ip6::new(PEER6, LOCAL6, UDP), (PORT, PORT), inner),
    }
}

/// An IPv4 packet between a container here and one behind the peer (from there, or to
/// there), with its TTL, fragment bits, options, protocol and payload drawn.
fn packet(from_there: bool) -> impl Strategy<Value = Vec<u8>> {
    let ttl = prop_oneof![Just(64), any::<u8>()];
    let fragment = prop_oneof![Just(0), Just(0x4000), any::<u16>()];
    let options = prop_oneof![Just(Vec::new()), vec(any::<u8>(), 0..=40)];
    let payload = vec(any::<u8>(), 0..usize::from(DEVICE_MTU));
    let fields = (1u8..=254, ttl, fragment, options, any::<u8>(), payload);
    fields.prop_map(
        move |(host, ttl, fragment, mut options, protocol, payload)| {
            options.truncate(options.len() / 4 * 4);
            let there = Ipv4Addr::new(10, 5, 2, host);
            let (src, dst) = if from_there {
                (there, HERE)
            } else {
                (HERE, there)
            };
            let ip = Ip {
                src,
                dst,
                protocol,
                ttl,
                id: 0,
                flags_fragment: fragment,
                options,
            };
            ip.packet(&payload)
        },
    )
}

/// An IPv6 packet between a container here and one behind the peer, with its hop limit, next
/// header and payload drawn.
fn packet6(from_there: bool) -> impl Strategy<Value = Vec<u8>> {
    let hop_limit = prop_oneof![Just(64), any::<u8>()];
    let payload = vec(any::<u8>(), 0..usize::from(DEVICE_MTU) - IPV6_HEADER);
    let fields = (any::<u16>(), hop_limit, any::<u8>(), payload);
    fields.prop_map(move |(host, hop_limit, next_header, payload)| {
        let there = Ipv6Addr::new(0xfd10, 0, 0, 2, 0, 0, 0, host);
        let (src, dst) = if from_there {
            (there, HERE6)
        } else {
            (HERE6, there)
        };
        let ip = Ip6 {
            src,
            dst,
            next_header,
            hop_limit,
        };
        ip.packet(&payload)
    })
}

/// One frame through one program, and what its verdict allows: carried exactly when the
/// userspace engine's checks carry it, and as they would.
fn check(bench: &TestBench, program: Program, frame: &[u8]) -> Result<Outcome, String> {
    let counters = || bench.dataplane.counters().map_err(|e| format!("{e:#}"));
    let side = program.side();
    let node = bench.node();
    let before = counters()?;
    let output = match program {
        Program::Tc(side) => bench.dataplane.test_run(side, frame),
        Program::Xdp => bench.dataplane.test_run_xdp(frame),
    };
    let moved = Moved::between(&before, &counters()?, side);
    let output = match output {
        Ok(output) => output,
        Err(e)
            if refused_by_the_kernel(program, frame)
                && format!("{e:#}").ends_with("(os error 22)") =>
        {
            moved.expect(Moved::default(), "a frame the kernel refused")?;
            return Ok(Outcome::Refused);
        }
        Err(e) => return Err(format!("{e:#}")),
    };
    // The XDP program passes up what it decapsulated, with the mark for twill_ingress.
    let carried = output.frame != frame && program == Program::Xdp;
    let by_userspace = carried_by_userspace(node, side, frame);
    let not_carried = |outcome| match by_userspace {
        Some(_) => Err("not carried, but twill's userspace checks would carry it".to_string()),
        None => Ok(outcome),
    };
    match output.verdict {
        Verdict::Pass if carried => {
            let carried =
                by_userspace.ok_or("carried, but twill's userspace checks would not carry it")?;
            // The outer Ethernet header as it came, but for the inner packet's ethertype.
            let at_xdp = [
                common::test_run::xdp_mark_shown(),
                &frame[..12],
                &carried.frame[12..],
            ]
            .concat();
            if output.frame != at_xdp {
                return Err(format!(
                    "carried as\n  {}\nnot as\n  {}",
                    hex(&output.frame),
                    hex(&at_xdp)
                ));
            }
            moved.expect(Moved::one_packet(carried.bytes), "a carried frame")?;
            Ok(Outcome::Carried)
        }
        Verdict::Pass if output.frame != frame => {
            Err(format!("passed, but changed to {}", hex(&output.frame)))
        }
        Verdict::Pass => {
            moved.expect(Moved::default(), "a passed frame")?;
            not_carried(Outcome::Passed)
        }
        Verdict::Drop => {
            moved.expect(Moved::one_drop(), "a dropped frame")?;
            if program != Program::Xdp && answered_by_userspace(node, side, frame).is_some() {
                return Err("dropped, but twill's userspace engine answers it".into());
            }
            not_carried(Outcome::Dropped)
        }
        Verdict::Redirect => {
            match answered_by_userspace(node, side, frame) {
                Some(answer) if output.frame == answer => {
                    moved.expect(Moved::one_drop(), "an answered frame")?;
                    return Ok(Outcome::Answered);
                }
                Some(answer) => {
                    return Err(format!(
                        "answered as\n  {}\nnot as\n  {}",
                        hex(&output.frame),
                        hex(&answer)
                    ))
                }
                None => {}
            }
            let carried =
                by_userspace.ok_or("carried, but twill's userspace checks would not carry it")?;
            if output.frame != carried.frame {
                return Err(format!(
                    "carried as\n  {}\nnot as\n  {}",
                    hex(&output.frame),
                    hex(&carried.frame)
                ));
            }
            moved.expect(Moved::one_packet(carried.bytes), "a carried frame")?;
            Ok(Outcome::Carried)
        }
        Verdict::Other(action) => Err(format!("action {action}, not a verdict")),
    }
}

/// The kernel builds no skb of a frame shorter than an Ethernet header, nor of an IPv4 (IPv6)
/// frame shorter than an IPv4 (IPv6) header: BPF_PROG_TEST_RUN refuses them with EINVAL and
/// no TC program ever sees one (nor does the stack send one through a device). XDP needs no
/// skb: it is refused only a frame shorter than an Ethernet header.
fn refused_by_the_kernel(program: Program, frame: &[u8]) -> bool {
    let ethertype = frame.get(12..14).map(|t| u16::from_be_bytes([t[0], t[1]]));
    let header = match ethertype {
        Some(ETH_IP) => IPV4_HEADER,
        Some(ETH_IPV6) => IPV6_HEADER,
        _ => 0,
    };
    let short_ip = frame.len() < FIRST_IP + header;
    frame.len() < FIRST_IP || (program != Program::Xdp && short_ip)
}

/// How a run moved the counters: drops of every reason, and (packets, bytes) in the program's
/// own direction and the other, in the totals and the peer's.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Moved {
    drops: u64,
    this_way: (u64, u64),
    peer_this_way: (u64, u64),
    other_way: (u64, u64),
    peer_other_way: (u64, u64),
}

impl Moved {
    fn between(before: &Counters, after: &Counters, side: Side) -> Moved {
        let totals = |c: &Counters| PeerTraffic { tx: c.tx, rx: c.rx };
        let peer = |c: &Counters| c.peers.get(&peer_subnet()).copied().unwrap_or_default();
        let (this_way, other_way) = ways(totals(before), totals(after), side);
        let (peer_this_way, peer_other_way) = ways(peer(before), peer(after), side);
        let drops = after.drops.iter().zip(&before.drops);
        Moved {
            drops: drops.map(|((_, now), (_, was))| now - was).sum(),
            this_way,
            peer_this_way,
            other_way,
            peer_other_way,
        }
    }

    fn one_drop() -> Moved {
        Moved {
            drops: 1,
            ..Moved::default()
        }
    }

    fn one_packet(bytes: u64) -> Moved {
        Moved {
            this_way: (1, bytes),
            peer_this_way: (1, bytes),
            ..Moved::default()
        }
    }

    fn expect(self, want: Moved, what: &str) -> Result<(), String> {
        if self == want {
            return Ok(());
        }
        Err(format!(
            "{what} moved the counters by {self:?}, not {want:?}"
        ))
    }
}

/// (packets, bytes) counted between two readings in `side`'s own direction, and the other.
fn ways(was: PeerTraffic, now: PeerTraffic, side: Side) -> ((u64, u64), (u64, u64)) {
    let moved = |was: Traffic, now: Traffic| (now.packets - was.packets, now.bytes - was.bytes);
    let (tx, rx) = (moved(was.tx, now.tx), moved(was.rx, now.rx));
    match side {
        Side::Egress => (tx, rx),
        Side::Ingress => (rx, tx),
        Side::Segmented => unreachable!("twill_segmented runs the other two's code"),
    }
}
