//! A pipe that becomes readable when one of some signals arrives, so a `ppoll` can wait for
//! signals next to file descriptors. Signals are process-directed (SIGCHLD, SIGINT): whichever
//! thread runs the handler, the byte lands in the pipe the waiting thread polls. Handlers already
//! installed for those signals keep running (signal-hook-registry chains them).

use std::{
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use nix::{
    errno::Errno,
    fcntl::OFlag,
    unistd::{pipe2, read},
};
use signal_hook_registry::SigId;

/// The read end of a signal-fed pipe; dropping it removes the handlers.
#[derive(Debug)]
pub struct SignalPipe {
    read: OwnedFd,
    /// Written from signal handlers; closed only after they are unregistered.
    write: OwnedFd,
    /// Set by the handlers too, so a zero-length wait can ask without a system call.
    arrived: Arc<AtomicBool>,
    ids: Vec<SigId>,
}

impl SignalPipe {
    pub fn new(signals: &[libc::c_int]) -> Result<Self, Errno> {
        let (read, write) = pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        let raw = write.as_raw_fd();
        let arrived = Arc::new(AtomicBool::new(false));
        let mut pipe = Self { read, write, arrived, ids: Vec::with_capacity(signals.len()) };
        for &signal in signals {
            let flag = Arc::clone(&pipe.arrived);
            // SAFETY: the action stores to an atomic and calls write(2) on a non-blocking pipe,
            // both async-signal-safe; a full pipe (EAGAIN) already says "something arrived".
            let id = unsafe {
                signal_hook_registry::register(signal, move || {
                    flag.store(true, Ordering::Relaxed);
                    let _ = libc::write(raw, b"s".as_ptr().cast(), 1);
                })
            }
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EINVAL)))?;
            pipe.ids.push(id);
        }
        Ok(pipe)
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.read.as_fd()
    }

    /// A signal arrived since the last [`SignalPipe::drain`] (no system call).
    pub fn arrived(&self) -> bool {
        self.arrived.load(Ordering::Relaxed)
    }

    /// Empty the pipe; whether anything had arrived.
    pub fn drain(&self) -> bool {
        self.arrived.store(false, Ordering::Relaxed);
        drain(&self.read)
    }
}

impl Drop for SignalPipe {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook_registry::unregister(id);
        }
        let _ = &self.write;
    }
}

/// Read a non-blocking fd until it is empty; whether anything was read.
pub fn drain(fd: &impl AsFd) -> bool {
    let mut buf = [0u8; 256];
    let mut any = false;
    while let Ok(n) = read(fd.as_fd(), &mut buf) {
        if n == 0 {
            break;
        }
        any = true;
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_makes_the_pipe_readable_and_drain_empties_it() {
        let pipe = SignalPipe::new(&[libc::SIGUSR2]).unwrap();
        assert!(!pipe.drain());
        // SAFETY: raise(3) to ourselves; the registry's handler only writes to the pipe.
        unsafe { libc::raise(libc::SIGUSR2) };
        assert!(pipe.arrived());
        assert!(pipe.drain());
        assert!(!pipe.arrived());
        assert!(!pipe.drain());
    }
}
