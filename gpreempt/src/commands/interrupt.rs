//! Ctrl-C, SIGTERM and SIGHUP as a flag the long-running commands poll, so they can resume the
//! target's queues and print their summary before exiting. A second signal exits at once: the
//! kernel then does the cleanup (ptrace links end with the tracer, `exit_ptrace`, kernel/ptrace.c;
//! KFD resumes the target's queues and disables debugging when the debugger's process goes away,
//! docs/kfd.md §2.7), so a stuck cleanup never holds the user hostage.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use anyhow::{Context, Result};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

static SIGNAL: AtomicI32 = AtomicI32::new(0);
/// Set by the first of the signals.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(signo: libc::c_int) {
    // Only async-signal-safe work: atomics and `_exit`.
    if STOP.swap(true, Ordering::Relaxed) {
        // SAFETY: `_exit` is async-signal-safe; no destructor must run (one may be what hangs).
        unsafe { libc::_exit(128 + signo) };
    }
    SIGNAL.store(signo, Ordering::Relaxed);
}

/// Install the handlers (without SA_RESTART, so blocking calls return EINTR promptly).
pub fn install() -> Result<&'static AtomicBool> {
    let action = SigAction::new(SigHandler::Handler(on_signal), SaFlags::empty(), SigSet::empty());
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to atomics.
        unsafe { sigaction(signal, &action) }.with_context(|| format!("installing the {signal} handler"))?;
    }
    Ok(&STOP)
}

/// The signal that set the flag, by name ("SIGINT").
pub fn received() -> Option<String> {
    let signo = SIGNAL.load(Ordering::Relaxed);
    (signo != 0).then(|| Signal::try_from(signo).map_or_else(|_| format!("signal {signo}"), |s| s.to_string()))
}
