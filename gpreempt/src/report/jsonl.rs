//! JSON Lines: one object per event (`"event"` names its kind), then one `"event": "summary"`.
//! Field names are part of the interface (docs/guide/json.md).

use std::io::Write;

use serde::Serialize;

use super::{Sink, TraceSummary};
use crate::{
    clock::WallClock,
    domain::HostPid,
    event::Event,
    model::{Model, QueueMap, registry::ProcessEntry, spans::Span},
};

pub struct JsonLines<W: Write> {
    out: W,
    clock: WallClock,
}

impl<W: Write> JsonLines<W> {
    pub fn new(out: W, clock: WallClock) -> Self {
        Self { out, clock }
    }

    /// One object, one line. Events wait for the batch's flush; the rare records (start, map,
    /// summary) are flushed at once so a reader sees them when they happen.
    fn line(&mut self, value: &impl Serialize, flush: bool) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.out, value)?;
        self.out.write_all(b"\n")?;
        if flush { self.out.flush() } else { Ok(()) }
    }
}

#[derive(Serialize)]
struct Timed<'a> {
    time: String,
    duration_ns: u64,
    #[serde(flatten)]
    event: &'a Event,
}

/// `{"event":"span","span":"suspend",…}`; `pid` is the target (0 when unknown) so recordings
/// stay readable by `gpreempt analyze`.
#[derive(Serialize)]
struct SpanObject<'a> {
    event: &'static str,
    time: String,
    pid: HostPid,
    #[serde(flatten)]
    span: &'a Span,
}

/// `{"event":"queue_map","ts_ns":…,"processes":[…]}`
#[derive(Serialize)]
struct MapObject<'a> {
    event: &'static str,
    ts_ns: u64,
    processes: &'a [&'a ProcessEntry],
}

#[derive(Serialize)]
struct Summary<'a> {
    event: &'static str,
    #[serde(flatten)]
    summary: &'a TraceSummary,
}

impl<W: Write> Sink for JsonLines<W> {
    fn event(&mut self, event: &Event) -> std::io::Result<()> {
        let timed = Timed { time: self.clock.rfc3339(event.ts_ns), duration_ns: event.duration_ns(), event };
        self.line(&timed, false)
    }

    fn span(&mut self, span: &Span, _model: &Model) -> std::io::Result<()> {
        let obj = SpanObject {
            event: "span",
            time: self.clock.rfc3339(span.start_ns),
            pid: span.target_pid.unwrap_or_default(),
            span,
        };
        self.line(&obj, false)
    }

    /// `{"event":"start","command":[…],"pid":…}`: what `gpreempt analyze` reads to name a run.
    fn start(&mut self, command: &[String], pid: HostPid) -> std::io::Result<()> {
        self.line(&serde_json::json!({"event": "start", "command": command, "pid": pid}), true)
    }

    fn queue_map(&mut self, map: &QueueMap<'_>) -> std::io::Result<()> {
        self.line(&MapObject { event: "queue_map", ts_ns: map.ts_ns, processes: &map.processes }, true)
    }

    fn summary(&mut self, summary: &TraceSummary) -> std::io::Result<()> {
        self.line(&Summary { event: "summary", summary }, true)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use gpreempt_common::record::{QueueDestroyRecord, RecordKind};

    use super::*;
    use crate::{
        event::Losses,
        trace::decode::{
            decode,
            tests::{bytes_of, header},
        },
    };

    #[test]
    fn writes_one_object_per_line_and_a_summary() {
        let mut out = Vec::new();
        let mut sink = JsonLines::new(&mut out, WallClock::from_offset(0));
        let d = QueueDestroyRecord {
            header: header(RecordKind::QueueDestroy, 9, "y"),
            queue_id: 42,
            context_id: gpreempt_common::record::CONTEXT_ID_PRIMARY,
            ret: 0,
        };
        sink.event(&decode(&bytes_of(&d)).unwrap()).unwrap();
        let losses = Losses { ringbuf_full: 2, ..Default::default() };
        sink.summary(&TraceSummary { events: 1, dropped: 2, losses, duration_ms: 10, ..Default::default() }).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["event"], "queue_destroy");
        assert_eq!(lines[0]["queue_id"], 42);
        assert_eq!(lines[0]["result"], "OK");
        assert_eq!(lines[0]["duration_ns"], 3500);
        assert_eq!(lines[0]["time"], "1970-01-01T00:00:00.000004Z");
        assert_eq!(lines[1]["event"], "summary");
        assert_eq!(lines[1]["events"], 1);
        assert_eq!(lines[1]["dropped"], 2);
        assert_eq!(lines[1]["losses"]["ringbuf_full"], 2);
    }

    #[test]
    fn a_span_keeps_its_field_names_and_values() {
        use crate::{
            domain::{EvictionTrigger, GpuId},
            model::spans::SpanKind,
        };
        let span = Span {
            kind: SpanKind::Eviction,
            target_pid: Some(HostPid(42)),
            gpu_id: Some(GpuId(0xa)),
            start_ns: 1_000,
            end_ns: 4_000,
            duration_ns: 3_000,
            trigger: Some(EvictionTrigger::Ttm),
            queues: vec![],
            rejected: vec![],
            collateral: vec![],
            breakdown: None,
            phases: vec![],
            open: true,
        };
        let mut out = Vec::new();
        JsonLines::new(&mut out, WallClock::from_offset(0)).span(&span, &Model::new(None)).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"event": "span", "time": "1970-01-01T00:00:00.000001Z", "pid": 42, "span": "eviction",
                "target_pid": 42, "gpu_id": 10, "start_ns": 1000, "end_ns": 4000, "duration_ns": 3000,
                "trigger": "ttm", "queues": [], "rejected": [], "collateral": [], "phases": [], "open": true})
        );
    }

    #[test]
    fn the_map_is_one_object_with_every_queue() {
        use crate::test_support::{create, ev};
        let mut m = Model::new(None);
        m.apply(&ev(10, 1, create(3, 0x1234)));
        let mut out = Vec::new();
        JsonLines::new(&mut out, WallClock::from_offset(0)).queue_map(&m.snapshot(5, |_| true)).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!((json["event"].as_str(), json["ts_ns"].as_u64()), (Some("queue_map"), Some(5)));
        assert_eq!(json["processes"][0]["pid"], 10);
        assert_eq!(json["processes"][0]["queues"]["3"]["state"], "active");
        assert_eq!(json["processes"][0]["queues"]["3"]["gpu_id"], 0x1234);
        assert!(json["processes"][0].get("exited_ns").is_none());
    }
}
