//! The low-level event type: one traced occurrence in the KFD driver, owned and decoded. The
//! tracer ([`crate::trace`]) produces it; the model, the pipeline, the sinks and the scheduler
//! consume it without depending on the tracer.

use gpreempt_common::record::KfdFn;
use serde::Serialize;

use crate::{
    domain::{DebugTrapOp, EvictionTrigger, GpuId, HostPid, QueueId, QueueType},
    kfd::uapi::QueueOutcome,
};

/// One traced occurrence, owned and decoded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Event {
    /// CLOCK_BOOTTIME ns when the record was written.
    pub ts_ns: u64,
    /// CLOCK_BOOTTIME ns when the traced function was entered.
    pub entry_ns: u64,
    pub cpu: u32,
    /// Host pid (thread group id) of the calling task.
    pub pid: HostPid,
    pub tid: u32,
    pub comm: String,
    #[serde(flatten)]
    pub kind: EventKind,
}

impl Event {
    /// Time spent inside the traced function.
    pub fn duration_ns(&self) -> u64 {
        self.ts_ns.saturating_sub(self.entry_ns)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EventKind {
    QueueCreate(QueueCreate),
    QueueDestroy(QueueDestroy),
    QueueUpdate(QueueUpdate),
    DebugTrap(DebugTrap),
    RuntimeEnable(RuntimeEnable),
    QueueEviction(QueueEviction),
    QueueRestore(QueueRestore),
    SuspendQueues(QueueSuspend),
    ResumeQueues(QueueSuspend),
    KfdCall(KfdCall),
    ProcessOpen(ProcessOpen),
    ProcessExit(ProcessExit),
    QueueRemoved(QueueRemoved),
    QueueReset(QueueReset),
    ContextCreate(ContextCreate),
    GpuReset(GpuReset),
}

impl EventKind {
    pub fn name(&self) -> &'static str {
        match self {
            Self::QueueCreate(_) => "queue_create",
            Self::QueueDestroy(_) => "queue_destroy",
            Self::QueueUpdate(_) => "queue_update",
            Self::DebugTrap(_) => "debug_trap",
            Self::RuntimeEnable(_) => "runtime_enable",
            Self::QueueEviction(_) => "queue_eviction",
            Self::QueueRestore(_) => "queue_restore",
            Self::SuspendQueues(_) => "suspend_queues",
            Self::ResumeQueues(_) => "resume_queues",
            Self::KfdCall(_) => "kfd_call",
            Self::ProcessOpen(_) => "process_open",
            Self::ProcessExit(_) => "process_exit",
            Self::QueueRemoved(_) => "queue_removed",
            Self::QueueReset(_) => "queue_reset",
            Self::ContextCreate(_) => "context_create",
            Self::GpuReset(_) => "gpu_reset",
        }
    }
}

/// The return value of a KFD handler: 0 or a negative errno.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelResult(pub i64);

impl KernelResult {
    pub fn is_ok(self) -> bool {
        self.0 >= 0
    }

    /// `OK`, or the errno name (`EINVAL`) for a negative value.
    pub fn name(self) -> String {
        if self.0 >= 0 {
            return "OK".to_owned();
        }
        // checked: a corrupt record may carry i64::MIN (found by the decode_record fuzz target).
        match self.0.checked_neg().and_then(|n| i32::try_from(n).ok()).ok_or(()) {
            Ok(errno) => match nix::errno::Errno::from_raw(errno) {
                nix::errno::Errno::UnknownErrno => format!("E{errno}"),
                known => format!("{known:?}"),
            },
            Err(_) => format!("{}", self.0),
        }
    }
}

impl Serialize for KernelResult {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

/// The KFD context of a queue event, as the record carried it: `None` for the primary context
/// (the only one before Linux 7.0, and what a record says when BTF gave no
/// `kfd_process.context_id`), the `context_id` of a secondary one (`proc/<pid>/context_<id>/`).
/// Queue ids are per context (docs/kfd.md §1.4).
pub fn context_id_of_wire(raw: u32) -> Option<u16> {
    if raw == gpreempt_common::record::CONTEXT_ID_PRIMARY { None } else { u16::try_from(raw).ok() }
}

/// `kfd_ioctl_create_queue` returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueCreate {
    /// Assigned queue id; only meaningful when the call succeeded.
    pub queue_id: Option<QueueId>,
    /// The KFD context the queue was made in: `None` (JSON `null`) for the primary one, else the
    /// secondary context's `context_id` ([`context_id_of_wire`]).
    pub context_id: Option<u16>,
    pub gpu_id: GpuId,
    /// `KFD_IOC_QUEUE_TYPE_*` name (`compute-aql`), or the number when unknown.
    pub queue_type: QueueType,
    pub priority: u32,
    pub percentage: u32,
    pub ring_base: u64,
    pub ring_size: u32,
    pub read_pointer: u64,
    pub write_pointer: u64,
    pub doorbell_offset: Option<u64>,
    pub eop_buffer: u64,
    pub eop_buffer_size: u64,
    pub cwsr_address: u64,
    pub cwsr_size: u32,
    pub ctl_stack_size: u32,
    pub result: KernelResult,
    pub ret: i64,
}

/// `kfd_ioctl_destroy_queue` returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueDestroy {
    pub queue_id: QueueId,
    /// As [`QueueCreate::context_id`].
    pub context_id: Option<u16>,
    pub result: KernelResult,
    pub ret: i64,
}

/// `kfd_ioctl_update_queue` returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueUpdate {
    pub queue_id: QueueId,
    /// As [`QueueCreate::context_id`].
    pub context_id: Option<u16>,
    pub ring_base: u64,
    pub ring_size: u32,
    pub percentage: u32,
    pub priority: u32,
    pub result: KernelResult,
    pub ret: i64,
}

/// `kfd_ioctl_set_debug_trap` returned. Op-specific fields are present only for their op.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DebugTrap {
    /// Target pid as the caller passed it (its own pid namespace).
    pub target_pid: u32,
    /// `enable`, `suspend_queues`, … or the number when unknown.
    pub op: DebugTrapOp,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exception_mask: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_queues: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grace_period: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dbg_fd: Option<u32>,
    pub result: KernelResult,
    /// For SUSPEND/RESUME: the number of queues handled.
    pub ret: i64,
}

/// `kfd_ioctl_runtime_enable` returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuntimeEnable {
    /// `false` is RUNTIME_DISABLE (mode mask without the enable bit).
    pub enable: bool,
    pub ttmp_save: bool,
    pub r_debug: u64,
    pub result: KernelResult,
    pub ret: i64,
}

/// `kfd_smi_event_queue_eviction`: queues of `target_pid` on `gpu_id` are about to be evicted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueEviction {
    pub target_pid: HostPid,
    /// `None` without BTF.
    pub gpu_id: Option<GpuId>,
    pub trigger: EvictionTrigger,
}

/// `kfd_smi_event_queue_restore`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueRestore {
    pub target_pid: HostPid,
    pub gpu_id: Option<GpuId>,
}

/// `suspend_queues` / `resume_queues` returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueSuspend {
    /// Host pid of the target (`None` when unknown).
    pub target_pid: Option<HostPid>,
    pub num_queues: u32,
    /// Suspend only (1000-cycle units).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grace_period: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exception_clear_mask: Option<u64>,
    /// The first ids of the array (up to 16), with their outcome bits.
    pub queues: Vec<QueueOutcome>,
    /// Queues handled (>= 0) …
    pub handled: Option<u32>,
    pub result: KernelResult,
    pub ret: i64,
}

/// An internal KFD function: eviction/restore ops, the HWS path, MES.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KfdCall {
    /// Kernel function name (`amdkfd_fence_wait_timeout`): [`KfdFn::name`].
    pub function: &'static str,
    /// The probed function: what code compares, never the name.
    #[serde(skip)]
    pub kfd_fn: KfdFn,
    /// Host pid the call is about (`None` for device-wide calls or unknown owners).
    pub owner_pid: Option<HostPid>,
    pub gpu_id: Option<GpuId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trigger: Option<EvictionTrigger>,
    /// `enum kfd_unmap_queues_filter`: 1 single, 2 all, 3 dynamic, 4 by pasid (6.12 values).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter_param: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grace_period: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence_value: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u32>,
    pub result: KernelResult,
    pub ret: i64,
}

/// `kfd_create_process` returned: a process opened /dev/kfd (or a debugger enabled it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProcessOpen {
    pub owner_pid: HostPid,
    /// The `struct kfd_process*`, for correlating with later teardown.
    pub kfd_process: u64,
}

/// The process's KFD state is torn down (`kfd_process_dequeue_from_all_devices` or
/// `kfd_process_wq_release`, in a kworker).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProcessExit {
    pub owner_pid: Option<HostPid>,
    /// `kfd_process_dequeue_from_all_devices` or `kfd_process_wq_release`.
    pub stage: &'static str,
}

/// `kfd_procfs_del_queue`: a queue's sysfs entry is removed (destroy ioctl or teardown).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueRemoved {
    pub owner_pid: Option<HostPid>,
    /// `None` when unreadable.
    pub queue_id: Option<QueueId>,
    /// As [`QueueCreate::context_id`].
    pub context_id: Option<u16>,
}

/// `set_queue_as_reset`: the driver reset one queue that failed a preemption (gfx9 per-queue
/// reset, 6.12+). It is gone for its process's work; the SUSPEND_QUEUES that caused it counted
/// it suspended all the same (docs/kfd.md §2.4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueReset {
    pub owner_pid: Option<HostPid>,
    pub gpu_id: Option<GpuId>,
    /// `None` when unreadable.
    pub queue_id: Option<QueueId>,
    /// As [`QueueCreate::context_id`].
    pub context_id: Option<u16>,
}

/// `kfd_ioctl_create_process` (AMDKFD_IOC_CREATE_PROCESS, Linux 7.0) returned: the caller turned
/// one of its `/dev/kfd` files into a secondary KFD context. DBG_TRAP cannot reach such a context
/// (EOPNOTSUPP), so `gpreempt` cannot suspend its queues; the tracer keys them by context
/// (docs/kfd.md §1.4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ContextCreate {
    /// The context's `context_id` (`proc/<pid>/context_<id>/` in sysfs); `None` when the call
    /// failed or the id could not be read (no BTF offsets).
    pub context_id: Option<u16>,
    pub result: KernelResult,
    pub ret: i64,
}

/// `amdgpu_amdkfd_gpu_reset`: an alarm (failed preemption or HWS hang resets the whole GPU).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuReset {
    pub alarm: &'static str,
}

/// Records that did not become events, by cause. Never silent: printed in every summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Losses {
    /// The kernel found the ring buffer full (summed over CPUs).
    pub ringbuf_full: u64,
    /// A probe could not read the ioctl arguments.
    pub read_failed: u64,
    /// A return probe fired without its entry probe.
    pub entry_missing: u64,
    /// Userspace could not decode a record (short or unknown kind).
    pub decode_errors: u64,
    /// Calls whose return probe the kernel skipped because every kretprobe instance was in use
    /// (more callers inside a sleeping probed function than the instance limit), summed over
    /// the return probes; `None` when the kernel cannot tell (before Linux 6.7).
    pub return_probes_missed: Option<u64>,
    /// Not a loss: records delivered without their owner (kworker context, no BTF and the
    /// process opened /dev/kfd before the tracer started).
    pub owner_unknown: u64,
}

impl Losses {
    /// Every record that was not delivered (missed return probes included when known).
    pub fn dropped(&self) -> u64 {
        self.ringbuf_full
            + self.read_failed
            + self.entry_missing
            + self.decode_errors
            + self.return_probes_missed.unwrap_or(0)
    }
}

impl std::fmt::Display for Losses {
    /// `ring buffer full 0, probe read failed 0, return without entry 0, undecodable 0, return
    /// probes missed 0` (`unknown (before Linux 6.7)` when the kernel cannot tell).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ring buffer full {}, probe read failed {}, return without entry {}, undecodable {}, return probes missed ",
            self.ringbuf_full, self.read_failed, self.entry_missing, self.decode_errors
        )?;
        match self.return_probes_missed {
            Some(n) => write!(f, "{n}"),
            None => write!(f, "unknown (before Linux 6.7)"),
        }
    }
}
