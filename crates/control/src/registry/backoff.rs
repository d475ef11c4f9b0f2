//! Doubling delays between two bounds, for every retry that talks to a registry's server.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max,
            next: min,
        }
    }

    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (delay * 2).min(self.max);
        delay
    }

    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_bound_and_starts_over_on_reset() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(350));
        assert_eq!(
            [
                b.next_delay(),
                b.next_delay(),
                b.next_delay(),
                b.next_delay()
            ],
            [ms(100), ms(200), ms(350), ms(350)]
        );
        b.reset();
        assert_eq!(b.next_delay(), ms(100));
    }
}
