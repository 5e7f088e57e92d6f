/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * The emulated GPU as both modules describe it: kfd_emu.ko in the KFD topology
 * (/sys/class/kfd/kfd/topology), amdgpu_emu.ko in its DRM render node's AMDGPU_INFO answers,
 * and the interface between the two modules.
 *
 * An MI200-class GPU (gfx90a, the newest target ROCm 5.2 knows; HWS, CWSR and the KFD paths of
 * MI300) with the 304 CUs the emulator has always reported (stats_<gpuid>/cu_occupancy): 8 shader
 * engines x 2 shader arrays x 19 CUs, 4 SIMDs per CU. PCI ids are an MI210's (0x1002:0x740f,
 * revision 0x02), so libdrm's amdgpu.ids names it "AMD Instinct MI210".
 */
#ifndef EMU_GPU_H
#define EMU_GPU_H

#include <linux/types.h>

#define EMU_VENDOR_ID 0x1002
#define EMU_DEVICE_ID 0x740f
#define EMU_PCI_REV 0x02
/* gfx_target_version: major * 10000 + minor * 100 + stepping (kfd_device.c, gfx 9.0.10) */
#define EMU_GFX_TARGET_VERSION 90010
#define EMU_SHADER_ENGINES 8
#define EMU_ARRAYS_PER_ENGINE 2
#define EMU_CU_PER_ARRAY 19
#define EMU_SIMD_PER_CU 4
#define EMU_CU_COUNT (EMU_SHADER_ENGINES * EMU_ARRAYS_PER_ENGINE * EMU_CU_PER_ARRAY)	/* 304 */
#define EMU_MAX_WAVES_PER_SIMD 8
#define EMU_WAVE_SIZE 64
#define EMU_LDS_KB 64
#define EMU_ENGINE_CLK_MHZ 1700
#define EMU_MEM_CLK_MHZ 1600
#define EMU_VRAM_BYTES (64ULL << 30)
#define EMU_VRAM_WIDTH 4096
/* firmware versions KFD reports (mec_fw_version, sdma_fw_version): gfx90a's HWS with CWSR and
 * the debug trap need MEC firmware >= 51 (kfd_dbg_has_cwsr_workaround, kfd_debug.h 6.12).
 */
#define EMU_MEC_FW_VERSION 80
#define EMU_SDMA_FW_VERSION 20
#define EMU_SDMA_ENGINES 2
#define EMU_SDMA_XGMI_ENGINES 3
#define EMU_SDMA_QUEUES_PER_ENGINE 8
/* num_cp_queues: (MEC pipes available to KFD: 3 of 4) x 8 queues per pipe x 1 MEC (6.12) */
#define EMU_CP_QUEUES 24
/* RLC's GPU clock counter runs at 100 MHz on gfx9 (amdgpu_gfx.c, gpu_counter_freq 100000 kHz) */
#define EMU_GPU_COUNTER_KHZ 100000
/* L1 (TCP) per CU, L2 shared (gfx90a: 16 KB, 8 MB) */
#define EMU_L1_KB 16
#define EMU_L2_KB 8192
#define EMU_CACHE_LINE 128

#define EMU_MAX_GPUS 2
/* DRM render minors start at 128 (drm_minor_alloc, DRM_MINOR_RENDER); ours are the first free */
#define EMU_NO_RENDER_MINOR 0

/*
 * amdgpu_emu.ko (the emulated amdgpu DRM driver: render nodes) registers with kfd_emu.ko, as
 * amdgpu's DRM side hands its render minor and file to its KFD side (kgd2kfd_device_init's
 * drm_render_minor; kfd_ioctl_acquire_vm takes the render node's file).
 */
struct kfd_emu_render_ops {
	/* the emulated GPU index (0, 1) whose render node `file` is, or -1 */
	int (*gpu_of_file)(struct file *file);
};

/* render_minor[i] for GPU i (num_gpus of them); -EBUSY if already registered */
int kfd_emu_render_register(const struct kfd_emu_render_ops *ops, const int *render_minor);
void kfd_emu_render_unregister(void);
/* the number of emulated GPUs (kfd_emu's num_gpus parameter) */
unsigned int kfd_emu_num_gpus(void);
/* mmap of a buffer object of the calling process through GPU `gpu`'s render node */
int kfd_emu_render_mmap(unsigned int gpu, struct vm_area_struct *vma);

#endif /* EMU_GPU_H */
