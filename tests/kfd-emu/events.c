// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * KFD events (kfd_events.c): the signal page, CREATE/DESTROY/SET/RESET_EVENT, WAIT_EVENTS and the
 * interrupts that completion signals raise.
 *
 * Part of the KFD emulator, kfd_emu.ko: main.c describes it, README.md "Source files" maps it.
 */

#include "kfd_emu.h"

/*
 * ---- events (kfd_events.c, 6.12.117) ----
 *
 * Signal and debug events take ids 0..4095, which are their slots in the signal page (u64 each,
 * UNSIGNALED_EVENT_SLOT = -1 until signalled); other types take ids from 4096. The first
 * CREATE_EVENT of a dGPU process names the event page, a GTT object the process allocated
 * (kfd_kmap_event_page); without one KFD allocates the page itself. SET_EVENT raises a signal
 * event from the CPU; WAIT_EVENTS sleeps until any (or all) of its events fire, the timeout
 * (ms; 0 polls, 0xFFFFFFFF waits forever) passes, or a signal arrives (-ERESTARTSYS).
 */

#define EMU_UNSIGNALED_EVENT_SLOT ((u64)-1)
#define EMU_EVENT_TIMEOUT_INFINITE 0xFFFFFFFFu

struct emu_event {
	u32 id;
	u32 type;
	bool auto_reset;
	bool signaled;
	u64 age;		/* event_age: 1 at creation, +1 per signal (never 0) */
	struct list_head waiters;	/* struct emu_waiter of WAIT_EVENTS calls (ev->wq in KFD) */
};

static bool emu_event_is_signal(u32 type)
{
	return type == KFD_IOC_EVENT_SIGNAL || type == KFD_IOC_EVENT_DEBUG_EVENT;
}

static int emu_event_free_cb(int id, void *ptr, void *data)
{
	kfree(ptr);
	return 0;
}

void emu_process_free_events(struct kfd_process *p)
{
	idr_for_each(&p->event_idr, emu_event_free_cb, NULL);
	idr_destroy(&p->event_idr);
	if (p->signal_page_owned)
		vfree(p->signal_page);
}

static void emu_event_fire(struct emu_event *ev);

/*
 * kfd_signal_event_interrupt() (kfd_events.c, 6.12.117) for the interrupt an interrupt signal's
 * completion raises, its payload the signal's event_id: the event whose slot is signalled (the
 * CP just wrote the mailbox) is acknowledged (slot back to UNSIGNALED) and set; if that slot is
 * not signalled, every signalled slot's event is (KFD's exhaustive search). From the CP thread,
 * under hw_lock (events_lock is taken under it, never the other way round).
 */
void emu_signal_interrupt(struct device_queue_manager *dqm, struct kfd_process *p,
			  u32 event_id)
{
	struct emu_event *ev;
	unsigned int set = 0;
	int id;

	mutex_lock(&p->events_lock);
	if (!p->signal_page)
		goto out;
	ev = event_id < KFD_SIGNAL_EVENT_LIMIT ? idr_find(&p->event_idr, event_id) : NULL;
	if (ev && emu_event_is_signal(ev->type) &&
	    READ_ONCE(p->signal_page[event_id]) != EMU_UNSIGNALED_EVENT_SLOT) {
		WRITE_ONCE(p->signal_page[event_id], EMU_UNSIGNALED_EVENT_SLOT);
		emu_event_fire(ev);
		set = 1;
		goto out;
	}
	idr_for_each_entry(&p->event_idr, ev, id) {
		if (id >= KFD_SIGNAL_EVENT_LIMIT || !emu_event_is_signal(ev->type) ||
		    READ_ONCE(p->signal_page[id]) == EMU_UNSIGNALED_EVENT_SLOT)
			continue;
		WRITE_ONCE(p->signal_page[id], EMU_UNSIGNALED_EVENT_SLOT);
		emu_event_fire(ev);
		set++;
	}
out:
	dqm->stats.events_set += set;
	mutex_unlock(&p->events_lock);
	if (set)
		wake_up_all(&p->event_wq);
}

/* kfd_kmap_event_page(): the page once, from a GTT object of the process (p->mutex held) */
static int emu_set_event_page(struct kfd_process *p, u64 handle)
{
	struct emu_bo *bo;

	if (p->signal_page)
		return -EINVAL;	/* "Event page is already set" */
	if (!kfd_process_device_data_by_id(p, EMU_HANDLE_GPU(handle)))
		return -EINVAL;
	bo = emu_bo_lookup(p, handle);
	if (!bo || bo->size < KFD_SIGNAL_EVENT_LIMIT * 8)
		return -EINVAL;
	mutex_lock(&p->bo_lock);
	if (!emu_bo_backing(bo)) {
		mutex_unlock(&p->bo_lock);
		return -ENOMEM;
	}
	mutex_unlock(&p->bo_lock);
	memset(bo->kaddr, 0xff, KFD_SIGNAL_EVENT_LIMIT * 8);
	p->signal_page = bo->kaddr;
	return 0;
}

int kfd_ioctl_create_event(struct file *filp, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_create_event_args *args = data;
	struct emu_event *ev;
	int id, err = 0;

	if (args->event_page_offset) {
		mutex_lock(&p->mutex);
		mutex_lock(&p->events_lock);
		err = emu_set_event_page(p, args->event_page_offset);
		mutex_unlock(&p->events_lock);
		mutex_unlock(&p->mutex);
		if (err)
			return err;
	}
	ev = kzalloc(sizeof(*ev), GFP_KERNEL);
	if (!ev)
		return -ENOMEM;
	ev->type = args->event_type;
	ev->auto_reset = args->auto_reset != 0;
	INIT_LIST_HEAD(&ev->waiters);
	args->event_page_offset = 0;
	mutex_lock(&p->events_lock);
	if (emu_event_is_signal(ev->type)) {
		if (!p->signal_page) {
			p->signal_page = vmalloc_user(KFD_SIGNAL_EVENT_LIMIT * 8);
			if (!p->signal_page) {
				err = -ENOMEM;
				goto fail;
			}
			p->signal_page_owned = true;
			memset(p->signal_page, 0xff, KFD_SIGNAL_EVENT_LIMIT * 8);
		}
		if (p->signal_event_count == KFD_SIGNAL_EVENT_LIMIT) {
			err = -ENOSPC;
			goto fail;
		}
		id = idr_alloc(&p->event_idr, ev, 0, KFD_SIGNAL_EVENT_LIMIT, GFP_KERNEL);
		if (id < 0) {
			err = -ENOSPC;
			goto fail;
		}
		p->signal_event_count++;
		p->signal_page[id] = EMU_UNSIGNALED_EVENT_SLOT;
		/* KFD_MMAP_TYPE_EVENTS (kfd_mmap() takes the offset as vm_pgoff << PAGE_SHIFT) */
		args->event_page_offset = 0x2ULL << 62;
		args->event_slot_index = id;
	} else {
		id = idr_alloc(&p->event_idr, ev, KFD_SIGNAL_EVENT_LIMIT, 0, GFP_KERNEL);
		if (id < 0) {
			err = id;
			goto fail;
		}
	}
	ev->id = id;
	ev->age = 1;
	args->event_id = id;
	args->event_trigger_data = id;
	mutex_unlock(&p->events_lock);
	return 0;
fail:
	mutex_unlock(&p->events_lock);
	kfree(ev);
	return err;
}

struct emu_waiter {
	u32 id;
	u64 age;		/* the caller's last_event_age (0: not used) */
	bool activated;
	struct emu_event *ev;	/* NULL once the event is destroyed */
	struct list_head node;	/* on ev->waiters while waiting */
};

/* kfd_event_destroy(): unknown id -EINVAL; waiters on it wake and fail */
int kfd_ioctl_destroy_event(struct file *filp, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_destroy_event_args *args = data;
	struct emu_waiter *w, *next;
	struct emu_event *ev;
	int err = 0;

	mutex_lock(&p->events_lock);
	ev = idr_find(&p->event_idr, args->event_id);
	if (!ev) {
		err = -EINVAL;
	} else {
		/* destroy_event(): every waiter's event goes, so its wait fails */
		list_for_each_entry_safe(w, next, &ev->waiters, node) {
			w->ev = NULL;
			list_del_init(&w->node);
		}
		idr_remove(&p->event_idr, ev->id);
		if (emu_event_is_signal(ev->type))
			p->signal_event_count--;
		kfree(ev);
	}
	mutex_unlock(&p->events_lock);
	wake_up_all(&p->event_wq);
	return err;
}

/*
 * set_event() (kfd_events.c, 6.12.117): every waiter sleeping on the event is activated, and
 * the event stays signalled unless it is auto-reset and woke someone ("Auto reset if the list is
 * non-empty and we're waking someone"); age + 1. ROCr 5.2 has two threads on one event (the
 * queue event: hsa_queue_destroy's wait and the async-handler thread): each must wake.
 */
static void emu_event_fire(struct emu_event *ev)
{
	struct emu_waiter *w;

	ev->signaled = !ev->auto_reset || list_empty(&ev->waiters);
	if (!++ev->age)
		ev->age = 2;
	list_for_each_entry(w, &ev->waiters, node)
		w->activated = true;
}

/* kfd_set_event() / kfd_reset_event(): unknown id or not a signal event -EINVAL */
int kfd_ioctl_set_event(struct file *filp, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_set_event_args *args = data;
	struct emu_event *ev;
	int err = 0;

	mutex_lock(&p->events_lock);
	ev = idr_find(&p->event_idr, args->event_id);
	if (!ev || ev->type != KFD_IOC_EVENT_SIGNAL)
		err = -EINVAL;
	else
		emu_event_fire(ev);
	mutex_unlock(&p->events_lock);
	wake_up_all(&p->event_wq);
	return err;
}

int kfd_ioctl_reset_event(struct file *filp, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_reset_event_args *args = data;
	struct emu_event *ev;
	int err = 0;

	mutex_lock(&p->events_lock);
	ev = idr_find(&p->event_idr, args->event_id);
	if (!ev || ev->type != KFD_IOC_EVENT_SIGNAL)
		err = -EINVAL;
	else
		ev->signaled = false;
	mutex_unlock(&p->events_lock);
	return err;
}

/*
 * init_event_waiter() (6.12.117), under events_lock: the waiter joins the event's list, activated
 * at once if the event is signalled (an auto-reset event is consumed) or, when the caller gave a
 * last_event_age, if the event's age moved since.
 */
static void emu_waiter_init(struct emu_waiter *w, struct emu_event *ev)
{
	w->ev = ev;
	w->activated = ev->signaled;
	ev->signaled = ev->signaled && !ev->auto_reset;
	if (!w->activated && w->age && emu_event_is_signal(ev->type) && ev->age != w->age)
		w->activated = true;
	list_add(&w->node, &ev->waiters);
}

/*
 * test_event_condition() (6.12.117): COMPLETE when any (all) waiters are activated, FAIL when an
 * event was destroyed, else TIMEOUT (still waiting).
 */
static u32 emu_events_test(struct emu_waiter *w, u32 n, bool all)
{
	u32 i, activated = 0;

	for (i = 0; i < n; i++) {
		if (!w[i].ev)
			return KFD_IOC_WAIT_RESULT_FAIL;
		activated += w[i].activated;
	}
	if (all ? activated == n : activated > 0)
		return KFD_IOC_WAIT_RESULT_COMPLETE;
	return KFD_IOC_WAIT_RESULT_TIMEOUT;
}

int kfd_ioctl_wait_events(struct file *filp, struct kfd_process *p, void *data)
{
	struct kfd_ioctl_wait_events_args *args = data;
	struct kfd_event_data __user *events = u64_to_user_ptr(args->events_ptr);
	long timeout = args->timeout == 0 ? 0 :
		       args->timeout == EMU_EVENT_TIMEOUT_INFINITE ? MAX_SCHEDULE_TIMEOUT :
		       (long)msecs_to_jiffies(args->timeout) + 1;
	struct emu_waiter *w;
	u32 i, result;
	int err = 0;

	w = kcalloc(args->num_events, sizeof(*w), GFP_KERNEL);
	if (args->num_events && !w)
		return -ENOMEM;
	for (i = 0; i < args->num_events; i++) {
		struct kfd_event_data ed;

		if (copy_from_user(&ed, &events[i], sizeof(ed))) {
			err = -EFAULT;
			goto out;
		}
		w[i].id = ed.event_id;
		w[i].age = ed.signal_event_data.last_event_age;
	}
	mutex_lock(&p->events_lock);
	for (i = 0; i < args->num_events; i++)
		if (!idr_find(&p->event_idr, w[i].id)) {
			mutex_unlock(&p->events_lock);
			err = -EINVAL;
			goto out;
		}
	for (i = 0; i < args->num_events; i++)
		emu_waiter_init(&w[i], idr_find(&p->event_idr, w[i].id));
	for (;;) {
		DEFINE_WAIT(wait);

		prepare_to_wait(&p->event_wq, &wait, TASK_INTERRUPTIBLE);
		result = emu_events_test(w, args->num_events, args->wait_for_all);
		mutex_unlock(&p->events_lock);
		if (result != KFD_IOC_WAIT_RESULT_TIMEOUT || timeout <= 0) {
			finish_wait(&p->event_wq, &wait);
			break;
		}
		if (signal_pending(current)) {
			finish_wait(&p->event_wq, &wait);
			err = -ERESTARTSYS;
			break;
		}
		timeout = schedule_timeout(timeout);
		finish_wait(&p->event_wq, &wait);
		mutex_lock(&p->events_lock);
	}
	args->wait_result = result;
	/*
	 * The waiters leave their events' lists; copy_signaled_event_data(): an activated signal
	 * event's age goes back to the caller that gave one (w[i].age, 0 for none to copy).
	 */
	mutex_lock(&p->events_lock);
	for (i = 0; i < args->num_events; i++) {
		struct emu_event *ev = w[i].ev;

		if (ev)
			list_del(&w[i].node);
		if (err || result != KFD_IOC_WAIT_RESULT_COMPLETE || !ev || !w[i].activated ||
		    !w[i].age || !emu_event_is_signal(ev->type))
			w[i].age = 0;
		else
			w[i].age = ev->age;
	}
	mutex_unlock(&p->events_lock);
	for (i = 0; i < args->num_events && !err; i++)
		if (w[i].age && put_user(w[i].age, &events[i].signal_event_data.last_event_age))
			err = -EFAULT;
out:
	kfree(w);
	return err;
}
