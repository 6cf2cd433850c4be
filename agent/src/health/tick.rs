//! Points in time as the prober's records keep them: microseconds since
//! an epoch of the process, in 8 bytes against an `Instant`'s 16. A node
//! may have 50,000 peers, each with a record and a place in a schedule in
//! both the health table and the path MTU searches.

use std::{
    sync::OnceLock,
    time::{Duration, Instant},
};

/// An `Instant`, to the microsecond (earlier than the epoch: the epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Tick(u64);

/// An hour before the first use, so the instants a caller took just
/// before (a test's start) keep their order.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(|| {
        let now = Instant::now();
        now.checked_sub(Duration::from_secs(3600)).unwrap_or(now)
    })
}

impl Tick {
    pub(crate) fn of(t: Instant) -> Self {
        let us = t.saturating_duration_since(epoch()).as_micros();
        Self(u64::try_from(us).unwrap_or(u64::MAX))
    }

    pub(crate) fn instant(self) -> Instant {
        epoch() + Duration::from_micros(self.0)
    }
}

/// A wall-clock time (when a path was measured) to the millisecond, in 8
/// bytes against an `Option<SystemTime>`'s 16; None before 1970.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stamp(std::num::NonZeroU64);

impl Stamp {
    pub(crate) fn now() -> Option<Self> {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_millis();
        std::num::NonZeroU64::new(u64::try_from(ms).ok()?).map(Self)
    }

    pub(crate) fn time(self) -> std::time::SystemTime {
        std::time::UNIX_EPOCH + Duration::from_millis(self.0.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_keep_their_order_and_come_back_to_the_microsecond() {
        let a = Instant::now();
        let b = a + Duration::from_micros(1500);
        let (ta, tb) = (Tick::of(a), Tick::of(b));
        assert!(ta < tb);
        assert!(Tick::of(a + Duration::from_nanos(300)) >= ta);
        let back = tb.instant();
        assert!(back <= b && b.duration_since(back) < Duration::from_micros(1));
        assert_eq!(Tick::of(back), tb);
    }

    #[test]
    fn records_are_smaller() {
        assert_eq!(std::mem::size_of::<Tick>(), 8);
        assert_eq!(std::mem::size_of::<Option<Stamp>>(), 8);
        let s = Stamp::now().unwrap().time();
        let d = std::time::SystemTime::now().duration_since(s).unwrap();
        assert!(d < Duration::from_secs(1));
    }
}
