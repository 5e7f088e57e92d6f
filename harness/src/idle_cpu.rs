//! gpreempt's CPU while the online side is idle, measured apart from its busy periods: the
//! scheduler's two threads (the reaction thread, by name, and the thread calling `run()`) read
//! from `/proc/self/task/TID/schedstat` (time on a CPU, ns; Documentation/scheduler/sched-stats
//! .rst) at two moments inside the idle load's quiet time, so neither the start-up (attach,
//! `mlockall`) nor the one request at its end is counted.

use std::time::Duration;

use serde::Serialize;

/// The reaction thread's name (`gpreempt::schedule::Scheduler::start` names it).
const REACTION_THREAD: &str = "gpreempt-react";

/// CPU of the scheduler's threads over a window of the idle time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct IdleCpu {
    pub window_s: f64,
    pub reaction_ms: f64,
    pub run_thread_ms: f64,
    /// Both, as a share of one core.
    pub share: f64,
}

/// The calling thread's id (to sample it from another thread).
pub fn gettid() -> i32 {
    // SAFETY: gettid(2) takes no argument and cannot fail.
    unsafe { libc::gettid() }
}

fn on_cpu_ns(tid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

fn reaction_tid() -> Option<i32> {
    std::fs::read_dir("/proc/self/task").ok()?.flatten().find_map(|e| {
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        (comm.trim() == REACTION_THREAD).then(|| e.file_name().to_str()?.parse().ok()).flatten()
    })
}

/// Sleep `skip`, then sample both threads over `window`; `None` when a thread is not found.
pub fn measure(run_thread: i32, skip: Duration, window: Duration) -> Option<IdleCpu> {
    std::thread::sleep(skip);
    let reaction = reaction_tid()?;
    let (r0, t0) = (on_cpu_ns(reaction)?, on_cpu_ns(run_thread)?);
    let started = std::time::Instant::now();
    std::thread::sleep(window);
    let (r1, t1) = (on_cpu_ns(reaction)?, on_cpu_ns(run_thread)?);
    let secs = started.elapsed().as_secs_f64();
    let (reaction_ms, run_thread_ms) = ((r1 - r0) as f64 / 1e6, (t1 - t0) as f64 / 1e6);
    Some(IdleCpu { window_s: secs, reaction_ms, run_thread_ms, share: (reaction_ms + run_thread_ms) / 1e3 / secs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_named_thread_shows_its_cpu_and_a_sleeping_one_almost_none() {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let spinner = std::thread::Builder::new()
            .name(REACTION_THREAD.into())
            .spawn(move || {
                while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
            .unwrap();
        let me = gettid();
        let sampler = std::thread::spawn(move || measure(me, Duration::ZERO, Duration::from_millis(300)));
        // This thread sleeps while sampled.
        let m = sampler.join().unwrap().expect("both threads found");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        spinner.join().unwrap();
        assert!(m.reaction_ms > 0.0, "{m:?}");
        assert!(m.run_thread_ms < m.reaction_ms, "{m:?}");
        assert!(m.window_s >= 0.3, "{m:?}");
    }
}
