//! The live PID → queue map: bootstrapped from `/sys/class/kfd/kfd/proc/<pid>/queues/` for
//! queues that existed before the tracer started, then kept current by applying events.
//!
//! Per queue: state (Active / Evicted / Suspended) and attributes; per process: host pid, comm,
//! container and the pid inside it (from /proc, read once when the process is first seen), and
//! the churn counters the exit summary reports. A process whose KFD state is torn down leaves
//! the map (its counters stay in [`Registry::finished`]).

use std::{collections::BTreeMap, fmt::Write as _};

use serde::Serialize;

use super::{
    procinfo::{self, Container},
    ps::{self, Roots},
};
use crate::trace::decode::{Event, EventKind};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueState {
    Active,
    /// Unmapped by the eviction path (TTM, SVM, userptr, system suspend, CRIU).
    Evicted,
    /// Unmapped by a debugger's SUSPEND_QUEUES.
    Suspended,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueEntry {
    pub queue_id: u32,
    pub gpu_id: Option<u32>,
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
    pub pid: u32,
    pub comm: Option<String>,
    /// Pid inside its pid namespace (NSpid), equal to `pid` on the host.
    pub ns_pid: Option<u32>,
    pub container: Option<Container>,
    pub queues: BTreeMap<u32, QueueEntry>,
    pub churn: Churn,
}

impl ProcessEntry {
    fn new(pid: u32, roots: Option<&Roots>) -> Self {
        let info = roots.and_then(|r| procinfo::read_with(&r.proc, &r.docker, pid).ok());
        Self {
            pid,
            comm: info.as_ref().and_then(|i| i.comm.clone()),
            ns_pid: info.as_ref().and_then(|i| i.ns_pid),
            container: info.and_then(|i| i.container),
            queues: BTreeMap::new(),
            churn: Churn::default(),
        }
    }

    /// Does `filter` (container name, full id or id prefix) name this process's container?
    pub fn in_container(&self, filter: &str) -> bool {
        let Some(c) = &self.container else { return false };
        c.name.as_deref() == Some(filter) || (!filter.is_empty() && c.id.starts_with(filter))
    }
}

/// The map.
#[derive(Debug, Default)]
pub struct Registry {
    pub processes: BTreeMap<u32, ProcessEntry>,
    /// Processes that exited during the trace, with their final counters.
    pub finished: Vec<ProcessEntry>,
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
        let (processes, notes) = ps::scan(roots);
        for p in processes {
            let entry = self.processes.entry(p.pid()).or_insert_with(|| ProcessEntry {
                pid: p.pid(),
                comm: p.info.as_ref().and_then(|i| i.comm.clone()),
                ns_pid: p.info.as_ref().and_then(|i| i.ns_pid),
                container: p.info.as_ref().and_then(|i| i.container.clone()),
                queues: BTreeMap::new(),
                churn: Churn::default(),
            });
            for q in &p.sysfs.queues {
                entry.queues.insert(
                    q.queue_id,
                    QueueEntry {
                        queue_id: q.queue_id,
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

    fn process(&mut self, pid: u32, comm: Option<&str>) -> &mut ProcessEntry {
        let roots = self.roots.as_ref();
        let entry = self.processes.entry(pid).or_insert_with(|| ProcessEntry::new(pid, roots));
        if entry.comm.is_none() {
            entry.comm = comm.map(str::to_owned);
        }
        entry
    }

    /// Queues of `pid` on `gpu` (all GPUs when unknown).
    fn queues_on(&mut self, pid: u32, gpu: Option<u32>) -> impl Iterator<Item = &mut QueueEntry> {
        self.processes
            .get_mut(&pid)
            .into_iter()
            .flat_map(|p| p.queues.values_mut())
            .filter(move |q| gpu.is_none() || q.gpu_id.is_none() || q.gpu_id == gpu)
    }

    /// Active queues of every process except `except` on `gpu` (all GPUs when unknown): what a
    /// device-wide HWS unmap preempts besides the target.
    pub fn active_queues_of_others(&self, except: Option<u32>, gpus: &[u32]) -> Vec<(u32, u32, Option<u32>)> {
        let mut out = Vec::new();
        for p in self.processes.values().filter(|p| Some(p.pid) != except) {
            for q in p.queues.values().filter(|q| q.state == QueueState::Active) {
                let on_gpu = gpus.is_empty() || q.gpu_id.is_none_or(|g| gpus.contains(&g));
                if on_gpu {
                    out.push((p.pid, q.queue_id, q.gpu_id));
                }
            }
        }
        out
    }

    /// The GPUs `pid` has queues on.
    pub fn gpus_of(&self, pid: u32) -> Vec<u32> {
        let mut gpus: Vec<u32> =
            self.processes.get(&pid).map(|p| p.queues.values().filter_map(|q| q.gpu_id).collect()).unwrap_or_default();
        gpus.sort_unstable();
        gpus.dedup();
        gpus
    }

    /// Apply one event.
    pub fn apply(&mut self, e: &Event) {
        let ts = e.ts_ns;
        match &e.kind {
            EventKind::QueueCreate(c) => {
                let Some(queue_id) = c.queue_id else { return };
                let p = self.process(e.pid, Some(&e.comm));
                p.churn.queues_created += 1;
                p.queues.insert(
                    queue_id,
                    QueueEntry {
                        queue_id,
                        gpu_id: Some(c.gpu_id),
                        queue_type: Some(c.queue_type.clone()),
                        priority: Some(c.priority),
                        percentage: Some(c.percentage),
                        ring_base: Some(c.ring_base),
                        ring_size: Some(u64::from(c.ring_size)),
                        state: QueueState::Active,
                        since_ns: ts,
                        bootstrapped: false,
                    },
                );
            }
            EventKind::QueueDestroy(d) if d.result.is_ok() => {
                if let Some(p) = self.processes.get_mut(&e.pid)
                    && p.queues.remove(&d.queue_id).is_some()
                {
                    p.churn.queues_destroyed += 1;
                }
            }
            EventKind::QueueRemoved(r) => {
                // Teardown removes queues without a destroy ioctl; the destroy path was counted above.
                let (Some(pid), Some(queue_id)) = (r.owner_pid, r.queue_id) else { return };
                if let Some(p) = self.processes.get_mut(&pid)
                    && p.queues.remove(&queue_id).is_some()
                {
                    p.churn.queues_destroyed += 1;
                }
            }
            EventKind::QueueUpdate(u) if u.result.is_ok() => {
                if let Some(q) = self.processes.get_mut(&e.pid).and_then(|p| p.queues.get_mut(&u.queue_id)) {
                    q.priority = Some(u.priority);
                    q.percentage = Some(u.percentage);
                    q.ring_base = Some(u.ring_base);
                    q.ring_size = Some(u64::from(u.ring_size));
                }
            }
            EventKind::ProcessOpen(o) => {
                let comm = (o.owner_pid == e.pid).then_some(e.comm.as_str());
                self.process(o.owner_pid, comm);
            }
            EventKind::ProcessExit(x) => {
                if let Some(pid) = x.owner_pid
                    && let Some(p) = self.processes.remove(&pid)
                {
                    self.finished.push(p);
                }
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
            }
            EventKind::QueueRestore(v) => {
                for q in self.queues_on(v.target_pid, v.gpu_id) {
                    if q.state == QueueState::Evicted {
                        q.state = QueueState::Active;
                        q.since_ns = ts;
                    }
                }
            }
            EventKind::SuspendQueues(s) | EventKind::ResumeQueues(s) => {
                let resume = matches!(e.kind, EventKind::ResumeQueues(_));
                let Some(pid) = s.target_pid else { return };
                if !resume && let Some(p) = self.processes.get_mut(&pid) {
                    p.churn.suspends += 1;
                }
                let handled: Vec<u32> =
                    s.queues.iter().filter(|o| !o.invalid && !o.error).map(|o| o.queue_id).collect();
                // Resume without an array (debugger DISABLE / exit) resumes every suspended queue.
                let all = resume && s.queues.is_empty() && s.result.is_ok();
                for q in self.queues_on(pid, None) {
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
            }
            _ => {}
        }
    }

    /// A human table of the map (processes in pid order, queues in id order).
    pub fn render(&self, filter: impl Fn(&ProcessEntry) -> bool) -> String {
        let mut out = String::new();
        let shown: Vec<&ProcessEntry> = self.processes.values().filter(|p| filter(p)).collect();
        let _ = writeln!(out, "queue map: {} process(es)", shown.len());
        for p in shown {
            let container = p
                .container
                .as_ref()
                .map(|c| {
                    format!(" {} {}", c.runtime, c.name.clone().unwrap_or_else(|| procinfo::short_id(&c.id).to_owned()))
                })
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  pid {} ({}){container} nspid {} queues {}",
                p.pid,
                p.comm.as_deref().unwrap_or("?"),
                p.ns_pid.map_or_else(|| "?".to_owned(), |n| n.to_string()),
                p.queues.len()
            );
            for q in p.queues.values() {
                let _ = writeln!(
                    out,
                    "    queue {:>4} gpu {} {:<12} {:<9} prio {}",
                    q.queue_id,
                    q.gpu_id.map_or_else(|| "?".to_owned(), |g| format!("{g:#06x}")),
                    q.queue_type.as_deref().unwrap_or("?"),
                    format!("{:?}", q.state).to_lowercase(),
                    q.priority.map_or_else(|| "?".to_owned(), |p| p.to_string()),
                );
            }
        }
        out
    }

    /// The map as JSON (`{"event":"queue_map","processes":[…]}`).
    pub fn to_json(&self, filter: impl Fn(&ProcessEntry) -> bool, ts_ns: u64) -> serde_json::Value {
        let processes: Vec<&ProcessEntry> = self.processes.values().filter(|p| filter(p)).collect();
        serde_json::json!({ "event": "queue_map", "ts_ns": ts_ns, "processes": processes })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::trace::decode::{
        KernelResult, ProcessExit, QueueCreate, QueueDestroy, QueueEviction, QueueOutcome, QueueRemoved, QueueRestore,
        QueueSuspend,
    };

    pub(crate) fn ev(pid: u32, ts_ns: u64, kind: EventKind) -> Event {
        Event { ts_ns, entry_ns: ts_ns, cpu: 0, pid, tid: pid, comm: format!("p{pid}"), kind }
    }

    pub(crate) fn create(queue_id: u32, gpu_id: u32) -> EventKind {
        EventKind::QueueCreate(QueueCreate {
            queue_id: Some(queue_id),
            gpu_id,
            queue_type: "compute-aql".to_owned(),
            priority: 7,
            percentage: 100,
            ring_base: 0x1000,
            ring_size: 4096,
            read_pointer: 0,
            write_pointer: 0,
            doorbell_offset: Some(0),
            eop_buffer: 0,
            eop_buffer_size: 0,
            cwsr_address: 0,
            cwsr_size: 0,
            ctl_stack_size: 0,
            result: KernelResult(0),
            ret: 0,
        })
    }

    pub(crate) fn suspend(target: u32, ids: &[u32], resume: bool) -> EventKind {
        let s = QueueSuspend {
            target_pid: Some(target),
            num_queues: ids.len() as u32,
            grace_period: None,
            exception_clear_mask: None,
            queues: ids
                .iter()
                .map(|&raw| QueueOutcome { queue_id: raw & 0x3fff_ffff, invalid: raw >> 31 == 1, error: false })
                .collect(),
            handled: Some(ids.iter().filter(|&&r| r >> 31 == 0).count() as u32),
            result: KernelResult(0),
            ret: 0,
        };
        if resume { EventKind::ResumeQueues(s) } else { EventKind::SuspendQueues(s) }
    }

    fn states(r: &Registry, pid: u32) -> Vec<(u32, QueueState)> {
        r.processes[&pid].queues.values().map(|q| (q.queue_id, q.state)).collect()
    }

    #[test]
    fn queues_follow_create_evict_suspend_resume_destroy_and_exit() {
        let mut r = Registry::new(None);
        r.apply(&ev(10, 1, create(0, 0x1234)));
        r.apply(&ev(10, 2, create(1, 0x1234)));
        r.apply(&ev(10, 3, create(2, 0x5678)));
        r.apply(&ev(20, 4, create(0, 0x1234)));
        assert_eq!(r.processes[&10].comm.as_deref(), Some("p10"));
        // Eviction of pid 10 on one GPU only.
        let evict =
            EventKind::QueueEviction(QueueEviction { target_pid: 10, gpu_id: Some(0x1234), trigger: "ttm".into() });
        r.apply(&ev(99, 5, evict));
        assert_eq!(states(&r, 10), [(0, QueueState::Evicted), (1, QueueState::Evicted), (2, QueueState::Active)]);
        r.apply(&ev(99, 6, EventKind::QueueRestore(QueueRestore { target_pid: 10, gpu_id: Some(0x1234) })));
        assert!(states(&r, 10).iter().all(|(_, s)| *s == QueueState::Active));
        // Suspend 0 and 2; id 7 came back INVALID and changes nothing.
        r.apply(&ev(30, 7, suspend(10, &[0, 2, 7 | 1 << 31], false)));
        assert_eq!(states(&r, 10), [(0, QueueState::Suspended), (1, QueueState::Active), (2, QueueState::Suspended)]);
        assert_eq!(r.active_queues_of_others(Some(10), &[0x1234]), [(20, 0, Some(0x1234))]);
        r.apply(&ev(30, 8, suspend(10, &[0], true)));
        assert_eq!(states(&r, 10)[0], (0, QueueState::Active));
        // Resume without an array (DISABLE): everything.
        r.apply(&ev(30, 9, suspend(10, &[], true)));
        assert!(states(&r, 10).iter().all(|(_, s)| *s == QueueState::Active));
        // Destroy, then teardown removal of the rest, then exit.
        let destroy = EventKind::QueueDestroy(QueueDestroy { queue_id: 1, result: KernelResult(0), ret: 0 });
        r.apply(&ev(10, 10, destroy));
        r.apply(&ev(5, 11, EventKind::QueueRemoved(QueueRemoved { owner_pid: Some(10), queue_id: Some(0) })));
        assert_eq!(states(&r, 10), [(2, QueueState::Active)]);
        let exit = EventKind::ProcessExit(ProcessExit { owner_pid: Some(10), stage: "kfd_process_wq_release" });
        r.apply(&ev(5, 12, exit));
        assert!(!r.processes.contains_key(&10));
        let gone = &r.finished[0];
        assert_eq!(gone.churn, Churn { queues_created: 3, queues_destroyed: 2, evictions: 1, suspends: 1 });
        assert_eq!(r.processes.keys().copied().collect::<Vec<_>>(), [20]);
    }

    #[test]
    fn render_and_json_show_every_queue() {
        let mut r = Registry::new(None);
        r.apply(&ev(10, 1, create(3, 0x1234)));
        assert_eq!(
            r.render(|_| true),
            "queue map: 1 process(es)\n  pid 10 (p10) nspid ? queues 1\n    queue    3 gpu 0x1234 compute-aql  active    prio 7\n"
        );
        let json = r.to_json(|_| true, 5);
        assert_eq!(json["processes"][0]["queues"]["3"]["state"], "active");
        assert_eq!(json["processes"][0]["pid"], 10);
        assert_eq!(r.render(|p| p.pid == 1), "queue map: 0 process(es)\n");
    }
}
