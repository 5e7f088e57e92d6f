// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * The emulated SDMA engines: the SDMA 4.x packets of SDMA queues, executed by the CP thread
 * (cp.c) at each of its passes.
 *
 * Part of the KFD emulator, kfd_emu.ko: main.c describes it, README.md "Source files" maps it.
 */

#include "kfd_emu.h"

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

bool emu_sdma_serves(struct queue *q)
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
bool emu_cp_sdma(struct device_queue_manager *dqm, u64 now)
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
