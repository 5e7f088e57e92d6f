//! Process lifetime: `/dev/kfd` open (`kfd_create_process`), teardown and release, and every
//! queue removal.
//!
//! Teardown runs in a `kfd_process_wq` kworker (docs/kfd.md §3.2): the owner comes from the
//! `kfd_process*` argument (`maps::owner_of_process`), and the queue removals nested in a
//! teardown are attributed to it and its KFD context through the per-thread `TEARDOWN` map.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{kprobe, kretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use gpreempt_common::record::{
    CONTEXT_ID_PRIMARY, CallPhase, KfdFn, OFFSET_UNKNOWN, ProcessCreateRecord, counter, stash_slot,
};

use crate::{
    maps::{
        clear_teardown, config, context_of, count, emit, forget_owner, header, learn_owner, owner_of_process, peek,
        read_at, set_teardown, stash, take, task_tgid, teardown_of_thread,
    },
    pairs::{arg, emit_call, now},
};

/// match-proto:v6.1.192:drivers/gpu/drm/amd/amdkfd/kfd_process.c:
/// struct kfd_process *kfd_create_process(struct file *filep)
/// match-proto:v6.12.117,v7.3.4: struct kfd_process *kfd_create_process(struct task_struct *thread)
/// Called from `kfd_open` (current = opener) and from DBG_TRAP ENABLE for a ptraced target
/// (current = debugger, `thread` = target): the task argument wins when its layout is known.
#[kprobe]
pub fn create_process_entry(ctx: ProbeContext) -> u32 {
    stash(stash_slot::CREATE_PROCESS, [arg(&ctx, 0), 0, 0, 0, 0]);
    0
}

/// Return of `kfd_create_process`: learn `kfd_process*` → owner for kworker probes without BTF.
#[kretprobe]
pub fn create_process_return(ctx: RetProbeContext) -> u32 {
    let Some(entry) = take(stash_slot::CREATE_PROCESS) else { return 0 };
    let process: u64 = ctx.ret();
    // IS_ERR(): the last 4095 values are errnos.
    if process == 0 || process >= (-4095i64) as u64 {
        return 0;
    }
    let cfg = config();
    let from_task = if cfg.create_process_takes_task != 0 { task_tgid(&cfg, entry.args[0]) } else { None };
    let tgid = from_task.unwrap_or((bpf_get_current_pid_tgid() >> 32) as u32);
    learn_owner(process, tgid);
    emit(&ProcessCreateRecord {
        header: header(entry.entry_ns),
        process,
        tgid,
        from_task: u32::from(from_task.is_some()),
    });
    0
}

/// match-proto:v6.1.192,v6.12.117,v7.3.4:kfd_process.c: static void kfd_process_wq_release(struct work_struct *work)
/// Runs in a `kfd_process_wq` kworker once the last reference is gone; the sysfs directory is
/// removed here. `p = container_of(work, struct kfd_process, release_work)` needs BTF.
#[kprobe]
pub fn process_release_entry(ctx: ProbeContext) -> u32 {
    let cfg = config();
    let work = arg(&ctx, 0);
    let (p, owner) = if cfg.process_release_work != OFFSET_UNKNOWN && work > u64::from(cfg.process_release_work) {
        let p = work - u64::from(cfg.process_release_work);
        let context_id = context_of(&cfg, p);
        if context_id != CONTEXT_ID_PRIMARY {
            // A secondary context's release (its file closed, Linux 7.0): not the process's end;
            // its queue removals are keyed by its context.
            set_teardown(owner_of_process(&cfg, p), context_id);
            stash(KfdFn::ProcessRelease.stash_slot(), [0; 5]);
            return 0;
        }
        (p, owner_of_process(&cfg, p))
    } else {
        // No BTF: the owner comes from `kfd_process_dequeue_from_all_devices` just after.
        count(counter::OWNER_UNKNOWN);
        (0, 0)
    };
    if owner != 0 {
        set_teardown(owner, CONTEXT_ID_PRIMARY);
    }
    stash(KfdFn::ProcessRelease.stash_slot(), [p, 0, 0, 0, 0]);
    let now = now();
    emit_call(KfdFn::ProcessRelease, CallPhase::Entry, now, owner, 0, [p, 0, 0, 0], 0);
    0
}

/// Return of `kfd_process_wq_release`: ends this kworker's teardown attribution.
#[kretprobe]
pub fn process_release_return(_ctx: RetProbeContext) -> u32 {
    clear_teardown();
    if let Some(e) = take(KfdFn::ProcessRelease.stash_slot()) {
        if e.args[0] != 0 {
            forget_owner(e.args[0]);
        }
    }
    0
}

/// match-proto:v6.1.192,v6.12.117,v7.3.4:kfd_process.c: void kfd_process_dequeue_from_all_devices(struct kfd_process *p)
/// Called from `kfd_process_wq_release` (kworker) before `pqm_uninit` destroys the queues.
#[kprobe]
pub fn dequeue_all_entry(ctx: ProbeContext) -> u32 {
    let cfg = config();
    let p = arg(&ctx, 0);
    let context_id = context_of(&cfg, p);
    let owner = owner_of_process(&cfg, p);
    if context_id != CONTEXT_ID_PRIMARY {
        // A secondary context's teardown (Linux 7.0): not the process's end.
        set_teardown(owner, context_id);
        return 0;
    }
    if owner != 0 {
        set_teardown(owner, CONTEXT_ID_PRIMARY);
    }
    let now = now();
    emit_call(KfdFn::ProcessDequeueAll, CallPhase::Entry, now, owner, 0, [p, 0, 0, 0], 0);
    0
}

/// match-proto:v6.1.192,v6.12.117,v7.3.4:kfd_process.c: void kfd_procfs_del_queue(struct queue *q)
/// Every queue removal: destroy ioctl (current = owner) and teardown (kworker: owner from the
/// enclosing release). `q->properties.queue_id` is at q+48 on 6.1/6.12 (docs/kfd.md §3.3). The
/// context (Linux 7.0) is the enclosing teardown's, or that of the DESTROY_QUEUE's file (its entry
/// stashed the handler's `p`), else the primary.
#[kprobe]
pub fn procfs_del_queue(ctx: ProbeContext) -> u32 {
    let cfg = config();
    let q = arg(&ctx, 0);
    if q == 0 {
        return 0;
    }
    let teardown = teardown_of_thread();
    let context_id = match teardown {
        Some(t) => t.context_id,
        None => peek(stash_slot::DESTROY_QUEUE).map_or(CONTEXT_ID_PRIMARY, |ioctl| context_of(&cfg, ioctl.args[1])),
    };
    let queue_id = if cfg.queue_queue_id == OFFSET_UNKNOWN {
        u64::from(u32::MAX)
    } else {
        read_at::<u32>(q, cfg.queue_queue_id).map_or(u64::from(u32::MAX), u64::from)
    };
    let owner = teardown.map_or((bpf_get_current_pid_tgid() >> 32) as u32, |t| t.owner);
    let now = now();
    emit_call(KfdFn::ProcfsDelQueue, CallPhase::Entry, now, owner, 0, [queue_id, u64::from(context_id), 0, 0], 0);
    0
}
