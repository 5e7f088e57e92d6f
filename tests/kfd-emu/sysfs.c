// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * sysfs: /sys/class/kfd/kfd/proc/<pid>/ (kfd_process.c's procfs part) and the emulator's control
 * files /sys/kernel/kfd_emu/{evict,restore,cp_stats}.
 *
 * Part of the KFD emulator, kfd_emu.ko: main.c describes it, README.md "Source files" maps it.
 */

#include "kfd_emu.h"

/* ---- sysfs (kfd_process.c procfs part, 6.12.117 formats) ---- */

static void kfd_procfs_kobj_release(struct kobject *kobj)
{
}

static ssize_t kfd_procfs_queue_show(struct kobject *kobj, struct attribute *attr, char *buffer)
{
	struct queue *q = container_of(kobj, struct queue, kobj);

	/* no trailing newline, as kfd_procfs_queue_show() */
	if (!strcmp(attr->name, "size"))
		return sysfs_emit(buffer, "%llu", q->properties.queue_size);
	if (!strcmp(attr->name, "type"))
		return sysfs_emit(buffer, "%d", q->properties.type);
	if (!strcmp(attr->name, "gpuid"))
		return sysfs_emit(buffer, "%u", q->device->id);
	return 0;
}

static struct attribute attr_queue_size = { .name = "size", .mode = 0444 };
static struct attribute attr_queue_type = { .name = "type", .mode = 0444 };
static struct attribute attr_queue_gpuid = { .name = "gpuid", .mode = 0444 };
static struct attribute *procfs_queue_attrs[] = {
	&attr_queue_size, &attr_queue_type, &attr_queue_gpuid, NULL
};
ATTRIBUTE_GROUPS(procfs_queue);

static const struct sysfs_ops procfs_queue_ops = { .show = kfd_procfs_queue_show };
static struct kobj_type procfs_queue_type = {
	.release = kfd_procfs_kobj_release,
	.sysfs_ops = &procfs_queue_ops,
	.default_groups = procfs_queue_groups,
};

int kfd_procfs_add_queue(struct queue *q)
{
	int ret = kobject_init_and_add(&q->kobj, &procfs_queue_type, q->process->kobj_queues, "%u",
				       q->properties.queue_id);

	if (ret < 0) {
		pr_warn("kfd_emu: Creating proc/<pid>/queues/%u failed\n", q->properties.queue_id);
		kobject_put(&q->kobj);
	}
	return ret;
}

void kfd_procfs_del_queue(struct queue *q)
{
	kobject_del(&q->kobj);
	kobject_put(&q->kobj);
}

/*
 * stats_<gpuid>/cu_occupancy: kfd_get_cu_occupancy() (6.12.117) reads the waves in flight from
 * the hardware and prints the CUs they occupy ("%d\n"). Here the state the emulated CP published
 * (emu_cp_occupied_by: lock-free, neither waking the CP thread nor waiting for it): a running
 * dispatch holds every CU of the node (its partition's CUs), a preempted one none.
 */
static int emu_cu_occupancy(struct kfd_process_device *pdd)
{
	return emu_cp_occupied_by(pdd->dev->dqm, pdd->process) ? pdd->dev->cu_count : 0;
}

static ssize_t kfd_procfs_show(struct kobject *kobj, struct attribute *attr, char *buffer)
{
	struct kfd_process_device *pdd;

	if (!strcmp(attr->name, "pasid")) {
#if EMU_SECONDARY_CONTEXTS
		/*
		 * 6.14+ (8544374c0f82, "Have kfd driver use same PASID values from graphic driver"):
		 * the PASID is per device (kfd_process_device), and kfd_procfs_show keeps the file but
		 * prints 0 ("%d\n", 0), for tools that read it (docs/kfd.md §4.1). The 7.x build only:
		 * older builds mirror 6.12.117.
		 */
		return sysfs_emit(buffer, "%d\n", 0);
#else
		struct kfd_process *p = container_of(attr, struct kfd_process, attr_pasid);

		return sysfs_emit(buffer, "%d\n", p->pasid);
#endif
	}
	if (!strncmp(attr->name, "vram_", 5))
		return sysfs_emit(buffer, "%llu\n", 0ULL);	/* the emulator allocates no VRAM */
	if (!strncmp(attr->name, "sdma_", 5))
		return sysfs_emit(buffer, "%llu\n", 0ULL);	/* no SDMA activity accounting */
	if (!strcmp(attr->name, "cu_occupancy")) {
		pdd = container_of(attr, struct kfd_process_device, attr_cu_occupancy);
		return sysfs_emit(buffer, "%d\n", emu_cu_occupancy(pdd));
	}
	if (!strcmp(attr->name, "evicted_ms")) {
		pdd = container_of(attr, struct kfd_process_device, attr_evict);
		return sysfs_emit(buffer, "%llu\n",
				  (u64)jiffies64_to_msecs(atomic64_read(&pdd->evict_duration_counter)));
	}
	return 0;
}

static const struct sysfs_ops kfd_procfs_ops = { .show = kfd_procfs_show };
static struct kobj_type procfs_type = {
	.release = kfd_procfs_kobj_release,
	.sysfs_ops = &kfd_procfs_ops,
};

static void kfd_sysfs_init_attr(struct attribute *attr, const char *name)
{
	sysfs_attr_init(attr);
	attr->name = name;
	attr->mode = 0444;
}

/*
 * kfd_create_process_sysfs() (kfd_process.c): proc/<pid>/ for a primary; for a secondary (7.0,
 * fac682a1d1af) the same files in its primary's directory as context_<context_id>/, so queues
 * of a secondary are proc/<pid>/context_<id>/queues/<queue id>/ (ids per context).
 */
int kfd_process_add_sysfs(struct kfd_process *p)
{
	int i, ret;

	p->kobj = kzalloc(sizeof(*p->kobj), GFP_KERNEL);
	if (!p->kobj)
		return -ENOMEM;
#if EMU_SECONDARY_CONTEXTS
	if (!kfd_process_is_primary(p) && !p->primary_process->kobj)
		ret = -ESRCH;	/* upstream: no primary found by mm */
	else if (!kfd_process_is_primary(p))
		ret = kobject_init_and_add(p->kobj, &procfs_type, p->primary_process->kobj,
					   "context_%u", p->context_id);
	else
#endif
		ret = kobject_init_and_add(p->kobj, &procfs_type, procfs_kobj, "%d",
					   (int)p->lead_thread->pid);
	if (ret) {
		kobject_put(p->kobj);
		kfree(p->kobj);
		p->kobj = NULL;
		return ret;
	}
	kfd_sysfs_init_attr(&p->attr_pasid, "pasid");
	ret = sysfs_create_file(p->kobj, &p->attr_pasid);
	p->kobj_queues = kobject_create_and_add("queues", p->kobj);
	if (!p->kobj_queues)
		return -ENOMEM;
	for (i = 0; i < p->n_pdds; i++) {
		struct kfd_process_device *pdd = &p->pdds[i];

		snprintf(pdd->vram_name, sizeof(pdd->vram_name), "vram_%u", pdd->dev->id);
		snprintf(pdd->sdma_name, sizeof(pdd->sdma_name), "sdma_%u", pdd->dev->id);
		snprintf(pdd->stats_name, sizeof(pdd->stats_name), "stats_%u", pdd->dev->id);
		kfd_sysfs_init_attr(&pdd->attr_vram, pdd->vram_name);
		kfd_sysfs_init_attr(&pdd->attr_sdma, pdd->sdma_name);
		kfd_sysfs_init_attr(&pdd->attr_evict, "evicted_ms");
		kfd_sysfs_init_attr(&pdd->attr_cu_occupancy, "cu_occupancy");
		ret |= sysfs_create_file(p->kobj, &pdd->attr_vram);
		ret |= sysfs_create_file(p->kobj, &pdd->attr_sdma);
		pdd->kobj_stats = kzalloc(sizeof(*pdd->kobj_stats), GFP_KERNEL);
		if (!pdd->kobj_stats)
			return -ENOMEM;
		if (kobject_init_and_add(pdd->kobj_stats, &procfs_type, p->kobj, "%s",
					 pdd->stats_name)) {
			kobject_put(pdd->kobj_stats);
			kfree(pdd->kobj_stats);
			pdd->kobj_stats = NULL;
			return -ENOMEM;
		}
		ret |= sysfs_create_file(pdd->kobj_stats, &pdd->attr_evict);
		ret |= sysfs_create_file(pdd->kobj_stats, &pdd->attr_cu_occupancy);
	}
	return ret ? -ENOMEM : 0;
}

void kfd_process_remove_sysfs(struct kfd_process *p)
{
	int i;

	if (!p->kobj)
		return;
	for (i = 0; i < p->n_pdds; i++) {
		struct kfd_process_device *pdd = &p->pdds[i];

		sysfs_remove_file(p->kobj, &pdd->attr_vram);
		sysfs_remove_file(p->kobj, &pdd->attr_sdma);
		if (pdd->kobj_stats) {
			sysfs_remove_file(pdd->kobj_stats, &pdd->attr_evict);
			sysfs_remove_file(pdd->kobj_stats, &pdd->attr_cu_occupancy);
			kobject_del(pdd->kobj_stats);
			kobject_put(pdd->kobj_stats);
			kfree(pdd->kobj_stats);
			pdd->kobj_stats = NULL;
		}
	}
	sysfs_remove_file(p->kobj, &p->attr_pasid);
	if (p->kobj_queues) {
		kobject_del(p->kobj_queues);
		kobject_put(p->kobj_queues);
		p->kobj_queues = NULL;
	}
	kobject_del(p->kobj);
	kobject_put(p->kobj);
	kfree(p->kobj);
	p->kobj = NULL;
}

/* ---- control files: /sys/kernel/kfd_emu/{evict,restore} ---- */

struct emu_evict_work {
	struct work_struct work;
	struct kfd_process *p;
	bool evict;
	int ret;
};

/* Like evict_process_worker / restore_process_worker: TTM evictions run in a kworker. */
static void emu_evict_worker(struct work_struct *work)
{
	struct emu_evict_work *w = container_of(work, struct emu_evict_work, work);

	if (w->evict)
		w->ret = kfd_process_evict_queues(w->p, KFD_QUEUE_EVICTION_TRIGGER_TTM);
	else
		w->ret = kfd_process_restore_queues(w->p);
}

static ssize_t emu_evict_store_common(const char *buf, size_t count, bool evict)
{
	struct emu_evict_work w = { .evict = evict };
	struct kfd_process *p, *found = NULL;
	int pid, err;

	err = kstrtoint(buf, 10, &pid);
	if (err)
		return err;
	mutex_lock(&kfd_processes_mutex);
	list_for_each_entry(p, &kfd_processes_list, processes) {
		if (p->lead_thread->pid == pid && kfd_process_is_primary(p)) {
			found = p;
			kref_get(&p->ref);
			break;
		}
	}
	mutex_unlock(&kfd_processes_mutex);
	if (!found)
		return -ESRCH;
	w.p = found;
	INIT_WORK_ONSTACK(&w.work, emu_evict_worker);
	schedule_work(&w.work);
	flush_work(&w.work);
	destroy_work_on_stack(&w.work);
	kfd_unref_process(found);
	return w.ret ? w.ret : count;
}

static ssize_t evict_store(struct kobject *kobj, struct kobj_attribute *attr, const char *buf,
			   size_t count)
{
	return emu_evict_store_common(buf, count, true);
}

static ssize_t restore_store(struct kobject *kobj, struct kobj_attribute *attr, const char *buf,
			     size_t count)
{
	return emu_evict_store_common(buf, count, false);
}

/*
 * stuck_queue (0200, emulator-only): write "<pid> <queue id>" to make that compute queue ignore
 * preemption, as a queue whose waves do not reach a save point: at the next unmap the MEC
 * abandons its save and logs it, and KFD resets it alone (queues.c, reset_queues_on_hws_hang).
 * ESRCH: no such process; EINVAL: no such compute queue, or already reset.
 */
static ssize_t stuck_queue_store(struct kobject *kobj, struct kobj_attribute *attr,
				 const char *buf, size_t count)
{
	struct process_queue_node *pqn;
	struct kfd_process *p, *found = NULL;
	int pid, err = -EINVAL;
	unsigned int qid;

	if (sscanf(buf, "%d %u", &pid, &qid) != 2)
		return -EINVAL;
	mutex_lock(&kfd_processes_mutex);
	list_for_each_entry(p, &kfd_processes_list, processes) {
		if (p->lead_thread->pid == pid && kfd_process_is_primary(p)) {
			found = p;
			kref_get(&p->ref);
			break;
		}
	}
	mutex_unlock(&kfd_processes_mutex);
	if (!found)
		return -ESRCH;
	mutex_lock(&found->mutex);
	pqn = get_queue_by_qid(&found->pqm, qid);
	if (pqn && pqn->q->properties.type == KFD_QUEUE_TYPE_COMPUTE &&
	    !pqn->q->properties.is_reset) {
		struct device_queue_manager *dqm = pqn->q->device->dqm;

		mutex_lock(&dqm->hw_lock);
		pqn->q->stuck = true;
		mutex_unlock(&dqm->hw_lock);
		err = 0;
	}
	mutex_unlock(&found->mutex);
	kfd_unref_process(found);
	return err ? err : count;
}

struct kobj_attribute stuck_queue_attr = __ATTR_WO(stuck_queue);

/*
 * cp_stats: what each emulated CP executed since the module loaded, one line per GPU
 * ("gpu_id 4096 dispatches N kernels N barriers_and N barriers_or N barriers_value N pm4_ibs N signals N interrupts N
 * events_set N errors N sdma_copies N sdma_bytes N ... sdma_timestamps N"): the exact counts the
 * ROCm tests assert. Emulator-only (no KFD file).
 */
static ssize_t cp_stats_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	unsigned int i;
	int offs = 0;

	for (i = 0; i < emu_num_nodes; i++) {
		struct device_queue_manager *dqm = &emu_dqms[i];

		mutex_lock(&dqm->hw_lock);
		offs += sysfs_emit_at(buf, offs,
				      "gpu_id %u dispatches %llu kernels %llu barriers_and %llu barriers_or %llu barriers_value %llu pm4_ibs %llu signals %llu interrupts %llu events_set %llu errors %llu sdma_copies %llu sdma_bytes %llu sdma_fills %llu sdma_fences %llu sdma_traps %llu sdma_atomics %llu sdma_polls %llu sdma_timestamps %llu\n",
				      emu_nodes[i].id, dqm->stats.dispatches, dqm->stats.kernels,
				      dqm->stats.barriers_and, dqm->stats.barriers_or,
				      dqm->stats.barriers_value, dqm->stats.pm4_ibs,
				      dqm->stats.signals, dqm->stats.interrupts,
				      dqm->stats.events_set, dqm->stats.errors, dqm->stats.sdma_copies,
				      dqm->stats.sdma_bytes, dqm->stats.sdma_fills, dqm->stats.sdma_fences,
				      dqm->stats.sdma_traps, dqm->stats.sdma_atomics, dqm->stats.sdma_polls,
				      dqm->stats.sdma_timestamps);
		mutex_unlock(&dqm->hw_lock);
	}
	return offs;
}

struct kobj_attribute cp_stats_attr = __ATTR_RO(cp_stats);
struct kobj_attribute evict_attr = __ATTR_WO(evict);
struct kobj_attribute restore_attr = __ATTR_WO(restore);
