// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * /dev/kfd (kfd_chardev.c): GET_VERSION, the queue ioctls, the ioctls libhsakmt issues at
 * hsaKmtOpenKFD, the ioctl table and dispatcher, open and release. The memory, event and debug
 * ioctls are with their concern (memory.c, events.c, debug.c).
 *
 * Part of the KFD emulator, kfd_emu.ko: main.c describes it, README.md "Source files" maps it.
 */

#include "kfd_emu.h"

/* ---- ioctls (kfd_chardev.c) ---- */

static int kfd_ioctl_get_version(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_get_version_args *args = data;

	args->major_version = KFD_IOCTL_MAJOR_VERSION;
	args->minor_version = READ_ONCE(kfd_minor_version);
	return 0;
}

/* set_queue_properties_from_user() (6.12.117), in its order of checks and errnos. */
static int set_queue_properties_from_user(struct queue_properties *q_properties,
					  struct kfd_ioctl_create_queue_args *args)
{
	if ((args->queue_percentage & 0xFF) > KFD_MAX_QUEUE_PERCENTAGE)
		return -EINVAL;
	if (args->queue_priority > KFD_MAX_QUEUE_PRIORITY)
		return -EINVAL;
	if (args->ring_base_address && !access_ok((const void __user *)args->ring_base_address,
						  sizeof(u64)))
		return -EFAULT;
	if (!is_power_of_2(args->ring_size) && args->ring_size != 0)
		return -EINVAL;
	if (!access_ok((const void __user *)args->read_pointer_address, sizeof(u32)))
		return -EFAULT;
	if (!access_ok((const void __user *)args->write_pointer_address, sizeof(u32)))
		return -EFAULT;
	if (args->eop_buffer_address && !access_ok((const void __user *)args->eop_buffer_address,
						   sizeof(u32)))
		return -EFAULT;
	if (args->ctx_save_restore_address &&
	    !access_ok((const void __user *)args->ctx_save_restore_address, sizeof(u32)))
		return -EFAULT;

	q_properties->queue_percent = args->queue_percentage & 0xFF;
	q_properties->priority = args->queue_priority;
	q_properties->queue_address = args->ring_base_address;
	q_properties->queue_size = args->ring_size;
	q_properties->read_ptr = (void __user *)args->read_pointer_address;
	q_properties->write_ptr = (void __user *)args->write_pointer_address;
	q_properties->eop_ring_buffer_address = args->eop_buffer_address;
	q_properties->eop_ring_buffer_size = args->eop_buffer_size;
	q_properties->ctx_save_restore_area_address = args->ctx_save_restore_address;
	q_properties->ctx_save_restore_area_size = args->ctx_save_restore_size;
	q_properties->ctl_stack_size = args->ctl_stack_size;
	q_properties->sdma_engine_id = args->sdma_engine_id;
	if (args->queue_type == KFD_IOC_QUEUE_TYPE_COMPUTE ||
	    args->queue_type == KFD_IOC_QUEUE_TYPE_COMPUTE_AQL)
		q_properties->type = KFD_QUEUE_TYPE_COMPUTE;
	else if (args->queue_type == KFD_IOC_QUEUE_TYPE_SDMA)
		q_properties->type = KFD_QUEUE_TYPE_SDMA;
	else if (args->queue_type == KFD_IOC_QUEUE_TYPE_SDMA_XGMI)
		q_properties->type = KFD_QUEUE_TYPE_SDMA_XGMI;
	else if (args->queue_type == KFD_IOC_QUEUE_TYPE_SDMA_BY_ENG_ID)
		q_properties->type = KFD_QUEUE_TYPE_SDMA_BY_ENG_ID;
	else
		return -ENOTSUPP;
	if (args->queue_type == KFD_IOC_QUEUE_TYPE_COMPUTE_AQL)
		q_properties->format = KFD_QUEUE_FORMAT_AQL;
	else
		q_properties->format = KFD_QUEUE_FORMAT_PM4;
	return 0;
}

/*
 * kfd_queue_acquire_buffers() (kfd_queue.c 6.12), its save-area checks, on a profile that
 * enables them (emu_gpu.h queue_buffer_checks: gfx942). A compute queue's EOP buffer, if given,
 * must be the node's eop_buffer_size; its ctl_stack_size and ctx_save_restore_size must be the
 * node's per-XCC ctl_stack_size and cwsr_size (6.12 compares with !=; later kernels accept a
 * larger save area); the save area must be one GPU mapping of exactly
 * (cwsr_size + debug_memory_size) x NUM_XCC, page aligned (kfd_queue_buffer_get): one
 * context-save area per XCC, as libhsakmt lays them out (one header each). -EINVAL otherwise.
 * The ring and pointer mappings are not checked (README "Not emulated").
 */
static int kfd_queue_acquire_buffers(struct kfd_process_device *pdd, struct queue_properties *q)
{
	struct kfd_node *node = pdd->dev;
	u64 total;

	if (!emu_prof->queue_buffer_checks || q->type != KFD_QUEUE_TYPE_COMPUTE)
		return 0;
	if (q->eop_ring_buffer_address && q->eop_ring_buffer_size != node->eop_buffer_size) {
		pr_debug("kfd_emu: queue eop bo size 0x%x not equal to node eop buf size 0x%x\n",
			 q->eop_ring_buffer_size, node->eop_buffer_size);
		return -EINVAL;
	}
	if (q->ctl_stack_size != node->ctl_stack_size) {
		pr_debug("kfd_emu: queue ctl stack size 0x%x not equal to node ctl stack size 0x%x\n",
			 q->ctl_stack_size, node->ctl_stack_size);
		return -EINVAL;
	}
	if (q->ctx_save_restore_area_size != node->cwsr_size) {
		pr_debug("kfd_emu: queue cwsr size 0x%x not equal to node cwsr size 0x%x\n",
			 q->ctx_save_restore_area_size, node->cwsr_size);
		return -EINVAL;
	}
	total = PAGE_ALIGN((u64)(node->cwsr_size + node->debug_memory_size) * node->num_xcc);
	if (emu_bo_size_at(pdd->process, q->ctx_save_restore_area_address) != total) {
		pr_debug("kfd_emu: expected size 0x%llx not equal to the mapping at 0x%llx\n", total,
			 q->ctx_save_restore_area_address);
		return -EINVAL;
	}
	return 0;
}

/*
 * Mirrors: static int kfd_ioctl_create_queue(struct file *filep, struct kfd_process *p,
 *     void *data) (6.12.117): property checks, "Could not find gpu id" -> -EINVAL,
 * pqm_create_queue,
 * queue_id and the doorbell mmap cookie written back. The kernel copy of the args is `data`
 * (queue_id at +52, what the tracer's kretprobe reads).
 */
__used noinline int kfd_ioctl_create_queue(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_create_queue_args *args = data;
	struct queue_properties q_properties;
	struct kfd_process_device *pdd;
	u32 doorbell_offset_in_process = 0;
	unsigned int queue_id;
	int err;

	memset(&q_properties, 0, sizeof(q_properties));
	err = set_queue_properties_from_user(&q_properties, args);
	if (err)
		return err;

	mutex_lock(&p->mutex);
	pdd = kfd_process_device_data_by_id(p, args->gpu_id);
	if (!pdd) {
		pr_debug("kfd_emu: Could not find gpu id 0x%x\n", args->gpu_id);
		err = -EINVAL;
		goto out;
	}
	/* SDMA_BY_ENG_ID: the emulated GPUs have two SDMA engines (allocate_sdma_queue: -EINVAL) */
	if (q_properties.type == KFD_QUEUE_TYPE_SDMA_BY_ENG_ID &&
	    q_properties.sdma_engine_id >= 2) {
		err = -EINVAL;
		goto out;
	}
	pdd->bound = true;	/* kfd_bind_process_to_device() */
	err = kfd_queue_acquire_buffers(pdd, &q_properties);
	if (err)
		goto out;
	err = pqm_create_queue(&p->pqm, pdd->dev, filep, &q_properties, &queue_id, NULL, NULL, NULL,
			       &doorbell_offset_in_process);
	if (err)
		goto out;
	args->queue_id = queue_id;
	args->doorbell_offset = KFD_MMAP_TYPE_DOORBELL | KFD_MMAP_GPU_ID(args->gpu_id) |
				doorbell_offset_in_process;
out:
	mutex_unlock(&p->mutex);
	return err;
}

/*
 * Mirrors: static int kfd_ioctl_destroy_queue(struct file *filp, struct kfd_process *p,
 *     void *data) (6.12.117)
 */
__used noinline int kfd_ioctl_destroy_queue(struct file *filp, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_destroy_queue_args *args = data;
	int retval;

	mutex_lock(&p->mutex);
	retval = pqm_destroy_queue(&p->pqm, args->queue_id);
	mutex_unlock(&p->mutex);
	return retval;
}

/*
 * Mirrors: static int kfd_ioctl_update_queue(struct file *filp, struct kfd_process *p, void *data)
 * (6.12.117): same range checks as create; an unknown queue id is -EFAULT
 * (pqm_update_queue_properties).
 */
__used noinline int kfd_ioctl_update_queue(struct file *filp, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_update_queue_args *args = data;
	struct process_queue_node *pqn;
	int retval;

	if ((args->queue_percentage & 0xFF) > KFD_MAX_QUEUE_PERCENTAGE)
		return -EINVAL;
	if (args->queue_priority > KFD_MAX_QUEUE_PRIORITY)
		return -EINVAL;
	if (args->ring_base_address && !access_ok((const void __user *)args->ring_base_address,
						  sizeof(u64)))
		return -EFAULT;
	if (!is_power_of_2(args->ring_size) && args->ring_size != 0)
		return -EINVAL;

	mutex_lock(&p->mutex);
	pqn = get_queue_by_qid(&p->pqm, args->queue_id);
	if (!pqn) {
		retval = -EFAULT;
		goto out;
	}
	pqn->q->properties.queue_address = args->ring_base_address;
	pqn->q->properties.queue_size = args->ring_size;
	pqn->q->properties.queue_percent = args->queue_percentage & 0xFF;
	pqn->q->properties.priority = args->queue_priority;
	retval = dqm_update_queue(pqn->q->device->dqm, pqn->q);
out:
	mutex_unlock(&p->mutex);
	return retval;
}

/*
 * ---- the ioctls libhsakmt issues at hsaKmtOpenKFD (ROCm 5.2) ----
 */

/*
 * kfd_ioctl_set_memory_policy() (6.12.117): the policies must be COHERENT or NONCOHERENT
 * (-EINVAL), the gpu id known (-EINVAL); the process binds to the device. The emulated GPU has
 * no caches to configure, so nothing else is kept.
 */
static int kfd_ioctl_set_memory_policy(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_set_memory_policy_args *args = data;
	struct kfd_process_device *pdd;
	int err = 0;

	if (args->default_policy != KFD_IOC_CACHE_POLICY_COHERENT &&
	    args->default_policy != KFD_IOC_CACHE_POLICY_NONCOHERENT)
		return -EINVAL;
	if (args->alternate_policy != KFD_IOC_CACHE_POLICY_COHERENT &&
	    args->alternate_policy != KFD_IOC_CACHE_POLICY_NONCOHERENT)
		return -EINVAL;
	mutex_lock(&p->mutex);
	pdd = kfd_process_device_data_by_id(p, args->gpu_id);
	if (!pdd) {
		pr_debug("kfd_emu: Could not find gpu id 0x%x\n", args->gpu_id);
		err = -EINVAL;
		goto out;
	}
	pdd->bound = true;
out:
	mutex_unlock(&p->mutex);
	return err;
}

/*
 * kfd_ioctl_get_clock_counters() (6.12.117): an unknown gpu id is not an error, its GPU counter
 * reads 0. The GPU counter is RLC's 100 MHz clock (gfx9), here the CP's CLOCK_MONOTONIC / 10; CPU
 * counter ktime_get_raw_ns(), system counter ktime_get_boottime_ns() at 1 GHz.
 */
static int kfd_ioctl_get_clock_counters(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_get_clock_counters_args *args = data;
	struct kfd_process_device *pdd;

	mutex_lock(&p->mutex);
	pdd = kfd_process_device_data_by_id(p, args->gpu_id);
	mutex_unlock(&p->mutex);
	args->gpu_clock_counter = pdd ? emu_gpu_ticks(ktime_get_ns()) : 0;
	args->cpu_clock_counter = ktime_get_raw_ns();
	args->system_clock_counter = ktime_get_boottime_ns();
	args->system_clock_freq = 1000000000;
	return 0;
}

/*
 * gfx9 apertures (kfd_flat_memory.c kfd_init_apertures_v9, 6.12.117): LDS at 1 << 48, scratch
 * at 2 << 48, each 4 GiB; GPUVM from max(SVM_USER_BASE, AMDGPU_VA_RESERVED_BOTTOM) = 64 KiB
 * to the 47-bit hole (gpuvm_size 1 << 47).
 */
#define EMU_LDS_BASE (1ULL << 48)
#define EMU_SCRATCH_BASE (2ULL << 48)
#define EMU_APERTURE_LIMIT(base) (((base) & 0xFFFFFFFF00000000ULL) | 0xFFFFFFFF)
#define EMU_GPUVM_BASE (1ULL << 16)
#define EMU_GPUVM_LIMIT ((1ULL << 47) - 1)

/* kfd_ioctl_get_process_apertures_new() (6.12.117): num_of_nodes 0 asks for the count */
static int kfd_ioctl_get_process_apertures_new(struct file *filp, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_get_process_apertures_new_args *args = data;
	struct kfd_process_device_apertures *pa;
	int i, ret;

	if (args->num_of_nodes == 0) {
		mutex_lock(&p->mutex);
		args->num_of_nodes = p->n_pdds;
		mutex_unlock(&p->mutex);
		return 0;
	}
	pa = kcalloc(args->num_of_nodes, sizeof(*pa), GFP_KERNEL);
	if (!pa)
		return -ENOMEM;
	mutex_lock(&p->mutex);
	for (i = 0; i < min_t(u32, p->n_pdds, args->num_of_nodes); i++) {
		pa[i].gpu_id = p->pdds[i].dev->id;
		pa[i].lds_base = EMU_LDS_BASE;
		pa[i].lds_limit = EMU_APERTURE_LIMIT(EMU_LDS_BASE);
		pa[i].gpuvm_base = EMU_GPUVM_BASE;
		pa[i].gpuvm_limit = EMU_GPUVM_LIMIT;
		pa[i].scratch_base = EMU_SCRATCH_BASE;
		pa[i].scratch_limit = EMU_APERTURE_LIMIT(EMU_SCRATCH_BASE);
	}
	mutex_unlock(&p->mutex);
	args->num_of_nodes = i;
	ret = copy_to_user((void __user *)args->kfd_process_device_apertures_ptr, pa,
			   i * sizeof(*pa));
	kfree(pa);
	return ret ? -EFAULT : 0;
}

/*
 * kfd_ioctl_acquire_vm() (6.12.117): the process's GPU VM comes from a render node file of the
 * same GPU (amdgpu_amdkfd_gpuvm_acquire_process_vm). A bad fd or gpu id is -EINVAL; a file that
 * is not that GPU's render node -EINVAL (amdgpu: not an amdgpu DRM file); a second acquire with
 * the same file is 0, with another -EBUSY. The pdd keeps the file's reference until the process
 * is released.
 */
static int kfd_ioctl_acquire_vm(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_acquire_vm_args *args = data;
	struct kfd_process_device *pdd;
	struct file *drm_file;
	int ret;

	drm_file = fget(args->drm_fd);
	if (!drm_file)
		return -EINVAL;
	mutex_lock(&p->mutex);
	pdd = kfd_process_device_data_by_id(p, args->gpu_id);
	if (!pdd) {
		ret = -EINVAL;
		goto err;
	}
	if (pdd->drm_file) {
		ret = pdd->drm_file == drm_file ? 0 : -EBUSY;
		goto err;
	}
	if (render_gpu_of_file(drm_file) != pdd - p->pdds) {
		ret = -EINVAL;
		goto err;
	}
	pdd->drm_file = drm_file;
	mutex_unlock(&p->mutex);
	return 0;
err:
	mutex_unlock(&p->mutex);
	fput(drm_file);
	return ret;
}

/*
 * kfd_ioctl_set_scratch_backing_va() / kfd_ioctl_set_trap_handler() (6.12.117): unknown gpu
 * -EINVAL; the process binds to the device. Under HWS the CP takes the scratch base from the
 * queue's MQD and the trap handler from the process's TBA/TMA; the emulated CP runs no waves,
 * so the addresses are only kept.
 */
static int kfd_ioctl_set_scratch_backing_va(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_set_scratch_backing_va_args *args = data;
	struct kfd_process_device *pdd;
	int err = 0;

	mutex_lock(&p->mutex);
	pdd = kfd_process_device_data_by_id(p, args->gpu_id);
	if (pdd) {
		pdd->bound = true;
		pdd->scratch_backing_va = args->va_addr;
	} else {
		err = -EINVAL;
	}
	mutex_unlock(&p->mutex);
	return err;
}

/*
 * kfd_ioctl_get_tile_config() (6.12.117): unknown gpu -EINVAL; what
 * amdgpu_amdkfd_get_tile_config() reports for gfx9: GB_ADDR_CONFIG (the profile's, the value
 * amdgpu_emu's READ_MMR_REG answers), the 32 tile and 16 macro-tile modes all 0 and no banks or
 * ranks ("not set from GFX9 onwards"); each array copied up to the caller's size (-EFAULT, its
 * count zeroed, if unwritable). ROCr 5.2's image extension asks at start-up
 * (ImageManagerKv::Initialize, hsaKmtGetTileConfig), which HIP's initialisation reaches.
 */
#define EMU_NUM_TILE_CONFIGS 32
#define EMU_NUM_MACRO_TILE_CONFIGS 16
/* n modes (all 0 on gfx9), at most `have`, to ptr; -EFAULT with *n zeroed if unwritable */
static int emu_tile_modes(u64 ptr, u32 *n, u32 have)
{
	static const u32 zeros[EMU_NUM_TILE_CONFIGS];

	*n = min(*n, have);
	if (copy_to_user((void __user *)(uintptr_t)ptr, zeros, *n * sizeof(u32))) {
		*n = 0;
		return -EFAULT;
	}
	return 0;
}

static int kfd_ioctl_get_tile_config(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_get_tile_config_args *args = data;
	struct kfd_process_device *pdd;

	mutex_lock(&p->mutex);
	pdd = kfd_process_device_data_by_id(p, args->gpu_id);
	mutex_unlock(&p->mutex);
	if (!pdd)
		return -EINVAL;
	args->gb_addr_config = emu_prof->gb_addr_config;
	args->num_banks = 0;
	args->num_ranks = 0;
	if (emu_tile_modes(args->tile_config_ptr, &args->num_tile_configs, EMU_NUM_TILE_CONFIGS))
		return -EFAULT;
	return emu_tile_modes(args->macro_tile_config_ptr, &args->num_macro_tile_configs,
			      EMU_NUM_MACRO_TILE_CONFIGS);
}

static int kfd_ioctl_set_trap_handler(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_set_trap_handler_args *args = data;
	struct kfd_process_device *pdd;
	int err = 0;

	mutex_lock(&p->mutex);
	pdd = kfd_process_device_data_by_id(p, args->gpu_id);
	if (pdd) {
		pdd->bound = true;
		pdd->tba_addr = args->tba_addr;
		pdd->tma_addr = args->tma_addr;
	} else {
		err = -EINVAL;
	}
	mutex_unlock(&p->mutex);
	return err;
}

#if EMU_SECONDARY_CONTEXTS
/*
 * Mirrors: static int kfd_ioctl_create_process(struct file *filep, struct kfd_process *p,
 *     void *data) (kfd_chardev.c 7.0: cc6b66d661fd, "amdkfd: introduce new ioctl
 * AMDKFD_IOC_CREATE_PROCESS", in its V7 form with Felix Kuehling's locking, and the NULL check
 * first as fixed after it). It turns the calling /dev/kfd file into a new secondary context of
 * the calling process: -EINVAL unless the file's context is the primary one ("Each FD owns only
 * one kfd_process"), create_process(current, false) under kfd_processes_mutex, the file's
 * private_data replaced, the context's sysfs directory made (a failure only warns), and the
 * file's reference on the primary dropped. No argument; returns 0. Global and noinline here so
 * that kallsyms names it, as 7.x's does (gpreempt's feature detection: docs/kfd.md §1.5).
 */
__used noinline int kfd_ioctl_create_process(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_process *process;

	if (!filep->private_data || !p)
		return -EINVAL;
	/* Each FD owns only one kfd_process */
	if (p->context_id != KFD_CONTEXT_ID_PRIMARY)
		return -EINVAL;
	mutex_lock(&kfd_processes_mutex);
	if (p != filep->private_data) {
		mutex_unlock(&kfd_processes_mutex);
		return -EINVAL;
	}
	process = create_process(current, false);
	if (IS_ERR(process)) {
		mutex_unlock(&kfd_processes_mutex);
		return PTR_ERR(process);
	}
	filep->private_data = process;
	if (kfd_process_add_sysfs(process))
		pr_warn("kfd_emu: Failed to create sysfs entry for the kfd_process");
	mutex_unlock(&kfd_processes_mutex);
	/* the reference open() took on the primary, which this file no longer holds */
	kfd_unref_process(p);
	return 0;
}
#endif

typedef int amdkfd_ioctl_t(struct file *filep, struct kfd_process *p, void *data);

struct amdkfd_ioctl_desc {
	unsigned int cmd;
	amdkfd_ioctl_t *func;
};

static const struct amdkfd_ioctl_desc amdkfd_ioctls[AMDKFD_COMMAND_END] = {
	[0x01] = { AMDKFD_IOC_GET_VERSION, kfd_ioctl_get_version },
	[0x02] = { AMDKFD_IOC_CREATE_QUEUE, kfd_ioctl_create_queue },
	[0x03] = { AMDKFD_IOC_DESTROY_QUEUE, kfd_ioctl_destroy_queue },
	[0x04] = { AMDKFD_IOC_SET_MEMORY_POLICY, kfd_ioctl_set_memory_policy },
	[0x05] = { AMDKFD_IOC_GET_CLOCK_COUNTERS, kfd_ioctl_get_clock_counters },
	[0x07] = { AMDKFD_IOC_UPDATE_QUEUE, kfd_ioctl_update_queue },
	[0x08] = { AMDKFD_IOC_CREATE_EVENT, kfd_ioctl_create_event },
	[0x09] = { AMDKFD_IOC_DESTROY_EVENT, kfd_ioctl_destroy_event },
	[0x0A] = { AMDKFD_IOC_SET_EVENT, kfd_ioctl_set_event },
	[0x0B] = { AMDKFD_IOC_RESET_EVENT, kfd_ioctl_reset_event },
	[0x0C] = { AMDKFD_IOC_WAIT_EVENTS, kfd_ioctl_wait_events },
	[0x11] = { AMDKFD_IOC_SET_SCRATCH_BACKING_VA, kfd_ioctl_set_scratch_backing_va },
	[0x12] = { AMDKFD_IOC_GET_TILE_CONFIG, kfd_ioctl_get_tile_config },
	[0x13] = { AMDKFD_IOC_SET_TRAP_HANDLER, kfd_ioctl_set_trap_handler },
	[0x14] = { AMDKFD_IOC_GET_PROCESS_APERTURES_NEW, kfd_ioctl_get_process_apertures_new },
	[0x15] = { AMDKFD_IOC_ACQUIRE_VM, kfd_ioctl_acquire_vm },
	[0x16] = { AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, kfd_ioctl_alloc_memory_of_gpu },
	[0x17] = { AMDKFD_IOC_FREE_MEMORY_OF_GPU, kfd_ioctl_free_memory_of_gpu },
	[0x18] = { AMDKFD_IOC_MAP_MEMORY_TO_GPU, kfd_ioctl_map_memory_to_gpu },
	[0x19] = { AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU, kfd_ioctl_unmap_memory_from_gpu },
	[0x21] = { AMDKFD_IOC_SET_XNACK_MODE, kfd_ioctl_set_xnack_mode },
	[0x23] = { AMDKFD_IOC_AVAILABLE_MEMORY, kfd_ioctl_get_available_memory },
	[0x25] = { AMDKFD_IOC_RUNTIME_ENABLE, kfd_ioctl_runtime_enable },
	[0x26] = { AMDKFD_IOC_DBG_TRAP, kfd_ioctl_set_debug_trap },
#if EMU_SECONDARY_CONTEXTS
	[0x27] = { AMDKFD_IOC_CREATE_PROCESS, kfd_ioctl_create_process },
#endif
};

/*
 * Mirrors: static long kfd_ioctl(struct file *filep, unsigned int cmd, unsigned long arg)
 * (6.12.117): the table's command wins (either CREATE_QUEUE size works, the rest zero-filled),
 * -EBADF when another process uses the fd, -EINVAL for numbers without a handler (the
 * emulator has handlers only for the ioctls above), the args copied back even on error.
 */
__used noinline long kfd_ioctl(struct file *filep, unsigned int cmd, unsigned long arg)
{
	struct kfd_process *process = filep->private_data;
	unsigned int nr = _IOC_NR(cmd);
	const struct amdkfd_ioctl_desc *ioctl;
	char stack_kdata[128];
	char *kdata = NULL;
	unsigned int usize, asize;
	long retcode;

	if (_IOC_TYPE(cmd) != AMDKFD_IOCTL_BASE || nr < AMDKFD_COMMAND_START ||
	    nr >= AMDKFD_COMMAND_END)
		return -ENOTTY;
	ioctl = &amdkfd_ioctls[nr];
	usize = _IOC_SIZE(cmd);
	asize = max_t(unsigned int, usize, _IOC_SIZE(ioctl->cmd));
	cmd = ioctl->cmd;

	/* "Using KFD FD in wrong process", then "no function" */
	if (process->lead_thread != current->group_leader)
		return -EBADF;
	if (!ioctl->func)
		return -EINVAL;

	if (cmd & (IOC_IN | IOC_OUT)) {
		if (asize <= sizeof(stack_kdata)) {
			kdata = stack_kdata;
		} else {
			kdata = kmalloc(asize, GFP_KERNEL);
			if (!kdata)
				return -ENOMEM;
		}
		memset(kdata, 0, asize);
	}
	if ((cmd & IOC_IN) && copy_from_user(kdata, (void __user *)arg, usize)) {
		retcode = -EFAULT;
		goto out;
	}
	retcode = ioctl->func(filep, process, kdata);
	if ((cmd & IOC_OUT) && copy_to_user((void __user *)arg, kdata, usize))
		retcode = -EFAULT;
out:
	if (kdata != stack_kdata)
		kfree(kdata);
	return retcode;
}

static int kfd_open(struct inode *inode, struct file *filep)
{
	struct kfd_process *process;

	if (iminor(inode) != 0)
		return -ENODEV;
	process = kfd_create_process(current);
	if (IS_ERR(process))
		return PTR_ERR(process);
	filep->private_data = process;	/* holds the reference kfd_create_process returned */
	return 0;
}

/*
 * kfd_release() (6.12.117): only drops the file's reference; the process lives with its mm.
 * 7.0 (65cce2a172ff): a secondary context lives with its file: it leaves the table (and the
 * debug state) first, then its last reference goes.
 */
static int kfd_release(struct inode *inode, struct file *filep)
{
	struct kfd_process *process = filep->private_data;

	if (!process)
		return 0;
	if (!kfd_process_is_primary(process))
		kfd_process_notifier_release_internal(process);
	kfd_unref_process(process);
	return 0;
}

const struct file_operations kfd_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = kfd_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = kfd_mmap,
	.open = kfd_open,
	.release = kfd_release,
};
