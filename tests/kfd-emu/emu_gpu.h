/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * The emulated GPU as both modules describe it: kfd_emu.ko in the KFD topology
 * (/sys/class/kfd/kfd/topology), amdgpu_emu.ko in its DRM render node's AMDGPU_INFO answers,
 * and the interface between the two modules.
 *
 * Two profiles, chosen when kfd_emu loads (module parameter profile=, README "Profiles"):
 *
 * - mi210 (the default): an MI210, gfx90a (Aldebaran, GC 9.4.2), PCI 1002:740f rev 02, 104 CUs
 *   (8 shader engines x 1 array x 13 active CUs; simd_count 416 as an MI210's topology shows it,
 *   RVS GPUP on an MI210 host, index id 66857953663; "MI210 ... 104" CUs in ROCm's GPU
 *   specifications, rocm.docs.amd.com docs-6.0.2 gpu-arch-spec-overview), one XCC.
 * - mi300x: an MI300X, gfx942 (Aqua Vanjaram, GC 9.4.3), PCI 1002:74a1 rev 00, 8 XCCs of 4
 *   shader engines x 1 array x 10 CUs (38 active per XCC: 304), in one of the compute
 *   partition modes SPX, DPX, QPX, CPX (parameter partition=): 1, 2, 4 or 8 KFD nodes per
 *   package (amdgpu_xcp.c; "Add spatial partitioning support in KFD", Linux 6.5), each with
 *   8/N XCCs. The SPX values are a real MI300X node's (the
 *   gpuq mock of a real node's properties, rocminfo of ROCm 6.2.3 in ROCm/legacy-rocm-build#4021).
 */
#ifndef EMU_GPU_H
#define EMU_GPU_H

#include <linux/types.h>

#define EMU_VENDOR_ID 0x1002
#define EMU_WAVE_SIZE 64
/* RLC's GPU clock counter runs at 100 MHz on gfx9 (amdgpu_gfx.c, gpu_counter_freq 100000 kHz) */
#define EMU_GPU_COUNTER_KHZ 100000
#define EMU_CACHE_LINE 128
#define EMU_SDMA_QUEUES_PER_ENGINE 8

/* one profile: a package's hardware (README "Profiles"; values and sources in topology.c) */
struct emu_profile {
	const char *name;		/* "mi210", "mi300x" */
	const char *gfx_name;		/* "gfx90a", "gfx942" */
	u32 device_id, pci_rev;
	u32 external_rev;		/* soc15_common_early_init(): rev_id + 0x3c / + 0x46 */
	u32 gfx_target_version;		/* major * 10000 + minor * 100 + stepping */
	u32 num_xcc;			/* XCCs per package */
	u32 se_per_xcc;			/* shader engines per XCC */
	u32 arrays_per_engine;
	u32 cu_per_array;		/* topology cu_per_simd_array (max_cu_per_sh) */
	u32 cu_active_per_xcc;
	u32 simd_per_cu, max_waves_per_simd, lds_kb;
	u32 engine_clk_mhz, mem_clk_mhz;
	u64 vram_bytes;			/* per package */
	u32 vram_width;
	u32 mec_fw, sdma_fw;
	u32 sdma_instances;		/* SDMA engines per package */
	u32 cp_queues;			/* num_cp_queues (per node) */
	u32 l1_kb, l2_kb;		/* L1 per CU, L2 per XCC */
	u32 capability;			/* node capability (HSA_CAP_*) */
	u64 debug_prop;			/* node debug_prop (HSA_DBG_*) */
	u32 gb_addr_config;		/* GB_ADDR_CONFIG (READ_MMR_REG, GET_TILE_CONFIG) */
	/*
	 * kfd_queue_acquire_buffers()' save-area checks at CREATE_QUEUE (kfd_queue.c 6.12):
	 * on for the gfx942 profile, whose clients are ROCm's runtimes; off for gfx90a, whose
	 * project clients (emu-workload, kfd-client) pass a header-only save area (README).
	 */
	bool queue_buffer_checks;
};

/* the loaded profile and partition mode (kfd_emu's profile= and partition=) */
const struct emu_profile *kfd_emu_profile(void);
/* KFD nodes (partitions) per package: 1 SPX, 2 DPX, 4 QPX, 8 CPX */
unsigned int kfd_emu_partitions(void);

/* KFD nodes: up to 2 packages x 8 partitions (CPX) */
#define EMU_MAX_GPUS 16
/* DRM render minors start at 128 (drm_minor_alloc, DRM_MINOR_RENDER); ours are the first free */
#define EMU_NO_RENDER_MINOR 0

/*
 * amdgpu_emu.ko (the emulated amdgpu DRM driver: render nodes) registers with kfd_emu.ko, as
 * amdgpu's DRM side hands its render minor and file to its KFD side (kgd2kfd_device_init's
 * drm_render_minor; kfd_ioctl_acquire_vm takes the render node's file).
 */
struct kfd_emu_render_ops {
	/* the emulated GPU (KFD node) index whose render node `file` is, or -1 */
	int (*gpu_of_file)(struct file *file);
};

/* render_minor[i] for KFD node i (kfd_emu_num_gpus() of them); -EBUSY if already registered */
int kfd_emu_render_register(const struct kfd_emu_render_ops *ops, const int *render_minor);
void kfd_emu_render_unregister(void);
/* the number of emulated KFD nodes: packages (num_gpus) x partitions */
unsigned int kfd_emu_num_gpus(void);
/* mmap of a buffer object of the calling process through GPU `gpu`'s render node */
int kfd_emu_render_mmap(unsigned int gpu, struct vm_area_struct *vma);

#endif /* EMU_GPU_H */
