//! The programs on crafted frames through BPF_PROG_TEST_RUN, with their real maps: each frame
//! gets the verdict expected, and the counters move by exactly what it should count (a drop
//! under its reason, or a packet to or from the peer). Every ingress frame goes through the
//! TC program and through the XDP one. Inner packets are IPv4 and IPv6, over the IPv4 underlay
//! and over the IPv6 one.

mod common;
#[path = "prog_test_run/egress.rs"]
mod egress;
#[path = "prog_test_run/ingress.rs"]
mod ingress;

use anyhow::Result;
use common::engine_model::{answered_by_userspace, ethertype_of};
use common::frames::{datagram, datagram6, ethernet, hex, udp, Ip, Ip6, ETH_IPV6};
use common::test_run::{
    peer_subnet, peer_subnet6, test_bench, test_bench6, test_bench_limited, xdp_loads, TestBench,
    HERE, HERE6, LOCAL, LOCAL6, PEER, PEER6, THERE, THERE6, UDP,
};
use common::PORT;
use egress::{egress6_cases, egress_cases};
use ingress::{ingress6_cases, ingress_cases, ingress_over6_cases};
use std::net::SocketAddrV4;
use std::time::{Duration, Instant};
use twill_dataplane::icmp_limit::IcmpLimit;
use twill_dataplane::stats::DropReason;
use twill_ebpf::{Counters, Opened, Side, Takes, TestOutput, Verdict};

/// What a frame should come to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Left to the stack, unchanged, nothing counted.
    Untouched,
    /// Dropped and counted under the reason.
    Dropped(DropReason),
    /// Refused by BPF_PROG_TEST_RUN itself (EINVAL): the kernel does not build an skb of an
    /// IPv4 frame shorter than an IPv4 header, so no such frame reaches the program (nor does
    /// the stack ever send one through a device).
    Refused,
    /// Encapsulated to the peer (egress) or decapsulated from it (ingress), counted as one
    /// packet of this many inner bytes.
    Carried(u64),
    /// Dropped and counted under the reason, and answered with the ICMP or ICMPv6 error the
    /// userspace engine answers it with, sent into the device (at XDP: passed on untouched,
    /// for twill_ingress to answer).
    Answered(DropReason),
}

struct Case {
    name: &'static str,
    side: Side,
    frame: Vec<u8>,
    expect: Expect,
}

/// `side`'s cases from (name, frame, expectation).
fn cases_of(
    side: Side,
    cases: impl IntoIterator<Item = (&'static str, Vec<u8>, Expect)>,
) -> Vec<Case> {
    cases
        .into_iter()
        .map(|(name, frame, expect)| Case {
            name,
            side,
            frame,
            expect,
        })
        .collect()
}

/// The inner packet HERE -> THERE (or back, for `from_peer`) with a small UDP payload.
fn inner(from_peer: bool) -> Ip {
    match from_peer {
        false => Ip::new(HERE, THERE, UDP),
        true => Ip::new(THERE, HERE, UDP),
    }
}

fn payload() -> Vec<u8> {
    udp(4000, 5000, b"twill table test")
}

/// The inner IPv6 packet HERE6 -> THERE6 (or back, for `from_peer`).
fn inner6(from_peer: bool) -> Ip6 {
    match from_peer {
        false => Ip6::new(HERE6, THERE6, UDP),
        true => Ip6::new(THERE6, HERE6, UDP),
    }
}

/// The frame a carried packet should leave as.
fn carried(case: &Case, via: Via, bench: &TestBench) -> Vec<u8> {
    let inner = forwarded_inner(case);
    let device_mac = bench.device_mac;
    match (case.side, via) {
        (Side::Egress, _) if bench.over_ipv6 => {
            datagram6(&Ip6::new(LOCAL6, PEER6, UDP), (PORT, PORT), &inner)
        }
        (Side::Egress, _) => {
            let mut outer = Ip::new(LOCAL, PEER, UDP);
            outer.flags_fragment = 0x4000;
            datagram(&outer, (PORT, PORT), &inner)
        }
        (Side::Ingress, Via::Tc | Via::Segmented) => {
            let mut frame = ethernet(ethertype_of(&inner), &inner);
            frame[..6].copy_from_slice(&device_mac);
            frame
        }
        // The mark for twill_ingress in the metadata (which BPF_PROG_TEST_RUN hands back
        // before the frame), then the outer Ethernet header as it came (twill_ingress
        // readdresses it at TC) but for the inner packet's ethertype.
        (Side::Ingress, Via::Xdp) => {
            let ethertype = ethertype_of(&inner).to_be_bytes();
            [
                common::test_run::xdp_mark_shown(),
                &case.frame[..12],
                &ethertype,
                &inner[..],
            ]
            .concat()
        }
        (Side::Segmented, _) => unreachable!("every case is an egress or an ingress one"),
    }
}

/// The inner packet of a carried frame, its TTL or hop limit decremented.
fn forwarded_inner(case: &Case) -> Vec<u8> {
    let mut inner = case.frame[14..].to_vec();
    if case.side == Side::Ingress {
        let outer6 = u16::from_be_bytes([case.frame[12], case.frame[13]]) == ETH_IPV6;
        inner.drain(..if outer6 { 48 } else { 28 });
    }
    if inner[0] >> 4 == 6 {
        inner[7] -= 1;
        return inner;
    }
    let header_len = usize::from(inner[0] & 0x0f) * 4;
    inner[8] -= 1;
    inner[10..12].fill(0);
    let sum = common::frames::checksum(&inner[..header_len]);
    inner[10..12].copy_from_slice(&sum.to_be_bytes());
    inner
}

/// Which program an ingress frame goes through: the TC one, or the XDP one before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    Tc,
    Xdp,
    /// twill_segmented, at the segmenter's receiving end, in place of the case's TC program.
    Segmented,
}

/// Every egress and ingress case over the IPv4 underlay, of both inner families.
fn egress_and_ingress_cases() -> Vec<Case> {
    egress_cases()
        .into_iter()
        .chain(egress6_cases())
        .chain(ingress_cases())
        .chain(ingress6_cases())
        .collect()
}

#[test]
fn every_crafted_frame_gets_its_verdict_and_counter() -> Result<()> {
    let cases = egress_and_ingress_cases();
    run_cases(&test_bench("ebpf-table")?, &cases, Via::Tc)
}

/// The XDP program makes every check the TC ingress program makes, under the same reasons.
/// (Maps of its own: the fragments the TC run remembered would change the verdicts.)
#[test]
fn the_xdp_program_gives_every_ingress_frame_the_tc_programs_verdict() -> Result<()> {
    let cases: Vec<Case> = ingress_cases()
        .into_iter()
        .chain(ingress6_cases())
        .collect();
    run_cases(&test_bench("ebpf-tablex")?, &cases, Via::Xdp)
}

/// What comes back from the segmenter, a datagram of a train or a packet for a peer, is judged
/// there as twill_ingress and twill_egress judge it. (What is not ours goes to be sent there,
/// not to the stack: those ingress cases are left out.)
#[test]
fn the_segmented_program_gives_every_frame_its_tc_programs_verdict() -> Result<()> {
    let cases: Vec<Case> = egress_and_ingress_cases()
        .into_iter()
        .filter(|c| !(c.side == Side::Ingress && c.expect == Expect::Untouched))
        .collect();
    run_cases(&test_bench("ebpf-tables")?, &cases, Via::Segmented)
}

fn run_cases(bench: &TestBench, cases: &[Case], via: Via) -> Result<()> {
    if via == Via::Xdp && !xdp_loads()? {
        return Ok(());
    }
    let mut failures = Vec::new();
    for case in cases {
        let before = bench.dataplane.counters()?;
        let run = match via {
            Via::Tc => bench.dataplane.test_run(case.side, &case.frame),
            Via::Xdp => bench.dataplane.test_run_xdp(&case.frame),
            Via::Segmented => bench.dataplane.test_run(Side::Segmented, &case.frame),
        };
        // XDP needs no skb: a frame too short for one is looked at, and is not ours. What TC
        // answers (a packet too big, if it may not be fragmented) XDP leaves to it.
        let expect = match (via, case.expect) {
            (
                Via::Xdp,
                Expect::Refused | Expect::Answered(_) | Expect::Dropped(DropReason::TooBig),
            ) => Expect::Untouched,
            (_, expect) => expect,
        };
        let output = match (run, expect) {
            (Err(_), Expect::Refused) => continue,
            (Ok(output), _) => output,
            (Err(e), _) => {
                failures.push(format!("{:?} {}: {e:#}", case.side, case.name));
                continue;
            }
        };
        let after = bench.dataplane.counters()?;
        let moved = Moved {
            before: &before,
            after: &after,
        };
        if let Err(why) = check(case, expect, via, &output, moved, bench) {
            failures.push(format!("{:?} {}: {why}", case.side, case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{via:?}: {} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    Ok(())
}

/// The counters before and after a case.
struct Moved<'a> {
    before: &'a Counters,
    after: &'a Counters,
}

fn check(
    case: &Case,
    expect: Expect,
    via: Via,
    output: &TestOutput,
    Moved { before, after }: Moved<'_>,
    bench: &TestBench,
) -> Result<(), String> {
    let (verdict, frame) = (&output.verdict, &output.frame);
    let carried_verdict = match via {
        Via::Tc | Via::Segmented => Verdict::Redirect,
        // Up the underlay's stack, where GRO and then twill_ingress take it.
        Via::Xdp => Verdict::Pass,
    };
    let (want_verdict, want_frame) = match expect {
        Expect::Untouched => (Verdict::Pass, Some(case.frame.clone())),
        Expect::Dropped(_) => (Verdict::Drop, None),
        Expect::Refused => return Err("BPF_PROG_TEST_RUN ran it".into()),
        Expect::Carried(_) => (carried_verdict, Some(carried(case, via, bench))),
        // The drop counter says why; the engine's rules say what the answer is.
        Expect::Answered(_) => {
            let answer = answered_by_userspace(bench.node(), case.side, &case.frame);
            (
                Verdict::Redirect,
                Some(answer.ok_or("the engine would not answer it")?),
            )
        }
    };
    if *verdict != want_verdict {
        return Err(format!("verdict {verdict:?}, expected {want_verdict:?}"));
    }
    if let Some(want) = want_frame {
        if *frame != want {
            return Err(format!(
                "frame\n  got  {}\n  want {}",
                hex(frame),
                hex(&want)
            ));
        }
    }
    for reason in DropReason::ALL {
        let moved = after.drop_count(reason) - before.drop_count(reason);
        let want =
            u64::from(expect == Expect::Dropped(reason) || expect == Expect::Answered(reason));
        if moved != want {
            return Err(format!(
                "{} moved by {moved}, expected {want}",
                reason.as_str()
            ));
        }
    }
    let peer = |c: &Counters| c.peers.get(&peer_subnet()).copied().unwrap_or_default();
    let (total, peer_before, peer_after) = match case.side {
        Side::Egress => ((before.tx, after.tx), peer(before).tx, peer(after).tx),
        Side::Ingress => ((before.rx, after.rx), peer(before).rx, peer(after).rx),
        Side::Segmented => unreachable!("every case is an egress or an ingress one"),
    };
    let want = match expect {
        Expect::Carried(bytes) => (1, bytes),
        _ => (0, 0),
    };
    let moved = (
        total.1.packets - total.0.packets,
        total.1.bytes - total.0.bytes,
    );
    let peer_moved = (
        peer_after.packets - peer_before.packets,
        peer_after.bytes - peer_before.bytes,
    );
    if moved != want || peer_moved != want {
        return Err(format!(
            "traffic moved {moved:?} (peer {peer_moved:?}), expected {want:?}"
        ));
    }
    Ok(())
}

/// Over the IPv6 underlay, egress sends both families in outer IPv6 to the peer's IPv6 address
/// (UDP checksum 0), and ingress takes only datagrams from the peer's IPv6 address, under the
/// same checks and counters; at TC and at XDP.
#[test]
fn over_the_ipv6_underlay_every_crafted_frame_gets_its_verdict_and_counter() -> Result<()> {
    let cases: Vec<Case> = egress_cases()
        .into_iter()
        .chain(egress6_cases())
        .chain(ingress_over6_cases())
        .collect();
    run_cases(&test_bench6("ebpf-table6")?, &cases, Via::Tc)?;
    run_cases(
        &test_bench6("ebpf-table6x")?,
        &ingress_over6_cases(),
        Via::Xdp,
    )
}

/// A peer whose IPv6 subnet is taken away (its lease lost it, or it never had one) sends no IPv6
/// of its own, and nothing is routed to its former IPv6 subnet; given back, both work again.
#[test]
fn a_peer_without_an_ipv6_subnet_gets_no_ipv6_either_way() -> Result<()> {
    let bench = test_bench("ebpf-no6")?;
    let endpoint = SocketAddrV4::new(PEER, PORT);
    let valid = |name| {
        let mut cases: Vec<Case> = egress6_cases().into_iter().take(1).collect();
        cases.extend(ingress6_cases().into_iter().take(1));
        cases.iter_mut().for_each(|c| c.name = name);
        cases
    };
    bench
        .dataplane
        .set_peer(peer_subnet(), None, endpoint, Takes::SuperPackets)?;
    let mut refused = valid("IPv6 once the peer has no IPv6 subnet");
    refused[0].expect = Expect::Answered(DropReason::NoRoute);
    refused[1].expect = Expect::Dropped(DropReason::SpoofedSource);
    run_cases(&bench, &refused, Via::Tc)?;
    run_cases(&bench, &refused[1..], Via::Xdp)?;
    bench.dataplane.set_peer(
        peer_subnet(),
        Some(peer_subnet6()),
        endpoint,
        Takes::SuperPackets,
    )?;
    let carried = valid("IPv6 once the peer has its IPv6 subnet again");
    run_cases(&bench, &carried, Via::Tc)?;
    run_cases(&bench, &carried[1..], Via::Xdp)
}

/// The programs answer within the node's ICMP limit: a burst at once, then nothing until the
/// rate has paid for more. What is held back is dropped and counted under its reason as ever,
/// and counted as held back. Both families, no route and TTL alike.
#[test]
fn answers_beyond_the_icmp_limit_are_held_back_and_counted() -> Result<()> {
    // One a second, bursts of three: the frames below run in far less than the second that
    // would pay for a fourth answer.
    let limit = IcmpLimit {
        per_second: 1,
        burst: 3,
    };
    let bench = test_bench_limited("ebpf-limit", limit)?;
    let named = |names: [&str; 3]| -> Vec<Case> {
        let all: Vec<Case> = egress_cases().into_iter().chain(egress6_cases()).collect();
        let mut picked: Vec<Case> = all
            .into_iter()
            .filter(|c| names.contains(&c.name))
            .collect();
        assert_eq!(picked.len(), 3, "{names:?}");
        picked.sort_by_key(|c| names.iter().position(|n| *n == c.name));
        picked
    };
    let answerable = named(["no route", "TTL 1", "IPv6 no route"]);
    let held_back: Vec<Case> = named(["no route", "TTL 1", "IPv6 no route"])
        .into_iter()
        .map(|mut c| {
            if let Expect::Answered(reason) = c.expect {
                c.expect = Expect::Dropped(reason);
            }
            c
        })
        .collect();
    let started = Instant::now();
    run_cases(&bench, &answerable, Via::Tc)?;
    run_cases(&bench, &held_back, Via::Tc)?;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "the frames took {took:?}: the rate paid for more answers meanwhile"
    );
    assert_eq!(bench.dataplane.counters()?.icmp_rate_limited, 3);
    // A restart writes the limit again and keeps what was held back, as it keeps the other
    // counters.
    assert!(matches!(bench.reopen()?, Opened::Adopted { .. }));
    assert_eq!(bench.dataplane.counters()?.icmp_rate_limited, 3);
    Ok(())
}
