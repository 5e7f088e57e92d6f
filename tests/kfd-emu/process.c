// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * Processes (kfd_process.c): the process list, lookups, creation at the first open of /dev/kfd
 * and teardown when the process's mm goes.
 *
 * Part of the KFD emulator, kfd_emu.ko: main.c describes it, README.md "Source files" maps it.
 */

#include "kfd_emu.h"

/* ---- processes (kfd_process.c) ---- */

DEFINE_MUTEX(kfd_processes_mutex);
LIST_HEAD(kfd_processes_list);
/*
 * Also guards kfd_processes_list's additions and removals, for lookups from mmap handlers:
 * they run under mmap_lock, which process creation takes under kfd_processes_mutex
 * (mmu_notifier_register), so they must not take that mutex (KFD looks up under SRCU).
 */
DEFINE_SPINLOCK(kfd_processes_lock);
static atomic_t pasid_counter = ATOMIC_INIT(0x8000);

struct kfd_process *find_process_by_mm(const struct mm_struct *mm)
{
	struct kfd_process *p;

	list_for_each_entry(p, &kfd_processes_list, processes)
		if (p->mm == mm)
			return p;
	return NULL;
}

/* kfd_lookup_process_by_pid() (6.12.117): referenced process of a pid, or NULL. */
struct kfd_process *kfd_lookup_process_by_pid(struct pid *pid)
{
	struct task_struct *task = get_pid_task(pid, PIDTYPE_PID);
	struct kfd_process *p = NULL;
	struct mm_struct *mm;

	if (!task)
		return NULL;
	mm = get_task_mm(task);
	put_task_struct(task);
	if (!mm)
		return NULL;
	mutex_lock(&kfd_processes_mutex);
	p = find_process_by_mm(mm);
	if (p)
		kref_get(&p->ref);
	mutex_unlock(&kfd_processes_mutex);
	mmput(mm);
	return p;
}

static void kfd_process_ref_release(struct kref *ref)
{
	struct kfd_process *p = container_of(ref, struct kfd_process, ref);

	INIT_WORK(&p->release_work, kfd_process_wq_release);
	queue_work(kfd_process_wq, &p->release_work);
}

void kfd_unref_process(struct kfd_process *p)
{
	kref_put(&p->ref, kfd_process_ref_release);
}

/*
 * Mirrors: void kfd_process_dequeue_from_all_devices(struct kfd_process *p) (6.12.117).
 */
__used noinline void kfd_process_dequeue_from_all_devices(struct kfd_process *p)
{
	int i;

	for (i = 0; i < p->n_pdds; i++)
		process_termination_cpsch(p->pdds[i].dev->dqm, &p->pdds[i].qpd);
}

/*
 * Mirrors: static void kfd_process_wq_release(struct work_struct *work) (6.12.117), on
 * kfd_process_wq: queues leave the GPUs, the pqm frees them, the sysfs directory goes.
 */
__used noinline void kfd_process_wq_release(struct work_struct *work)
{
	struct kfd_process *p = container_of(work, struct kfd_process, release_work);
	int i;

	kfd_process_dequeue_from_all_devices(p);
	pqm_uninit(&p->pqm);
	emu_process_free_events(p);
	emu_process_free_bos(p);
	for (i = 0; i < p->n_pdds; i++)
		vfree(p->pdds[i].doorbells);
	/* kfd_process_destroy_pdds(): the render node files ACQUIRE_VM took (before the sysfs
	 * directory goes, which is what "released" means to the tests)
	 */
	for (i = 0; i < p->n_pdds; i++)
		if (p->pdds[i].drm_file)
			fput(p->pdds[i].drm_file);
	kfd_process_remove_sysfs(p);
	mmdrop(p->mm_grabbed);
	put_task_struct(p->lead_thread);
	kfree(p);
	module_put(THIS_MODULE);
}

/*
 * kfd_process_notifier_release_internal() (6.12.117): at exit_mmap the process leaves the table,
 * disables debugging of itself and of every process it debugs (resuming their queues: the
 * "debugger exit auto-resume"), and drops the notifier's reference.
 */
static void kfd_process_notifier_release(struct mmu_notifier *mn, struct mm_struct *mm)
{
	struct kfd_process *p = container_of(mn, struct kfd_process, mmu_notifier);
	struct kfd_process *target, *refs[16];
	int n = 0, i;

	mutex_lock(&kfd_processes_mutex);
	spin_lock(&kfd_processes_lock);
	list_del_init(&p->processes);
	spin_unlock(&kfd_processes_lock);
	p->mm = NULL;
	if (atomic_read(&p->debugged_process_count) > 0) {
		list_for_each_entry(target, &kfd_processes_list, processes) {
			if (target->debugger_process == p && n < ARRAY_SIZE(refs)) {
				kref_get(&target->ref);
				refs[n++] = target;
			}
		}
	}
	mutex_unlock(&kfd_processes_mutex);

	mutex_lock(&p->mutex);
	kfd_dbg_trap_disable(p);
	mutex_unlock(&p->mutex);
	for (i = 0; i < n; i++) {
		mutex_lock_nested(&refs[i]->mutex, 1);
		if (refs[i]->debugger_process == p)
			kfd_dbg_trap_disable(refs[i]);
		mutex_unlock(&refs[i]->mutex);
		kfd_unref_process(refs[i]);
	}
	mmu_notifier_put(&p->mmu_notifier);
}

static void kfd_process_free_notifier(struct mmu_notifier *mn)
{
	kfd_unref_process(container_of(mn, struct kfd_process, mmu_notifier));
}

static const struct mmu_notifier_ops kfd_process_mmu_notifier_ops = {
	.release = kfd_process_notifier_release,
	.free_notifier = kfd_process_free_notifier,
};

struct kfd_process *create_process(struct task_struct *thread)
{
	struct kfd_process *p;
	unsigned int i;
	int err;

	p = kzalloc(sizeof(*p), GFP_KERNEL);
	if (!p)
		return ERR_PTR(-ENOMEM);
	p->pqm.queue_slot_bitmap = bitmap_zalloc(KFD_MAX_NUM_OF_QUEUES_PER_PROCESS, GFP_KERNEL);
	if (!p->pqm.queue_slot_bitmap) {
		kfree(p);
		return ERR_PTR(-ENOMEM);
	}
	if (!try_module_get(THIS_MODULE)) {
		bitmap_free(p->pqm.queue_slot_bitmap);
		kfree(p);
		return ERR_PTR(-ENODEV);
	}
	kref_init(&p->ref);	/* owned by the mmu notifier, dropped in free_notifier */
	mutex_init(&p->mutex);
	mutex_init(&p->event_mutex);
	sema_init(&p->runtime_enable_sema, 0);
	INIT_LIST_HEAD(&p->pqm.queues);
	idr_init(&p->bo_idr);
	mutex_init(&p->bo_lock);
	idr_init(&p->event_idr);
	mutex_init(&p->events_lock);
	init_waitqueue_head(&p->event_wq);
	p->pqm.process = p;
	p->mm = thread->mm;
	p->mm_grabbed = thread->mm;
	mmgrab(p->mm_grabbed);
	p->lead_thread = thread->group_leader;
	get_task_struct(p->lead_thread);
	p->pasid = atomic_inc_return(&pasid_counter);
	/* kfd_init_apertures(): one process-device per GPU from the start */
	for (i = 0; i < emu_num_nodes; i++) {
		struct kfd_process_device *pdd = &p->pdds[i];

		pdd->dev = &emu_nodes[i];
		pdd->process = p;
		pdd->qpd.dqm = emu_nodes[i].dqm;
		pdd->qpd.pqm = &p->pqm;
		INIT_LIST_HEAD(&pdd->qpd.queues_list);
		INIT_LIST_HEAD(&pdd->qpd.dqm_list);
	}
	p->n_pdds = emu_num_nodes;

	p->mmu_notifier.ops = &kfd_process_mmu_notifier_ops;
	err = mmu_notifier_register(&p->mmu_notifier, p->mm);
	if (err) {
		mmdrop(p->mm_grabbed);
		put_task_struct(p->lead_thread);
		bitmap_free(p->pqm.queue_slot_bitmap);
		kfree(p);
		module_put(THIS_MODULE);
		return ERR_PTR(err);
	}
	spin_lock(&kfd_processes_lock);
	list_add(&p->processes, &kfd_processes_list);
	spin_unlock(&kfd_processes_lock);
	if (kfd_process_add_sysfs(p))
		pr_warn("kfd_emu: Creating procfs for pid %d failed\n", p->lead_thread->pid);
	return p;
}

/*
 * Mirrors: struct kfd_process *kfd_create_process(struct task_struct *thread) (6.12.117): from
 * kfd_open (thread = current) or from DBG_TRAP ENABLE for a ptraced target; finds the process
 * of thread's mm or creates it (sysfs proc/<pid>). Returns a referenced process.
 */
__used noinline struct kfd_process *kfd_create_process(struct task_struct *thread)
{
	struct kfd_process *process;
	struct mm_struct *mm = get_task_mm(thread);

	if (!mm)
		return ERR_PTR(-EINVAL);
	if (thread->group_leader->mm != mm) {
		mmput(mm);
		return ERR_PTR(-EINVAL);
	}
	mutex_lock(&kfd_processes_mutex);
	process = find_process_by_mm(mm);
	if (process) {
		kref_get(&process->ref);
	} else {
		process = create_process(thread);
		if (!IS_ERR(process))
			kref_get(&process->ref);
	}
	mutex_unlock(&kfd_processes_mutex);
	mmput(mm);
	return process;
}
