//! Queue lifecycle on the ioctl path: create, destroy and update.
//!
//! Both handlers run in the ioctl caller's context (`kfd_ioctl()` refuses a /dev/kfd fd used by
//! another process), so `current` is the queue's owner. `data` is the kernel's copy of the ioctl
//! arguments, read here rather than any internal struct because the UAPI layout is stable across
//! versions. Each record carries the `context_id` of the handler's `kfd_process` (Linux 7.0:
//! queue ids are per KFD context, docs/kfd.md §1.4).

use gpreempt_common::{
    kfd_uapi::{CreateQueueArgs, UpdateQueueArgs},
    record::{QueueCreateRecord, QueueDestroyRecord, QueueUpdateRecord, stash_slot},
};

use crate::pairs::ioctl_pair;

ioctl_pair!(
    /// match-proto:v6.1.192,v6.12.117,v7.3.4:drivers/gpu/drm/amd/amdkfd/kfd_chardev.c:
    /// static int kfd_ioctl_create_queue(struct file *filep, struct kfd_process *p, void *data)
    /// The return reads the first 88 bytes of `data` (the layout shared by KFD 1.1–1.22;
    /// `sdma_engine_id` at 88 exists only from 1.17 and is not read).
    create_queue_entry,
    create_queue_return,
    stash_slot::CREATE_QUEUE,
    "kfd_ioctl_create_queue",
    CreateQueueArgs,
    |header, args, ret, context_id| Some(QueueCreateRecord { header, args, context_id, _pad: 0, ret })
);

ioctl_pair!(
    /// match-proto:v6.1.192,v6.12.117,v7.3.4:drivers/gpu/drm/amd/amdkfd/kfd_chardev.c:
    /// static int kfd_ioctl_destroy_queue(struct file *filp, struct kfd_process *p, void *data)
    /// `data` is `struct kfd_ioctl_destroy_queue_args` (`queue_id` at offset 0).
    destroy_queue_entry,
    destroy_queue_return,
    stash_slot::DESTROY_QUEUE,
    "kfd_ioctl_destroy_queue",
    u32,
    |header, queue_id, ret, context_id| Some(QueueDestroyRecord { header, queue_id, context_id, ret })
);

ioctl_pair!(
    /// match-proto:v6.1.192,v6.12.117,v7.3.4:drivers/gpu/drm/amd/amdkfd/kfd_chardev.c:
    /// static int kfd_ioctl_update_queue(struct file *filp, struct kfd_process *p, void *data)
    /// `data` is `struct kfd_ioctl_update_queue_args` (24 bytes, unchanged since KFD 1.1).
    update_queue_entry,
    update_queue_return,
    stash_slot::UPDATE_QUEUE,
    "kfd_ioctl_update_queue",
    UpdateQueueArgs,
    |header, args, ret, context_id| Some(QueueUpdateRecord { header, args, context_id, _pad: 0, ret })
);
