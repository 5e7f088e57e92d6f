//! The cost-aware idle resume. An idle resume is worth its cost only if the gap it opens is
//! longer than what the resume and the next suspend cost the online job (`transition_cost.rs`).
//! Once idle for `t`, the rest of the gap is predicted from the gaps on record (`gap_record.rs`)
//! as the mean of `g - t` over the recent gaps between bursts `g > t` (the empirical mean
//! residual life: for periodic requests it shrinks as the next one nears, for Poisson arrivals it
//! stays the mean gap), or with `learn_idle` as their median over every gap on record (robust to
//! the few long gaps between a serving engine's batches, see [`GapDecision::predicted_rest`]).
//! Below the cost the machine holds on and says so once per gap
//! ([`Action::HoldThroughGap`](super::Action::HoldThroughGap)); with fewer than [`MIN_GAPS`]
//! gaps longer than `t` on record there is no evidence either way, and with `learn_idle` it waits
//! until [`UNPROVEN_WAIT`] × the threshold before it resumes (online work first: a serving
//! engine's first step gaps would each be a flap).

use super::{GapVerdict, PolicyConfig, gap_record::GapRecord, transition_cost::TransitionCost};

/// Recorded gaps longer than the idle time so far needed before a gap is predicted short. Few
/// suffice because a wrong hold is cheap and short: it lasts only while at least half of the
/// recorded gaps longer than the idle time so far ended within the transition cost, so it costs
/// the offline job at most about that cost (a resume and a reaction, ~1.4 ms on the MI300X
/// profile), while each resume taken for want of evidence is a flap that costs the online job the
/// same. With 8 the harness's serving engine flapped 11 times in its first busy period
/// (`harness run --load batching --requests 40`: every resume inside a busy period was in the
/// first), with 3 it flapped 4 times.
pub const MIN_GAPS: usize = 3;
/// A gap past the threshold with no evidence waits until this many times the threshold.
pub const UNPROVEN_WAIT: u64 = 2;

/// The cost-aware answer for a gap past the idle threshold ([`GapDecision::call`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum GapCall {
    Resume,
    /// Predicted shorter than the transitions' cost.
    Hold(GapVerdict),
    /// No evidence either way yet: wait (up to [`UNPROVEN_WAIT`] × the threshold).
    Wait,
}

#[derive(Clone, Debug)]
pub(super) struct GapDecision {
    /// `cost_aware`: without it every gap past the threshold resumes.
    cost_aware: bool,
    /// `learn_idle`: the median rest over every gap on record, and unproven gaps wait.
    learnt_rules: bool,
    /// The current gap's hold was said.
    said: bool,
}

impl GapDecision {
    pub(super) fn new(config: &PolicyConfig) -> Self {
        Self { cost_aware: config.cost_aware, learnt_rules: config.learn_idle, said: false }
    }

    /// The predicted rest of a gap that has lasted `idle_ns`, over the recorded gaps longer than
    /// it, and how many those are: their mean rest, or with `learn_idle` their median rest. A
    /// serving engine's gaps mix many step gaps just past the threshold (a rest of a few hundred
    /// µs) with a few long ones between batches (tens of ms): the mean is the long ones', so every
    /// step gap past the threshold was resumed; the median is the step gaps' when they are most.
    /// For Poisson gaps the median rest is ln 2 of the mean gap, still long.
    ///
    /// With `learn_idle` the median is taken over every gap on record
    /// ([`ALL_GAPS`](super::ALL_GAPS), the short ones too), not only the last 64 past the
    /// threshold: a serving engine's step gaps that just pass the threshold are its tail, a
    /// handful among the last 64, and with fewer than [`MIN_GAPS`] of them on record each was
    /// resumed (a flap inside the busy period; harness batching load: 28 of 56 transitions).
    pub(super) fn predicted_rest(&self, record: &GapRecord, idle_ns: u64) -> (Option<u64>, usize) {
        if self.learnt_rules { record.median_rest(idle_ns) } else { record.mean_rest(idle_ns) }
    }

    /// The cost-aware check of a gap past the threshold (`threshold_ns`), from one prediction:
    /// hold through it when its rest is predicted shorter than the transitions' cost; with the
    /// learnt rules and no evidence either way (fewer than [`MIN_GAPS`] recorded gaps longer than
    /// it) wait up to [`UNPROVEN_WAIT`] × the threshold before resuming, as the online job comes
    /// first: a resume for want of evidence is a flap when the gap is one of a serving engine's
    /// first step gaps (harness batching load, 40 requests: the first busy period's 4 flaps), and
    /// a long gap loses only that wait; else resume.
    pub(super) fn call(&self, idle_ns: u64, threshold_ns: u64, record: &GapRecord, costs: &TransitionCost) -> GapCall {
        if !self.cost_aware {
            return GapCall::Resume;
        }
        let (predicted, evidence) = self.predicted_rest(record, idle_ns);
        if let (Some(cost_ns), Some(predicted_ns)) = (costs.ns(), predicted)
            && evidence >= MIN_GAPS
            && predicted_ns < cost_ns
        {
            return GapCall::Hold(GapVerdict { idle_ns, predicted_ns, cost_ns, evidence });
        }
        if self.learnt_rules && idle_ns < threshold_ns.saturating_mul(UNPROVEN_WAIT) && evidence < MIN_GAPS {
            return GapCall::Wait;
        }
        GapCall::Resume
    }

    /// Online work was seen: the gap after it may have its hold said.
    pub(super) fn new_gap(&mut self) {
        self.said = false;
    }

    /// Whether a hold is to be said now: the first time in the gap.
    pub(super) fn say_once(&mut self) -> bool {
        !std::mem::replace(&mut self.said, true)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{
        super::{
            Action, PolicyMachine, ResumeReason, State,
            test_support::{MS, kinds, off, on, policy, replay, run},
        },
        *,
    };

    #[test]
    fn gaps_shorter_than_a_resume_and_the_next_reaction_are_held_through() {
        // Requests of 1 ms every 4 ms: 3 ms gaps; a resume costs 1 ms and a reaction 1.5 ms, so
        // once idle for 2 ms the 1 ms left of the gap is shorter than the 2.5 ms the online job
        // would pay.
        let bursts: Vec<(u64, u64)> = (0..40).map(|i| (i * 4_000, i * 4_000 + 1_000)).collect();
        let actions = replay(&bursts, 160_000, 1_000, 1_500);
        // The first MIN_GAPS gaps have no evidence either way: each waits, unproven, for twice the
        // threshold (4 ms) and ends first (3 ms). Every later gap is held through (no resume was
        // measured yet: it is taken to cost what the reaction did), and the trace's final gap
        // (3.2 ms polled, as long as every recorded one) waits, unproven, past the trace's end:
        // one suspension for the whole trace.
        let (suspends, resumes, held) = kinds(&actions);
        assert_eq!((suspends, resumes, held), (1, 0, 40 - MIN_GAPS));
        let Some((t, Action::HoldThroughGap(v))) = actions.iter().find(|(_, a)| matches!(a, Action::HoldThroughGap(_)))
        else {
            panic!("no gap held through: {actions:?}")
        };
        // Request 3 is last busy at 12.8 ms, idle for 2 ms at 14.8 ms: 1.2 ms predicted left, and
        // the cost is twice the reaction (no resume measured).
        assert_eq!(*t, MIN_GAPS as u64 * 4_000 + 2_800);
        assert_eq!((v.idle_ns, v.predicted_ns, v.cost_ns, v.evidence), (2_000_000, 1_200_000, 3_000_000, MIN_GAPS));
        // At most one suspend per request, and the last suspension ends only at the trace's end.
        assert!(actions.iter().filter(|(_, a)| *a == Action::Suspend).count() <= bursts.len());
    }

    #[test]
    fn long_gaps_are_resumed_and_a_gap_longer_than_any_recorded_one_ends_the_hold() {
        // The same requests every 20 ms: 19 ms gaps, well past the 2.5 ms cost: every gap resumes.
        let bursts: Vec<(u64, u64)> = (0..20).map(|i| (i * 20_000, i * 20_000 + 1_000)).collect();
        let (suspends, resumes, held) = kinds(&replay(&bursts, 400_000, 1_000, 1_500));
        assert_eq!((suspends, resumes, held), (20, 20, 0));
        // Short gaps, then the online job pauses for 50 ms: held through while the evidence
        // says the gap is short, resumed once it outlasts every recorded gap.
        let mut bursts: Vec<(u64, u64)> = (0..20).map(|i| (i * 4_000, i * 4_000 + 1_000)).collect();
        bursts.push((130_000, 131_000));
        let actions = replay(&bursts, 140_000, 1_000, 1_500);
        let in_pause: Vec<&(u64, Action)> = actions.iter().filter(|(t, _)| (77_000..130_000).contains(t)).collect();
        // The last short request is busy until 76.8 ms; at 78.8 ms (2 ms idle) the gap is held
        // through; at 80 ms it has lasted 3.2 ms, as long as every recorded gap: no evidence of a
        // short gap any more, so it waits, unproven, to twice the threshold and resumes (80.8 ms).
        assert!(
            matches!(in_pause[..], [(78_800, Action::HoldThroughGap(_)), (80_800, Action::Resume(ResumeReason::Idle))]),
            "{in_pause:?}"
        );
    }

    #[test]
    fn poisson_like_gaps_resume_when_their_mean_rest_exceeds_the_cost() {
        // Gaps drawn from a fixed exponential-like sequence (mean 10 ms): the mean rest of a gap
        // idle for 2 ms stays about the mean, far above a 2.5 ms cost: nothing is held through.
        let gaps_us = [3_100u64, 12_400, 7_800, 25_000, 2_600, 9_900, 4_300, 16_700, 8_800, 5_200, 13_300, 3_900];
        let mut t = 0;
        let mut bursts = Vec::new();
        for g in gaps_us.iter().cycle().take(36) {
            bursts.push((t, t + 1_000));
            t += 1_000 + g;
        }
        let (suspends, resumes, held) = kinds(&replay(&bursts, t, 1_000, 1_500));
        assert_eq!(held, 0);
        // The first gap (3.1 ms, none on record) waits, unproven, for 4 ms and ends first: the
        // first two requests share one suspension.
        assert_eq!((suspends, resumes), (35, 35));
        // With a cost above the mean rest, the same trace is held through after learning.
        let (_, _, held) = kinds(&replay(&bursts, t, 10_000, 15_000));
        assert!(held > 20, "held through {held} gaps");
    }

    #[test]
    fn without_cost_awareness_every_idle_gap_resumes() {
        let mut p = policy(2, 10_000, 0.0);
        for _ in 0..20 {
            p.note_resume(5 * MS);
            p.note_reaction(5 * MS);
        }
        let mut actions = Vec::new();
        for i in 0..20 {
            actions.extend(run(&mut p, i * 4, i * 4, on()));
            actions.extend(run(&mut p, i * 4 + 1, i * 4 + 3, off()));
        }
        assert_eq!(actions.iter().filter(|(_, a)| matches!(a, Action::Resume(_))).count(), 20);
    }

    #[test]
    fn no_costly_look_is_due_while_a_short_gap_is_held_through() {
        // 2 ms idle; costs: resume 1 ms, reaction 1 ms; twenty 2.4 ms gaps on record.
        let mut p = PolicyMachine::new(PolicyConfig { idle: Duration::from_millis(2), ..PolicyConfig::default() });
        p.note_resume(MS);
        p.note_reaction(MS);
        let mut t = 0;
        for _ in 0..20 {
            if p.tick(t, on()) == Some(Action::Suspend) {
                p.suspended(t, true);
            }
            for u in (t + 200_000..t + 2_400_000).step_by(200_000) {
                if let Some(Action::Resume(_)) = p.tick(u, off()) {
                    p.resumed(u);
                }
            }
            t += 2_400_000;
        }
        if p.tick(t, on()) == Some(Action::Suspend) {
            p.suspended(t, true);
        }
        assert_eq!(p.state(), State::Suspended);
        // 2.2 ms idle: past the threshold, but the rest (0.2 ms) is shorter than the cost.
        assert!(!p.idle_resume_due(t + 2_200_000));
        assert!(matches!(p.tick(t + 2_200_000, off()), Some(Action::HoldThroughGap(_))));
        // Past every recorded gap there is no evidence of a short one: it waits, unproven, to
        // twice the threshold, and then the look is due again.
        assert!(!p.idle_resume_due(t + 3_000_000));
        assert!(p.idle_resume_due(t + 4_000_000));
    }

    #[test]
    fn a_hold_is_said_once_per_gap_and_unproven_gaps_wait_with_the_learnt_rules_only() {
        let mut record = GapRecord::new();
        for gap in [3 * MS; MIN_GAPS] {
            record.push(gap);
            record.push_between_bursts(gap);
        }
        let mut costs = TransitionCost::new(true);
        costs.note_reaction(MS);
        let learnt = GapDecision::new(&PolicyConfig::default());
        let verdict = GapVerdict { idle_ns: 2 * MS, predicted_ns: MS, cost_ns: 2 * MS, evidence: MIN_GAPS };
        assert_eq!(learnt.call(2 * MS, 2 * MS, &record, &costs), GapCall::Hold(verdict));
        // Past every recorded gap: no evidence, wait to twice the threshold.
        assert_eq!(learnt.call(3 * MS, 2 * MS, &record, &costs), GapCall::Wait);
        assert_eq!(learnt.call(4 * MS, 2 * MS, &record, &costs), GapCall::Resume);
        let fixed = GapDecision::new(&PolicyConfig { learn_idle: false, ..PolicyConfig::default() });
        assert_eq!(fixed.call(3 * MS, 2 * MS, &record, &costs), GapCall::Resume);
        let blind = GapDecision::new(&PolicyConfig { cost_aware: false, ..PolicyConfig::default() });
        assert_eq!(blind.call(2 * MS, 2 * MS, &record, &costs), GapCall::Resume);
        let mut said = learnt;
        assert!(said.say_once());
        assert!(!said.say_once());
        said.new_gap();
        assert!(said.say_once());
    }
}
