//! Output sinks over the event stream: thin formatting, no tracing logic.

pub mod clock;
pub mod console;
pub mod jsonl;

use crate::trace::{decode::Event, stream::Losses};

/// Something that shows events and the closing summary.
pub trait Sink {
    fn event(&mut self, event: &Event) -> std::io::Result<()>;
    fn summary(&mut self, summary: &TraceSummary) -> std::io::Result<()>;
}

/// What a trace saw, printed at its end.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TraceSummary {
    /// Events delivered (after filters).
    pub events: u64,
    /// Records lost, all causes.
    pub dropped: u64,
    pub losses: Losses,
    pub duration_ms: u64,
}
