//! The one path every decoded event takes: the [`Model`] applies it (queue map and spans, in
//! one place), the [`Filter`] decides what is shown, the [`Sink`]s format what is shown, and
//! in-process [`Subscriber`]s react to what the model saw (every notice and span, unfiltered).
//!
//! The pipeline benchmark and the decode fuzz target feed a [`Pipeline`] directly; every command
//! that traces (`trace`, `preempt`, `queues --watch`, `top`, `schedule` and `evaluate` through the
//! scheduler's discovery, the agent) through the one [`in_process::InProcessTracer`]. Front ends
//! only choose the sinks and subscribers and drive the clock (the stream batches, the map
//! interval, the end).

pub mod filter;
pub mod in_process;

use std::{io, sync::mpsc};

use self::filter::Filter;
use crate::{
    domain::HostPid,
    event::{Event, Losses},
    model::{Model, ModelNotice, QueueNotice, spans::Span},
    report::{Sink, TraceSummary},
};

/// An in-process listener (the scheduler, a metrics exporter). Runs on the thread that delivers
/// events, in stream order, so it must not block; [`Observed`] over a channel hands off to
/// another thread.
pub trait Subscriber {
    /// A queue or a process appeared or went away.
    fn notice(&mut self, _notice: ModelNotice, _model: &Model) {}
    /// A queue appeared or went away, in full (after [`Subscriber::notice`] of the same change);
    /// a secondary KFD context's queue too, which has no notice ([`ModelNotice`]).
    fn queue(&mut self, _queue: QueueNotice, _model: &Model) {}
    /// A span closed (suspend, resume, eviction).
    fn span(&mut self, _span: &Span, _model: &Model) {}
    /// The model forgot an exited process (after [`crate::model::Limits`]): drop what is kept for it.
    fn forgotten(&mut self, _pid: HostPid) {}
}

/// What a channel subscriber receives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observed {
    Notice(ModelNotice),
    Span(Span),
    Forgotten(HostPid),
}

/// Forward everything to a receiver, on this thread or another; a closed receiver is ignored.
impl Subscriber for mpsc::Sender<Observed> {
    fn notice(&mut self, notice: ModelNotice, _model: &Model) {
        let _ = self.send(Observed::Notice(notice));
    }

    fn span(&mut self, span: &Span, _model: &Model) {
        let _ = self.send(Observed::Span(span.clone()));
    }

    fn forgotten(&mut self, pid: HostPid) {
        let _ = self.send(Observed::Forgotten(pid));
    }
}

/// Forward the queue notices in full to a receiver (`queues --watch` reads them after each drain).
impl Subscriber for mpsc::Sender<QueueNotice> {
    fn queue(&mut self, queue: QueueNotice, _model: &Model) {
        let _ = self.send(queue);
    }
}

/// Model + filter + sinks + subscribers. Remembers the first write error of any sink.
pub struct Pipeline {
    model: Model,
    filter: Filter,
    sinks: Vec<Box<dyn Sink>>,
    subscribers: Vec<Box<dyn Subscriber>>,
    /// Events shown (after the filter).
    events: u64,
    write_error: Option<io::Error>,
}

impl Pipeline {
    pub fn new(model: Model, filter: Filter) -> Self {
        Self { model, filter, sinks: Vec::new(), subscribers: Vec::new(), events: 0, write_error: None }
    }

    pub fn add_sink(&mut self, sink: Box<dyn Sink>) {
        self.sinks.push(sink);
    }

    pub fn subscribe(&mut self, subscriber: Box<dyn Subscriber>) {
        self.subscribers.push(subscriber);
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Events shown so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// `trace -- CMD` started `command` as `pid`: show only it and its descendants from now on.
    pub fn start(&mut self, command: &[String], pid: HostPid) {
        self.filter.set_root(pid);
        for sink in &mut self.sinks {
            if let Err(e) = sink.start(command, pid) {
                self.write_error.get_or_insert(e);
            }
        }
    }

    /// One event through the model, the filter, the sinks and the subscribers. The model sees
    /// everything (collateral needs other processes' queues); only output is filtered.
    pub fn deliver(&mut self, event: &Event) {
        let applied = self.model.apply(event);
        if self.filter.keep_event(event, &self.model) {
            self.events += 1;
            for sink in &mut self.sinks {
                if let Err(e) = sink.event(event) {
                    self.write_error.get_or_insert(e);
                }
            }
        }
        if let Some(notice) = applied.notice {
            for s in &mut self.subscribers {
                s.notice(notice, &self.model);
            }
        }
        if let Some(queue) = applied.queue {
            for s in &mut self.subscribers {
                s.queue(queue, &self.model);
            }
            if self.filter.keep_pid(queue.pid(), &self.model) {
                for sink in &mut self.sinks {
                    if let Err(e) = sink.queue(&queue, &self.model) {
                        self.write_error.get_or_insert(e);
                    }
                }
            }
        }
        for span in &applied.spans {
            self.span(span);
        }
        self.forget(&applied.forgotten);
    }

    fn span(&mut self, span: &Span) {
        for s in &mut self.subscribers {
            s.span(span, &self.model);
        }
        let (filter, model) = (&mut self.filter, &self.model);
        let shown = span.target_pid.is_some_and(|p| filter.keep_pid(p, model))
            || span.collateral.iter().any(|c| filter.keep_pid(c.pid, model));
        if !shown {
            return;
        }
        for sink in &mut self.sinks {
            if let Err(e) = sink.span(span, &self.model) {
                self.write_error.get_or_insert(e);
            }
        }
    }

    fn forget(&mut self, pids: &[HostPid]) {
        for &pid in pids {
            self.filter.forget(pid);
            for s in &mut self.subscribers {
                s.forgotten(pid);
            }
        }
    }

    /// Forget exited processes past their grace period at `now_ns` (call it periodically when
    /// the stream may be quiet).
    pub fn expire(&mut self, now_ns: u64) {
        let forgotten = self.model.expire(now_ns);
        self.forget(&forgotten);
    }

    /// End of a ring-buffer batch: push buffered output out.
    pub fn flush(&mut self) {
        for sink in &mut self.sinks {
            if let Err(e) = sink.flush() {
                self.write_error.get_or_insert(e);
            }
        }
    }

    /// Hand the live queue map (the shown processes) at `now_ns` to every sink.
    pub fn emit_map(&mut self, now_ns: u64) {
        let Self { model, filter, sinks, write_error, .. } = self;
        let map = model.snapshot(now_ns, |pid| filter.keep_pid(pid, model));
        for sink in sinks.iter_mut() {
            if let Err(e) = sink.queue_map(&map) {
                write_error.get_or_insert(e);
            }
        }
    }

    /// The stream ended at `end_ns`: close open spans, show the final map, build the summary
    /// and hand it to every sink, then let each sink write what it writes once.
    pub fn finish(&mut self, end_ns: u64, losses: Losses, duration_ms: u64) -> TraceSummary {
        for span in self.model.finish(end_ns) {
            self.span(&span);
        }
        self.emit_map(end_ns);
        let mut summary =
            TraceSummary { events: self.events, dropped: losses.dropped(), losses, duration_ms, ..Default::default() };
        let Self { model, filter, sinks, write_error, .. } = self;
        summary.add_model(model, |pid| filter.keep_pid(pid, model));
        for sink in sinks.iter_mut() {
            if let Err(e) = sink.summary(&summary) {
                write_error.get_or_insert(e);
            }
        }
        for sink in sinks.iter_mut() {
            if let Err(e) = sink.finish(end_ns) {
                write_error.get_or_insert(e);
            }
        }
        summary
    }

    /// A reader closed the pipe: stop tracing, not an error.
    pub fn broken_pipe(&self) -> bool {
        self.write_error.as_ref().is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
    }

    /// The first write error of any sink, if any.
    pub fn take_write_error(&mut self) -> Option<io::Error> {
        self.write_error.take()
    }
}

#[cfg(test)]
mod tests {
    use std::{cell::RefCell, rc::Rc};

    use super::*;
    use crate::{
        domain::{GpuId, QueueId},
        event::{EventKind, ProcessExit},
        model::QueueAddrs,
        report::jsonl::JsonLines,
        test_support::{create, create_in, ev, suspend},
    };

    /// A sink that records what it was given, shared with the test.
    #[derive(Clone, Default)]
    struct Record(Rc<RefCell<Vec<String>>>);

    impl Sink for Record {
        fn event(&mut self, e: &Event) -> io::Result<()> {
            self.0.borrow_mut().push(format!("event {} {}", e.pid, e.kind.name()));
            Ok(())
        }
        fn span(&mut self, s: &Span, model: &Model) -> io::Result<()> {
            let pid = s.target_pid.unwrap_or_default();
            self.0.borrow_mut().push(format!("span {pid} {}", model.comm_of(pid).unwrap_or("?")));
            Ok(())
        }
        fn queue(&mut self, q: &QueueNotice, _model: &Model) -> io::Result<()> {
            let kind = if matches!(q, QueueNotice::Created { .. }) { "created" } else { "gone" };
            self.0.borrow_mut().push(format!("queue {} {kind}", q.pid()));
            Ok(())
        }
        fn queue_map(&mut self, map: &crate::model::QueueMap<'_>) -> io::Result<()> {
            self.0.borrow_mut().push(format!("map {}", map.processes.len()));
            Ok(())
        }
        fn summary(&mut self, s: &TraceSummary) -> io::Result<()> {
            self.0.borrow_mut().push(format!("summary {} {}", s.events, s.processes.len()));
            Ok(())
        }
        fn finish(&mut self, end_ns: u64) -> io::Result<()> {
            self.0.borrow_mut().push(format!("finish {end_ns}"));
            Ok(())
        }
    }

    #[test]
    fn filtered_sinks_and_unfiltered_subscribers_see_one_stream() {
        let mut p = Pipeline::new(Model::new(None), Filter::new(&[HostPid(10)], None, "/nonexistent"));
        let record = Record::default();
        p.add_sink(Box::new(record.clone()));
        let (tx, rx) = mpsc::channel();
        p.subscribe(Box::new(tx));
        p.deliver(&ev(10, 1, create(0, 0xa)));
        p.deliver(&ev(20, 2, create(4, 0xa))); // not shown, but the model and subscribers see it
        p.deliver(&ev(30, 3, suspend(10, &[0], false))); // the debugger is not shown, its target is
        let exit = ProcessExit { owner_pid: Some(HostPid(10)), stage: "kfd_process_wq_release" };
        p.deliver(&ev(5, 4, EventKind::ProcessExit(exit)));
        let summary = p.finish(9, Losses::default(), 1);
        assert_eq!(
            *record.0.borrow(),
            [
                "event 10 queue_create",
                "queue 10 created", // pid 20's is not shown either
                "event 30 suspend_queues",
                "span 10 p10",
                "event 5 process_exit",
                "map 0",
                "summary 3 1",
                "finish 9"
            ]
        );
        assert_eq!((summary.events, summary.processes[0].pid, summary.processes[0].exited), (3, HostPid(10), true));
        let seen: Vec<Observed> = rx.try_iter().collect();
        assert_eq!(seen.len(), 4);
        assert_eq!(
            seen[1],
            Observed::Notice(ModelNotice::QueueCreated {
                pid: HostPid(20),
                queue: QueueAddrs {
                    queue_id: QueueId(4),
                    gpu_id: GpuId(0xa),
                    read: 0x7f00_0000_4080,
                    write: 0x7f00_0000_4038
                }
            })
        );
        assert!(matches!(&seen[2], Observed::Span(s) if s.queues == [QueueId(0)]));
        assert_eq!(seen[3], Observed::Notice(ModelNotice::ProcessGone { pid: HostPid(10) }));
    }

    #[test]
    fn a_queue_subscriber_gets_each_queue_change_in_full_and_nothing_else() {
        use crate::model::{GoneCause, registry::QueueKey};
        let mut p = Pipeline::new(Model::new(None), Filter::default());
        let (tx, rx) = mpsc::channel::<QueueNotice>();
        p.subscribe(Box::new(tx));
        let (observed, notices) = mpsc::channel::<Observed>();
        p.subscribe(Box::new(observed));
        p.deliver(&ev(10, 1, create(0, 0xa)));
        // Secondary context 0's queue 0 (Linux 7.0): in full for the views, no notice for the
        // scheduler and the agent (DBG_TRAP cannot reach it).
        p.deliver(&ev(10, 1, create_in(0, 0, 0xa)));
        let created: Vec<Observed> = notices.try_iter().collect();
        assert!(matches!(created[..], [Observed::Notice(ModelNotice::QueueCreated { .. })]), "{created:?}");
        let destroy = crate::event::QueueDestroy {
            queue_id: QueueId(0),
            context_id: None,
            result: crate::event::KernelResult(0),
            ret: 0,
        };
        p.deliver(&ev(10, 2, EventKind::QueueDestroy(destroy)));
        let exit = ProcessExit { owner_pid: Some(HostPid(10)), stage: "kfd_process_wq_release" };
        p.deliver(&ev(5, 3, EventKind::ProcessExit(exit)));
        let seen: Vec<QueueNotice> = rx.try_iter().collect();
        assert!(
            matches!(seen[0], QueueNotice::Created { pid: HostPid(10), ts_ns: 1, queue } if queue.queue_id == QueueId(0))
        );
        assert_eq!(seen[1].key().to_string(), "context_0/0");
        let cause = GoneCause::Destroyed;
        let key = QueueKey::primary(QueueId(0));
        assert_eq!(seen[2..], [QueueNotice::Gone { pid: HostPid(10), key, ts_ns: 2, cause }]);
    }

    #[test]
    fn a_broken_pipe_is_remembered_and_reported() {
        struct Closed;
        impl io::Write for Closed {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut p = Pipeline::new(Model::new(None), Filter::default());
        p.add_sink(Box::new(JsonLines::new(Closed, crate::clock::WallClock::from_offset(0))));
        p.deliver(&ev(10, 1, create(0, 0xa)));
        assert!(p.broken_pipe());
        assert_eq!(p.take_write_error().map(|e| e.kind()), Some(io::ErrorKind::BrokenPipe));
        assert_eq!(p.events(), 1);
    }
}
