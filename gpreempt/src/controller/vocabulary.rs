//! The controller's vocabulary: a session's options, errors, batches, notices and how it ended.
//! Shared by the session ([`super::session`]), its threaded form ([`super::threaded`]), the
//! measurement loop and the scheduler; it depends on none of them.

use std::{fmt, path::PathBuf, sync::Arc, time::Duration};

use nix::errno::Errno;
use serde::{Serialize, Serializer};

use super::target::TargetError;
use crate::{
    domain::{DebugTrapOp, GpuId, HostPid, QueueId, RuntimeState},
    kfd::{
        KfdVersion,
        device::DeviceError,
        uapi::{QueueOutcome, QueueResult},
    },
};

/// `grace_period` value KFD treats as "leave CP_IQ_WAIT_TIME2 as it is" (`USE_DEFAULT_GRACE_PERIOD`,
/// kfd_device_queue_manager.h, 6.5–6.12).
pub const DRIVER_GRACE_PERIOD: u32 = 0xffff_ffff;

/// Settings of a session.
#[derive(Clone, Debug)]
pub struct Options {
    /// Resume automatically when queues stay suspended longer than this.
    pub max_suspend: Option<Duration>,
    pub roots: crate::host::roots::Roots,
    pub device: PathBuf,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            max_suspend: None,
            roots: crate::host::roots::Roots::default(),
            device: PathBuf::from(crate::kfd::device::KFD_DEVICE),
        }
    }
}

/// Why a debug session could not start or an operation failed: cause and fix.
#[derive(Debug, thiserror::Error)]
pub enum DebugError {
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error("the debug-trap API needs KFD ≥ 1.13 (Linux 6.5+ or amdgpu-dkms); this kernel has {0}")]
    NoDebugTrap(KfdVersion),
    #[error(
        "refusing to suspend pid {pid}'s queues on GPU {gpu}: it is a gfx12 GPU and KFD {version}'s trap handler \
         predates gfx12 \"expert scheduling\" support (KFD 1.20), so a suspend can corrupt the waves of such kernels; \
         use a driver with KFD ≥ 1.20 (see `gpreempt doctor`)"
    )]
    ExpertSchedUnsafe { pid: HostPid, gpu: GpuId, version: KfdVersion },
    #[error("cannot ptrace pid {pid}: {reason}")]
    PtraceDenied { pid: HostPid, reason: String },
    #[error("PTRACE_SEIZE of pid {pid} failed: {errno}")]
    Ptrace { pid: HostPid, errno: Errno },
    #[error(
        "pid {pid} is already being debugged through KFD (another gpreempt, or rocgdb/ROCdbgapi): EALREADY; \
         stop that debugger first"
    )]
    AlreadyDebugged { pid: HostPid },
    #[error(
        "KFD refused to debug pid {pid}: EBUSY — on GPUs without per-VMID debug (MI50/MI60, MI100, RDNA1/2) only \
         one process per GPU can be debugged and one already is, or the process uses GWS"
    )]
    Busy { pid: HostPid },
    #[error(
        "KFD refused the debug trap: EINVAL — amdgpu runs without the hardware scheduler (sched_policy=2), which \
         the debug-trap API needs; reload amdgpu with sched_policy=0"
    )]
    NoHws,
    #[error(
        "pid {pid} has not enabled the ROCm runtime's debug interface (AMDKFD_IOC_RUNTIME_ENABLE): it is not a \
         ROCr process, its ROCr predates the call (ROCm 5.x never makes it), or the GPU firmware lacks debug support; \
         KFD refuses to suspend its queues (EPERM)"
    )]
    RuntimeNotEnabled { pid: HostPid },
    #[error(
        "pid {pid} shut its ROCm runtime down (RUNTIME_ENABLE mode 0, as ROCr does at exit or hsa_shut_down): \
         KFD resumed its queues and refuses new suspends"
    )]
    RuntimeDisabled { pid: HostPid },
    #[error(
        "KFD says this thread is not the ptrace parent of pid {pid} (EPERM) although it seized it; was it \
         detached by someone else?"
    )]
    NotPtraceParent { pid: HostPid },
    #[error("pid {pid} exited (status {code}) during the debug session")]
    TargetExited { pid: HostPid, code: i32 },
    #[error("AMDKFD_IOC_DBG_TRAP {} on pid {pid} failed: {errno}", op.uapi_name())]
    Ioctl { op: DebugTrapOp, pid: HostPid, errno: Errno },
    #[error("cannot create the debug-event pipe: {0}")]
    Pipe(Errno),
    #[error(transparent)]
    Watchdog(#[from] super::watchdog::WatchdogError),
    #[error("the debug session thread is gone (it panicked?)")]
    SessionGone,
    #[error("injected fault ({0}) from GPREEMPT_TEST_FAULT")]
    Injected(&'static str),
    #[error("cannot wait on {0} file descriptors at once (at most 64: 2 per session plus the caller's)")]
    TooManyFds(usize),
}

/// A [`DebugError`] kept in a record (a notice, a run's stop reason): shared, compared and
/// serialised by its message, so the record keeps the typed error and its JSON keeps the text.
#[derive(Clone, Debug)]
pub struct SharedError(pub Arc<DebugError>);

impl From<DebugError> for SharedError {
    fn from(e: DebugError) -> Self {
        Self(Arc::new(e))
    }
}

impl std::fmt::Display for SharedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for SharedError {
    /// By message: an errno or an I/O error has no other equality.
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

impl Serialize for SharedError {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// What attaching found out.
#[derive(Clone, Debug, Serialize)]
pub struct AttachedTarget {
    pub pid: HostPid,
    pub comm: String,
    pub kfd_version: KfdVersion,
    /// `kfd_runtime_info.runtime_state` at ENABLE.
    pub runtime_state: RuntimeState,
    /// `kfd_runtime_info.r_debug`: ROCr's `_amdgpu_r_debug` address, 0 before runtime enable.
    pub r_debug: u64,
}

/// One SUSPEND_QUEUES or RESUME_QUEUES as seen from userspace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    /// The ioctl's return value: the number of queues suspended/resumed.
    pub count: i32,
    /// Serialised as `{queue_id, result}` per id (the `--json` record's shape).
    pub outcomes: Vec<QueueOutcome>,
    /// A SUSPEND_QUEUES: an ERROR verdict is a queue the driver reset ([`QueueResult::Reset`]).
    pub suspend: bool,
    /// Time spent in the ioctl(s), retry included.
    pub latency_ns: u64,
    /// Ids retried once after a re-snapshot because they came back INVALID.
    pub retried: u32,
    /// No ioctl was needed (nothing to suspend or resume).
    pub skipped: bool,
}

impl Serialize for Batch {
    /// The record's shape: `count`, `outcomes` as `{queue_id, result}`, `latency_ns`, `retried`,
    /// `skipped`.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Verdict {
            queue_id: QueueId,
            result: QueueResult,
        }
        #[derive(Serialize)]
        struct Record {
            count: i32,
            outcomes: Vec<Verdict>,
            latency_ns: u64,
            retried: u32,
            skipped: bool,
        }
        Record {
            count: self.count,
            outcomes: self
                .outcomes
                .iter()
                .map(|&o| Verdict { queue_id: o.queue_id, result: self.result_of(o) })
                .collect(),
            latency_ns: self.latency_ns,
            retried: self.retried,
            skipped: self.skipped,
        }
        .serialize(s)
    }
}

impl Batch {
    /// The verdict on one id: a SUSPEND's ERROR is [`QueueResult::Reset`].
    pub fn result_of(&self, o: QueueOutcome) -> QueueResult {
        if self.suspend { o.suspend_result() } else { o.result() }
    }
    /// Queues the driver reset (gone) in a SUSPEND.
    pub fn reset(&self) -> usize {
        self.count_of(QueueResult::Reset)
    }
    pub fn done(&self) -> usize {
        self.count_of(QueueResult::Done)
    }
    pub fn invalid(&self) -> usize {
        self.count_of(QueueResult::Invalid)
    }
    pub fn error(&self) -> usize {
        self.count_of(QueueResult::Error)
    }
    fn count_of(&self, r: QueueResult) -> usize {
        self.outcomes.iter().filter(|&&o| self.result_of(o) == r).count()
    }
}

/// Which queues to suspend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    /// Every queue of the target (from the latest snapshot, refreshed when queues appear);
    /// queues it creates while they are held are suspended too.
    All,
    /// Every queue of the target on one GPU (the snapshot says which GPU a queue is on); queues
    /// it creates on that GPU while they are held are suspended too, its queues on other GPUs
    /// are left running.
    Gpu(GpuId),
    Ids(Vec<QueueId>),
}

impl Selection {
    /// Whether a queue on `gpu` is one this selection holds (`Ids` picks queues, not GPUs).
    pub fn holds_gpu(&self, gpu: GpuId) -> bool {
        match self {
            Self::All => true,
            Self::Gpu(g) => *g == gpu,
            Self::Ids(_) => false,
        }
    }
}

/// Things that happened in the session without being asked.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "notice", rename_all = "snake_case")]
pub enum SessionNotice {
    TargetExited {
        code: i32,
    },
    /// EC_PROCESS_RUNTIME acknowledged; the target's runtime is now in this state.
    RuntimeChanged {
        runtime_state: RuntimeState,
    },
    /// The target created queues (EC_QUEUE_NEW); the next `All` suspend re-snapshots.
    QueuesAppeared,
    /// Queues created during a hold of every queue were snapshotted and suspended too.
    QueuesSuspendedMidHold {
        count: u32,
    },
    /// SUSPEND_QUEUES came back with ERROR on these queues: their preemption failed and the driver
    /// reset them (or the GPU). They are gone — not a failed suspend — and are never suspended or
    /// resumed again; the target's other queues go on being held.
    QueuesReset {
        queues: Vec<QueueId>,
    },
    /// The watchdog resumed queues held longer than `max_suspend`.
    WatchdogResumed {
        held_ms: u64,
        resumed: Batch,
    },
    /// The watchdog's RESUME failed; it tries again after `retry_in_ms` (doubling, at most 1 s).
    WatchdogResumeFailed {
        held_ms: u64,
        error: SharedError,
        retry_in_ms: u64,
    },
    /// A step the session took on its own failed.
    Failed {
        op: SessionOp,
        error: SharedError,
    },
}

/// A step the session takes on its own, unasked: what a [`SessionNotice::Failed`] names.
/// Displayed and serialised as its name (`suspend new queues`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SessionOp {
    /// Snapshot the queues created during a hold and suspend those the hold covers.
    SuspendNewQueues,
}

impl SessionOp {
    pub fn name(self) -> &'static str {
        match self {
            Self::SuspendNewQueues => "suspend new queues",
        }
    }
}

impl fmt::Display for SessionOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl Serialize for SessionOp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// How the session ended.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Detached {
    /// Queues resumed at detach (0 when nothing was suspended).
    pub resumed: usize,
    /// DISABLE succeeded (false if the target was already gone).
    pub disabled: bool,
    /// Signals re-injected into the target while it was seized.
    pub signals_forwarded: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_count_verdicts_and_serialise_them_by_id() {
        let b = Batch {
            count: 2,
            outcomes: crate::kfd::uapi::decode_outcomes(&[0, 1 | 1 << 31, 2 | 1 << 30, 3]),
            ..Batch::default()
        };
        assert_eq!((b.done(), b.invalid(), b.error(), b.reset()), (2, 1, 1, 0));
        let json = serde_json::to_value(&b).unwrap();
        assert_eq!(json["outcomes"][1], serde_json::json!({"queue_id": 1, "result": "invalid"}));
        assert_eq!(json["outcomes"][2], serde_json::json!({"queue_id": 2, "result": "error"}));
        assert_eq!(
            json.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["count", "latency_ns", "outcomes", "retried", "skipped"]
        );
        // The same array from a SUSPEND: the ERROR id is a reset queue.
        let s = Batch { suspend: true, ..b };
        assert_eq!((s.done(), s.invalid(), s.error(), s.reset()), (2, 1, 0, 1));
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["outcomes"][2], serde_json::json!({"queue_id": 2, "result": "reset"}));
    }

    #[test]
    fn a_failed_step_is_named_as_before_in_text_and_json() {
        let op = SessionOp::SuspendNewQueues;
        assert_eq!(format!("{op} failed"), "suspend new queues failed");
        let notice = SessionNotice::Failed { op, error: SharedError::from(DebugError::NoHws) };
        let json = serde_json::to_value(&notice).unwrap();
        assert_eq!(
            (&json["notice"], &json["op"]),
            (&serde_json::json!("failed"), &serde_json::json!("suspend new queues"))
        );
    }
}
