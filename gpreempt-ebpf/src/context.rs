//! Secondary KFD contexts (Linux 7.0): `AMDKFD_IOC_CREATE_PROCESS` turns the calling `/dev/kfd`
//! file into a new context of the same process (docs/kfd.md §1.4). The tracer reports each one
//! it sees made, with its `context_id`, as a [`KfdFn::ContextCreate`] call record at the
//! handler's return; the queue records of the other programs carry the context they happen in
//! (`maps::context_of`).

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{kprobe, kretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use gpreempt_common::record::{CallPhase, KfdFn, OFFSET_UNKNOWN};

use crate::{
    maps::{config, read_at, stash, take},
    pairs::{arg, emit_call},
};

/// match-proto:v7.3.4:drivers/gpu/drm/amd/amdkfd/kfd_chardev.c: static int
/// kfd_ioctl_create_process(struct file *filep, struct kfd_process *p, void *data) — upstream
/// since v7.0-rc1 (cc6b66d661fd): on success `filep->private_data` holds the new secondary
/// context, made by `create_process(current, false)`. Keeps `filep` for the return.
#[kprobe]
pub fn create_context_entry(ctx: ProbeContext) -> u32 {
    stash(KfdFn::ContextCreate.stash_slot(), [arg(&ctx, 0), 0, 0, 0, 0]);
    0
}

/// Return of `kfd_ioctl_create_process`: the caller, the new context's id (through the file's
/// `private_data`; `u32::MAX` when the call failed or an offset is unknown) and the result.
#[kretprobe]
pub fn create_context_return(ctx: RetProbeContext) -> u32 {
    let Some(entry) = take(KfdFn::ContextCreate.stash_slot()) else { return 0 };
    let ret: i32 = ctx.ret();
    let cfg = config();
    let known = ret == 0 && cfg.file_private_data != OFFSET_UNKNOWN && cfg.process_context_id != OFFSET_UNKNOWN;
    let context_id = if known {
        read_at::<u64>(entry.args[0], cfg.file_private_data)
            .and_then(|p| read_at::<u16>(p, cfg.process_context_id))
            .map_or(u64::from(u32::MAX), u64::from)
    } else {
        u64::from(u32::MAX)
    };
    let owner = (bpf_get_current_pid_tgid() >> 32) as u32;
    emit_call(KfdFn::ContextCreate, CallPhase::Return, entry.entry_ns, owner, 0, [context_id, 0, 0, 0], i64::from(ret));
    0
}
