//! Chrome trace-event JSON (`{"traceEvents":[…]}`) that ui.perfetto.dev and chrome://tracing
//! open: one track (process) per host pid with a thread per queue (named by its [`QueueKey`]:
//! `queue 3`, `queue context_0/3` for a secondary KFD context's, Linux 7.0), a track per GPU for
//! the HWS/MES calls, and complete ("X") events for evictions, suspends/resumes, fence waits and
//! queue lifetimes. Written once, at the end (the format is one JSON document).

use std::{collections::BTreeMap, io::Write};

use gpreempt_common::record::KfdFn;
use serde_json::{Value, json};

use super::Sink;
use crate::{
    domain::HostPid,
    event::{Event, EventKind},
    host::sysfs::KfdContext,
    model::{
        Model, QueueNotice,
        registry::QueueKey,
        spans::{Span, SpanKind},
    },
};

/// Pseudo pids for the GPU tracks (above any real pid: PID_MAX_LIMIT is 2^22).
const GPU_TRACK_BASE: u64 = 1 << 30;
/// Thread ids of per-queue tracks inside a process track: the primary context's queues from
/// here, each secondary context's ([`queue_tid`]) in a block of [`QUEUE_IDS`] after it.
const QUEUE_TID_BASE: u64 = 1 << 24;
/// Queue ids per KFD context (`KFD_MAX_NUM_OF_QUEUES_PER_PROCESS`: ids are < 1024).
const QUEUE_IDS: u64 = 1024;
/// The process-level thread of a process track.
const PROCESS_TID: u64 = 0;

/// The thread id of queue `key`'s track: distinct per context and id, below 2^31 for every
/// context id (0..0xFFFE).
fn queue_tid(key: QueueKey) -> u64 {
    let block = match key.context {
        KfdContext::Primary => 0,
        KfdContext::Secondary(id) => 1 + u64::from(id),
    };
    QUEUE_TID_BASE + block * QUEUE_IDS + u64::from(key.queue_id)
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// Collects trace events; writes the document to `out` when the stream ends.
#[derive(Debug)]
pub struct Perfetto<W: Write> {
    out: W,
    events: Vec<Value>,
    names: BTreeMap<(u64, Option<u64>), String>,
    /// Open queue lifetimes: (pid, queue) → created at.
    queues: BTreeMap<(HostPid, QueueKey), u64>,
}

impl<W: Write> Sink for Perfetto<W> {
    fn event(&mut self, event: &Event) -> std::io::Result<()> {
        self.record_event(event);
        Ok(())
    }

    fn span(&mut self, span: &Span, model: &Model) -> std::io::Result<()> {
        self.record_span(span, |pid| model.comm_of(pid).map(str::to_owned));
        Ok(())
    }

    fn queue(&mut self, queue: &QueueNotice, model: &Model) -> std::io::Result<()> {
        self.record_queue(queue, model.comm_of(queue.pid()));
        Ok(())
    }

    fn finish(&mut self, end_ns: u64) -> std::io::Result<()> {
        self.write(end_ns)
    }
}

impl<W: Write> Perfetto<W> {
    pub fn new(out: W) -> Self {
        Self { out, events: Vec::new(), names: BTreeMap::new(), queues: BTreeMap::new() }
    }

    fn name_process(&mut self, pid: u64, name: String) {
        self.names.entry((pid, None)).or_insert(name);
    }

    fn name_thread(&mut self, pid: u64, tid: u64, name: String) {
        self.names.entry((pid, Some(tid))).or_insert(name);
    }

    /// A complete event on `track` = (pid, tid).
    fn complete(&mut self, name: &str, cat: &str, track: (u64, u64), start_ns: u64, end_ns: u64, args: Value) {
        let (pid, tid) = track;
        self.events.push(json!({
            "name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid,
            "ts": us(start_ns), "dur": us(end_ns.saturating_sub(start_ns)), "args": args,
        }));
    }

    fn instant(&mut self, name: &str, cat: &str, pid: u64, tid: u64, ts_ns: u64, args: Value) {
        self.events.push(json!({
            "name": name, "cat": cat, "ph": "i", "s": "t", "pid": pid, "tid": tid, "ts": us(ts_ns), "args": args,
        }));
    }

    fn queue_track(&mut self, pid: HostPid, key: QueueKey) -> u64 {
        let tid = queue_tid(key);
        self.name_thread(u64::from(pid), tid, format!("queue {key}"));
        tid
    }

    fn process_track(&mut self, pid: HostPid, comm: Option<&str>) -> u64 {
        let p = u64::from(pid);
        self.name_process(p, format!("{} {pid}", comm.unwrap_or("pid")));
        self.name_thread(p, PROCESS_TID, "process".to_owned());
        p
    }

    /// One traced event: HWS calls on the GPU track, debug-trap calls, alarms.
    fn record_event(&mut self, e: &Event) {
        match &e.kind {
            EventKind::KfdCall(c) => {
                let (pid, tname) = match c.gpu_id {
                    Some(g) => (GPU_TRACK_BASE + u64::from(g), format!("GPU {g:#x}")),
                    None => (GPU_TRACK_BASE, "GPU (unknown id)".to_owned()),
                };
                self.name_process(pid, tname);
                let tid = u64::from(e.tid);
                self.name_thread(pid, tid, format!("{} {}", e.comm, e.tid));
                let name = if c.kfd_fn == KfdFn::FenceWaitTimeout { "fence wait" } else { c.function };
                self.complete(
                    name,
                    "hws",
                    (pid, tid),
                    e.entry_ns,
                    e.ts_ns,
                    json!({"owner_pid": c.owner_pid, "result": c.result.name()}),
                );
            }
            EventKind::GpuReset(r) => {
                self.name_process(GPU_TRACK_BASE, "GPU (unknown id)".to_owned());
                self.events.push(json!({"name": "GPU RESET", "cat": "alarm", "ph": "i", "s": "g", "pid": GPU_TRACK_BASE, "tid": 0, "ts": us(e.ts_ns), "args": {"alarm": r.alarm}}));
            }
            EventKind::DebugTrap(d) => {
                let p = self.process_track(e.pid, Some(&e.comm));
                self.complete(
                    &format!("dbg_trap {}", d.op),
                    "debug",
                    (p, PROCESS_TID),
                    e.entry_ns,
                    e.ts_ns,
                    json!({"target_pid": d.target_pid, "result": d.result.name(), "ret": d.ret}),
                );
            }
            _ => {}
        }
    }

    /// A queue's lifetime, from the model's notices (every KFD context's queues): an instant at
    /// its creation, a complete event from creation to its end (or the trace's).
    fn record_queue(&mut self, queue: &QueueNotice, comm: Option<&str>) {
        match *queue {
            QueueNotice::Created { pid, ts_ns, queue: q } => {
                let p = self.process_track(pid, comm);
                let tid = self.queue_track(pid, q.key());
                self.queues.insert((pid, q.key()), ts_ns);
                self.instant(
                    "create",
                    "queue",
                    p,
                    tid,
                    ts_ns,
                    json!({"gpu_id": q.gpu_id, "type": q.queue_type, "priority": q.priority}),
                );
            }
            QueueNotice::Gone { pid, key, ts_ns, .. } => self.end_queue(pid, key, ts_ns),
        }
    }

    fn end_queue(&mut self, pid: HostPid, key: QueueKey, ts_ns: u64) {
        if let Some(start) = self.queues.remove(&(pid, key)) {
            let tid = self.queue_track(pid, key);
            self.complete(&format!("queue {key}"), "queue", (u64::from(pid), tid), start, ts_ns, json!({}));
        }
    }

    /// One closed span: on the target's process track and on each affected queue's track (a
    /// suspend's and resume's queues are the primary context's: DBG_TRAP reaches no other; its
    /// collateral, any context's, each on its own queue's track).
    fn record_span(&mut self, s: &Span, comm_of: impl Fn(HostPid) -> Option<String>) {
        let Some(pid) = s.target_pid else { return };
        let p = self.process_track(pid, comm_of(pid).as_deref());
        let name = match s.kind {
            SpanKind::Eviction => "evicted",
            SpanKind::Suspend => "suspend",
            SpanKind::Resume => "resume",
        };
        let args = json!({
            "gpu_id": s.gpu_id, "trigger": s.trigger, "queues": s.queues, "rejected": s.rejected,
            "collateral": s.collateral, "breakdown": s.breakdown, "open": s.open,
        });
        self.complete(name, "span", (p, PROCESS_TID), s.start_ns, s.end_ns, args);
        for q in &s.queues {
            let tid = self.queue_track(pid, QueueKey::primary(*q));
            self.complete(name, "span", (p, tid), s.start_ns, s.end_ns, json!({}));
        }
        for c in &s.collateral {
            let cp = self.process_track(c.pid, comm_of(c.pid).as_deref());
            let tid = self.queue_track(c.pid, c.key());
            self.complete(
                "preempted (collateral)",
                "span",
                (cp, tid),
                s.start_ns,
                s.end_ns,
                json!({"by_pid": pid, "kind": name}),
            );
        }
    }

    /// Close queue lifetimes still open at `end_ns` and write the document.
    fn write(&mut self, end_ns: u64) -> std::io::Result<()> {
        let open: Vec<(HostPid, QueueKey)> = self.queues.keys().copied().collect();
        for (pid, q) in open {
            self.end_queue(pid, q, end_ns);
        }
        let mut events = Vec::with_capacity(self.names.len() + self.events.len());
        for ((pid, tid), name) in &self.names {
            events.push(match tid {
                None => json!({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}}),
                Some(tid) => json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}),
            });
        }
        events.append(&mut self.events);
        serde_json::to_writer(&mut self.out, &json!({"traceEvents": events, "displayTimeUnit": "ns"}))?;
        self.out.write_all(b"\n")?;
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::GpuId;
    use crate::{
        domain::QueueId,
        event::{KernelResult, QueueDestroy},
        model::{registry::Collateral, spans::Breakdown},
        test_support::{create, create_in, ev},
    };

    #[test]
    fn the_document_has_named_tracks_and_complete_spans() {
        let mut out = Vec::new();
        let mut p = Perfetto::new(&mut out);
        // The queues' lifetimes come from the model's notices, as the pipeline hands them out.
        let mut model = Model::new(None);
        let mut lifecycle = |e: Event, p: &mut Perfetto<&mut Vec<u8>>| {
            if let Some(q) = model.apply(&e).queue {
                p.queue(&q, &model).unwrap();
            }
        };
        lifecycle(ev(10, 1_000, create(3, 0xa)), &mut p);
        let destroy = QueueDestroy { queue_id: QueueId(3), context_id: None, result: KernelResult(0), ret: 0 };
        lifecycle(ev(10, 9_000, EventKind::QueueDestroy(destroy)), &mut p);
        lifecycle(ev(20, 2_000, create(0, 0xa)), &mut p);
        // Queue 3 of pid 10's secondary KFD context 0 (Linux 7.0): another queue, its own track.
        lifecycle(ev(10, 1_500, create_in(0, 3, 0xa)), &mut p);
        // Pid 20's secondary context 1 has a queue 0 too: the suspend's collateral besides its
        // primary queue 0, drawn on its own track.
        lifecycle(ev(20, 2_500, create_in(1, 0, 0xa)), &mut p);
        let span = Span {
            kind: SpanKind::Suspend,
            target_pid: Some(HostPid(10)),
            gpu_id: None,
            start_ns: 3_000,
            end_ns: 5_000,
            duration_ns: 2_000,
            trigger: None,
            queues: vec![QueueId(3)],
            rejected: vec![],
            collateral: vec![
                Collateral { pid: HostPid(20), queue_id: QueueId(0), context_id: None, gpu_id: Some(GpuId(0xa)) },
                Collateral { pid: HostPid(20), queue_id: QueueId(0), context_id: Some(1), gpu_id: Some(GpuId(0xa)) },
            ],
            breakdown: Some(Breakdown { unmap_ns: 1, fence_wait_ns: 1, remap_ns: 1, gpus: vec![GpuId(0xa)] }),
            phases: vec![],
            open: false,
        };
        p.record_span(&span, |pid| Some(format!("p{pid}")));
        let mut fence = ev(30, 4_500, EventKind::GpuReset(crate::event::GpuReset { alarm: "x" }));
        fence.kind = EventKind::KfdCall(crate::event::KfdCall {
            function: "amdkfd_fence_wait_timeout",
            kfd_fn: KfdFn::FenceWaitTimeout,
            owner_pid: None,
            gpu_id: Some(GpuId(0xa)),
            trigger: None,
            filter: None,
            filter_param: None,
            grace_period: None,
            fence_value: Some(1),
            timeout_ms: Some(9000),
            result: KernelResult(0),
            ret: 0,
        });
        fence.entry_ns = 3_500;
        p.record_event(&fence);
        p.finish(10_000).unwrap();
        drop(p);
        let doc: Value = serde_json::from_slice(&out).unwrap();
        let events = doc["traceEvents"].as_array().unwrap();
        let names = |ph: &str| -> Vec<(u64, u64, String)> {
            events
                .iter()
                .filter(|e| e["ph"] == ph)
                .map(|e| {
                    let n = if ph == "M" { e["args"]["name"].as_str() } else { e["name"].as_str() };
                    (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap(), n.unwrap().to_owned())
                })
                .collect()
        };
        let q = |id: u64| QUEUE_TID_BASE + id;
        let context_0 = |id: u64| QUEUE_TID_BASE + 1024 + id;
        let context_1 = |id: u64| QUEUE_TID_BASE + 2 * 1024 + id;
        let gpu = GPU_TRACK_BASE + 0xa;
        assert_eq!(
            names("M"),
            [
                (10, 0, "p10 10".to_owned()),
                (10, 0, "process".to_owned()),
                (10, q(3), "queue 3".to_owned()),
                (10, context_0(3), "queue context_0/3".to_owned()),
                (20, 0, "p20 20".to_owned()),
                (20, 0, "process".to_owned()),
                (20, q(0), "queue 0".to_owned()),
                (20, context_1(0), "queue context_1/0".to_owned()),
                (gpu, 0, "GPU 0xa".to_owned()),
                (gpu, 30, "p30 30".to_owned()),
            ]
        );
        let mut complete = names("X");
        complete.sort();
        assert_eq!(
            complete,
            [
                (10, 0, "suspend".to_owned()),
                (10, q(3), "queue 3".to_owned()),
                (10, q(3), "suspend".to_owned()),
                (10, context_0(3), "queue context_0/3".to_owned()),
                (20, q(0), "preempted (collateral)".to_owned()),
                (20, q(0), "queue 0".to_owned()),
                (20, context_1(0), "preempted (collateral)".to_owned()),
                (20, context_1(0), "queue context_1/0".to_owned()),
                (gpu, 30, "fence wait".to_owned()),
            ]
        );
        // Times are µs; durations of complete events are non-negative; every event has a phase.
        let suspend = events.iter().find(|e| e["name"] == "suspend" && e["tid"] == 0).unwrap();
        assert_eq!((suspend["ts"].as_f64(), suspend["dur"].as_f64()), (Some(3.0), Some(2.0)));
        assert_eq!(suspend["args"]["collateral"][0]["pid"], 20);
        let contexts: Vec<&Value> =
            suspend["args"]["collateral"].as_array().unwrap().iter().map(|c| &c["context_id"]).collect();
        assert_eq!(contexts, [&Value::Null, &json!(1)]);
        let queue0 = events.iter().find(|e| e["name"] == "queue 0").unwrap();
        assert_eq!((queue0["ts"].as_f64(), queue0["dur"].as_f64()), (Some(2.0), Some(8.0)), "closed at the end");
        assert!(events.iter().all(|e| e["ph"].is_string() && e["pid"].is_u64()));
        let secondary = events.iter().find(|e| e["name"] == "queue context_0/3").unwrap();
        assert_eq!((secondary["ts"].as_f64(), secondary["dur"].as_f64()), (Some(1.5), Some(8.5)), "open to the end");
    }

    #[test]
    fn every_context_s_queues_have_their_own_tracks_below_2_pow_31() {
        let key = |context_id, id| QueueKey::new(context_id, QueueId(id));
        assert_eq!(queue_tid(key(None, 3)), QUEUE_TID_BASE + 3);
        assert_eq!(queue_tid(key(Some(0), 3)), QUEUE_TID_BASE + 1024 + 3);
        assert_ne!(queue_tid(key(None, 1023)), queue_tid(key(Some(0), 0)));
        assert!(queue_tid(key(Some(0xFFFE), 1023)) < 1 << 31);
    }
}
