//! KFD user API layouts, re-declared from `include/uapi/linux/kfd_ioctl.h` (MIT-style licence,
//! no SPDX line). Offsets checked against Linux 6.1.192 (KFD 1.11) and 6.12.117 (KFD 1.17);
//! every struct carries compile-time size and offset assertions.
//!
//! Only the layouts and constants live here (they are shared with the eBPF probes); the ioctl
//! calls themselves are in `gpreempt::kfd`.

use core::mem::{offset_of, size_of};

/// `AMDKFD_IOCTL_BASE`: the ioctl type byte of every KFD ioctl.
pub const KFD_IOCTL_TYPE: u8 = b'K';

/// `_IOC_NR` of each KFD ioctl we use. The tracer matches on these, not on the full command:
/// CREATE_QUEUE's argument size (and so its command value) changed from 88 to 96 bytes in 1.17.
pub mod nr {
    pub const GET_VERSION: u8 = 0x01;
    pub const CREATE_QUEUE: u8 = 0x02;
    pub const DESTROY_QUEUE: u8 = 0x03;
    pub const UPDATE_QUEUE: u8 = 0x07;
    pub const SMI_EVENTS: u8 = 0x1F;
    pub const RUNTIME_ENABLE: u8 = 0x25;
    pub const DBG_TRAP: u8 = 0x26;
}

/// `struct kfd_ioctl_get_version_args`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GetVersionArgs {
    pub major_version: u32,
    pub minor_version: u32,
}

/// `struct kfd_ioctl_create_queue_args` as of KFD 1.1–1.16 (88 bytes). Kernels with 1.17+ append
/// [`CreateQueueArgsV17`]'s fields; the first 88 bytes are the same on every version, so the
/// probes read exactly this prefix of the kernel's copy.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CreateQueueArgs {
    /// in
    pub ring_base_address: u64,
    /// in
    pub write_pointer_address: u64,
    /// in
    pub read_pointer_address: u64,
    /// out: mmap cookie (`KFD_MMAP_TYPE_DOORBELL | gpu_id << 46 | offset in frame`)
    pub doorbell_offset: u64,
    /// in: bytes, power of two, clamped to at least 1024 by the kernel
    pub ring_size: u32,
    /// in: topology gpu_id
    pub gpu_id: u32,
    /// in: `KFD_IOC_QUEUE_TYPE_*` ([`queue_type`])
    pub queue_type: u32,
    /// in: bits 0-7 percent (0..=100), bits 8-15 pm4_target_xcc on newer kernels
    pub queue_percentage: u32,
    /// in: 0..=15
    pub queue_priority: u32,
    /// out: process-global queue id (0..1024)
    pub queue_id: u32,
    pub eop_buffer_address: u64,
    pub eop_buffer_size: u64,
    /// in: CWSR (context save/restore) area
    pub ctx_save_restore_address: u64,
    pub ctx_save_restore_size: u32,
    pub ctl_stack_size: u32,
}

/// `struct kfd_ioctl_create_queue_args` as of KFD 1.17+ (96 bytes; `metadata_ring_size` is 1.22).
/// The kernel accepts either size (`kfd_ioctl()` zero-fills up to its own size).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CreateQueueArgsV17 {
    pub base: CreateQueueArgs,
    /// in, only with [`queue_type::SDMA_BY_ENG_ID`]
    pub sdma_engine_id: u32,
    pub metadata_ring_size: u32,
}

/// `struct kfd_ioctl_destroy_queue_args`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DestroyQueueArgs {
    pub queue_id: u32,
    pub pad: u32,
}

/// `struct kfd_ioctl_update_queue_args`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UpdateQueueArgs {
    pub ring_base_address: u64,
    pub queue_id: u32,
    pub ring_size: u32,
    pub queue_percentage: u32,
    pub queue_priority: u32,
}

/// `struct kfd_ioctl_smi_events_args` (KFD 1.3+): ask for an SMI event fd on one GPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SmiEventsArgs {
    /// in: topology gpu_id
    pub gpuid: u32,
    /// out: a file descriptor delivering `KFD_SMI_EVENT_*` text records
    pub anon_fd: u32,
}

/// `struct kfd_ioctl_runtime_enable_args` (KFD 1.13+).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeEnableArgs {
    pub r_debug: u64,
    /// [`runtime_enable::MODE_ENABLE_MASK`] (0 disables), [`runtime_enable::MODE_TTMP_SAVE_MASK`]
    pub mode_mask: u32,
    pub capabilities_mask: u32,
}

/// `struct kfd_ioctl_dbg_trap_args` (KFD 1.13+): `pid`, `op`, then a 24-byte union whose member
/// is chosen by `op`. The union is kept as raw words; [`DbgTrapArgs`]'s constructors and
/// accessors name each member's fields.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DbgTrapArgs {
    /// Target pid, resolved by the kernel in the *caller's* pid namespace.
    pub pid: u32,
    /// [`dbg_trap_op`]
    pub op: u32,
    pub data: [u64; 3],
}

fn lo(word: u64) -> u32 {
    word as u32
}
fn hi(word: u64) -> u32 {
    (word >> 32) as u32
}
fn pack(lo: u32, hi: u32) -> u64 {
    u64::from(lo) | (u64::from(hi) << 32)
}

impl DbgTrapArgs {
    /// `enable { exception_mask, rinfo_ptr, rinfo_size, dbg_fd }`
    pub fn enable(pid: u32, exception_mask: u64, rinfo_ptr: u64, rinfo_size: u32, dbg_fd: u32) -> Self {
        Self { pid, op: dbg_trap_op::ENABLE, data: [exception_mask, rinfo_ptr, pack(rinfo_size, dbg_fd)] }
    }
    /// `suspend_queues { exception_mask, queue_array_ptr, num_queues, grace_period }`
    pub fn suspend_queues(
        pid: u32,
        exception_mask: u64,
        queue_array_ptr: u64,
        num_queues: u32,
        grace_period: u32,
    ) -> Self {
        Self {
            pid,
            op: dbg_trap_op::SUSPEND_QUEUES,
            data: [exception_mask, queue_array_ptr, pack(num_queues, grace_period)],
        }
    }
    /// `resume_queues { queue_array_ptr, num_queues, pad }`
    pub fn resume_queues(pid: u32, queue_array_ptr: u64, num_queues: u32) -> Self {
        Self { pid, op: dbg_trap_op::RESUME_QUEUES, data: [queue_array_ptr, u64::from(num_queues), 0] }
    }
    /// `queue_snapshot { exception_mask, snapshot_buf_ptr, num_queues, entry_size }`
    pub fn queue_snapshot(pid: u32, exception_mask: u64, buf_ptr: u64, num_queues: u32, entry_size: u32) -> Self {
        Self { pid, op: dbg_trap_op::GET_QUEUE_SNAPSHOT, data: [exception_mask, buf_ptr, pack(num_queues, entry_size)] }
    }
    /// `send_runtime_event { exception_mask, gpu_id, queue_id }`
    pub fn send_runtime_event(pid: u32, exception_mask: u64, gpu_id: u32, queue_id: u32) -> Self {
        Self { pid, op: dbg_trap_op::SEND_RUNTIME_EVENT, data: [exception_mask, pack(gpu_id, queue_id), 0] }
    }
    /// `set_exceptions_enabled { exception_mask }`
    pub fn set_exceptions_enabled(pid: u32, exception_mask: u64) -> Self {
        Self { pid, op: dbg_trap_op::SET_EXCEPTIONS_ENABLED, data: [exception_mask, 0, 0] }
    }
    /// `query_debug_event { exception_mask (in/out), gpu_id (out), queue_id (out) }`
    pub fn query_debug_event(pid: u32, exception_mask: u64) -> Self {
        Self { pid, op: dbg_trap_op::QUERY_DEBUG_EVENT, data: [exception_mask, 0, 0] }
    }
    /// `query_exception_info { info_ptr, info_size, source_id, exception_code, clear_exception }`
    pub fn query_exception_info(
        pid: u32,
        info_ptr: u64,
        info_size: u32,
        source_id: u32,
        exception_code: u32,
        clear: bool,
    ) -> Self {
        Self {
            pid,
            op: dbg_trap_op::QUERY_EXCEPTION_INFO,
            data: [info_ptr, pack(info_size, source_id), pack(exception_code, u32::from(clear))],
        }
    }
    /// A member without arguments (`DISABLE`).
    pub fn bare(pid: u32, op: u32) -> Self {
        Self { pid, op, data: [0; 3] }
    }

    /// First u64 of the union: `exception_mask` for enable/suspend/snapshot/query_debug_event.
    pub fn exception_mask(&self) -> u64 {
        self.data[0]
    }
    /// enable: `rinfo_size` (in/out)
    pub fn rinfo_size(&self) -> u32 {
        lo(self.data[2])
    }
    /// suspend/snapshot: `num_queues` (snapshot: in/out)
    pub fn num_queues(&self) -> u32 {
        match self.op {
            dbg_trap_op::RESUME_QUEUES => lo(self.data[1]),
            _ => lo(self.data[2]),
        }
    }
    /// suspend: `grace_period`
    pub fn grace_period(&self) -> u32 {
        hi(self.data[2])
    }
    /// snapshot: `entry_size` (in/out)
    pub fn entry_size(&self) -> u32 {
        hi(self.data[2])
    }
    /// query_debug_event: `gpu_id` (out)
    pub fn event_gpu_id(&self) -> u32 {
        lo(self.data[1])
    }
    /// query_debug_event: `queue_id` (out)
    pub fn event_queue_id(&self) -> u32 {
        hi(self.data[1])
    }
}

/// `enum kfd_dbg_trap_operations`.
pub mod dbg_trap_op {
    pub const ENABLE: u32 = 0;
    pub const DISABLE: u32 = 1;
    pub const SEND_RUNTIME_EVENT: u32 = 2;
    pub const SET_EXCEPTIONS_ENABLED: u32 = 3;
    pub const SET_WAVE_LAUNCH_OVERRIDE: u32 = 4;
    pub const SET_WAVE_LAUNCH_MODE: u32 = 5;
    pub const SUSPEND_QUEUES: u32 = 6;
    pub const RESUME_QUEUES: u32 = 7;
    pub const SET_NODE_ADDRESS_WATCH: u32 = 8;
    pub const CLEAR_NODE_ADDRESS_WATCH: u32 = 9;
    pub const SET_FLAGS: u32 = 10;
    pub const QUERY_DEBUG_EVENT: u32 = 11;
    pub const QUERY_EXCEPTION_INFO: u32 = 12;
    pub const GET_QUEUE_SNAPSHOT: u32 = 13;
    pub const GET_DEVICE_SNAPSHOT: u32 = 14;

    /// The UAPI name of an op, for output.
    pub fn name(op: u32) -> Option<&'static str> {
        Some(match op {
            ENABLE => "ENABLE",
            DISABLE => "DISABLE",
            SEND_RUNTIME_EVENT => "SEND_RUNTIME_EVENT",
            SET_EXCEPTIONS_ENABLED => "SET_EXCEPTIONS_ENABLED",
            SET_WAVE_LAUNCH_OVERRIDE => "SET_WAVE_LAUNCH_OVERRIDE",
            SET_WAVE_LAUNCH_MODE => "SET_WAVE_LAUNCH_MODE",
            SUSPEND_QUEUES => "SUSPEND_QUEUES",
            RESUME_QUEUES => "RESUME_QUEUES",
            SET_NODE_ADDRESS_WATCH => "SET_NODE_ADDRESS_WATCH",
            CLEAR_NODE_ADDRESS_WATCH => "CLEAR_NODE_ADDRESS_WATCH",
            SET_FLAGS => "SET_FLAGS",
            QUERY_DEBUG_EVENT => "QUERY_DEBUG_EVENT",
            QUERY_EXCEPTION_INFO => "QUERY_EXCEPTION_INFO",
            GET_QUEUE_SNAPSHOT => "GET_QUEUE_SNAPSHOT",
            GET_DEVICE_SNAPSHOT => "GET_DEVICE_SNAPSHOT",
            _ => return None,
        })
    }
}

/// `struct kfd_queue_snapshot_entry` (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueSnapshotEntry {
    pub exception_status: u64,
    pub ring_base_address: u64,
    pub write_pointer_address: u64,
    pub read_pointer_address: u64,
    pub ctx_save_restore_address: u64,
    pub queue_id: u32,
    pub gpu_id: u32,
    pub ring_size: u32,
    pub queue_type: u32,
    pub ctx_save_restore_area_size: u32,
    pub reserved: u32,
}

/// `struct kfd_runtime_info` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeInfo {
    pub r_debug: u64,
    /// [`runtime_state`]
    pub runtime_state: u32,
    pub ttmp_setup: u32,
}

/// `KFD_IOC_QUEUE_TYPE_*` (ioctl values; sysfs prints the kernel-internal enum instead).
pub mod queue_type {
    pub const COMPUTE: u32 = 0x0;
    pub const SDMA: u32 = 0x1;
    pub const COMPUTE_AQL: u32 = 0x2;
    pub const SDMA_XGMI: u32 = 0x3;
    /// KFD 1.17+
    pub const SDMA_BY_ENG_ID: u32 = 0x4;

    pub fn name(queue_type: u32) -> Option<&'static str> {
        Some(match queue_type {
            COMPUTE => "compute",
            SDMA => "sdma",
            COMPUTE_AQL => "compute-aql",
            SDMA_XGMI => "sdma-xgmi",
            SDMA_BY_ENG_ID => "sdma-by-eng-id",
            _ => return None,
        })
    }
}

/// `DEBUG_RUNTIME_STATE_*`.
pub mod runtime_state {
    pub const DISABLED: u32 = 0;
    pub const ENABLED: u32 = 1;
    pub const ENABLED_BUSY: u32 = 2;
    pub const ENABLED_ERROR: u32 = 3;
}

/// `KFD_RUNTIME_ENABLE_MODE_*`.
pub mod runtime_enable {
    pub const MODE_ENABLE_MASK: u32 = 1;
    pub const MODE_TTMP_SAVE_MASK: u32 = 2;
}

/// Per-queue result bits ORed into the queue id array by SUSPEND/RESUME_QUEUES.
pub mod queue_status {
    /// `KFD_DBG_QUEUE_ERROR_MASK`: the hardware failed to suspend/resume the queue.
    pub const ERROR_MASK: u32 = 1 << 30;
    /// `KFD_DBG_QUEUE_INVALID_MASK`: no such queue, new (EC_QUEUE_NEW) or being destroyed.
    pub const INVALID_MASK: u32 = 1 << 31;
    /// The queue id without the status bits.
    pub const ID_MASK: u32 = !(ERROR_MASK | INVALID_MASK);
}

/// Exception codes (`enum kfd_dbg_trap_exception_code`); mask with [`ec_mask`].
pub mod exception {
    pub const EC_QUEUE_WAVE_ABORT: u32 = 1;
    pub const EC_QUEUE_WAVE_TRAP: u32 = 2;
    pub const EC_QUEUE_WAVE_MATH_ERROR: u32 = 3;
    pub const EC_QUEUE_WAVE_ILLEGAL_INSTRUCTION: u32 = 4;
    pub const EC_QUEUE_WAVE_MEMORY_VIOLATION: u32 = 5;
    pub const EC_QUEUE_WAVE_APERTURE_VIOLATION: u32 = 6;
    pub const EC_QUEUE_PREEMPTION_ERROR: u32 = 30;
    pub const EC_QUEUE_NEW: u32 = 31;
    pub const EC_DEVICE_QUEUE_DELETE: u32 = 32;
    pub const EC_DEVICE_NEW: u32 = 36;
    pub const EC_PROCESS_RUNTIME: u32 = 48;
    pub const EC_PROCESS_DEVICE_REMOVE: u32 = 49;

    /// `KFD_EC_MASK(ec)`
    pub const fn ec_mask(ec: u32) -> u64 {
        1u64 << (ec - 1)
    }
}

/// Smallest ring the kernel accepts (`KFD_MIN_QUEUE_RING_SIZE`).
pub const KFD_MIN_QUEUE_RING_SIZE: u32 = 1024;
/// `KFD_MAX_QUEUE_PRIORITY`
pub const KFD_MAX_QUEUE_PRIORITY: u32 = 15;

// Layouts from docs/kfd.md §1.2 (x86-64), checked against the headers of 6.1.192 and 6.12.117.
const _: () = {
    assert!(size_of::<GetVersionArgs>() == 8);
    assert!(size_of::<CreateQueueArgs>() == 88);
    assert!(size_of::<CreateQueueArgsV17>() == 96);
    assert!(offset_of!(CreateQueueArgs, doorbell_offset) == 24);
    assert!(offset_of!(CreateQueueArgs, ring_size) == 32);
    assert!(offset_of!(CreateQueueArgs, gpu_id) == 36);
    assert!(offset_of!(CreateQueueArgs, queue_type) == 40);
    assert!(offset_of!(CreateQueueArgs, queue_percentage) == 44);
    assert!(offset_of!(CreateQueueArgs, queue_priority) == 48);
    assert!(offset_of!(CreateQueueArgs, queue_id) == 52);
    assert!(offset_of!(CreateQueueArgs, eop_buffer_address) == 56);
    assert!(offset_of!(CreateQueueArgs, ctx_save_restore_address) == 72);
    assert!(offset_of!(CreateQueueArgs, ctx_save_restore_size) == 80);
    assert!(offset_of!(CreateQueueArgs, ctl_stack_size) == 84);
    assert!(offset_of!(CreateQueueArgsV17, sdma_engine_id) == 88);
    assert!(offset_of!(CreateQueueArgsV17, metadata_ring_size) == 92);
    assert!(size_of::<DestroyQueueArgs>() == 8);
    assert!(size_of::<UpdateQueueArgs>() == 24);
    assert!(offset_of!(UpdateQueueArgs, queue_id) == 8);
    assert!(offset_of!(UpdateQueueArgs, queue_priority) == 20);
    assert!(size_of::<RuntimeEnableArgs>() == 16);
    assert!(size_of::<SmiEventsArgs>() == 8);
    assert!(size_of::<DbgTrapArgs>() == 32);
    assert!(offset_of!(DbgTrapArgs, op) == 4);
    assert!(offset_of!(DbgTrapArgs, data) == 8);
    assert!(size_of::<QueueSnapshotEntry>() == 64);
    assert!(offset_of!(QueueSnapshotEntry, queue_id) == 40);
    assert!(offset_of!(QueueSnapshotEntry, queue_type) == 52);
    assert!(offset_of!(QueueSnapshotEntry, ctx_save_restore_area_size) == 56);
    assert!(size_of::<RuntimeInfo>() == 16);
};
