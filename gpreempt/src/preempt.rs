//! The `gpreempt preempt` measurement: per iteration suspend → hold → resume → gap on an attached
//! [`Debugger`], one record per iteration, and the run's statistics.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use serde::Serialize;

use crate::{
    domain::{GpuId, HostPid},
    kfd::debugger::{Batch, DebugError, Debugger, Notice, Selection},
    model::spans::{Span, SpanKind},
    stats::{self, Bucket, Summary},
};

/// What to do.
#[derive(Clone, Debug)]
pub struct Plan {
    pub iterations: u32,
    pub hold: Duration,
    pub gap: Duration,
    /// SUSPEND_QUEUES `grace_period` (units of 1000 GPU cycles on HWS; ignored by MES).
    pub grace_period: u32,
    pub selection: Selection,
}

/// One suspend/resume cycle.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Iteration {
    pub index: u32,
    /// Time in the SUSPEND_QUEUES ioctl(s), µs (`None` if no ioctl was made).
    pub suspend_us: Option<f64>,
    /// Time in the RESUME_QUEUES ioctl, µs.
    pub resume_us: Option<f64>,
    /// Queues the kernel suspended (its return value).
    pub suspended: i32,
    pub invalid: usize,
    pub error: usize,
    /// INVALID ids retried after a re-snapshot.
    pub retried: u32,
    /// Queues the kernel resumed.
    pub resumed: i32,
    /// How long the queues were actually held, ms (suspend return → resume call).
    pub held_ms: f64,
    /// CLOCK_MONOTONIC when SUSPEND_QUEUES returned and when RESUME_QUEUES was called, ns (to
    /// line iterations up with other observers of the same machine).
    pub suspended_at_ns: u64,
    pub resumed_at_ns: u64,
    /// What the driver did, from the in-process tracer (absent when it could not attach).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelSide>,
    /// Every requested queue was suspended and resumed, none INVALID or ERROR.
    pub ok: bool,
}

/// The kernel's side of one iteration, from the tracer's suspend/resume spans.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct KernelSide {
    pub suspend: Option<KernelCall>,
    pub resume: Option<KernelCall>,
}

/// One `suspend_queues` / `resume_queues` inside the driver.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct KernelCall {
    pub duration_us: f64,
    /// `unmap_queues_cpsch` (or MES remove), fence wait included.
    pub unmap_us: f64,
    /// `amdkfd_fence_wait_timeout`: the preemption (CWSR save) latency.
    pub fence_wait_us: f64,
    /// `map_queues_cpsch` (or MES add).
    pub remap_us: f64,
    pub gpus: Vec<GpuId>,
    /// Queues of other processes the device-wide unmap preempted.
    pub collateral_queues: usize,
    pub collateral_pids: Vec<HostPid>,
    /// Of those, the `--online` process's queues.
    pub online_queues: usize,
}

impl KernelSide {
    /// The suspend and resume spans of `offline` among `spans` (the last of each kind wins: a
    /// retried suspend is two calls, the second is the one that counted).
    pub fn from_spans(spans: &[Span], offline: HostPid, online: Option<HostPid>) -> Option<Self> {
        let call = |kind: SpanKind| {
            spans.iter().rev().find(|s| s.kind == kind && s.target_pid == Some(offline)).map(|s| {
                let us = |ns: u64| ns as f64 / 1e3;
                let b = s.breakdown.clone().unwrap_or_default();
                let mut pids: Vec<HostPid> = s.collateral.iter().map(|c| c.pid).collect();
                pids.sort_unstable();
                pids.dedup();
                KernelCall {
                    duration_us: us(s.duration_ns),
                    unmap_us: us(b.unmap_ns),
                    fence_wait_us: us(b.fence_wait_ns),
                    remap_us: us(b.remap_ns),
                    gpus: b.gpus,
                    collateral_queues: s.collateral.len(),
                    collateral_pids: pids,
                    online_queues: online.map_or(0, |o| s.collateral.iter().filter(|c| c.pid == o).count()),
                }
            })
        };
        let side = Self { suspend: call(SpanKind::Suspend), resume: call(SpanKind::Resume) };
        (side.suspend.is_some() || side.resume.is_some()).then_some(side)
    }
}

/// Why a run ended before `Plan::iterations`. Serialised as `"interrupted"` or the error's text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// Ctrl-C / SIGTERM.
    Interrupted,
    /// The target exited or an ioctl failed: the error's text.
    Failed(String),
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Interrupted => f.write_str("interrupted"),
            Self::Failed(why) => f.write_str(why),
        }
    }
}

impl Serialize for StopReason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Everything a run produced.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    pub iterations: Vec<Iteration>,
    pub notices: Vec<Notice>,
    pub stopped: Option<StopReason>,
}

/// Statistics of a run.
#[derive(Clone, Debug, Serialize)]
pub struct RunSummary {
    pub planned: u32,
    pub completed: usize,
    pub ok: usize,
    /// `ok / completed`, 0 when nothing completed.
    pub success_rate: f64,
    pub suspend_us: Option<Summary>,
    pub resume_us: Option<Summary>,
    pub suspend_histogram: Vec<Bucket>,
    pub resume_histogram: Vec<Bucket>,
    /// In-driver preemption latency of the suspends (fence wait), µs, when traced.
    pub fence_wait_us: Option<Summary>,
    /// Other processes' queues preempted by the suspends and resumes, in total, when traced.
    pub collateral_queues: Option<usize>,
    /// The `--online` process's queues among them.
    pub online_queues: Option<usize>,
    pub stopped: Option<StopReason>,
}

impl Run {
    pub fn summary(&self, planned: u32) -> RunSummary {
        let suspend: Vec<f64> = self.iterations.iter().filter_map(|i| i.suspend_us).collect();
        let resume: Vec<f64> = self.iterations.iter().filter_map(|i| i.resume_us).collect();
        let ok = self.iterations.iter().filter(|i| i.ok).count();
        let completed = self.iterations.len();
        let kernel: Vec<&KernelSide> = self.iterations.iter().filter_map(|i| i.kernel.as_ref()).collect();
        let calls = || kernel.iter().flat_map(|k| [&k.suspend, &k.resume]).flatten();
        let fence: Vec<f64> =
            kernel.iter().filter_map(|k| k.suspend.as_ref()).map(|c| c.fence_wait_us).filter(|&f| f > 0.0).collect();
        let traced = !kernel.is_empty();
        RunSummary {
            planned,
            completed,
            ok,
            success_rate: if completed == 0 { 0.0 } else { ok as f64 / completed as f64 },
            suspend_us: Summary::of(&suspend),
            resume_us: Summary::of(&resume),
            suspend_histogram: stats::histogram(&suspend),
            resume_histogram: stats::histogram(&resume),
            fence_wait_us: Summary::of(&fence),
            collateral_queues: traced.then(|| calls().map(|c| c.collateral_queues).sum()),
            online_queues: traced.then(|| calls().map(|c| c.online_queues).sum()),
            stopped: self.stopped.clone(),
        }
    }
}

/// Run the plan. Returns early — with what was recorded so far and the reason — when `stop` is
/// set, the target exits, or an ioctl fails; queues are never left suspended by this function
/// (a failed iteration's resume is attempted before returning; the debugger's drop does the rest).
/// `observe` runs after each iteration's resume, before `progress` (the caller's tracer adds
/// [`Iteration::kernel`] there).
pub fn run(
    debugger: &Debugger,
    plan: &Plan,
    stop: &AtomicBool,
    mut observe: impl FnMut(&mut Iteration),
    mut progress: impl FnMut(&Iteration),
) -> Run {
    let mut run = Run { iterations: Vec::new(), notices: Vec::new(), stopped: None };
    for index in 0..plan.iterations {
        if stop.load(Ordering::Relaxed) {
            run.stopped = Some(StopReason::Interrupted);
            break;
        }
        match iteration(debugger, plan, index, stop) {
            Ok(mut it) => {
                observe(&mut it);
                progress(&it);
                run.iterations.push(it);
            }
            Err(e) => {
                run.stopped = Some(StopReason::Failed(e.to_string()));
                break;
            }
        }
        run.notices.extend(debugger.notices());
        if index + 1 < plan.iterations && !sleep_unless(stop, plan.gap) {
            run.stopped = Some(StopReason::Interrupted);
            break;
        }
    }
    run.notices.extend(debugger.notices());
    run
}

fn iteration(debugger: &Debugger, plan: &Plan, index: u32, stop: &AtomicBool) -> Result<Iteration, DebugError> {
    let suspend = debugger.suspend(plan.selection.clone(), plan.grace_period)?;
    let held_from = Instant::now();
    let suspended_at_ns = monotonic_ns();
    // Hold even when interrupted only as long as it takes to notice; resume comes first.
    sleep_unless(stop, plan.hold);
    let held_ms = held_from.elapsed().as_secs_f64() * 1e3;
    let resumed_at_ns = monotonic_ns();
    let resume = debugger.resume()?;
    let mut it = record(index, &suspend, &resume, held_ms);
    (it.suspended_at_ns, it.resumed_at_ns) = (suspended_at_ns, resumed_at_ns);
    Ok(it)
}

pub use crate::clock::monotonic_ns;

fn record(index: u32, suspend: &Batch, resume: &Batch, held_ms: f64) -> Iteration {
    let us = |b: &Batch| (!b.skipped).then_some(b.latency_ns as f64 / 1e3);
    Iteration {
        index,
        suspend_us: us(suspend),
        resume_us: us(resume),
        suspended: suspend.count,
        invalid: suspend.invalid(),
        error: suspend.error() + resume.error(),
        retried: suspend.retried,
        resumed: resume.count,
        held_ms,
        suspended_at_ns: 0,
        resumed_at_ns: 0,
        kernel: None,
        ok: !suspend.skipped && suspend.invalid() == 0 && suspend.error() == 0 && resume.error() == 0,
    }
}

/// Sleep `total` in short slices; false if `stop` was set meanwhile.
pub fn sleep_unless(stop: &AtomicBool, total: Duration) -> bool {
    const SLICE: Duration = Duration::from_millis(5);
    let end = Instant::now() + total;
    loop {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        thread::sleep(left.min(SLICE));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        domain::QueueId,
        kfd::debugger::{QueueOutcome, QueueResult},
    };

    fn batch(count: i32, results: &[QueueResult], ns: u64) -> Batch {
        Batch {
            count,
            outcomes: results
                .iter()
                .enumerate()
                .map(|(i, &result)| QueueOutcome {
                    queue_id: QueueId(i as u32),
                    invalid: result == QueueResult::Invalid,
                    error: result == QueueResult::Error,
                })
                .collect(),
            latency_ns: ns,
            retried: 0,
            skipped: false,
        }
    }

    #[test]
    fn iterations_record_counts_and_verdicts() {
        use QueueResult::*;
        let good = record(0, &batch(2, &[Done, Done], 12_500), &batch(2, &[Done, Done], 8_000), 100.2);
        assert_eq!(
            good,
            Iteration {
                index: 0,
                suspend_us: Some(12.5),
                resume_us: Some(8.0),
                suspended: 2,
                invalid: 0,
                error: 0,
                retried: 0,
                resumed: 2,
                held_ms: 100.2,
                suspended_at_ns: 0,
                resumed_at_ns: 0,
                kernel: None,
                ok: true
            }
        );
        // The real driver without a GPU: both ids come back INVALID and the ioctl returns 0.
        let no_gpu =
            record(1, &batch(0, &[Invalid, Invalid], 3_000), &Batch { skipped: true, ..Batch::default() }, 1.0);
        assert_eq!((no_gpu.suspended, no_gpu.invalid, no_gpu.resume_us, no_gpu.ok), (0, 2, None, false));
        let skipped = record(2, &Batch { skipped: true, ..Batch::default() }, &Batch::default(), 0.0);
        assert!(!skipped.ok);
        assert_eq!(skipped.suspend_us, None);
    }

    #[test]
    fn summary_counts_successes() {
        use QueueResult::*;
        let run = Run {
            iterations: vec![
                record(0, &batch(1, &[Done], 10_000), &batch(1, &[Done], 5_000), 1.0),
                record(1, &batch(0, &[Invalid], 30_000), &batch(0, &[], 7_000), 1.0),
            ],
            notices: vec![],
            stopped: Some(StopReason::Interrupted),
        };
        let s = run.summary(5);
        assert_eq!((s.planned, s.completed, s.ok, s.success_rate), (5, 2, 1, 0.5));
        assert_eq!(serde_json::to_value(&s).unwrap()["stopped"], "interrupted");
        let su = s.suspend_us.unwrap();
        assert_eq!((su.count, su.min, su.max, su.p50), (2, 10.0, 30.0, 10.0));
        assert_eq!(s.stopped, Some(StopReason::Interrupted));
        assert_eq!(StopReason::Failed("pid 7 exited".into()).to_string(), "pid 7 exited");
    }

    #[test]
    fn the_kernel_side_comes_from_the_offline_process_spans() {
        use crate::model::spans::{Breakdown, Collateral};
        let span = |kind, pid, fence_ns, collateral: Vec<(u32, u32)>| Span {
            kind,
            target_pid: Some(HostPid(pid)),
            gpu_id: None,
            start_ns: 1_000,
            end_ns: 9_000,
            duration_ns: 8_000,
            trigger: None,
            queues: vec![QueueId(0), QueueId(1)],
            rejected: vec![],
            collateral: collateral
                .into_iter()
                .map(|(pid, queue_id)| Collateral {
                    pid: HostPid(pid),
                    queue_id: QueueId(queue_id),
                    gpu_id: Some(GpuId(0x1000)),
                })
                .collect(),
            breakdown: Some(Breakdown {
                unmap_ns: 6_000,
                fence_wait_ns: fence_ns,
                remap_ns: 1_500,
                gpus: vec![GpuId(0x1000)],
            }),
            phases: vec![],
            open: false,
        };
        let spans = vec![
            span(SpanKind::Suspend, 99, 1, vec![]), // another target's
            span(SpanKind::Suspend, 7, 5_000, vec![(8, 0), (8, 1), (9, 0)]),
            span(SpanKind::Resume, 7, 4_000, vec![(8, 0)]),
        ];
        let k = KernelSide::from_spans(&spans, HostPid(7), Some(HostPid(8))).unwrap();
        let s = k.suspend.unwrap();
        assert_eq!((s.duration_us, s.unmap_us, s.fence_wait_us, s.remap_us), (8.0, 6.0, 5.0, 1.5));
        assert_eq!((s.collateral_queues, s.collateral_pids, s.online_queues), (3, vec![HostPid(8), HostPid(9)], 2));
        assert_eq!(k.resume.unwrap().online_queues, 1);
        assert_eq!(KernelSide::from_spans(&spans, HostPid(5), None), None);

        let mut it =
            record(0, &batch(2, &[QueueResult::Done; 2], 9_000), &batch(2, &[QueueResult::Done; 2], 9_000), 1.0);
        it.kernel = KernelSide::from_spans(&spans, HostPid(7), Some(HostPid(8)));
        let run = Run { iterations: vec![it], notices: vec![], stopped: None };
        let s = run.summary(1);
        assert_eq!(s.fence_wait_us.unwrap().p50, 5.0);
        assert_eq!((s.collateral_queues, s.online_queues), (Some(4), Some(3)));
    }

    #[test]
    fn sleeping_stops_early_when_asked() {
        let stop = AtomicBool::new(true);
        let t = Instant::now();
        assert!(!sleep_unless(&stop, Duration::from_secs(5)));
        assert!(t.elapsed() < Duration::from_secs(1));
        assert!(sleep_unless(&AtomicBool::new(false), Duration::from_millis(1)));
    }
}
