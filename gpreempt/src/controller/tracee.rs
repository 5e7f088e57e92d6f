//! The ptrace link KFD requires (docs/kfd.md §2.1: the calling thread must be the ptrace parent of the
//! target's leader), kept invisible to the target: PTRACE_SEIZE does not stop it, every signal it
//! receives is re-injected, job-control stops stay stops (PTRACE_LISTEN), and detach works from
//! any state within a deadline. All calls must come from the thread that seized (ptrace links are
//! per thread).
//!
//! Wait statuses are decoded from the raw `int` rather than through nix's `WaitStatus`: nix's
//! `Signal` has no SIGRTMIN..SIGRTMAX, so a real-time signal to the target (glibc's SIGCANCEL 32
//! and SIGSETXID 33, POSIX timers) made its `waitpid` fail after the kernel had already consumed
//! the stop, leaving the target in a ptrace stop.

use std::{
    thread,
    time::{Duration, Instant},
};

use nix::{errno::Errno, sys::ptrace, unistd::Pid};

use crate::domain::HostPid;

/// How long [`Tracee::detach`] waits for the interrupt stop PTRACE_DETACH needs. A tracee in
/// uninterruptible sleep, or a vfork parent (it waits for the child's exec or exit in
/// `wait_for_vfork_done`, kernel/fork.c, 6.12, and only then reaches the stop), may take longer
/// than anyone should wait.
pub const DETACH_DEADLINE: Duration = Duration::from_secs(2);
/// Poll period while waiting for that stop.
const DETACH_POLL: Duration = Duration::from_millis(5);

/// What servicing the tracee observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceeState {
    Running,
    /// Exited with this status, or killed by this signal (as `128 + signo`).
    Gone(i32),
}

/// How [`Tracee::detach`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DetachOutcome {
    /// PTRACE_DETACH done (or there was nothing to detach: already detached).
    Detached,
    /// The tracee exited before or during the detach.
    Gone,
    /// It did not reach a ptrace stop within [`DETACH_DEADLINE`]. The link stays until this
    /// thread exits: the kernel detaches every tracee of an exiting tracer thread (`exit_ptrace`
    /// from `forget_original_parent`, kernel/exit.c and kernel/ptrace.c, 6.12), and
    /// `__ptrace_unlink` clears the pending interrupt (JOBCTL_TRAP_MASK), so the target runs on.
    TimedOut,
}

/// One decoded `waitpid` status (see wait(2) and ptrace(2), "PTRACE_SEIZE" stops).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    Exited(i32),
    Signaled(i32),
    /// A ptrace stop: `signo` is WSTOPSIG, `event` is `status >> 16` (0 for a signal-delivery stop,
    /// `PTRACE_EVENT_STOP` for group and interrupt stops under SEIZE).
    Stopped {
        signo: i32,
        event: i32,
    },
    Continued,
}

impl Stop {
    /// Decode a raw wait status. Any signal number the kernel reports (1..=64) is kept as is.
    pub fn decode(status: libc::c_int) -> Self {
        if libc::WIFEXITED(status) {
            Self::Exited(libc::WEXITSTATUS(status))
        } else if libc::WIFSIGNALED(status) {
            Self::Signaled(libc::WTERMSIG(status))
        } else if libc::WIFSTOPPED(status) {
            Self::Stopped { signo: libc::WSTOPSIG(status), event: status >> 16 }
        } else {
            Self::Continued
        }
    }
}

/// A seized process leader.
#[derive(Debug)]
pub struct Tracee {
    pid: Pid,
    gone: Option<i32>,
    detached: bool,
    /// Signals delivered to the target while seized (re-injected), for reports.
    pub forwarded: u64,
}

impl Tracee {
    /// `PTRACE_SEIZE` without options: the target keeps running; we only see its signal and
    /// group stops.
    pub fn seize(pid: HostPid) -> Result<Self, Errno> {
        let pid = Pid::from_raw(pid.0 as i32);
        ptrace::seize(pid, ptrace::Options::empty())?;
        Ok(Self { pid, gone: None, detached: false, forwarded: 0 })
    }

    /// A link that was never made, for the session's host unit tests: servicing and detaching
    /// it do nothing.
    #[cfg(test)]
    pub(crate) fn unseized(pid: HostPid) -> Self {
        Self { pid: Pid::from_raw(pid.0 as i32), gone: None, detached: true, forwarded: 0 }
    }

    pub fn is_gone(&self) -> Option<i32> {
        self.gone
    }

    /// One `waitpid(pid, __WALL | flags)`: `Ok(None)` when nothing is pending (WNOHANG).
    fn wait(&self, flags: libc::c_int) -> Result<Option<Stop>, Errno> {
        let mut status: libc::c_int = 0;
        // SAFETY: `status` is a valid out pointer for the call's duration.
        let r = unsafe { libc::waitpid(self.pid.as_raw(), &mut status, flags | libc::__WALL) };
        match r {
            -1 => Err(Errno::last()),
            0 => Ok(None),
            _ => Ok(Some(Stop::decode(status))),
        }
    }

    /// Handle every pending stop without blocking; returns whether the target still exists.
    pub fn service(&mut self) -> TraceeState {
        while self.gone.is_none() && !self.detached {
            match self.wait(libc::WNOHANG) {
                Ok(None) => break,
                Ok(Some(stop)) => self.handle(stop),
                Err(Errno::EINTR) => continue,
                // ECHILD: no longer our tracee (reaped elsewhere, or detached under us).
                Err(_) => self.gone = Some(-1),
            }
        }
        match self.gone {
            Some(code) => TraceeState::Gone(code),
            None => TraceeState::Running,
        }
    }

    fn handle(&mut self, stop: Stop) {
        match stop {
            Stop::Exited(code) => self.gone = Some(code),
            Stop::Signaled(signo) => self.gone = Some(128 + signo),
            // Group-stop under SEIZE (SIGSTOP/SIGTSTP/…): leave it stopped, as if untraced, but
            // still notice the SIGCONT that ends it (man 2 ptrace, "PTRACE_LISTEN").
            Stop::Stopped { signo, event: libc::PTRACE_EVENT_STOP } if is_stop_signal(signo) => {
                self.request(libc::PTRACE_LISTEN, 0);
            }
            // PTRACE_INTERRUPT stops and other events: just continue.
            Stop::Stopped { event, .. } if event != 0 => self.request(libc::PTRACE_CONT, 0),
            // Signal-delivery-stop: deliver the signal the target was sent, whatever its number.
            Stop::Stopped { signo, .. } => {
                self.forwarded += 1;
                self.request(libc::PTRACE_CONT, signo);
            }
            Stop::Continued => {}
        }
    }

    /// A ptrace request whose `data` is a signal number (or 0). Errors mean the tracee is no
    /// longer in a stop (killed meanwhile); the next wait reports why.
    fn request(&self, request: libc::c_uint, signo: i32) {
        // SAFETY: no pointers are passed; `data` is a signal number.
        unsafe { libc::ptrace(request, self.pid.as_raw(), 0, signo as libc::c_long) };
    }

    /// Detach from any state: interrupt so the tracee is in a ptrace-stop (required by
    /// PTRACE_DETACH), then detach handing back a signal it was about to receive. Gives up after
    /// [`DETACH_DEADLINE`] (see [`DetachOutcome::TimedOut`]).
    pub fn detach(&mut self) -> DetachOutcome {
        self.detach_within(DETACH_DEADLINE)
    }

    pub fn detach_within(&mut self, deadline: Duration) -> DetachOutcome {
        if self.gone.is_some() {
            return DetachOutcome::Gone;
        }
        if self.detached {
            return DetachOutcome::Detached;
        }
        self.detached = true;
        if ptrace::interrupt(self.pid).is_err() {
            return DetachOutcome::Gone;
        }
        let until = Instant::now() + deadline;
        loop {
            match self.wait(libc::WNOHANG) {
                // A signal-delivery stop: hand the signal back with the detach.
                Ok(Some(Stop::Stopped { signo, event: 0 })) => {
                    self.request(libc::PTRACE_DETACH, signo);
                    return DetachOutcome::Detached;
                }
                // The interrupt or a group stop: a tracee in group-stop stays stopped after detach
                // (it was stopped by a signal).
                Ok(Some(Stop::Stopped { .. })) => {
                    self.request(libc::PTRACE_DETACH, 0);
                    return DetachOutcome::Detached;
                }
                Ok(Some(Stop::Exited(_) | Stop::Signaled(_))) | Err(Errno::ECHILD | Errno::ESRCH) => {
                    return DetachOutcome::Gone;
                }
                Ok(Some(Stop::Continued)) | Err(Errno::EINTR) => continue,
                Ok(None) if Instant::now() < until => thread::sleep(DETACH_POLL),
                Ok(None) => {
                    log::warn!(
                        "pid {} did not stop within {deadline:?} for PTRACE_DETACH (uninterruptible sleep or a \
                         vfork parent); the kernel detaches it when this thread exits",
                        self.pid
                    );
                    return DetachOutcome::TimedOut;
                }
                Err(_) => return DetachOutcome::Gone,
            }
        }
    }
}

impl Drop for Tracee {
    fn drop(&mut self) {
        self.detach();
    }
}

fn is_stop_signal(signo: i32) -> bool {
    matches!(signo, libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU)
}

#[cfg(test)]
mod tests {
    use std::{os::unix::process::CommandExt, process::Command};

    use super::*;

    /// State letter of /proc/<pid>/stat.
    fn state(pid: u32) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        stat[stat.rfind(')').unwrap() + 2..].chars().next().unwrap()
    }

    #[test]
    fn a_real_time_signal_is_re_injected_and_the_tracee_runs_on() {
        let rt = libc::SIGRTMIN() + 6;
        // `sleep` with the signal ignored: a ptraced task still stops for it (sig_ignored() is
        // false under ptrace, kernel/signal.c, 6.12), and must not be left in that stop.
        let mut command = Command::new("sleep");
        command.arg("30");
        // SAFETY: only `signal(2)` between fork and exec.
        unsafe {
            command.pre_exec(move || {
                libc::signal(rt, libc::SIG_IGN);
                Ok(())
            })
        };
        let mut child = command.spawn().unwrap();
        let pid = child.id();
        let mut tracee = match Tracee::seize(HostPid(pid)) {
            Ok(t) => t,
            Err(e) => {
                let _ = child.kill();
                panic!("PTRACE_SEIZE of a child failed ({e}): ptrace is not permitted here");
            }
        };
        for _ in 0..3 {
            // SAFETY: signalling our own child.
            assert_eq!(unsafe { libc::kill(pid as i32, rt) }, 0);
        }
        let until = Instant::now() + Duration::from_secs(10);
        while tracee.forwarded < 3 && Instant::now() < until {
            assert_eq!(tracee.service(), TraceeState::Running);
            thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(tracee.forwarded, 3);
        assert_eq!(tracee.service(), TraceeState::Running);
        assert_ne!(state(pid), 't', "left in a ptrace stop");
        assert_eq!(tracee.detach(), DetachOutcome::Detached);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Raw statuses as the kernel builds them (`wait_task_stopped`/`ptrace_stop`, kernel/exit.c and
    /// kernel/signal.c, 6.12): `(event << 16) | (signo << 8) | 0x7f` for stops.
    #[test]
    fn real_time_and_glibc_internal_signals_decode_to_their_numbers() {
        let stopped = |signo: i32, event: i32| (event << 16) | (signo << 8) | 0x7f;
        for signo in [32, 33, 34, 40, 64] {
            assert_eq!(Stop::decode(stopped(signo, 0)), Stop::Stopped { signo, event: 0 });
        }
        assert_eq!(
            Stop::decode(stopped(libc::SIGSTOP, libc::PTRACE_EVENT_STOP)),
            Stop::Stopped { signo: libc::SIGSTOP, event: libc::PTRACE_EVENT_STOP }
        );
        assert_eq!(Stop::decode(3 << 8), Stop::Exited(3));
        assert_eq!(Stop::decode(35), Stop::Signaled(35));
        assert_eq!(Stop::decode(0xffff), Stop::Continued);
    }
}
