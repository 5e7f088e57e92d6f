//! Human lines: one per event; colour only when writing to a terminal.

use std::io::Write;

use super::{Sink, TraceSummary};
use crate::{
    clock::WallClock,
    domain::{GpuId, QueueId},
    event::{Event, EventKind, KernelResult},
    host::procinfo,
    model::{
        Model, QueueMap,
        registry::QueueKey,
        spans::{Span, SpanKind},
    },
    output::text::escape,
};

pub struct Console<W: Write> {
    out: W,
    clock: WallClock,
    colour: bool,
    /// Only the closing summary (on stderr when stdout carries JSON or is redirected).
    summary_only: bool,
}

const RED: &str = "\x1b[31m";
const GREEN: &str = "\x1b[32m";
const RESET: &str = "\x1b[0m";

impl<W: Write> Console<W> {
    pub fn new(out: W, clock: WallClock, colour: bool) -> Self {
        Self { out, clock, colour, summary_only: false }
    }

    /// A console that prints the closing summary and nothing else.
    pub fn summary_only(out: W, clock: WallClock) -> Self {
        Self { out, clock, colour: false, summary_only: true }
    }

    fn result(&self, r: KernelResult) -> String {
        match (self.colour, r.is_ok()) {
            (false, _) => r.name(),
            (true, true) => format!("{GREEN}{}{RESET}", r.name()),
            (true, false) => format!("{RED}{}{RESET}", r.name()),
        }
    }

    /// The line for one event, without colour decisions of the caller.
    pub fn line(&self, e: &Event) -> String {
        let head =
            format!("{} {:>7} {:<15} {:<14}", self.clock.time_of_day(e.ts_ns), e.pid, escape(&e.comm), e.kind.name());
        let body = match &e.kind {
            EventKind::QueueCreate(c) => format!(
                "queue {:>4} gpu {:#06x} {:<12} prio {:>2} ring {:>8}  {}",
                label(c.context_id, c.queue_id, "-"),
                c.gpu_id,
                c.queue_type,
                c.priority,
                c.ring_size,
                self.result(c.result)
            ),
            EventKind::QueueDestroy(d) => {
                format!("queue {:>4}  {}", QueueKey::new(d.context_id, d.queue_id), self.result(d.result))
            }
            EventKind::QueueUpdate(u) => format!(
                "queue {:>4} prio {:>2} pct {:>3} ring {:>8}  {}",
                QueueKey::new(u.context_id, u.queue_id),
                u.priority,
                u.percentage,
                u.ring_size,
                self.result(u.result)
            ),
            EventKind::DebugTrap(d) => {
                let mut text = format!("target {} {}", d.target_pid, d.op);
                if let Some(n) = d.num_queues {
                    text.push_str(&format!(" queues {n}"));
                }
                if let Some(g) = d.grace_period {
                    text.push_str(&format!(" grace {g}"));
                }
                if d.ret > 0 {
                    text.push_str(&format!(" -> {}", d.ret));
                }
                format!("{text}  {}", self.result(d.result))
            }
            EventKind::RuntimeEnable(r) => {
                format!("{}  {}", if r.enable { "enable" } else { "disable" }, self.result(r.result))
            }
            EventKind::QueueEviction(v) => {
                format!("target {} gpu {} trigger {}", v.target_pid, gpu(v.gpu_id), v.trigger)
            }
            EventKind::QueueRestore(v) => format!("target {} gpu {}", v.target_pid, gpu(v.gpu_id)),
            EventKind::SuspendQueues(q) | EventKind::ResumeQueues(q) => {
                let ids: Vec<String> = q
                    .queues
                    .iter()
                    .map(|o| {
                        let flag = if o.error {
                            "!E"
                        } else if o.invalid {
                            "!I"
                        } else {
                            ""
                        };
                        format!("{}{flag}", o.queue_id)
                    })
                    .collect();
                format!(
                    "target {} queues {} [{}] handled {}  {}",
                    q.target_pid.map_or_else(|| "?".to_owned(), |p| p.to_string()),
                    q.num_queues,
                    ids.join(","),
                    q.handled.map_or_else(|| "-".to_owned(), |h| h.to_string()),
                    self.result(q.result)
                )
            }
            EventKind::KfdCall(c) => format!(
                "{} owner {} gpu {}  {}",
                c.function,
                c.owner_pid.map_or_else(|| "-".to_owned(), |p| p.to_string()),
                gpu(c.gpu_id),
                self.result(c.result)
            ),
            EventKind::ProcessOpen(p) => format!("owner {} kfd_process {:#x}", p.owner_pid, p.kfd_process),
            EventKind::ProcessExit(p) => {
                format!("owner {} ({})", p.owner_pid.map_or_else(|| "?".to_owned(), |p| p.to_string()), p.stage)
            }
            EventKind::QueueRemoved(q) => format!(
                "queue {:>4} owner {}",
                label(q.context_id, q.queue_id, "?"),
                q.owner_pid.map_or_else(|| "?".to_owned(), |p| p.to_string())
            ),
            EventKind::QueueReset(q) => format!(
                "queue {:>4} owner {} gpu {}  reset by the driver after a failed preemption (gone)",
                label(q.context_id, q.queue_id, "?"),
                q.owner_pid.map_or_else(|| "?".to_owned(), |p| p.to_string()),
                gpu(q.gpu_id)
            ),
            EventKind::ContextCreate(c) if c.result.is_ok() => format!(
                "context_{} (secondary: DBG_TRAP cannot suspend its queues)  {}",
                c.context_id.map_or_else(|| "?".to_owned(), |id| id.to_string()),
                self.result(c.result)
            ),
            EventKind::ContextCreate(c) => format!("no secondary context made  {}", self.result(c.result)),
            EventKind::GpuReset(r) => {
                if self.colour {
                    format!("{RED}{}{RESET}", r.alarm)
                } else {
                    r.alarm.to_owned()
                }
            }
        };
        format!("{head} {body} ({:.1} µs)", e.duration_ns() as f64 / 1000.0)
    }
}

fn gpu(id: Option<GpuId>) -> String {
    id.map_or_else(|| "?".to_owned(), |g| format!("{g:#06x}"))
}

/// A queue's label as every view gives it ([`QueueKey`]: `3`, `context_0/3` for a secondary KFD
/// context's, Linux 7.0: ids are per context); `unknown` stands for an id the record lacks
/// (`-`, `context_0/-`).
fn label(context_id: Option<u16>, queue_id: Option<QueueId>, unknown: &str) -> String {
    match (queue_id, context_id) {
        (Some(id), _) => QueueKey::new(context_id, id).to_string(),
        (None, None) => unknown.to_owned(),
        (None, Some(context)) => format!("context_{context}/{unknown}"),
    }
}

/// `[0, 1]`
fn id_list(ids: &[QueueId]) -> String {
    let ids: Vec<String> = ids.iter().map(QueueId::to_string).collect();
    format!("[{}]", ids.join(", "))
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

impl<W: Write> Console<W> {
    /// The line for one span.
    pub fn span_line(&self, s: &Span) -> String {
        let kind = match s.kind {
            SpanKind::Eviction => "evicted",
            SpanKind::Suspend => "suspended",
            SpanKind::Resume => "resumed",
        };
        let target = s.target_pid.map_or_else(|| "?".to_owned(), |p| p.to_string());
        let mut line =
            format!("{} {:>7} span {:<9} {:.3} ms", self.clock.time_of_day(s.end_ns), target, kind, ms(s.duration_ns));
        if let Some(t) = &s.trigger {
            line.push_str(&format!(" gpu {} trigger {t}", gpu(s.gpu_id)));
        }
        if s.open {
            line.push_str(" (not restored when the trace ended)");
        }
        if s.kind != SpanKind::Eviction {
            line.push_str(&format!(" queues {}", id_list(&s.queues)));
            if !s.rejected.is_empty() {
                line.push_str(&format!(" rejected {}", id_list(&s.rejected)));
            }
        }
        if let Some(b) = &s.breakdown {
            line.push_str(&format!(
                " (unmap {:.3} fence {:.3} remap {:.3} ms)",
                ms(b.unmap_ns),
                ms(b.fence_wait_ns),
                ms(b.remap_ns)
            ));
        }
        if !s.collateral.is_empty() {
            let others: Vec<String> = s.collateral.iter().map(|c| format!("{}:{}", c.pid, c.key())).collect();
            line.push_str(&format!(" collateral [{}]", others.join(" ")));
        }
        line
    }

    /// The queue map as a table (processes in pid order, queues in id order).
    pub fn map_text(map: &QueueMap<'_>) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(out, "queue map: {} process(es)", map.processes.len());
        for p in &map.processes {
            let container = p
                .container
                .as_ref()
                .map(|c| {
                    format!(" {} {}", c.runtime, escape(c.name.as_deref().unwrap_or_else(|| procinfo::short_id(&c.id))))
                })
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  pid {} ({}){container} nspid {} queues {}",
                p.pid,
                escape(p.comm.as_deref().unwrap_or("?")),
                p.ns_pid.map_or_else(|| "?".to_owned(), |n| n.to_string()),
                p.queues.len()
            );
            for q in p.queues.values() {
                let _ = writeln!(
                    out,
                    "    queue {:>4} gpu {} {:<12} {:<9} prio {}",
                    q.key(),
                    gpu(q.gpu_id),
                    q.queue_type.as_deref().unwrap_or("?"),
                    q.state.name(),
                    q.priority.map_or_else(|| "?".to_owned(), |p| p.to_string()),
                );
            }
        }
        out
    }
}

impl<W: Write> Sink for Console<W> {
    fn event(&mut self, event: &Event) -> std::io::Result<()> {
        if self.summary_only {
            return Ok(());
        }
        let line = self.line(event);
        writeln!(self.out, "{line}")
    }

    fn span(&mut self, s: &Span, _model: &Model) -> std::io::Result<()> {
        if self.summary_only {
            return Ok(());
        }
        let line = self.span_line(s);
        writeln!(self.out, "{line}")
    }

    fn queue_map(&mut self, map: &QueueMap<'_>) -> std::io::Result<()> {
        if self.summary_only {
            return Ok(());
        }
        write!(self.out, "{}", Self::map_text(map))?;
        self.out.flush()
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }

    fn summary(&mut self, s: &TraceSummary) -> std::io::Result<()> {
        for p in &s.processes {
            writeln!(
                self.out,
                "pid {:>7} {:<15} queues {:>3}{} created {} destroyed {} evictions {} ({:.3} ms total, {:.3} ms max) suspends {}",
                p.pid,
                escape(p.comm.as_deref().unwrap_or("?")),
                p.queues,
                if p.exited { " (exited)" } else { "" },
                p.churn.queues_created,
                p.churn.queues_destroyed,
                p.eviction_time.count,
                ms(p.eviction_time.total_ns),
                ms(p.eviction_time.max_ns),
                p.churn.suspends,
            )?;
        }
        for (name, l) in [("suspend", &s.suspend), ("resume", &s.resume), ("fence wait", &s.fence_wait)] {
            if l.count > 0 {
                writeln!(
                    self.out,
                    "{name} latency: n {} p50 {:.3} ms p90 {:.3} ms p99 {:.3} ms max {:.3} ms",
                    l.count,
                    ms(l.p50_ns),
                    ms(l.p90_ns),
                    ms(l.p99_ns),
                    ms(l.max_ns)
                )?;
            }
        }
        if s.evictions.count > 0 || s.collateral_queues > 0 {
            writeln!(
                self.out,
                "evictions {} ({:.3} ms total, {:.3} ms max); other processes' queues preempted by suspends/resumes: {}",
                s.evictions.count,
                ms(s.evictions.total_ns),
                ms(s.evictions.max_ns),
                s.collateral_queues
            )?;
        }
        writeln!(
            self.out,
            "{} events in {:.1} s, {} dropped ({})",
            s.events,
            s.duration_ms as f64 / 1000.0,
            s.dropped,
            s.losses
        )?;
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use gpreempt_common::{
        kfd_uapi::CreateQueueArgs,
        record::{QueueCreateRecord, RecordKind},
    };

    use super::*;
    use crate::{
        domain::HostPid,
        test_support::{create, ev},
        trace::decode::{
            decode,
            tests::{bytes_of, header},
        },
    };

    #[test]
    fn a_span_line_lists_ids_breakdown_and_collateral() {
        use crate::{
            domain::{GpuId, QueueId},
            model::{registry::Collateral, spans::Breakdown},
        };
        let span = Span {
            kind: SpanKind::Suspend,
            target_pid: Some(HostPid(10)),
            gpu_id: None,
            start_ns: 1_000_000,
            end_ns: 3_000_000,
            duration_ns: 2_000_000,
            trigger: None,
            queues: vec![QueueId(0), QueueId(1)],
            rejected: vec![QueueId(5)],
            collateral: vec![
                Collateral { pid: HostPid(20), queue_id: QueueId(4), context_id: None, gpu_id: Some(GpuId(0xa)) },
                // Queue 4 of pid 20's secondary KFD context 0 (Linux 7.0), another queue.
                Collateral { pid: HostPid(20), queue_id: QueueId(4), context_id: Some(0), gpu_id: Some(GpuId(0xa)) },
            ],
            breakdown: Some(Breakdown {
                unmap_ns: 1_500_000,
                fence_wait_ns: 1_000_000,
                remap_ns: 250_000,
                gpus: vec![GpuId(0xa)],
            }),
            phases: vec![],
            open: false,
        };
        let c = Console::new(Vec::new(), WallClock::from_offset(0), false);
        assert_eq!(
            c.span_line(&span),
            "00:00:00.003000      10 span suspended 2.000 ms queues [0, 1] rejected [5] \
             (unmap 1.500 fence 1.000 remap 0.250 ms) collateral [20:4 20:context_0/4]"
        );
    }

    #[test]
    fn the_map_is_a_table_of_every_queue() {
        let mut m = Model::new(None);
        m.apply(&ev(10, 1, create(3, 0x1234)));
        assert_eq!(
            Console::<Vec<u8>>::map_text(&m.snapshot(5, |_| true)),
            "queue map: 1 process(es)\n  pid 10 (p10) nspid ? queues 1\n    queue    3 gpu 0x1234 compute-aql  active    prio 7\n"
        );
        // Queue 3 of its secondary KFD context 0 (Linux 7.0): labelled by QueueKey, after the primary's.
        let mut both = Model::new(None);
        both.apply(&ev(10, 1, create(3, 0x1234)));
        both.apply(&ev(10, 2, crate::test_support::create_in(0, 3, 0x1234)));
        assert_eq!(
            Console::<Vec<u8>>::map_text(&both.snapshot(5, |_| true)),
            "queue map: 1 process(es)\n  pid 10 (p10) nspid ? queues 2\n    queue    3 gpu 0x1234 compute-aql  active    prio 7\n    \
             queue context_0/3 gpu 0x1234 compute-aql  active    prio 7\n"
        );
        assert_eq!(Console::<Vec<u8>>::map_text(&m.snapshot(5, |p| p == HostPid(1))), "queue map: 0 process(es)\n");
        let mut quiet = Console::summary_only(Vec::new(), WallClock::from_offset(0));
        quiet.queue_map(&m.snapshot(5, |_| true)).unwrap();
        quiet.event(&ev(10, 1, create(3, 0x1234))).unwrap();
        quiet.summary(&TraceSummary::default()).unwrap();
        assert!(String::from_utf8(quiet.out).unwrap().starts_with("0 events in 0.0 s"));
    }

    #[test]
    fn a_create_line_shows_every_issue_field() {
        let rec = QueueCreateRecord {
            header: header(RecordKind::QueueCreate, 4242, "kfd-client"),
            args: CreateQueueArgs {
                gpu_id: 0x1234,
                queue_type: 2,
                queue_priority: 7,
                ring_size: 65536,
                ..Default::default()
            },
            context_id: gpreempt_common::record::CONTEXT_ID_PRIMARY,
            _pad: 0,
            ret: -22,
        };
        let c = Console::new(Vec::new(), WallClock::from_offset(0), false);
        assert_eq!(
            c.line(&decode(&bytes_of(&rec)).unwrap()),
            "00:00:00.000004    4242 kfd-client      queue_create   queue    - gpu 0x1234 compute-aql  prio  7 ring    65536  EINVAL (3.5 µs)"
        );
        let coloured = Console::new(Vec::new(), WallClock::from_offset(0), true);
        assert!(coloured.line(&decode(&bytes_of(&rec)).unwrap()).contains("\x1b[31mEINVAL\x1b[0m"));
        // The same create in secondary context 0 (Linux 7.0) is labelled as every view labels a
        // queue (QueueKey), its id unknown.
        let secondary = QueueCreateRecord { context_id: 0, ..rec };
        assert_eq!(
            c.line(&decode(&bytes_of(&secondary)).unwrap()),
            "00:00:00.000004    4242 kfd-client      queue_create   queue context_0/- gpu 0x1234 compute-aql  prio  7 ring    65536  EINVAL (3.5 µs)"
        );
    }

    /// Every queue line of a secondary KFD context's queue (Linux 7.0) carries QueueKey's label,
    /// the one every other view shows; a primary's keeps its bare id.
    #[test]
    fn a_secondary_context_s_queue_lines_carry_the_queue_label() {
        use crate::{
            domain::{GpuId, QueueId},
            event::{KernelResult, QueueDestroy, QueueRemoved, QueueReset, QueueUpdate},
        };
        let c = Console::new(Vec::new(), WallClock::from_offset(0), false);
        let destroy = |context_id| {
            EventKind::QueueDestroy(QueueDestroy { queue_id: QueueId(0), context_id, result: KernelResult(0), ret: 0 })
        };
        let update = QueueUpdate {
            queue_id: QueueId(2),
            context_id: Some(1),
            priority: 7,
            percentage: 100,
            ring_base: 0x1000,
            ring_size: 4096,
            result: KernelResult(0),
            ret: 0,
        };
        let removed = |queue_id| QueueRemoved { owner_pid: Some(HostPid(42)), queue_id, context_id: Some(0) };
        let reset = QueueReset {
            owner_pid: Some(HostPid(42)),
            queue_id: Some(QueueId(1)),
            context_id: Some(0),
            gpu_id: Some(GpuId(0x1234)),
        };
        let lines = [
            c.line(&ev(42, 1_000, destroy(None))),
            c.line(&ev(42, 1_000, destroy(Some(0)))),
            c.line(&ev(42, 1_000, EventKind::QueueUpdate(update))),
            c.line(&ev(42, 1_000, EventKind::QueueRemoved(removed(Some(QueueId(3)))))),
            c.line(&ev(42, 1_000, EventKind::QueueRemoved(removed(None)))),
            c.line(&ev(42, 1_000, EventKind::QueueReset(reset))),
        ];
        assert_eq!(
            lines,
            [
                "00:00:00.000001      42 p42             queue_destroy  queue    0  OK (0.0 µs)",
                "00:00:00.000001      42 p42             queue_destroy  queue context_0/0  OK (0.0 µs)",
                "00:00:00.000001      42 p42             queue_update   queue context_1/2 prio  7 pct 100 ring     4096  OK (0.0 µs)",
                "00:00:00.000001      42 p42             queue_removed  queue context_0/3 owner 42 (0.0 µs)",
                "00:00:00.000001      42 p42             queue_removed  queue context_0/? owner 42 (0.0 µs)",
                "00:00:00.000001      42 p42             queue_reset    queue context_0/1 owner 42 gpu 0x1234  reset by the \
                 driver after a failed preemption (gone) (0.0 µs)",
            ]
        );
    }

    /// A secondary KFD context made (Linux 7.0), and a CREATE_PROCESS refused.
    #[test]
    fn a_context_create_line_names_the_context_and_what_it_means() {
        use crate::event::{ContextCreate, KernelResult};
        let c = Console::new(Vec::new(), WallClock::from_offset(0), false);
        let made = ContextCreate { context_id: Some(0), result: KernelResult(0), ret: 0 };
        let refused = ContextCreate { context_id: None, result: KernelResult(-22), ret: -22 };
        assert_eq!(
            [
                c.line(&ev(42, 1_000, EventKind::ContextCreate(made))),
                c.line(&ev(42, 1_000, EventKind::ContextCreate(refused)))
            ],
            [
                "00:00:00.000001      42 p42             context_create context_0 (secondary: DBG_TRAP cannot suspend \
                 its queues)  OK (0.0 µs)",
                "00:00:00.000001      42 p42             context_create no secondary context made  EINVAL (0.0 µs)",
            ]
        );
    }
}
