//! Queue lifecycle on the ioctl path: create, destroy and update.
//!
//! Both handlers run in the ioctl caller's context (`kfd_ioctl()` refuses a /dev/kfd fd used by
//! another process), so `current` is the queue's owner. `data` is the kernel's copy of the ioctl
//! arguments (`kfd_ioctl()` copies them in before and out after the handler), read here rather
//! than any internal struct because the UAPI layout is stable across versions.

use aya_ebpf::{
    helpers::bpf_probe_read_kernel,
    macros::{kprobe, kretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use aya_log_ebpf::warn;
use gpreempt_common::{
    kfd_uapi::{CreateQueueArgs, UpdateQueueArgs},
    record::{QueueCreateRecord, QueueDestroyRecord, QueueUpdateRecord, RecordKind, counter, stash_slot},
};

use crate::maps::{count, emit, header, stash, take};

/// match-proto:v6.1.192,v6.12.117:drivers/gpu/drm/amd/amdkfd/kfd_chardev.c:
/// static int kfd_ioctl_create_queue(struct file *filep, struct kfd_process *p, void *data)
#[kprobe]
pub fn create_queue_entry(ctx: ProbeContext) -> u32 {
    let data: u64 = ctx.arg(2).unwrap_or(0);
    stash(stash_slot::CREATE_QUEUE, [data, 0, 0, 0, 0]);
    0
}

/// Return of `kfd_ioctl_create_queue`: reads the first 88 bytes of `data` (the layout shared by
/// KFD 1.1–1.22; `sdma_engine_id` at 88 exists only from 1.17 and is not read).
#[kretprobe]
pub fn create_queue_return(ctx: RetProbeContext) -> u32 {
    let Some(entry) = take(stash_slot::CREATE_QUEUE) else { return 0 };
    // SAFETY: bpf_probe_read_kernel checks the address; a fault returns an error.
    let Ok(args) = (unsafe { bpf_probe_read_kernel(entry.args[0] as *const CreateQueueArgs) }) else {
        count(counter::READ_FAILED);
        warn!(&ctx, "kfd_ioctl_create_queue: cannot read args at {:x}", entry.args[0]);
        return 0;
    };
    let ret: i32 = ctx.ret();
    emit(&QueueCreateRecord { header: header(RecordKind::QueueCreate, entry.entry_ns), args, ret: i64::from(ret) });
    0
}

/// match-proto:v6.1.192,v6.12.117:drivers/gpu/drm/amd/amdkfd/kfd_chardev.c:
/// static int kfd_ioctl_destroy_queue(struct file *filp, struct kfd_process *p, void *data)
#[kprobe]
pub fn destroy_queue_entry(ctx: ProbeContext) -> u32 {
    let data: u64 = ctx.arg(2).unwrap_or(0);
    stash(stash_slot::DESTROY_QUEUE, [data, 0, 0, 0, 0]);
    0
}

/// Return of `kfd_ioctl_destroy_queue`: `data` is `struct kfd_ioctl_destroy_queue_args`
/// (`queue_id` at offset 0).
#[kretprobe]
pub fn destroy_queue_return(ctx: RetProbeContext) -> u32 {
    let Some(entry) = take(stash_slot::DESTROY_QUEUE) else { return 0 };
    // SAFETY: as above.
    let Ok(queue_id) = (unsafe { bpf_probe_read_kernel(entry.args[0] as *const u32) }) else {
        count(counter::READ_FAILED);
        warn!(&ctx, "kfd_ioctl_destroy_queue: cannot read args at {:x}", entry.args[0]);
        return 0;
    };
    let ret: i32 = ctx.ret();
    emit(&QueueDestroyRecord {
        header: header(RecordKind::QueueDestroy, entry.entry_ns),
        queue_id,
        _pad: 0,
        ret: i64::from(ret),
    });
    0
}

/// match-proto:v6.1.192,v6.12.117:drivers/gpu/drm/amd/amdkfd/kfd_chardev.c:
/// static int kfd_ioctl_update_queue(struct file *filp, struct kfd_process *p, void *data)
#[kprobe]
pub fn update_queue_entry(ctx: ProbeContext) -> u32 {
    let data: u64 = ctx.arg(2).unwrap_or(0);
    stash(stash_slot::UPDATE_QUEUE, [data, 0, 0, 0, 0]);
    0
}

/// Return of `kfd_ioctl_update_queue`: `data` is `struct kfd_ioctl_update_queue_args` (24 bytes,
/// unchanged since KFD 1.1).
#[kretprobe]
pub fn update_queue_return(ctx: RetProbeContext) -> u32 {
    let Some(entry) = take(stash_slot::UPDATE_QUEUE) else { return 0 };
    // SAFETY: as above.
    let Ok(args) = (unsafe { bpf_probe_read_kernel(entry.args[0] as *const UpdateQueueArgs) }) else {
        count(counter::READ_FAILED);
        return 0;
    };
    let ret: i32 = ctx.ret();
    emit(&QueueUpdateRecord { header: header(RecordKind::QueueUpdate, entry.entry_ns), args, ret: i64::from(ret) });
    0
}
