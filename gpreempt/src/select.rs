//! Which processes a command acts on: a host pid, or every KFD process of a container
//! (`container:NAME`, where NAME is a container name, id or id prefix as `docker` accepts them).
//!
//! A selector resolves against the KFD processes of the moment ([`resolve`], the same scan as
//! `gpreempt ps`) and decides whether a process that opens `/dev/kfd` later belongs to it
//! ([`Selector::matches`], fed by the tracer's process-open notices). Container matching is
//! [`Container::matches`]: one rule for `ps`, the registry and the selectors.

use std::{fmt, str::FromStr};

use serde::Serialize;

use crate::{
    domain::HostPid,
    model::{
        procinfo::{self, Container},
        ps::{self, KfdProcess},
    },
    roots::Roots,
};

/// The prefix that names a container rather than a pid.
const CONTAINER_PREFIX: &str = "container:";

/// One `--online`/`--offline` value.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Selector {
    Pid(HostPid),
    /// Container name, full id or id prefix.
    Container(String),
}

/// Why a selector does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SelectorError {
    #[error("empty selector: give a host pid (e.g. 4242) or container:NAME")]
    Empty,
    #[error("`container:` needs a container name or id after it (e.g. container:trainer)")]
    EmptyContainer,
    #[error("`{0}` is neither a host pid nor container:NAME (see `gpreempt ps` for the KFD processes)")]
    Invalid(String),
    #[error("pid 0 names no process; give the host pid of a KFD process (see `gpreempt ps`)")]
    ZeroPid,
}

impl FromStr for Selector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(SelectorError::Empty);
        }
        if let Some(name) = s.strip_prefix(CONTAINER_PREFIX) {
            let name = name.trim();
            return if name.is_empty() { Err(SelectorError::EmptyContainer) } else { Ok(Self::Container(name.into())) };
        }
        match s.parse::<u32>() {
            Ok(0) => Err(SelectorError::ZeroPid),
            Ok(pid) => Ok(Self::Pid(HostPid(pid))),
            Err(_) => Err(SelectorError::Invalid(s.into())),
        }
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pid(pid) => write!(f, "{}", pid.0),
            Self::Container(name) => write!(f, "{CONTAINER_PREFIX}{name}"),
        }
    }
}

impl Selector {
    /// Does the process `pid`, in `container` (if any), belong to this selector?
    pub fn matches(&self, pid: HostPid, container: Option<&Container>) -> bool {
        match self {
            Self::Pid(p) => *p == pid,
            Self::Container(name) => container.is_some_and(|c| c.matches(name)),
        }
    }

    /// [`Selector::matches`] for a process of a `ps` scan.
    pub fn matches_process(&self, p: &KfdProcess) -> bool {
        self.matches(HostPid(p.pid()), p.info.as_ref().and_then(|i| i.container.as_ref()))
    }

    /// [`Selector::matches`] for a pid seen opening `/dev/kfd` now: its container is read from
    /// /proc (a pid selector needs no lookup). False when the process is already gone.
    pub fn matches_new(&self, roots: &Roots, pid: HostPid) -> bool {
        match self {
            Self::Pid(p) => *p == pid,
            Self::Container(_) => procinfo::read_with(&roots.proc, &roots.docker, pid.0)
                .ok()
                .is_some_and(|info| self.matches(pid, info.container.as_ref())),
        }
    }
}

/// True when any of `selectors` takes the new process `pid`.
pub fn any_matches_new(selectors: &[Selector], roots: &Roots, pid: HostPid) -> bool {
    selectors.iter().any(|s| s.matches_new(roots, pid))
}

/// What a set of selectors names now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    /// KFD processes matched, in pid order, without repeats.
    pub pids: Vec<HostPid>,
    /// Pid selectors that name no KFD process now (the caller decides whether that is an error:
    /// see [`crate::kfd::target::Target`] for why).
    pub unmatched_pids: Vec<HostPid>,
    /// Container selectors with no KFD process now (their processes may start later).
    pub empty_containers: Vec<String>,
    /// What the scan could not read.
    pub notes: Vec<String>,
}

/// Match `selectors` against the KFD processes under `roots` now.
pub fn resolve(selectors: &[Selector], roots: &Roots) -> Resolved {
    let (processes, notes) = ps::scan(roots);
    resolve_in(selectors, &processes, notes)
}

/// [`resolve`] over an already scanned process list.
pub fn resolve_in(selectors: &[Selector], processes: &[KfdProcess], notes: Vec<String>) -> Resolved {
    let mut out = Resolved { notes, ..Resolved::default() };
    for sel in selectors {
        let hits: Vec<HostPid> =
            processes.iter().filter(|p| sel.matches_process(p)).map(|p| HostPid(p.pid())).collect();
        if hits.is_empty() {
            match sel {
                Selector::Pid(pid) => out.unmatched_pids.push(*pid),
                Selector::Container(name) => out.empty_containers.push(name.clone()),
            }
        }
        out.pids.extend(hits);
    }
    out.pids.sort_unstable();
    out.pids.dedup();
    out
}

#[cfg(test)]
mod tests {
    use std::{fs, path::Path};

    use super::*;

    const ID_A: &str = "3f1b6c0f5e2d4a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b";
    const ID_B: &str = "aa1b6c0f5e2d4a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b";

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }

    /// KFD processes 100 and 101 in Docker container "trainer", 200 in "server", 300 on the
    /// host; 400 runs in "trainer" but never opened /dev/kfd.
    fn host() -> (tempfile::TempDir, Roots) {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        for (pid, id) in [(100, Some(ID_A)), (101, Some(ID_A)), (200, Some(ID_B)), (300, None), (400, Some(ID_A))] {
            if pid != 400 {
                write(r, &format!("sys/class/kfd/kfd/proc/{pid}/pasid"), "32770\n");
            }
            write(r, &format!("proc/{pid}/comm"), "python3\n");
            write(r, &format!("proc/{pid}/status"), &format!("Name:\tpython3\nNSpid:\t{pid}\n"));
            let cgroup =
                id.map_or_else(|| "0::/user.slice\n".to_owned(), |id| format!("0::/system.slice/docker-{id}.scope\n"));
            write(r, &format!("proc/{pid}/cgroup"), &cgroup);
        }
        write(r, &format!("docker/containers/{ID_A}/config.v2.json"), r#"{"Name":"/trainer"}"#);
        write(r, &format!("docker/containers/{ID_B}/config.v2.json"), r#"{"Name":"/server"}"#);
        let roots = Roots { sys: r.join("sys"), proc: r.join("proc"), docker: r.join("docker"), ..Roots::default() };
        (dir, roots)
    }

    #[test]
    fn parses_pids_and_containers_with_clear_errors() {
        assert_eq!("4242".parse(), Ok(Selector::Pid(HostPid(4242))));
        assert_eq!(" 7 ".parse(), Ok(Selector::Pid(HostPid(7))));
        assert_eq!("container:trainer".parse(), Ok(Selector::Container("trainer".into())));
        assert_eq!("container:3f1b6c".parse(), Ok(Selector::Container("3f1b6c".into())));
        assert_eq!("".parse::<Selector>(), Err(SelectorError::Empty));
        assert_eq!("container:".parse::<Selector>(), Err(SelectorError::EmptyContainer));
        assert_eq!("0".parse::<Selector>(), Err(SelectorError::ZeroPid));
        assert_eq!("trainer".parse::<Selector>(), Err(SelectorError::Invalid("trainer".into())));
        assert_eq!("-5".parse::<Selector>(), Err(SelectorError::Invalid("-5".into())));
        let err = "pod:x".parse::<Selector>().unwrap_err().to_string();
        assert_eq!(err, "`pod:x` is neither a host pid nor container:NAME (see `gpreempt ps` for the KFD processes)");
        assert_eq!(Selector::Container("trainer".into()).to_string(), "container:trainer");
        assert_eq!(Selector::Pid(HostPid(9)).to_string(), "9");
    }

    #[test]
    fn resolves_against_the_kfd_processes_of_the_moment() {
        let (_dir, roots) = host();
        let sels: Vec<Selector> =
            ["container:trainer", "300", "999", "container:nothing"].iter().map(|s| s.parse().unwrap()).collect();
        let r = resolve(&sels, &roots);
        assert_eq!(r.pids, vec![HostPid(100), HostPid(101), HostPid(300)]);
        assert_eq!(r.unmatched_pids, vec![HostPid(999)]);
        assert_eq!(r.empty_containers, vec!["nothing".to_owned()]);
        assert_eq!(r.notes, Vec::<String>::new());
        // An id prefix names the same container; the same pid twice is one process.
        let r = resolve(&["container:aa1b6c".parse().unwrap(), "200".parse().unwrap()], &roots);
        assert_eq!(r.pids, vec![HostPid(200)]);
        // A pid that never opened /dev/kfd is not a KFD process.
        let r = resolve(&["400".parse().unwrap()], &roots);
        assert_eq!((r.pids, r.unmatched_pids), (vec![], vec![HostPid(400)]));
    }

    #[test]
    fn matches_a_process_that_opens_kfd_later() {
        let (_dir, roots) = host();
        let trainer: Selector = "container:trainer".parse().unwrap();
        assert!(trainer.matches_new(&roots, HostPid(400)));
        assert!(!trainer.matches_new(&roots, HostPid(200)));
        assert!(!trainer.matches_new(&roots, HostPid(300)));
        // Gone before it could be looked at: not taken.
        assert!(!trainer.matches_new(&roots, HostPid(12345)));
        assert!(Selector::Pid(HostPid(12345)).matches_new(&roots, HostPid(12345)));
        let sels = vec!["200".parse().unwrap(), trainer];
        assert!(any_matches_new(&sels, &roots, HostPid(101)));
        assert!(!any_matches_new(&sels, &roots, HostPid(300)));
    }
}
