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
//!
//! A gap that ended with a request the arrival probe announced (a pending hold was open when the
//! online work came back, `reaction/arrivals.rs`) lies between requests by construction, whatever
//! its length. Where the probe announces most gaps (at least [`ANNOUNCED_SHARE`] of the last
//! [`KIND_WINDOW`]) and the record has no valley, the gaps inside requests are the unannounced ones
//! shorter than `idle` (those `idle` kept held): the threshold is twice the longest of them, at
//! least `idle` / [`IDLE_RANGE`] and at most `idle`. Why: a Poisson service whose kernels follow
//! each other with no idle poll between them records only the gaps between its requests, one
//! smooth population with no valley, and kept `idle` (2 ms) after every request although no
//! request of it ever paused on the GPU (harness: 6.8 % of the idle GPU time lost per 200
//! requests, most of it those 2 ms). Without the probe nothing changes.

use std::collections::VecDeque;

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
/// The recent gaps whose kind (announced by the arrival probe or not) is kept.
pub const KIND_WINDOW: usize = 128;
/// The share of [`KIND_WINDOW`]'s gaps the arrival probe must have announced before the
/// unannounced ones are taken for the gaps inside requests.
pub const ANNOUNCED_SHARE: f64 = 0.5;
/// The share of [`KIND_WINDOW`]'s gaps, unannounced and shorter than `idle`, the threshold may
/// fall below (`above_unannounced`).
pub const RESUMED_THROUGH: f64 = 0.01;
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
    /// The last [`KIND_WINDOW`] gaps, oldest first: (ns, announced by the arrival probe).
    kinds: VecDeque<(u64, bool)>,
}

impl LearntThreshold {
    pub(super) fn new(configured_ns: u64) -> Self {
        Self { configured_ns, threshold_ns: configured_ns, unlearnt: 0, kinds: VecDeque::with_capacity(KIND_WINDOW) }
    }

    /// The idle threshold in force (learnt, or `idle`), ns.
    pub(super) fn ns(&self) -> u64 {
        self.threshold_ns
    }

    /// One more gap is on record (`sorted`: every gap on record, shortest first): learnt first as
    /// soon as [`LEARN_MIN_GAPS`] are, then every [`RELEARN_EVERY`].
    /// `gap` (ns) is the one just recorded; `announced`: it ended with a request the arrival
    /// probe announced.
    pub(super) fn note_gap(&mut self, sorted: &[u64], gap: u64, announced: bool) {
        if self.kinds.len() == KIND_WINDOW {
            self.kinds.pop_front();
        }
        self.kinds.push_back((gap, announced));
        self.unlearnt += 1;
        if self.unlearnt >= RELEARN_EVERY || sorted.len() == LEARN_MIN_GAPS {
            self.unlearnt = 0;
            if sorted.len() >= LEARN_MIN_GAPS {
                let valley = in_valley(sorted, self.configured_ns);
                self.threshold_ns = if valley == self.configured_ns {
                    above_unannounced(&self.kinds, self.configured_ns).unwrap_or(valley)
                } else {
                    valley
                };
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

/// Where the arrival probe announced at least [`ANNOUNCED_SHARE`] of `kinds` (and
/// [`LEARN_MIN_GAPS`] of them are on record): twice the longest unannounced gap shorter than
/// `configured` (a gap inside a request that `configured` kept held), within `configured` /
/// [`IDLE_RANGE`] and `configured`, leaving out the longest [`RESUMED_THROUGH`] of `kinds`: a
/// request whose probe hit was taken for another's (two requests in one busy period, the second
/// one's first work seen in the first one's) ends an unannounced gap between requests, and one
/// such gap must not pin the threshold; a gap inside a request resumed through costs that
/// request a RESUME and a SUSPEND, so at most that share of them may be (the P99 goal). None: the
/// probe does not see this service's requests.
fn above_unannounced(kinds: &VecDeque<(u64, bool)>, configured: u64) -> Option<u64> {
    let announced = kinds.iter().filter(|(_, a)| *a).count();
    if kinds.len() < LEARN_MIN_GAPS || (announced as f64) < ANNOUNCED_SHARE * kinds.len() as f64 {
        return None;
    }
    let mut inside: Vec<u64> = kinds.iter().filter(|&&(g, a)| !a && g < configured).map(|&(g, _)| g).collect();
    inside.sort_unstable_by(|a, b| b.cmp(a));
    let longest = inside.get((kinds.len() as f64 * RESUMED_THROUGH) as usize).copied().unwrap_or(0);
    Some(longest.saturating_mul(2).clamp(configured / IDLE_RANGE, configured))
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
            t.note_gap(&gaps[..n], gaps[n - 1], false);
        }
        assert_eq!(t.ns(), 2_000 * US);
        let mut at_min = gaps[..LEARN_MIN_GAPS - 3].to_vec();
        at_min.extend([30_000 * US; 3]);
        t.note_gap(&at_min, 30_000 * US, false);
        assert_eq!(t.ns(), 2_400 * US);
        // Not learnt again before RELEARN_EVERY more gaps.
        for _ in 1..RELEARN_EVERY {
            t.note_gap(&(1..=64).map(|i| i * 200 * US).collect::<Vec<_>>(), 200 * US, false);
        }
        assert_eq!(t.ns(), 2_400 * US);
        t.note_gap(&(1..=64).map(|i| i * 200 * US).collect::<Vec<_>>(), 200 * US, false);
        assert_eq!(t.ns(), 2_000 * US);
    }

    /// `gaps` (ns, announced or not) fed one by one as the policy feeds them, the record kept
    /// sorted: the threshold after the last.
    fn learnt(configured: u64, gaps: &[(u64, bool)]) -> u64 {
        let mut t = LearntThreshold::new(configured);
        let mut sorted = Vec::new();
        for &(g, announced) in gaps {
            let at = sorted.partition_point(|&x| x < g);
            sorted.insert(at, g);
            t.note_gap(&sorted, g, announced);
        }
        t.ns()
    }

    /// `n` gaps between requests of 3-33 ms (one smooth population: no valley), announced.
    fn between_requests(n: usize) -> Vec<(u64, bool)> {
        (0..n as u64).map(|i| ((3_000 + i * 7_919 % 30_000) * US, true)).collect()
    }

    #[test]
    fn gaps_the_arrival_probe_announced_and_none_inside_requests_lower_the_threshold_to_its_floor() {
        // No valley: the record alone keeps `idle`.
        let gaps = between_requests(LEARN_MIN_GAPS);
        let sorted = {
            let mut s: Vec<u64> = gaps.iter().map(|g| g.0).collect();
            s.sort_unstable();
            s
        };
        assert_eq!(in_valley(&sorted, 2_000 * US), 2_000 * US);
        // Announced, every one: idle / IDLE_RANGE, learnt at the LEARN_MIN_GAPS-th gap.
        assert_eq!(learnt(2_000 * US, &gaps[..LEARN_MIN_GAPS - 1]), 2_000 * US);
        assert_eq!(learnt(2_000 * US, &gaps), 250 * US);
    }

    #[test]
    fn unannounced_gaps_shorter_than_idle_set_twice_the_longest_leaving_out_one_in_a_hundred() {
        // 128 gaps: 120 between requests, announced; 8 unannounced inside requests, the two
        // longest 900 and 700 µs. One of 128 (1 %) is left out: 2 × 700 µs.
        let mut gaps = between_requests(120);
        for (i, g) in [300, 300, 300, 900, 300, 700, 300, 300].into_iter().enumerate() {
            gaps.insert(i * 15, (g * US, false));
        }
        assert_eq!(gaps.len(), KIND_WINDOW);
        assert_eq!(learnt(2_000 * US, &gaps), 1_400 * US);
        // An unannounced gap of `idle` or more is not inside a request (`idle` resumed there too).
        gaps[5] = (5_000 * US, false);
        assert_eq!(learnt(2_000 * US, &gaps), 1_400 * US);
        // Twice the longest stays at most `idle`.
        gaps[20] = (1_500 * US, false);
        gaps[21] = (1_400 * US, false);
        assert_eq!(learnt(2_000 * US, &gaps), 2_000 * US);
    }

    #[test]
    fn without_the_probe_or_with_few_gaps_announced_idle_stays() {
        let unannounced: Vec<(u64, bool)> =
            between_requests(KIND_WINDOW).into_iter().map(|(g, _)| (g, false)).collect();
        assert_eq!(learnt(2_000 * US, &unannounced), 2_000 * US);
        // 40 % announced (another path carries most requests): below ANNOUNCED_SHARE.
        let mostly: Vec<(u64, bool)> =
            between_requests(KIND_WINDOW).into_iter().enumerate().map(|(i, (g, _))| (g, i % 5 < 2)).collect();
        assert_eq!(learnt(2_000 * US, &mostly), 2_000 * US);
        // 50 %: the rule applies.
        let half: Vec<(u64, bool)> =
            between_requests(KIND_WINDOW).into_iter().enumerate().map(|(i, (g, _))| (g, i % 2 == 0)).collect();
        assert_eq!(learnt(2_000 * US, &half), 250 * US);
    }

    #[test]
    fn a_valley_in_the_record_wins_over_the_announced_gaps() {
        // A serving engine's step gaps (1.0-1.9 ms) inside requests and its gaps between busy
        // periods, every one announced by mistake: the valley sets 2 × 1.9 ms as without the probe.
        // 112 gaps (learnt at the 32nd and every 16th after: the last one learns), one in 20 long.
        let gaps: Vec<(u64, bool)> = (0..112u64)
            .map(|i| if i % 20 == 10 { (30_000 * US, true) } else { (1_000 * US + i % 10 * 100 * US, true) })
            .collect();
        assert_eq!(learnt(2_000 * US, &gaps), 3_800 * US);
    }
}
