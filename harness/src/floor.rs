//! What the issue-35 latency goal leaves the offline side on a Poisson load, for any scheduler
//! that protects online work by suspending the offline processes when it sees that work (the
//! lever this project drives: SUSPEND_QUEUES, which unmaps every queue of the GPU for the call).
//!
//! The argument, from figures the harness measures:
//! - a request that arrives while the offline processes run waits at least for their SUSPENDs:
//!   `delay` = the offline processes × the profile's shortest SUSPEND (no CWSR save, no
//!   detection counted: a lower bound). One that arrives while they are held waits at least its
//!   alone latency;
//! - Poisson arrivals see time averages (PASTA), and a hold is decided without knowing when the
//!   next request comes: a fraction `h` of the time held is a fraction `h` of requests held;
//! - so with the alone latencies' distribution F, the quantile q of the latencies under the
//!   scheduler stays ≤ `ratio` × its alone value t/ratio only if h·F(t) + (1−h)·F(t − delay) ≥ q,
//!   i.e. h ≥ (q − F(t − delay)) / (F(t) − F(t − delay));
//! - offline runs only while not held, so its share of the GPU time online leaves idle is at
//!   most (1 − h) / (1 − the online share alone).
//!
//! Where that maximum is below the offline goal, the two goals cannot both hold on that load and
//! profile, whatever the policy.

use gpreempt::stats::{nearest_rank, percentile};
use serde::Serialize;

/// Issue 35's latency goal: online P50 and P99 ≤ 1.10× alone.
pub const GOAL_RATIO: f64 = 1.10;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SuspendFloor {
    /// The least an unheld request waits for the offline processes' SUSPENDs, ms.
    pub delay_ms: f64,
    /// The least share of time the offline processes must be held for P50, and for P99, to stay
    /// ≤ [`GOAL_RATIO`] × alone.
    pub held_for_p50: f64,
    pub held_for_p99: f64,
    /// The online load's share of the GPU's time, alone.
    pub online_share: f64,
    /// The most offline can keep of the GPU time the online load leaves idle with both held.
    pub offline_of_idle_max: f64,
}

/// `alone_ns`: the online requests' latencies alone; `delay_ns`: the least wait of an unheld
/// request. None without latencies or idle time.
pub fn suspend_floor(alone_ns: &[u64], online_share: f64, delay_ns: u64) -> Option<SuspendFloor> {
    if alone_ns.is_empty() || online_share >= 1.0 {
        return None;
    }
    let mut sorted: Vec<f64> = alone_ns.iter().map(|&ns| ns as f64).collect();
    sorted.sort_by(f64::total_cmp);
    let held = |q: f64| held_for(&sorted, q, delay_ns as f64);
    let (held_for_p50, held_for_p99) = (held(50.0), held(99.0));
    Some(SuspendFloor {
        delay_ms: delay_ns as f64 / 1e6,
        held_for_p50,
        held_for_p99,
        online_share,
        offline_of_idle_max: ((1.0 - held_for_p50.max(held_for_p99)) / (1.0 - online_share)).min(1.0),
    })
}

/// The least held share for the `p`th percentile (nearest rank, as [`gpreempt::stats`]) to stay
/// ≤ [`GOAL_RATIO`] × alone when an unheld request waits `delay` more.
fn held_for(sorted: &[f64], p: f64, delay: f64) -> f64 {
    let n = sorted.len() as f64;
    // The share of requests whose latency the percentile must not pass: its nearest rank.
    let q = (nearest_rank(sorted.len(), p) + 1) as f64 / n;
    let t = GOAL_RATIO * percentile(sorted, p);
    let cdf = |x: f64| sorted.partition_point(|&v| v <= x) as f64 / n;
    let (held, unheld) = (cdf(t), cdf(t - delay));
    if unheld >= q { 0.0 } else { ((q - unheld) / (held - unheld)).clamp(0.0, 1.0) }
}

/// The continuous-batching engine's two goals at once (step P99 ≤ [`GOAL_RATIO`] × alone, and
/// offline ≥ 80 % of the idle GPU time with no resume inside a busy period), from the engine's
/// record alone: the opening step of each busy period, found with the offline side running,
/// waits at least `delay` for the SUSPENDs; enough of the openings that this carries past the
/// goal must find the offline side already held. A scheduler foresees neither when a request
/// comes nor how long its opening step will be, so an opening finds offline held with the share
/// of the idle gaps' time it is held, and those gaps are the only GPU time offline can have.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepFloor {
    pub delay_ms: f64,
    /// Engine busy periods (their opening steps).
    pub openings: usize,
    /// The steps' P99 with every opening step waiting `delay`, over the P99 alone.
    pub p99_ratio_unheld: f64,
    /// Openings that must find the offline side held for the P99 to stay within the goal.
    pub openings_to_hold: usize,
    /// The idle GPU time outside the busy periods, and the least of it those holds take (the
    /// share of openings to hold, of every gap), as shares of the idle GPU time.
    pub idle_outside_busy_of_idle: f64,
    pub hold_cost_of_idle: f64,
    /// What the other gaps lose at least: after a busy period's last step a hold must outlast
    /// the engine's longest step gap (no scheduler can tell the engine is done sooner without a
    /// resume inside a busy period), then the RESUMEs unmap every queue; as a share of the idle
    /// GPU time.
    pub transitions_cost_of_idle: f64,
    /// So the most offline can keep of the idle GPU time with both goals held.
    pub offline_of_idle_max: f64,
}

/// `steps_ns` and `opens`: each engine step's time and whether it opened a busy period;
/// `periods`: the busy periods (start, end), in order, one per opening but perhaps the last;
/// `delay_ns`: the least wait of an opening found with offline running; `after_busy_ns`: the
/// least a gap not held loses (the engine's longest step gap and the RESUMEs at their shortest).
pub fn step_floor(
    steps_ns: &[u64],
    opens: &[bool],
    periods: &[(u64, u64)],
    delay_ns: u64,
    after_busy_ns: u64,
) -> Option<StepFloor> {
    let (first, last) = (periods.first()?, periods.last()?);
    let n = steps_ns.len();
    if n == 0 || opens.len() != n {
        return None;
    }
    let mut sorted: Vec<f64> = steps_ns.iter().map(|&ns| ns as f64).collect();
    sorted.sort_by(f64::total_cmp);
    let p99 = percentile(&sorted, 99.0);
    let goal = GOAL_RATIO * p99;
    let delay = delay_ns as f64;
    let mut unheld: Vec<f64> =
        steps_ns.iter().zip(opens).map(|(&s, &o)| s as f64 + if o { delay } else { 0.0 }).collect();
    unheld.sort_by(f64::total_cmp);
    // At most this many steps may exceed the goal with the P99 (nearest rank) within it.
    let allowed_above = n - (nearest_rank(n, 99.0) + 1);
    let above_anyway = sorted.iter().filter(|&&s| s > goal).count();
    // Opening k's gap: the idle time before its busy period (none known before the first).
    let gaps: Vec<u64> = std::iter::once(0).chain(periods.windows(2).map(|w| w[1].0.saturating_sub(w[0].1))).collect();
    // The openings the delay carries past the goal.
    let crossing =
        steps_ns.iter().zip(opens).filter(|&(&s, &o)| o && s as f64 <= goal && s as f64 + delay > goal).count();
    let to_hold = (above_anyway + crossing).saturating_sub(allowed_above).min(crossing);
    // Which openings will cross is not known before they come (it is the joining request's
    // prefill), nor when they come: an opening finds offline held with the share of the gaps'
    // time it is held (arrivals that cannot be foreseen see time averages), so holding
    // `to_hold` of the crossing ones takes that share of every gap.
    let share = if crossing == 0 { 0.0 } else { to_hold as f64 / crossing as f64 };
    let span = last.1.saturating_sub(first.0);
    let idle = span.saturating_sub(steps_ns.iter().sum()).max(1) as f64;
    let outside = gaps.iter().sum::<u64>() as f64;
    let transitions = gaps.iter().skip(1).map(|&g| g.min(after_busy_ns)).sum::<u64>() as f64 * (1.0 - share);
    let (idle_outside, hold_cost) = (outside / idle, share * outside / idle);
    Some(StepFloor {
        delay_ms: delay / 1e6,
        openings: opens.iter().filter(|&&o| o).count(),
        p99_ratio_unheld: percentile(&unheld, 99.0) / p99.max(1.0),
        openings_to_hold: to_hold,
        idle_outside_busy_of_idle: idle_outside,
        hold_cost_of_idle: hold_cost,
        transitions_cost_of_idle: transitions / idle,
        offline_of_idle_max: (idle_outside - hold_cost - transitions / idle).max(0.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openings_carried_past_the_goal_must_be_held_for_a_share_of_every_gap() {
        // 200 steps of 1 ms, 4 busy periods of 50 steps (the periods are 50 ms) with gaps of 30,
        // 10 and 20 ms; the opening steps are 1.05 ms. Alone P99 = 1.05 ms (rank 198 of 200 is an
        // opening), goal 1.155 ms; a 0.2 ms wait carries all 4 openings past it. Two steps may
        // exceed it, so 2 of the 4 must find offline held: half of every gap's time.
        let mut steps = Vec::new();
        let mut opens = Vec::new();
        for _ in 0..4 {
            steps.push(1_050_000);
            opens.push(true);
            steps.extend([1_000_000; 49]);
            opens.extend([false; 49]);
        }
        let ms = 1_000_000;
        let periods = [(0, 50 * ms), (80 * ms, 130 * ms), (140 * ms, 190 * ms), (210 * ms, 260 * ms)];
        let f = step_floor(&steps, &opens, &periods, 200_000, 2 * ms).unwrap();
        assert_eq!((f.openings, f.openings_to_hold), (4, 2));
        assert!((f.p99_ratio_unheld - 1.25 / 1.05).abs() < 1e-9, "{f:?}");
        // Idle over the span: 260 ms − 200.2 ms of steps = 59.8 ms; outside the periods 60 ms
        // (the steps fill the periods but for the openings' extra 0.05 ms each).
        let idle = 260.0 - 200.2;
        assert!((f.idle_outside_busy_of_idle - 60.0 / idle).abs() < 1e-9, "{f:?}");
        assert!((f.hold_cost_of_idle - 30.0 / idle).abs() < 1e-9, "{f:?}");
        // The three gaps lose at least 2 ms each in the half of their time not held.
        assert!((f.transitions_cost_of_idle - 3.0 / idle).abs() < 1e-9, "{f:?}");
        assert!((f.offline_of_idle_max - 27.0 / idle).abs() < 1e-9, "{f:?}");
    }

    #[test]
    fn openings_within_the_goal_need_no_hold() {
        let steps = [1_000_000u64; 100];
        let mut opens = [false; 100];
        opens[0] = true;
        let f = step_floor(&steps, &opens, &[(0, 100_000_000)], 50_000, 1_000_000).unwrap();
        assert_eq!((f.openings, f.openings_to_hold, f.hold_cost_of_idle), (1, 0, 0.0));
    }

    #[test]
    fn a_delay_no_latency_can_absorb_needs_the_offline_side_held_half_the_time_for_the_median() {
        // 100 requests of 10 ms alone: the goal's 11 ms leaves 1 ms; a 2 ms wait on every unheld
        // request passes it, so half of them (the median's rank) must find the offline side held.
        let alone = vec![10_000_000; 100];
        let f = suspend_floor(&alone, 0.2, 2_000_000).unwrap();
        assert_eq!((f.held_for_p50, f.held_for_p99), (0.5, 0.99));
        // Offline runs only in the 1 % of the time not held, of the 80 % left idle.
        assert!((f.offline_of_idle_max - 0.01 / 0.8).abs() < 1e-12, "{f:?}");
        assert_eq!(f.delay_ms, 2.0);
    }

    #[test]
    fn a_delay_within_the_goals_margin_needs_no_hold() {
        let alone = vec![10_000_000; 100];
        let f = suspend_floor(&alone, 0.2, 900_000).unwrap();
        assert_eq!((f.held_for_p50, f.held_for_p99, f.offline_of_idle_max), (0.0, 0.0, 1.0));
    }

    #[test]
    fn spread_latencies_need_a_share_held_between() {
        // 1..=100 ms: P50 = 50 ms, the goal 55 ms; a 10 ms wait keeps requests of ≤ 45 ms under
        // it (45 %), so h·55 % + (1 − h)·45 % ≥ 50 % needs h ≥ 0.5. P99 = 99 ms, goal 108.9 ms:
        // the unheld ones of ≤ 98.9 ms (98 %) stay under it, h·100 % + (1 − h)·98 % ≥ 99 %.
        let alone: Vec<u64> = (1..=100).map(|ms| ms * 1_000_000).collect();
        let f = suspend_floor(&alone, 0.0, 10_000_000).unwrap();
        assert!((f.held_for_p50 - 0.5).abs() < 1e-9, "{f:?}");
        assert!((f.held_for_p99 - 0.5).abs() < 1e-9, "{f:?}");
        assert!((f.offline_of_idle_max - 0.5).abs() < 1e-9, "{f:?}");
    }

    #[test]
    fn no_latencies_or_no_idle_time_give_no_floor() {
        assert_eq!(suspend_floor(&[], 0.1, 1), None);
        assert_eq!(suspend_floor(&[1], 1.0, 1), None);
    }
}
