//! The reaction thread's one wait while the online side is idle and every online queue is
//! covered by the doorbell probe: the probe's ring buffer (a submission), the nudge (a command
//! from the other threads: a new queue, an attach), the hint socket (a client or a line) or the
//! slow cross-check's deadline, whichever comes first. Otherwise the thread steps every `--poll` as before.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// An eventfd the other threads bump after handing the reaction thread a command, so that a
/// command never waits for the cross-check.
#[derive(Debug)]
pub struct Nudge {
    fd: OwnedFd,
}

impl Nudge {
    pub fn new() -> std::io::Result<Self> {
        // SAFETY: eventfd(2) with valid flags; the fd is owned from here on.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh fd of ours.
        Ok(Self { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Wake the waiter (or make its next wait return at once).
    pub fn nudge(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64. A full counter (2^64-2 nudges) only fails EAGAIN.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Take the nudges (the waiter, after waking).
    pub fn clear(&self) {
        let mut n: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64; EAGAIN when there was none.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Wait until one of `fds` is readable or `timeout_ns` passed (ppoll: a nanosecond timeout).
/// Returns whether some fd was readable.
pub fn wait_readable(fds: &[RawFd], timeout_ns: u64) -> bool {
    let mut polls: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `polls` is a live array of `polls.len()` pollfds; a valid timespec; no signal mask.
    let n = unsafe { libc::ppoll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, &ts, std::ptr::null()) };
    n > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nudge_ends_the_wait_and_clear_takes_it() {
        let nudge = Nudge::new().unwrap();
        assert!(!wait_readable(&[nudge.fd()], 1_000_000), "nothing to read: the timeout");
        nudge.nudge();
        nudge.nudge();
        assert!(wait_readable(&[nudge.fd()], 10_000_000_000), "nudged: at once");
        nudge.clear();
        assert!(!wait_readable(&[nudge.fd()], 1_000_000), "both nudges taken by one clear");
    }
}
