//! The one retry schedule: exponential, capped, optionally jittered; and
//! [`Retry`], the schedule every retry against etcd follows: full jitter,
//! a window that grows with the cluster, a reset after a healthy while.

use std::time::Duration;

use tokio::time::Instant;

use rand::Rng;

/// `base · 2^attempt`, at most `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backoff {
    base: Duration,
    cap: Duration,
}

impl Backoff {
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

/// Retries against etcd: full jitter up to 1 s, 2 s, ... 30 s (the
/// Kubernetes reflector's 0.8-30 s), reset once a try has held for
/// [`Retry::HEALTHY`].
pub(crate) const ETCD: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));

/// The state of one thing that retries against etcd (the watch, the
/// keep-alive, an acquisition). Every wait is drawn at random from zero to
/// the larger of the backoff step and the cluster's window
/// ([`Retry::window`]): thousands of agents that lost etcd together come
/// back spread over a time that grows with their number, not together.
#[derive(Debug)]
pub(crate) struct Retry {
    schedule: Backoff,
    attempt: u32,
    /// Since when the last try has held.
    since: Option<Instant>,
}

impl Retry {
    /// A try that held this long was healthy: the next failure starts the
    /// schedule again.
    pub(crate) const HEALTHY: Duration = Duration::from_secs(30);

    pub(crate) const fn new(schedule: Backoff) -> Self {
        Self {
            schedule,
            attempt: 0,
            since: None,
        }
    }

    /// The window over which `nodes` agents spread their first retry: 10 ms
    /// a node, at least 1 s, at most 60 s (1,000 nodes: 10 s; 5,000: 50 s).
    pub(crate) fn window(nodes: usize) -> Duration {
        Duration::from_millis(10)
            .saturating_mul(u32::try_from(nodes).unwrap_or(u32::MAX))
            .clamp(Duration::from_secs(1), Duration::from_secs(60))
    }

    /// A try started working (a stream opened, a request answered).
    pub(crate) fn working(&mut self) {
        if self.since.is_none() {
            self.since = Some(Instant::now());
        }
    }

    /// A try failed: how long to wait before the next, among `nodes`.
    pub(crate) fn failed(&mut self, nodes: usize, rng: &mut impl Rng) -> Duration {
        if self
            .since
            .take()
            .is_some_and(|t| t.elapsed() >= Self::HEALTHY)
        {
            self.attempt = 0;
        }
        let max = self.schedule.delay(self.attempt).max(Self::window(nodes));
        self.attempt = self.attempt.saturating_add(1);
        Duration::from_millis(rng.random_range(0..=max.as_millis() as u64))
    }

    /// The wait before trying again elsewhere, where nothing failed (the
    /// client moved off a member): the cluster's window, no backoff.
    pub(crate) fn moved(&mut self, nodes: usize, rng: &mut impl Rng) -> Duration {
        self.since = None;
        let max = Self::window(nodes);
        Duration::from_millis(rng.random_range(0..=max.as_millis() as u64))
    }

    /// How many tries have failed in a row.
    #[cfg(test)]
    pub(crate) fn attempts(&self) -> u32 {
        self.attempt
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng as _;

    #[test]
    fn doubles_up_to_the_cap() {
        let b = Backoff::new(Duration::from_millis(250), Duration::from_secs(5));
        let ms: Vec<u128> = (0..7).map(|a| b.delay(a).as_millis()).collect();
        assert_eq!(ms, [250, 500, 1000, 2000, 4000, 5000, 5000]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(5));
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let j: Vec<Duration> = (0..50).map(|_| b.jittered(2, &mut rng)).collect();
        assert!(j.iter().all(|d| *d <= Duration::from_secs(1)));
        assert!(j.iter().any(|d| *d != j[0]), "jitter varies");
    }

    #[test]
    fn retry_windows_grow_with_the_cluster() {
        assert_eq!(Retry::window(0), Duration::from_secs(1));
        assert_eq!(Retry::window(1_000), Duration::from_secs(10));
        assert_eq!(Retry::window(5_000), Duration::from_secs(50));
        assert_eq!(Retry::window(50_000), Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_are_fully_jittered_capped_and_reset_after_a_healthy_while() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        // 1,000 agents failing together: their first waits spread over 10 s.
        let firsts: Vec<Duration> = (0..1000)
            .map(|_| Retry::new(ETCD).failed(1_000, &mut rng))
            .collect();
        assert!(firsts.iter().all(|d| *d <= Duration::from_secs(10)));
        let early = firsts
            .iter()
            .filter(|d| **d < Duration::from_secs(1))
            .count();
        assert!(early < 200, "{early} of 1000 within the first second");
        // One agent: 1 s, 2 s, ... capped at 30 s.
        let mut r = Retry::new(ETCD);
        let waits: Vec<Duration> = (0..10).map(|_| r.failed(1, &mut rng)).collect();
        assert!(waits.iter().all(|d| *d <= Duration::from_secs(30)));
        assert!(waits[0] <= Duration::from_secs(1));
        assert_eq!(r.attempts(), 10);
        // A short success does not reset; a healthy while does.
        r.working();
        tokio::time::advance(Duration::from_secs(5)).await;
        r.failed(1, &mut rng);
        assert_eq!(r.attempts(), 11);
        r.working();
        tokio::time::advance(Retry::HEALTHY).await;
        assert!(r.failed(1, &mut rng) <= Duration::from_secs(1));
        assert_eq!(r.attempts(), 1);
    }
}
