//! Empty programs for `gpreempt trace --empty-probes` (hidden): attached to the functions the
//! benchmarked ioctl paths hit, they measure the kprobe + kretprobe floor itself, what no
//! tracer built on kprobes can go below (`cargo xtask bench`, BENCHMARKS.md row 1).
//! One program per attachment because a loaded program is attached by name from the table.

use aya_ebpf::{
    macros::{kprobe, kretprobe},
    programs::{ProbeContext, RetProbeContext},
};

macro_rules! floor {
    ($entry:ident, $ret:ident) => {
        #[kprobe]
        pub fn $entry(_ctx: ProbeContext) -> u32 {
            0
        }
        #[kretprobe]
        pub fn $ret(_ctx: RetProbeContext) -> u32 {
            0
        }
    };
}

floor!(floor_create_queue_entry, floor_create_queue_return);
floor!(floor_debug_trap_entry, floor_debug_trap_return);
floor!(floor_suspend_queues_entry, floor_suspend_queues_return);
floor!(floor_resume_queues_entry, floor_resume_queues_return);
