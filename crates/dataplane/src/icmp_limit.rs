//! How many ICMP errors a node answers with: the limit Linux puts on the errors it sends itself
//! (`net.ipv4.icmp_msgs_per_sec` a second, bursts of `net.ipv4.icmp_msgs_burst`, which hold
//! for ICMPv6 too), read from the node's own namespace at start, so that twill, a router
//! between its containers and its peers, answers no more than a Linux router there would: a
//! container flooding a subnet no peer owns, or a peer sending packets whose TTL runs out here,
//! gets a trickle of errors, not one per packet. As the kernel does, the errors that carry a
//! path MTU (fragmentation needed, packet too big) are never limited: a sender that misses one
//! stalls its stream. What the limit holds back is counted (`icmp_rate_limited`).
//!
//! A userspace engine spends from one [`IcmpBudget`] for all its threads; the eBPF programs run
//! the same algorithm (GCRA, as governor's) over a map of their own (bpf/icmp.h), from
//! [`IcmpLimit::interval_ns`] and [`IcmpLimit::slack_ns`].

use anyhow::Context;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use std::num::NonZeroU32;
use std::path::Path;

/// Answers a second, and how many may go at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcmpLimit {
    pub per_second: u32,
    pub burst: u32,
}

const NANOS_PER_SECOND: u64 = 1_000_000_000;

impl IcmpLimit {
    /// What a Linux namespace starts with.
    pub const LINUX_DEFAULT: IcmpLimit = IcmpLimit {
        per_second: 1000,
        burst: 50,
    };

    /// The kernel's limit in the namespace this thread runs in; its default, with a warning,
    /// where /proc/sys cannot be read.
    pub fn of_this_namespace() -> IcmpLimit {
        IcmpLimit::read_from(Path::new("/proc/sys/net/ipv4")).unwrap_or_else(|e| {
            let default = IcmpLimit::LINUX_DEFAULT;
            tracing::warn!(
                "reading the kernel's ICMP limit ({e:#}): answering at most {} errors a second, bursts of {}, its default",
                default.per_second,
                default.burst
            );
            default
        })
    }

    /// The limit in `dir`'s `icmp_msgs_per_sec` and `icmp_msgs_burst`.
    fn read_from(dir: &Path) -> anyhow::Result<IcmpLimit> {
        let read = |name: &str| -> anyhow::Result<u32> {
            let path = dir.join(name);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            text.trim()
                .parse()
                .with_context(|| format!("{}: {:?} is not a count", path.display(), text.trim()))
        };
        Ok(IcmpLimit {
            per_second: read("icmp_msgs_per_sec")?,
            burst: read("icmp_msgs_burst")?,
        })
    }

    /// What one answer costs at the rate, in nanoseconds (at least 1); 0 when no answer may be
    /// sent at all (a rate or a burst of 0).
    pub fn interval_ns(self) -> u64 {
        match self.quota() {
            Some(_) => (NANOS_PER_SECOND / u64::from(self.per_second)).max(1),
            None => 0,
        }
    }

    /// How far ahead of now the answers sent may have spent: the burst, less the answer being
    /// sent.
    pub fn slack_ns(self) -> u64 {
        self.interval_ns() * u64::from(self.burst.saturating_sub(1))
    }

    fn quota(self) -> Option<Quota> {
        let per_second = NonZeroU32::new(self.per_second)?;
        Some(Quota::per_second(per_second).allow_burst(NonZeroU32::new(self.burst)?))
    }
}

/// The answers one userspace engine may still send, shared by its threads.
pub struct IcmpBudget(Option<DefaultDirectRateLimiter>);

impl IcmpBudget {
    pub fn new(limit: IcmpLimit) -> IcmpBudget {
        IcmpBudget(limit.quota().map(RateLimiter::direct))
    }

    /// Spends one answer, if the limit has one left now.
    pub fn spend(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|limiter| limiter.check().is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_goes_at_once_and_then_no_more() {
        let budget = IcmpBudget::new(IcmpLimit {
            per_second: 1,
            burst: 3,
        });
        let spent = (0..10).filter(|_| budget.spend()).count();
        assert_eq!(spent, 3);
    }

    #[test]
    fn a_rate_or_a_burst_of_zero_answers_nothing() {
        for (per_second, burst) in [(0, 50), (1000, 0)] {
            let limit = IcmpLimit { per_second, burst };
            assert!(!IcmpBudget::new(limit).spend(), "{limit:?}");
            assert_eq!(limit.interval_ns(), 0);
        }
    }

    #[test]
    fn the_programs_get_governors_cell_and_tolerance() {
        let limit = IcmpLimit::LINUX_DEFAULT;
        assert_eq!(limit.interval_ns(), 1_000_000);
        assert_eq!(limit.slack_ns(), 49_000_000);
        let fast = IcmpLimit {
            per_second: u32::MAX,
            burst: 1,
        };
        assert_eq!((fast.interval_ns(), fast.slack_ns()), (1, 0));
    }

    #[test]
    fn the_limit_is_read_from_the_kernels_two_knobs() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("icmp_msgs_per_sec"), "7\n")?;
        std::fs::write(dir.path().join("icmp_msgs_burst"), "3\n")?;
        let limit = IcmpLimit::read_from(dir.path())?;
        assert_eq!(
            limit,
            IcmpLimit {
                per_second: 7,
                burst: 3
            }
        );
        std::fs::write(dir.path().join("icmp_msgs_burst"), "lots\n")?;
        let refused = IcmpLimit::read_from(dir.path()).unwrap_err();
        assert!(
            format!("{refused:#}").contains("\"lots\" is not a count"),
            "{refused:#}"
        );
        std::fs::remove_file(dir.path().join("icmp_msgs_per_sec"))?;
        let refused = IcmpLimit::read_from(dir.path()).unwrap_err();
        assert!(
            format!("{refused:#}").contains("icmp_msgs_per_sec"),
            "{refused:#}"
        );
        // This kernel has both.
        IcmpLimit::read_from(Path::new("/proc/sys/net/ipv4"))?;
        Ok(())
    }
}
