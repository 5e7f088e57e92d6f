// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * GPU memory (kfd_chardev.c + amdgpu_amdkfd_gpuvm.c): buffer objects and their ioctls, the emulated
 * GPU's access to a process's memory, doorbells, kfd_mmap() and the render node's mmap.
 *
 * Part of the KFD emulator, kfd_emu.ko: main.c describes it, README.md "Source files" maps it.
 */

#include "kfd_emu.h"

/*
 * ---- GPU memory (kfd_chardev.c + amdgpu_amdkfd_gpuvm.c, 6.12.117) ----
 *
 * A buffer object is guest memory: VRAM and GTT objects are vmalloc_user() pages the process
 * maps through its render node (a VRAM object gets its pages at its first CPU mapping: VRAM
 * no CPU maps, such as ROCr's scratch reservation, costs the guest nothing) (amdgpu_emu's mmap, at the offset ALLOC returned, as amdgpu's
 * DRM vma offsets); USERPTR objects are the process's own pages (GPU VA = CPU VA). The
 * emulated GPU reaches memory through the process's address space, so GPU mappings
 * (MAP/UNMAP_MEMORY_TO_GPU) are bookkeeping: which GPUs an object is mapped on.
 */

/* a DRM vma offset: DRM_FILE_PAGE_OFFSET_START ((0xFFFFFFFFUL >> PAGE_SHIFT) + 1) pages up */
#define EMU_BO_MMAP_BASE ((((u64)0xFFFFFFFFUL >> PAGE_SHIFT) + 1) << PAGE_SHIFT)
/* doorbell slice per process on gfx9: 1024 doorbells of 8 bytes (kfd_doorbell_process_slice) */
#define EMU_DOORBELL_SLICE (1024 * 8)

static atomic64_t emu_bo_mmap_next = ATOMIC64_INIT(0);

static void emu_bo_free(struct emu_bo *bo)
{
	vfree(bo->kaddr);	/* mapped pages keep their own references (vm_insert_page) */
	kfree(bo);
}

static int emu_bo_free_cb(int id, void *ptr, void *data)
{
	emu_bo_free(ptr);
	return 0;
}

/* kfd_process_free_outstanding_kfd_bos(): at release, every object the process left */
void emu_process_free_bos(struct kfd_process *p)
{
	idr_for_each(&p->bo_idr, emu_bo_free_cb, NULL);
	idr_destroy(&p->bo_idr);
}

/*
 * kfd_ioctl_alloc_memory_of_gpu() (6.12.117): size 0 -EINVAL, unknown gpu -EINVAL, no VM
 * acquired -ENODEV (kfd_bind_process_to_device), a doorbell object of other than the process
 * slice -EINVAL, an MMIO remap object of other than a page -EINVAL; the emulated GPU has no
 * MMIO remap page (rmmio_remap.bus_addr 0: -ENOMEM, which libhsakmt tolerates). VRAM is limited
 * by the topology's size (-ENOMEM, amdgpu_amdkfd_reserve_mem_limit) and, for its backing, by
 * the guest's memory.
 */
int kfd_ioctl_alloc_memory_of_gpu(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_alloc_memory_of_gpu_args *args = data;
	struct kfd_process_device *pdd;
	struct emu_bo *bo;
	u32 flags = args->flags;
	int id, err;

	if (args->size == 0)
		return -EINVAL;
	mutex_lock(&p->mutex);
	pdd = kfd_process_device_data_by_id(p, args->gpu_id);
	if (!pdd) {
		err = -EINVAL;
		goto out;
	}
	if (!pdd->drm_file) {
		err = -ENODEV;
		goto out;
	}
	pdd->bound = true;
	if (flags & KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL) {
		if (args->size != EMU_DOORBELL_SLICE) {
			err = -EINVAL;
			goto out;
		}
	} else if (flags & KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP) {
		err = args->size != PAGE_SIZE ? -EINVAL : -ENOMEM;
		goto out;
	}
	if ((flags & KFD_IOC_ALLOC_MEM_FLAGS_VRAM) &&
	    p->vram_used[pdd - p->pdds] + args->size > pdd->dev->vram_bytes) {
		err = -ENOMEM;
		goto out;
	}
	bo = kzalloc(sizeof(*bo), GFP_KERNEL);
	if (!bo) {
		err = -ENOMEM;
		goto out;
	}
	bo->gpu = pdd - p->pdds;
	bo->flags = flags;
	bo->va = args->va_addr;
	bo->size = PAGE_ALIGN(args->size);
	if (flags & (KFD_IOC_ALLOC_MEM_FLAGS_VRAM | KFD_IOC_ALLOC_MEM_FLAGS_GTT)) {
		if (flags & KFD_IOC_ALLOC_MEM_FLAGS_GTT)
			bo->kaddr = vmalloc_user(bo->size);
		if ((flags & KFD_IOC_ALLOC_MEM_FLAGS_GTT) && !bo->kaddr) {
			kfree(bo);
			err = -ENOMEM;
			goto out;
		}
		bo->mmap_offset = EMU_BO_MMAP_BASE +
				  atomic64_fetch_add(bo->size, &emu_bo_mmap_next);
	} else if (flags & KFD_IOC_ALLOC_MEM_FLAGS_USERPTR) {
		bo->mmap_offset = args->mmap_offset;
	}
	mutex_lock(&p->bo_lock);
	id = idr_alloc(&p->bo_idr, bo, 1, 0, GFP_KERNEL);
	mutex_unlock(&p->bo_lock);
	if (id < 0) {
		emu_bo_free(bo);
		err = -EFAULT;
		goto out;
	}
	if (flags & KFD_IOC_ALLOC_MEM_FLAGS_VRAM)
		p->vram_used[bo->gpu] += bo->size;
	args->handle = EMU_MAKE_HANDLE(args->gpu_id, id);
	args->mmap_offset = bo->mmap_offset;
	err = 0;
out:
	mutex_unlock(&p->mutex);
	return err;
}

/* a VRAM or GTT object's pages, allocated at the first CPU access; p->bo_lock held */
void *emu_bo_backing(struct emu_bo *bo)
{
	if (!bo->kaddr && (bo->flags & (KFD_IOC_ALLOC_MEM_FLAGS_VRAM | KFD_IOC_ALLOC_MEM_FLAGS_GTT)))
		bo->kaddr = vmalloc_user(bo->size);
	return bo->kaddr;
}

/* the object of `handle` allocated on a GPU of p, or NULL; p->mutex held */
struct emu_bo *emu_bo_lookup(struct kfd_process *p, u64 handle)
{
	struct kfd_process_device *pdd = kfd_process_device_data_by_id(p, EMU_HANDLE_GPU(handle));
	struct emu_bo *bo;

	if (!pdd)
		return NULL;
	bo = idr_find(&p->bo_idr, EMU_HANDLE_IDR(handle));
	return bo && bo->gpu == pdd - p->pdds ? bo : NULL;
}

/* Does one memory object of p (VRAM, GTT or USERPTR) hold [va, va + len)? For the emulated CP. */
bool emu_bo_holds(struct kfd_process *p, u64 va, u64 len)
{
	struct emu_bo *bo;
	bool found = false;
	int id;

	mutex_lock(&p->bo_lock);
	idr_for_each_entry(&p->bo_idr, bo, id)
		if (bo->va && va >= bo->va && va + len <= bo->va + bo->size &&
		    (bo->flags & (KFD_IOC_ALLOC_MEM_FLAGS_VRAM | KFD_IOC_ALLOC_MEM_FLAGS_GTT |
				  KFD_IOC_ALLOC_MEM_FLAGS_USERPTR))) {
			found = true;
			break;
		}
	mutex_unlock(&p->bo_lock);
	return found;
}

/*
 * The size of the memory object mapped at exactly va, 0 if none starts there: the GPU VA
 * mapping kfd_queue_buffer_get() (kfd_queue.c 6.12) looks up for a queue's buffers.
 */
u64 emu_bo_size_at(struct kfd_process *p, u64 va)
{
	struct emu_bo *bo;
	u64 size = 0;
	int id;

	mutex_lock(&p->bo_lock);
	idr_for_each_entry(&p->bo_idr, bo, id)
		if (bo->va && bo->va == va) {
			size = bo->size;
			break;
		}
	mutex_unlock(&p->bo_lock);
	return size;
}

/*
 * The emulated GPU's view of p's memory for the SDMA engines: [va, va + len) (within one page)
 * of a VRAM or GTT object is read or written in the object's own pages (the emulator's backing,
 * which the process's CPU mappings of it share, whatever their protection), any other address
 * (USERPTR objects, ROCr's system memory) in the process's address space. The user mm is in use;
 * p->bo_lock is held only around the object's pages (never across a user access, which may
 * fault: the render node's mmap takes bo_lock under mmap_lock). 0 or -EFAULT.
 * emu_bo_kaddr: the kernel address of va in the VRAM or GTT object holding [va, va + len), or
 * NULL (none, or its pages cannot be allocated); p->bo_lock held.
 */
static u8 *emu_bo_kaddr(struct kfd_process *p, u64 va, u64 len)
{
	struct emu_bo *bo;
	u8 *k;
	int id;

	idr_for_each_entry(&p->bo_idr, bo, id) {
		if (!bo->va || va < bo->va || va + len > bo->va + bo->size ||
		    !(bo->flags & (KFD_IOC_ALLOC_MEM_FLAGS_VRAM | KFD_IOC_ALLOC_MEM_FLAGS_GTT)))
			continue;
		k = emu_bo_backing(bo);
		return k ? k + (va - bo->va) : NULL;
	}
	return NULL;
}

int emu_gpu_access(struct kfd_process *p, u64 va, void *buf, u32 len, bool write)
{
	u8 *k;

	mutex_lock(&p->bo_lock);
	k = emu_bo_kaddr(p, va, len);
	if (k && write)
		memcpy(k, buf, len);
	else if (k)
		memcpy(buf, k, len);
	mutex_unlock(&p->bo_lock);
	if (k)
		return 0;
	if (write)
		return copy_to_user((void __user *)(uintptr_t)va, buf, len) ? -EFAULT : 0;
	return copy_from_user(buf, (void __user *)(uintptr_t)va, len) ? -EFAULT : 0;
}

/* An SDMA ATOMIC ADD64 on p's u64 at va (8-byte aligned), atomic against the CPU's own. */
int emu_gpu_add64(struct kfd_process *p, u64 va, s64 v)
{
	struct page *page;
	u8 *k;

	if (va % 8)
		return -EFAULT;
	mutex_lock(&p->bo_lock);
	k = emu_bo_kaddr(p, va, 8);
	if (k)
		atomic64_add(v, (atomic64_t *)k);
	mutex_unlock(&p->bo_lock);
	if (k)
		return 0;
	if (pin_user_pages_fast(va & PAGE_MASK, 1, FOLL_WRITE, &page) != 1)
		return -EFAULT;
	atomic64_add(v, (atomic64_t *)(page_address(page) + offset_in_page(va)));
	unpin_user_pages_dirty_lock(&page, 1, true);
	return 0;
}

/* kfd_ioctl_free_memory_of_gpu() (6.12.117): unknown gpu or handle -EINVAL, the event page -EPERM */
int kfd_ioctl_free_memory_of_gpu(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_free_memory_of_gpu_args *args = data;
	struct emu_bo *bo;
	int err = 0;

	mutex_lock(&p->mutex);
	bo = emu_bo_lookup(p, args->handle);
	if (!bo) {
		err = -EINVAL;
		goto out;
	}
	/* "Free signal BO is not allowed" */
	if (bo->kaddr && (void *)p->signal_page == bo->kaddr) {
		err = -EPERM;
		goto out;
	}
	mutex_lock(&p->bo_lock);
	idr_remove(&p->bo_idr, EMU_HANDLE_IDR(args->handle));
	mutex_unlock(&p->bo_lock);
	if (bo->flags & KFD_IOC_ALLOC_MEM_FLAGS_VRAM)
		p->vram_used[bo->gpu] -= bo->size;
	emu_bo_free(bo);
out:
	mutex_unlock(&p->mutex);
	return err;
}

/*
 * kfd_ioctl_map_memory_to_gpu() / kfd_ioctl_unmap_memory_from_gpu() (6.12.117): no devices or
 * n_success > n_devices -EINVAL, an unreadable id array -EFAULT, unknown handle gpu -EINVAL,
 * unknown object -ENOMEM (map) or -EINVAL (unmap), an unknown device in the array -EINVAL;
 * n_success counts the devices done, so a retry resumes there.
 */
static int emu_map_unmap(struct kfd_process *p, u64 handle, u64 ids_ptr, u32 n_devices,
			 u32 *n_success, bool map)
{
	struct kfd_process_device *peer;
	struct emu_bo *bo;
	u32 *ids, i;
	int err = 0;

	if (!n_devices || *n_success > n_devices)
		return -EINVAL;
	ids = memdup_user(u64_to_user_ptr(ids_ptr), array_size(n_devices, sizeof(u32)));
	if (IS_ERR(ids))
		return PTR_ERR(ids) == -ENOMEM ? -ENOMEM : -EFAULT;
	mutex_lock(&p->mutex);
	if (!kfd_process_device_data_by_id(p, EMU_HANDLE_GPU(handle))) {
		err = -EINVAL;
		goto out;
	}
	bo = emu_bo_lookup(p, handle);
	if (!bo) {
		err = map ? -ENOMEM : -EINVAL;
		goto out;
	}
	for (i = *n_success; i < n_devices; i++) {
		peer = kfd_process_device_data_by_id(p, ids[i]);
		if (!peer) {
			err = -EINVAL;
			goto out;
		}
		if (map)
			bo->mapped |= BIT(peer - p->pdds);
		else
			bo->mapped &= ~BIT(peer - p->pdds);
		*n_success = i + 1;
	}
out:
	mutex_unlock(&p->mutex);
	kfree(ids);
	return err;
}

int kfd_ioctl_map_memory_to_gpu(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_map_memory_to_gpu_args *args = data;

	return emu_map_unmap(p, args->handle, args->device_ids_array_ptr, args->n_devices,
			     &args->n_success, true);
}

int kfd_ioctl_unmap_memory_from_gpu(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_unmap_memory_from_gpu_args *args = data;

	return emu_map_unmap(p, args->handle, args->device_ids_array_ptr, args->n_devices,
			     &args->n_success, false);
}

/*
 * kfd_ioctl_get_available_memory() (6.12.117): unknown gpu -EINVAL; VRAM left to the process
 * (amdgpu_amdkfd_get_available_memory), here the topology's size less what it allocated.
 */
int kfd_ioctl_get_available_memory(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_get_available_memory_args *args = data;
	struct kfd_process_device *pdd;
	int err = 0;

	mutex_lock(&p->mutex);
	pdd = kfd_process_device_data_by_id(p, args->gpu_id);
	if (pdd)
		args->available = pdd->dev->vram_bytes - p->vram_used[pdd - p->pdds];
	else
		err = -EINVAL;
	mutex_unlock(&p->mutex);
	return err;
}

/*
 * kfd_ioctl_set_xnack_mode() (6.12.117): a negative value queries. The emulated GPU runs with
 * retry faults off (amdgpu's noretry), as gfx90a does by default: enabling XNACK is -EPERM
 * (kfd_process_xnack_mode() false), and with queues any change is -EBUSY.
 */
int kfd_ioctl_set_xnack_mode(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_set_xnack_mode_args *args = data;
	int err = 0;

	mutex_lock(&p->mutex);
	if (args->xnack_enabled >= 0) {
		if (!list_empty(&p->pqm.queues))
			err = -EBUSY;
		else if (args->xnack_enabled)
			err = -EPERM;
	} else {
		args->xnack_enabled = 0;
	}
	mutex_unlock(&p->mutex);
	return err;
}

/* The calling process's KFD process, referenced, from an mmap handler (kfd_processes_lock). */
static struct kfd_process *emu_process_of_current(void)
{
	struct kfd_process *p;

	spin_lock(&kfd_processes_lock);
	p = find_process_by_mm(current->mm);
	if (p)
		kref_get(&p->ref);
	spin_unlock(&kfd_processes_lock);
	return p;
}

/* the doorbell slice of a process on a GPU, allocated at its first mapping (p->bo_lock held) */
static void *emu_doorbells(struct kfd_process_device *pdd)
{
	if (!pdd->doorbells)
		pdd->doorbells = vmalloc_user(EMU_DOORBELL_SLICE);
	return pdd->doorbells;
}

/*
 * kfd_mmap() (6.12.117): the offset (vm_pgoff << PAGE_SHIFT) names the type and the gpu.
 * DOORBELL: exactly the process's 8 KiB doorbell slice of that GPU (-EINVAL otherwise, -ENODEV
 * for an unknown gpu): pages the emulated CP may read, where KFD maps the doorbell BAR
 * uncached. EVENTS: exactly the 32 KiB signal page (-EINVAL), when KFD allocated it. The
 * emulated GPUs have no reserved (APU CWSR) or MMIO remap memory: -ENODEV, as for a device
 * KFD does not find; any other type -EFAULT.
 */
int kfd_mmap(struct file *filp, struct vm_area_struct *vma)
{
	u64 offset = (u64)vma->vm_pgoff << PAGE_SHIFT, len = vma->vm_end - vma->vm_start;
	struct kfd_process_device *pdd = NULL;
	struct kfd_process *p;
	void *pages = NULL;
	int err;

#if EMU_SECONDARY_CONTEXTS
	/* 7.0 (4eb38fc0f1da): the file's context, which may be a secondary one */
	p = filp->private_data;
	if (p)
		kref_get(&p->ref);
#else
	p = emu_process_of_current();
#endif
	if (!p)
		return -EINVAL;
	if (KFD_MMAP_GET_GPU_ID(offset))
		pdd = kfd_process_device_data_by_id(p, KFD_MMAP_GET_GPU_ID(offset));
	mutex_lock(&p->bo_lock);
	switch (offset & KFD_MMAP_TYPE_MASK) {
	case KFD_MMAP_TYPE_DOORBELL:
		if (!pdd)
			err = -ENODEV;
		else if (len != EMU_DOORBELL_SLICE)
			err = -EINVAL;
		else
			err = (pages = emu_doorbells(pdd)) ? 0 : -ENOMEM;
		break;
	case KFD_MMAP_TYPE_EVENTS:
		if (len != KFD_SIGNAL_EVENT_LIMIT * 8)
			err = -EINVAL;
		else if (!p->signal_page_owned)
			err = -ENOMEM;	/* kfd_event_mmap: "Signal page not allocated" */
		else
			err = (pages = p->signal_page) ? 0 : -ENOMEM;
		break;
	case 0x1ULL << 62:	/* KFD_MMAP_TYPE_RESERVED_MEM */
	case 0x0ULL << 62:	/* KFD_MMAP_TYPE_MMIO */
		err = -ENODEV;
		break;
	default:
		err = -EFAULT;
	}
	if (!err)
		err = remap_vmalloc_range(vma, pages, 0);
	mutex_unlock(&p->bo_lock);
	kfd_unref_process(p);
	return err;
}

/*
 * amdgpu_emu's render node mmap (amdgpu_gem_mmap -> TTM, 6.12.117), mmap_lock held: the caller's
 * VRAM or GTT object at that offset, the whole mapping inside it; else -EACCES as
 * drm_gem_mmap answers an offset with no object (-EINVAL for a range past its end).
 */
int kfd_emu_render_mmap(unsigned int gpu, struct vm_area_struct *vma)
{
	u64 offset = (u64)vma->vm_pgoff << PAGE_SHIFT, len = vma->vm_end - vma->vm_start;
	struct kfd_process *p;
	struct emu_bo *bo, *found = NULL;
	int id, err;

	p = emu_process_of_current();
	if (!p)
		return -EACCES;
	mutex_lock(&p->bo_lock);
	idr_for_each_entry(&p->bo_idr, bo, id)
		if ((bo->flags & (KFD_IOC_ALLOC_MEM_FLAGS_VRAM | KFD_IOC_ALLOC_MEM_FLAGS_GTT)) &&
		    bo->gpu == gpu && offset >= bo->mmap_offset &&
		    offset < bo->mmap_offset + bo->size) {
			found = bo;
			break;
		}
	if (!found)
		err = -EACCES;
	else if (offset + len > found->mmap_offset + found->size)
		err = -EINVAL;
	else if (!emu_bo_backing(found))
		err = -ENOMEM;
	else
		err = remap_vmalloc_range(vma, found->kaddr, (offset - found->mmap_offset) >> PAGE_SHIFT);
	mutex_unlock(&p->bo_lock);
	kfd_unref_process(p);
	return err;
}
EXPORT_SYMBOL_GPL(kfd_emu_render_mmap);
