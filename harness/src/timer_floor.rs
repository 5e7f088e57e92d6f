//! The host's own timer floor, measured in the same run: a thread that does nothing but sleep to
//! absolute deadlines 200 µs apart (the reaction thread's default cadence, without its work).
//! No polling loop on this host can step faster than that.

use gpreempt::{clock::monotonic_ns, stats::Summary};

pub fn measure(seconds: f64) -> Option<Summary> {
    std::thread::spawn(move || {
        let period = 200_000u64;
        let end = monotonic_ns() + (seconds * 1e9) as u64;
        let (mut next, mut last) = (monotonic_ns(), monotonic_ns());
        let mut gaps = Vec::new();
        while last < end {
            next += period;
            let ts = libc::timespec { tv_sec: (next / 1_000_000_000) as _, tv_nsec: (next % 1_000_000_000) as _ };
            // SAFETY: a valid timespec; an absolute sleep on CLOCK_MONOTONIC.
            unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) };
            let now = monotonic_ns();
            gaps.push((now - last) as f64 / 1e3);
            last = now;
            if now > next + period {
                next = now;
            }
        }
        Summary::of(&gaps)
    })
    .join()
    .ok()
    .flatten()
}
