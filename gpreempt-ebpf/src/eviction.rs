//! Eviction and restore: the SMI notifications, the per-GPU dqm ops and the per-process calls.
//! Each call becomes a [`gpreempt_common::record::KfdCallRecord`] at its return; the SMI
//! notifications become an [`SmiQueueRecord`].
//!
//! None of these may trust `current` for the owner (docs/kfd.md §3.2): TTM eviction/restore runs
//! in kworkers, SVM/userptr eviction in MMU-notifier context. The owner comes from the
//! `kfd_process*` / `qcm_process_device*` argument (`maps::owner_of_*`), the gpu from
//! `dqm->dev->id` (BTF offsets).

use aya_ebpf::{macros::kprobe, programs::ProbeContext};
use gpreempt_common::record::SmiQueueRecord;

use crate::{
    maps::{config, emit, gpu_of_dqm, gpu_of_node, header, owner_of_process, owner_of_qpd, task_tgid},
    pairs::{arg, call_pair, now},
};

/// match-proto:v6.1.192,v6.12.117:drivers/gpu/drm/amd/amdkfd/kfd_smi_events.c:
/// void kfd_smi_event_queue_eviction(struct kfd_node *node, pid_t pid, uint32_t trigger)
/// match-proto:v7.3.4 (module BTF): void kfd_smi_event_queue_eviction(struct kfd_node *node,
/// struct task_struct *task, u32 trigger)
/// (`struct kfd_dev *dev` on 6.1). A pending patch passes a `task_struct*` instead of the pid:
/// `smi_arg_is_pid` (from BTF) says which.
#[kprobe]
pub fn smi_eviction(ctx: ProbeContext) -> u32 {
    smi(&ctx, 0);
    0
}

/// match-proto:v6.1.192,v6.12.117:drivers/gpu/drm/amd/amdkfd/kfd_smi_events.c:
/// void kfd_smi_event_queue_restore(struct kfd_node *node, pid_t pid)
/// match-proto:v7.3.4 (module BTF): void kfd_smi_event_queue_restore(struct kfd_node *node, struct task_struct *task)
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
    emit(&SmiQueueRecord { header: header(now()), pid, trigger, gpu_id: gpu_of_node(&cfg, arg(ctx, 0)), restore });
}

/// `int (struct device_queue_manager *dqm, struct qcm_process_device *qpd)`: the per-GPU
/// eviction/restore ops (dqm->ops), all of 6.1.192 and 6.12.117. Owner from the qpd, gpu from
/// the dqm.
fn dqm_qpd(ctx: &ProbeContext) -> (u32, u32, [u64; 4]) {
    let cfg = config();
    let (dqm, qpd) = (arg(ctx, 0), arg(ctx, 1));
    (owner_of_qpd(&cfg, qpd), gpu_of_dqm(&cfg, dqm), [dqm, qpd, 0, 0])
}

call_pair!(
    /// match-proto:v6.1.192,v6.12.117,v7.3.4:drivers/gpu/drm/amd/amdkfd/kfd_device_queue_manager.c:
    /// static int evict_process_queues_cpsch(struct device_queue_manager *dqm, struct qcm_process_device *qpd)
    EvictProcessQueuesCpsch: evict_cpsch_entry, evict_cpsch_return, |ctx| dqm_qpd(&ctx)
);
call_pair!(
    /// match-proto:v6.1.192,v6.12.117,v7.3.4:kfd_device_queue_manager.c:
    /// static int evict_process_queues_nocpsch(struct device_queue_manager *dqm, struct qcm_process_device *qpd)
    EvictProcessQueuesNocpsch: evict_nocpsch_entry, evict_nocpsch_return, |ctx| dqm_qpd(&ctx)
);
call_pair!(
    /// match-proto:v6.1.192,v6.12.117,v7.3.4:kfd_device_queue_manager.c:
    /// static int restore_process_queues_cpsch(struct device_queue_manager *dqm, struct qcm_process_device *qpd)
    RestoreProcessQueuesCpsch: restore_cpsch_entry, restore_cpsch_return, |ctx| dqm_qpd(&ctx)
);
call_pair!(
    /// match-proto:v6.1.192,v6.12.117,v7.3.4:kfd_device_queue_manager.c:
    /// static int restore_process_queues_nocpsch(struct device_queue_manager *dqm, struct qcm_process_device *qpd)
    RestoreProcessQueuesNocpsch: restore_nocpsch_entry, restore_nocpsch_return, |ctx| dqm_qpd(&ctx)
);

call_pair!(
    /// match-proto:v6.1.192,v6.12.117,v7.3.4:drivers/gpu/drm/amd/amdkfd/kfd_process.c:
    /// int kfd_process_evict_queues(struct kfd_process *p, uint32_t trigger)
    ProcessEvictQueues: process_evict_entry, process_evict_return, |ctx| {
        let cfg = config();
        (owner_of_process(&cfg, arg(&ctx, 0)), 0, [arg(&ctx, 1) & 0xffff_ffff, 0, 0, 0])
    }
);
call_pair!(
    /// match-proto:v6.1.192,v6.12.117,v7.3.4:kfd_process.c: int kfd_process_restore_queues(struct kfd_process *p)
    ProcessRestoreQueues: process_restore_entry, process_restore_return, |ctx| {
        let cfg = config();
        (owner_of_process(&cfg, arg(&ctx, 0)), 0, [0; 4])
    }
);
