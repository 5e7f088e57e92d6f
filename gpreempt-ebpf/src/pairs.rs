//! The two shapes of kprobe/kretprobe pair every area uses, written once.
//!
//! - An ioctl handler, `static int kfd_ioctl_X(struct file *, struct kfd_process *p, void *data)`
//!   (kfd_chardev.c, 6.1.192 and 6.12.117): the entry keeps `data`, the kernel's copy of the UAPI
//!   arguments (`kfd_ioctl()` copies them in before and out after the handler), and the return
//!   reads it back, outputs included, into one record ([`ioctl_pair!`]).
//! - An internal KFD function: the entry stashes what it resolved (owner, gpu, raw arguments)
//!   and the return writes one [`KfdCallRecord`] with the duration and the result
//!   ([`call_pair!`]).
//!
//! Each pair stays two named programs (the userspace probe table attaches them by name); the
//! macros only generate the bodies.

use aya_ebpf::{
    helpers::bpf_probe_read_kernel,
    programs::{ProbeContext, RetProbeContext},
};
use aya_log_ebpf::warn;
use gpreempt_common::record::{CallPhase, KfdCallRecord, KfdFn, Record, RecordHeader, counter};

use crate::maps::{config, context_of, count, emit, header, stash, stash_call, take};

/// Integer argument `n` of the probed function (0 when the context cannot give it).
pub fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

/// CLOCK_BOOTTIME now.
pub fn now() -> u64 {
    // SAFETY: helper without preconditions.
    unsafe { aya_ebpf::helpers::bpf_ktime_get_boot_ns() }
}

/// Entry of an ioctl handler: keep `data` (argument 2) and the file's KFD context `p` (argument
/// 1) for the return probe.
#[inline(always)]
pub fn ioctl_entry(ctx: &ProbeContext, slot: u32) {
    stash(slot, [arg(ctx, 2), arg(ctx, 1), 0, 0, 0]);
}

/// Return of an ioctl handler: read `A` at the `data` the entry kept and emit the record `build`
/// makes of it, the handler's `int` result and the `context_id` of the file's KFD context (Linux
/// 7.0: a secondary context's queue ids are its own); `build` returns `None` for a call it leaves
/// out. An unreadable `data` is counted as [`counter::READ_FAILED`], never written.
#[inline(always)]
pub fn ioctl_return<A, R: Record>(
    ctx: &RetProbeContext,
    slot: u32,
    handler: &'static str,
    build: impl FnOnce(RecordHeader, A, i64, u32) -> Option<R>,
) {
    let Some(entry) = take(slot) else { return };
    let context_id = context_of(&config(), entry.args[1]);
    // SAFETY: bpf_probe_read_kernel checks the address; a fault returns an error.
    let Ok(args) = (unsafe { bpf_probe_read_kernel(entry.args[0] as *const A) }) else {
        count(counter::READ_FAILED);
        warn!(ctx, "{}: cannot read args at {:x}", handler, entry.args[0]);
        return;
    };
    let ret: i32 = ctx.ret();
    if let Some(record) = build(header(entry.entry_ns), args, i64::from(ret), context_id) {
        emit(&record);
    }
}

/// A kprobe on `kfd_ioctl_*` and its kretprobe, named `$entry` and `$ret`; `$build` makes the
/// record from `(header, args: $args, ret, context_id)`, or `None`.
macro_rules! ioctl_pair {
    ($(#[$doc:meta])* $entry:ident, $ret:ident, $slot:expr, $handler:literal, $args:ty, $build:expr) => {
        $(#[$doc])*
        #[aya_ebpf::macros::kprobe]
        pub fn $entry(ctx: aya_ebpf::programs::ProbeContext) -> u32 {
            $crate::pairs::ioctl_entry(&ctx, $slot);
            0
        }

        #[doc = concat!("Return of `", $handler, "`.")]
        #[aya_ebpf::macros::kretprobe]
        pub fn $ret(ctx: aya_ebpf::programs::RetProbeContext) -> u32 {
            $crate::pairs::ioctl_return::<$args, _>(&ctx, $slot, $handler, $build);
            0
        }
    };
}
pub(crate) use ioctl_pair;

/// Write a [`KfdCallRecord`] about `function`.
#[inline(always)]
pub fn emit_call(function: KfdFn, phase: CallPhase, entry_ns: u64, owner: u32, gpu_id: u32, args: [u64; 4], ret: i64) {
    emit(&KfdCallRecord::new(header(entry_ns), function, phase, owner, gpu_id, args, ret));
}

/// Entry of an internal function: stash what the entry knows; the return probe writes the record.
#[inline(always)]
pub fn enter(function: KfdFn, owner: u32, gpu_id: u32, args: [u64; 4]) {
    stash_call(function.stash_slot(), owner, gpu_id, [args[0], args[1], args[2], args[3], 0]);
}

/// Return of an internal function: one [`CallPhase::Return`] record with the entry's time,
/// owner, gpu and arguments, and the `int` result.
#[inline(always)]
pub fn leave(ctx: &RetProbeContext, function: KfdFn) {
    let Some(e) = take(function.stash_slot()) else { return };
    let ret: i64 = ctx.ret();
    emit_call(
        function,
        CallPhase::Return,
        e.entry_ns,
        e.owner,
        e.gpu_id,
        [e.args[0], e.args[1], e.args[2], e.args[3]],
        ret,
    );
}

/// A kprobe (`$entry`) and kretprobe (`$ret`) on the internal function `KfdFn::$function`.
/// `|$ctx| $resolve` gives `(owner, gpu_id, args)` at the call.
macro_rules! call_pair {
    ($(#[$doc:meta])* $function:ident: $entry:ident, $ret:ident, |$ctx:ident| $resolve:expr) => {
        $(#[$doc])*
        #[aya_ebpf::macros::kprobe]
        pub fn $entry($ctx: aya_ebpf::programs::ProbeContext) -> u32 {
            let (owner, gpu_id, args): (u32, u32, [u64; 4]) = $resolve;
            $crate::pairs::enter(gpreempt_common::record::KfdFn::$function, owner, gpu_id, args);
            0
        }

        #[doc = concat!("Return of `KfdFn::", stringify!($function), "`.")]
        #[aya_ebpf::macros::kretprobe]
        pub fn $ret(ctx: aya_ebpf::programs::RetProbeContext) -> u32 {
            $crate::pairs::leave(&ctx, gpreempt_common::record::KfdFn::$function);
            0
        }
    };
}
pub(crate) use call_pair;
