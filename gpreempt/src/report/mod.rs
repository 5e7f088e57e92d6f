//! Output sinks over the event stream: thin formatting, no tracing logic.

pub mod clock;
pub mod console;
pub mod jsonl;
pub mod perfetto;

use serde::Serialize;

use crate::{
    model::{
        procinfo::Container,
        registry::{Churn, Registry},
        spans::{EvictionStats, Latency, Span, SpanTracker},
    },
    trace::{decode::Event, stream::Losses},
};

/// Something that shows events, spans, the queue map and the closing summary.
pub trait Sink {
    fn event(&mut self, event: &Event) -> std::io::Result<()>;
    fn span(&mut self, _span: &Span) -> std::io::Result<()> {
        Ok(())
    }
    /// The live map: `text` for humans, `json` (`{"event":"queue_map",…}`) for machines.
    fn queue_map(&mut self, _text: &str, _json: &serde_json::Value) -> std::io::Result<()> {
        Ok(())
    }
    fn summary(&mut self, summary: &TraceSummary) -> std::io::Result<()>;
    /// Push buffered output out: called once per ring-buffer batch, not per event, so a busy
    /// trace costs one write(2) per batch instead of one per line.
    fn flush(&mut self) -> std::io::Result<()>;
    /// `trace -- CMD` started `command` as host pid `pid`.
    fn start(&mut self, _command: &[String], _pid: u32) -> std::io::Result<()> {
        Ok(())
    }
}

/// One process in the exit summary.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcessSummary {
    pub pid: u32,
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
    pub fn add_model(&mut self, registry: &Registry, spans: &SpanTracker, mut keep: impl FnMut(u32) -> bool) {
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
        self.suspend = Latency::of(&spans.suspend_ns);
        self.resume = Latency::of(&spans.resume_ns);
        self.fence_wait = Latency::of(&spans.fence_wait_ns);
        self.collateral_queues = spans.collateral_queues;
    }
}
