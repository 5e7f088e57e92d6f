// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * The emulated command processor, one kthread per GPU: its timeline, the AQL packets it executes
 * (kernel dispatch, barrier-AND/OR, AMD's barrier-value and PM4-IB vendor packets), the
 * completion signals it writes, and the preemption an unmap makes it take. The SDMA engines it
 * also runs are in sdma.c.
 *
 * Part of the KFD emulator, kfd_emu.ko: main.c describes it, README.md "Source files" maps it.
 */

#include "kfd_emu.h"

/* ---- emulated command processor (one per GPU) ---- */

/*
 * The CP plays a timeline: one dispatch occupies the GPU at a time, for its cost; at each
 * dispatch boundary the next one comes from the queue with work that was served least recently
 * (round-robin between queues), a preempted dispatch first. Event times are computed, not taken
 * from when the thread happens to wake, so a late wake-up (a descheduled vCPU) delays only what
 * software sees (the read index, the fence, completion records), never the emulated times.
 */

/* user memory of q's process, for the CP kthread (kthread_use_mm); false if the mm is gone */
bool emu_user_begin(struct queue *q)
{
	struct mm_struct *mm = q->process->mm_grabbed;

	if (!mmget_not_zero(mm))
		return false;
	kthread_use_mm(mm);
	return true;
}

void emu_user_end(struct queue *q)
{
	struct mm_struct *mm = q->process->mm_grabbed;

	kthread_unuse_mm(mm);
	/* Never the last user here in practice; async so exit_mmap never runs under hw_lock. */
	mmput_async(mm);
}

/* AQL compute queues carry the packets the CP executes (SDMA queues: emu_sdma_serves); PM4 idle. */
static bool emu_cp_serves(struct queue *q)
{
	return q->hw_mapped && !q->error_ec && !q->properties.is_reset &&
	       q->properties.type == KFD_QUEUE_TYPE_COMPUTE &&
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
u64 emu_gpu_ticks(u64 mono_ns)
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

/* UNMAP_QUEUES reached the waves at t: the running dispatch stops and keeps what it has left. */
void emu_cp_preempt(struct device_queue_manager *dqm, u64 t)
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
void emu_cp_forget(struct device_queue_manager *dqm, struct queue *q)
{
	if (dqm->running == q) {
		dqm->now_ns = max(dqm->now_ns, min(q->d.seg_start_ns + q->d.remaining_ns,
						   ktime_get_ns()));
		dqm->running = NULL;
	}
	q->hw_mapped = false;
	q->has_dispatch = false;
	emu_cp_publish(dqm);
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
		list_for_each_entry(qpd, &dqm->queues, dqm_list) {
			list_for_each_entry(q, &qpd->queues_list, list) {
				/*
				 * A queue that does not answer the preemption (the stuck_queue hook):
				 * the MEC abandons its unmap, logs its doorbell in the HIQ MQD and
				 * still writes the fence (kfd_device_queue_manager.c 6.12,
				 * unmap_queues_cpsch's comment on check_preemption_failed).
				 */
				if (q->hw_mapped && q->stuck && !q->properties.is_reset)
					q->preempt_failed = true;
				q->hw_mapped = false;
			}
		}
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

/*
 * The dispatch the CP starts next (for emu_cp_publish): at the running dispatch's end, or once
 * the restore after a map is over, the pick emu_cp_advance() will make then from what the CP
 * has observed (a packet observed later is known later, so it cannot change that pick), and
 * that dispatch's cost (a preempted one's remaining cost; a barrier or vendor packet: none).
 * The CP thread, under hw_lock, with the queue's user memory readable.
 */
static void emu_cp_lookahead(struct device_queue_manager *dqm)
{
	struct hsa_kernel_dispatch_packet pkt;
	struct queue *run = dqm->running, *q = NULL;
	u64 t = 0, next_t, cost = 0;
	bool found = false;
	int foreign;

	if (!dqm->cp_mapped || dqm->preempt_pending)
		goto out;
	t = run ? run->d.seg_start_ns + run->d.remaining_ns : max(dqm->now_ns, dqm->stall_until_ns);
	if (run)
		run->has_dispatch = false;	/* as when it completes at t */
	q = emu_cp_pick(dqm, t, &next_t);
	if (run)
		run->has_dispatch = true;
	if (!q)
		goto out;
	if (q->has_dispatch) {
		cost = q->d.remaining_ns;
		found = true;
		goto out;
	}
	if (!emu_user_begin(q))
		goto out;
	if (copy_from_user(&pkt, (void __user *)(uintptr_t)(q->properties.queue_address +
			   (q->cp_rptr % emu_ring_packets(q)) * AQL_PACKET_SIZE), sizeof(pkt))) {
		emu_user_end(q);
		goto out;
	}
	emu_user_end(q);
	if ((pkt.header & HSA_PACKET_HEADER_TYPE_MASK) != HSA_PACKET_TYPE_KERNEL_DISPATCH ||
	    emu_packet_error(&pkt))
		goto out;
	foreign = emu_kernel_cost(q, &pkt, &cost);
	if (foreign < 0)
		goto out;
	if (!foreign)
		cost = pkt.kernel_object;
	found = true;
out:
	write_seqcount_begin(&dqm->occ_seq);
	dqm->occ.next = found ? q->process : NULL;
	dqm->occ.next_from = t;
	dqm->occ.next_until = found ? t + cost : 0;
	write_seqcount_end(&dqm->occ_seq);
}

void emu_cp_kick(struct device_queue_manager *dqm)
{
	WRITE_ONCE(dqm->cp_kick, true);
	wake_up(&dqm->cp_wait);
}

int emu_cp_thread(void *data)
{
	struct device_queue_manager *dqm = data;
	u64 now, wake;

	while (!kthread_should_stop()) {
		WRITE_ONCE(dqm->cp_kick, false);
		mutex_lock(&dqm->hw_lock);
		now = ktime_get_ns();
		wake = emu_cp_run(dqm, &now);
		emu_cp_lookahead(dqm);
		emu_cp_publish(dqm);
		mutex_unlock(&dqm->hw_lock);
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

/*
 * What the CUs run, for cu_occupancy (sysfs.c), as the CP's state says it without the CP thread:
 * published under hw_lock at the end of every pass, read lock-free (a seqcount), so a sysfs read
 * neither wakes the CP nor waits for it, as kfd_get_cu_occupancy() reads the wave registers. The
 * CP publishes the running dispatch's segment and the one it starts next (its pick at that
 * segment's end or after a restore: a late CP thread does not make a read miss a dispatch that
 * began on the timeline since its last pass), and an unmap publishes its time: no wave of this
 * node runs from then on. Under hw_lock.
 */
void emu_cp_publish(struct device_queue_manager *dqm)
{
	struct queue *q = dqm->running;

	write_seqcount_begin(&dqm->occ_seq);
	dqm->occ.proc = q ? q->process : NULL;
	dqm->occ.from = q ? q->d.seg_start_ns : 0;
	dqm->occ.until = q ? q->d.seg_start_ns + q->d.remaining_ns : 0;
	dqm->occ.stop_ns = dqm->preempt_pending ? dqm->unmap_at_ns : U64_MAX;
	write_seqcount_end(&dqm->occ_seq);
}

/* whether a wave of p occupies the node's CUs now (lock-free; see emu_cp_publish) */
bool emu_cp_occupied_by(struct device_queue_manager *dqm, const struct kfd_process *p)
{
	unsigned int seq;
	bool busy;
	u64 now;

	do {
		seq = read_seqcount_begin(&dqm->occ_seq);
		now = ktime_get_ns();
		busy = now < dqm->occ.stop_ns &&
		       ((dqm->occ.proc == p && now >= dqm->occ.from && now < dqm->occ.until) ||
			(dqm->occ.next == p && now >= dqm->occ.next_from &&
			 now < dqm->occ.next_until));
	} while (read_seqcount_retry(&dqm->occ_seq, seq));
	return busy;
}
