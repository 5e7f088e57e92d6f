//! The evaluation itself: check the input, learn the queues, then run each state of the plan
//! with the observer on, the load command once, and what the state needs around it (nothing;
//! the offline processes held; `schedule`; no load), and release it before the next state starts.
//!
//! Nothing is held until the first state (co-located) has shown that the load command runs, that
//! it drives the online queues and that every `--metric` matches its output. After that, an
//! error or Ctrl-C ends the current state, releases what it holds and returns the report of what
//! was measured.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use super::{
    EvaluateError,
    hold::Hold,
    host_facts,
    load::{LoadCommand, LoadRun},
    metric::MetricSpec,
    observe::{Observation, Observed, Ticker, Watched, learn_queues},
    offline_log::LogWindow,
    plan::{Step, plan},
    ranks,
    report::{
        Ended, EvaluationReport, GpuProgress, Held, LoadOutcome, REPORT_VERSION, StateRun, arrival_summary, summarise,
    },
    state::State,
};
use crate::{
    domain::HostPid,
    host::select,
    pipeline::in_process::TracerOptions,
    schedule::{
        Role, ScheduleConfig, ScheduleEvent, ScheduleReport, Scheduler, check_kernel, check_selection,
        discover::{Discovery, SysfsDiscovery, TracerDiscovery},
        seams::Seams,
    },
    stats::Summary,
};

/// What to evaluate and how.
#[derive(Clone, Debug)]
pub struct EvaluateConfig {
    /// The selectors, the scheduler's settings for the scheduled state, the session options and
    /// the host roots.
    pub schedule: ScheduleConfig,
    pub load: LoadCommand,
    pub metrics: Vec<MetricSpec>,
    /// The offline job's log and the figures taken from what it wrote there during each state.
    pub offline_log: Option<std::path::PathBuf>,
    pub offline_metrics: Vec<MetricSpec>,
    pub rounds: u32,
    /// The longest a load run may take; it is ended after that.
    pub state_timeout: Duration,
    /// Interval between the observer's reads of the online indices.
    pub sample: Duration,
    /// Attach the tracer in the scheduled state (the driver's side of its transitions).
    pub trace: bool,
    /// Interval of [`Progress::ticker`]'s calls while a state runs.
    pub progress_every: Duration,
}

/// What the caller shows while it runs.
pub trait Progress {
    fn state_started(&mut self, index: usize, total: usize, step: Step);
    fn state_ended(&mut self, run: &StateRun);
    /// The scheduler's events during a scheduled state.
    fn schedule_event(&mut self, event: &ScheduleEvent);
    fn note(&mut self, message: &str);
    /// What to call every [`EvaluateConfig::progress_every`] while a state runs (on the
    /// observer's thread), if anything.
    fn ticker(&mut self) -> Option<Ticker> {
        None
    }
}

/// The offline processes' CPU threads are not stopped by a hold (said in every report).
const HOLD_NOTE: &str = "online alone: the offline processes' GPU queues were held suspended for the whole state (the \
suspension bound lifted for it); their CPU threads still ran and competed for the CPU";

/// The processes the selectors name now; a side with none is refused (the evaluation measures
/// running processes).
fn resolve(config: &ScheduleConfig, role: Role) -> Result<Vec<HostPid>, EvaluateError> {
    let selectors = match role {
        Role::Online => &config.online,
        Role::Offline => &config.offline,
    };
    let r = select::resolve(selectors, &config.roots);
    if r.pids.is_empty() {
        let named: Vec<String> = selectors.iter().map(ToString::to_string).collect();
        return Err(EvaluateError::NoProcess { role, selectors: named.join(" ") });
    }
    Ok(r.pids)
}

/// Everything checked and learnt before the first state.
struct Prepared {
    online: Vec<Watched>,
    offline: Vec<Watched>,
}

/// Every user figure name once (the report's own have blanks, which theirs cannot), and the
/// offline log readable.
fn check_figures(config: &EvaluateConfig) -> Result<(), EvaluateError> {
    let mut names: Vec<&str> = Vec::new();
    for m in config.metrics.iter().chain(&config.offline_metrics) {
        if names.contains(&m.name.as_str()) {
            return Err(EvaluateError::FigureNameTwice(m.name.clone()));
        }
        names.push(&m.name);
    }
    if let Some(path) = &config.offline_log {
        LogWindow::open(path).map_err(|cause| EvaluateError::OfflineLog { path: path.clone(), cause })?;
    }
    Ok(())
}

fn prepare(config: &EvaluateConfig, progress: &mut dyn Progress) -> Result<Prepared, EvaluateError> {
    let s = &config.schedule;
    check_figures(config)?;
    check_selection(s)?;
    check_kernel(&s.session.device)?;
    let online_pids = resolve(s, Role::Online)?;
    let offline_pids = resolve(s, Role::Offline)?;
    let mut online = Vec::new();
    for pid in online_pids {
        let w =
            learn_queues(pid, &s.session).map_err(|cause| EvaluateError::Learn { role: Role::Online, pid, cause })?;
        online.push(w);
    }
    if online.iter().all(|w| w.queues.is_empty()) {
        let pids: Vec<String> = online.iter().map(|w| w.pid.to_string()).collect();
        return Err(EvaluateError::NoOnlineQueues(pids.join(", ")));
    }
    let mut offline = Vec::new();
    for pid in offline_pids {
        let w =
            learn_queues(pid, &s.session).map_err(|cause| EvaluateError::Learn { role: Role::Offline, pid, cause })?;
        if w.queues.is_empty() {
            progress.note(&format!("offline pid {pid} has no GPU queue now: its progress counts as 0"));
        }
        if let Some(rank) = ranks::rank_of(&s.roots, pid) {
            progress.note(&ranks::warning(pid, &rank, config.state_timeout));
        }
        offline.push(w);
    }
    Ok(Prepared { online, offline })
}

/// A state's figures from the observer and the load run.
fn state_run(
    step: Step,
    observed: Observed,
    load: Option<&LoadRun>,
    config: &EvaluateConfig,
    offline_log: Option<std::io::Result<String>>,
) -> StateRun {
    let metrics = &config.metrics;
    let secs = observed.elapsed.as_secs_f64().max(1e-9);
    let mut warnings = Vec::new();
    let mut values = std::collections::BTreeMap::new();
    if let Some(l) = load {
        if !l.succeeded() {
            warnings.push(format!("the load command {}", l.describe()));
        }
        for m in metrics {
            match m.extract(&l.output) {
                Ok(Some(v)) => {
                    values.insert(m.name.clone(), v);
                }
                Ok(None) => warnings.push(format!("--metric {m} did not match the load command's output")),
                Err(e) => warnings.push(e.to_string()),
            }
        }
        if observed.online_published == 0 {
            warnings.push("the online processes published no dispatch during the load run".into());
        }
    }
    let mut offline_values = std::collections::BTreeMap::new();
    match offline_log {
        // Online alone: the offline job is held and logs no progress of its own.
        _ if step.state == State::OnlineAlone => {}
        None => {}
        Some(Err(e)) => warnings.push(format!("the offline log could not be read at the end of the state: {e}")),
        Some(Ok(text)) => {
            for m in &config.offline_metrics {
                match m.extract(&text) {
                    Ok(Some(v)) => {
                        offline_values.insert(m.name.clone(), v);
                    }
                    Ok(None) => warnings.push(format!(
                        "--offline-metric {m} did not match what the offline log got during the state (does the job \
                         log less often than the state lasts?)"
                    )),
                    Err(e) => warnings.push(e.to_string()),
                }
            }
        }
    }
    for pid in &observed.unreadable {
        warnings.push(format!("pid {pid}'s queue indices could not be read to the end of the state (did it exit?)"));
    }
    let offline_gpus: Vec<GpuProgress> = observed
        .offline_consumed
        .iter()
        .map(|(&gpu_id, &dispatches)| GpuProgress { gpu_id, dispatches, per_s: dispatches as f64 / secs })
        .collect();
    let offline_dispatches: u64 = offline_gpus.iter().map(|g| g.dispatches).sum();
    StateRun {
        round: step.round,
        state: step.state,
        duration_ms: secs * 1e3,
        load: load.map(LoadOutcome::from),
        metrics: values,
        offline_metrics: offline_values,
        online_dispatch_delay_us: Summary::of(&observed.delays_us),
        online_dispatches: observed.online_published,
        online_consumed: observed.online_consumed,
        offline_dispatches,
        offline_per_s: offline_dispatches as f64 / secs,
        offline_gpus,
        held: None,
        schedule: None,
        interrupted: false,
        warnings,
    }
}

/// The first state's checks: the load runs, drives the online queues, and every metric matches.
fn check_first(config: &EvaluateConfig, load: &LoadRun, published: u64, queues: usize) -> Result<(), EvaluateError> {
    let tail = load.stderr_tail.clone();
    if load.not_found() {
        return Err(EvaluateError::LoadNotRunnable { command: config.load.command.clone(), tail });
    }
    if !load.succeeded() {
        return Err(EvaluateError::FirstLoadFailed { how: load.describe(), tail });
    }
    for m in &config.metrics {
        if m.extract(&load.output)?.is_none() {
            let lines: Vec<&str> = load.output.lines().rev().take(5).collect();
            let tail = lines.into_iter().rev().collect::<Vec<_>>().join("\n");
            return Err(EvaluateError::MetricNeverMatched { metric: m.to_string(), tail });
        }
    }
    if published == 0 {
        return Err(EvaluateError::NothingDriven { queues });
    }
    Ok(())
}

/// The scheduler for one state: the tracer (or sysfs) discovery, started first.
fn start_scheduler(
    config: &EvaluateConfig,
    traced: &mut bool,
    progress: &mut dyn Progress,
) -> Result<Scheduler, EvaluateError> {
    let s = &config.schedule;
    let discovery: Box<dyn Discovery> = if *traced {
        match TracerDiscovery::start(&TracerOptions { roots: s.roots.clone(), ..TracerOptions::default() }) {
            Ok(t) => Box::new(t),
            Err(e) => {
                progress.note(&format!(
                    "the tracer could not attach ({e}); the scheduled states run without the driver's side"
                ));
                *traced = false;
                Box::new(SysfsDiscovery::new(s.roots.clone()))
            }
        }
    } else {
        Box::new(SysfsDiscovery::new(s.roots.clone()))
    };
    let mut emit = |e: &ScheduleEvent| progress.schedule_event(e);
    Ok(Scheduler::start(s.clone(), Seams::host(s.roots.clone(), discovery), &mut emit)?)
}

/// Run the load with the observer on, on this thread; `state_over` is set when it ended.
fn load_and_observe(
    config: &EvaluateConfig,
    prepared: &Prepared,
    stop: &AtomicBool,
    state_over: &AtomicBool,
    ticker: Option<Ticker>,
) -> (Result<LoadRun, EvaluateError>, Observed) {
    let tick = ticker.map(|t| (config.progress_every, t));
    let obs = Observation::start(&prepared.online, &prepared.offline, config.sample, tick);
    let load = config.load.run(config.state_timeout, stop).map_err(EvaluateError::from);
    let observed = obs.finish();
    state_over.store(true, Ordering::Relaxed);
    (load, observed)
}

/// One state: its run and, for the first state, its checks.
fn run_state(
    config: &EvaluateConfig,
    prepared: &Prepared,
    step: Step,
    longest_load: Duration,
    traced: &mut bool,
    stop: &AtomicBool,
    progress: &mut dyn Progress,
) -> Result<(StateRun, Option<LoadRun>), EvaluateError> {
    let state_over = AtomicBool::new(false);
    let ticker = progress.ticker();
    // The offline log from the state's start; read when it ends.
    let window = config.offline_log.as_deref().map(LogWindow::open);
    let log_text = move || window.map(|w| w.and_then(|w| w.read()));
    match step.state {
        State::CoLocated => {
            let (load, observed) = load_and_observe(config, prepared, stop, &state_over, ticker);
            let load = load?;
            Ok((state_run(step, observed, Some(&load), config, log_text()), Some(load)))
        }
        State::OnlineAlone => {
            let pids: Vec<HostPid> = prepared.offline.iter().map(|w| w.pid).collect();
            let hold = Hold::start(&pids, &config.schedule.session)
                .map_err(|(pid, cause)| EvaluateError::Hold { pid, cause })?;
            let queues = hold.queues;
            // The observer starts once every queue is held and ends before any is resumed.
            let (load, observed) = load_and_observe(config, prepared, stop, &state_over, ticker);
            let released = hold.release();
            let load = load?;
            let mut run = state_run(step, observed, Some(&load), config, log_text());
            run.held = Some(Held {
                processes: released.processes,
                queues_suspended: queues,
                queues_resumed: released.queues_resumed,
                cpu_threads_ran: true,
            });
            if released.gone > 0 {
                run.warnings.push(format!("{} offline process(es) had exited when released", released.gone));
            }
            Ok((run, Some(load)))
        }
        State::Scheduled => {
            let scheduler = start_scheduler(config, traced, progress)?;
            // The scheduler runs on this thread until the load, on a scoped thread, ends.
            let (outcome, report) = std::thread::scope(|scope| {
                let worker = scope.spawn(|| load_and_observe(config, prepared, stop, &state_over, ticker));
                let mut emit = |e: &ScheduleEvent| progress.schedule_event(e);
                let report: ScheduleReport = scheduler.run(&state_over, &mut emit);
                (worker.join(), report)
            });
            let (load, observed) = outcome.map_err(|_| EvaluateError::ThreadPanicked)?;
            let load = load?;
            let mut run = state_run(step, observed, Some(&load), config, log_text());
            if report.reaction_panicked {
                run.warnings.push("schedule's reaction thread panicked; it resumed and detached everything".into());
            }
            run.schedule = Some(Box::new(report));
            Ok((run, Some(load)))
        }
        State::OfflineAlone => {
            let tick = ticker.map(|t| (config.progress_every, t));
            let obs = Observation::start(&prepared.online, &prepared.offline, config.sample, tick);
            let until = Instant::now() + longest_load;
            while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(10).min(until.saturating_duration_since(Instant::now())));
            }
            Ok((state_run(step, obs.finish(), None, config, log_text()), None))
        }
    }
}

/// Run the evaluation until its plan is done, `stop` is set (Ctrl-C) or an error ends it. An
/// error before anything was held (bad input, a load command or metric that fails in the first
/// state) is returned as such; after that the report says how it ended.
pub fn evaluate(
    config: &EvaluateConfig,
    stop: &AtomicBool,
    progress: &mut dyn Progress,
) -> Result<EvaluationReport, EvaluateError> {
    let prepared = prepare(config, progress)?;
    let mut facts_of: Vec<(HostPid, &'static str)> = prepared.online.iter().map(|w| (w.pid, "online")).collect();
    facts_of.extend(prepared.offline.iter().map(|w| (w.pid, "offline")));
    let host = host_facts::collect(&config.schedule.roots, &config.schedule.session.device, &facts_of);
    let steps = plan(config.rounds);
    let online_queues: usize = prepared.online.iter().map(|w| w.queues.len()).sum();
    let mut runs: Vec<StateRun> = Vec::new();
    let mut longest = Duration::ZERO;
    let mut traced = config.trace;
    let mut ended = Ended::Completed;
    for (i, &step) in steps.iter().enumerate() {
        if stop.load(Ordering::Relaxed) {
            ended = Ended::Interrupted { signal: None };
            break;
        }
        progress.state_started(i, steps.len(), step);
        let result = run_state(config, &prepared, step, longest, &mut traced, stop, progress);
        let (mut run, load) = match result {
            Ok(r) => r,
            // Nothing measured yet: the error is the answer.
            Err(e) if runs.is_empty() => return Err(e),
            Err(e) => {
                ended = Ended::Failed { error: e.to_string() };
                break;
            }
        };
        if i == 0
            && let Some(load) = &load
        {
            // An interrupted first run proves nothing about the input; it is reported as is.
            if !stop.load(Ordering::Relaxed) {
                check_first(config, load, run.online_dispatches, online_queues)?;
            }
        }
        if let Some(load) = &load {
            longest = longest.max(load.duration);
        }
        run.interrupted = stop.load(Ordering::Relaxed);
        progress.state_ended(&run);
        runs.push(run);
    }
    if stop.load(Ordering::Relaxed) && !matches!(ended, Ended::Failed { .. }) {
        ended = Ended::Interrupted { signal: None };
    }
    let mut notes = Vec::new();
    if runs.iter().any(|r| r.held.is_some()) {
        notes.push(HOLD_NOTE.to_owned());
    }
    if runs.iter().any(|r| r.schedule.is_some()) && !traced {
        notes.push("scheduled: without the tracer, the driver's side of the transitions is not reported".into());
    }
    Ok(EvaluationReport {
        version: REPORT_VERSION,
        host,
        online: prepared.online.iter().map(|w| w.pid).collect(),
        offline: prepared.offline.iter().map(|w| w.pid).collect(),
        load: config.load.command.clone(),
        metrics: config.metrics.clone(),
        offline_log: config.offline_log.clone(),
        offline_metrics: config.offline_metrics.clone(),
        rounds: config.rounds,
        summary: summarise(&runs, &config.metrics, &config.offline_metrics),
        arrival: arrival_summary(&runs),
        runs,
        ended,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(metrics: &[&str], offline: &[&str], log: Option<std::path::PathBuf>) -> EvaluateConfig {
        EvaluateConfig {
            schedule: ScheduleConfig::default(),
            load: LoadCommand { command: "true".into() },
            metrics: metrics.iter().map(|m| m.parse().unwrap()).collect(),
            offline_log: log,
            offline_metrics: offline.iter().map(|m| m.parse().unwrap()).collect(),
            rounds: 1,
            state_timeout: Duration::from_secs(1),
            sample: Duration::from_millis(1),
            trace: false,
            progress_every: Duration::from_secs(10),
        }
    }

    #[test]
    fn figure_names_are_unique_and_the_offline_log_must_be_readable_before_anything_runs() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("train.log");
        std::fs::write(&log, "").unwrap();
        assert!(check_figures(&config(&["p99=x ([0-9]+)"], &["sps=y ([0-9]+)"], Some(log.clone()))).is_ok());
        let twice = check_figures(&config(&["p=x ([0-9]+)"], &["p=y ([0-9]+)"], Some(log.clone())));
        assert!(matches!(twice, Err(EvaluateError::FigureNameTwice(ref n)) if n == "p"), "{twice:?}");
        let missing = check_figures(&config(&[], &["sps=y ([0-9]+)"], Some(dir.path().join("none.log"))));
        let Err(e @ EvaluateError::OfflineLog { .. }) = missing else { panic!("{missing:?}") };
        assert!(e.to_string().contains("none.log: No such file or directory"), "{e}");
    }
}
