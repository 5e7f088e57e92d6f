//! Which events and processes a trace shows: `--pid`, `--container`, and `-- CMD` (the command
//! and its descendants). The model (map, spans) always sees every event; only output is filtered.

use std::{
    collections::{HashMap, HashSet},
    fs,
    path::PathBuf,
};

use crate::{
    domain::HostPid,
    event::{Event, EventKind},
    model::Model,
};

#[derive(Clone, Debug, Default)]
pub struct Filter {
    pids: HashSet<HostPid>,
    container: Option<String>,
    /// `-- CMD`: the command's host pid; its descendants are included too.
    root: Option<HostPid>,
    proc_root: PathBuf,
    /// Decisions per pid, dropped when the model forgets the pid ([`Filter::forget`]).
    decided: HashMap<HostPid, bool>,
}

/// The parent pid from `/proc/<pid>/stat` (`pid (comm) state ppid …`; comm may hold spaces
/// and parentheses, so parse after the last `)`).
pub fn parent_from_stat(stat: &str) -> Option<HostPid> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok().map(HostPid)
}

impl Filter {
    pub fn new(pids: &[HostPid], container: Option<String>, proc_root: impl Into<PathBuf>) -> Self {
        Self {
            pids: pids.iter().copied().collect(),
            container,
            root: None,
            proc_root: proc_root.into(),
            ..Default::default()
        }
    }

    /// Restrict to `pid` and its descendants (the `-- CMD` child).
    pub fn set_root(&mut self, pid: HostPid) {
        self.root = Some(pid);
        self.decided.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.pids.is_empty() && self.container.is_none() && self.root.is_none()
    }

    /// The model no longer knows `pid`: a later process may reuse it.
    pub fn forget(&mut self, pid: HostPid) {
        self.decided.remove(&pid);
    }

    fn descends_from_root(&self, pid: HostPid) -> bool {
        let Some(root) = self.root else { return true };
        let mut current = pid;
        // Bounded walk up the process tree (pid 1 / 0 end it).
        for _ in 0..64 {
            if current == root {
                return true;
            }
            if current.0 <= 1 {
                return false;
            }
            let Ok(stat) = fs::read_to_string(self.proc_root.join(current.to_string()).join("stat")) else {
                return false;
            };
            match parent_from_stat(&stat) {
                Some(parent) => current = parent,
                None => return false,
            }
        }
        false
    }

    /// Is host pid `pid` shown? Decided once per pid (a process cannot change container or parent
    /// chain in a way that matters here, and it may be gone from /proc later).
    pub fn keep_pid(&mut self, pid: HostPid, model: &Model) -> bool {
        if self.is_empty() {
            return true;
        }
        if let Some(&d) = self.decided.get(&pid) {
            return d;
        }
        let by_pid = self.pids.is_empty() || self.pids.contains(&pid);
        let by_container = match &self.container {
            None => true,
            Some(c) => model.process(pid).is_some_and(|p| p.in_container(c)),
        };
        let keep = by_pid && by_container && self.descends_from_root(pid);
        // A container lookup that failed because the process was not in the map yet is retried.
        if self.container.is_none() || model.process(pid).is_some() {
            self.decided.insert(pid, keep);
        }
        keep
    }

    /// An event is shown when its caller or the process it is about is shown.
    pub fn keep_event(&mut self, e: &Event, model: &Model) -> bool {
        if self.is_empty() {
            return true;
        }
        let about = match &e.kind {
            EventKind::QueueEviction(v) => Some(v.target_pid),
            EventKind::QueueRestore(v) => Some(v.target_pid),
            EventKind::SuspendQueues(s) | EventKind::ResumeQueues(s) => s.target_pid,
            EventKind::KfdCall(c) => c.owner_pid,
            EventKind::ProcessOpen(p) => Some(p.owner_pid),
            EventKind::ProcessExit(p) => p.owner_pid,
            EventKind::QueueRemoved(q) => q.owner_pid,
            EventKind::QueueReset(q) => q.owner_pid,
            _ => None,
        };
        // Kworker-context events are about their owner, not the kworker.
        let caller_counts = !matches!(
            e.kind,
            EventKind::QueueEviction(_)
                | EventKind::QueueRestore(_)
                | EventKind::ProcessExit(_)
                | EventKind::QueueRemoved(_)
                | EventKind::QueueReset(_)
        );
        (caller_counts && self.keep_pid(e.pid, model)) || about.is_some_and(|p| self.keep_pid(p, model))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        domain::QueueId,
        event::QueueRemoved,
        test_support::{create, ev},
    };

    #[test]
    fn stat_parent_survives_odd_comms() {
        assert_eq!(parent_from_stat("42 (a) b) c) S 7 42 42 0"), Some(HostPid(7)));
        assert_eq!(parent_from_stat("1 (init) S 0 1 1"), Some(HostPid(0)));
        assert_eq!(parent_from_stat("garbage"), None);
    }

    #[test]
    fn pid_filter_keeps_callers_and_subjects() {
        let reg = Model::new(None);
        let mut f = Filter::new(&[HostPid(10)], None, "/nonexistent");
        assert!(f.keep_event(&ev(10, 1, create(0, 1)), &reg));
        assert!(!f.keep_event(&ev(11, 1, create(0, 1)), &reg));
        // A kworker (pid 3) removing pid 10's queue at teardown is about pid 10.
        let removed = EventKind::QueueRemoved(QueueRemoved {
            owner_pid: Some(HostPid(10)),
            queue_id: Some(QueueId(0)),
            context_id: None,
        });
        assert!(f.keep_event(&ev(3, 1, removed.clone()), &reg));
        let mut g = Filter::new(&[HostPid(3)], None, "/nonexistent");
        assert!(!g.keep_event(&ev(3, 1, removed), &reg), "the kworker itself is not the subject");
        assert!(Filter::new(&[], None, "/x").keep_event(&ev(1, 1, create(0, 1)), &reg));
    }

    #[test]
    fn command_filter_follows_the_process_tree() {
        let dir = tempfile::tempdir().unwrap();
        for (pid, ppid) in [(100, 1), (101, 100), (102, 101), (200, 1)] {
            let d = dir.path().join(pid.to_string());
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("stat"), format!("{pid} (x y) S {ppid} 0 0")).unwrap();
        }
        let reg = Model::new(None);
        let mut f = Filter::new(&[], None, dir.path());
        f.set_root(HostPid(100));
        assert!(f.keep_pid(HostPid(100), &reg));
        assert!(f.keep_pid(HostPid(102), &reg));
        assert!(!f.keep_pid(HostPid(200), &reg));
        assert!(!f.keep_pid(HostPid(999), &reg), "unknown pids are not the command's");
        f.forget(HostPid(200));
        assert!(!f.decided.contains_key(&HostPid(200)));
    }
}
