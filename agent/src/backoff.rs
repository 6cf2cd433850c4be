//! The one retry schedule: exponential, capped, optionally jittered.

use std::time::Duration;

use rand::Rng;

/// `base · 2^attempt`, at most `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backoff {
    base: Duration,
    cap: Duration,
}

impl Backoff {
    /// Retries against etcd or the kernel: 250 ms, 500 ms, ... 5 s.
    pub(crate) const RETRY: Backoff =
        Backoff::new(Duration::from_millis(250), Duration::from_secs(5));

    pub(crate) const fn new(base: Duration, cap: Duration) -> Self {
        Self { base, cap }
    }

    /// The wait before retry `attempt` (0 for the first retry).
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        self.base
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.cap)
    }

    /// A uniformly random wait up to [`Backoff::delay`] ("full jitter"), so
    /// agents that lost the same race do not collide again.
    pub(crate) fn jittered(&self, attempt: u32, rng: &mut impl Rng) -> Duration {
        let max = self.delay(attempt).as_millis() as u64;
        Duration::from_millis(rng.random_range(0..=max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng as _;

    #[test]
    fn doubles_up_to_the_cap() {
        let b = Backoff::RETRY;
        let ms: Vec<u128> = (0..7).map(|a| b.delay(a).as_millis()).collect();
        assert_eq!(ms, [250, 500, 1000, 2000, 4000, 5000, 5000]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(5));
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let j: Vec<Duration> = (0..50).map(|_| b.jittered(2, &mut rng)).collect();
        assert!(j.iter().all(|d| *d <= Duration::from_secs(1)));
        assert!(j.iter().any(|d| *d != j[0]), "jitter varies");
    }
}
