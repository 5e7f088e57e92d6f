//! The evaluation's record: every state run (what the load command said, what was measured from
//! outside), and per state the figures over the rounds (median and range) with their ratio to
//! the state where that side ran alone. Serialised as the `--json` document; the renderers
//! ([`super::render`]) draw the same figures as a table.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    host_facts::HostFacts,
    load::{LoadEnd, LoadRun},
    metric::MetricSpec,
    state::State,
};
use crate::{
    domain::{GpuId, HostPid},
    schedule::{
        ScheduleReport,
        arrival::{lead::PendingCounts, report::ArrivalReport},
    },
    stats::Summary,
};

/// Bumped when a field changes meaning or goes away.
pub const REPORT_VERSION: u32 = 1;

/// How the load command's run of a state ended.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LoadOutcome {
    pub ended: LoadEnd,
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub duration_ms: f64,
    pub succeeded: bool,
    /// "exited 0", "timed out after 600.0 s and was ended", …
    pub message: String,
    /// The end of its stderr when it did not succeed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr_tail: Option<String>,
}

impl From<&LoadRun> for LoadOutcome {
    fn from(r: &LoadRun) -> Self {
        Self {
            ended: r.ended,
            code: r.code,
            signal: r.signal,
            duration_ms: r.duration.as_secs_f64() * 1e3,
            succeeded: r.succeeded(),
            message: r.describe(),
            stderr_tail: (!r.succeeded() && !r.stderr_tail.is_empty()).then(|| r.stderr_tail.clone()),
        }
    }
}

/// One GPU's offline progress in a state.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuProgress {
    pub gpu_id: GpuId,
    /// Dispatches the offline processes' queues on it consumed (read indices).
    pub dispatches: u64,
    pub per_s: f64,
}

/// The offline processes held during an online-alone state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Held {
    pub processes: usize,
    /// Queues the suspends reported done.
    pub queues_suspended: usize,
    pub queues_resumed: usize,
    /// Always true: a suspend stops the GPU queues, not the process; its CPU threads (a training
    /// loop waiting for the GPU, data loading) kept running and competing for the CPU.
    pub cpu_threads_ran: bool,
}

/// One state of one round, as run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StateRun {
    pub round: u32,
    pub state: State,
    pub duration_ms: f64,
    /// None in the offline-alone state (no load runs).
    pub load: Option<LoadOutcome>,
    /// The `--metric` values found in the load command's output.
    pub metrics: BTreeMap<String, f64>,
    /// The `--offline-metric` values found in what the offline log got during the state.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub offline_metrics: BTreeMap<String, f64>,
    /// Online dispatch delay (published → consumed), µs, measured from outside.
    pub online_dispatch_delay_us: Option<Summary>,
    /// Dispatches the online processes published (write-index movement) and the GPU consumed.
    pub online_dispatches: u64,
    pub online_consumed: u64,
    pub offline_dispatches: u64,
    pub offline_per_s: f64,
    pub offline_gpus: Vec<GpuProgress>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<Held>,
    /// `schedule`'s own report of the state (transitions, detection, reaction, the driver's
    /// side when traced).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Box<ScheduleReport>>,
    /// Ctrl-C or SIGTERM ended the state early.
    pub interrupted: bool,
    pub warnings: Vec<String>,
}

/// Which side a figure belongs to, and so which state it is compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    /// Compared with online alone.
    Online,
    /// Compared with offline alone.
    Offline,
}

/// One figure of one state over the rounds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FigureSummary {
    pub figure: String,
    pub side: Side,
    /// Rounds that gave a value.
    pub n: usize,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Median ÷ the median of the state where this side ran alone.
    pub ratio_to_alone: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StateSummary {
    pub state: State,
    pub runs: usize,
    pub figures: Vec<FigureSummary>,
}

/// How the evaluation ended.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "how", rename_all = "snake_case")]
pub enum Ended {
    Completed,
    /// By a signal; what was measured until then is reported.
    Interrupted {
        signal: Option<String>,
    },
    /// By an error after the first state; what was measured until then is reported.
    Failed {
        error: String,
    },
}

/// The whole evaluation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EvaluationReport {
    pub version: u32,
    pub host: HostFacts,
    pub online: Vec<HostPid>,
    pub offline: Vec<HostPid>,
    pub load: String,
    pub metrics: Vec<MetricSpec>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offline_log: Option<std::path::PathBuf>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub offline_metrics: Vec<MetricSpec>,
    pub rounds: u32,
    pub runs: Vec<StateRun>,
    pub summary: Vec<StateSummary>,
    /// The arrival path over the scheduled runs, per online process (empty with --no-arrival).
    pub arrival: Vec<ArrivalSummary>,
    pub ended: Ended,
    pub notes: Vec<String>,
}

/// What the arrival path of `schedule` did for one online process over the scheduled runs: the
/// requests its probe saw before their first kernel, the probes and scrapes it let by, and how the
/// pending hold each request opened ended (each run's `schedule.arrival` has the details).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ArrivalSummary {
    pub pid: HostPid,
    /// The ports it was watched on in the last run that watched it.
    pub ports: Vec<u16>,
    /// Scheduled runs that reported it.
    pub runs: usize,
    /// Requests the allow list matched, summed over the runs.
    pub requests: u64,
    /// Health probes and metric scrapes the deny list matched: no hold, no suspend.
    pub denied: u64,
    /// Pending holds (one per request that found the process armed), how they ended, and those
    /// still pending when a run ended (flattened: `arrivals`, `served`, … beside the fields above).
    #[serde(flatten)]
    pub pending: PendingCounts,
    /// Arrival to first GPU work, µs: each run's p50, their median and range.
    pub lead_p50_us: Option<Range>,
    /// Why the probe did not watch it, when no run did (its requests were then seen at their
    /// first GPU work).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// A figure's median and range over the runs that gave it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Range {
    pub n: usize,
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Range {
    fn of(mut values: Vec<f64>) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        values.sort_by(f64::total_cmp);
        Some(Self { n: values.len(), median: median(&values), min: values[0], max: values[values.len() - 1] })
    }
}

/// Per online process (in the order first reported), the arrival path over every scheduled run
/// (one cut short by Ctrl-C included: its counts are what happened).
pub fn arrival_summary(runs: &[StateRun]) -> Vec<ArrivalSummary> {
    let mut per_pid: Vec<(ArrivalSummary, Vec<f64>, bool)> = Vec::new();
    let reports = runs.iter().filter_map(|r| r.schedule.as_ref()).flat_map(|s| &s.arrival);
    for a in reports {
        let i = match per_pid.iter().position(|(s, ..)| s.pid == a.pid) {
            Some(i) => i,
            None => {
                per_pid.push((ArrivalSummary::empty(a.pid), Vec::new(), false));
                per_pid.len() - 1
            }
        };
        let (s, leads, watched) = &mut per_pid[i];
        add(s, a);
        leads.extend(a.lead_us.as_ref().map(|l| l.p50));
        if a.cgroup.is_some() && a.why.is_none() {
            *watched = true;
            s.ports.clone_from(&a.ports);
        } else if !*watched {
            s.why.clone_from(&a.why);
        }
    }
    per_pid
        .into_iter()
        .map(|(mut s, leads, watched)| {
            s.lead_p50_us = Range::of(leads);
            if watched {
                s.why = None;
            }
            s
        })
        .collect()
}

fn add(s: &mut ArrivalSummary, a: &ArrivalReport) {
    s.runs += 1;
    s.requests += a.counts.allowed;
    s.denied += a.counts.denied;
    s.pending.add(&a.pending);
}

impl ArrivalSummary {
    fn empty(pid: HostPid) -> Self {
        Self {
            pid,
            ports: Vec::new(),
            runs: 0,
            requests: 0,
            denied: 0,
            pending: PendingCounts::default(),
            lead_p50_us: None,
            why: None,
        }
    }
}

/// Figure names the report uses besides the user's metrics.
pub const DELAY_P50: &str = "online delay p50 us";
pub const DELAY_P99: &str = "online delay p99 us";
pub const OFFLINE_RATE: &str = "offline dispatches/s";

/// One figure's values over the rounds of a state.
struct Values {
    name: String,
    side: Side,
    values: Vec<f64>,
}

fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 { sorted[n / 2] } else { (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0 }
}

/// The figures of `run` by name, and their side.
fn figures_of(run: &StateRun, metrics: &[MetricSpec], offline: &[MetricSpec]) -> Vec<(String, Side, Option<f64>)> {
    let mut out: Vec<(String, Side, Option<f64>)> =
        metrics.iter().map(|m| (m.name.clone(), Side::Online, run.metrics.get(&m.name).copied())).collect();
    if run.state.runs_load() {
        out.push((DELAY_P50.into(), Side::Online, run.online_dispatch_delay_us.as_ref().map(|s| s.p50)));
        out.push((DELAY_P99.into(), Side::Online, run.online_dispatch_delay_us.as_ref().map(|s| s.p99)));
    }
    if run.state != State::OnlineAlone {
        out.push((OFFLINE_RATE.into(), Side::Offline, Some(run.offline_per_s)));
        out.extend(offline.iter().map(|m| (m.name.clone(), Side::Offline, run.offline_metrics.get(&m.name).copied())));
    }
    out
}

/// Per state in [`State::ALL`] order (those with at least one run): each figure's median
/// and range over the rounds, and its ratio to the alone state of its side. Interrupted runs
/// are left out (a state cut short measures something else).
pub fn summarise(runs: &[StateRun], metrics: &[MetricSpec], offline: &[MetricSpec]) -> Vec<StateSummary> {
    let mut per_state: BTreeMap<State, (usize, Vec<Values>)> = BTreeMap::new();
    for run in runs.iter().filter(|r| !r.interrupted) {
        let (count, figures) = per_state.entry(run.state).or_default();
        *count += 1;
        for (name, side, value) in figures_of(run, metrics, offline) {
            match figures.iter_mut().find(|f| f.name == name) {
                Some(f) => f.values.extend(value),
                None => figures.push(Values { name, side, values: value.into_iter().collect() }),
            }
        }
    }
    for (_, figures) in per_state.values_mut() {
        figures.retain(|f| !f.values.is_empty());
        for f in figures.iter_mut() {
            f.values.sort_by(f64::total_cmp);
        }
    }
    let alone_median =
        |state: State, name: &str| per_state.get(&state)?.1.iter().find(|f| f.name == name).map(|f| median(&f.values));
    State::ALL
        .iter()
        .filter_map(|state| {
            let (runs, figs) = per_state.get(state)?;
            let figures = figs
                .iter()
                .map(|f| {
                    let m = median(&f.values);
                    let alone = match f.side {
                        Side::Online => State::OnlineAlone,
                        Side::Offline => State::OfflineAlone,
                    };
                    FigureSummary {
                        figure: f.name.clone(),
                        side: f.side,
                        n: f.values.len(),
                        median: m,
                        min: f.values[0],
                        max: f.values[f.values.len() - 1],
                        ratio_to_alone: alone_median(alone, &f.name).filter(|&a| a != 0.0).map(|a| m / a),
                    }
                })
                .collect();
            Some(StateSummary { state: *state, runs: *runs, figures })
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn run(round: u32, state: State, p99_ms: Option<f64>, delay_p99: f64, offline_per_s: f64) -> StateRun {
        StateRun {
            round,
            state,
            duration_ms: 1000.0,
            load: None,
            metrics: p99_ms.map(|v| BTreeMap::from([("p99_ms".to_owned(), v)])).unwrap_or_default(),
            // The job's own figure, as its log would give it: twice its dispatch rate.
            offline_metrics: if state == State::OnlineAlone {
                BTreeMap::new()
            } else {
                BTreeMap::from([("samples_s".to_owned(), offline_per_s * 2.0)])
            },
            online_dispatch_delay_us: state.runs_load().then(|| Summary {
                count: 10,
                p50: delay_p99 / 2.0,
                p99: delay_p99,
                ..Summary::default()
            }),
            online_dispatches: 20,
            online_consumed: 20,
            offline_dispatches: offline_per_s as u64,
            offline_per_s,
            offline_gpus: Vec::new(),
            held: None,
            schedule: None,
            interrupted: false,
            warnings: Vec::new(),
        }
    }

    /// What `schedule` reported of an online process's arrival path in one scheduled run.
    pub(crate) fn arrival(pid: u32, allowed: u64, denied: u64, ends: [u64; 4], lead_p50: Option<f64>) -> ArrivalReport {
        use gpreempt_common::arrival::ArrivalCounts;
        let [served, late, wasted, busy] = ends;
        let arrivals = served + late + wasted + busy;
        ArrivalReport {
            pid: HostPid(pid),
            ports: vec![8000],
            cgroup: Some("/sys/fs/cgroup/serving".into()),
            why: None,
            counts: ArrivalCounts {
                segments: allowed + denied,
                allowed,
                denied,
                unmatched: 0,
                tls: 0,
                armings: arrivals,
            },
            pending: PendingCounts {
                arrivals,
                served,
                late,
                late_before_issue: 0,
                wasted,
                busy,
                continued: 0,
                open: 0,
            },
            lead_us: lead_p50.map(|p50| Summary { count: 1, p50, ..Summary::default() }),
            arrival_to_suspend_us: None,
            arrival_to_taken_us: None,
            arrival_to_suspend_in_transition_us: None,
            arrival_to_suspend_samples_us: Vec::new(),
        }
    }

    /// A scheduled run whose `schedule` reported `arrival`.
    pub(crate) fn scheduled(round: u32, arrival: Vec<ArrivalReport>) -> StateRun {
        StateRun {
            schedule: Some(Box::new(ScheduleReport { arrival, ..ScheduleReport::default() })),
            ..run(round, State::Scheduled, Some(12.0), 150.0, 80.0)
        }
    }

    #[test]
    fn the_arrival_path_is_summed_per_online_process_over_the_scheduled_runs() {
        let not_watched = ArrivalReport {
            pid: HostPid(11),
            why: Some("it listens on no TCP port yet (or give --arrival-port)".into()),
            ..ArrivalReport::default()
        };
        let runs = vec![
            run(1, State::CoLocated, Some(30.0), 900.0, 50.0),
            scheduled(1, vec![arrival(10, 40, 12, [36, 3, 0, 1], Some(31_000.0)), not_watched.clone()]),
            scheduled(2, vec![arrival(10, 40, 11, [38, 1, 1, 0], Some(33_000.0)), not_watched]),
            // --no-arrival, or a run whose scheduler saw no online process: nothing to add.
            scheduled(3, Vec::new()),
        ];
        let s = arrival_summary(&runs);
        assert_eq!(
            s,
            [
                ArrivalSummary {
                    pid: HostPid(10),
                    ports: vec![8000],
                    runs: 2,
                    requests: 80,
                    denied: 23,
                    pending: PendingCounts {
                        arrivals: 80,
                        served: 74,
                        late: 4,
                        late_before_issue: 0,
                        wasted: 1,
                        busy: 1,
                        continued: 0,
                        open: 0
                    },
                    lead_p50_us: Some(Range { n: 2, median: 32_000.0, min: 31_000.0, max: 33_000.0 }),
                    why: None,
                },
                ArrivalSummary {
                    why: Some("it listens on no TCP port yet (or give --arrival-port)".into()),
                    runs: 2,
                    ..ArrivalSummary::empty(HostPid(11))
                },
            ]
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(
            json[0]["lead_p50_us"],
            serde_json::json!({"n": 2, "median": 32000.0, "min": 31000.0, "max": 33000.0})
        );
        assert_eq!(
            (json[0].get("why"), &json[1]["why"]),
            (None, &serde_json::json!("it listens on no TCP port yet (or give --arrival-port)"))
        );
        assert_eq!(arrival_summary(&runs[..1]), []);
    }

    pub(crate) fn metrics() -> Vec<MetricSpec> {
        vec!["p99_ms=p99_ms=([0-9.]+)".parse().unwrap()]
    }

    pub(crate) fn offline_metrics() -> Vec<MetricSpec> {
        vec!["samples_s=samples/s ([0-9.]+)".parse().unwrap()]
    }

    #[test]
    fn medians_ranges_and_ratios_to_the_alone_state_of_each_side() {
        use State::*;
        let runs = vec![
            run(1, CoLocated, Some(30.0), 900.0, 50.0),
            run(1, OnlineAlone, Some(10.0), 100.0, 0.0),
            run(1, Scheduled, Some(12.0), 150.0, 80.0),
            run(1, OfflineAlone, None, 0.0, 100.0),
            run(2, OnlineAlone, Some(10.0), 300.0, 0.0),
            run(2, Scheduled, Some(14.0), 250.0, 60.0),
            run(2, OfflineAlone, None, 0.0, 100.0),
            run(2, CoLocated, Some(50.0), 1100.0, 40.0),
            // Cut short by Ctrl-C: left out.
            StateRun { interrupted: true, ..run(3, Scheduled, Some(1000.0), 1e6, 1.0) },
        ];
        let s = summarise(&runs, &metrics(), &offline_metrics());
        assert_eq!(
            s.iter().map(|s| (s.state, s.runs)).collect::<Vec<_>>(),
            [(CoLocated, 2), (OnlineAlone, 2), (Scheduled, 2), (OfflineAlone, 2)]
        );
        let fig = |state: usize, name: &str| s[state].figures.iter().find(|f| f.figure == name).cloned();
        let p99 = fig(0, "p99_ms").unwrap();
        assert_eq!((p99.n, p99.median, p99.min, p99.max, p99.ratio_to_alone), (2, 40.0, 30.0, 50.0, Some(4.0)));
        let sched = fig(2, "p99_ms").unwrap();
        assert_eq!((sched.median, sched.ratio_to_alone), (13.0, Some(1.3)));
        assert_eq!(fig(2, DELAY_P99).unwrap().ratio_to_alone, Some(1.0));
        assert_eq!(fig(0, DELAY_P99).unwrap().ratio_to_alone, Some(5.0));
        assert_eq!(fig(2, OFFLINE_RATE).unwrap().ratio_to_alone, Some(0.7));
        assert_eq!(fig(3, OFFLINE_RATE).unwrap().ratio_to_alone, Some(1.0));
        // The job's own figure, against offline alone (median 2 x 70 over 2 x 100).
        let samples = fig(2, "samples_s").unwrap();
        assert_eq!(
            (samples.side, samples.n, samples.median, samples.ratio_to_alone),
            (Side::Offline, 2, 140.0, Some(0.7))
        );
        // Online alone has no offline figure; offline alone no online one.
        assert_eq!((fig(1, OFFLINE_RATE), fig(1, "samples_s")), (None, None));
        assert_eq!((fig(3, "p99_ms"), fig(3, DELAY_P50)), (None, None));
        assert_eq!(fig(1, DELAY_P50).unwrap().median, 100.0);
        let json = serde_json::to_value(&s[2]).unwrap();
        assert_eq!(json["state"], "scheduled");
        assert_eq!(json["figures"][0]["side"], "online");
    }
}
