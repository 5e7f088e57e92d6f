//! The series `gpreempt agent` serves on [`METRICS_PATH`], named once: `metrics` registers every
//! family of [`FAMILIES`] from here, and `top` reads the scheduler's families back by the same
//! names and labels, so a renamed series breaks the build, not a reader. docs/guide/metrics.md
//! is their reference table (tests/deploy.rs holds it to [`FAMILIES`]); deploy/grafana-dashboard.json
//! queries them.

/// Where the agent serves its exposition (HTTP GET).
pub const METRICS_PATH: &str = "/metrics";

/// Where the agent answers whether its tracer loop is alive (HTTP GET: 200, or 503 once it
/// stalled): the DaemonSet's startup, readiness and liveness probes ask it.
pub const HEALTH_PATH: &str = "/healthz";

/// The prefix of every family's name (`gpreempt_…`).
pub const PREFIX: &str = "gpreempt";

/// What a family is, which decides the names of its samples (OpenMetrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
    Info,
}

impl Kind {
    /// The `# TYPE` line's word for it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
            Self::Info => "info",
        }
    }

    /// The suffixes its samples add to the family's name.
    fn suffixes(self) -> &'static [&'static str] {
        match self {
            Self::Counter => &["_total"],
            Self::Gauge => &[""],
            Self::Histogram => &["_bucket", "_sum", "_count"],
            Self::Info => &["_info"],
        }
    }
}

/// One metric family of the agent: its name as registered (without the prefix and the unit),
/// its help text, whether it is in seconds, and its kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    /// In seconds: the exposition names it `NAME_seconds` and says so in a `# UNIT` line.
    pub seconds: bool,
    pub kind: Kind,
}

/// One sample of a family, by what its suffix says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sample {
    /// A counter's value (`_total`).
    Total,
    /// A histogram's cumulative count under a bound (`_bucket`, labelled [`label::LE`]).
    Bucket,
    /// A histogram's sum of observations (`_sum`).
    Sum,
    /// A histogram's number of observations (`_count`).
    Count,
}

impl Family {
    /// The family's name in the exposition (`# TYPE` and `# HELP` lines): `gpreempt_NAME`, with
    /// `_seconds` for a family in seconds.
    pub fn exposed(&self) -> String {
        let unit = if self.seconds { "_seconds" } else { "" };
        format!("{PREFIX}_{}{unit}", self.name)
    }

    /// The name of one of its samples.
    pub fn sample(&self, sample: Sample) -> String {
        let suffix = match sample {
            Sample::Total => "_total",
            Sample::Bucket => "_bucket",
            Sample::Sum => "_sum",
            Sample::Count => "_count",
        };
        format!("{}{suffix}", self.exposed())
    }

    /// The names of every sample its kind has.
    pub fn samples(&self) -> Vec<String> {
        self.kind.suffixes().iter().map(|s| format!("{}{s}", self.exposed())).collect()
    }
}

const fn family(name: &'static str, help: &'static str, kind: Kind) -> Family {
    Family { name, help, seconds: false, kind }
}

const fn in_seconds(name: &'static str, help: &'static str, kind: Kind) -> Family {
    Family { name, help, seconds: true, kind }
}

/// The label names the scheduler's families carry and `top` reads.
pub mod label {
    /// The agent's `[[policy]]` name.
    pub const POLICY: &str = "policy";
    /// KFD's `gpu_id`, in decimal: the same label name as the other families' GPU label.
    pub const GPU_ID: &str = "gpu_id";
    /// [`crate::domain::TransitionKind::name`].
    pub const TRANSITION: &str = "transition";
    /// A histogram bucket's upper bound (`+Inf` for the last), written by the encoder.
    pub const LE: &str = "le";
}

pub const BUILD: Family = family("build", "The agent's build", Kind::Info);
pub const PROCESSES: Family = family("processes", "KFD processes running now", Kind::Gauge);
pub const QUEUES: Family =
    family("queues", "User-mode queues now, per process, GPU, queue type and state", Kind::Gauge);
pub const QUEUE_CREATES: Family = family("queue_creates", "Queues created (successful create ioctls)", Kind::Counter);
pub const QUEUE_DESTROYS: Family =
    family("queue_destroys", "Queues destroyed or torn down with their process", Kind::Counter);
pub const EVICTIONS: Family = family("evictions", "Queue evictions, counted when they end, by trigger", Kind::Counter);
pub const RESTORES: Family =
    family("restores", "Evictions that ended with a restore (not with the process), by trigger", Kind::Counter);
pub const EVICTION: Family = in_seconds("eviction", "Time queues spent evicted, by trigger", Kind::Counter);
pub const DEBUG_TRAP_OPERATIONS: Family = family(
    "debug_trap_operations",
    "Debug-trap SUSPEND_QUEUES/RESUME_QUEUES calls on a process, by operation",
    Kind::Counter,
);
pub const DEBUG_TRAP_DURATION: Family = in_seconds(
    "debug_trap_duration",
    "Latency of debug-trap suspend/resume calls (ioctl entry to return)",
    Kind::Histogram,
);
pub const HWS_UNMAP_DURATION: Family = in_seconds(
    "hws_unmap_duration",
    "In-driver unmap time of a debug-trap call (unmap_queues_cpsch or MES remove)",
    Kind::Histogram,
);
pub const HWS_FENCE_WAIT_DURATION: Family = in_seconds(
    "hws_fence_wait_duration",
    "In-driver preemption fence wait of a debug-trap call (amdkfd_fence_wait_timeout)",
    Kind::Histogram,
);
pub const HWS_REMAP_DURATION: Family = in_seconds(
    "hws_remap_duration",
    "In-driver remap time of a debug-trap call (map_queues_cpsch or MES add)",
    Kind::Histogram,
);
pub const COLLATERAL_QUEUES_PREEMPTED: Family = family(
    "collateral_queues_preempted",
    "Queues of this process preempted by a device-wide unmap aimed at another process",
    Kind::Counter,
);
pub const TRACER_EVENTS: Family = family("tracer_events", "Events the tracer decoded", Kind::Counter);
pub const TRACER_LOST_RECORDS: Family =
    family("tracer_lost_records", "Records that did not become events, by cause", Kind::Counter);
pub const PROBES: Family = family("probes", "Tracer probes, by state (attached or missing)", Kind::Gauge);
pub const GPU_PARTITION: Family = family(
    "gpu_partition",
    "Each GPU's package (PCI address), its partition index and the package's partition count and compute \
     partition mode; 1 per GPU, to join on gpu_id",
    Kind::Gauge,
);
pub const CONFIG_RELOADS: Family = family(
    "config_reloads",
    "Configuration reloads (a changed file seen by the watch, or SIGHUP), by result",
    Kind::Counter,
);
pub const SCHEDULER_TRANSITIONS: Family = family(
    "scheduler_transitions",
    "Scheduler decisions per policy and GPU, by transition (suspend or resume)",
    Kind::Counter,
);
pub const SCHEDULER_SUSPENDED: Family =
    in_seconds("scheduler_suspended", "Time a policy kept its offline queues on a GPU suspended", Kind::Counter);
pub const SCHEDULER_REACTION: Family = in_seconds(
    "scheduler_reaction",
    "Time from online work seen on a GPU to its policy's suspend of the offline queues there returning",
    Kind::Histogram,
);
pub const SCHEDULER_DETECTION: Family = in_seconds(
    "scheduler_detection",
    "Time from the last poll that saw a GPU free of online work to the suspend entering the kernel (an \
     upper bound of online work published to suspend)",
    Kind::Histogram,
);
pub const SCHEDULER_RESUMES_SKIPPED: Family = family(
    "scheduler_resumes_skipped",
    "Idle resumes a policy skipped because the online gap was predicted shorter than their cost",
    Kind::Counter,
);
pub const SCHEDULER_LOOP_STEP: Family = in_seconds(
    "scheduler_loop_step",
    "The reaction thread's step interval so far, by quantile (0.5, 0.99, 1 for the maximum)",
    Kind::Gauge,
);

/// The scheduler's families (`gpreempt_scheduler_*`), per policy.
pub const SCHEDULER: [Family; 6] = [
    SCHEDULER_TRANSITIONS,
    SCHEDULER_SUSPENDED,
    SCHEDULER_REACTION,
    SCHEDULER_DETECTION,
    SCHEDULER_RESUMES_SKIPPED,
    SCHEDULER_LOOP_STEP,
];

/// Every family the agent registers, in the exposition's order.
pub const FAMILIES: [Family; 25] = [
    BUILD,
    PROCESSES,
    QUEUES,
    QUEUE_CREATES,
    QUEUE_DESTROYS,
    EVICTIONS,
    RESTORES,
    EVICTION,
    DEBUG_TRAP_OPERATIONS,
    DEBUG_TRAP_DURATION,
    HWS_UNMAP_DURATION,
    HWS_FENCE_WAIT_DURATION,
    HWS_REMAP_DURATION,
    COLLATERAL_QUEUES_PREEMPTED,
    TRACER_EVENTS,
    TRACER_LOST_RECORDS,
    PROBES,
    GPU_PARTITION,
    CONFIG_RELOADS,
    SCHEDULER_TRANSITIONS,
    SCHEDULER_SUSPENDED,
    SCHEDULER_REACTION,
    SCHEDULER_DETECTION,
    SCHEDULER_RESUMES_SKIPPED,
    SCHEDULER_LOOP_STEP,
];
