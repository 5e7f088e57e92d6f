//! A watchdog outside the controller's process: if queues stay suspended past their limit and the
//! controller does not resume them — because it is stopped (Ctrl-Z, SIGSTOP, SIGTTOU from a
//! progress line, a frozen cgroup) or stuck — the watchdog SIGKILLs the controller. KFD then
//! resumes the target's queues and disables debugging as part of the debugger's teardown
//! (docs/kfd.md §2.7), and the kernel ends the ptrace link with the tracer (`exit_ptrace`,
//! kernel/ptrace.c, 6.12). An in-process watchdog cannot do this: it stops with the process.
//!
//! The watchdog is a forked child in its own session (`setsid`), so job control aimed at the
//! controller's foreground process group (Ctrl-Z, Ctrl-C) does not reach it. It reads fixed-size
//! messages from a pipe: [`Watchdog::arm`] and [`Watchdog::disarm`] are one non-blocking `write(2)`
//! each, no allocation, cheap enough for every suspend/resume. It exits when the pipe reports EOF:
//! the controller closed it ([`Drop`]) or died. A watchdog inside a frozen cgroup freezes too;
//! nothing in-process can help there either.
//!
//! After `fork` the child of a multi-threaded process may only call async-signal-safe functions:
//! it uses raw `poll`, `read`, `clock_gettime`, `kill`, `write` and `_exit` and never allocates.

use std::{
    os::fd::{AsRawFd, OwnedFd},
    time::Duration,
};

use nix::{errno::Errno, fcntl::OFlag, unistd::pipe2};

/// Added to the limit before the kill, so a controller that is merely late (it resumes at the
/// limit itself) is not killed for it.
pub const MARGIN: Duration = Duration::from_millis(500);

const DISARM: u64 = 0;
const ARM: u64 = 1;
/// One message: kind, then the CLOCK_MONOTONIC deadline in ns. 16 bytes ≤ PIPE_BUF, so every
/// write is atomic and a read of a multiple of 16 bytes never splits one.
const MESSAGE: usize = 16;
const _: () = assert!(MESSAGE <= libc::PIPE_BUF);

/// The controller's end: the pipe to its watchdog process.
#[derive(Debug)]
pub struct Watchdog {
    /// None once closed (in drop).
    pipe: Option<OwnedFd>,
    child: libc::pid_t,
}

#[derive(Debug, thiserror::Error)]
pub enum WatchdogError {
    #[error("cannot create the watchdog pipe: {0}")]
    Pipe(Errno),
    #[error("cannot fork the watchdog process: {0}")]
    Fork(Errno),
}

impl Watchdog {
    /// Fork the watchdog process for this (the calling) process.
    pub fn spawn() -> Result<Self, WatchdogError> {
        let (read_end, write_end) = pipe2(OFlag::O_CLOEXEC).map_err(WatchdogError::Pipe)?;
        let controller = std::process::id() as libc::pid_t;
        let read_fd = read_end.as_raw_fd();
        // SAFETY: the child runs only async-signal-safe code (`watch`) and never returns.
        match unsafe { libc::fork() } {
            -1 => Err(WatchdogError::Fork(Errno::last())),
            0 => watch(read_fd, controller),
            child => {
                drop(read_end);
                // Non-blocking: a controller must never wait on its watchdog. A full pipe (64 KiB of
                // unread messages) means the watchdog itself is stuck.
                // SAFETY: fcntl on an fd we own.
                unsafe { libc::fcntl(write_end.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
                Ok(Self { pipe: Some(write_end), child })
            }
        }
    }

    /// The watchdog's pid (for tests and reports).
    pub fn pid(&self) -> u32 {
        self.child as u32
    }

    /// Queues are suspended: kill this process unless [`disarm`](Self::disarm) comes within
    /// `limit` + [`MARGIN`]. Re-arming moves the deadline.
    pub fn arm(&self, limit: Duration) {
        let deadline = monotonic_ns().saturating_add((limit + MARGIN).as_nanos() as u64);
        self.send(ARM, deadline);
    }

    /// Nothing is suspended any more.
    pub fn disarm(&self) {
        self.send(DISARM, 0);
    }

    fn send(&self, kind: u64, deadline: u64) {
        let Some(pipe) = &self.pipe else { return };
        let mut message = [0u8; MESSAGE];
        message[..8].copy_from_slice(&kind.to_ne_bytes());
        message[8..].copy_from_slice(&deadline.to_ne_bytes());
        // SAFETY: writes 16 bytes from a stack buffer to our pipe.
        let _ = unsafe { libc::write(pipe.as_raw_fd(), message.as_ptr().cast(), MESSAGE) };
    }
}

impl Drop for Watchdog {
    /// Closing the pipe ends the watchdog; reap it (briefly: a watchdog that was itself stopped
    /// exits at EOF once continued, reaped by init if we are gone by then).
    fn drop(&mut self) {
        drop(self.pipe.take());
        for _ in 0..100 {
            let mut status = 0;
            // SAFETY: reaping our own child without blocking.
            if unsafe { libc::waitpid(self.child, &mut status, libc::WNOHANG) } != 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// CLOCK_MONOTONIC in ns (async-signal-safe: vDSO `clock_gettime`).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// What the watchdog says on stderr before the kill (a constant: no formatting after fork).
const KILLING: &[u8] = b"gpreempt watchdog: queues stayed suspended past --max-suspend-ms and the controller did not \
resume them (stopped or stuck): killing it with SIGKILL; KFD resumes the queues on the debugger's exit\n";

/// The watchdog process: never returns.
fn watch(pipe: libc::c_int, controller: libc::pid_t) -> ! {
    // SAFETY (whole function): only async-signal-safe libc calls on stack memory.
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
        let mut armed: Option<u64> = None;
        let mut buf = [0u8; MESSAGE * 64];
        loop {
            let timeout = match armed {
                None => -1,
                Some(deadline) => {
                    let left_ms = deadline.saturating_sub(monotonic_ns()).div_ceil(1_000_000);
                    left_ms.min(i32::MAX as u64) as libc::c_int
                }
            };
            let mut fd = libc::pollfd { fd: keep, events: libc::POLLIN, revents: 0 };
            let ready = libc::poll(&mut fd, 1, timeout);
            if ready > 0 {
                let n = libc::read(keep, buf.as_mut_ptr().cast(), buf.len());
                if n == 0 {
                    libc::_exit(0); // the controller closed the pipe or died
                }
                if n > 0 {
                    for message in buf[..n as usize].chunks_exact(MESSAGE) {
                        let mut kind = [0u8; 8];
                        let mut deadline = [0u8; 8];
                        kind.copy_from_slice(&message[..8]);
                        deadline.copy_from_slice(&message[8..]);
                        armed = (u64::from_ne_bytes(kind) == ARM).then_some(u64::from_ne_bytes(deadline));
                    }
                }
            }
            if armed.is_some_and(|deadline| monotonic_ns() >= deadline) {
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
