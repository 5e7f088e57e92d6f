//! When to suspend and resume the offline queues: a pure state machine over "is online work
//! visible now", fed by the controller on every poll and told when its suspends and resumes
//! return. No clock of its own (timestamps are nanoseconds on any monotonic clock), no I/O, so
//! every rule is tested with a scripted clock.
//!
//! Rules, in the order they are checked (each file keeps its own in full):
//! - **Never stacked.** Nothing is issued while a suspend or resume is in flight: a suspend that
//!   piles up behind another can wait out the fence timeout (`queue_preemption_timeout_ms`,
//!   default 9000), after which KFD declares the hardware scheduler hung and resets the GPU
//!   (`amdkfd_fence_wait_timeout` and its callers, kfd_device_queue_manager.c, Linux 6.12).
//! - **Suspend** when online work is visible, at most once per online *burst* (`burst.rs`).
//! - **Resume** when online work has been invisible for the idle threshold (hysteresis), at once
//!   when an online process exits and nothing else is pending, when a suspension has lasted
//!   `max_suspend` (watchdog), or when the offline job's share of the `share_window` would drop
//!   below `min_share`.
//! - **No cliff after the watchdog** and the **minimum share** (`share_window.rs`): the offline
//!   job's slices of an online burst longer than `max_suspend` (`busy_share`) and of the window
//!   (`min_share`).
//! - **The idle threshold learnt from every gap** (`learnt_threshold.rs`, over the gaps of
//!   `gap_record.rs`): with `learn_idle` it goes into the valley between the gaps inside requests
//!   and the gaps between them, so that a serving engine's step gaps do not flap the GPU (each
//!   flip a device-wide unmap that preempts the online queues too).
//! - **Cost-aware idle resume** (`gap_decision.rs`, with the costs of `transition_cost.rs`): an
//!   idle resume only when the rest of the gap is predicted longer than what the resume and the
//!   next suspend cost the online job. Every other resume rule (online exit, `max_suspend`,
//!   minimum share) goes first.

mod burst;
mod gap_decision;
mod gap_record;
mod learnt_threshold;
mod share_window;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod traces;
mod transition_cost;

use std::time::Duration;

use serde::Serialize;

use self::{
    burst::Burst,
    gap_decision::{GapCall, GapDecision},
    gap_record::GapRecord,
    learnt_threshold::LearntThreshold,
    share_window::ShareWindow,
    transition_cost::TransitionCost,
};
pub use self::{
    gap_decision::{MIN_GAPS, UNPROVEN_WAIT},
    gap_record::ALL_GAPS,
    learnt_threshold::{IDLE_RANGE, LEARN_MIN_GAPS, VALLEY_ABOVE, VALLEY_RATIO, VALLEY_SIDE, VALLEY_SPAN},
    share_window::DEFAULT_BUSY_SHARE,
};

/// Parameters of the policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PolicyConfig {
    /// Online idle time after which the offline queues resume (hysteresis).
    pub idle: Duration,
    /// Longest suspension; the watchdog resumes after it.
    pub max_suspend: Duration,
    /// Fraction of `share_window` the offline job runs at least (0: no guarantee).
    pub min_share: f64,
    pub share_window: Duration,
    /// Hold through idle gaps predicted shorter than a resume and the next suspend cost.
    pub cost_aware: bool,
    /// The offline job's share of the GPU while online work stays busy past `max_suspend`
    /// (0: the watchdog's resume ends the burst's protection).
    pub busy_share: f64,
    /// Learn the idle threshold from every online gap (`idle` is where it starts).
    pub learn_idle: bool,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            idle: Duration::from_millis(2),
            max_suspend: Duration::from_secs(5),
            min_share: 0.0,
            share_window: Duration::from_secs(1),
            cost_aware: true,
            busy_share: DEFAULT_BUSY_SHARE,
            learn_idle: true,
        }
    }
}

/// Where the offline queues are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Running,
    /// A SUSPEND is in flight.
    Suspending,
    Suspended,
    /// A RESUME is in flight.
    Resuming,
}

/// Why the offline queues are resumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResumeReason {
    /// No online work for the idle threshold.
    Idle,
    /// An online process exited with no other online work pending.
    OnlineGone,
    /// The suspension reached `max_suspend`.
    Watchdog,
    /// The offline job's minimum share of the window.
    MinShare,
    /// The controller stops.
    Stop,
}

impl ResumeReason {
    /// The name used in the output (as serialised).
    pub fn name(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::OnlineGone => "online_gone",
            Self::Watchdog => "watchdog",
            Self::MinShare => "min_share",
            Self::Stop => "stop",
        }
    }
}

/// What the controller must do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Suspend,
    Resume(ResumeReason),
    /// No ioctl: the idle resume is skipped because the gap is predicted shorter than its
    /// cost (said once per gap).
    HoldThroughGap(GapVerdict),
}

/// Why an idle resume was skipped: the predicted rest of the gap against the cost, ns. The field
/// names are the JSON output's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GapVerdict {
    /// Online idle so far.
    pub idle_ns: u64,
    /// Predicted rest of the gap.
    pub predicted_ns: u64,
    /// Resume plus the next reaction, as measured on this run.
    pub cost_ns: u64,
    /// Recorded gaps longer than `idle_ns` the prediction rests on.
    pub evidence: usize,
}

/// What the controller saw at one poll.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    /// Online work is pending or running (indices, occupancy, an open hint).
    pub online_active: bool,
    /// An online process exited since the previous poll.
    pub online_gone: bool,
    /// A request the arrival probe saw is pending on this GPU (opened before its first GPU work):
    /// online work that comes back now ends a gap between requests.
    pub announced: bool,
}

/// The state machine: where the offline queues are, composed with the online bursts, the share
/// window, the gap record and its learnt threshold, the transitions' costs and the gap decision.
#[derive(Clone, Debug)]
pub struct PolicyMachine {
    config: PolicyConfig,
    state: State,
    burst: Burst,
    window: ShareWindow,
    record: GapRecord,
    threshold: LearntThreshold,
    costs: TransitionCost,
    decision: GapDecision,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl PolicyMachine {
    pub fn new(config: PolicyConfig) -> Self {
        Self {
            config,
            state: State::Running,
            burst: Burst::new(),
            window: ShareWindow::new(&config),
            record: GapRecord::new(),
            threshold: LearntThreshold::new(ns(config.idle)),
            costs: TransitionCost::new(config.learn_idle),
            decision: GapDecision::new(&config),
        }
    }

    /// The idle threshold in force (learnt, or `idle`).
    pub fn idle_threshold(&self) -> Duration {
        Duration::from_nanos(self.threshold.ns())
    }

    /// The same, in ns (the reaction thread's clock).
    pub fn idle_threshold_ns(&self) -> u64 {
        self.threshold.ns()
    }

    /// A resume ioctl took `ns` (the online queues on the GPU were unmapped meanwhile).
    pub fn note_resume(&mut self, ns: u64) {
        self.costs.note_resume(ns);
    }

    /// Online work waited `ns` from visible to suspended (detection and the suspend ioctl).
    pub fn note_reaction(&mut self, ns: u64) {
        self.costs.note_reaction(ns);
    }

    /// What a resume now and the next suspend cost the online job, ns (None until a reaction was
    /// measured): the medians of the recent resumes and reactions (`transition_cost.rs`).
    pub fn transition_cost(&self) -> Option<u64> {
        self.costs.ns()
    }

    /// What a suspend costs, ns (None until one was measured): the median of the recent
    /// reactions. A pending hold issues its SUSPENDs this much ahead of the predicted first kernel.
    pub fn suspend_cost(&self) -> Option<u64> {
        self.costs.suspend_ns()
    }

    /// The predicted rest of a gap that has lasted `idle_ns`, and how many recorded gaps longer
    /// than it the prediction rests on: their mean rest, or with `learn_idle` their median rest
    /// over every gap on record (why: `gap_decision.rs`).
    pub fn predicted_rest(&self, idle_ns: u64) -> (Option<u64>, usize) {
        self.decision.predicted_rest(&self.record, idle_ns)
    }

    fn gap_call(&self, idle_ns: u64) -> GapCall {
        self.decision.call(idle_ns, self.threshold.ns(), &self.record, &self.costs)
    }

    /// Record a gap that ended with online work seen again.
    fn note_gap(&mut self, gap: u64, announced: bool) {
        if self.config.learn_idle {
            self.record.push(gap);
            self.threshold.note_gap(self.record.sorted(), gap, announced);
        }
        // Measured against the threshold this gap may just have moved.
        if gap >= self.threshold.ns() {
            self.record.push_between_bursts(gap);
        }
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// Whether a poll at `now` that sees no online work would resume for idleness: suspended,
    /// no online work seen for the idle threshold, and the gap not predicted too short. The
    /// controller may then confirm with a costlier
    /// look (the online `cu_occupancy`) before it tells the machine what it saw.
    /// Not while the machine holds through a gap it predicts too short to be worth a resume: the
    /// costly look would change nothing then (each step of a hold would read it otherwise: at 50
    /// µs a read, a quarter of a core at a 200 µs poll).
    pub fn idle_resume_due(&self, now: u64) -> bool {
        let Some(idle_for) = self.burst.idle_for(now) else {
            return self.state == State::Suspended;
        };
        self.state == State::Suspended && idle_for >= self.threshold.ns() && self.gap_call(idle_for) == GapCall::Resume
    }

    /// One poll at `now`: the action to take, if any. After a `Suspend` or `Resume` the
    /// controller reports the outcome with [`PolicyMachine::suspended`] / [`PolicyMachine::resumed`].
    pub fn tick(&mut self, now: u64, seen: Observation) -> Option<Action> {
        if let Some(gap) = self.burst.poll(now, seen.online_active) {
            self.note_gap(gap, seen.announced);
        }
        if seen.online_active {
            self.decision.new_gap();
        }
        let idle_for = self.burst.idle_for(now).unwrap_or(u64::MAX);
        self.burst.end_if_over(idle_for, seen, self.threshold.ns());
        match self.state {
            State::Suspending | State::Resuming => None,
            State::Running => {
                let allowed = seen.online_active && self.burst.may_suspend() && self.window.slice_over(now);
                if allowed && self.window.has_room(now) {
                    self.burst.serve();
                    self.state = State::Suspending;
                    Some(Action::Suspend)
                } else {
                    None
                }
            }
            State::Suspended => {
                let reason = if seen.online_gone && !seen.online_active {
                    Some(ResumeReason::OnlineGone)
                } else if self.window.suspended_for(now) >= ns(self.config.max_suspend) {
                    if self.window.open_busy_slice(now) {
                        // A duty cycle, not a cliff: the burst may be suspended again after
                        // the offline job's slice.
                        self.burst.allow_another_suspend();
                    }
                    Some(ResumeReason::Watchdog)
                } else if !self.window.has_room(now) {
                    self.burst.allow_another_suspend();
                    self.window.open_share_slice(now);
                    Some(ResumeReason::MinShare)
                } else if !seen.online_active && idle_for >= self.threshold.ns() {
                    match self.gap_call(idle_for) {
                        GapCall::Hold(verdict) => {
                            return self.decision.say_once().then_some(Action::HoldThroughGap(verdict));
                        }
                        GapCall::Wait => return None,
                        GapCall::Resume => Some(ResumeReason::Idle),
                    }
                } else {
                    None
                };
                reason.map(|r| {
                    self.state = State::Resuming;
                    Action::Resume(r)
                })
            }
        }
    }

    /// The controller stops: resume if anything is or may be suspended.
    pub fn stop(&mut self) -> Option<Action> {
        match self.state {
            State::Running => None,
            _ => {
                self.state = State::Resuming;
                Some(Action::Resume(ResumeReason::Stop))
            }
        }
    }

    /// The SUSPEND returned at `now`; `ok`: at least one queue is suspended. A failed suspend is
    /// not retried in the same burst.
    pub fn suspended(&mut self, now: u64, ok: bool) {
        if ok {
            self.state = State::Suspended;
            self.window.opened(now);
        } else {
            self.state = State::Running;
        }
    }

    /// The RESUME returned at `now`, or the queues were resumed without being asked (the
    /// session's own watchdog, every offline process gone).
    pub fn resumed(&mut self, now: u64) {
        self.window.closed(now);
        self.state = State::Running;
    }

    /// Time suspended within the share window ending at `now`, in ns.
    pub fn suspended_in_window(&mut self, now: u64) -> u64 {
        self.window.suspended_in_window(now)
    }
}

#[cfg(test)]
mod tests {
    use super::{
        test_support::{MS, off, on, policy, run},
        *,
    };

    #[test]
    fn one_suspend_per_burst_and_resume_after_idle() {
        let mut p = policy(3, 1000, 0.0);
        assert_eq!(run(&mut p, 0, 9, off()), vec![]);
        assert_eq!(run(&mut p, 10, 14, on()), vec![(10, Action::Suspend)]);
        // A 2 ms gap is within the burst: no resume, and no second suspend when work returns.
        assert_eq!(run(&mut p, 15, 16, off()), vec![]);
        assert_eq!(run(&mut p, 17, 20, on()), vec![]);
        assert_eq!(run(&mut p, 21, 30, off()), vec![(23, Action::Resume(ResumeReason::Idle))]);
        assert_eq!(p.state(), State::Running);
        // The next burst has its own suspend.
        assert_eq!(run(&mut p, 31, 31, on()), vec![(31, Action::Suspend)]);
    }

    #[test]
    fn nothing_is_issued_while_a_suspend_or_resume_is_in_flight() {
        let mut p = policy(2, 1000, 0.0);
        assert_eq!(p.tick(0, on()), Some(Action::Suspend));
        assert_eq!(p.state(), State::Suspending);
        // The suspend has not returned: whatever is seen, nothing is issued.
        for t in 1..50 {
            assert_eq!(p.tick(t * MS, if t % 2 == 0 { on() } else { off() }), None);
        }
        p.suspended(50 * MS, true);
        assert_eq!(p.tick(60 * MS, off()), Some(Action::Resume(ResumeReason::Idle)));
        assert_eq!(p.state(), State::Resuming);
        assert_eq!(p.tick(61 * MS, on()), None);
        assert_eq!(p.tick(62 * MS, on()), None);
        p.resumed(63 * MS);
        // The burst ended at 60 (idle 2 ms); the work seen during the resume is a new burst.
        assert_eq!(p.tick(64 * MS, on()), Some(Action::Suspend));
    }

    #[test]
    fn a_failed_suspend_is_not_retried_within_the_burst() {
        let mut p = policy(3, 1000, 0.0);
        assert_eq!(p.tick(0, on()), Some(Action::Suspend));
        p.suspended(MS, false);
        assert_eq!(p.state(), State::Running);
        assert_eq!(run(&mut p, 2, 20, on()), vec![]);
        assert_eq!(run(&mut p, 21, 23, off()), vec![]);
        assert_eq!(run(&mut p, 24, 24, on()), vec![(24, Action::Suspend)]);
    }

    /// With `busy_share` 0 (the rule before the duty cycle): the watchdog's resume ends the
    /// burst's protection.
    #[test]
    fn watchdog_ends_a_long_suspension_and_the_burst_is_not_suspended_again() {
        let mut p = policy(3, 20, 0.0);
        assert_eq!(run(&mut p, 0, 60, on()), vec![(0, Action::Suspend), (20, Action::Resume(ResumeReason::Watchdog))]);
        assert_eq!(run(&mut p, 61, 64, off()), vec![]);
        assert_eq!(run(&mut p, 65, 65, on()), vec![(65, Action::Suspend)]);
    }

    #[test]
    fn an_online_exit_resumes_at_once() {
        let mut p = policy(50, 1000, 0.0);
        assert_eq!(run(&mut p, 0, 5, on()), vec![(0, Action::Suspend)]);
        let gone = Observation { online_active: false, online_gone: true, announced: false };
        assert_eq!(p.tick(6 * MS, gone), Some(Action::Resume(ResumeReason::OnlineGone)));
        p.resumed(6 * MS);
        // Another online process still busy when one exits: no resume.
        let mut p = policy(50, 1000, 0.0);
        run(&mut p, 0, 5, on());
        assert_eq!(p.tick(6 * MS, Observation { online_active: true, online_gone: true, announced: false }), None);
    }

    #[test]
    fn stop_resumes_whatever_may_be_suspended() {
        let mut p = policy(3, 1000, 0.0);
        assert_eq!(p.stop(), None);
        assert_eq!(p.tick(0, on()), Some(Action::Suspend));
        assert_eq!(p.stop(), Some(Action::Resume(ResumeReason::Stop)));
        p.resumed(MS);
        assert_eq!(p.state(), State::Running);
        for r in [ResumeReason::Idle, ResumeReason::OnlineGone, ResumeReason::MinShare] {
            assert_eq!(serde_json::to_value(r).unwrap(), r.name());
        }
    }
}
