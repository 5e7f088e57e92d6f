//! What the reaction thread measures, read live by the other threads.

use std::sync::{Mutex, atomic::AtomicU64};

use crate::{schedule::hints::HintCounts, stats::Histogram};

/// What the reaction thread measures, read live by the other threads.
#[derive(Default)]
pub struct LoopStats {
    /// Start of one step to the start of the next, ns, over the steps that called the kernel for
    /// nothing but the reads: the poll's own cadence. A step that suspended, resumed or attached
    /// is as long as its ioctls (their cost is in the transitions' latency and the reaction
    /// figure); with the doorbell probe most quiet steps are waits, so those few long steps
    /// would otherwise make the percentiles.
    pub step: Histogram,
    /// Steps left out of `step` because they suspended, resumed or attached.
    pub transition_steps: AtomicU64,
    /// Per suspend, see [`super::TransitionRecord::detection_ns`].
    pub detection: Histogram,
    /// Of them, the suspends whose online work the doorbell probe saw: its store → the first
    /// SUSPEND entering the kernel, exactly.
    pub detection_doorbell: Histogram,
    /// Per hit of the probe the reaction thread took: the store's kernel stamp → the start of
    /// the step that took it (the wake-up's share of `detection_doorbell`; the rest is the
    /// step's own work up to the SUSPEND).
    pub doorbell_wake: Histogram,
    /// Waits on the doorbell probe (the online side idle and covered), and of them those a
    /// submission ended.
    pub doorbell_waits: AtomicU64,
    pub doorbell_wakes: AtomicU64,
    /// Offline processes a suspend found with nothing on the GPU (held with no ioctl), and of
    /// them those suspended later at their first submission within the hold.
    pub offline_deferred: AtomicU64,
    pub offline_late_suspends: AtomicU64,
    /// Resumes of several offline processes stopped between two RESUMEs because online work
    /// was published meanwhile (the rest stayed held).
    pub resumes_cut_short: AtomicU64,
    /// `--runnable`: offline processes parked (suspended while their GPU had no online work) and
    /// unparked (their turn to run).
    pub offline_parks: AtomicU64,
    pub offline_unparks: AtomicU64,
    /// `--runnable auto`: one more offline process made runnable (those running left the GPU
    /// idle), or one fewer (they kept it busy).
    pub runnable_raised: AtomicU64,
    pub runnable_lowered: AtomicU64,
    /// Online dispatch delay seen in the indices: first seen pending → consumed, ns.
    pub dispatch_delay: Histogram,
    pub steps: AtomicU64,
    /// The reaction thread's own CPU time over its run, ns (set when it ends).
    pub cpu_ns: AtomicU64,
    /// Of it, the time inside suspend and resume transitions (the debug-trap ioctls: on HWS,
    /// KFD's unmap, fence wait and remap run on this thread), ns.
    pub transition_cpu_ns: AtomicU64,
    /// Reports dropped because their queue was full (the reader fell behind).
    pub reports_dropped: AtomicU64,
    /// The `--hint-socket` counters, as of the last step that received a line or a client.
    pub hints: Mutex<HintCounts>,
}
