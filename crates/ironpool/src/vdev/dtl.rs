//! A leaf's dirty time log (DTL): the txgs in which it missed writes.
//!
//! A leaf misses writes while it is missing, offline or failing, and a
//! replacement has missed everything written before it arrived. Blocks are
//! copy-on-write and carry their birth txg, so "which txgs did this device miss"
//! is all a resilver needs: it rewrites the blocks born in those txgs onto the
//! leaf and nothing else, and reads do not trust the leaf for them meanwhile.
//!
//! Two kinds of entry:
//! - closed ranges `[first, last]` of txgs (merged when they touch);
//! - an open range from `missing_since` on, while the leaf is still away: every
//!   txg from then is missed, without an update per txg. It is closed at the txg
//!   open when the leaf comes back.
//!
//! The log is persisted in the pool config (`LeafConfig::dtl`), so it survives
//! export, crashes and reimport; `dirty` says the config needs rewriting.

use std::collections::BTreeMap;

/// The `last` of a persisted open range.
pub const OPEN_RANGE_END: u64 = u64::MAX;

/// The txgs one leaf missed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dtl {
    /// Closed ranges, first -> last (inclusive), disjoint and not touching.
    ranges: BTreeMap<u64, u64>,
    /// Every txg from this one on is missed (the leaf is still away).
    missing_since: Option<u64>,
    /// Changed since the config last took a copy.
    dirty: bool,
}

impl Dtl {
    /// The log as the config stores it (ranges in order, possibly ending with
    /// an open one). Overlapping or touching ranges are merged, so a damaged
    /// but decodable list still gives a usable log.
    pub fn from_config(ranges: &[[u64; 2]]) -> Dtl {
        let mut dtl = Dtl::default();
        for &[first, last] in ranges {
            if last == OPEN_RANGE_END {
                dtl.missing_since = Some(dtl.missing_since.map_or(first, |since| since.min(first)));
            } else if first <= last {
                dtl.add_range(first, last);
            }
        }
        dtl.dirty = false;
        dtl
    }

    /// The config form: closed ranges, then the open one.
    pub fn to_config(&self) -> Vec<[u64; 2]> {
        let mut out: Vec<[u64; 2]> = self
            .ranges
            .iter()
            .map(|(first, last)| [*first, *last])
            .collect();
        if let Some(since) = self.missing_since {
            // Closed ranges at or after the open one are inside it.
            out.retain(|[first, _]| *first < since);
            if let Some(last) = out.last_mut() {
                last[1] = last[1].min(since - 1);
            }
            out.push([since, OPEN_RANGE_END]);
        }
        out
    }

    /// True when the leaf missed writes in `txg`: its copy of a block born then
    /// cannot be trusted.
    pub fn contains(&self, txg: u64) -> bool {
        if self.missing_since.is_some_and(|since| txg >= since) {
            return true;
        }
        self.ranges
            .range(..=txg)
            .next_back()
            .is_some_and(|(_, last)| *last >= txg)
    }

    /// True when nothing was missed.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty() && self.missing_since.is_none()
    }

    /// True while the leaf is away (an open range).
    pub fn is_open(&self) -> bool {
        self.missing_since.is_some()
    }

    /// Records that the leaf missed a write born in `txg`.
    pub fn add(&mut self, txg: u64) {
        if !self.contains(txg) {
            self.add_range(txg, txg);
        }
    }

    /// Records that the leaf missed every txg of `first..=last`.
    pub fn add_range(&mut self, first: u64, last: u64) {
        debug_assert!(first <= last);
        let mut first = first;
        let mut last = last;
        // Absorb every range that overlaps or touches [first, last].
        let touching: Vec<(u64, u64)> = self
            .ranges
            .range(..=last.saturating_add(1))
            .filter(|(_, range_last)| range_last.saturating_add(1) >= first)
            .map(|(range_first, range_last)| (*range_first, *range_last))
            .collect();
        for (range_first, range_last) in touching {
            self.ranges.remove(&range_first);
            first = first.min(range_first);
            last = last.max(range_last);
        }
        self.ranges.insert(first, last);
        self.dirty = true;
    }

    /// The leaf went away: every txg from `txg` on is missed until `close`.
    pub fn open(&mut self, txg: u64) {
        if self.missing_since.is_none() {
            self.missing_since = Some(txg);
            self.dirty = true;
        }
    }

    /// The leaf is back while `txg` is open: the open range becomes
    /// `[missing_since, txg]` (writes issued from now on reach it; `txg` itself
    /// stays in the log because part of it was missed).
    pub fn close(&mut self, txg: u64) {
        if let Some(since) = self.missing_since.take() {
            self.add_range(since.min(txg), txg);
            self.dirty = true;
        }
    }

    /// The closed ranges, oldest first: what a resilver can work on.
    pub fn closed_ranges(&self) -> Vec<(u64, u64)> {
        self.ranges
            .iter()
            .map(|(first, last)| (*first, *last))
            .collect()
    }

    /// Forgets `ranges` (a resilver rewrote every block born in them); txgs
    /// added since stay.
    pub fn remove_ranges(&mut self, ranges: &[(u64, u64)]) {
        for &(first, last) in ranges {
            let overlapping: Vec<(u64, u64)> = self
                .ranges
                .range(..=last)
                .filter(|(_, range_last)| **range_last >= first)
                .map(|(range_first, range_last)| (*range_first, *range_last))
                .collect();
            for (range_first, range_last) in overlapping {
                self.ranges.remove(&range_first);
                if range_first < first {
                    self.ranges.insert(range_first, first - 1);
                }
                if range_last > last {
                    self.ranges.insert(last + 1, range_last);
                }
            }
        }
        self.dirty = true;
    }

    /// Replaces the log with "missed everything up to `txg`" (a new device).
    pub fn reset_to_everything_before(&mut self, txg: u64) {
        self.ranges.clear();
        self.missing_since = None;
        self.add_range(0, txg);
    }

    /// True once, after a change: the config should take a new copy.
    pub fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_split() {
        let mut dtl = Dtl::default();
        assert!(dtl.is_empty() && !dtl.contains(5));
        dtl.add(5);
        dtl.add(6);
        dtl.add(9);
        assert_eq!(dtl.closed_ranges(), vec![(5, 6), (9, 9)]);
        dtl.add_range(7, 8);
        assert_eq!(dtl.closed_ranges(), vec![(5, 9)]);
        assert!(dtl.contains(5) && dtl.contains(9) && !dtl.contains(4) && !dtl.contains(10));
        dtl.remove_ranges(&[(6, 7)]);
        assert_eq!(dtl.closed_ranges(), vec![(5, 5), (8, 9)]);
        dtl.remove_ranges(&[(0, 100)]);
        assert!(dtl.is_empty());
        assert!(dtl.take_dirty());
        assert!(!dtl.take_dirty());
    }

    #[test]
    fn an_open_range_covers_every_later_txg_until_closed() {
        let mut dtl = Dtl::default();
        dtl.add(3);
        dtl.open(10);
        assert!(dtl.contains(10) && dtl.contains(1_000_000) && !dtl.contains(9));
        dtl.add(50); // inside the open range: no change
        assert_eq!(dtl.to_config(), vec![[3, 3], [10, OPEN_RANGE_END]]);
        let round_trip = Dtl::from_config(&dtl.to_config());
        assert!(
            round_trip.is_open()
                && round_trip.contains(77)
                && round_trip.contains(3)
                && !round_trip.contains(4)
        );
        dtl.close(20);
        assert!(!dtl.is_open());
        assert_eq!(dtl.closed_ranges(), vec![(3, 3), (10, 20)]);
        assert!(!dtl.contains(21));
        dtl.reset_to_everything_before(30);
        assert_eq!(dtl.closed_ranges(), vec![(0, 30)]);
    }

    #[test]
    fn garbage_from_a_config_still_gives_a_consistent_log() {
        let dtl = Dtl::from_config(&[
            [9, 4],
            [5, 8],
            [7, 12],
            [20, OPEN_RANGE_END],
            [15, OPEN_RANGE_END],
        ]);
        assert_eq!(dtl.closed_ranges(), vec![(5, 12)]);
        assert!(dtl.contains(15) && !dtl.contains(14) && !dtl.contains(4));
    }
}
