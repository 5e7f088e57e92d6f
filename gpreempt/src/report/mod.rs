//! Output sinks over the event stream: formatting only, no tracing logic. Each sink receives the
//! filtered events and closed spans, the live queue map on request and the closing summary
//! from [`crate::pipeline::Pipeline`].

pub mod console;
pub mod jsonl;
pub mod perfetto;
pub mod summary;

use serde::Serialize;

use crate::{
    domain::HostPid,
    event::{Event, Losses},
    host::procinfo::Container,
    model::{
        Model, QueueMap, QueueNotice,
        registry::Churn,
        spans::{EvictionStats, Latency, Span},
    },
};

/// Something that shows events, spans, the queue map and the closing summary. Every method has
/// a do-nothing default, so a sink implements only what it shows.
pub trait Sink {
    fn event(&mut self, _event: &Event) -> std::io::Result<()> {
        Ok(())
    }
    /// A closed span; `model` names the processes it involves.
    fn span(&mut self, _span: &Span, _model: &Model) -> std::io::Result<()> {
        Ok(())
    }
    /// A queue appeared or went, in full, as the model derived it (its process passed the
    /// filter): a sink that draws queue lifetimes takes them here, not from the raw records.
    fn queue(&mut self, _queue: &QueueNotice, _model: &Model) -> std::io::Result<()> {
        Ok(())
    }
    /// The live queue map (on SIGUSR1, every `--map-interval`, and at the end).
    fn queue_map(&mut self, _map: &QueueMap<'_>) -> std::io::Result<()> {
        Ok(())
    }
    fn summary(&mut self, _summary: &TraceSummary) -> std::io::Result<()> {
        Ok(())
    }
    /// Push buffered output out: called once per ring-buffer batch, not per event, so a busy
    /// trace costs one write(2) per batch instead of one per line.
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
    /// `trace -- CMD` started `command` as host pid `pid`.
    fn start(&mut self, _command: &[String], _pid: HostPid) -> std::io::Result<()> {
        Ok(())
    }
    /// The stream ended at `end_ns` (CLOCK_BOOTTIME), after the summary: write what is written
    /// once (a whole-document format) and flush.
    fn finish(&mut self, _end_ns: u64) -> std::io::Result<()> {
        self.flush()
    }
}

/// One process in the exit summary.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcessSummary {
    pub pid: HostPid,
    pub comm: Option<String>,
    pub container: Option<Container>,
    /// Queues it holds at the end (0 once it exited).
    pub queues: u64,
    pub exited: bool,
    #[serde(flatten)]
    pub churn: Churn,
    /// Eviction → restore spans of this process.
    pub eviction_time: EvictionStats,
}

/// What a trace saw, printed at its end.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TraceSummary {
    /// Events delivered (after filters).
    pub events: u64,
    /// Records lost, all causes.
    pub dropped: u64,
    pub losses: Losses,
    pub duration_ms: u64,
    pub processes: Vec<ProcessSummary>,
    /// Debugger suspend/resume latency (`suspend_queues` / `resume_queues` entry → return).
    pub suspend: Latency,
    pub resume: Latency,
    /// `amdkfd_fence_wait_timeout`: HWS preemption latency.
    pub fence_wait: Latency,
    /// Other processes' queues preempted by device-wide unmaps of suspends/resumes.
    pub collateral_queues: u64,
    pub evictions: EvictionStats,
}

impl TraceSummary {
    /// Fill the per-process and latency parts from the model (`keep` filters processes).
    pub fn add_model(&mut self, model: &Model, mut keep: impl FnMut(HostPid) -> bool) {
        let (registry, spans) = (model.registry(), model.spans());
        let entries = registry
            .processes
            .values()
            .map(|p| (p, false))
            .chain(registry.finished.iter().map(|p| (p, true)))
            .filter(|(p, _)| keep(p.pid));
        for (p, exited) in entries {
            let eviction_time = spans.evictions.get(&p.pid).cloned().unwrap_or_default();
            self.evictions.count += eviction_time.count;
            self.evictions.total_ns += eviction_time.total_ns;
            self.evictions.max_ns = self.evictions.max_ns.max(eviction_time.max_ns);
            self.processes.push(ProcessSummary {
                pid: p.pid,
                comm: p.comm.clone(),
                container: p.container.clone(),
                queues: if exited { 0 } else { p.queues.len() as u64 },
                exited,
                churn: p.churn.clone(),
                eviction_time,
            });
        }
        self.suspend = spans.suspend_ns.latency();
        self.resume = spans.resume_ns.latency();
        self.fence_wait = spans.fence_wait_ns.latency();
        self.collateral_queues = spans.collateral_queues;
    }
}
