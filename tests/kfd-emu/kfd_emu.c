// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * KFD emulator: /dev/kfd with the UAPI and semantics of amdkfd as of Linux 6.12.117 (KFD 1.17)
 * for queues, the debug-trap API and process lifetime, plus emulated GPUs whose queues consume
 * work, so gpreempt can be tested end to end without an AMD GPU. A test fixture, never shipped.
 *
 * Every function the tracer may probe has the name and prototype of its amdkfd counterpart
 * (comment "mirrors"), is global and noinline, so it appears in /proc/kallsyms under its own
 * name. Behaviour comments name the amdkfd fact they reproduce; docs/kfd.md has the sources.
 *
 * Emulated GPUs: gpu_id 0x1000 (topology node 1) and 0x2000 (node 2), see kfd_emu.h.
 * Emulated execution: one "CP" kthread per GPU executes the 64-byte AQL kernel-dispatch packets
 * of the mapped queues, one dispatch at a time for its cost (kernel_object in ns, or for a code
 * object's kernel its grid x ns_per_workitem), plus barrier-AND/OR and ROCr's PM4-IB vendor
 * packets completing amd_signal_t signals (README "ROCm's packets"), round-robin
 * between queues at dispatch boundaries; an unmap (HWS UNMAP_QUEUES of every dynamic queue on
 * the GPU) stops the running dispatch, which keeps its remaining cost, and writes the fence
 * amdkfd_fence_wait_timeout() polls preempt_delay_us later; after a map nothing runs for
 * restore_delay_us. README.md describes the packet format and the model.
 */

#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/fs.h>
#include <linux/file.h>
#include <linux/device.h>
#include <linux/kthread.h>
#include <linux/sched/mm.h>
#include <linux/sched/task.h>
#include <linux/sched/signal.h>
#include <linux/ptrace.h>
#include <linux/pid.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/delay.h>
#include <linux/bitmap.h>
#include <linux/jiffies.h>
#include <linux/version.h>
#include <linux/log2.h>
#include <linux/vmalloc.h>
#include <linux/mm.h>
#include <linux/overflow.h>

#include "kfd_emu.h"

static_assert(sizeof(struct kfd_ioctl_create_queue_args) == 96);
static_assert(sizeof(struct hsa_kernel_dispatch_packet) == AQL_PACKET_SIZE);
static_assert(sizeof(struct hsa_barrier_packet) == AQL_PACKET_SIZE);
static_assert(sizeof(struct amd_aql_pm4_ib) == AQL_PACKET_SIZE);
static_assert(offsetof(struct amd_aql_pm4_ib, completion_signal) == 56);
static_assert(sizeof(struct amd_aql_barrier_value) == AQL_PACKET_SIZE);
static_assert(offsetof(struct amd_aql_barrier_value, cond) == 32);
static_assert(offsetof(struct amd_aql_barrier_value, completion_signal) == 56);
static_assert(sizeof(struct amd_signal) == 64);
static_assert(offsetof(struct amd_signal, value) == 8 && offsetof(struct amd_signal, start_ts) == 32);
static_assert(offsetof(struct kfd_ioctl_create_queue_args, queue_id) == 52);
static_assert(sizeof(struct kfd_ioctl_dbg_trap_args) == 32);
static_assert(offsetof(struct kfd_ioctl_dbg_trap_args, suspend_queues.num_queues) == 24);
static_assert(sizeof(struct kfd_queue_snapshot_entry) == 64);
static_assert(sizeof(struct kfd_runtime_info) == 16);
static_assert(sizeof(struct kfd_ioctl_update_queue_args) == 24);
static_assert(offsetof(struct queue, properties) == 40);
static_assert(offsetof(struct queue_properties, queue_id) == 8);
static_assert(offsetof(struct qcm_process_device, pqm) == 8);
static_assert(offsetof(struct kfd_process_device, qpd) == 16);

/* ---- module parameters ---- */

static unsigned int num_gpus = 2;
module_param(num_gpus, uint, 0444);
MODULE_PARM_DESC(num_gpus, "Emulated GPUs (1 or 2; gpu_id 0x1000, 0x2000)");

static unsigned int tick_us = 200;
module_param(tick_us, uint, 0644);
MODULE_PARM_DESC(tick_us,
		 "Emulated doorbell: the CP polls the write indices every tick_us (default 200)");

/* Emulator defaults, not measurements: a full CWSR save on MI300 moves ~150-180 MB (>= ~30 us at
 * HBM bandwidth) plus CP and fence overhead; no public figure for either delay exists.
 */
static unsigned int preempt_delay_us = 200;
module_param(preempt_delay_us, uint, 0644);
MODULE_PARM_DESC(preempt_delay_us,
		 "Emulated CWSR save of an unmap, spent in amdkfd_fence_wait_timeout (default 200)");

static unsigned int restore_delay_us = 100;
module_param(restore_delay_us, uint, 0644);
MODULE_PARM_DESC(restore_delay_us,
		 "Emulated restore after a map: nothing runs for restore_delay_us (default 100)");

/*
 * SUSPEND_QUEUES calls so far, read-only (not a KFD parameter): a test waits on it until a
 * controller's cycles are under way, instead of sleeping for a time that a loaded host can outlast.
 */
static atomic_t suspend_calls = ATOMIC_INIT(0);

static int suspend_calls_get(char *buffer, const struct kernel_param *kp)
{
	return scnprintf(buffer, PAGE_SIZE, "%d\n", atomic_read(&suspend_calls));
}

static int suspend_calls_set(const char *val, const struct kernel_param *kp)
{
	return -EPERM;
}

static const struct kernel_param_ops suspend_calls_ops = {
	.set = suspend_calls_set,
	.get = suspend_calls_get,
};
module_param_cb(suspend_calls, &suspend_calls_ops, NULL, 0444);
MODULE_PARM_DESC(suspend_calls, "SUSPEND_QUEUES calls since the module loaded (read-only)");

/* amdgpu's queue_preemption_timeout_ms (default 9000, 0644) */
static unsigned int queue_preemption_timeout_ms = 9000;
module_param(queue_preemption_timeout_ms, uint, 0644);
MODULE_PARM_DESC(queue_preemption_timeout_ms, "Fence wait timeout (default 9000)");

/*
 * The emulated duration of a code object's kernel (a dispatch whose kernel_object is a kernel
 * descriptor in the process's GPU memory: ROCr's and HIP's dispatches), which the CP cannot
 * take from kernel_object as it does for the cost convention: work-items of the grid times this.
 */
static unsigned int ns_per_workitem = 1000;
module_param(ns_per_workitem, uint, 0644);
MODULE_PARM_DESC(ns_per_workitem,
		 "Emulated duration of a code object's kernel per work-item of its grid, ns (default 1000)");

/* Only what GET_VERSION answers, so that gpreempt's version-gated refusals (secondary contexts
 * from KFD 1.19, gfx12 trap support from 1.20) can be tested; the emulated ABI stays 1.17.
 */
static unsigned int kfd_minor_version = KFD_IOCTL_MINOR_VERSION;
module_param(kfd_minor_version, uint, 0644);
MODULE_PARM_DESC(kfd_minor_version,
		 "KFD minor version GET_VERSION reports (default 17; the ABI emulated stays 1.17)");

/* ---- globals ---- */

static struct kfd_node emu_nodes[EMU_MAX_GPUS];
static struct device_queue_manager emu_dqms[EMU_MAX_GPUS];
static const unsigned int emu_gpu_ids[EMU_MAX_GPUS] = { EMU_GPU_ID0, EMU_GPU_ID1 };

static DEFINE_MUTEX(kfd_processes_mutex);
static LIST_HEAD(kfd_processes_list);
/*
 * Also guards kfd_processes_list's additions and removals, for lookups from mmap handlers:
 * they run under mmap_lock, which process creation takes under kfd_processes_mutex
 * (mmu_notifier_register), so they must not take that mutex (KFD looks up under SRCU).
 */
static DEFINE_SPINLOCK(kfd_processes_lock);
static struct workqueue_struct *kfd_process_wq;
static atomic_t pasid_counter = ATOMIC_INIT(0x8000);

static int kfd_char_dev_major = -1;
static struct class *kfd_class;
static struct device *kfd_device;
static struct kobject *procfs_kobj;
static struct kobject *topology_kobj;
static struct kobject *topology_nodes_kobj;
static struct kobject *emu_ctl_kobj;

static void kfd_unref_process(struct kfd_process *p);
static int render_gpu_of_file(struct file *file);
static void emu_process_free_bos(struct kfd_process *p);
static void emu_process_free_events(struct kfd_process *p);

static void dqm_lock(struct device_queue_manager *dqm)
{
	mutex_lock(&dqm->lock_hidden);
}

static void dqm_unlock(struct device_queue_manager *dqm)
{
	mutex_unlock(&dqm->lock_hidden);
}

static struct kfd_process_device *kfd_process_device_data_by_id(struct kfd_process *p, u32 gpu_id)
{
	int i;

	for (i = 0; i < p->n_pdds; i++)
		if (p->pdds[i].dev->id == gpu_id)
			return &p->pdds[i];
	return NULL;
}

static struct kfd_process_device *qpd_to_pdd(struct qcm_process_device *qpd)
{
	return container_of(qpd, struct kfd_process_device, qpd);
}

/* ---- emulated command processor (one per GPU) ---- */

/*
 * The CP plays a timeline: one dispatch occupies the GPU at a time, for its cost; at each
 * dispatch boundary the next one comes from the queue with work that was served least recently
 * (round-robin between queues), a preempted dispatch first. Event times are computed, not taken
 * from when the thread happens to wake, so a late wake-up (a descheduled vCPU) delays only what
 * software sees (the read index, the fence, completion records), never the emulated times.
 */

static void emu_queue_error(struct queue *q, u32 ec);
static bool emu_bo_holds(struct kfd_process *p, u64 va, u64 len);
static int emu_gpu_access(struct kfd_process *p, u64 va, void *buf, u32 len, bool write);
static int emu_gpu_add64(struct kfd_process *p, u64 va, s64 v);
static void emu_signal_interrupt(struct device_queue_manager *dqm, struct kfd_process *p,
				 u32 event_id);

/* user memory of q's process, for the CP kthread (kthread_use_mm); false if the mm is gone */
static bool emu_user_begin(struct queue *q)
{
	struct mm_struct *mm = q->process->mm_grabbed;

	if (!mmget_not_zero(mm))
		return false;
	kthread_use_mm(mm);
	return true;
}

static void emu_user_end(struct queue *q)
{
	struct mm_struct *mm = q->process->mm_grabbed;

	kthread_unuse_mm(mm);
	/* Never the last user here in practice; async so exit_mmap never runs under hw_lock. */
	mmput_async(mm);
}

/* AQL compute queues carry the packets the CP executes (SDMA queues: emu_sdma_serves); PM4 idle. */
static bool emu_cp_serves(struct queue *q)
{
	return q->hw_mapped && !q->error_ec && q->properties.type == KFD_QUEUE_TYPE_COMPUTE &&
	       q->properties.format == KFD_QUEUE_FORMAT_AQL;
}

static u64 emu_ring_packets(struct queue *q)
{
	return q->properties.queue_size / AQL_PACKET_SIZE;
}

/*
 * The doorbell the emulator does not have: read each served queue's write index. New packets
 * are known from the time taken *after* the reads, which is returned: a producer that stamps
 * its submission and then publishes between the caller's clock read and these reads would
 * otherwise see its packet start before it was submitted.
 */
static u64 emu_cp_observe(struct device_queue_manager *dqm)
{
	struct qcm_process_device *qpd;
	struct queue *q, *first;
	struct queue *seen[16];
	unsigned int n = 0, k;
	u64 w, t;

	list_for_each_entry(qpd, &dqm->queues, dqm_list) {
		first = NULL;
		list_for_each_entry(q, &qpd->queues_list, list)
			if (emu_cp_serves(q) && !first)
				first = q;
		if (!first || !emu_user_begin(first))
			continue;
		list_for_each_entry(q, &qpd->queues_list, list) {
			if (!emu_cp_serves(q) || get_user(w, (u64 __user *)q->properties.write_ptr))
				continue;
			/* A write index behind the read index or more than a ring ahead of it names
			 * packets the ring cannot hold.
			 */
			if (w - q->cp_rptr > emu_ring_packets(q)) {
				emu_queue_error(q, EC_QUEUE_PACKET_RESERVED);
				continue;
			}
			if (w > q->obs_new_w) {
				q->obs_old_w = q->obs_new_w;
				q->obs_old_ns = q->obs_new_ns;
				q->obs_new_w = w;
				q->obs_new_ns = U64_MAX;
				if (n < ARRAY_SIZE(seen))
					seen[n++] = q;
			}
		}
		emu_user_end(first);
	}
	t = ktime_get_ns();
	for (k = 0; k < n; k++)
		seen[k]->obs_new_ns = t;
	if (n == ARRAY_SIZE(seen)) {
		/* more queues than the list holds: stamp every one still unstamped */
		list_for_each_entry(qpd, &dqm->queues, dqm_list)
			list_for_each_entry(q, &qpd->queues_list, list)
				if (q->obs_new_ns == U64_MAX)
					q->obs_new_ns = t;
	}
	return t;
}

/*
 * When q's next packet became known to the CP (U64_MAX: none is), and not before the barrier
 * ahead of it completed. A queue whose next packet is a barrier still waiting is not eligible.
 */
static u64 emu_next_known_at(struct queue *q)
{
	if (q->at_barrier)
		return U64_MAX;
	if (q->cp_rptr < q->obs_old_w)
		return max(q->obs_old_ns, q->ready_ns);
	if (q->cp_rptr < q->obs_new_w)
		return max(q->obs_new_ns, q->ready_ns);
	return U64_MAX;
}

/*
 * The queue to serve at time t: a preempted dispatch first, then the least recently served
 * queue whose next packet is known by t. *next_t: the earliest time another becomes eligible.
 */
static struct queue *emu_cp_pick(struct device_queue_manager *dqm, u64 t, u64 *next_t)
{
	struct qcm_process_device *qpd;
	struct queue *q, *best = NULL;
	u64 best_at = 0;

	*next_t = U64_MAX;
	list_for_each_entry(qpd, &dqm->queues, dqm_list) {
		list_for_each_entry(q, &qpd->queues_list, list) {
			u64 at;

			if (!emu_cp_serves(q))
				continue;
			at = q->has_dispatch ? t : emu_next_known_at(q);
			if (at > t) {
				*next_t = min(*next_t, at);
				continue;
			}
			if (!best || (q->has_dispatch && !best->has_dispatch) ||
			    (q->has_dispatch == best->has_dispatch &&
			     (q->served_seq < best->served_seq ||
			      (q->served_seq == best->served_seq && at < best_at)))) {
				best = q;
				best_at = at;
			}
		}
	}
	return best;
}

static u32 emu_packet_error(const struct hsa_kernel_dispatch_packet *pkt)
{
	u32 dims = pkt->setup & HSA_KERNEL_DISPATCH_PACKET_SETUP_DIMENSIONS_MASK;

	switch (pkt->header & HSA_PACKET_HEADER_TYPE_MASK) {
	case HSA_PACKET_TYPE_KERNEL_DISPATCH:
		break;
	case HSA_PACKET_TYPE_BARRIER_AND:
	case HSA_PACKET_TYPE_BARRIER_OR:
		return 0;
	case HSA_PACKET_TYPE_VENDOR_SPECIFIC:
		return 0;	/* emu_cp_vendor() knows one format */
	case HSA_PACKET_TYPE_AGENT_DISPATCH:
		/* valid AQL for an agent's own queue, not a GPU's: not executed */
		return EC_QUEUE_PACKET_UNSUPPORTED;
	default:
		return EC_QUEUE_PACKET_RESERVED;
	}
	if (dims == 0 || !pkt->grid_size_x || (dims > 1 && !pkt->grid_size_y) ||
	    (dims > 2 && !pkt->grid_size_z))
		return EC_QUEUE_PACKET_DISPATCH_DIM_INVALID;
	if (!pkt->workgroup_size_x || (dims > 1 && !pkt->workgroup_size_y) ||
	    (dims > 2 && !pkt->workgroup_size_z))
		return EC_QUEUE_PACKET_DISPATCH_WORK_GROUP_SIZE_INVALID;
	if (!pkt->kernel_object)
		return EC_QUEUE_PACKET_DISPATCH_CODE_INVALID;
	return 0;
}

/*
 * A dispatch's cost. The project's clients carry it in kernel_object (ns, README "Packet
 * format"); a real runtime (ROCr, HIP) puts there the address of a kernel descriptor, inside a
 * code object its loader placed in GPU memory (ALLOC_MEMORY_OF_GPU). So: a kernel_object inside
 * one of the process's memory objects is a code object's kernel, which runs for its grid's
 * work-items times ns_per_workitem. Its descriptor must be 64-byte aligned (the code object
 * ABI's alignment of a .kd symbol); its bytes are not read: ROCr's loader copies code into VRAM
 * with its blit kernel, which the emulated CP does not execute (README, "ROCm's packets").
 * Returns 1 (a code object's kernel, *cost set), 0 (the cost convention) or
 * -EC_QUEUE_PACKET_DISPATCH_CODE_INVALID.
 */
static int emu_kernel_cost(struct queue *q, const struct hsa_kernel_dispatch_packet *pkt, u64 *cost)
{
	u32 dims = pkt->setup & HSA_KERNEL_DISPATCH_PACKET_SETUP_DIMENSIONS_MASK;
	u64 ko = pkt->kernel_object, items;

	if (!emu_bo_holds(q->process, ko, 64))
		return 0;
	if (ko % 64)
		return -EC_QUEUE_PACKET_DISPATCH_CODE_INVALID;
	/* saturating: a 3-D grid of 2^32 per dimension overflows u64 */
	items = (u64)pkt->grid_size_x * (dims > 1 ? pkt->grid_size_y : 1);
	if (check_mul_overflow(items, (u64)(dims > 2 ? pkt->grid_size_z : 1), &items) ||
	    check_mul_overflow(items, (u64)READ_ONCE(ns_per_workitem), cost))
		*cost = U64_MAX;
	*cost = max_t(u64, *cost, 1);
	return 1;
}

/*
 * PM4 type-3 packets (amdgpu's soc15d.h / ROCr 5.2 src/core/inc/amd_gpu_pm4.h): header bits
 * 31:30 = 3, 29:16 = dwords - 2, 15:8 the opcode.
 */
#define PM4_TYPE3 3
#define PM4_TYPE2_FILLER 0x80000000u
#define PM4_OPCODE_NOP 0x10
#define PM4_OPCODE_INDIRECT_BUFFER 0x3F
#define PM4_OPCODE_ACQUIRE_MEM 0x58
#define PM4_IB_MAX_DW 1024

/*
 * An AMD vendor-specific AQL packet (the only one ROCr 5.2 writes on gfx9: AqlQueue::ExecutePM4,
 * src/core/runtime/amd_aql_queue.cpp, format AMD_AQL_FORMAT_PM4_IB = 1 in the u16 after the
 * header): an INDIRECT_BUFFER command to a PM4 buffer, which the CP executes. ROCr sends the
 * code cache invalidation after loading code (GpuAgent::InvalidateCodeCaches: ACQUIRE_MEM).
 * The emulated GPU has no caches, so ACQUIRE_MEM and NOP execute as nothing; any other command,
 * another format or an unreadable buffer is EC_QUEUE_PACKET_VENDOR_UNSUPPORTED. The user mm is
 * in use. Returns 0 or the exception code.
 */
static u32 emu_cp_vendor(const struct amd_aql_pm4_ib *pkt)
{
	u32 hdr = pkt->ib_jump_cmd[0], ib_dw, i, n;
	u64 ib;
	u32 *buf;
	u32 ec = 0;

	if (pkt->ven_hdr != AMD_AQL_FORMAT_PM4_IB || hdr >> 30 != PM4_TYPE3 ||
	    ((hdr >> 8) & 0xff) != PM4_OPCODE_INDIRECT_BUFFER) {
		pr_debug("kfd_emu: vendor packet format %u, first dword 0x%08x: not emulated\n",
			 pkt->ven_hdr, hdr);
		return EC_QUEUE_PACKET_VENDOR_UNSUPPORTED;
	}
	/* INDIRECT_BUFFER: DW1 base[31:2], DW2 base[47:32], DW3 size in dwords [19:0] */
	ib = (pkt->ib_jump_cmd[1] & ~3u) | ((u64)(pkt->ib_jump_cmd[2] & 0xffff) << 32);
	ib_dw = pkt->ib_jump_cmd[3] & 0xfffff;
	if (!ib_dw || ib_dw > PM4_IB_MAX_DW)
		return EC_QUEUE_PACKET_VENDOR_UNSUPPORTED;
	buf = kmalloc_array(ib_dw, sizeof(u32), GFP_KERNEL);
	if (!buf)
		return EC_QUEUE_PACKET_VENDOR_UNSUPPORTED;
	if (copy_from_user(buf, (void __user *)(uintptr_t)ib, ib_dw * sizeof(u32))) {
		ec = EC_QUEUE_PACKET_VENDOR_UNSUPPORTED;
		goto out;
	}
	for (i = 0; i < ib_dw; i += n) {
		if (buf[i] == PM4_TYPE2_FILLER) {
			n = 1;
			continue;
		}
		n = ((buf[i] >> 16) & 0x3fff) + 2;
		if (buf[i] >> 30 != PM4_TYPE3 || i + n > ib_dw ||
		    (((buf[i] >> 8) & 0xff) != PM4_OPCODE_ACQUIRE_MEM &&
		     ((buf[i] >> 8) & 0xff) != PM4_OPCODE_NOP)) {
			pr_debug("kfd_emu: PM4 IB dword %u: 0x%08x not emulated\n", i, buf[i]);
			ec = EC_QUEUE_PACKET_VENDOR_UNSUPPORTED;
			break;
		}
	}
out:
	kfree(buf);
	return ec;
}

/*
 * The GPU clock (RLC's 100 MHz counter on gfx9, amdgpu_gfx.c) at a time of the CP's timeline
 * (CLOCK_MONOTONIC ns): what GET_CLOCK_COUNTERS reads and what amd_signal_t timestamps carry,
 * one clock so that ROCr's conversions and the timestamps' order agree.
 */
static u64 emu_gpu_ticks(u64 mono_ns)
{
	return div_u64(mono_ns, 1000000 / EMU_GPU_COUNTER_KHZ);
}

/*
 * Complete the amd_signal_t at va as the CP's end-of-packet RELEASE_MEM does: start_ts and
 * end_ts written, then the value decremented atomically (ROCr may update it from the CPU at the
 * same time: the page is pinned and decremented in place), then, for an interrupt signal, its
 * event_id written to event_mailbox_ptr (the event's slot) and the interrupt raised
 * (kfd_signal_event_interrupt). Under hw_lock; a signal the CP cannot write is skipped (a GPU
 * would fault).
 */
static void emu_signal_complete(struct device_queue_manager *dqm, struct queue *q, u64 va,
				u64 start_ns, u64 end_ns)
{
	struct amd_signal *sig;
	struct page *page;
	u64 mailbox;
	u32 event_id;

	if (!va)
		return;
	if (va % 8 || offset_in_page(va) + sizeof(*sig) > PAGE_SIZE) {
		pr_debug("kfd_emu: completion signal 0x%llx misaligned\n", va);
		return;
	}
	if (!emu_user_begin(q))
		return;
	if (pin_user_pages_fast(va & PAGE_MASK, 1, FOLL_WRITE, &page) != 1) {
		emu_user_end(q);
		pr_debug("kfd_emu: completion signal 0x%llx unwritable\n", va);
		return;
	}
	sig = page_address(page) + offset_in_page(va);
	WRITE_ONCE(sig->start_ts, emu_gpu_ticks(start_ns));
	WRITE_ONCE(sig->end_ts, emu_gpu_ticks(end_ns));
	/* fully ordered: the timestamps are visible before the value that releases the waiter */
	atomic64_sub_return(1, (atomic64_t *)&sig->value);
	mailbox = READ_ONCE(sig->event_mailbox_ptr);
	event_id = READ_ONCE(sig->event_id);
	unpin_user_pages_dirty_lock(&page, 1, true);
	dqm->stats.signals++;
	if (mailbox && put_user((u64)event_id, (u64 __user *)(uintptr_t)mailbox))
		pr_debug("kfd_emu: event mailbox 0x%llx unwritable\n", mailbox);
	emu_user_end(q);
	if (mailbox) {
		dqm->stats.interrupts++;
		emu_signal_interrupt(dqm, q->process, event_id);
	}
}

/*
 * Start q's next packet (or resume its preempted dispatch) at time t. The read index advances
 * when the packet is consumed, i.e. when its dispatch starts, and the slot's header becomes
 * INVALID so the producer may reuse it. False if nothing started (header still INVALID: the
 * packet is not published yet and is looked for again at the next poll; or a packet error).
 */
static bool emu_cp_start(struct device_queue_manager *dqm, struct queue *q, u64 t)
{
	struct hsa_kernel_dispatch_packet pkt;
	const struct amd_aql_barrier_value *bv;
	u64 i = q->cp_rptr, cost;
	void __user *slot;
	u32 ec, type;
	int foreign;

	if (q->has_dispatch) {
		q->d.off_ns += t - q->d.stop_ns;
		q->d.seg_start_ns = t;
		goto run;
	}
	slot = (void __user *)(uintptr_t)(q->properties.queue_address +
					  (i % emu_ring_packets(q)) * AQL_PACKET_SIZE);
	if (!emu_user_begin(q)) {
		/* the process is exiting: forget what was seen, its queues are torn down next */
		q->obs_old_w = q->obs_new_w = i;
		return false;
	}
	if (copy_from_user(&pkt, slot, sizeof(pkt))) {
		emu_user_end(q);
		emu_queue_error(q, EC_QUEUE_PACKET_RESERVED);
		return false;
	}
	if ((pkt.header & HSA_PACKET_HEADER_TYPE_MASK) == HSA_PACKET_TYPE_INVALID) {
		emu_user_end(q);
		q->obs_old_w = q->obs_new_w = i;
		return false;
	}
	ec = emu_packet_error(&pkt);
	if (ec) {
		emu_user_end(q);
		emu_queue_error(q, ec);
		return false;
	}
	type = pkt.header & HSA_PACKET_HEADER_TYPE_MASK;
	bv = (const struct amd_aql_barrier_value *)&pkt;
	if (type == HSA_PACKET_TYPE_VENDOR_SPECIFIC && bv->ven_hdr == AMD_AQL_FORMAT_BARRIER_VALUE) {
		emu_user_end(q);
		if (bv->cond > HSA_SIGNAL_CONDITION_GTE) {
			emu_queue_error(q, EC_QUEUE_PACKET_VENDOR_UNSUPPORTED);
			return false;
		}
		/* a barrier: emu_cp_barriers() completes it once its condition holds */
		q->at_barrier = true;
		return false;
	}
	if (type == HSA_PACKET_TYPE_VENDOR_SPECIFIC) {
		/* executed at once, taking no GPU time: consumed and completed at t */
		const struct amd_aql_pm4_ib *ib = (const struct amd_aql_pm4_ib *)&pkt;

		ec = emu_cp_vendor(ib);
		if (!ec) {
			q->cp_rptr = i + 1;
			if (put_user((u16)HSA_PACKET_TYPE_INVALID, (u16 __user *)slot) ||
			    put_user(q->cp_rptr, (u64 __user *)q->properties.read_ptr))
				ec = EC_QUEUE_PACKET_RESERVED;
		}
		emu_user_end(q);
		if (ec) {
			emu_queue_error(q, ec);
			return false;
		}
		q->ready_ns = t;
		q->packets_done++;
		dqm->stats.pm4_ibs++;
		emu_signal_complete(dqm, q, ib->completion_signal, t, t);
		return false;
	}
	if (type == HSA_PACKET_TYPE_BARRIER_AND || type == HSA_PACKET_TYPE_BARRIER_OR) {
		/* not GPU work: emu_cp_barriers() completes it once its dependencies are met */
		emu_user_end(q);
		q->at_barrier = true;
		return false;
	}
	foreign = emu_kernel_cost(q, &pkt, &cost);
	if (foreign < 0) {
		emu_user_end(q);
		emu_queue_error(q, -foreign);
		return false;
	}
	if (!foreign)
		cost = pkt.kernel_object;
	q->cp_rptr = i + 1;
	if (put_user((u16)HSA_PACKET_TYPE_INVALID, (u16 __user *)slot) ||
	    put_user(q->cp_rptr, (u64 __user *)q->properties.read_ptr)) {
		emu_user_end(q);
		emu_queue_error(q, EC_QUEUE_PACKET_RESERVED);
		return false;
	}
	emu_user_end(q);
	q->has_dispatch = true;
	q->d.index = i;
	q->d.cost_ns = cost;
	q->d.remaining_ns = cost;
	q->d.completion = pkt.completion_signal;
	q->d.foreign = foreign;
	q->d.start_ns = t;
	q->d.seg_start_ns = t;
	q->d.first_stop_ns = 0;
	q->d.off_ns = 0;
	q->d.preemptions = 0;
run:
	q->served_seq = ++dqm->serve_seq;
	dqm->running = q;
	return true;
}

/* q's running dispatch ends at end: completion record (status written last). */
static void emu_cp_complete(struct device_queue_manager *dqm, struct queue *q, u64 end)
{
	struct emu_completion_record rec = {
		.start_ns = q->d.start_ns,
		.end_ns = end,
		.packet_index = q->d.index,
		.off_ns = q->d.off_ns,
		.first_stop_ns = q->d.first_stop_ns ? q->d.first_stop_ns : end,
		.last_start_ns = q->d.seg_start_ns,
		.preemptions = q->d.preemptions,
		.queue_id = q->properties.queue_id,
		.status = EMU_COMPLETION_DONE,
	};
	struct emu_completion_record __user *dst =
		(struct emu_completion_record __user *)(uintptr_t)q->d.completion;

	dqm->running = NULL;
	q->has_dispatch = false;
	q->packets_done++;
	if (q->d.foreign) {
		dqm->stats.kernels++;
		emu_signal_complete(dqm, q, q->d.completion, q->d.start_ns, end);
		return;
	}
	dqm->stats.dispatches++;
	if (!dst || !emu_user_begin(q))
		return;
	if (!copy_to_user(dst, &rec, offsetof(struct emu_completion_record, status))) {
		smp_wmb();
		if (put_user(rec.status, &dst->status))
			pr_debug("kfd_emu: completion record of queue %u unwritable\n",
				 q->properties.queue_id);
	}
	emu_user_end(q);
}

/* Play the timeline up to limit. */
static void emu_cp_advance(struct device_queue_manager *dqm, u64 limit)
{
	struct queue *q;
	u64 t, next_t;

	for (;;) {
		q = dqm->running;
		if (q) {
			u64 end = q->d.seg_start_ns + q->d.remaining_ns;

			if (end > limit)
				break;
			dqm->now_ns = end;
			emu_cp_complete(dqm, q, end);
			continue;
		}
		if (!dqm->cp_mapped)
			break;
		t = max(dqm->now_ns, dqm->stall_until_ns);
		if (t > limit)
			break;
		q = emu_cp_pick(dqm, t, &next_t);
		if (!q) {
			if (next_t > limit)
				break;
			dqm->now_ns = next_t;
			continue;
		}
		dqm->now_ns = t;
		emu_cp_start(dqm, q, t);
	}
	dqm->now_ns = max(dqm->now_ns, limit);
}

/*
 * A barrier's dependencies (HSA 1.2 "Barrier-AND / Barrier-OR packet"): the non-null
 * dep_signals' values, read from the process's memory. AND: met when every one is 0; OR: when
 * any is, or when there is none. 1 met, 0 not yet, -EFAULT unreadable.
 */
static int emu_barrier_value_met(const struct amd_aql_barrier_value *b)
{
	s64 v;

	if (!b->signal)
		return 1;
	if (get_user(v, (s64 __user *)(uintptr_t)(b->signal + offsetof(struct amd_signal, value))))
		return -EFAULT;
	v &= b->mask;
	switch (b->cond) {
	case HSA_SIGNAL_CONDITION_EQ:
		return v == b->value;
	case HSA_SIGNAL_CONDITION_NE:
		return v != b->value;
	case HSA_SIGNAL_CONDITION_LT:
		return v < b->value;
	default:	/* GTE: other conditions stopped the queue when the packet was read */
		return v >= b->value;
	}
}

static int emu_barrier_met(const struct hsa_barrier_packet *b, bool any)
{
	int i, deps = 0, met = 0;
	s64 v;

	for (i = 0; i < ARRAY_SIZE(b->dep_signal); i++) {
		if (!b->dep_signal[i])
			continue;
		deps++;
		if (get_user(v, (s64 __user *)(uintptr_t)(b->dep_signal[i] +
							   offsetof(struct amd_signal, value))))
			return -EFAULT;
		met += v == 0;
	}
	return any ? (!deps || met > 0) : met == deps;
}

/*
 * The barriers at the head of their queues, looked at on each poll at now (the CP has played
 * its timeline up to now, so every completion before now is in memory; a barrier met is
 * completed at now, which no dependency can postdate): a met barrier is consumed (read index
 * advanced, slot INVALID), its completion signal completed with start = end = now, and its
 * queue's next packet starts no earlier. True if one completed.
 */
static bool emu_cp_barriers(struct device_queue_manager *dqm, u64 now)
{
	struct hsa_barrier_packet b;
	struct qcm_process_device *qpd;
	void __user *slot;
	struct queue *q;
	bool progress = false, any;
	int met;
	u16 type;

	list_for_each_entry(qpd, &dqm->queues, dqm_list) {
		list_for_each_entry(q, &qpd->queues_list, list) {
			if (!emu_cp_serves(q) || !q->at_barrier || q->has_dispatch)
				continue;
			slot = (void __user *)(uintptr_t)(q->properties.queue_address +
				(q->cp_rptr % emu_ring_packets(q)) * AQL_PACKET_SIZE);
			if (!emu_user_begin(q))
				continue;
			if (copy_from_user(&b, slot, sizeof(b))) {
				emu_user_end(q);
				emu_queue_error(q, EC_QUEUE_PACKET_RESERVED);
				continue;
			}
			type = b.header & HSA_PACKET_HEADER_TYPE_MASK;
			any = type == HSA_PACKET_TYPE_BARRIER_OR;
			if (type == HSA_PACKET_TYPE_VENDOR_SPECIFIC)
				met = emu_barrier_value_met((const struct amd_aql_barrier_value *)&b);
			else
				met = emu_barrier_met(&b, any);
			if (met <= 0) {
				emu_user_end(q);
				/* an unreadable dependency: the GPU would fault on it */
				if (met < 0)
					emu_queue_error(q, EC_QUEUE_PACKET_RESERVED);
				continue;
			}
			q->cp_rptr++;
			if (put_user((u16)HSA_PACKET_TYPE_INVALID, (u16 __user *)slot) ||
			    put_user(q->cp_rptr, (u64 __user *)q->properties.read_ptr)) {
				emu_user_end(q);
				emu_queue_error(q, EC_QUEUE_PACKET_RESERVED);
				continue;
			}
			emu_user_end(q);
			q->at_barrier = false;
			q->ready_ns = now;
			q->packets_done++;
			if (type == HSA_PACKET_TYPE_VENDOR_SPECIFIC)
				dqm->stats.barriers_value++;
			else if (any)
				dqm->stats.barriers_or++;
			else
				dqm->stats.barriers_and++;
			emu_signal_complete(dqm, q, b.completion_signal, now, now);
			progress = true;
		}
	}
	return progress;
}

/*
 * The SDMA engines (README "SDMA"). ROCr 5.2 copies between system memory and a GPU's memory
 * on SDMA queues on gfx90a (GpuAgent::InitDma, src/core/runtime/amd_gpu_agent.cpp: BlitSdma
 * unless HSA_ENABLE_SDMA=0; gfx8 and gfx1013 excepted), which HIP 5.2's hipMemcpy of pageable
 * memory reaches through hsa_amd_memory_async_copy from its pinned staging buffer. A queue of
 * type SDMA (or SDMA_XGMI, SDMA_BY_ENG_ID) is a ring of dword packets; its read and write
 * pointers are 64-bit byte offsets that only grow (gfx9's SDMA 4.x: ROCr's BlitSdmaV4,
 * BlitSdma<uint64_t, true, -1, false>, src/core/inc/amd_blit_sdma.h), the ring offset being
 * the pointer modulo the ring size. The packets are SDMA 4.x's (Linux
 * drivers/gpu/drm/amd/amdgpu/vega10_sdma_pkt_open.h, the format ROCr's
 * src/core/inc/sdma_registers.h writes): header dword op in bits 0..7, sub-op in 8..15.
 */
#define SDMA_OP_NOP 0
#define SDMA_OP_COPY 1
#define SDMA_OP_FENCE 5
#define SDMA_OP_TRAP 6
#define SDMA_OP_POLL_REGMEM 8
#define SDMA_OP_ATOMIC 10
#define SDMA_OP_CONST_FILL 11
#define SDMA_OP_TIMESTAMP 13
#define SDMA_SUBOP_COPY_LINEAR 0
#define SDMA_SUBOP_TIMESTAMP_GET_GLOBAL 2
#define SDMA_ATOMIC_ADD64 47
#define SDMA_MAX_PKT_DW 8
/* copies and fills go in pieces of at most a page (one packet moves up to 2^22 bytes:
 * SDMA 4 counts bytes - 1 in 22 bits) */
#define SDMA_COPY_CHUNK PAGE_SIZE

static bool emu_sdma_serves(struct queue *q)
{
	return q->hw_mapped && !q->error_ec &&
	       (q->properties.type == KFD_QUEUE_TYPE_SDMA ||
		q->properties.type == KFD_QUEUE_TYPE_SDMA_XGMI ||
		q->properties.type == KFD_QUEUE_TYPE_SDMA_BY_ENG_ID);
}

/* dwords of the packet whose header is hdr, 0 for an op the emulated engine does not know */
static u32 emu_sdma_packet_dw(u32 hdr)
{
	switch (hdr & 0xff) {
	case SDMA_OP_NOP:
		return 1 + ((hdr >> 16) & 0x3fff);	/* NOP: count dwords of payload follow */
	case SDMA_OP_COPY:
		return ((hdr >> 8) & 0xff) == SDMA_SUBOP_COPY_LINEAR ? 7 : 0;
	case SDMA_OP_FENCE:
		return 4;
	case SDMA_OP_TRAP:
		return 2;
	case SDMA_OP_POLL_REGMEM:
		return 6;
	case SDMA_OP_ATOMIC:
		return 8;
	case SDMA_OP_CONST_FILL:
		return 5;
	case SDMA_OP_TIMESTAMP:
		return ((hdr >> 8) & 0xff) == SDMA_SUBOP_TIMESTAMP_GET_GLOBAL ? 3 : 0;
	default:
		return 0;
	}
}

/* COPY_LINEAR: count + 1 bytes (SDMA 4's count is bytes - 1), in page-sized pieces */
static int emu_sdma_copy(struct kfd_process *p, u64 dst, u64 src, u64 bytes, u8 *buf)
{
	while (bytes) {
		u32 n = min_t(u64, bytes, SDMA_COPY_CHUNK - max(offset_in_page(src), offset_in_page(dst)));

		if (emu_gpu_access(p, src, buf, n, false) || emu_gpu_access(p, dst, buf, n, true))
			return -EFAULT;
		src += n;
		dst += n;
		bytes -= n;
	}
	return 0;
}

/* POLL_REGMEM's compare functions (SDMA 4: 0 always, 1 <, 2 <=, 3 ==, 4 !=, 5 >=, 6 >) */
static bool emu_sdma_compare(u32 func, u32 v, u32 ref)
{
	switch (func) {
	case 0: return true;
	case 1: return v < ref;
	case 2: return v <= ref;
	case 3: return v == ref;
	case 4: return v != ref;
	case 5: return v >= ref;
	case 6: return v > ref;
	default: return false;
	}
}

/*
 * Execute one SDMA packet (dw, n dwords) at now. 1 done, 0 a POLL_REGMEM whose condition does
 * not hold yet (not consumed: looked at again at the next poll), or a negated exception code.
 * The user mm is in use; *trap gets a TRAP's interrupt context (the event id) or stays -1.
 */
static int emu_sdma_exec(struct device_queue_manager *dqm, struct queue *q, const u32 *dw,
			 u64 now, u8 *buf, s64 *trap)
{
	struct kfd_process *p = q->process;
	u32 hdr = dw[0], v;
	u64 addr, bytes, ticks;
	int i;

	switch (hdr & 0xff) {
	case SDMA_OP_NOP:
		return 1;
	case SDMA_OP_COPY:
		/* DW1 count[21:0], DW2 swap, DW3/4 src, DW5/6 dst */
		bytes = (u64)(dw[1] & 0x3fffff) + 1;
		if (emu_sdma_copy(p, dw[5] | (u64)dw[6] << 32, dw[3] | (u64)dw[4] << 32, bytes, buf))
			return -EC_QUEUE_PACKET_RESERVED;
		dqm->stats.sdma_copies++;
		dqm->stats.sdma_bytes += bytes;
		return 1;
	case SDMA_OP_CONST_FILL:
		/* DW0 fillsize[31:30], DW1/2 dst, DW3 data, DW4 count[21:0] (bytes - 1) */
		addr = dw[1] | (u64)dw[2] << 32;
		bytes = (u64)(dw[4] & 0x3fffff) + 1;
		for (i = 0; i < SDMA_COPY_CHUNK / 4; i++)
			((u32 *)buf)[i] = dw[3];
		while (bytes) {
			u32 n = min_t(u64, bytes, SDMA_COPY_CHUNK - offset_in_page(addr));

			if (emu_gpu_access(p, addr, buf, n, true))
				return -EC_QUEUE_PACKET_RESERVED;
			addr += n;
			bytes -= n;
		}
		dqm->stats.sdma_fills++;
		return 1;
	case SDMA_OP_FENCE:
		/* DW1/2 address, DW3 the u32 written */
		v = dw[3];
		if (emu_gpu_access(p, dw[1] | (u64)dw[2] << 32, &v, sizeof(v), true))
			return -EC_QUEUE_PACKET_RESERVED;
		dqm->stats.sdma_fences++;
		return 1;
	case SDMA_OP_TRAP:
		/* DW1 int_ctx[27:0]: the interrupt's context, the KFD event id ROCr puts there
		 * (kfd_int_process_v9.c: SDMA_TRAP -> kfd_signal_event_interrupt(pasid,
		 * context_id & 0xfffffff, 28)) */
		*trap = dw[1] & 0xfffffff;
		dqm->stats.sdma_traps++;
		return 1;
	case SDMA_OP_POLL_REGMEM:
		/* DW0 mem_poll[31] func[30:28] hdp_flush[26]; DW1/2 address, DW3 reference,
		 * DW4 mask. A register poll (mem_poll 0: ROCr's HDP flush) has nothing to wait for. */
		if (hdr >> 31) {
			if (emu_gpu_access(p, dw[1] | (u64)dw[2] << 32, &v, sizeof(v), false))
				return -EC_QUEUE_PACKET_RESERVED;
			if (!emu_sdma_compare((hdr >> 28) & 7, v & dw[4], dw[3]))
				return 0;
		}
		dqm->stats.sdma_polls++;
		return 1;
	case SDMA_OP_ATOMIC:
		/* DW0 operation[31:25]; DW1/2 address, DW3/4 source data (ADD64: the addend) */
		if (hdr >> 25 != SDMA_ATOMIC_ADD64)
			return -EC_QUEUE_PACKET_UNSUPPORTED;
		if (emu_gpu_add64(p, dw[1] | (u64)dw[2] << 32, (s64)(dw[3] | (u64)dw[4] << 32)))
			return -EC_QUEUE_PACKET_RESERVED;
		dqm->stats.sdma_atomics++;
		return 1;
	case SDMA_OP_TIMESTAMP:
		/* GET_GLOBAL_TIMESTAMP: the GPU clock (the 100 MHz counter signals carry) at DW1/2 */
		ticks = emu_gpu_ticks(now);
		if (emu_gpu_access(p, dw[1] | (u64)dw[2] << 32, &ticks, sizeof(ticks), true))
			return -EC_QUEUE_PACKET_RESERVED;
		dqm->stats.sdma_timestamps++;
		return 1;
	}
	return -EC_QUEUE_PACKET_UNSUPPORTED;
}

/*
 * Play q's SDMA ring from its read pointer up to its write pointer at now: every packet takes
 * no emulated time (the copy engines are not modelled for time; the compute timeline is
 * unaffected). Stops at a POLL_REGMEM not yet met. The read pointer advances past each packet
 * executed (written back where CREATE_QUEUE said, as the engine's rptr write-back). A write
 * pointer behind the read pointer, more than a ring ahead or not dword aligned, a packet
 * running past the write pointer, an unreadable ring or an address no memory holds stop the
 * queue with EC_QUEUE_PACKET_RESERVED; an op the engine does not know (or an atomic other than
 * ADD64) with EC_QUEUE_PACKET_UNSUPPORTED. True if a packet was executed.
 */
static bool emu_sdma_run(struct device_queue_manager *dqm, struct queue *q, u64 now, u8 *buf)
{
	u64 ring = q->properties.queue_size, base = q->properties.queue_address;
	u64 r = q->cp_rptr, w;
	u32 dw[SDMA_MAX_PKT_DW], n, i;
	s64 trap = -1;
	int ret = 0, ec = 0;
	bool progress = false;

	if (!ring || !emu_user_begin(q))
		return false;
	if (get_user(w, (u64 __user *)q->properties.write_ptr) || w < r || w - r > ring || w % 4) {
		ec = EC_QUEUE_PACKET_RESERVED;
		goto out;
	}
	while (r < w) {
		if (get_user(dw[0], (u32 __user *)(uintptr_t)(base + r % ring))) {
			ec = EC_QUEUE_PACKET_RESERVED;
			break;
		}
		n = emu_sdma_packet_dw(dw[0]);
		if (!n) {
			pr_debug("kfd_emu: SDMA packet 0x%08x not emulated\n", dw[0]);
			ec = EC_QUEUE_PACKET_UNSUPPORTED;
			break;
		}
		if (r + n * 4 > w) {
			ec = EC_QUEUE_PACKET_RESERVED;
			break;
		}
		for (i = 1; i < min_t(u32, n, SDMA_MAX_PKT_DW); i++)
			if (get_user(dw[i], (u32 __user *)(uintptr_t)(base + (r + i * 4) % ring)))
				break;
		if (i < min_t(u32, n, SDMA_MAX_PKT_DW)) {
			ec = EC_QUEUE_PACKET_RESERVED;
			break;
		}
		ret = emu_sdma_exec(dqm, q, dw, now, buf, &trap);
		if (ret < 0) {
			ec = -ret;
			break;
		}
		if (!ret)
			break;
		r += n * 4;
		progress = true;
		if (trap >= 0) {
			/* the interrupt after the packets before it (the mailbox FENCE) */
			q->cp_rptr = r;
			emu_user_end(q);
			dqm->stats.interrupts++;
			emu_signal_interrupt(dqm, q->process, (u32)trap);
			trap = -1;
			if (!emu_user_begin(q))
				return true;
		}
	}
	q->cp_rptr = r;
	if (progress && put_user(r, (u64 __user *)q->properties.read_ptr))
		ec = EC_QUEUE_PACKET_RESERVED;
out:
	emu_user_end(q);
	if (ec)
		emu_queue_error(q, ec);
	return progress;
}

/* every mapped SDMA queue of the GPU, played up to now; true if a packet was executed */
static bool emu_cp_sdma(struct device_queue_manager *dqm, u64 now)
{
	struct qcm_process_device *qpd;
	struct queue *q;
	bool progress = false;
	u8 *buf = NULL;

	list_for_each_entry(qpd, &dqm->queues, dqm_list) {
		list_for_each_entry(q, &qpd->queues_list, list) {
			if (!emu_sdma_serves(q))
				continue;
			if (!buf) {
				buf = kmalloc(SDMA_COPY_CHUNK, GFP_KERNEL);
				if (!buf)
					return progress;
			}
			progress |= emu_sdma_run(dqm, q, now, buf);
		}
	}
	kfree(buf);
	return progress;
}

/* UNMAP_QUEUES reached the waves at t: the running dispatch stops and keeps what it has left. */
static void emu_cp_preempt(struct device_queue_manager *dqm, u64 t)
{
	struct queue *q = dqm->running;

	dqm->cp_mapped = false;
	if (!q)
		return;
	q->d.remaining_ns -= t - q->d.seg_start_ns;
	q->d.stop_ns = t;
	if (!q->d.first_stop_ns)
		q->d.first_stop_ns = t;
	q->d.preemptions++;
	dqm->running = NULL;
}

/* A queue leaves the GPU's lists (destroy, process teardown): the CP forgets it. */
static void emu_cp_forget(struct device_queue_manager *dqm, struct queue *q)
{
	if (dqm->running == q) {
		dqm->now_ns = max(dqm->now_ns, min(q->d.seg_start_ns + q->d.remaining_ns,
						   ktime_get_ns()));
		dqm->running = NULL;
	}
	q->hw_mapped = false;
	q->has_dispatch = false;
}

/* One pass at time now (under hw_lock); returns when the CP must look again (0: when kicked). */
static u64 emu_cp_run(struct device_queue_manager *dqm, u64 *now_io)
{
	u64 now = *now_io;
	struct qcm_process_device *qpd;
	struct queue *q;
	u64 wake = U64_MAX;
	bool polling = false;

	if (dqm->cp_mapped && !dqm->preempt_pending) {
		now = max(now, emu_cp_observe(dqm));
		*now_io = now;
	}
	if (dqm->preempt_pending && !dqm->preempt_applied) {
		emu_cp_advance(dqm, dqm->unmap_at_ns);
		emu_cp_preempt(dqm, dqm->unmap_at_ns);
		dqm->preempt_applied = true;
	}
	emu_cp_advance(dqm, now);
	if (dqm->cp_mapped && !dqm->preempt_pending) {
		unsigned int rounds = 0;

		/* a completed barrier may let its queue run up to the next one; an SDMA packet
		 * may complete a barrier's dependency and a barrier's signal an SDMA poll */
		emu_cp_sdma(dqm, now);
		while ((emu_cp_barriers(dqm, now) | emu_cp_sdma(dqm, now)) && ++rounds < 64)
			emu_cp_advance(dqm, now);
	}
	if (dqm->preempt_pending && now >= dqm->preempt_deadline_ns) {
		/* UNMAP_QUEUES finished: every queue is saved and off the runlist, then the
		 * QUERY_STATUS fence is written (what amdkfd_fence_wait_timeout polls).
		 */
		list_for_each_entry(qpd, &dqm->queues, dqm_list)
			list_for_each_entry(q, &qpd->queues_list, list)
				q->hw_mapped = false;
		dqm->preempt_pending = false;
		WRITE_ONCE(*dqm->fence_addr, dqm->fence_pending_value);
	}
	if (dqm->preempt_pending)
		wake = dqm->preempt_deadline_ns;
	if (dqm->running)
		wake = min(wake, dqm->running->d.seg_start_ns + dqm->running->d.remaining_ns);
	if (dqm->cp_mapped && dqm->stall_until_ns > now)
		wake = min(wake, dqm->stall_until_ns);
	if (dqm->cp_mapped) {
		list_for_each_entry(qpd, &dqm->queues, dqm_list)
			list_for_each_entry(q, &qpd->queues_list, list)
				polling |= emu_cp_serves(q) || emu_sdma_serves(q);
		if (polling)
			wake = min(wake, now + (u64)max(tick_us, 1U) * NSEC_PER_USEC);
	}
	return wake == U64_MAX ? 0 : wake;
}

static void emu_cp_kick(struct device_queue_manager *dqm)
{
	WRITE_ONCE(dqm->cp_kick, true);
	wake_up(&dqm->cp_wait);
}

static int emu_cp_thread(void *data)
{
	struct device_queue_manager *dqm = data;
	u64 now, wake, sync;

	while (!kthread_should_stop()) {
		WRITE_ONCE(dqm->cp_kick, false);
		mutex_lock(&dqm->hw_lock);
		sync = dqm->sync_req;
		now = ktime_get_ns();
		wake = emu_cp_run(dqm, &now);
		dqm->sync_done = sync;
		mutex_unlock(&dqm->hw_lock);
		wake_up_all(&dqm->sync_wait);
		if (!wake)
			wait_event_interruptible(dqm->cp_wait, kthread_should_stop() ||
						 READ_ONCE(dqm->cp_kick));
		else if (wake > now)
			wait_event_interruptible_hrtimeout(dqm->cp_wait, kthread_should_stop() ||
							   READ_ONCE(dqm->cp_kick),
							   ns_to_ktime(wake - now));
	}
	return 0;
}

/* Make the CP play its timeline up to now (a "register read" of the emulated GPU). */
static void emu_cp_sync(struct device_queue_manager *dqm)
{
	u64 want;

	mutex_lock(&dqm->hw_lock);
	want = ++dqm->sync_req;
	mutex_unlock(&dqm->hw_lock);
	emu_cp_kick(dqm);
	wait_event_timeout(dqm->sync_wait, READ_ONCE(dqm->sync_done) >= want, HZ);
}

/* ---- device queue manager (kfd_device_queue_manager.c) ---- */

/*
 * Mirrors: int amdkfd_fence_wait_timeout(struct device_queue_manager *dqm, uint64_t fence_value,
 *                                        unsigned int timeout_ms)   (Linux 6.12.117)
 * Polls the fence the CP writes when the preemption is done; -ETIME after timeout_ms
 * ("qcm fence wait loop timeout expired").
 */
__used noinline int amdkfd_fence_wait_timeout(struct device_queue_manager *dqm, u64 fence_value,
					      unsigned int timeout_ms)
{
	unsigned long end_jiffies = msecs_to_jiffies(timeout_ms) + jiffies;

	while (READ_ONCE(*dqm->fence_addr) != fence_value) {
		if (time_after(jiffies, end_jiffies)) {
			pr_err("kfd_emu: qcm fence wait loop timeout expired\n");
			return -ETIME;
		}
		usleep_range(50, 100);
	}
	return 0;
}

/*
 * Mirrors: static int unmap_queues_cpsch(struct device_queue_manager *dqm,
 *     enum kfd_unmap_queues_filter filter, uint32_t filter_param, uint32_t grace_period,
 *     bool reset)
 * (6.12.117). Nothing to do without an active runlist; otherwise UNMAP_QUEUES of every dynamic
 * queue of every process on this GPU, then wait for the fence. grace_period is accepted and,
 * like the SCH_WAVE wait it programs on real HWS, has no emulated effect.
 */
__used noinline int unmap_queues_cpsch(struct device_queue_manager *dqm,
				       enum kfd_unmap_queues_filter filter,
				       u32 filter_param, u32 grace_period, bool reset)
{
	struct qcm_process_device *qpd;
	struct queue *q;
	int retval;

	if (!dqm->active_runlist)
		return 0;

	mutex_lock(&dqm->hw_lock);
	WRITE_ONCE(*dqm->fence_addr, KFD_FENCE_INIT);
	dqm->fence_pending_value = KFD_FENCE_COMPLETED;
	dqm->unmap_at_ns = ktime_get_ns();
	dqm->preempt_deadline_ns = dqm->unmap_at_ns + (u64)preempt_delay_us * NSEC_PER_USEC;
	dqm->preempt_applied = false;
	dqm->preempt_pending = true;
	mutex_unlock(&dqm->hw_lock);
	emu_cp_kick(dqm);

	retval = amdkfd_fence_wait_timeout(dqm, KFD_FENCE_COMPLETED, queue_preemption_timeout_ms);
	if (retval) {
		/* Real KFD calls kfd_hws_hang() (GPU reset) here; the emulator drops the runlist */
		pr_err("kfd_emu: The cp might be in an unrecoverable state due to an unsuccessful queues preemption\n");
		mutex_lock(&dqm->hw_lock);
		if (!dqm->preempt_applied)
			emu_cp_preempt(dqm, dqm->unmap_at_ns);
		dqm->preempt_pending = false;
		dqm->cp_mapped = false;
		list_for_each_entry(qpd, &dqm->queues, dqm_list)
			list_for_each_entry(q, &qpd->queues_list, list)
				q->hw_mapped = false;
		mutex_unlock(&dqm->hw_lock);
	}
	dqm->active_runlist = false;
	return retval;
}

/*
 * Mirrors: static int map_queues_cpsch(struct device_queue_manager *dqm) (6.12.117):
 * no-op without active queues or with a runlist already active; else submit a runlist of every
 * active queue on the GPU.
 */
__used noinline int map_queues_cpsch(struct device_queue_manager *dqm)
{
	struct qcm_process_device *qpd;
	struct queue *q;

	if (dqm->active_queue_count == 0 || dqm->processes_count == 0)
		return 0;
	if (dqm->active_runlist)
		return 0;

	mutex_lock(&dqm->hw_lock);
	list_for_each_entry(qpd, &dqm->queues, dqm_list)
		list_for_each_entry(q, &qpd->queues_list, list)
			q->hw_mapped = q->properties.is_active;
	/* the CP loads the runlist and restores the saved waves before anything runs */
	dqm->now_ns = max(dqm->now_ns, ktime_get_ns());
	dqm->stall_until_ns = dqm->now_ns + (u64)restore_delay_us * NSEC_PER_USEC;
	dqm->cp_mapped = true;
	dqm->active_runlist = true;
	mutex_unlock(&dqm->hw_lock);
	emu_cp_kick(dqm);
	return 0;
}

/*
 * Mirrors: static int execute_queues_cpsch(struct device_queue_manager *dqm,
 *     enum kfd_unmap_queues_filter filter, uint32_t filter_param, uint32_t grace_period) (6.12.117)
 * = unmap (device-wide) then map the active queues again.
 */
__used noinline int execute_queues_cpsch(struct device_queue_manager *dqm,
					 enum kfd_unmap_queues_filter filter,
					 u32 filter_param, u32 grace_period)
{
	int retval;

	retval = unmap_queues_cpsch(dqm, filter, filter_param, grace_period, false);
	if (!retval)
		retval = map_queues_cpsch(dqm);
	return retval;
}

static void increment_queue_count(struct device_queue_manager *dqm, struct queue *q)
{
	dqm->active_queue_count++;
}

static void decrement_queue_count(struct device_queue_manager *dqm, struct queue *q)
{
	dqm->active_queue_count--;
}

/* register_process(): the qpd joins dqm->queues (under hw_lock: the CP thread walks it). */
static void dqm_register_process(struct device_queue_manager *dqm, struct qcm_process_device *qpd)
{
	if (qpd->registered)
		return;
	mutex_lock(&dqm->hw_lock);
	list_add(&qpd->dqm_list, &dqm->queues);
	mutex_unlock(&dqm->hw_lock);
	qpd->registered = true;
	dqm->processes_count++;
}

static void dqm_unregister_process(struct device_queue_manager *dqm, struct qcm_process_device *qpd)
{
	if (!qpd->registered)
		return;
	mutex_lock(&dqm->hw_lock);
	list_del(&qpd->dqm_list);
	mutex_unlock(&dqm->hw_lock);
	qpd->registered = false;
	dqm->processes_count--;
}

/*
 * Mirrors: static int create_queue_cpsch(struct device_queue_manager *dqm, struct queue *q,
 *     struct qcm_process_device *qpd, const struct kfd_criu_queue_priv_data *qd,
 *     const void *restore_mqd, const void *restore_ctl_stack) (6.12.117):
 * a queue of an evicted process starts evicted; an active queue triggers execute_queues_cpsch.
 */
__used noinline int create_queue_cpsch(struct device_queue_manager *dqm, struct queue *q,
				       struct qcm_process_device *qpd, const void *qd,
				       const void *restore_mqd, const void *restore_ctl_stack)
{
	int retval = 0;

	dqm_lock(dqm);
	dqm_register_process(dqm, qpd);
	q->properties.is_evicted = !!qpd->evicted;
	q->properties.is_active = QUEUE_IS_ACTIVE(q->properties);
	mutex_lock(&dqm->hw_lock);
	list_add(&q->list, &qpd->queues_list);
	mutex_unlock(&dqm->hw_lock);
	qpd->queue_count++;
	if (q->properties.is_active) {
		increment_queue_count(dqm, q);
		retval = execute_queues_cpsch(dqm, KFD_UNMAP_QUEUES_FILTER_DYNAMIC_QUEUES, 0,
					      USE_DEFAULT_GRACE_PERIOD);
	}
	dqm_unlock(dqm);
	return retval;
}

/*
 * wait_on_destroy_queue() (6.12.117): destroying a suspended queue of a debug-enabled process
 * blocks (interruptibly) until the debugger resumes it.
 */
static int wait_on_destroy_queue(struct device_queue_manager *dqm, struct queue *q)
{
	struct kfd_process *p = q->process;
	int ret = 0;

	q->properties.is_being_destroyed = true;
	if (p->debug_trap_enabled && q->properties.is_suspended) {
		dqm_unlock(dqm);
		mutex_unlock(&p->mutex);
		ret = wait_event_interruptible(dqm->destroy_wait, !q->properties.is_suspended);
		mutex_lock(&p->mutex);
		dqm_lock(dqm);
	}
	return ret;
}

/*
 * Mirrors: static int destroy_queue_cpsch(struct device_queue_manager *dqm,
 *     struct qcm_process_device *qpd, struct queue *q) (6.12.117)
 */
__used noinline int destroy_queue_cpsch(struct device_queue_manager *dqm,
					struct qcm_process_device *qpd,
					struct queue *q)
{
	int retval;

	dqm_lock(dqm);
	retval = wait_on_destroy_queue(dqm, q);
	if (retval) {
		q->properties.is_being_destroyed = false;
		dqm_unlock(dqm);
		return retval;
	}
	mutex_lock(&dqm->hw_lock);
	list_del(&q->list);
	emu_cp_forget(dqm, q);
	mutex_unlock(&dqm->hw_lock);
	qpd->queue_count--;
	if (q->properties.is_active) {
		decrement_queue_count(dqm, q);
		retval = execute_queues_cpsch(dqm, KFD_UNMAP_QUEUES_FILTER_DYNAMIC_QUEUES, 0,
					      USE_DEFAULT_GRACE_PERIOD);
		/* -ETIME: real KFD still frees the queue (pqm_destroy_queue ignores it) */
		if (retval == -ETIME)
			retval = 0;
	}
	if (list_empty(&qpd->queues_list))
		dqm_unregister_process(dqm, qpd);
	dqm_unlock(dqm);
	return retval;
}

/* update_queue(): an active queue is unmapped while its properties change, then remapped. */
static int dqm_update_queue(struct device_queue_manager *dqm, struct queue *q)
{
	bool prev_active;
	int retval = 0;

	dqm_lock(dqm);
	prev_active = q->properties.is_active;
	if (prev_active)
		retval = unmap_queues_cpsch(dqm, KFD_UNMAP_QUEUES_FILTER_DYNAMIC_QUEUES, 0,
					    USE_DEFAULT_GRACE_PERIOD, false);
	q->properties.is_active = QUEUE_IS_ACTIVE(q->properties);
	if (q->properties.is_active && !prev_active)
		increment_queue_count(dqm, q);
	else if (!q->properties.is_active && prev_active)
		decrement_queue_count(dqm, q);
	if (!retval)
		retval = map_queues_cpsch(dqm);
	dqm_unlock(dqm);
	return retval;
}

/*
 * Mirrors: static int evict_process_queues_cpsch(struct device_queue_manager *dqm,
 *     struct qcm_process_device *qpd) (6.12.117): counted (only the first eviction acts), marks
 * every queue evicted, deactivates the active ones, execute_queues_cpsch.
 */
__used noinline int evict_process_queues_cpsch(struct device_queue_manager *dqm,
					       struct qcm_process_device *qpd)
{
	struct queue *q;
	int retval = 0;

	dqm_lock(dqm);
	if (qpd->evicted++ > 0)
		goto out;
	list_for_each_entry(q, &qpd->queues_list, list) {
		q->properties.is_evicted = true;
		if (!q->properties.is_active)
			continue;
		q->properties.is_active = false;
		decrement_queue_count(dqm, q);
	}
	qpd_to_pdd(qpd)->last_evict_timestamp = get_jiffies_64();
	retval = execute_queues_cpsch(dqm, KFD_UNMAP_QUEUES_FILTER_DYNAMIC_QUEUES, 0,
				      USE_DEFAULT_GRACE_PERIOD);
out:
	dqm_unlock(dqm);
	return retval;
}

/*
 * Mirrors: static int restore_process_queues_cpsch(struct device_queue_manager *dqm,
 *     struct qcm_process_device *qpd) (6.12.117): the last restore reactivates queues and adds the
 * eviction time to stats_<gpuid>/evicted_ms.
 */
__used noinline int restore_process_queues_cpsch(struct device_queue_manager *dqm,
						 struct qcm_process_device *qpd)
{
	struct kfd_process_device *pdd = qpd_to_pdd(qpd);
	struct queue *q;
	int retval = 0;

	dqm_lock(dqm);
	if (WARN_ON_ONCE(!qpd->evicted))
		goto out;
	if (qpd->evicted > 1) {
		qpd->evicted--;
		goto out;
	}
	list_for_each_entry(q, &qpd->queues_list, list) {
		q->properties.is_evicted = false;
		if (!QUEUE_IS_ACTIVE(q->properties))
			continue;
		q->properties.is_active = true;
		increment_queue_count(dqm, q);
	}
	retval = execute_queues_cpsch(dqm, KFD_UNMAP_QUEUES_FILTER_DYNAMIC_QUEUES, 0,
				      USE_DEFAULT_GRACE_PERIOD);
	atomic64_add(get_jiffies_64() - pdd->last_evict_timestamp, &pdd->evict_duration_counter);
	qpd->evicted = 0;
out:
	dqm_unlock(dqm);
	return retval;
}

/*
 * Mirrors: static int process_termination_cpsch(struct device_queue_manager *dqm,
 *     struct qcm_process_device *qpd) (6.12.117): the process's queues leave the GPU whether or
 * not they are suspended; one execute_queues_cpsch if any was active.
 */
__used noinline int process_termination_cpsch(struct device_queue_manager *dqm,
					      struct qcm_process_device *qpd)
{
	struct queue *q;
	bool any_active = false;
	int retval = 0;

	dqm_lock(dqm);
	mutex_lock(&dqm->hw_lock);
	list_for_each_entry(q, &qpd->queues_list, list) {
		emu_cp_forget(dqm, q);
		if (q->properties.is_active) {
			any_active = true;
			q->properties.is_active = false;
			decrement_queue_count(dqm, q);
		}
	}
	/* the pqm still owns the queue memory (pqm_uninit frees it) */
	while (!list_empty(&qpd->queues_list))
		list_del_init(qpd->queues_list.next);
	qpd->queue_count = 0;
	mutex_unlock(&dqm->hw_lock);
	dqm_unregister_process(dqm, qpd);
	if (any_active)
		retval = execute_queues_cpsch(dqm, KFD_UNMAP_QUEUES_FILTER_DYNAMIC_QUEUES, 0,
					      USE_DEFAULT_GRACE_PERIOD);
	/* debug-suspended queues of a dying process must not keep a destroyer waiting */
	wake_up_all(&dqm->destroy_wait);
	dqm_unlock(dqm);
	return retval;
}

/* suspend_single_queue() (6.12.117): new (EC_QUEUE_NEW) or dying queues are refused (-EBUSY). */
static int suspend_single_queue(struct device_queue_manager *dqm, struct queue *q)
{
	if (q->properties.is_suspended)
		return 0;
	if ((q->properties.exception_status & KFD_EC_MASK(EC_QUEUE_NEW)) ||
	    q->properties.is_being_destroyed)
		return -EBUSY;
	q->properties.is_suspended = true;
	if (q->properties.is_active) {
		decrement_queue_count(dqm, q);
		q->properties.is_active = false;
	}
	return 0;
}

static int resume_single_queue(struct device_queue_manager *dqm, struct queue *q)
{
	if (!q->properties.is_suspended)
		return 0;
	q->properties.is_suspended = false;
	if (QUEUE_IS_ACTIVE(q->properties)) {
		q->properties.is_active = true;
		increment_queue_count(dqm, q);
	}
	return 0;
}

static u32 *get_queue_ids(u32 num_queues, u32 __user *usr_queue_id_array)
{
	if (!usr_queue_id_array)
		return NULL;
	return memdup_user(usr_queue_id_array, array_size(num_queues, sizeof(u32)));
}

static int q_array_get_index(unsigned int queue_id, u32 num_queues, u32 *queue_ids)
{
	u32 i;

	for (i = 0; i < num_queues; i++)
		if (queue_id == (queue_ids[i] & ~KFD_DBG_QUEUE_INVALID_MASK))
			return i;
	return -1;
}

/*
 * Mirrors: int suspend_queues(struct kfd_process *p, uint32_t num_queues, uint32_t grace_period,
 *     uint64_t exception_clear_mask, uint32_t *usr_queue_id_array) (6.12.117, HWS path):
 * every id starts INVALID, suspended (or already suspended) ones are cleared, one
 * execute_queues_cpsch per GPU, ERROR on failure, array written back, returns the count.
 */
__used noinline int suspend_queues(struct kfd_process *p, u32 num_queues, u32 grace_period,
				   u64 exception_clear_mask, u32 *usr_queue_id_array)
{
	u32 *queue_ids = get_queue_ids(num_queues, (u32 __user *)usr_queue_id_array);
	int total_suspended = 0;
	u32 i;
	int d;

	atomic_inc(&suspend_calls);
	if (IS_ERR(queue_ids))
		return PTR_ERR(queue_ids);
	if (!queue_ids)
		return -EINVAL;	/* real KFD dereferences the NULL array; refuse instead */
	for (i = 0; i < num_queues; i++)
		queue_ids[i] |= KFD_DBG_QUEUE_INVALID_MASK;

	for (d = 0; d < p->n_pdds; d++) {
		struct kfd_process_device *pdd = &p->pdds[d];
		struct device_queue_manager *dqm = pdd->dev->dqm;
		struct queue *q;
		int r = 0, per_device_suspended = 0;

		mutex_lock(&p->event_mutex);
		dqm_lock(dqm);
		list_for_each_entry(q, &pdd->qpd.queues_list, list) {
			int q_idx = q_array_get_index(q->properties.queue_id, num_queues,
						      queue_ids);
			int err;

			if (q_idx < 0)
				continue;
			err = suspend_single_queue(dqm, q);
			if (!err) {
				queue_ids[q_idx] &= ~KFD_DBG_QUEUE_INVALID_MASK;
				per_device_suspended++;
			} else if (err != -EBUSY) {
				queue_ids[q_idx] |= KFD_DBG_QUEUE_ERROR_MASK;
				break;
			}
		}
		if (!per_device_suspended) {
			dqm_unlock(dqm);
			mutex_unlock(&p->event_mutex);
			continue;
		}
		r = execute_queues_cpsch(dqm, KFD_UNMAP_QUEUES_FILTER_DYNAMIC_QUEUES, 0,
					 grace_period);
		if (r)
			pr_err("kfd_emu: Failed to suspend process queues.\n");
		else
			total_suspended += per_device_suspended;
		list_for_each_entry(q, &pdd->qpd.queues_list, list) {
			int q_idx = q_array_get_index(q->properties.queue_id, num_queues,
						      queue_ids);

			if (q_idx < 0)
				continue;
			if (r)
				queue_ids[q_idx] |= KFD_DBG_QUEUE_ERROR_MASK;
			else if (exception_clear_mask)
				q->properties.exception_status &= ~exception_clear_mask;
		}
		dqm_unlock(dqm);
		mutex_unlock(&p->event_mutex);
	}
	if (copy_to_user((void __user *)usr_queue_id_array, queue_ids, array_size(num_queues,
										  sizeof(u32))))
		pr_err("kfd_emu: copy_to_user failed on queue suspend\n");
	kfree(queue_ids);
	return total_suspended;
}

/*
 * Mirrors: int resume_queues(struct kfd_process *p, uint32_t num_queues,
 *     uint32_t *usr_queue_id_array) (6.12.117). A NULL array resumes every queue (used by
 * debug deactivation, runtime disable and debugger exit).
 */
__used noinline int resume_queues(struct kfd_process *p, u32 num_queues, u32 *usr_queue_id_array)
{
	u32 *queue_ids = NULL;
	int total_resumed = 0;
	u32 i;
	int d;

	if (usr_queue_id_array) {
		queue_ids = get_queue_ids(num_queues, (u32 __user *)usr_queue_id_array);
		if (IS_ERR(queue_ids))
			return PTR_ERR(queue_ids);
		for (i = 0; i < num_queues; i++)
			queue_ids[i] |= KFD_DBG_QUEUE_INVALID_MASK;
	}

	for (d = 0; d < p->n_pdds; d++) {
		struct kfd_process_device *pdd = &p->pdds[d];
		struct device_queue_manager *dqm = pdd->dev->dqm;
		struct queue *q;
		int r, per_device_resumed = 0;

		dqm_lock(dqm);
		list_for_each_entry(q, &pdd->qpd.queues_list, list) {
			int q_idx = -1;

			if (queue_ids)
				q_idx = q_array_get_index(q->properties.queue_id, num_queues,
							  queue_ids);
			if (queue_ids && q_idx < 0)
				continue;
			if (!resume_single_queue(dqm, q) && queue_ids)
				queue_ids[q_idx] &= ~KFD_DBG_QUEUE_INVALID_MASK;
			per_device_resumed++;
		}
		if (!per_device_resumed) {
			dqm_unlock(dqm);
			continue;
		}
		r = execute_queues_cpsch(dqm, KFD_UNMAP_QUEUES_FILTER_DYNAMIC_QUEUES, 0,
					 USE_DEFAULT_GRACE_PERIOD);
		if (r) {
			pr_err("kfd_emu: Failed to resume process queues\n");
			if (queue_ids) {
				list_for_each_entry(q, &pdd->qpd.queues_list, list) {
					int q_idx = q_array_get_index(q->properties.queue_id,
								      num_queues, queue_ids);

					if (q_idx >= 0)
						queue_ids[q_idx] |= KFD_DBG_QUEUE_ERROR_MASK;
				}
			}
		} else {
			total_resumed += per_device_resumed;
		}
		wake_up_all(&dqm->destroy_wait);
		dqm_unlock(dqm);
	}
	if (queue_ids) {
		if (copy_to_user((void __user *)usr_queue_id_array, queue_ids,
				 array_size(num_queues, sizeof(u32))))
			pr_err("kfd_emu: copy_to_user failed on queue resume\n");
		kfree(queue_ids);
	}
	return total_resumed;
}

/* ---- SMI events and eviction (kfd_smi_events.c, kfd_process.c) ---- */

/*
 * Mirrors: void kfd_smi_event_queue_eviction(struct kfd_node *node, pid_t pid, uint32_t trigger)
 * (6.12.117). The emulator has no SMI event fds; this is the probe point with the real arguments.
 */
__used noinline void kfd_smi_event_queue_eviction(struct kfd_node *node, pid_t pid, u32 trigger)
{
	pr_debug("kfd_emu: %x queue eviction pid %d trigger %u\n", node->id, pid, trigger);
}

/* Mirrors: void kfd_smi_event_queue_restore(struct kfd_node *node, pid_t pid) (6.12.117). */
__used noinline void kfd_smi_event_queue_restore(struct kfd_node *node, pid_t pid)
{
	pr_debug("kfd_emu: %x queue restore pid %d\n", node->id, pid);
}

/*
 * Mirrors: int kfd_process_evict_queues(struct kfd_process *p, uint32_t trigger) (6.12.117):
 * per GPU, the SMI eviction event then the dqm's evict_process_queues.
 */
__used noinline int kfd_process_evict_queues(struct kfd_process *p, u32 trigger)
{
	int r = 0, i;

	for (i = 0; i < p->n_pdds; i++) {
		struct kfd_process_device *pdd = &p->pdds[i];

		kfd_smi_event_queue_eviction(pdd->dev, p->lead_thread->pid, trigger);
		r = evict_process_queues_cpsch(pdd->dev->dqm, &pdd->qpd);
		if (r && r != -EIO) {
			pr_err("kfd_emu: Failed to evict process queues\n");
			break;
		}
	}
	return r;
}

/* Mirrors: int kfd_process_restore_queues(struct kfd_process *p) (6.12.117). */
__used noinline int kfd_process_restore_queues(struct kfd_process *p)
{
	int r, ret = 0, i;

	for (i = 0; i < p->n_pdds; i++) {
		struct kfd_process_device *pdd = &p->pdds[i];

		kfd_smi_event_queue_restore(pdd->dev, p->lead_thread->pid);
		r = restore_process_queues_cpsch(pdd->dev->dqm, &pdd->qpd);
		if (r) {
			pr_err("kfd_emu: Failed to restore process queues\n");
			if (!ret)
				ret = r;
		}
	}
	return ret;
}

/* ---- sysfs (kfd_process.c procfs part, 6.12.117 formats) ---- */

static void kfd_procfs_kobj_release(struct kobject *kobj)
{
}

static ssize_t kfd_procfs_queue_show(struct kobject *kobj, struct attribute *attr, char *buffer)
{
	struct queue *q = container_of(kobj, struct queue, kobj);

	/* no trailing newline, as kfd_procfs_queue_show() */
	if (!strcmp(attr->name, "size"))
		return sysfs_emit(buffer, "%llu", q->properties.queue_size);
	if (!strcmp(attr->name, "type"))
		return sysfs_emit(buffer, "%d", q->properties.type);
	if (!strcmp(attr->name, "gpuid"))
		return sysfs_emit(buffer, "%u", q->device->id);
	return 0;
}

static struct attribute attr_queue_size = { .name = "size", .mode = 0444 };
static struct attribute attr_queue_type = { .name = "type", .mode = 0444 };
static struct attribute attr_queue_gpuid = { .name = "gpuid", .mode = 0444 };
static struct attribute *procfs_queue_attrs[] = {
	&attr_queue_size, &attr_queue_type, &attr_queue_gpuid, NULL
};
ATTRIBUTE_GROUPS(procfs_queue);

static const struct sysfs_ops procfs_queue_ops = { .show = kfd_procfs_queue_show };
static struct kobj_type procfs_queue_type = {
	.release = kfd_procfs_kobj_release,
	.sysfs_ops = &procfs_queue_ops,
	.default_groups = procfs_queue_groups,
};

static int kfd_procfs_add_queue(struct queue *q)
{
	int ret = kobject_init_and_add(&q->kobj, &procfs_queue_type, q->process->kobj_queues, "%u",
				       q->properties.queue_id);

	if (ret < 0) {
		pr_warn("kfd_emu: Creating proc/<pid>/queues/%u failed\n", q->properties.queue_id);
		kobject_put(&q->kobj);
	}
	return ret;
}

static void kfd_procfs_del_queue(struct queue *q)
{
	kobject_del(&q->kobj);
	kobject_put(&q->kobj);
}

/*
 * stats_<gpuid>/cu_occupancy: kfd_get_cu_occupancy() (6.12.117) reads the waves in flight from
 * the hardware and prints the CUs they occupy ("%d\n"). Here the CP first plays its timeline up
 * to now; a running dispatch holds every CU of the emulated GPU, a preempted one none.
 */
static int emu_cu_occupancy(struct kfd_process_device *pdd)
{
	struct device_queue_manager *dqm = pdd->dev->dqm;
	bool busy;

	emu_cp_sync(dqm);
	mutex_lock(&dqm->hw_lock);
	busy = dqm->running && dqm->running->process == pdd->process;
	mutex_unlock(&dqm->hw_lock);
	return busy ? EMU_CU_COUNT : 0;
}

static ssize_t kfd_procfs_show(struct kobject *kobj, struct attribute *attr, char *buffer)
{
	struct kfd_process *p;
	struct kfd_process_device *pdd;

	if (!strcmp(attr->name, "pasid")) {
		p = container_of(attr, struct kfd_process, attr_pasid);
		return sysfs_emit(buffer, "%d\n", p->pasid);
	}
	if (!strncmp(attr->name, "vram_", 5))
		return sysfs_emit(buffer, "%llu\n", 0ULL);	/* the emulator allocates no VRAM */
	if (!strncmp(attr->name, "sdma_", 5))
		return sysfs_emit(buffer, "%llu\n", 0ULL);	/* no SDMA activity accounting */
	if (!strcmp(attr->name, "cu_occupancy")) {
		pdd = container_of(attr, struct kfd_process_device, attr_cu_occupancy);
		return sysfs_emit(buffer, "%d\n", emu_cu_occupancy(pdd));
	}
	if (!strcmp(attr->name, "evicted_ms")) {
		pdd = container_of(attr, struct kfd_process_device, attr_evict);
		return sysfs_emit(buffer, "%llu\n",
				  (u64)jiffies64_to_msecs(atomic64_read(&pdd->evict_duration_counter)));
	}
	return 0;
}

static const struct sysfs_ops kfd_procfs_ops = { .show = kfd_procfs_show };
static struct kobj_type procfs_type = {
	.release = kfd_procfs_kobj_release,
	.sysfs_ops = &kfd_procfs_ops,
};

static void kfd_sysfs_init_attr(struct attribute *attr, const char *name)
{
	sysfs_attr_init(attr);
	attr->name = name;
	attr->mode = 0444;
}

static int kfd_process_add_sysfs(struct kfd_process *p)
{
	int i, ret;

	p->kobj = kzalloc(sizeof(*p->kobj), GFP_KERNEL);
	if (!p->kobj)
		return -ENOMEM;
	ret = kobject_init_and_add(p->kobj, &procfs_type, procfs_kobj, "%d",
				   (int)p->lead_thread->pid);
	if (ret) {
		kobject_put(p->kobj);
		kfree(p->kobj);
		p->kobj = NULL;
		return ret;
	}
	kfd_sysfs_init_attr(&p->attr_pasid, "pasid");
	ret = sysfs_create_file(p->kobj, &p->attr_pasid);
	p->kobj_queues = kobject_create_and_add("queues", p->kobj);
	if (!p->kobj_queues)
		return -ENOMEM;
	for (i = 0; i < p->n_pdds; i++) {
		struct kfd_process_device *pdd = &p->pdds[i];

		snprintf(pdd->vram_name, sizeof(pdd->vram_name), "vram_%u", pdd->dev->id);
		snprintf(pdd->sdma_name, sizeof(pdd->sdma_name), "sdma_%u", pdd->dev->id);
		snprintf(pdd->stats_name, sizeof(pdd->stats_name), "stats_%u", pdd->dev->id);
		kfd_sysfs_init_attr(&pdd->attr_vram, pdd->vram_name);
		kfd_sysfs_init_attr(&pdd->attr_sdma, pdd->sdma_name);
		kfd_sysfs_init_attr(&pdd->attr_evict, "evicted_ms");
		kfd_sysfs_init_attr(&pdd->attr_cu_occupancy, "cu_occupancy");
		ret |= sysfs_create_file(p->kobj, &pdd->attr_vram);
		ret |= sysfs_create_file(p->kobj, &pdd->attr_sdma);
		pdd->kobj_stats = kzalloc(sizeof(*pdd->kobj_stats), GFP_KERNEL);
		if (!pdd->kobj_stats)
			return -ENOMEM;
		if (kobject_init_and_add(pdd->kobj_stats, &procfs_type, p->kobj, "%s",
					 pdd->stats_name)) {
			kobject_put(pdd->kobj_stats);
			kfree(pdd->kobj_stats);
			pdd->kobj_stats = NULL;
			return -ENOMEM;
		}
		ret |= sysfs_create_file(pdd->kobj_stats, &pdd->attr_evict);
		ret |= sysfs_create_file(pdd->kobj_stats, &pdd->attr_cu_occupancy);
	}
	return ret ? -ENOMEM : 0;
}

static void kfd_process_remove_sysfs(struct kfd_process *p)
{
	int i;

	if (!p->kobj)
		return;
	for (i = 0; i < p->n_pdds; i++) {
		struct kfd_process_device *pdd = &p->pdds[i];

		sysfs_remove_file(p->kobj, &pdd->attr_vram);
		sysfs_remove_file(p->kobj, &pdd->attr_sdma);
		if (pdd->kobj_stats) {
			sysfs_remove_file(pdd->kobj_stats, &pdd->attr_evict);
			sysfs_remove_file(pdd->kobj_stats, &pdd->attr_cu_occupancy);
			kobject_del(pdd->kobj_stats);
			kobject_put(pdd->kobj_stats);
			kfree(pdd->kobj_stats);
			pdd->kobj_stats = NULL;
		}
	}
	sysfs_remove_file(p->kobj, &p->attr_pasid);
	if (p->kobj_queues) {
		kobject_del(p->kobj_queues);
		kobject_put(p->kobj_queues);
		p->kobj_queues = NULL;
	}
	kobject_del(p->kobj);
	kobject_put(p->kobj);
	kfree(p->kobj);
	p->kobj = NULL;
}

/* ---- process queue manager (kfd_process_queue_manager.c) ---- */

static struct process_queue_node *get_queue_by_qid(struct process_queue_manager *pqm,
						   unsigned int qid)
{
	struct process_queue_node *pqn;

	list_for_each_entry(pqn, &pqm->queues, process_queue_list)
		if (pqn->q && pqn->q->properties.queue_id == qid)
			return pqn;
	return NULL;
}

static void kfd_dbg_ev_raise(u64 event_mask, struct kfd_process *process, struct kfd_node *dev,
			     unsigned int source_id);

/*
 * Mirrors: int pqm_create_queue(struct process_queue_manager *pqm, struct kfd_node *dev,
 *     struct file *f, struct queue_properties *properties, unsigned int *qid,
 *     const struct kfd_criu_queue_priv_data *q_data, const void *restore_mqd,
 *     const void *restore_ctl_stack, uint32_t *p_doorbell_offset_in_process) (6.12.117):
 * -ENOSPC past 127 queues on the device, lowest free id 0..1023 (-ENOMEM when none),
 * EC_QUEUE_NEW set on the new queue and raised to a debugger, sysfs queues/<id>.
 */
__used noinline int pqm_create_queue(struct process_queue_manager *pqm, struct kfd_node *dev,
				     struct file *f,
				     struct queue_properties *properties, unsigned int *qid,
				     const void *q_data, const void *restore_mqd, const void *restore_ctl_stack,
				     u32 *p_doorbell_offset_in_process)
{
	struct kfd_process *p = pqm->process;
	struct kfd_process_device *pdd = kfd_process_device_data_by_id(p, dev->id);
	struct process_queue_node *pqn;
	struct queue *q;
	unsigned long found;
	int retval;

	if (!pdd)
		return -EINVAL;
	if (pdd->qpd.queue_count >= KFD_MAX_QUEUES_PER_PROCESS_DEVICE) {
		pr_warn("kfd_emu: Can't create new usermode queue because 127 queues were already created\n");
		return -ENOSPC;
	}
	found = find_first_zero_bit(pqm->queue_slot_bitmap, KFD_MAX_NUM_OF_QUEUES_PER_PROCESS);
	if (found >= KFD_MAX_NUM_OF_QUEUES_PER_PROCESS) {
		pr_info("kfd_emu: Cannot open more queues for process with pasid 0x%x\n", p->pasid);
		return -ENOMEM;
	}

	pqn = kzalloc(sizeof(*pqn), GFP_KERNEL);
	q = kzalloc(sizeof(*q), GFP_KERNEL);
	if (!pqn || !q) {
		kfree(pqn);
		kfree(q);
		return -ENOMEM;
	}
	set_bit(found, pqm->queue_slot_bitmap);
	q->properties = *properties;
	q->properties.queue_id = found;
	/* init_user_queue(): every new queue carries EC_QUEUE_NEW until a snapshot clears it */
	q->properties.exception_status = KFD_EC_MASK(EC_QUEUE_NEW);
	q->process = p;
	q->device = dev;
	INIT_LIST_HEAD(&q->list);
	pqn->q = q;
	/* the CP starts at the read index the producer initialised (here, in its context) */
	if (get_user(q->cp_rptr, (u64 __user *)q->properties.read_ptr))
		q->cp_rptr = 0;
	q->obs_old_w = q->cp_rptr;
	q->obs_new_w = q->cp_rptr;

	retval = create_queue_cpsch(dev->dqm, q, &pdd->qpd, q_data, restore_mqd, restore_ctl_stack);
	if (retval) {
		pr_err("kfd_emu: Error dqm create queue\n");
		dqm_lock(dev->dqm);
		mutex_lock(&dev->dqm->hw_lock);
		list_del(&q->list);
		emu_cp_forget(dev->dqm, q);
		mutex_unlock(&dev->dqm->hw_lock);
		pdd->qpd.queue_count--;
		if (q->properties.is_active)
			decrement_queue_count(dev->dqm, q);
		dqm_unlock(dev->dqm);
		clear_bit(found, pqm->queue_slot_bitmap);
		kfree(q);
		kfree(pqn);
		return retval;
	}
	*qid = found;
	/* doorbell index within the process's doorbell frame (8-byte doorbells) */
	if (p_doorbell_offset_in_process)
		*p_doorbell_offset_in_process = found * sizeof(u64);
	list_add(&pqn->process_queue_list, &pqm->queues);
	kfd_procfs_add_queue(q);
	if (p->debug_trap_enabled)
		kfd_dbg_ev_raise(KFD_EC_MASK(EC_QUEUE_NEW), p, dev, found);
	return 0;
}

/*
 * Mirrors: int pqm_destroy_queue(struct process_queue_manager *pqm, unsigned int qid) (6.12.117):
 * "Queue id does not match any known queue" -> -EINVAL.
 */
__used noinline int pqm_destroy_queue(struct process_queue_manager *pqm, unsigned int qid)
{
	struct process_queue_node *pqn = get_queue_by_qid(pqm, qid);
	struct kfd_process_device *pdd;
	struct queue *q;
	int retval;

	if (!pqn) {
		pr_debug("kfd_emu: Queue id does not match any known queue\n");
		return -EINVAL;
	}
	q = pqn->q;
	pdd = kfd_process_device_data_by_id(pqm->process, q->device->id);
	retval = destroy_queue_cpsch(q->device->dqm, &pdd->qpd, q);
	if (retval)
		return retval;
	kfd_procfs_del_queue(q);
	list_del(&pqn->process_queue_list);
	clear_bit(qid, pqm->queue_slot_bitmap);
	kfree(q);
	kfree(pqn);
	return 0;
}

/* Mirrors: void pqm_uninit(struct process_queue_manager *pqm) (6.12.117): frees every queue. */
__used noinline void pqm_uninit(struct process_queue_manager *pqm)
{
	struct process_queue_node *pqn, *next;

	list_for_each_entry_safe(pqn, next, &pqm->queues, process_queue_list) {
		if (pqn->q) {
			kfd_procfs_del_queue(pqn->q);
			kfree(pqn->q);
		}
		list_del(&pqn->process_queue_list);
		kfree(pqn);
	}
	bitmap_free(pqm->queue_slot_bitmap);
	pqm->queue_slot_bitmap = NULL;
}

static u32 set_queue_type_for_user(struct queue_properties *q_props)
{
	switch (q_props->type) {
	case KFD_QUEUE_TYPE_COMPUTE:
		return q_props->format == KFD_QUEUE_FORMAT_AQL ? KFD_IOC_QUEUE_TYPE_COMPUTE_AQL
							       : KFD_IOC_QUEUE_TYPE_COMPUTE;
	case KFD_QUEUE_TYPE_SDMA:
		return KFD_IOC_QUEUE_TYPE_SDMA;
	case KFD_QUEUE_TYPE_SDMA_XGMI:
		return KFD_IOC_QUEUE_TYPE_SDMA_XGMI;
	case KFD_QUEUE_TYPE_SDMA_BY_ENG_ID:
		return KFD_IOC_QUEUE_TYPE_SDMA_BY_ENG_ID;
	default:
		return KFD_IOC_QUEUE_TYPE_COMPUTE;
	}
}

/*
 * Mirrors: int pqm_get_queue_snapshot(struct process_queue_manager *pqm,
 *     uint64_t exception_clear_mask, void __user *buf, int *num_qss_entries,
 *     uint32_t *entry_size) (6.12.117): entry_size 0 -> -EINVAL; writes min(entry_size, 64) bytes
 * per queue, at most *num_qss_entries entries, returns the real count, clears the mask bits.
 */
__used noinline int pqm_get_queue_snapshot(struct process_queue_manager *pqm,
					   u64 exception_clear_mask,
					   void __user *buf, int *num_qss_entries, u32 *entry_size)
{
	struct process_queue_node *pqn;
	struct kfd_queue_snapshot_entry src;
	u32 stride = *entry_size;
	int r = 0, count = 0;

	if (!*entry_size)
		return -EINVAL;
	*entry_size = min_t(u32, *entry_size, sizeof(src));
	mutex_lock(&pqm->process->event_mutex);
	list_for_each_entry(pqn, &pqm->queues, process_queue_list) {
		struct queue *q = pqn->q;

		if (!q)
			continue;
		if (count < *num_qss_entries) {
			memset(&src, 0, sizeof(src));
			src.exception_status = q->properties.exception_status;
			src.ring_base_address = q->properties.queue_address;
			src.write_pointer_address = (u64)(uintptr_t)q->properties.write_ptr;
			src.read_pointer_address = (u64)(uintptr_t)q->properties.read_ptr;
			src.ctx_save_restore_address = q->properties.ctx_save_restore_area_address;
			src.ctx_save_restore_area_size = q->properties.ctx_save_restore_area_size;
			src.queue_id = q->properties.queue_id;
			src.gpu_id = q->device->id;
			src.ring_size = (u32)q->properties.queue_size;
			src.queue_type = set_queue_type_for_user(&q->properties);
			if (copy_to_user(buf, &src, *entry_size)) {
				r = -EFAULT;
				break;
			}
			buf += stride;
			q->properties.exception_status &= ~exception_clear_mask;
		}
		count++;
	}
	mutex_unlock(&pqm->process->event_mutex);
	*num_qss_entries = count;
	return r;
}

/* ---- debugger (kfd_debug.c) ---- */

/*
 * kfd_dbg_ev_raise() (6.12.117): record the exception on the queue / device / process and write
 * one '.' to the debugger's dbg_fd when the debugger enabled that exception.
 */
static void kfd_dbg_ev_raise(u64 event_mask, struct kfd_process *process, struct kfd_node *dev,
			     unsigned int source_id)
{
	struct process_queue_node *pqn;
	bool notify;
	loff_t pos = 0;
	char dot = '.';

	mutex_lock(&process->event_mutex);
	if (event_mask & KFD_EC_MASK(EC_PROCESS_RUNTIME)) {
		process->exception_status |= event_mask;
	} else if (dev) {
		list_for_each_entry(pqn, &process->pqm.queues, process_queue_list)
			if (pqn->q && pqn->q->properties.queue_id == source_id)
				pqn->q->properties.exception_status |= event_mask;
	}
	notify = process->exception_enable_mask & event_mask;
	if (notify && process->dbg_ev_file)
		kernel_write(process->dbg_ev_file, &dot, 1, &pos);
	mutex_unlock(&process->event_mutex);
}

/*
 * kfd_send_exception_to_runtime() (kfd_process.c, 6.12.117): OR the exception into the u64 the
 * CWSR area header's err_payload_addr names (the runtime's HSA event is not emulated).
 */
static void kfd_send_exception_to_runtime(struct kfd_process *p, u64 csa, u64 error_reason)
{
	struct kfd_context_save_area_header __user *header =
		(struct kfd_context_save_area_header __user *)(uintptr_t)csa;
	struct mm_struct *mm = p->mm_grabbed;
	u64 payload, cur;

	if (!mmget_not_zero(mm))
		return;
	kthread_use_mm(mm);
	if (!get_user(payload, &header->err_payload_addr) && payload &&
	    !get_user(cur, (u64 __user *)(uintptr_t)payload))
		if (put_user(cur | error_reason, (u64 __user *)(uintptr_t)payload))
			pr_debug("kfd_emu: error payload of pasid 0x%x unwritable\n", p->pasid);
	kthread_unuse_mm(mm);
	mmput(mm);
}

/*
 * kfd_set_dbg_ev_from_interrupt() (kfd_debug.c, 6.12.117) for a CP packet error: a debugger
 * that enabled the exception gets it on the queue and a '.' on its dbg_fd; otherwise a runtime
 * (RUNTIME_ENABLE) gets it through kfd_send_exception_to_runtime.
 */
static void emu_report_queue_exception(struct kfd_process *p, struct kfd_node *dev, u32 queue_id,
				       u64 mask)
{
	struct process_queue_node *pqn;
	u64 csa = 0;

	mutex_lock(&p->mutex);
	if (p->debug_trap_enabled) {
		kfd_dbg_ev_raise(mask, p, dev, queue_id);
		if (p->exception_enable_mask & mask) {
			mutex_unlock(&p->mutex);
			return;
		}
	}
	if (p->runtime_info.runtime_state == DEBUG_RUNTIME_STATE_ENABLED) {
		pqn = get_queue_by_qid(&p->pqm, queue_id);
		if (pqn)
			csa = pqn->q->properties.ctx_save_restore_area_address;
	}
	mutex_unlock(&p->mutex);
	if (csa)
		kfd_send_exception_to_runtime(p, csa, mask);
}

struct emu_error_work {
	struct work_struct work;
	struct kfd_process *p;
	struct kfd_node *dev;
	u32 queue_id;
	u64 mask;
};

static void emu_error_worker(struct work_struct *work)
{
	struct emu_error_work *w = container_of(work, struct emu_error_work, work);

	emu_report_queue_exception(w->p, w->dev, w->queue_id, w->mask);
	kfd_unref_process(w->p);
	kfree(w);
}

/*
 * The CP found a packet it cannot execute (under hw_lock): the queue stops being served and
 * the exception is reported from a worker, as amdgpu's interrupt handler defers to
 * kfd_int_process_v9's work (the reporting takes process locks the CP must not).
 */
static void emu_queue_error(struct queue *q, u32 ec)
{
	struct emu_error_work *w;

	if (q->error_ec)
		return;
	q->error_ec = ec;
	q->device->dqm->stats.errors++;
	pr_debug("kfd_emu: queue %u of pasid 0x%x: packet error %u at index %llu\n",
		 q->properties.queue_id, q->process->pasid, ec, q->cp_rptr);
	w = kzalloc(sizeof(*w), GFP_KERNEL);
	if (!w)
		return;
	if (!kref_get_unless_zero(&q->process->ref)) {
		kfree(w);
		return;
	}
	w->p = q->process;
	w->dev = q->device;
	w->queue_id = q->properties.queue_id;
	w->mask = KFD_EC_MASK(ec);
	INIT_WORK(&w->work, emu_error_worker);
	queue_work(kfd_process_wq, &w->work);
}

/*
 * kfd_dbg_trap_activate() (6.12.117, per-VMID debug GPU under HWS): runtime state stays ENABLED,
 * the runlist is refreshed (debug_refresh_runlist -> execute_queues_cpsch).
 */
static void kfd_dbg_trap_activate(struct kfd_process *target)
{
	int i;

	for (i = 0; i < target->n_pdds; i++) {
		struct device_queue_manager *dqm = target->pdds[i].dev->dqm;

		dqm_lock(dqm);
		execute_queues_cpsch(dqm, KFD_UNMAP_QUEUES_FILTER_DYNAMIC_QUEUES, 0,
				     USE_DEFAULT_GRACE_PERIOD);
		dqm_unlock(dqm);
	}
}

/* kfd_dbg_trap_deactivate() (6.12.117): resumes every suspended queue, refreshes the runlist. */
static void kfd_dbg_trap_deactivate(struct kfd_process *target)
{
	resume_queues(target, 0, NULL);
	kfd_dbg_trap_activate(target);
}

/*
 * Mirrors: int kfd_dbg_trap_disable(struct kfd_process *target) (6.12.117): 0 when not enabled;
 * deactivates (resumes everything) when the runtime is enabled, drops the dbg_fd, the debugger
 * link and the reference ENABLE took.
 */
__used noinline int kfd_dbg_trap_disable(struct kfd_process *target)
{
	struct process_queue_node *pqn;

	if (!target->debug_trap_enabled)
		return 0;
	if (target->runtime_info.runtime_state == DEBUG_RUNTIME_STATE_ENABLED)
		kfd_dbg_trap_deactivate(target);
	else if (target->runtime_info.runtime_state != DEBUG_RUNTIME_STATE_DISABLED)
		target->runtime_info.runtime_state = DEBUG_RUNTIME_STATE_ENABLED;

	mutex_lock(&target->event_mutex);
	if (target->dbg_ev_file)
		fput(target->dbg_ev_file);
	target->dbg_ev_file = NULL;
	/* kfd_dbg_clean_exception_status() */
	target->exception_status = 0;
	list_for_each_entry(pqn, &target->pqm.queues, process_queue_list)
		if (pqn->q)
			pqn->q->properties.exception_status = 0;
	mutex_unlock(&target->event_mutex);
	if (target->debugger_process) {
		atomic_dec(&target->debugger_process->debugged_process_count);
		target->debugger_process = NULL;
	}
	target->debug_trap_enabled = false;
	kfd_unref_process(target);
	return 0;
}

/*
 * Mirrors: int kfd_dbg_trap_enable(struct kfd_process *target, uint32_t fd,
 *     void __user *runtime_info, uint32_t *runtime_size) (6.12.117): -EALREADY when enabled,
 * -EBADF for a bad dbg_fd, activation deferred until RUNTIME_ENABLE, an extra process reference,
 * min(size, 16) bytes of kfd_runtime_info copied out, size written back as 16.
 */
__used noinline int kfd_dbg_trap_enable(struct kfd_process *target, u32 fd,
					void __user *runtime_info,
					u32 *runtime_size)
{
	u32 copy_size = min_t(u32, *runtime_size, sizeof(target->runtime_info));
	struct file *f;
	int r = 0;

	if (target->debug_trap_enabled)
		return -EALREADY;
	f = fget(fd);
	if (!f) {
		pr_err("kfd_emu: Failed to get file for (%i)\n", fd);
		return -EBADF;
	}
	target->dbg_ev_file = f;
	if (target->runtime_info.runtime_state == DEBUG_RUNTIME_STATE_ENABLED)
		kfd_dbg_trap_activate(target);
	target->debug_trap_enabled = true;
	kref_get(&target->ref);
	if (copy_to_user(runtime_info, &target->runtime_info, copy_size)) {
		target->debug_trap_enabled = false;
		if (target->runtime_info.runtime_state == DEBUG_RUNTIME_STATE_ENABLED)
			kfd_dbg_trap_deactivate(target);
		fput(f);
		target->dbg_ev_file = NULL;
		kfd_unref_process(target);	/* the caller still holds its own reference */
		r = -EFAULT;
	}
	*runtime_size = sizeof(target->runtime_info);
	return r;
}

/* kfd_dbg_send_exception_to_runtime() (6.12.117): EC_PROCESS_RUNTIME acks the runtime handshake. */
static int kfd_dbg_send_exception_to_runtime(struct kfd_process *p, unsigned int dev_id,
					     unsigned int queue_id,
					     u64 error_reason)
{
	if (error_reason & KFD_EC_MASK(EC_PROCESS_RUNTIME)) {
		up(&p->runtime_enable_sema);
		error_reason &= ~KFD_EC_MASK(EC_PROCESS_RUNTIME);
	}
	if (!error_reason)
		return 0;
	/* queue exceptions go to the runtime through HSA signal events, which are not emulated */
	if (!get_queue_by_qid(&p->pqm, queue_id))
		return -EINVAL;
	return 0;
}

/* kfd_dbg_set_enabled_debug_exception_mask() (6.12.117): pokes dbg_fd if one pending is now enabled */
static void kfd_dbg_set_enabled_debug_exception_mask(struct kfd_process *target,
						     u64 exception_set_mask)
{
	struct process_queue_node *pqn;
	u64 found_mask = 0;
	loff_t pos = 0;
	char dot = '.';

	mutex_lock(&target->event_mutex);
	found_mask |= target->exception_status;
	list_for_each_entry(pqn, &target->pqm.queues, process_queue_list)
		if (pqn->q)
			found_mask |= pqn->q->properties.exception_status;
	target->exception_enable_mask = exception_set_mask;
	found_mask &= exception_set_mask;
	if (found_mask && target->dbg_ev_file)
		kernel_write(target->dbg_ev_file, &dot, 1, &pos);
	mutex_unlock(&target->event_mutex);
}

/*
 * kfd_dbg_ev_query_debug_event() (6.12.117): first queue with an enabled exception, else the
 * process; clears exception_clear_mask on what it reports; -EAGAIN when nothing is pending.
 */
static int kfd_dbg_ev_query_debug_event(struct kfd_process *process, u32 *queue_id, u32 *gpu_id,
					u64 exception_clear_mask, u64 *event_status)
{
	struct process_queue_node *pqn;
	int ret = 0;

	*event_status = 0;
	*queue_id = 0;
	*gpu_id = 0;
	mutex_lock(&process->event_mutex);
	list_for_each_entry(pqn, &process->pqm.queues, process_queue_list) {
		struct queue *q = pqn->q;

		if (!q || !(q->properties.exception_status & process->exception_enable_mask))
			continue;
		*event_status = q->properties.exception_status;
		*queue_id = q->properties.queue_id;
		*gpu_id = q->device->id;
		q->properties.exception_status &= ~exception_clear_mask;
		goto out;
	}
	if (process->exception_enable_mask & process->exception_status) {
		*event_status = process->exception_status;
		process->exception_status &= ~exception_clear_mask;
	} else {
		ret = -EAGAIN;
	}
out:
	mutex_unlock(&process->event_mutex);
	return ret;
}

/* kfd_dbg_trap_query_exception_info() (6.12.117), queue and process exceptions. */
static int kfd_dbg_trap_query_exception_info(struct kfd_process *target, u32 source_id,
					     u32 exception_code,
					     bool clear_exception, void __user *info, u32 *info_size)
{
	u64 *exception_status_ptr = NULL;
	u32 actual_info_size = 0;
	struct process_queue_node *pqn;
	int r = 0;

	if (!info || !info_size)
		return -EINVAL;
	mutex_lock(&target->event_mutex);
	if (KFD_DBG_EC_TYPE_IS_QUEUE(exception_code)) {
		list_for_each_entry(pqn, &target->pqm.queues, process_queue_list)
			if (pqn->q && pqn->q->properties.queue_id == source_id)
				exception_status_ptr = &pqn->q->properties.exception_status;
	} else if (KFD_DBG_EC_TYPE_IS_PROCESS(exception_code)) {
		exception_status_ptr = &target->exception_status;
		if (exception_code == EC_PROCESS_RUNTIME) {
			u32 copy_size = min_t(u32, *info_size, sizeof(target->runtime_info));

			if (copy_to_user(info, &target->runtime_info, copy_size)) {
				r = -EFAULT;
				goto out;
			}
			actual_info_size = sizeof(target->runtime_info);
		}
	}
	if (!exception_status_ptr) {
		r = -EINVAL;
		goto out;
	}
	if (!(*exception_status_ptr & KFD_EC_MASK(exception_code))) {
		r = -ENODATA;
		goto out;
	}
	if (clear_exception)
		*exception_status_ptr &= ~KFD_EC_MASK(exception_code);
out:
	mutex_unlock(&target->event_mutex);
	*info_size = actual_info_size;
	return r;
}

/* ---- processes (kfd_process.c) ---- */

static struct kfd_process *find_process_by_mm(const struct mm_struct *mm)
{
	struct kfd_process *p;

	list_for_each_entry(p, &kfd_processes_list, processes)
		if (p->mm == mm)
			return p;
	return NULL;
}

/* kfd_lookup_process_by_pid() (6.12.117): referenced process of a pid, or NULL. */
static struct kfd_process *kfd_lookup_process_by_pid(struct pid *pid)
{
	struct task_struct *task = get_pid_task(pid, PIDTYPE_PID);
	struct kfd_process *p = NULL;
	struct mm_struct *mm;

	if (!task)
		return NULL;
	mm = get_task_mm(task);
	put_task_struct(task);
	if (!mm)
		return NULL;
	mutex_lock(&kfd_processes_mutex);
	p = find_process_by_mm(mm);
	if (p)
		kref_get(&p->ref);
	mutex_unlock(&kfd_processes_mutex);
	mmput(mm);
	return p;
}

static void kfd_process_ref_release(struct kref *ref)
{
	struct kfd_process *p = container_of(ref, struct kfd_process, ref);

	INIT_WORK(&p->release_work, kfd_process_wq_release);
	queue_work(kfd_process_wq, &p->release_work);
}

static void kfd_unref_process(struct kfd_process *p)
{
	kref_put(&p->ref, kfd_process_ref_release);
}

/*
 * Mirrors: void kfd_process_dequeue_from_all_devices(struct kfd_process *p) (6.12.117).
 */
__used noinline void kfd_process_dequeue_from_all_devices(struct kfd_process *p)
{
	int i;

	for (i = 0; i < p->n_pdds; i++)
		process_termination_cpsch(p->pdds[i].dev->dqm, &p->pdds[i].qpd);
}

/*
 * Mirrors: static void kfd_process_wq_release(struct work_struct *work) (6.12.117), on
 * kfd_process_wq: queues leave the GPUs, the pqm frees them, the sysfs directory goes.
 */
__used noinline void kfd_process_wq_release(struct work_struct *work)
{
	struct kfd_process *p = container_of(work, struct kfd_process, release_work);
	int i;

	kfd_process_dequeue_from_all_devices(p);
	pqm_uninit(&p->pqm);
	emu_process_free_events(p);
	emu_process_free_bos(p);
	for (i = 0; i < p->n_pdds; i++)
		vfree(p->pdds[i].doorbells);
	/* kfd_process_destroy_pdds(): the render node files ACQUIRE_VM took (before the sysfs
	 * directory goes, which is what "released" means to the tests)
	 */
	for (i = 0; i < p->n_pdds; i++)
		if (p->pdds[i].drm_file)
			fput(p->pdds[i].drm_file);
	kfd_process_remove_sysfs(p);
	mmdrop(p->mm_grabbed);
	put_task_struct(p->lead_thread);
	kfree(p);
	module_put(THIS_MODULE);
}

/*
 * kfd_process_notifier_release_internal() (6.12.117): at exit_mmap the process leaves the table,
 * disables debugging of itself and of every process it debugs (resuming their queues: the
 * "debugger exit auto-resume"), and drops the notifier's reference.
 */
static void kfd_process_notifier_release(struct mmu_notifier *mn, struct mm_struct *mm)
{
	struct kfd_process *p = container_of(mn, struct kfd_process, mmu_notifier);
	struct kfd_process *target, *refs[16];
	int n = 0, i;

	mutex_lock(&kfd_processes_mutex);
	spin_lock(&kfd_processes_lock);
	list_del_init(&p->processes);
	spin_unlock(&kfd_processes_lock);
	p->mm = NULL;
	if (atomic_read(&p->debugged_process_count) > 0) {
		list_for_each_entry(target, &kfd_processes_list, processes) {
			if (target->debugger_process == p && n < ARRAY_SIZE(refs)) {
				kref_get(&target->ref);
				refs[n++] = target;
			}
		}
	}
	mutex_unlock(&kfd_processes_mutex);

	mutex_lock(&p->mutex);
	kfd_dbg_trap_disable(p);
	mutex_unlock(&p->mutex);
	for (i = 0; i < n; i++) {
		mutex_lock_nested(&refs[i]->mutex, 1);
		if (refs[i]->debugger_process == p)
			kfd_dbg_trap_disable(refs[i]);
		mutex_unlock(&refs[i]->mutex);
		kfd_unref_process(refs[i]);
	}
	mmu_notifier_put(&p->mmu_notifier);
}

static void kfd_process_free_notifier(struct mmu_notifier *mn)
{
	kfd_unref_process(container_of(mn, struct kfd_process, mmu_notifier));
}

static const struct mmu_notifier_ops kfd_process_mmu_notifier_ops = {
	.release = kfd_process_notifier_release,
	.free_notifier = kfd_process_free_notifier,
};

static struct kfd_process *create_process(struct task_struct *thread)
{
	struct kfd_process *p;
	unsigned int i;
	int err;

	p = kzalloc(sizeof(*p), GFP_KERNEL);
	if (!p)
		return ERR_PTR(-ENOMEM);
	p->pqm.queue_slot_bitmap = bitmap_zalloc(KFD_MAX_NUM_OF_QUEUES_PER_PROCESS, GFP_KERNEL);
	if (!p->pqm.queue_slot_bitmap) {
		kfree(p);
		return ERR_PTR(-ENOMEM);
	}
	if (!try_module_get(THIS_MODULE)) {
		bitmap_free(p->pqm.queue_slot_bitmap);
		kfree(p);
		return ERR_PTR(-ENODEV);
	}
	kref_init(&p->ref);	/* owned by the mmu notifier, dropped in free_notifier */
	mutex_init(&p->mutex);
	mutex_init(&p->event_mutex);
	sema_init(&p->runtime_enable_sema, 0);
	INIT_LIST_HEAD(&p->pqm.queues);
	idr_init(&p->bo_idr);
	mutex_init(&p->bo_lock);
	idr_init(&p->event_idr);
	mutex_init(&p->events_lock);
	init_waitqueue_head(&p->event_wq);
	p->pqm.process = p;
	p->mm = thread->mm;
	p->mm_grabbed = thread->mm;
	mmgrab(p->mm_grabbed);
	p->lead_thread = thread->group_leader;
	get_task_struct(p->lead_thread);
	p->pasid = atomic_inc_return(&pasid_counter);
	/* kfd_init_apertures(): one process-device per GPU from the start */
	for (i = 0; i < num_gpus; i++) {
		struct kfd_process_device *pdd = &p->pdds[i];

		pdd->dev = &emu_nodes[i];
		pdd->process = p;
		pdd->qpd.dqm = emu_nodes[i].dqm;
		pdd->qpd.pqm = &p->pqm;
		INIT_LIST_HEAD(&pdd->qpd.queues_list);
		INIT_LIST_HEAD(&pdd->qpd.dqm_list);
	}
	p->n_pdds = num_gpus;

	p->mmu_notifier.ops = &kfd_process_mmu_notifier_ops;
	err = mmu_notifier_register(&p->mmu_notifier, p->mm);
	if (err) {
		mmdrop(p->mm_grabbed);
		put_task_struct(p->lead_thread);
		bitmap_free(p->pqm.queue_slot_bitmap);
		kfree(p);
		module_put(THIS_MODULE);
		return ERR_PTR(err);
	}
	spin_lock(&kfd_processes_lock);
	list_add(&p->processes, &kfd_processes_list);
	spin_unlock(&kfd_processes_lock);
	if (kfd_process_add_sysfs(p))
		pr_warn("kfd_emu: Creating procfs for pid %d failed\n", p->lead_thread->pid);
	return p;
}

/*
 * Mirrors: struct kfd_process *kfd_create_process(struct task_struct *thread) (6.12.117): from
 * kfd_open (thread = current) or from DBG_TRAP ENABLE for a ptraced target; finds the process
 * of thread's mm or creates it (sysfs proc/<pid>). Returns a referenced process.
 */
__used noinline struct kfd_process *kfd_create_process(struct task_struct *thread)
{
	struct kfd_process *process;
	struct mm_struct *mm = get_task_mm(thread);

	if (!mm)
		return ERR_PTR(-EINVAL);
	if (thread->group_leader->mm != mm) {
		mmput(mm);
		return ERR_PTR(-EINVAL);
	}
	mutex_lock(&kfd_processes_mutex);
	process = find_process_by_mm(mm);
	if (process) {
		kref_get(&process->ref);
	} else {
		process = create_process(thread);
		if (!IS_ERR(process))
			kref_get(&process->ref);
	}
	mutex_unlock(&kfd_processes_mutex);
	mmput(mm);
	return process;
}

/* ---- ioctls (kfd_chardev.c) ---- */

static int kfd_ioctl_get_version(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_get_version_args *args = data;

	args->major_version = KFD_IOCTL_MAJOR_VERSION;
	args->minor_version = READ_ONCE(kfd_minor_version);
	return 0;
}

/* set_queue_properties_from_user() (6.12.117), in its order of checks and errnos. */
static int set_queue_properties_from_user(struct queue_properties *q_properties,
					  struct kfd_ioctl_create_queue_args *args)
{
	if ((args->queue_percentage & 0xFF) > KFD_MAX_QUEUE_PERCENTAGE)
		return -EINVAL;
	if (args->queue_priority > KFD_MAX_QUEUE_PRIORITY)
		return -EINVAL;
	if (args->ring_base_address && !access_ok((const void __user *)args->ring_base_address,
						  sizeof(u64)))
		return -EFAULT;
	if (!is_power_of_2(args->ring_size) && args->ring_size != 0)
		return -EINVAL;
	if (!access_ok((const void __user *)args->read_pointer_address, sizeof(u32)))
		return -EFAULT;
	if (!access_ok((const void __user *)args->write_pointer_address, sizeof(u32)))
		return -EFAULT;
	if (args->eop_buffer_address && !access_ok((const void __user *)args->eop_buffer_address,
						   sizeof(u32)))
		return -EFAULT;
	if (args->ctx_save_restore_address &&
	    !access_ok((const void __user *)args->ctx_save_restore_address, sizeof(u32)))
		return -EFAULT;

	q_properties->queue_percent = args->queue_percentage & 0xFF;
	q_properties->priority = args->queue_priority;
	q_properties->queue_address = args->ring_base_address;
	q_properties->queue_size = args->ring_size;
	q_properties->read_ptr = (void __user *)args->read_pointer_address;
	q_properties->write_ptr = (void __user *)args->write_pointer_address;
	q_properties->eop_ring_buffer_address = args->eop_buffer_address;
	q_properties->eop_ring_buffer_size = args->eop_buffer_size;
	q_properties->ctx_save_restore_area_address = args->ctx_save_restore_address;
	q_properties->ctx_save_restore_area_size = args->ctx_save_restore_size;
	q_properties->ctl_stack_size = args->ctl_stack_size;
	q_properties->sdma_engine_id = args->sdma_engine_id;
	if (args->queue_type == KFD_IOC_QUEUE_TYPE_COMPUTE ||
	    args->queue_type == KFD_IOC_QUEUE_TYPE_COMPUTE_AQL)
		q_properties->type = KFD_QUEUE_TYPE_COMPUTE;
	else if (args->queue_type == KFD_IOC_QUEUE_TYPE_SDMA)
		q_properties->type = KFD_QUEUE_TYPE_SDMA;
	else if (args->queue_type == KFD_IOC_QUEUE_TYPE_SDMA_XGMI)
		q_properties->type = KFD_QUEUE_TYPE_SDMA_XGMI;
	else if (args->queue_type == KFD_IOC_QUEUE_TYPE_SDMA_BY_ENG_ID)
		q_properties->type = KFD_QUEUE_TYPE_SDMA_BY_ENG_ID;
	else
		return -ENOTSUPP;
	if (args->queue_type == KFD_IOC_QUEUE_TYPE_COMPUTE_AQL)
		q_properties->format = KFD_QUEUE_FORMAT_AQL;
	else
		q_properties->format = KFD_QUEUE_FORMAT_PM4;
	return 0;
}

#define KFD_MMAP_TYPE_DOORBELL (0x3ULL << 62)
#define KFD_MMAP_GPU_ID(gpu_id) ((((u64)(gpu_id)) << 46) & GENMASK_ULL(61, 46))

/*
 * Mirrors: static int kfd_ioctl_create_queue(struct file *filep, struct kfd_process *p,
 *     void *data) (6.12.117): property checks, "Could not find gpu id" -> -EINVAL,
 * pqm_create_queue,
 * queue_id and the doorbell mmap cookie written back. The kernel copy of the args is `data`
 * (queue_id at +52, what the tracer's kretprobe reads).
 */
__used noinline int kfd_ioctl_create_queue(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_create_queue_args *args = data;
	struct queue_properties q_properties;
	struct kfd_process_device *pdd;
	u32 doorbell_offset_in_process = 0;
	unsigned int queue_id;
	int err;

	memset(&q_properties, 0, sizeof(q_properties));
	err = set_queue_properties_from_user(&q_properties, args);
	if (err)
		return err;

	mutex_lock(&p->mutex);
	pdd = kfd_process_device_data_by_id(p, args->gpu_id);
	if (!pdd) {
		pr_debug("kfd_emu: Could not find gpu id 0x%x\n", args->gpu_id);
		err = -EINVAL;
		goto out;
	}
	/* SDMA_BY_ENG_ID: the emulated GPUs have two SDMA engines (allocate_sdma_queue: -EINVAL) */
	if (q_properties.type == KFD_QUEUE_TYPE_SDMA_BY_ENG_ID &&
	    q_properties.sdma_engine_id >= 2) {
		err = -EINVAL;
		goto out;
	}
	pdd->bound = true;	/* kfd_bind_process_to_device() */
	err = pqm_create_queue(&p->pqm, pdd->dev, filep, &q_properties, &queue_id, NULL, NULL, NULL,
			       &doorbell_offset_in_process);
	if (err)
		goto out;
	args->queue_id = queue_id;
	args->doorbell_offset = KFD_MMAP_TYPE_DOORBELL | KFD_MMAP_GPU_ID(args->gpu_id) |
				doorbell_offset_in_process;
out:
	mutex_unlock(&p->mutex);
	return err;
}

/*
 * Mirrors: static int kfd_ioctl_destroy_queue(struct file *filp, struct kfd_process *p,
 *     void *data) (6.12.117)
 */
__used noinline int kfd_ioctl_destroy_queue(struct file *filp, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_destroy_queue_args *args = data;
	int retval;

	mutex_lock(&p->mutex);
	retval = pqm_destroy_queue(&p->pqm, args->queue_id);
	mutex_unlock(&p->mutex);
	return retval;
}

/*
 * Mirrors: static int kfd_ioctl_update_queue(struct file *filp, struct kfd_process *p, void *data)
 * (6.12.117): same range checks as create; an unknown queue id is -EFAULT
 * (pqm_update_queue_properties).
 */
__used noinline int kfd_ioctl_update_queue(struct file *filp, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_update_queue_args *args = data;
	struct process_queue_node *pqn;
	int retval;

	if ((args->queue_percentage & 0xFF) > KFD_MAX_QUEUE_PERCENTAGE)
		return -EINVAL;
	if (args->queue_priority > KFD_MAX_QUEUE_PRIORITY)
		return -EINVAL;
	if (args->ring_base_address && !access_ok((const void __user *)args->ring_base_address,
						  sizeof(u64)))
		return -EFAULT;
	if (!is_power_of_2(args->ring_size) && args->ring_size != 0)
		return -EINVAL;

	mutex_lock(&p->mutex);
	pqn = get_queue_by_qid(&p->pqm, args->queue_id);
	if (!pqn) {
		retval = -EFAULT;
		goto out;
	}
	pqn->q->properties.queue_address = args->ring_base_address;
	pqn->q->properties.queue_size = args->ring_size;
	pqn->q->properties.queue_percent = args->queue_percentage & 0xFF;
	pqn->q->properties.priority = args->queue_priority;
	retval = dqm_update_queue(pqn->q->device->dqm, pqn->q);
out:
	mutex_unlock(&p->mutex);
	return retval;
}

/*
 * runtime_enable() / runtime_disable() (kfd_chardev.c, 6.12.117): -EBUSY unless DISABLED,
 * -EEXIST once the process has queues; with a debugger attached, raise EC_PROCESS_RUNTIME and
 * block until the debugger acks with SEND_RUNTIME_EVENT.
 */
static int runtime_enable(struct kfd_process *p, u64 r_debug, bool enable_ttmp_setup)
{
	int i, ret = 0;

	if (p->is_runtime_retry)
		goto retry;
	if (p->runtime_info.runtime_state != DEBUG_RUNTIME_STATE_DISABLED)
		return -EBUSY;
	for (i = 0; i < p->n_pdds; i++)
		if (p->pdds[i].qpd.queue_count)
			return -EEXIST;
	p->runtime_info.runtime_state = DEBUG_RUNTIME_STATE_ENABLED;
	p->runtime_info.r_debug = r_debug;
	p->runtime_info.ttmp_setup = enable_ttmp_setup;
retry:
	if (p->debug_trap_enabled) {
		if (!p->is_runtime_retry) {
			kfd_dbg_trap_activate(p);
			kfd_dbg_ev_raise(KFD_EC_MASK(EC_PROCESS_RUNTIME), p, NULL, 0);
		}
		mutex_unlock(&p->mutex);
		ret = down_interruptible(&p->runtime_enable_sema);
		mutex_lock(&p->mutex);
		p->is_runtime_retry = !!ret;
	}
	return ret;
}

static int runtime_disable(struct kfd_process *p)
{
	bool was_enabled = p->runtime_info.runtime_state == DEBUG_RUNTIME_STATE_ENABLED;
	int ret;

	p->runtime_info.runtime_state = DEBUG_RUNTIME_STATE_DISABLED;
	p->runtime_info.r_debug = 0;
	if (p->debug_trap_enabled) {
		if (was_enabled)
			kfd_dbg_trap_deactivate(p);
		if (!p->is_runtime_retry)
			kfd_dbg_ev_raise(KFD_EC_MASK(EC_PROCESS_RUNTIME), p, NULL, 0);
		mutex_unlock(&p->mutex);
		ret = down_interruptible(&p->runtime_enable_sema);
		mutex_lock(&p->mutex);
		p->is_runtime_retry = !!ret;
		if (ret)
			return ret;
	}
	p->runtime_info.ttmp_setup = false;
	return 0;
}

/*
 * Mirrors: static int kfd_ioctl_runtime_enable(struct file *filep, struct kfd_process *p,
 *     void *data) (6.12.117)
 */
__used noinline int kfd_ioctl_runtime_enable(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_runtime_enable_args *args = data;
	int r;

	mutex_lock(&p->mutex);
	if (args->mode_mask & KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK)
		r = runtime_enable(p, args->r_debug,
				   !!(args->mode_mask & KFD_RUNTIME_ENABLE_MODE_TTMP_SAVE_MASK));
	else
		r = runtime_disable(p);
	mutex_unlock(&p->mutex);
	return r;
}

/*
 * Mirrors: static int kfd_ioctl_set_debug_trap(struct file *filep, struct kfd_process *p,
 *     void *data) (6.12.117). Checks in the kernel's order: pid lookup (-ESRCH), target process
 * (created for a ptraced target on ENABLE), the 6.12.117 permission rule (the calling thread
 * must be the ptracer of the target's leader unless target == caller or the caller is the
 * registered debugger: -EPERM), debug enabled (-EINVAL), runtime enabled for HW ops (-EPERM).
 */
__used noinline int kfd_ioctl_set_debug_trap(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_dbg_trap_args *args = data;
	struct task_struct *thread = NULL;
	struct kfd_process *target = NULL;
	struct mm_struct *mm = NULL;
	struct pid *pid = NULL;
	int r = 0;

	pid = find_get_pid(args->pid);
	if (!pid) {
		r = -ESRCH;
		goto out;
	}
	thread = get_pid_task(pid, PIDTYPE_PID);
	if (!thread) {
		r = -ESRCH;
		goto out;
	}
	mm = get_task_mm(thread);
	if (!mm) {
		r = -ESRCH;
		goto out;
	}

	if (args->op == KFD_IOC_DBG_TRAP_ENABLE) {
		bool create_process;

		rcu_read_lock();
		create_process = thread != current && ptrace_parent(thread) == current;
		rcu_read_unlock();
		if (create_process)
			target = kfd_create_process(thread);
		else
			target = kfd_lookup_process_by_pid(pid);
	} else {
		target = kfd_lookup_process_by_pid(pid);
	}
	if (IS_ERR_OR_NULL(target)) {
		r = target ? PTR_ERR(target) : -ESRCH;
		target = NULL;
		goto out;
	}

	rcu_read_lock();
	if (target != p && ptrace_parent(target->lead_thread) != current &&
	    target->debugger_process != p)
		r = -EPERM;
	rcu_read_unlock();
	if (r)
		goto out;

	mutex_lock(&target->mutex);
	if (args->op != KFD_IOC_DBG_TRAP_ENABLE && !target->debug_trap_enabled) {
		r = -EINVAL;
		goto unlock_out;
	}
	if (target->runtime_info.runtime_state != DEBUG_RUNTIME_STATE_ENABLED &&
	    (args->op == KFD_IOC_DBG_TRAP_SET_WAVE_LAUNCH_OVERRIDE ||
	     args->op == KFD_IOC_DBG_TRAP_SET_WAVE_LAUNCH_MODE ||
	     args->op == KFD_IOC_DBG_TRAP_SUSPEND_QUEUES ||
	     args->op == KFD_IOC_DBG_TRAP_RESUME_QUEUES ||
	     args->op == KFD_IOC_DBG_TRAP_SET_NODE_ADDRESS_WATCH ||
	     args->op == KFD_IOC_DBG_TRAP_CLEAR_NODE_ADDRESS_WATCH ||
	     args->op == KFD_IOC_DBG_TRAP_SET_FLAGS)) {
		r = -EPERM;
		goto unlock_out;
	}

	switch (args->op) {
	case KFD_IOC_DBG_TRAP_ENABLE:
		r = kfd_dbg_trap_enable(target, args->enable.dbg_fd,
					(void __user *)args->enable.rinfo_ptr,
					&args->enable.rinfo_size);
		if (!r) {
			target->exception_enable_mask = args->enable.exception_mask;
			if (target != p) {
				target->debugger_process = p;
				atomic_inc(&p->debugged_process_count);
			}
		}
		break;
	case KFD_IOC_DBG_TRAP_DISABLE:
		r = kfd_dbg_trap_disable(target);
		break;
	case KFD_IOC_DBG_TRAP_SEND_RUNTIME_EVENT:
		r = kfd_dbg_send_exception_to_runtime(target, args->send_runtime_event.gpu_id,
						      args->send_runtime_event.queue_id,
						      args->send_runtime_event.exception_mask);
		break;
	case KFD_IOC_DBG_TRAP_SET_EXCEPTIONS_ENABLED:
		kfd_dbg_set_enabled_debug_exception_mask(target,
							 args->set_exceptions_enabled.exception_mask);
		break;
	case KFD_IOC_DBG_TRAP_SUSPEND_QUEUES:
		r = suspend_queues(target, args->suspend_queues.num_queues,
				   args->suspend_queues.grace_period,
				   args->suspend_queues.exception_mask,
				   (u32 *)args->suspend_queues.queue_array_ptr);
		break;
	case KFD_IOC_DBG_TRAP_RESUME_QUEUES:
		r = resume_queues(target, args->resume_queues.num_queues,
				  (u32 *)args->resume_queues.queue_array_ptr);
		break;
	case KFD_IOC_DBG_TRAP_QUERY_DEBUG_EVENT:
		r = kfd_dbg_ev_query_debug_event(target, &args->query_debug_event.queue_id,
						 &args->query_debug_event.gpu_id,
						 args->query_debug_event.exception_mask,
						 &args->query_debug_event.exception_mask);
		break;
	case KFD_IOC_DBG_TRAP_QUERY_EXCEPTION_INFO:
		r = kfd_dbg_trap_query_exception_info(target, args->query_exception_info.source_id,
						      args->query_exception_info.exception_code,
						      args->query_exception_info.clear_exception,
						      (void __user *)args->query_exception_info.info_ptr,
						      &args->query_exception_info.info_size);
		break;
	case KFD_IOC_DBG_TRAP_GET_QUEUE_SNAPSHOT:
		r = pqm_get_queue_snapshot(&target->pqm, args->queue_snapshot.exception_mask,
					   (void __user *)args->queue_snapshot.snapshot_buf_ptr,
					   (int *)&args->queue_snapshot.num_queues,
					   &args->queue_snapshot.entry_size);
		break;
	case KFD_IOC_DBG_TRAP_SET_WAVE_LAUNCH_OVERRIDE:
	case KFD_IOC_DBG_TRAP_SET_WAVE_LAUNCH_MODE:
	case KFD_IOC_DBG_TRAP_SET_NODE_ADDRESS_WATCH:
	case KFD_IOC_DBG_TRAP_CLEAR_NODE_ADDRESS_WATCH:
	case KFD_IOC_DBG_TRAP_SET_FLAGS:
	case KFD_IOC_DBG_TRAP_GET_DEVICE_SNAPSHOT:
		/* wave-level debugging and device snapshots are not emulated (README.md) */
		r = -EOPNOTSUPP;
		break;
	default:
		r = -EINVAL;
	}
unlock_out:
	mutex_unlock(&target->mutex);
out:
	if (thread)
		put_task_struct(thread);
	if (mm)
		mmput(mm);
	if (pid)
		put_pid(pid);
	if (target)
		kfd_unref_process(target);
	return r;
}

/*
 * ---- the ioctls libhsakmt issues at hsaKmtOpenKFD (ROCm 5.2) ----
 */

/*
 * kfd_ioctl_set_memory_policy() (6.12.117): the policies must be COHERENT or NONCOHERENT
 * (-EINVAL), the gpu id known (-EINVAL); the process binds to the device. The emulated GPU has
 * no caches to configure, so nothing else is kept.
 */
static int kfd_ioctl_set_memory_policy(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_set_memory_policy_args *args = data;
	struct kfd_process_device *pdd;
	int err = 0;

	if (args->default_policy != KFD_IOC_CACHE_POLICY_COHERENT &&
	    args->default_policy != KFD_IOC_CACHE_POLICY_NONCOHERENT)
		return -EINVAL;
	if (args->alternate_policy != KFD_IOC_CACHE_POLICY_COHERENT &&
	    args->alternate_policy != KFD_IOC_CACHE_POLICY_NONCOHERENT)
		return -EINVAL;
	mutex_lock(&p->mutex);
	pdd = kfd_process_device_data_by_id(p, args->gpu_id);
	if (!pdd) {
		pr_debug("kfd_emu: Could not find gpu id 0x%x\n", args->gpu_id);
		err = -EINVAL;
		goto out;
	}
	pdd->bound = true;
out:
	mutex_unlock(&p->mutex);
	return err;
}

/*
 * kfd_ioctl_get_clock_counters() (6.12.117): an unknown gpu id is not an error, its GPU counter
 * reads 0. The GPU counter is RLC's 100 MHz clock (gfx9), here the CP's CLOCK_MONOTONIC / 10; CPU
 * counter ktime_get_raw_ns(), system counter ktime_get_boottime_ns() at 1 GHz.
 */
static int kfd_ioctl_get_clock_counters(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_get_clock_counters_args *args = data;
	struct kfd_process_device *pdd;

	mutex_lock(&p->mutex);
	pdd = kfd_process_device_data_by_id(p, args->gpu_id);
	mutex_unlock(&p->mutex);
	args->gpu_clock_counter = pdd ? emu_gpu_ticks(ktime_get_ns()) : 0;
	args->cpu_clock_counter = ktime_get_raw_ns();
	args->system_clock_counter = ktime_get_boottime_ns();
	args->system_clock_freq = 1000000000;
	return 0;
}

/*
 * gfx9 apertures (kfd_flat_memory.c kfd_init_apertures_v9, 6.12.117): LDS at 1 << 48, scratch
 * at 2 << 48, each 4 GiB; GPUVM from max(SVM_USER_BASE, AMDGPU_VA_RESERVED_BOTTOM) = 64 KiB
 * to the 47-bit hole (gpuvm_size 1 << 47).
 */
#define EMU_LDS_BASE (1ULL << 48)
#define EMU_SCRATCH_BASE (2ULL << 48)
#define EMU_APERTURE_LIMIT(base) (((base) & 0xFFFFFFFF00000000ULL) | 0xFFFFFFFF)
#define EMU_GPUVM_BASE (1ULL << 16)
#define EMU_GPUVM_LIMIT ((1ULL << 47) - 1)

/* kfd_ioctl_get_process_apertures_new() (6.12.117): num_of_nodes 0 asks for the count */
static int kfd_ioctl_get_process_apertures_new(struct file *filp, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_get_process_apertures_new_args *args = data;
	struct kfd_process_device_apertures *pa;
	int i, ret;

	if (args->num_of_nodes == 0) {
		mutex_lock(&p->mutex);
		args->num_of_nodes = p->n_pdds;
		mutex_unlock(&p->mutex);
		return 0;
	}
	pa = kcalloc(args->num_of_nodes, sizeof(*pa), GFP_KERNEL);
	if (!pa)
		return -ENOMEM;
	mutex_lock(&p->mutex);
	for (i = 0; i < min_t(u32, p->n_pdds, args->num_of_nodes); i++) {
		pa[i].gpu_id = p->pdds[i].dev->id;
		pa[i].lds_base = EMU_LDS_BASE;
		pa[i].lds_limit = EMU_APERTURE_LIMIT(EMU_LDS_BASE);
		pa[i].gpuvm_base = EMU_GPUVM_BASE;
		pa[i].gpuvm_limit = EMU_GPUVM_LIMIT;
		pa[i].scratch_base = EMU_SCRATCH_BASE;
		pa[i].scratch_limit = EMU_APERTURE_LIMIT(EMU_SCRATCH_BASE);
	}
	mutex_unlock(&p->mutex);
	args->num_of_nodes = i;
	ret = copy_to_user((void __user *)args->kfd_process_device_apertures_ptr, pa,
			   i * sizeof(*pa));
	kfree(pa);
	return ret ? -EFAULT : 0;
}

/*
 * kfd_ioctl_acquire_vm() (6.12.117): the process's GPU VM comes from a render node file of the
 * same GPU (amdgpu_amdkfd_gpuvm_acquire_process_vm). A bad fd or gpu id is -EINVAL; a file that
 * is not that GPU's render node -EINVAL (amdgpu: not an amdgpu DRM file); a second acquire with
 * the same file is 0, with another -EBUSY. The pdd keeps the file's reference until the process
 * is released.
 */
static int kfd_ioctl_acquire_vm(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_acquire_vm_args *args = data;
	struct kfd_process_device *pdd;
	struct file *drm_file;
	int ret;

	drm_file = fget(args->drm_fd);
	if (!drm_file)
		return -EINVAL;
	mutex_lock(&p->mutex);
	pdd = kfd_process_device_data_by_id(p, args->gpu_id);
	if (!pdd) {
		ret = -EINVAL;
		goto err;
	}
	if (pdd->drm_file) {
		ret = pdd->drm_file == drm_file ? 0 : -EBUSY;
		goto err;
	}
	if (render_gpu_of_file(drm_file) != pdd - p->pdds) {
		ret = -EINVAL;
		goto err;
	}
	pdd->drm_file = drm_file;
	mutex_unlock(&p->mutex);
	return 0;
err:
	mutex_unlock(&p->mutex);
	fput(drm_file);
	return ret;
}

/*
 * ---- GPU memory (kfd_chardev.c + amdgpu_amdkfd_gpuvm.c, 6.12.117) ----
 *
 * A buffer object is guest memory: VRAM and GTT objects are vmalloc_user() pages the process
 * maps through its render node (a VRAM object gets its pages at its first CPU mapping: VRAM
 * no CPU maps, such as ROCr's scratch reservation, costs the guest nothing) (amdgpu_emu's mmap, at the offset ALLOC returned, as amdgpu's
 * DRM vma offsets); USERPTR objects are the process's own pages (GPU VA = CPU VA). The
 * emulated GPU reaches memory through the process's address space, so GPU mappings
 * (MAP/UNMAP_MEMORY_TO_GPU) are bookkeeping: which GPUs an object is mapped on.
 */

/* a DRM vma offset: DRM_FILE_PAGE_OFFSET_START ((0xFFFFFFFFUL >> PAGE_SHIFT) + 1) pages up */
#define EMU_BO_MMAP_BASE ((((u64)0xFFFFFFFFUL >> PAGE_SHIFT) + 1) << PAGE_SHIFT)
/* doorbell slice per process on gfx9: 1024 doorbells of 8 bytes (kfd_doorbell_process_slice) */
#define EMU_DOORBELL_SLICE (1024 * 8)
/* MAKE_HANDLE / GET_GPU_ID / GET_IDR_HANDLE (kfd_priv.h) */
#define EMU_MAKE_HANDLE(gpu_id, idr) (((u64)(gpu_id) << 32) | (idr))
#define EMU_HANDLE_GPU(h) ((u32)((h) >> 32))
#define EMU_HANDLE_IDR(h) ((u32)((h) & 0xFFFFFFFF))

struct emu_bo {
	u32 gpu;		/* allocating GPU index */
	u32 flags;		/* KFD_IOC_ALLOC_MEM_FLAGS_* */
	u64 va;			/* GPU VA (= CPU VA of its mapping) */
	u64 size;
	u64 mmap_offset;	/* VRAM/GTT: the render node offset; USERPTR: the CPU address */
	void *kaddr;		/* VRAM/GTT backing (vmalloc_user) */
	u32 mapped;		/* bit per GPU index it is mapped on */
};

static atomic64_t emu_bo_mmap_next = ATOMIC64_INIT(0);

static void emu_bo_free(struct emu_bo *bo)
{
	vfree(bo->kaddr);	/* mapped pages keep their own references (vm_insert_page) */
	kfree(bo);
}

static int emu_bo_free_cb(int id, void *ptr, void *data)
{
	emu_bo_free(ptr);
	return 0;
}

/* kfd_process_free_outstanding_kfd_bos(): at release, every object the process left */
static void emu_process_free_bos(struct kfd_process *p)
{
	idr_for_each(&p->bo_idr, emu_bo_free_cb, NULL);
	idr_destroy(&p->bo_idr);
}

/*
 * kfd_ioctl_alloc_memory_of_gpu() (6.12.117): size 0 -EINVAL, unknown gpu -EINVAL, no VM
 * acquired -ENODEV (kfd_bind_process_to_device), a doorbell object of other than the process
 * slice -EINVAL, an MMIO remap object of other than a page -EINVAL; the emulated GPU has no
 * MMIO remap page (rmmio_remap.bus_addr 0: -ENOMEM, which libhsakmt tolerates). VRAM is limited
 * by the topology's size (-ENOMEM, amdgpu_amdkfd_reserve_mem_limit) and, for its backing, by
 * the guest's memory.
 */
static int kfd_ioctl_alloc_memory_of_gpu(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_alloc_memory_of_gpu_args *args = data;
	struct kfd_process_device *pdd;
	struct emu_bo *bo;
	u32 flags = args->flags;
	int id, err;

	if (args->size == 0)
		return -EINVAL;
	mutex_lock(&p->mutex);
	pdd = kfd_process_device_data_by_id(p, args->gpu_id);
	if (!pdd) {
		err = -EINVAL;
		goto out;
	}
	if (!pdd->drm_file) {
		err = -ENODEV;
		goto out;
	}
	pdd->bound = true;
	if (flags & KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL) {
		if (args->size != EMU_DOORBELL_SLICE) {
			err = -EINVAL;
			goto out;
		}
	} else if (flags & KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP) {
		err = args->size != PAGE_SIZE ? -EINVAL : -ENOMEM;
		goto out;
	}
	if ((flags & KFD_IOC_ALLOC_MEM_FLAGS_VRAM) &&
	    p->vram_used[pdd - p->pdds] + args->size > EMU_VRAM_BYTES) {
		err = -ENOMEM;
		goto out;
	}
	bo = kzalloc(sizeof(*bo), GFP_KERNEL);
	if (!bo) {
		err = -ENOMEM;
		goto out;
	}
	bo->gpu = pdd - p->pdds;
	bo->flags = flags;
	bo->va = args->va_addr;
	bo->size = PAGE_ALIGN(args->size);
	if (flags & (KFD_IOC_ALLOC_MEM_FLAGS_VRAM | KFD_IOC_ALLOC_MEM_FLAGS_GTT)) {
		if (flags & KFD_IOC_ALLOC_MEM_FLAGS_GTT)
			bo->kaddr = vmalloc_user(bo->size);
		if ((flags & KFD_IOC_ALLOC_MEM_FLAGS_GTT) && !bo->kaddr) {
			kfree(bo);
			err = -ENOMEM;
			goto out;
		}
		bo->mmap_offset = EMU_BO_MMAP_BASE +
				  atomic64_fetch_add(bo->size, &emu_bo_mmap_next);
	} else if (flags & KFD_IOC_ALLOC_MEM_FLAGS_USERPTR) {
		bo->mmap_offset = args->mmap_offset;
	}
	mutex_lock(&p->bo_lock);
	id = idr_alloc(&p->bo_idr, bo, 1, 0, GFP_KERNEL);
	mutex_unlock(&p->bo_lock);
	if (id < 0) {
		emu_bo_free(bo);
		err = -EFAULT;
		goto out;
	}
	if (flags & KFD_IOC_ALLOC_MEM_FLAGS_VRAM)
		p->vram_used[bo->gpu] += bo->size;
	args->handle = EMU_MAKE_HANDLE(args->gpu_id, id);
	args->mmap_offset = bo->mmap_offset;
	err = 0;
out:
	mutex_unlock(&p->mutex);
	return err;
}

/* a VRAM or GTT object's pages, allocated at the first CPU access; p->bo_lock held */
static void *emu_bo_backing(struct emu_bo *bo)
{
	if (!bo->kaddr && (bo->flags & (KFD_IOC_ALLOC_MEM_FLAGS_VRAM | KFD_IOC_ALLOC_MEM_FLAGS_GTT)))
		bo->kaddr = vmalloc_user(bo->size);
	return bo->kaddr;
}

/* the object of `handle` allocated on a GPU of p, or NULL; p->mutex held */
static struct emu_bo *emu_bo_lookup(struct kfd_process *p, u64 handle)
{
	struct kfd_process_device *pdd = kfd_process_device_data_by_id(p, EMU_HANDLE_GPU(handle));
	struct emu_bo *bo;

	if (!pdd)
		return NULL;
	bo = idr_find(&p->bo_idr, EMU_HANDLE_IDR(handle));
	return bo && bo->gpu == pdd - p->pdds ? bo : NULL;
}

/* Does one memory object of p (VRAM, GTT or USERPTR) hold [va, va + len)? For the emulated CP. */
static bool emu_bo_holds(struct kfd_process *p, u64 va, u64 len)
{
	struct emu_bo *bo;
	bool found = false;
	int id;

	mutex_lock(&p->bo_lock);
	idr_for_each_entry(&p->bo_idr, bo, id)
		if (bo->va && va >= bo->va && va + len <= bo->va + bo->size &&
		    (bo->flags & (KFD_IOC_ALLOC_MEM_FLAGS_VRAM | KFD_IOC_ALLOC_MEM_FLAGS_GTT |
				  KFD_IOC_ALLOC_MEM_FLAGS_USERPTR))) {
			found = true;
			break;
		}
	mutex_unlock(&p->bo_lock);
	return found;
}

/*
 * The emulated GPU's view of p's memory for the SDMA engines: [va, va + len) (within one page)
 * of a VRAM or GTT object is read or written in the object's own pages (the emulator's backing,
 * which the process's CPU mappings of it share, whatever their protection), any other address
 * (USERPTR objects, ROCr's system memory) in the process's address space. The user mm is in use;
 * p->bo_lock is held only around the object's pages (never across a user access, which may
 * fault: the render node's mmap takes bo_lock under mmap_lock). 0 or -EFAULT.
 * emu_bo_kaddr: the kernel address of va in the VRAM or GTT object holding [va, va + len), or
 * NULL (none, or its pages cannot be allocated); p->bo_lock held.
 */
static u8 *emu_bo_kaddr(struct kfd_process *p, u64 va, u64 len)
{
	struct emu_bo *bo;
	u8 *k;
	int id;

	idr_for_each_entry(&p->bo_idr, bo, id) {
		if (!bo->va || va < bo->va || va + len > bo->va + bo->size ||
		    !(bo->flags & (KFD_IOC_ALLOC_MEM_FLAGS_VRAM | KFD_IOC_ALLOC_MEM_FLAGS_GTT)))
			continue;
		k = emu_bo_backing(bo);
		return k ? k + (va - bo->va) : NULL;
	}
	return NULL;
}

static int emu_gpu_access(struct kfd_process *p, u64 va, void *buf, u32 len, bool write)
{
	u8 *k;

	mutex_lock(&p->bo_lock);
	k = emu_bo_kaddr(p, va, len);
	if (k && write)
		memcpy(k, buf, len);
	else if (k)
		memcpy(buf, k, len);
	mutex_unlock(&p->bo_lock);
	if (k)
		return 0;
	if (write)
		return copy_to_user((void __user *)(uintptr_t)va, buf, len) ? -EFAULT : 0;
	return copy_from_user(buf, (void __user *)(uintptr_t)va, len) ? -EFAULT : 0;
}

/* An SDMA ATOMIC ADD64 on p's u64 at va (8-byte aligned), atomic against the CPU's own. */
static int emu_gpu_add64(struct kfd_process *p, u64 va, s64 v)
{
	struct page *page;
	u8 *k;

	if (va % 8)
		return -EFAULT;
	mutex_lock(&p->bo_lock);
	k = emu_bo_kaddr(p, va, 8);
	if (k)
		atomic64_add(v, (atomic64_t *)k);
	mutex_unlock(&p->bo_lock);
	if (k)
		return 0;
	if (pin_user_pages_fast(va & PAGE_MASK, 1, FOLL_WRITE, &page) != 1)
		return -EFAULT;
	atomic64_add(v, (atomic64_t *)(page_address(page) + offset_in_page(va)));
	unpin_user_pages_dirty_lock(&page, 1, true);
	return 0;
}

/* kfd_ioctl_free_memory_of_gpu() (6.12.117): unknown gpu or handle -EINVAL, the event page -EPERM */
static int kfd_ioctl_free_memory_of_gpu(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_free_memory_of_gpu_args *args = data;
	struct emu_bo *bo;
	int err = 0;

	mutex_lock(&p->mutex);
	bo = emu_bo_lookup(p, args->handle);
	if (!bo) {
		err = -EINVAL;
		goto out;
	}
	/* "Free signal BO is not allowed" */
	if (bo->kaddr && (void *)p->signal_page == bo->kaddr) {
		err = -EPERM;
		goto out;
	}
	mutex_lock(&p->bo_lock);
	idr_remove(&p->bo_idr, EMU_HANDLE_IDR(args->handle));
	mutex_unlock(&p->bo_lock);
	if (bo->flags & KFD_IOC_ALLOC_MEM_FLAGS_VRAM)
		p->vram_used[bo->gpu] -= bo->size;
	emu_bo_free(bo);
out:
	mutex_unlock(&p->mutex);
	return err;
}

/*
 * kfd_ioctl_map_memory_to_gpu() / kfd_ioctl_unmap_memory_from_gpu() (6.12.117): no devices or
 * n_success > n_devices -EINVAL, an unreadable id array -EFAULT, unknown handle gpu -EINVAL,
 * unknown object -ENOMEM (map) or -EINVAL (unmap), an unknown device in the array -EINVAL;
 * n_success counts the devices done, so a retry resumes there.
 */
static int emu_map_unmap(struct kfd_process *p, u64 handle, u64 ids_ptr, u32 n_devices,
			 u32 *n_success, bool map)
{
	struct kfd_process_device *peer;
	struct emu_bo *bo;
	u32 *ids, i;
	int err = 0;

	if (!n_devices || *n_success > n_devices)
		return -EINVAL;
	ids = memdup_user(u64_to_user_ptr(ids_ptr), array_size(n_devices, sizeof(u32)));
	if (IS_ERR(ids))
		return PTR_ERR(ids) == -ENOMEM ? -ENOMEM : -EFAULT;
	mutex_lock(&p->mutex);
	if (!kfd_process_device_data_by_id(p, EMU_HANDLE_GPU(handle))) {
		err = -EINVAL;
		goto out;
	}
	bo = emu_bo_lookup(p, handle);
	if (!bo) {
		err = map ? -ENOMEM : -EINVAL;
		goto out;
	}
	for (i = *n_success; i < n_devices; i++) {
		peer = kfd_process_device_data_by_id(p, ids[i]);
		if (!peer) {
			err = -EINVAL;
			goto out;
		}
		if (map)
			bo->mapped |= BIT(peer - p->pdds);
		else
			bo->mapped &= ~BIT(peer - p->pdds);
		*n_success = i + 1;
	}
out:
	mutex_unlock(&p->mutex);
	kfree(ids);
	return err;
}

static int kfd_ioctl_map_memory_to_gpu(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_map_memory_to_gpu_args *args = data;

	return emu_map_unmap(p, args->handle, args->device_ids_array_ptr, args->n_devices,
			     &args->n_success, true);
}

static int kfd_ioctl_unmap_memory_from_gpu(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_unmap_memory_from_gpu_args *args = data;

	return emu_map_unmap(p, args->handle, args->device_ids_array_ptr, args->n_devices,
			     &args->n_success, false);
}

/*
 * kfd_ioctl_get_available_memory() (6.12.117): unknown gpu -EINVAL; VRAM left to the process
 * (amdgpu_amdkfd_get_available_memory), here the topology's size less what it allocated.
 */
static int kfd_ioctl_get_available_memory(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_get_available_memory_args *args = data;
	struct kfd_process_device *pdd;
	int err = 0;

	mutex_lock(&p->mutex);
	pdd = kfd_process_device_data_by_id(p, args->gpu_id);
	if (pdd)
		args->available = EMU_VRAM_BYTES - p->vram_used[pdd - p->pdds];
	else
		err = -EINVAL;
	mutex_unlock(&p->mutex);
	return err;
}

/*
 * kfd_ioctl_set_xnack_mode() (6.12.117): a negative value queries. The emulated GPU runs with
 * retry faults off (amdgpu's noretry), as gfx90a does by default: enabling XNACK is -EPERM
 * (kfd_process_xnack_mode() false), and with queues any change is -EBUSY.
 */
static int kfd_ioctl_set_xnack_mode(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_set_xnack_mode_args *args = data;
	int err = 0;

	mutex_lock(&p->mutex);
	if (args->xnack_enabled >= 0) {
		if (!list_empty(&p->pqm.queues))
			err = -EBUSY;
		else if (args->xnack_enabled)
			err = -EPERM;
	} else {
		args->xnack_enabled = 0;
	}
	mutex_unlock(&p->mutex);
	return err;
}

/* The calling process's KFD process, referenced, from an mmap handler (kfd_processes_lock). */
static struct kfd_process *emu_process_of_current(void)
{
	struct kfd_process *p;

	spin_lock(&kfd_processes_lock);
	p = find_process_by_mm(current->mm);
	if (p)
		kref_get(&p->ref);
	spin_unlock(&kfd_processes_lock);
	return p;
}

/* the doorbell slice of a process on a GPU, allocated at its first mapping (p->bo_lock held) */
static void *emu_doorbells(struct kfd_process_device *pdd)
{
	if (!pdd->doorbells)
		pdd->doorbells = vmalloc_user(EMU_DOORBELL_SLICE);
	return pdd->doorbells;
}

#define KFD_MMAP_TYPE_MASK (0x3ULL << 62)
#define KFD_MMAP_TYPE_EVENTS (0x2ULL << 62)
#define KFD_MMAP_GET_GPU_ID(offset) (((offset) & GENMASK_ULL(61, 46)) >> 46)

/*
 * kfd_mmap() (6.12.117): the offset (vm_pgoff << PAGE_SHIFT) names the type and the gpu.
 * DOORBELL: exactly the process's 8 KiB doorbell slice of that GPU (-EINVAL otherwise, -ENODEV
 * for an unknown gpu): pages the emulated CP may read, where KFD maps the doorbell BAR
 * uncached. EVENTS: exactly the 32 KiB signal page (-EINVAL), when KFD allocated it. The
 * emulated GPUs have no reserved (APU CWSR) or MMIO remap memory: -ENODEV, as for a device
 * KFD does not find; any other type -EFAULT.
 */
static int kfd_mmap(struct file *filp, struct vm_area_struct *vma)
{
	u64 offset = (u64)vma->vm_pgoff << PAGE_SHIFT, len = vma->vm_end - vma->vm_start;
	struct kfd_process_device *pdd = NULL;
	struct kfd_process *p;
	void *pages = NULL;
	int err;

	p = emu_process_of_current();
	if (!p)
		return -EINVAL;
	if (KFD_MMAP_GET_GPU_ID(offset))
		pdd = kfd_process_device_data_by_id(p, KFD_MMAP_GET_GPU_ID(offset));
	mutex_lock(&p->bo_lock);
	switch (offset & KFD_MMAP_TYPE_MASK) {
	case KFD_MMAP_TYPE_DOORBELL:
		if (!pdd)
			err = -ENODEV;
		else if (len != EMU_DOORBELL_SLICE)
			err = -EINVAL;
		else
			err = (pages = emu_doorbells(pdd)) ? 0 : -ENOMEM;
		break;
	case KFD_MMAP_TYPE_EVENTS:
		if (len != KFD_SIGNAL_EVENT_LIMIT * 8)
			err = -EINVAL;
		else if (!p->signal_page_owned)
			err = -ENOMEM;	/* kfd_event_mmap: "Signal page not allocated" */
		else
			err = (pages = p->signal_page) ? 0 : -ENOMEM;
		break;
	case 0x1ULL << 62:	/* KFD_MMAP_TYPE_RESERVED_MEM */
	case 0x0ULL << 62:	/* KFD_MMAP_TYPE_MMIO */
		err = -ENODEV;
		break;
	default:
		err = -EFAULT;
	}
	if (!err)
		err = remap_vmalloc_range(vma, pages, 0);
	mutex_unlock(&p->bo_lock);
	kfd_unref_process(p);
	return err;
}

/*
 * amdgpu_emu's render node mmap (amdgpu_gem_mmap -> TTM, 6.12.117), mmap_lock held: the caller's
 * VRAM or GTT object at that offset, the whole mapping inside it; else -EACCES as
 * drm_gem_mmap answers an offset with no object (-EINVAL for a range past its end).
 */
int kfd_emu_render_mmap(unsigned int gpu, struct vm_area_struct *vma)
{
	u64 offset = (u64)vma->vm_pgoff << PAGE_SHIFT, len = vma->vm_end - vma->vm_start;
	struct kfd_process *p;
	struct emu_bo *bo, *found = NULL;
	int id, err;

	p = emu_process_of_current();
	if (!p)
		return -EACCES;
	mutex_lock(&p->bo_lock);
	idr_for_each_entry(&p->bo_idr, bo, id)
		if ((bo->flags & (KFD_IOC_ALLOC_MEM_FLAGS_VRAM | KFD_IOC_ALLOC_MEM_FLAGS_GTT)) &&
		    bo->gpu == gpu && offset >= bo->mmap_offset &&
		    offset < bo->mmap_offset + bo->size) {
			found = bo;
			break;
		}
	if (!found)
		err = -EACCES;
	else if (offset + len > found->mmap_offset + found->size)
		err = -EINVAL;
	else if (!emu_bo_backing(found))
		err = -ENOMEM;
	else
		err = remap_vmalloc_range(vma, found->kaddr, (offset - found->mmap_offset) >> PAGE_SHIFT);
	mutex_unlock(&p->bo_lock);
	kfd_unref_process(p);
	return err;
}
EXPORT_SYMBOL_GPL(kfd_emu_render_mmap);

/*
 * ---- events (kfd_events.c, 6.12.117) ----
 *
 * Signal and debug events take ids 0..4095, which are their slots in the signal page (u64 each,
 * UNSIGNALED_EVENT_SLOT = -1 until signalled); other types take ids from 4096. The first
 * CREATE_EVENT of a dGPU process names the event page, a GTT object the process allocated
 * (kfd_kmap_event_page); without one KFD allocates the page itself. SET_EVENT raises a signal
 * event from the CPU; WAIT_EVENTS sleeps until any (or all) of its events fire, the timeout
 * (ms; 0 polls, 0xFFFFFFFF waits forever) passes, or a signal arrives (-ERESTARTSYS).
 */

#define EMU_UNSIGNALED_EVENT_SLOT ((u64)-1)
#define EMU_EVENT_TIMEOUT_INFINITE 0xFFFFFFFFu

struct emu_event {
	u32 id;
	u32 type;
	bool auto_reset;
	bool signaled;
	u64 age;		/* event_age: 1 at creation, +1 per signal (never 0) */
	struct list_head waiters;	/* struct emu_waiter of WAIT_EVENTS calls (ev->wq in KFD) */
};

static bool emu_event_is_signal(u32 type)
{
	return type == KFD_IOC_EVENT_SIGNAL || type == KFD_IOC_EVENT_DEBUG_EVENT;
}

static int emu_event_free_cb(int id, void *ptr, void *data)
{
	kfree(ptr);
	return 0;
}

static void emu_process_free_events(struct kfd_process *p)
{
	idr_for_each(&p->event_idr, emu_event_free_cb, NULL);
	idr_destroy(&p->event_idr);
	if (p->signal_page_owned)
		vfree(p->signal_page);
}

static void emu_event_fire(struct emu_event *ev);

/*
 * kfd_signal_event_interrupt() (kfd_events.c, 6.12.117) for the interrupt an interrupt signal's
 * completion raises, its payload the signal's event_id: the event whose slot is signalled (the
 * CP just wrote the mailbox) is acknowledged (slot back to UNSIGNALED) and set; if that slot is
 * not signalled, every signalled slot's event is (KFD's exhaustive search). From the CP thread,
 * under hw_lock (events_lock is taken under it, never the other way round).
 */
static void emu_signal_interrupt(struct device_queue_manager *dqm, struct kfd_process *p,
				 u32 event_id)
{
	struct emu_event *ev;
	unsigned int set = 0;
	int id;

	mutex_lock(&p->events_lock);
	if (!p->signal_page)
		goto out;
	ev = event_id < KFD_SIGNAL_EVENT_LIMIT ? idr_find(&p->event_idr, event_id) : NULL;
	if (ev && emu_event_is_signal(ev->type) &&
	    READ_ONCE(p->signal_page[event_id]) != EMU_UNSIGNALED_EVENT_SLOT) {
		WRITE_ONCE(p->signal_page[event_id], EMU_UNSIGNALED_EVENT_SLOT);
		emu_event_fire(ev);
		set = 1;
		goto out;
	}
	idr_for_each_entry(&p->event_idr, ev, id) {
		if (id >= KFD_SIGNAL_EVENT_LIMIT || !emu_event_is_signal(ev->type) ||
		    READ_ONCE(p->signal_page[id]) == EMU_UNSIGNALED_EVENT_SLOT)
			continue;
		WRITE_ONCE(p->signal_page[id], EMU_UNSIGNALED_EVENT_SLOT);
		emu_event_fire(ev);
		set++;
	}
out:
	dqm->stats.events_set += set;
	mutex_unlock(&p->events_lock);
	if (set)
		wake_up_all(&p->event_wq);
}

/* kfd_kmap_event_page(): the page once, from a GTT object of the process (p->mutex held) */
static int emu_set_event_page(struct kfd_process *p, u64 handle)
{
	struct emu_bo *bo;

	if (p->signal_page)
		return -EINVAL;	/* "Event page is already set" */
	if (!kfd_process_device_data_by_id(p, EMU_HANDLE_GPU(handle)))
		return -EINVAL;
	bo = emu_bo_lookup(p, handle);
	if (!bo || bo->size < KFD_SIGNAL_EVENT_LIMIT * 8)
		return -EINVAL;
	mutex_lock(&p->bo_lock);
	if (!emu_bo_backing(bo)) {
		mutex_unlock(&p->bo_lock);
		return -ENOMEM;
	}
	mutex_unlock(&p->bo_lock);
	memset(bo->kaddr, 0xff, KFD_SIGNAL_EVENT_LIMIT * 8);
	p->signal_page = bo->kaddr;
	return 0;
}

static int kfd_ioctl_create_event(struct file *filp, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_create_event_args *args = data;
	struct emu_event *ev;
	int id, err = 0;

	if (args->event_page_offset) {
		mutex_lock(&p->mutex);
		mutex_lock(&p->events_lock);
		err = emu_set_event_page(p, args->event_page_offset);
		mutex_unlock(&p->events_lock);
		mutex_unlock(&p->mutex);
		if (err)
			return err;
	}
	ev = kzalloc(sizeof(*ev), GFP_KERNEL);
	if (!ev)
		return -ENOMEM;
	ev->type = args->event_type;
	ev->auto_reset = args->auto_reset != 0;
	INIT_LIST_HEAD(&ev->waiters);
	args->event_page_offset = 0;
	mutex_lock(&p->events_lock);
	if (emu_event_is_signal(ev->type)) {
		if (!p->signal_page) {
			p->signal_page = vmalloc_user(KFD_SIGNAL_EVENT_LIMIT * 8);
			if (!p->signal_page) {
				err = -ENOMEM;
				goto fail;
			}
			p->signal_page_owned = true;
			memset(p->signal_page, 0xff, KFD_SIGNAL_EVENT_LIMIT * 8);
		}
		if (p->signal_event_count == KFD_SIGNAL_EVENT_LIMIT) {
			err = -ENOSPC;
			goto fail;
		}
		id = idr_alloc(&p->event_idr, ev, 0, KFD_SIGNAL_EVENT_LIMIT, GFP_KERNEL);
		if (id < 0) {
			err = -ENOSPC;
			goto fail;
		}
		p->signal_event_count++;
		p->signal_page[id] = EMU_UNSIGNALED_EVENT_SLOT;
		/* KFD_MMAP_TYPE_EVENTS (kfd_mmap() takes the offset as vm_pgoff << PAGE_SHIFT) */
		args->event_page_offset = 0x2ULL << 62;
		args->event_slot_index = id;
	} else {
		id = idr_alloc(&p->event_idr, ev, KFD_SIGNAL_EVENT_LIMIT, 0, GFP_KERNEL);
		if (id < 0) {
			err = id;
			goto fail;
		}
	}
	ev->id = id;
	ev->age = 1;
	args->event_id = id;
	args->event_trigger_data = id;
	mutex_unlock(&p->events_lock);
	return 0;
fail:
	mutex_unlock(&p->events_lock);
	kfree(ev);
	return err;
}

struct emu_waiter {
	u32 id;
	u64 age;		/* the caller's last_event_age (0: not used) */
	bool activated;
	struct emu_event *ev;	/* NULL once the event is destroyed */
	struct list_head node;	/* on ev->waiters while waiting */
};

/* kfd_event_destroy(): unknown id -EINVAL; waiters on it wake and fail */
static int kfd_ioctl_destroy_event(struct file *filp, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_destroy_event_args *args = data;
	struct emu_waiter *w, *next;
	struct emu_event *ev;
	int err = 0;

	mutex_lock(&p->events_lock);
	ev = idr_find(&p->event_idr, args->event_id);
	if (!ev) {
		err = -EINVAL;
	} else {
		/* destroy_event(): every waiter's event goes, so its wait fails */
		list_for_each_entry_safe(w, next, &ev->waiters, node) {
			w->ev = NULL;
			list_del_init(&w->node);
		}
		idr_remove(&p->event_idr, ev->id);
		if (emu_event_is_signal(ev->type))
			p->signal_event_count--;
		kfree(ev);
	}
	mutex_unlock(&p->events_lock);
	wake_up_all(&p->event_wq);
	return err;
}

/*
 * set_event() (kfd_events.c, 6.12.117): every waiter sleeping on the event is activated, and
 * the event stays signalled unless it is auto-reset and woke someone ("Auto reset if the list is
 * non-empty and we're waking someone"); age + 1. ROCr 5.2 has two threads on one event (the
 * queue event: hsa_queue_destroy's wait and the async-handler thread): each must wake.
 */
static void emu_event_fire(struct emu_event *ev)
{
	struct emu_waiter *w;

	ev->signaled = !ev->auto_reset || list_empty(&ev->waiters);
	if (!++ev->age)
		ev->age = 2;
	list_for_each_entry(w, &ev->waiters, node)
		w->activated = true;
}

/* kfd_set_event() / kfd_reset_event(): unknown id or not a signal event -EINVAL */
static int kfd_ioctl_set_event(struct file *filp, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_set_event_args *args = data;
	struct emu_event *ev;
	int err = 0;

	mutex_lock(&p->events_lock);
	ev = idr_find(&p->event_idr, args->event_id);
	if (!ev || ev->type != KFD_IOC_EVENT_SIGNAL)
		err = -EINVAL;
	else
		emu_event_fire(ev);
	mutex_unlock(&p->events_lock);
	wake_up_all(&p->event_wq);
	return err;
}

static int kfd_ioctl_reset_event(struct file *filp, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_reset_event_args *args = data;
	struct emu_event *ev;
	int err = 0;

	mutex_lock(&p->events_lock);
	ev = idr_find(&p->event_idr, args->event_id);
	if (!ev || ev->type != KFD_IOC_EVENT_SIGNAL)
		err = -EINVAL;
	else
		ev->signaled = false;
	mutex_unlock(&p->events_lock);
	return err;
}

/*
 * init_event_waiter() (6.12.117), under events_lock: the waiter joins the event's list, activated
 * at once if the event is signalled (an auto-reset event is consumed) or, when the caller gave a
 * last_event_age, if the event's age moved since.
 */
static void emu_waiter_init(struct emu_waiter *w, struct emu_event *ev)
{
	w->ev = ev;
	w->activated = ev->signaled;
	ev->signaled = ev->signaled && !ev->auto_reset;
	if (!w->activated && w->age && emu_event_is_signal(ev->type) && ev->age != w->age)
		w->activated = true;
	list_add(&w->node, &ev->waiters);
}

/*
 * test_event_condition() (6.12.117): COMPLETE when any (all) waiters are activated, FAIL when an
 * event was destroyed, else TIMEOUT (still waiting).
 */
static u32 emu_events_test(struct emu_waiter *w, u32 n, bool all)
{
	u32 i, activated = 0;

	for (i = 0; i < n; i++) {
		if (!w[i].ev)
			return KFD_IOC_WAIT_RESULT_FAIL;
		activated += w[i].activated;
	}
	if (all ? activated == n : activated > 0)
		return KFD_IOC_WAIT_RESULT_COMPLETE;
	return KFD_IOC_WAIT_RESULT_TIMEOUT;
}

static int kfd_ioctl_wait_events(struct file *filp, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_wait_events_args *args = data;
	struct kfd_event_data __user *events = u64_to_user_ptr(args->events_ptr);
	long timeout = args->timeout == 0 ? 0 :
		       args->timeout == EMU_EVENT_TIMEOUT_INFINITE ? MAX_SCHEDULE_TIMEOUT :
		       (long)msecs_to_jiffies(args->timeout) + 1;
	struct emu_waiter *w;
	u32 i, result;
	int err = 0;

	w = kcalloc(args->num_events, sizeof(*w), GFP_KERNEL);
	if (args->num_events && !w)
		return -ENOMEM;
	for (i = 0; i < args->num_events; i++) {
		struct kfd_event_data ed;

		if (copy_from_user(&ed, &events[i], sizeof(ed))) {
			err = -EFAULT;
			goto out;
		}
		w[i].id = ed.event_id;
		w[i].age = ed.signal_event_data.last_event_age;
	}
	mutex_lock(&p->events_lock);
	for (i = 0; i < args->num_events; i++)
		if (!idr_find(&p->event_idr, w[i].id)) {
			mutex_unlock(&p->events_lock);
			err = -EINVAL;
			goto out;
		}
	for (i = 0; i < args->num_events; i++)
		emu_waiter_init(&w[i], idr_find(&p->event_idr, w[i].id));
	for (;;) {
		DEFINE_WAIT(wait);

		prepare_to_wait(&p->event_wq, &wait, TASK_INTERRUPTIBLE);
		result = emu_events_test(w, args->num_events, args->wait_for_all);
		mutex_unlock(&p->events_lock);
		if (result != KFD_IOC_WAIT_RESULT_TIMEOUT || timeout <= 0) {
			finish_wait(&p->event_wq, &wait);
			break;
		}
		if (signal_pending(current)) {
			finish_wait(&p->event_wq, &wait);
			err = -ERESTARTSYS;
			break;
		}
		timeout = schedule_timeout(timeout);
		finish_wait(&p->event_wq, &wait);
		mutex_lock(&p->events_lock);
	}
	args->wait_result = result;
	/*
	 * The waiters leave their events' lists; copy_signaled_event_data(): an activated signal
	 * event's age goes back to the caller that gave one (w[i].age, 0 for none to copy).
	 */
	mutex_lock(&p->events_lock);
	for (i = 0; i < args->num_events; i++) {
		struct emu_event *ev = w[i].ev;

		if (ev)
			list_del(&w[i].node);
		if (err || result != KFD_IOC_WAIT_RESULT_COMPLETE || !ev || !w[i].activated ||
		    !w[i].age || !emu_event_is_signal(ev->type))
			w[i].age = 0;
		else
			w[i].age = ev->age;
	}
	mutex_unlock(&p->events_lock);
	for (i = 0; i < args->num_events && !err; i++)
		if (w[i].age && put_user(w[i].age, &events[i].signal_event_data.last_event_age))
			err = -EFAULT;
out:
	kfree(w);
	return err;
}


/*
 * kfd_ioctl_set_scratch_backing_va() / kfd_ioctl_set_trap_handler() (6.12.117): unknown gpu
 * -EINVAL; the process binds to the device. Under HWS the CP takes the scratch base from the
 * queue's MQD and the trap handler from the process's TBA/TMA; the emulated CP runs no waves,
 * so the addresses are only kept.
 */
static int kfd_ioctl_set_scratch_backing_va(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_set_scratch_backing_va_args *args = data;
	struct kfd_process_device *pdd;
	int err = 0;

	mutex_lock(&p->mutex);
	pdd = kfd_process_device_data_by_id(p, args->gpu_id);
	if (pdd) {
		pdd->bound = true;
		pdd->scratch_backing_va = args->va_addr;
	} else {
		err = -EINVAL;
	}
	mutex_unlock(&p->mutex);
	return err;
}

/*
 * kfd_ioctl_get_tile_config() (6.12.117): unknown gpu -EINVAL; what
 * amdgpu_amdkfd_get_tile_config() reports for gfx9: GB_ADDR_CONFIG (Aldebaran's, the value
 * amdgpu_emu's READ_MMR_REG answers), the 32 tile and 16 macro-tile modes all 0 and no banks or
 * ranks ("not set from GFX9 onwards"); each array copied up to the caller's size (-EFAULT, its
 * count zeroed, if unwritable). ROCr 5.2's image extension asks at start-up
 * (ImageManagerKv::Initialize, hsaKmtGetTileConfig), which HIP's initialisation reaches.
 */
#define EMU_GB_ADDR_CONFIG_GFX90A 0x22014042
#define EMU_NUM_TILE_CONFIGS 32
#define EMU_NUM_MACRO_TILE_CONFIGS 16
/* n modes (all 0 on gfx9), at most `have`, to ptr; -EFAULT with *n zeroed if unwritable */
static int emu_tile_modes(u64 ptr, u32 *n, u32 have)
{
	static const u32 zeros[EMU_NUM_TILE_CONFIGS];

	*n = min(*n, have);
	if (copy_to_user((void __user *)(uintptr_t)ptr, zeros, *n * sizeof(u32))) {
		*n = 0;
		return -EFAULT;
	}
	return 0;
}

static int kfd_ioctl_get_tile_config(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_get_tile_config_args *args = data;
	struct kfd_process_device *pdd;

	mutex_lock(&p->mutex);
	pdd = kfd_process_device_data_by_id(p, args->gpu_id);
	mutex_unlock(&p->mutex);
	if (!pdd)
		return -EINVAL;
	args->gb_addr_config = EMU_GB_ADDR_CONFIG_GFX90A;
	args->num_banks = 0;
	args->num_ranks = 0;
	if (emu_tile_modes(args->tile_config_ptr, &args->num_tile_configs, EMU_NUM_TILE_CONFIGS))
		return -EFAULT;
	return emu_tile_modes(args->macro_tile_config_ptr, &args->num_macro_tile_configs,
			      EMU_NUM_MACRO_TILE_CONFIGS);
}

static int kfd_ioctl_set_trap_handler(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_set_trap_handler_args *args = data;
	struct kfd_process_device *pdd;
	int err = 0;

	mutex_lock(&p->mutex);
	pdd = kfd_process_device_data_by_id(p, args->gpu_id);
	if (pdd) {
		pdd->bound = true;
		pdd->tba_addr = args->tba_addr;
		pdd->tma_addr = args->tma_addr;
	} else {
		err = -EINVAL;
	}
	mutex_unlock(&p->mutex);
	return err;
}

typedef int amdkfd_ioctl_t(struct file *filep, struct kfd_process *p, void *data);

struct amdkfd_ioctl_desc {
	unsigned int cmd;
	amdkfd_ioctl_t *func;
};

static const struct amdkfd_ioctl_desc amdkfd_ioctls[AMDKFD_COMMAND_END] = {
	[0x01] = { AMDKFD_IOC_GET_VERSION, kfd_ioctl_get_version },
	[0x02] = { AMDKFD_IOC_CREATE_QUEUE, kfd_ioctl_create_queue },
	[0x03] = { AMDKFD_IOC_DESTROY_QUEUE, kfd_ioctl_destroy_queue },
	[0x04] = { AMDKFD_IOC_SET_MEMORY_POLICY, kfd_ioctl_set_memory_policy },
	[0x05] = { AMDKFD_IOC_GET_CLOCK_COUNTERS, kfd_ioctl_get_clock_counters },
	[0x07] = { AMDKFD_IOC_UPDATE_QUEUE, kfd_ioctl_update_queue },
	[0x08] = { AMDKFD_IOC_CREATE_EVENT, kfd_ioctl_create_event },
	[0x09] = { AMDKFD_IOC_DESTROY_EVENT, kfd_ioctl_destroy_event },
	[0x0A] = { AMDKFD_IOC_SET_EVENT, kfd_ioctl_set_event },
	[0x0B] = { AMDKFD_IOC_RESET_EVENT, kfd_ioctl_reset_event },
	[0x0C] = { AMDKFD_IOC_WAIT_EVENTS, kfd_ioctl_wait_events },
	[0x11] = { AMDKFD_IOC_SET_SCRATCH_BACKING_VA, kfd_ioctl_set_scratch_backing_va },
	[0x12] = { AMDKFD_IOC_GET_TILE_CONFIG, kfd_ioctl_get_tile_config },
	[0x13] = { AMDKFD_IOC_SET_TRAP_HANDLER, kfd_ioctl_set_trap_handler },
	[0x14] = { AMDKFD_IOC_GET_PROCESS_APERTURES_NEW, kfd_ioctl_get_process_apertures_new },
	[0x15] = { AMDKFD_IOC_ACQUIRE_VM, kfd_ioctl_acquire_vm },
	[0x16] = { AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, kfd_ioctl_alloc_memory_of_gpu },
	[0x17] = { AMDKFD_IOC_FREE_MEMORY_OF_GPU, kfd_ioctl_free_memory_of_gpu },
	[0x18] = { AMDKFD_IOC_MAP_MEMORY_TO_GPU, kfd_ioctl_map_memory_to_gpu },
	[0x19] = { AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU, kfd_ioctl_unmap_memory_from_gpu },
	[0x21] = { AMDKFD_IOC_SET_XNACK_MODE, kfd_ioctl_set_xnack_mode },
	[0x23] = { AMDKFD_IOC_AVAILABLE_MEMORY, kfd_ioctl_get_available_memory },
	[0x25] = { AMDKFD_IOC_RUNTIME_ENABLE, kfd_ioctl_runtime_enable },
	[0x26] = { AMDKFD_IOC_DBG_TRAP, kfd_ioctl_set_debug_trap },
};

/*
 * Mirrors: static long kfd_ioctl(struct file *filep, unsigned int cmd, unsigned long arg)
 * (6.12.117): the table's command wins (either CREATE_QUEUE size works, the rest zero-filled),
 * -EBADF when another process uses the fd, -EINVAL for numbers without a handler (the
 * emulator has handlers only for the ioctls above), the args copied back even on error.
 */
__used noinline long kfd_ioctl(struct file *filep, unsigned int cmd, unsigned long arg)
{
	struct kfd_process *process = filep->private_data;
	unsigned int nr = _IOC_NR(cmd);
	const struct amdkfd_ioctl_desc *ioctl;
	char stack_kdata[128];
	char *kdata = NULL;
	unsigned int usize, asize;
	long retcode;

	if (_IOC_TYPE(cmd) != AMDKFD_IOCTL_BASE || nr < AMDKFD_COMMAND_START ||
	    nr >= AMDKFD_COMMAND_END)
		return -ENOTTY;
	ioctl = &amdkfd_ioctls[nr];
	usize = _IOC_SIZE(cmd);
	asize = max_t(unsigned int, usize, _IOC_SIZE(ioctl->cmd));
	cmd = ioctl->cmd;

	/* "Using KFD FD in wrong process", then "no function" */
	if (process->lead_thread != current->group_leader)
		return -EBADF;
	if (!ioctl->func)
		return -EINVAL;

	if (cmd & (IOC_IN | IOC_OUT)) {
		if (asize <= sizeof(stack_kdata)) {
			kdata = stack_kdata;
		} else {
			kdata = kmalloc(asize, GFP_KERNEL);
			if (!kdata)
				return -ENOMEM;
		}
		memset(kdata, 0, asize);
	}
	if ((cmd & IOC_IN) && copy_from_user(kdata, (void __user *)arg, usize)) {
		retcode = -EFAULT;
		goto out;
	}
	retcode = ioctl->func(filep, process, kdata);
	if ((cmd & IOC_OUT) && copy_to_user((void __user *)arg, kdata, usize))
		retcode = -EFAULT;
out:
	if (kdata != stack_kdata)
		kfree(kdata);
	return retcode;
}

static int kfd_open(struct inode *inode, struct file *filep)
{
	struct kfd_process *process;

	if (iminor(inode) != 0)
		return -ENODEV;
	process = kfd_create_process(current);
	if (IS_ERR(process))
		return PTR_ERR(process);
	filep->private_data = process;	/* holds the reference kfd_create_process returned */
	return 0;
}

/* kfd_release() (6.12.117): only drops the file's reference; the process lives with its mm. */
static int kfd_release(struct inode *inode, struct file *filep)
{
	struct kfd_process *process = filep->private_data;

	if (process)
		kfd_unref_process(process);
	return 0;
}

static const struct file_operations kfd_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = kfd_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = kfd_mmap,
	.open = kfd_open,
	.release = kfd_release,
};

/* ---- control files: /sys/kernel/kfd_emu/{evict,restore} ---- */

struct emu_evict_work {
	struct work_struct work;
	struct kfd_process *p;
	bool evict;
	int ret;
};

/* Like evict_process_worker / restore_process_worker: TTM evictions run in a kworker. */
static void emu_evict_worker(struct work_struct *work)
{
	struct emu_evict_work *w = container_of(work, struct emu_evict_work, work);

	if (w->evict)
		w->ret = kfd_process_evict_queues(w->p, KFD_QUEUE_EVICTION_TRIGGER_TTM);
	else
		w->ret = kfd_process_restore_queues(w->p);
}

static ssize_t emu_evict_store_common(const char *buf, size_t count, bool evict)
{
	struct emu_evict_work w = { .evict = evict };
	struct kfd_process *p, *found = NULL;
	int pid, err;

	err = kstrtoint(buf, 10, &pid);
	if (err)
		return err;
	mutex_lock(&kfd_processes_mutex);
	list_for_each_entry(p, &kfd_processes_list, processes) {
		if (p->lead_thread->pid == pid) {
			found = p;
			kref_get(&p->ref);
			break;
		}
	}
	mutex_unlock(&kfd_processes_mutex);
	if (!found)
		return -ESRCH;
	w.p = found;
	INIT_WORK_ONSTACK(&w.work, emu_evict_worker);
	schedule_work(&w.work);
	flush_work(&w.work);
	destroy_work_on_stack(&w.work);
	kfd_unref_process(found);
	return w.ret ? w.ret : count;
}

static ssize_t evict_store(struct kobject *kobj, struct kobj_attribute *attr, const char *buf,
			   size_t count)
{
	return emu_evict_store_common(buf, count, true);
}

static ssize_t restore_store(struct kobject *kobj, struct kobj_attribute *attr, const char *buf,
			     size_t count)
{
	return emu_evict_store_common(buf, count, false);
}

/*
 * cp_stats: what each emulated CP executed since the module loaded, one line per GPU
 * ("gpu_id 4096 dispatches N kernels N barriers_and N barriers_or N barriers_value N pm4_ibs N signals N interrupts N
 * events_set N errors N sdma_copies N sdma_bytes N ... sdma_timestamps N"): the exact counts the
 * ROCm tests assert. Emulator-only (no KFD file).
 */
static ssize_t cp_stats_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	unsigned int i;
	int offs = 0;

	for (i = 0; i < num_gpus; i++) {
		struct device_queue_manager *dqm = &emu_dqms[i];

		mutex_lock(&dqm->hw_lock);
		offs += sysfs_emit_at(buf, offs,
				      "gpu_id %u dispatches %llu kernels %llu barriers_and %llu barriers_or %llu barriers_value %llu pm4_ibs %llu signals %llu interrupts %llu events_set %llu errors %llu sdma_copies %llu sdma_bytes %llu sdma_fills %llu sdma_fences %llu sdma_traps %llu sdma_atomics %llu sdma_polls %llu sdma_timestamps %llu\n",
				      emu_nodes[i].id, dqm->stats.dispatches, dqm->stats.kernels,
				      dqm->stats.barriers_and, dqm->stats.barriers_or,
				      dqm->stats.barriers_value, dqm->stats.pm4_ibs,
				      dqm->stats.signals, dqm->stats.interrupts,
				      dqm->stats.events_set, dqm->stats.errors, dqm->stats.sdma_copies,
				      dqm->stats.sdma_bytes, dqm->stats.sdma_fills, dqm->stats.sdma_fences,
				      dqm->stats.sdma_traps, dqm->stats.sdma_atomics, dqm->stats.sdma_polls,
				      dqm->stats.sdma_timestamps);
		mutex_unlock(&dqm->hw_lock);
	}
	return offs;
}

static struct kobj_attribute cp_stats_attr = __ATTR_RO(cp_stats);
static struct kobj_attribute evict_attr = __ATTR_WO(evict);
static struct kobj_attribute restore_attr = __ATTR_WO(restore);

/*
 * ---- topology (kfd_topology.c, 6.12.117) ----
 *
 * /sys/devices/virtual/kfd/kfd/topology/: generation_id, system_properties and per node gpu_id,
 * name, properties, mem_banks/N/properties, caches/N/properties, io_links/N/properties and an
 * empty p2p_links/. Every properties file is `name value` lines in kfd_topology.c's order
 * ("%s %u\n" for 32-bit, "%s %llu\n" for 64-bit properties): libhsakmt reads them with
 * sscanf("%s %llu") until the first line that does not parse. Node 0 is the CPU (gpu_id 0),
 * nodes 1 and 2 the emulated GPUs (emu_gpu.h), each linked to the CPU by one PCIe io_link.
 */

/* HSA_CAP_* (kfd_topology.h, 6.12.117) */
#define HSA_CAP_WATCH_POINTS_SUPPORTED 0x00000080
#define HSA_CAP_WATCH_POINTS_TOTALBITS_SHIFT 8
#define HSA_CAP_DOORBELL_TYPE_TOTALBITS_SHIFT 12
#define HSA_CAP_DOORBELL_TYPE_2_0 0x2
#define HSA_CAP_TRAP_DEBUG_SUPPORT 0x00008000
#define HSA_CAP_TRAP_DEBUG_WAVE_LAUNCH_TRAP_OVERRIDE_SUPPORTED 0x00010000
#define HSA_CAP_TRAP_DEBUG_WAVE_LAUNCH_MODE_SUPPORTED 0x00020000
#define HSA_CAP_MEM_EDCSUPPORTED 0x00100000
#define HSA_CAP_SRAM_EDCSUPPORTED 0x04000000
#define HSA_CAP_TRAP_DEBUG_FIRMWARE_SUPPORTED 0x20000000
/* HSA_DBG_* debug_prop bits (kfd_topology.h): gfx90a's watch address mask 6..30, dispatch info */
#define HSA_DBG_WATCH_ADDR_MASK_LO_BIT_GFX9 (6 << 0)
#define HSA_DBG_WATCH_ADDR_MASK_HI_BIT (29 << 6)
#define HSA_DBG_DISPATCH_INFO_ALWAYS_VALID (1 << 11)
/* heap types (HSA_MEM_HEAP_TYPE_*), cache types (HSA_CACHE_TYPE_*), io link (CRAT) values */
#define HSA_MEM_HEAP_TYPE_SYSTEM 0
#define HSA_MEM_HEAP_TYPE_FB_PUBLIC 1
#define HSA_CACHE_TYPE_DATA 0x1
#define HSA_CACHE_TYPE_HSACU 0x8
#define CRAT_IOLINK_TYPE_PCIEXPRESS 2
#define CRAT_IOLINK_FLAGS_ENABLED (1 << 0)
/* simd_id_base of GPU nodes: 0x80001000 + 0x1000 per GPU (kfd_crat.c, KFD_CRAT_INTRA_SOCKET..) */
#define EMU_SIMD_ID_BASE 0x80001000u
/* PCIe 4.0 x16 in MB/s, both directions (amdgpu_amdkfd_get_pcie_bandwidth_mbytes) */
#define EMU_PCIE_MIN_BW 312
#define EMU_PCIE_MAX_BW 31508

enum emu_topo_kind { TOPO_NODE, TOPO_MEM, TOPO_CACHE, TOPO_IOLINK };

struct emu_topo_obj {
	struct kobject kobj;
	enum emu_topo_kind kind;
	unsigned int node;	/* topology node index */
	unsigned int index;	/* bank, cache or link index within the node */
};

/* GPU i of node n, or NULL for the CPU node */
static struct kfd_node *topo_gpu(unsigned int node)
{
	return node >= 1 && node <= num_gpus ? &emu_nodes[node - 1] : NULL;
}

#define PROP32(name, v) (offs += sysfs_emit_at(buf, offs, "%s %u\n", (name), (u32)(v)))
#define PROP64(name, v) (offs += sysfs_emit_at(buf, offs, "%s %llu\n", (name), (u64)(v)))

/* node_show() "properties" (6.12.117): the order and the 32/64-bit formats of the kernel */
static ssize_t topo_node_properties(char *buf, unsigned int node)
{
	struct kfd_node *gpu = topo_gpu(node);
	u32 cap = 0;
	int offs = 0;

	if (gpu)
		/*
		 * kfd_topology_add_device() for gfx90a: 4 watch points (log2 2), doorbell type 2,
		 * the debug trap with firmware support, SRAM and memory ECC. Not SVMAPI_SUPPORTED:
		 * the SVM ioctl is not emulated.
		 */
		cap = HSA_CAP_WATCH_POINTS_SUPPORTED | (2 << HSA_CAP_WATCH_POINTS_TOTALBITS_SHIFT) |
		      (HSA_CAP_DOORBELL_TYPE_2_0 << HSA_CAP_DOORBELL_TYPE_TOTALBITS_SHIFT) |
		      HSA_CAP_TRAP_DEBUG_SUPPORT |
		      HSA_CAP_TRAP_DEBUG_WAVE_LAUNCH_TRAP_OVERRIDE_SUPPORTED |
		      HSA_CAP_TRAP_DEBUG_WAVE_LAUNCH_MODE_SUPPORTED | HSA_CAP_MEM_EDCSUPPORTED |
		      HSA_CAP_SRAM_EDCSUPPORTED | HSA_CAP_TRAP_DEBUG_FIRMWARE_SUPPORTED;
	PROP32("cpu_cores_count", gpu ? 0 : num_online_cpus());
	PROP32("simd_count", gpu ? EMU_CU_COUNT * EMU_SIMD_PER_CU : 0);
	PROP32("mem_banks_count", 1);
	PROP32("caches_count", gpu ? 2 : 0);
	PROP32("io_links_count", gpu ? 1 : num_gpus);
	PROP32("p2p_links_count", 0);
	PROP32("cpu_core_id_base", 0);
	PROP32("simd_id_base", gpu ? EMU_SIMD_ID_BASE + 0x1000 * (node - 1) : 0);
	PROP32("max_waves_per_simd", gpu ? EMU_MAX_WAVES_PER_SIMD : 0);
	PROP32("lds_size_in_kb", gpu ? EMU_LDS_KB : 0);
	PROP32("gds_size_in_kb", 0);
	PROP32("num_gws", 0);
	PROP32("wave_front_size", gpu ? EMU_WAVE_SIZE : 0);
	PROP32("array_count", gpu ? EMU_SHADER_ENGINES * EMU_ARRAYS_PER_ENGINE : 0);
	PROP32("simd_arrays_per_engine", gpu ? EMU_ARRAYS_PER_ENGINE : 0);
	PROP32("cu_per_simd_array", gpu ? EMU_CU_PER_ARRAY : 0);
	PROP32("simd_per_cu", gpu ? EMU_SIMD_PER_CU : 0);
	/* kfd_topology.c: max_slots_scratch_cu = 32 on gfx9 */
	PROP32("max_slots_scratch_cu", gpu ? 32 : 0);
	PROP32("gfx_target_version", gpu ? EMU_GFX_TARGET_VERSION : 0);
	PROP32("vendor_id", gpu ? EMU_VENDOR_ID : 0);
	PROP32("device_id", gpu ? EMU_DEVICE_ID : 0);
	/* location_id = pci_dev_id(): bus << 8 | devfn; the GPUs sit on buses 3 and 4, domain 0 */
	PROP32("location_id", gpu ? (3 + node - 1) << 8 : 0);
	PROP32("domain", 0);
	PROP32("drm_render_minor", gpu ? gpu->drm_render_minor : 0);
	PROP64("hive_id", 0);
	PROP32("num_sdma_engines", gpu ? EMU_SDMA_ENGINES : 0);
	PROP32("num_sdma_xgmi_engines", gpu ? EMU_SDMA_XGMI_ENGINES : 0);
	PROP32("num_sdma_queues_per_engine", gpu ? EMU_SDMA_QUEUES_PER_ENGINE : 0);
	PROP32("num_cp_queues", gpu ? EMU_CP_QUEUES : 0);
	if (gpu) {
		PROP32("max_engine_clk_fcompute", EMU_ENGINE_CLK_MHZ);
		/* 6.12 hides the VRAM size here (0); the mem bank carries it */
		PROP64("local_mem_size", 0);
		PROP32("fw_version", EMU_MEC_FW_VERSION);
		PROP32("capability", cap);
		PROP64("debug_prop", HSA_DBG_WATCH_ADDR_MASK_LO_BIT_GFX9 |
				     HSA_DBG_WATCH_ADDR_MASK_HI_BIT |
				     HSA_DBG_DISPATCH_INFO_ALWAYS_VALID);
		PROP32("sdma_fw_version", EMU_SDMA_FW_VERSION);
		/* amdgpu's unique_id (the ASIC serial): a fixed one per emulated GPU */
		PROP64("unique_id", 0x4b46445f454d5500ULL + node);
		PROP32("num_xcc", 1);
	}
	/* cpufreq_quick_get_max(0) / 1000: 0 without a cpufreq driver (as in these VMs) */
	PROP32("max_engine_clk_ccompute", 0);
	return offs;
}

/* mem_show() (6.12.117) */
static ssize_t topo_mem_properties(char *buf, unsigned int node)
{
	struct kfd_node *gpu = topo_gpu(node);
	int offs = 0;

	PROP32("heap_type", gpu ? HSA_MEM_HEAP_TYPE_FB_PUBLIC : HSA_MEM_HEAP_TYPE_SYSTEM);
	PROP64("size_in_bytes", gpu ? EMU_VRAM_BYTES : (u64)totalram_pages() << PAGE_SHIFT);
	PROP32("flags", 0);
	PROP32("width", gpu ? EMU_VRAM_WIDTH : 64);
	PROP32("mem_clk_max", gpu ? EMU_MEM_CLK_MHZ : 0);
	return offs;
}

/*
 * kfd_cache_show() (6.12.117). Two entries per GPU: the L1 of CU 0 standing for every CU's (the
 * kernel lists one per CU; ROCr reports caches per level) and the L2 all CUs share.
 */
static ssize_t topo_cache_properties(char *buf, unsigned int node, unsigned int index)
{
	u32 simd_base = EMU_SIMD_ID_BASE + 0x1000 * (node - 1);
	unsigned int cus = index == 0 ? 1 : EMU_CU_COUNT, i;
	int offs = 0;

	PROP32("processor_id_low", simd_base);
	PROP32("level", index + 1);
	PROP32("size", index == 0 ? EMU_L1_KB : EMU_L2_KB);
	PROP32("cache_line_size", EMU_CACHE_LINE);
	PROP32("cache_lines_per_tag", 1);
	PROP32("association", index == 0 ? 64 : 16);
	PROP32("latency", 0);
	PROP32("type", HSA_CACHE_TYPE_DATA | HSA_CACHE_TYPE_HSACU);
	/* one bit per CU, 32 per word, as the kernel prints sibling_map ("%d," each, last ',' -> '\n') */
	offs += sysfs_emit_at(buf, offs, "sibling_map ");
	for (i = 0; i < round_up(cus, 32); i++)
		offs += sysfs_emit_at(buf, offs, "%d,", i < cus);
	buf[offs - 1] = '\n';
	return offs;
}

/* iolink_show() (6.12.117): CPU node link i goes to GPU node i + 1; a GPU's link 0 to the CPU */
static ssize_t topo_iolink_properties(char *buf, unsigned int node, unsigned int index)
{
	int offs = 0;

	PROP32("type", CRAT_IOLINK_TYPE_PCIEXPRESS);
	PROP32("version_major", 0);
	PROP32("version_minor", 0);
	PROP32("node_from", node);
	PROP32("node_to", node == 0 ? index + 1 : 0);
	/* KFD_CRAT_INTRA_SOCKET_WEIGHT 13 + KFD_CRAT_XGMI... : a PCIe hop weighs 20 (kfd_crat.c) */
	PROP32("weight", 20);
	PROP32("min_latency", 0);
	PROP32("max_latency", 0);
	PROP32("min_bandwidth", EMU_PCIE_MIN_BW);
	PROP32("max_bandwidth", EMU_PCIE_MAX_BW);
	PROP32("recommended_transfer_size", 0);
	PROP32("recommended_sdma_engine_id_mask", 0);
	PROP32("flags", CRAT_IOLINK_FLAGS_ENABLED);
	return offs;
}

static ssize_t topo_show(struct kobject *kobj, struct attribute *attr, char *buffer)
{
	struct emu_topo_obj *o = container_of(kobj, struct emu_topo_obj, kobj);
	struct kfd_node *gpu = topo_gpu(o->node);

	if (o->kind == TOPO_NODE && !strcmp(attr->name, "gpu_id"))
		return sysfs_emit(buffer, "%u\n", gpu ? gpu->id : 0);
	if (o->kind == TOPO_NODE && !strcmp(attr->name, "name"))
		return sysfs_emit(buffer, "%s\n", gpu ? "kfd_emu" : "");
	switch (o->kind) {
	case TOPO_NODE:
		return topo_node_properties(buffer, o->node);
	case TOPO_MEM:
		return topo_mem_properties(buffer, o->node);
	case TOPO_CACHE:
		return topo_cache_properties(buffer, o->node, o->index);
	case TOPO_IOLINK:
		return topo_iolink_properties(buffer, o->node, o->index);
	}
	return -EINVAL;
}

static struct attribute topo_attr_gpu_id = { .name = "gpu_id", .mode = 0444 };
static struct attribute topo_attr_name = { .name = "name", .mode = 0444 };
static struct attribute topo_attr_properties = { .name = "properties", .mode = 0444 };
static struct attribute *node_attrs[] = { &topo_attr_gpu_id, &topo_attr_name,
					  &topo_attr_properties, NULL };
ATTRIBUTE_GROUPS(node);
static struct attribute *prop_attrs[] = { &topo_attr_properties, NULL };
ATTRIBUTE_GROUPS(prop);
static const struct sysfs_ops topo_ops = { .show = topo_show };

static void topo_kobj_release(struct kobject *kobj)
{
	kfree(container_of(kobj, struct emu_topo_obj, kobj));
}

static struct kobj_type node_type = {
	.release = topo_kobj_release,
	.sysfs_ops = &topo_ops,
	.default_groups = node_groups,
};

static struct kobj_type prop_type = {
	.release = topo_kobj_release,
	.sysfs_ops = &topo_ops,
	.default_groups = prop_groups,
};

/* every topology kobject, released in reverse order at unload */
#define EMU_TOPO_MAX_KOBJS 64
static struct kobject *topo_kobjs[EMU_TOPO_MAX_KOBJS];
static unsigned int topo_nkobjs;

static struct kobject *topo_keep(struct kobject *kobj)
{
	if (kobj && topo_nkobjs < EMU_TOPO_MAX_KOBJS) {
		topo_kobjs[topo_nkobjs++] = kobj;
		return kobj;
	}
	kobject_put(kobj);
	return NULL;
}

static struct kobject *topo_add(struct kobject *parent, enum emu_topo_kind kind, unsigned int node,
				unsigned int index)
{
	struct emu_topo_obj *o = kzalloc(sizeof(*o), GFP_KERNEL);

	if (!o)
		return NULL;
	o->kind = kind;
	o->node = node;
	o->index = index;
	if (kobject_init_and_add(&o->kobj, kind == TOPO_NODE ? &node_type : &prop_type, parent, "%u",
				 kind == TOPO_NODE ? node : index)) {
		kobject_put(&o->kobj);
		return NULL;
	}
	return topo_keep(&o->kobj);
}

/* nodes/<node>/ with its mem_banks, caches, io_links and p2p_links */
static struct kobject *add_topology_node(unsigned int node)
{
	struct kobject *n, *mem, *caches, *links;
	unsigned int i;

	n = topo_add(topology_nodes_kobj, TOPO_NODE, node, 0);
	if (!n)
		return NULL;
	mem = topo_keep(kobject_create_and_add("mem_banks", n));
	caches = topo_keep(kobject_create_and_add("caches", n));
	links = topo_keep(kobject_create_and_add("io_links", n));
	if (!mem || !caches || !links || !topo_keep(kobject_create_and_add("p2p_links", n)))
		return NULL;
	if (!topo_add(mem, TOPO_MEM, node, 0))
		return NULL;
	for (i = 0; topo_gpu(node) && i < 2; i++)
		if (!topo_add(caches, TOPO_CACHE, node, i))
			return NULL;
	for (i = 0; i < (topo_gpu(node) ? 1 : num_gpus); i++)
		if (!topo_add(links, TOPO_IOLINK, node, i))
			return NULL;
	return n;
}

/* topology/generation_id ("%d\n" of topology_generation) and system_properties */
static ssize_t generation_id_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%d\n", 1);
}

static ssize_t system_properties_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	int offs = 0;

	/* sys_props.platform_{oem,id,rev}: 0 without an ACPI CRAT table (a virtual CRAT) */
	PROP64("platform_oem", 0);
	PROP64("platform_id", 0);
	PROP64("platform_rev", 0);
	return offs;
}

static struct kobj_attribute generation_id_attr = __ATTR_RO(generation_id);
static struct kobj_attribute system_properties_attr = __ATTR_RO(system_properties);

static void topology_remove(void)
{
	while (topo_nkobjs)
		kobject_put(topo_kobjs[--topo_nkobjs]);
}

/* ---- the render nodes amdgpu_emu.ko registers (emu_gpu.h) ---- */

static DEFINE_MUTEX(render_mutex);
static const struct kfd_emu_render_ops *render_ops;

int kfd_emu_render_register(const struct kfd_emu_render_ops *ops, const int *render_minor)
{
	unsigned int i;
	int ret = 0;

	mutex_lock(&render_mutex);
	if (render_ops) {
		ret = -EBUSY;
	} else {
		render_ops = ops;
		for (i = 0; i < num_gpus; i++)
			emu_nodes[i].drm_render_minor = render_minor[i];
	}
	mutex_unlock(&render_mutex);
	return ret;
}
EXPORT_SYMBOL_GPL(kfd_emu_render_register);

/* Processes holding a render file hold amdgpu_emu (the file's module), so none is left here. */
void kfd_emu_render_unregister(void)
{
	unsigned int i;

	mutex_lock(&render_mutex);
	render_ops = NULL;
	for (i = 0; i < num_gpus; i++)
		emu_nodes[i].drm_render_minor = EMU_NO_RENDER_MINOR;
	mutex_unlock(&render_mutex);
}
EXPORT_SYMBOL_GPL(kfd_emu_render_unregister);

unsigned int kfd_emu_num_gpus(void)
{
	return num_gpus;
}
EXPORT_SYMBOL_GPL(kfd_emu_num_gpus);

/* the emulated GPU index of a render node file, or -1 (not one of amdgpu_emu's) */
static int render_gpu_of_file(struct file *file)
{
	int gpu = -1;

	mutex_lock(&render_mutex);
	if (render_ops)
		gpu = render_ops->gpu_of_file(file);
	mutex_unlock(&render_mutex);
	return gpu;
}

/* ---- module init / exit ---- */

static void kfd_emu_cleanup(void)
{
	unsigned int i;

	for (i = 0; i < EMU_MAX_GPUS; i++) {
		if (emu_dqms[i].cp_thread)
			kthread_stop(emu_dqms[i].cp_thread);
		emu_dqms[i].cp_thread = NULL;
		emu_nodes[i].kobj_node = NULL;
	}
	topology_remove();
	kobject_put(topology_nodes_kobj);
	kobject_put(topology_kobj);
	kobject_put(procfs_kobj);
	kobject_put(emu_ctl_kobj);
	if (kfd_device)
		device_destroy(kfd_class, MKDEV(kfd_char_dev_major, 0));
	if (!IS_ERR_OR_NULL(kfd_class))
		class_destroy(kfd_class);
	if (kfd_char_dev_major > 0)
		unregister_chrdev(kfd_char_dev_major, "kfd");
	if (kfd_process_wq)
		destroy_workqueue(kfd_process_wq);
}

static int __init kfd_emu_init(void)
{
	unsigned int i;
	int err = -ENOMEM;

	if (num_gpus < 1 || num_gpus > EMU_MAX_GPUS)
		return -EINVAL;
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 17, 0)
	/*
	 * 6.17 added WQ_PERCPU; 7.x (Debian 7.3.4) warns at alloc_workqueue() when neither it nor
	 * WQ_UNBOUND is given ("workqueue: kfd_process_wq is using neither WQ_PERCPU or
	 * WQ_UNBOUND", kernel/workqueue.c) and sets WQ_PERCPU itself: say it, as the default was.
	 */
	kfd_process_wq = alloc_workqueue("kfd_process_wq", WQ_PERCPU, 0);
#else
	kfd_process_wq = alloc_workqueue("kfd_process_wq", 0, 0);
#endif
	if (!kfd_process_wq)
		return -ENOMEM;
	for (i = 0; i < num_gpus; i++) {
		struct device_queue_manager *dqm = &emu_dqms[i];

		emu_nodes[i].id = emu_gpu_ids[i];
		emu_nodes[i].node_id = i + 1;
		emu_nodes[i].drm_render_minor = EMU_NO_RENDER_MINOR;
		emu_nodes[i].dqm = dqm;
		dqm->dev = &emu_nodes[i];
		mutex_init(&dqm->lock_hidden);
		mutex_init(&dqm->hw_lock);
		INIT_LIST_HEAD(&dqm->queues);
		init_waitqueue_head(&dqm->destroy_wait);
		init_waitqueue_head(&dqm->cp_wait);
		init_waitqueue_head(&dqm->sync_wait);
		dqm->fence_addr = &dqm->fence_mem;
		dqm->cp_thread = kthread_run(emu_cp_thread, dqm, "kfd_emu_cp%u", i);
		if (IS_ERR(dqm->cp_thread)) {
			err = PTR_ERR(dqm->cp_thread);
			dqm->cp_thread = NULL;
			goto fail;
		}
		/*
		 * A GPU's command processor is hardware: it does not wait for a CPU. The emulated one
		 * is a kthread, which at normal priority would queue behind every busy process of the
		 * guest (clients that poll for completions on the CPU, as HIP's synchronize does) and
		 * stretch every dispatch, save and fence with the guest's CPU load. SCHED_FIFO (50,
		 * sched_set_fifo, Linux 5.9+) keeps its timeline on time; it sleeps between events
		 * (wait_event_*), so it takes no CPU it does not use.
		 */
		sched_set_fifo(dqm->cp_thread);
	}

	kfd_char_dev_major = register_chrdev(0, "kfd", &kfd_fops);
	if (kfd_char_dev_major < 0) {
		err = kfd_char_dev_major;
		goto fail;
	}
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
	kfd_class = class_create("kfd");
#else
	kfd_class = class_create(THIS_MODULE, "kfd");
#endif
	if (IS_ERR(kfd_class)) {
		err = PTR_ERR(kfd_class);
		goto fail;
	}
	kfd_device = device_create(kfd_class, NULL, MKDEV(kfd_char_dev_major, 0), NULL, "kfd");
	if (IS_ERR(kfd_device)) {
		err = PTR_ERR(kfd_device);
		kfd_device = NULL;
		goto fail;
	}
	err = -ENOMEM;
	procfs_kobj = kobject_create_and_add("proc", &kfd_device->kobj);
	topology_kobj = kobject_create_and_add("topology", &kfd_device->kobj);
	if (!procfs_kobj || !topology_kobj)
		goto fail;
	topology_nodes_kobj = kobject_create_and_add("nodes", topology_kobj);
	if (!topology_nodes_kobj)
		goto fail;
	if (sysfs_create_file(topology_kobj, &generation_id_attr.attr) ||
	    sysfs_create_file(topology_kobj, &system_properties_attr.attr))
		goto fail;
	if (!add_topology_node(0))	/* node 0: the CPU, gpu_id 0 */
		goto fail;
	for (i = 0; i < num_gpus; i++) {
		emu_nodes[i].kobj_node = add_topology_node(emu_nodes[i].node_id);
		if (!emu_nodes[i].kobj_node)
			goto fail;
	}
	emu_ctl_kobj = kobject_create_and_add("kfd_emu", kernel_kobj);
	if (!emu_ctl_kobj)
		goto fail;
	if (sysfs_create_file(emu_ctl_kobj, &evict_attr.attr) ||
	    sysfs_create_file(emu_ctl_kobj, &restore_attr.attr) ||
	    sysfs_create_file(emu_ctl_kobj, &cp_stats_attr.attr))
		goto fail;
	pr_info("kfd_emu: KFD emulator (KFD %d.%d) with %u GPU(s): gpu_id 0x%x%s\n",
		KFD_IOCTL_MAJOR_VERSION,
		KFD_IOCTL_MINOR_VERSION, num_gpus, emu_gpu_ids[0], num_gpus > 1 ? ", 0x2000" : "");
	return 0;
fail:
	kfd_emu_cleanup();
	return err;
}

static void __exit kfd_emu_exit(void)
{
	/* processes hold module references, so none is left here; wait for their last callbacks */
	flush_workqueue(kfd_process_wq);
	mmu_notifier_synchronize();
	kfd_emu_cleanup();
}

module_init(kfd_emu_init);
module_exit(kfd_emu_exit);
MODULE_DESCRIPTION("KFD emulator for gpreempt tests (emulated AMD GPU queues behind /dev/kfd)");
MODULE_LICENSE("Dual MIT/GPL");
