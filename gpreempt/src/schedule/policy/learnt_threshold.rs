//! The idle threshold learnt from every gap. With `learn_idle`, every gap between two polls that
//! saw online work is recorded (`gap_record.rs`), the short ones too. Gaps inside a request
//! (between the decode steps of a continuous-batching engine, between a request's kernels) and
//! gaps between requests form two populations; once [`LEARN_MIN_GAPS`] are on record and a
//! valley separates them (the widest ratio across [`VALLEY_SPAN`] neighbouring sorted gaps, at
//! least [`VALLEY_RATIO`], with a tenth of the gaps below it and [`VALLEY_ABOVE`] above: a
//! serving engine makes hundreds of step gaps per busy period and one gap between busy periods,
//! so the gaps between requests can be under 1 % of the record, which is why it holds
//! [`ALL_GAPS`](super::ALL_GAPS)), the threshold goes into it: twice the longest gap inside a
//! request, or the geometric middle of the valley if that is shorter, within [`IDLE_RANGE`] of
//! `idle`. Without a valley (Poisson gaps are one smooth population) `idle` stays. A threshold
//! above the in-request gaps is what keeps a serving engine's step gaps from flapping the GPU
//! (each flip a device-wide unmap that preempts the online queues too).

/// Gaps on record before a threshold is learnt from them.
pub const LEARN_MIN_GAPS: usize = 32;
/// The least ratio across [`VALLEY_SPAN`] sorted gaps that counts as a valley between two populations.
pub const VALLEY_RATIO: f64 = 4.0;
/// Below a valley lie at least 1 / this of the gaps (and 3): the population inside requests.
pub const VALLEY_SIDE: usize = 10;
/// Above a valley lie at least this many gaps: the gaps between requests may be few (one per
/// busy period of a serving engine), but one or two long stalls are no population.
pub const VALLEY_ABOVE: usize = 3;
/// A valley is measured across this many neighbouring sorted gaps, not between two: a serving
/// engine's step gaps have a thin tail (a larger batch's longer steps, a step delayed by a
/// transition) that fills the valley with one or two gaps at a time, so no two neighbours are
/// [`VALLEY_RATIO`] apart though the populations are (harness batching load, recorded:
/// `… 2.4, 2.5, 2.6, 3.1, 3.5, 4.6, 6.0, 17.9, 36.3 …` ms, widest neighbour ratio 3.0). The gaps
/// the span steps over fall on either side of the threshold it sets.
pub const VALLEY_SPAN: usize = 3;
/// The learnt threshold stays within `idle` / this and `idle` × this.
pub const IDLE_RANGE: u64 = 8;
/// The threshold is learnt again after this many new gaps (a scan of
/// [`ALL_GAPS`](super::ALL_GAPS) values).
const RELEARN_EVERY: usize = 16;

#[derive(Clone, Debug)]
pub(super) struct LearntThreshold {
    /// `idle`: where the threshold starts, and where it stays without a valley, ns.
    configured_ns: u64,
    /// The idle threshold in force, ns.
    threshold_ns: u64,
    /// Gaps recorded since the threshold was last learnt.
    unlearnt: usize,
}

impl LearntThreshold {
    pub(super) fn new(configured_ns: u64) -> Self {
        Self { configured_ns, threshold_ns: configured_ns, unlearnt: 0 }
    }

    /// The idle threshold in force (learnt, or `idle`), ns.
    pub(super) fn ns(&self) -> u64 {
        self.threshold_ns
    }

    /// One more gap is on record (`sorted`: every gap on record, shortest first): learnt first as
    /// soon as [`LEARN_MIN_GAPS`] are, then every [`RELEARN_EVERY`].
    pub(super) fn note_gap(&mut self, sorted: &[u64]) {
        self.unlearnt += 1;
        if self.unlearnt >= RELEARN_EVERY || sorted.len() == LEARN_MIN_GAPS {
            self.unlearnt = 0;
            if sorted.len() >= LEARN_MIN_GAPS {
                self.threshold_ns = in_valley(sorted, self.configured_ns);
            }
        }
    }
}

/// The threshold the gaps `sorted` (shortest first) say: in their valley, or `configured` when
/// they have none.
fn in_valley(sorted: &[u64], configured: u64) -> u64 {
    let n = sorted.len();
    let below = (n / VALLEY_SIDE).max(3);
    // The widest ratio across VALLEY_SPAN neighbours with a tenth of the gaps below and a few
    // above.
    let mut best: Option<(f64, usize)> = None;
    for i in below..=n.saturating_sub(VALLEY_ABOVE.max(VALLEY_SPAN)) {
        let ratio = sorted[i + VALLEY_SPAN - 1].max(1) as f64 / sorted[i - 1].max(1) as f64;
        if best.is_none_or(|(r, _)| ratio > r) {
            best = Some((ratio, i));
        }
    }
    match best {
        Some((ratio, i)) if ratio >= VALLEY_RATIO => {
            let (inside, between) = (sorted[i - 1], sorted[i + VALLEY_SPAN - 1]);
            let middle = ((inside as f64) * (between as f64)).sqrt() as u64;
            (inside * 2).min(middle).clamp(configured / IDLE_RANGE, configured.saturating_mul(IDLE_RANGE))
        }
        _ => configured,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;

    /// `inner` gaps of 1.0-1.9 ms and `between` gaps of 30 ms, sorted.
    fn two_populations(inner: usize, between: usize) -> Vec<u64> {
        let mut gaps: Vec<u64> = (0..inner as u64).map(|i| 1_000 * US + i % 10 * 100 * US).collect();
        gaps.extend(std::iter::repeat_n(30_000 * US, between));
        gaps.sort_unstable();
        gaps
    }

    #[test]
    fn a_valley_between_two_populations_sets_twice_the_longest_inner_gap() {
        assert_eq!(in_valley(&two_populations(100, VALLEY_ABOVE), 2_000 * US), 3_800 * US);
        // Within IDLE_RANGE of `idle`.
        assert_eq!(in_valley(&two_populations(100, 5), 100 * US), 800 * US);
        assert_eq!(in_valley(&two_populations(100, 5), 200 * US), 1_600 * US);
    }

    #[test]
    fn without_a_valley_the_configured_threshold_stays() {
        let smooth: Vec<u64> = (1..=200).map(|i| i * 200 * US).collect();
        assert_eq!(in_valley(&smooth, 2_000 * US), 2_000 * US);
        assert_eq!(in_valley(&[], 2_000 * US), 2_000 * US);
    }

    #[test]
    fn the_threshold_is_learnt_at_the_minimum_record_and_then_every_few_gaps() {
        let gaps = two_populations(100, 5);
        let mut t = LearntThreshold::new(2_000 * US);
        // Too few gaps: no learning.
        for n in 1..LEARN_MIN_GAPS {
            t.note_gap(&gaps[..n]);
        }
        assert_eq!(t.ns(), 2_000 * US);
        let mut at_min = gaps[..LEARN_MIN_GAPS - 3].to_vec();
        at_min.extend([30_000 * US; 3]);
        t.note_gap(&at_min);
        assert_eq!(t.ns(), 2_400 * US);
        // Not learnt again before RELEARN_EVERY more gaps.
        for _ in 1..RELEARN_EVERY {
            t.note_gap(&(1..=64).map(|i| i * 200 * US).collect::<Vec<_>>());
        }
        assert_eq!(t.ns(), 2_400 * US);
        t.note_gap(&(1..=64).map(|i| i * 200 * US).collect::<Vec<_>>());
        assert_eq!(t.ns(), 2_000 * US);
    }
}
