//! Internal KFD functions: eviction/restore, the HWS runlist path with its fence wait, MES,
//! GPU reset, and process lifetime. Each becomes a [`KfdCallRecord`] (entry and/or return).
//!
//! None of these may trust `current` for the owner (KFD.md §3.2): TTM eviction/restore and
//! process teardown run in kworkers, SVM/userptr eviction in MMU-notifier context. The owner
//! comes from the `kfd_process*` / `qcm_process_device*` argument (`maps::owner_of_*`), the gpu
//! from `dqm->dev->id` (BTF offsets). HWS calls nested in a suspend/eviction run on the same
//! thread; userspace pairs them by thread and time.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{kprobe, kretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use gpreempt_common::record::{
    KfdCallRecord, ProcessCreateRecord, RecordKind, SmiQueueRecord, call_phase, counter, kfd_fn, stash_slot,
};

use crate::maps::{
    clear_teardown, config, count, emit, forget_owner, gpu_of_dqm, gpu_of_node, header, learn_owner, owner_of_process,
    owner_of_qpd, read_at, set_teardown, stash, stash_call, take, task_tgid, teardown_owner,
};

fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

#[inline(always)]
fn emit_call(function: u32, phase: u32, entry_ns: u64, owner: u32, gpu_id: u32, args: [u64; 4], ret: i64) {
    emit(&KfdCallRecord { header: header(RecordKind::KfdCall, entry_ns), function, phase, owner, gpu_id, args, ret });
}

fn now() -> u64 {
    // SAFETY: helper without preconditions.
    unsafe { aya_ebpf::helpers::bpf_ktime_get_boot_ns() }
}

/// Stash what the entry knows; the return probe writes the record.
fn enter(function: u32, owner: u32, gpu_id: u32, args: [u64; 4]) {
    stash_call(stash_slot::KFD_CALL_BASE + function, owner, gpu_id, [args[0], args[1], args[2], args[3], 0]);
}

fn leave(ctx: &RetProbeContext, function: u32) {
    let Some(e) = take(stash_slot::KFD_CALL_BASE + function) else { return };
    let ret: i64 = ctx.ret();
    emit_call(
        function,
        call_phase::RETURN,
        e.entry_ns,
        e.owner,
        e.gpu_id,
        [e.args[0], e.args[1], e.args[2], e.args[3]],
        ret,
    );
}

// ---- eviction / restore ---------------------------------------------------------------------

/// match-proto:v6.1.192,v6.12.117:drivers/gpu/drm/amd/amdkfd/kfd_smi_events.c:
/// void kfd_smi_event_queue_eviction(struct kfd_node *node, pid_t pid, uint32_t trigger)
/// (`struct kfd_dev *dev` on 6.1). A pending patch passes a `task_struct*` instead of the pid:
/// `smi_arg_is_pid` (from BTF) says which.
#[kprobe]
pub fn smi_eviction(ctx: ProbeContext) -> u32 {
    smi(&ctx, 0);
    0
}

/// match-proto:v6.1.192,v6.12.117:drivers/gpu/drm/amd/amdkfd/kfd_smi_events.c:
/// void kfd_smi_event_queue_restore(struct kfd_node *node, pid_t pid)
#[kprobe]
pub fn smi_restore(ctx: ProbeContext) -> u32 {
    smi(&ctx, 1);
    0
}

fn smi(ctx: &ProbeContext, restore: u32) {
    let cfg = config();
    let pid = if cfg.smi_arg_is_pid != 0 {
        ctx.arg::<u32>(1).unwrap_or(0)
    } else {
        task_tgid(&cfg, arg(ctx, 1)).unwrap_or(0)
    };
    let trigger = if restore == 0 { ctx.arg::<u32>(2).unwrap_or(0) } else { 0 };
    let now = now();
    emit(&SmiQueueRecord {
        header: header(RecordKind::SmiQueue, now),
        pid,
        trigger,
        gpu_id: gpu_of_node(&cfg, arg(ctx, 0)),
        restore,
    });
}

/// `int (struct device_queue_manager *dqm, struct qcm_process_device *qpd)`: the per-GPU
/// eviction/restore ops (dqm->ops), all of 6.1.192 and 6.12.117.
fn dqm_qpd_entry(ctx: &ProbeContext, function: u32) {
    let cfg = config();
    let (dqm, qpd) = (arg(ctx, 0), arg(ctx, 1));
    enter(function, owner_of_qpd(&cfg, qpd), gpu_of_dqm(&cfg, dqm), [dqm, qpd, 0, 0]);
}

/// match-proto:v6.1.192,v6.12.117:drivers/gpu/drm/amd/amdkfd/kfd_device_queue_manager.c:
/// static int evict_process_queues_cpsch(struct device_queue_manager *dqm, struct qcm_process_device *qpd)
#[kprobe]
pub fn evict_cpsch_entry(ctx: ProbeContext) -> u32 {
    dqm_qpd_entry(&ctx, kfd_fn::EVICT_PROCESS_QUEUES_CPSCH);
    0
}
#[kretprobe]
pub fn evict_cpsch_return(ctx: RetProbeContext) -> u32 {
    leave(&ctx, kfd_fn::EVICT_PROCESS_QUEUES_CPSCH);
    0
}
/// match-proto:v6.1.192,v6.12.117:kfd_device_queue_manager.c:
/// static int evict_process_queues_nocpsch(struct device_queue_manager *dqm, struct qcm_process_device *qpd)
#[kprobe]
pub fn evict_nocpsch_entry(ctx: ProbeContext) -> u32 {
    dqm_qpd_entry(&ctx, kfd_fn::EVICT_PROCESS_QUEUES_NOCPSCH);
    0
}
#[kretprobe]
pub fn evict_nocpsch_return(ctx: RetProbeContext) -> u32 {
    leave(&ctx, kfd_fn::EVICT_PROCESS_QUEUES_NOCPSCH);
    0
}
/// match-proto:v6.1.192,v6.12.117:kfd_device_queue_manager.c:
/// static int restore_process_queues_cpsch(struct device_queue_manager *dqm, struct qcm_process_device *qpd)
#[kprobe]
pub fn restore_cpsch_entry(ctx: ProbeContext) -> u32 {
    dqm_qpd_entry(&ctx, kfd_fn::RESTORE_PROCESS_QUEUES_CPSCH);
    0
}
#[kretprobe]
pub fn restore_cpsch_return(ctx: RetProbeContext) -> u32 {
    leave(&ctx, kfd_fn::RESTORE_PROCESS_QUEUES_CPSCH);
    0
}
/// match-proto:v6.1.192,v6.12.117:kfd_device_queue_manager.c:
/// static int restore_process_queues_nocpsch(struct device_queue_manager *dqm, struct qcm_process_device *qpd)
#[kprobe]
pub fn restore_nocpsch_entry(ctx: ProbeContext) -> u32 {
    dqm_qpd_entry(&ctx, kfd_fn::RESTORE_PROCESS_QUEUES_NOCPSCH);
    0
}
#[kretprobe]
pub fn restore_nocpsch_return(ctx: RetProbeContext) -> u32 {
    leave(&ctx, kfd_fn::RESTORE_PROCESS_QUEUES_NOCPSCH);
    0
}

/// match-proto:v6.1.192,v6.12.117:drivers/gpu/drm/amd/amdkfd/kfd_process.c:
/// int kfd_process_evict_queues(struct kfd_process *p, uint32_t trigger)
#[kprobe]
pub fn process_evict_entry(ctx: ProbeContext) -> u32 {
    let cfg = config();
    enter(kfd_fn::PROCESS_EVICT_QUEUES, owner_of_process(&cfg, arg(&ctx, 0)), 0, [arg(&ctx, 1) & 0xffff_ffff, 0, 0, 0]);
    0
}
#[kretprobe]
pub fn process_evict_return(ctx: RetProbeContext) -> u32 {
    leave(&ctx, kfd_fn::PROCESS_EVICT_QUEUES);
    0
}
/// match-proto:v6.1.192,v6.12.117:kfd_process.c: int kfd_process_restore_queues(struct kfd_process *p)
#[kprobe]
pub fn process_restore_entry(ctx: ProbeContext) -> u32 {
    let cfg = config();
    enter(kfd_fn::PROCESS_RESTORE_QUEUES, owner_of_process(&cfg, arg(&ctx, 0)), 0, [0; 4]);
    0
}
#[kretprobe]
pub fn process_restore_return(ctx: RetProbeContext) -> u32 {
    leave(&ctx, kfd_fn::PROCESS_RESTORE_QUEUES);
    0
}

// ---- HWS: runlist, unmap, fence wait ---------------------------------------------------------

/// match-proto:v6.1.192:kfd_device_queue_manager.c: static int execute_queues_cpsch(struct
/// device_queue_manager *dqm, enum kfd_unmap_queues_filter filter, uint32_t filter_param)
/// match-proto:v6.12.117: ... uint32_t filter_param, uint32_t grace_period) (`.constprop.0`)
#[kprobe]
pub fn execute_queues_entry(ctx: ProbeContext) -> u32 {
    let cfg = config();
    let dqm = arg(&ctx, 0);
    enter(kfd_fn::EXECUTE_QUEUES_CPSCH, 0, gpu_of_dqm(&cfg, dqm), [arg(&ctx, 1), arg(&ctx, 2), arg(&ctx, 3), 0]);
    0
}
#[kretprobe]
pub fn execute_queues_return(ctx: RetProbeContext) -> u32 {
    leave(&ctx, kfd_fn::EXECUTE_QUEUES_CPSCH);
    0
}

/// match-proto:v6.1.192:kfd_device_queue_manager.c: static int unmap_queues_cpsch(struct
/// device_queue_manager *dqm, enum kfd_unmap_queues_filter filter, uint32_t filter_param, bool reset)
/// match-proto:v6.12.117: ... uint32_t filter_param, uint32_t grace_period, bool reset)
#[kprobe]
pub fn unmap_queues_entry(ctx: ProbeContext) -> u32 {
    let cfg = config();
    let dqm = arg(&ctx, 0);
    enter(
        kfd_fn::UNMAP_QUEUES_CPSCH,
        0,
        gpu_of_dqm(&cfg, dqm),
        [arg(&ctx, 1), arg(&ctx, 2), arg(&ctx, 3), arg(&ctx, 4)],
    );
    0
}
#[kretprobe]
pub fn unmap_queues_return(ctx: RetProbeContext) -> u32 {
    leave(&ctx, kfd_fn::UNMAP_QUEUES_CPSCH);
    0
}

/// match-proto:v6.1.192,v6.12.117:kfd_device_queue_manager.c: static int map_queues_cpsch(struct device_queue_manager *dqm)
#[kprobe]
pub fn map_queues_entry(ctx: ProbeContext) -> u32 {
    let cfg = config();
    enter(kfd_fn::MAP_QUEUES_CPSCH, 0, gpu_of_dqm(&cfg, arg(&ctx, 0)), [0; 4]);
    0
}
#[kretprobe]
pub fn map_queues_return(ctx: RetProbeContext) -> u32 {
    leave(&ctx, kfd_fn::MAP_QUEUES_CPSCH);
    0
}

/// match-proto:v6.1.192:kfd_device_queue_manager.c:
/// int amdkfd_fence_wait_timeout(uint64_t *fence_addr, uint64_t fence_value, unsigned int timeout_ms)
/// match-proto:v6.12.117: int amdkfd_fence_wait_timeout(struct device_queue_manager *dqm, uint64_t fence_value, unsigned int timeout_ms)
/// Entry→return is the HWS preemption latency (UNMAP_QUEUES + CWSR save); -ETIME on timeout.
#[kprobe]
pub fn fence_wait_entry(ctx: ProbeContext) -> u32 {
    let cfg = config();
    let first = arg(&ctx, 0);
    let gpu = if cfg.fence_wait_takes_dqm != 0 { gpu_of_dqm(&cfg, first) } else { 0 };
    enter(kfd_fn::FENCE_WAIT_TIMEOUT, 0, gpu, [arg(&ctx, 1), arg(&ctx, 2) & 0xffff_ffff, 0, 0]);
    0
}
#[kretprobe]
pub fn fence_wait_return(ctx: RetProbeContext) -> u32 {
    leave(&ctx, kfd_fn::FENCE_WAIT_TIMEOUT);
    0
}

/// match-proto:v6.1.192,v6.12.117:kfd_packet_manager.c:
/// int pm_send_runlist(struct packet_manager *pm, struct list_head *dqm_queues)
#[kprobe]
pub fn send_runlist_entry(_ctx: ProbeContext) -> u32 {
    enter(kfd_fn::PM_SEND_RUNLIST, 0, 0, [0; 4]);
    0
}
#[kretprobe]
pub fn send_runlist_return(ctx: RetProbeContext) -> u32 {
    leave(&ctx, kfd_fn::PM_SEND_RUNLIST);
    0
}

/// match-proto:v6.1.192,v6.12.117:kfd_packet_manager.c: int pm_send_unmap_queue(struct
/// packet_manager *pm, enum kfd_unmap_queues_filter filter, uint32_t filter_param, bool reset)
#[kprobe]
pub fn send_unmap_entry(ctx: ProbeContext) -> u32 {
    enter(
        kfd_fn::PM_SEND_UNMAP_QUEUE,
        0,
        0,
        [arg(&ctx, 1) & 0xffff_ffff, arg(&ctx, 2) & 0xffff_ffff, arg(&ctx, 3) & 0xff, 0],
    );
    0
}
#[kretprobe]
pub fn send_unmap_return(ctx: RetProbeContext) -> u32 {
    leave(&ctx, kfd_fn::PM_SEND_UNMAP_QUEUE);
    0
}

// ---- MES (gfx11/gfx12) -----------------------------------------------------------------------

/// match-proto:v6.12.117:drivers/gpu/drm/amd/amdgpu/mes_v11_0.c: static int
/// mes_v11_0_remove_hw_queue(struct amdgpu_mes *mes, struct mes_remove_queue_input *input)
#[kprobe]
pub fn mes11_remove_entry(_ctx: ProbeContext) -> u32 {
    enter(kfd_fn::MES_V11_REMOVE_HW_QUEUE, 0, 0, [0; 4]);
    0
}
#[kretprobe]
pub fn mes11_remove_return(ctx: RetProbeContext) -> u32 {
    leave(&ctx, kfd_fn::MES_V11_REMOVE_HW_QUEUE);
    0
}
/// match-proto:v6.12.117:mes_v11_0.c: static int mes_v11_0_add_hw_queue(struct amdgpu_mes *mes, struct mes_add_queue_input *input)
#[kprobe]
pub fn mes11_add_entry(_ctx: ProbeContext) -> u32 {
    enter(kfd_fn::MES_V11_ADD_HW_QUEUE, 0, 0, [0; 4]);
    0
}
#[kretprobe]
pub fn mes11_add_return(ctx: RetProbeContext) -> u32 {
    leave(&ctx, kfd_fn::MES_V11_ADD_HW_QUEUE);
    0
}
/// match-proto:v6.12.117:mes_v12_0.c: static int mes_v12_0_remove_hw_queue(struct amdgpu_mes *mes, struct mes_remove_queue_input *input)
#[kprobe]
pub fn mes12_remove_entry(_ctx: ProbeContext) -> u32 {
    enter(kfd_fn::MES_V12_REMOVE_HW_QUEUE, 0, 0, [0; 4]);
    0
}
#[kretprobe]
pub fn mes12_remove_return(ctx: RetProbeContext) -> u32 {
    leave(&ctx, kfd_fn::MES_V12_REMOVE_HW_QUEUE);
    0
}
/// match-proto:v6.12.117:mes_v12_0.c: static int mes_v12_0_add_hw_queue(struct amdgpu_mes *mes, struct mes_add_queue_input *input)
#[kprobe]
pub fn mes12_add_entry(_ctx: ProbeContext) -> u32 {
    enter(kfd_fn::MES_V12_ADD_HW_QUEUE, 0, 0, [0; 4]);
    0
}
#[kretprobe]
pub fn mes12_add_return(ctx: RetProbeContext) -> u32 {
    leave(&ctx, kfd_fn::MES_V12_ADD_HW_QUEUE);
    0
}

// ---- GPU reset -------------------------------------------------------------------------------

/// match-proto:v6.1.192,v6.12.117:drivers/gpu/drm/amd/amdgpu/amdgpu_amdkfd.c:
/// void amdgpu_amdkfd_gpu_reset(struct amdgpu_device *adev) — reached from `kfd_hws_hang`
/// after a failed preemption (fence wait timeout), via `hw_exception_work`.
#[kprobe]
pub fn gpu_reset(_ctx: ProbeContext) -> u32 {
    let now = now();
    emit_call(kfd_fn::GPU_RESET, call_phase::ENTRY, now, 0, 0, [0; 4], 0);
    0
}

// ---- process lifetime ------------------------------------------------------------------------

/// match-proto:v6.1.192:drivers/gpu/drm/amd/amdkfd/kfd_process.c:
/// struct kfd_process *kfd_create_process(struct file *filep)
/// match-proto:v6.12.117: struct kfd_process *kfd_create_process(struct task_struct *thread)
/// Called from `kfd_open` (current = opener) and from DBG_TRAP ENABLE for a ptraced target
/// (current = debugger, `thread` = target): the task argument wins when its layout is known.
#[kprobe]
pub fn create_process_entry(ctx: ProbeContext) -> u32 {
    stash(stash_slot::CREATE_PROCESS, [arg(&ctx, 0), 0, 0, 0, 0]);
    0
}

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
        header: header(RecordKind::ProcessCreate, entry.entry_ns),
        process,
        tgid,
        from_task: u32::from(from_task.is_some()),
    });
    0
}

/// match-proto:v6.1.192,v6.12.117:kfd_process.c: static void kfd_process_wq_release(struct work_struct *work)
/// Runs in a `kfd_process_wq` kworker once the last reference is gone; the sysfs directory is
/// removed here. `p = container_of(work, struct kfd_process, release_work)` needs BTF.
#[kprobe]
pub fn process_release_entry(ctx: ProbeContext) -> u32 {
    let cfg = config();
    let work = arg(&ctx, 0);
    let (p, owner) = if cfg.process_release_work != 0 && work > u64::from(cfg.process_release_work) {
        let p = work - u64::from(cfg.process_release_work);
        (p, owner_of_process(&cfg, p))
    } else {
        // No BTF: the owner comes from `kfd_process_dequeue_from_all_devices` just after.
        count(counter::OWNER_UNKNOWN);
        (0, 0)
    };
    if owner != 0 {
        set_teardown(owner);
    }
    stash(stash_slot::KFD_CALL_BASE + kfd_fn::PROCESS_RELEASE, [p, 0, 0, 0, 0]);
    let now = now();
    emit_call(kfd_fn::PROCESS_RELEASE, call_phase::ENTRY, now, owner, 0, [p, 0, 0, 0], 0);
    0
}

#[kretprobe]
pub fn process_release_return(_ctx: RetProbeContext) -> u32 {
    clear_teardown();
    if let Some(e) = take(stash_slot::KFD_CALL_BASE + kfd_fn::PROCESS_RELEASE) {
        if e.args[0] != 0 {
            forget_owner(e.args[0]);
        }
    }
    0
}

/// match-proto:v6.1.192,v6.12.117:kfd_process.c: void kfd_process_dequeue_from_all_devices(struct kfd_process *p)
/// Called from `kfd_process_wq_release` (kworker) before `pqm_uninit` destroys the queues.
#[kprobe]
pub fn dequeue_all_entry(ctx: ProbeContext) -> u32 {
    let cfg = config();
    let p = arg(&ctx, 0);
    let owner = owner_of_process(&cfg, p);
    if owner != 0 {
        set_teardown(owner);
    }
    let now = now();
    emit_call(kfd_fn::PROCESS_DEQUEUE_ALL, call_phase::ENTRY, now, owner, 0, [p, 0, 0, 0], 0);
    0
}

/// match-proto:v6.1.192,v6.12.117:kfd_process.c: void kfd_procfs_del_queue(struct queue *q)
/// Every queue removal: destroy ioctl (current = owner) and teardown (kworker: owner from the
/// enclosing release). `q->properties.queue_id` is at q+48 on 6.1/6.12 (KFD.md §3.3).
#[kprobe]
pub fn procfs_del_queue(ctx: ProbeContext) -> u32 {
    let cfg = config();
    let q = arg(&ctx, 0);
    if q == 0 {
        return 0;
    }
    let queue_id = if cfg.queue_queue_id == gpreempt_common::record::OFFSET_UNKNOWN {
        u64::from(u32::MAX)
    } else {
        read_at::<u32>(q, cfg.queue_queue_id).map_or(u64::from(u32::MAX), u64::from)
    };
    let owner = teardown_owner().unwrap_or((bpf_get_current_pid_tgid() >> 32) as u32);
    let now = now();
    emit_call(kfd_fn::PROCFS_DEL_QUEUE, call_phase::ENTRY, now, owner, 0, [queue_id, 0, 0, 0], 0);
    0
}
