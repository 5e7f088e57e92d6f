//! The reaction thread's footing on the host: real-time priority, memory locked, an optional
//! CPU. Each step is asked for and, when the host refuses it, said once and done without: the
//! scheduler still works at normal priority, only its reaction under CPU load is worse.

use serde::Serialize;

use super::wake_latency::{self, WakeLatency};

/// What the reaction thread asked of the host. The default asks nothing (normal priority, no
/// pinning, no lock, no wake latency request); the scheduler's footing is
/// `ScheduleConfig::default().realtime`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RealtimeConfig {
    /// SCHED_FIFO priority (1-99); 0 keeps the normal scheduling class.
    pub priority: u8,
    /// Pin the thread to this CPU.
    pub cpu: Option<usize>,
    /// `mlockall`: no page fault of the process's memory (the tracer's buffers, the session's
    /// arrays) stalls a step.
    pub lock_memory: bool,
    /// How quickly an idle CPU must wake (a PM QoS request held while the thread runs).
    pub wake_latency: WakeLatency,
}

impl Default for RealtimeConfig {
    fn default() -> Self {
        Self { priority: 0, cpu: None, lock_memory: false, wake_latency: WakeLatency::Off }
    }
}

/// What the host granted, reported in the summary.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Realtime {
    /// `fifo` or `normal`.
    pub policy: &'static str,
    pub priority: u8,
    pub cpu: Option<usize>,
    pub memory_locked: bool,
    /// The CPU wake latency limit in force, µs (None: the idle states as the host has them).
    pub cpu_wake_limit_us: Option<u32>,
    /// The idle states that limit keeps out (`C6 (133 µs)`).
    pub idle_states_excluded: Vec<String>,
    /// What was refused, and why (one line each).
    pub refused: Vec<String>,
}

/// Apply `config` to the calling thread (priority, affinity) and the process (memory lock,
/// the CPU wake latency request, in force while the returned request lives).
pub fn apply(config: RealtimeConfig) -> (Realtime, Option<wake_latency::Request>) {
    let mut out = Realtime { policy: "normal", ..Realtime::default() };
    let request = ask_wake_latency(config.wake_latency, &mut out);
    if config.priority > 0 {
        let param = libc::sched_param { sched_priority: i32::from(config.priority.min(99)) };
        // SAFETY: pthread_self() is this thread; `param` is a valid sched_param for the call.
        let rc = unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) };
        if rc == 0 {
            out.policy = "fifo";
            out.priority = config.priority.min(99);
        } else {
            let why = std::io::Error::from_raw_os_error(rc);
            out.refused.push(match rc {
                libc::EPERM => format!(
                    "SCHED_FIFO priority {} refused ({why}): gpreempt lacks CAP_SYS_NICE (or RLIMIT_RTPRIO is too \
                     low, or a cgroup has no real-time budget); the reaction thread runs at normal priority",
                    config.priority
                ),
                _ => format!(
                    "SCHED_FIFO priority {} refused ({why}); the reaction thread runs at normal priority",
                    config.priority
                ),
            });
        }
    }
    if let Some(cpu) = config.cpu {
        match pin(cpu) {
            Ok(()) => out.cpu = Some(cpu),
            Err(why) => out.refused.push(format!("--cpu {cpu} refused ({why}); the reaction thread runs on any CPU")),
        }
    }
    if config.lock_memory {
        // MCL_ONFAULT (Linux 4.4): lock pages as they are touched rather than populating every
        // mapping now (the tracer's ring buffers are large and mostly untouched).
        // SAFETY: mlockall takes flags only.
        let rc = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE | libc::MCL_ONFAULT) };
        if rc == 0 {
            out.memory_locked = true;
        } else {
            let why = std::io::Error::last_os_error();
            out.refused.push(format!(
                "mlockall refused ({why}): needs CAP_IPC_LOCK or a larger RLIMIT_MEMLOCK; a page fault may stall a step"
            ));
        }
    }
    (out, request)
}

/// Hold the CPU wake latency `setting` asks for on this host, noting it (or its refusal) in `out`.
fn ask_wake_latency(setting: WakeLatency, out: &mut Realtime) -> Option<wake_latency::Request> {
    let held = wake_latency::hold(setting);
    if let (Some(limit), Some(why)) = (held.limit_us, &held.refused) {
        out.refused.push(format!(
            "the CPU wake latency request ({limit} us on {}) refused ({why}): needs root (the device is \
             root's, mode 0600); idle CPUs keep their deep states and wake the reaction thread later \
             (--cpu-wake-latency off asks for nothing and says nothing)",
            wake_latency::DEVICE
        ));
    }
    if held.request.is_some() {
        out.cpu_wake_limit_us = held.limit_us;
        out.idle_states_excluded = held.excluded;
    }
    held.request
}

/// The calling thread back to the normal footing: SCHED_OTHER and the process's CPUs (those of
/// its main thread). A thread inherits its creator's policy and affinity, so a helper the
/// reaction thread starts (the port reader, the link reaper) would otherwise run at its FIFO
/// priority on its pinned CPU. Best effort: a refusal leaves the helper where it was.
pub fn normal_footing() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pthread_self() is this thread; `param` is a valid sched_param for SCHED_OTHER.
    unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_OTHER, &param) };
    // SAFETY: an all-zero cpu_set_t is the empty set, filled by the call.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: getpid() is the main thread's tid; `set` is a valid cpu_set_t of the size given.
    if unsafe { libc::sched_getaffinity(libc::getpid(), size, &mut set) } == 0 {
        // SAFETY: pid 0 is the calling thread; `set` as read above.
        unsafe { libc::sched_setaffinity(0, size, &set) };
    }
}

/// Pin the calling thread to `cpu`.
pub fn pin(cpu: usize) -> std::io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE, checked above.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of the size given.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// Sleep until CLOCK_MONOTONIC reaches `deadline_ns` (absolute, so a late step does not push
/// every later one back); returns at once when it has passed.
pub fn sleep_until(deadline_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: a valid timespec; the remainder pointer may be null with TIMER_ABSTIME. EINTR just
    // ends the sleep early: the loop checks the clock again.
    unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_asked_is_nothing_refused() {
        let (r, request) = apply(RealtimeConfig::default());
        assert_eq!(r, Realtime { policy: "normal", ..Realtime::default() });
        assert!(request.is_none());
    }

    #[test]
    fn a_cpu_that_does_not_exist_is_refused_with_the_reason() {
        let (r, _) = apply(RealtimeConfig { cpu: Some(100_000), ..RealtimeConfig::default() });
        assert_eq!(r.cpu, None);
        assert_eq!(r.refused.len(), 1);
        assert!(r.refused[0].starts_with("--cpu 100000 refused ("), "{}", r.refused[0]);
    }
}
