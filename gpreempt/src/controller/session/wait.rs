//! A hold or a gap of the caller's timing loop: one `ppoll` over the debug-event pipe (KFD writes
//! a byte per raised exception, docs/kfd.md §2.2), a SIGCHLD/SIGIO pipe (the target's stops and
//! exit, the event pipe's O_ASYNC) of every session the thread holds, and the caller's fds
//! (Ctrl-C, an eventfd), with the watchdog's deadline as the timeout.

use std::{
    os::fd::{AsRawFd, BorrowedFd},
    time::Instant,
};

use super::{SERVICE_PERIOD_NS, Session};
use crate::{clock::monotonic_ns, controller::vocabulary::DebugError};

/// Fds one [`wait_any`] polls per session: the debug-event pipe and the signal pipe.
pub const FDS_PER_SESSION: usize = 2;
/// The most fds one [`wait_any`] polls (sessions' and the caller's).
pub const MAX_POLL_FDS: usize = 64;

/// What ended a [`Session::wait`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// The deadline passed.
    Deadline,
    /// The caller's fd `extra[i]` is readable (not read: that is the caller's).
    Ready(usize),
    /// A session serviced events (new queues, runtime change): see its notices.
    Target,
    /// The watchdog resumed a session's queues (held longer than `max_suspend`).
    Watchdog,
}

impl Session {
    /// Wait until `deadline`, a readable fd of `extra`, a debug event or the watchdog, servicing
    /// the session meanwhile (one `ppoll`).
    pub fn wait(&mut self, deadline: Instant, extra: &[BorrowedFd<'_>]) -> Result<Wake, DebugError> {
        wait_any(std::slice::from_mut(self), deadline, extra)
    }

    /// [`Session::wait`] for a timing loop that already read the clock: `deadline_ns` and
    /// `now_ns` are CLOCK_MONOTONIC. A deadline already passed (a zero hold or gap) costs no
    /// system call unless a signal says something happened, the backstop look or the watchdog is
    /// due.
    pub fn wait_ns(&mut self, deadline_ns: u64, now_ns: u64, extra: &[BorrowedFd<'_>]) -> Result<Wake, DebugError> {
        if now_ns >= deadline_ns
            && !self.signals.arrived()
            && now_ns < self.last_service_ns + SERVICE_PERIOD_NS
            && self.watchdog_due_ns().is_none_or(|due| now_ns < due)
        {
            return Ok(Wake::Deadline);
        }
        wait_ns(std::slice::from_mut(self), deadline_ns, now_ns, extra)
    }
}

/// [`Session::wait`] over several sessions held by this thread (the scheduler's offline
/// processes): one `ppoll` over all their fds and `extra`. `Wake::Target`/`Wake::Watchdog` do not
/// say which session: read their notices. A session whose target exited makes every call fail
/// with `DebugError::TargetExited` naming its pid: detach it and wait on the others.
pub fn wait_any(sessions: &mut [Session], deadline: Instant, extra: &[BorrowedFd<'_>]) -> Result<Wake, DebugError> {
    let now_ns = monotonic_ns();
    let left = deadline.saturating_duration_since(Instant::now());
    wait_ns(sessions, now_ns + left.as_nanos() as u64, now_ns, extra)
}

fn wait_ns(
    sessions: &mut [Session],
    deadline_ns: u64,
    mut now_ns: u64,
    extra: &[BorrowedFd<'_>],
) -> Result<Wake, DebugError> {
    let nfds = FDS_PER_SESSION * sessions.len() + extra.len();
    if nfds > MAX_POLL_FDS {
        return Err(DebugError::TooManyFds(nfds));
    }
    loop {
        let mut woke = None;
        for s in sessions.iter_mut() {
            if s.watchdog(now_ns) {
                woke = Some(Wake::Watchdog);
            }
        }
        if let Some(w) = woke {
            return Ok(w);
        }
        let mut until = deadline_ns;
        let mut due = false;
        for s in sessions.iter() {
            until = until.min(s.watchdog_due_ns().unwrap_or(u64::MAX));
            due |= now_ns >= s.last_service_ns + SERVICE_PERIOD_NS || s.signals.arrived();
        }
        if now_ns >= deadline_ns && !due {
            return Ok(Wake::Deadline);
        }
        let timeout_ns = until.saturating_sub(now_ns).min(SERVICE_PERIOD_NS);
        let mut fds = [libc::pollfd { fd: -1, events: 0, revents: 0 }; MAX_POLL_FDS];
        for (i, s) in sessions.iter().enumerate() {
            fds[FDS_PER_SESSION * i].fd = s.dbg_read.as_raw_fd();
            fds[FDS_PER_SESSION * i + 1].fd = s.signals.fd().as_raw_fd();
        }
        for (i, fd) in extra.iter().enumerate() {
            fds[FDS_PER_SESSION * sessions.len() + i].fd = fd.as_raw_fd();
        }
        for p in fds.iter_mut().take(nfds) {
            p.events = libc::POLLIN;
        }
        let ts = libc::timespec {
            tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: `fds` holds `nfds` initialised pollfds; ts outlives the call; no sigmask.
        let n = unsafe { libc::ppoll(fds.as_mut_ptr(), nfds as libc::nfds_t, &ts, std::ptr::null()) };
        now_ns = monotonic_ns();
        let mut serviced = false;
        for (i, s) in sessions.iter_mut().enumerate() {
            let (dbg, chld) = (fds[FDS_PER_SESSION * i].revents != 0, fds[FDS_PER_SESSION * i + 1].revents != 0);
            if n > 0 && dbg {
                serviced |= s.service_events();
            }
            // The flag too, not only a readable pipe: a signal between `drain`'s clearing the flag
            // and its read leaves the flag set over an empty pipe, which would make every
            // zero-length wait poll until the next signal.
            let signalled = (n > 0 && chld) || s.signals.arrived();
            if (signalled && s.signals.drain()) || now_ns >= s.last_service_ns + SERVICE_PERIOD_NS {
                s.service_tracee();
                s.last_service_ns = now_ns;
            }
            s.check_alive()?;
        }
        if n > 0
            && let Some(i) = (0..extra.len()).find(|&i| fds[FDS_PER_SESSION * sessions.len() + i].revents != 0)
        {
            return Ok(Wake::Ready(i));
        }
        if serviced {
            return Ok(Wake::Target);
        }
        if now_ns >= deadline_ns {
            return Ok(Wake::Deadline);
        }
    }
}
