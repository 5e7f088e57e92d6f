//! What the scheduler reports: every [`ScheduleEvent`] as it happens, the periodic
//! [`Interval`] and the end-of-run [`ScheduleReport`]. Their JSON is the output of
//! `gpreempt schedule --json` and what the agent and `top` read.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    arrival::report::ArrivalReport,
    doorbell::target::ProbePoint,
    hints::HintCounts,
    kernel::KernelReport,
    policy::{ResumeReason, State},
    realtime::Realtime,
};
use crate::{
    controller::vocabulary::{Detached, SharedError},
    domain::{GpuId, HostPid, QueueId, TransitionKind},
    stats::Summary as Stats,
};

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// One suspend or resume of one GPU's offline queues.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Transition {
    /// Milliseconds since start.
    pub t_ms: f64,
    pub gpu_id: GpuId,
    pub action: TransitionKind,
    /// Why a resume happened (`None` for a suspend).
    pub reason: Option<ResumeReason>,
    /// Time in the ioctls, every offline process together, µs.
    pub latency_us: f64,
    /// Suspend only: online work first seen → SUSPEND returned, µs.
    pub reaction_us: Option<f64>,
    /// Suspend only: the last poll that saw the GPU free of online work → SUSPEND entering the
    /// kernel, µs (an upper bound of online work published → suspend).
    pub detection_us: Option<f64>,
    /// Queues suspended or resumed.
    pub queues: i64,
    /// Offline processes an ioctl was issued for.
    pub ioctls: u32,
    /// Offline processes counted as held with no ioctl: nothing of theirs on the GPU (suspended
    /// at their first submission instead), or already held by their gang (`--gang`).
    #[serde(skip_serializing_if = "is_zero")]
    pub held_no_ioctl: u32,
    /// Offline processes the ioctl failed for, with the error.
    pub errors: Vec<TransitionError>,
}

impl Transition {
    /// A suspend that left the GPU held: queues suspended, or processes held with no ioctl.
    pub fn holds(&self) -> bool {
        self.action == TransitionKind::Suspend && (self.queues > 0 || self.held_no_ioctl > 0)
    }
}

/// One offline process a transition's ioctl failed for.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TransitionError {
    pub pid: HostPid,
    pub error: SharedError,
}

impl std::fmt::Display for TransitionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {}: {}", self.pid, self.error)
    }
}

impl Transition {
    /// The failures, one line: `pid N: why; pid M: why`.
    pub fn errors_line(&self) -> String {
        self.errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    }
}

/// One GPU in a periodic report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuInterval {
    pub gpu_id: GpuId,
    pub state: State,
    /// Share of the interval this GPU's offline queues were suspended.
    pub suspended_share: f64,
    /// Offline dispatches started on this GPU in the interval (read indices).
    pub offline_dispatches: u64,
}

/// A periodic report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Interval {
    pub t_ms: f64,
    pub online_processes: usize,
    pub offline_processes: usize,
    /// Transitions so far, every GPU.
    pub transitions: u64,
    pub reaction_p99_us: Option<f64>,
    /// The reaction thread's step interval so far: p50, p99 and the maximum, µs.
    pub loop_step_p50_us: Option<f64>,
    pub loop_step_p99_us: Option<f64>,
    pub loop_step_max_us: Option<f64>,
    /// Offline dispatches started in the interval, every GPU.
    pub offline_dispatches: u64,
    pub gpus: Vec<GpuInterval>,
}

/// One GPU over the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuReport {
    pub gpu_id: GpuId,
    /// A policy ran for it (online work was seen on it).
    pub scheduled: bool,
    pub suspends: u64,
    pub resumes: u64,
    pub resumes_by_reason: BTreeMap<ResumeReason, u64>,
    /// Idle resumes skipped because the gap was predicted shorter than the transitions cost.
    pub resumes_skipped: u64,
    /// The idle threshold in force at the last resume for idleness, µs: learnt from the online
    /// gaps (the valley between gaps inside a request and between requests) or `--idle`.
    pub idle_threshold_us: Option<f64>,
    pub failed_suspends: u64,
    pub suspended_ms: f64,
    pub suspended_share: f64,
    pub reaction_us: Option<Stats>,
    pub detection_us: Option<Stats>,
    pub suspend_us: Option<Stats>,
    pub resume_us: Option<Stats>,
    pub offline_dispatches: u64,
    pub offline_rate_running_per_s: Option<f64>,
    pub offline_rate_overall_per_s: Option<f64>,
}

/// The end-of-run report; the top-level figures cover every GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ScheduleReport {
    pub elapsed_ms: f64,
    pub suspends: u64,
    pub resumes: u64,
    pub resumes_by_reason: BTreeMap<ResumeReason, u64>,
    pub resumes_skipped: u64,
    /// Suspends that failed for every offline process.
    pub failed_suspends: u64,
    /// Summed over GPUs.
    pub suspended_ms: f64,
    /// Mean over the GPUs with a policy.
    pub suspended_share: f64,
    pub reaction_us: Option<Stats>,
    pub detection_us: Option<Stats>,
    /// Of the detections, those the doorbell probe saw: the store itself → the first SUSPEND
    /// entering the kernel (exact; the others are bounded by the last quiet poll).
    pub detection_doorbell_us: Option<Stats>,
    /// Per hit of the probe: the store → the start of the reaction thread's step that took it
    /// (the wake-up's share of `detection_doorbell_us`).
    pub doorbell_wake_us: Option<Stats>,
    /// Waits on the doorbell probe while the online side was idle and covered, and of them those
    /// a store or a command ended (the rest ended at the cross-check).
    pub doorbell_waits: u64,
    pub doorbell_wakes: u64,
    /// Offline processes a suspend found with nothing on its GPU (held there with no ioctl), and
    /// of them those suspended later within the hold, at their first submission.
    pub offline_deferred: u64,
    pub offline_late_suspends: u64,
    /// Resumes of several offline processes stopped between two RESUMEs because online work was
    /// published meanwhile (the rest stayed held and the next suspend held them with no ioctl).
    pub resumes_cut_short: u64,
    /// `--runnable`: offline processes parked and unparked (their turn to run).
    pub offline_parks: u64,
    pub offline_unparks: u64,
    /// `--runnable auto`: one more offline process made runnable on a GPU (those running left it
    /// idle), and one fewer (they kept it busy).
    pub runnable_raised: u64,
    pub runnable_lowered: u64,
    /// Per online queue the probe filtered on, its stores (queues gone before the end included).
    pub doorbell_stores: Vec<DoorbellCount>,
    /// Per online process the arrival probe watched (or could not), what it saw and how each
    /// request's pending hold ended (processes gone before the end included).
    pub arrival: Vec<ArrivalReport>,
    pub suspend_us: Option<Stats>,
    pub resume_us: Option<Stats>,
    /// Online dispatch delay estimated from the indices: first seen pending → consumed, µs.
    pub online_dispatch_delay_us: Option<Stats>,
    /// Offline dispatches started (read indices), in total and per second.
    pub offline_dispatches: u64,
    pub offline_rate_running_per_s: Option<f64>,
    pub offline_rate_overall_per_s: Option<f64>,
    /// Steps of the reaction thread, and the interval between their starts (µs) over the steps
    /// that made no suspend, resume or attach (the poll's cadence; `transition_steps` were left
    /// out: their length is their ioctls', reported as the transitions' latency).
    pub polls: u64,
    pub loop_step_us: Option<Stats>,
    pub transition_steps: u64,
    pub realtime: Realtime,
    /// Reports the reaction thread dropped because this side fell behind.
    pub reports_dropped: u64,
    /// The reaction thread panicked (its sessions resumed and detached while it unwound).
    pub reaction_panicked: bool,
    pub hints: Option<HintCounts>,
    /// Runlist refreshes caused by attaching (ENABLE and DISABLE of offline sessions, online snapshots).
    pub attach_refreshes: u64,
    /// Offline queues the driver reset (gone, not failed suspends), in the order reported.
    pub queues_reset: Vec<ResetQueue>,
    /// This process's CPU time (user + system), ms, and as a share of the elapsed time.
    pub cpu_ms: f64,
    pub cpu_share: f64,
    /// Of it, the reaction thread's, ms; and of that, the time inside suspend and resume
    /// transitions (the debug-trap ioctls, whose driver work runs on the calling thread), ms.
    /// The rest of the reaction thread's CPU is its polling.
    pub reaction_cpu_ms: f64,
    pub transition_cpu_ms: f64,
    /// What the driver did for the suspends and resumes, when the tracer is attached.
    pub kernel: Option<KernelReport>,
    pub gpus: Vec<GpuReport>,
}

/// The doorbell stores the probe counted on one online queue over its watch (exact: every call
/// of the runtime's store exports on the queue's doorbell signal, by any thread of the process).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DoorbellCount {
    pub pid: HostPid,
    pub queue_id: QueueId,
    pub gpu_id: GpuId,
    pub stores: u64,
}

/// Why an offline process was detached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DetachReason {
    /// It exited.
    Exited,
    /// The scheduler stopped.
    Stopped,
}

impl DetachReason {
    /// The name used in the output, printed and serialised.
    pub fn name(self) -> &'static str {
        match self {
            Self::Exited => "exited",
            Self::Stopped => "stopped",
        }
    }
}

impl std::fmt::Display for DetachReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for DetachReason {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// How online submissions reach the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DetectionPath {
    /// The doorbell probe: the submission itself, stamped in the kernel.
    Doorbell,
    /// The dispatch indices, read every `--poll`: the submission is bounded by the last quiet poll.
    Poll,
}

/// An offline process's queue the driver reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ResetQueue {
    pub pid: HostPid,
    pub queue_id: QueueId,
}

/// Everything the scheduler reports.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ScheduleEvent {
    /// An offline process is attached (kept attached until it exits or the scheduler stops).
    OfflineAttached {
        pid: HostPid,
        comm: String,
        queues: usize,
        /// Its GPUs (those of its queues), sorted.
        gpus: Vec<GpuId>,
        picked_up: bool,
    },
    /// An offline process could not be attached (picked up later: it is skipped).
    OfflineAttachFailed {
        pid: HostPid,
        error: String,
    },
    OfflineDetached {
        pid: HostPid,
        reason: DetachReason,
        detached: Detached,
    },
    /// A held offline process created queues on a held GPU: they are suspended too.
    OfflineQueuesHeld {
        pid: HostPid,
        queues: u32,
    },
    /// The driver reset these queues of an offline process after they failed a preemption
    /// (gfx9 per-queue reset: seen by the tracer, since SUSPEND_QUEUES counts such a queue
    /// suspended; or a SUSPEND's ERROR). They are gone — not failed suspends — and never
    /// suspended or resumed again; its other queues go on being held (docs/kfd.md §2.4).
    OfflineQueuesReset {
        pid: HostPid,
        queues: Vec<QueueId>,
    },
    /// An online process is watched; `snapshot`: its existing queues were learnt with one
    /// debug-trap snapshot (ENABLE, GET_QUEUE_SNAPSHOT, DISABLE: two runlist refreshes).
    OnlineAdded {
        pid: HostPid,
        queues: usize,
        snapshot: bool,
        occupancy_files: usize,
    },
    /// How the online process's submissions are seen: `doorbell` (the probe is attached to the
    /// runtime libraries it maps; the index poll cross-checks) or `poll` (the dispatch indices
    /// every `--poll`; `why` says why not the probe). `probes`: where each uprobe sits (the
    /// export's implementation, one trap per store, or the export itself; `doorbell::target`).
    OnlineSeenBy {
        pid: HostPid,
        path: DetectionPath,
        libraries: Vec<String>,
        probes: Vec<ProbePoint>,
        why: Option<String>,
    },
    /// What the arrival probe sees of an online process: the TCP `ports` it watches in `cgroup`
    /// (a request to one opens a pending hold before its first kernel), or `why` not (its
    /// requests are then seen at their first GPU work). Said again when it changes (a server that
    /// opens its port after its first queue).
    OnlineArrival {
        pid: HostPid,
        ports: Vec<u16>,
        cgroup: Option<String>,
        why: Option<String>,
    },
    OnlineQueue {
        pid: HostPid,
        queue_id: QueueId,
        gpu_id: GpuId,
    },
    OnlineGone {
        pid: HostPid,
    },
    Transition(Transition),
    /// A GPU's idle resume was skipped: the rest of the online gap is predicted shorter than
    /// what a resume and the next suspend cost the online job (said once per gap).
    ResumeSkipped {
        t_ms: f64,
        gpu_id: GpuId,
        idle_us: f64,
        predicted_gap_us: f64,
        cost_us: f64,
        /// Recorded gaps the prediction rests on.
        evidence: usize,
    },
    Interval(Interval),
    /// A hint line that is not `begin` or `end` (ignored).
    HintMalformed {
        line: String,
        count: u64,
    },
    /// A session's own watchdog resumed an offline process's queues: they had been held `held_ms`,
    /// past the session's `max_suspend`, because the reaction thread stalled. `still_held`
    /// offline processes remain suspended.
    WatchdogResumed {
        t_ms: f64,
        pid: HostPid,
        held_ms: u64,
        still_held: usize,
    },
    Warning {
        message: String,
    },
    Summary(Box<ScheduleReport>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_names_transitions_and_resume_reasons_as_before() {
        let t = Transition {
            t_ms: 1.5,
            gpu_id: GpuId(0x1000),
            action: TransitionKind::Resume,
            reason: Some(ResumeReason::MinShare),
            latency_us: 40.0,
            reaction_us: None,
            detection_us: None,
            queues: 2,
            ioctls: 1,
            held_no_ioctl: 0,
            errors: Vec::new(),
        };
        let json = serde_json::to_value(ScheduleEvent::Transition(t)).unwrap();
        assert_eq!((json["event"].as_str(), json["action"].as_str()), (Some("transition"), Some("resume")));
        assert_eq!(json["reason"], "min_share");
        let report = ScheduleReport {
            resumes_by_reason: BTreeMap::from([(ResumeReason::Idle, 3), (ResumeReason::OnlineGone, 1)]),
            ..ScheduleReport::default()
        };
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["resumes_by_reason"], serde_json::json!({"idle": 3, "online_gone": 1}));
    }
}
