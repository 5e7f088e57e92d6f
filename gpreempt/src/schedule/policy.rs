//! When to suspend and resume the offline queues: a pure state machine over "is online work
//! visible now", fed by the controller on every poll and told when its suspends and resumes
//! return. No clock of its own (timestamps are nanoseconds on any monotonic clock), no I/O, so
//! every rule is tested with a scripted clock.
//!
//! Rules, in the order they are checked:
//! - **Never stacked.** Nothing is issued while a suspend or resume is in flight: a suspend that
//!   piles up behind another can wait out the fence timeout (`queue_preemption_timeout_ms`,
//!   default 9000), after which KFD declares the hardware scheduler hung and resets the GPU
//!   (`amdkfd_fence_wait_timeout` and its callers, kfd_device_queue_manager.c, Linux 6.12).
//! - **Suspend** when online work is visible, at most once per online *burst*. A burst is online
//!   activity with no gap of `idle` or more; a suspend that failed or was ended by the watchdog is
//!   not retried within the same burst (each suspend and resume unmaps every queue of the device
//!   on HWS GPUs, the online process's too).
//! - **Resume** when online work has been invisible for `idle` (hysteresis), at once when an online
//!   process exits and nothing else is pending, when a suspension has lasted `max_suspend`
//!   (watchdog), or when the offline job's share of the `share_window` would drop below
//!   `min_share`.
//! - **No cliff after the watchdog.** With `busy_share` S > 0, a watchdog resume in a burst that
//!   goes on opens a slice of `max_suspend` × S / (1 − S) for the offline job, after which the
//!   same burst may be suspended again: online work busy for longer than `max_suspend` stays
//!   protected 1 − S of the time instead of running unprotected to the burst's end (S = 0 keeps
//!   the previous rule: no second suspend in the burst).
//! - **The idle threshold learnt from every gap.** With `learn_idle`, every gap between two polls
//!   that saw online work is recorded, the short ones too. Gaps inside a request (between the
//!   decode steps of a continuous-batching engine, between a request's kernels) and gaps between
//!   requests form two populations; once [`LEARN_MIN_GAPS`] are on record and a valley separates
//!   them (the widest ratio across [`VALLEY_SPAN`] neighbouring sorted gaps, at least [`VALLEY_RATIO`], with a
//!   tenth of the gaps below it and [`VALLEY_ABOVE`] above: a serving engine makes hundreds of
//!   step gaps per busy period and one gap between busy periods, so the gaps between requests
//!   can be under 1 % of the record, which is why it holds [`ALL_GAPS`]), the
//!   threshold goes into it: twice the longest gap inside
//!   a request, or the geometric middle of the valley if that is shorter, within
//!   [`IDLE_RANGE`] of `idle`. Without a valley (Poisson gaps are one smooth population) `idle`
//!   stays. A threshold above the in-request gaps is what keeps a serving engine's step gaps from
//!   flapping the GPU (each flip a device-wide unmap that preempts the online queues too).
//! - **Minimum share** (the trade-off): with `min_share` F > 0 the offline job runs at least
//!   F × `share_window` after a share resume before it can be suspended again, so under
//!   continuous online load it gets about F of the GPU in slices, and the online work waits
//!   behind it during those slices.
//! - **Cost-aware idle resume.** An idle resume is worth its cost only if the gap it opens is
//!   longer than what the resume and the next suspend cost the online job: the resume itself
//!   (on HWS it unmaps the online queues too) plus the next reaction (online work waits behind
//!   offline work until the suspend lands). The machine keeps the recent gaps between online
//!   bursts and, once idle for `t`, predicts the rest of the gap as the mean of `g - t` over the
//!   recorded gaps `g > t` (the empirical mean residual life: for periodic requests it shrinks as
//!   the next one nears, for Poisson arrivals it stays the mean gap), or with `learn_idle` as
//!   their median (robust to the few long gaps between a serving engine's batches, see
//!   [`PolicyMachine::predicted_rest`]). Below the cost it holds on
//!   and says so once per gap ([`Action::HoldThroughGap`]); with fewer than [`MIN_GAPS`] gaps
//!   longer than `t` on record there is no evidence either way, and with `learn_idle` it waits
//!   until [`UNPROVEN_WAIT`] × the threshold before it resumes (online work first: a serving
//!   engine's first step gaps would each be a flap). The costs are measured on the run, as the
//!   medians of the last 16 ([`PolicyMachine::note_resume`], [`PolicyMachine::note_reaction`]):
//!   one stalled ioctl does not hold every later gap; until a resume is measured it is taken to
//!   cost what a reaction did.
//!   Every other resume rule (online exit, `max_suspend`, minimum share) goes first.

use std::{collections::VecDeque, time::Duration};

use serde::Serialize;

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

/// The offline job's default share of a long online busy period: after a 5 s watchdog a 263 ms
/// slice, so the online work stays protected 95 % of such a period.
pub const DEFAULT_BUSY_SHARE: f64 = 0.05;
/// Gaps between online bursts kept for the prediction.
const GAP_HISTORY: usize = 64;
/// Every online gap kept for learning the idle threshold: enough to hold several of a serving
/// engine's busy periods (the harness's continuous-batching engine, harness/PROFILES.md: 100-200
/// steps per busy period, so 256 gaps held one or two gaps between busy periods and never a
/// valley). Kept sorted gap by gap: an insertion moves at most 8 KiB.
pub const ALL_GAPS: usize = 1024;
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
/// The threshold is learnt again after this many new gaps (a scan of [`ALL_GAPS`] values).
const RELEARN_EVERY: usize = 16;
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
/// Recent samples a cost is the median of: robust to the odd stalled ioctl (a vCPU or a
/// preempted thread can stretch one sample a hundredfold; an average would then hold the
/// offline job through every gap for the next dozen transitions).
const COST_SAMPLES: usize = 16;

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
    /// No online work for `idle`.
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

/// Why an idle resume was skipped: the predicted rest of the gap against the cost, ns.
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

/// The cost-aware answer for a gap past the idle threshold ([`PolicyMachine::gap_call`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GapCall {
    Resume,
    /// Predicted shorter than the transitions' cost.
    Hold(GapVerdict),
    /// No evidence either way yet: wait (up to [`UNPROVEN_WAIT`] × the threshold).
    Wait,
}

/// What the controller saw at one poll.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    /// Online work is pending or running (indices, occupancy, an open hint).
    pub online_active: bool,
    /// An online process exited since the previous poll.
    pub online_gone: bool,
}

/// The state machine.
#[derive(Clone, Debug)]
pub struct PolicyMachine {
    config: PolicyConfig,
    state: State,
    /// Last poll that saw online work.
    last_active: Option<u64>,
    /// This burst already had its suspend.
    burst_served: bool,
    /// Start of the current suspension (SUSPEND returned).
    suspended_since: Option<u64>,
    /// Closed suspensions (start, end) that may still overlap the share window.
    history: VecDeque<(u64, u64)>,
    /// No suspend before this (the end of a minimum-share slice).
    no_suspend_until: u64,
    /// Recent idle gaps between bursts (at least `idle` long), ns.
    gaps: VecDeque<u64>,
    /// The previous poll saw no online work.
    was_idle: bool,
    /// Recent resume ioctls and reactions (work visible → suspended), ns.
    resume_cost: VecDeque<u64>,
    reaction_cost: VecDeque<u64>,
    /// The current gap's skip was said.
    gap_verdict_said: bool,
    /// Every recent gap between polls that saw online work, ns.
    all_gaps: VecDeque<u64>,
    /// Gaps recorded since the threshold was last learnt.
    unlearnt: usize,
    /// The idle threshold in force, ns (`idle` until one is learnt).
    idle_ns: u64,
    /// `all_gaps` sorted, kept so at every gap (no allocation on the reaction thread: its
    /// capacity is [`ALL_GAPS`]): what the threshold is learnt from and the median rest is read
    /// from.
    sorted: Vec<u64>,
}

fn push_sample(window: &mut VecDeque<u64>, sample_ns: u64) {
    if window.len() == COST_SAMPLES {
        window.pop_front();
    }
    window.push_back(sample_ns);
}

/// The lower median (no allocation: at most [`COST_SAMPLES`] values, sorted on the stack).
fn median(window: &VecDeque<u64>) -> Option<u64> {
    let mut sorted = [0u64; COST_SAMPLES];
    let n = window.len();
    for (slot, &v) in sorted.iter_mut().zip(window) {
        *slot = v;
    }
    sorted[..n].sort_unstable();
    (n > 0).then(|| sorted[(n - 1) / 2])
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl PolicyMachine {
    pub fn new(config: PolicyConfig) -> Self {
        Self {
            config,
            state: State::Running,
            last_active: None,
            burst_served: false,
            suspended_since: None,
            history: VecDeque::new(),
            no_suspend_until: 0,
            gaps: VecDeque::with_capacity(GAP_HISTORY),
            was_idle: true,
            resume_cost: VecDeque::with_capacity(COST_SAMPLES),
            reaction_cost: VecDeque::with_capacity(COST_SAMPLES),
            gap_verdict_said: false,
            all_gaps: VecDeque::with_capacity(ALL_GAPS),
            unlearnt: 0,
            idle_ns: ns(config.idle),
            sorted: Vec::with_capacity(ALL_GAPS),
        }
    }

    /// The idle threshold in force (learnt, or `idle`).
    pub fn idle_threshold(&self) -> Duration {
        Duration::from_nanos(self.idle_ns)
    }

    /// The same, in ns (the reaction thread's clock).
    pub fn idle_threshold_ns(&self) -> u64 {
        self.idle_ns
    }

    /// Learn the idle threshold from the gaps on record (see the module's rules).
    fn learn_idle(&mut self) {
        self.unlearnt = 0;
        if self.all_gaps.len() < LEARN_MIN_GAPS {
            return;
        }
        let n = self.sorted.len();
        let below = (n / VALLEY_SIDE).max(3);
        // The widest ratio across VALLEY_SPAN neighbours with a tenth of the gaps below and a few
        // above.
        let mut best: Option<(f64, usize)> = None;
        for i in below..=(n - VALLEY_ABOVE.max(VALLEY_SPAN)) {
            let ratio = self.sorted[i + VALLEY_SPAN - 1].max(1) as f64 / self.sorted[i - 1].max(1) as f64;
            if best.is_none_or(|(r, _)| ratio > r) {
                best = Some((ratio, i));
            }
        }
        let configured = ns(self.config.idle);
        self.idle_ns = match best {
            Some((ratio, i)) if ratio >= VALLEY_RATIO => {
                let (inside, between) = (self.sorted[i - 1], self.sorted[i + VALLEY_SPAN - 1]);
                let middle = ((inside as f64) * (between as f64)).sqrt() as u64;
                (inside * 2).min(middle).clamp(configured / IDLE_RANGE, configured.saturating_mul(IDLE_RANGE))
            }
            _ => configured,
        };
    }

    /// A resume ioctl took `ns` (the online queues on the GPU were unmapped meanwhile).
    pub fn note_resume(&mut self, ns: u64) {
        push_sample(&mut self.resume_cost, ns);
    }

    /// Online work waited `ns` from visible to suspended (detection and the suspend ioctl).
    pub fn note_reaction(&mut self, ns: u64) {
        push_sample(&mut self.reaction_cost, ns);
    }

    /// What a resume now and the next suspend cost the online job: the medians of the recent
    /// resumes and reactions, ns (None until a reaction was measured). Until a resume is
    /// measured it is taken to cost what a reaction did: on HWS both end in one unmap and map of
    /// the device's queues (`execute_queues_cpsch`, kfd_device_queue_manager.c), and the reaction
    /// also waited for detection, so this errs towards holding, the online job's side. (With
    /// `--fixed-idle`, the previous rules: None until both were measured.)
    pub fn transition_cost(&self) -> Option<u64> {
        let reaction = median(&self.reaction_cost)?;
        let resume = median(&self.resume_cost).or(self.config.learn_idle.then_some(reaction))?;
        Some(resume + reaction)
    }

    /// The predicted rest of a gap that has lasted `idle_ns`, over the recorded gaps longer than
    /// it, and how many those are: their mean rest, or with `learn_idle` their median rest. A
    /// serving engine's gaps mix many step gaps just past the threshold (a rest of a few hundred
    /// µs) with a few long ones between batches (tens of ms): the mean is the long ones', so every
    /// step gap past the threshold was resumed; the median is the step gaps' when they are most.
    /// For Poisson gaps the median rest is ln 2 of the mean gap, still long.
    ///
    /// With `learn_idle` the median is taken over every gap on record ([`ALL_GAPS`], the short
    /// ones too), not only the last 64 past the threshold (`GAP_HISTORY`): a serving engine's step
    /// gaps that just pass the threshold are its tail, a handful among the last 64, and with
    /// fewer than [`MIN_GAPS`] of them on record each was resumed (a flap inside the busy
    /// period; harness batching load: 28 of 56 transitions). The record is kept sorted, so the
    /// median of `g - idle` over the gaps `g > idle` is one binary search (this runs at every
    /// poll of an idle, suspended GPU).
    pub fn predicted_rest(&self, idle_ns: u64) -> (Option<u64>, usize) {
        if self.config.learn_idle {
            let from = self.sorted.partition_point(|&g| g <= idle_ns);
            let n = self.sorted.len() - from;
            return ((n > 0).then(|| self.sorted[from + (n - 1) / 2] - idle_ns), n);
        }
        let longer = self.gaps.iter().filter(|&&g| g > idle_ns);
        let (n, sum) = longer.fold((0usize, 0u128), |(n, sum), &g| (n + 1, sum + u128::from(g - idle_ns)));
        ((n > 0).then(|| (sum / n as u128) as u64), n)
    }

    /// The cost-aware check of a gap past the threshold, from one prediction: hold through it
    /// when its rest is predicted shorter than the transitions' cost; with the learnt rules and no
    /// evidence either way (fewer than [`MIN_GAPS`] recorded gaps longer than it) wait up to
    /// [`UNPROVEN_WAIT`] × the threshold before resuming, as the online job comes first: a resume
    /// for want of evidence is a flap when the gap is one of a serving engine's first step gaps
    /// (harness batching load, 40 requests: the first busy period's 4 flaps), and a long gap
    /// loses only that wait; else resume.
    fn gap_call(&self, idle_ns: u64) -> GapCall {
        if !self.config.cost_aware {
            return GapCall::Resume;
        }
        let (predicted, evidence) = self.predicted_rest(idle_ns);
        if let (Some(cost_ns), Some(predicted_ns)) = (self.transition_cost(), predicted)
            && evidence >= MIN_GAPS
            && predicted_ns < cost_ns
        {
            return GapCall::Hold(GapVerdict { idle_ns, predicted_ns, cost_ns, evidence });
        }
        if self.config.learn_idle && idle_ns < self.idle_ns.saturating_mul(UNPROVEN_WAIT) && evidence < MIN_GAPS {
            return GapCall::Wait;
        }
        GapCall::Resume
    }

    /// Record the gap that ends at `now` when online work reappears.
    fn note_activity(&mut self, now: u64) {
        if self.was_idle
            && let Some(last) = self.last_active
        {
            let gap = now.saturating_sub(last);
            if self.config.learn_idle {
                if self.all_gaps.len() == ALL_GAPS
                    && let Some(old) = self.all_gaps.pop_front()
                {
                    let at = self.sorted.partition_point(|&g| g < old);
                    self.sorted.remove(at);
                }
                self.all_gaps.push_back(gap);
                // Kept sorted one gap at a time (a move of at most ALL_GAPS words), so the median
                // rest counts every gap from the first (no stale snapshot while evidence is scarce).
                let at = self.sorted.partition_point(|&g| g < gap);
                self.sorted.insert(at, gap);
                self.unlearnt += 1;
                if self.unlearnt >= RELEARN_EVERY || self.all_gaps.len() == LEARN_MIN_GAPS {
                    self.learn_idle();
                }
            }
            if gap >= self.idle_ns {
                if self.gaps.len() == GAP_HISTORY {
                    self.gaps.pop_front();
                }
                self.gaps.push_back(gap);
            }
        }
        self.gap_verdict_said = false;
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
        let Some(idle_for) = self.last_active.map(|t| now.saturating_sub(t)) else {
            return self.state == State::Suspended;
        };
        self.state == State::Suspended && idle_for >= self.idle_ns && self.gap_call(idle_for) == GapCall::Resume
    }

    /// One poll at `now`: the action to take, if any. After a `Suspend` or `Resume` the
    /// controller reports the outcome with [`PolicyMachine::suspended`] / [`PolicyMachine::resumed`].
    pub fn tick(&mut self, now: u64, seen: Observation) -> Option<Action> {
        if seen.online_active {
            self.note_activity(now);
            self.last_active = Some(now);
        }
        self.was_idle = !seen.online_active;
        let idle_for = self.last_active.map_or(u64::MAX, |t| now.saturating_sub(t));
        if !seen.online_active && (idle_for >= self.idle_ns || seen.online_gone) {
            // The burst is over: the next online work may have its suspend.
            self.burst_served = false;
        }
        match self.state {
            State::Suspending | State::Resuming => None,
            State::Running => {
                let allowed = seen.online_active && !self.burst_served && now >= self.no_suspend_until;
                if allowed && self.share_room(now) {
                    self.burst_served = true;
                    self.state = State::Suspending;
                    Some(Action::Suspend)
                } else {
                    None
                }
            }
            State::Suspended => {
                let since = self.suspended_since.unwrap_or(now);
                let reason = if seen.online_gone && !seen.online_active {
                    Some(ResumeReason::OnlineGone)
                } else if now.saturating_sub(since) >= ns(self.config.max_suspend) {
                    if self.config.busy_share > 0.0 {
                        // A duty cycle, not a cliff: the burst may be suspended again after
                        // the offline job's slice.
                        self.burst_served = false;
                        self.no_suspend_until = now + self.busy_slice_ns();
                    }
                    Some(ResumeReason::Watchdog)
                } else if !self.share_room(now) {
                    self.burst_served = false;
                    self.no_suspend_until = now + self.slice_ns();
                    Some(ResumeReason::MinShare)
                } else if !seen.online_active && idle_for >= self.idle_ns {
                    match self.gap_call(idle_for) {
                        GapCall::Hold(verdict) => {
                            if std::mem::replace(&mut self.gap_verdict_said, true) {
                                return None;
                            }
                            return Some(Action::HoldThroughGap(verdict));
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
            self.suspended_since = Some(now);
        } else {
            self.state = State::Running;
        }
    }

    /// The RESUME returned at `now`, or the queues were resumed without being asked (the
    /// session's own watchdog, every offline process gone).
    pub fn resumed(&mut self, now: u64) {
        if let Some(start) = self.suspended_since.take() {
            self.history.push_back((start, now));
        }
        self.state = State::Running;
    }

    /// Time suspended within the share window ending at `now`, in ns.
    pub fn suspended_in_window(&mut self, now: u64) -> u64 {
        let from = now.saturating_sub(ns(self.config.share_window));
        while self.history.front().is_some_and(|&(_, end)| end <= from) {
            self.history.pop_front();
        }
        let open = self.suspended_since.map(|s| (s, now));
        self.history.iter().copied().chain(open).map(|(s, e)| e.saturating_sub(s.max(from))).sum()
    }

    /// The offline job's slice after a watchdog resume in a burst that goes on.
    fn busy_slice_ns(&self) -> u64 {
        let share = self.config.busy_share.clamp(0.0, 0.5);
        (ns(self.config.max_suspend) as f64 * share / (1.0 - share)) as u64
    }

    fn slice_ns(&self) -> u64 {
        (self.config.min_share * ns(self.config.share_window) as f64) as u64
    }

    /// Suspended time the window allows.
    fn budget_ns(&self) -> u64 {
        ((1.0 - self.config.min_share) * ns(self.config.share_window) as f64) as u64
    }

    /// Is the window within its suspended-time budget (a suspension may start or go on)?
    fn share_room(&mut self, now: u64) -> bool {
        self.config.min_share <= 0.0 || self.suspended_in_window(now) <= self.budget_ns()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn policy(idle_ms: u64, max_ms: u64, share: f64) -> PolicyMachine {
        PolicyMachine::new(PolicyConfig {
            idle: Duration::from_millis(idle_ms),
            max_suspend: Duration::from_millis(max_ms),
            min_share: share,
            share_window: Duration::from_millis(100),
            cost_aware: false,
            // The rules these tests pin predate the duty cycle and the learnt threshold; each
            // has its own tests below.
            busy_share: 0.0,
            learn_idle: false,
        })
    }

    fn on() -> Observation {
        Observation { online_active: true, online_gone: false }
    }

    fn off() -> Observation {
        Observation::default()
    }

    /// Drive `p` from `from` to `to` (inclusive) in 1 ms polls with `seen`; every action is
    /// completed at once. Returns (time ms, action).
    fn run(p: &mut PolicyMachine, from: u64, to: u64, seen: Observation) -> Vec<(u64, Action)> {
        let mut out = Vec::new();
        for t in from..=to {
            if let Some(a) = p.tick(t * MS, seen) {
                match a {
                    Action::Suspend => p.suspended(t * MS, true),
                    Action::Resume(_) => p.resumed(t * MS),
                    Action::HoldThroughGap(_) => {}
                }
                out.push((t, a));
            }
        }
        out
    }

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
        let gone = Observation { online_active: false, online_gone: true };
        assert_eq!(p.tick(6 * MS, gone), Some(Action::Resume(ResumeReason::OnlineGone)));
        p.resumed(6 * MS);
        // Another online process still busy when one exits: no resume.
        let mut p = policy(50, 1000, 0.0);
        run(&mut p, 0, 5, on());
        assert_eq!(p.tick(6 * MS, Observation { online_active: true, online_gone: true }), None);
    }

    #[test]
    fn minimum_share_gives_the_offline_job_slices_under_continuous_load() {
        // Window 100 ms, share 0.3: at most 70 ms suspended in any 100 ms, then a 30 ms slice.
        // The budget is exceeded at the first poll past it (1 ms polls here).
        let mut p = policy(3, 10_000, 0.3);
        let actions = run(&mut p, 0, 299, on());
        assert_eq!(
            actions,
            vec![
                (0, Action::Suspend),
                (71, Action::Resume(ResumeReason::MinShare)),
                (101, Action::Suspend),
                (172, Action::Resume(ResumeReason::MinShare)),
                (202, Action::Suspend),
                (273, Action::Resume(ResumeReason::MinShare)),
            ]
        );
        // The last window holds the budget plus one poll of suspension.
        assert_eq!(p.suspended_in_window(300 * MS), 71 * MS);
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

    /// 200 µs polls from 0 to `end_us` over an online activity trace (bursts as `[start, end)` in
    /// µs, in order and apart): (µs, online work seen).
    fn polls_over(bursts: &[(u64, u64)], end_us: u64) -> Vec<(u64, bool)> {
        let mut next = 0;
        (0..=end_us)
            .step_by(200)
            .map(|t| {
                // The first burst that has not ended is the only candidate.
                while bursts.get(next).is_some_and(|b| b.1 <= t) {
                    next += 1;
                }
                (t, bursts.get(next).is_some_and(|&(s, e)| (s..e).contains(&t)))
            })
            .collect()
    }

    /// Drive `p` through `polls` (µs, online work seen); every suspend and resume completes within
    /// the poll and, with `costs` = (resume, reaction) ns, the machine is told each cost that.
    /// Returns the actions with their poll time (µs).
    fn drive(p: &mut PolicyMachine, polls: &[(u64, bool)], costs: Option<(u64, u64)>) -> Vec<(u64, Action)> {
        let mut out = Vec::new();
        for &(t, active) in polls {
            let now = t * 1_000;
            if let Some(a) = p.tick(now, Observation { online_active: active, online_gone: false }) {
                match a {
                    Action::Suspend => {
                        p.suspended(now, true);
                        costs.inspect(|&(_, reaction)| p.note_reaction(reaction));
                    }
                    Action::Resume(_) => {
                        p.resumed(now);
                        costs.inspect(|&(resume, _)| p.note_resume(resume));
                    }
                    Action::HoldThroughGap(_) => {}
                }
                out.push((t, a));
            }
        }
        out
    }

    /// Replay an online activity trace through a cost-aware machine (2 ms idle) in 200 µs polls,
    /// each resume costing `resume_us` and each reaction `reaction_us`.
    fn replay(bursts: &[(u64, u64)], end_us: u64, resume_us: u64, reaction_us: u64) -> Vec<(u64, Action)> {
        let mut p = PolicyMachine::new(PolicyConfig { idle: Duration::from_millis(2), ..PolicyConfig::default() });
        drive(&mut p, &polls_over(bursts, end_us), Some((resume_us * 1_000, reaction_us * 1_000)))
    }

    fn kinds(actions: &[(u64, Action)]) -> (usize, usize, usize) {
        let n = |f: fn(&Action) -> bool| actions.iter().filter(|(_, a)| f(a)).count();
        (
            n(|a| *a == Action::Suspend),
            n(|a| matches!(a, Action::Resume(_))),
            n(|a| matches!(a, Action::HoldThroughGap(_))),
        )
    }

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
    fn one_stalled_transition_does_not_make_every_gap_look_short() {
        // Gaps of 8 ms; resumes of 1 ms and reactions of 1.5 ms, but one reaction stalled for
        // 400 ms (a vCPU or the thread preempted). The median ignores it: every gap resumes.
        let mut p = PolicyMachine::new(PolicyConfig { idle: Duration::from_millis(2), ..PolicyConfig::default() });
        for i in 0..20 {
            p.note_resume(MS);
            p.note_reaction(if i == 10 { 400 * MS } else { 3 * MS / 2 });
        }
        assert_eq!(p.transition_cost(), Some(5 * MS / 2));
        assert_eq!(median(&VecDeque::from([5, 1, 3, 2])), Some(2));
        assert_eq!(median(&VecDeque::new()), None);
    }

    #[test]
    fn a_burst_longer_than_the_watchdog_gets_a_duty_cycle_not_a_cliff() {
        // max 20 ms, busy share 0.2: after each watchdog resume a 5 ms slice (20 × 0.2 / 0.8),
        // then the same burst is suspended again.
        let mut p = PolicyMachine::new(PolicyConfig { busy_share: 0.2, ..policy(3, 20, 0.0).config });
        let actions = run(&mut p, 0, 80, on());
        assert_eq!(
            actions,
            vec![
                (0, Action::Suspend),
                (20, Action::Resume(ResumeReason::Watchdog)),
                (25, Action::Suspend),
                (45, Action::Resume(ResumeReason::Watchdog)),
                (50, Action::Suspend),
                (70, Action::Resume(ResumeReason::Watchdog)),
                (75, Action::Suspend),
            ]
        );
        // The end of the burst resumes as before, and the next burst has its suspend at once.
        assert_eq!(run(&mut p, 81, 90, off()), vec![(83, Action::Resume(ResumeReason::Idle))]);
        assert_eq!(run(&mut p, 91, 91, on()), vec![(91, Action::Suspend)]);
        // The default share: a 263 ms slice after the 5 s watchdog.
        let p = PolicyMachine::new(PolicyConfig::default());
        assert_eq!(p.busy_slice_ns(), 263_157_894);
    }

    /// A small deterministic generator for the traces below (64-bit LCG, Knuth's constants).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> f64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (self.0 >> 11) as f64 / (1u64 << 53) as f64
        }
        fn between(&mut self, lo_us: u64, hi_us: u64) -> u64 {
            lo_us + (self.next() * (hi_us - lo_us) as f64) as u64
        }
    }

    /// A continuous-batching engine's activity: batches of decode steps (10-30 ms of GPU work
    /// each) separated by the step gaps of `step_gap_us`, and batches separated by 20-80 ms with
    /// no request in flight. Bursts as `[start, end)` µs, and the number of batches.
    fn batching_trace(seed: u64, batches: usize, step_gap_us: (u64, u64)) -> (Vec<(u64, u64)>, usize) {
        let mut rng = Lcg(seed);
        let mut t = 1_000;
        let mut bursts = Vec::new();
        for _ in 0..batches {
            for _ in 0..rng.between(3, 8) {
                let step = rng.between(10_000, 30_000);
                bursts.push((t, t + step));
                t += step + rng.between(step_gap_us.0, step_gap_us.1);
            }
            t += rng.between(20_000, 80_000);
        }
        (bursts, batches)
    }

    /// Replay `bursts` in 200 µs polls through `config`, no cost told: the actions with their poll
    /// time (µs), and the machine.
    fn replay_with(config: PolicyConfig, bursts: &[(u64, u64)]) -> (Vec<(u64, Action)>, PolicyMachine) {
        let mut p = PolicyMachine::new(config);
        let end = bursts.last().map_or(0, |b| b.1) + 100_000;
        let actions = drive(&mut p, &polls_over(bursts, end), None);
        (actions, p)
    }

    #[test]
    fn a_serving_engines_step_gaps_flap_at_a_fixed_threshold_and_not_once_it_is_learnt() {
        // Step gaps of 1.0-2.6 ms around the 2 ms default threshold, 40 batches.
        let (bursts, batches) = batching_trace(7, 40, (1_000, 2_600));
        let fixed = PolicyConfig { cost_aware: false, learn_idle: false, ..PolicyConfig::default() };
        let (actions, _) = replay_with(fixed, &bursts);
        let suspends = actions.iter().filter(|(_, a)| *a == Action::Suspend).count();
        assert_eq!(suspends, 110, "fixed threshold: a suspend for every gap past 2 ms");
        let learnt = PolicyConfig { cost_aware: false, ..PolicyConfig::default() };
        let (actions, p) = replay_with(learnt, &bursts);
        // Twice the longest step gap seen (2.6 ms polled: up to 2.8 ms) sits in the valley.
        let threshold = p.idle_threshold();
        assert!(
            threshold >= Duration::from_micros(5_000) && threshold <= Duration::from_micros(5_600),
            "{threshold:?}"
        );
        // Once learnt (the first 32 gaps), one suspend per batch.
        let late: Vec<&(u64, Action)> = actions.iter().filter(|(t, _)| *t > bursts[60].0).collect();
        let late_suspends = late.iter().filter(|(_, a)| *a == Action::Suspend).count();
        // Batches that start after it: the ones after a batch gap (bursts[60] is inside one).
        let late_batches = bursts[60..].windows(2).filter(|w| w[1].0 - w[0].1 > 10_000).count();
        assert_eq!(late_suspends, late_batches, "{late:?}");
        assert!(suspends > batches * 2);
    }

    #[test]
    fn poisson_gaps_have_no_valley_and_the_threshold_stays() {
        let mut rng = Lcg(11);
        let mut t = 1_000;
        let mut bursts = Vec::new();
        for _ in 0..300 {
            let work = rng.between(500, 3_000);
            bursts.push((t, t + work));
            // Exponential gaps, mean 20 ms.
            t += work + (-(1.0 - rng.next()).ln() * 20_000.0) as u64 + 200;
        }
        let (_, p) = replay_with(PolicyConfig { cost_aware: false, ..PolicyConfig::default() }, &bursts);
        assert_eq!(p.idle_threshold(), Duration::from_millis(2));
    }

    #[test]
    fn requests_with_short_inner_gaps_learn_a_threshold_below_the_default() {
        // Requests of 4 kernels 300-500 µs apart (a launcher between them), requests 30-60 ms apart.
        let mut rng = Lcg(3);
        let mut t = 1_000;
        let mut bursts = Vec::new();
        for _ in 0..60 {
            for _ in 0..4 {
                let k = rng.between(800, 1_500);
                bursts.push((t, t + k));
                t += k + rng.between(300, 500);
            }
            t += rng.between(30_000, 60_000);
        }
        let (actions, p) = replay_with(PolicyConfig { cost_aware: false, ..PolicyConfig::default() }, &bursts);
        // An inner gap of at most 500 µs is seen between two active polls 200 µs apart at most
        // 800 µs apart: twice that.
        assert_eq!(p.idle_threshold(), Duration::from_micros(1_600));
        let suspends = actions.iter().filter(|(_, a)| *a == Action::Suspend).count();
        assert_eq!(suspends, 60, "one suspend per request");
    }

    #[test]
    fn an_engine_busy_across_requests_holds_through_its_step_gaps_on_the_median_rest() {
        // One long busy engine: 300 steps of 0.8 ms with CPU gaps of 1.0-2.6 ms, and only three
        // 30 ms pauses (1 %: no valley to learn until the third is on record, so for the first
        // 200 steps the threshold stays 2 ms). Resume 500 µs, reaction 900 µs: a step gap's rest
        // past 2 ms (≤ 0.8 ms polled) is shorter than that.
        let mut rng = Lcg(5);
        let mut t = 1_000;
        let mut bursts = Vec::new();
        for i in 0..300 {
            bursts.push((t, t + 800));
            t += 800 + rng.between(1_000, 2_600);
            if i % 100 == 99 {
                t += 30_000;
            }
        }
        let end = t + 50_000;
        let with_median = replay(&bursts, end, 500, 900);
        let (suspends, resumes, holds) = kinds(&with_median);
        // The mean rest (the previous rule) is the pauses': every step gap past 2 ms resumed.
        let mut p = PolicyMachine::new(PolicyConfig {
            idle: Duration::from_millis(2),
            learn_idle: false,
            ..PolicyConfig::default()
        });
        let (_, mean_resumes, _) = kinds(&drive(&mut p, &polls_over(&bursts, end), Some((500_000, 900_000))));
        assert_eq!(mean_resumes, 46, "the mean rest resumes in step gaps");
        // The median rest holds through them once MIN_GAPS gaps past 2 ms are on record (the
        // first wait, unproven, for 4 ms): the resumes are the three pauses. After the third pause the threshold is
        // learnt above the step gaps and they need no hold (119 holds before the valley spanned
        // VALLEY_SPAN gaps, when three pauses made no valley; 16 suspends with MIN_GAPS 8 and no
        // unproven wait).
        assert_eq!((suspends, resumes, holds), (3, 3, 41));
    }

    #[test]
    fn an_engine_with_long_busy_periods_holds_through_its_step_gaps_though_its_pauses_are_rare() {
        // 12 busy periods of 150 steps (0.8 ms, CPU gaps 1.0-2.6 ms around the 2 ms threshold),
        // 40-400 ms apart: the pauses are 11 of 1799 gaps, under 1 %. Resume 500 µs, reaction
        // 900 µs: a step gap's rest past 2 ms (≤ 0.8 ms polled) is shorter than that.
        let mut rng = Lcg(17);
        let mut t = 1_000;
        let mut bursts = Vec::new();
        let mut periods = Vec::new();
        for _ in 0..12 {
            let start = t;
            for _ in 0..150 {
                bursts.push((t, t + 800));
                t += 800 + rng.between(1_000, 2_600);
            }
            periods.push((start, t));
            t += rng.between(40_000, 400_000);
        }
        let actions = replay(&bursts, t + 50_000, 500, 900);
        let inside = |at: u64| periods.iter().any(|&(s, e)| s < at && at < e);
        let resumes_inside = |actions: &[(u64, Action)]| {
            actions.iter().filter(|(at, a)| matches!(a, Action::Resume(_)) && inside(*at)).count()
        };
        // The median rest over every gap on record: no resume inside a busy period. The step gaps
        // before MIN_GAPS past the idle time so far are on record wait, unproven, for 4 ms (a
        // step gap is at most 2.8 ms polled); then they are held through, the first ones at
        // the reaction's cost for a resume (none measured yet). One suspend per busy period and
        // one resume after it (with MIN_GAPS 8, no unproven wait and no resume cost until one
        // was measured: 20 flaps in the first busy period).
        let (suspends, resumes, _) = kinds(&actions);
        let first_end = periods[0].1;
        let early = actions.iter().filter(|(at, _)| *at <= first_end).copied().collect::<Vec<_>>();
        assert_eq!((suspends, resumes, resumes_inside(&actions), resumes_inside(&early)), (12, 12, 0, 0));
        let late = actions.iter().filter(|(at, _)| *at > first_end).copied().collect::<Vec<_>>();
        assert_eq!((kinds(&late).0, kinds(&late).1, resumes_inside(&late)), (11, 12, 0));
    }

    /// The observations the reaction thread fed the policy in a recorded run of the harness's
    /// continuous-batching load (`harness run --load batching`, see the fixture's header): runs of
    /// polls that saw online work or not, replayed poll by poll: (µs, online work seen).
    fn recorded_batching() -> Vec<(u64, bool)> {
        let mut polls = Vec::new();
        let mut t = 0u64;
        for line in include_str!("fixtures/batching-observations.txt").lines() {
            if line.starts_with('#') {
                continue;
            }
            let mut f = line.split_whitespace();
            let (Some(active), Some(n), Some(us)) = (f.next(), f.next(), f.next()) else { continue };
            let (Ok(n), Ok(us)) = (n.parse::<u64>(), us.parse::<u64>()) else { continue };
            for i in 0..n {
                polls.push((t + us * i / n, active == "1"));
            }
            t += us;
        }
        polls
    }

    #[test]
    fn a_recorded_serving_engine_is_suspended_about_once_per_busy_period_with_the_learnt_rules() {
        // The run the fixture was recorded from: 35 engine busy periods, 47 suspends. Replayed
        // with that run's median costs (resume 568 µs, reaction 812 µs).
        let polls = recorded_batching();
        assert_eq!(polls.len(), 60_436);
        let count = |config| {
            let mut p = PolicyMachine::new(config);
            kinds(&drive(&mut p, &polls, Some((567_597, 811_832))))
        };
        let learnt = count(PolicyConfig::default());
        let fixed = count(PolicyConfig { learn_idle: false, ..PolicyConfig::default() });
        let plain = count(PolicyConfig { learn_idle: false, cost_aware: false, ..PolicyConfig::default() });
        // (suspends, resumes, holds through a gap). The learnt rules: 35 suspends for the 35 busy
        // periods, none inside one (the first busy period's step gaps wait, unproven, then are
        // held through at the reaction's cost for a resume until one is measured). Before the
        // valley spanned VALLEY_SPAN gaps (MIN_GAPS 8, no unproven wait, no resume cost assumed):
        // 48, the recorded run's 47 (the replay is faithful), and 200 holds: the threshold fell
        // back to 2 ms whenever the step gaps' thin tail filled the valley, and the median rest
        // then held through the step gaps, or not (13 flaps). The fixed threshold with the mean
        // rest (`--fixed-idle`, the previous scheduler) resumes in the engine's step gaps past
        // 2 ms: 625; without cost awareness, 923. (The observations are the learnt run's: another
        // rule would have seen a little differently, e.g. the doorbell only while running.)
        assert_eq!((learnt, fixed, plain), ((35, 34, 9), (625, 625, 309), (923, 923, 0)));
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
}
