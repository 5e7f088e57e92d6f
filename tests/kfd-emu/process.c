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

/*
 * find_process_by_mm() (6.12.117): the process of an mm. Since 7.0 several contexts share an mm
 * and the lookup "always return[s] the primary context" (commit 3880d8e3c6ef of the
 * CREATE_PROCESS series): so do kfd_open's second open, a pid's lookup (DBG_TRAP) and the
 * control files.
 */
struct kfd_process *find_process_by_mm(const struct mm_struct *mm)
{
	struct kfd_process *p;

	list_for_each_entry(p, &kfd_processes_list, processes)
		if (p->mm == mm && kfd_process_is_primary(p))
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
#if EMU_SECONDARY_CONTEXTS
	/*
	 * kfd_process_wq_release() 7.0 (fac682a1d1af): a secondary gives its id back to its primary
	 * (kfd_process_free_id, with the 2026 fix of its inverted test: "if (process->context_id ==
	 * KFD_CONTEXT_ID_PRIMARY) return;"), a primary destroys its IDA.
	 */
	if (!kfd_process_is_primary(p))
		ida_free(&p->primary_process->id_table, p->context_id);
	else
		ida_destroy(&p->id_table);
#endif
	kfd_process_remove_sysfs(p);
#if EMU_SECONDARY_CONTEXTS
	if (p->primary_process)
		kfd_unref_process(p->primary_process);
#endif
	mmdrop(p->mm_grabbed);
	put_task_struct(p->lead_thread);
	kfree(p);
	module_put(THIS_MODULE);
}

/*
 * kfd_process_notifier_release_internal() (6.12.117): at exit_mmap the process leaves the table,
 * disables debugging of itself and of every process it debugs (resuming their queues: the
 * "debugger exit auto-resume"), and drops the notifier's reference. 7.0 (65cce2a172ff, "a
 * secondary context dies with its file") also calls it from kfd_release for a secondary, which
 * has no notifier.
 */
void kfd_process_notifier_release_internal(struct kfd_process *p)
{
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
	/* 7.0 (65cce2a172ff): only a primary has a notifier */
	if (kfd_process_is_primary(p))
		mmu_notifier_put(&p->mmu_notifier);
}

static void kfd_process_notifier_release(struct mmu_notifier *mn, struct mm_struct *mm)
{
	kfd_process_notifier_release_internal(container_of(mn, struct kfd_process, mmu_notifier));
}

static void kfd_process_free_notifier(struct mmu_notifier *mn)
{
	kfd_unref_process(container_of(mn, struct kfd_process, mmu_notifier));
}

static const struct mmu_notifier_ops kfd_process_mmu_notifier_ops = {
	.release = kfd_process_notifier_release,
	.free_notifier = kfd_process_free_notifier,
};

/*
 * create_process(thread, primary) (kfd_process.c; the primary argument and the export to
 * kfd_chardev.c since 7.0, cc6b66d661fd), under kfd_processes_mutex. A primary registers the
 * mm's notifier, which owns its first reference, and its sysfs directory; a secondary (7.0) has
 * no notifier (its first reference is its file's), takes an id from its primary's IDA
 * (kfd_process_alloc_id: 0..KFD_CONTEXT_ID_PRIMARY - 1) and gets its sysfs directory from the
 * CREATE_PROCESS ioctl.
 */
struct kfd_process *create_process(struct task_struct *thread, bool primary)
{
	struct kfd_process *p;
	unsigned int i;
	int err;
#if EMU_SECONDARY_CONTEXTS
	struct kfd_process *primary_process = NULL;

	if (!primary) {
		primary_process = find_process_by_mm(thread->mm);
		if (!primary_process)
			return ERR_PTR(-ESRCH);
	}
#else
	if (!primary)
		return ERR_PTR(-EINVAL);
#endif

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

#if EMU_SECONDARY_CONTEXTS
	if (!primary) {
		err = ida_alloc_range(&primary_process->id_table, 0, KFD_CONTEXT_ID_PRIMARY - 1,
				      GFP_KERNEL);
		if (err < 0) {
			pr_err("kfd_emu: Creating kfd process: failed to alloc an id\n");
			goto err_free;
		}
		p->context_id = err;
		kref_get(&primary_process->ref);
		p->primary_process = primary_process;
		spin_lock(&kfd_processes_lock);
		list_add(&p->processes, &kfd_processes_list);
		spin_unlock(&kfd_processes_lock);
		return p;	/* sysfs: kfd_ioctl_create_process */
	}
	p->context_id = KFD_CONTEXT_ID_PRIMARY;
	ida_init(&p->id_table);
#endif
	p->mmu_notifier.ops = &kfd_process_mmu_notifier_ops;
	err = mmu_notifier_register(&p->mmu_notifier, p->mm);
	if (err)
		goto err_free;
	spin_lock(&kfd_processes_lock);
	list_add(&p->processes, &kfd_processes_list);
	spin_unlock(&kfd_processes_lock);
	if (kfd_process_add_sysfs(p))
		pr_warn("kfd_emu: Creating procfs for pid %d failed\n", p->lead_thread->pid);
	return p;

err_free:
	mmdrop(p->mm_grabbed);
	put_task_struct(p->lead_thread);
	bitmap_free(p->pqm.queue_slot_bitmap);
	kfree(p);
	module_put(THIS_MODULE);
	return ERR_PTR(err);
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
		process = create_process(thread, true);
		if (!IS_ERR(process))
			kref_get(&process->ref);
	}
	mutex_unlock(&kfd_processes_mutex);
	mmput(mm);
	return process;
}
