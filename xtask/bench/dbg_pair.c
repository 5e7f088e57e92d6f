/*
 * The baseline of `cargo xtask bench`'s controller row: the least a program can do to suspend
 * and resume another process's queues through the KFD debug-trap ioctl (KFD >= 1.13), the same
 * ioctl pair `gpreempt preempt` issues, with nothing else in the loop.
 *
 *   dbg-pair PID CYCLES GRACE_PERIOD
 *
 * PTRACE_SEIZE, DBG_TRAP ENABLE, GET_QUEUE_SNAPSHOT (the ids), then CYCLES x {SUSPEND_QUEUES,
 * RESUME_QUEUES} back to back, DISABLE, PTRACE_DETACH. Prints one line per cycle with
 * CLOCK_MONOTONIC ns: suspend call, suspend return, resume call, resume return.
 * Layouts: include/uapi/linux/kfd_ioctl.h (Linux 6.12.117), KFD_IOCTL_MINOR_VERSION 17.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/ptrace.h>
#include <time.h>
#include <unistd.h>

struct kfd_ioctl_dbg_trap_args {
	uint32_t pid;
	uint32_t op;
	uint64_t data[3]; /* the union: every member used here is 24 bytes or less */
};
#define AMDKFD_IOC_DBG_TRAP _IOWR('K', 0x26, struct kfd_ioctl_dbg_trap_args)
#define KFD_IOC_DBG_TRAP_ENABLE 0
#define KFD_IOC_DBG_TRAP_DISABLE 1
#define KFD_IOC_DBG_TRAP_SUSPEND_QUEUES 6
#define KFD_IOC_DBG_TRAP_RESUME_QUEUES 7
#define KFD_IOC_DBG_TRAP_GET_QUEUE_SNAPSHOT 13

struct kfd_queue_snapshot_entry {
	uint64_t exception_status, ring_base_address, write_pointer_address, read_pointer_address;
	uint64_t ctx_save_restore_address;
	uint32_t queue_id, gpu_id, ring_size, queue_type, ctx_save_restore_area_size, reserved;
};

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int dbg_trap(int kfd, uint32_t pid, uint32_t op, uint64_t a, uint64_t b, uint64_t c)
{
	struct kfd_ioctl_dbg_trap_args args = { .pid = pid, .op = op, .data = { a, b, c } };
	return ioctl(kfd, AMDKFD_IOC_DBG_TRAP, &args) < 0 ? -errno : 0;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: dbg-pair PID CYCLES GRACE_PERIOD\n");
		return 2;
	}
	uint32_t pid = (uint32_t)atoi(argv[1]);
	long cycles = atol(argv[2]);
	uint32_t grace = (uint32_t)atoi(argv[3]);
	uint64_t (*times)[4] = calloc((size_t)cycles, sizeof(*times));
	struct kfd_queue_snapshot_entry snap[64];
	uint32_t ids[64], again[64];
	uint8_t rinfo[16];
	int events[2], kfd, ret, status = 1;

	if (!times || ptrace(PTRACE_SEIZE, pid, 0, 0) < 0) {
		perror("PTRACE_SEIZE");
		return 1;
	}
	kfd = open("/dev/kfd", O_RDWR | O_CLOEXEC);
	if (kfd < 0 || pipe2(events, O_NONBLOCK | O_CLOEXEC) < 0) {
		perror("/dev/kfd");
		goto detach;
	}
	ret = dbg_trap(kfd, pid, KFD_IOC_DBG_TRAP_ENABLE, 0, (uint64_t)(uintptr_t)rinfo,
		       sizeof(rinfo) | ((uint64_t)events[1] << 32));
	if (ret) {
		fprintf(stderr, "DBG_TRAP ENABLE: %s\n", strerror(-ret));
		goto detach;
	}
	/* num_queues in, the real count out (low word of data[2]); entry_size in the high word. */
	struct kfd_ioctl_dbg_trap_args s = { .pid = pid, .op = KFD_IOC_DBG_TRAP_GET_QUEUE_SNAPSHOT,
		.data = { 0, (uint64_t)(uintptr_t)snap, 64 | ((uint64_t)sizeof(snap[0]) << 32) } };
	if (ioctl(kfd, AMDKFD_IOC_DBG_TRAP, &s) < 0) {
		perror("GET_QUEUE_SNAPSHOT");
		goto disable;
	}
	uint32_t n = (uint32_t)s.data[2];
	if (n > 64)
		n = 64;
	for (uint32_t i = 0; i < n; i++)
		ids[i] = snap[i].queue_id;
	for (long c = 0; c < cycles; c++) {
		/* KFD writes status bits into the array: hand it a fresh copy each time. */
		memcpy(again, ids, n * sizeof(ids[0]));
		times[c][0] = now_ns();
		ret = dbg_trap(kfd, pid, KFD_IOC_DBG_TRAP_SUSPEND_QUEUES, 0, (uint64_t)(uintptr_t)again,
			       n | ((uint64_t)grace << 32));
		times[c][1] = now_ns();
		memcpy(again, ids, n * sizeof(ids[0]));
		times[c][2] = now_ns();
		ret |= dbg_trap(kfd, pid, KFD_IOC_DBG_TRAP_RESUME_QUEUES, (uint64_t)(uintptr_t)again, n, 0);
		times[c][3] = now_ns();
		if (ret) {
			fprintf(stderr, "cycle %ld: %s\n", c, strerror(-ret));
			goto disable;
		}
	}
	for (long c = 0; c < cycles; c++)
		printf("%llu %llu %llu %llu\n", (unsigned long long)times[c][0], (unsigned long long)times[c][1],
		       (unsigned long long)times[c][2], (unsigned long long)times[c][3]);
	fprintf(stderr, "dbg-pair: %ld cycles on %u queue(s) of pid %u\n", cycles, n, pid);
	status = 0;
disable:
	dbg_trap(kfd, pid, KFD_IOC_DBG_TRAP_DISABLE, 0, 0, 0);
detach:
	ptrace(PTRACE_DETACH, pid, 0, 0);
	return status;
}
