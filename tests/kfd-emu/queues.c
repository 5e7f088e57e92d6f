// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * Queues: the device queue manager (kfd_device_queue_manager.c: HWS map/unmap with the preemption
 * fence, queue create/destroy/update, process eviction and restore, suspend/resume), SMI
 * eviction events with process-wide eviction (kfd_smi_events.c, kfd_process.c), and the process
 * queue manager (kfd_process_queue_manager.c).
 *
 * Part of the KFD emulator, kfd_emu.ko: main.c describes it, README.md "Source files" maps it.
 */

#include "kfd_emu.h"

/* ---- device queue manager (kfd_device_queue_manager.c) ---- */

/*
 * Mirrors: int amdkfd_fence_wait_timeout(struct device_queue_manager *dqm, uint64_t fence_value,
 *                                        unsigned int timeout_ms)   (Linux 6.12.117)
 * Polls the fence the CP writes when the preemption is done; -ETIME after timeout_ms
 * ("qcm fence wait loop timeout expired").
 */
__used noinline int amdkfd_fence_wait_timeout(struct device_queue_manager *dqm, u64 fence_value,
					      unsigned int timeout_ms)
{
	unsigned long end_jiffies = msecs_to_jiffies(timeout_ms) + jiffies;

	while (READ_ONCE(*dqm->fence_addr) != fence_value) {
		if (time_after(jiffies, end_jiffies)) {
			pr_err("kfd_emu: qcm fence wait loop timeout expired\n");
			return -ETIME;
		}
		usleep_range(50, 100);
	}
	return 0;
}

/*
 * Mirrors: void kfd_signal_reset_event(struct kfd_node *dev) (kfd_events.c 6.12), the probe
 * point of a reset: after a per-queue reset only the processes with a reset queue
 * (pdd->has_reset_queue) are told, each with "Queues reset on process %s tid %d thread %s pid %d"
 * (drm_err). The HW exception events it sets (memory-lost / reset cause) are not emulated.
 */
__used noinline void kfd_signal_reset_event(struct kfd_node *dev)
{
	struct kfd_process *p;

	mutex_lock(&kfd_processes_mutex);
	list_for_each_entry(p, &kfd_processes_list, processes) {
		struct kfd_process_device *pdd = kfd_process_device_data_by_id(p, dev->id);

		if (pdd && pdd->has_reset_queue)
			pr_err("kfd_emu: Queues reset on process %s tid %d thread %s pid %d\n",
			       p->lead_thread->comm, p->lead_thread->tgid, p->lead_thread->comm,
			       p->lead_thread->pid);
	}
	mutex_unlock(&kfd_processes_mutex);
}

/*
 * Mirrors: static void set_queue_as_reset(struct device_queue_manager *dqm, struct queue *q,
 *     struct qcm_process_device *qpd) (kfd_device_queue_manager.c 6.12, "drm/amdkfd: support
 * per-queue reset on gfx9"): dev_err "queue id 0x%0x at pasid 0x%0x is reset", the process
 * device has a reset queue, the queue leaves the active count. Global and noinline here so that a
 * tracer can see the reset (in the kernel it is static). The emulated HQD reset also drops the
 * queue's dispatch (its waves are killed) and the CP never serves the queue again (is_reset, as
 * later kernels mark it; 6.12 would map it again at the next runlist, whose state the reset
 * lost: README "Per-queue reset").
 */
__used noinline void set_queue_as_reset(struct device_queue_manager *dqm, struct queue *q,
					struct qcm_process_device *qpd)
{
	struct kfd_process_device *pdd = qpd_to_pdd(qpd);

	pr_err("kfd_emu: queue id 0x%0x at pasid 0x%0x is reset\n", q->properties.queue_id,
	       q->process->pasid);
	pdd->has_reset_queue = true;
	q->properties.is_reset = true;
	if (q->properties.is_active) {
		q->properties.is_active = false;
		dqm->active_queue_count--;
	}
	mutex_lock(&dqm->hw_lock);
	q->preempt_failed = false;
	q->stuck = false;
	emu_cp_forget(dqm, q);
	mutex_unlock(&dqm->hw_lock);
}

/*
 * reset_queues_on_hws_hang() (kfd_device_queue_manager.c 6.12), after a fence that came in time:
 * check_preemption_failed() finds the doorbells the MEC logged for queues that did not answer
 * the unmap; each such queue is reset alone (set_queue_as_reset) and the processes concerned are
 * told (kfd_signal_reset_event). The unmap then succeeds: the SUSPEND_QUEUES reply carries no
 * error for the reset queue (suspend_queues() marks ERROR only when execute_queues_cpsch fails)
 * and the other queues are suspended normally. 0, or -ETIME if none was found (never here).
 */
static int reset_queues_on_hws_hang(struct device_queue_manager *dqm)
{
	struct qcm_process_device *qpd;
	struct queue *q;
	int reset = 0;

	list_for_each_entry(qpd, &dqm->queues, dqm_list) {
		list_for_each_entry(q, &qpd->queues_list, list) {
			if (!READ_ONCE(q->preempt_failed))
				continue;
			set_queue_as_reset(dqm, q, qpd);
			reset++;
		}
	}
	if (reset)
		kfd_signal_reset_event(dqm->dev);
	return 0;
}

/*
 * Mirrors: static int unmap_queues_cpsch(struct device_queue_manager *dqm,
 *     enum kfd_unmap_queues_filter filter, uint32_t filter_param, uint32_t grace_period,
 *     bool reset)
 * (6.12.117). Nothing to do without an active runlist; otherwise UNMAP_QUEUES of every dynamic
 * queue of every process on this GPU, then wait for the fence. grace_period is accepted and,
 * like the SCH_WAVE wait it programs on real HWS, has no emulated effect.
 */
__used noinline int unmap_queues_cpsch(struct device_queue_manager *dqm,
				       enum kfd_unmap_queues_filter filter,
				       u32 filter_param, u32 grace_period, bool reset)
{
	struct qcm_process_device *qpd;
	struct queue *q;
	int retval;

	if (!dqm->active_runlist)
		return 0;

	mutex_lock(&dqm->hw_lock);
	WRITE_ONCE(*dqm->fence_addr, KFD_FENCE_INIT);
	dqm->fence_pending_value = KFD_FENCE_COMPLETED;
	dqm->unmap_at_ns = ktime_get_ns();
	dqm->preempt_deadline_ns = dqm->unmap_at_ns + (u64)preempt_delay_us * NSEC_PER_USEC;
	dqm->preempt_applied = false;
	dqm->preempt_pending = true;
	emu_cp_publish(dqm);	/* cu_occupancy: no wave runs from the unmap on */
	mutex_unlock(&dqm->hw_lock);
	emu_cp_kick(dqm);

	retval = amdkfd_fence_wait_timeout(dqm, KFD_FENCE_COMPLETED, queue_preemption_timeout_ms);
	if (!retval)
		retval = reset_queues_on_hws_hang(dqm);
	if (retval) {
		/* Real KFD calls kfd_hws_hang() (GPU reset) here; the emulator drops the runlist */
		pr_err("kfd_emu: The cp might be in an unrecoverable state due to an unsuccessful queues preemption\n");
		mutex_lock(&dqm->hw_lock);
		if (!dqm->preempt_applied)
			emu_cp_preempt(dqm, dqm->unmap_at_ns);
		dqm->preempt_pending = false;
		dqm->cp_mapped = false;
		list_for_each_entry(qpd, &dqm->queues, dqm_list)
			list_for_each_entry(q, &qpd->queues_list, list)
				q->hw_mapped = false;
		mutex_unlock(&dqm->hw_lock);
	}
	dqm->active_runlist = false;
	return retval;
}

/*
 * Mirrors: static int map_queues_cpsch(struct device_queue_manager *dqm) (6.12.117):
 * no-op without active queues or with a runlist already active; else submit a runlist of every
 * active queue on the GPU.
 */
__used noinline int map_queues_cpsch(struct device_queue_manager *dqm)
{
	struct qcm_process_device *qpd;
	struct queue *q;

	if (dqm->active_queue_count == 0 || dqm->processes_count == 0)
		return 0;
	if (dqm->active_runlist)
		return 0;

	mutex_lock(&dqm->hw_lock);
	list_for_each_entry(qpd, &dqm->queues, dqm_list)
		list_for_each_entry(q, &qpd->queues_list, list)
			q->hw_mapped = q->properties.is_active;
	/* the CP loads the runlist and restores the saved waves before anything runs */
	dqm->now_ns = max(dqm->now_ns, ktime_get_ns());
	dqm->stall_until_ns = dqm->now_ns + (u64)restore_delay_us * NSEC_PER_USEC;
	dqm->cp_mapped = true;
	dqm->active_runlist = true;
	mutex_unlock(&dqm->hw_lock);
	emu_cp_kick(dqm);
	return 0;
}

/*
 * Mirrors: static int execute_queues_cpsch(struct device_queue_manager *dqm,
 *     enum kfd_unmap_queues_filter filter, uint32_t filter_param, uint32_t grace_period) (6.12.117)
 * = unmap (device-wide) then map the active queues again.
 */
__used noinline int execute_queues_cpsch(struct device_queue_manager *dqm,
					 enum kfd_unmap_queues_filter filter,
					 u32 filter_param, u32 grace_period)
{
	int retval;

	retval = unmap_queues_cpsch(dqm, filter, filter_param, grace_period, false);
	if (!retval)
		retval = map_queues_cpsch(dqm);
	return retval;
}

static void increment_queue_count(struct device_queue_manager *dqm, struct queue *q)
{
	dqm->active_queue_count++;
}

static void decrement_queue_count(struct device_queue_manager *dqm, struct queue *q)
{
	dqm->active_queue_count--;
}

/* register_process(): the qpd joins dqm->queues (under hw_lock: the CP thread walks it). */
static void dqm_register_process(struct device_queue_manager *dqm, struct qcm_process_device *qpd)
{
	if (qpd->registered)
		return;
	mutex_lock(&dqm->hw_lock);
	list_add(&qpd->dqm_list, &dqm->queues);
	mutex_unlock(&dqm->hw_lock);
	qpd->registered = true;
	dqm->processes_count++;
}

static void dqm_unregister_process(struct device_queue_manager *dqm, struct qcm_process_device *qpd)
{
	if (!qpd->registered)
		return;
	mutex_lock(&dqm->hw_lock);
	list_del(&qpd->dqm_list);
	mutex_unlock(&dqm->hw_lock);
	qpd->registered = false;
	dqm->processes_count--;
}

/*
 * Mirrors: static int create_queue_cpsch(struct device_queue_manager *dqm, struct queue *q,
 *     struct qcm_process_device *qpd, const struct kfd_criu_queue_priv_data *qd,
 *     const void *restore_mqd, const void *restore_ctl_stack) (6.12.117):
 * a queue of an evicted process starts evicted; an active queue triggers execute_queues_cpsch.
 */
__used noinline int create_queue_cpsch(struct device_queue_manager *dqm, struct queue *q,
				       struct qcm_process_device *qpd, const void *qd,
				       const void *restore_mqd, const void *restore_ctl_stack)
{
	int retval = 0;

	dqm_lock(dqm);
	dqm_register_process(dqm, qpd);
	q->properties.is_evicted = !!qpd->evicted;
	q->properties.is_active = QUEUE_IS_ACTIVE(q->properties);
	mutex_lock(&dqm->hw_lock);
	list_add(&q->list, &qpd->queues_list);
	mutex_unlock(&dqm->hw_lock);
	qpd->queue_count++;
	if (q->properties.is_active) {
		increment_queue_count(dqm, q);
		retval = execute_queues_cpsch(dqm, KFD_UNMAP_QUEUES_FILTER_DYNAMIC_QUEUES, 0,
					      USE_DEFAULT_GRACE_PERIOD);
	}
	dqm_unlock(dqm);
	return retval;
}

/*
 * wait_on_destroy_queue() (6.12.117): destroying a suspended queue of a debug-enabled process
 * blocks (interruptibly) until the debugger resumes it.
 */
static int wait_on_destroy_queue(struct device_queue_manager *dqm, struct queue *q)
{
	struct kfd_process *p = q->process;
	int ret = 0;

	q->properties.is_being_destroyed = true;
	if (p->debug_trap_enabled && q->properties.is_suspended) {
		dqm_unlock(dqm);
		mutex_unlock(&p->mutex);
		ret = wait_event_interruptible(dqm->destroy_wait, !q->properties.is_suspended);
		mutex_lock(&p->mutex);
		dqm_lock(dqm);
	}
	return ret;
}

/*
 * Mirrors: static int destroy_queue_cpsch(struct device_queue_manager *dqm,
 *     struct qcm_process_device *qpd, struct queue *q) (6.12.117)
 */
__used noinline int destroy_queue_cpsch(struct device_queue_manager *dqm,
					struct qcm_process_device *qpd,
					struct queue *q)
{
	int retval;

	dqm_lock(dqm);
	retval = wait_on_destroy_queue(dqm, q);
	if (retval) {
		q->properties.is_being_destroyed = false;
		dqm_unlock(dqm);
		return retval;
	}
	mutex_lock(&dqm->hw_lock);
	list_del(&q->list);
	emu_cp_forget(dqm, q);
	mutex_unlock(&dqm->hw_lock);
	qpd->queue_count--;
	if (q->properties.is_active) {
		decrement_queue_count(dqm, q);
		retval = execute_queues_cpsch(dqm, KFD_UNMAP_QUEUES_FILTER_DYNAMIC_QUEUES, 0,
					      USE_DEFAULT_GRACE_PERIOD);
		/* -ETIME: real KFD still frees the queue (pqm_destroy_queue ignores it) */
		if (retval == -ETIME)
			retval = 0;
	}
	if (list_empty(&qpd->queues_list))
		dqm_unregister_process(dqm, qpd);
	dqm_unlock(dqm);
	return retval;
}

/* update_queue(): an active queue is unmapped while its properties change, then remapped. */
int dqm_update_queue(struct device_queue_manager *dqm, struct queue *q)
{
	bool prev_active;
	int retval = 0;

	dqm_lock(dqm);
	prev_active = q->properties.is_active;
	if (prev_active)
		retval = unmap_queues_cpsch(dqm, KFD_UNMAP_QUEUES_FILTER_DYNAMIC_QUEUES, 0,
					    USE_DEFAULT_GRACE_PERIOD, false);
	q->properties.is_active = QUEUE_IS_ACTIVE(q->properties);
	if (q->properties.is_active && !prev_active)
		increment_queue_count(dqm, q);
	else if (!q->properties.is_active && prev_active)
		decrement_queue_count(dqm, q);
	if (!retval)
		retval = map_queues_cpsch(dqm);
	dqm_unlock(dqm);
	return retval;
}

/*
 * Mirrors: static int evict_process_queues_cpsch(struct device_queue_manager *dqm,
 *     struct qcm_process_device *qpd) (6.12.117): counted (only the first eviction acts), marks
 * every queue evicted, deactivates the active ones, execute_queues_cpsch.
 */
__used noinline int evict_process_queues_cpsch(struct device_queue_manager *dqm,
					       struct qcm_process_device *qpd)
{
	struct queue *q;
	int retval = 0;

	dqm_lock(dqm);
	if (qpd->evicted++ > 0)
		goto out;
	list_for_each_entry(q, &qpd->queues_list, list) {
		q->properties.is_evicted = true;
		if (!q->properties.is_active)
			continue;
		q->properties.is_active = false;
		decrement_queue_count(dqm, q);
	}
	qpd_to_pdd(qpd)->last_evict_timestamp = get_jiffies_64();
	retval = execute_queues_cpsch(dqm, KFD_UNMAP_QUEUES_FILTER_DYNAMIC_QUEUES, 0,
				      USE_DEFAULT_GRACE_PERIOD);
out:
	dqm_unlock(dqm);
	return retval;
}

/*
 * Mirrors: static int restore_process_queues_cpsch(struct device_queue_manager *dqm,
 *     struct qcm_process_device *qpd) (6.12.117): the last restore reactivates queues and adds the
 * eviction time to stats_<gpuid>/evicted_ms.
 */
__used noinline int restore_process_queues_cpsch(struct device_queue_manager *dqm,
						 struct qcm_process_device *qpd)
{
	struct kfd_process_device *pdd = qpd_to_pdd(qpd);
	struct queue *q;
	int retval = 0;

	dqm_lock(dqm);
	if (WARN_ON_ONCE(!qpd->evicted))
		goto out;
	if (qpd->evicted > 1) {
		qpd->evicted--;
		goto out;
	}
	list_for_each_entry(q, &qpd->queues_list, list) {
		q->properties.is_evicted = false;
		if (!QUEUE_IS_ACTIVE(q->properties))
			continue;
		q->properties.is_active = true;
		increment_queue_count(dqm, q);
	}
	retval = execute_queues_cpsch(dqm, KFD_UNMAP_QUEUES_FILTER_DYNAMIC_QUEUES, 0,
				      USE_DEFAULT_GRACE_PERIOD);
	atomic64_add(get_jiffies_64() - pdd->last_evict_timestamp, &pdd->evict_duration_counter);
	qpd->evicted = 0;
out:
	dqm_unlock(dqm);
	return retval;
}

/*
 * Mirrors: static int process_termination_cpsch(struct device_queue_manager *dqm,
 *     struct qcm_process_device *qpd) (6.12.117): the process's queues leave the GPU whether or
 * not they are suspended; one execute_queues_cpsch if any was active.
 */
__used noinline int process_termination_cpsch(struct device_queue_manager *dqm,
					      struct qcm_process_device *qpd)
{
	struct queue *q;
	bool any_active = false;
	int retval = 0;

	dqm_lock(dqm);
	mutex_lock(&dqm->hw_lock);
	list_for_each_entry(q, &qpd->queues_list, list) {
		emu_cp_forget(dqm, q);
		if (q->properties.is_active) {
			any_active = true;
			q->properties.is_active = false;
			decrement_queue_count(dqm, q);
		}
	}
	/* the pqm still owns the queue memory (pqm_uninit frees it) */
	while (!list_empty(&qpd->queues_list))
		list_del_init(qpd->queues_list.next);
	qpd->queue_count = 0;
	mutex_unlock(&dqm->hw_lock);
	dqm_unregister_process(dqm, qpd);
	if (any_active)
		retval = execute_queues_cpsch(dqm, KFD_UNMAP_QUEUES_FILTER_DYNAMIC_QUEUES, 0,
					      USE_DEFAULT_GRACE_PERIOD);
	/* debug-suspended queues of a dying process must not keep a destroyer waiting */
	wake_up_all(&dqm->destroy_wait);
	dqm_unlock(dqm);
	return retval;
}

/* suspend_single_queue() (6.12.117): new (EC_QUEUE_NEW) or dying queues are refused (-EBUSY). */
static int suspend_single_queue(struct device_queue_manager *dqm, struct queue *q)
{
	if (q->properties.is_suspended)
		return 0;
	if ((q->properties.exception_status & KFD_EC_MASK(EC_QUEUE_NEW)) ||
	    q->properties.is_being_destroyed)
		return -EBUSY;
	q->properties.is_suspended = true;
	if (q->properties.is_active) {
		decrement_queue_count(dqm, q);
		q->properties.is_active = false;
	}
	return 0;
}

static int resume_single_queue(struct device_queue_manager *dqm, struct queue *q)
{
	if (!q->properties.is_suspended)
		return 0;
	q->properties.is_suspended = false;
	if (QUEUE_IS_ACTIVE(q->properties)) {
		q->properties.is_active = true;
		increment_queue_count(dqm, q);
	}
	return 0;
}

static u32 *get_queue_ids(u32 num_queues, u32 __user *usr_queue_id_array)
{
	if (!usr_queue_id_array)
		return NULL;
	return memdup_user(usr_queue_id_array, array_size(num_queues, sizeof(u32)));
}

static int q_array_get_index(unsigned int queue_id, u32 num_queues, u32 *queue_ids)
{
	u32 i;

	for (i = 0; i < num_queues; i++)
		if (queue_id == (queue_ids[i] & ~KFD_DBG_QUEUE_INVALID_MASK))
			return i;
	return -1;
}

/*
 * Mirrors: int suspend_queues(struct kfd_process *p, uint32_t num_queues, uint32_t grace_period,
 *     uint64_t exception_clear_mask, uint32_t *usr_queue_id_array) (6.12.117, HWS path):
 * every id starts INVALID, suspended (or already suspended) ones are cleared, one
 * execute_queues_cpsch per GPU, ERROR on failure, array written back, returns the count.
 */
__used noinline int suspend_queues(struct kfd_process *p, u32 num_queues, u32 grace_period,
				   u64 exception_clear_mask, u32 *usr_queue_id_array)
{
	u32 *queue_ids = get_queue_ids(num_queues, (u32 __user *)usr_queue_id_array);
	int total_suspended = 0;
	u32 i;
	int d;

	atomic_inc(&suspend_calls);
	if (IS_ERR(queue_ids))
		return PTR_ERR(queue_ids);
	if (!queue_ids)
		return -EINVAL;	/* real KFD dereferences the NULL array; refuse instead */
	for (i = 0; i < num_queues; i++)
		queue_ids[i] |= KFD_DBG_QUEUE_INVALID_MASK;

	for (d = 0; d < p->n_pdds; d++) {
		struct kfd_process_device *pdd = &p->pdds[d];
		struct device_queue_manager *dqm = pdd->dev->dqm;
		struct queue *q;
		int r = 0, per_device_suspended = 0;

		mutex_lock(&p->event_mutex);
		dqm_lock(dqm);
		list_for_each_entry(q, &pdd->qpd.queues_list, list) {
			int q_idx = q_array_get_index(q->properties.queue_id, num_queues,
						      queue_ids);
			int err;

			if (q_idx < 0)
				continue;
			err = suspend_single_queue(dqm, q);
			if (!err) {
				queue_ids[q_idx] &= ~KFD_DBG_QUEUE_INVALID_MASK;
				per_device_suspended++;
			} else if (err != -EBUSY) {
				queue_ids[q_idx] |= KFD_DBG_QUEUE_ERROR_MASK;
				break;
			}
		}
		if (!per_device_suspended) {
			dqm_unlock(dqm);
			mutex_unlock(&p->event_mutex);
			continue;
		}
		r = execute_queues_cpsch(dqm, KFD_UNMAP_QUEUES_FILTER_DYNAMIC_QUEUES, 0,
					 grace_period);
		if (r)
			pr_err("kfd_emu: Failed to suspend process queues.\n");
		else
			total_suspended += per_device_suspended;
		list_for_each_entry(q, &pdd->qpd.queues_list, list) {
			int q_idx = q_array_get_index(q->properties.queue_id, num_queues,
						      queue_ids);

			if (q_idx < 0)
				continue;
			if (r)
				queue_ids[q_idx] |= KFD_DBG_QUEUE_ERROR_MASK;
			else if (exception_clear_mask)
				q->properties.exception_status &= ~exception_clear_mask;
		}
		dqm_unlock(dqm);
		mutex_unlock(&p->event_mutex);
	}
	if (copy_to_user((void __user *)usr_queue_id_array, queue_ids, array_size(num_queues,
										  sizeof(u32))))
		pr_err("kfd_emu: copy_to_user failed on queue suspend\n");
	kfree(queue_ids);
	return total_suspended;
}

/*
 * Mirrors: int resume_queues(struct kfd_process *p, uint32_t num_queues,
 *     uint32_t *usr_queue_id_array) (6.12.117). A NULL array resumes every queue (used by
 * debug deactivation, runtime disable and debugger exit).
 */
__used noinline int resume_queues(struct kfd_process *p, u32 num_queues, u32 *usr_queue_id_array)
{
	u32 *queue_ids = NULL;
	int total_resumed = 0;
	u32 i;
	int d;

	if (usr_queue_id_array) {
		queue_ids = get_queue_ids(num_queues, (u32 __user *)usr_queue_id_array);
		if (IS_ERR(queue_ids))
			return PTR_ERR(queue_ids);
		for (i = 0; i < num_queues; i++)
			queue_ids[i] |= KFD_DBG_QUEUE_INVALID_MASK;
	}

	for (d = 0; d < p->n_pdds; d++) {
		struct kfd_process_device *pdd = &p->pdds[d];
		struct device_queue_manager *dqm = pdd->dev->dqm;
		struct queue *q;
		int r, per_device_resumed = 0;

		dqm_lock(dqm);
		list_for_each_entry(q, &pdd->qpd.queues_list, list) {
			int q_idx = -1;

			if (queue_ids)
				q_idx = q_array_get_index(q->properties.queue_id, num_queues,
							  queue_ids);
			if (queue_ids && q_idx < 0)
				continue;
			if (!resume_single_queue(dqm, q) && queue_ids)
				queue_ids[q_idx] &= ~KFD_DBG_QUEUE_INVALID_MASK;
			per_device_resumed++;
		}
		if (!per_device_resumed) {
			dqm_unlock(dqm);
			continue;
		}
		r = execute_queues_cpsch(dqm, KFD_UNMAP_QUEUES_FILTER_DYNAMIC_QUEUES, 0,
					 USE_DEFAULT_GRACE_PERIOD);
		if (r) {
			pr_err("kfd_emu: Failed to resume process queues\n");
			if (queue_ids) {
				list_for_each_entry(q, &pdd->qpd.queues_list, list) {
					int q_idx = q_array_get_index(q->properties.queue_id,
								      num_queues, queue_ids);

					if (q_idx >= 0)
						queue_ids[q_idx] |= KFD_DBG_QUEUE_ERROR_MASK;
				}
			}
		} else {
			total_resumed += per_device_resumed;
		}
		wake_up_all(&dqm->destroy_wait);
		dqm_unlock(dqm);
	}
	if (queue_ids) {
		if (copy_to_user((void __user *)usr_queue_id_array, queue_ids,
				 array_size(num_queues, sizeof(u32))))
			pr_err("kfd_emu: copy_to_user failed on queue resume\n");
		kfree(queue_ids);
	}
	return total_resumed;
}

/* ---- SMI events and eviction (kfd_smi_events.c, kfd_process.c) ---- */

/*
 * Mirrors: void kfd_smi_event_queue_eviction(struct kfd_node *node, pid_t pid, uint32_t trigger)
 * (6.12.117). The emulator has no SMI event fds; this is the probe point with the real arguments.
 */
__used noinline void kfd_smi_event_queue_eviction(struct kfd_node *node, pid_t pid, u32 trigger)
{
	pr_debug("kfd_emu: %x queue eviction pid %d trigger %u\n", node->id, pid, trigger);
}

/* Mirrors: void kfd_smi_event_queue_restore(struct kfd_node *node, pid_t pid) (6.12.117). */
__used noinline void kfd_smi_event_queue_restore(struct kfd_node *node, pid_t pid)
{
	pr_debug("kfd_emu: %x queue restore pid %d\n", node->id, pid);
}

/*
 * Mirrors: int kfd_process_evict_queues(struct kfd_process *p, uint32_t trigger) (6.12.117):
 * per GPU, the SMI eviction event then the dqm's evict_process_queues.
 */
__used noinline int kfd_process_evict_queues(struct kfd_process *p, u32 trigger)
{
	int r = 0, i;

	for (i = 0; i < p->n_pdds; i++) {
		struct kfd_process_device *pdd = &p->pdds[i];

		kfd_smi_event_queue_eviction(pdd->dev, p->lead_thread->pid, trigger);
		r = evict_process_queues_cpsch(pdd->dev->dqm, &pdd->qpd);
		if (r && r != -EIO) {
			pr_err("kfd_emu: Failed to evict process queues\n");
			break;
		}
	}
	return r;
}

/* Mirrors: int kfd_process_restore_queues(struct kfd_process *p) (6.12.117). */
__used noinline int kfd_process_restore_queues(struct kfd_process *p)
{
	int r, ret = 0, i;

	for (i = 0; i < p->n_pdds; i++) {
		struct kfd_process_device *pdd = &p->pdds[i];

		kfd_smi_event_queue_restore(pdd->dev, p->lead_thread->pid);
		r = restore_process_queues_cpsch(pdd->dev->dqm, &pdd->qpd);
		if (r) {
			pr_err("kfd_emu: Failed to restore process queues\n");
			if (!ret)
				ret = r;
		}
	}
	return ret;
}

/* ---- process queue manager (kfd_process_queue_manager.c) ---- */

struct process_queue_node *get_queue_by_qid(struct process_queue_manager *pqm,
					    unsigned int qid)
{
	struct process_queue_node *pqn;

	list_for_each_entry(pqn, &pqm->queues, process_queue_list)
		if (pqn->q && pqn->q->properties.queue_id == qid)
			return pqn;
	return NULL;
}

/*
 * Mirrors: int pqm_create_queue(struct process_queue_manager *pqm, struct kfd_node *dev,
 *     struct file *f, struct queue_properties *properties, unsigned int *qid,
 *     const struct kfd_criu_queue_priv_data *q_data, const void *restore_mqd,
 *     const void *restore_ctl_stack, uint32_t *p_doorbell_offset_in_process) (6.12.117):
 * -ENOSPC past 127 queues on the device, lowest free id 0..1023 (-ENOMEM when none),
 * EC_QUEUE_NEW set on the new queue and raised to a debugger, sysfs queues/<id>.
 */
__used noinline int pqm_create_queue(struct process_queue_manager *pqm, struct kfd_node *dev,
				     struct file *f,
				     struct queue_properties *properties, unsigned int *qid,
				     const void *q_data, const void *restore_mqd, const void *restore_ctl_stack,
				     u32 *p_doorbell_offset_in_process)
{
	struct kfd_process *p = pqm->process;
	struct kfd_process_device *pdd = kfd_process_device_data_by_id(p, dev->id);
	struct process_queue_node *pqn;
	struct queue *q;
	unsigned long found;
	int retval;

	if (!pdd)
		return -EINVAL;
	if (pdd->qpd.queue_count >= KFD_MAX_QUEUES_PER_PROCESS_DEVICE) {
		pr_warn("kfd_emu: Can't create new usermode queue because 127 queues were already created\n");
		return -ENOSPC;
	}
	found = find_first_zero_bit(pqm->queue_slot_bitmap, KFD_MAX_NUM_OF_QUEUES_PER_PROCESS);
	if (found >= KFD_MAX_NUM_OF_QUEUES_PER_PROCESS) {
		pr_info("kfd_emu: Cannot open more queues for process with pasid 0x%x\n", p->pasid);
		return -ENOMEM;
	}

	pqn = kzalloc(sizeof(*pqn), GFP_KERNEL);
	q = kzalloc(sizeof(*q), GFP_KERNEL);
	if (!pqn || !q) {
		kfree(pqn);
		kfree(q);
		return -ENOMEM;
	}
	set_bit(found, pqm->queue_slot_bitmap);
	q->properties = *properties;
	q->properties.queue_id = found;
	/* init_user_queue(): every new queue carries EC_QUEUE_NEW until a snapshot clears it */
	q->properties.exception_status = KFD_EC_MASK(EC_QUEUE_NEW);
	q->process = p;
	q->device = dev;
	INIT_LIST_HEAD(&q->list);
	pqn->q = q;
	/* the CP starts at the read index the producer initialised (here, in its context) */
	if (get_user(q->cp_rptr, (u64 __user *)q->properties.read_ptr))
		q->cp_rptr = 0;
	q->obs_old_w = q->cp_rptr;
	q->obs_new_w = q->cp_rptr;

	retval = create_queue_cpsch(dev->dqm, q, &pdd->qpd, q_data, restore_mqd, restore_ctl_stack);
	if (retval) {
		pr_err("kfd_emu: Error dqm create queue\n");
		dqm_lock(dev->dqm);
		mutex_lock(&dev->dqm->hw_lock);
		list_del(&q->list);
		emu_cp_forget(dev->dqm, q);
		mutex_unlock(&dev->dqm->hw_lock);
		pdd->qpd.queue_count--;
		if (q->properties.is_active)
			decrement_queue_count(dev->dqm, q);
		dqm_unlock(dev->dqm);
		clear_bit(found, pqm->queue_slot_bitmap);
		kfree(q);
		kfree(pqn);
		return retval;
	}
	*qid = found;
	/* doorbell index within the process's doorbell frame (8-byte doorbells) */
	if (p_doorbell_offset_in_process)
		*p_doorbell_offset_in_process = found * sizeof(u64);
	list_add(&pqn->process_queue_list, &pqm->queues);
	kfd_procfs_add_queue(q);
	if (p->debug_trap_enabled)
		kfd_dbg_ev_raise(KFD_EC_MASK(EC_QUEUE_NEW), p, dev, found);
	return 0;
}

/*
 * Mirrors: int pqm_destroy_queue(struct process_queue_manager *pqm, unsigned int qid) (6.12.117):
 * "Queue id does not match any known queue" -> -EINVAL.
 */
__used noinline int pqm_destroy_queue(struct process_queue_manager *pqm, unsigned int qid)
{
	struct process_queue_node *pqn = get_queue_by_qid(pqm, qid);
	struct kfd_process_device *pdd;
	struct queue *q;
	int retval;

	if (!pqn) {
		pr_debug("kfd_emu: Queue id does not match any known queue\n");
		return -EINVAL;
	}
	q = pqn->q;
	pdd = kfd_process_device_data_by_id(pqm->process, q->device->id);
	retval = destroy_queue_cpsch(q->device->dqm, &pdd->qpd, q);
	if (retval)
		return retval;
	kfd_procfs_del_queue(q);
	list_del(&pqn->process_queue_list);
	clear_bit(qid, pqm->queue_slot_bitmap);
	kfree(q);
	kfree(pqn);
	return 0;
}

/* Mirrors: void pqm_uninit(struct process_queue_manager *pqm) (6.12.117): frees every queue. */
__used noinline void pqm_uninit(struct process_queue_manager *pqm)
{
	struct process_queue_node *pqn, *next;

	list_for_each_entry_safe(pqn, next, &pqm->queues, process_queue_list) {
		if (pqn->q) {
			kfd_procfs_del_queue(pqn->q);
			kfree(pqn->q);
		}
		list_del(&pqn->process_queue_list);
		kfree(pqn);
	}
	bitmap_free(pqm->queue_slot_bitmap);
	pqm->queue_slot_bitmap = NULL;
}

static u32 set_queue_type_for_user(struct queue_properties *q_props)
{
	switch (q_props->type) {
	case KFD_QUEUE_TYPE_COMPUTE:
		return q_props->format == KFD_QUEUE_FORMAT_AQL ? KFD_IOC_QUEUE_TYPE_COMPUTE_AQL
							       : KFD_IOC_QUEUE_TYPE_COMPUTE;
	case KFD_QUEUE_TYPE_SDMA:
		return KFD_IOC_QUEUE_TYPE_SDMA;
	case KFD_QUEUE_TYPE_SDMA_XGMI:
		return KFD_IOC_QUEUE_TYPE_SDMA_XGMI;
	case KFD_QUEUE_TYPE_SDMA_BY_ENG_ID:
		return KFD_IOC_QUEUE_TYPE_SDMA_BY_ENG_ID;
	default:
		return KFD_IOC_QUEUE_TYPE_COMPUTE;
	}
}

/*
 * Mirrors: int pqm_get_queue_snapshot(struct process_queue_manager *pqm,
 *     uint64_t exception_clear_mask, void __user *buf, int *num_qss_entries,
 *     uint32_t *entry_size) (6.12.117): entry_size 0 -> -EINVAL; writes min(entry_size, 64) bytes
 * per queue, at most *num_qss_entries entries, returns the real count, clears the mask bits.
 */
__used noinline int pqm_get_queue_snapshot(struct process_queue_manager *pqm,
					   u64 exception_clear_mask,
					   void __user *buf, int *num_qss_entries, u32 *entry_size)
{
	struct process_queue_node *pqn;
	struct kfd_queue_snapshot_entry src;
	u32 stride = *entry_size;
	int r = 0, count = 0;

	if (!*entry_size)
		return -EINVAL;
	*entry_size = min_t(u32, *entry_size, sizeof(src));
	mutex_lock(&pqm->process->event_mutex);
	list_for_each_entry(pqn, &pqm->queues, process_queue_list) {
		struct queue *q = pqn->q;

		if (!q)
			continue;
		if (count < *num_qss_entries) {
			memset(&src, 0, sizeof(src));
			src.exception_status = q->properties.exception_status;
			src.ring_base_address = q->properties.queue_address;
			src.write_pointer_address = (u64)(uintptr_t)q->properties.write_ptr;
			src.read_pointer_address = (u64)(uintptr_t)q->properties.read_ptr;
			src.ctx_save_restore_address = q->properties.ctx_save_restore_area_address;
			src.ctx_save_restore_area_size = q->properties.ctx_save_restore_area_size;
			src.queue_id = q->properties.queue_id;
			src.gpu_id = q->device->id;
			src.ring_size = (u32)q->properties.queue_size;
			src.queue_type = set_queue_type_for_user(&q->properties);
			if (copy_to_user(buf, &src, *entry_size)) {
				r = -EFAULT;
				break;
			}
			buf += stride;
			q->properties.exception_status &= ~exception_clear_mask;
		}
		count++;
	}
	mutex_unlock(&pqm->process->event_mutex);
	*num_qss_entries = count;
	return r;
}
