//! A watchdog outside the controller's process: if queues stay suspended past their limit and the
//! controller does not resume them — because it is stopped (Ctrl-Z, SIGSTOP, SIGTTOU from a
//! progress line, a frozen cgroup) or stuck — the watchdog SIGKILLs the controller. KFD then
//! resumes the target's queues and disables debugging as part of the debugger's teardown
//! (docs/kfd.md §2.7), and the kernel ends the ptrace link with the tracer (`exit_ptrace`,
//! kernel/ptrace.c, 6.12). An in-process watchdog cannot do this: it stops with the process.
//!
//! The watchdog is a forked child in its own session (`setsid`), so job control aimed at the
//! controller's foreground process group (Ctrl-Z, Ctrl-C) does not reach it. The two processes
//! share one anonymous `MAP_SHARED` page holding the armed deadline: [`Watchdog::arm`] and
//! [`Watchdog::disarm`] are one atomic store each — no system call, so they cost nothing on the
//! controller's suspend/resume path (a pipe write per transition would wake the watchdog twice
//! per cycle). The watchdog looks at the page every [`LOOK_PERIOD`] and exits when the pipe it
//! holds reports EOF: the controller closed it ([`Drop`]) or died. A watchdog inside a frozen
//! cgroup freezes too; nothing in-process can help there either.
//!
//! After `fork` the child of a multi-threaded process may only call async-signal-safe functions:
//! it uses raw `poll`, `clock_gettime`, `kill`, `write` and `_exit` and never allocates.

use std::{
    os::fd::{AsRawFd, OwnedFd},
    ptr::NonNull,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use nix::{errno::Errno, fcntl::OFlag, unistd::pipe2};

// A bare vDSO `clock_gettime`: async-signal-safe, so the forked watchdog uses it too.
use crate::clock::monotonic_ns;

/// Added to the limit before the kill, so a controller that is merely late (it resumes at the
/// limit itself) is not killed for it.
pub const MARGIN: Duration = Duration::from_millis(500);

/// How often the watchdog reads the shared deadline: a bound on how late past `limit + MARGIN`
/// the kill comes, and one wake-up of an otherwise idle process.
pub const LOOK_PERIOD: Duration = Duration::from_millis(50);

/// The shared deadline's value when nothing is suspended.
const DISARMED: u64 = 0;

/// The controller's end: the shared deadline page and the pipe whose EOF ends the watchdog.
#[derive(Debug)]
pub struct Watchdog {
    /// CLOCK_MONOTONIC ns after which the watchdog kills the controller; [`DISARMED`] when idle.
    /// Points into a `MAP_SHARED` page that the child inherited at fork.
    deadline: NonNull<AtomicU64>,
    /// None once closed (in drop).
    pipe: Option<OwnedFd>,
    child: libc::pid_t,
}

#[derive(Debug, thiserror::Error)]
pub enum WatchdogError {
    #[error("cannot create the watchdog pipe: {0}")]
    Pipe(Errno),
    #[error("cannot map the watchdog's shared page: {0}")]
    Map(Errno),
    #[error("cannot fork the watchdog process: {0}")]
    Fork(Errno),
}

impl Watchdog {
    /// Fork the watchdog process for this (the calling) process.
    pub fn spawn() -> Result<Self, WatchdogError> {
        // SAFETY: a fresh anonymous shared mapping of one u64-aligned page, checked below.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size_of::<AtomicU64>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if page == libc::MAP_FAILED {
            return Err(WatchdogError::Map(Errno::last()));
        }
        let deadline = NonNull::new(page.cast::<AtomicU64>()).ok_or(WatchdogError::Map(Errno::EINVAL))?;
        // The page is zero-filled: DISARMED.
        let (read_end, write_end) = match pipe2(OFlag::O_CLOEXEC) {
            Ok(ends) => ends,
            Err(e) => {
                unmap(deadline);
                return Err(WatchdogError::Pipe(e));
            }
        };
        let controller = std::process::id() as libc::pid_t;
        let read_fd = read_end.as_raw_fd();
        // SAFETY: the child runs only async-signal-safe code (`watch`) and never returns.
        match unsafe { libc::fork() } {
            -1 => {
                unmap(deadline);
                Err(WatchdogError::Fork(Errno::last()))
            }
            // SAFETY: the mapping stays valid in the child (inherited, never unmapped there).
            0 => watch(read_fd, unsafe { deadline.as_ref() }, controller),
            child => {
                drop(read_end);
                Ok(Self { deadline, pipe: Some(write_end), child })
            }
        }
    }

    /// The watchdog's pid (for tests and reports).
    pub fn pid(&self) -> u32 {
        self.child as u32
    }

    /// Queues are suspended: kill this process unless [`disarm`](Self::disarm) comes within
    /// `limit` + [`MARGIN`]. Re-arming moves the deadline. One store, no system call.
    pub fn arm(&self, limit: Duration) {
        self.arm_from(monotonic_ns(), limit.as_nanos() as u64);
    }

    /// [`arm`](Self::arm) for a suspension that began at `since_ns` (CLOCK_MONOTONIC), a time the
    /// caller already read: no clock read, one store (the controller's per-cycle path).
    #[inline(always)]
    pub fn arm_from(&self, since_ns: u64, limit_ns: u64) {
        self.deadline().arm_from(since_ns, limit_ns);
    }

    /// Nothing is suspended any more. One store, no system call.
    #[inline(always)]
    pub fn disarm(&self) {
        self.deadline().disarm();
    }

    /// The shared deadline alone, for a loop that keeps it in a local while this lives.
    #[inline(always)]
    pub fn deadline(&self) -> Deadline<'_> {
        // SAFETY: mapped in `spawn`, unmapped only in drop, which the borrow outlasts.
        Deadline(unsafe { self.deadline.as_ref() })
    }
}

/// The deadline the watchdog process reads, borrowed from its [`Watchdog`].
#[derive(Clone, Copy, Debug)]
pub struct Deadline<'a>(&'a AtomicU64);

impl Deadline<'_> {
    /// See [`Watchdog::arm_from`].
    #[inline(always)]
    pub fn arm_from(self, since_ns: u64, limit_ns: u64) {
        const MARGIN_NS: u64 = MARGIN.as_nanos() as u64;
        let at = since_ns.saturating_add(limit_ns).saturating_add(MARGIN_NS);
        self.0.store(at.max(1), Ordering::Release);
    }

    /// See [`Watchdog::disarm`].
    #[inline(always)]
    pub fn disarm(self) {
        self.0.store(DISARMED, Ordering::Release);
    }
}

impl Drop for Watchdog {
    /// Closing the pipe ends the watchdog; reap it (briefly: a watchdog that was itself stopped
    /// exits at EOF once continued, reaped by init if we are gone by then).
    fn drop(&mut self) {
        self.disarm();
        drop(self.pipe.take());
        for _ in 0..100 {
            let mut status = 0;
            // SAFETY: reaping our own child without blocking.
            if unsafe { libc::waitpid(self.child, &mut status, libc::WNOHANG) } != 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        unmap(self.deadline);
    }
}

fn unmap(page: NonNull<AtomicU64>) {
    // SAFETY: the mapping made in `spawn`, of this size.
    unsafe { libc::munmap(page.as_ptr().cast(), size_of::<AtomicU64>()) };
}

/// What the watchdog says on stderr before the kill (a constant: no formatting after fork).
const KILLING: &[u8] = b"gpreempt watchdog: queues stayed suspended past --max-suspend and the controller did not \
resume them (stopped or stuck): killing it with SIGKILL; KFD resumes the queues on the debugger's exit\n";

/// The watchdog process: never returns.
fn watch(pipe: libc::c_int, deadline: &AtomicU64, controller: libc::pid_t) -> ! {
    // SAFETY: only async-signal-safe libc calls on stack memory (the whole function runs in the
    // forked child, where nothing else is safe).
    unsafe {
        // Out of the controller's session and process group: no job-control stop, no Ctrl-C.
        libc::setsid();
        // Keep stdin/out/err and the pipe; drop everything else (the KFD device, the target's
        // debug-event pipe) so nothing of the session lives on in this process.
        let keep = 3;
        if pipe != keep {
            libc::dup2(pipe, keep);
        }
        libc::syscall(libc::SYS_close_range, keep + 1, libc::c_uint::MAX, 0);
        let period = LOOK_PERIOD.as_millis() as libc::c_int;
        loop {
            let mut fd = libc::pollfd { fd: keep, events: libc::POLLIN, revents: 0 };
            // Nothing is ever written: readiness means EOF (the controller closed it or died).
            if libc::poll(&mut fd, 1, period) > 0 {
                libc::_exit(0);
            }
            let at = deadline.load(Ordering::Acquire);
            if at != DISARMED && monotonic_ns() >= at {
                libc::write(2, KILLING.as_ptr().cast(), KILLING.len());
                libc::kill(controller, libc::SIGKILL);
                libc::_exit(0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process (a forked copy of the test binary, parked in `pause`) that owns a watchdog.
    fn controller_with_watchdog(limit: Option<Duration>, disarm: bool, stop_itself: bool) -> libc::pid_t {
        // SAFETY: the child only sets up the watchdog and sleeps (no allocation).
        match unsafe { libc::fork() } {
            0 => {
                // SAFETY: `_exit` in the forked child, as below.
                let Ok(w) = Watchdog::spawn() else { unsafe { libc::_exit(2) } };
                if let Some(limit) = limit {
                    w.arm(limit);
                }
                if disarm {
                    w.disarm();
                }
                if stop_itself {
                    // SAFETY: signalling ourselves.
                    unsafe { libc::raise(libc::SIGSTOP) };
                }
                std::thread::sleep(Duration::from_secs(1));
                drop(w);
                // SAFETY: the forked child ends without running the parent's exit handlers.
                unsafe { libc::_exit(0) }
            }
            pid => pid,
        }
    }

    fn wait_status(pid: libc::pid_t) -> libc::c_int {
        let mut status = 0;
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        status
    }

    #[test]
    fn a_stopped_controller_with_queues_held_is_killed_after_the_limit() {
        let pid = controller_with_watchdog(Some(Duration::from_millis(100)), false, true);
        let status = wait_status(pid);
        assert!(libc::WIFSIGNALED(status), "status {status:#x}");
        assert_eq!(libc::WTERMSIG(status), libc::SIGKILL);
    }

    #[test]
    fn a_disarmed_or_never_armed_watchdog_lets_the_controller_live() {
        for (limit, disarm) in [(None, false), (Some(Duration::from_millis(100)), true)] {
            let pid = controller_with_watchdog(limit, disarm, false);
            let status = wait_status(pid);
            assert!(libc::WIFEXITED(status), "status {status:#x}");
            assert_eq!(libc::WEXITSTATUS(status), 0);
        }
    }
}
