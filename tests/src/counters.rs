//! The datapath's counters in tests: a snapshot of every reason's packets,
//! and what was counted between two snapshots.

use dataplane_common::Reason;
use weft::dataplane::Counters;

/// Every reason's packet and byte counts at one moment.
pub struct Snapshot(Vec<u64>, Vec<u64>);

impl Snapshot {
    pub fn of(c: &Counters) -> Self {
        let all = c.all().expect("the counters are readable");
        Snapshot(
            all.iter().map(|(_, v)| v.packets).collect(),
            all.iter().map(|(_, v)| v.bytes).collect(),
        )
    }

    /// The packets counted for `r` from `before` to this snapshot.
    pub fn since(&self, before: &Snapshot, r: Reason) -> u64 {
        self.0[r as usize] - before.0[r as usize]
    }

    /// The bytes counted for `r` from `before` to this snapshot.
    pub fn bytes_since(&self, before: &Snapshot, r: Reason) -> u64 {
        self.1[r as usize] - before.1[r as usize]
    }
}
