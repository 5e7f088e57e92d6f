//! The Rust twin of `dbg_pair.c` for `cargo xtask bench`'s controller row: the same ioctl pair,
//! the same loop, the same output, in a Rust program with nothing but the standard library (the
//! C library's functions declared by hand). It separates what the language and its code
//! generation cost under software emulation from what gpreempt's own per-cycle work costs.
//!
//!   dbg-pair-rs PID CYCLES GRACE_PERIOD
//!
//! Compiled by xtask with `rustc -C opt-level=3`; layouts as in dbg_pair.c (Linux 6.12.117
//! include/uapi/linux/kfd_ioctl.h, KFD_IOCTL_MINOR_VERSION 17).

use std::os::raw::{c_int, c_long, c_ulong, c_void};
use std::process::ExitCode;

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

/// `struct kfd_ioctl_dbg_trap_args`: pid, op, then the 24-byte union.
#[repr(C)]
struct DbgTrapArgs {
    pid: u32,
    op: u32,
    data: [u64; 3],
}

/// `struct kfd_queue_snapshot_entry` (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SnapshotEntry {
    addresses: [u64; 5],
    queue_id: u32,
    gpu_id: u32,
    ring_size: u32,
    queue_type: u32,
    ctx_save_restore_area_size: u32,
    reserved: u32,
}

extern "C" {
    fn clock_gettime(clock: c_int, ts: *mut Timespec) -> c_int;
    fn ioctl(fd: c_int, request: c_ulong, ...) -> c_int;
    fn ptrace(request: c_int, pid: c_int, addr: *mut c_void, data: *mut c_void) -> c_long;
    fn open(path: *const u8, flags: c_int) -> c_int;
    fn pipe2(fds: *mut c_int, flags: c_int) -> c_int;
}

/// `_IOWR('K', 0x26, struct kfd_ioctl_dbg_trap_args)`
const AMDKFD_IOC_DBG_TRAP: c_ulong = 0xC020_4B26;
const ENABLE: u32 = 0;
const DISABLE: u32 = 1;
const SUSPEND_QUEUES: u32 = 6;
const RESUME_QUEUES: u32 = 7;
const GET_QUEUE_SNAPSHOT: u32 = 13;
const CLOCK_MONOTONIC: c_int = 1;
const PTRACE_SEIZE: c_int = 0x4206;
const PTRACE_DETACH: c_int = 17;
const O_RDWR: c_int = 2;
const O_NONBLOCK: c_int = 0o4000;
const O_CLOEXEC: c_int = 0o2000000;

fn now_ns() -> u64 {
    let mut t = Timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out pointer.
    unsafe { clock_gettime(CLOCK_MONOTONIC, &mut t) };
    (t.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(t.tv_nsec as u64)
}

fn dbg_trap(kfd: c_int, pid: u32, op: u32, a: u64, b: u64, c: u64) -> c_int {
    let mut args = DbgTrapArgs { pid, op, data: [a, b, c] };
    // SAFETY: the ioctl's argument struct; the arrays it points to outlive the call.
    unsafe { ioctl(kfd, AMDKFD_IOC_DBG_TRAP, &mut args as *mut DbgTrapArgs) }
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    let parsed = match argv.as_slice() {
        [_, pid, cycles, grace] => (pid.parse::<u32>(), cycles.parse::<usize>(), grace.parse::<u32>()),
        _ => {
            eprintln!("usage: dbg-pair-rs PID CYCLES GRACE_PERIOD");
            return ExitCode::from(2);
        }
    };
    let (Ok(pid), Ok(cycles), Ok(grace)) = parsed else {
        eprintln!("usage: dbg-pair-rs PID CYCLES GRACE_PERIOD (numbers)");
        return ExitCode::from(2);
    };
    let mut times = vec![[0u64; 4]; cycles];
    let mut snap = [SnapshotEntry::default(); 64];
    let (mut ids, mut again) = ([0u32; 64], [0u32; 64]);
    let mut rinfo = [0u8; 16];
    let mut events = [0 as c_int; 2];
    let null = std::ptr::null_mut();
    // SAFETY: plain system calls on values owned by this function.
    unsafe {
        if ptrace(PTRACE_SEIZE, pid as c_int, null, null) < 0 {
            eprintln!("PTRACE_SEIZE: {}", std::io::Error::last_os_error());
            return ExitCode::FAILURE;
        }
        let kfd = open(c"/dev/kfd".as_ptr().cast(), O_RDWR | O_CLOEXEC);
        let mut status = ExitCode::FAILURE;
        'session: {
            if kfd < 0 || pipe2(events.as_mut_ptr(), O_NONBLOCK | O_CLOEXEC) < 0 {
                eprintln!("/dev/kfd: {}", std::io::Error::last_os_error());
                break 'session;
            }
            let info = rinfo.as_mut_ptr() as u64;
            if dbg_trap(kfd, pid, ENABLE, 0, info, rinfo.len() as u64 | ((events[1] as u64) << 32)) < 0 {
                eprintln!("DBG_TRAP ENABLE: {}", std::io::Error::last_os_error());
                break 'session;
            }
            // num_queues in, the real count out (low word of data[2]); entry_size in the high word.
            let size = size_of::<SnapshotEntry>() as u64;
            let mut s = DbgTrapArgs {
                pid,
                op: GET_QUEUE_SNAPSHOT,
                data: [0, snap.as_mut_ptr() as u64, 64 | (size << 32)],
            };
            if ioctl(kfd, AMDKFD_IOC_DBG_TRAP, &mut s as *mut DbgTrapArgs) < 0 {
                eprintln!("GET_QUEUE_SNAPSHOT: {}", std::io::Error::last_os_error());
            } else {
                let n = (s.data[2] as u32).min(64) as usize;
                for i in 0..n {
                    ids[i] = snap[i].queue_id;
                }
                let mut failed = None;
                for (c, t) in times.iter_mut().enumerate() {
                    // KFD writes status bits into the array: hand it a fresh copy each time.
                    std::ptr::copy_nonoverlapping(ids.as_ptr(), again.as_mut_ptr(), n);
                    t[0] = now_ns();
                    let mut ret = dbg_trap(kfd, pid, SUSPEND_QUEUES, 0, again.as_mut_ptr() as u64, n as u64 | ((grace as u64) << 32));
                    t[1] = now_ns();
                    std::ptr::copy_nonoverlapping(ids.as_ptr(), again.as_mut_ptr(), n);
                    t[2] = now_ns();
                    ret |= dbg_trap(kfd, pid, RESUME_QUEUES, again.as_mut_ptr() as u64, n as u64, 0);
                    t[3] = now_ns();
                    if ret < 0 {
                        failed = Some(c);
                        break;
                    }
                }
                match failed {
                    Some(c) => eprintln!("cycle {c}: {}", std::io::Error::last_os_error()),
                    None => {
                        let mut out = String::with_capacity(cycles * 64);
                        for t in &times {
                            out.push_str(&format!("{} {} {} {}\n", t[0], t[1], t[2], t[3]));
                        }
                        print!("{out}");
                        eprintln!("dbg-pair-rs: {cycles} cycles on {n} queue(s) of pid {pid}");
                        status = ExitCode::SUCCESS;
                    }
                }
            }
            dbg_trap(kfd, pid, DISABLE, 0, 0, 0);
        }
        ptrace(PTRACE_DETACH, pid as c_int, null, null);
        status
    }
}
