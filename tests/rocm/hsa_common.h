/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * What the C clients of Debian's libhsa-runtime64 (ROCm 5.2) in tests/rocm/ share: exit 1 with
 * the failing call's HSA status string (check) or the failed check (fail), and every GPU agent
 * (hsa_init then hsa_collect_gpus, into gpus[0..ngpus)).
 */
#ifndef HSA_COMMON_H
#define HSA_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <hsa/hsa.h>

#define MAX_GPUS 8

static hsa_agent_t gpus[MAX_GPUS];
static int ngpus;

static void check(hsa_status_t s, const char *what)
{
	const char *msg = NULL;

	if (s == HSA_STATUS_SUCCESS)
		return;
	hsa_status_string(s, &msg);
	fprintf(stderr, "%s: 0x%x %s\n", what, s, msg ? msg : "");
	exit(1);
}

static inline void fail(const char *what)
{
	fprintf(stderr, "check failed: %s\n", what);
	exit(1);
}

static hsa_status_t collect_gpu(hsa_agent_t agent, void *data)
{
	hsa_device_type_t type;

	(void)data;
	check(hsa_agent_get_info(agent, HSA_AGENT_INFO_DEVICE, &type), "hsa_agent_get_info(DEVICE)");
	if (type == HSA_DEVICE_TYPE_GPU && ngpus < MAX_GPUS)
		gpus[ngpus++] = agent;
	return HSA_STATUS_SUCCESS;
}

/* every GPU agent, in ROCr's order, into gpus[] (after hsa_init) */
static inline void hsa_collect_gpus(void)
{
	check(hsa_iterate_agents(collect_gpu, NULL), "hsa_iterate_agents");
}

#endif
