/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * KFD emulator: a test fixture for gpreempt, never shipped with it.
 *
 * Internal structures carry the names of the amdkfd structures of Linux 6.12.117
 * (drivers/gpu/drm/amd/amdkfd/kfd_priv.h) but hold only what the emulator needs. Where a probe
 * may read a field without BTF, the offset matches amdkfd (docs/kfd.md §3.3):
 * queue.properties @40, queue_properties.queue_id @8 (so q->properties.queue_id is q+48),
 * qcm_process_device.pqm @8, process_queue_manager.process @0,
 * kfd_process_device {dev @0, process @8, qpd @16}.
 *
 * Emulated GPUs (fixed topology gpu ids): EMU_GPU_ID0 = 0x1000 (4096) on topology node 1 and
 * EMU_GPU_ID1 = 0x2000 (8192) on node 2 (module parameter num_gpus = 1 keeps only the first).
 *
 * The one header of kfd_emu.ko's objects (Kbuild kfd_emu-y, README.md "Source files"), which
 * each includes alone: the kernel headers they use, the UAPI, the structures, the prototypes of
 * the probed functions and, at the end, what one object defines for another.
 */
#ifndef KFD_EMU_H
#define KFD_EMU_H

/* the objects' kernel headers, then the structures' */
#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/fs.h>
#include <linux/file.h>
#include <linux/device.h>
#include <linux/kthread.h>
#include <linux/sched/mm.h>
#include <linux/sched/task.h>
#include <linux/sched/signal.h>
#include <linux/ptrace.h>
#include <linux/pid.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/delay.h>
#include <linux/bitmap.h>
#include <linux/jiffies.h>
#include <linux/version.h>
#include <linux/log2.h>
#include <linux/vmalloc.h>
#include <linux/mm.h>
#include <linux/overflow.h>

#include <linux/types.h>
#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/kobject.h>
#include <linux/kref.h>
#include <linux/mmu_notifier.h>
#include <linux/semaphore.h>
#include <linux/sysfs.h>
#include <linux/wait.h>
#include <linux/workqueue.h>
#include <linux/ioctl.h>
#include <linux/idr.h>
#include <linux/seqlock.h>

#include "emu_gpu.h"

#define EMU_GPU_ID0 0x1000
#define EMU_GPU_ID1 0x2000

/*
 * Secondary KFD contexts (Linux 7.0, KFD 1.19): built against 7.x headers the emulator mirrors
 * the series "amdkfd: introduce new ioctl AMDKFD_IOC_CREATE_PROCESS" (Zhu Lingshan, V7, merged
 * for v7.0-rc1: cc6b66d661fd the ioctl, e3491fa3f3c9 "process debug trap ioctl only on a primary
 * context", fac682a1d1af context ids and sysfs, 65cce2a172ff a secondary dies with its file,
 * e1b73b64271d "remove DIQ support"): AMDKFD_IOC_CREATE_PROCESS, kfd_process.context_id, the
 * context_<id> sysfs directories, DBG_TRAP's -EOPNOTSUPP, the queue-type enum without DIQ and
 * GET_VERSION 1.19. Older builds stay 6.12.117's KFD 1.17 (README "Secondary contexts").
 */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(7, 0, 0)
#define EMU_SECONDARY_CONTEXTS 1
#else
#define EMU_SECONDARY_CONTEXTS 0
#endif

/* ---- UAPI (include/uapi/linux/kfd_ioctl.h, KFD 1.17 as in Linux 6.12.117; MIT licence) ---- */

#define KFD_IOCTL_MAJOR_VERSION 1
#if EMU_SECONDARY_CONTEXTS
#define KFD_IOCTL_MINOR_VERSION 19	/* "1.19 - Add a new ioctl to craete secondary kfd processes" */
#else
#define KFD_IOCTL_MINOR_VERSION 17
#endif

struct kfd_ioctl_get_version_args {
	__u32 major_version;
	__u32 minor_version;
};

#define KFD_IOC_QUEUE_TYPE_COMPUTE 0x0
#define KFD_IOC_QUEUE_TYPE_SDMA 0x1
#define KFD_IOC_QUEUE_TYPE_COMPUTE_AQL 0x2
#define KFD_IOC_QUEUE_TYPE_SDMA_XGMI 0x3
#define KFD_IOC_QUEUE_TYPE_SDMA_BY_ENG_ID 0x4

#define KFD_MAX_QUEUE_PERCENTAGE 100
#define KFD_MAX_QUEUE_PRIORITY 15

struct kfd_ioctl_create_queue_args {
	__u64 ring_base_address;
	__u64 write_pointer_address;
	__u64 read_pointer_address;
	__u64 doorbell_offset;
	__u32 ring_size;
	__u32 gpu_id;
	__u32 queue_type;
	__u32 queue_percentage;
	__u32 queue_priority;
	__u32 queue_id;
	__u64 eop_buffer_address;
	__u64 eop_buffer_size;
	__u64 ctx_save_restore_address;
	__u32 ctx_save_restore_size;
	__u32 ctl_stack_size;
	__u32 sdma_engine_id;
	__u32 pad;
};

struct kfd_ioctl_destroy_queue_args {
	__u32 queue_id;
	__u32 pad;
};

struct kfd_ioctl_update_queue_args {
	__u64 ring_base_address;
	__u32 queue_id;
	__u32 ring_size;
	__u32 queue_percentage;
	__u32 queue_priority;
};

#define KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK 1
#define KFD_RUNTIME_ENABLE_MODE_TTMP_SAVE_MASK 2

struct kfd_ioctl_runtime_enable_args {
	__u64 r_debug;
	__u32 mode_mask;
	__u32 capabilities_mask;
};

enum kfd_dbg_trap_operations {
	KFD_IOC_DBG_TRAP_ENABLE = 0,
	KFD_IOC_DBG_TRAP_DISABLE = 1,
	KFD_IOC_DBG_TRAP_SEND_RUNTIME_EVENT = 2,
	KFD_IOC_DBG_TRAP_SET_EXCEPTIONS_ENABLED = 3,
	KFD_IOC_DBG_TRAP_SET_WAVE_LAUNCH_OVERRIDE = 4,
	KFD_IOC_DBG_TRAP_SET_WAVE_LAUNCH_MODE = 5,
	KFD_IOC_DBG_TRAP_SUSPEND_QUEUES = 6,
	KFD_IOC_DBG_TRAP_RESUME_QUEUES = 7,
	KFD_IOC_DBG_TRAP_SET_NODE_ADDRESS_WATCH = 8,
	KFD_IOC_DBG_TRAP_CLEAR_NODE_ADDRESS_WATCH = 9,
	KFD_IOC_DBG_TRAP_SET_FLAGS = 10,
	KFD_IOC_DBG_TRAP_QUERY_DEBUG_EVENT = 11,
	KFD_IOC_DBG_TRAP_QUERY_EXCEPTION_INFO = 12,
	KFD_IOC_DBG_TRAP_GET_QUEUE_SNAPSHOT = 13,
	KFD_IOC_DBG_TRAP_GET_DEVICE_SNAPSHOT = 14,
};

struct kfd_ioctl_dbg_trap_enable_args {
	__u64 exception_mask;
	__u64 rinfo_ptr;
	__u32 rinfo_size;
	__u32 dbg_fd;
};

struct kfd_ioctl_dbg_trap_send_runtime_event_args {
	__u64 exception_mask;
	__u32 gpu_id;
	__u32 queue_id;
};

struct kfd_ioctl_dbg_trap_set_exceptions_enabled_args {
	__u64 exception_mask;
};

struct kfd_ioctl_dbg_trap_suspend_queues_args {
	__u64 exception_mask;
	__u64 queue_array_ptr;
	__u32 num_queues;
	__u32 grace_period;
};

struct kfd_ioctl_dbg_trap_resume_queues_args {
	__u64 queue_array_ptr;
	__u32 num_queues;
	__u32 pad;
};

struct kfd_ioctl_dbg_trap_query_debug_event_args {
	__u64 exception_mask;
	__u32 gpu_id;
	__u32 queue_id;
};

struct kfd_ioctl_dbg_trap_query_exception_info_args {
	__u64 info_ptr;
	__u32 info_size;
	__u32 source_id;
	__u32 exception_code;
	__u32 clear_exception;
};

struct kfd_ioctl_dbg_trap_queue_snapshot_args {
	__u64 exception_mask;
	__u64 snapshot_buf_ptr;
	__u32 num_queues;
	__u32 entry_size;
};

struct kfd_ioctl_dbg_trap_args {
	__u32 pid;
	__u32 op;
	union {
		struct kfd_ioctl_dbg_trap_enable_args enable;
		struct kfd_ioctl_dbg_trap_send_runtime_event_args send_runtime_event;
		struct kfd_ioctl_dbg_trap_set_exceptions_enabled_args set_exceptions_enabled;
		struct kfd_ioctl_dbg_trap_suspend_queues_args suspend_queues;
		struct kfd_ioctl_dbg_trap_resume_queues_args resume_queues;
		struct kfd_ioctl_dbg_trap_query_debug_event_args query_debug_event;
		struct kfd_ioctl_dbg_trap_query_exception_info_args query_exception_info;
		struct kfd_ioctl_dbg_trap_queue_snapshot_args queue_snapshot;
	};
};

struct kfd_queue_snapshot_entry {
	__u64 exception_status;
	__u64 ring_base_address;
	__u64 write_pointer_address;
	__u64 read_pointer_address;
	__u64 ctx_save_restore_address;
	__u32 queue_id;
	__u32 gpu_id;
	__u32 ring_size;
	__u32 queue_type;
	__u32 ctx_save_restore_area_size;
	__u32 reserved;
};

struct kfd_runtime_info {
	__u64 r_debug;
	__u32 runtime_state;
	__u32 ttmp_setup;
};

enum {
	DEBUG_RUNTIME_STATE_DISABLED = 0,
	DEBUG_RUNTIME_STATE_ENABLED = 1,
	DEBUG_RUNTIME_STATE_ENABLED_BUSY = 2,
	DEBUG_RUNTIME_STATE_ENABLED_ERROR = 3,
};

#define KFD_DBG_QUEUE_ERROR_BIT 30
#define KFD_DBG_QUEUE_INVALID_BIT 31
#define KFD_DBG_QUEUE_ERROR_MASK (1U << KFD_DBG_QUEUE_ERROR_BIT)
#define KFD_DBG_QUEUE_INVALID_MASK (1U << KFD_DBG_QUEUE_INVALID_BIT)

/* enum kfd_dbg_trap_exception_code (kfd_ioctl.h, 6.12.117): the packet errors the emulated CP raises */
#define EC_QUEUE_PACKET_DISPATCH_DIM_INVALID 16
#define EC_QUEUE_PACKET_DISPATCH_CODE_INVALID 18
#define EC_QUEUE_PACKET_RESERVED 19
#define EC_QUEUE_PACKET_UNSUPPORTED 20
#define EC_QUEUE_PACKET_DISPATCH_WORK_GROUP_SIZE_INVALID 21
#define EC_QUEUE_PACKET_VENDOR_UNSUPPORTED 23
#define EC_QUEUE_NEW 31
#define EC_PROCESS_RUNTIME 48
#define KFD_EC_MASK(ec) (1ULL << ((ec) - 1))
/* kfd_ioctl.h: queue exceptions 1..31, device 32..47, process 48..63 */
#define KFD_DBG_EC_TYPE_IS_QUEUE(ec) ((ec) >= 1 && (ec) <= 31)
#define KFD_DBG_EC_TYPE_IS_DEVICE(ec) ((ec) >= 32 && (ec) <= 47)
#define KFD_DBG_EC_TYPE_IS_PROCESS(ec) ((ec) >= 48 && (ec) <= 63)

/*
 * struct kfd_context_save_area_header (kfd_ioctl.h, 6.12.117): the head of the CWSR area at
 * ctx_save_restore_address. KFD reports a queue exception to a runtime that has no debugger by
 * OR-ing the exception mask into the u64 at err_payload_addr (kfd_send_exception_to_runtime).
 */
struct kfd_context_save_area_header {
	struct {
		__u32 control_stack_offset;
		__u32 control_stack_size;
		__u32 wave_state_offset;
		__u32 wave_state_size;
	} wave_state;
	__u32 debug_offset;
	__u32 debug_size;
	__u64 err_payload_addr;
	__u32 err_event_id;
	__u32 reserved1;
};

/* ---- AQL (HSA 1.2 hsa.h, the packet format of an AQL queue's ring) ---- */

#define HSA_PACKET_TYPE_VENDOR_SPECIFIC 0
#define HSA_PACKET_TYPE_INVALID 1
#define HSA_PACKET_TYPE_KERNEL_DISPATCH 2
#define HSA_PACKET_TYPE_BARRIER_AND 3
#define HSA_PACKET_TYPE_AGENT_DISPATCH 4
#define HSA_PACKET_TYPE_BARRIER_OR 5
#define HSA_PACKET_HEADER_TYPE_MASK 0xff	/* header bits 0..7 */
#define HSA_KERNEL_DISPATCH_PACKET_SETUP_DIMENSIONS_MASK 0x3
#define AQL_PACKET_SIZE 64

/*
 * hsa_kernel_dispatch_packet_t. The emulator runs no code, so for the project's clients
 * kernel_object, which names the code object to run, carries the dispatch's emulated GPU time in
 * nanoseconds instead (0 is refused as EC_QUEUE_PACKET_DISPATCH_CODE_INVALID, like a null code
 * object), and completion_signal, a signal handle on hardware, is the user address of a struct
 * emu_completion_record (0: no record). README.md, "Packet format". A kernel_object inside the
 * process's GPU memory is a real kernel descriptor instead, with an amd_signal_t completion
 * signal (README.md, "ROCm's packets").
 */
struct hsa_kernel_dispatch_packet {
	__u16 header;
	__u16 setup;
	__u16 workgroup_size_x;
	__u16 workgroup_size_y;
	__u16 workgroup_size_z;
	__u16 reserved0;
	__u32 grid_size_x;
	__u32 grid_size_y;
	__u32 grid_size_z;
	__u32 private_segment_size;
	__u32 group_segment_size;
	__u64 kernel_object;		/* emulator: cost in ns, or a kernel descriptor's address */
	__u64 kernarg_address;
	__u64 reserved2;
	__u64 completion_signal;	/* an emu_completion_record or an amd_signal_t (above) */
};

/*
 * hsa_barrier_and_packet_t / hsa_barrier_or_packet_t (same layout): up to five dependency
 * signals (0: none) and the completion signal. An AND barrier completes when every dependency's
 * value is 0, an OR barrier when any is (or when it has none).
 */
struct hsa_barrier_packet {
	__u16 header;
	__u16 reserved0;
	__u32 reserved1;
	__u64 dep_signal[5];
	__u64 reserved2;
	__u64 completion_signal;
};

/*
 * amd_signal_t (ROCr 5.2, src/inc/amd_hsa_signal.h, as Debian's libhsa-runtime-dev installs it
 * in /usr/include/hsa/): 64 bytes, 64-byte aligned; an hsa_signal_t handle is its address. The
 * CP writes start_ts and end_ts (GPU clock ticks), decrements value, and for an interrupt signal
 * (event_mailbox_ptr non-zero) writes event_id to the mailbox and raises the interrupt that makes
 * KFD set the event.
 */
struct amd_signal {
	__s64 kind;
	__s64 value;
	__u64 event_mailbox_ptr;
	__u32 event_id;
	__u32 reserved1;
	__u64 start_ts;
	__u64 end_ts;
	__u64 queue_ptr;
	__u32 reserved3[2];
};

/*
 * AMD's vendor-specific AQL packet carrying a PM4 indirect buffer (ROCr 5.2 AqlQueue::ExecutePM4,
 * gfx9+): header type VENDOR_SPECIFIC, then the format, an INDIRECT_BUFFER command (4 dwords),
 * dw_cnt_remain (10) and the completion signal at 56 like every AQL packet.
 */
#define AMD_AQL_FORMAT_PM4_IB 1
struct amd_aql_pm4_ib {
	__u16 header;
	__u16 ven_hdr;
	__u32 ib_jump_cmd[4];
	__u32 dw_cnt_remain;
	__u32 reserved[8];
	__u64 completion_signal;
};

/*
 * AMD's barrier-value packet (ROCr 6.1 hsa_ext_amd.h hsa_amd_barrier_value_packet_t, format
 * HSA_AMD_PACKET_TYPE_BARRIER_VALUE = 2): the packet processor stops on it until
 * (signal's value & mask) cond value holds, a null signal being a met dependency, then completes
 * it. HIP 5.7 writes one per hipEventRecord (ROCclr waits on its own marker signal with it).
 * cond is an hsa_signal_condition_t: EQ 0, NE 1, LT 2, GTE 3.
 */
#define AMD_AQL_FORMAT_BARRIER_VALUE 2
#define HSA_SIGNAL_CONDITION_EQ 0
#define HSA_SIGNAL_CONDITION_NE 1
#define HSA_SIGNAL_CONDITION_LT 2
#define HSA_SIGNAL_CONDITION_GTE 3
struct amd_aql_barrier_value {
	__u16 header;
	__u16 ven_hdr;
	__u32 reserved0;
	__u64 signal;
	__s64 value;
	__s64 mask;
	__u32 cond;
	__u32 reserved1;
	__u64 reserved2[2];
	__u64 completion_signal;
};

/*
 * Written by the emulated CP when a dispatch completes (64 bytes, status last). Times are
 * CLOCK_MONOTONIC ns on the emulated GPU's timeline: start/end of the dispatch, the end of its
 * first run segment and the start of its last (equal to end/start when never preempted), and
 * off_ns, the time between start and end it spent preempted or waiting to be restored, so that
 * end - start - off_ns is the GPU time it used, always its cost.
 */
struct emu_completion_record {
	__u64 start_ns;
	__u64 end_ns;
	__u64 packet_index;
	__u64 off_ns;
	__u64 first_stop_ns;
	__u64 last_start_ns;
	__u32 preemptions;
	__u32 queue_id;
	__u64 status;			/* EMU_COMPLETION_DONE once the rest is written */
};

#define EMU_COMPLETION_DONE 1

/* enum KFD_QUEUE_EVICTION_TRIGGERS */
#define KFD_QUEUE_EVICTION_TRIGGER_TTM 2

/* struct kfd_ioctl_set_memory_policy_args and its policies */
#define KFD_IOC_CACHE_POLICY_COHERENT 0
#define KFD_IOC_CACHE_POLICY_NONCOHERENT 1
struct kfd_ioctl_set_memory_policy_args {
	__u64 alternate_aperture_base;
	__u64 alternate_aperture_size;
	__u32 gpu_id;
	__u32 default_policy;
	__u32 alternate_policy;
	__u32 pad;
};

struct kfd_ioctl_get_clock_counters_args {
	__u64 gpu_clock_counter;
	__u64 cpu_clock_counter;
	__u64 system_clock_counter;
	__u64 system_clock_freq;
	__u32 gpu_id;
	__u32 pad;
};

struct kfd_process_device_apertures {
	__u64 lds_base;
	__u64 lds_limit;
	__u64 scratch_base;
	__u64 scratch_limit;
	__u64 gpuvm_base;
	__u64 gpuvm_limit;
	__u32 gpu_id;
	__u32 pad;
};

struct kfd_ioctl_get_process_apertures_new_args {
	__u64 kfd_process_device_apertures_ptr;
	__u32 num_of_nodes;
	__u32 pad;
};

struct kfd_ioctl_acquire_vm_args {
	__u32 drm_fd;
	__u32 gpu_id;
};

/* ALLOC_MEMORY_OF_GPU flags (kfd_ioctl.h) */
#define KFD_IOC_ALLOC_MEM_FLAGS_VRAM (1 << 0)
#define KFD_IOC_ALLOC_MEM_FLAGS_GTT (1 << 1)
#define KFD_IOC_ALLOC_MEM_FLAGS_USERPTR (1 << 2)
#define KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL (1 << 3)
#define KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP (1 << 4)
#define KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC (1 << 29)

struct kfd_ioctl_alloc_memory_of_gpu_args {
	__u64 va_addr;
	__u64 size;
	__u64 handle;
	__u64 mmap_offset;
	__u32 gpu_id;
	__u32 flags;
};

struct kfd_ioctl_free_memory_of_gpu_args {
	__u64 handle;
};

struct kfd_ioctl_map_memory_to_gpu_args {
	__u64 handle;
	__u64 device_ids_array_ptr;
	__u32 n_devices;
	__u32 n_success;
};

struct kfd_ioctl_unmap_memory_from_gpu_args {
	__u64 handle;
	__u64 device_ids_array_ptr;
	__u32 n_devices;
	__u32 n_success;
};

struct kfd_ioctl_set_xnack_mode_args {
	__s32 xnack_enabled;
};

struct kfd_ioctl_get_available_memory_args {
	__u64 available;
	__u32 gpu_id;
	__u32 pad;
};

/* events (kfd_ioctl.h) */
#define KFD_IOC_EVENT_SIGNAL 0
#define KFD_IOC_EVENT_NODECHANGE 1
#define KFD_IOC_EVENT_DEVICESTATECHANGE 2
#define KFD_IOC_EVENT_HW_EXCEPTION 3
#define KFD_IOC_EVENT_SYSTEM_EVENT 4
#define KFD_IOC_EVENT_DEBUG_EVENT 5
#define KFD_IOC_EVENT_PROFILE_EVENT 6
#define KFD_IOC_EVENT_QUEUE_EVENT 7
#define KFD_IOC_EVENT_MEMORY 8
#define KFD_IOC_WAIT_RESULT_COMPLETE 0
#define KFD_IOC_WAIT_RESULT_TIMEOUT 1
#define KFD_IOC_WAIT_RESULT_FAIL 2
#define KFD_SIGNAL_EVENT_LIMIT 4096

struct kfd_ioctl_create_event_args {
	__u64 event_page_offset;
	__u32 event_trigger_data;
	__u32 event_type;
	__u32 auto_reset;
	__u32 node_id;
	__u32 event_id;
	__u32 event_slot_index;
};

struct kfd_ioctl_destroy_event_args {
	__u32 event_id;
	__u32 pad;
};

struct kfd_ioctl_set_event_args {
	__u32 event_id;
	__u32 pad;
};

struct kfd_ioctl_reset_event_args {
	__u32 event_id;
	__u32 pad;
};

/* struct kfd_event_data: a 32-byte union (memory/hw exception data, signal last_event_age) */
struct kfd_event_data {
	union {
		__u8 exception_data[32];
		struct {
			__u64 last_event_age;
		} signal_event_data;
	};
	__u64 kfd_event_data_ext;
	__u32 event_id;
	__u32 pad;
};

struct kfd_ioctl_wait_events_args {
	__u64 events_ptr;
	__u32 num_events;
	__u32 wait_for_all;
	__u32 timeout;
	__u32 wait_result;
};

struct kfd_ioctl_set_scratch_backing_va_args {
	__u64 va_addr;
	__u32 gpu_id;
	__u32 pad;
};

struct kfd_ioctl_set_trap_handler_args {
	__u64 tba_addr;
	__u64 tma_addr;
	__u32 gpu_id;
	__u32 pad;
};

/* GET_TILE_CONFIG (kfd_ioctl.h, 6.12.117) */
struct kfd_ioctl_get_tile_config_args {
	__u64 tile_config_ptr;		/* to KFD: pointer to tiling array */
	__u64 macro_tile_config_ptr;	/* to KFD: pointer to macro tile array */
	__u32 num_tile_configs;		/* to KFD: array size allocated; from KFD: entries filled */
	__u32 num_macro_tile_configs;	/* likewise */
	__u32 gpu_id;			/* to KFD */
	__u32 gb_addr_config;		/* from KFD */
	__u32 num_banks;		/* from KFD */
	__u32 num_ranks;		/* from KFD */
};

#define AMDKFD_IOCTL_BASE 'K'
#define AMDKFD_IOC_GET_TILE_CONFIG \
	_IOWR(AMDKFD_IOCTL_BASE, 0x12, struct kfd_ioctl_get_tile_config_args)
#define AMDKFD_IOC_SET_SCRATCH_BACKING_VA \
	_IOWR(AMDKFD_IOCTL_BASE, 0x11, struct kfd_ioctl_set_scratch_backing_va_args)
#define AMDKFD_IOC_SET_TRAP_HANDLER \
	_IOW(AMDKFD_IOCTL_BASE, 0x13, struct kfd_ioctl_set_trap_handler_args)
#define AMDKFD_IOC_CREATE_EVENT _IOWR(AMDKFD_IOCTL_BASE, 0x08, struct kfd_ioctl_create_event_args)
#define AMDKFD_IOC_DESTROY_EVENT _IOW(AMDKFD_IOCTL_BASE, 0x09, struct kfd_ioctl_destroy_event_args)
#define AMDKFD_IOC_SET_EVENT _IOW(AMDKFD_IOCTL_BASE, 0x0A, struct kfd_ioctl_set_event_args)
#define AMDKFD_IOC_RESET_EVENT _IOW(AMDKFD_IOCTL_BASE, 0x0B, struct kfd_ioctl_reset_event_args)
#define AMDKFD_IOC_WAIT_EVENTS _IOWR(AMDKFD_IOCTL_BASE, 0x0C, struct kfd_ioctl_wait_events_args)
#define AMDKFD_IOC_ALLOC_MEMORY_OF_GPU \
	_IOWR(AMDKFD_IOCTL_BASE, 0x16, struct kfd_ioctl_alloc_memory_of_gpu_args)
#define AMDKFD_IOC_FREE_MEMORY_OF_GPU \
	_IOW(AMDKFD_IOCTL_BASE, 0x17, struct kfd_ioctl_free_memory_of_gpu_args)
#define AMDKFD_IOC_MAP_MEMORY_TO_GPU \
	_IOWR(AMDKFD_IOCTL_BASE, 0x18, struct kfd_ioctl_map_memory_to_gpu_args)
#define AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU \
	_IOWR(AMDKFD_IOCTL_BASE, 0x19, struct kfd_ioctl_unmap_memory_from_gpu_args)
#define AMDKFD_IOC_SET_XNACK_MODE _IOWR(AMDKFD_IOCTL_BASE, 0x21, struct kfd_ioctl_set_xnack_mode_args)
#define AMDKFD_IOC_AVAILABLE_MEMORY \
	_IOWR(AMDKFD_IOCTL_BASE, 0x23, struct kfd_ioctl_get_available_memory_args)
#define AMDKFD_IOC_SET_MEMORY_POLICY \
	_IOW(AMDKFD_IOCTL_BASE, 0x04, struct kfd_ioctl_set_memory_policy_args)
#define AMDKFD_IOC_GET_CLOCK_COUNTERS \
	_IOWR(AMDKFD_IOCTL_BASE, 0x05, struct kfd_ioctl_get_clock_counters_args)
#define AMDKFD_IOC_GET_PROCESS_APERTURES_NEW \
	_IOWR(AMDKFD_IOCTL_BASE, 0x14, struct kfd_ioctl_get_process_apertures_new_args)
#define AMDKFD_IOC_ACQUIRE_VM _IOW(AMDKFD_IOCTL_BASE, 0x15, struct kfd_ioctl_acquire_vm_args)
#define AMDKFD_IOC_GET_VERSION _IOR(AMDKFD_IOCTL_BASE, 0x01, struct kfd_ioctl_get_version_args)
#define AMDKFD_IOC_CREATE_QUEUE _IOWR(AMDKFD_IOCTL_BASE, 0x02, struct kfd_ioctl_create_queue_args)
#define AMDKFD_IOC_DESTROY_QUEUE _IOWR(AMDKFD_IOCTL_BASE, 0x03, struct kfd_ioctl_destroy_queue_args)
#define AMDKFD_IOC_UPDATE_QUEUE _IOW(AMDKFD_IOCTL_BASE, 0x07, struct kfd_ioctl_update_queue_args)
#define AMDKFD_IOC_RUNTIME_ENABLE _IOWR(AMDKFD_IOCTL_BASE, 0x25, struct kfd_ioctl_runtime_enable_args)
#define AMDKFD_IOC_DBG_TRAP _IOWR(AMDKFD_IOCTL_BASE, 0x26, struct kfd_ioctl_dbg_trap_args)
#define AMDKFD_COMMAND_START 0x01
#if EMU_SECONDARY_CONTEXTS
/* kfd_ioctl.h 7.0: AMDKFD_IO(0x27), no argument (cc6b66d661fd) */
#define AMDKFD_IOC_CREATE_PROCESS _IO(AMDKFD_IOCTL_BASE, 0x27)
#define AMDKFD_COMMAND_END 0x28
#else
#define AMDKFD_COMMAND_END 0x27
#endif

/* ---- internal structures (names from kfd_priv.h / kfd_device_queue_manager.h, 6.12.117) ---- */

/*
 * Kernel-internal queue types (6.12.117): what sysfs queues/<id>/type prints. 7.0 removed DIQ
 * ("amdkfd: remove DIQ support", e1b73b64271d, the CREATE_PROCESS series): the values after HIQ
 * moved down by one (docs/kfd.md §1).
 */
enum kfd_queue_type {
	KFD_QUEUE_TYPE_COMPUTE = 0,
	KFD_QUEUE_TYPE_SDMA = 1,
	KFD_QUEUE_TYPE_HIQ = 2,
#if EMU_SECONDARY_CONTEXTS
	KFD_QUEUE_TYPE_SDMA_XGMI = 3,
	KFD_QUEUE_TYPE_SDMA_BY_ENG_ID = 4,
#else
	KFD_QUEUE_TYPE_DIQ = 3,
	KFD_QUEUE_TYPE_SDMA_XGMI = 4,
	KFD_QUEUE_TYPE_SDMA_BY_ENG_ID = 5,
#endif
};

enum kfd_queue_format {
	KFD_QUEUE_FORMAT_PM4 = 0,
	KFD_QUEUE_FORMAT_AQL = 1,
};

enum kfd_unmap_queues_filter {
	KFD_UNMAP_QUEUES_FILTER_ALL_QUEUES = 1,
	KFD_UNMAP_QUEUES_FILTER_DYNAMIC_QUEUES = 2,
	KFD_UNMAP_QUEUES_FILTER_BY_PASID = 3,
};

#define USE_DEFAULT_GRACE_PERIOD 0xffffffff
#define KFD_FENCE_COMPLETED 100
#define KFD_FENCE_INIT 10
#define KFD_MAX_NUM_OF_QUEUES_PER_PROCESS 1024
/* "HWS limit" on queues per process per device (kfd_process_queue_manager.c, 6.12.117). */
#define KFD_MAX_QUEUES_PER_PROCESS_DEVICE 127

struct kfd_node;
struct kfd_process;

struct queue_properties {
	enum kfd_queue_type type;
	enum kfd_queue_format format;
	unsigned int queue_id;
	u64 queue_address;
	u64 queue_size;
	u32 priority;
	u32 queue_percent;
	void __user *read_ptr;
	void __user *write_ptr;
	u64 eop_ring_buffer_address;
	u32 eop_ring_buffer_size;
	u64 ctx_save_restore_area_address;
	u32 ctx_save_restore_area_size;
	u32 ctl_stack_size;
	u32 sdma_engine_id;
	u64 exception_status;
	bool is_interop;
	bool is_evicted;
	bool is_suspended;
	bool is_being_destroyed;
	bool is_active;
	bool is_gws;
	/* later kernels' is_reset (6.12: pdd->has_reset_queue only): reset by a per-queue reset */
	bool is_reset;
};

/* QUEUE_IS_ACTIVE() from kfd_priv.h (6.12.117). */
#define QUEUE_IS_ACTIVE(q) ((q).queue_size > 0 && (q).queue_address != 0 && (q).queue_percent > 0 && \
			    !(q).is_evicted && !(q).is_suspended)

struct queue {
	struct list_head list;		/* on qpd->queues_list */
	void *mqd;
	void *mqd_mem_obj;
	u64 gart_mqd_addr;
	struct queue_properties properties;
	struct kfd_process *process;
	struct kfd_node *device;
	struct kobject kobj;		/* /sys/class/kfd/kfd/proc/<pid>/queues/<id> */
	/* emulator only, guarded by dqm->hw_lock: the emulated CP's view of the queue */
	bool hw_mapped;			/* in the runlist the CP executes */
	u64 cp_rptr;			/* next packet index to consume (the read index) */
	/*
	 * Write indices observed at two polls (the later one and the one before): packet i is
	 * known to the CP from obs_old_ns when i < obs_old_w, else from obs_new_ns when
	 * i < obs_new_w (the emulated doorbell).
	 */
	u64 obs_old_w, obs_old_ns, obs_new_w, obs_new_ns;
	u64 served_seq;			/* CP dispatch counter when the queue last started one */
	u32 error_ec;			/* packet error raised: the CP no longer serves the queue */
	bool has_dispatch;		/* started and not complete (running or preempted) */
	bool at_barrier;		/* the next packet is a barrier whose dependencies are unmet */
	bool stuck;			/* test hook: its CWSR save never completes (stuck_queue) */
	bool preempt_failed;		/* the MEC abandoned its unmap (HIQ MQD doorbell logged) */
	u64 ready_ns;			/* no packet starts before (the end of the last barrier) */
	struct {
		u64 index, cost_ns, remaining_ns, completion;
		u64 start_ns, seg_start_ns, stop_ns, first_stop_ns, off_ns;
		u32 preemptions;
		bool foreign;		/* a code object's kernel: completion is an amd_signal_t */
	} d;
	u64 packets_done;
};

struct process_queue_node {
	struct queue *q;
	struct list_head process_queue_list;
};

struct process_queue_manager {
	struct kfd_process *process;
	struct list_head queues;
	unsigned long *queue_slot_bitmap;
};

struct qcm_process_device {
	struct device_queue_manager *dqm;
	struct process_queue_manager *pqm;
	struct list_head queues_list;
	struct list_head dqm_list;	/* on dqm->queues while the process has queues here */
	unsigned int queue_count;
	unsigned int evicted;		/* eviction counter, 0 = not evicted */
	bool registered;
};

struct kfd_process_device {
	struct kfd_node *dev;
	struct kfd_process *process;
	struct qcm_process_device qpd;
	bool bound;
	struct file *drm_file;		/* the render node ACQUIRE_VM took (a reference) */
	u64 scratch_backing_va;		/* SET_SCRATCH_BACKING_VA (qpd.sh_hidden_private_base) */
	u64 tba_addr, tma_addr;		/* SET_TRAP_HANDLER */
	void *doorbells;		/* the process's doorbell slice on this GPU (kfd_mmap) */
	u64 exception_status;
	bool has_reset_queue;		/* set_queue_as_reset() (6.12): a queue of it was reset */
	u64 last_evict_timestamp;
	atomic64_t evict_duration_counter;
	struct attribute attr_vram;
	struct attribute attr_sdma;
	struct attribute attr_evict;
	struct attribute attr_cu_occupancy;
	struct kobject *kobj_stats;
	char vram_name[24];
	char sdma_name[24];
	char stats_name[24];
};

struct device_queue_manager {
	struct kfd_node *dev;
	struct mutex lock_hidden;	/* dqm_lock() */
	struct list_head queues;	/* qcm_process_device.dqm_list */
	unsigned int active_queue_count;
	unsigned int processes_count;
	bool active_runlist;
	wait_queue_head_t destroy_wait;
	u64 *fence_addr;		/* written by the emulated CP when a preemption completes */
	u64 fence_mem;
	/* emulated CP (one kthread per GPU), guarded by hw_lock; times are ktime_get_ns() */
	struct mutex hw_lock;
	struct task_struct *cp_thread;
	wait_queue_head_t cp_wait;
	bool cp_kick;			/* something changed: the CP thread runs now */
	bool cp_mapped;			/* a runlist is mapped and not being unmapped */
	struct queue *running;		/* the queue whose dispatch occupies the GPU */
	u64 now_ns;			/* the CP's timeline has been played up to here */
	u64 stall_until_ns;		/* restore after a map: nothing runs before */
	u64 serve_seq;
	bool preempt_pending;		/* UNMAP_QUEUES sent, fence not yet written */
	bool preempt_applied;		/* the running dispatch was stopped at unmap_at_ns */
	u64 unmap_at_ns;
	u64 preempt_deadline_ns;	/* unmap_at_ns + preempt_delay_us: the fence */
	u64 fence_pending_value;
	/*
	 * What the CUs run, published by the CP (emu_cp_publish) for cu_occupancy's lock-free read
	 * (seqcount under hw_lock): the running dispatch's process over [from, until), the
	 * dispatch that follows it (the CP's pick at `until`, or after a restore) over
	 * [next_from, next_until), nothing from stop_ns (an unmap's time) on.
	 */
	seqcount_mutex_t occ_seq;
	struct {
		const void *proc, *next;
		u64 from, until, next_from, next_until, stop_ns;
	} occ;
	/* what the CP executed since the module loaded (/sys/kernel/kfd_emu/cp_stats) */
	struct {
		u64 dispatches;		/* kernel dispatches of the cost convention */
		u64 kernels;		/* kernel dispatches of a code object (foreign kernels) */
		u64 barriers_and, barriers_or;
		u64 barriers_value;	/* AMD barrier-value packets completed */
		u64 pm4_ibs;		/* AMD vendor packets (PM4 indirect buffers) executed */
		u64 signals;		/* amd_signal_t completions (value decremented) */
		u64 interrupts;		/* of them, interrupt signals (mailbox written, event raised) */
		u64 events_set;		/* KFD events the interrupts set */
		u64 errors;		/* packet errors (queues stopped) */
		/* SDMA queues (README "SDMA"): packets executed by the emulated copy engines */
		u64 sdma_copies;	/* COPY_LINEAR packets */
		u64 sdma_bytes;		/* bytes they moved */
		u64 sdma_fills;		/* CONST_FILL packets */
		u64 sdma_fences;	/* FENCE packets (a u32 written) */
		u64 sdma_traps;		/* TRAP packets (interrupts raised) */
		u64 sdma_atomics;	/* ATOMIC packets */
		u64 sdma_polls;		/* POLL_REGMEM packets satisfied */
		u64 sdma_timestamps;	/* TIMESTAMP packets */
	} stats;
};

struct kfd_node {
	unsigned int id;		/* topology gpu_id */
	unsigned int node_id;		/* topology node index */
	struct device_queue_manager *dqm;
	struct kobject *kobj_node;
	int drm_render_minor;		/* amdgpu_emu's render node, EMU_NO_RENDER_MINOR before */
	/* emulator: where the node sits (topology.c, README "Profiles") */
	unsigned int package;		/* emulated package (num_gpus of them) */
	unsigned int partition;		/* its compute partition (XCP) index in the package */
	unsigned int num_xcc;		/* NUM_XCC(xcc_mask): XCCs of this partition */
	unsigned int cu_count;		/* active CUs of the partition */
	u64 vram_bytes;			/* KFD_XCP_MEMORY_SIZE: the partition's share (NPS1) */
	/* kfd_queue_ctx_save_restore_size() (kfd_queue.c 6.12): per XCC */
	u32 cwsr_size, ctl_stack_size, debug_memory_size, eop_buffer_size;
};

struct kfd_process {
	struct list_head processes;	/* kfd_processes_list */
	struct mm_struct *mm;
	struct mutex mutex;
	struct task_struct *lead_thread;
	struct mmu_notifier mmu_notifier;
	struct mm_struct *mm_grabbed;	/* emulator: mmgrab()ed for the CP thread */
	struct kref ref;
	struct work_struct release_work;
	u32 pasid;
	struct kfd_process_device pdds[EMU_MAX_GPUS];
	int n_pdds;
	struct process_queue_manager pqm;
	/* debugger (kfd_debug.c, 6.12.117) */
	struct mutex event_mutex;
	bool debug_trap_enabled;
	struct kfd_process *debugger_process;
	atomic_t debugged_process_count;
	struct file *dbg_ev_file;
	u64 exception_enable_mask;
	u64 exception_status;
	struct kfd_runtime_info runtime_info;
	struct semaphore runtime_enable_sema;
	bool is_runtime_retry;
	/* KFD events (kfd_events.c): struct emu_event by id, under events_lock */
	struct mutex events_lock;
	struct idr event_idr;
	wait_queue_head_t event_wq;
	u64 *signal_page;		/* the event slots (a GTT object's pages, or KFD's own) */
	bool signal_page_owned;		/* KFD allocated it (no page handle at the first event) */
	u32 signal_event_count;
	/*
	 * GPU memory (ALLOC_MEMORY_OF_GPU): struct emu_bo by handle. Changed under mutex and
	 * bo_lock; the render node's mmap (under mmap_lock) takes only bo_lock, a leaf lock never
	 * held across a user access, so it cannot invert with mutex -> mmap_lock (a user fault).
	 */
	struct mutex bo_lock;
	struct idr bo_idr;
	u64 vram_used[EMU_MAX_GPUS];
	/* sysfs */
	struct kobject *kobj;
	struct kobject *kobj_queues;
	struct attribute attr_pasid;
#if EMU_SECONDARY_CONTEXTS
	/*
	 * kfd_priv.h 7.0 (fac682a1d1af): KFD_CONTEXT_ID_PRIMARY for the context kfd_open made, else
	 * the id the primary's id_table gave this secondary (0..0xFFFE); the primary's IDA.
	 */
	u16 context_id;
	struct ida id_table;
	/*
	 * Emulator: a secondary keeps its primary referenced until it is released, so the primary's
	 * sysfs directory (its context_<id> parent) and IDA outlive it (upstream the kobject's parent
	 * reference keeps the directory, and a lookup by mm finds the primary).
	 */
	struct kfd_process *primary_process;
#endif
};

#define KFD_CONTEXT_ID_PRIMARY 0xFFFF

/* Whether p is the context kfd_open made (every context before 7.0). */
static inline bool kfd_process_is_primary(const struct kfd_process *p)
{
#if EMU_SECONDARY_CONTEXTS
	return p->context_id == KFD_CONTEXT_ID_PRIMARY;
#else
	return true;
#endif
}

/* ---- the functions the tracer probes: amdkfd names and 6.12.117 prototypes ---- */
long kfd_ioctl(struct file *filep, unsigned int cmd, unsigned long arg);
int kfd_ioctl_create_queue(struct file *filep, struct kfd_process *p, void *data);
int kfd_ioctl_destroy_queue(struct file *filp, struct kfd_process *p, void *data);
int kfd_ioctl_update_queue(struct file *filp, struct kfd_process *p, void *data);
int kfd_ioctl_set_debug_trap(struct file *filep, struct kfd_process *p, void *data);
int kfd_ioctl_runtime_enable(struct file *filep, struct kfd_process *p, void *data);
#if EMU_SECONDARY_CONTEXTS
int kfd_ioctl_create_process(struct file *filep, struct kfd_process *p, void *data);
#endif
int pqm_create_queue(struct process_queue_manager *pqm, struct kfd_node *dev, struct file *f,
		     struct queue_properties *properties, unsigned int *qid,
		     const void *q_data, const void *restore_mqd, const void *restore_ctl_stack,
		     u32 *p_doorbell_offset_in_process);
int pqm_destroy_queue(struct process_queue_manager *pqm, unsigned int qid);
int suspend_queues(struct kfd_process *p, u32 num_queues, u32 grace_period,
		   u64 exception_clear_mask,
		   u32 *usr_queue_id_array);
int resume_queues(struct kfd_process *p, u32 num_queues, u32 *usr_queue_id_array);
int execute_queues_cpsch(struct device_queue_manager *dqm, enum kfd_unmap_queues_filter filter,
			 u32 filter_param, u32 grace_period);
int unmap_queues_cpsch(struct device_queue_manager *dqm, enum kfd_unmap_queues_filter filter,
		       u32 filter_param, u32 grace_period, bool reset);
int map_queues_cpsch(struct device_queue_manager *dqm);
int amdkfd_fence_wait_timeout(struct device_queue_manager *dqm, u64 fence_value,
			      unsigned int timeout_ms);
int kfd_process_evict_queues(struct kfd_process *p, u32 trigger);
int kfd_process_restore_queues(struct kfd_process *p);
void kfd_smi_event_queue_eviction(struct kfd_node *node, pid_t pid, u32 trigger);
void kfd_smi_event_queue_restore(struct kfd_node *node, pid_t pid);
int evict_process_queues_cpsch(struct device_queue_manager *dqm, struct qcm_process_device *qpd);
int restore_process_queues_cpsch(struct device_queue_manager *dqm, struct qcm_process_device *qpd);
struct kfd_process *kfd_create_process(struct task_struct *thread);
void kfd_process_wq_release(struct work_struct *work);
int create_queue_cpsch(struct device_queue_manager *dqm, struct queue *q,
		       struct qcm_process_device *qpd,
		       const void *qd, const void *restore_mqd, const void *restore_ctl_stack);
int destroy_queue_cpsch(struct device_queue_manager *dqm, struct qcm_process_device *qpd,
			struct queue *q);
int process_termination_cpsch(struct device_queue_manager *dqm, struct qcm_process_device *qpd);
void kfd_process_dequeue_from_all_devices(struct kfd_process *p);
void pqm_uninit(struct process_queue_manager *pqm);
int kfd_dbg_trap_enable(struct kfd_process *target, u32 fd, void __user *runtime_info,
			u32 *runtime_size);
int kfd_dbg_trap_disable(struct kfd_process *target);
int pqm_get_queue_snapshot(struct process_queue_manager *pqm, u64 exception_clear_mask,
			   void __user *buf,
			   int *num_qss_entries, u32 *entry_size);

/*
 * ---- shared between kfd_emu.ko's objects (Kbuild kfd_emu-y; README.md "Source files") ----
 *
 * What one file defines and another uses: the definitions stay with their concern, without
 * `static`; everything else stays static in its file.
 */

/* KFD_MMAP_* (kfd_priv.h): the type and gpu in a /dev/kfd mmap offset */
#define KFD_MMAP_TYPE_DOORBELL (0x3ULL << 62)
#define KFD_MMAP_GPU_ID(gpu_id) ((((u64)(gpu_id)) << 46) & GENMASK_ULL(61, 46))
#define KFD_MMAP_TYPE_MASK (0x3ULL << 62)
#define KFD_MMAP_TYPE_EVENTS (0x2ULL << 62)
#define KFD_MMAP_GET_GPU_ID(offset) (((offset) & GENMASK_ULL(61, 46)) >> 46)

/* MAKE_HANDLE / GET_GPU_ID / GET_IDR_HANDLE (kfd_priv.h) */
#define EMU_MAKE_HANDLE(gpu_id, idr) (((u64)(gpu_id) << 32) | (idr))
#define EMU_HANDLE_GPU(h) ((u32)((h) >> 32))
#define EMU_HANDLE_IDR(h) ((u32)((h) & 0xFFFFFFFF))

/* a buffer object (memory.c); an event page is one (events.c) */
struct emu_bo {
	u32 gpu;		/* allocating GPU index */
	u32 flags;		/* KFD_IOC_ALLOC_MEM_FLAGS_* */
	u64 va;			/* GPU VA (= CPU VA of its mapping) */
	u64 size;
	u64 mmap_offset;	/* VRAM/GTT: the render node offset; USERPTR: the CPU address */
	void *kaddr;		/* VRAM/GTT backing (vmalloc_user) */
	u32 mapped;		/* bit per GPU index it is mapped on */
};

/* main.c: module parameters, state every object shares, lookups */
extern unsigned int num_gpus;
extern unsigned int emu_num_nodes;	/* KFD nodes: num_gpus x partitions */
extern const struct emu_profile *emu_prof;
extern unsigned int tick_us;
extern unsigned int preempt_delay_us;
extern unsigned int restore_delay_us;
extern atomic_t suspend_calls;
extern unsigned int queue_preemption_timeout_ms;
extern unsigned int ns_per_workitem;
extern unsigned int kfd_minor_version;
extern struct kfd_node emu_nodes[EMU_MAX_GPUS];
extern struct device_queue_manager emu_dqms[EMU_MAX_GPUS];
extern struct workqueue_struct *kfd_process_wq;
extern struct kobject *procfs_kobj;
extern struct kobject *topology_nodes_kobj;
void dqm_lock(struct device_queue_manager *dqm);
void dqm_unlock(struct device_queue_manager *dqm);
struct kfd_process_device *kfd_process_device_data_by_id(struct kfd_process *p, u32 gpu_id);
struct kfd_process_device *qpd_to_pdd(struct qcm_process_device *qpd);
int render_gpu_of_file(struct file *file);

/* cp.c: the command processor, for its SDMA engines, the queue manager and init */
bool emu_user_begin(struct queue *q);
void emu_user_end(struct queue *q);
u64 emu_gpu_ticks(u64 mono_ns);
void emu_cp_preempt(struct device_queue_manager *dqm, u64 t);
void emu_cp_forget(struct device_queue_manager *dqm, struct queue *q);
void emu_cp_kick(struct device_queue_manager *dqm);
int emu_cp_thread(void *data);
void emu_cp_publish(struct device_queue_manager *dqm);
bool emu_cp_occupied_by(struct device_queue_manager *dqm, const struct kfd_process *p);

/* sdma.c: the SDMA engines the CP runs */
bool emu_sdma_serves(struct queue *q);
bool emu_cp_sdma(struct device_queue_manager *dqm, u64 now);

/* queues.c: queue lookup and update, for the queue and debug ioctls; per-queue reset */
void kfd_signal_reset_event(struct kfd_node *dev);
void set_queue_as_reset(struct device_queue_manager *dqm, struct queue *q,
			struct qcm_process_device *qpd);
int dqm_update_queue(struct device_queue_manager *dqm, struct queue *q);
struct process_queue_node *get_queue_by_qid(struct process_queue_manager *pqm,
					    unsigned int qid);

/* process.c: the process list and lifetime */
extern struct mutex kfd_processes_mutex;
extern struct list_head kfd_processes_list;
extern spinlock_t kfd_processes_lock;
struct kfd_process *find_process_by_mm(const struct mm_struct *mm);
struct kfd_process *kfd_lookup_process_by_pid(struct pid *pid);
void kfd_unref_process(struct kfd_process *p);
struct kfd_process *create_process(struct task_struct *thread, bool primary);
void kfd_process_notifier_release_internal(struct kfd_process *p);

/* chardev.c: /dev/kfd, registered by init */
extern const struct file_operations kfd_fops;

/* memory.c: GPU memory: buffer objects, the GPU's accesses, mmap, the memory ioctls */
void emu_process_free_bos(struct kfd_process *p);
int kfd_ioctl_alloc_memory_of_gpu(struct file *filep, struct kfd_process *p, void *data);
void *emu_bo_backing(struct emu_bo *bo);
struct emu_bo *emu_bo_lookup(struct kfd_process *p, u64 handle);
bool emu_bo_holds(struct kfd_process *p, u64 va, u64 len);
u64 emu_bo_size_at(struct kfd_process *p, u64 va);
int emu_gpu_access(struct kfd_process *p, u64 va, void *buf, u32 len, bool write);
int emu_gpu_add64(struct kfd_process *p, u64 va, s64 v);
int kfd_ioctl_free_memory_of_gpu(struct file *filep, struct kfd_process *p, void *data);
int kfd_ioctl_map_memory_to_gpu(struct file *filep, struct kfd_process *p, void *data);
int kfd_ioctl_unmap_memory_from_gpu(struct file *filep, struct kfd_process *p, void *data);
int kfd_ioctl_get_available_memory(struct file *filep, struct kfd_process *p, void *data);
int kfd_ioctl_set_xnack_mode(struct file *filep, struct kfd_process *p, void *data);
int kfd_mmap(struct file *filp, struct vm_area_struct *vma);

/* events.c: KFD events: teardown, interrupts, the event ioctls */
void emu_process_free_events(struct kfd_process *p);
void emu_signal_interrupt(struct device_queue_manager *dqm, struct kfd_process *p,
			  u32 event_id);
int kfd_ioctl_create_event(struct file *filp, struct kfd_process *p, void *data);
int kfd_ioctl_destroy_event(struct file *filp, struct kfd_process *p, void *data);
int kfd_ioctl_set_event(struct file *filp, struct kfd_process *p, void *data);
int kfd_ioctl_reset_event(struct file *filp, struct kfd_process *p, void *data);
int kfd_ioctl_wait_events(struct file *filp, struct kfd_process *p, void *data);

/* debug.c: exceptions and queue errors */
void kfd_dbg_ev_raise(u64 event_mask, struct kfd_process *process, struct kfd_node *dev,
		      unsigned int source_id);
void emu_queue_error(struct queue *q, u32 ec);

/* sysfs.c: /sys/class/kfd/kfd/proc and the control files init creates */
int kfd_procfs_add_queue(struct queue *q);
void kfd_procfs_del_queue(struct queue *q);
int kfd_process_add_sysfs(struct kfd_process *p);
void kfd_process_remove_sysfs(struct kfd_process *p);
extern struct kobj_attribute cp_stats_attr;
extern struct kobj_attribute evict_attr;
extern struct kobj_attribute restore_attr;
extern struct kobj_attribute stuck_queue_attr;

/* topology.c: the profiles, each node's derived properties, the topology init builds and removes */
const struct emu_profile *emu_profile_by_name(const char *name);
void emu_node_init_props(struct kfd_node *node);
struct kobject *add_topology_node(unsigned int node);
extern struct kobj_attribute generation_id_attr;
extern struct kobj_attribute system_properties_attr;
void topology_remove(void);

#endif /* KFD_EMU_H */
