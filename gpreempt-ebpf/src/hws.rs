//! The hardware scheduler path: HWS runlist (execute/unmap/map), its fence wait and packets,
//! MES on gfx11/gfx12, and the resets a failed preemption ends in (one queue's, or the GPU's).
//! Each call becomes a [`gpreempt_common::record::KfdCallRecord`] at its return (the resets at
//! their entry).
//!
//! These calls nest in a suspend or an eviction on the same thread; userspace pairs them by
//! thread and time. They are device-wide: the gpu comes from `dqm->dev->id` (BTF offsets), there
//! is no owner (a queue's reset has its queue's).

use aya_ebpf::{macros::kprobe, programs::ProbeContext};
use gpreempt_common::record::{CONTEXT_ID_PRIMARY, CallPhase, KfdFn, OFFSET_UNKNOWN};

use crate::{
    maps::{config, context_of, gpu_of_dqm, owner_of_qpd, process_of_qpd, read_at},
    pairs::{arg, call_pair, emit_call, now},
};

call_pair!(
    /// match-proto:v6.1.192:kfd_device_queue_manager.c: static int execute_queues_cpsch(struct
    /// device_queue_manager *dqm, enum kfd_unmap_queues_filter filter, uint32_t filter_param)
    /// match-proto:v6.12.117,v7.3.4: ... uint32_t filter_param, uint32_t grace_period) (`.constprop.0`)
    ExecuteQueuesCpsch: execute_queues_entry, execute_queues_return, |ctx| {
        let cfg = config();
        (0, gpu_of_dqm(&cfg, arg(&ctx, 0)), [arg(&ctx, 1), arg(&ctx, 2), arg(&ctx, 3), 0])
    }
);

call_pair!(
    /// match-proto:v6.1.192:kfd_device_queue_manager.c: static int unmap_queues_cpsch(struct
    /// device_queue_manager *dqm, enum kfd_unmap_queues_filter filter, uint32_t filter_param, bool reset)
    /// match-proto:v6.12.117,v7.3.4: ... uint32_t filter_param, uint32_t grace_period, bool reset)
    UnmapQueuesCpsch: unmap_queues_entry, unmap_queues_return, |ctx| {
        let cfg = config();
        (0, gpu_of_dqm(&cfg, arg(&ctx, 0)), [arg(&ctx, 1), arg(&ctx, 2), arg(&ctx, 3), arg(&ctx, 4)])
    }
);

call_pair!(
    /// match-proto:v6.1.192,v6.12.117,v7.3.4:kfd_device_queue_manager.c: static int map_queues_cpsch(struct device_queue_manager *dqm)
    MapQueuesCpsch: map_queues_entry, map_queues_return, |ctx| {
        let cfg = config();
        (0, gpu_of_dqm(&cfg, arg(&ctx, 0)), [0; 4])
    }
);

call_pair!(
    /// match-proto:v6.1.192:kfd_device_queue_manager.c:
    /// int amdkfd_fence_wait_timeout(uint64_t *fence_addr, uint64_t fence_value, unsigned int timeout_ms)
    /// match-proto:v6.12.117,v7.3.4: int amdkfd_fence_wait_timeout(struct device_queue_manager *dqm, uint64_t fence_value, unsigned int timeout_ms)
    /// Entry→return is the HWS preemption latency (UNMAP_QUEUES + CWSR save); -ETIME on timeout.
    /// It sleeps (up to `queue_preemption_timeout_ms`, 9 s by default) under the dqm lock, so one
    /// caller per GPU is inside at a time.
    FenceWaitTimeout: fence_wait_entry, fence_wait_return, |ctx| {
        let cfg = config();
        let gpu = if cfg.fence_wait_takes_dqm != 0 { gpu_of_dqm(&cfg, arg(&ctx, 0)) } else { 0 };
        (0, gpu, [arg(&ctx, 1), arg(&ctx, 2) & 0xffff_ffff, 0, 0])
    }
);

call_pair!(
    /// match-proto:v6.1.192,v6.12.117,v7.3.4:kfd_packet_manager.c:
    /// int pm_send_runlist(struct packet_manager *pm, struct list_head *dqm_queues)
    PmSendRunlist: send_runlist_entry, send_runlist_return, |_ctx| (0, 0, [0; 4])
);

call_pair!(
    /// match-proto:v6.1.192,v6.12.117,v7.3.4:kfd_packet_manager.c: int pm_send_unmap_queue(struct
    /// packet_manager *pm, enum kfd_unmap_queues_filter filter, uint32_t filter_param, bool reset)
    PmSendUnmapQueue: send_unmap_entry, send_unmap_return, |ctx| {
        (0, 0, [arg(&ctx, 1) & 0xffff_ffff, arg(&ctx, 2) & 0xffff_ffff, arg(&ctx, 3) & 0xff, 0])
    }
);

// ---- MES (gfx11/gfx12): per-queue preemption instead of HWS unmap -----------------------------

call_pair!(
    /// match-proto:v6.12.117,v7.3.4:drivers/gpu/drm/amd/amdgpu/mes_v11_0.c: static int
    /// mes_v11_0_remove_hw_queue(struct amdgpu_mes *mes, struct mes_remove_queue_input *input)
    MesV11RemoveHwQueue: mes11_remove_entry, mes11_remove_return, |_ctx| (0, 0, [0; 4])
);
call_pair!(
    /// match-proto:v6.12.117,v7.3.4:mes_v11_0.c: static int mes_v11_0_add_hw_queue(struct amdgpu_mes *mes, struct mes_add_queue_input *input)
    MesV11AddHwQueue: mes11_add_entry, mes11_add_return, |_ctx| (0, 0, [0; 4])
);
call_pair!(
    /// match-proto:v6.12.117,v7.3.4:mes_v12_0.c: static int mes_v12_0_remove_hw_queue(struct amdgpu_mes *mes, struct mes_remove_queue_input *input)
    MesV12RemoveHwQueue: mes12_remove_entry, mes12_remove_return, |_ctx| (0, 0, [0; 4])
);
call_pair!(
    /// match-proto:v6.12.117,v7.3.4:mes_v12_0.c: static int mes_v12_0_add_hw_queue(struct amdgpu_mes *mes, struct mes_add_queue_input *input)
    MesV12AddHwQueue: mes12_add_entry, mes12_add_return, |_ctx| (0, 0, [0; 4])
);

// ---- GPU reset -------------------------------------------------------------------------------

/// match-proto:v7.3.4:kfd_device_queue_manager.c: static void set_queue_as_reset(struct
/// device_queue_manager *dqm, struct queue *q, struct qcm_process_device *qpd) — gfx9 per-queue
/// reset (6.12+): the queue the MEC could not preempt, reset alone; the unmap then succeeds, so
/// SUSPEND_QUEUES counts it suspended (docs/kfd.md §2.4). Static: inlined on Debian 6.12.117, a
/// symbol in .text.unlikely on 7.3.4. Owner and context from the qpd, gpu from the dqm, queue id at
/// q+48.
#[kprobe]
pub fn set_queue_as_reset(ctx: ProbeContext) -> u32 {
    let cfg = config();
    let (dqm, q, qpd) = (arg(&ctx, 0), arg(&ctx, 1), arg(&ctx, 2));
    // Queue ids are per KFD context (Linux 7.0): the record says whose.
    let context_id = process_of_qpd(&cfg, qpd).map_or(CONTEXT_ID_PRIMARY, |p| context_of(&cfg, p));
    let queue_id = if q == 0 || cfg.queue_queue_id == OFFSET_UNKNOWN {
        u64::from(u32::MAX)
    } else {
        read_at::<u32>(q, cfg.queue_queue_id).map_or(u64::from(u32::MAX), u64::from)
    };
    let (owner, gpu) = (owner_of_qpd(&cfg, qpd), gpu_of_dqm(&cfg, dqm));
    let now = now();
    emit_call(KfdFn::QueueSetReset, CallPhase::Entry, now, owner, gpu, [queue_id, u64::from(context_id), 0, 0], 0);
    0
}

/// match-proto:v6.1.192,v6.12.117,v7.3.4:drivers/gpu/drm/amd/amdgpu/amdgpu_amdkfd.c:
/// void amdgpu_amdkfd_gpu_reset(struct amdgpu_device *adev) — reached from `kfd_hws_hang`
/// after a failed preemption (fence wait timeout), via `hw_exception_work`.
#[kprobe]
pub fn gpu_reset(_ctx: ProbeContext) -> u32 {
    let now = now();
    emit_call(KfdFn::GpuReset, CallPhase::Entry, now, 0, 0, [0; 4], 0);
    0
}
