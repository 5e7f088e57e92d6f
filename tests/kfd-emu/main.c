// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * KFD emulator: /dev/kfd with the UAPI and semantics of amdkfd as of Linux 6.12.117 (KFD 1.17)
 * for queues, the debug-trap API and process lifetime, plus emulated GPUs whose queues consume
 * work, so gpreempt can be tested end to end without an AMD GPU. A test fixture, never shipped.
 *
 * Every function the tracer may probe has the name and prototype of its amdkfd counterpart
 * (comment "mirrors"), is global and noinline, so it appears in /proc/kallsyms under its own
 * name. Behaviour comments name the amdkfd fact they reproduce; docs/kfd.md has the sources.
 *
 * Emulated GPUs: gpu_id 0x1000 (topology node 1) and 0x2000 (node 2), see kfd_emu.h.
 * Emulated execution: one "CP" kthread per GPU executes the 64-byte AQL kernel-dispatch packets
 * of the mapped queues, one dispatch at a time for its cost (kernel_object in ns, or for a code
 * object's kernel its grid x ns_per_workitem), plus barrier-AND/OR and ROCr's PM4-IB vendor
 * packets completing amd_signal_t signals (README "ROCm's packets"), round-robin
 * between queues at dispatch boundaries; an unmap (HWS UNMAP_QUEUES of every dynamic queue on
 * the GPU) stops the running dispatch, which keeps its remaining cost, and writes the fence
 * amdkfd_fence_wait_timeout() polls preempt_delay_us later; after a map nothing runs for
 * restore_delay_us. README.md describes the packet format and the model.
 *
 * main.c: the module parameters, the state the other files share (the emulated GPUs' nodes and
 * device queue managers), the render-node registration amdgpu_emu.ko calls, and module init and
 * exit. kfd_emu.ko's other objects, one per concern, are mapped in README.md "Source files".
 */

#include "kfd_emu.h"

static_assert(sizeof(struct kfd_ioctl_create_queue_args) == 96);
static_assert(sizeof(struct hsa_kernel_dispatch_packet) == AQL_PACKET_SIZE);
static_assert(sizeof(struct hsa_barrier_packet) == AQL_PACKET_SIZE);
static_assert(sizeof(struct amd_aql_pm4_ib) == AQL_PACKET_SIZE);
static_assert(offsetof(struct amd_aql_pm4_ib, completion_signal) == 56);
static_assert(sizeof(struct amd_aql_barrier_value) == AQL_PACKET_SIZE);
static_assert(offsetof(struct amd_aql_barrier_value, cond) == 32);
static_assert(offsetof(struct amd_aql_barrier_value, completion_signal) == 56);
static_assert(sizeof(struct amd_signal) == 64);
static_assert(offsetof(struct amd_signal, value) == 8 && offsetof(struct amd_signal, start_ts) == 32);
static_assert(offsetof(struct kfd_ioctl_create_queue_args, queue_id) == 52);
static_assert(sizeof(struct kfd_ioctl_dbg_trap_args) == 32);
static_assert(offsetof(struct kfd_ioctl_dbg_trap_args, suspend_queues.num_queues) == 24);
static_assert(sizeof(struct kfd_queue_snapshot_entry) == 64);
static_assert(sizeof(struct kfd_runtime_info) == 16);
static_assert(sizeof(struct kfd_ioctl_update_queue_args) == 24);
static_assert(offsetof(struct queue, properties) == 40);
static_assert(offsetof(struct queue_properties, queue_id) == 8);
static_assert(offsetof(struct qcm_process_device, pqm) == 8);
static_assert(offsetof(struct kfd_process_device, qpd) == 16);

/* ---- module parameters ---- */

unsigned int num_gpus = 2;
module_param(num_gpus, uint, 0444);
MODULE_PARM_DESC(num_gpus, "Emulated GPU packages (1 or 2; gpu_id 0x1000, 0x2000 in SPX)");

/* README "Profiles": the emulated package (emu_gpu.h, topology.c) */
static char *profile = "mi210";
module_param(profile, charp, 0444);
MODULE_PARM_DESC(profile, "Emulated GPU: mi210 (gfx90a, default) or mi300x (gfx942)");

/*
 * The compute partition mode of an mi300x package (amdgpu's compute_partition; the kernel's
 * AMDGPU_SPX/DPX/QPX/CPX_PARTITION_MODE): spx, dpx, qpx or cpx, 1, 2, 4 or 8 KFD nodes per
 * package. mi210 has one XCC: spx only.
 */
static char *partition = "spx";
module_param(partition, charp, 0444);
MODULE_PARM_DESC(partition, "Compute partition mode of an mi300x: spx (default), dpx, qpx, cpx");

unsigned int emu_num_nodes;
const struct emu_profile *emu_prof;
static unsigned int emu_partitions = 1;

const struct emu_profile *kfd_emu_profile(void)
{
	return emu_prof;
}
EXPORT_SYMBOL_GPL(kfd_emu_profile);

unsigned int kfd_emu_partitions(void)
{
	return emu_partitions;
}
EXPORT_SYMBOL_GPL(kfd_emu_partitions);

unsigned int tick_us = 200;
module_param(tick_us, uint, 0644);
MODULE_PARM_DESC(tick_us,
		 "Emulated doorbell: the CP polls the write indices every tick_us (default 200)");

/* Emulator defaults, not measurements: a full CWSR save on MI300 moves ~150-180 MB (>= ~30 us at
 * HBM bandwidth) plus CP and fence overhead; no public figure for either delay exists.
 */
unsigned int preempt_delay_us = 200;
module_param(preempt_delay_us, uint, 0644);
MODULE_PARM_DESC(preempt_delay_us,
		 "Emulated CWSR save of an unmap, spent in amdkfd_fence_wait_timeout (default 200)");

unsigned int restore_delay_us = 100;
module_param(restore_delay_us, uint, 0644);
MODULE_PARM_DESC(restore_delay_us,
		 "Emulated restore after a map: nothing runs for restore_delay_us (default 100)");

/*
 * SUSPEND_QUEUES calls so far, read-only (not a KFD parameter): a test waits on it until a
 * controller's cycles are under way, instead of sleeping for a time that a loaded host can outlast.
 */
atomic_t suspend_calls = ATOMIC_INIT(0);

static int suspend_calls_get(char *buffer, const struct kernel_param *kp)
{
	return scnprintf(buffer, PAGE_SIZE, "%d\n", atomic_read(&suspend_calls));
}

static int suspend_calls_set(const char *val, const struct kernel_param *kp)
{
	return -EPERM;
}

static const struct kernel_param_ops suspend_calls_ops = {
	.set = suspend_calls_set,
	.get = suspend_calls_get,
};
module_param_cb(suspend_calls, &suspend_calls_ops, NULL, 0444);
MODULE_PARM_DESC(suspend_calls, "SUSPEND_QUEUES calls since the module loaded (read-only)");

/* amdgpu's queue_preemption_timeout_ms (default 9000, 0644) */
unsigned int queue_preemption_timeout_ms = 9000;
module_param(queue_preemption_timeout_ms, uint, 0644);
MODULE_PARM_DESC(queue_preemption_timeout_ms, "Fence wait timeout (default 9000)");

/*
 * The emulated duration of a code object's kernel (a dispatch whose kernel_object is a kernel
 * descriptor in the process's GPU memory: ROCr's and HIP's dispatches), which the CP cannot
 * take from kernel_object as it does for the cost convention: work-items of the grid times this.
 */
unsigned int ns_per_workitem = 1000;
module_param(ns_per_workitem, uint, 0644);
MODULE_PARM_DESC(ns_per_workitem,
		 "Emulated duration of a code object's kernel per work-item of its grid, ns (default 1000)");

/* Only what GET_VERSION answers, so that gpreempt's version-gated refusals (secondary contexts
 * from KFD 1.19, gfx12 trap support from 1.20) can be tested; the emulated ABI stays 1.17.
 */
unsigned int kfd_minor_version = KFD_IOCTL_MINOR_VERSION;
module_param(kfd_minor_version, uint, 0644);
MODULE_PARM_DESC(kfd_minor_version,
		 "KFD minor version GET_VERSION reports (default 17; the ABI emulated stays 1.17)");

/* ---- globals ---- */

struct kfd_node emu_nodes[EMU_MAX_GPUS];
struct device_queue_manager emu_dqms[EMU_MAX_GPUS];

struct workqueue_struct *kfd_process_wq;

static int kfd_char_dev_major = -1;
static struct class *kfd_class;
static struct device *kfd_device;
struct kobject *procfs_kobj;
static struct kobject *topology_kobj;
struct kobject *topology_nodes_kobj;
static struct kobject *emu_ctl_kobj;

void dqm_lock(struct device_queue_manager *dqm)
{
	mutex_lock(&dqm->lock_hidden);
}

void dqm_unlock(struct device_queue_manager *dqm)
{
	mutex_unlock(&dqm->lock_hidden);
}

struct kfd_process_device *kfd_process_device_data_by_id(struct kfd_process *p, u32 gpu_id)
{
	int i;

	for (i = 0; i < p->n_pdds; i++)
		if (p->pdds[i].dev->id == gpu_id)
			return &p->pdds[i];
	return NULL;
}

struct kfd_process_device *qpd_to_pdd(struct qcm_process_device *qpd)
{
	return container_of(qpd, struct kfd_process_device, qpd);
}

/* ---- the render nodes amdgpu_emu.ko registers (emu_gpu.h) ---- */

static DEFINE_MUTEX(render_mutex);
static const struct kfd_emu_render_ops *render_ops;

int kfd_emu_render_register(const struct kfd_emu_render_ops *ops, const int *render_minor)
{
	unsigned int i;
	int ret = 0;

	mutex_lock(&render_mutex);
	if (render_ops) {
		ret = -EBUSY;
	} else {
		render_ops = ops;
		for (i = 0; i < emu_num_nodes; i++)
			emu_nodes[i].drm_render_minor = render_minor[i];
	}
	mutex_unlock(&render_mutex);
	return ret;
}
EXPORT_SYMBOL_GPL(kfd_emu_render_register);

/* Processes holding a render file hold amdgpu_emu (the file's module), so none is left here. */
void kfd_emu_render_unregister(void)
{
	unsigned int i;

	mutex_lock(&render_mutex);
	render_ops = NULL;
	for (i = 0; i < emu_num_nodes; i++)
		emu_nodes[i].drm_render_minor = EMU_NO_RENDER_MINOR;
	mutex_unlock(&render_mutex);
}
EXPORT_SYMBOL_GPL(kfd_emu_render_unregister);

unsigned int kfd_emu_num_gpus(void)
{
	return emu_num_nodes;
}
EXPORT_SYMBOL_GPL(kfd_emu_num_gpus);

/* the emulated GPU index of a render node file, or -1 (not one of amdgpu_emu's) */
int render_gpu_of_file(struct file *file)
{
	int gpu = -1;

	mutex_lock(&render_mutex);
	if (render_ops)
		gpu = render_ops->gpu_of_file(file);
	mutex_unlock(&render_mutex);
	return gpu;
}

/* ---- module init / exit ---- */

static void kfd_emu_cleanup(void)
{
	unsigned int i;

	for (i = 0; i < EMU_MAX_GPUS; i++) {
		if (emu_dqms[i].cp_thread)
			kthread_stop(emu_dqms[i].cp_thread);
		emu_dqms[i].cp_thread = NULL;
		emu_nodes[i].kobj_node = NULL;
	}
	topology_remove();
	kobject_put(topology_nodes_kobj);
	kobject_put(topology_kobj);
	kobject_put(procfs_kobj);
	kobject_put(emu_ctl_kobj);
	if (kfd_device)
		device_destroy(kfd_class, MKDEV(kfd_char_dev_major, 0));
	if (!IS_ERR_OR_NULL(kfd_class))
		class_destroy(kfd_class);
	if (kfd_char_dev_major > 0)
		unregister_chrdev(kfd_char_dev_major, "kfd");
	if (kfd_process_wq)
		destroy_workqueue(kfd_process_wq);
}

static int __init kfd_emu_init(void)
{
	unsigned int i;
	int err = -ENOMEM;

	static const char *const modes[] = { "spx", "dpx", "qpx", "cpx" };

	emu_prof = emu_profile_by_name(profile);
	if (!emu_prof)
		return -EINVAL;
	for (i = 0; i < ARRAY_SIZE(modes) && strcmp(partition, modes[i]); i++)
		;
	if (i == ARRAY_SIZE(modes))
		return -EINVAL;
	emu_partitions = 1U << i;
	/* a partition holds whole XCCs (__aqua_vanjaram_is_valid_mode: num_xcc % partitions) */
	if (emu_prof->num_xcc % emu_partitions)
		return -EINVAL;
	if (num_gpus < 1 || num_gpus > 2)
		return -EINVAL;
	emu_num_nodes = num_gpus * emu_partitions;
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 17, 0)
	/*
	 * 6.17 added WQ_PERCPU; 7.x (Debian 7.3.4) warns at alloc_workqueue() when neither it nor
	 * WQ_UNBOUND is given ("workqueue: kfd_process_wq is using neither WQ_PERCPU or
	 * WQ_UNBOUND", kernel/workqueue.c) and sets WQ_PERCPU itself: say it, as the default was.
	 */
	kfd_process_wq = alloc_workqueue("kfd_process_wq", WQ_PERCPU, 0);
#else
	kfd_process_wq = alloc_workqueue("kfd_process_wq", 0, 0);
#endif
	if (!kfd_process_wq)
		return -ENOMEM;
	for (i = 0; i < emu_num_nodes; i++) {
		struct device_queue_manager *dqm = &emu_dqms[i];

		/*
		 * Fixed gpu ids: package p's partition k is 0x1000 * (p + 1) + k (SPX: 0x1000,
		 * 0x2000). The kernel hashes each node's properties and XCC mask instead
		 * (kfd_generate_gpu_id, 6.5+), so partitions of a package differ there too.
		 */
		emu_nodes[i].package = i / emu_partitions;
		emu_nodes[i].partition = i % emu_partitions;
		emu_nodes[i].id = EMU_GPU_ID0 * (emu_nodes[i].package + 1) + emu_nodes[i].partition;
		emu_nodes[i].node_id = i + 1;
		emu_node_init_props(&emu_nodes[i]);
		emu_nodes[i].drm_render_minor = EMU_NO_RENDER_MINOR;
		emu_nodes[i].dqm = dqm;
		dqm->dev = &emu_nodes[i];
		mutex_init(&dqm->lock_hidden);
		mutex_init(&dqm->hw_lock);
		INIT_LIST_HEAD(&dqm->queues);
		init_waitqueue_head(&dqm->destroy_wait);
		init_waitqueue_head(&dqm->cp_wait);
		seqcount_mutex_init(&dqm->occ_seq, &dqm->hw_lock);
		dqm->occ.stop_ns = U64_MAX;
		dqm->fence_addr = &dqm->fence_mem;
		/* one HWS (a CP and its runlist) per KFD node: each partition schedules its own */
		dqm->cp_thread = kthread_run(emu_cp_thread, dqm, "kfd_emu_cp%u", i);
		if (IS_ERR(dqm->cp_thread)) {
			err = PTR_ERR(dqm->cp_thread);
			dqm->cp_thread = NULL;
			goto fail;
		}
		/*
		 * A GPU's command processor is hardware: it does not wait for a CPU. The emulated one
		 * is a kthread, which at normal priority would queue behind every busy process of the
		 * guest (clients that poll for completions on the CPU, as HIP's synchronize does) and
		 * stretch every dispatch, save and fence with the guest's CPU load. SCHED_FIFO (50,
		 * sched_set_fifo, Linux 5.9+) keeps its timeline on time; it sleeps between events
		 * (wait_event_*), so it takes no CPU it does not use.
		 */
		sched_set_fifo(dqm->cp_thread);
	}

	kfd_char_dev_major = register_chrdev(0, "kfd", &kfd_fops);
	if (kfd_char_dev_major < 0) {
		err = kfd_char_dev_major;
		goto fail;
	}
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
	kfd_class = class_create("kfd");
#else
	kfd_class = class_create(THIS_MODULE, "kfd");
#endif
	if (IS_ERR(kfd_class)) {
		err = PTR_ERR(kfd_class);
		goto fail;
	}
	kfd_device = device_create(kfd_class, NULL, MKDEV(kfd_char_dev_major, 0), NULL, "kfd");
	if (IS_ERR(kfd_device)) {
		err = PTR_ERR(kfd_device);
		kfd_device = NULL;
		goto fail;
	}
	err = -ENOMEM;
	procfs_kobj = kobject_create_and_add("proc", &kfd_device->kobj);
	topology_kobj = kobject_create_and_add("topology", &kfd_device->kobj);
	if (!procfs_kobj || !topology_kobj)
		goto fail;
	topology_nodes_kobj = kobject_create_and_add("nodes", topology_kobj);
	if (!topology_nodes_kobj)
		goto fail;
	if (sysfs_create_file(topology_kobj, &generation_id_attr.attr) ||
	    sysfs_create_file(topology_kobj, &system_properties_attr.attr))
		goto fail;
	if (!add_topology_node(0))	/* node 0: the CPU, gpu_id 0 */
		goto fail;
	for (i = 0; i < emu_num_nodes; i++) {
		emu_nodes[i].kobj_node = add_topology_node(emu_nodes[i].node_id);
		if (!emu_nodes[i].kobj_node)
			goto fail;
	}
	emu_ctl_kobj = kobject_create_and_add("kfd_emu", kernel_kobj);
	if (!emu_ctl_kobj)
		goto fail;
	if (sysfs_create_file(emu_ctl_kobj, &evict_attr.attr) ||
	    sysfs_create_file(emu_ctl_kobj, &restore_attr.attr) ||
	    sysfs_create_file(emu_ctl_kobj, &cp_stats_attr.attr) ||
	    sysfs_create_file(emu_ctl_kobj, &stuck_queue_attr.attr))
		goto fail;
	pr_info("kfd_emu: KFD emulator (KFD %d.%d): %u %s (%s) package(s), %s, %u KFD node(s) from gpu_id 0x%x\n",
		KFD_IOCTL_MAJOR_VERSION, KFD_IOCTL_MINOR_VERSION, num_gpus, emu_prof->name,
		emu_prof->gfx_name, partition, emu_num_nodes, emu_nodes[0].id);
	return 0;
fail:
	kfd_emu_cleanup();
	return err;
}

static void __exit kfd_emu_exit(void)
{
	/* processes hold module references, so none is left here; wait for their last callbacks */
	flush_workqueue(kfd_process_wq);
	mmu_notifier_synchronize();
	kfd_emu_cleanup();
}

module_init(kfd_emu_init);
module_exit(kfd_emu_exit);
MODULE_DESCRIPTION("KFD emulator for gpreempt tests (emulated AMD GPU queues behind /dev/kfd)");
MODULE_LICENSE("Dual MIT/GPL");
