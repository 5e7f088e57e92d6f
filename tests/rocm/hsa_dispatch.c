/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * Kernels dispatched through Debian's libhsa-runtime64 (ROCm 5.2) on the emulated GPUs:
 * hsa_init, every GPU agent, hsa_queue_create, a real gfx90a code object loaded with
 * hsa_executable_* (hsa_dispatch_kernel.cl, built by Debian's clang-15 / lld-15), AQL
 * kernel-dispatch, barrier-AND and barrier-OR packets written into ROCr's ring, the doorbell rung
 * with hsa_signal_store_screlease, completions waited for with hsa_signal_wait_scacquire.
 *
 * Usage: hsa-dispatch CODE_OBJECT MODE [ARGS]
 *   run GRID       on every GPU: dispatches A and B, a barrier-AND on A, B and a gate signal the
 *                  program holds at 1 (checked to block: its signal stays 1, the read index stays
 *                  on it), the gate opened, dispatch C, a barrier-OR on C and a signal never
 *                  satisfied. Prints one JSON line per GPU with every signal value, the
 *                  amd_signal_t timestamps and the queue indices, then {"gpus":N,"done":true}.
 *   loop GRID N    on the first GPU: dispatches one after the other (each waited for), after
 *                  a line {"pid":P,"looping":N}, until at least N are done and a line (or EOF)
 *                  is on stdin, so a test decides when the run ends whatever the machine's
 *                  speed; then {"completed":K,"read_index":K,"longest_ticks":T,"done":true}, T the
 *                  longest start-to-end of one dispatch (amd_signal_t timestamps, GPU clock
 *                  ticks): its cost alone, longer if its queue was suspended mid-dispatch.
 *   offline GRID N as loop, a training job's shape for a scheduler, and before the last line
 *                  {"ends_ns":[...]}: each dispatch's end (amd_signal_t end_ts, 10 ns GPU ticks
 *                  of CLOCK_MONOTONIC) in ns.
 *   hold GRID      on the first GPU: one dispatch, {"pid":P,"dispatched":1}, then waits for it.
 *   requests GRID N PERIOD_US [K]
 *                  on the first GPU, an online service's shape: {"pid":P,"ready":N}, then on a
 *                  line on stdin N requests of K dispatches each (default 1; written together, in
 *                  order, only the last with a completion signal, as a runtime launches a
 *                  request's kernels), started every PERIOD_US; per request
 *                  {"submit_ns":S,"latency_ns":L} (CLOCK_MONOTONIC, from the first doorbell to
 *                  the last completion seen), then {"completed":N*K,"read_index":N*K,"done":true}.
 *   bad            on the first GPU: an AGENT_DISPATCH packet (valid AQL the emulated CP does
 *                  not execute); prints its signal value and the read index after 500 ms.
 *   value          on the first GPU: AMD barrier-value packets (hsa_ext_amd.h): one waiting for
 *                  (gate & 0xf0) >= 0x10 with the gate at 5, a null-signal one and one for
 *                  gate2 < 4 with gate2 at 3 behind it; after 300 ms all three signals and the
 *                  read index (blocked), then the gate set to 0x13 and the same once all three
 *                  completed; then one with condition 9 (no hsa_signal_condition_t) and its
 *                  signal and indices after 500 ms: {"blocked":{...},"met":{...},"bad":{...}}.
 * GRID: work-items of each one-dimensional dispatch (workgroups of 64). Exits 1 with the
 * failing call on any error; every check that fails says what it found.
 *
 * Build: cc -O1 -o hsa-dispatch hsa_dispatch.c -lhsa-runtime64 (libhsa-runtime-dev)
 */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <poll.h>
#include <time.h>
#include <hsa/hsa.h>
#include <hsa/hsa_ext_amd.h>
#include <hsa/amd_hsa_queue.h>
#include <hsa/amd_hsa_signal.h>

#include "hsa_common.h"

/* the kernarg region (system memory, fine grained) ROCr offers every agent */
static hsa_status_t find_kernarg(hsa_region_t region, void *data)
{
	hsa_region_global_flag_t flags;
	hsa_region_segment_t segment;

	check(hsa_region_get_info(region, HSA_REGION_INFO_SEGMENT, &segment), "region segment");
	if (segment != HSA_REGION_SEGMENT_GLOBAL)
		return HSA_STATUS_SUCCESS;
	check(hsa_region_get_info(region, HSA_REGION_INFO_GLOBAL_FLAGS, &flags), "region flags");
	if (flags & HSA_REGION_GLOBAL_FLAG_KERNARG) {
		*(hsa_region_t *)data = region;
		return HSA_STATUS_INFO_BREAK;
	}
	return HSA_STATUS_SUCCESS;
}

struct kernel {
	uint64_t object;	/* the kernel descriptor's address (spin.kd) */
	uint32_t kernarg_size;
	void *kernarg;		/* { u32 *out; u32 tag; } */
	void *out;
};

static struct kernel load_kernel(hsa_agent_t agent, const char *path, uint32_t grid)
{
	hsa_code_object_reader_t reader;
	hsa_executable_t exe;
	hsa_executable_symbol_t sym;
	hsa_region_t kernarg = { 0 };
	struct kernel k;
	FILE *f = fopen(path, "rb");

	if (!f) {
		perror(path);
		exit(1);
	}
	check(hsa_code_object_reader_create_from_file(fileno(f), &reader),
	      "hsa_code_object_reader_create_from_file");
	check(hsa_executable_create_alt(HSA_PROFILE_FULL, HSA_DEFAULT_FLOAT_ROUNDING_MODE_DEFAULT, NULL,
					&exe), "hsa_executable_create_alt");
	check(hsa_executable_load_agent_code_object(exe, agent, reader, NULL, NULL),
	      "hsa_executable_load_agent_code_object");
	check(hsa_executable_freeze(exe, NULL), "hsa_executable_freeze");
	check(hsa_executable_get_symbol_by_name(exe, "spin.kd", &agent, &sym),
	      "hsa_executable_get_symbol_by_name(spin.kd)");
	check(hsa_executable_symbol_get_info(sym, HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT, &k.object),
	      "symbol KERNEL_OBJECT");
	check(hsa_executable_symbol_get_info(sym, HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE,
					     &k.kernarg_size), "symbol KERNARG_SEGMENT_SIZE");
	if (hsa_agent_iterate_regions(agent, find_kernarg, &kernarg) != HSA_STATUS_INFO_BREAK)
		fail("no kernarg region");
	check(hsa_memory_allocate(kernarg, 4096, &k.kernarg), "hsa_memory_allocate(kernarg)");
	check(hsa_memory_allocate(kernarg, ((grid + 63) / 64) * 64 * 4, &k.out),
	      "hsa_memory_allocate(out)");
	memcpy(k.kernarg, &k.out, sizeof(k.out));
	*(uint32_t *)((char *)k.kernarg + 8) = 0x5eed;
	return k;
}

static void free_kernel(struct kernel *k)
{
	check(hsa_memory_free(k->kernarg), "hsa_memory_free(kernarg)");
	check(hsa_memory_free(k->out), "hsa_memory_free(out)");
}

/* Reserve the next slot, fill it with the header last (release), ring the doorbell. */
static uint64_t submit(hsa_queue_t *q, const void *packet)
{
	uint64_t index = hsa_queue_add_write_index_screlease(q, 1);
	char *slot = (char *)q->base_address + (index % q->size) * 64;
	uint32_t first;

	while (index - hsa_queue_load_read_index_scacquire(q) >= q->size)
		usleep(100);
	memcpy(slot + 4, (const char *)packet + 4, 60);
	memcpy(&first, packet, 4);
	__atomic_store_n((uint32_t *)slot, first, __ATOMIC_RELEASE);
	hsa_signal_store_screlease(q->doorbell_signal, (hsa_signal_value_t)index);
	return index;
}

static uint16_t header(hsa_packet_type_t type)
{
	return (uint16_t)((type << HSA_PACKET_HEADER_TYPE) | (1 << HSA_PACKET_HEADER_BARRIER) |
			  (HSA_FENCE_SCOPE_SYSTEM << HSA_PACKET_HEADER_ACQUIRE_FENCE_SCOPE) |
			  (HSA_FENCE_SCOPE_SYSTEM << HSA_PACKET_HEADER_RELEASE_FENCE_SCOPE));
}

static uint64_t dispatch(hsa_queue_t *q, const struct kernel *k, uint32_t grid, hsa_signal_t done)
{
	hsa_kernel_dispatch_packet_t p;

	memset(&p, 0, sizeof(p));
	p.header = header(HSA_PACKET_TYPE_KERNEL_DISPATCH);
	p.setup = 1 << HSA_KERNEL_DISPATCH_PACKET_SETUP_DIMENSIONS;
	p.workgroup_size_x = 64;
	p.workgroup_size_y = 1;
	p.workgroup_size_z = 1;
	p.grid_size_x = grid;
	p.grid_size_y = 1;
	p.grid_size_z = 1;
	p.kernel_object = k->object;
	p.kernarg_address = k->kernarg;
	p.completion_signal = done;
	return submit(q, &p);
}

static uint64_t barrier(hsa_queue_t *q, hsa_packet_type_t type, const hsa_signal_t *deps, int n,
			hsa_signal_t done)
{
	hsa_barrier_and_packet_t p;	/* the barrier-OR packet has the same layout */
	int i;

	memset(&p, 0, sizeof(p));
	p.header = header(type);
	for (i = 0; i < n; i++)
		p.dep_signal[i] = deps[i];
	p.completion_signal = done;
	return submit(q, &p);
}

static amd_signal_t *amd(hsa_signal_t s)
{
	/* ROCr's signal handle is the address of its amd_signal_t (amd_hsa_signal.h, 5.2) */
	return (amd_signal_t *)(uintptr_t)s.handle;
}

static hsa_signal_t signal_new(hsa_signal_value_t v)
{
	hsa_signal_t s;

	check(hsa_signal_create(v, 0, NULL, &s), "hsa_signal_create");
	return s;
}

static hsa_signal_value_t wait_zero(hsa_signal_t s, uint64_t timeout_ns)
{
	return hsa_signal_wait_scacquire(s, HSA_SIGNAL_CONDITION_EQ, 0, timeout_ns,
					 HSA_WAIT_STATE_BLOCKED);
}

static hsa_queue_t *queue_on(hsa_agent_t agent)
{
	hsa_queue_t *q;

	check(hsa_queue_create(agent, 64, HSA_QUEUE_TYPE_MULTI, NULL, NULL, UINT32_MAX, UINT32_MAX,
			       &q), "hsa_queue_create");
	return q;
}

static void print_signal(const char *name, hsa_signal_t s, int comma)
{
	amd_signal_t *a = amd(s);

	printf("\"%s\":{\"value\":%lld,\"start_ts\":%llu,\"end_ts\":%llu,\"interrupt\":%s}%s", name,
	       (long long)hsa_signal_load_scacquire(s), (unsigned long long)a->start_ts,
	       (unsigned long long)a->end_ts, a->event_mailbox_ptr ? "true" : "false",
	       comma ? "," : "");
}

static uint64_t monotonic_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

/* `requests` (see the top of the file): a latency-sensitive program's shape for a scheduler. */
static void requests(const char *path, uint32_t grid, int n, uint64_t period_ns, int per_request)
{
	const hsa_signal_t none = { 0 };
	hsa_queue_t *q = queue_on(gpus[0]);
	struct kernel k = load_kernel(gpus[0], path, grid);
	hsa_signal_t s = signal_new(1);
	char line[64];
	uint64_t start;
	int i;

	printf("{\"pid\":%d,\"ready\":%d}\n", getpid(), n);
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		fail("a line on stdin starts the requests");
	start = monotonic_ns();
	for (i = 0; i < n; i++) {
		uint64_t due = start + (uint64_t)i * period_ns, submit, now = monotonic_ns();

		if (now < due)
			usleep((useconds_t)((due - now) / 1000));
		hsa_signal_store_screlease(s, 1);
		submit = monotonic_ns();
		for (int d = 0; d < per_request; d++)
			dispatch(q, &k, grid, d == per_request - 1 ? s : none);
		if (wait_zero(s, UINT64_MAX) != 0)
			fail("a request's dispatches complete");
		printf("{\"submit_ns\":%llu,\"latency_ns\":%llu}\n", (unsigned long long)submit,
		       (unsigned long long)(monotonic_ns() - submit));
		fflush(stdout);
	}
	printf("{\"completed\":%d,\"read_index\":%llu,\"done\":true}\n", n * per_request,
	       (unsigned long long)hsa_queue_load_read_index_scacquire(q));
	fflush(stdout);
	check(hsa_queue_destroy(q), "hsa_queue_destroy");
	free_kernel(&k);
	check(hsa_signal_destroy(s), "hsa_signal_destroy");
}

/* The sequence of `run` on one GPU (see the top of the file). */
static void run_gpu(int gpu, const char *path, uint32_t grid)
{
	hsa_queue_t *q = queue_on(gpus[gpu]);
	amd_queue_t *aq = (amd_queue_t *)q;
	struct kernel k = load_kernel(gpus[gpu], path, grid);
	hsa_signal_t a = signal_new(1), b = signal_new(1), c = signal_new(1);
	hsa_signal_t gate = signal_new(1), never = signal_new(1), and = signal_new(1), or = signal_new(1);
	hsa_signal_t deps_and[3] = { a, b, gate }, deps_or[2] = { never, c };
	hsa_signal_value_t blocked;
	uint64_t read_blocked, write_blocked;

	dispatch(q, &k, grid, a);
	dispatch(q, &k, grid, b);
	barrier(q, HSA_PACKET_TYPE_BARRIER_AND, deps_and, 3, and);
	dispatch(q, &k, grid, c);
	if (wait_zero(b, UINT64_MAX) != 0)
		fail("dispatch B completes");
	if (hsa_signal_load_scacquire(a) != 0)
		fail("dispatch A completed before B");
	/* The gate is held: the barrier-AND must not complete, nor C start. */
	blocked = wait_zero(and, 300000000ULL);
	read_blocked = hsa_queue_load_read_index_scacquire(q);
	write_blocked = hsa_queue_load_write_index_scacquire(q);
	hsa_signal_store_screlease(gate, 0);
	if (wait_zero(and, UINT64_MAX) != 0)
		fail("the barrier-AND completes once the gate opens");
	barrier(q, HSA_PACKET_TYPE_BARRIER_OR, deps_or, 2, or);
	if (wait_zero(or, UINT64_MAX) != 0)
		fail("the barrier-OR completes once C does");
	printf("{\"gpu\":%d,\"queue_id\":%llu,\"kernel_object\":%llu,\"blocked\":{\"barrier\":%lld,"
	       "\"read_index\":%llu,\"write_index\":%llu},", gpu, (unsigned long long)q->id,
	       (unsigned long long)k.object, (long long)blocked, (unsigned long long)read_blocked,
	       (unsigned long long)write_blocked);
	print_signal("a", a, 1);
	print_signal("b", b, 1);
	print_signal("and", and, 1);
	print_signal("c", c, 1);
	print_signal("or", or, 1);
	print_signal("never", never, 1);
	printf("\"read_index\":%llu,\"write_index\":%llu,\"read_dispatch_id\":%llu}\n",
	       (unsigned long long)hsa_queue_load_read_index_scacquire(q),
	       (unsigned long long)hsa_queue_load_write_index_scacquire(q),
	       (unsigned long long)aq->read_dispatch_id);
	fflush(stdout);
	check(hsa_queue_destroy(q), "hsa_queue_destroy");
	free_kernel(&k);
	check(hsa_signal_destroy(a), "hsa_signal_destroy");
	check(hsa_signal_destroy(b), "hsa_signal_destroy");
	check(hsa_signal_destroy(c), "hsa_signal_destroy");
	check(hsa_signal_destroy(gate), "hsa_signal_destroy");
	check(hsa_signal_destroy(never), "hsa_signal_destroy");
	check(hsa_signal_destroy(and), "hsa_signal_destroy");
	check(hsa_signal_destroy(or), "hsa_signal_destroy");
}

int main(int argc, char **argv)
{
	const char *path = argc > 1 ? argv[1] : "";
	const char *mode = argc > 2 ? argv[2] : "run";
	uint32_t grid = argc > 3 ? (uint32_t)strtoul(argv[3], NULL, 0) : 64;
	int i;

	check(hsa_init(), "hsa_init");
	hsa_collect_gpus();
	if (!ngpus)
		fail("no GPU agent");
	if (!strcmp(mode, "run")) {
		for (i = 0; i < ngpus; i++)
			run_gpu(i, path, grid);
	} else if (!strcmp(mode, "loop") || !strcmp(mode, "offline") || !strcmp(mode, "hold")) {
		int n = !strcmp(mode, "hold") ? 1 : (argc > 4 ? atoi(argv[4]) : 1), done = 0;
		uint64_t longest = 0, *ends = NULL;
		size_t cap = 0;
		hsa_queue_t *q = queue_on(gpus[0]);
		struct kernel k = load_kernel(gpus[0], path, grid);
		hsa_signal_t s = signal_new(1);

		printf("{\"pid\":%d,\"%s\":%d}\n", getpid(), n == 1 && !strcmp(mode, "hold") ?
		       "dispatched" : "looping", n);
		fflush(stdout);
		for (i = 0;; i++) {
			struct pollfd in = { .fd = 0, .events = POLLIN };

			/* loop: on past N until stdin has a line or ends; hold: exactly one. */
			if (i >= n && (!strcmp(mode, "hold") || poll(&in, 1, 0) != 0))
				break;
			hsa_signal_store_screlease(s, 1);
			dispatch(q, &k, grid, s);
			if (wait_zero(s, UINT64_MAX) != 0)
				fail("a dispatch completes");
			if (amd(s)->end_ts - amd(s)->start_ts > longest)
				longest = amd(s)->end_ts - amd(s)->start_ts;
			if ((size_t)done == cap) {
				cap = cap ? 2 * cap : 1024;
				ends = realloc(ends, cap * sizeof(*ends));
				if (!ends)
					fail("memory for the dispatch ends");
			}
			ends[done] = amd(s)->end_ts * 10;
			done++;
		}
		if (!strcmp(mode, "offline")) {
			printf("{\"ends_ns\":[");
			for (i = 0; i < done; i++)
				printf("%s%llu", i ? "," : "", (unsigned long long)ends[i]);
			printf("]}\n");
		}
		free(ends);
		if (hsa_queue_load_read_index_scacquire(q) != (uint64_t)done)
			fail("the read index reaches the write index");
		printf("{\"completed\":%d,\"read_index\":%llu,\"longest_ticks\":%llu,\"done\":true}\n",
		       done, (unsigned long long)hsa_queue_load_read_index_scacquire(q),
		       (unsigned long long)longest);
		check(hsa_queue_destroy(q), "hsa_queue_destroy");
		free_kernel(&k);
		check(hsa_signal_destroy(s), "hsa_signal_destroy");
		check(hsa_shut_down(), "hsa_shut_down");
		return 0;
	} else if (!strcmp(mode, "requests")) {
		requests(path, grid, argc > 4 ? atoi(argv[4]) : 1,
			 (argc > 5 ? strtoull(argv[5], NULL, 0) : 100000) * 1000ULL,
			 argc > 6 && atoi(argv[6]) > 0 ? atoi(argv[6]) : 1);
		check(hsa_shut_down(), "hsa_shut_down");
		return 0;
	} else if (!strcmp(mode, "value")) {
		hsa_queue_t *q = queue_on(gpus[0]);
		hsa_signal_t gate = signal_new(5), gate2 = signal_new(3), s[4];
		hsa_amd_barrier_value_packet_t p[4];

		for (i = 0; i < 4; i++) {
			s[i] = signal_new(1);
			memset(&p[i], 0, sizeof(p[i]));
			p[i].header.header = header(HSA_PACKET_TYPE_VENDOR_SPECIFIC);
			p[i].header.AmdFormat = HSA_AMD_PACKET_TYPE_BARRIER_VALUE;
			p[i].mask = -1;
			p[i].completion_signal = s[i];
		}
		p[0].signal = gate;
		p[0].value = 0x10;
		p[0].mask = 0xf0;
		p[0].cond = HSA_SIGNAL_CONDITION_GTE;
		p[2].signal = gate2;
		p[2].value = 4;
		p[2].cond = HSA_SIGNAL_CONDITION_LT;
		p[3].signal = gate2;
		p[3].cond = 9;
		for (i = 0; i < 3; i++)
			submit(q, &p[i]);
		usleep(300000);
		printf("{\"blocked\":{\"values\":[%lld,%lld,%lld],\"read_index\":%llu},",
		       (long long)hsa_signal_load_scacquire(s[0]), (long long)hsa_signal_load_scacquire(s[1]),
		       (long long)hsa_signal_load_scacquire(s[2]),
		       (unsigned long long)hsa_queue_load_read_index_scacquire(q));
		hsa_signal_store_screlease(gate, 0x13);
		for (i = 0; i < 3; i++)
			if (wait_zero(s[i], UINT64_MAX) != 0)
				fail("a barrier-value packet completes once its condition holds");
		printf("\"met\":{\"values\":[0,0,0],\"read_index\":%llu},",
		       (unsigned long long)hsa_queue_load_read_index_scacquire(q));
		submit(q, &p[3]);
		printf("\"bad\":{\"value\":%lld,\"read_index\":%llu,\"write_index\":%llu}}\n",
		       (long long)wait_zero(s[3], 500000000ULL),
		       (unsigned long long)hsa_queue_load_read_index_scacquire(q),
		       (unsigned long long)hsa_queue_load_write_index_scacquire(q));
		fflush(stdout);
		check(hsa_queue_destroy(q), "hsa_queue_destroy");
		for (i = 0; i < 4; i++)
			check(hsa_signal_destroy(s[i]), "hsa_signal_destroy");
		check(hsa_signal_destroy(gate), "hsa_signal_destroy");
		check(hsa_signal_destroy(gate2), "hsa_signal_destroy");
	} else if (!strcmp(mode, "bad")) {
		hsa_queue_t *q = queue_on(gpus[0]);
		hsa_agent_dispatch_packet_t p;
		hsa_signal_t s = signal_new(1);

		memset(&p, 0, sizeof(p));
		p.header = header(HSA_PACKET_TYPE_AGENT_DISPATCH);
		p.completion_signal = s;
		submit(q, &p);
		printf("{\"bad\":{\"value\":%lld,\"read_index\":%llu,\"write_index\":%llu}}\n",
		       (long long)wait_zero(s, 500000000ULL),
		       (unsigned long long)hsa_queue_load_read_index_scacquire(q),
		       (unsigned long long)hsa_queue_load_write_index_scacquire(q));
		fflush(stdout);
		check(hsa_queue_destroy(q), "hsa_queue_destroy");
		check(hsa_signal_destroy(s), "hsa_signal_destroy");
	} else {
		fail("unknown mode");
	}
	check(hsa_shut_down(), "hsa_shut_down");
	printf("{\"gpus\":%d,\"done\":true}\n", ngpus);
	return 0;
}
