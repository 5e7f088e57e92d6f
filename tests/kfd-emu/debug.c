// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * The debug trap (kfd_debug.c): exceptions raised to a debugger and to the runtime, queue errors,
 * debugger enable/disable, and the RUNTIME_ENABLE and DBG_TRAP ioctls.
 *
 * Part of the KFD emulator, kfd_emu.ko: main.c describes it, README.md "Source files" maps it.
 */

#include "kfd_emu.h"

/* ---- debugger (kfd_debug.c) ---- */

/*
 * kfd_dbg_ev_raise() (6.12.117): record the exception on the queue / device / process and write
 * one '.' to the debugger's dbg_fd when the debugger enabled that exception.
 */
void kfd_dbg_ev_raise(u64 event_mask, struct kfd_process *process, struct kfd_node *dev,
		      unsigned int source_id)
{
	struct process_queue_node *pqn;
	bool notify;
	loff_t pos = 0;
	char dot = '.';

	mutex_lock(&process->event_mutex);
	if (event_mask & KFD_EC_MASK(EC_PROCESS_RUNTIME)) {
		process->exception_status |= event_mask;
	} else if (dev) {
		list_for_each_entry(pqn, &process->pqm.queues, process_queue_list)
			if (pqn->q && pqn->q->properties.queue_id == source_id)
				pqn->q->properties.exception_status |= event_mask;
	}
	notify = process->exception_enable_mask & event_mask;
	if (notify && process->dbg_ev_file)
		kernel_write(process->dbg_ev_file, &dot, 1, &pos);
	mutex_unlock(&process->event_mutex);
}

/*
 * kfd_send_exception_to_runtime() (kfd_process.c, 6.12.117): OR the exception into the u64 the
 * CWSR area header's err_payload_addr names (the runtime's HSA event is not emulated).
 */
static void kfd_send_exception_to_runtime(struct kfd_process *p, u64 csa, u64 error_reason)
{
	struct kfd_context_save_area_header __user *header =
		(struct kfd_context_save_area_header __user *)(uintptr_t)csa;
	struct mm_struct *mm = p->mm_grabbed;
	u64 payload, cur;

	if (!mmget_not_zero(mm))
		return;
	kthread_use_mm(mm);
	if (!get_user(payload, &header->err_payload_addr) && payload &&
	    !get_user(cur, (u64 __user *)(uintptr_t)payload))
		if (put_user(cur | error_reason, (u64 __user *)(uintptr_t)payload))
			pr_debug("kfd_emu: error payload of pasid 0x%x unwritable\n", p->pasid);
	kthread_unuse_mm(mm);
	mmput(mm);
}

/*
 * kfd_set_dbg_ev_from_interrupt() (kfd_debug.c, 6.12.117) for a CP packet error: a debugger
 * that enabled the exception gets it on the queue and a '.' on its dbg_fd; otherwise a runtime
 * (RUNTIME_ENABLE) gets it through kfd_send_exception_to_runtime.
 */
static void emu_report_queue_exception(struct kfd_process *p, struct kfd_node *dev, u32 queue_id,
				       u64 mask)
{
	struct process_queue_node *pqn;
	u64 csa = 0;

	mutex_lock(&p->mutex);
	if (p->debug_trap_enabled) {
		kfd_dbg_ev_raise(mask, p, dev, queue_id);
		if (p->exception_enable_mask & mask) {
			mutex_unlock(&p->mutex);
			return;
		}
	}
	if (p->runtime_info.runtime_state == DEBUG_RUNTIME_STATE_ENABLED) {
		pqn = get_queue_by_qid(&p->pqm, queue_id);
		if (pqn)
			csa = pqn->q->properties.ctx_save_restore_area_address;
	}
	mutex_unlock(&p->mutex);
	if (csa)
		kfd_send_exception_to_runtime(p, csa, mask);
}

struct emu_error_work {
	struct work_struct work;
	struct kfd_process *p;
	struct kfd_node *dev;
	u32 queue_id;
	u64 mask;
};

static void emu_error_worker(struct work_struct *work)
{
	struct emu_error_work *w = container_of(work, struct emu_error_work, work);

	emu_report_queue_exception(w->p, w->dev, w->queue_id, w->mask);
	kfd_unref_process(w->p);
	kfree(w);
}

/*
 * The CP found a packet it cannot execute (under hw_lock): the queue stops being served and
 * the exception is reported from a worker, as amdgpu's interrupt handler defers to
 * kfd_int_process_v9's work (the reporting takes process locks the CP must not).
 */
void emu_queue_error(struct queue *q, u32 ec)
{
	struct emu_error_work *w;

	if (q->error_ec)
		return;
	q->error_ec = ec;
	q->device->dqm->stats.errors++;
	pr_debug("kfd_emu: queue %u of pasid 0x%x: packet error %u at index %llu\n",
		 q->properties.queue_id, q->process->pasid, ec, q->cp_rptr);
	w = kzalloc(sizeof(*w), GFP_KERNEL);
	if (!w)
		return;
	if (!kref_get_unless_zero(&q->process->ref)) {
		kfree(w);
		return;
	}
	w->p = q->process;
	w->dev = q->device;
	w->queue_id = q->properties.queue_id;
	w->mask = KFD_EC_MASK(ec);
	INIT_WORK(&w->work, emu_error_worker);
	queue_work(kfd_process_wq, &w->work);
}

/*
 * kfd_dbg_trap_activate() (6.12.117, per-VMID debug GPU under HWS): runtime state stays ENABLED,
 * the runlist is refreshed (debug_refresh_runlist -> execute_queues_cpsch).
 */
static void kfd_dbg_trap_activate(struct kfd_process *target)
{
	int i;

	for (i = 0; i < target->n_pdds; i++) {
		struct device_queue_manager *dqm = target->pdds[i].dev->dqm;

		dqm_lock(dqm);
		execute_queues_cpsch(dqm, KFD_UNMAP_QUEUES_FILTER_DYNAMIC_QUEUES, 0,
				     USE_DEFAULT_GRACE_PERIOD);
		dqm_unlock(dqm);
	}
}

/* kfd_dbg_trap_deactivate() (6.12.117): resumes every suspended queue, refreshes the runlist. */
static void kfd_dbg_trap_deactivate(struct kfd_process *target)
{
	resume_queues(target, 0, NULL);
	kfd_dbg_trap_activate(target);
}

/*
 * Mirrors: int kfd_dbg_trap_disable(struct kfd_process *target) (6.12.117): 0 when not enabled;
 * deactivates (resumes everything) when the runtime is enabled, drops the dbg_fd, the debugger
 * link and the reference ENABLE took.
 */
__used noinline int kfd_dbg_trap_disable(struct kfd_process *target)
{
	struct process_queue_node *pqn;

	if (!target->debug_trap_enabled)
		return 0;
	if (target->runtime_info.runtime_state == DEBUG_RUNTIME_STATE_ENABLED)
		kfd_dbg_trap_deactivate(target);
	else if (target->runtime_info.runtime_state != DEBUG_RUNTIME_STATE_DISABLED)
		target->runtime_info.runtime_state = DEBUG_RUNTIME_STATE_ENABLED;

	mutex_lock(&target->event_mutex);
	if (target->dbg_ev_file)
		fput(target->dbg_ev_file);
	target->dbg_ev_file = NULL;
	/* kfd_dbg_clean_exception_status() */
	target->exception_status = 0;
	list_for_each_entry(pqn, &target->pqm.queues, process_queue_list)
		if (pqn->q)
			pqn->q->properties.exception_status = 0;
	mutex_unlock(&target->event_mutex);
	if (target->debugger_process) {
		atomic_dec(&target->debugger_process->debugged_process_count);
		target->debugger_process = NULL;
	}
	target->debug_trap_enabled = false;
	kfd_unref_process(target);
	return 0;
}

/*
 * Mirrors: int kfd_dbg_trap_enable(struct kfd_process *target, uint32_t fd,
 *     void __user *runtime_info, uint32_t *runtime_size) (6.12.117): -EALREADY when enabled,
 * -EBADF for a bad dbg_fd, activation deferred until RUNTIME_ENABLE, an extra process reference,
 * min(size, 16) bytes of kfd_runtime_info copied out, size written back as 16.
 */
__used noinline int kfd_dbg_trap_enable(struct kfd_process *target, u32 fd,
					void __user *runtime_info,
					u32 *runtime_size)
{
	u32 copy_size = min_t(u32, *runtime_size, sizeof(target->runtime_info));
	struct file *f;
	int r = 0;

	if (target->debug_trap_enabled)
		return -EALREADY;
	f = fget(fd);
	if (!f) {
		pr_err("kfd_emu: Failed to get file for (%i)\n", fd);
		return -EBADF;
	}
	target->dbg_ev_file = f;
	if (target->runtime_info.runtime_state == DEBUG_RUNTIME_STATE_ENABLED)
		kfd_dbg_trap_activate(target);
	target->debug_trap_enabled = true;
	kref_get(&target->ref);
	if (copy_to_user(runtime_info, &target->runtime_info, copy_size)) {
		target->debug_trap_enabled = false;
		if (target->runtime_info.runtime_state == DEBUG_RUNTIME_STATE_ENABLED)
			kfd_dbg_trap_deactivate(target);
		fput(f);
		target->dbg_ev_file = NULL;
		kfd_unref_process(target);	/* the caller still holds its own reference */
		r = -EFAULT;
	}
	*runtime_size = sizeof(target->runtime_info);
	return r;
}

/* kfd_dbg_send_exception_to_runtime() (6.12.117): EC_PROCESS_RUNTIME acks the runtime handshake. */
static int kfd_dbg_send_exception_to_runtime(struct kfd_process *p, unsigned int dev_id,
					     unsigned int queue_id,
					     u64 error_reason)
{
	if (error_reason & KFD_EC_MASK(EC_PROCESS_RUNTIME)) {
		up(&p->runtime_enable_sema);
		error_reason &= ~KFD_EC_MASK(EC_PROCESS_RUNTIME);
	}
	if (!error_reason)
		return 0;
	/* queue exceptions go to the runtime through HSA signal events, which are not emulated */
	if (!get_queue_by_qid(&p->pqm, queue_id))
		return -EINVAL;
	return 0;
}

/* kfd_dbg_set_enabled_debug_exception_mask() (6.12.117): pokes dbg_fd if one pending is now enabled */
static void kfd_dbg_set_enabled_debug_exception_mask(struct kfd_process *target,
						     u64 exception_set_mask)
{
	struct process_queue_node *pqn;
	u64 found_mask = 0;
	loff_t pos = 0;
	char dot = '.';

	mutex_lock(&target->event_mutex);
	found_mask |= target->exception_status;
	list_for_each_entry(pqn, &target->pqm.queues, process_queue_list)
		if (pqn->q)
			found_mask |= pqn->q->properties.exception_status;
	target->exception_enable_mask = exception_set_mask;
	found_mask &= exception_set_mask;
	if (found_mask && target->dbg_ev_file)
		kernel_write(target->dbg_ev_file, &dot, 1, &pos);
	mutex_unlock(&target->event_mutex);
}

/*
 * kfd_dbg_ev_query_debug_event() (6.12.117): first queue with an enabled exception, else the
 * process; clears exception_clear_mask on what it reports; -EAGAIN when nothing is pending.
 */
static int kfd_dbg_ev_query_debug_event(struct kfd_process *process, u32 *queue_id, u32 *gpu_id,
					u64 exception_clear_mask, u64 *event_status)
{
	struct process_queue_node *pqn;
	int ret = 0;

	*event_status = 0;
	*queue_id = 0;
	*gpu_id = 0;
	mutex_lock(&process->event_mutex);
	list_for_each_entry(pqn, &process->pqm.queues, process_queue_list) {
		struct queue *q = pqn->q;

		if (!q || !(q->properties.exception_status & process->exception_enable_mask))
			continue;
		*event_status = q->properties.exception_status;
		*queue_id = q->properties.queue_id;
		*gpu_id = q->device->id;
		q->properties.exception_status &= ~exception_clear_mask;
		goto out;
	}
	if (process->exception_enable_mask & process->exception_status) {
		*event_status = process->exception_status;
		process->exception_status &= ~exception_clear_mask;
	} else {
		ret = -EAGAIN;
	}
out:
	mutex_unlock(&process->event_mutex);
	return ret;
}

/* kfd_dbg_trap_query_exception_info() (6.12.117), queue and process exceptions. */
static int kfd_dbg_trap_query_exception_info(struct kfd_process *target, u32 source_id,
					     u32 exception_code,
					     bool clear_exception, void __user *info, u32 *info_size)
{
	u64 *exception_status_ptr = NULL;
	u32 actual_info_size = 0;
	struct process_queue_node *pqn;
	int r = 0;

	if (!info || !info_size)
		return -EINVAL;
	mutex_lock(&target->event_mutex);
	if (KFD_DBG_EC_TYPE_IS_QUEUE(exception_code)) {
		list_for_each_entry(pqn, &target->pqm.queues, process_queue_list)
			if (pqn->q && pqn->q->properties.queue_id == source_id)
				exception_status_ptr = &pqn->q->properties.exception_status;
	} else if (KFD_DBG_EC_TYPE_IS_PROCESS(exception_code)) {
		exception_status_ptr = &target->exception_status;
		if (exception_code == EC_PROCESS_RUNTIME) {
			u32 copy_size = min_t(u32, *info_size, sizeof(target->runtime_info));

			if (copy_to_user(info, &target->runtime_info, copy_size)) {
				r = -EFAULT;
				goto out;
			}
			actual_info_size = sizeof(target->runtime_info);
		}
	}
	if (!exception_status_ptr) {
		r = -EINVAL;
		goto out;
	}
	if (!(*exception_status_ptr & KFD_EC_MASK(exception_code))) {
		r = -ENODATA;
		goto out;
	}
	if (clear_exception)
		*exception_status_ptr &= ~KFD_EC_MASK(exception_code);
out:
	mutex_unlock(&target->event_mutex);
	*info_size = actual_info_size;
	return r;
}

/*
 * runtime_enable() / runtime_disable() (kfd_chardev.c, 6.12.117): -EBUSY unless DISABLED,
 * -EEXIST once the process has queues; with a debugger attached, raise EC_PROCESS_RUNTIME and
 * block until the debugger acks with SEND_RUNTIME_EVENT.
 */
static int runtime_enable(struct kfd_process *p, u64 r_debug, bool enable_ttmp_setup)
{
	int i, ret = 0;

	if (p->is_runtime_retry)
		goto retry;
	if (p->runtime_info.runtime_state != DEBUG_RUNTIME_STATE_DISABLED)
		return -EBUSY;
	for (i = 0; i < p->n_pdds; i++)
		if (p->pdds[i].qpd.queue_count)
			return -EEXIST;
	p->runtime_info.runtime_state = DEBUG_RUNTIME_STATE_ENABLED;
	p->runtime_info.r_debug = r_debug;
	p->runtime_info.ttmp_setup = enable_ttmp_setup;
retry:
	if (p->debug_trap_enabled) {
		if (!p->is_runtime_retry) {
			kfd_dbg_trap_activate(p);
			kfd_dbg_ev_raise(KFD_EC_MASK(EC_PROCESS_RUNTIME), p, NULL, 0);
		}
		mutex_unlock(&p->mutex);
		ret = down_interruptible(&p->runtime_enable_sema);
		mutex_lock(&p->mutex);
		p->is_runtime_retry = !!ret;
	}
	return ret;
}

static int runtime_disable(struct kfd_process *p)
{
	bool was_enabled = p->runtime_info.runtime_state == DEBUG_RUNTIME_STATE_ENABLED;
	int ret;

	p->runtime_info.runtime_state = DEBUG_RUNTIME_STATE_DISABLED;
	p->runtime_info.r_debug = 0;
	if (p->debug_trap_enabled) {
		if (was_enabled)
			kfd_dbg_trap_deactivate(p);
		if (!p->is_runtime_retry)
			kfd_dbg_ev_raise(KFD_EC_MASK(EC_PROCESS_RUNTIME), p, NULL, 0);
		mutex_unlock(&p->mutex);
		ret = down_interruptible(&p->runtime_enable_sema);
		mutex_lock(&p->mutex);
		p->is_runtime_retry = !!ret;
		if (ret)
			return ret;
	}
	p->runtime_info.ttmp_setup = false;
	return 0;
}

/*
 * Mirrors: static int kfd_ioctl_runtime_enable(struct file *filep, struct kfd_process *p,
 *     void *data) (6.12.117)
 */
__used noinline int kfd_ioctl_runtime_enable(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_runtime_enable_args *args = data;
	int r;

	mutex_lock(&p->mutex);
	if (args->mode_mask & KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK)
		r = runtime_enable(p, args->r_debug,
				   !!(args->mode_mask & KFD_RUNTIME_ENABLE_MODE_TTMP_SAVE_MASK));
	else
		r = runtime_disable(p);
	mutex_unlock(&p->mutex);
	return r;
}

/*
 * Mirrors: static int kfd_ioctl_set_debug_trap(struct file *filep, struct kfd_process *p,
 *     void *data) (6.12.117). Checks in the kernel's order: pid lookup (-ESRCH), target process
 * (created for a ptraced target on ENABLE), the 6.12.117 permission rule (the calling thread
 * must be the ptracer of the target's leader unless target == caller or the caller is the
 * registered debugger: -EPERM), debug enabled (-EINVAL), runtime enabled for HW ops (-EPERM).
 */
__used noinline int kfd_ioctl_set_debug_trap(struct file *filep, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_dbg_trap_args *args = data;
	struct task_struct *thread = NULL;
	struct kfd_process *target = NULL;
	struct mm_struct *mm = NULL;
	struct pid *pid = NULL;
	int r = 0;

	/*
	 * 7.0 ("amdkfd: process debug trap ioctl only on a primary context", e3491fa3f3c9, Reviewed-by
	 * Felix Kuehling): first of all, the caller's context must be the primary one.
	 */
	if (!kfd_process_is_primary(p)) {
		pr_debug("kfd_emu: Set debug trap ioctl can not be invoked on non-primary kfd process\n");
		return -EOPNOTSUPP;
	}

	pid = find_get_pid(args->pid);
	if (!pid) {
		r = -ESRCH;
		goto out;
	}
	thread = get_pid_task(pid, PIDTYPE_PID);
	if (!thread) {
		r = -ESRCH;
		goto out;
	}
	mm = get_task_mm(thread);
	if (!mm) {
		r = -ESRCH;
		goto out;
	}

	if (args->op == KFD_IOC_DBG_TRAP_ENABLE) {
		bool create_process;

		rcu_read_lock();
		create_process = thread != current && ptrace_parent(thread) == current;
		rcu_read_unlock();
		if (create_process)
			target = kfd_create_process(thread);
		else
			target = kfd_lookup_process_by_pid(pid);
	} else {
		target = kfd_lookup_process_by_pid(pid);
	}
	if (IS_ERR_OR_NULL(target)) {
		r = target ? PTR_ERR(target) : -ESRCH;
		target = NULL;
		goto out;
	}
	/* 7.0 (e3491fa3f3c9): and so must the target's (a pid finds its primary, so it is) */
	if (!kfd_process_is_primary(target)) {
		pr_debug("kfd_emu: Set debug trap ioctl not supported on non-primary kfd process\n");
		r = -EOPNOTSUPP;
		goto out;
	}

	rcu_read_lock();
	if (target != p && ptrace_parent(target->lead_thread) != current &&
	    target->debugger_process != p)
		r = -EPERM;
	rcu_read_unlock();
	if (r)
		goto out;

	mutex_lock(&target->mutex);
	if (args->op != KFD_IOC_DBG_TRAP_ENABLE && !target->debug_trap_enabled) {
		r = -EINVAL;
		goto unlock_out;
	}
	if (target->runtime_info.runtime_state != DEBUG_RUNTIME_STATE_ENABLED &&
	    (args->op == KFD_IOC_DBG_TRAP_SET_WAVE_LAUNCH_OVERRIDE ||
	     args->op == KFD_IOC_DBG_TRAP_SET_WAVE_LAUNCH_MODE ||
	     args->op == KFD_IOC_DBG_TRAP_SUSPEND_QUEUES ||
	     args->op == KFD_IOC_DBG_TRAP_RESUME_QUEUES ||
	     args->op == KFD_IOC_DBG_TRAP_SET_NODE_ADDRESS_WATCH ||
	     args->op == KFD_IOC_DBG_TRAP_CLEAR_NODE_ADDRESS_WATCH ||
	     args->op == KFD_IOC_DBG_TRAP_SET_FLAGS)) {
		r = -EPERM;
		goto unlock_out;
	}

	switch (args->op) {
	case KFD_IOC_DBG_TRAP_ENABLE:
		r = kfd_dbg_trap_enable(target, args->enable.dbg_fd,
					(void __user *)args->enable.rinfo_ptr,
					&args->enable.rinfo_size);
		if (!r) {
			target->exception_enable_mask = args->enable.exception_mask;
			if (target != p) {
				target->debugger_process = p;
				atomic_inc(&p->debugged_process_count);
			}
		}
		break;
	case KFD_IOC_DBG_TRAP_DISABLE:
		r = kfd_dbg_trap_disable(target);
		break;
	case KFD_IOC_DBG_TRAP_SEND_RUNTIME_EVENT:
		r = kfd_dbg_send_exception_to_runtime(target, args->send_runtime_event.gpu_id,
						      args->send_runtime_event.queue_id,
						      args->send_runtime_event.exception_mask);
		break;
	case KFD_IOC_DBG_TRAP_SET_EXCEPTIONS_ENABLED:
		kfd_dbg_set_enabled_debug_exception_mask(target,
							 args->set_exceptions_enabled.exception_mask);
		break;
	case KFD_IOC_DBG_TRAP_SUSPEND_QUEUES:
		r = suspend_queues(target, args->suspend_queues.num_queues,
				   args->suspend_queues.grace_period,
				   args->suspend_queues.exception_mask,
				   (u32 *)args->suspend_queues.queue_array_ptr);
		break;
	case KFD_IOC_DBG_TRAP_RESUME_QUEUES:
		r = resume_queues(target, args->resume_queues.num_queues,
				  (u32 *)args->resume_queues.queue_array_ptr);
		break;
	case KFD_IOC_DBG_TRAP_QUERY_DEBUG_EVENT:
		r = kfd_dbg_ev_query_debug_event(target, &args->query_debug_event.queue_id,
						 &args->query_debug_event.gpu_id,
						 args->query_debug_event.exception_mask,
						 &args->query_debug_event.exception_mask);
		break;
	case KFD_IOC_DBG_TRAP_QUERY_EXCEPTION_INFO:
		r = kfd_dbg_trap_query_exception_info(target, args->query_exception_info.source_id,
						      args->query_exception_info.exception_code,
						      args->query_exception_info.clear_exception,
						      (void __user *)args->query_exception_info.info_ptr,
						      &args->query_exception_info.info_size);
		break;
	case KFD_IOC_DBG_TRAP_GET_QUEUE_SNAPSHOT:
		r = pqm_get_queue_snapshot(&target->pqm, args->queue_snapshot.exception_mask,
					   (void __user *)args->queue_snapshot.snapshot_buf_ptr,
					   (int *)&args->queue_snapshot.num_queues,
					   &args->queue_snapshot.entry_size);
		break;
	case KFD_IOC_DBG_TRAP_SET_WAVE_LAUNCH_OVERRIDE:
	case KFD_IOC_DBG_TRAP_SET_WAVE_LAUNCH_MODE:
	case KFD_IOC_DBG_TRAP_SET_NODE_ADDRESS_WATCH:
	case KFD_IOC_DBG_TRAP_CLEAR_NODE_ADDRESS_WATCH:
	case KFD_IOC_DBG_TRAP_SET_FLAGS:
	case KFD_IOC_DBG_TRAP_GET_DEVICE_SNAPSHOT:
		/* wave-level debugging and device snapshots are not emulated (README.md) */
		r = -EOPNOTSUPP;
		break;
	default:
		r = -EINVAL;
	}
unlock_out:
	mutex_unlock(&target->mutex);
out:
	if (thread)
		put_task_struct(thread);
	if (mm)
		mmput(mm);
	if (pid)
		put_pid(pid);
	if (target)
		kfd_unref_process(target);
	return r;
}
