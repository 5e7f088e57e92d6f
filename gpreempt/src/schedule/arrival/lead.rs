//! The lead: how long after a request reaches the online service's socket its first GPU work is
//! published (a doorbell store or a moved write index), learnt per online process and by request
//! size, and what the scheduler does with an arrival: a *pending hold* whose SUSPENDs are issued
//! just early enough to be done before the predicted first kernel, released if no GPU work comes
//! within the learnt upper bound. Pure: timestamps in ns of CLOCK_MONOTONIC (the probe's
//! `bpf_ktime_get_ns` and the reaction thread's clock), no I/O.
//!
//! Why a prediction and not a suspend at arrival: an LLM server's CPU phase grows with the prompt
//! (tokenization ≈ 500 k tokens/s, so a 100 k-token prompt spends ~130 ms before its first kernel,
//! docs/scheduling.md); suspending at arrival would hold the offline side for all of it. Why a
//! bound: probes the deny list does not know, scrapes and cancelled requests bring no GPU work,
//! and must cost the offline side no more than the bound.
//!
//! The model, over the last [`SAMPLES`] requests that brought GPU work: lead ≈ a + b × size (least
//! squares on the request's size as the probe sees it, `size.rs`), and the spread of the
//! residuals. An arrival of size s is predicted to publish its first work no earlier than
//! `fit(s) + q_low` and no later than `fit(s) + q_high`; the SUSPENDs are issued at
//! `arrival + fit(s) + q_low − 2 × cost` (the transition's cost as the policy measures it: each
//! SUSPEND and its reaction), and the hold is released at `arrival + BOUND_FACTOR × (fit(s) + q_high)`.
//! Until [`MIN_SAMPLES`] requests are on record nothing is known: the SUSPENDs are issued at once
//! and the bound is [`COLD_BOUND_NS`].

use std::collections::VecDeque;

use super::attribution::Prediction;

/// Requests kept for the fit.
pub const SAMPLES: usize = 64;
/// Requests on record before the lead is predicted (before: issue at once).
pub const MIN_SAMPLES: usize = 8;
/// The bound of a pending hold before any lead is known: long enough for a Python server's CPU
/// phase at a few thousand tokens (vLLM on MI300X: 15 ms to first byte at 8 k tokens of context),
/// short enough that a scrape the deny list missed costs the offline side little.
pub const COLD_BOUND_NS: u64 = 50_000_000;
/// The bound is this many times the latest predicted first work: a request is released as wasted
/// only well past where its like have always published.
pub const BOUND_FACTOR: u64 = 2;
/// Never release before this (the reaction's own jitter).
pub const MIN_BOUND_NS: u64 = 2_000_000;
/// The residual quantiles that bracket the lead (of 64 samples: the 3rd lowest and 3rd highest).
const Q_LOW: f64 = 0.05;
const Q_HIGH: f64 = 0.95;

/// One request that brought GPU work.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LeadSample {
    pub size: u32,
    pub lead_ns: u64,
}

/// What to do with one arrival.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingPlan {
    /// Issue the SUSPENDs at this time (the arrival itself when nothing is known).
    pub issue_at_ns: u64,
    /// Release the hold, counted as wasted, if no GPU work came by this time.
    pub release_at_ns: u64,
    /// Where the first work is expected, from the lead's bracket (None: cold), for the
    /// attribution of submissions to requests (`attribution.rs`).
    pub prediction: Option<Prediction>,
}

/// How one pending hold ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PendingEnd {
    /// GPU work came after the SUSPENDs were done (or with nothing to suspend): the lead was used.
    Served { lead_ns: u64 },
    /// GPU work came before the SUSPENDs were issued or done: the request waited for them.
    Late { lead_ns: u64 },
    /// No GPU work by the bound: the offline side was held for nothing.
    Wasted,
}

/// The lead model of one online process.
#[derive(Clone, Debug, Default)]
pub struct LeadModel {
    samples: VecDeque<LeadSample>,
    /// The fit and its residual bracket over `samples`, refit at each [`LeadModel::record`]: a
    /// request's first work is a step away from its arrival's SUSPEND, so the arrival's plan
    /// only evaluates the line (the fit's sort over 64 residuals cost the arrival's step ~6 µs
    /// natively, cold after the thread's wake).
    fitted: Option<Fitted>,
}

/// lead ≈ a + b × size, and the residuals' [`Q_LOW`] and [`Q_HIGH`] quantiles, ns.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Fitted {
    a: f64,
    b: f64,
    low: f64,
    high: f64,
}

impl LeadModel {
    pub fn record(&mut self, sample: LeadSample) {
        if self.samples.len() == SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
        self.fitted = self.refit();
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Least squares of lead on size: (a, b) in ns and ns per byte (b ≥ 0: a larger request never
    /// predicts an earlier kernel; with one size only, b = 0 and a the mean).
    fn fit(&self) -> (f64, f64) {
        let n = self.samples.len() as f64;
        let mean_x = self.samples.iter().map(|s| f64::from(s.size)).sum::<f64>() / n;
        let mean_y = self.samples.iter().map(|s| s.lead_ns as f64).sum::<f64>() / n;
        let (mut sxy, mut sxx) = (0.0, 0.0);
        for s in &self.samples {
            let dx = f64::from(s.size) - mean_x;
            sxy += dx * (s.lead_ns as f64 - mean_y);
            sxx += dx * dx;
        }
        let b = if sxx > 0.0 { (sxy / sxx).max(0.0) } else { 0.0 };
        (mean_y - b * mean_x, b)
    }

    /// The fit and the residuals' quantiles over the samples on record (None below
    /// [`MIN_SAMPLES`]).
    fn refit(&self) -> Option<Fitted> {
        if self.samples.len() < MIN_SAMPLES {
            return None;
        }
        let (a, b) = self.fit();
        let mut residuals: Vec<f64> =
            self.samples.iter().map(|s| s.lead_ns as f64 - (a + b * f64::from(s.size))).collect();
        residuals.sort_by(f64::total_cmp);
        let at = |q: f64| residuals[((residuals.len() - 1) as f64 * q).round() as usize];
        Some(Fitted { a, b, low: at(Q_LOW), high: at(Q_HIGH) })
    }

    /// The lead's bracket for a request of `size` bytes, ns: (earliest, latest).
    pub fn bracket(&self, size: u32) -> Option<(u64, u64)> {
        let Fitted { a, b, low, high } = self.fitted?;
        let fit = a + b * f64::from(size);
        let clamp = |v: f64| v.max(0.0).round() as u64;
        Some((clamp(fit + low), clamp(fit + high)))
    }

    /// The plan for a request of `size` bytes that arrived at `arrival_ns`, given what a
    /// transition costs now (`cost_ns`: the SUSPENDs and the reaction, as the policy measures it).
    pub fn plan(&self, arrival_ns: u64, size: u32, cost_ns: u64) -> PendingPlan {
        match self.bracket(size) {
            None => {
                PendingPlan { issue_at_ns: arrival_ns, release_at_ns: arrival_ns + COLD_BOUND_NS, prediction: None }
            }
            Some((early, late)) => PendingPlan {
                issue_at_ns: arrival_ns + early.saturating_sub(2 * cost_ns),
                release_at_ns: arrival_ns + (BOUND_FACTOR * late).max(MIN_BOUND_NS),
                prediction: Some(Prediction::of(arrival_ns, (early, late))),
            },
        }
    }
}

/// Tallies of pending holds, per online process (the report's figures): every arrival ends
/// `served`, `late` or `wasted`, or is still `open`; `busy` counts those of them that found the
/// process's GPU work already visible.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PendingCounts {
    /// Arrivals the probe sent (one per arming).
    pub arrivals: u64,
    /// Its GPU work came after the offline side was held.
    pub served: u64,
    /// Its GPU work came before the SUSPENDs returned: the request waited for (some of) them.
    pub late: u64,
    /// Of the late ones, those whose GPU work came before the SUSPENDs' planned issue time: the
    /// lead was shorter than the model's bracket (the rest found their SUSPENDs under way).
    pub late_before_issue: u64,
    /// No GPU work by the bound: released, the offline side held for nothing.
    pub wasted: u64,
    /// It found the process's GPU work already visible (another request's): its lead is not
    /// learnt from (its first work cannot be told from the other's for sure).
    pub busy: u64,
    /// Submissions taken as an earlier request's continuation while holds were pending: they came
    /// while its work was in flight and before any hold's own work could (`attribution.rs`), and
    /// ended none.
    pub continued: u64,
    /// Still pending when the figures were taken.
    pub open: u64,
}

impl PendingCounts {
    /// Another run's tallies added to these (`evaluate`'s sum over the scheduled runs).
    pub fn add(&mut self, other: &Self) {
        self.arrivals += other.arrivals;
        self.served += other.served;
        self.late += other.late;
        self.late_before_issue += other.late_before_issue;
        self.wasted += other.wasted;
        self.busy += other.busy;
        self.continued += other.continued;
        self.open += other.open;
    }

    pub fn end(&mut self, end: PendingEnd) {
        match end {
            PendingEnd::Served { .. } => self.served += 1,
            PendingEnd::Late { .. } => self.late += 1,
            PendingEnd::Wasted => self.wasted += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// The vLLM-on-MI300X fit (docs/scheduling.md): 3.2 ms + 1.26 µs per prompt token, a token
    /// taken as 4 bytes of the request.
    fn vllm(size: u32) -> u64 {
        3_200_000 + u64::from(size) / 4 * 1_260
    }

    #[test]
    fn cold_it_suspends_at_once_and_releases_at_the_cold_bound() {
        let m = LeadModel::default();
        assert_eq!(
            m.plan(10 * MS, 4_000, 900_000),
            PendingPlan { issue_at_ns: 10 * MS, release_at_ns: 10 * MS + COLD_BOUND_NS, prediction: None }
        );
    }

    #[test]
    fn a_learnt_lead_issues_just_early_enough_and_grows_with_the_request() {
        let mut m = LeadModel::default();
        for i in 0..64u32 {
            let size = 400 + (i % 16) * 2_000;
            m.record(LeadSample { size, lead_ns: vllm(size) });
        }
        // A noiseless line: the bracket is the line itself at any size.
        let (early, late) = m.bracket(8_000).unwrap();
        assert!(early.abs_diff(vllm(8_000)) <= 2, "{early}");
        assert!(late.abs_diff(vllm(8_000)) <= 2, "{late}");
        // 1 k tokens (4 KB): lead 4.46 ms; cost 0.9 ms: issue at 4.46 − 1.8 = 2.66 ms after arrival.
        let p = m.plan(100 * MS, 4_000, 900_000);
        assert!((p.issue_at_ns - 100 * MS).abs_diff(2_460_000 + 200_000) <= 2, "{p:?}");
        assert!((p.release_at_ns - 100 * MS).abs_diff(2 * 4_460_000) <= 4, "{p:?}");
        // A 100 k-token prompt (400 KB): its 129 ms of CPU phase is not held.
        let p = m.plan(0, 400_000, 900_000);
        assert!(p.issue_at_ns > 125 * MS, "{p:?}");
    }

    #[test]
    fn noise_widens_the_bracket_to_its_quantiles() {
        // Leads 5 ms ± up to 2 ms (a deterministic spread), one size.
        let mut m = LeadModel::default();
        for i in 0..64u64 {
            m.record(LeadSample { size: 1_000, lead_ns: 3 * MS + (i * 37 % 64) * MS / 16 });
        }
        let (early, late) = m.bracket(1_000).unwrap();
        // Residual quantiles of a uniform 3-7 ms spread: the 3rd lowest and 3rd highest samples.
        assert_eq!((early, late), (3 * MS + 3 * MS / 16, 3 * MS + 60 * MS / 16));
        assert_eq!(m.plan(0, 1_000, 0).issue_at_ns, early);
    }

    #[test]
    fn the_bracket_follows_each_sample_as_the_window_slides() {
        let mut m = LeadModel::default();
        for _ in 0..MIN_SAMPLES - 1 {
            m.record(LeadSample { size: 1_000, lead_ns: 4 * MS });
        }
        // One short of MIN_SAMPLES: cold.
        assert_eq!(m.bracket(1_000), None);
        m.record(LeadSample { size: 1_000, lead_ns: 4 * MS });
        assert_eq!(m.bracket(1_000), Some((4 * MS, 4 * MS)));
        // The service's lead drops to 1 ms: half the window through, the bracket spans both leads;
        // once every 4 ms sample has left the window of SAMPLES, it is the new lead's (refit at
        // each record, not at each arrival).
        for _ in 0..SAMPLES / 2 {
            m.record(LeadSample { size: 1_000, lead_ns: MS });
        }
        assert_eq!(m.bracket(1_000), Some((MS, 4 * MS)));
        for _ in 0..SAMPLES / 2 {
            m.record(LeadSample { size: 1_000, lead_ns: MS });
        }
        assert_eq!(m.bracket(1_000), Some((MS, MS)));
    }

    #[test]
    fn a_slope_is_never_negative_and_the_bound_never_below_its_floor() {
        let mut m = LeadModel::default();
        for i in 0..10u32 {
            m.record(LeadSample { size: 100 * (i + 1), lead_ns: 100_000 - u64::from(i) * 5_000 });
        }
        let (_, b) = m.fit();
        assert_eq!(b, 0.0);
        let p = m.plan(0, 100, 50_000);
        assert_eq!(p.release_at_ns, MIN_BOUND_NS);
    }

    #[test]
    fn counts_tally_each_end() {
        let mut c = PendingCounts { arrivals: 4, ..PendingCounts::default() };
        // Every arrival ends one way (busy and open are counted where they are seen).
        for e in
            [PendingEnd::Served { lead_ns: 1 }, PendingEnd::Late { lead_ns: 1 }, PendingEnd::Wasted, PendingEnd::Wasted]
        {
            c.end(e);
        }
        assert_eq!(
            c,
            PendingCounts {
                arrivals: 4,
                served: 1,
                late: 1,
                late_before_issue: 0,
                wasted: 2,
                busy: 0,
                continued: 0,
                open: 0
            }
        );
    }
}
