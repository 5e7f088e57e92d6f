//! Debug-trap preemption (KFD 1.13+, Linux 6.5+): the `AMDKFD_IOC_DBG_TRAP` and
//! `AMDKFD_IOC_RUNTIME_ENABLE` handlers, and the `suspend_queues` / `resume_queues` they reach.
//!
//! The ioctl handlers run in the caller's context (the debugger, or the target for
//! RUNTIME_ENABLE) and read the kernel's copy of the UAPI arguments (`pairs::ioctl_pair!`).
//! `suspend_queues`/`resume_queues` also run from `kfd_dbg_trap_deactivate` (DISABLE, runtime
//! disable, debugger exit), so their target comes from the `kfd_process*` argument, not `current`.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user},
    macros::{kprobe, kretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use gpreempt_common::{
    kfd_uapi::{DbgTrapArgs, RuntimeEnableArgs},
    record::{
        CONTEXT_ID_PRIMARY, DebugTrapRecord, EntryStash, MAX_QUEUE_IDS, ProbeConfig, QueueSuspendRecord,
        RuntimeEnableRecord, counter, stash_slot,
    },
};

use crate::{
    maps::{config, count, emit, header, known_owner, learn_owner, peek, read_at, stash_call, take},
    pairs::ioctl_pair,
};

/// The owner of the `kfd_process *p` a suspend or resume acts on. With BTF offsets or a pointer
/// learned at `/dev/kfd` open, that; otherwise (no module BTF, as on Linux 5.10, and a target
/// that opened `/dev/kfd` before the tracer started) the call it is nested in says: inside
/// `kfd_ioctl_set_debug_trap` (SUSPEND/RESUME/DISABLE: `kfd_dbg_trap_*` → `suspend_queues`/
/// `resume_queues` on the same thread, 6.12.117) the target is the ioctl's `pid` (byte 0 of the
/// kernel's copy of `kfd_ioctl_dbg_trap_args`), in the debugger's pid namespace — the host tgid
/// when the debugger runs on the host, as gpreempt does; inside `kfd_ioctl_runtime_enable`
/// (runtime disable resumes) it is the caller. The pointer is then learned, so the eviction and
/// teardown probes of that process find their owner too.
fn debugged_owner(cfg: &ProbeConfig, p: u64) -> u32 {
    if let Some(tgid) = known_owner(cfg, p) {
        return tgid;
    }
    let nested = if let Some(ioctl) = peek(stash_slot::DEBUG_TRAP) {
        read_at::<u32>(ioctl.args[0], 0).unwrap_or(0)
    } else if peek(stash_slot::RUNTIME_ENABLE).is_some() {
        (bpf_get_current_pid_tgid() >> 32) as u32
    } else {
        0
    };
    if nested == 0 {
        count(counter::OWNER_UNKNOWN);
    } else {
        learn_owner(p, nested);
    }
    nested
}

ioctl_pair!(
    /// match-proto:v6.12.117,v7.3.4:drivers/gpu/drm/amd/amdkfd/kfd_chardev.c:
    /// static int kfd_ioctl_set_debug_trap(struct file *filep, struct kfd_process *p, void *data)
    /// (absent in 6.1.192, KFD 1.11). `data` is `struct kfd_ioctl_dbg_trap_args` (32 bytes) after
    /// the call; the return value is the queue count for SUSPEND/RESUME.
    debug_trap_entry,
    debug_trap_return,
    stash_slot::DEBUG_TRAP,
    "kfd_ioctl_set_debug_trap",
    DbgTrapArgs,
    // Refused through a secondary context's file (EOPNOTSUPP, Linux 7.0, docs/kfd.md §1.4).
    |header, args, ret, context_id| (context_id == CONTEXT_ID_PRIMARY).then_some(DebugTrapRecord { header, args, ret })
);

ioctl_pair!(
    /// match-proto:v6.12.117,v7.3.4:drivers/gpu/drm/amd/amdkfd/kfd_chardev.c:
    /// static int kfd_ioctl_runtime_enable(struct file *filep, struct kfd_process *p, void *data)
    /// (absent in 6.1.192). With a debugger attached it sleeps until the debugger acknowledges
    /// the runtime event: many concurrent callers can exceed the kretprobe instance limit, and
    /// the loader reports those misses.
    runtime_enable_entry,
    runtime_enable_return,
    stash_slot::RUNTIME_ENABLE,
    "kfd_ioctl_runtime_enable",
    RuntimeEnableArgs,
    // A secondary context's runtime state is not the process's (Linux 7.0): left out.
    |header, args, ret, context_id| {
        (context_id == CONTEXT_ID_PRIMARY).then_some(RuntimeEnableRecord { header, args, ret })
    }
);

/// match-proto:v6.12.117,v7.3.4:drivers/gpu/drm/amd/amdkfd/kfd_device_queue_manager.c:
/// int suspend_queues(struct kfd_process *p, uint32_t num_queues, uint32_t grace_period,
///                    uint64_t exception_clear_mask, uint32_t *usr_queue_id_array)
#[kprobe]
pub fn suspend_queues_entry(ctx: ProbeContext) -> u32 {
    let cfg = config();
    let p: u64 = ctx.arg(0).unwrap_or(0);
    let owner = debugged_owner(&cfg, p);
    let num: u64 = ctx.arg::<u32>(1).map_or(0, u64::from);
    let grace: u64 = ctx.arg::<u32>(2).map_or(0, u64::from);
    let mask: u64 = ctx.arg(3).unwrap_or(0);
    let array: u64 = ctx.arg(4).unwrap_or(0);
    stash_call(stash_slot::SUSPEND_QUEUES, owner, 0, [p, num, grace, mask, array]);
    0
}

#[kretprobe]
pub fn suspend_queues_return(ctx: RetProbeContext) -> u32 {
    let Some(entry) = take(stash_slot::SUSPEND_QUEUES) else { return 0 };
    let ret: i32 = ctx.ret();
    emit_suspend(&entry, 0, ret);
    0
}

/// match-proto:v6.12.117,v7.3.4:drivers/gpu/drm/amd/amdkfd/kfd_device_queue_manager.c:
/// int resume_queues(struct kfd_process *p, uint32_t num_queues, uint32_t *usr_queue_id_array)
/// (`usr_queue_id_array` is NULL when called from `kfd_dbg_trap_deactivate`: resume all)
#[kprobe]
pub fn resume_queues_entry(ctx: ProbeContext) -> u32 {
    let cfg = config();
    let p: u64 = ctx.arg(0).unwrap_or(0);
    let owner = debugged_owner(&cfg, p);
    let num: u64 = ctx.arg::<u32>(1).map_or(0, u64::from);
    let array: u64 = ctx.arg(2).unwrap_or(0);
    stash_call(stash_slot::RESUME_QUEUES, owner, 0, [p, num, 0, 0, array]);
    0
}

#[kretprobe]
pub fn resume_queues_return(ctx: RetProbeContext) -> u32 {
    let Some(entry) = take(stash_slot::RESUME_QUEUES) else { return 0 };
    let ret: i32 = ctx.ret();
    emit_suspend(&entry, 1, ret);
    0
}

/// Both calls copy the user array back with bit 31 (INVALID) / bit 30 (ERROR) per id before
/// returning, so reading it at return shows the per-queue outcome.
/// The stash holds `[p, num_queues, grace_period, exception_clear_mask, array]`.
fn emit_suspend(entry: &EntryStash, resume: u32, ret: i32) {
    let [_, num, grace, mask, array] = entry.args;
    let mut record = QueueSuspendRecord {
        header: header(entry.entry_ns),
        target: entry.owner,
        num_queues: num as u32,
        grace_period: grace as u32,
        resume,
        exception_clear_mask: mask,
        ids_read: 0,
        _pad: 0,
        queue_ids: [0; MAX_QUEUE_IDS],
        ret: i64::from(ret),
    };
    if array != 0 {
        for i in 0..MAX_QUEUE_IDS {
            if i as u64 >= num {
                break;
            }
            // SAFETY: bpf_probe_read_user checks the user address; a fault ends the copy.
            match unsafe { bpf_probe_read_user((array + 4 * i as u64) as *const u32) } {
                Ok(id) => {
                    record.queue_ids[i] = id;
                    record.ids_read = i as u32 + 1;
                }
                Err(_) => break,
            }
        }
    }
    emit(&record);
}
