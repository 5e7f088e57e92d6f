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

struct kobj_attribute generation_id_attr = __ATTR_RO(generation_id);
struct kobj_attribute system_properties_attr = __ATTR_RO(system_properties);

void topology_remove(void)
{
	while (topo_nkobjs)
		kobject_put(topo_kobjs[--topo_nkobjs]);
}
