//! `gpreempt evaluate --online SEL --offline SEL… --load COMMAND`: the evaluation of the library
//! (`gpreempt::evaluate`) behind progress lines on stderr and the report as a table, Markdown or
//! JSON.

use super::stderr::errln;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use gpreempt::{
    controller::vocabulary::Options,
    evaluate::{
        self, EvaluateConfig, Progress, Step, Ticker, render,
        report::{Ended, StateRun},
    },
    host::roots::Roots,
    schedule::{ScheduleConfig, ScheduleEvent},
};

use super::{interrupt, stdout::outln};
use crate::cli::EvaluateArgs;

/// Progress on stderr: a line per state as it starts and ends, one every [`PROGRESS_EVERY`]
/// while it runs, and what schedule says that a user must know (attach failures, warnings). Its
/// per-transition events stay in the report.
struct Lines;

impl Progress for Lines {
    fn state_started(&mut self, index: usize, total: usize, step: Step) {
        errln!("gpreempt: [{}/{total}] round {}: {}…", index + 1, step.round, step.state);
    }

    fn state_ended(&mut self, run: &StateRun) {
        let load = run.load.as_ref().map_or_else(String::new, |l| format!("load {}, ", l.message));
        let metrics: Vec<String> = run.metrics.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let delay = run
            .online_dispatch_delay_us
            .as_ref()
            .map_or_else(String::new, |s| format!(", online delay p99 {:.0} us", s.p99));
        errln!(
            "gpreempt:   {:.1} s, {load}{} online dispatches{delay}, offline {:.1} dispatches/s{}{}",
            run.duration_ms / 1e3,
            run.online_dispatches,
            run.offline_per_s,
            if metrics.is_empty() { String::new() } else { format!(", {}", metrics.join(" ")) },
            if run.interrupted { " (interrupted)" } else { "" },
        );
        for w in &run.warnings {
            errln!("gpreempt:   warning: {w}");
        }
    }

    fn schedule_event(&mut self, e: &ScheduleEvent) {
        match e {
            ScheduleEvent::OfflineAttachFailed { pid, error } => {
                errln!("gpreempt:   schedule: offline pid {pid} not attached: {error}");
            }
            ScheduleEvent::WatchdogResumed { pid, held_ms, .. } => {
                errln!("gpreempt:   schedule: the watchdog resumed offline pid {pid} after {held_ms} ms");
            }
            ScheduleEvent::Warning { message } => errln!("gpreempt:   schedule: warning: {message}"),
            _ => {}
        }
    }

    fn note(&mut self, message: &str) {
        errln!("gpreempt: {message}");
    }

    fn ticker(&mut self) -> Option<Ticker> {
        Some(Box::new(|live| {
            let secs = live.elapsed.as_secs_f64();
            errln!(
                "gpreempt:   {secs:.0} s: {} online dispatches, offline {:.1} dispatches/s",
                live.online_published,
                if secs > 0.0 { live.offline_consumed as f64 / secs } else { 0.0 },
            );
        }))
    }
}

/// A state of a minute or more says how far it has come this often.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

pub fn run(args: &EvaluateArgs) -> Result<()> {
    let stop = interrupt::install()?;
    // --load was checked while parsing (cli::parse_load): a typo is a usage error.
    let load = args.load.clone();
    let roots = Roots::default();
    let session = Options::default();
    let config = EvaluateConfig {
        schedule: ScheduleConfig {
            // The scheduler's own interval records are not shown; its summary is kept per state.
            interval: Duration::from_secs(3600),
            roots,
            session,
            ..args.settings.config(args.online.clone(), args.offline.clone())
        },
        load,
        metrics: args.metric.clone(),
        offline_log: args.offline_log.clone(),
        offline_metrics: args.offline_metric.clone(),
        rounds: args.rounds,
        state_timeout: args.state_timeout,
        sample: args.sample.max(Duration::from_micros(50)),
        trace: !args.no_trace,
        progress_every: PROGRESS_EVERY,
    };
    let mut report = evaluate::evaluate(&config, stop, &mut Lines)?;
    if let Ended::Interrupted { signal } = &mut report.ended {
        *signal = interrupt::received();
    }
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(path) = &args.output {
        gpreempt::output::file::write_atomically(path, json.as_bytes())
            .with_context(|| format!("writing the report to {}", path.display()))?;
    }
    if args.json {
        super::stdout::json(&json);
    } else if args.markdown {
        outln!("{}", render::markdown(&report).trim_end());
    } else {
        outln!("{}", render::terminal(&report).trim_end());
    }
    match &report.ended {
        Ended::Completed => {}
        Ended::Interrupted { .. } => bail!(
            "interrupted by {} after {} state run(s); everything was released",
            interrupt::received().unwrap_or_else(|| "a signal".into()),
            report.runs.len()
        ),
        Ended::Failed { error } => bail!("stopped after {} state run(s): {error}", report.runs.len()),
    }
    let failed: Vec<String> = report
        .runs
        .iter()
        .filter(|r| r.load.as_ref().is_some_and(|l| !l.succeeded))
        .map(|r| format!("round {} {}", r.round, r.state))
        .collect();
    if !failed.is_empty() {
        bail!(
            "the load command did not succeed in {} state(s): {}; see the warnings above",
            failed.len(),
            failed.join(", ")
        );
    }
    Ok(())
}
