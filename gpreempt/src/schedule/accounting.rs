//! The scheduler's accounting, on the thread that started it: per GPU, the transitions the
//! reaction thread recorded, the time suspended, the offline processes' progress (their queues'
//! read indices), the driver's spans; and the figures of the periodic [`Interval`] and the
//! end-of-run [`ScheduleReport`] built from them. Nothing here decides anything.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::atomic::Ordering,
};

use super::{
    arrival::report::ArrivalReport,
    events::{
        DoorbellCount, GpuInterval, GpuReport, Interval, ResetQueue, ScheduleEvent, ScheduleReport, Transition,
        TransitionError,
    },
    hints::HintCounts,
    kernel::KernelBreakdown,
    online,
    policy::{GapVerdict, ResumeReason, State},
    reaction::{LoopStats, TransitionRecord},
    realtime::Realtime,
};
use crate::{
    controller::vocabulary::SharedError,
    domain::{GpuId, HostPid, TransitionKind},
    kfd::uapi::QueueSnapshotEntry,
    model::{QueueAddrs, spans::Span},
    stats::Summary as Stats,
};

/// One GPU's accounting, from the reaction thread's records.
#[derive(Default)]
struct GpuAccount {
    report: GpuReport,
    state: Option<State>,
    /// Since when it is suspended (ns), while it is.
    suspended_since: Option<u64>,
    suspended_ns: u64,
    interval_suspended_ns: u64,
    interval_dispatches: u64,
    reaction_us: Vec<f64>,
    detection_us: Vec<f64>,
    suspend_us: Vec<f64>,
    resume_us: Vec<f64>,
}

impl GpuAccount {
    fn end_suspension(&mut self, t: u64, interval_start: u64) {
        if let Some(since) = self.suspended_since.take() {
            self.suspended_ns += t.saturating_sub(since);
            self.interval_suspended_ns += t.saturating_sub(since.max(interval_start));
        }
    }
}

/// An offline process as this side sees it: its queues' read indices for the progress count.
struct OfflineWatch {
    /// (GPU, read-index address) of each queue.
    reads: Vec<(GpuId, u64)>,
    last: Vec<u64>,
}

/// What the run's report needs from outside the accounts.
pub(super) struct RunFacts<'a> {
    pub loop_stats: &'a LoopStats,
    pub realtime: Realtime,
    pub reaction_panicked: bool,
    pub hints: Option<HintCounts>,
}

/// Everything counted over a run.
pub(super) struct Accounts {
    start_ns: u64,
    /// This process's CPU time when the scheduler started, ms.
    cpu_start: f64,
    interval_start: u64,
    gpus: BTreeMap<GpuId, GpuAccount>,
    offline: BTreeMap<HostPid, OfflineWatch>,
    /// Runlist refreshes caused by attaching (ENABLE and DISABLE, online snapshots).
    pub attach_refreshes: u64,
    /// The doorbell probe's store counts, per online queue, as the reaction thread reports them.
    pub doorbell_stores: Vec<DoorbellCount>,
    pub arrival: Vec<ArrivalReport>,
    /// Offline queues the driver reset, as reported.
    pub queues_reset: Vec<ResetQueue>,
    /// The driver's side of the transitions (with the tracer).
    kernel: Option<KernelBreakdown>,
}

/// This process's CPU time (user + system), ms.
pub(super) fn cpu_ms() -> f64 {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr()) } != 0 {
        return 0.0;
    }
    // SAFETY: initialised by the successful call.
    let u = unsafe { u.assume_init() };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    ms(u.ru_utime) + ms(u.ru_stime)
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

impl Accounts {
    pub fn new(start_ns: u64, cpu_start: f64, sees_driver: bool) -> Self {
        Self {
            start_ns,
            cpu_start,
            interval_start: start_ns,
            gpus: BTreeMap::new(),
            offline: BTreeMap::new(),
            attach_refreshes: 0,
            doorbell_stores: Vec::new(),
            arrival: Vec::new(),
            queues_reset: Vec::new(),
            kernel: sees_driver.then(KernelBreakdown::default),
        }
    }

    /// When the scheduler started, CLOCK_MONOTONIC ns.
    pub fn start_ns(&self) -> u64 {
        self.start_ns
    }

    /// Milliseconds since start.
    pub fn t_ms(&self, t_ns: u64) -> f64 {
        t_ns.saturating_sub(self.start_ns) as f64 / 1e6
    }

    fn gpu(&mut self, gpu: GpuId) -> &mut GpuAccount {
        self.gpus.entry(gpu).or_insert_with(|| GpuAccount {
            report: GpuReport { gpu_id: gpu, ..GpuReport::default() },
            ..GpuAccount::default()
        })
    }

    /// A GPU with a queue of either side (reported even if nothing happens on it).
    pub fn note_gpu(&mut self, gpu: GpuId) {
        self.gpu(gpu);
    }

    pub fn offline_pids(&self) -> BTreeSet<HostPid> {
        self.offline.keys().copied().collect()
    }

    pub fn is_offline(&self, pid: HostPid) -> bool {
        self.offline.contains_key(&pid)
    }

    /// An offline process attached with `queues`: its progress is counted from now. Returns its
    /// GPUs, sorted.
    pub fn offline_attached(&mut self, pid: HostPid, queues: &[QueueSnapshotEntry]) -> Vec<GpuId> {
        self.attach_refreshes += 1;
        let reads: Vec<(GpuId, u64)> = queues.iter().map(|q| (GpuId(q.gpu_id), q.read_pointer_address)).collect();
        let mut last = vec![0; reads.len()];
        let addrs: Vec<u64> = reads.iter().map(|r| r.1).collect();
        let _ = online::read_u64s(pid, &addrs, &mut last);
        let mut gpus: Vec<GpuId> = reads.iter().map(|r| r.0).collect();
        gpus.sort_unstable();
        gpus.dedup();
        for &g in &gpus {
            self.gpu(g);
        }
        self.offline.insert(pid, OfflineWatch { reads, last });
        gpus
    }

    /// A queue an attached offline process created.
    pub fn offline_queue(&mut self, pid: HostPid, addrs: QueueAddrs) {
        let Some(p) = self.offline.get_mut(&pid) else { return };
        p.reads.push((addrs.gpu_id, addrs.read));
        let mut v = [0];
        let _ = online::read_u64s(pid, &[addrs.read], &mut v);
        p.last.push(v[0]);
        self.gpu(addrs.gpu_id);
    }

    /// An offline process detached: its progress so far counted, then forgotten.
    pub fn offline_detached(&mut self, pid: HostPid) {
        self.attach_refreshes += 1;
        self.offline_progress();
        self.offline.remove(&pid);
    }

    /// A transition the reaction thread recorded, counted; the event that says it.
    pub fn transition(&mut self, r: TransitionRecord, errors: Vec<(HostPid, SharedError)>) -> Transition {
        let start = self.interval_start;
        let g = self.gpu(r.gpu);
        g.report.scheduled = true;
        match r.kind {
            TransitionKind::Suspend => {
                g.report.suspends += 1;
                g.suspend_us.push(us(r.latency_ns));
                if r.queues > 0 || r.held_no_ioctl > 0 {
                    g.suspended_since = Some(r.t_ns);
                    g.state = Some(State::Suspended);
                    g.reaction_us.extend(r.reaction_ns.map(us));
                    g.detection_us.extend(r.detection_ns.map(us));
                } else {
                    g.state = Some(State::Running);
                    if !errors.is_empty() {
                        g.report.failed_suspends += 1;
                    }
                }
            }
            TransitionKind::Resume => {
                g.report.resumes += 1;
                g.resume_us.push(us(r.latency_ns));
                // A resume always has its reason; `Stop` stands in should one ever not.
                *g.report.resumes_by_reason.entry(r.reason.unwrap_or(ResumeReason::Stop)).or_default() += 1;
                if r.reason == Some(ResumeReason::Idle) {
                    g.report.idle_threshold_us = r.idle_threshold_ns.map(us);
                }
                g.end_suspension(r.t_ns, start);
                g.state = Some(State::Running);
            }
        }
        Transition {
            t_ms: self.t_ms(r.t_ns),
            gpu_id: r.gpu,
            action: r.kind,
            reason: r.reason,
            latency_us: us(r.latency_ns),
            reaction_us: r.reaction_ns.map(us),
            detection_us: r.detection_ns.map(us),
            queues: i64::from(r.queues),
            ioctls: r.ioctls,
            held_no_ioctl: r.held_no_ioctl,
            errors: errors.into_iter().map(|(pid, error)| TransitionError { pid, error }).collect(),
        }
    }

    /// An idle resume the policy skipped, counted; the event that says it.
    pub fn resume_skipped(&mut self, t_ns: u64, gpu: GpuId, verdict: GapVerdict) -> ScheduleEvent {
        self.gpu(gpu).report.resumes_skipped += 1;
        let GapVerdict { idle_ns, predicted_ns, cost_ns, evidence } = verdict;
        ScheduleEvent::ResumeSkipped {
            t_ms: self.t_ms(t_ns),
            gpu_id: gpu,
            idle_us: us(idle_ns),
            predicted_gap_us: us(predicted_ns),
            cost_us: us(cost_ns),
            evidence,
        }
    }

    /// Every hold of `gpu` ended without its policy (watchdogs, exits): it runs again.
    pub fn released(&mut self, t_ns: u64, gpu: GpuId) {
        let start = self.interval_start;
        let g = self.gpu(gpu);
        g.end_suspension(t_ns, start);
        g.state = Some(State::Running);
    }

    /// The driver's spans of the offline processes' suspends and resumes.
    pub fn add_spans(&mut self, spans: &mut Vec<Span>, online_ever: &BTreeSet<HostPid>) {
        let offline = self.offline_pids();
        let Some(kernel) = self.kernel.as_mut() else {
            spans.clear();
            return;
        };
        for span in spans.drain(..) {
            kernel.add(&span, &offline, online_ever);
        }
    }

    /// Offline dispatches started since the last call (read indices of every offline queue),
    /// counted per GPU.
    pub fn offline_progress(&mut self) -> u64 {
        let mut total = 0;
        let mut per_gpu: Vec<(GpuId, u64)> = Vec::new();
        for (&pid, p) in &mut self.offline {
            let addrs: Vec<u64> = p.reads.iter().map(|r| r.1).collect();
            let mut now = vec![0; addrs.len()];
            if online::read_u64s(pid, &addrs, &mut now).is_ok() {
                for ((gpu, _), (n, l)) in p.reads.iter().zip(now.iter().zip(&p.last)) {
                    let d = n.saturating_sub(*l);
                    total += d;
                    per_gpu.push((*gpu, d));
                }
                p.last = now;
            }
        }
        for (gpu, d) in per_gpu {
            let g = self.gpu(gpu);
            g.report.offline_dispatches += d;
            g.interval_dispatches += d;
        }
        total
    }

    /// The periodic report at `now`; a new interval starts.
    pub fn interval(&mut self, now: u64, online_processes: usize, stats: &LoopStats) -> Interval {
        let len = now.saturating_sub(self.interval_start).max(1);
        let dispatches = self.offline_progress();
        let start = self.interval_start;
        let mut gpus = Vec::new();
        let mut transitions = 0;
        let mut reaction = Vec::new();
        for (&gpu_id, g) in &mut self.gpus {
            if let Some(since) = g.suspended_since {
                g.interval_suspended_ns += now.saturating_sub(since.max(start));
            }
            transitions += g.report.suspends + g.report.resumes;
            reaction.extend_from_slice(&g.reaction_us);
            gpus.push(GpuInterval {
                gpu_id,
                state: g.state.unwrap_or(State::Running),
                suspended_share: g.interval_suspended_ns as f64 / len as f64,
                offline_dispatches: std::mem::take(&mut g.interval_dispatches),
            });
            g.interval_suspended_ns = 0;
        }
        self.interval_start = now;
        Interval {
            t_ms: self.t_ms(now),
            online_processes,
            offline_processes: self.offline.len(),
            transitions,
            reaction_p99_us: Stats::of(&reaction).map(|s| s.p99),
            loop_step_p50_us: stats.step.percentile_ns(50.0).map(|ns| ns as f64 / 1e3),
            loop_step_p99_us: stats.step.percentile_ns(99.0).map(|ns| ns as f64 / 1e3),
            loop_step_max_us: stats.step.summary_us().map(|s| s.max),
            offline_dispatches: dispatches,
            gpus,
        }
    }

    /// The end-of-run report at `end` (ns).
    pub fn report(&mut self, end: u64, facts: RunFacts<'_>) -> ScheduleReport {
        let elapsed_ns = end.saturating_sub(self.start_ns).max(1);
        let elapsed_ms = elapsed_ns as f64 / 1e6;
        let cpu = cpu_ms() - self.cpu_start;
        let per_s = |n: u64, ns: u64| (ns > 0).then(|| n as f64 / (ns as f64 / 1e9));
        let start = self.interval_start;
        let mut all = ScheduleReport::default();
        let (mut reaction, mut suspend, mut resume, mut detection) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut scheduled_gpus = 0usize;
        let mut running_ns_total = 0u64;
        for g in self.gpus.values_mut() {
            g.end_suspension(end, start);
            let r = &mut g.report;
            r.suspended_ms = g.suspended_ns as f64 / 1e6;
            r.suspended_share = g.suspended_ns as f64 / elapsed_ns as f64;
            r.reaction_us = Stats::of(&g.reaction_us);
            r.detection_us = Stats::of(&g.detection_us);
            r.suspend_us = Stats::of(&g.suspend_us);
            r.resume_us = Stats::of(&g.resume_us);
            let running_ns = elapsed_ns.saturating_sub(g.suspended_ns);
            r.offline_rate_running_per_s = per_s(r.offline_dispatches, running_ns);
            r.offline_rate_overall_per_s = per_s(r.offline_dispatches, elapsed_ns);
            all.suspends += r.suspends;
            all.resumes += r.resumes;
            all.resumes_skipped += r.resumes_skipped;
            all.failed_suspends += r.failed_suspends;
            all.suspended_ms += r.suspended_ms;
            all.offline_dispatches += r.offline_dispatches;
            for (k, v) in &r.resumes_by_reason {
                *all.resumes_by_reason.entry(*k).or_default() += v;
            }
            if r.scheduled {
                scheduled_gpus += 1;
                all.suspended_share += r.suspended_share;
            }
            if r.offline_dispatches > 0 {
                running_ns_total += running_ns;
            }
            reaction.extend_from_slice(&g.reaction_us);
            detection.extend_from_slice(&g.detection_us);
            suspend.extend_from_slice(&g.suspend_us);
            resume.extend_from_slice(&g.resume_us);
        }
        let stats = facts.loop_stats;
        ScheduleReport {
            elapsed_ms,
            suspended_share: all.suspended_share / scheduled_gpus.max(1) as f64,
            reaction_us: Stats::of(&reaction),
            detection_us: Stats::of(&detection),
            detection_doorbell_us: stats.detection_doorbell.summary_us(),
            doorbell_wake_us: stats.doorbell_wake.summary_us(),
            doorbell_waits: stats.doorbell_waits.load(Ordering::Relaxed),
            doorbell_wakes: stats.doorbell_wakes.load(Ordering::Relaxed),
            offline_deferred: stats.offline_deferred.load(Ordering::Relaxed),
            offline_late_suspends: stats.offline_late_suspends.load(Ordering::Relaxed),
            resumes_cut_short: stats.resumes_cut_short.load(Ordering::Relaxed),
            offline_parks: stats.offline_parks.load(Ordering::Relaxed),
            offline_unparks: stats.offline_unparks.load(Ordering::Relaxed),
            runnable_raised: stats.runnable_raised.load(Ordering::Relaxed),
            runnable_lowered: stats.runnable_lowered.load(Ordering::Relaxed),
            doorbell_stores: self.doorbell_stores.clone(),
            arrival: self.arrival.clone(),
            suspend_us: Stats::of(&suspend),
            resume_us: Stats::of(&resume),
            online_dispatch_delay_us: stats.dispatch_delay.summary_us(),
            offline_rate_running_per_s: per_s(all.offline_dispatches, running_ns_total),
            offline_rate_overall_per_s: per_s(all.offline_dispatches, elapsed_ns),
            polls: stats.steps.load(Ordering::Relaxed),
            loop_step_us: stats.step.summary_us(),
            transition_steps: stats.transition_steps.load(Ordering::Relaxed),
            realtime: facts.realtime,
            reports_dropped: stats.reports_dropped.load(Ordering::Relaxed),
            reaction_panicked: facts.reaction_panicked,
            hints: facts.hints,
            attach_refreshes: self.attach_refreshes,
            queues_reset: self.queues_reset.clone(),
            cpu_ms: cpu,
            cpu_share: if elapsed_ms > 0.0 { cpu / elapsed_ms } else { 0.0 },
            reaction_cpu_ms: stats.cpu_ns.load(Ordering::Relaxed) as f64 / 1e6,
            transition_cpu_ms: stats.transition_cpu_ns.load(Ordering::Relaxed) as f64 / 1e6,
            kernel: self.kernel.as_ref().map(KernelBreakdown::report),
            gpus: self.gpus.values().map(|g| g.report.clone()).collect(),
            ..all
        }
    }

    /// Each GPU with a policy and its state now (as the reaction thread last reported it).
    pub fn states(&self) -> Vec<(GpuId, State)> {
        self.gpus.iter().filter_map(|(&g, a)| a.state.map(|s| (g, s))).collect()
    }
}
