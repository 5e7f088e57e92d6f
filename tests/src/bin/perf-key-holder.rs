//! Keeps the kernel's `perf_sched_events` static key enabled for the whole life of a test guest,
//! so that it is switched once, before any test runs, and never while the tests run.
//!
//! Every per-task perf event enables that key while it exists (`account_event`, PERF_ATTACH_TASK,
//! kernel/events/core.c, Linux 5.10-7.x) and a delayed work disables it after the last one goes;
//! the key's sites are inlined in `__schedule` (`perf_event_task_sched_in/out`). The doorbell
//! probe's uprobes are per-task perf events (one online process each), so covering and uncovering
//! online processes switched the key again and again, and under software emulation a vCPU that
//! the host descheduled mid-patch once executed a left-over int3 there ("Oops: int3 at
//! __schedule+0x407", 6.12 guest) — the artefact of docs/toolchain.md "Kernel text patches". On
//! real hardware the switch is safe; this process exists only in the guests xtask boots.
//!
//! It opens one software dummy event on itself (no sampling, never read) and sleeps until killed.

fn main() {
    // struct perf_event_attr: type PERF_TYPE_SOFTWARE (1), size, config PERF_COUNT_SW_DUMMY (9);
    // everything else zero. The kernel accepts any size >= PERF_ATTR_SIZE_VER0 (64 bytes).
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&1u32.to_ne_bytes());
    attr[4..8].copy_from_slice(&128u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&9u64.to_ne_bytes());
    // SAFETY: perf_event_open(2) with a zeroed attr of the stated size; pid 0 (this task), cpu -1.
    let fd = unsafe { libc::syscall(libc::SYS_perf_event_open, attr.as_ptr(), 0, -1, -1, 0usize) };
    if fd < 0 {
        eprintln!("perf-key-holder: perf_event_open failed: {}", std::io::Error::last_os_error());
        std::process::exit(1);
    }
    loop {
        // SAFETY: pause(2) has no preconditions; the fd stays open until the process is killed.
        unsafe { libc::pause() };
    }
}
