//! A scenario's states in one run — online alone, offline alone, co-located without the
//! scheduler, then the scheduler under each variant — and the comparisons against alone.

use anyhow::Result;
use gpreempt::{
    evaluate::{BenchState, State},
    stats::Summary,
};
use serde::Serialize;

use crate::{
    figures::{StateFigures, reduce},
    floor::{
        GOAL_RATIO_FROM_ARRIVAL, GOAL_RATIO_FROM_SUBMISSION, LeadFloor, StepFloor, SuspendFloor, lead_floor,
        step_floor, suspend_floor,
    },
    profile::section7,
    run::{Raw, run_state},
    scenario::{ENGINE_GAP_NS, Offline, Online, Scenario},
};

/// One co-located state against the alone states.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    pub state: BenchState,
    pub p50_ratio: Option<f64>,
    pub p99_ratio: Option<f64>,
    /// Continuous batching: engine step P99 against alone.
    pub step_p99_ratio: Option<f64>,
    /// The same over the steps after each engine busy period's first, against those alone (the
    /// opening step admits the first request: its prefill makes it the longest).
    pub step_later_p99_ratio: Option<f64>,
    /// The opening steps alone (each busy period's first) against those alone: issue 45's
    /// "opening-step P99 ≤ 1.05× alone".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_opening_p99_ratio: Option<f64>,
    /// The same at P50: an opening step's prefill grows with its prompt, so the P99 of a few dozen
    /// busy periods is their longest prefill, which a SUSPEND barely moves; the median shows the wait.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_opening_p50_ratio: Option<f64>,
    /// Offline GPU time on each GPU as a share of offline alone.
    pub kept: Vec<f64>,
    /// Offline GPU time over what the online load leaves (online GPU).
    pub offline_of_idle: f64,
    /// Continuous batching under the scheduler: the offline GPU time over the idle time outside
    /// the engine's busy periods (what a hold from each period's first step to its end leaves):
    /// issue 45's "offline ≥ 95 % of the idle time outside the engine's busy periods".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offline_of_idle_outside_busy: Option<f64>,
    /// The data-parallel job's steps/s against alone.
    pub job_steps_ratio: Option<f64>,
    /// Requests over TCP: P50 and P99 measured from arrival (the sender's write → its answer)
    /// against alone's, measured the same way.
    pub p50_ratio_from_arrival: Option<f64>,
    pub p99_ratio_from_arrival: Option<f64>,
}

/// Whether the emulator profile reproduces §7.3 within PROFILES.md's tolerance.
#[derive(Clone, Debug, Serialize)]
pub struct Section7Check {
    pub kept_schedule: f64,
    pub kept_colocated: f64,
    pub suspends_per_request: f64,
    pub within_tolerance: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct ScenarioResult {
    pub scenario: Scenario,
    pub states: Vec<StateFigures>,
    pub comparisons: Vec<Comparison>,
    pub section7: Option<Section7Check>,
    /// Poisson loads: what the latency goal leaves the offline side under any scheduler that
    /// suspends on sight (`floor.rs`).
    pub suspend_floor: Option<SuspendFloor>,
    /// Continuous batching: what the step goal asks of the offline side's idle time.
    pub step_floor: Option<StepFloor>,
    /// Poisson requests over TCP next to trainers: the floor with the CPU phase as a lead,
    /// judged from arrival and from the first submission (`floor.rs`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lead_floors: Vec<LeadFloor>,
    /// The CPU wake latency request held for every state (crate::cpu_wake).
    pub cpu_wake: crate::cpu_wake::CpuWake,
}

fn ratio(a: Option<&Summary>, b: Option<&Summary>, f: fn(&Summary) -> f64) -> Option<f64> {
    Some(f(a?) / f(b?).max(1e-9))
}

impl ScenarioResult {
    /// Each request's latency in `state`, ms: from its arrival at the service, or from its first
    /// submission (empty if the state did not run).
    pub fn latency_samples_ms(&self, state: &BenchState, from_arrival: bool) -> Vec<f64> {
        self.states
            .iter()
            .find(|s| &s.state == state)
            .map(|s| if from_arrival { &s.latency_from_arrival_samples_ms } else { &s.latency_samples_ms })
            .cloned()
            .unwrap_or_default()
    }

    /// Arrival → first SUSPEND, µs, of every request whose SUSPENDs the scheduler's default
    /// issued at once in this scenario (every online process's; the suite pools them).
    pub fn arrival_to_suspend_samples_us(&self) -> Vec<f64> {
        let default = BenchState::new(State::Scheduled);
        self.states
            .iter()
            .filter(|s| s.state == default)
            .filter_map(|s| s.scheduler.as_ref())
            .flat_map(|s| s.arrival.iter().flat_map(|a| a.arrival_to_suspend_samples_us.iter().copied()))
            .collect()
    }
}

pub fn evaluate(sc: &Scenario, section7_mirror: bool) -> Result<ScenarioResult> {
    // The scheduler's default request, held for the baselines too (`_held` until the end).
    let (cpu_wake, _held) = crate::cpu_wake::hold();
    let mut states = Vec::new();
    eprintln!("[{}] online alone", sc.name);
    let alone = BenchState::new(State::OnlineAlone);
    let online_raw = run_state(sc, &alone, 0.0)?;
    let online = reduce(&alone, &online_raw, sc.requests());
    let (suspend_floor, step_floor) = floors(sc, &online_raw, &online);
    let lead_floors = lead_floors(sc, &online_raw, &online);
    let seconds = online.window_s.clamp(2.0, 8.0);
    eprintln!("[{}] offline alone ({seconds:.1} s)", sc.name);
    let alone = BenchState::new(State::OfflineAlone);
    let offline = reduce(&alone, &run_state(sc, &alone, seconds)?, sc.requests());
    eprintln!("[{}] co-located", sc.name);
    let colocated = BenchState::new(State::CoLocated);
    let mut co = vec![reduce(&colocated, &run_state(sc, &colocated, 0.0)?, sc.requests())];
    for v in &sc.variants {
        eprintln!("[{}] schedule ({v})", sc.name);
        let scheduled = BenchState::scheduled(v);
        co.push(reduce(&scheduled, &run_state(sc, &scheduled, 0.0)?, sc.requests()));
    }
    let comparisons: Vec<Comparison> = co
        .iter()
        .map(|s| Comparison {
            state: s.state.clone(),
            p50_ratio: ratio(s.online_latency_ms.as_ref(), online.online_latency_ms.as_ref(), |x| x.p50),
            p99_ratio: ratio(s.online_latency_ms.as_ref(), online.online_latency_ms.as_ref(), |x| x.p99),
            step_p99_ratio: ratio(s.online_step_ms.as_ref(), online.online_step_ms.as_ref(), |x| x.p99),
            step_later_p99_ratio: ratio(s.online_step_later_ms.as_ref(), online.online_step_later_ms.as_ref(), |x| {
                x.p99
            }),
            kept: s.gpus.iter().zip(&offline.gpus).map(|(c, a)| c.offline_share / a.offline_share.max(1e-9)).collect(),
            step_opening_p99_ratio: ratio(
                s.online_step_opening_ms.as_ref(),
                online.online_step_opening_ms.as_ref(),
                |x| x.p99,
            ),
            step_opening_p50_ratio: ratio(
                s.online_step_opening_ms.as_ref(),
                online.online_step_opening_ms.as_ref(),
                |x| x.p50,
            ),
            offline_of_idle: s.gpus.first().map_or(0.0, |g| g.offline_of_idle),
            offline_of_idle_outside_busy: s
                .scheduler
                .as_ref()
                .and_then(|f| f.engine.as_ref())
                .zip(s.gpus.first())
                .map(|(e, g)| g.offline_of_idle / e.idle_outside_busy_of_idle.max(1e-9)),
            job_steps_ratio: s.job_steps_per_s.zip(offline.job_steps_per_s).map(|(c, a)| c / a.max(1e-9)),
            p50_ratio_from_arrival: ratio(from_arrival(s), from_arrival(&online), |x| x.p50),
            p99_ratio_from_arrival: ratio(from_arrival(s), from_arrival(&online), |x| x.p99),
        })
        .collect();
    let section7 = section7_mirror.then(|| {
        let kept_colocated = comparisons.first().and_then(|c| c.kept.first().copied()).unwrap_or(0.0);
        // §7 was measured with the scheduler before this wave's changes: the `previous` variant.
        let sched = comparisons
            .iter()
            .position(|c| c.state == BenchState::scheduled("previous"))
            .or_else(|| comparisons.iter().position(|c| c.state == BenchState::new(State::Scheduled)));
        let kept_schedule = sched.and_then(|i| comparisons[i].kept.first().copied()).unwrap_or(0.0);
        let suspends_per_request = sched.and_then(|i| co[i].scheduler.as_ref()).map_or(0.0, |s| s.suspends_per_request);
        let within_tolerance = (kept_schedule - section7::KEPT_SCHEDULE).abs() <= section7::KEPT_SCHEDULE_TOLERANCE
            && (suspends_per_request - section7::SUSPENDS_PER_REQUEST).abs()
                <= section7::SUSPENDS_PER_REQUEST_TOLERANCE
            && (kept_colocated - section7::KEPT_COLOCATED).abs() <= section7::KEPT_COLOCATED_TOLERANCE;
        Section7Check { kept_schedule, kept_colocated, suspends_per_request, within_tolerance }
    });
    states.push(online);
    states.push(offline);
    states.extend(co);
    Ok(ScenarioResult {
        scenario: sc.clone(),
        states,
        comparisons,
        section7,
        suspend_floor,
        step_floor,
        lead_floors,
        cpu_wake,
    })
}

fn from_arrival(s: &StateFigures) -> Option<&Summary> {
    s.request_path.as_ref()?.latency_from_arrival_ms.as_ref()
}

/// The floor with a lead (`floor.rs`), for Poisson requests over TCP next to trainers that always
/// have work queued: from the alone run, each request's latency (from arrival and from its first
/// submission) and its lead; the SUSPENDs and RESUMEs at the profile's shortest, one per trainer;
/// the gaps between the online GPU's busy periods alone.
fn lead_floors(sc: &Scenario, alone: &Raw, figures: &StateFigures) -> Vec<LeadFloor> {
    let (Offline::Trainers { processes, host_gap_ns: (0, 0), .. }, Online::Poisson { .. }, Some(_)) =
        (&sc.offline, &sc.online, sc.serving)
    else {
        return Vec::new();
    };
    let trainers = *processes as u64;
    let costs = (trainers * sc.profile.suspend.min(), trainers * sc.profile.resume.min());
    let joined = crate::request_path::joined(alone);
    let end = alone.start_ns + alone.window_ns;
    let busy: Vec<_> = alone
        .busy
        .first()
        .into_iter()
        .flatten()
        .filter(|b| b.start_ns >= alone.start_ns && b.start_ns <= end)
        .collect();
    let gaps: Vec<u64> = busy.windows(2).map(|w| w[1].start_ns.saturating_sub(w[0].end_ns)).collect();
    let share = figures.gpus.first().map_or(0.0, |g| g.online_share);
    let idle = (alone.window_ns as f64 * (1.0 - share)) as u64;
    let leads: Vec<u64> = joined.iter().map(|j| j.1).collect();
    [
        ("arrival", GOAL_RATIO_FROM_ARRIVAL, joined.iter().map(|j| j.0).collect::<Vec<_>>()),
        ("submission", GOAL_RATIO_FROM_SUBMISSION, joined.iter().map(|j| j.2).collect()),
    ]
    .into_iter()
    .filter_map(|(from, ratio, alone_ns)| lead_floor(&alone_ns, &leads, from, ratio, costs, &gaps, share, idle))
    .collect()
}

/// The floors of a load next to trainers that always have work queued (a loader-bound trainer or
/// a rank waiting for its peer may have nothing to preempt: no floor is claimed there). An unheld
/// Poisson request or engine opening step waits at least one SUSPEND per trainer at the profile's
/// shortest; an engine gap not held loses at least the engine's longest step gap and one RESUME
/// per trainer at the shortest.
fn floors(sc: &Scenario, alone: &Raw, figures: &StateFigures) -> (Option<SuspendFloor>, Option<StepFloor>) {
    let (Offline::Trainers { processes, host_gap_ns: (0, 0), .. }, Some(o)) = (&sc.offline, alone.online()) else {
        return (None, None);
    };
    let trainers = *processes as u64;
    let suspends = trainers * sc.profile.suspend.min();
    match sc.online {
        Online::Poisson { .. } => {
            (figures.gpus.first().and_then(|g| suspend_floor(&o.latencies_ns, g.online_share, suspends)), None)
        }
        Online::Batching { .. } => {
            let after_busy = ENGINE_GAP_NS.1 + trainers * sc.profile.resume.min();
            (None, step_floor(&o.step_ns, &o.step_opens_busy, &o.engine_busy_ns, suspends, after_busy))
        }
        Online::Trace { .. } | Online::Idle { .. } => (None, None),
    }
}
