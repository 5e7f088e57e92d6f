//! What the reaction thread and the other threads tell each other: [`Command`]s in, [`Report`]s
//! out (each [`TransitionRecord`] among them).

use crate::{
    controller::vocabulary::{DebugError, Detached, SharedError},
    domain::{GpuId, HostPid, QueueId, TransitionKind},
    kfd::uapi::QueueSnapshotEntry,
    model::QueueAddrs,
    schedule::{
        arrival::report::ArrivalReport,
        doorbell::target::ProbePoint,
        events::{DetachReason, DetectionPath, DoorbellCount},
        offline::JobId,
        policy::{GapVerdict, ResumeReason},
        seams::Occupancy,
    },
};

/// What the other threads ask of the reaction thread.
#[derive(Debug)]
pub enum Command {
    /// Watch an online queue (its GPU's policy starts with the first one).
    OnlineQueue {
        pid: HostPid,
        addrs: QueueAddrs,
    },
    OnlineQueueGone {
        pid: HostPid,
        queue_id: QueueId,
    },
    /// The online process exited: its GPUs resume at once if nothing else is pending there.
    OnlineGone {
        pid: HostPid,
    },
    /// Attach an offline process on this thread (slow: a ptrace seize and a runlist refresh).
    AttachOffline {
        pid: HostPid,
        picked_up: bool,
        job: JobId,
    },
    /// The offline process exited: detach it.
    OfflineGone {
        pid: HostPid,
    },
    /// The tracer saw the driver reset one of its queues (`set_queue_as_reset`): gone, never
    /// suspended or resumed again.
    OfflineQueueReset {
        pid: HostPid,
        queue_id: QueueId,
    },
    /// An online process's occupancy reader for a GPU (see [`super::lane::Lane::occupancy`]).
    OnlineOccupancy {
        pid: HostPid,
        reader: Box<dyn Occupancy>,
    },
}

/// One suspend or resume of one GPU's offline queues, as the reaction thread records it: fixed
/// size, no allocation (the errors, rare, travel beside it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TransitionRecord {
    /// CLOCK_MONOTONIC when the last ioctl returned, ns.
    pub t_ns: u64,
    pub gpu: GpuId,
    pub kind: TransitionKind,
    pub reason: Option<ResumeReason>,
    /// Time in the ioctls, every offline process together, ns.
    pub latency_ns: u64,
    /// Suspend only: online work first seen → the suspend returned, ns.
    pub reaction_ns: Option<u64>,
    /// Suspend only: the last step that saw this GPU free of online work → the first SUSPEND
    /// entering the kernel, ns. The online work was published after that step, so this bounds
    /// the time from its publication to the suspend from above.
    pub detection_ns: Option<u64>,
    /// Queues suspended or resumed.
    pub queues: u32,
    /// Offline processes an ioctl was issued for.
    pub ioctls: u32,
    /// Offline processes counted as held with no ioctl: idle on the GPU (deferred, see
    /// [`crate::schedule::offline`]) or already held by their gang.
    pub held_no_ioctl: u32,
    /// Resume only: the idle threshold in force when it was decided (learnt or `--idle`), ns.
    pub idle_threshold_ns: Option<u64>,
}

/// What the reaction thread tells the other threads.
#[derive(Debug)]
pub enum Report {
    /// An offline process is attached; its queues (id, GPU, read-index address) from the snapshot.
    Attached {
        pid: HostPid,
        comm: String,
        queues: Vec<QueueSnapshotEntry>,
        picked_up: bool,
    },
    /// It could not be attached; `retry`: its KFD state was not complete yet.
    AttachFailed {
        pid: HostPid,
        error: DebugError,
        retry: bool,
    },
    Detached {
        pid: HostPid,
        reason: DetachReason,
        detached: Detached,
    },
    /// Queues it created while held were suspended too.
    QueuesHeld {
        pid: HostPid,
        queues: u32,
    },
    /// The driver reset these queues of `pid` (a SUSPEND's ERROR, or the tracer's
    /// `set_queue_as_reset`): gone, not failed suspends; its other queues go on being held.
    QueuesReset {
        pid: HostPid,
        queues: Vec<QueueId>,
    },
    /// A session's own watchdog resumed every queue of `pid` (this loop did not resume in time).
    WatchdogResumed {
        t_ns: u64,
        pid: HostPid,
        held_ms: u64,
        still_held: usize,
    },
    Transition(TransitionRecord, Vec<(HostPid, SharedError)>),
    /// An idle resume skipped: the gap is predicted shorter than the transitions cost.
    ResumeSkipped {
        t_ns: u64,
        gpu: GpuId,
        verdict: GapVerdict,
    },
    /// Every hold of a GPU ended without its policy (watchdogs, exits): it runs again.
    Released {
        t_ns: u64,
        gpu: GpuId,
    },
    OnlineGone {
        pid: HostPid,
    },
    /// The probe's store count of an online queue it stops filtering on.
    DoorbellStores(DoorbellCount),
    /// How an online process's submissions are seen (once per process, at its first queue).
    SeenBy {
        pid: HostPid,
        path: DetectionPath,
        libraries: Vec<String>,
        probes: Vec<ProbePoint>,
        why: Option<String>,
    },
    /// What the arrival probe sees of an online process: the ports it watches in `cgroup`, or
    /// `why` not (once per change: a server that opens its port later is watched from then).
    ArrivalWatch {
        pid: HostPid,
        ports: Vec<u16>,
        cgroup: Option<String>,
        why: Option<String>,
    },
    /// An online process's arrival figures (it exited, or the scheduler stops).
    ArrivalDone(Box<ArrivalReport>),
    /// A malformed `--hint-socket` line.
    HintMalformed {
        line: String,
        count: u64,
    },
    Warning(String),
}
