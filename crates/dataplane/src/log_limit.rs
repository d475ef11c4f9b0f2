//! Rate limits for log lines on the packet path: a kernel that refuses every send must show in
//! the log at once, but must not write a line per packet.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Lets one line through per `interval` for one call site (keep it in a `static`), and counts
/// the events it held back in between, so the next line can say how many there were.
pub struct LogLimit {
    interval_ms: u64,
    /// Milliseconds since [`epoch`] before which nothing more is logged.
    next_ms: AtomicU64,
    held: AtomicU64,
}

impl LogLimit {
    pub const fn new(interval: Duration) -> LogLimit {
        LogLimit {
            interval_ms: interval.as_millis() as u64,
            next_ms: AtomicU64::new(0),
            held: AtomicU64::new(0),
        }
    }

    /// One line a second: what the packet path uses.
    pub const fn per_second() -> LogLimit {
        LogLimit::new(Duration::from_secs(1))
    }

    /// `Some(held)` when a line may be written now; `held` events went unlogged since the last.
    pub fn allow(&self) -> Option<u64> {
        let now = epoch().elapsed().as_millis() as u64;
        let next = self.next_ms.load(Relaxed);
        if now < next
            || self
                .next_ms
                .compare_exchange(next, now + self.interval_ms, Relaxed, Relaxed)
                .is_err()
        {
            self.held.fetch_add(1, Relaxed);
            return None;
        }
        Some(self.held.swap(0, Relaxed))
    }
}

/// The packet path's clock start, for times kept in an atomic as milliseconds since it.
pub(crate) fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_counting_the_rest() {
        let limit = LogLimit::new(Duration::from_millis(200));
        assert_eq!(limit.allow(), Some(0));
        assert_eq!(limit.allow(), None);
        assert_eq!(limit.allow(), None);
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(limit.allow(), Some(2));
        assert_eq!(limit.allow(), None);
    }
}
