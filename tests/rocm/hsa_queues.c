/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * A client of Debian's libhsa-runtime64 (ROCm 5.2) on the emulated GPUs: hsa_init, every GPU
 * agent, one AQL queue of SIZE packets per GPU (hsa_queue_create), the queue's dispatch ids as
 * ROCr's amd_queue_t has them, then (with a second argument: after a line on stdin, the queues
 * held) hsa_queue_destroy and hsa_shut_down. Prints one JSON line per queue and a summary;
 * exits 1 with the failing call's status string on any error. Usage: hsa-queues [SIZE [hold]]
 *
 * Build: cc -O1 -o hsa_queues hsa_queues.c -lhsa-runtime64 (libhsa-runtime-dev)
 */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <unistd.h>
#include <hsa/hsa.h>
#include <hsa/hsa_ext_amd.h>
#include <hsa/amd_hsa_queue.h>

#include "hsa_common.h"

int main(int argc, char **argv)
{
	uint32_t size = argc > 1 ? (uint32_t)atoi(argv[1]) : 4096;
	hsa_queue_t *queues[MAX_GPUS];
	int i;

	check(hsa_init(), "hsa_init");
	hsa_collect_gpus();
	for (i = 0; i < ngpus; i++) {
		char name[64] = { 0 };
		uint32_t node = 0;
		amd_queue_t *amd;

		check(hsa_agent_get_info(gpus[i], HSA_AGENT_INFO_NAME, name), "hsa_agent_get_info(NAME)");
		check(hsa_agent_get_info(gpus[i], HSA_AMD_AGENT_INFO_DRIVER_NODE_ID, &node),
		      "hsa_agent_get_info(DRIVER_NODE_ID)");
		check(hsa_queue_create(gpus[i], size, HSA_QUEUE_TYPE_MULTI, NULL, NULL, UINT32_MAX,
				       UINT32_MAX, &queues[i]), "hsa_queue_create");
		amd = (amd_queue_t *)queues[i];
		/* amd_queue_t: the HSA queue first, write_dispatch_id at 0x38, read at 0x80 */
		printf("{\"pid\":%d,\"agent\":\"%s\",\"node\":%u,\"size\":%u,\"queue_id\":%llu,"
		       "\"write_dispatch_id_offset\":%llu,\"read_dispatch_id_offset\":%llu,"
		       "\"write_dispatch_id\":%llu,\"read_dispatch_id\":%llu}\n",
		       getpid(), name, node, queues[i]->size, (unsigned long long)queues[i]->id,
		       (unsigned long long)((char *)&amd->write_dispatch_id - (char *)amd),
		       (unsigned long long)((char *)&amd->read_dispatch_id - (char *)amd),
		       (unsigned long long)amd->write_dispatch_id,
		       (unsigned long long)amd->read_dispatch_id);
	}
	fflush(stdout);
	/* "hold": wait for a line on stdin with the queues alive (for gpreempt's queue views) */
	if (argc > 2) {
		char line[16];

		printf("{\"holding\":%d}\n", ngpus);
		fflush(stdout);
		if (!fgets(line, sizeof(line), stdin))
			line[0] = 0;
	}
	for (i = 0; i < ngpus; i++)
		check(hsa_queue_destroy(queues[i]), "hsa_queue_destroy");
	check(hsa_shut_down(), "hsa_shut_down");
	printf("{\"gpus\":%d,\"done\":true}\n", ngpus);
	return 0;
}
