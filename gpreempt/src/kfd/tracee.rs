//! The ptrace link KFD requires (docs/kfd.md §2.1: the calling thread must be the ptrace parent of the
//! target's leader), kept invisible to the target: PTRACE_SEIZE does not stop it, every signal it
//! receives is re-injected, job-control stops stay stops (PTRACE_LISTEN), and detach works from
//! any state. All calls must come from the thread that seized (ptrace links are per thread).

use nix::{
    errno::Errno,
    sys::{
        ptrace,
        signal::Signal,
        wait::{WaitPidFlag, WaitStatus, waitpid},
    },
    unistd::Pid,
};

/// What servicing the tracee observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceeState {
    Running,
    /// Exited with this status, or killed by this signal (as `128 + signo`).
    Gone(i32),
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
    pub fn seize(pid: u32) -> Result<Self, Errno> {
        let pid = Pid::from_raw(pid as i32);
        ptrace::seize(pid, ptrace::Options::empty())?;
        Ok(Self { pid, gone: None, detached: false, forwarded: 0 })
    }

    pub fn is_gone(&self) -> Option<i32> {
        self.gone
    }

    /// Handle every pending stop without blocking; returns whether the target still exists.
    pub fn service(&mut self) -> TraceeState {
        while self.gone.is_none() && !self.detached {
            match waitpid(self.pid, Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(status) => self.handle(status),
                // ECHILD: no longer our tracee (reaped elsewhere, or detached under us).
                Err(Errno::EINTR) => continue,
                Err(_) => self.gone = Some(-1),
            }
        }
        match self.gone {
            Some(code) => TraceeState::Gone(code),
            None => TraceeState::Running,
        }
    }

    fn handle(&mut self, status: WaitStatus) {
        match status {
            WaitStatus::Exited(_, code) => self.gone = Some(code),
            WaitStatus::Signaled(_, sig, _) => self.gone = Some(128 + sig as i32),
            // Group-stop under SEIZE (SIGSTOP/SIGTSTP/…): leave it stopped, as if untraced, but
            // still notice the SIGCONT that ends it (man 2 ptrace, "PTRACE_LISTEN").
            WaitStatus::PtraceEvent(pid, sig, libc::PTRACE_EVENT_STOP) if is_stop_signal(sig) => {
                // SAFETY: plain ptrace request on our tracee; no pointers passed.
                unsafe { libc::ptrace(libc::PTRACE_LISTEN, pid.as_raw(), 0, 0) };
            }
            // PTRACE_INTERRUPT stops or other events: just continue.
            WaitStatus::PtraceEvent(pid, _, _) | WaitStatus::PtraceSyscall(pid) => {
                let _ = ptrace::cont(pid, None);
            }
            // Signal-delivery-stop: deliver the signal the target was sent.
            WaitStatus::Stopped(pid, sig) => {
                self.forwarded += 1;
                let _ = ptrace::cont(pid, Some(sig));
            }
            WaitStatus::Continued(_) | WaitStatus::StillAlive => {}
        }
    }

    /// Detach from any state: interrupt so the tracee is in a ptrace-stop (required by
    /// PTRACE_DETACH), then detach handing back a signal it was about to receive.
    pub fn detach(&mut self) {
        if self.gone.is_some() || self.detached {
            return;
        }
        self.detached = true;
        if ptrace::interrupt(self.pid).is_err() {
            return;
        }
        loop {
            match waitpid(self.pid, Some(WaitPidFlag::__WALL)) {
                Ok(WaitStatus::Stopped(pid, sig)) => {
                    let _ = ptrace::detach(pid, Some(sig));
                    break;
                }
                Ok(WaitStatus::PtraceEvent(pid, _, _)) | Ok(WaitStatus::PtraceSyscall(pid)) => {
                    // A tracee in group-stop stays stopped after detach (it was stopped by a signal).
                    let _ = ptrace::detach(pid, None);
                    break;
                }
                Ok(WaitStatus::Exited(..)) | Ok(WaitStatus::Signaled(..)) | Err(Errno::ECHILD) | Err(Errno::ESRCH) => {
                    break;
                }
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(_) => break,
            }
        }
    }
}

impl Drop for Tracee {
    fn drop(&mut self) {
        self.detach();
    }
}

fn is_stop_signal(sig: Signal) -> bool {
    matches!(sig, Signal::SIGSTOP | Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU)
}
