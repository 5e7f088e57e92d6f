//! Records the eBPF programs write into the `EVENTS` ring buffer.
//!
//! Each record is one `#[repr(C)]` struct that starts with [`RecordHeader`]; the header's `kind`
//! ([`RecordKind`] as `u32`) says which struct follows. Timestamps are `bpf_ktime_get_boot_ns()`,
//! i.e. CLOCK_BOOTTIME, the same clock as KFD's SMI event timestamps.

use core::mem::size_of;

use crate::kfd_uapi::CreateQueueArgs;

/// Name of the ring buffer map.
pub const EVENTS_MAP: &str = "EVENTS";
/// Name of the per-CPU counters map (indices in [`counter`]).
pub const COUNTERS_MAP: &str = "COUNTERS";
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
    pub const COUNT: u32 = 3;
}

/// Kinds of record, the `kind` field of [`RecordHeader`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// [`QueueCreateRecord`]: `kfd_ioctl_create_queue` returned.
    QueueCreate = 1,
    /// [`QueueDestroyRecord`]: `kfd_ioctl_destroy_queue` returned.
    QueueDestroy = 2,
}

impl TryFrom<u32> for RecordKind {
    type Error = u32;

    fn try_from(value: u32) -> Result<Self, u32> {
        Ok(match value {
            1 => Self::QueueCreate,
            2 => Self::QueueDestroy,
            unknown => return Err(unknown),
        })
    }
}

/// `TASK_COMM_LEN`
pub const COMM_LEN: usize = 16;

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
    /// Return value of the handler: 0 or a negative errno.
    pub ret: i64,
}

/// `kfd_ioctl_destroy_queue(filep, p, data)` returned.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueDestroyRecord {
    pub header: RecordHeader,
    pub queue_id: u32,
    pub _pad: u32,
    /// Return value of the handler: 0 or a negative errno.
    pub ret: i64,
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
    pub args: [u64; 3],
}

/// One slot per traced function that has an entry/return pair.
pub mod stash_slot {
    pub const CREATE_QUEUE: u32 = 1;
    pub const DESTROY_QUEUE: u32 = 2;
}

const _: () = {
    assert!(size_of::<RecordHeader>() == 48);
    assert!(size_of::<QueueCreateRecord>() == 48 + 88 + 8);
    assert!(size_of::<QueueDestroyRecord>() == 48 + 16);
    assert!(size_of::<StashKey>() == 16);
    assert!(size_of::<EntryStash>() == 32);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain `#[repr(C)]` integers and arrays with no padding (asserted above).
    unsafe impl aya::Pod for super::RecordHeader {}
    unsafe impl aya::Pod for super::QueueCreateRecord {}
    unsafe impl aya::Pod for super::QueueDestroyRecord {}
    unsafe impl aya::Pod for super::StashKey {}
    unsafe impl aya::Pod for super::EntryStash {}
}
