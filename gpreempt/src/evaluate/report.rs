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
    schedule::ScheduleReport,
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
    pub ended: Ended,
    pub notes: Vec<String>,
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
