//! From what a state measured to the figures issue 35 names. *Detection* = an online dispatch
//! published (the first of an online busy period: its client's CLOCK_MONOTONIC stamp) → the
//! first SUSPEND entering the (model) kernel; *reaction* = published → the last offline process's
//! SUSPEND returned. The harness knows the publish time exactly.

use std::collections::BTreeMap;

use gpreempt::{evaluate::BenchState, stats::Summary};
use serde::Serialize;

use crate::{
    client::ClientResult,
    control::{Call, Stamp},
    gpu::core::{Accounting, BusyPeriod, Side},
    run::Raw,
};

/// One GPU over the window.
#[derive(Clone, Debug, Serialize)]
pub struct GpuFigures {
    pub gpu: usize,
    /// Shares of the window: useful GPU time of the online and offline clients, restores,
    /// unmap stalls, idle.
    pub online_share: f64,
    pub offline_share: f64,
    pub restore_share: f64,
    pub stalled_share: f64,
    pub idle_share: f64,
    /// Offline GPU time over the GPU time the online load leaves (window − online work).
    pub offline_of_idle: f64,
    pub busy_periods: usize,
}

/// The continuous-batching engine's busy periods against the scheduler's calls.
#[derive(Clone, Debug, Serialize)]
pub struct EngineFigures {
    pub busy_periods: usize,
    pub transitions_per_busy_period: f64,
    pub resumes_inside: usize,
    /// The busy periods with resumes inside: (ordinal from 0, RESUME calls), so a learning
    /// phase (the first periods) is told apart from flaps all through the run.
    pub flapping_periods: Vec<(usize, usize)>,
    /// The GPU time outside the engine's busy periods over the GPU time the online work leaves
    /// (online GPU): the most offline can have without a resume inside a busy period (after a
    /// period's first suspend it stays held to the period's end; its step gaps are lost to it).
    pub idle_outside_busy_of_idle: f64,
    /// From each busy period's end to the first RESUME after it (before the next period), ms:
    /// the idle time outside the busy periods that the hold still takes.
    pub resume_after_busy_ms: Option<Summary>,
}

/// What the scheduler did, from the harness's side (stamps) and its own report.
#[derive(Clone, Debug, Serialize)]
pub struct SchedulerFigures {
    pub variant: String,
    /// Suspend transitions on the online GPU (one or more SUSPEND calls each) and the calls.
    pub transitions: usize,
    pub suspend_calls: usize,
    pub resume_calls: usize,
    pub transitions_per_busy_period: f64,
    pub suspends_per_request: f64,
    /// Batching: the engine's busy periods (any request in flight) in the window, the suspend
    /// transitions per such period, and the RESUME calls made inside one (each a flap: the
    /// next step is suspended again). None for other loads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineFigures>,
    /// Busy periods that found the offline queues already suspended, and those never protected.
    pub busy_periods_held_at_start: usize,
    pub busy_periods_unprotected: usize,
    /// Busy periods that began with no offline dispatch waiting or running on the online GPU:
    /// nothing to preempt, so neither a detection sample nor unprotected (a suspend deferred
    /// there costs nothing; one made there is still counted as a transition).
    pub busy_periods_nothing_to_preempt: usize,
    pub detection_us: Option<Summary>,
    /// Of the detection samples, those whose busy period was published while a RESUME was in
    /// the kernel (the reaction thread inside it), and the detection of the others.
    pub busy_periods_during_resume: usize,
    pub detection_outside_resume_us: Option<Summary>,
    pub reaction_us: Option<Summary>,
    /// Per reaction sample: the time its SUSPEND calls spent in the model kernel (the profile's
    /// SUSPEND: sampled duration + a CWSR save per queue executing, online ones too), and
    /// gpreempt's own time between them; reaction = detection + these two, sample by sample.
    pub suspend_calls_us: Option<Summary>,
    pub between_suspend_calls_us: Option<Summary>,
    /// The scheduler's own detection (from its last quiet poll, an upper bound) for comparison.
    pub scheduler_detection_us: Option<Summary>,
    /// Of it, through the doorbell probe (exact: the store's kernel stamp → SUSPEND entered).
    pub scheduler_detection_doorbell_us: Option<Summary>,
    /// Its wake-up share: the store → the start of the step that took the probe's hit.
    pub scheduler_doorbell_wake_us: Option<Summary>,
    /// Waits on the probe while the online side was idle, and those a store or command ended.
    pub doorbell_waits: u64,
    pub doorbell_wakes: u64,
    /// Offline processes a suspend found with nothing on the GPU (held with no call), and of them
    /// those suspended later in the hold at their first submission (the scheduler's counts).
    pub offline_deferred: u64,
    pub offline_late_suspends: u64,
    /// Resumes stopped between two RESUMEs for online work published meanwhile (or a request
    /// whose SUSPENDs were due before the next could run).
    pub resumes_cut_short: u64,
    /// `--runnable`: offline processes parked and unparked; with `auto`, one more made runnable
    /// on a GPU, or one fewer (the scheduler's counts).
    pub offline_parks: u64,
    pub offline_unparks: u64,
    pub runnable_raised: u64,
    pub runnable_lowered: u64,
    pub loop_step_us: Option<Summary>,
    /// gpreempt's CPU: the reaction thread (its report) + the thread calling `run()`, as a share
    /// of one core over the scheduler's run.
    pub cpu_share: f64,
    pub reaction_cpu_ms: f64,
    pub run_thread_cpu_ms: f64,
    /// The idle load only: both threads' CPU inside its quiet time (start-up left out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_cpu: Option<crate::idle_cpu::IdleCpu>,
    /// Keyed by `ResumeReason::name`, as the scheduler's own JSON is (BENCHMARKS.json sections
    /// measured before have the variant's Debug name lowercased: `onlinegone`, `minshare`).
    pub resumes_by_reason: BTreeMap<String, u64>,
    pub resumes_skipped: u64,
    /// Per scheduled GPU, the idle threshold in force at its last idle resume (learnt or
    /// `--idle`), µs.
    pub idle_threshold_us: Vec<Option<f64>>,
    pub realtime: String,
    /// Per online process: the arrival path as the scheduler reports it (segment counts, pending
    /// holds served / late / wasted, the lead, arrival → SUSPEND).
    pub arrival: Vec<gpreempt::schedule::arrival::report::ArrivalReport>,
}

#[derive(Clone, Debug, Serialize)]
pub struct StateFigures {
    pub state: BenchState,
    pub window_s: f64,
    pub requests: usize,
    pub online_latency_ms: Option<Summary>,
    /// Continuous batching: engine step, publish → completion seen.
    pub online_step_ms: Option<Summary>,
    /// The same without the step that opens each engine busy period: the steps a scheduler that
    /// acts on visible work can protect (the opening step waits for its reaction, and on HWS the
    /// SUSPEND unmaps the online queue too).
    pub online_step_later_ms: Option<Summary>,
    /// The steps that open an engine busy period alone (their prefill admits the first request
    /// to an idle engine): the step a scheduler that sees the request before the GPU can protect.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub online_step_opening_ms: Option<Summary>,
    /// The online client's doorbell stores through the stand-in runtime, µs each (with the
    /// doorbell probe attached they include its uprobe trap: the cost per kernel launch).
    pub doorbell_store_us: Option<Summary>,
    pub gpus: Vec<GpuFigures>,
    /// The data-parallel job's steps per second (both ranks meet every step).
    pub job_steps_per_s: Option<f64>,
    pub scheduler: Option<SchedulerFigures>,
    /// Requests over TCP (issue 45): from arrival, the lead, probes, requests found held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_path: Option<crate::request_path::RequestPathFigures>,
    pub warnings: Vec<String>,
    /// Each request's latency from its first submission, ms (in-process callers pool them; not
    /// in the JSON).
    #[serde(skip)]
    pub latency_samples_ms: Vec<f64>,
    /// Each request's latency from its arrival at the service, ms (requests over TCP; likewise).
    #[serde(skip)]
    pub latency_from_arrival_samples_ms: Vec<f64>,
}

fn ms(xs: &[u64]) -> Option<Summary> {
    Summary::of(&xs.iter().map(|&ns| ns as f64 / 1e6).collect::<Vec<_>>())
}

fn gpu_figures(
    gpu: usize,
    before: &Accounting,
    after: &Accounting,
    busy: &[BusyPeriod],
    sides: &[Side],
    window: u64,
) -> GpuFigures {
    let (mut online, mut offline, mut restore) = (0u64, 0u64, 0u64);
    for (c, (a, b)) in
        after.clients.iter().zip(before.clients.iter().chain(std::iter::repeat(&Default::default()))).enumerate()
    {
        let work = a.work_ns - b.work_ns;
        restore += a.restore_ns - b.restore_ns;
        match sides.get(c) {
            Some(Side::Online) => online += work,
            _ => offline += work,
        }
    }
    let w = window.max(1) as f64;
    GpuFigures {
        gpu,
        online_share: online as f64 / w,
        offline_share: offline as f64 / w,
        restore_share: restore as f64 / w,
        stalled_share: (after.stalled_ns - before.stalled_ns) as f64 / w,
        idle_share: (after.idle_ns - before.idle_ns) as f64 / w,
        offline_of_idle: offline as f64 / (window.saturating_sub(online)).max(1) as f64,
        busy_periods: busy.len(),
    }
}

/// Suspends of one transition closer than this follow each other in one step of the reaction
/// thread (microseconds apart); a later step is at least the poll interval (200 µs) on.
const BACK_TO_BACK_NS: u64 = 100_000;

/// Held intervals of GPU `g` (some offline process suspended), from the stamps.
pub(crate) fn held_intervals(stamps: &[Stamp], g: usize) -> Vec<(u64, u64)> {
    let mut s: Vec<&Stamp> = stamps.iter().filter(|s| s.gpu == g).collect();
    s.sort_by_key(|s| s.entered_ns);
    let (mut n, mut since, mut out) = (0usize, 0u64, Vec::new());
    for st in s {
        match st.call {
            Call::Suspend => {
                if n == 0 {
                    since = st.returned_ns;
                }
                n += 1;
            }
            Call::Resume => {
                n = n.saturating_sub(1);
                if n == 0 {
                    out.push((since, st.entered_ns));
                }
            }
        }
    }
    if n > 0 {
        out.push((since, u64::MAX));
    }
    out
}

/// The online GPU's busy periods against the scheduler's calls: which were held at their start,
/// had nothing to preempt, went unprotected, and for the others their detection and reaction.
#[derive(Debug, Default, PartialEq)]
struct BusyPeriodSamples {
    /// Suspend transitions: (first SUSPEND entered, last returned, time inside the calls), in order.
    transitions: Vec<(u64, u64, u64)>,
    held_at_start: usize,
    nothing_to_preempt: usize,
    unprotected: usize,
    detection_us: Vec<f64>,
    reaction_us: Vec<f64>,
    /// Per sample: its SUSPEND calls' own time in the (model) kernel, and gpreempt's between them.
    suspend_calls_us: Vec<f64>,
    between_calls_us: Vec<f64>,
    during_resume: usize,
    detection_outside_resume_us: Vec<f64>,
}

impl BusyPeriodSamples {
    /// `stamps`: the window's calls; `held`: the online GPU's held intervals over the whole run.
    fn of(online_busy: &[BusyPeriod], stamps: &[Stamp], held: &[(u64, u64)]) -> Self {
        let mut out = Self::default();
        // Transitions on the online GPU: (first entered, last returned) of the suspends made in
        // one go (back to back on the reaction thread). A deferred process suspended later in
        // the hold, at its first submission (a later step: a poll interval on), is not part of
        // the reaction to the online work. Each also sums the time its calls spent in the model
        // kernel (the profile's SUSPEND: the sampled duration plus a save per queue executing),
        // so that a reaction splits exactly into detection + the calls + gpreempt's own time
        // between them.
        let mut transitions: BTreeMap<u64, (u64, u64, u64)> = BTreeMap::new();
        let mut suspends: Vec<&Stamp> = stamps.iter().filter(|s| s.gpu == 0 && s.call == Call::Suspend).collect();
        suspends.sort_by_key(|s| s.entered_ns);
        for s in suspends {
            let call = s.returned_ns - s.entered_ns;
            let t = transitions.entry(s.transition).or_insert((s.entered_ns, s.entered_ns, 0));
            if s.entered_ns.saturating_sub(t.1) < BACK_TO_BACK_NS {
                t.1 = t.1.max(s.returned_ns);
                t.2 += call;
            }
        }
        out.transitions = transitions.into_values().collect();
        out.transitions.sort_unstable();
        // Busy periods published while a RESUME of the online GPU was in the (model) kernel: the
        // reaction thread is inside that ioctl and KFD would serialise a SUSPEND behind it, so
        // their detection includes the rest of it whatever the detection path.
        let resumes: Vec<(u64, u64)> = stamps
            .iter()
            .filter(|s| s.gpu == 0 && s.call == Call::Resume)
            .map(|s| (s.entered_ns, s.returned_ns))
            .collect();
        let us = |ns: u64| ns as f64 / 1e3;
        for (i, b) in online_busy.iter().enumerate() {
            let next = online_busy.get(i + 1).map_or(u64::MAX, |n| n.start_ns);
            if held.iter().any(|&(s, e)| s <= b.start_ns && b.start_ns < e) {
                out.held_at_start += 1;
            } else if !b.offline_work {
                out.nothing_to_preempt += 1;
            } else if let Some(&(entered, returned, in_calls)) =
                out.transitions.iter().find(|t| t.0 >= b.start_ns && t.0 < next)
            {
                out.detection_us.push(us(entered - b.start_ns));
                out.reaction_us.push(us(returned - b.start_ns));
                out.suspend_calls_us.push(us(in_calls));
                out.between_calls_us.push(us((returned - entered).saturating_sub(in_calls)));
                if resumes.iter().any(|&(e, r)| e <= b.start_ns && b.start_ns < r) {
                    out.during_resume += 1;
                } else {
                    out.detection_outside_resume_us.push(us(entered - b.start_ns));
                }
            } else {
                out.unprotected += 1;
            }
        }
        out
    }
}

/// A batching engine's step times, those that open a busy period (`opening`) or the others.
fn steps(o: &ClientResult, opening: bool) -> Vec<u64> {
    o.step_ns
        .iter()
        .zip(o.step_opens_busy.iter().chain(std::iter::repeat(&false)))
        .filter(|(_, opens)| **opens == opening)
        .map(|(ns, _)| *ns)
        .collect()
}

pub fn reduce(state: &BenchState, raw: &Raw, requests: usize) -> StateFigures {
    let end = raw.start_ns + raw.window_ns;
    let sides: Vec<Side> = raw.clients.iter().map(|c| c.0).collect();
    let in_window = |b: &&BusyPeriod| b.start_ns >= raw.start_ns && b.start_ns <= end;
    let busy: Vec<Vec<BusyPeriod>> = raw.busy.iter().map(|v| v.iter().filter(in_window).copied().collect()).collect();
    let gpus: Vec<GpuFigures> = (0..raw.after.len())
        .map(|g| gpu_figures(g, &raw.before[g], &raw.after[g], &busy[g], &sides, raw.window_ns))
        .collect();
    let online = raw.online();
    let dp_steps = raw
        .clients
        .iter()
        .filter(|c| c.0 == Side::Offline)
        .map(|c| c.1.step_ends_ns.iter().filter(|&&t| t >= raw.start_ns && t <= end).count());
    let job_steps_per_s = match raw.after.len() {
        2 => dp_steps.min().map(|n| n as f64 / (raw.window_ns as f64 / 1e9)),
        _ => None,
    };
    let scheduler = raw.report.as_ref().map(|report| {
        let stamps: Vec<Stamp> =
            raw.stamps.iter().filter(|s| s.entered_ns >= raw.start_ns && s.entered_ns <= end).copied().collect();
        let online_busy = &busy[0];
        let samples = BusyPeriodSamples::of(online_busy, &stamps, &held_intervals(&raw.stamps, 0));
        let firsts = &samples.transitions;
        let calls = |c: Call| stamps.iter().filter(|s| s.call == c).count();
        let engine = online.filter(|o| !o.engine_busy_ns.is_empty()).map(|o| {
            let periods: Vec<(u64, u64)> =
                o.engine_busy_ns.iter().copied().filter(|&(s, _)| s >= raw.start_ns && s <= end).collect();
            // The engine's busy periods do not overlap: each RESUME inside one counts once.
            let flapping_periods: Vec<(usize, usize)> = periods
                .iter()
                .enumerate()
                .map(|(i, &(s, e))| {
                    let n = stamps
                        .iter()
                        .filter(|c| c.gpu == 0 && c.call == Call::Resume && s < c.entered_ns && c.entered_ns < e)
                        .count();
                    (i, n)
                })
                .filter(|&(_, n)| n > 0)
                .collect();
            let busy_ns: u64 = periods.iter().map(|&(s, e)| e.min(end) - s).sum();
            let resume_after: Vec<u64> = periods
                .iter()
                .enumerate()
                .filter_map(|(i, &(_, e))| {
                    let next = periods.get(i + 1).map_or(u64::MAX, |p| p.0);
                    stamps
                        .iter()
                        .filter(|c| c.gpu == 0 && c.call == Call::Resume && e <= c.entered_ns && c.entered_ns < next)
                        .map(|c| c.entered_ns - e)
                        .min()
                })
                .collect();
            // The GPU time the online work leaves, from its share of the window.
            let idle_ns = raw.window_ns as f64 * (1.0 - gpus.first().map_or(0.0, |g| g.online_share));
            EngineFigures {
                idle_outside_busy_of_idle: raw.window_ns.saturating_sub(busy_ns) as f64 / idle_ns.max(1.0),
                resume_after_busy_ms: ms(&resume_after),
                busy_periods: periods.len(),
                transitions_per_busy_period: firsts.len() as f64 / periods.len().max(1) as f64,
                resumes_inside: flapping_periods.iter().map(|&(_, n)| n).sum(),
                flapping_periods,
            }
        });
        let cpu_ms = report.reaction_cpu_ms + raw.run_thread_cpu_ns as f64 / 1e6;
        SchedulerFigures {
            variant: state.variant().unwrap_or(BenchState::DEFAULT_VARIANT).to_owned(),
            transitions: firsts.len(),
            suspend_calls: calls(Call::Suspend),
            resume_calls: calls(Call::Resume),
            transitions_per_busy_period: firsts.len() as f64 / online_busy.len().max(1) as f64,
            suspends_per_request: firsts.len() as f64 / requests.max(1) as f64,
            engine,
            busy_periods_held_at_start: samples.held_at_start,
            busy_periods_unprotected: samples.unprotected,
            busy_periods_nothing_to_preempt: samples.nothing_to_preempt,
            detection_us: Summary::of(&samples.detection_us),
            busy_periods_during_resume: samples.during_resume,
            detection_outside_resume_us: Summary::of(&samples.detection_outside_resume_us),
            reaction_us: Summary::of(&samples.reaction_us),
            suspend_calls_us: Summary::of(&samples.suspend_calls_us),
            between_suspend_calls_us: Summary::of(&samples.between_calls_us),
            scheduler_detection_us: report.detection_us.clone(),
            scheduler_detection_doorbell_us: report.detection_doorbell_us.clone(),
            scheduler_doorbell_wake_us: report.doorbell_wake_us.clone(),
            doorbell_waits: report.doorbell_waits,
            doorbell_wakes: report.doorbell_wakes,
            offline_deferred: report.offline_deferred,
            offline_late_suspends: report.offline_late_suspends,
            resumes_cut_short: report.resumes_cut_short,
            offline_parks: report.offline_parks,
            offline_unparks: report.offline_unparks,
            runnable_raised: report.runnable_raised,
            runnable_lowered: report.runnable_lowered,
            loop_step_us: report.loop_step_us.clone(),
            cpu_share: cpu_ms / report.elapsed_ms.max(1e-9),
            reaction_cpu_ms: report.reaction_cpu_ms,
            run_thread_cpu_ms: raw.run_thread_cpu_ns as f64 / 1e6,
            idle_cpu: raw.idle_cpu,
            resumes_by_reason: report.resumes_by_reason.iter().map(|(r, n)| (r.name().to_owned(), *n)).collect(),
            resumes_skipped: report.resumes_skipped,
            idle_threshold_us: report.gpus.iter().filter(|g| g.scheduled).map(|g| g.idle_threshold_us).collect(),
            realtime: report.realtime.policy.to_owned(),
            arrival: report.arrival.clone(),
        }
    });
    StateFigures {
        state: state.clone(),
        window_s: raw.window_ns as f64 / 1e9,
        requests: online.map_or(0, |o| o.latencies_ns.len()),
        online_latency_ms: online.and_then(|o| ms(&o.latencies_ns)),
        online_step_ms: online.and_then(|o| ms(&o.step_ns)),
        online_step_later_ms: online.and_then(|o| ms(&steps(o, false))),
        online_step_opening_ms: online.and_then(|o| ms(&steps(o, true))),
        doorbell_store_us: online
            .and_then(|o| Summary::of(&o.doorbell_store_ns.iter().map(|&ns| ns as f64 / 1e3).collect::<Vec<_>>())),
        gpus,
        job_steps_per_s,
        scheduler,
        request_path: crate::request_path::reduce(
            raw,
            raw.report.as_ref().map(|_| held_intervals(&raw.stamps, 0)).as_deref(),
        ),
        warnings: raw.warnings.clone(),
        latency_samples_ms: online
            .map(|o| o.latencies_ns.iter().map(|&ns| ns as f64 / 1e6).collect())
            .unwrap_or_default(),
        latency_from_arrival_samples_ms: crate::request_path::joined(raw)
            .iter()
            .map(|&(from_arrival, _, _)| from_arrival as f64 / 1e6)
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(call: Call, client: usize, entered_ns: u64, returned_ns: u64, transition: u64) -> Stamp {
        Stamp { gpu: 0, client, call, entered_ns, returned_ns, transition, queues: 1 }
    }

    fn busy(start_ns: u64, offline_work: bool) -> BusyPeriod {
        BusyPeriod { start_ns, end_ns: start_ns + 500_000, offline_work }
    }

    #[test]
    fn a_reaction_splits_into_detection_the_suspend_calls_and_the_time_between_them() {
        let stamps = [
            // Busy period at 1 ms: three offline processes suspended back to back (2 µs and 1 µs
            // between the calls), resumed one by one from 8 ms, the last at 10 ms.
            call(Call::Suspend, 1, 1_050_000, 1_700_000, 1),
            call(Call::Suspend, 2, 1_702_000, 2_400_000, 1),
            call(Call::Suspend, 3, 2_401_000, 3_000_000, 1),
            // A deferred process suspended a poll interval later: not part of the reaction.
            call(Call::Suspend, 4, 3_300_000, 3_900_000, 1),
            call(Call::Resume, 2, 8_000_000, 8_500_000, 1),
            call(Call::Resume, 3, 8_500_000, 9_000_000, 1),
            call(Call::Resume, 4, 9_000_000, 9_500_000, 1),
            call(Call::Resume, 1, 10_000_000, 10_500_000, 1),
            // Busy period at 10.2 ms, published inside that RESUME: suspended when it returned.
            call(Call::Suspend, 1, 10_520_000, 11_100_000, 2),
            call(Call::Resume, 1, 30_000_000, 30_500_000, 2),
        ];
        let periods = [
            busy(1_000_000, true),
            busy(10_200_000, true),
            // Inside the second hold.
            busy(20_000_000, true),
            // After the last resume: nothing to preempt, then work no suspend followed.
            busy(40_000_000, false),
            busy(50_000_000, true),
        ];
        let s = BusyPeriodSamples::of(&periods, &stamps, &held_intervals(&stamps, 0));
        assert_eq!(s.transitions, vec![(1_050_000, 3_000_000, 1_947_000), (10_520_000, 11_100_000, 580_000)]);
        assert_eq!((s.held_at_start, s.nothing_to_preempt, s.unprotected, s.during_resume), (1, 1, 1, 1));
        assert_eq!(s.detection_us, vec![50.0, 320.0]);
        assert_eq!(s.reaction_us, vec![2000.0, 900.0]);
        assert_eq!(s.suspend_calls_us, vec![1947.0, 580.0]);
        assert_eq!(s.between_calls_us, vec![3.0, 0.0]);
        assert_eq!(s.detection_outside_resume_us, vec![50.0]);
        // Sample by sample, reaction = detection + the calls + the time between them.
        for i in 0..2 {
            assert_eq!(s.reaction_us[i], s.detection_us[i] + s.suspend_calls_us[i] + s.between_calls_us[i]);
        }
    }
}
