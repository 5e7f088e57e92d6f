//! Section 9: the native evaluation at hardware time scales. `cargo run --release -p harness --
//! suite [--quick]` runs the real scheduler against the model GPU and model ioctls (harness/,
//! costs and sources in harness/PROFILES.md) and prints one JSON document, stored whole in
//! BENCHMARKS.json under `native`; this module runs it and renders the section from it.

use std::fmt::Write as _;

use anyhow::{Context, Result};
use serde::Deserialize;
use serde_json::Value;

use super::state::{BenchState, State};
use crate::util::{self, cargo};

/// `harness suite`, its JSON.
pub fn run(quick: bool) -> Result<Value> {
    let mut cmd = cargo();
    cmd.args(["run", "--release", "--package", "harness", "--", "suite"]);
    if quick {
        cmd.arg("--quick");
    }
    let text = util::output(&mut cmd)?;
    let line = text.lines().rev().find(|l| l.starts_with('{')).context("the harness suite printed no JSON")?;
    serde_json::from_str(line).context("reading the harness suite's JSON")
}

// The parts of the harness's JSON the page shows (the stored document keeps everything).

#[derive(Deserialize, Default)]
#[serde(default)]
struct Doc {
    quick: bool,
    seconds: f64,
    timer_floor_us: Option<Stats>,
    wake_floor: Option<WakeFloor>,
    scenarios: Vec<ScenarioResult>,
    policy: Policy,
    doorbell: Doorbell,
    arrival: Arrival,
}

/// The arrival probe against `--no-arrival`, and its cost per packet (`harness suite`'s `arrival`).
#[derive(Deserialize, Default)]
#[serde(default)]
struct Arrival {
    scenarios: Vec<ScenarioResult>,
    packet_cost: PacketCost,
    /// The CPU wake latency request held for every state (harness/src/cpu_wake.rs).
    cpu_wake: Option<CpuWake>,
    wake_floor: ArrivalWakeFloor,
    /// Arrival → first SUSPEND over every arrival issued at once in the matrix's default states
    /// (harness/src/suite.rs; absent from runs before it was pooled).
    arrival_to_suspend_pooled_us: Option<Stats>,
    /// The Poisson latency goals' scenarios' requests pooled, alone and under the default
    /// (harness/src/suite.rs `PooledLatency`; absent from runs before it was pooled).
    poisson_pooled: Option<PoissonPooled>,
}

/// harness/src/suite.rs `PooledLatency`'s figures.
#[derive(Deserialize, Default)]
#[serde(default)]
struct PoissonPooled {
    scenarios: Vec<String>,
    alone_from_arrival_ms: Option<Stats>,
    scheduled_from_arrival_ms: Option<Stats>,
    alone_ms: Option<Stats>,
    scheduled_ms: Option<Stats>,
}

impl PoissonPooled {
    /// P50 and P99 against alone, from arrival or from the first submission, and the requests
    /// under the scheduler they are over.
    fn ratios(&self, from_arrival: bool) -> Option<(f64, f64, u64)> {
        let (alone, scheduled) = if from_arrival {
            (self.alone_from_arrival_ms.as_ref()?, self.scheduled_from_arrival_ms.as_ref()?)
        } else {
            (self.alone_ms.as_ref()?, self.scheduled_ms.as_ref()?)
        };
        Some((scheduled.p50 / alone.p50.max(1e-9), scheduled.p99 / alone.p99.max(1e-9), scheduled.count as u64))
    }
}

/// harness/src/cpu_wake.rs `CpuWake`.
#[derive(Deserialize, Default)]
#[serde(default)]
struct CpuWake {
    driver: Option<String>,
    limit_us: Option<u32>,
    excluded: Vec<String>,
    refused: Option<String>,
}

/// The wake floor measured before the request was taken and under it.
#[derive(Deserialize, Default)]
#[serde(default)]
struct ArrivalWakeFloor {
    as_is: Option<WakeFloor>,
    held: Option<WakeFloor>,
}

/// `harness packet-cost` (harness/src/packet_cost.rs).
#[derive(Deserialize, Default)]
#[serde(default)]
struct PacketCost {
    requests: usize,
    rounds: usize,
    bare_us: Option<Stats>,
    disarmed_us: Option<Stats>,
    armed_us: Option<Stats>,
    added_disarmed_us: f64,
    added_armed_us: f64,
    sent: u64,
    answered: u64,
    error: Option<String>,
}

/// The floor with a lead (harness/src/floor.rs `LeadFloor`).
#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct LeadFloor {
    ratio: f64,
    from: String,
    suspends_ms: f64,
    lead_min_ms: f64,
    lead_p50_ms: f64,
    covered: f64,
    wait_max_ms: f64,
    held_for_p50: f64,
    held_for_p99: f64,
    transitions_cost_of_idle: f64,
    offline_of_idle_max: f64,
}

/// Requests over TCP (harness/src/request_path.rs).
#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct RequestPath {
    requests_sent: usize,
    requests_answered: usize,
    latency_from_arrival_ms: Option<Stats>,
    lead_ms: Option<Stats>,
    found_held: Option<f64>,
    probes: Vec<ProbeCount>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct ProbeCount {
    path: String,
    sent: u64,
    answered: u64,
}

/// One online process's arrival path, as the scheduler reports it (`ScheduleReport.arrival`).
#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct ArrivalPath {
    why: Option<String>,
    counts: SegmentCounts,
    pending: PendingCounts,
    lead_us: Option<Stats>,
    arrival_to_suspend_us: Option<Stats>,
    arrival_to_taken_us: Option<Stats>,
    arrival_to_suspend_in_transition_us: Option<Stats>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct SegmentCounts {
    segments: u64,
    allowed: u64,
    denied: u64,
    armings: u64,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct PendingCounts {
    arrivals: u64,
    served: u64,
    late: u64,
    late_before_issue: u64,
    wasted: u64,
}

/// What the run asked of the host's idle CPUs, and the cross-CPU wake floor without and with it.
fn cpu_wake_note(a: &Arrival) -> String {
    let floor = |f: &Option<WakeFloor>| {
        f.as_ref()
            .and_then(|f| f.cross_cpu_us.as_ref())
            .map_or("–".to_owned(), |s| format!("{:.1} / {:.1}", s.p50, s.p99))
    };
    match &a.cpu_wake {
        None => String::new(),
        Some(CpuWake { refused: Some(why), .. }) => format!("; the CPU wake latency request was refused ({why})"),
        Some(w) => format!(
            "; every state ran with the scheduler's default CPU wake latency request held (`--cpu-wake-latency \
             auto`: {} µs, idle driver {}, keeping out {}): the host's cross-CPU wake floor p50 / p99 {} µs as the \
             host has its idle states, {} µs under the request",
            w.limit_us.map_or("–".to_owned(), |l| l.to_string()),
            w.driver.as_deref().unwrap_or("none"),
            if w.excluded.is_empty() { "nothing".to_owned() } else { w.excluded.join(", ") },
            floor(&a.wake_floor.as_is),
            floor(&a.wake_floor.held),
        ),
    }
}

/// The host's wake-up floor (harness/src/wake_floor.rs), µs.
#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct WakeFloor {
    same_cpu_us: Option<Stats>,
    cross_cpu_us: Option<Stats>,
}

/// The policy's options in the same run (`harness suite`'s `policy`).
#[derive(Deserialize, Default)]
#[serde(default)]
struct Policy {
    scenarios: Vec<ScenarioResult>,
}

/// The doorbell probe against the index poll (`harness suite`'s `doorbell`).
#[derive(Deserialize, Default)]
#[serde(default)]
struct Doorbell {
    scenarios: Vec<ScenarioResult>,
    store_cost: StoreCost,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StoreCost {
    calls: usize,
    bare_us: Option<Stats>,
    unregistered_us: Option<Stats>,
    disarmed_us: Option<Stats>,
    armed_us: Option<Stats>,
    attach_us: Option<Stats>,
    detach_us: Option<Stats>,
    error: Option<String>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct Stats {
    count: f64,
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ScenarioResult {
    scenario: ScenarioDesc,
    states: Vec<StateFigures>,
    comparisons: Vec<Comparison>,
    section7: Option<Section7>,
    /// Poisson next to always-busy trainers: what the latency goal leaves offline (harness/src/floor.rs).
    suspend_floor: Option<SuspendFloor>,
    /// Continuous batching: what the step goal asks of the idle time (harness/src/floor.rs).
    step_floor: Option<StepFloor>,
    /// Requests over TCP next to trainers: the floor with the CPU phase as a lead.
    lead_floors: Vec<LeadFloor>,
    error: Option<String>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct StepFloor {
    delay_ms: f64,
    openings: usize,
    p99_ratio_unheld: f64,
    openings_to_hold: usize,
    idle_outside_busy_of_idle: f64,
    hold_cost_of_idle: f64,
    transitions_cost_of_idle: f64,
    offline_of_idle_max: f64,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct SuspendFloor {
    delay_ms: f64,
    held_for_p50: f64,
    held_for_p99: f64,
    offline_of_idle_max: f64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ScenarioDesc {
    name: String,
    bound: String,
    profile: ProfileDesc,
    offline: Value,
    /// Requests over TCP: the CPU phase and the probes' rates.
    serving: Option<ServingDesc>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct ServingDesc {
    cpu: String,
    health_per_s: f64,
    metrics_per_s: f64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ProfileDesc {
    name: String,
    /// The SUSPEND duration's distribution (harness/src/profile.rs: `fixed` or `uniform`), ns.
    suspend: Value,
    save_ns: u64,
}

impl ProfileDesc {
    /// The mean SUSPEND duration, ns.
    fn mean_suspend_ns(&self) -> Option<f64> {
        let n = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64);
        n(&self.suspend, "fixed").or_else(|| {
            let u = self.suspend.get("uniform")?;
            Some((n(u, "lo")? + n(u, "hi")?) / 2.0)
        })
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StateFigures {
    /// A name no state has fails the read rather than leaving the state's rows empty.
    state: Option<BenchState>,
    online_latency_ms: Option<Stats>,
    online_step_ms: Option<Stats>,
    gpus: Vec<GpuFigures>,
    job_steps_per_s: Option<f64>,
    scheduler: Option<SchedulerFigures>,
    doorbell_store_us: Option<Stats>,
    request_path: Option<RequestPath>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct GpuFigures {
    busy_periods: usize,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct EngineFigures {
    busy_periods: usize,
    transitions_per_busy_period: f64,
    resumes_inside: usize,
    /// The idle GPU time outside the engine's busy periods: the most offline can have without a
    /// resume inside one.
    idle_outside_busy_of_idle: f64,
    /// From each busy period's end to the RESUME after it, ms.
    resume_after_busy_ms: Option<Stats>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct SchedulerFigures {
    transitions: usize,
    suspend_calls: usize,
    transitions_per_busy_period: f64,
    suspends_per_request: f64,
    /// The batching engine's busy periods (any request in flight) and the flaps inside them.
    engine: Option<EngineFigures>,
    busy_periods_unprotected: usize,
    busy_periods_nothing_to_preempt: usize,
    offline_deferred: u64,
    offline_late_suspends: u64,
    detection_us: Option<Stats>,
    busy_periods_during_resume: usize,
    detection_outside_resume_us: Option<Stats>,
    reaction_us: Option<Stats>,
    /// Per reaction sample: its SUSPEND calls' time in the model kernel, and gpreempt's own time
    /// between them (reaction = detection + both, sample by sample).
    suspend_calls_us: Option<Stats>,
    between_suspend_calls_us: Option<Stats>,
    loop_step_us: Option<Stats>,
    cpu_share: f64,
    scheduler_detection_doorbell_us: Option<Stats>,
    scheduler_doorbell_wake_us: Option<Stats>,
    doorbell_waits: u64,
    doorbell_wakes: u64,
    /// The idle load only: the scheduler's threads inside its quiet time.
    idle_cpu: Option<IdleCpu>,
    /// Per online process: the arrival path (the scheduler's `arrival`).
    arrival: Vec<ArrivalPath>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct IdleCpu {
    window_s: f64,
    reaction_ms: f64,
    run_thread_ms: f64,
    share: f64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Comparison {
    state: Option<BenchState>,
    p50_ratio: Option<f64>,
    p99_ratio: Option<f64>,
    step_p99_ratio: Option<f64>,
    step_later_p99_ratio: Option<f64>,
    step_opening_p99_ratio: Option<f64>,
    step_opening_p50_ratio: Option<f64>,
    kept: Vec<f64>,
    offline_of_idle: f64,
    offline_of_idle_outside_busy: Option<f64>,
    job_steps_ratio: Option<f64>,
    p50_ratio_from_arrival: Option<f64>,
    p99_ratio_from_arrival: Option<f64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Section7 {
    kept_schedule: f64,
    kept_colocated: f64,
    suspends_per_request: f64,
    within_tolerance: bool,
}

fn x(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.2}×"))
}

fn pct(v: f64) -> String {
    format!("{:.0} %", v * 100.0)
}

/// A share to a tenth of a point, where a bound sits within a point of its goal.
fn pct_fine(v: f64) -> String {
    format!("{:.1} %", v * 100.0)
}

fn us(s: &Option<Stats>) -> String {
    s.as_ref().map_or("–".into(), |s| format!("{:.0} / {:.0}", s.p50, s.p99))
}

impl ScenarioResult {
    fn state(&self, state: &BenchState) -> Option<&StateFigures> {
        self.states.iter().find(|s| s.state.as_ref() == Some(state))
    }
    fn comparison(&self, state: &BenchState) -> Option<&Comparison> {
        self.comparisons.iter().find(|c| c.state.as_ref() == Some(state))
    }
    fn offline_processes(&self) -> usize {
        self.scenario.offline.get("processes").and_then(Value::as_u64).map_or(2, |n| n as usize)
    }
}

/// One row of a scenario table: its figures under the scheduler `variant` (harness/src/variants.rs).
fn row(md: &mut String, s: &ScenarioResult, variant: &str) {
    if let Some(e) = &s.error {
        let _ = writeln!(md, "| {} | failed: {e} |||||||||||", s.scenario.name);
        return;
    }
    let key = BenchState::scheduled(variant);
    if variant != BenchState::DEFAULT_VARIANT && s.state(&key).is_none() {
        return;
    }
    let alone = s.state(&BenchState::new(State::OnlineAlone));
    let sched = s.state(&key).and_then(|st| st.scheduler.as_ref());
    let (co, sc) = (s.comparison(&BenchState::new(State::CoLocated)), s.comparison(&key));
    let alone_lat = alone.and_then(|a| a.online_step_ms.clone().or(a.online_latency_ms.clone()));
    let batching = alone.is_some_and(|a| a.online_step_ms.is_some());
    let (p50, p99) = match (batching, sc) {
        (true, Some(c)) => ("–".to_owned(), x(c.step_p99_ratio)),
        (_, Some(c)) => (x(c.p50_ratio), x(c.p99_ratio)),
        _ => ("–".into(), "–".into()),
    };
    let co_p99 = co.map_or("–".into(), |c| x(if batching { c.step_p99_ratio } else { c.p99_ratio }));
    let kept = |c: Option<&Comparison>| {
        c.map_or("–".into(), |c| c.kept.iter().map(|&k| pct(k)).collect::<Vec<_>>().join(" + "))
    };
    let job = sc.and_then(|c| c.job_steps_ratio).map_or(String::new(), |r| format!("; job steps {}", x(Some(r))));
    let _ = writeln!(
        md,
        "| {}{} | {} | {} ms | {co_p99} | {p50} / {p99} | {} / {}{job} | {} | {} | {} | {} | {} | {} |",
        s.scenario.name,
        if variant == BenchState::DEFAULT_VARIANT { String::new() } else { format!(" — *{variant} scheduler*") },
        s.scenario.bound,
        alone_lat.map_or("–".into(), |a| format!("{:.2} / {:.2}", a.p50, a.p99)),
        kept(co),
        kept(sc),
        sc.map_or("–".into(), |c| pct(c.offline_of_idle)),
        sched.map_or("–".into(), |f| format!(
            "{:.2} ({} of {} busy periods unprotected)",
            f.transitions_per_busy_period,
            f.busy_periods_unprotected,
            s.state(&key).and_then(|st| st.gpus.first()).map_or(0, |g| g.busy_periods)
        )),
        sched.map_or("–".into(), |f| us(&f.detection_us)),
        sched.map_or("–".into(), |f| us(&f.reaction_us)),
        sched.map_or("–".into(), |f| us(&f.loop_step_us)),
        sched.map_or("–".into(), |f| pct(f.cpu_share)),
    );
}

/// A scenario's rows: this checkout's scheduler, then the previous one measured in the same run.
fn rows(md: &mut String, s: &ScenarioResult) {
    row(md, s, BenchState::DEFAULT_VARIANT);
    row(md, s, "previous");
}

const HEADER: &str = "| scenario | bound | online P50 / P99 alone (batching: step) | P99 / alone co-located | P50 / P99 vs alone under `schedule` | offline kept co-located / `schedule` (per GPU) | offline of the idle GPU time | transitions per online busy period | detection p50 / p99 µs | reaction p50 / p99 µs | loop step p50 / p99 µs | gpreempt CPU (one core) |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";

/// A goal's verdict.
fn verdict(ok: bool) -> &'static str {
    if ok { "**pass**" } else { "**FAIL**" }
}

pub fn section(md: &mut String, doc: &Value) {
    let doc: Doc = match serde_json::from_value(doc.clone()) {
        Ok(d) => d,
        Err(e) => {
            let _ = writeln!(md, "The stored results could not be read ({e}).\n");
            return;
        }
    };
    let floor = doc.timer_floor_us.clone().unwrap_or_default();
    let _ = writeln!(
        md,
        "On the host, natively, no VM and no GPU ({}): `harness suite{}` (the `harness` crate) runs the real \
         `gpreempt::schedule::Scheduler` — its reaction thread, `PolicyMachine`, `process_vm_readv` of the online \
         indices — with default settings (its reaction thread at SCHED_FIFO 20 with memory locked, as granted to root here; the previous scheduler, `previous` in `harness/src/variants.rs`, in the same run and on the same clients: the rows marked *previous scheduler*), against models of only the kernel \
         boundary and the GPU, through the scheduler's seams: `ModelSide` (SUSPEND/RESUME block the reaction \
         thread asleep for sampled durations plus a CWSR save per executing queue, and unmap every queue of the GPU, \
         the online ones too, for the call), `ModelOccupancySource` (`cu_occupancy` answered from the model after \
         spinning its read cost), and a model GPU per GPU on timers, in two bounds: `serial` (one dispatch at a \
         time, queues in turn, as the emulator) and `shared` (every queue's head dispatch at once, sharing the CUs). \
         Online and offline clients are separate processes publishing AQL-like read/write dispatch indices in their \
         own memory (a shared mapping), blocking on futexes. Every cost, its source, the token → GPU-time model \
         and the tolerance are in `harness/PROFILES.md`, committed before the first measurement. States per \
         scenario, one after the other: online alone, offline alone, co-located without the scheduler, under \
         `gpreempt schedule`. *Detection* = the first online dispatch of a busy period published (the client's \
         CLOCK_MONOTONIC stamp, exact) → the first SUSPEND entering the model kernel; *reaction* = published → the \
         last offline process's SUSPEND returned (busy periods that found the offline queues already held are not \
         samples). gpreempt CPU = the reaction thread's (`reaction_cpu_ms`) plus the thread calling `run()`, \
         over the run, as a share of one core; the model's threads are not counted, the `cu_occupancy` spin is. \
         The host's timer floor in the same run (a thread sleeping to 200 µs absolute deadlines): wake interval \
         p50 {:.0} / p99 {:.0} / max {:.0} µs over {:.0} wake-ups. The suite took {:.0} s. Other work shared this \
         2-core host during the run; its tails are in these figures.\n",
        if doc.quick {
            "`--quick`: 60 Poisson/trace requests, 40 batched"
        } else {
            "200 Poisson requests, 157 trace requests, 100 batched"
        },
        if doc.quick { " --quick" } else { "" },
        floor.p50,
        floor.p99,
        floor.max,
        floor.count,
        doc.seconds,
    );
    // The emulator profile against §7.
    if let Some(s) = doc.scenarios.iter().find(|s| s.section7.is_some()) {
        let c = s.section7.as_ref().expect("checked");
        let _ = writeln!(
            md,
            "**Emulator profile against §7.3 (1 offline process)**, serial bound, §7.3's loads: offline kept under \
             `schedule` {} (§7.3: 80 %, tolerance ± 8 points), co-located {} (93 %, ± 5), suspends per request {:.2} \
             (0.785, ± 0.20): {}.\n",
            pct(c.kept_schedule),
            pct(c.kept_colocated),
            c.suspends_per_request,
            if c.within_tolerance {
                "**reproduces §7 within the stated tolerance**"
            } else {
                "**does NOT reproduce §7 within the stated tolerance**"
            },
        );
        md.push_str(HEADER);
        rows(md, s);
        md.push('\n');
    }
    let _ = writeln!(md, "### 9.1. MI300X central profile\n");
    md.push_str(HEADER);
    for s in doc.scenarios.iter().filter(|s| s.scenario.profile.name == "mi300x") {
        rows(md, s);
    }
    let _ = writeln!(md, "\n### 9.2. MI300X sweep (Poisson, one offline process; every point)\n");
    md.push_str(HEADER);
    for s in doc.scenarios.iter().filter(|s| s.scenario.profile.name.starts_with("mi300x-")) {
        rows(md, s);
    }
    md.push('\n');
    doorbell(md, &doc.doorbell, doc.wake_floor.as_ref());
    policy(md, &doc.policy);
    arrival(md, &doc.arrival);
    goals(md, &doc);
}

/// §9.4: the policy's options on the loads where they differ, each against the default in the
/// same run on the same clients.
fn policy(md: &mut String, p: &Policy) {
    let _ = writeln!(md, "### 9.4. The policy's options in the same run (issue 35)\n");
    if p.scenarios.is_empty() {
        let _ = writeln!(md, "Not in the stored run (it predates the options): `cargo xtask bench --only native`.\n");
        return;
    }
    let _ = writeln!(
        md,
        "MI300X central profile, serial bound, 200 Poisson requests (also with `--quick`). *default*: every offline \
         process with queues on the held GPU is suspended, each GPU on its own. *defer-idle*: \
         `--defer-idle-offline`, an offline process with nothing on the held GPU (its queues drained, no wave in \
         flight) is held with no ioctl and suspended at its first submission in the hold. *gang*: `--gang`, the \
         job's ranks held on both GPUs together. `loader-3off`: three loader-bound trainers (one step of 4 × 4 ms in flight, then 5-25 ms of host \
         work: PROFILES.md \"Loads\"); `dp-2gpu`: a 2-rank data-parallel job, rank 0 on the online GPU. Busy periods \
         that began with no offline work on the online GPU are no detection sample.\n"
    );
    md.push_str(
        "| scenario | scheduler | online P50 / P99 vs alone | offline kept (per GPU) | offline of the idle GPU time | SUSPEND calls per online busy period | held with no ioctl (suspended later in the hold) | detection p50 / p99 µs | reaction p50 / p99 µs | job steps vs alone |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in &p.scenarios {
        if let Some(e) = &s.error {
            let _ = writeln!(md, "| {} | failed: {e} |||||||||", s.scenario.name);
            continue;
        }
        let variants: Vec<&str> = s.states.iter().filter_map(|st| st.state.as_ref()?.variant()).collect();
        for v in variants {
            let key = BenchState::scheduled(v);
            let (c, st) = (s.comparison(&key), s.state(&key));
            let f = st.and_then(|st| st.scheduler.as_ref());
            let busy = st.and_then(|st| st.gpus.first()).map_or(1, |g| g.busy_periods.max(1));
            let _ = writeln!(
                md,
                "| {} | {v} | {} / {} | {} | {} | {} | {} | {} | {} | {} |",
                s.scenario.name,
                x(c.and_then(|c| c.p50_ratio)),
                x(c.and_then(|c| c.p99_ratio)),
                c.map_or("–".into(), |c| c.kept.iter().map(|&k| pct(k)).collect::<Vec<_>>().join(" + ")),
                c.map_or("–".into(), |c| pct(c.offline_of_idle)),
                f.map_or("–".into(), |f| format!("{:.2}", f.suspend_calls as f64 / busy as f64)),
                f.map_or("–".into(), |f| format!("{} ({})", f.offline_deferred, f.offline_late_suspends)),
                f.map_or("–".into(), |f| us(&f.detection_us)),
                f.map_or("–".into(), |f| us(&f.reaction_us)),
                x(c.and_then(|c| c.job_steps_ratio)),
            );
        }
    }
    md.push('\n');
}

fn us3(s: &Option<Stats>) -> String {
    s.as_ref().map_or("–".into(), |s| format!("{:.2} / {:.2}", s.p50, s.p99))
}

/// §9.3: the same clients with and without the doorbell probe, and what a store costs.
fn doorbell(md: &mut String, d: &Doorbell, wake: Option<&WakeFloor>) {
    if d.scenarios.is_empty() {
        let _ = writeln!(
            md,
            "### 9.3. The doorbell probe against the index poll (issue 36)\n\nNot in the stored run (it predates \
             the probe): `cargo xtask bench --only native` measures it.\n"
        );
        return;
    }
    let _ = writeln!(
        md,
        "### 9.3. The doorbell probe against the index poll (issue 36)\n\n\
         The online client rings each submission's doorbell through a stand-in ROCm runtime \
         (`tests/rocm/hsa_store_stub.c` built as `libhsa-runtime64.so.1`; its queue laid out as ROCr's \
         `amd_queue_t`), so the scheduler's eBPF uprobe on it is the real path (docs/doorbell.md). *default*: the \
         probe (the reaction thread waits on it while the online side is idle); *poll*: `--no-doorbell`; \
         *same-cpu*: the probe with the reaction thread and the online client pinned to one CPU (`--cpu 0`), so a \
         hit wakes the reaction thread where the store ran instead of on the other, idle vCPU. \
         Detection as above (the client's publish stamp → SUSPEND entered); *scheduler's doorbell detection*: the \
         store's kernel stamp → SUSPEND entered, for the suspends the probe started, and its *wake-up* share: the \
         store → the start of the reaction thread's step that took the probe's hit; *store* = one call of the \
         runtime's store as the online client timed it (with the probe: its uprobe trap, and on these 2 cores \
         the real-time reaction thread's step when the store woke it).\n"
    );
    md.push_str(
        "| scenario | scheduler | online P50 / P99 vs alone (batching: step P99) | offline of the idle GPU time | detection p50 / p99 µs | scheduler's doorbell detection p50 / p99 µs (n) | of it, the wake-up p50 / p99 µs | waits on the probe (ended by a store or command) | store p50 / p99 µs | gpreempt CPU |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in &d.scenarios {
        if let Some(e) = &s.error {
            let _ = writeln!(md, "| {} | failed: {e} |||||||||", s.scenario.name);
            continue;
        }
        for variant in [BenchState::DEFAULT_VARIANT, "poll", "same-cpu"] {
            let key = BenchState::scheduled(variant);
            let (Some(st), Some(c)) = (s.state(&key), s.comparison(&key)) else { continue };
            let f = st.scheduler.as_ref();
            let ratio = match c.step_p99_ratio {
                Some(step) => format!("step {}", x(Some(step))),
                None => format!("{} / {}", x(c.p50_ratio), x(c.p99_ratio)),
            };
            let _ = writeln!(
                md,
                "| {} | {variant} | {ratio} | {} | {} | {} | {} | {} | {} | {} |",
                s.scenario.name,
                pct(c.offline_of_idle),
                f.map_or("–".into(), |f| us(&f.detection_us)),
                f.map_or("–".into(), |f| format!(
                    "{} ({})",
                    us(&f.scheduler_detection_doorbell_us),
                    f.scheduler_detection_doorbell_us.as_ref().map_or(0.0, |s| s.count)
                )),
                f.map_or("–".into(), |f| us(&f.scheduler_doorbell_wake_us)),
                f.map_or("–".into(), |f| format!("{} ({})", f.doorbell_waits, f.doorbell_wakes)),
                us3(&st.doorbell_store_us),
                f.map_or("–".into(), |f| pct(f.cpu_share)),
            );
        }
    }
    // Issue 36's native goals.
    // The worst p99 of one of a variant's figures over the scenarios.
    let worst_p99 = |variant: &str, figure: fn(&SchedulerFigures) -> &Option<Stats>| {
        d.scenarios
            .iter()
            .filter_map(|s| {
                figure(s.state(&BenchState::scheduled(variant))?.scheduler.as_ref()?).as_ref().map(|s| s.p99)
            })
            .fold(f64::NAN, f64::max)
    };
    let doorbell_p99 = |variant: &str| worst_p99(variant, |f| &f.scheduler_detection_doorbell_us);
    let worst_doorbell_p99 = doorbell_p99(BenchState::DEFAULT_VARIANT);
    // The client's publish → SUSPEND entered (an upper bound of the store's) over the busy periods
    // not published during a RESUME.
    let outside = |variant: &str| worst_p99(variant, |f| &f.detection_outside_resume_us);
    let (outside_default, outside_same) = (outside(BenchState::DEFAULT_VARIANT), outside("same-cpu"));
    let same_cpu_p99 = doorbell_p99("same-cpu");
    let added = match (&d.store_cost.disarmed_us, &d.store_cost.bare_us) {
        (Some(with), Some(bare)) => with.p50 - bare.p50,
        _ => f64::NAN,
    };
    // The idle load's quiet time, measured apart (the scheduler's two threads, start-up left out).
    let idle =
        |v: &str| d.scenarios.iter().find_map(|s| s.state(&BenchState::scheduled(v))?.scheduler.as_ref()?.idle_cpu);
    let idle_text = |c: Option<IdleCpu>| {
        c.map_or("not in this run".to_owned(), |c| {
            format!(
                "{} ({:.0} ms reaction thread + {:.0} ms the other, over {:.1} s)",
                pct(c.share),
                c.reaction_ms,
                c.run_thread_ms,
                c.window_s
            )
        })
    };
    let idle_verdict = idle(BenchState::DEFAULT_VARIANT).map_or("not judged", |c| verdict(c.share <= 0.01));
    let _ = writeln!(
        md,
        "\n| goal (issue 36, natively) | measured | verdict |\n|---|---|---|\n\
         | Detection through the probe (store → SUSPEND entered) p99 ≤ 50 µs | worst {worst_doorbell_p99:.0} µs \
         (this host's wake-up floor in the same run, an eventfd write → a SCHED_FIFO thread in poll(2) running: \
         p50 / p99 {} µs on the writer's CPU, {} µs on another; with the reaction thread on the storing CPU, \
         *same-cpu*: {same_cpu_p99:.0} µs; the busy periods not published during a RESUME, whose ioctl the \
         reaction thread is in, publish → SUSPEND entered: p99 {outside_default:.0} µs, *same-cpu* \
         {outside_same:.0} µs) | {} |\n\
         | Added cost per kernel launch ≤ 2 µs | {added:.2} µs (store p50 with the probe on a disarmed queue − without) | {} |\n\
         | gpreempt ≤ 1 % of a core while the online side is idle (`idle-1off`) | {} with the probe; {} polling | {idle_verdict} |\n",
        wake.map_or("–".into(), |w| us(&w.same_cpu_us)),
        wake.map_or("–".into(), |w| us(&w.cross_cpu_us)),
        verdict(worst_doorbell_p99 <= 50.0),
        verdict(added <= 2.0),
        idle_text(idle(BenchState::DEFAULT_VARIANT)),
        idle_text(idle("poll")),
    );
    let c = &d.store_cost;
    match &c.error {
        Some(e) => {
            let _ = writeln!(md, "\nThe store-cost measurement failed: {e}\n");
        }
        None => {
            let _ = writeln!(
                md,
                "\n**Cost per doorbell store** (`harness store-cost`, {} calls per row, this process, no scheduler \
                 running; p50 / p99 µs; the probe on the implementation behind the stand-in's exported thunk, as on \
                 ROCr: docs/doorbell.md): without the probe {}; with it, a signal it does not filter on {}, an online \
                 queue's disarmed (every store of a burst but the first) {}, armed (the first: one hit) {}. Taking \
                 the probe out of the process and putting it back (p50 / p99 µs, 50 rounds): detach {}, attach {}.\n",
                c.calls,
                us3(&c.bare_us),
                us3(&c.unregistered_us),
                us3(&c.disarmed_us),
                us3(&c.armed_us),
                us(&c.detach_us),
                us(&c.attach_us),
            );
        }
    }
}

/// Issue 35's goals, judged on the MI300X central profile, per bound.
fn goals(md: &mut String, doc: &Doc) {
    let _ = writeln!(md, "### Goals (issue 35), judged on the MI300X central profile, default settings\n");
    md.push_str("| goal | bound | measured | verdict |\n|---|---|---|---|\n");
    let central: Vec<&ScenarioResult> =
        doc.scenarios.iter().filter(|s| s.scenario.profile.name == "mi300x" && s.error.is_none()).collect();
    for bound in ["serial", "shared"] {
        let of = |prefix: &'static str| -> Vec<&ScenarioResult> {
            central
                .iter()
                .copied()
                .filter(|s| s.scenario.bound == bound && s.scenario.name.starts_with(prefix))
                .collect()
        };
        let request_loads: Vec<&ScenarioResult> = of("poisson").into_iter().chain(of("azure")).collect();
        let sc = |s: &ScenarioResult| {
            s.comparison(&BenchState::new(State::Scheduled))
                .map(|c| (c.p50_ratio.unwrap_or(f64::NAN), c.p99_ratio.unwrap_or(f64::NAN), c.offline_of_idle))
        };
        let worst = request_loads
            .iter()
            .filter_map(|s| sc(s))
            .fold((0.0f64, 0.0f64, 1.0f64), |a, b| (a.0.max(b.0), a.1.max(b.1), a.2.min(b.2)));
        // What the profile's SUSPEND alone adds to a request that opens a busy period with the
        // offline work running: its mean duration and a CWSR save per offline process, against
        // the alone P50 (every scheduler that acts on visible work pays it; HWS unmaps the online
        // queues for the call).
        let floors: Vec<(usize, f64)> = of("poisson")
            .iter()
            .filter_map(|s| {
                let p50 = s.state(&BenchState::new(State::OnlineAlone))?.online_latency_ms.as_ref()?.p50;
                let per = s.scenario.profile.mean_suspend_ns()? + s.scenario.profile.save_ns as f64;
                Some((s.offline_processes(), 1.0 + per * s.offline_processes() as f64 / 1e6 / p50))
            })
            .collect();
        let floor = |n: usize| floors.iter().filter(|f| f.0 == n).map(|f| f.1).fold(f64::NAN, f64::max);
        let _ = writeln!(
            md,
            "| Poisson and Azure trace, 1-3 offline: online P50 and P99 ≤ 1.10× alone | {bound} | worst P50 {:.2}×, P99 \
             {:.2}× (the profile's mean SUSPEND and CWSR save per offline process alone, added to the alone P50: \
             {:.2}× with 1, {:.2}× with 3; Poisson) | {} |",
            worst.0,
            worst.1,
            floor(1),
            floor(3),
            verdict(worst.0 <= 1.10 && worst.1 <= 1.10)
        );
        let _ = writeln!(
            md,
            "| Poisson and Azure trace: offline ≥ 90 % of the idle GPU time | {bound} | worst {} | {} |",
            pct(worst.2),
            verdict(worst.2 >= 0.90)
        );
        // Both request-load goals at once, Poisson: the least share of time a scheduler that
        // suspends on sight must hold the offline side for each latency goal (an unheld request
        // waits at least the SUSPENDs at the profile's shortest; Poisson arrivals see time
        // averages), and so the most offline can keep of the idle GPU time (harness/src/floor.rs).
        let limits: Vec<String> = of("poisson")
            .iter()
            .filter_map(|s| {
                let f = s.suspend_floor?;
                Some(format!(
                    "{} offline: each unheld request waits ≥ {:.2} ms, so held ≥ {:.0} % of the time for P50 \
                     (≥ {:.0} % for P99) and offline ≤ {}",
                    s.offline_processes(),
                    f.delay_ms,
                    f.held_for_p50 * 100.0,
                    f.held_for_p99 * 100.0,
                    pct(f.offline_of_idle_max)
                ))
            })
            .collect();
        if !limits.is_empty() {
            let most =
                of("poisson").iter().filter_map(|s| s.suspend_floor).map(|f| f.offline_of_idle_max).fold(0.0, f64::max);
            let _ = writeln!(
                md,
                "| Poisson: both goals at once, for any scheduler that suspends on sight (not a goal: their bound) | \
                 {bound} | {} | {} |",
                limits.join("; "),
                if most < 0.90 { "**cannot both hold**" } else { "can both hold" }
            );
        }
        for s in of("batching") {
            let c = s.comparison(&BenchState::new(State::Scheduled));
            let f = s.state(&BenchState::new(State::Scheduled)).and_then(|st| st.scheduler.as_ref());
            let engine = f.and_then(|f| f.engine.as_ref());
            let step = c.and_then(|c| c.step_p99_ratio).unwrap_or(f64::NAN);
            let later = c.and_then(|c| c.step_later_p99_ratio).unwrap_or(f64::NAN);
            let idle = c.map_or(0.0, |c| c.offline_of_idle);
            let per = f.map_or(f64::NAN, |f| {
                let busy = s
                    .state(&BenchState::new(State::Scheduled))
                    .and_then(|st| st.gpus.first())
                    .map_or(1, |g| g.busy_periods.max(1));
                f.suspend_calls as f64 / busy as f64 / s.offline_processes() as f64
            });
            let _ = writeln!(
                md,
                "| Continuous batching: step P99 ≤ 1.10× alone | {bound} | {step:.2}× (the steps after each engine busy \
                 period's first: {later:.2}×) | {} |",
                verdict(step <= 1.10)
            );
            let _ = writeln!(
                md,
                "| Continuous batching: offline ≥ 80 % of the idle GPU time | {bound} | {} (the idle time outside the \
                 engine's busy periods, all offline can have with no resume inside one: {}; its step gaps are the rest; \
                 from a busy period's end to the RESUME after it, p50 / p90 {} ms) | {} |",
                pct(idle),
                engine.map_or("–".into(), |e| pct_fine(e.idle_outside_busy_of_idle)),
                engine
                    .and_then(|e| e.resume_after_busy_ms.as_ref())
                    .map_or("–".into(), |r| format!("{:.1} / {:.1}", r.p50, r.p90)),
                verdict(idle >= 0.80)
            );
            if let Some(f) = s.step_floor {
                let left = f.offline_of_idle_max;
                let _ = writeln!(
                    md,
                    "| Continuous batching: both goals at once, for any scheduler that suspends on sight (not a goal: \
                     their bound; from the engine alone) | {bound} | each busy period's opening step found with offline \
                     running waits ≥ {:.2} ms: step P99 {:.2}× alone with none held; within 1.10× only with {} of the {} \
                     openings found held; a scheduler foresees neither a request nor its opening step's length, so that \
                     share of every idle gap's time held: ≥ {} of the idle GPU time, of the {} outside the busy \
                     periods; the rest of each gap loses ≥ the engine's longest step gap and the RESUMEs ({}): \
                     offline ≤ {} | {} |",
                    f.delay_ms,
                    f.p99_ratio_unheld,
                    f.openings_to_hold,
                    f.openings,
                    pct_fine(f.hold_cost_of_idle),
                    pct_fine(f.idle_outside_busy_of_idle),
                    pct_fine(f.transitions_cost_of_idle),
                    pct_fine(left),
                    if left < 0.80 { "**cannot both hold**" } else { "can both hold" }
                );
            }
            // The issue's busy period under continuous batching is "any request in flight": the
            // engine records each (from the step admitting the first request to the step ending
            // the last), and a resume inside one is a flap.
            let engine = engine.cloned().unwrap_or_default();
            let per_period = engine.transitions_per_busy_period / s.offline_processes() as f64;
            let _ = writeln!(
                md,
                "| Continuous batching: ≤ 1 suspend per offline process per online busy period (any request in \
                 flight) | {bound} | {per_period:.2} per busy period ({} busy periods, {} resumes inside one); \
                 {per:.2} per engine step | {} |",
                engine.busy_periods,
                engine.resumes_inside,
                verdict(engine.busy_periods > 0 && per_period <= 1.0)
            );
        }
        let scheds: Vec<(&SchedulerFigures, usize, &str)> = central
            .iter()
            .filter(|s| s.scenario.bound == bound && !s.scenario.name.starts_with("dp"))
            .filter_map(|s| {
                s.state(&BenchState::new(State::Scheduled))
                    .and_then(|st| st.scheduler.as_ref())
                    .map(|f| (f, s.offline_processes(), s.scenario.name.as_str()))
            })
            .collect();
        let max_of = |f: &dyn Fn(&SchedulerFigures) -> Option<f64>| {
            scheds.iter().filter_map(|(s, _, _)| f(s)).fold(0.0f64, f64::max)
        };
        let det = max_of(&|s| s.detection_us.as_ref().map(|d| d.p99));
        let outside = max_of(&|s| s.detection_outside_resume_us.as_ref().map(|d| d.p99));
        let during: usize = scheds.iter().map(|(s, _, _)| s.busy_periods_during_resume).sum();
        let samples: f64 = scheds.iter().filter_map(|(s, _, _)| s.detection_us.as_ref().map(|d| d.count)).sum();
        let _ = writeln!(
            md,
            "| Detection p99 ≤ 300 µs at the default poll (worst scenario) | {bound} | {det:.0} µs ({during} of the \
             {samples:.0} samples were published while a RESUME was in the kernel, the reaction thread inside it; \
             without them, worst p99 {outside:.0} µs) | {} |",
            verdict(det <= 300.0)
        );
        // Reaction bound, sample by sample: reaction = detection + the SUSPEND calls' own time in
        // the model kernel (the profile's SUSPEND: its sampled duration plus a CWSR save per queue
        // executing, the online ones too on `shared`) + gpreempt's own time between the calls. The
        // goal holds when that last part is negligible: p99 ≤ 20 µs (a tenth of the poll interval).
        let worst = |f: &dyn Fn(&SchedulerFigures) -> Option<&Stats>| {
            scheds
                .iter()
                .filter_map(|(s, _, name)| f(s).map(|st| (st.p99, *name)))
                .fold((0.0f64, ""), |a, b| if b.0 > a.0 { b } else { a })
        };
        let (between, between_at) = worst(&|s| s.between_suspend_calls_us.as_ref());
        let (calls, calls_at) = worst(&|s| s.suspend_calls_us.as_ref());
        let rmax = max_of(&|s| s.reaction_us.as_ref().map(|d| d.p99));
        let _ = writeln!(
            md,
            "| Reaction ≤ detection + the SUSPEND time (the profile's, per offline process with work pending) | {bound} | \
             per busy period, reaction − detection − the SUSPEND calls' own time = gpreempt's time between its calls: \
             worst p99 {between:.0} µs ({between_at}; criterion ≤ 20 µs); the calls' own time worst p99 {calls:.0} µs \
             ({calls_at}: the profile's 0.45-0.75 ms each + 0.1 ms per queue executing, and whatever this host's \
             timer overslept the model's call; the timer floor above); reaction worst p99 {rmax:.0} µs | {} |",
            verdict(between <= 20.0 && calls > 0.0)
        );
        let step = max_of(&|s| s.loop_step_us.as_ref().map(|d| d.p99));
        let _ = writeln!(md, "| Loop step p99 ≤ 300 µs | {bound} | worst {step:.0} µs | {} |", verdict(step <= 300.0));
        let cpu = max_of(&|s| Some(s.cpu_share));
        let _ = writeln!(
            md,
            "| gpreempt ≤ 5 % of a core (`cu_occupancy` at 50 µs) | {bound} | worst {} | {} |",
            pct(cpu),
            verdict(cpu <= 0.05)
        );
        for s in of("dp") {
            let c = s.comparison(&BenchState::new(State::Scheduled));
            let co = s.comparison(&BenchState::new(State::CoLocated));
            let alone = s.state(&BenchState::new(State::OfflineAlone)).and_then(|st| st.job_steps_per_s).unwrap_or(0.0);
            // The same job under --gang, where the policy matrix measured it (serial bound).
            let gang = doc
                .policy
                .scenarios
                .iter()
                .filter(|p| p.scenario.bound == bound && p.scenario.name.contains("dp-2gpu"))
                .find_map(|p| {
                    Some((
                        p.comparison(&BenchState::new(State::Scheduled))?,
                        p.comparison(&BenchState::scheduled("gang"))?,
                    ))
                });
            let gang = gang.map_or(String::new(), |(d, g)| {
                format!(
                    "; §9.4, 200 requests: per-GPU holds {}, `--gang` {}",
                    x(d.job_steps_ratio),
                    x(g.job_steps_ratio)
                )
            });
            let _ = writeln!(
                md,
                "| 2-GPU data-parallel job: steps/s (alone {alone:.1}/s) under each gang option | {bound} | co-located {}, `schedule` {} of alone{gang} | reported |",
                x(co.and_then(|c| c.job_steps_ratio)),
                x(c.and_then(|c| c.job_steps_ratio)),
            );
        }
    }
    md.push('\n');
}

/// A rate per second as the probes' period.
fn every(per_s: f64) -> String {
    match per_s {
        r if r <= 0.0 => "none".into(),
        r if r >= 1.0 => format!("{r:.0}/s"),
        r => format!("every {:.0} s", 1.0 / r),
    }
}

/// §9.5: the arrival probe (issue 45) against `--no-arrival`, the floor with a lead, its goals and
/// its cost per packet.
fn arrival(md: &mut String, a: &Arrival) {
    let _ = writeln!(md, "### 9.5. The arrival probe (issue 45)\n");
    if a.scenarios.is_empty() {
        let _ = writeln!(md, "Not in the stored run (it predates the probe): `cargo xtask bench --only native`.\n");
        return;
    }
    let _ = writeln!(
        md,
        "MI300X central profile, serial bound, Poisson requests (1-5 dispatches of 1 ms ± 50 %, 20/s) sent over \
         loopback TCP by the harness (`POST /generate`, keep-alive pool, a body of 4 bytes per prompt token; prompts \
         drawn from the Azure conversation slice's context sizes, median 862 tokens) to the online client, which \
         runs in a cgroup v2 of its own and spins each request's *CPU phase* before its first dispatch \
         (harness/PROFILES.md \"Requests over TCP\": `vllm-mi300x` 3.2 ms + 1.26 µs per token, `lean` 0.25 ms). \
         *default*: the scheduler with the arrival probe (the real `cgroup_skb` program on the client's cgroup); \
         *no-arrival*: `--no-arrival`. *From arrival* = the sender's write → the answer read; *from the first \
         submission* = the first dispatch published → the last complete; each against the same measure alone. \
         *Found held*: requests whose first dispatch found the offline side already suspended. Pending holds and \
         segment counts are the scheduler's (`ScheduleReport.arrival`); *lead* = the sender's write → the first \
         dispatch published, as the harness measured it. The `batching-1off-vllm` row is the continuous-batching \
         engine served the same way (the Azure conversation slice's arrivals and prompts; each request joins the \
         engine's next step after its CPU phase, PROFILES.md \"Continuous batching over TCP\"): its latencies are \
         per request, its step figures in the goals below.\n"
    );
    md.push_str(
        "| scenario | CPU phase | probes: health / metrics | scheduler | P50 / P99 vs alone from arrival | from the first submission | offline of the idle GPU time | found held | pending holds: arrivals (served / late / wasted) | segments: requests / probes | arrival → SUSPEND p50 / p99 µs (arrived during a transition: count, p99) | lead p50 / p99 ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in &a.scenarios {
        if let Some(e) = &s.error {
            let _ = writeln!(md, "| {} | failed: {e} |||||||||||", s.scenario.name);
            continue;
        }
        let serving = s.scenario.serving.clone().unwrap_or_default();
        let variants: Vec<&str> = s.states.iter().filter_map(|st| st.state.as_ref()?.variant()).collect();
        for v in variants {
            let key = BenchState::scheduled(v);
            let (c, st) = (s.comparison(&key), s.state(&key));
            let f = st.and_then(|st| st.scheduler.as_ref());
            let path = st.and_then(|st| st.request_path.as_ref());
            let arrival = f.and_then(|f| f.arrival.first());
            let _ = writeln!(
                md,
                "| {} | {} | {} / {} | {v} | {} / {} | {} / {} | {} | {} | {} | {} | {} | {} |",
                s.scenario.name,
                serving.cpu,
                every(serving.health_per_s),
                every(serving.metrics_per_s),
                x(c.and_then(|c| c.p50_ratio_from_arrival)),
                x(c.and_then(|c| c.p99_ratio_from_arrival)),
                x(c.and_then(|c| c.p50_ratio)),
                x(c.and_then(|c| c.p99_ratio)),
                c.map_or("–".into(), |c| pct(c.offline_of_idle)),
                path.and_then(|p| p.found_held).map_or("–".into(), pct_fine),
                arrival.map_or("–".into(), |a| match &a.why {
                    Some(why) => format!("off: {why}"),
                    None => format!(
                        "{} ({} / {} / {})",
                        a.pending.arrivals, a.pending.served, a.pending.late, a.pending.wasted
                    ),
                }),
                arrival.map_or("–".into(), |a| format!("{} / {}", a.counts.allowed, a.counts.denied)),
                arrival.map_or("–".into(), |a| {
                    let during = a.arrival_to_suspend_in_transition_us.as_ref();
                    format!(
                        "{} ({})",
                        us(&a.arrival_to_suspend_us),
                        during.map_or("0".into(), |d| format!("{:.0}, {:.0}", d.count, d.p99))
                    )
                }),
                path.and_then(|p| p.lead_ms.as_ref()).map_or("–".into(), |l| format!("{:.2} / {:.2}", l.p50, l.p99)),
            );
        }
    }
    md.push('\n');
    // The floor with a lead, per scenario (not a goal: the bound).
    for s in a.scenarios.iter().filter(|s| !s.lead_floors.is_empty()) {
        let parts: Vec<String> = s
            .lead_floors
            .iter()
            .map(|f| {
                format!(
                    "from {} (≤ {:.2}×): held ≥ {:.0} % of the time for P50, ≥ {:.0} % for P99, offline ≤ {}",
                    f.from,
                    f.ratio,
                    f.held_for_p50 * 100.0,
                    f.held_for_p99 * 100.0,
                    pct_fine(f.offline_of_idle_max)
                )
            })
            .collect();
        if let Some(f) = s.lead_floors.first() {
            let _ = writeln!(
                md,
                "- *Floor with a lead* (`harness/src/floor.rs`, not a goal: the bound), {}: SUSPENDs ≥ {:.2} ms; leads \
                 alone min {:.2} / p50 {:.2} ms, {} of the requests covered (an uncovered one waits ≤ {:.2} ms); the \
                 transitions take ≥ {} of the idle GPU time; {}.",
                s.scenario.name,
                f.suspends_ms,
                f.lead_min_ms,
                f.lead_p50_ms,
                pct(f.covered),
                f.wait_max_ms,
                pct_fine(f.transitions_cost_of_idle),
                parts.join("; ")
            );
        }
    }
    md.push('\n');
    arrival_goals(md, a);
}

/// Issue 45's native goals on the arrival rows.
fn arrival_goals(md: &mut String, a: &Arrival) {
    let ok = |s: &&ScenarioResult| s.error.is_none();
    let named = |suffix: &str| a.scenarios.iter().filter(ok).find(|s| s.scenario.name.contains(suffix));
    let default = BenchState::new(State::Scheduled);
    let vllm: Vec<&ScenarioResult> =
        ["poisson-1off-vllm/", "poisson-2off-vllm/", "poisson-3off-vllm/"].iter().filter_map(|n| named(n)).collect();
    let worst = |f: &dyn Fn(&Comparison) -> Option<f64>| {
        vllm.iter().filter_map(|s| f(s.comparison(&default)?)).fold(f64::NAN, f64::max)
    };
    let (arr50, arr99) = (worst(&|c| c.p50_ratio_from_arrival), worst(&|c| c.p99_ratio_from_arrival));
    let (sub50, sub99) = (worst(&|c| c.p50_ratio), worst(&|c| c.p99_ratio));
    let held =
        vllm.iter().filter_map(|s| s.state(&default)?.request_path.as_ref()?.found_held).fold(f64::NAN, f64::min);
    let idle = vllm.iter().filter_map(|s| Some(s.comparison(&default)?.offline_of_idle)).fold(f64::NAN, f64::min);
    let without =
        |s: &ScenarioResult| s.comparison(&BenchState::scheduled("no-arrival")).map(|c| x(c.p50_ratio_from_arrival));
    let _ = writeln!(md, "| goal (issue 45, natively, `vllm-mi300x`) | measured | verdict |\n|---|---|---|");
    // Where the run pooled the three scenarios' requests (one online load, the same seed), the
    // goal is judged over them: a P99 over 200 requests is the second-worst, and the alone runs'
    // own P99 moved by a quarter between these scenarios in one run. Else on the worst scenario.
    let judged = |from_arrival: bool, worst50: f64, worst99: f64, goal: f64| {
        let per_scenario = format!("worst P50 {worst50:.2}×, P99 {worst99:.2}×");
        match a.poisson_pooled.as_ref().and_then(|p| p.ratios(from_arrival)) {
            Some((p50, p99, n)) => (
                format!(
                    "pooled over the three runs ({n} requests): P50 {p50:.2}×, P99 {p99:.2}×; per scenario {per_scenario}"
                ),
                p50 <= goal && p99 <= goal,
            ),
            None => (per_scenario, worst50 <= goal && worst99 <= goal),
        }
    };
    let (figure, pass) = judged(true, arr50, arr99, 1.03);
    let _ = writeln!(
        md,
        "| Poisson, 1-3 offline: P50 and P99 ≤ 1.03× alone from arrival | {figure} (`--no-arrival`: P50 {}) | {} |",
        vllm.iter().filter_map(|s| without(s)).collect::<Vec<_>>().join(", "),
        verdict(pass)
    );
    let (figure, pass) = judged(false, sub50, sub99, 1.05);
    let _ = writeln!(
        md,
        "| Poisson, 1-3 offline: P50 and P99 ≤ 1.05× alone from the first submission | {figure} | {} |",
        verdict(pass)
    );
    let holds: Vec<PendingCounts> =
        vllm.iter().filter_map(|s| Some(s.state(&default)?.scheduler.as_ref()?.arrival.first()?.pending)).collect();
    let late: u64 = holds.iter().map(|p| p.late).sum();
    let before: u64 = holds.iter().map(|p| p.late_before_issue).sum();
    let _ = writeln!(
        md,
        "| ≥ 99 % of requests find the SUSPENDs done before their first doorbell | worst {} (the scheduler's holds \
         over these runs: {late} late, {before} of them with the work before the planned issue time, a lead \
         shorter than the model's bracket; the rest found their SUSPENDs under way) | {} |",
        pct_fine(held),
        verdict(held >= 0.99)
    );
    let _ = writeln!(md, "| Offline ≥ 90 % of the idle GPU time | worst {} | {} |", pct(idle), verdict(idle >= 0.90));
    let idle_of = |s: Option<&ScenarioResult>| s.and_then(|s| s.comparison(&default)).map(|c| c.offline_of_idle);
    if let (Some(base), Some(probed)) =
        (idle_of(named("poisson-1off-vllm/")), idle_of(named("poisson-1off-vllm-probes/")))
    {
        let lost = (base - probed) * 100.0;
        let _ = writeln!(
            md,
            "| Health probes every second and a scrape every 15 s: offline loses ≤ 1 point against no probes | \
             {lost:.1} points ({} → {}) | {} |",
            pct_fine(base),
            pct_fine(probed),
            verdict(lost <= 1.0)
        );
    }
    if let Some(s) = named("poisson-1off-vllm-stress/") {
        let st = s.state(&default);
        let arrival = st.and_then(|st| st.scheduler.as_ref()).and_then(|f| f.arrival.first());
        let probes: u64 =
            st.and_then(|st| st.request_path.as_ref()).map_or(0, |p| p.probes.iter().map(|p| p.sent).sum());
        let requests = st.and_then(|st| st.request_path.as_ref()).map_or(0, |p| p.requests_sent) as u64;
        let text = arrival.map_or("–".into(), |a| {
            format!(
                "{probes} probes and {requests} requests sent; the program counted {} denied, {} allowed, {} armings \
                 (only an allowed segment arms); {} pending holds wasted (requests' holds: a probe opens none)",
                a.counts.denied, a.counts.allowed, a.counts.armings, a.pending.wasted
            )
        });
        // Every probe filtered in the kernel and every request allowed: no probe can open a hold.
        let pass = arrival.is_some_and(|a| a.counts.denied == probes && a.counts.allowed == requests);
        let _ = writeln!(md, "| 20 probes per second: no suspend for a probe | {text} | {} |", verdict(pass));
    }
    if let Some(s) = named("batching-1off-vllm/") {
        let c = s.comparison(&default);
        let opening = c.and_then(|c| c.step_opening_p99_ratio);
        let outside = c.and_then(|c| c.offline_of_idle_outside_busy);
        let without = s.comparison(&BenchState::scheduled("no-arrival"));
        let _ = writeln!(
            md,
            "| Continuous batching: opening-step P99 ≤ 1.05× alone; offline ≥ 95 % of the idle time outside the \
             engine's busy periods | opening step P99 {} / P50 {} (`--no-arrival` {} / {}), all steps P99 {}; \
             offline {} of the idle time outside the busy periods (`--no-arrival` {}) | {} |",
            x(opening),
            x(c.and_then(|c| c.step_opening_p50_ratio)),
            x(without.and_then(|c| c.step_opening_p99_ratio)),
            x(without.and_then(|c| c.step_opening_p50_ratio)),
            x(c.and_then(|c| c.step_p99_ratio)),
            outside.map_or("–".into(), pct),
            without.and_then(|c| c.offline_of_idle_outside_busy).map_or("–".into(), pct),
            verdict(opening.is_some_and(|o| o <= 1.05) && outside.is_some_and(|o| o >= 0.95))
        );
    }
    let paths: Vec<&ArrivalPath> =
        a.scenarios.iter().filter_map(|s| s.state(&default)?.scheduler.as_ref()?.arrival.first()).collect();
    let p99 = paths.iter().filter_map(|p| p.arrival_to_suspend_us.as_ref().map(|x| x.p99)).fold(f64::NAN, f64::max);
    let during: Vec<&Stats> = paths.iter().filter_map(|p| p.arrival_to_suspend_in_transition_us.as_ref()).collect();
    let issued: f64 = paths.iter().filter_map(|p| p.arrival_to_suspend_us.as_ref()).map(|x| x.count).sum();
    let taken = paths.iter().filter_map(|p| p.arrival_to_taken_us.as_ref().map(|x| x.p99)).fold(f64::NAN, f64::max);
    let taken_note = if taken.is_nan() {
        String::new()
    } else {
        format!(
            "; of it, arrival → the reaction thread taking the probe's record (the ring buffer's wake-up and the host \
             waking the thread, before gpreempt's own code runs): worst p99 {taken:.0} µs"
        )
    };
    let during_note = if during.is_empty() {
        "none arrived during a transition's ioctls".to_owned()
    } else {
        format!(
            "{:.0} more arrived during a transition's ioctls (a RESUME in the kernel, which nothing cuts short), worst \
             p99 {:.0} µs",
            during.iter().map(|d| d.count).sum::<f64>(),
            during.iter().map(|d| d.p99).fold(f64::NAN, f64::max)
        )
    };
    // Each scenario has a few dozen such arrivals, so its p99 is its maximum: the goal is judged
    // on the p99 over all of them where the run pooled them, else on the worst scenario's.
    let (figure, judged) = match &a.arrival_to_suspend_pooled_us {
        Some(pooled) => (
            format!(
                "p99 {:.0} µs (p50 {:.0}, max {:.0}) over all {:.0} arrivals that found the reaction thread outside \
                 the kernel; per scenario, worst p99 {p99:.0} µs",
                pooled.p99, pooled.p50, pooled.max, pooled.count
            ),
            pooled.p99,
        ),
        None => (
            format!("worst {p99:.0} µs over {issued:.0} arrivals that found the reaction thread outside the kernel"),
            p99,
        ),
    };
    let _ = writeln!(
        md,
        "| Arrival → first SUSPEND entered, when issued at once: p99 ≤ 100 µs | {figure}{taken_note}; \
         {during_note}{} | {} |",
        cpu_wake_note(a),
        verdict(judged <= 100.0)
    );
    let c = &a.packet_cost;
    match &c.error {
        Some(e) => {
            let _ = writeln!(md, "| The probe adds ≤ 1 µs per packet and drops none | failed: {e} | **FAIL** |");
        }
        None => {
            let _ = writeln!(
                md,
                "| The probe adds ≤ 1 µs per packet and drops none (`harness packet-cost`: {} exchanges in {} rounds \
                 of each kind, one request segment each) | {:.2} µs disarmed, {:.2} µs armed (exchange p50 / p99 µs: \
                 without {}, disarmed {}, armed {}); {} sent, {} answered | {} |",
                c.requests,
                c.rounds,
                c.added_disarmed_us,
                c.added_armed_us,
                us3(&c.bare_us),
                us3(&c.disarmed_us),
                us3(&c.armed_us),
                c.sent,
                c.answered,
                verdict(c.added_disarmed_us <= 1.0 && c.sent == c.answered && c.sent > 0)
            );
        }
    }
    if let Some(s) = named("poisson-1off-lean/") {
        let c = s.comparison(&default);
        let floor = s.lead_floors.iter().find(|f| f.from == "arrival");
        let _ = writeln!(
            md,
            "| `lean` (0.25 ms, shorter than the SUSPENDs): what is reached, against the floor with a lead | P50 / P99 \
             from arrival {} / {}, offline {}; the floor: held ≥ {} of the time for P50, offline ≤ {} | reported |",
            x(c.and_then(|c| c.p50_ratio_from_arrival)),
            x(c.and_then(|c| c.p99_ratio_from_arrival)),
            c.map_or("–".into(), |c| pct(c.offline_of_idle)),
            floor.map_or("–".into(), |f| pct(f.held_for_p50)),
            floor.map_or("–".into(), |f| pct_fine(f.offline_of_idle_max)),
        );
    }
    md.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stored_state_names_are_found_by_state() {
        let s: ScenarioResult = serde_json::from_value(serde_json::json!({
            "states": [
                {"state": "online_alone", "job_steps_per_s": 1.0},
                {"state": "offline_alone", "job_steps_per_s": 2.0},
                {"state": "colocated", "job_steps_per_s": 3.0},
                {"state": "schedule:default", "job_steps_per_s": 4.0},
                {"state": "schedule:gang", "job_steps_per_s": 5.0}
            ],
            "comparisons": [{"state": "colocated", "offline_of_idle": 0.5}, {"state": "schedule:gang", "offline_of_idle": 0.9}]
        }))
        .unwrap();
        let steps = |b: BenchState| s.state(&b).and_then(|st| st.job_steps_per_s);
        assert_eq!(steps(BenchState::new(State::OnlineAlone)), Some(1.0));
        assert_eq!(steps(BenchState::new(State::OfflineAlone)), Some(2.0));
        assert_eq!(steps(BenchState::new(State::CoLocated)), Some(3.0));
        assert_eq!(steps(BenchState::new(State::Scheduled)), Some(4.0));
        assert_eq!(steps(BenchState::scheduled("gang")), Some(5.0));
        assert_eq!(steps(BenchState::scheduled("poll")), None);
        let of_idle = |b: BenchState| s.comparison(&b).map(|c| c.offline_of_idle);
        assert_eq!(of_idle(BenchState::new(State::CoLocated)), Some(0.5));
        assert_eq!(of_idle(BenchState::scheduled("gang")), Some(0.9));
        let variants: Vec<&str> = s.states.iter().filter_map(|st| st.state.as_ref()?.variant()).collect();
        assert_eq!(variants, ["default", "gang"]);
        let unknown = serde_json::from_value::<ScenarioResult>(serde_json::json!({"states": [{"state": "alone"}]}));
        assert_eq!(
            unknown.err().map(|e| e.to_string()),
            Some(
                r#"no state is named "alone" (the names: online_alone, offline_alone, colocated, schedule:VARIANT)"#
                    .to_owned()
            )
        );
    }

    #[test]
    fn the_arrival_rows_show_both_origins_the_schedulers_counts_and_the_goals() {
        let stats =
            |p50: f64, p99: f64| serde_json::json!({"count": 10.0, "p50": p50, "p90": p99, "p99": p99, "max": p99});
        let a: Arrival = serde_json::from_value(serde_json::json!({
            "scenarios": [{
                "scenario": {
                    "name": "arrival/poisson-1off-vllm/mi300x/serial",
                    "serving": {"cpu": "vllm-mi300x", "health_per_s": 1.0, "metrics_per_s": 1.0 / 15.0}
                },
                "states": [
                    {"state": "online_alone"},
                    {"state": "schedule:default", "request_path": {"found_held": 0.995, "lead_ms": stats(4.3, 8.1)},
                     "scheduler": {"arrival": [{
                         "counts": {"segments": 210, "allowed": 200, "denied": 10, "armings": 150},
                         "pending": {"arrivals": 150, "served": 148, "late": 1, "wasted": 1},
                         "arrival_to_suspend_us": stats(40.0, 90.0)
                     }]}},
                    {"state": "schedule:no-arrival", "scheduler": {"arrival": []}}
                ],
                "comparisons": [
                    {"state": "schedule:default", "p50_ratio": 1.01, "p99_ratio": 1.04, "p50_ratio_from_arrival": 1.0,
                     "p99_ratio_from_arrival": 1.02, "offline_of_idle": 0.93},
                    {"state": "schedule:no-arrival", "p50_ratio": 1.2, "p99_ratio": 1.3, "p50_ratio_from_arrival": 1.1,
                     "p99_ratio_from_arrival": 1.15, "offline_of_idle": 0.94}
                ]
            }],
            "packet_cost": {"requests": 16, "rounds": 8, "added_disarmed_us": 0.4, "added_armed_us": 0.7,
                            "sent": 50, "answered": 50}
        }))
        .unwrap();
        let mut md = String::new();
        arrival(&mut md, &a);
        let rows: Vec<&str> =
            md.lines().filter(|l| l.starts_with("| arrival/") || l.starts_with("| Poisson")).collect();
        assert_eq!(
            rows,
            [
                "| arrival/poisson-1off-vllm/mi300x/serial | vllm-mi300x | 1/s / every 15 s | default | 1.00× / 1.02× | \
                 1.01× / 1.04× | 93 % | 99.5 % | 150 (148 / 1 / 1) | 200 / 10 | 40 / 90 (0) | 4.30 / 8.10 |",
                "| arrival/poisson-1off-vllm/mi300x/serial | vllm-mi300x | 1/s / every 15 s | no-arrival | 1.10× / 1.15× | \
                 1.20× / 1.30× | 94 % | – | – | – | – | – |",
                "| Poisson, 1-3 offline: P50 and P99 ≤ 1.03× alone from arrival | worst P50 1.00×, P99 1.02× \
                 (`--no-arrival`: P50 1.10×) | **pass** |",
                "| Poisson, 1-3 offline: P50 and P99 ≤ 1.05× alone from the first submission | worst P50 1.01×, P99 \
                 1.04× | **pass** |",
            ]
        );
        assert!(md.contains(
            "| ≥ 99 % of requests find the SUSPENDs done before their first doorbell | worst 99.5 % (the scheduler's \
             holds over these runs: 1 late, 0 of them with the work before the planned issue time, a lead shorter than \
             the model's bracket; the rest found their SUSPENDs under way) | **pass** |"
        ));
        assert!(md.contains(
            "| Arrival → first SUSPEND entered, when issued at once: p99 ≤ 100 µs | worst 90 µs over 10 arrivals that \
             found the reaction thread outside the kernel; none arrived during a transition's ioctls | **pass** |"
        ));
        assert!(md.contains("0.40 µs disarmed, 0.70 µs armed"), "{md}");
    }

    #[test]
    fn the_arrival_to_suspend_goal_is_judged_on_the_pooled_p99_where_the_run_has_it() {
        // One scenario's 19 arrivals with one 1.28 ms stall: its p99 is that stall; over the
        // matrix's 258, the p99 is 95 µs.
        let doc = |pooled: serde_json::Value| {
            serde_json::json!({
                "scenarios": [{
                    "scenario": {"name": "arrival/poisson-3off-vllm/mi300x/serial"},
                    "states": [{"state": "schedule:default", "scheduler": {"arrival": [{
                        "arrival_to_suspend_us": {"count": 19.0, "p50": 51.0, "p90": 70.0, "p99": 1280.0, "max": 1280.0}
                    }]}}]
                }],
                "packet_cost": {"sent": 1, "answered": 1},
                "arrival_to_suspend_pooled_us": pooled
            })
        };
        let row = |a: &Arrival| {
            let mut md = String::new();
            arrival(&mut md, a);
            md.lines().find(|l| l.starts_with("| Arrival → first SUSPEND")).map(str::to_owned).unwrap_or_default()
        };
        let pooled: Arrival = serde_json::from_value(doc(
            serde_json::json!({"count": 258.0, "p50": 48.0, "p90": 70.0, "p99": 95.0, "max": 1280.0}),
        ))
        .unwrap();
        assert_eq!(
            row(&pooled),
            "| Arrival → first SUSPEND entered, when issued at once: p99 ≤ 100 µs | p99 95 µs (p50 48, max 1280) over \
             all 258 arrivals that found the reaction thread outside the kernel; per scenario, worst p99 1280 µs; none \
             arrived during a transition's ioctls | **pass** |"
        );
        let before: Arrival = serde_json::from_value(doc(serde_json::Value::Null)).unwrap();
        assert_eq!(
            row(&before),
            "| Arrival → first SUSPEND entered, when issued at once: p99 ≤ 100 µs | worst 1280 µs over 19 arrivals \
             that found the reaction thread outside the kernel; none arrived during a transition's ioctls | **FAIL** |"
        );
    }

    #[test]
    fn the_poisson_latency_goals_are_judged_on_the_pooled_requests_where_the_run_has_them() {
        // One scenario whose P99 from the first submission is 1.15× alone (its second-worst
        // request); over the three runs' 600 requests, 1.02×.
        let stats =
            |count: f64, p50: f64, p99: f64| serde_json::json!({"count": count, "p50": p50, "p99": p99, "max": p99});
        let doc = |pooled: serde_json::Value| {
            serde_json::json!({
                "scenarios": [{
                    "scenario": {"name": "arrival/poisson-1off-vllm/mi300x/serial"},
                    "states": [{"state": "online_alone"}, {"state": "schedule:default"}],
                    "comparisons": [{"state": "schedule:default", "p50_ratio": 1.03, "p99_ratio": 1.15,
                                     "p50_ratio_from_arrival": 1.01, "p99_ratio_from_arrival": 1.0,
                                     "offline_of_idle": 0.93}]
                }],
                "packet_cost": {"sent": 1, "answered": 1},
                "poisson_pooled": pooled
            })
        };
        let rows = |a: &Arrival| {
            let mut md = String::new();
            arrival(&mut md, a);
            md.lines().filter(|l| l.starts_with("| Poisson, 1-3 offline")).map(str::to_owned).collect::<Vec<_>>()
        };
        let pooled: Arrival = serde_json::from_value(doc(serde_json::json!({
            "scenarios": ["arrival/poisson-1off-vllm", "arrival/poisson-2off-vllm", "arrival/poisson-3off-vllm"],
            "alone_from_arrival_ms": stats(600.0, 7.5, 13.0),
            "scheduled_from_arrival_ms": stats(600.0, 7.6, 13.2),
            "alone_ms": stats(600.0, 3.5, 7.5),
            "scheduled_ms": stats(600.0, 3.5, 7.65)
        })))
        .unwrap();
        assert_eq!(
            rows(&pooled),
            [
                "| Poisson, 1-3 offline: P50 and P99 ≤ 1.03× alone from arrival | pooled over the three runs (600 \
                 requests): P50 1.01×, P99 1.02×; per scenario worst P50 1.01×, P99 1.00× (`--no-arrival`: P50 ) | \
                 **pass** |",
                "| Poisson, 1-3 offline: P50 and P99 ≤ 1.05× alone from the first submission | pooled over the three \
                 runs (600 requests): P50 1.00×, P99 1.02×; per scenario worst P50 1.03×, P99 1.15× | **pass** |",
            ]
        );
        // Without the pooled figures (a run before them) the worst scenario decides.
        let before: Arrival = serde_json::from_value(doc(serde_json::Value::Null)).unwrap();
        assert_eq!(
            rows(&before)[1],
            "| Poisson, 1-3 offline: P50 and P99 ≤ 1.05× alone from the first submission | worst P50 1.03×, P99 \
             1.15× | **FAIL** |"
        );
    }
}
