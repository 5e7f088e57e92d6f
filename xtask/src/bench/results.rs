//! What `cargo xtask bench` measures, as the types both halves share: the guest (`xtask
//! bench-guest`, in the VM) serializes a [`Run`] or a [`Colocation`] to JSON, the host reads it
//! back and keeps it, with what it measured itself, in BENCHMARKS.json ([`Benchmarks`]), from
//! which `report.rs` writes BENCHMARKS.md.
//!
//! The field names are the JSON keys BENCHMARKS.json has always had, and every struct declares its
//! fields in alphabetical order: the order `serde_json::Value` wrote them in (its maps are sorted),
//! so rewriting the file after a partial run changes only what was measured. Fields that may be
//! absent are `Option`s (or default to empty); any other missing field is an error that names it.

use std::collections::BTreeMap;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

/// Which guest half ran; the `scenario` of a run and `xtask bench-guest --scenario`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// Rows 1-4 on the real amdgpu driver.
    Amdgpu,
    /// Rows 5-6 on the KFD emulator module.
    Emulator,
    /// The co-location benchmark on the KFD emulator module (`colocation.rs`).
    Colocation,
}

/// BENCHMARKS.json: every section's results and who measured them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Benchmarks {
    /// Section 7 (not measured yet: absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub colocation: Option<Colocation>,
    /// Files written before sections were stamped: the whole run's command, commit and date.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Row 2's userspace pipeline, one entry per criterion benchmark.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub criterion: Option<Vec<Criterion>>,
    /// Files written before sections were stamped: the pipeline measured again on its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub criterion_rerun: Option<CriterionRerun>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub date: Option<String>,
    /// The host's cores when the file was last written.
    pub host_cpus: usize,
    /// What a partial run of the pipeline replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_previous: Option<PipelinePrevious>,
    /// Section 8 (not measured yet: absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reaction: Option<Reaction>,
    /// Section 9: `harness suite`'s JSON, whole (its schema is the harness's; rendered by
    /// `native::section`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native: Option<serde_json::Value>,
    /// Rows 1-6: the guest runs of the amdgpu and emulator scenarios.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<Run>,
    /// Files written before sections were stamped: the whole run's length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    /// Who measured each section, by [`super::Section::name`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sections: BTreeMap<String, Stamp>,
}

/// The command, commit and date that measured a section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stamp {
    pub command: String,
    pub commit: String,
    pub date: String,
    /// How long measuring the section took (unknown for the stamps of older files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
}

/// One criterion benchmark of the userspace pipeline (row 2).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Criterion {
    pub events_per_second: f64,
    /// The slower end of criterion's 95% interval for the median.
    pub events_per_second_low: f64,
    pub id: String,
    pub ns_per_event: f64,
    pub records_per_iteration: f64,
}

/// The pipeline's numbers before a partial run replaced them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelinePrevious {
    pub commit: String,
    pub criterion: Vec<Criterion>,
}

/// `criterion_rerun` of files written before sections were stamped.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CriterionRerun {
    pub command: String,
    pub commit: String,
    pub date: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<PipelinePrevious>,
}

/// Section 8: the JSON line `cargo bench -p gpreempt --bench reaction` prints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reaction {
    /// Between one posted dispatch and the next.
    pub gap_us: u64,
    pub loop_step_ns: f64,
    pub max_ns: f64,
    pub min_ns: f64,
    pub p50_ns: f64,
    pub p99_ns: f64,
    pub resumes: u64,
    pub samples: u64,
    pub suspends: u64,
    /// The reaction thread's scheduling class as granted (`fifo` or `normal`; older runs: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub realtime: Option<String>,
}

/// What one guest of the amdgpu or emulator scenario measured (rows 1-6).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Run {
    /// The guest's vCPUs.
    pub cpus: usize,
    /// The guest kernel's release.
    pub kernel: String,
    /// Remarks for the report; a row's own start with its name ("controller row: …").
    pub notes: Vec<String>,
    pub quick: bool,
    pub samples: Vec<Sample>,
    pub scenario: Scenario,
    pub seconds: f64,
    pub sizes: RunSizes,
}

/// One measurement; the report groups them by (row, case, tool).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sample {
    pub case: String,
    pub row: String,
    pub tool: String,
    pub unit: String,
    pub value: f64,
}

/// How much of everything a run did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSizes {
    pub controller_cycles: u64,
    pub controller_runs: u64,
    pub create_ioctls: u64,
    /// SUSPEND_QUEUES and RESUME_QUEUES together, per loop.
    pub debug_ioctls: u64,
    pub fence_iterations: u64,
    pub loops: u64,
    pub memory_events: u64,
    pub rate_step_s: u64,
    pub sessions: u64,
}

/// What the co-location guest measured (section 7): every scenario, each state once per round.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Colocation {
    pub cpus: usize,
    /// The emulator's parameters during the run.
    pub emulator: EmulatorParams,
    /// The host's 1-minute load average before and after the VM ran (written by the host: QEMU's
    /// vCPU threads share the host's cores with whatever else runs there, which shows here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_loadavg: Option<[f64; 2]>,
    pub kernel: String,
    /// Where the previous global policy's binary came from.
    pub previous: PreviousScheduler,
    pub quick: bool,
    pub rounds: u64,
    pub scenario: Scenario,
    pub scenarios: Vec<ColocationScenario>,
    pub seconds: f64,
    /// Reaction and online collateral against the number of offline processes on the online GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<OfflineSweep>,
    /// The guest's own floor for a polling loop, measured in the same VM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timer_floor: Option<TimerFloor>,
    /// The same on the host, without emulation, just before the VM booted (written by the host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_timer_floor: Option<TimerFloor>,
}

/// A thread that does nothing but sleep to absolute deadlines 200 µs apart at SCHED_FIFO 20 —
/// the reaction thread's cadence and class without its work: the interval between its wake-ups
/// (µs), alone in the guest and beside as many `sched_yield` busy loops as the co-located states
/// run busy clients. Whatever a polling loop achieves in this VM, it cannot beat this.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimerFloor {
    pub idle: Stats,
    pub busy: Stats,
    pub busy_loops: u32,
    pub seconds: f64,
    /// The sleeping thread's own CPU time over each run (`CLOCK_THREAD_CPUTIME_ID`), as a
    /// percentage of the run's wall time: what waking every 200 µs costs, with no work at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_cpu_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_cpu_pct: Option<f64>,
}

/// The online client next to 1, 2, 3… single-queue offline processes on its GPU, co-located and
/// under `gpreempt schedule`, one round each: every SUSPEND_QUEUES is one process's, so each
/// transition costs one device-wide unmap per offline process with queues there.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OfflineSweep {
    /// The online client alone, once: every request's latency, ms.
    pub online_alone: Vec<f64>,
    pub points: Vec<SweepPoint>,
    /// The workloads' command lines (`{i}` stands for the offline process's index).
    pub serve: String,
    pub train: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepPoint {
    pub offline_processes: u32,
    pub colocated: StateRun,
    pub schedule: StateRun,
}

/// `/sys/module/kfd_emu/parameters` as the co-location run found them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmulatorParams {
    pub preempt_delay_us: u64,
    pub restore_delay_us: u64,
    pub tick_us: u64,
}

/// The `gpreempt` binary of the last commit before the per-GPU scheduler.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreviousScheduler {
    pub commit: String,
}

/// One co-location scenario: its workloads' command lines and every round's states.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColocationScenario {
    /// The GPUs whose offline throughput is reported, the online one first.
    pub gpus: Vec<u32>,
    pub name: String,
    /// Online requests per state.
    pub requests: u64,
    pub rounds: Vec<ScenarioRound>,
    /// `emu-workload serve` arguments (round 0's seed).
    pub serve: String,
    /// `emu-workload train` arguments, one per offline process (round 0's seeds).
    pub train: Vec<String>,
}

/// One round of a scenario: each state once, in the order of the fields' documentation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioRound {
    /// Online and offline together, no gpreempt.
    pub colocated: StateRun,
    /// The offline processes alone: their throughput per GPU.
    pub offline_alone: Vec<GpuRate>,
    /// The online client alone: every request's latency, ms.
    pub online_alone: Vec<f64>,
    /// Under the previous global policy's `gpreempt schedule`.
    pub previous: StateRun,
    pub round: u64,
    /// Under this checkout's `gpreempt schedule`.
    pub schedule: StateRun,
    /// Under this checkout's `gpreempt schedule --busy-poll`: the reaction thread never sleeps,
    /// so what is left of its detection is the vCPU's own scheduling, not the timer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_poll: Option<StateRun>,
}

/// Offline throughput on one GPU over the online window, all offline processes together.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuRate {
    /// Offline dispatches completed per second.
    pub dispatches_per_s: f64,
    pub gpu_id: u32,
    /// Emulated GPU time of the completed offline dispatches per wall-clock time (1.0: the GPU
    /// did nothing else); the dispatch costs vary, so this, not the count, is the throughput.
    pub work_share: f64,
}

/// Online latencies and offline throughput in one co-located state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateRun {
    pub latency_ms: Vec<f64>,
    pub offline: Vec<GpuRate>,
    /// The scheduler's side, in the states that run one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<SchedulerRun>,
}

/// A `gpreempt schedule` run: what the bench measured around it and what it reported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerRun {
    /// Its CPU time (user + system, all threads) over the online window, ms (`None`: /proc
    /// could not be read).
    pub cpu_ms: Option<f64>,
    /// The reaction thread's share of it (`None`: no thread of that name, as in the previous
    /// global policy's binary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reaction_cpu_ms: Option<f64>,
    /// Start to every offline process attached, s.
    pub startup_s: f64,
    pub summary: SchedulerSummary,
    /// Its `transition` events counted per GPU.
    pub transitions: Vec<GpuTransitions>,
    /// The online window, ms.
    pub window_ms: f64,
}

/// Transitions of one GPU, from the `transition` events.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuTransitions {
    /// `None`: the binary's events do not name a GPU (the previous global policy).
    pub gpu_id: Option<u32>,
    pub resumes: u64,
    pub suspends: u64,
    /// SUSPEND_QUEUES ioctls of the suspend transitions (the events' `ioctls`; `None`: the
    /// binary's events do not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend_ioctls: Option<u64>,
}

/// What the bench keeps of `gpreempt schedule --json`'s summary. Both the current and the
/// previous binary write it, and the current one is changing, so every field that either may
/// lack is optional and unknown fields are ignored when it is read from the scheduler.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SchedulerSummary {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attach_refreshes: Option<u64>,
    /// Its own CPU time over its whole run (start-up included), as a share of one CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_share: Option<f64>,
    /// Online write index published → SUSPEND_QUEUES entered, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detection_us: Option<Stats>,
    /// The scheduler's run, start to summary, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_suspends: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<Vec<GpuSummary>>,
    /// What the driver did for the suspends, from the in-process tracer (`kernel.suspend`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelFigures>,
    /// The reaction loop's achieved step interval, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loop_step_us: Option<Stats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub polls: Option<u64>,
    /// The reaction thread's CPU over the run, ms, and of it the time inside the suspend and
    /// resume transitions (the ioctls, whose driver work runs on that thread), ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reaction_cpu_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transition_cpu_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reaction_us: Option<Stats>,
    /// The reaction thread's scheduling class as the host granted it (`policy`, `priority`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub realtime: Option<RealtimeGrant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_us: Option<Stats>,
    pub resumes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumes_skipped: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend_us: Option<Stats>,
    pub suspends: u64,
}

/// `kernel` of the scheduler's summary: the SUSPEND_QUEUES calls as the tracer saw them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelFigures {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<DriverCalls>,
}

/// One kind of driver call (`kernel.suspend`): how long its fence wait took, µs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DriverCalls {
    #[serde(default)]
    pub count: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence_wait_us: Option<Stats>,
}

/// `realtime` of the scheduler's summary.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RealtimeGrant {
    #[serde(default)]
    pub policy: String,
    #[serde(default)]
    pub priority: u64,
    #[serde(default)]
    pub memory_locked: bool,
    #[serde(default)]
    pub refused: Vec<String>,
}

/// One GPU of the scheduler's summary (`gpus`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuSummary {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detection_us: Option<Stats>,
    pub gpu_id: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offline_dispatches: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offline_rate_overall_per_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offline_rate_running_per_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reaction_us: Option<Stats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumes_skipped: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended_share: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspends: Option<u64>,
}

/// A summary of samples as gpreempt reports it (`gpreempt::stats::Summary`); the fields a
/// version may leave out are optional.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub count: u64,
    pub max: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    pub p50: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p90: Option<f64>,
    pub p99: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stddev: Option<f64>,
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    /// The committed BENCHMARKS.json reads into the types and writes back the same document, byte
    /// for byte: no field is lost, renamed, reordered or turned from an integer into a float.
    #[test]
    fn benchmarks_json_survives_a_round_trip_through_the_types() {
        let path = crate::util::workspace_root().join("BENCHMARKS.json");
        let Ok(text) = std::fs::read_to_string(&path) else {
            return; // not measured yet
        };
        let typed: Benchmarks = serde_json::from_str(&text).expect("BENCHMARKS.json reads into the types");
        let again = serde_json::to_string_pretty(&typed).expect("serializes");
        let (a, b): (Value, Value) =
            (serde_json::from_str(&text).expect("JSON"), serde_json::from_str(&again).expect("JSON"));
        assert_eq!(a, b);
        assert_eq!(text.trim_end(), again);
    }

    #[test]
    fn a_missing_field_is_an_error_that_names_it() {
        let e = serde_json::from_str::<Sample>(r#"{"case": "c", "row": "r", "tool": "t", "unit": "us"}"#)
            .expect_err("no value");
        assert!(e.to_string().contains("missing field `value`"), "{e}");
        let e = serde_json::from_str::<Benchmarks>(r#"{"host_cpus": 2, "runz": []}"#).expect_err("a typo");
        assert!(e.to_string().contains("unknown field `runz`"), "{e}");
        // What may be missing is: an empty file of stamps and runs, a round without CPU time.
        let b: Benchmarks = serde_json::from_str(r#"{"host_cpus": 2}"#).expect("reads");
        assert!(b.runs.is_empty() && b.sections.is_empty() && b.colocation.is_none());
    }
}
