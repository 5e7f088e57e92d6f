// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * The topology (kfd_topology.c): /sys/devices/virtual/kfd/kfd/topology/.
 *
 * Part of the KFD emulator, kfd_emu.ko: main.c describes it, README.md "Source files" maps it.
 */

#include "kfd_emu.h"

/*
 * ---- topology (kfd_topology.c, 6.12.117) ----
 *
 * /sys/devices/virtual/kfd/kfd/topology/: generation_id, system_properties and per node gpu_id,
 * name, properties, mem_banks/N/properties, caches/N/properties, io_links/N/properties and an
 * empty p2p_links/. Every properties file is `name value` lines in kfd_topology.c's order
 * ("%s %u\n" for 32-bit, "%s %llu\n" for 64-bit properties): libhsakmt reads them with
 * sscanf("%s %llu") until the first line that does not parse. Node 0 is the CPU (gpu_id 0),
 * nodes 1.. the emulated KFD nodes (emu_gpu.h: one per package, or one per compute partition of
 * the mi300x profile), each linked to the CPU by one PCIe io_link.
 */

/* HSA_CAP_* and HSA_DBG_* (include/uapi/linux/kfd_sysfs.h, as in 6.12) */
#define HSA_CAP_WATCH_POINTS_SUPPORTED 0x00000080
#define HSA_CAP_WATCH_POINTS_TOTALBITS_SHIFT 8
#define HSA_CAP_DOORBELL_TYPE_TOTALBITS_SHIFT 12
#define HSA_CAP_DOORBELL_TYPE_2_0 0x2
#define HSA_CAP_TRAP_DEBUG_SUPPORT 0x00008000
#define HSA_CAP_TRAP_DEBUG_WAVE_LAUNCH_TRAP_OVERRIDE_SUPPORTED 0x00010000
#define HSA_CAP_TRAP_DEBUG_WAVE_LAUNCH_MODE_SUPPORTED 0x00020000
#define HSA_CAP_MEM_EDCSUPPORTED 0x00100000
#define HSA_CAP_SRAM_EDCSUPPORTED 0x04000000
#define HSA_CAP_SVMAPI_SUPPORTED 0x08000000
#define HSA_CAP_TRAP_DEBUG_FIRMWARE_SUPPORTED 0x20000000
#define HSA_CAP_PER_QUEUE_RESET_SUPPORTED 0x80000000
#define HSA_DBG_WATCH_ADDR_MASK_HI_BIT_SHIFT 4
#define HSA_DBG_DISPATCH_INFO_ALWAYS_VALID 0x00000400
/* heap types (HSA_MEM_HEAP_TYPE_*), cache types (HSA_CACHE_TYPE_*), io link (CRAT) values */
#define HSA_MEM_HEAP_TYPE_SYSTEM 0
#define HSA_MEM_HEAP_TYPE_FB_PUBLIC 1
#define HSA_CACHE_TYPE_DATA 0x1
#define HSA_CACHE_TYPE_HSACU 0x8
#define CRAT_IOLINK_TYPE_PCIEXPRESS 2
#define CRAT_IOLINK_FLAGS_ENABLED (1 << 0)
/*
 * ---- the profiles (emu_gpu.h; README "Profiles") ----
 *
 * gfx90a (MI210): 6.12's kfd_topology_set_capabilities() for GC 9.4.2: 4 watch points
 * (log2 2), doorbell type 2, the debug trap with firmware support, SRAM and memory ECC, and
 * per-queue reset (every gfx9 node from 6.12, "drm/amdkfd: support per-queue reset on gfx9";
 * only SR-IOV VFs lose it in the 6.12 stable backport). Not SVMAPI_SUPPORTED: the SVM ioctl is
 * not emulated. debug_prop: watch address mask bits 6..29 and DISPATCH_INFO_ALWAYS_VALID
 * (HSA_DBG_WATCH_ADDR_MASK_LO_BIT_GFX9 6, HI_BIT 29 << 4, 9.4.2+ dispatch info).
 */
static const struct emu_profile emu_mi210 = {
	.name = "mi210",
	.gfx_name = "gfx90a",
	.device_id = 0x740f,
	.pci_rev = 0x02,
	.external_rev = 0x3c,		/* soc15.c, Aldebaran: rev_id + 0x3c */
	.gfx_target_version = 90010,	/* gfx 9.0.10 (kfd_device.c) */
	.num_xcc = 1,
	/*
	 * 104 CUs (simd_count 416): 8 shader engines x 1 array x 13. No public MI210 properties
	 * dump in the index shows array_count and cu_per_simd_array; these multiply to its CUs.
	 */
	.se_per_xcc = 8,
	.arrays_per_engine = 1,
	.cu_per_array = 13,
	.cu_active_per_xcc = 104,
	.simd_per_cu = 4,
	.max_waves_per_simd = 8,
	.lds_kb = 64,
	.engine_clk_mhz = 1700,
	.mem_clk_mhz = 1600,
	.vram_bytes = 64ULL << 30,
	.vram_width = 4096,
	/* gfx90a's HWS with CWSR and the debug trap need MEC firmware >= 51 (kfd_debug.h 6.12) */
	.mec_fw = 80,
	.sdma_fw = 20,
	.sdma_instances = 5,		/* num_sdma_engines 2 + num_sdma_xgmi_engines 3 */
	/* (MEC pipes available to KFD: 3 of 4) x 8 queues per pipe x 1 MEC (6.12) */
	.cp_queues = 24,
	.l1_kb = 16,
	.l2_kb = 8192,
	.capability = HSA_CAP_WATCH_POINTS_SUPPORTED | (2 << HSA_CAP_WATCH_POINTS_TOTALBITS_SHIFT) |
		      (HSA_CAP_DOORBELL_TYPE_2_0 << HSA_CAP_DOORBELL_TYPE_TOTALBITS_SHIFT) |
		      HSA_CAP_TRAP_DEBUG_SUPPORT |
		      HSA_CAP_TRAP_DEBUG_WAVE_LAUNCH_TRAP_OVERRIDE_SUPPORTED |
		      HSA_CAP_TRAP_DEBUG_WAVE_LAUNCH_MODE_SUPPORTED | HSA_CAP_MEM_EDCSUPPORTED |
		      HSA_CAP_SRAM_EDCSUPPORTED | HSA_CAP_TRAP_DEBUG_FIRMWARE_SUPPORTED |
		      HSA_CAP_PER_QUEUE_RESET_SUPPORTED,
	.debug_prop = 6 | (29 << HSA_DBG_WATCH_ADDR_MASK_HI_BIT_SHIFT) |
		      HSA_DBG_DISPATCH_INFO_ALWAYS_VALID,
	.gb_addr_config = 0x22014042,	/* gfx_v9_0_gpu_early_init(), Aldebaran */
	.queue_buffer_checks = false,
};

/*
 * gfx942 (MI300X), SPX values of a real node (the gpuq mock
 * of a real MI300X's properties, corroborated by RVS GPUP docs and rocminfo in
 * ROCm/legacy-rocm-build#4021): simd_count 1216, array_count 32, simd_arrays_per_engine 1,
 * cu_per_simd_array 10, max_waves_per_simd 8, gfx_target_version 90402, device_id 29857,
 * max_engine_clk_fcompute 2100, fw_version 166, sdma_fw_version 22, num_sdma_engines 2 +
 * num_sdma_xgmi_engines 14, num_cp_queues 24, num_xcc 8, debug_prop 1511 (watch address mask
 * bits 7..30 of GC 9.4.3 and DISPATCH_INFO_ALWAYS_VALID), capability 0x2C77A280. The emulator
 * reports that capability with PER_QUEUE_RESET_SUPPORTED, which 6.12 sets on every gfx9 node
 * (the captured node ran an older driver), and without SVMAPI_SUPPORTED (the SVM ioctl is not
 * emulated, as for gfx90a): 0xA477A280.
 */
static const struct emu_profile emu_mi300x = {
	.name = "mi300x",
	.gfx_name = "gfx942",
	.device_id = 0x74a1,
	.pci_rev = 0x00,		/* rocm-smi "Device Rev: 0x00" on MI300X */
	.external_rev = 0x46,		/* soc15.c, GC 9.4.3: rev_id + 0x46 */
	.gfx_target_version = 90402,
	.num_xcc = 8,
	.se_per_xcc = 4,		/* array_count 32 / num_xcc 8 (node_show: array_count x NUM_XCC) */
	.arrays_per_engine = 1,
	.cu_per_array = 10,
	.cu_active_per_xcc = 38,	/* 304 CUs / 8 XCDs (rocminfo "Compute Unit: 304") */
	.simd_per_cu = 4,
	.max_waves_per_simd = 8,
	.lds_kb = 64,
	.engine_clk_mhz = 2100,
	.mem_clk_mhz = 1300,		/* not in the captured properties: HBM3 5.2 Gb/s, 1300 MHz */
	/* 196592 MiB: the DPX partition's 98296 MiB x 2 (ROCm/k8s-gpu-dra-driver#21) */
	.vram_bytes = 196592ULL << 20,
	.vram_width = 8192,		/* 8 HBM3 stacks x 1024 bits */
	.mec_fw = 166,
	.sdma_fw = 22,
	.sdma_instances = 16,		/* 2 + 14 in SPX (kfd_get_num_sdma_engines / _xgmi_) */
	.cp_queues = 24,
	.l1_kb = 32,			/* ROCm GPU specifications: MI300X L1 vector cache 32 KiB */
	.l2_kb = 4096,			/* per XCD (rocminfo "L2: 4096 KB") */
	.capability = (0x2C77A280 & ~HSA_CAP_SVMAPI_SUPPORTED) | HSA_CAP_PER_QUEUE_RESET_SUPPORTED,
	.debug_prop = 1511,
	/* GC 9.4.3 reads GB_ADDR_CONFIG from the hardware and no dump shows it: Aldebaran's */
	.gb_addr_config = 0x22014042,
	.queue_buffer_checks = true,
};

const struct emu_profile *emu_profile_by_name(const char *name)
{
	if (!strcmp(name, "mi210"))
		return &emu_mi210;
	if (!strcmp(name, "mi300x"))
		return &emu_mi300x;
	return NULL;
}

/*
 * kfd_queue_ctx_save_restore_size() (kfd_queue.c 6.12, libhsakmt's update_ctx_save_restore_size
 * the same): per XCC, from the node's CUs per XCC and array_count / simd_arrays_per_engine.
 * gfx90a and gfx942 save 0x80000 bytes of VGPRs per CU, 0x4000 SGPRs, 0x10000 LDS, 0x1000
 * HWREGs; 8 bytes of control stack per wave; 32 debugger bytes per wave; a 40-byte header.
 * MI300X (38 CUs per XCC, 1520 waves): ctl_stack_size 12288, cwsr_size 23203840, debug 48640.
 */
static void kfd_queue_ctx_save_restore_size(struct kfd_node *node)
{
	const struct emu_profile *pr = emu_prof;
	u32 cu_num = node->cu_count / node->num_xcc;
	u32 arrays_per_xcc = pr->se_per_xcc * pr->arrays_per_engine;
	u32 wave_num = min(cu_num * 40, arrays_per_xcc / pr->arrays_per_engine * 512);
	u32 wg_data_size = ALIGN(cu_num * (0x80000 + 0x4000 + 0x10000 + 0x1000), PAGE_SIZE);
	u32 ctl_stack_size = ALIGN(40 + wave_num * 8 + 8, PAGE_SIZE);

	node->ctl_stack_size = ctl_stack_size;
	node->debug_memory_size = ALIGN(wave_num * 32, 64);
	node->cwsr_size = ctl_stack_size + wg_data_size;
	node->eop_buffer_size = 4096;
}

/*
 * A node's share of its package (amdgpu_xcp.c, kfd_topology.c 6.12): num_xcc / partitions XCCs
 * and their CUs, the memory partition's size split between the partitions on it (NPS1:
 * KFD_XCP_MEMORY_SIZE), then the save-area sizes.
 */
void emu_node_init_props(struct kfd_node *node)
{
	node->num_xcc = emu_prof->num_xcc / kfd_emu_partitions();
	node->cu_count = emu_prof->cu_active_per_xcc * node->num_xcc;
	node->vram_bytes = div_u64(emu_prof->vram_bytes, kfd_emu_partitions());
	kfd_queue_ctx_save_restore_size(node);
}

/* kfd_get_num_sdma_engines() / kfd_get_num_xgmi_sdma_engines() (kfd_device.c 6.12) per node */
static u32 emu_sdma_per_node(void)
{
	return emu_prof->sdma_instances / kfd_emu_partitions();
}

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
	return node >= 1 && node <= emu_num_nodes ? &emu_nodes[node - 1] : NULL;
}

#define PROP32(name, v) (offs += sysfs_emit_at(buf, offs, "%s %u\n", (name), (u32)(v)))
#define PROP64(name, v) (offs += sysfs_emit_at(buf, offs, "%s %llu\n", (name), (u64)(v)))

/* node_show() "properties" (6.12.117): the order and the 32/64-bit formats of the kernel */
static ssize_t topo_node_properties(char *buf, unsigned int node)
{
	struct kfd_node *gpu = topo_gpu(node);
	const struct emu_profile *pr = emu_prof;
	u32 arrays = gpu ? pr->se_per_xcc * pr->arrays_per_engine * gpu->num_xcc : 0;
	u32 sdma = emu_sdma_per_node();
	int offs = 0;

	PROP32("cpu_cores_count", gpu ? 0 : num_online_cpus());
	/* the partition's active CUs x SIMDs per CU (kfd_crat.c: per node of a partitioned GPU) */
	PROP32("simd_count", gpu ? gpu->cu_count * pr->simd_per_cu : 0);
	PROP32("mem_banks_count", 1);
	PROP32("caches_count", gpu ? 2 : 0);
	PROP32("io_links_count", gpu ? 1 : emu_num_nodes);
	PROP32("p2p_links_count", 0);
	PROP32("cpu_core_id_base", 0);
	PROP32("simd_id_base", gpu ? EMU_SIMD_ID_BASE + 0x1000 * (node - 1) : 0);
	PROP32("max_waves_per_simd", gpu ? pr->max_waves_per_simd : 0);
	PROP32("lds_size_in_kb", gpu ? pr->lds_kb : 0);
	PROP32("gds_size_in_kb", 0);
	PROP32("num_gws", 0);
	PROP32("wave_front_size", gpu ? EMU_WAVE_SIZE : 0);
	/* 6.5+: array_count * NUM_XCC(xcc_mask) */
	PROP32("array_count", arrays);
	PROP32("simd_arrays_per_engine", gpu ? pr->arrays_per_engine : 0);
	PROP32("cu_per_simd_array", gpu ? pr->cu_per_array : 0);
	PROP32("simd_per_cu", gpu ? pr->simd_per_cu : 0);
	/* kfd_topology.c: max_slots_scratch_cu = 32 on gfx9 */
	PROP32("max_slots_scratch_cu", gpu ? 32 : 0);
	PROP32("gfx_target_version", gpu ? pr->gfx_target_version : 0);
	PROP32("vendor_id", gpu ? EMU_VENDOR_ID : 0);
	PROP32("device_id", gpu ? pr->device_id : 0);
	/*
	 * location_id = pci_dev_id(): bus << 8 | devfn; packages on buses 3 and 4, domain 0. The
	 * partitions of a package share both (kfd_topology.c 6.5+ takes them from the one PCI
	 * device; ROCm/k8s-gpu-dra-driver#21 groups partitions by them).
	 */
	PROP32("location_id", gpu ? (3 + gpu->package) << 8 : 0);
	PROP32("domain", 0);
	PROP32("drm_render_minor", gpu ? gpu->drm_render_minor : 0);
	PROP64("hive_id", 0);
	/* kfd_get_num_sdma_engines(): min(instances / nodes, 2) PCIe engines, the rest XGMI */
	PROP32("num_sdma_engines", gpu ? min(sdma, 2U) : 0);
	PROP32("num_sdma_xgmi_engines", gpu ? sdma - min(sdma, 2U) : 0);
	PROP32("num_sdma_queues_per_engine", gpu ? EMU_SDMA_QUEUES_PER_ENGINE : 0);
	PROP32("num_cp_queues", gpu ? pr->cp_queues : 0);
	if (gpu) {
		PROP32("max_engine_clk_fcompute", pr->engine_clk_mhz);
		/* 6.12 hides the VRAM size here (0); the mem bank carries it */
		PROP64("local_mem_size", 0);
		PROP32("fw_version", pr->mec_fw);
		PROP32("capability", pr->capability);
		PROP64("debug_prop", pr->debug_prop);
		PROP32("sdma_fw_version", pr->sdma_fw);
		/* amdgpu's unique_id (the ASIC serial): one per emulated package */
		PROP64("unique_id", 0x4b46445f454d5500ULL + gpu->package + 1);
		PROP32("num_xcc", gpu->num_xcc);
	}
	/* cpufreq_quick_get_max(0) / 1000: 0 without a cpufreq driver (as in these VMs) */
	PROP32("max_engine_clk_ccompute", 0);
	if (gpu) {
		/*
		 * 6.18.4+ and 6.19 print the per-XCC save-area sizes (node_props.cwsr_size,
		 * ctl_stack_size) last; 6.12 computes them without printing them. The emulator prints
		 * them on every kernel so that a test and gpreempt can read the figure it enforces.
		 */
		PROP32("cwsr_size", gpu->cwsr_size);
		PROP32("ctl_stack_size", gpu->ctl_stack_size);
	}
	return offs;
}

/* mem_show() (6.12.117) */
static ssize_t topo_mem_properties(char *buf, unsigned int node)
{
	struct kfd_node *gpu = topo_gpu(node);
	int offs = 0;

	PROP32("heap_type", gpu ? HSA_MEM_HEAP_TYPE_FB_PUBLIC : HSA_MEM_HEAP_TYPE_SYSTEM);
	PROP64("size_in_bytes", gpu ? gpu->vram_bytes : (u64)totalram_pages() << PAGE_SHIFT);
	PROP32("flags", 0);
	PROP32("width", gpu ? emu_prof->vram_width : 64);
	PROP32("mem_clk_max", gpu ? emu_prof->mem_clk_mhz : 0);
	return offs;
}

/*
 * kfd_cache_show() (6.12.117). Two entries per GPU: the L1 of CU 0 standing for every CU's (the
 * kernel lists one per CU; ROCr reports caches per level) and the L2 of XCC 0 standing for
 * every XCC's, shared by that XCC's CUs.
 */
static ssize_t topo_cache_properties(char *buf, unsigned int node, unsigned int index)
{
	u32 simd_base = EMU_SIMD_ID_BASE + 0x1000 * (node - 1);
	unsigned int cus = index == 0 ? 1 : emu_prof->cu_active_per_xcc, i;
	int offs = 0;

	PROP32("processor_id_low", simd_base);
	PROP32("level", index + 1);
	PROP32("size", index == 0 ? emu_prof->l1_kb : emu_prof->l2_kb);
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
#define EMU_TOPO_MAX_KOBJS 256	/* 16 GPU nodes x 9 + the CPU node's 5 + 16 links */
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
struct kobject *add_topology_node(unsigned int node)
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
	for (i = 0; i < (topo_gpu(node) ? 1 : emu_num_nodes); i++)
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

struct kobj_attribute generation_id_attr = __ATTR_RO(generation_id);
struct kobj_attribute system_properties_attr = __ATTR_RO(system_properties);

void topology_remove(void)
{
	while (topo_nkobjs)
		kobject_put(topo_kobjs[--topo_nkobjs]);
}
