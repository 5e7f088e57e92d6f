//! Scheduler variants compared in the same run: each a change to the default `ScheduleConfig`
//! (besides the fake roots and the pids). A policy change is judged by adding its row here and
//! reading it beside `default`.

use std::time::Duration;

use gpreempt::schedule::{ScheduleConfig, runnable::Runnable};

pub type Variant = (&'static str, fn(&mut ScheduleConfig));

pub const VARIANTS: &[Variant] = &[
    ("default", |_| {}),
    // The scheduler before this wave's detection and policy changes (commit 52b2870): no doorbell
    // probe, no arrival probe, no moved write index counted, cu_occupancy every 1 ms, a fixed idle threshold, the watchdog cliff.
    // (A resume cut short by online work between two RESUMEs is a rule of the reaction thread, not
    // a setting: it applies here too.)
    ("previous", |c| {
        c.doorbell = false;
        c.runnable = Runnable::All;
        c.watch_writes = false;
        c.occupancy = Duration::from_millis(1);
        c.policy.learn_idle = false;
        c.policy.busy_share = 0.0;
        c.defer_idle = false;
        c.arrival = None;
    }),
    // Today's scheduler without the arrival probe (`--no-arrival`): a request is seen at its first
    // kernel (doorbell probe or poll), not when it reaches the online process's socket.
    (NO_ARRIVAL_VARIANT, |c| c.arrival = None),
    // Today's scheduler without the doorbell probe: the index poll every --poll, idle or not.
    ("poll", |c| c.doorbell = false),
    // The idle threshold halved: what continuous batching's ~1 ms step gaps do to the default.
    ("idle-1ms", |c| c.policy.idle = Duration::from_millis(1)),
    // Occupancy read every step's worth of polls: the detection blind spot of the shared bound.
    ("occupancy-200us", |c| c.occupancy = Duration::from_micros(200)),
    // The previous scheduler's changes one at a time, to find which costs the offline work its
    // share: the idle threshold as given (not learnt), and a moved write index not counted.
    ("fixed-idle", |c| c.policy.learn_idle = false),
    ("no-watch-writes", |c| c.watch_writes = false),
    // An offline process with nothing on the held GPU held with no ioctl until it submits
    // (`--defer-idle-offline`).
    ("defer-idle", |c| c.defer_idle = true),
    // Each offline job held on all of its GPUs or on none (`--gang`).
    ("gang", |c| c.gang = true),
    // Every offline process runnable (`--runnable all`, the default before issue 45): one SUSPEND
    // per offline process per transition. The default (`auto`) keeps as many as fill the GPU.
    (ALL_RUNNABLE_VARIANT, |c| c.runnable = Runnable::All),
    // One offline process runnable per GPU while it has no online work, the others parked and
    // taking turns (`--runnable 1`): one SUSPEND per transition, whatever the trainers.
    ("runnable-1", |c| c.runnable = Runnable::Keep(1)),
    // The reaction thread on the online client's CPU (`--cpu`; the client is pinned there too,
    // run.rs): the probe's wake-up is then local, so the figure is the probe path's own and not
    // the host's wake-up of another, idle vCPU.
    (SAME_CPU_VARIANT, |c| c.realtime.cpu = Some(SAME_CPU)),
];

/// The variant that keeps every offline process runnable (`--runnable all`).
pub const ALL_RUNNABLE_VARIANT: &str = "all-runnable";

/// The variant without the arrival probe.
pub const NO_ARRIVAL_VARIANT: &str = "no-arrival";

/// The variant that pins the reaction thread and the online client to one CPU, and that CPU.
pub const SAME_CPU_VARIANT: &str = "same-cpu";
pub const SAME_CPU: usize = 0;

pub fn by_name(name: &str) -> Option<Variant> {
    VARIANTS.iter().copied().find(|v| v.0 == name)
}
