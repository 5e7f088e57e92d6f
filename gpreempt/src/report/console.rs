//! Human lines: one per event; colour only when writing to a terminal.

use std::io::Write;

use super::{Sink, TraceSummary, clock::WallClock};
use crate::trace::decode::{Event, EventKind, KernelResult};

pub struct Console<W: Write> {
    out: W,
    clock: WallClock,
    colour: bool,
}

const RED: &str = "\x1b[31m";
const GREEN: &str = "\x1b[32m";
const RESET: &str = "\x1b[0m";

impl<W: Write> Console<W> {
    pub fn new(out: W, clock: WallClock, colour: bool) -> Self {
        Self { out, clock, colour }
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
        let head = format!("{} {:>7} {:<15} {:<14}", self.clock.time_of_day(e.ts_ns), e.pid, e.comm, e.kind.name());
        let body = match &e.kind {
            EventKind::QueueCreate(c) => format!(
                "queue {:>4} gpu {:#06x} {:<12} prio {:>2} ring {:>8}  {}",
                c.queue_id.map_or_else(|| "-".to_owned(), |q| q.to_string()),
                c.gpu_id,
                c.queue_type,
                c.priority,
                c.ring_size,
                self.result(c.result)
            ),
            EventKind::QueueDestroy(d) => format!("queue {:>4}  {}", d.queue_id, self.result(d.result)),
            EventKind::QueueUpdate(u) => format!(
                "queue {:>4} prio {:>2} pct {:>3} ring {:>8}  {}",
                u.queue_id,
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
                q.queue_id.map_or_else(|| "?".to_owned(), |q| q.to_string()),
                q.owner_pid.map_or_else(|| "?".to_owned(), |p| p.to_string())
            ),
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

fn gpu(id: Option<u32>) -> String {
    id.map_or_else(|| "?".to_owned(), |g| format!("{g:#06x}"))
}

impl<W: Write> Sink for Console<W> {
    fn event(&mut self, event: &Event) -> std::io::Result<()> {
        let line = self.line(event);
        writeln!(self.out, "{line}")
    }

    fn summary(&mut self, s: &TraceSummary) -> std::io::Result<()> {
        let l = &s.losses;
        writeln!(
            self.out,
            "{} events in {:.1} s, {} dropped (ring buffer full {}, probe read failed {}, return without entry {}, undecodable {})",
            s.events,
            s.duration_ms as f64 / 1000.0,
            s.dropped,
            l.ringbuf_full,
            l.read_failed,
            l.entry_missing,
            l.decode_errors
        )
    }
}

#[cfg(test)]
mod tests {
    use gpreempt_common::{
        kfd_uapi::CreateQueueArgs,
        record::{QueueCreateRecord, RecordKind},
    };

    use super::*;
    use crate::trace::decode::{
        decode,
        tests::{bytes_of, header},
    };

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
            ret: -22,
        };
        let c = Console::new(Vec::new(), WallClock::from_offset(0), false);
        assert_eq!(
            c.line(&decode(&bytes_of(&rec)).unwrap()),
            "00:00:00.000004    4242 kfd-client      queue_create   queue    - gpu 0x1234 compute-aql  prio  7 ring    65536  EINVAL (3.5 µs)"
        );
        let coloured = Console::new(Vec::new(), WallClock::from_offset(0), true);
        assert!(coloured.line(&decode(&bytes_of(&rec)).unwrap()).contains("\x1b[31mEINVAL\x1b[0m"));
    }
}
