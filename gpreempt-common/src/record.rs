//! Records the eBPF programs write into the `EVENTS` ring buffer.
//!
//! Each record is one `#[repr(C)]` struct that starts with [`RecordHeader`]; the header's `kind`
//! ([`RecordKind`] as `u32`) says which struct follows. Timestamps are `bpf_ktime_get_boot_ns()`,
//! i.e. CLOCK_BOOTTIME, the same clock as KFD's SMI event timestamps.

use core::mem::size_of;

use crate::kfd_uapi::{CreateQueueArgs, DbgTrapArgs, RuntimeEnableArgs, UpdateQueueArgs};

/// Name of the ring buffer map.
pub const EVENTS_MAP: &str = "EVENTS";
/// Name of the per-CPU counters map (indices in [`counter`]).
pub const COUNTERS_MAP: &str = "COUNTERS";
/// Name of the load-time global holding the [`ProbeConfig`].
pub const CONFIG_GLOBAL: &str = "CONFIG";
/// How many queue ids of a `suspend_queues`/`resume_queues` user array a record carries.
pub const MAX_QUEUE_IDS: usize = 16;
/// Size of the ring buffer in bytes: 4 MiB holds ~29 000 create records, enough for bursts of
/// thousands of ioctls while userspace is descheduled. Must be a power of two multiple of the
/// page size.
pub const EVENTS_BYTES: u32 = 4 << 20;

/// Indices into the per-CPU `COUNTERS` array: every event the programs could not deliver.
pub mod counter {
    /// The ring buffer was full: the record was dropped.
    pub const RINGBUF_FULL: u32 = 0;
    /// `bpf_probe_read_kernel` of the ioctl arguments failed: the record was dropped.
    pub const READ_FAILED: u32 = 1;
    /// A kretprobe fired without its entry stash (evicted from the LRU or attached mid-call).
    pub const ENTRY_MISSING: u32 = 2;
    /// A probe in kworker/notifier context could not resolve the owning process (no BTF offsets
    /// and the `kfd_process*` was created before the tracer started): the record carries tgid 0.
    pub const OWNER_UNKNOWN: u32 = 3;
    pub const COUNT: u32 = 4;
}

/// Kinds of record, the `kind` field of [`RecordHeader`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// [`QueueCreateRecord`]: `kfd_ioctl_create_queue` returned.
    QueueCreate = 1,
    /// [`QueueDestroyRecord`]: `kfd_ioctl_destroy_queue` returned.
    QueueDestroy = 2,
    /// [`QueueUpdateRecord`]: `kfd_ioctl_update_queue` returned.
    QueueUpdate = 3,
    /// [`DebugTrapRecord`]: `kfd_ioctl_set_debug_trap` returned.
    DebugTrap = 4,
    /// [`RuntimeEnableRecord`]: `kfd_ioctl_runtime_enable` returned.
    RuntimeEnable = 5,
    /// [`SmiQueueRecord`]: `kfd_smi_event_queue_eviction` / `_restore` was called.
    SmiQueue = 6,
    /// [`KfdCallRecord`]: an internal KFD function (eviction, HWS runlist, fence wait, MES,
    /// teardown, GPU reset) was called or returned.
    KfdCall = 7,
    /// [`QueueSuspendRecord`]: `suspend_queues` / `resume_queues` returned.
    QueueSuspend = 8,
    /// [`ProcessCreateRecord`]: `kfd_create_process` returned.
    ProcessCreate = 9,
}

impl TryFrom<u32> for RecordKind {
    type Error = u32;

    fn try_from(value: u32) -> Result<Self, u32> {
        Ok(match value {
            1 => Self::QueueCreate,
            2 => Self::QueueDestroy,
            3 => Self::QueueUpdate,
            4 => Self::DebugTrap,
            5 => Self::RuntimeEnable,
            6 => Self::SmiQueue,
            7 => Self::KfdCall,
            8 => Self::QueueSuspend,
            9 => Self::ProcessCreate,
            unknown => return Err(unknown),
        })
    }
}

/// A record type of the `EVENTS` ring buffer, tied to the [`RecordKind`] its header carries.
///
/// The eBPF side writes only such types (its `emit` sets `header.kind` from [`Record::KIND`]);
/// the user side reads only such types, so a kind and its layout cannot disagree.
pub trait Record: Copy + 'static {
    /// The `kind` of this record's header.
    const KIND: RecordKind;
    /// What the record is called in decode errors (`queue_create record`).
    const NAME: &'static str;
    /// The common start of the record.
    fn header_mut(&mut self) -> &mut RecordHeader;
}

macro_rules! record {
    ($($ty:ident => $kind:ident, $name:literal;)+) => {
        $(
            impl Record for $ty {
                const KIND: RecordKind = RecordKind::$kind;
                const NAME: &'static str = $name;
                fn header_mut(&mut self) -> &mut RecordHeader {
                    &mut self.header
                }
            }
        )+
    };
}

record! {
    QueueCreateRecord => QueueCreate, "queue_create record";
    QueueDestroyRecord => QueueDestroy, "queue_destroy record";
    QueueUpdateRecord => QueueUpdate, "queue_update record";
    DebugTrapRecord => DebugTrap, "debug_trap record";
    RuntimeEnableRecord => RuntimeEnable, "runtime_enable record";
    SmiQueueRecord => SmiQueue, "smi_queue record";
    KfdCallRecord => KfdCall, "kfd_call record";
    QueueSuspendRecord => QueueSuspend, "queue_suspend record";
    ProcessCreateRecord => ProcessCreate, "process_create record";
}

/// `TASK_COMM_LEN`
pub const COMM_LEN: usize = 16;

/// `KFD_CONTEXT_ID_PRIMARY` (kfd_priv.h, Linux 7.0, commit fac682a1d1af): the `context_id` of the
/// context `kfd_open` made. Queue records carry it where the kernel has no secondary contexts
/// (before 7.0) or BTF gives no `kfd_process.context_id` offset (docs/kfd.md §1.4).
pub const CONTEXT_ID_PRIMARY: u32 = 0xFFFF;

/// Common start of every record.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    /// [`RecordKind`] as `u32`.
    pub kind: u32,
    /// CPU the record was written on.
    pub cpu: u32,
    /// CLOCK_BOOTTIME ns when the traced function was entered.
    pub entry_ns: u64,
    /// CLOCK_BOOTTIME ns when the record was written (return, for kretprobe records).
    pub ts_ns: u64,
    /// Thread group id (the host pid) of `current`.
    pub tgid: u32,
    /// Thread id of `current`.
    pub tid: u32,
    /// `current->comm`, NUL-padded.
    pub comm: [u8; COMM_LEN],
}

/// `kfd_ioctl_create_queue(filep, p, data)` returned: `args` is the kernel's copy of the ioctl
/// arguments after the call (so `queue_id` and `doorbell_offset` are the outputs on success).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueCreateRecord {
    pub header: RecordHeader,
    pub args: CreateQueueArgs,
    /// `context_id` of the handler's `kfd_process` (Linux 7.0: queue ids are per context);
    /// [`CONTEXT_ID_PRIMARY`] when the kernel has no contexts or the offset is unknown.
    pub context_id: u32,
    pub _pad: u32,
    /// Return value of the handler: 0 or a negative errno.
    pub ret: i64,
}

/// `kfd_ioctl_destroy_queue(filep, p, data)` returned.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueDestroyRecord {
    pub header: RecordHeader,
    pub queue_id: u32,
    /// As [`QueueCreateRecord::context_id`].
    pub context_id: u32,
    /// Return value of the handler: 0 or a negative errno.
    pub ret: i64,
}

/// `kfd_ioctl_update_queue(filep, p, data)` returned: `args` is the kernel's copy of
/// `struct kfd_ioctl_update_queue_args`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueUpdateRecord {
    pub header: RecordHeader,
    pub args: UpdateQueueArgs,
    /// As [`QueueCreateRecord::context_id`].
    pub context_id: u32,
    pub _pad: u32,
    pub ret: i64,
}

/// `kfd_ioctl_set_debug_trap(filep, p, data)` returned: the kernel's copy of
/// `struct kfd_ioctl_dbg_trap_args` after the call (in/out fields hold the outputs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DebugTrapRecord {
    pub header: RecordHeader,
    pub args: DbgTrapArgs,
    /// Positive for SUSPEND/RESUME: the number of queues handled.
    pub ret: i64,
}

/// `kfd_ioctl_runtime_enable(filep, p, data)` returned.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuntimeEnableRecord {
    pub header: RecordHeader,
    pub args: RuntimeEnableArgs,
    pub ret: i64,
}

/// `kfd_smi_event_queue_eviction(dev, pid, trigger)` (`restore == 0`) or
/// `kfd_smi_event_queue_restore(dev, pid)` (`restore == 1`). The pid is the kernel's argument
/// (`p->lead_thread->pid`, the host tgid), not `current`, which is often a kworker.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmiQueueRecord {
    pub header: RecordHeader,
    pub pid: u32,
    /// `KFD_QUEUE_EVICTION_TRIGGER_*` for evictions, 0 for restores.
    pub trigger: u32,
    /// 0 when the offset of `kfd_node.id` is unknown (no module BTF).
    pub gpu_id: u32,
    pub restore: u32,
}

/// Which internal KFD function a [`KfdCallRecord`] is about (its `function` field, as `u32`).
/// Each has its own probe(s) in the table (`gpreempt::trace::probes`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KfdFn {
    EvictProcessQueuesCpsch = 1,
    EvictProcessQueuesNocpsch = 2,
    RestoreProcessQueuesCpsch = 3,
    RestoreProcessQueuesNocpsch = 4,
    ExecuteQueuesCpsch = 5,
    UnmapQueuesCpsch = 6,
    MapQueuesCpsch = 7,
    FenceWaitTimeout = 8,
    PmSendRunlist = 9,
    PmSendUnmapQueue = 10,
    MesV11RemoveHwQueue = 11,
    MesV11AddHwQueue = 12,
    MesV12RemoveHwQueue = 13,
    MesV12AddHwQueue = 14,
    ProcessEvictQueues = 15,
    ProcessRestoreQueues = 16,
    /// `amdgpu_amdkfd_gpu_reset`: entry only; an alarm.
    GpuReset = 17,
    /// `kfd_process_dequeue_from_all_devices`: entry only; process teardown begins.
    ProcessDequeueAll = 18,
    /// `kfd_procfs_del_queue`: entry only; `args[0]` is the queue id, `args[1]` the context id
    /// ([`CONTEXT_ID_PRIMARY`] unless known secondary). Every queue removal, including those of
    /// process teardown.
    ProcfsDelQueue = 19,
    /// `kfd_process_wq_release`: entry only; the kfd_process is freed.
    ProcessRelease = 20,
    /// `set_queue_as_reset`: entry only; `args[0]` is the queue id, `args[1]` the context id, the
    /// owner from the qpd, the gpu from the dqm. A queue the driver reset after it failed a preemption (gfx9 per-queue
    /// reset, 6.12+); the SUSPEND_QUEUES that caused it still counts it suspended.
    QueueSetReset = 21,
    /// `kfd_ioctl_create_process` (AMDKFD_IOC_CREATE_PROCESS, Linux 7.0): written at its return;
    /// the owner is the caller, `args[0]` the new secondary context's `context_id` (read through
    /// the file's `private_data`; `u32::MAX` when unreadable or the call failed), `ret` the
    /// handler's result.
    ContextCreate = 22,
}

impl KfdFn {
    /// Every variant, in wire order (`ALL[i] as u32 == i + 1`).
    pub const ALL: [Self; 22] = [
        Self::EvictProcessQueuesCpsch,
        Self::EvictProcessQueuesNocpsch,
        Self::RestoreProcessQueuesCpsch,
        Self::RestoreProcessQueuesNocpsch,
        Self::ExecuteQueuesCpsch,
        Self::UnmapQueuesCpsch,
        Self::MapQueuesCpsch,
        Self::FenceWaitTimeout,
        Self::PmSendRunlist,
        Self::PmSendUnmapQueue,
        Self::MesV11RemoveHwQueue,
        Self::MesV11AddHwQueue,
        Self::MesV12RemoveHwQueue,
        Self::MesV12AddHwQueue,
        Self::ProcessEvictQueues,
        Self::ProcessRestoreQueues,
        Self::GpuReset,
        Self::ProcessDequeueAll,
        Self::ProcfsDelQueue,
        Self::ProcessRelease,
        Self::QueueSetReset,
        Self::ContextCreate,
    ];

    /// The kernel symbol (base name, without a `.constprop.N` suffix).
    pub const fn name(self) -> &'static str {
        match self {
            Self::EvictProcessQueuesCpsch => "evict_process_queues_cpsch",
            Self::EvictProcessQueuesNocpsch => "evict_process_queues_nocpsch",
            Self::RestoreProcessQueuesCpsch => "restore_process_queues_cpsch",
            Self::RestoreProcessQueuesNocpsch => "restore_process_queues_nocpsch",
            Self::ExecuteQueuesCpsch => "execute_queues_cpsch",
            Self::UnmapQueuesCpsch => "unmap_queues_cpsch",
            Self::MapQueuesCpsch => "map_queues_cpsch",
            Self::FenceWaitTimeout => "amdkfd_fence_wait_timeout",
            Self::PmSendRunlist => "pm_send_runlist",
            Self::PmSendUnmapQueue => "pm_send_unmap_queue",
            Self::MesV11RemoveHwQueue => "mes_v11_0_remove_hw_queue",
            Self::MesV11AddHwQueue => "mes_v11_0_add_hw_queue",
            Self::MesV12RemoveHwQueue => "mes_v12_0_remove_hw_queue",
            Self::MesV12AddHwQueue => "mes_v12_0_add_hw_queue",
            Self::ProcessEvictQueues => "kfd_process_evict_queues",
            Self::ProcessRestoreQueues => "kfd_process_restore_queues",
            Self::GpuReset => "amdgpu_amdkfd_gpu_reset",
            Self::ProcessDequeueAll => "kfd_process_dequeue_from_all_devices",
            Self::ProcfsDelQueue => "kfd_procfs_del_queue",
            Self::ProcessRelease => "kfd_process_wq_release",
            Self::QueueSetReset => "set_queue_as_reset",
            Self::ContextCreate => "kfd_ioctl_create_process",
        }
    }

    /// The [`StashKey::slot`] of this function's entry/return pair.
    pub const fn stash_slot(self) -> u32 {
        stash_slot::KFD_CALL_BASE + self as u32
    }
}

impl TryFrom<u32> for KfdFn {
    type Error = u32;

    /// The variant whose wire value is `value`; the value itself when none is.
    fn try_from(value: u32) -> Result<Self, u32> {
        let index = value.checked_sub(1).ok_or(value)? as usize;
        Self::ALL.get(index).copied().ok_or(value)
    }
}

/// Whether a [`KfdCallRecord`] is written at the call or at its return (its `phase` field).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallPhase {
    Entry = 0,
    Return = 1,
}

impl TryFrom<u32> for CallPhase {
    type Error = u32;

    fn try_from(value: u32) -> Result<Self, u32> {
        match value {
            0 => Ok(Self::Entry),
            1 => Ok(Self::Return),
            unknown => Err(unknown),
        }
    }
}

/// An internal KFD function was called ([`CallPhase::Entry`]) or returned
/// ([`CallPhase::Return`], with `header.entry_ns` the call time).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KfdCallRecord {
    pub header: RecordHeader,
    /// [`KfdFn`] as `u32`.
    pub function: u32,
    /// [`CallPhase`] as `u32`.
    pub phase: u32,
    /// Host tgid of the process the call is about (from its `kfd_process*`/`qpd*`), 0 when
    /// the function is device-wide or the owner is unknown.
    pub owner: u32,
    /// GPU (topology id) from `dqm->dev->id`, 0 when unknown or not applicable.
    pub gpu_id: u32,
    /// Raw integer arguments, per function (see `gpreempt::trace::decode`).
    pub args: [u64; 4],
    /// Return value (0 for entry records and void functions).
    pub ret: i64,
}

impl KfdCallRecord {
    /// A record about `function`, with its typed function and phase on the wire as `u32`.
    pub const fn new(
        header: RecordHeader,
        function: KfdFn,
        phase: CallPhase,
        owner: u32,
        gpu_id: u32,
        args: [u64; 4],
        ret: i64,
    ) -> Self {
        Self { header, function: function as u32, phase: phase as u32, owner, gpu_id, args, ret }
    }
}

/// `suspend_queues(p, num_queues, grace_period, exception_clear_mask, usr_queue_id_array)` or
/// `resume_queues(p, num_queues, usr_queue_id_array)` returned (KFD 1.13+).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueSuspendRecord {
    pub header: RecordHeader,
    /// Host tgid of the target process (0 when unknown).
    pub target: u32,
    pub num_queues: u32,
    /// 1000-cycle units (suspend only).
    pub grace_period: u32,
    /// 1 = resume, 0 = suspend.
    pub resume: u32,
    pub exception_clear_mask: u64,
    /// How many of `queue_ids` were read (min(num_queues, MAX_QUEUE_IDS), 0 if unreadable).
    pub ids_read: u32,
    pub _pad: u32,
    /// The user array as the kernel wrote it back: ids with bit 31 INVALID / bit 30 ERROR.
    pub queue_ids: [u32; MAX_QUEUE_IDS],
    /// Number of queues suspended/resumed, or a negative errno.
    pub ret: i64,
}

/// `kfd_create_process(...)` returned: `process` is the `struct kfd_process*` (or an
/// `ERR_PTR`), `tgid` its owner (the `task_struct` argument on KFD 1.13+, else `current`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessCreateRecord {
    pub header: RecordHeader,
    pub process: u64,
    pub tgid: u32,
    /// 1 when the owner came from the `task_struct` argument (BTF offset of `tgid` known).
    pub from_task: u32,
}

/// Struct offsets the probes need, found in BTF at start (bytes; [`OFFSET_UNKNOWN`] = unknown:
/// 0 is a real offset, that of a struct's first member).
/// Passed as the load-time global [`CONFIG_GLOBAL`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeConfig {
    /// `struct kfd_process.lead_thread` (a `task_struct*`).
    pub process_lead_thread: u32,
    /// `struct task_struct.tgid` (vmlinux BTF).
    pub task_tgid: u32,
    /// `struct kfd_process.release_work` (a `work_struct`), for `kfd_process_wq_release`.
    pub process_release_work: u32,
    /// `struct qcm_process_device.pqm`; stable 8 on 6.1/6.12 (docs/kfd.md §3.3).
    pub qpd_pqm: u32,
    /// `struct process_queue_manager.process`; stable 0.
    pub pqm_process: u32,
    /// `struct device_queue_manager.dev` (a `kfd_node*`/`kfd_dev*`).
    pub dqm_dev: u32,
    /// `struct kfd_node.id` (`kfd_dev.id` on 6.1): the topology gpu id.
    pub node_id: u32,
    /// `struct queue.properties.queue_id`; stable 48.
    pub queue_queue_id: u32,
    /// 1 when `kfd_create_process` takes a `task_struct*` (KFD 1.13+), 0 for `struct file*`.
    pub create_process_takes_task: u32,
    /// 1 when `amdkfd_fence_wait_timeout`'s first argument is the dqm (6.12+), 0 for `u64*`.
    pub fence_wait_takes_dqm: u32,
    /// 1 when `kfd_smi_event_queue_*`'s second argument is a pid (all released kernels).
    pub smi_arg_is_pid: u32,
    /// `struct kfd_process.context_id` (u16; Linux 7.0, [`CONTEXT_ID_PRIMARY`] for the context
    /// `kfd_open` made): queue records carry it, since a secondary context's queue ids repeat the
    /// primary's (docs/kfd.md §1.4). Unknown before 7.0 (no such member: every context is the
    /// primary) and without module BTF.
    pub process_context_id: u32,
    /// `struct file.private_data` (vmlinux BTF): the KFD context a `/dev/kfd` file holds, which
    /// CREATE_PROCESS replaces with the new secondary one (docs/kfd.md §1.4).
    pub file_private_data: u32,
}

/// "Unknown" for every offset of [`ProbeConfig`]: 0 is the offset of a first member (the
/// emulator's `device_queue_manager.dev` and `kfd_node.id` are first members, for one).
pub const OFFSET_UNKNOWN: u32 = u32::MAX;

impl ProbeConfig {
    /// The layout-free defaults, what the programs use until the loader overrides them from BTF:
    /// only the offsets found stable on 6.1.192, 6.12.117 and the newest tree are filled in
    /// (docs/kfd.md §3.3); everything BTF must answer is [`OFFSET_UNKNOWN`].
    pub const DEFAULT: Self = Self {
        process_lead_thread: OFFSET_UNKNOWN,
        task_tgid: OFFSET_UNKNOWN,
        process_release_work: OFFSET_UNKNOWN,
        qpd_pqm: 8,
        pqm_process: 0,
        dqm_dev: OFFSET_UNKNOWN,
        node_id: OFFSET_UNKNOWN,
        queue_queue_id: 48,
        create_process_takes_task: 0,
        fence_wait_takes_dqm: 0,
        smi_arg_is_pid: 1,
        process_context_id: OFFSET_UNKNOWN,
        file_private_data: OFFSET_UNKNOWN,
    };
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Key of the entry-argument stash that pairs a kprobe with its kretprobe: the same thread,
/// the same traced function.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StashKey {
    pub pid_tgid: u64,
    /// [`stash_slot`]
    pub slot: u32,
    pub _pad: u32,
}

/// What a kprobe saves for its kretprobe.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryStash {
    pub entry_ns: u64,
    /// Owner and gpu the entry probe resolved (for [`KfdCallRecord`]).
    pub owner: u32,
    pub gpu_id: u32,
    pub args: [u64; 5],
}

/// One slot per traced function that has an entry/return pair.
pub mod stash_slot {
    pub const CREATE_QUEUE: u32 = 1;
    pub const DESTROY_QUEUE: u32 = 2;
    pub const UPDATE_QUEUE: u32 = 3;
    pub const DEBUG_TRAP: u32 = 4;
    pub const RUNTIME_ENABLE: u32 = 5;
    pub const SUSPEND_QUEUES: u32 = 6;
    pub const RESUME_QUEUES: u32 = 7;
    pub const CREATE_PROCESS: u32 = 8;
    /// `KfdCall` functions use `100 + KfdFn as u32` ([`KfdFn::stash_slot`]).
    pub const KFD_CALL_BASE: u32 = 100;
}

const _: () = {
    assert!(size_of::<RecordHeader>() == 48);
    assert!(size_of::<QueueCreateRecord>() == 48 + 88 + 8 + 8);
    assert!(size_of::<QueueDestroyRecord>() == 48 + 16);
    assert!(size_of::<StashKey>() == 16);
    assert!(size_of::<EntryStash>() == 56);
    assert!(size_of::<QueueUpdateRecord>() == 48 + 24 + 8 + 8);
    assert!(size_of::<DebugTrapRecord>() == 48 + 32 + 8);
    assert!(size_of::<RuntimeEnableRecord>() == 48 + 16 + 8);
    assert!(size_of::<SmiQueueRecord>() == 48 + 16);
    assert!(size_of::<KfdCallRecord>() == 48 + 16 + 32 + 8);
    assert!(size_of::<QueueSuspendRecord>() == 48 + 32 + 64 + 8);
    assert!(size_of::<ProcessCreateRecord>() == 48 + 16);
    assert!(size_of::<ProbeConfig>() == 52);
};

#[cfg(feature = "user")]
mod pod {
    macro_rules! pod {
        ($($record:ident),* $(,)?) => {$(
            // SAFETY: a `#[repr(C)]` struct of integers and integer arrays with no padding (its
            // size is asserted above), so every bit pattern is a valid value.
            unsafe impl aya::Pod for super::$record {}
        )*};
    }

    pod!(
        RecordHeader,
        QueueCreateRecord,
        QueueDestroyRecord,
        StashKey,
        EntryStash,
        QueueUpdateRecord,
        DebugTrapRecord,
        RuntimeEnableRecord,
        SmiQueueRecord,
        KfdCallRecord,
        QueueSuspendRecord,
        ProcessCreateRecord,
        ProbeConfig,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kfd_fn_round_trips_through_its_wire_value_and_names_distinct_symbols() {
        for (i, f) in KfdFn::ALL.iter().enumerate() {
            assert_eq!(*f as u32, i as u32 + 1, "{f:?}");
            assert_eq!(KfdFn::try_from(*f as u32), Ok(*f));
            assert!(KfdFn::ALL[..i].iter().all(|g| g.name() != f.name()), "{} twice", f.name());
        }
        assert_eq!(KfdFn::try_from(0), Err(0));
        assert_eq!(KfdFn::try_from(23), Err(23));
        assert_eq!(KfdFn::FenceWaitTimeout.name(), "amdkfd_fence_wait_timeout");
        assert_eq!(KfdFn::FenceWaitTimeout.stash_slot(), 108);
    }

    #[test]
    fn call_phase_and_record_kind_reject_unknown_values() {
        assert_eq!(CallPhase::try_from(1), Ok(CallPhase::Return));
        assert_eq!(CallPhase::try_from(2), Err(2));
        assert_eq!(RecordKind::try_from(QueueSuspendRecord::KIND as u32), Ok(RecordKind::QueueSuspend));
        assert_eq!(RecordKind::try_from(10), Err(10));
    }

    #[test]
    fn the_default_config_is_the_layout_free_one() {
        let c = ProbeConfig::default();
        assert_eq!((c.qpd_pqm, c.pqm_process, c.queue_queue_id, c.smi_arg_is_pid), (8, 0, 48, 1));
        let unknown = OFFSET_UNKNOWN;
        assert_eq!(
            (c.process_lead_thread, c.task_tgid, c.process_release_work, c.dqm_dev, c.node_id),
            (unknown, unknown, unknown, unknown, unknown)
        );
    }
}
