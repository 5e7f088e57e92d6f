/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * A HIP program (Debian's hipcc and libamdhip64 5.2) on the first emulated GPU: hipMalloc,
 * STREAMS streams (hipStreamCreate), on each a kernel launch (hipLaunchKernelGGL) between two
 * hipEventRecord, hipStreamSynchronize, hipEventSynchronize and hipEventElapsedTime, then a
 * hipMemcpy host -> device -> host of BYTES bytes per stream's buffer whose round trip is checked
 * byte for byte. The emulated GPU runs no ISA: the kernel takes GRID work-items of emulated time
 * and computes nothing the program reads; the copies are the runtime's own (HIP 5.2 copies small
 * pageable buffers through a pinned staging buffer with hsa_amd_memory_async_copy, which ROCr
 * 5.2 runs on an SDMA queue on gfx90a), so the bytes that come back went through the GPU's copy
 * engine.
 *
 * Usage: hip-streams STREAMS GRID BYTES [hold]
 *   Prints {"pid":P,"devices":N,"streams":S} at start, then one line per stream
 *   {"stream":i,"elapsed_ms":MS,"bytes":B,"equal":E,"first":X,"last":Y} (E: bytes that came back
 *   equal); with "hold", {"holding":S} and waits for a line (or EOF) on stdin with every stream,
 *   event and buffer alive, so a test can look at the process's queues; then destroys them and
 *   prints {"streams":S,"done":true}. Exits 1 with the failing call's name and error on any error.
 *
 * Usage: hip-streams requests GRID N PERIOD_US
 *   An online service's shape, as hsa-dispatch's `requests`: one stream (hipStreamCreate) and its
 *   buffer, one warm-up launch of 64 work-items (HIP loads the code objects at the first launch),
 *   {"pid":P,"ready":N}, then on a line on stdin N requests started every PERIOD_US, each
 *   one kernel launch on the stream (hipLaunchKernelGGL) and hipStreamSynchronize; per request
 *   {"submit_ns":S,"latency_ns":L} (CLOCK_MONOTONIC, from just before the launch to the
 *   synchronize's return), then {"completed":N,"done":true} (HIP gives no queue read index).
 *
 * Usage: hip-streams offline GRID
 *   A training job's shape: one stream and its buffer, the warm-up launch, {"pid":P,"looping":1},
 *   then kernel launches back to back, each followed by hipStreamSynchronize (one step at a
 *   time), until a line (or EOF) is on stdin and at least one ran; then {"ends_ns":[...]} (each
 *   kernel's end as the program saw it: the return of its hipStreamSynchronize,
 *   CLOCK_MONOTONIC), a hipMemcpy round trip of 4096 bytes through the buffer, checked, and
 *   {"completed":K,"longest_ns":L,"bytes":4096,"equal":E,"done":true}, L the longest
 *   launch-to-synchronized step: a kernel's cost alone, longer if its queue was suspended
 *   mid-kernel.
 *
 * Usage: hip-streams serve GRID SOCKET
 *   An online *service*: one stream and its buffer, the warm-up launch, then a Unix socket at
 *   SOCKET and {"pid":P,"serving":"SOCKET"}. Each connection (one at a time) sends lines `N`; each
 *   is answered, once N kernel launches on the stream and one hipStreamSynchronize returned, with
 *   `done N LATENCY_NS` (CLOCK_MONOTONIC, first launch to the synchronize's return) — the line
 *   protocol of `emu-workload server`, so `emu-workload request` is its load command. A line on
 *   stdin (or EOF) ends it with {"requests":R,"kernels":K,"connections":C,"done":true}.
 *
 * Build: hipcc --offload-arch=gfx90a -O1 -o hip-streams hip_streams.hip (Debian bookworm hipcc;
 * `hip-streams-6` is the same program linked to run on trixie's HIP 5.7 and ROCr 6.1)
 */
#include <hip/hip_runtime.h>
#include <poll.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_STREAMS 16

static void check(hipError_t e, const char *what)
{
	if (e == hipSuccess)
		return;
	fprintf(stderr, "%s: %d %s\n", what, (int)e, hipGetErrorString(e));
	exit(1);
}

/* Writes only for a work-item index no grid here reaches: the emulated GPU executes no ISA, and
 * the program never reads what a kernel would have written. */
__global__ void spin(unsigned int *out, unsigned int tag)
{
	if (blockIdx.x * blockDim.x + threadIdx.x == 0xffffffffu)
		out[0] = tag;
}

static unsigned long long monotonic_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (unsigned long long)t.tv_sec * 1000000000ULL + (unsigned long long)t.tv_nsec;
}

/* `requests` (see the top of the file): a latency-sensitive HIP program's shape for a scheduler. */
static int requests(unsigned int grid, int n, unsigned long long period_ns)
{
	hipStream_t s;
	unsigned int *dev;
	unsigned long long start;
	char line[64];
	int i;

	check(hipSetDevice(0), "hipSetDevice");
	check(hipMalloc((void **)&dev, 4096), "hipMalloc");
	check(hipStreamCreate(&s), "hipStreamCreate");
	/* HIP 5.2 loads the program's code object (and ROCclr's) at the first launch, on the CPU
	 * and through ROCr's blit kernels: one launch before `ready`, so that no request pays it. */
	hipLaunchKernelGGL(spin, dim3(1), dim3(64), 0, s, dev, 0u);
	check(hipGetLastError(), "hipLaunchKernelGGL(warm-up)");
	check(hipStreamSynchronize(s), "hipStreamSynchronize(warm-up)");
	printf("{\"pid\":%d,\"ready\":%d}\n", getpid(), n);
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin)) {
		fprintf(stderr, "a line on stdin starts the requests\n");
		return 1;
	}
	start = monotonic_ns();
	for (i = 0; i < n; i++) {
		unsigned long long due = start + (unsigned long long)i * period_ns, submit, now;

		now = monotonic_ns();
		if (now < due)
			usleep((useconds_t)((due - now) / 1000));
		submit = monotonic_ns();
		hipLaunchKernelGGL(spin, dim3(grid / 64), dim3(64), 0, s, dev, (unsigned int)i);
		check(hipGetLastError(), "hipLaunchKernelGGL");
		check(hipStreamSynchronize(s), "hipStreamSynchronize");
		printf("{\"submit_ns\":%llu,\"latency_ns\":%llu}\n", submit, monotonic_ns() - submit);
		fflush(stdout);
	}
	printf("{\"completed\":%d,\"done\":true}\n", n);
	fflush(stdout);
	check(hipStreamDestroy(s), "hipStreamDestroy");
	check(hipFree(dev), "hipFree");
	return 0;
}

/* The buffer's round trip through the GPU (host -> device -> host), byte for byte: how many
 * of its bytes came back equal. back starts as the pattern's complement. */
static size_t round_trip(unsigned char *dev, unsigned char *host, unsigned char *back, size_t bytes,
			 int tag)
{
	size_t k, equal = 0;

	for (k = 0; k < bytes; k++) {
		host[k] = (unsigned char)(k * 131 + tag * 17 + 7);
		back[k] = (unsigned char)~host[k];
	}
	check(hipMemcpy(dev, host, bytes, hipMemcpyHostToDevice), "hipMemcpy(HostToDevice)");
	check(hipMemcpy(back, dev, bytes, hipMemcpyDeviceToHost), "hipMemcpy(DeviceToHost)");
	for (k = 0; k < bytes; k++)
		equal += back[k] == host[k];
	return equal;
}

/* `offline` (see the top of the file): a training job's shape for a scheduler. */
static int offline(unsigned int grid)
{
	static unsigned char host[4096], back[4096];
	unsigned long long *ends = NULL, longest = 0;
	size_t done = 0, cap = 0, i;
	hipStream_t s;
	unsigned char *dev;

	check(hipSetDevice(0), "hipSetDevice");
	check(hipMalloc((void **)&dev, sizeof(host)), "hipMalloc");
	check(hipStreamCreate(&s), "hipStreamCreate");
	hipLaunchKernelGGL(spin, dim3(1), dim3(64), 0, s, (unsigned int *)dev, 0u);
	check(hipGetLastError(), "hipLaunchKernelGGL(warm-up)");
	check(hipStreamSynchronize(s), "hipStreamSynchronize(warm-up)");
	printf("{\"pid\":%d,\"looping\":1}\n", getpid());
	fflush(stdout);
	for (;;) {
		struct pollfd in = { .fd = 0, .events = POLLIN };
		unsigned long long launched;

		if (done && poll(&in, 1, 0) != 0)
			break;
		launched = monotonic_ns();
		hipLaunchKernelGGL(spin, dim3(grid / 64), dim3(64), 0, s, (unsigned int *)dev,
				   (unsigned int)done);
		check(hipGetLastError(), "hipLaunchKernelGGL");
		check(hipStreamSynchronize(s), "hipStreamSynchronize");
		if (done == cap) {
			cap = cap ? 2 * cap : 1024;
			ends = (unsigned long long *)realloc(ends, cap * sizeof(*ends));
			if (!ends) {
				fprintf(stderr, "memory for the kernel ends\n");
				return 1;
			}
		}
		ends[done] = monotonic_ns();
		if (ends[done] - launched > longest)
			longest = ends[done] - launched;
		done++;
	}
	printf("{\"ends_ns\":[");
	for (i = 0; i < done; i++)
		printf("%s%llu", i ? "," : "", ends[i]);
	printf("]}\n");
	printf("{\"completed\":%zu,\"longest_ns\":%llu,\"bytes\":%zu,\"equal\":%zu,\"done\":true}\n",
	       done, longest, sizeof(host), round_trip(dev, host, back, sizeof(host), 1));
	fflush(stdout);
	free(ends);
	check(hipStreamDestroy(s), "hipStreamDestroy");
	check(hipFree(dev), "hipFree");
	return 0;
}

/* `serve` (see the top of the file): the one connection's requests until it closes. */
static void serve_connection(int conn, hipStream_t s, unsigned int *dev, unsigned int grid,
			     unsigned long long *requests, unsigned long long *kernels)
{
	FILE *in = fdopen(conn, "r");
	char line[64];

	if (!in) {
		close(conn);
		return;
	}
	while (fgets(line, sizeof(line), in)) {
		char answer[96];
		int n = atoi(line), k, len;
		unsigned long long submit;

		if (n < 1 || n > 256) {
			len = snprintf(answer, sizeof(answer), "error a request is a number of dispatches, 1 to 256\n");
		} else {
			submit = monotonic_ns();
			for (k = 0; k < n; k++) {
				hipLaunchKernelGGL(spin, dim3(grid / 64), dim3(64), 0, s, dev, (unsigned int)k);
				check(hipGetLastError(), "hipLaunchKernelGGL");
			}
			check(hipStreamSynchronize(s), "hipStreamSynchronize");
			len = snprintf(answer, sizeof(answer), "done %d %llu\n", n, monotonic_ns() - submit);
			*requests += 1;
			*kernels += (unsigned long long)n;
		}
		/* A client gone mid-answer ends its connection, not the service. */
		if (write(conn, answer, (size_t)len) != len)
			break;
	}
	fclose(in);
}

static int serve(unsigned int grid, const char *path)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	unsigned long long requests = 0, kernels = 0, connections = 0;
	hipStream_t s;
	unsigned int *dev;
	int listener;

	if (strlen(path) >= sizeof(addr.sun_path)) {
		fprintf(stderr, "the socket path is longer than %zu bytes: %s\n", sizeof(addr.sun_path) - 1, path);
		return 2;
	}
	strcpy(addr.sun_path, path);
	check(hipSetDevice(0), "hipSetDevice");
	check(hipMalloc((void **)&dev, 4096), "hipMalloc");
	check(hipStreamCreate(&s), "hipStreamCreate");
	hipLaunchKernelGGL(spin, dim3(1), dim3(64), 0, s, dev, 0u);
	check(hipGetLastError(), "hipLaunchKernelGGL(warm-up)");
	check(hipStreamSynchronize(s), "hipStreamSynchronize(warm-up)");
	unlink(path);
	listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof(addr)) || listen(listener, 4)) {
		perror(path);
		return 1;
	}
	printf("{\"pid\":%d,\"serving\":\"%s\"}\n", getpid(), path);
	fflush(stdout);
	for (;;) {
		struct pollfd fds[2] = { { .fd = 0, .events = POLLIN }, { .fd = listener, .events = POLLIN } };
		int conn;

		if (poll(fds, 2, -1) < 0)
			continue;
		if (fds[0].revents)
			break;
		conn = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
		if (conn < 0)
			continue;
		connections++;
		serve_connection(conn, s, dev, grid, &requests, &kernels);
	}
	close(listener);
	unlink(path);
	printf("{\"requests\":%llu,\"kernels\":%llu,\"connections\":%llu,\"done\":true}\n", requests,
	       kernels, connections);
	fflush(stdout);
	check(hipStreamDestroy(s), "hipStreamDestroy");
	check(hipFree(dev), "hipFree");
	return 0;
}

int main(int argc, char **argv)
{
	int streams = argc > 1 ? atoi(argv[1]) : 3;
	unsigned int grid = argc > 2 ? (unsigned int)atoi(argv[2]) : 640;
	size_t bytes = argc > 3 ? (size_t)atol(argv[3]) : 4096;
	bool hold = argc > 4 && !strcmp(argv[4], "hold");
	hipStream_t s[MAX_STREAMS];
	hipEvent_t start[MAX_STREAMS], stop[MAX_STREAMS];
	unsigned char *dev[MAX_STREAMS];
	unsigned char *host, *back;
	float ms[MAX_STREAMS];
	int devices = 0, i;

	if (argc > 1 && !strcmp(argv[1], "requests")) {
		unsigned int rgrid = argc > 2 ? (unsigned int)atoi(argv[2]) : 0;
		int n = argc > 3 ? atoi(argv[3]) : 0;
		long long period_us = argc > 4 ? atoll(argv[4]) : -1;

		if (rgrid < 64 || rgrid % 64 || n < 1 || period_us < 0) {
			fprintf(stderr, "usage: hip-streams requests GRID(multiple of 64) N PERIOD_US\n");
			return 2;
		}
		return requests(rgrid, n, (unsigned long long)period_us * 1000);
	}
	if (argc > 1 && !strcmp(argv[1], "serve")) {
		unsigned int sgrid = argc > 2 ? (unsigned int)atoi(argv[2]) : 0;

		if (sgrid < 64 || sgrid % 64 || argc < 4) {
			fprintf(stderr, "usage: hip-streams serve GRID(multiple of 64) SOCKET\n");
			return 2;
		}
		return serve(sgrid, argv[3]);
	}
	if (argc > 1 && !strcmp(argv[1], "offline")) {
		unsigned int ogrid = argc > 2 ? (unsigned int)atoi(argv[2]) : 0;

		if (ogrid < 64 || ogrid % 64) {
			fprintf(stderr, "usage: hip-streams offline GRID(multiple of 64)\n");
			return 2;
		}
		return offline(ogrid);
	}
	if (streams < 1 || streams > MAX_STREAMS || grid < 64 || grid % 64 || !bytes) {
		fprintf(stderr, "usage: hip-streams STREAMS(1..%d) GRID(multiple of 64) BYTES [hold]\n",
			MAX_STREAMS);
		return 2;
	}
	check(hipGetDeviceCount(&devices), "hipGetDeviceCount");
	check(hipSetDevice(0), "hipSetDevice");
	printf("{\"pid\":%d,\"devices\":%d,\"streams\":%d}\n", getpid(), devices, streams);
	fflush(stdout);
	for (i = 0; i < streams; i++) {
		check(hipMalloc((void **)&dev[i], bytes), "hipMalloc");
		check(hipStreamCreate(&s[i]), "hipStreamCreate");
		check(hipEventCreate(&start[i]), "hipEventCreate");
		check(hipEventCreate(&stop[i]), "hipEventCreate");
	}
	for (i = 0; i < streams; i++) {
		check(hipEventRecord(start[i], s[i]), "hipEventRecord(start)");
		hipLaunchKernelGGL(spin, dim3(grid / 64), dim3(64), 0, s[i], (unsigned int *)dev[i],
				   (unsigned int)i);
		check(hipGetLastError(), "hipLaunchKernelGGL");
		check(hipEventRecord(stop[i], s[i]), "hipEventRecord(stop)");
	}
	for (i = 0; i < streams; i++) {
		check(hipStreamSynchronize(s[i]), "hipStreamSynchronize");
		check(hipEventSynchronize(stop[i]), "hipEventSynchronize");
		check(hipEventElapsedTime(&ms[i], start[i], stop[i]), "hipEventElapsedTime");
	}
	host = (unsigned char *)malloc(bytes);
	back = (unsigned char *)malloc(bytes);
	if (!host || !back) {
		fprintf(stderr, "malloc\n");
		return 1;
	}
	for (i = 0; i < streams; i++) {
		/* a pattern distinct per stream and per byte */
		size_t equal = round_trip(dev[i], host, back, bytes, i);

		printf("{\"stream\":%d,\"elapsed_ms\":%.6f,\"bytes\":%zu,\"equal\":%zu,"
		       "\"first\":%u,\"last\":%u}\n",
		       i, ms[i], bytes, equal, back[0], back[bytes - 1]);
	}
	fflush(stdout);
	if (hold) {
		char line[16];

		printf("{\"holding\":%d}\n", streams);
		fflush(stdout);
		if (!fgets(line, sizeof(line), stdin))
			line[0] = 0;
	}
	for (i = 0; i < streams; i++) {
		check(hipEventDestroy(start[i]), "hipEventDestroy");
		check(hipEventDestroy(stop[i]), "hipEventDestroy");
		check(hipStreamDestroy(s[i]), "hipStreamDestroy");
		check(hipFree(dev[i]), "hipFree");
	}
	free(host);
	free(back);
	printf("{\"streams\":%d,\"done\":true}\n", streams);
	return 0;
}
