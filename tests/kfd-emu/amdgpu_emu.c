// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * amdgpu_emu: the DRM side of the emulated GPUs, next to kfd_emu.ko (their KFD side). One DRM
 * device named "amdgpu" (version 3.x, as libdrm_amdgpu requires) per emulated GPU, each with a
 * render node /dev/dri/renderD<minor> that answers what ROCm 5.2's libhsakmt asks through
 * libdrm_amdgpu's amdgpu_device_initialize(): DRM_IOCTL_VERSION (DRM core) and AMDGPU_INFO
 * queries ACCEL_WORKING, DEV_INFO and READ_MMR_REG (GB_ADDR_CONFIG). The render minors go to kfd_emu's
 * topology (drm_render_minor) and kfd_emu's ACQUIRE_VM accepts only these files, as amdgpu's
 * KFD accepts only its own DRM files.
 *
 * The real amdgpu holds /dev/kfd itself, so it cannot be loaded next to kfd_emu; this module is
 * the part of amdgpu the emulator needs from the DRM side, and its name carries "amdgpu" as
 * amdgpu's does: ROCm 5.2's rocminfo checks `lsmod | grep amdgpu` before it opens /dev/kfd.
 * A test fixture, never shipped. README.md documents what it answers.
 */

#include <linux/module.h>
#include <linux/platform_device.h>
#include <linux/slab.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/uaccess.h>
#include <linux/version.h>
#include <drm/drm_drv.h>
#include <drm/drm_file.h>
#include <drm/drm_ioctl.h>
#include <drm/amdgpu_drm.h>

#include "emu_gpu.h"

/* amdgpu 6.12.117's version (amdgpu_drv.c KMS_DRIVER_MAJOR/MINOR/PATCHLEVEL) */
#define EMU_DRM_MAJOR 3
#define EMU_DRM_MINOR 59
#define EMU_DRM_PATCHLEVEL 0

/* soc15 GC register GB_ADDR_CONFIG (dword offset), the one register libdrm reads on gfx9 */
#define EMU_MM_GB_ADDR_CONFIG 0x263e
/* AMDGPU_GMC_HOLE_START / END: the 48-bit VM's low and high halves (amdgpu_gmc.h) */
#define EMU_GMC_HOLE_START 0x0000800000000000ULL
#define EMU_GMC_HOLE_END 0xffff800000000000ULL
/* AMDGPU_VA_RESERVED_BOTTOM (amdgpu_vm.h, 6.12) */
#define EMU_VA_RESERVED_BOTTOM (1ULL << 16)

struct emu_drm_gpu {
	struct platform_device *pdev;
	struct drm_device *drm;
	bool partition_attr;	/* current_compute_partition created on pdev */
};

static struct emu_drm_gpu emu_drm_gpus[EMU_MAX_GPUS];
static unsigned int emu_drm_ngpus;

/*
 * amdgpu_info_ioctl() AMDGPU_INFO_DEV_INFO (amdgpu_kms.c, 6.12.117) for a KFD node of the loaded
 * profile (emu_gpu.h): a partition's render node answers for its own XCCs (amdgpu_xcp.c gives
 * each partition a DRM device), the CU bitmap that of its first XCC.
 */
static void emu_dev_info(struct drm_amdgpu_info_device *di)
{
	const struct emu_profile *pr = kfd_emu_profile();
	unsigned int xccs = pr->num_xcc / kfd_emu_partitions(), se, sh, arrays, i, cu;

	di->device_id = pr->device_id;
	di->chip_rev = 0;
	di->external_rev = pr->external_rev;
	di->pci_rev = pr->pci_rev;
	di->family = AMDGPU_FAMILY_AI;
	di->num_shader_engines = pr->se_per_xcc * xccs;
	di->num_shader_arrays_per_engine = pr->arrays_per_engine;
	di->gpu_counter_freq = EMU_GPU_COUNTER_KHZ;
	di->max_engine_clock = pr->engine_clk_mhz * 1000;
	di->max_memory_clock = pr->mem_clk_mhz * 1000;
	di->cu_active_number = pr->cu_active_per_xcc * xccs;
	/*
	 * gfx9 with more than 4 SEs: bitmap[se % 4][sh + (se / 4) * 2] (gfx_v9_0_get_cu_info); the
	 * XCC's active CUs spread over its arrays, the first ones getting one more.
	 */
	arrays = pr->se_per_xcc * pr->arrays_per_engine;
	for (se = 0; se < pr->se_per_xcc; se++) {
		for (sh = 0; sh < pr->arrays_per_engine; sh++) {
			i = se * pr->arrays_per_engine + sh;
			cu = pr->cu_active_per_xcc / arrays + (i < pr->cu_active_per_xcc % arrays);
			di->cu_bitmap[se % 4][sh + (se / 4) * 2] = (1U << cu) - 1;
		}
	}
	di->num_hw_gfx_contexts = 8;
	di->virtual_address_offset = EMU_VA_RESERVED_BOTTOM;
	di->virtual_address_max = EMU_GMC_HOLE_START;
	di->virtual_address_alignment = PAGE_SIZE;
	di->pte_fragment_size = 2 << 20;
	di->gart_page_size = PAGE_SIZE;
	di->vram_type = AMDGPU_VRAM_TYPE_HBM;
	di->vram_bit_width = pr->vram_width;
	di->wave_front_size = EMU_WAVE_SIZE;
	di->num_shader_visible_vgprs = 256;
	di->num_cu_per_sh = pr->cu_per_array;
	di->num_tcc_blocks = 16;
	di->high_va_offset = EMU_GMC_HOLE_END;
	di->high_va_max = EMU_GMC_HOLE_END | EMU_GMC_HOLE_START;
}

/*
 * amdgpu_info_ioctl() (amdgpu_kms.c, 6.12.117): a zero return size or pointer is -EINVAL, an
 * unknown query -EINVAL, a register outside the readable set -EFAULT ("unallowed offset"), at
 * most 128 registers; the answer is copied up to the caller's return_size.
 */
static int emu_info_ioctl(struct drm_device *dev, void *data, struct drm_file *filp)
{
	struct drm_amdgpu_info *info = data;
	void __user *out = u64_to_user_ptr(info->return_pointer);
	u32 size = info->return_size;

	if (!info->return_size || !info->return_pointer)
		return -EINVAL;
	switch (info->query) {
	case AMDGPU_INFO_ACCEL_WORKING: {
		u32 working = 1;	/* adev->accel_working */

		return copy_to_user(out, &working, min_t(u32, size, sizeof(working))) ? -EFAULT : 0;
	}
	case AMDGPU_INFO_DEV_INFO: {
		struct drm_amdgpu_info_device *di;
		int ret;

		di = kzalloc(sizeof(*di), GFP_KERNEL);
		if (!di)
			return -ENOMEM;
		emu_dev_info(di);
		ret = copy_to_user(out, di, min_t(size_t, size, sizeof(*di))) ? -EFAULT : 0;
		kfree(di);
		return ret;
	}
	case AMDGPU_INFO_READ_MMR_REG: {
		u32 count = info->read_mmr_reg.count, i, reg = kfd_emu_profile()->gb_addr_config;

		if (count > 128)
			return -EINVAL;
		for (i = 0; i < count; i++)
			if (info->read_mmr_reg.dword_offset + i != EMU_MM_GB_ADDR_CONFIG)
				return -EFAULT;
		if (count && copy_to_user(out, &reg, min_t(u32, size, sizeof(reg))))
			return -EFAULT;
		return 0;
	}
	default:
		return -EINVAL;
	}
}

/* Every other amdgpu ioctl number has no function here: drm_ioctl() returns -EINVAL. */
static const struct drm_ioctl_desc emu_ioctls[] = {
	DRM_IOCTL_DEF_DRV(AMDGPU_INFO, emu_info_ioctl, DRM_AUTH | DRM_RENDER_ALLOW),
};

static int emu_gpu_of_file(struct file *file);

/* A buffer object's CPU mapping: kfd_emu owns the objects (ALLOC_MEMORY_OF_GPU). */
static int emu_drm_mmap(struct file *file, struct vm_area_struct *vma)
{
	int gpu = emu_gpu_of_file(file);

	return gpu < 0 ? -ENODEV : kfd_emu_render_mmap(gpu, vma);
}

static const struct file_operations emu_drm_fops = {
	.owner = THIS_MODULE,
	.open = drm_open,
	.release = drm_release,
	.unlocked_ioctl = drm_ioctl,
#ifdef CONFIG_COMPAT
	.compat_ioctl = drm_compat_ioctl,
#endif
	.poll = drm_poll,
	.read = drm_read,
	.mmap = emu_drm_mmap,
	.llseek = noop_llseek,
#ifdef FOP_UNSIGNED_OFFSET
	/* 6.12+: drm_open_helper() refuses (WARN, -EINVAL) DRM fops without it */
	.fop_flags = FOP_UNSIGNED_OFFSET,
#endif
};

static struct drm_driver emu_drm_driver = {
	.driver_features = DRIVER_RENDER,
	.ioctls = emu_ioctls,
	.num_ioctls = ARRAY_SIZE(emu_ioctls),
	.fops = &emu_drm_fops,
	.name = "amdgpu",
	.desc = "AMD GPU (emulated by gpreempt's amdgpu_emu)",
#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 14, 0)
	/* struct drm_driver lost .date in 6.14 */
	.date = "20150101",
#endif
	.major = EMU_DRM_MAJOR,
	.minor = EMU_DRM_MINOR,
	.patchlevel = EMU_DRM_PATCHLEVEL,
};

/* The emulated GPU whose render node `file` is, or -1 (not a render file of this module). */
static int emu_gpu_of_file(struct file *file)
{
	struct drm_file *df;
	unsigned int i;

	if (file->f_op != &emu_drm_fops)
		return -1;
	df = file->private_data;
	if (!df || !df->minor)
		return -1;
	for (i = 0; i < emu_drm_ngpus; i++)
		if (df->minor == emu_drm_gpus[i].drm->render)
			return i;
	return -1;
}

static const struct kfd_emu_render_ops emu_render_ops = {
	.gpu_of_file = emu_gpu_of_file,
};

/*
 * current_compute_partition (amdgpu_gfx.c, Linux 6.5+ through 7.x; amdgpu_gfx_sysfs_init creates
 * it on the PCI device of a GPU with an XCP manager, GC 9.4.3): "SPX\n", "DPX\n", "QPX\n" or
 * "CPX\n" (amdgpu_gfx_get_current_compute_partition -> amdgpu_gfx_compute_mode_desc). The PCI
 * device is partition 0's DRM parent (amdgpu_xcp.c amdgpu_xcp_dev_alloc: "xcp #0 shares drm
 * device setting with adev"), so here it sits on each package's first platform device, which
 * /sys/class/drm/renderD<minor>/device names for partition 0's render node. 0444 here: amdgpu's
 * is 0644 (a write switches the mode), the emulator's mode is the partition= parameter at load.
 */
static ssize_t current_compute_partition_show(struct device *dev, struct device_attribute *attr,
					      char *buf)
{
	static const char *const desc[] = { [1] = "SPX", [2] = "DPX", [4] = "QPX", [8] = "CPX" };
	unsigned int n = kfd_emu_partitions();

	return sysfs_emit(buf, "%s\n", n < ARRAY_SIZE(desc) && desc[n] ? desc[n] : "UNKNOWN");
}
static DEVICE_ATTR_RO(current_compute_partition);

static void emu_drm_remove(void)
{
	while (emu_drm_ngpus) {
		struct emu_drm_gpu *g = &emu_drm_gpus[--emu_drm_ngpus];

		drm_dev_unregister(g->drm);
		drm_dev_put(g->drm);
		if (g->partition_attr)
			device_remove_file(&g->pdev->dev, &dev_attr_current_compute_partition);
		platform_device_unregister(g->pdev);
	}
}

static int __init amdgpu_emu_init(void)
{
	int minors[EMU_MAX_GPUS] = { 0 };
	unsigned int i, n = kfd_emu_num_gpus();
	int err;

	for (i = 0; i < n; i++) {
		struct emu_drm_gpu *g = &emu_drm_gpus[i];

		g->pdev = platform_device_register_simple("amdgpu_emu", i, NULL, 0);
		if (IS_ERR(g->pdev)) {
			err = PTR_ERR(g->pdev);
			goto fail;
		}
		g->drm = drm_dev_alloc(&emu_drm_driver, &g->pdev->dev);
		if (IS_ERR(g->drm)) {
			err = PTR_ERR(g->drm);
			platform_device_unregister(g->pdev);
			goto fail;
		}
		err = drm_dev_register(g->drm, 0);
		if (err) {
			drm_dev_put(g->drm);
			platform_device_unregister(g->pdev);
			goto fail;
		}
		emu_drm_ngpus = i + 1;
		minors[i] = g->drm->render->index;
		/* multi-XCC packages (gfx942) have the XCP manager; a package's first node */
		if (kfd_emu_profile()->num_xcc > 1 && i % kfd_emu_partitions() == 0) {
			err = device_create_file(&g->pdev->dev, &dev_attr_current_compute_partition);
			if (err)
				goto fail;
			g->partition_attr = true;
		}
	}
	err = kfd_emu_render_register(&emu_render_ops, minors);
	if (err)
		goto fail;
	if (n > 1)
		pr_info("amdgpu_emu: render nodes renderD%d..renderD%d for kfd_emu's %u GPU nodes\n",
			minors[0], minors[n - 1], n);
	else
		pr_info("amdgpu_emu: render node renderD%d for kfd_emu's GPU\n", minors[0]);
	return 0;
fail:
	emu_drm_remove();
	return err;
}

static void __exit amdgpu_emu_exit(void)
{
	kfd_emu_render_unregister();
	emu_drm_remove();
}

module_init(amdgpu_emu_init);
module_exit(amdgpu_emu_exit);
MODULE_DESCRIPTION("Emulated amdgpu DRM render nodes for gpreempt's KFD emulator (test fixture)");
MODULE_LICENSE("Dual MIT/GPL");
