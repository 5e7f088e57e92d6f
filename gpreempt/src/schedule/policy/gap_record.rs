//! The online gaps on record, what an idle gap's rest is predicted from and the threshold is
//! learnt from: every gap between two polls that saw online work (with `learn_idle`, the short
//! ones too), kept sorted, and the recent gaps between bursts (at least the threshold long).

use std::collections::VecDeque;

/// Gaps between online bursts kept for the mean rest (the rules of `--fixed-idle`).
const GAP_HISTORY: usize = 64;
/// Every online gap kept for learning the idle threshold: enough to hold several of a serving
/// engine's busy periods (the harness's continuous-batching engine, harness/PROFILES.md: 100-200
/// steps per busy period, so 256 gaps held one or two gaps between busy periods and never a
/// valley). Kept sorted gap by gap: an insertion moves at most 8 KiB.
pub const ALL_GAPS: usize = 1024;

#[derive(Clone, Debug)]
pub(super) struct GapRecord {
    /// Every recent gap between polls that saw online work, oldest first, ns.
    all: VecDeque<u64>,
    /// `all` sorted, kept so at every gap (no allocation on the reaction thread: its capacity is
    /// [`ALL_GAPS`]): what the threshold is learnt from and the median rest is read from.
    sorted: Vec<u64>,
    /// Recent idle gaps between bursts (at least the threshold in force when they ended), ns.
    between_bursts: VecDeque<u64>,
}

impl GapRecord {
    pub(super) fn new() -> Self {
        Self {
            all: VecDeque::with_capacity(ALL_GAPS),
            sorted: Vec::with_capacity(ALL_GAPS),
            between_bursts: VecDeque::with_capacity(GAP_HISTORY),
        }
    }

    /// Record one more gap between polls that saw online work, the oldest leaving at [`ALL_GAPS`].
    pub(super) fn push(&mut self, gap: u64) {
        if self.all.len() == ALL_GAPS
            && let Some(old) = self.all.pop_front()
        {
            let at = self.sorted.partition_point(|&g| g < old);
            self.sorted.remove(at);
        }
        self.all.push_back(gap);
        // Kept sorted one gap at a time (a move of at most ALL_GAPS words), so the median rest
        // counts every gap from the first (no stale snapshot while evidence is scarce).
        let at = self.sorted.partition_point(|&g| g < gap);
        self.sorted.insert(at, gap);
    }

    /// Record a gap between bursts, the oldest leaving at `GAP_HISTORY`.
    pub(super) fn push_between_bursts(&mut self, gap: u64) {
        if self.between_bursts.len() == GAP_HISTORY {
            self.between_bursts.pop_front();
        }
        self.between_bursts.push_back(gap);
    }

    /// Every gap on record, shortest first.
    pub(super) fn sorted(&self) -> &[u64] {
        &self.sorted
    }

    /// The median of `g - idle_ns` over every recorded gap `g > idle_ns`, and how many those
    /// are. One binary search in the sorted record: this runs at every poll of an idle,
    /// suspended GPU.
    pub(super) fn median_rest(&self, idle_ns: u64) -> (Option<u64>, usize) {
        let from = self.sorted.partition_point(|&g| g <= idle_ns);
        let n = self.sorted.len() - from;
        ((n > 0).then(|| self.sorted[from + (n - 1) / 2] - idle_ns), n)
    }

    /// The mean of `g - idle_ns` over the recent gaps between bursts `g > idle_ns` (the empirical
    /// mean residual life), and how many those are.
    pub(super) fn mean_rest(&self, idle_ns: u64) -> (Option<u64>, usize) {
        let longer = self.between_bursts.iter().filter(|&&g| g > idle_ns);
        let (n, sum) = longer.fold((0usize, 0u128), |(n, sum), &g| (n + 1, sum + u128::from(g - idle_ns)));
        ((n > 0).then(|| (sum / n as u128) as u64), n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_stays_sorted_and_forgets_the_oldest_gap() {
        let mut r = GapRecord::new();
        for gap in (0..ALL_GAPS as u64).rev() {
            r.push(gap + 10);
        }
        assert_eq!(r.sorted().len(), ALL_GAPS);
        assert!(r.sorted().windows(2).all(|w| w[0] <= w[1]));
        // The oldest, the longest (ALL_GAPS + 9), leaves for the newest.
        r.push(5);
        assert_eq!((r.sorted()[0], r.sorted()[ALL_GAPS - 1]), (5, ALL_GAPS as u64 + 8));
        assert_eq!(r.sorted().len(), ALL_GAPS);
    }

    #[test]
    fn the_rest_of_a_gap_is_the_median_over_every_gap_or_the_mean_over_the_long_ones() {
        let mut r = GapRecord::new();
        for gap in [1, 2, 3, 10, 20, 60] {
            r.push(gap);
        }
        for gap in [10, 20, 60] {
            r.push_between_bursts(gap);
        }
        // Longer than 2: 3, 10, 20, 60; the lower median 10, 8 left.
        assert_eq!(r.median_rest(2), (Some(8), 4));
        assert_eq!(r.median_rest(60), (None, 0));
        // Longer than 5: 10, 20, 60; rests 5, 15, 55.
        assert_eq!(r.mean_rest(5), (Some(25), 3));
        assert_eq!(r.mean_rest(60), (None, 0));
        for _ in 0..GAP_HISTORY {
            r.push_between_bursts(4);
        }
        assert_eq!(r.mean_rest(3), (Some(1), GAP_HISTORY));
    }
}
