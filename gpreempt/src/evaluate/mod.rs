//! `gpreempt evaluate`: what gpreempt does for a user's own service and training job on their
//! own GPUs, measured with no change to either. The user's load command runs once per state and
//! round; the states are the online service alone (the offline processes held suspended), next
//! to the offline jobs (co-located), under `schedule`, and the offline jobs alone.
//!
//! - [`state`]: the states, defined once, and their names;
//! - [`plan`]: the states' order (rotated between rounds);
//! - [`metric`]: the user's figures in the load command's output (`--metric NAME=REGEX`,
//!   `NAME=json:PATH`);
//! - [`load`]: the load command, checked and run;
//! - [`observe`]: what is measured from outside in every state (AQL indices);
//! - [`offline_log`]: the part of the offline job's log written during a state (`--offline-log`);
//! - [`hold`]: the offline processes held suspended for the online-alone state;
//! - [`ranks`]: whether an offline process is a rank of a data-parallel job (warned before a hold);
//! - [`host_facts`]: kernel, KFD, GPUs, ROCm versions;
//! - [`run`]: the evaluation; [`report`]: its record, the summary over the rounds and the arrival
//!   path per online process; [`render`]: the terminal table and Markdown.

pub mod hold;
pub mod host_facts;
pub mod load;
pub mod metric;
pub mod observe;
pub mod offline_log;
pub mod plan;
pub mod ranks;
pub mod render;
pub mod report;
pub mod run;
pub mod state;

pub use self::{
    load::{LoadCommand, LoadError},
    metric::{MetricError, MetricSpec},
    observe::{Live, Ticker},
    plan::Step,
    report::EvaluationReport,
    run::{EvaluateConfig, Progress, evaluate},
    state::{BenchState, State, UnknownState},
};
use crate::{
    controller::vocabulary::DebugError,
    domain::HostPid,
    schedule::{Role, ScheduleError},
};

/// Why an evaluation could not start or go on: cause and fix.
#[derive(Debug, thiserror::Error)]
pub enum EvaluateError {
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    #[error(
        "--{role} {selectors}: no KFD process runs there now; evaluate measures running processes: start the \
         {role} {what} first (see `gpreempt ps`)",
        what = if *role == Role::Online { "service" } else { "job" }
    )]
    NoProcess { role: Role, selectors: String },
    #[error("--{role} {pid}: its queues could not be learnt: {cause}")]
    Learn { role: Role, pid: HostPid, cause: DebugError },
    #[error(
        "--online pid(s) {0}: no GPU queue yet, so nothing of its work can be seen; have the service serve one \
         request (it creates its queues) and run evaluate again"
    )]
    NoOnlineQueues(String),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(
        "--load {command:?}: the shell could not find or execute its program (status 126/127){}; nothing was held",
        tail_text(tail)
    )]
    LoadNotRunnable { command: String, tail: String },
    #[error(
        "the load command {how} in the first (co-located) state{}; fix it so that it succeeds alone, nothing was held",
        tail_text(tail)
    )]
    FirstLoadFailed { how: String, tail: String },
    #[error(
        "--metric {metric} never matched the load command's output in the first (co-located) state, so it would \
         measure nothing; nothing was held. Fix the regex or JSON path against the output (its last lines:{})",
        if tail.is_empty() { " none".to_owned() } else { format!("\n{tail}") }
    )]
    MetricNeverMatched { metric: String, tail: String },
    #[error(transparent)]
    Metric(#[from] MetricError),
    #[error(
        "the load command ran, but the online processes' {queues} queue(s) published no dispatch meanwhile: is \
         --load aimed at the --online service? (queues the service created after evaluate started are not \
         watched); nothing was held"
    )]
    NothingDriven { queues: usize },
    #[error(
        "--offline-log {}: {cause}; give the file the offline job writes its progress to (readable by root), or \
         leave out --offline-log and --offline-metric",
        path.display()
    )]
    OfflineLog { path: std::path::PathBuf, cause: std::io::Error },
    #[error(
        "the figure name {0:?} is given twice (each --metric and --offline-metric names a column and a JSON key): \
         rename one"
    )]
    FigureNameTwice(String),
    #[error("holding offline pid {pid} for the online-alone state failed: {cause}; everything held was released")]
    Hold { pid: HostPid, cause: DebugError },
    #[error("a thread of the scheduled state panicked (message above); everything was released")]
    ThreadPanicked,
}

fn tail_text(tail: &str) -> String {
    if tail.is_empty() { String::new() } else { format!("; its stderr ended with:\n{tail}") }
}
