//! What the event stream says about the host: who owns which queues (host pid, container, pid
//! inside it), in which state, and the timed spans (evictions, suspends, resumes).
//!
//! [`Model`] owns the queue map ([`registry`]) and the span tracker ([`spans`]) and applies one
//! event in one place ([`Model::apply`]); every consumer — `gpreempt trace`, `gpreempt preempt`,
//! the benchmark, the fuzz target — goes through it (via [`crate::pipeline::Pipeline`]).
//! It holds data, never formatting: sinks read [`Model::snapshot`] and the spans it returns.

pub mod registry;
pub mod spans;

use serde::Serialize;

use self::{
    registry::{Lifecycle, ProcessEntry, QueueKey, Registry},
    spans::{Span, SpanTracker},
};
use crate::{
    domain::{GpuId, HostPid, QueueId, QueueType},
    event::{Event, EventKind},
    host::roots::Roots,
    kfd::uapi::QueueSnapshotEntry,
};

/// A queue and where it keeps its dispatch indices: the addresses of its `read_dispatch_id` and
/// `write_dispatch_id`, in its process (CREATE_QUEUE's `read_pointer_address` and
/// `write_pointer_address`), which the scheduler reads to see online work pending.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct QueueAddrs {
    pub queue_id: QueueId,
    pub gpu_id: GpuId,
    pub read: u64,
    pub write: u64,
}

impl QueueAddrs {
    /// A queue as GET_QUEUE_SNAPSHOT gives it (kfd_ioctl.h `kfd_queue_snapshot_entry`: the same
    /// two addresses CREATE_QUEUE was given).
    pub fn of_snapshot(e: &QueueSnapshotEntry) -> Self {
        Self {
            queue_id: QueueId(e.queue_id),
            gpu_id: GpuId(e.gpu_id),
            read: e.read_pointer_address,
            write: e.write_pointer_address,
        }
    }
}

/// The queue and process lifecycle, derived once, here, from the event stream: a queue or a
/// process appeared or went away. Every consumer — the scheduler, `preempt`'s container
/// targets, the agent's policies and metrics — reacts to these rather than to raw events. At most
/// one per event, so applying an event allocates nothing for it. A queue's notice is the compact
/// form of a [`QueueNotice`], which says when and, for a new queue, everything its create record
/// said. Its queues are the primary KFD context's only: DBG_TRAP reaches no other (Linux 7.0,
/// docs/kfd.md §1.4), so a secondary context's queue has its [`QueueNotice`] and no notice here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "notice", rename_all = "snake_case")]
pub enum ModelNotice {
    /// A successful CREATE_QUEUE.
    QueueCreated { pid: HostPid, queue: QueueAddrs },
    /// Destroyed by its process (at the sysfs removal inside its DESTROY_QUEUE, or the ioctl's
    /// return when no removal was seen), or removed at teardown
    /// ([`GoneCause`] says which).
    QueueGone { pid: HostPid, queue_id: QueueId },
    /// A process opened /dev/kfd: reported once per process (not again for a process the model
    /// already knows, from its bootstrap scan or an earlier record).
    ProcessOpened { pid: HostPid },
    /// A process's KFD state was torn down (it exited or closed /dev/kfd).
    ProcessGone { pid: HostPid },
    /// The driver reset one of its queues after the queue failed a preemption (gfx9 per-queue
    /// reset, `set_queue_as_reset`): its work is lost; it stays listed until destroyed, and the
    /// SUSPEND_QUEUES that caused it counted it suspended (docs/kfd.md §2.4).
    QueueReset { pid: HostPid, queue_id: QueueId, gpu_id: Option<GpuId> },
    /// It made a secondary KFD context (Linux 7.0, `AMDKFD_IOC_CREATE_PROCESS`; `context_id`
    /// `None` when unreadable): DBG_TRAP cannot reach the queues created there; the model keys
    /// them by context and announces none of them here (docs/kfd.md §1.4).
    ContextCreated { pid: HostPid, context_id: Option<u16> },
}

/// A queue as its successful CREATE_QUEUE made it: the arguments KFD accepted
/// (`kfd_ioctl_create_queue_args`) and what it returned (the id, the doorbell offset). Taken from
/// the record once, in the registry, so a view that shows them (`queues --watch`) reads no record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CreatedQueue {
    pub queue_id: QueueId,
    /// The secondary KFD context it was created in (Linux 7.0; ids are per context); `None`
    /// (JSON `null`) for the primary one.
    pub context_id: Option<u16>,
    pub gpu_id: GpuId,
    pub queue_type: QueueType,
    pub priority: u32,
    pub percentage: u32,
    pub ring_base: u64,
    pub ring_size: u32,
    pub read_pointer_address: u64,
    pub write_pointer_address: u64,
    /// Doorbell offset KFD returned (absent when the kernel did not report it).
    pub doorbell_offset: Option<u64>,
    pub cwsr_address: u64,
    pub cwsr_size: u32,
}

impl CreatedQueue {
    /// Where it is: its context and id.
    pub fn key(&self) -> QueueKey {
        QueueKey::new(self.context_id, self.queue_id)
    }

    /// Where it keeps its dispatch indices: what the scheduler reads of it.
    pub fn addrs(&self) -> QueueAddrs {
        QueueAddrs {
            queue_id: self.queue_id,
            gpu_id: self.gpu_id,
            read: self.read_pointer_address,
            write: self.write_pointer_address,
        }
    }
}

/// Why a queue left the map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GoneCause {
    /// Its process's DESTROY_QUEUE succeeded.
    Destroyed,
    /// Removed with its process's KFD state (exit, or /dev/kfd closed), with no DESTROY_QUEUE.
    TornDown,
}

/// A queue created or gone, in full: what [`ModelNotice::QueueCreated`] and
/// [`ModelNotice::QueueGone`] say, with the event's time, the create record's arguments, its KFD
/// context and why the queue went. The scheduler and the agent keep the compact notice (ids and
/// index addresses, a third of the size, which is what crosses their channels), which only a
/// primary context's queue has; a view that shows a queue's arguments and times takes this one
/// ([`crate::pipeline::Subscriber::queue`]), for every context's queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueNotice {
    Created {
        pid: HostPid,
        /// CLOCK_BOOTTIME ns of the create record.
        ts_ns: u64,
        queue: CreatedQueue,
    },
    Gone {
        pid: HostPid,
        key: QueueKey,
        /// CLOCK_BOOTTIME ns of the record that ended it (its sysfs removal, or a destroy's
        /// return when no removal was seen).
        ts_ns: u64,
        cause: GoneCause,
    },
}

impl QueueNotice {
    /// The process whose queue it is.
    pub fn pid(&self) -> HostPid {
        match *self {
            Self::Created { pid, .. } | Self::Gone { pid, .. } => pid,
        }
    }

    /// Which queue: its context and id.
    pub fn key(&self) -> QueueKey {
        match *self {
            Self::Created { queue, .. } => queue.key(),
            Self::Gone { key, .. } => key,
        }
    }

    /// The compact notice every subscriber gets: none for a secondary KFD context's queue, which
    /// DBG_TRAP cannot reach ([`ModelNotice`]).
    pub fn notice(&self) -> Option<ModelNotice> {
        if !self.key().is_primary() {
            return None;
        }
        Some(match *self {
            Self::Created { pid, queue, .. } => ModelNotice::QueueCreated { pid, queue: queue.addrs() },
            Self::Gone { pid, key, .. } => ModelNotice::QueueGone { pid, queue_id: key.queue_id },
        })
    }
}

/// What one event closed or changed.
#[derive(Debug, Default)]
pub struct Applied {
    /// Spans it closed (a suspend, a resume, an eviction restored or ended by an exit).
    pub spans: Vec<Span>,
    pub notice: Option<ModelNotice>,
    /// The same change in full when it is a queue's (`notice` is then its compact form, or
    /// `None` for a secondary KFD context's queue).
    pub queue: Option<QueueNotice>,
    /// Exited processes the model no longer keeps (past [`Limits`]): their series can go.
    pub forgotten: Vec<HostPid>,
}

/// How much of the past the model keeps: a long-running consumer sets a grace period, a
/// one-shot trace keeps every exited process for its summary (up to `finished_max`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Exited processes kept at most.
    pub finished_max: usize,
    /// Exited processes leave this long (ns) after their teardown; `None`: only `finished_max`.
    pub finished_grace_ns: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Self { finished_max: 4096, finished_grace_ns: None }
    }
}

/// The live queue map at one instant, for sinks to render.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueMap<'a> {
    /// CLOCK_BOOTTIME ns when it was taken.
    pub ts_ns: u64,
    /// Running processes, in pid order.
    pub processes: Vec<&'a ProcessEntry>,
}

/// The queue map and the span tracker, fed one event at a time.
#[derive(Debug, Default)]
pub struct Model {
    registry: Registry,
    spans: SpanTracker,
    limits: Limits,
}

impl Model {
    /// An empty model that looks up the identity of new pids under `roots` (`None`: no /proc
    /// lookups, for tests and benchmarks).
    pub fn new(roots: Option<Roots>) -> Self {
        Self { registry: Registry::new(roots), ..Default::default() }
    }

    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Add every KFD process and queue sysfs shows now; returns the scan's notes.
    pub fn bootstrap(&mut self, roots: &Roots) -> Vec<String> {
        self.registry.bootstrap(roots)
    }

    /// Apply one event: spans first (they must see the map as the event found it: collateral
    /// is what was active before a suspend), then the map.
    pub fn apply(&mut self, event: &Event) -> Applied {
        let spans = self.spans.on_event(event, &self.registry);
        let change = self.registry.apply_in_full(event);
        let reset = match &event.kind {
            // A secondary context's queue is not announced (registry: DBG_TRAP cannot reach it).
            EventKind::QueueReset(r) if r.context_id.is_none() => match (r.owner_pid, r.queue_id) {
                (Some(pid), Some(queue_id)) => Some(ModelNotice::QueueReset { pid, queue_id, gpu_id: r.gpu_id }),
                _ => None,
            },
            EventKind::ContextCreate(c) if c.result.is_ok() => {
                Some(ModelNotice::ContextCreated { pid: event.pid, context_id: c.context_id })
            }
            _ => None,
        };
        let notice = change.and_then(Lifecycle::notice).or(reset);
        let queue = change.and_then(Lifecycle::queue);
        let mut forgotten = Vec::new();
        if matches!(notice, Some(ModelNotice::ProcessGone { .. })) {
            let before = self.limits.finished_grace_ns.map(|g| event.ts_ns.saturating_sub(g));
            self.registry.expire(self.limits.finished_max, before, |pid| forgotten.push(pid));
            for &pid in &forgotten {
                self.spans.forget(pid);
            }
        }
        Applied { spans, notice, queue, forgotten }
    }

    /// Forget exited processes past their grace period at `now_ns` (a quiet stream applies no
    /// exits that would do it); returns them.
    pub fn expire(&mut self, now_ns: u64) -> Vec<HostPid> {
        let mut forgotten = Vec::new();
        let before = self.limits.finished_grace_ns.map(|g| now_ns.saturating_sub(g));
        self.registry.expire(self.limits.finished_max, before, |pid| forgotten.push(pid));
        for &pid in &forgotten {
            self.spans.forget(pid);
        }
        forgotten
    }

    /// Close what is still open at the end (`now_ns`): evictions not restored.
    pub fn finish(&mut self, now_ns: u64) -> Vec<Span> {
        self.spans.finish(now_ns)
    }

    /// The process `pid`: running, or the last one of that pid that exited (pids are reused).
    pub fn process(&self, pid: HostPid) -> Option<&ProcessEntry> {
        self.registry.lookup(pid)
    }

    /// Its command name, when known.
    pub fn comm_of(&self, pid: HostPid) -> Option<&str> {
        self.process(pid).and_then(|p| p.comm.as_deref())
    }

    /// The running processes that `keep` selects, with their queues.
    pub fn snapshot(&self, ts_ns: u64, mut keep: impl FnMut(HostPid) -> bool) -> QueueMap<'_> {
        QueueMap { ts_ns, processes: self.registry.processes.values().filter(|p| keep(p.pid)).collect() }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn spans(&self) -> &SpanTracker {
        &self.spans
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        event::{EventKind, ProcessExit},
        test_support::{create, ev, suspend},
    };

    fn exit(pid: u32, ts: u64) -> Event {
        ev(
            5,
            ts,
            EventKind::ProcessExit(ProcessExit { owner_pid: Some(HostPid(pid)), stage: "kfd_process_wq_release" }),
        )
    }

    #[test]
    fn one_apply_updates_spans_and_map_and_says_what_happened() {
        let mut m = Model::new(None);
        let a = m.apply(&ev(10, 1, create(0, 0xa)));
        let queue =
            QueueAddrs { queue_id: QueueId(0), gpu_id: GpuId(0xa), read: 0x7f00_0000_0080, write: 0x7f00_0000_0038 };
        assert_eq!(a.notice, Some(ModelNotice::QueueCreated { pid: HostPid(10), queue }));
        m.apply(&ev(20, 2, create(4, 0xa)));
        let a = m.apply(&ev(30, 3, suspend(10, &[0], false)));
        assert_eq!((a.spans.len(), a.notice), (1, None));
        assert_eq!(a.spans[0].queues, [QueueId(0)]);
        let map = m.snapshot(9, |pid| pid == HostPid(20));
        assert_eq!((map.ts_ns, map.processes.len(), map.processes[0].pid), (9, 1, HostPid(20)));
        assert_eq!(m.apply(&exit(10, 4)).notice, Some(ModelNotice::ProcessGone { pid: HostPid(10) }));
        assert_eq!(m.comm_of(HostPid(10)), Some("p10"), "an exited process is still known");
    }

    #[test]
    fn exited_processes_leave_after_the_grace_period_or_beyond_the_cap() {
        let mut m = Model::new(None).with_limits(Limits { finished_max: 2, finished_grace_ns: Some(100) });
        for (i, pid) in [1u32, 2, 3].into_iter().enumerate() {
            m.apply(&ev(pid, i as u64, create(0, 1)));
            let a = m.apply(&exit(pid, 10 + i as u64));
            assert_eq!(a.forgotten, if pid == 3 { vec![HostPid(1)] } else { vec![] }, "cap of 2 at pid {pid}");
        }
        assert_eq!(m.expire(111), [], "exited at 11, grace 100: still kept at 111");
        assert_eq!(m.expire(112), [HostPid(2)]);
        assert_eq!(m.expire(113), [HostPid(3)]);
        assert_eq!((m.registry().finished.len(), m.process(HostPid(3))), (0, None));
    }

    #[test]
    fn a_queue_s_change_comes_in_full_beside_its_notice() {
        let mut m = Model::new(None);
        let a = m.apply(&ev(10, 1, create(2, 0xa)));
        let queue = CreatedQueue {
            queue_id: QueueId(2),
            context_id: None,
            gpu_id: GpuId(0xa),
            queue_type: QueueType::ComputeAql,
            priority: 7,
            percentage: 100,
            ring_base: 0x1000,
            ring_size: 4096,
            read_pointer_address: 0x7f00_0000_2080,
            write_pointer_address: 0x7f00_0000_2038,
            doorbell_offset: Some(0),
            cwsr_address: 0,
            cwsr_size: 0,
        };
        assert_eq!(a.queue, Some(QueueNotice::Created { pid: HostPid(10), ts_ns: 1, queue }));
        assert_eq!(a.notice, a.queue.and_then(|q| q.notice()));
        let a = m.apply(&exit(10, 4));
        assert_eq!((a.notice, a.queue), (Some(ModelNotice::ProcessGone { pid: HostPid(10) }), None));
    }
}
