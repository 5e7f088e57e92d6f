//! The live PID → queue map: bootstrapped from `/sys/class/kfd/kfd/proc/<pid>/queues/` for
//! queues that existed before the tracer started, then kept current by applying events.
//!
//! A queue is keyed by its KFD context and id ([`QueueKey`]): since Linux 7.0 a process may have
//! secondary contexts, each with its own queue ids from 0 (docs/kfd.md §1.4). Every queue's
//! change comes out in full ([`QueueNotice`], which the views and the Perfetto export show,
//! labelled by [`QueueKey`]); only the primary context's queues get the compact [`ModelNotice`]
//! the scheduler and the agent take: DBG_TRAP reaches no other, so they have nothing to do with
//! them.
//!
//! Per queue: state (Active / Evicted / Suspended) and attributes; per process: host pid, comm,
//! container and the pid inside it (from /proc, read once when the process is first seen), and
//! the churn counters the exit summary reports. A process whose KFD state is torn down leaves
//! the map (its counters stay in [`Registry::finished`], bounded by [`super::Limits`]).
//! Formatting is the sinks' business (`report::*`); this is data.

use std::collections::{BTreeMap, VecDeque};

use serde::Serialize;

use super::{CreatedQueue, GoneCause, ModelNotice, QueueNotice};
use crate::{
    domain::{GpuId, HostPid, QueueId},
    event::{Event, EventKind, QueueCreate},
    host::{
        processes,
        procinfo::{self, Container},
        roots::Roots,
        sysfs::KfdContext,
    },
};

/// Where a queue is: its KFD context and its id there (ids are per context, Linux 7.0). Primary
/// queues sort first. In JSON a map key: `"3"` for the primary context's queue 3,
/// `"context_0/3"` for secondary context 0's (the sysfs path under `proc/<pid>/`, without
/// `queues/`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueKey {
    pub context: KfdContext,
    pub queue_id: QueueId,
}

impl QueueKey {
    /// The key of queue `queue_id` in the context a record named (`None`: the primary).
    pub fn new(context_id: Option<u16>, queue_id: QueueId) -> Self {
        let context = context_id.map_or(KfdContext::Primary, KfdContext::Secondary);
        Self { context, queue_id }
    }

    /// A primary context's queue 3.
    pub fn primary(queue_id: QueueId) -> Self {
        Self { context: KfdContext::Primary, queue_id }
    }

    /// Its context as the records and JSON name it: `None` for the primary.
    pub fn context_id(&self) -> Option<u16> {
        match self.context {
            KfdContext::Primary => None,
            KfdContext::Secondary(id) => Some(id),
        }
    }

    /// In the primary context: the only one DBG_TRAP reaches, so the only one announced to the
    /// scheduler and the agent.
    pub fn is_primary(&self) -> bool {
        self.context == KfdContext::Primary
    }
}

/// The label every view gives a queue: `3`, `context_0/3` (also its JSON map key).
impl std::fmt::Display for QueueKey {
    /// Honours width and alignment (`{key:>5}`), as a queue id does.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.context {
            KfdContext::Primary => std::fmt::Display::fmt(&self.queue_id.0, f),
            KfdContext::Secondary(id) => f.pad(&format!("context_{id}/{}", self.queue_id.0)),
        }
    }
}

impl Serialize for QueueKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueState {
    Active,
    /// Unmapped by the eviction path (TTM, SVM, userptr, system suspend, CRIU).
    Evicted,
    /// Unmapped by a debugger's SUSPEND_QUEUES.
    Suspended,
}

impl QueueState {
    pub fn name(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Evicted => "evicted",
            Self::Suspended => "suspended",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueEntry {
    pub queue_id: QueueId,
    /// The secondary KFD context it is in; `None` (JSON `null`) for the primary one.
    pub context_id: Option<u16>,
    pub gpu_id: Option<GpuId>,
    /// `compute-aql`, … from the create ioctl; sysfs's kernel type name for bootstrapped queues.
    pub queue_type: Option<String>,
    pub priority: Option<u32>,
    pub percentage: Option<u32>,
    pub ring_base: Option<u64>,
    pub ring_size: Option<u64>,
    pub state: QueueState,
    /// CLOCK_BOOTTIME ns of the last state change (0 for bootstrapped queues).
    pub since_ns: u64,
    /// Found in sysfs at start rather than seen being created.
    pub bootstrapped: bool,
}

impl QueueEntry {
    /// Where it is: its context and id.
    pub fn key(&self) -> QueueKey {
        QueueKey::new(self.context_id, self.queue_id)
    }
}

/// Counters over the whole trace, per process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Churn {
    pub queues_created: u64,
    pub queues_destroyed: u64,
    pub evictions: u64,
    pub suspends: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProcessEntry {
    /// Host pid (tgid).
    pub pid: HostPid,
    pub comm: Option<String>,
    /// Pid inside its pid namespace (NSpid), equal to `pid` on the host.
    pub ns_pid: Option<u32>,
    pub container: Option<Container>,
    pub queues: BTreeMap<QueueKey, QueueEntry>,
    pub churn: Churn,
    /// CLOCK_BOOTTIME ns of its KFD teardown (`None` while it runs).
    #[serde(skip)]
    pub exited_ns: Option<u64>,
}

impl ProcessEntry {
    fn new(pid: HostPid, roots: Option<&Roots>) -> Self {
        let info = roots.and_then(|r| procinfo::read_with(r, pid).ok());
        Self {
            pid,
            comm: info.as_ref().and_then(|i| i.comm.clone()),
            ns_pid: info.as_ref().and_then(|i| i.ns_pid),
            container: info.and_then(|i| i.container),
            queues: BTreeMap::new(),
            churn: Churn::default(),
            exited_ns: None,
        }
    }

    /// Does `filter` (container name, full id or id prefix) name this process's container?
    pub fn in_container(&self, filter: &str) -> bool {
        self.container.as_ref().is_some_and(|c| c.matches(filter))
    }
}

/// A queue of another process preempted by a device-wide unmap (what a span reports; the
/// registry knows which queues were active). The unmap takes every context's queues on the GPU,
/// so a secondary KFD context's are among them, named by their context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Collateral {
    pub pid: HostPid,
    pub queue_id: QueueId,
    /// The secondary KFD context it is in; `None` (JSON `null`) for the primary one.
    pub context_id: Option<u16>,
    pub gpu_id: Option<GpuId>,
}

impl Collateral {
    /// Where it is: its context and id (labelled `3`, `context_0/3`).
    pub fn key(&self) -> QueueKey {
        QueueKey::new(self.context_id, self.queue_id)
    }
}

/// One event's lifecycle change, as [`Registry::apply_in_full`] derives it (a queue of any
/// context, or a process).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    /// A queue created or gone, in full.
    Queue(QueueNotice),
    /// A process opened /dev/kfd or went ([`ModelNotice::ProcessOpened`], [`ModelNotice::ProcessGone`]).
    Process(ModelNotice),
}

impl Lifecycle {
    /// The notice every subscriber gets; none for a secondary context's queue
    /// ([`QueueNotice::notice`]).
    pub fn notice(self) -> Option<ModelNotice> {
        match self {
            Self::Queue(q) => q.notice(),
            Self::Process(n) => Some(n),
        }
    }

    /// The queue's change in full, when it is a queue's.
    pub fn queue(self) -> Option<QueueNotice> {
        match self {
            Self::Queue(q) => Some(q),
            Self::Process(_) => None,
        }
    }
}

/// The queue a successful create record made, `queue_id` being the id it returned.
fn created(queue_id: QueueId, c: &QueueCreate) -> CreatedQueue {
    CreatedQueue {
        queue_id,
        context_id: c.context_id,
        gpu_id: c.gpu_id,
        queue_type: c.queue_type,
        priority: c.priority,
        percentage: c.percentage,
        ring_base: c.ring_base,
        ring_size: c.ring_size,
        read_pointer_address: c.read_pointer,
        write_pointer_address: c.write_pointer,
        doorbell_offset: c.doorbell_offset,
        cwsr_address: c.cwsr_address,
        cwsr_size: c.cwsr_size,
    }
}

/// The map.
#[derive(Debug, Default)]
pub struct Registry {
    pub processes: BTreeMap<HostPid, ProcessEntry>,
    /// Processes that exited during the trace, with their final counters, oldest first.
    pub finished: VecDeque<ProcessEntry>,
    /// Where identity is read for newly seen pids; `None` in tests (no /proc lookups).
    roots: Option<Roots>,
}

impl Registry {
    /// An empty map that looks up identities under `roots`.
    pub fn new(roots: Option<Roots>) -> Self {
        Self { roots, ..Default::default() }
    }

    /// Add every KFD process and queue that sysfs shows now; returns the scan's notes.
    pub fn bootstrap(&mut self, roots: &Roots) -> Vec<String> {
        let (processes, notes) = processes::scan(roots);
        for p in processes {
            let pid = p.pid();
            let entry = self.processes.entry(pid).or_insert_with(|| ProcessEntry {
                pid,
                comm: p.info.as_ref().and_then(|i| i.comm.clone()),
                ns_pid: p.info.as_ref().and_then(|i| i.ns_pid),
                container: p.info.as_ref().and_then(|i| i.container.clone()),
                queues: BTreeMap::new(),
                churn: Churn::default(),
                exited_ns: None,
            });
            for q in &p.sysfs.queues {
                let key = QueueKey { context: q.context, queue_id: q.queue_id };
                entry.queues.insert(
                    key,
                    QueueEntry {
                        queue_id: key.queue_id,
                        context_id: key.context_id(),
                        gpu_id: q.gpu_id,
                        queue_type: Some(q.type_name()),
                        priority: None,
                        percentage: None,
                        ring_base: None,
                        ring_size: q.ring_size,
                        state: QueueState::Active,
                        since_ns: 0,
                        bootstrapped: true,
                    },
                );
            }
        }
        notes
    }

    /// The process `pid`: running, or the last one of that pid that exited (pids are reused).
    pub fn lookup(&self, pid: HostPid) -> Option<&ProcessEntry> {
        self.processes.get(&pid).or_else(|| self.finished.iter().rev().find(|p| p.pid == pid))
    }

    fn process(&mut self, pid: HostPid, comm: Option<&str>) -> &mut ProcessEntry {
        let roots = self.roots.as_ref();
        let entry = self.processes.entry(pid).or_insert_with(|| ProcessEntry::new(pid, roots));
        if entry.comm.is_none() {
            entry.comm = comm.map(str::to_owned);
        }
        entry
    }

    /// Queues of `pid` on `gpu` (all GPUs when unknown).
    fn queues_on(&mut self, pid: HostPid, gpu: Option<GpuId>) -> impl Iterator<Item = &mut QueueEntry> {
        self.processes
            .get_mut(&pid)
            .into_iter()
            .flat_map(|p| p.queues.values_mut())
            .filter(move |q| gpu.is_none() || q.gpu_id.is_none() || q.gpu_id == gpu)
    }

    /// Active queues of every process except `except` on `gpus` (all GPUs when empty): what a
    /// device-wide HWS unmap preempts besides the target.
    pub fn active_queues_of_others(&self, except: Option<HostPid>, gpus: &[GpuId]) -> Vec<Collateral> {
        let mut out = Vec::new();
        for p in self.processes.values().filter(|p| Some(p.pid) != except) {
            for q in p.queues.values().filter(|q| q.state == QueueState::Active) {
                let on_gpu = gpus.is_empty() || q.gpu_id.is_none_or(|g| gpus.contains(&g));
                if on_gpu {
                    out.push(Collateral {
                        pid: p.pid,
                        queue_id: q.queue_id,
                        context_id: q.context_id,
                        gpu_id: q.gpu_id,
                    });
                }
            }
        }
        out
    }

    /// The GPUs `pid` has queues on.
    pub fn gpus_of(&self, pid: HostPid) -> Vec<GpuId> {
        let mut gpus: Vec<GpuId> =
            self.processes.get(&pid).map(|p| p.queues.values().filter_map(|q| q.gpu_id).collect()).unwrap_or_default();
        gpus.sort_unstable();
        gpus.dedup();
        gpus
    }

    /// Forget finished processes beyond `keep` entries or that exited before `before_ns`;
    /// calls `forgotten` with each.
    pub(super) fn expire(&mut self, keep: usize, before_ns: Option<u64>, mut forgotten: impl FnMut(HostPid)) {
        while let Some(oldest) = self.finished.front() {
            let old = before_ns.is_some_and(|t| oldest.exited_ns.is_some_and(|x| x < t));
            if self.finished.len() <= keep && !old {
                break;
            }
            if let Some(p) = self.finished.pop_front() {
                forgotten(p.pid);
            }
        }
    }

    /// Apply one event; returns what it created or ended, for subscribers.
    pub fn apply(&mut self, e: &Event) -> Option<ModelNotice> {
        self.apply_in_full(e).and_then(Lifecycle::notice)
    }

    /// Apply one event; returns what it created or ended, a queue's change in full.
    pub fn apply_in_full(&mut self, e: &Event) -> Option<Lifecycle> {
        let ts = e.ts_ns;
        match &e.kind {
            // Only a create that succeeded made a queue (a failed one has no id either).
            EventKind::QueueCreate(c) if c.result.is_ok() => {
                let queue = created(c.queue_id?, c);
                let p = self.process(e.pid, Some(&e.comm));
                p.churn.queues_created += 1;
                let queue_type = queue.queue_type;
                p.queues.insert(
                    queue.key(),
                    QueueEntry {
                        queue_id: queue.queue_id,
                        context_id: queue.context_id,
                        gpu_id: Some(queue.gpu_id),
                        queue_type: Some(queue_type.name().map_or_else(|| queue_type.to_string(), str::to_owned)),
                        priority: Some(queue.priority),
                        percentage: Some(queue.percentage),
                        ring_base: Some(queue.ring_base),
                        ring_size: Some(u64::from(queue.ring_size)),
                        state: QueueState::Active,
                        since_ns: ts,
                        bootstrapped: false,
                    },
                );
                Some(Lifecycle::Queue(QueueNotice::Created { pid: e.pid, ts_ns: ts, queue }))
            }
            EventKind::QueueDestroy(d) if d.result.is_ok() => {
                self.remove_queue(e.pid, QueueKey::new(d.context_id, d.queue_id), ts, GoneCause::Destroyed)
            }
            EventKind::QueueRemoved(r) => {
                let (Some(pid), Some(queue_id)) = (r.owner_pid, r.queue_id) else { return None };
                // In its owner's own task the removal is a step of its DESTROY_QUEUE: since
                // Linux 6.2 pqm_destroy_queue (kfd_process_queue_manager.c) deletes the sysfs
                // entry only once the queue is freed — after a destroy that succeeded or timed
                // out (-ETIME: the ioctl fails, the queue is gone all the same) — so the removal,
                // not the ioctl's result, says the queue went, a few µs before the return. (Up
                // to 6.1 it came first and a destroy could still fail after it: rare, and the
                // queue then lingers in the kernel, not in gpreempt's map.) A destroy that
                // returns 0 with no removal seen ends the queue too (a lost record). Teardown
                // removes queues in KFD's worker, with no destroy ioctl.
                let cause = if pid == e.pid { GoneCause::Destroyed } else { GoneCause::TornDown };
                self.remove_queue(pid, QueueKey::new(r.context_id, queue_id), ts, cause)
            }
            EventKind::QueueUpdate(u) if u.result.is_ok() => {
                let key = QueueKey::new(u.context_id, u.queue_id);
                if let Some(q) = self.processes.get_mut(&e.pid).and_then(|p| p.queues.get_mut(&key)) {
                    q.priority = Some(u.priority);
                    q.percentage = Some(u.percentage);
                    q.ring_base = Some(u.ring_base);
                    q.ring_size = Some(u64::from(u.ring_size));
                }
                None
            }
            EventKind::ProcessOpen(o) => {
                let comm = (o.owner_pid == e.pid).then_some(e.comm.as_str());
                let known = self.processes.contains_key(&o.owner_pid);
                self.process(o.owner_pid, comm);
                (!known).then_some(Lifecycle::Process(ModelNotice::ProcessOpened { pid: o.owner_pid }))
            }
            EventKind::ProcessExit(x) => {
                let pid = x.owner_pid?;
                let mut p = self.processes.remove(&pid)?;
                p.exited_ns = Some(ts);
                self.finished.push_back(p);
                Some(Lifecycle::Process(ModelNotice::ProcessGone { pid }))
            }
            EventKind::QueueEviction(v) => {
                if let Some(p) = self.processes.get_mut(&v.target_pid) {
                    p.churn.evictions += 1;
                }
                for q in self.queues_on(v.target_pid, v.gpu_id) {
                    if q.state == QueueState::Active {
                        q.state = QueueState::Evicted;
                        q.since_ns = ts;
                    }
                }
                None
            }
            EventKind::QueueRestore(v) => {
                for q in self.queues_on(v.target_pid, v.gpu_id) {
                    if q.state == QueueState::Evicted {
                        q.state = QueueState::Active;
                        q.since_ns = ts;
                    }
                }
                None
            }
            EventKind::SuspendQueues(s) | EventKind::ResumeQueues(s) => {
                let resume = matches!(e.kind, EventKind::ResumeQueues(_));
                let pid = s.target_pid?;
                if !resume && let Some(p) = self.processes.get_mut(&pid) {
                    p.churn.suspends += 1;
                }
                let handled: Vec<QueueId> = s.queues.iter().filter(|o| o.handled()).map(|o| o.queue_id).collect();
                // Resume without an array (debugger DISABLE / exit) resumes every suspended queue.
                let all = resume && s.queues.is_empty() && s.result.is_ok();
                // DBG_TRAP reaches the primary context only (Linux 7.0, docs/kfd.md §1.4): a
                // secondary context's queue of the same id is another queue.
                for q in self.queues_on(pid, None).filter(|q| q.context_id.is_none()) {
                    if !(all || handled.contains(&q.queue_id)) {
                        continue;
                    }
                    let (from, to) = if resume {
                        (QueueState::Suspended, QueueState::Active)
                    } else {
                        (QueueState::Active, QueueState::Suspended)
                    };
                    // A suspended queue stays unmapped through evictions (QUEUE_IS_ACTIVE needs both clear).
                    if q.state == from || (!resume && q.state == QueueState::Evicted) {
                        q.state = to;
                        q.since_ns = ts;
                    }
                }
                None
            }
            _ => None,
        }
    }

    fn remove_queue(&mut self, pid: HostPid, key: QueueKey, ts_ns: u64, cause: GoneCause) -> Option<Lifecycle> {
        let p = self.processes.get_mut(&pid)?;
        p.queues.remove(&key)?;
        p.churn.queues_destroyed += 1;
        Some(Lifecycle::Queue(QueueNotice::Gone { pid, key, ts_ns, cause }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        domain::EvictionTrigger,
        event::{KernelResult, ProcessExit, QueueDestroy, QueueEviction, QueueRemoved, QueueRestore},
        model::QueueAddrs,
        test_support::{create, ev, suspend},
    };

    fn states(r: &Registry, pid: u32) -> Vec<(u32, QueueState)> {
        r.processes[&HostPid(pid)].queues.values().map(|q| (q.queue_id.0, q.state)).collect()
    }

    #[test]
    fn queues_follow_create_evict_suspend_resume_destroy_and_exit() {
        let mut r = Registry::new(None);
        assert_eq!(
            r.apply(&ev(10, 1, create(0, 0x1234))),
            Some(ModelNotice::QueueCreated {
                pid: HostPid(10),
                queue: QueueAddrs {
                    queue_id: QueueId(0),
                    gpu_id: GpuId(0x1234),
                    read: 0x7f00_0000_0080,
                    write: 0x7f00_0000_0038
                }
            })
        );
        r.apply(&ev(10, 2, create(1, 0x1234)));
        r.apply(&ev(10, 3, create(2, 0x5678)));
        r.apply(&ev(20, 4, create(0, 0x1234)));
        assert_eq!(r.processes[&HostPid(10)].comm.as_deref(), Some("p10"));
        // Eviction of pid 10 on one GPU only.
        let evict = EventKind::QueueEviction(QueueEviction {
            target_pid: HostPid(10),
            gpu_id: Some(GpuId(0x1234)),
            trigger: EvictionTrigger::Ttm,
        });
        r.apply(&ev(99, 5, evict));
        assert_eq!(states(&r, 10), [(0, QueueState::Evicted), (1, QueueState::Evicted), (2, QueueState::Active)]);
        r.apply(&ev(
            99,
            6,
            EventKind::QueueRestore(QueueRestore { target_pid: HostPid(10), gpu_id: Some(GpuId(0x1234)) }),
        ));
        assert!(states(&r, 10).iter().all(|(_, s)| *s == QueueState::Active));
        // Suspend 0 and 2; id 7 came back INVALID and changes nothing.
        r.apply(&ev(30, 7, suspend(10, &[0, 2, 7 | 1 << 31], false)));
        assert_eq!(states(&r, 10), [(0, QueueState::Suspended), (1, QueueState::Active), (2, QueueState::Suspended)]);
        assert_eq!(
            r.active_queues_of_others(Some(HostPid(10)), &[GpuId(0x1234)]),
            [Collateral { pid: HostPid(20), queue_id: QueueId(0), context_id: None, gpu_id: Some(GpuId(0x1234)) }]
        );
        r.apply(&ev(30, 8, suspend(10, &[0], true)));
        assert_eq!(states(&r, 10)[0], (0, QueueState::Active));
        // Resume without an array (DISABLE): everything.
        r.apply(&ev(30, 9, suspend(10, &[], true)));
        assert!(states(&r, 10).iter().all(|(_, s)| *s == QueueState::Active));
        // Destroy, then teardown removal of the rest, then exit.
        let destroy = EventKind::QueueDestroy(QueueDestroy {
            queue_id: QueueId(1),
            context_id: None,
            result: KernelResult(0),
            ret: 0,
        });
        assert_eq!(
            r.apply(&ev(10, 10, destroy)),
            Some(ModelNotice::QueueGone { pid: HostPid(10), queue_id: QueueId(1) })
        );
        let removed = QueueRemoved { owner_pid: Some(HostPid(10)), queue_id: Some(QueueId(0)), context_id: None };
        r.apply(&ev(5, 11, EventKind::QueueRemoved(removed)));
        assert_eq!(states(&r, 10), [(2, QueueState::Active)]);
        let exit =
            EventKind::ProcessExit(ProcessExit { owner_pid: Some(HostPid(10)), stage: "kfd_process_wq_release" });
        assert_eq!(r.apply(&ev(5, 12, exit)), Some(ModelNotice::ProcessGone { pid: HostPid(10) }));
        assert!(!r.processes.contains_key(&HostPid(10)));
        let gone = &r.finished[0];
        assert_eq!(gone.churn, Churn { queues_created: 3, queues_destroyed: 2, evictions: 1, suspends: 1 });
        assert_eq!((gone.exited_ns, r.lookup(HostPid(10)).map(|p| p.pid)), (Some(12), Some(HostPid(10))));
        assert_eq!(r.processes.keys().copied().collect::<Vec<_>>(), [HostPid(20)]);
    }

    /// Linux 7.0: a secondary KFD context's queue 0 and the primary's queue 0 of one pid are two
    /// queues (docs/kfd.md §1.4). Only the primary's are announced; a suspend reaches only them.
    #[test]
    fn a_secondary_context_s_queue_is_another_queue_of_the_same_id() {
        use crate::event::{KernelResult, QueueDestroy, QueueRemoved};
        let in_context = |context_id, kind: EventKind| match kind {
            EventKind::QueueCreate(c) => EventKind::QueueCreate(crate::event::QueueCreate { context_id, ..c }),
            other => other,
        };
        let mut r = Registry::new(None);
        let primary = r.apply(&ev(10, 1, create(0, 0x1234)));
        assert!(matches!(primary, Some(ModelNotice::QueueCreated { pid: HostPid(10), .. })));
        let secondary = r.apply_in_full(&ev(10, 2, in_context(Some(0), create(0, 0x1234))));
        assert_eq!(secondary.and_then(Lifecycle::notice), None, "not announced to the scheduler and the agent");
        let shown = secondary.and_then(Lifecycle::queue).map(|q| q.key().to_string());
        assert_eq!(shown.as_deref(), Some("context_0/0"), "in full, for the views");
        let keys: Vec<String> = r.processes[&HostPid(10)].queues.keys().map(ToString::to_string).collect();
        assert_eq!(keys, ["0", "context_0/0"]);
        let contexts: Vec<Option<u16>> = r.processes[&HostPid(10)].queues.values().map(|q| q.context_id).collect();
        assert_eq!(contexts, [None, Some(0)]);
        let json = serde_json::to_value(&r.processes[&HostPid(10)]).unwrap();
        assert_eq!(json["queues"]["context_0/0"]["context_id"], 0);
        assert_eq!(json["queues"]["0"]["context_id"], serde_json::Value::Null);
        // SUSPEND_QUEUES of id 0 reaches the primary's queue only.
        r.apply(&ev(30, 3, suspend(10, &[0], false)));
        let by_context: Vec<(Option<u16>, QueueState)> =
            r.processes[&HostPid(10)].queues.values().map(|q| (q.context_id, q.state)).collect();
        assert_eq!(by_context, [(None, QueueState::Suspended), (Some(0), QueueState::Active)]);
        // Another process's device-wide unmap preempts the secondary's active queue 0: collateral
        // named by its context, not the (suspended) primary's queue 0.
        let collateral = r.active_queues_of_others(Some(HostPid(99)), &[GpuId(0x1234)]);
        assert_eq!(
            collateral,
            [Collateral { pid: HostPid(10), queue_id: QueueId(0), context_id: Some(0), gpu_id: Some(GpuId(0x1234)) }]
        );
        assert_eq!(collateral[0].key().to_string(), "context_0/0");
        // The secondary's DESTROY_QUEUE (its removal, then its return) takes its own queue 0.
        let removal = QueueRemoved { owner_pid: Some(HostPid(10)), queue_id: Some(QueueId(0)), context_id: Some(0) };
        let gone = r.apply_in_full(&ev(10, 4, EventKind::QueueRemoved(removal)));
        assert_eq!(gone.and_then(Lifecycle::notice), None, "not announced");
        assert_eq!(gone.and_then(Lifecycle::queue).map(|q| q.key()), Some(QueueKey::new(Some(0), QueueId(0))));
        let destroy = QueueDestroy { queue_id: QueueId(0), context_id: Some(0), result: KernelResult(0), ret: 0 };
        assert_eq!(r.apply(&ev(10, 5, EventKind::QueueDestroy(destroy))), None);
        assert_eq!(states(&r, 10), [(0, QueueState::Suspended)], "the primary's queue 0 stays");
        let destroy = QueueDestroy { queue_id: QueueId(0), context_id: None, result: KernelResult(0), ret: 0 };
        assert_eq!(
            r.apply(&ev(10, 6, EventKind::QueueDestroy(destroy))),
            Some(ModelNotice::QueueGone { pid: HostPid(10), queue_id: QueueId(0) })
        );
        let churn = &r.processes[&HostPid(10)].churn;
        assert_eq!((churn.queues_created, churn.queues_destroyed), (2, 2));
    }

    #[test]
    fn a_reused_pid_finds_its_last_process_and_old_ones_expire() {
        let mut r = Registry::new(None);
        let exit =
            || EventKind::ProcessExit(ProcessExit { owner_pid: Some(HostPid(10)), stage: "kfd_process_wq_release" });
        for (ts, comm) in [(1, "first"), (3, "second")] {
            let mut e = ev(10, ts, create(0, 1));
            e.comm = comm.to_owned();
            r.apply(&e);
            r.apply(&ev(5, ts + 1, exit()));
        }
        assert_eq!(r.lookup(HostPid(10)).and_then(|p| p.comm.as_deref()), Some("second"));
        let mut forgotten = Vec::new();
        r.expire(8, Some(3), |pid| forgotten.push(pid));
        assert_eq!((forgotten.len(), r.finished.len()), (1, 1), "exited at 2, before 3");
        r.expire(0, None, |pid| forgotten.push(pid));
        assert_eq!((forgotten, r.finished.len()), (vec![HostPid(10), HostPid(10)], 0));
    }

    #[test]
    fn a_process_is_announced_once_and_again_when_its_pid_comes_back() {
        use crate::event::{ProcessExit, ProcessOpen};
        let open = |ts| ev(42, ts, EventKind::ProcessOpen(ProcessOpen { owner_pid: HostPid(42), kfd_process: 0x10 }));
        let exit = ev(0, 3, EventKind::ProcessExit(ProcessExit { owner_pid: Some(HostPid(42)), stage: "teardown" }));
        let mut r = Registry::new(None);
        assert_eq!(r.apply(&open(1)), Some(ModelNotice::ProcessOpened { pid: HostPid(42) }));
        assert_eq!(r.apply(&open(2)), None, "known already");
        assert_eq!(r.apply(&exit), Some(ModelNotice::ProcessGone { pid: HostPid(42) }));
        assert_eq!(r.apply(&exit), None, "gone already");
        assert_eq!(r.apply(&open(4)), Some(ModelNotice::ProcessOpened { pid: HostPid(42) }), "a reused pid");
    }

    #[test]
    fn only_a_create_that_succeeded_announces_a_queue_and_only_a_known_queue_goes() {
        use crate::event::{KernelResult, QueueCreate, QueueDestroy};
        let EventKind::QueueCreate(c) = create(3, 0x1000) else { unreachable!() };
        let failed = QueueCreate { result: KernelResult(-22), ret: -22, ..c };
        let mut r = Registry::new(None);
        assert_eq!(r.apply(&ev(7, 1, EventKind::QueueCreate(failed))), None);
        assert!(r.lookup(HostPid(7)).is_none_or(|p| p.queues.is_empty()));
        let destroy = |result| {
            EventKind::QueueDestroy(QueueDestroy {
                queue_id: QueueId(3),
                context_id: None,
                result: KernelResult(result),
                ret: result,
            })
        };
        assert_eq!(r.apply(&ev(7, 2, destroy(0))), None, "no such queue");
        r.apply(&ev(7, 3, create(3, 0x1000)));
        assert_eq!(r.apply(&ev(7, 4, destroy(-16))), None, "a failed destroy leaves it");
        assert_eq!(
            r.apply(&ev(7, 5, destroy(0))),
            Some(ModelNotice::QueueGone { pid: HostPid(7), queue_id: QueueId(3) })
        );
    }

    #[test]
    fn a_queue_notice_carries_the_create_arguments_the_time_and_why_the_queue_went() {
        use crate::{
            domain::QueueType,
            event::{KernelResult, QueueDestroy, QueueRemoved},
        };
        let removal = |id: u32| {
            EventKind::QueueRemoved(QueueRemoved {
                owner_pid: Some(HostPid(7)),
                queue_id: Some(QueueId(id)),
                context_id: None,
            })
        };
        let destroy = |id: u32, r: i64| {
            EventKind::QueueDestroy(QueueDestroy {
                queue_id: QueueId(id),
                context_id: None,
                result: KernelResult(r),
                ret: r,
            })
        };
        let EventKind::QueueCreate(mut c) = create(3, 0x1000) else { unreachable!() };
        c.queue_type = QueueType::Sdma;
        (c.priority, c.percentage, c.ring_base, c.ring_size) = (15, 50, 0x7f00_0010_0000, 8192);
        (c.doorbell_offset, c.cwsr_address, c.cwsr_size) = (Some(0x1800), 0x7f00_0100_0000, 0x2000);
        let mut r = Registry::new(None);
        let created = r.apply_in_full(&ev(7, 1_000, EventKind::QueueCreate(c)));
        let queue = CreatedQueue {
            queue_id: QueueId(3),
            context_id: None,
            gpu_id: GpuId(0x1000),
            queue_type: QueueType::Sdma,
            priority: 15,
            percentage: 50,
            ring_base: 0x7f00_0010_0000,
            ring_size: 8192,
            read_pointer_address: 0x7f00_0000_3080,
            write_pointer_address: 0x7f00_0000_3038,
            doorbell_offset: Some(0x1800),
            cwsr_address: 0x7f00_0100_0000,
            cwsr_size: 0x2000,
        };
        assert_eq!(created, Some(Lifecycle::Queue(QueueNotice::Created { pid: HostPid(7), ts_ns: 1_000, queue })));
        let addrs =
            QueueAddrs { queue_id: QueueId(3), gpu_id: GpuId(0x1000), read: 0x7f00_0000_3080, write: 0x7f00_0000_3038 };
        assert_eq!(
            created.and_then(Lifecycle::notice),
            Some(ModelNotice::QueueCreated { pid: HostPid(7), queue: addrs })
        );
        // Its DESTROY_QUEUE as the kernel writes it (Linux ≥ 6.2): the sysfs removal in its own
        // task once the queue is freed, then the ioctl's return, which finds it gone.
        let gone = r.apply_in_full(&ev(7, 2_000, removal(3)));
        let cause = GoneCause::Destroyed;
        assert_eq!(
            gone,
            Some(Lifecycle::Queue(QueueNotice::Gone {
                pid: HostPid(7),
                key: QueueKey::primary(QueueId(3)),
                ts_ns: 2_000,
                cause
            }))
        );
        assert_eq!(
            gone.and_then(Lifecycle::notice),
            Some(ModelNotice::QueueGone { pid: HostPid(7), queue_id: QueueId(3) })
        );
        assert_eq!(r.apply_in_full(&ev(7, 2_500, destroy(3, 0))), None, "gone at the removal");
        // A destroy that returned 0 with no removal seen (a lost record) ends the queue at its
        // return; one that failed with no removal leaves it.
        r.apply(&ev(7, 3_000, create(4, 0x1000)));
        r.apply(&ev(7, 3_001, create(5, 0x1000)));
        assert_eq!(r.apply_in_full(&ev(7, 3_100, destroy(4, -16))), None);
        assert_eq!(
            r.apply_in_full(&ev(7, 3_200, destroy(4, 0))),
            Some(Lifecycle::Queue(QueueNotice::Gone {
                pid: HostPid(7),
                key: QueueKey::primary(QueueId(4)),
                ts_ns: 3_200,
                cause
            }))
        );
        assert_eq!(states(&r, 7), [(5, QueueState::Active)]);
        // Teardown, in KFD's worker (pid 0 here), removes the rest.
        let cause = GoneCause::TornDown;
        assert_eq!(
            r.apply_in_full(&ev(0, 4_000, removal(5))),
            Some(Lifecycle::Queue(QueueNotice::Gone {
                pid: HostPid(7),
                key: QueueKey::primary(QueueId(5)),
                ts_ns: 4_000,
                cause
            }))
        );
        let exit = EventKind::ProcessExit(ProcessExit { owner_pid: Some(HostPid(7)), stage: "kfd_process_wq_release" });
        let gone = r.apply_in_full(&ev(0, 5_000, exit));
        assert_eq!(gone, Some(Lifecycle::Process(ModelNotice::ProcessGone { pid: HostPid(7) })));
        assert_eq!(gone.and_then(Lifecycle::queue), None);
    }
}
