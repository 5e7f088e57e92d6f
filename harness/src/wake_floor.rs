//! The host's own wake-up floor, measured in the same run: a thread at the reaction thread's
//! footing (SCHED_FIFO 20 where granted) blocked in poll(2) on an eventfd, as the reaction thread
//! waits on the doorbell probe's ring buffer, and another thread that writes the eventfd every
//! 1-3 ms. From the write to the waiter running again is what any event-driven wake-up pays on
//! this host (on a VM, an idle vCPU halted in the hypervisor is woken first); the probe's path
//! adds its trap and the ring buffer's deferred wake-up (irq_work) to it. Measured twice: both
//! threads on one CPU (the waker is preempted at once by the real-time waiter) and on two (the
//! waiter's CPU idle: on a VM whose idle vCPUs halt, the hypervisor must run it again first).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
};

use gpreempt::{clock::monotonic_ns, schedule::realtime::pin, stats::Summary};
use serde::Serialize;

use crate::rng::Rng;

#[derive(Clone, Debug, Serialize)]
pub struct WakeFloor {
    /// Write → the waiter running again, µs: both threads on CPU 0, and the waiter on CPU 1.
    pub same_cpu_us: Option<Summary>,
    pub cross_cpu_us: Option<Summary>,
    /// Whether the waiter ran at SCHED_FIFO 20 (else at normal priority).
    pub realtime: bool,
}

/// Measure for about `seconds` in each placement (the cross-CPU one needs two CPUs).
pub fn measure(seconds: f64) -> Option<WakeFloor> {
    let (same_cpu_us, realtime) = placed(seconds, 0, 0)?;
    let cross = placed(seconds, 1, 0);
    Some(WakeFloor { same_cpu_us, cross_cpu_us: cross.and_then(|c| c.0), realtime })
}

fn placed(seconds: f64, waiter_cpu: usize, waker_cpu: usize) -> Option<(Option<Summary>, bool)> {
    // SAFETY: plain eventfd creation; the fd is closed below.
    let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if efd < 0 {
        return None;
    }
    let written = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let (w, d) = (written.clone(), done.clone());
    let waiter = thread::spawn(move || {
        let pinned = pin(waiter_cpu).is_ok();
        let param = libc::sched_param { sched_priority: 20 };
        // SAFETY: this thread's own scheduling class; refusal leaves it at normal priority.
        let realtime = unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) } == 0;
        let mut wakes = Vec::new();
        while !d.load(Ordering::Acquire) {
            let mut fd = libc::pollfd { fd: efd, events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd; a 100 ms timeout so `done` is seen.
            let n = unsafe { libc::poll(&mut fd, 1, 100) };
            let now = monotonic_ns();
            if n <= 0 {
                continue;
            }
            let mut v = 0u64;
            // SAFETY: an 8-byte read of the eventfd's counter into `v`.
            unsafe { libc::read(efd, (&raw mut v).cast(), 8) };
            let at = w.load(Ordering::Acquire);
            if at > 0 && now >= at {
                wakes.push((now - at) as f64 / 1e3);
            }
        }
        (pinned.then_some(wakes), realtime)
    });
    // The waker is a thread of its own too, so the caller's affinity is left alone.
    let waker = thread::spawn(move || {
        let pinned = pin(waker_cpu).is_ok();
        let mut rng = Rng::new(7);
        let end = monotonic_ns() + (seconds * 1e9) as u64;
        while monotonic_ns() < end {
            std::thread::sleep(std::time::Duration::from_micros(rng.between(1_000, 3_000)));
            let one = 1u64;
            written.store(monotonic_ns(), Ordering::Release);
            // SAFETY: an 8-byte write to the eventfd.
            unsafe { libc::write(efd, (&raw const one).cast(), 8) };
        }
        done.store(true, Ordering::Release);
        pinned
    });
    let waker_pinned = waker.join().ok()?;
    let (wakes, realtime) = waiter.join().ok()?;
    // SAFETY: the eventfd created above, no longer used.
    unsafe { libc::close(efd) };
    Some((wakes.filter(|_| waker_pinned).and_then(|w| Summary::of(&w)), realtime))
}
