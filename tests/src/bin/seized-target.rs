//! A runtime-enabled KFD process (no GPU needed on 6.5+) for the controller's exit-path tests,
//! driven line by line on stdin by its MAIN thread — the thread gpreempt seizes, so a reply proves
//! that thread is not left in a ptrace stop. Every reply is one JSON object on stdout; the first
//! line is `{"pid", "runtime_enable": 0 or -errno, "sigrtmin"}`.
//!
//! Commands: `counts` (`{"rt": [handler runs of SIGRTMIN+0..3], "usr1"}`); `cancel` (a thread is
//! cancelled with `pthread_cancel`, which installs glibc's SIGCANCEL (32) handler, so a later
//! SIGCANCEL is harmless); `setxid` (a second thread calls `setresuid(-1, -1, -1)`: glibc then
//! sends SIGSETXID (33) to every other thread, the main one included, and returns only when each
//! ran its handler); `vfork MS` (replies `{"vforking"}`, then vforks a child that sleeps MS ms
//! before exec'ing `/bin/true`: meanwhile this process is a vfork parent; replies `{"vforked",
//! "status"}` after).

use std::{
    ffi::CString,
    io::{BufRead, Write},
    sync::atomic::{AtomicU32, Ordering},
    thread,
};

use anyhow::{Context, Result, bail};
use gpreempt::kfd::{Device, uapi};
use serde_json::json;

const RT_SIGNALS: usize = 4;
static RT: [AtomicU32; RT_SIGNALS] = [const { AtomicU32::new(0) }; RT_SIGNALS];
static USR1: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_signal(signo: libc::c_int) {
    let rt = signo - libc::SIGRTMIN();
    if (0..RT_SIGNALS as i32).contains(&rt) {
        RT[rt as usize].fetch_add(1, Ordering::Relaxed);
    } else if signo == libc::SIGUSR1 {
        USR1.fetch_add(1, Ordering::Relaxed);
    }
}

fn install(signo: libc::c_int) -> Result<()> {
    // SAFETY: a zeroed sigaction with a handler that only touches atomics.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        if libc::sigaction(signo, &sa, std::ptr::null_mut()) != 0 {
            bail!("sigaction({signo}): {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn reply(value: serde_json::Value) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{value}")?;
    out.flush()?;
    Ok(())
}

/// `pthread_cancel` of a thread parked in a cancellation point.
fn cancel_a_thread() -> Result<()> {
    extern "C" fn park(_: *mut libc::c_void) -> *mut libc::c_void {
        loop {
            // SAFETY: pause is a cancellation point.
            unsafe { libc::pause() };
        }
    }
    // SAFETY: standard pthread create / cancel / join on a thread we own.
    unsafe {
        let mut t: libc::pthread_t = std::mem::zeroed();
        if libc::pthread_create(&mut t, std::ptr::null(), park, std::ptr::null_mut()) != 0 {
            bail!("pthread_create failed");
        }
        if libc::pthread_cancel(t) != 0 {
            bail!("pthread_cancel failed");
        }
        libc::pthread_join(t, std::ptr::null_mut());
    }
    Ok(())
}

/// What the vfork child needs, prepared before the clone.
struct VforkChild {
    path: CString,
    pause: libc::timespec,
}

extern "C" fn vfork_child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `VforkChild`, alive while the parent waits (CLONE_VFORK).
    unsafe {
        let c = &*(arg as *const VforkChild);
        libc::nanosleep(&c.pause, std::ptr::null_mut());
        let argv = [c.path.as_ptr(), std::ptr::null()];
        libc::execv(c.path.as_ptr(), argv.as_ptr());
        libc::_exit(127)
    }
}

/// vfork a child that sleeps `ms` then execs /bin/true; the child's wait status. Done as
/// `clone(CLONE_VM | CLONE_VFORK)` on a stack of its own (what vfork(2) is, kernel/fork.c, 6.12),
/// so the child cannot clobber this function's frame.
fn vfork_and_wait(ms: u64) -> Result<i32> {
    let child_args = VforkChild {
        path: CString::new("/bin/true")?,
        pause: libc::timespec { tv_sec: (ms / 1000) as libc::time_t, tv_nsec: ((ms % 1000) * 1_000_000) as _ },
    };
    let mut stack = vec![0u8; 64 * 1024];
    // SAFETY: the child runs `vfork_child` on `stack` (top of it: stacks grow down) and only
    // reads `child_args`; both outlive it because CLONE_VFORK suspends us until it execs or exits.
    let child = unsafe {
        libc::clone(
            vfork_child,
            stack.as_mut_ptr().add(stack.len()).cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            &child_args as *const VforkChild as *mut libc::c_void,
        )
    };
    if child < 0 {
        bail!("clone(CLONE_VFORK): {}", std::io::Error::last_os_error());
    }
    let mut status = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(child, &mut status, 0) };
    Ok(status)
}

fn main() -> Result<()> {
    for n in 0..RT_SIGNALS as i32 {
        install(libc::SIGRTMIN() + n)?;
    }
    install(libc::SIGUSR1)?;
    let device = Device::open()?;
    let mut args =
        uapi::RuntimeEnableArgs { r_debug: 0, mode_mask: uapi::runtime_enable::MODE_ENABLE_MASK, capabilities_mask: 0 };
    let runtime = match device.runtime_enable(&mut args) {
        Ok(()) => 0,
        Err(e) => -(e as i32),
    };
    reply(json!({"pid": std::process::id(), "runtime_enable": runtime, "sigrtmin": libc::SIGRTMIN()}))?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["counts"] => {
                let rt: Vec<u32> = RT.iter().map(|c| c.load(Ordering::Relaxed)).collect();
                reply(json!({"rt": rt, "usr1": USR1.load(Ordering::Relaxed)}))?;
            }
            ["cancel"] => {
                cancel_a_thread()?;
                reply(json!({"cancel": 0}))?;
            }
            ["setxid"] => {
                // SAFETY: -1 leaves every id unchanged; glibc still synchronises all threads.
                let r = thread::spawn(|| unsafe { libc::setresuid(u32::MAX, u32::MAX, u32::MAX) })
                    .join()
                    .ok()
                    .context("setxid thread panicked")?;
                reply(json!({"setxid": r}))?;
            }
            ["vfork", ms] => {
                reply(json!({"vforking": true}))?;
                let status = vfork_and_wait(ms.parse()?)?;
                reply(json!({"vforked": true, "status": status}))?;
            }
            _ => reply(json!({"error": format!("unknown command `{line}`")}))?,
        }
    }
    Ok(())
}
