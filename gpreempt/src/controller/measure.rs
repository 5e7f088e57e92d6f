//! The `gpreempt preempt` measurement: per iteration suspend → hold → resume → gap, run on the
//! thread that owns the [`Session`] (holds and gaps are the session's `ppoll`), one record per
//! iteration into a preallocated buffer, and the run's statistics.

use std::{
    os::fd::BorrowedFd,
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use serde::Serialize;

use crate::{
    clock::monotonic_ns,
    controller::{
        session::{Session, Tally, Wake},
        vocabulary::{DebugError, Selection, SessionNotice, SharedError},
    },
    domain::{GpuId, HostPid},
    kfd::uapi::QueueSnapshotEntry,
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
    /// Queues the target created during the hold, snapshotted and suspended within it.
    pub late_suspended: u32,
    /// How long the queues were actually held, ms (suspend return → resume call, the watchdog's
    /// if it resumed them).
    pub held_ms: f64,
    /// The watchdog resumed the queues: the hold outlived `max_suspend`.
    pub watchdog: bool,
    /// CLOCK_MONOTONIC when SUSPEND_QUEUES returned and when RESUME_QUEUES was called, ns (to
    /// line iterations up with other observers of the same machine).
    pub suspended_at_ns: u64,
    pub resumed_at_ns: u64,
    /// CLOCK_MONOTONIC when SUSPEND_QUEUES was called and RESUME_QUEUES returned, ns: with the two
    /// above, the windows the driver's spans of this iteration fall in.
    pub suspend_called_ns: u64,
    pub resume_returned_ns: u64,
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
    /// The suspend and resume spans of `offline` that lie within the iteration's ioctl windows
    /// (the last of each kind in its window wins: a retried suspend is two calls, the second is
    /// the one that counted).
    pub fn of_iteration(spans: &[Span], it: &Iteration, offline: HostPid, online: Option<HostPid>) -> Option<Self> {
        let within = |s: &Span, from: u64, to: u64| s.start_ns >= from && s.end_ns <= to;
        let call = |kind: SpanKind, from: u64, to: u64| {
            spans
                .iter()
                .rev()
                .find(|s| s.kind == kind && s.target_pid == Some(offline) && within(s, from, to))
                .map(|s| KernelCall::of(s, online))
        };
        let side = Self {
            suspend: call(SpanKind::Suspend, it.suspend_called_ns, it.suspended_at_ns),
            resume: call(SpanKind::Resume, it.resumed_at_ns, it.resume_returned_ns),
        };
        (side.suspend.is_some() || side.resume.is_some()).then_some(side)
    }
}

impl KernelCall {
    fn of(s: &Span, online: Option<HostPid>) -> Self {
        let f = s.driver_figures(|p| Some(p) == online);
        let phases = f.phases.unwrap_or_default();
        KernelCall {
            duration_us: f.duration_us,
            unmap_us: phases.unmap_us,
            fence_wait_us: phases.fence_wait_us,
            remap_us: phases.remap_us,
            gpus: f.gpus,
            collateral_queues: f.collateral_queues,
            collateral_pids: f.collateral_pids,
            online_queues: f.collateral_online_queues,
        }
    }
}

/// Why a run ended before `Plan::iterations`. Serialised as `"interrupted"` or the error's text.
#[derive(Clone, Debug, PartialEq)]
pub enum StopReason {
    /// Ctrl-C / SIGTERM.
    Interrupted,
    /// The target exited or an ioctl failed (shared: a run's record and its summary both hold it).
    Failed(SharedError),
    /// Every offline target of a group left (exited or failed).
    AllTargetsGone,
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Interrupted => f.write_str("interrupted"),
            Self::Failed(why) => why.fmt(f),
            Self::AllTargetsGone => f.write_str("every offline target is gone"),
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
    pub notices: Vec<SessionNotice>,
    pub stopped: Option<StopReason>,
    /// The CWSR save areas behind each suspend, from the snapshot taken before the first one.
    pub cwsr: Option<CwsrAtStake>,
}

/// The CWSR save areas of the queues a suspend covers: the most wave state (plus control stack)
/// one suspend can make the GPU write to memory. Each queue's area is what its runtime allocated
/// and passed to CREATE_QUEUE (`ctx_save_restore_area_size` in GET_QUEUE_SNAPSHOT's entry,
/// kfd_ioctl.h, KFD 1.13+); how much of it a suspend fills depends on the waves resident then.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CwsrAtStake {
    pub queues: u32,
    pub bytes: u64,
}

impl CwsrAtStake {
    /// Over the entries of `snapshot` that `selection` covers; `None` when it covers none.
    pub fn of(snapshot: &[QueueSnapshotEntry], selection: &Selection) -> Option<Self> {
        let covered = snapshot.iter().filter(|e| match selection {
            Selection::All => true,
            Selection::Gpu(gpu) => e.gpu_id == gpu.0,
            Selection::Ids(ids) => ids.iter().any(|id| id.0 == e.queue_id),
        });
        let at_stake = covered.fold(Self::default(), |a, e| Self {
            queues: a.queues + 1,
            bytes: a.bytes + u64::from(e.ctx_save_restore_area_size),
        });
        (at_stake.queues > 0).then_some(at_stake)
    }

    /// Before a run: one snapshot that clears nothing (the suspends' own snapshots do that).
    pub fn before_run(session: &mut Session, selection: &Selection) -> Option<Self> {
        session.snapshot(false).ok().and_then(|snap| Self::of(snap, selection))
    }
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
    /// Bytes of CWSR save area behind each suspend.
    pub cwsr: Option<CwsrAtStake>,
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
            cwsr: self.cwsr,
        }
    }
}

/// One cycle as the timing loop records it: the two tallies as the session returned them. The
/// [`Iteration`] (µs, verdicts, JSON shape) is built from it after the run, off the per-cycle path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cycle {
    pub index: u32,
    pub suspend: Tally,
    pub resume: Tally,
    /// Queues created during the hold and suspended within it.
    pub late: u32,
    /// `resume` is the watchdog's: the hold outlived `max_suspend`.
    pub watchdog: bool,
}

impl Cycle {
    /// CLOCK_MONOTONIC when the cycle's RESUME_QUEUES returned (or was found unnecessary), ns.
    #[inline(always)]
    pub fn ended_ns(&self) -> u64 {
        self.resume.returned_ns
    }

    /// The cycle's record; a watchdog resume (the hold outlived `max_suspend`) spoils it.
    pub fn iteration(&self) -> Iteration {
        let mut it = record(self.index, &self.suspend, &self.resume, self.late);
        if self.watchdog {
            it.watchdog = true;
            it.ok = false;
            // The loop's own resume then found nothing left to resume.
            it.resume_us = None;
            it.resumed = 0;
        }
        it
    }
}

/// Run the plan on the session's thread. Returns early — with what was recorded so far and the
/// reason — when `stop` is set or a fd of `wake` becomes readable (Ctrl-C), the target exits, or
/// an ioctl fails; queues are never left suspended by this function (a failed iteration's resume
/// is attempted before returning; the session's detach does the rest).
///
/// Per cycle: SUSPEND_QUEUES, the hold, RESUME_QUEUES, the gap, and a [`Cycle`] into a buffer
/// sized before the loop; the [`Iteration`]s are built after it. A hold or gap of zero costs no
/// system call (the session looks at its fds when SIGCHLD or SIGIO says so, or once a second);
/// `on_cycle` (progress, the tracer's draining) is the caller's to keep cheap.
pub fn run(
    session: &mut Session,
    plan: &Plan,
    stop: &AtomicBool,
    wake: &[BorrowedFd<'_>],
    mut on_cycle: impl FnMut(&Cycle),
) -> Run {
    // Sized for the plan (bounded: a run of millions grows the buffer now and then), and every
    // page of it touched now: a first-touch page fault inside the loop would land in one cycle
    // out of a few dozen, on any machine.
    let capacity = plan.iterations.min(100_000) as usize;
    let mut cycles: Vec<Cycle> = Vec::with_capacity(capacity);
    cycles.resize(capacity, Cycle::default());
    cycles.clear();
    let (hold_ns, gap_ns) = (plan.hold.as_nanos() as u64, plan.gap.as_nanos() as u64);
    let cwsr = CwsrAtStake::before_run(session, &plan.selection);
    let mut stopped = None;
    let mut index = 0;
    while index < plan.iterations {
        if stop.load(Ordering::Relaxed) {
            stopped = Some(StopReason::Interrupted);
            break;
        }
        let suspend = match session.suspend_tally(&plan.selection, plan.grace_period) {
            Ok(t) => t,
            Err(e) => {
                stopped = Some(failed(e));
                break;
            }
        };
        // Hold even when interrupted only as long as it takes to notice; resume comes first.
        let paused = match pause(session, suspend.returned_ns, hold_ns, stop, wake) {
            Ok(p) => p,
            Err(e) => {
                stopped = Some(failed(e));
                break;
            }
        };
        let late = session.late_suspended();
        let (resume, watchdog) = match session.resume_held() {
            Ok(r) => r,
            Err(e) => {
                stopped = Some(failed(e));
                break;
            }
        };
        let end = resume.returned_ns;
        cycles.push(Cycle { index, suspend, resume, late, watchdog });
        if let Some(c) = cycles.last() {
            on_cycle(c);
        }
        index += 1;
        if paused == Pause::Interrupted || stop.load(Ordering::Relaxed) {
            stopped = Some(StopReason::Interrupted);
            break;
        }
        if index < plan.iterations {
            match pause(session, end, gap_ns, stop, wake) {
                Ok(Pause::Interrupted) => {
                    stopped = Some(StopReason::Interrupted);
                    break;
                }
                Ok(_) => {}
                Err(e) => {
                    stopped = Some(failed(e));
                    break;
                }
            }
        }
    }
    Run { iterations: cycles.iter().map(Cycle::iteration).collect(), notices: session.notices(), stopped, cwsr }
}

#[cold]
fn failed(e: DebugError) -> StopReason {
    StopReason::Failed(e.into())
}

/// How a hold or a gap ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pause {
    Elapsed,
    Interrupted,
    /// The watchdog resumed the queues.
    Watchdog,
}

/// Wait `length_ns` from `from_ns` (CLOCK_MONOTONIC), servicing the session.
#[inline(always)]
fn pause(
    session: &mut Session,
    from_ns: u64,
    length_ns: u64,
    stop: &AtomicBool,
    wake: &[BorrowedFd<'_>],
) -> Result<Pause, DebugError> {
    let deadline_ns = from_ns + length_ns;
    let mut now_ns = from_ns;
    loop {
        match session.wait_ns(deadline_ns, now_ns, wake)? {
            Wake::Deadline => return Ok(Pause::Elapsed),
            Wake::Ready(_) => return Ok(Pause::Interrupted),
            Wake::Watchdog => return Ok(Pause::Watchdog),
            Wake::Target => {}
        }
        if stop.load(Ordering::Relaxed) {
            return Ok(Pause::Interrupted);
        }
        now_ns = monotonic_ns();
    }
}

#[inline]
fn record(index: u32, suspend: &Tally, resume: &Tally, late_suspended: u32) -> Iteration {
    let us = |t: &Tally| (!t.skipped).then_some(t.latency_ns as f64 / 1e3);
    let held_to = if resume.skipped { resume.returned_ns } else { resume.called_ns };
    Iteration {
        index,
        suspend_us: us(suspend),
        resume_us: us(resume),
        suspended: suspend.count,
        invalid: suspend.invalid as usize,
        error: (suspend.error + resume.error) as usize,
        retried: suspend.retried,
        resumed: resume.count,
        late_suspended,
        held_ms: held_to.saturating_sub(suspend.returned_ns) as f64 / 1e6,
        watchdog: false,
        suspended_at_ns: suspend.returned_ns,
        resumed_at_ns: resume.called_ns,
        suspend_called_ns: suspend.called_ns,
        resume_returned_ns: resume.returned_ns,
        kernel: None,
        // A queue the driver reset (gone) makes the cycle not ok, without counting as an error.
        ok: !suspend.skipped && suspend.invalid == 0 && suspend.error == 0 && suspend.reset == 0 && resume.error == 0,
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
    use crate::domain::QueueId;

    /// A tally of `count` handled ids (`invalid`, `error` more), ioctl from `at` for `ns`.
    fn tally(count: i32, invalid: u32, error: u32, at: u64, ns: u64) -> Tally {
        Tally {
            count,
            done: count as u32,
            invalid,
            error,
            reset: 0,
            retried: 0,
            latency_ns: ns,
            called_ns: at,
            returned_ns: at + ns,
            skipped: false,
        }
    }

    #[test]
    fn the_cwsr_at_stake_sums_the_covered_queues_save_areas() {
        let entry = |queue_id, gpu_id, size| QueueSnapshotEntry {
            queue_id,
            gpu_id,
            ctx_save_restore_area_size: size,
            ..QueueSnapshotEntry::default()
        };
        let snap = [entry(0, 0x1000, 0x30_0000), entry(1, 0x2000, 0x20_0000), entry(2, 0x1000, 0x30_0000)];
        assert_eq!(CwsrAtStake::of(&snap, &Selection::All), Some(CwsrAtStake { queues: 3, bytes: 0x80_0000 }));
        assert_eq!(
            CwsrAtStake::of(&snap, &Selection::Gpu(GpuId(0x1000))),
            Some(CwsrAtStake { queues: 2, bytes: 0x60_0000 })
        );
        assert_eq!(
            CwsrAtStake::of(&snap, &Selection::Ids(vec![QueueId(1)])),
            Some(CwsrAtStake { queues: 1, bytes: 0x20_0000 })
        );
        assert_eq!(CwsrAtStake::of(&snap, &Selection::Gpu(GpuId(0x3000))), None);
        assert_eq!(CwsrAtStake::of(&[], &Selection::All), None);
    }

    #[test]
    fn iterations_record_counts_verdicts_and_windows() {
        let good = record(0, &tally(2, 0, 0, 1_000_000, 12_500), &tally(2, 0, 0, 101_212_500, 8_000), 0);
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
                late_suspended: 0,
                held_ms: 100.2,
                watchdog: false,
                suspended_at_ns: 1_012_500,
                resumed_at_ns: 101_212_500,
                suspend_called_ns: 1_000_000,
                resume_returned_ns: 101_220_500,
                kernel: None,
                ok: true
            }
        );
        // The real driver without a GPU: both ids come back INVALID and the ioctl returns 0.
        let no_gpu = record(1, &tally(0, 2, 0, 0, 3_000), &Tally::default(), 0);
        assert_eq!((no_gpu.suspended, no_gpu.invalid, no_gpu.ok), (0, 2, false));
        let skipped = record(2, &Tally { skipped: true, ..Tally::default() }, &Tally::default(), 0);
        assert!(!skipped.ok);
        assert_eq!(skipped.suspend_us, None);
        // Queues created mid-hold are counted apart and do not spoil the iteration.
        let late = record(3, &tally(1, 0, 0, 0, 10), &tally(2, 0, 0, 50, 10), 1);
        assert_eq!((late.suspended, late.late_suspended, late.resumed, late.ok), (1, 1, 2, true));
    }

    #[test]
    fn summary_counts_successes() {
        let run = Run {
            iterations: vec![
                record(0, &tally(1, 0, 0, 0, 10_000), &tally(1, 0, 0, 20_000, 5_000), 0),
                record(1, &tally(0, 1, 0, 40_000, 30_000), &tally(0, 0, 0, 80_000, 7_000), 0),
            ],
            notices: vec![],
            stopped: Some(StopReason::Interrupted),
            cwsr: None,
        };
        let s = run.summary(5);
        assert_eq!((s.planned, s.completed, s.ok, s.success_rate), (5, 2, 1, 0.5));
        assert_eq!(serde_json::to_value(&s).unwrap()["stopped"], "interrupted");
        let su = s.suspend_us.unwrap();
        assert_eq!((su.count, su.min, su.max, su.p50), (2, 10.0, 30.0, 10.0));
        assert_eq!(s.stopped, Some(StopReason::Interrupted));
        assert_eq!(
            StopReason::Failed(DebugError::TargetExited { pid: HostPid(7), code: 3 }.into()).to_string(),
            "pid 7 exited (status 3) during the debug session"
        );
    }

    #[test]
    fn the_kernel_side_is_the_offline_spans_inside_each_iteration_s_ioctl_windows() {
        use crate::model::{registry::Collateral, spans::Breakdown};
        let span = |kind, pid, start_ns: u64, fence_ns, collateral: Vec<(u32, u32)>| Span {
            kind,
            target_pid: Some(HostPid(pid)),
            gpu_id: None,
            start_ns,
            end_ns: start_ns + 8_000,
            duration_ns: 8_000,
            trigger: None,
            queues: vec![QueueId(0), QueueId(1)],
            rejected: vec![],
            collateral: collateral
                .into_iter()
                .map(|(pid, queue_id)| Collateral {
                    pid: HostPid(pid),
                    queue_id: QueueId(queue_id),
                    context_id: None,
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
        // Two iterations: suspend [0, 10 µs], resume [20, 30]; suspend [100, 110], resume [120, 130].
        let first = record(0, &tally(2, 0, 0, 0, 10_000), &tally(2, 0, 0, 20_000, 10_000), 0);
        let second = record(1, &tally(2, 0, 0, 100_000, 10_000), &tally(2, 0, 0, 120_000, 10_000), 0);
        let spans = vec![
            span(SpanKind::Suspend, 99, 1_000, 1, vec![]), // another target's
            span(SpanKind::Suspend, 7, 1_000, 5_000, vec![(8, 0), (8, 1), (9, 0)]),
            span(SpanKind::Resume, 7, 21_000, 4_000, vec![(8, 0)]),
            span(SpanKind::Suspend, 7, 101_000, 7_000, vec![]),
            // The second iteration's resume span is missing (a lost record): nothing else may
            // stand in for it.
        ];
        let k = KernelSide::of_iteration(&spans, &first, HostPid(7), Some(HostPid(8))).unwrap();
        let s = k.suspend.unwrap();
        assert_eq!((s.duration_us, s.unmap_us, s.fence_wait_us, s.remap_us), (8.0, 6.0, 5.0, 1.5));
        assert_eq!((s.collateral_queues, s.collateral_pids, s.online_queues), (3, vec![HostPid(8), HostPid(9)], 2));
        assert_eq!(k.resume.unwrap().online_queues, 1);
        let k2 = KernelSide::of_iteration(&spans, &second, HostPid(7), Some(HostPid(8))).unwrap();
        assert_eq!((k2.suspend.unwrap().fence_wait_us, k2.resume), (7.0, None));
        assert_eq!(KernelSide::of_iteration(&spans, &first, HostPid(5), None), None);

        let mut it = first.clone();
        it.kernel = KernelSide::of_iteration(&spans, &first, HostPid(7), Some(HostPid(8)));
        let run = Run { iterations: vec![it], notices: vec![], stopped: None, cwsr: None };
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
