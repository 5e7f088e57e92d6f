//! `gpreempt preempt` on several offline targets at once: which processes the `--offline`
//! selectors name ([`plan`]), and the cycle run over all of them on the one thread that holds
//! their sessions ([`Group`]): each cycle suspends every target, holds (one `ppoll` over all the
//! sessions, [`wait_any`]), resumes every target, and waits the gap. Each target keeps its own
//! safety rails — its session's watchdog, its exit, its detach deadline — and its own records: a
//! target that exits or fails is detached and the others go on. Processes that open `/dev/kfd`
//! later inside a selected container are offered by the caller ([`Hooks::opened`]) and attached
//! for the next cycle.

use std::{
    os::fd::BorrowedFd,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use serde::Serialize;

use crate::{
    clock::monotonic_ns,
    controller::{
        measure::{CwsrAtStake, Cycle, Plan, Run, StopReason},
        session::{FDS_PER_SESSION, MAX_POLL_FDS, Session, Tally, Wake, wait_any},
        target::{Target, TargetError},
        vocabulary::{AttachedTarget, DebugError, Detached, Options},
    },
    domain::HostPid,
    host::{
        processes::KfdProcess,
        roots::Roots,
        select::{self, Selector},
    },
};

/// Targets one thread holds at most: [`wait_any`] polls two fds per session and the caller's
/// (Ctrl-C) within its limit.
pub const MAX_TARGETS: usize = (MAX_POLL_FDS - 1) / FDS_PER_SESSION;

/// Why a selection of offline targets is refused before anything is attached.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("`{0}` is given twice in --offline; give each target once")]
    Repeated(Selector),
    #[error(
        "--offline {0}: no KFD process runs in a container with that name, id or id prefix \
         (see `gpreempt ps` for the KFD processes and their containers); start its GPU work first — \
         processes that open /dev/kfd in it later are attached then"
    )]
    EmptyContainer(Selector),
    #[error(
        "--offline {0}: no KFD process runs in a pod that matches (see `gpreempt ps` for the KFD processes \
         and their pods); start its GPU work first — processes that open /dev/kfd in it later are attached then"
    )]
    EmptyPod(Selector),
    #[error(
        "pid {pid} is selected both as online and as offline (--offline {selector}); a process cannot be \
         preempted on behalf of itself: drop it from one side"
    )]
    Overlap { pid: HostPid, selector: Selector },
    #[error("--offline {selector}: {cause}")]
    Target { selector: Selector, cause: TargetError },
    #[error("--offline names {0} processes; one controller holds at most {MAX_TARGETS}: split the selection")]
    TooMany(usize),
}

/// The KFD processes `selectors` name now (pid order), checked: no selector twice, every pid a
/// KFD process that can be debugged, every container with a KFD process, and none of them the
/// online process.
pub fn plan(
    selectors: &[Selector],
    online: Option<HostPid>,
    processes: &[KfdProcess],
    roots: &Roots,
) -> Result<Vec<HostPid>, PlanError> {
    if let Some((_, s)) = selectors.iter().enumerate().find(|(i, s)| selectors[..*i].contains(s)) {
        return Err(PlanError::Repeated(s.clone()));
    }
    let resolved = select::resolve_in(selectors, processes, Vec::new(), roots);
    // The first container or pod selector with no KFD process, as given.
    let empty = selectors
        .iter()
        .find(|s| !matches!(s, Selector::Pid(_)) && !processes.iter().any(|p| s.matches_process(p, roots)));
    match empty {
        Some(s @ (Selector::Pod(_) | Selector::PodLabel(_))) => return Err(PlanError::EmptyPod(s.clone())),
        Some(s) => return Err(PlanError::EmptyContainer(s.clone())),
        None => {}
    }
    for &pid in &resolved.unmatched_pids {
        // Not a KFD process of the scan: the target check says exactly why (gone, never opened
        // /dev/kfd, a thread, …).
        let selector = Selector::Pid(pid);
        let target = Target::inspect(roots, pid)
            .map_err(|source| PlanError::Target { selector: selector.clone(), cause: source })?;
        target.check_debuggable(roots).map_err(|source| PlanError::Target { selector, cause: source })?;
    }
    let mut pids = resolved.pids;
    pids.extend(resolved.unmatched_pids);
    pids.sort_unstable();
    pids.dedup();
    if let Some(online) = online
        && pids.contains(&online)
    {
        let selector =
            selectors.iter().find(|s| takes(s, processes, roots, online)).cloned().unwrap_or(Selector::Pid(online));
        return Err(PlanError::Overlap { pid: online, selector });
    }
    if pids.len() > MAX_TARGETS {
        return Err(PlanError::TooMany(pids.len()));
    }
    Ok(pids)
}

/// Whether `selector` takes `pid` among `processes` (a pid selector takes its pid even when the
/// scan did not list it).
fn takes(selector: &Selector, processes: &[KfdProcess], roots: &Roots, pid: HostPid) -> bool {
    match selector {
        Selector::Pid(p) => *p == pid,
        Selector::Container(_) | Selector::Pod(_) | Selector::PodLabel(_) => {
            processes.iter().any(|p| p.pid() == pid && selector.matches_process(p, roots))
        }
    }
}

/// One offline target: what it did, from the cycle it joined.
#[derive(Clone, Debug, Serialize)]
pub struct Member {
    pub target: AttachedTarget,
    /// The first cycle it took part in (0 for the targets attached at start).
    pub first_iteration: u32,
    /// Attached later: it opened `/dev/kfd` in a selected container while the run went on.
    pub picked_up: bool,
    /// Its iterations (indexed by the group's cycle), notices, and why it left early.
    pub run: Run,
    /// Cycles whose suspend it could not take part in because its ROCm runtime was not enabled
    /// (yet): KFD refuses SUSPEND_QUEUES then (docs/kfd.md §2.1).
    pub runtime_not_enabled: u32,
    /// Set when it was detached (at the end, or when it exited or failed).
    pub detached: Option<Detached>,
}

/// What the caller does around the cycles.
pub trait Hooks {
    /// After each cycle, with every member (progress, the tracer's draining).
    fn cycle(&mut self, index: u32, members: &[Member]);
    /// Pids that opened `/dev/kfd` since the last call (the tracer's process events, or the
    /// sysfs process list); called between cycles.
    fn opened(&mut self, out: &mut Vec<HostPid>);
}

/// Several sessions on this thread, and the members they serve.
pub struct Group {
    sessions: Vec<Session>,
    /// `members` index of each session.
    of_session: Vec<usize>,
    members: Vec<Member>,
    selectors: Vec<Selector>,
    online: Option<HostPid>,
    options: Options,
    /// What happened outside any one member (a pick-up that could not attach).
    pub warnings: Vec<String>,
}

impl Group {
    /// Attach every pid of a [`plan`] on this thread; on an error the ones already attached are
    /// detached (their sessions drop).
    pub fn attach(
        pids: &[HostPid],
        selectors: &[Selector],
        online: Option<HostPid>,
        options: Options,
    ) -> Result<Self, DebugError> {
        let mut group = Self {
            sessions: Vec::with_capacity(MAX_TARGETS),
            of_session: Vec::with_capacity(MAX_TARGETS),
            members: Vec::new(),
            selectors: selectors.to_vec(),
            online,
            options,
            warnings: Vec::new(),
        };
        for &pid in pids {
            group.add(Session::attach(pid, &group.options)?, 0, false);
        }
        Ok(group)
    }

    pub fn members(&self) -> &[Member] {
        &self.members
    }

    fn add(&mut self, session: Session, first_iteration: u32, picked_up: bool) {
        self.members.push(Member {
            target: session.attached().clone(),
            first_iteration,
            picked_up,
            run: Run { iterations: Vec::new(), notices: Vec::new(), stopped: None, cwsr: None },
            runtime_not_enabled: 0,
            detached: None,
        });
        self.of_session.push(self.members.len() - 1);
        self.sessions.push(session);
    }

    /// A process that opened `/dev/kfd`: attached when a container or pod selector takes it and it is
    /// neither a member already nor the online process.
    fn offer(&mut self, pid: HostPid, next_iteration: u32) {
        let known = self.members.iter().any(|m| m.target.pid == pid && m.detached.is_none());
        let containers: Vec<Selector> =
            self.selectors.iter().filter(|s| matches!(s, Selector::Container(_) | Selector::Pod(_))).cloned().collect();
        if known || self.online == Some(pid) || !select::any_matches_new(&containers, &self.options.roots, pid) {
            return;
        }
        if self.sessions.len() >= MAX_TARGETS {
            self.warnings.push(format!("pid {pid} opened /dev/kfd in a selected container but {MAX_TARGETS} targets are held already: not attached"));
            return;
        }
        match Session::attach(pid, &self.options) {
            Ok(s) => self.add(s, next_iteration, true),
            Err(e) => self
                .warnings
                .push(format!("pid {pid} opened /dev/kfd in a selected container but was not attached: {e}")),
        }
    }

    /// Detach session `i` and close its member's record.
    fn leave(&mut self, i: usize, why: Option<StopReason>) {
        let mut session = self.sessions.remove(i);
        let m = self.of_session.remove(i);
        let member = &mut self.members[m];
        member.run.notices.extend(session.notices());
        member.run.stopped = why;
        member.detached = Some(session.detach());
    }

    /// Session index of the target `pid`.
    fn session_of(&self, pid: HostPid) -> Option<usize> {
        self.sessions.iter().position(|s| s.pid() == pid)
    }

    /// Run the plan over every member; `None` when every cycle ran. Returns early when `stop` is
    /// set or a fd of `wake` is readable (Ctrl-C), or when every target is gone. Never leaves a
    /// queue suspended past the cycle except through the members' own detach.
    pub fn run(
        &mut self,
        plan: &Plan,
        stop: &AtomicBool,
        wake: &[BorrowedFd<'_>],
        hooks: &mut impl Hooks,
    ) -> Option<StopReason> {
        let mut opened = Vec::new();
        let mut suspends: Vec<(HostPid, Result<Tally, DebugError>)> = Vec::with_capacity(MAX_TARGETS);
        for index in 0..plan.iterations {
            if stop.load(Ordering::Relaxed) {
                return Some(StopReason::Interrupted);
            }
            opened.clear();
            hooks.opened(&mut opened);
            for &pid in &opened {
                self.offer(pid, index);
            }
            if self.sessions.is_empty() {
                return Some(StopReason::AllTargetsGone);
            }
            for (s, &m) in self.sessions.iter_mut().zip(&self.of_session) {
                let run = &mut self.members[m].run;
                if run.iterations.is_empty() && run.cwsr.is_none() {
                    run.cwsr = CwsrAtStake::before_run(s, &plan.selection);
                }
            }
            suspends.clear();
            for s in &mut self.sessions {
                suspends.push((s.pid(), s.suspend_tally(&plan.selection, plan.grace_period)));
            }
            let held_from = monotonic_ns();
            let interrupted = match self.pause(held_from, plan.hold, stop, wake) {
                Ok(interrupted) => interrupted,
                Err(e) => return Some(StopReason::Failed(e.into())),
            };
            self.resume_and_record(index, &mut suspends);
            hooks.cycle(index, &self.members);
            if interrupted || stop.load(Ordering::Relaxed) {
                return Some(StopReason::Interrupted);
            }
            if index + 1 < plan.iterations {
                match self.pause(monotonic_ns(), plan.gap, stop, wake) {
                    Ok(false) => {}
                    Ok(true) => return Some(StopReason::Interrupted),
                    Err(e) => return Some(StopReason::Failed(e.into())),
                }
            }
        }
        None
    }

    /// Resume every member this cycle suspended and record its iteration; members whose target
    /// exited or whose ioctls failed are detached. `suspends` holds each target's pid with its
    /// suspend: a target that left during the hold has no session any more.
    fn resume_and_record(&mut self, index: u32, suspends: &mut Vec<(HostPid, Result<Tally, DebugError>)>) {
        let mut leaving: Vec<(HostPid, StopReason)> = Vec::new();
        for (pid, suspend) in suspends.drain(..) {
            let Some(i) = self.session_of(pid) else { continue };
            let (session, m) = (&mut self.sessions[i], self.of_session[i]);
            let suspend = match suspend {
                Ok(t) => t,
                Err(DebugError::RuntimeNotEnabled { .. }) => {
                    self.members[m].runtime_not_enabled += 1;
                    continue;
                }
                Err(e) => {
                    leaving.push((pid, StopReason::Failed(e.into())));
                    continue;
                }
            };
            let late = session.late_suspended();
            let (resume, watchdog) = match session.resume_held() {
                Ok(r) => r,
                Err(e) => {
                    leaving.push((pid, StopReason::Failed(e.into())));
                    continue;
                }
            };
            let cycle = Cycle { index, suspend, resume, late, watchdog };
            self.members[m].run.iterations.push(cycle.iteration());
        }
        for (pid, why) in leaving {
            if let Some(i) = self.session_of(pid) {
                self.leave(i, Some(why));
            }
        }
    }

    /// Wait `length` from `from_ns` over every session; true when interrupted. A target that
    /// exits meanwhile is detached and the wait goes on for the others.
    fn pause(
        &mut self,
        from_ns: u64,
        length: Duration,
        stop: &AtomicBool,
        wake: &[BorrowedFd<'_>],
    ) -> Result<bool, DebugError> {
        let deadline =
            Instant::now() + Duration::from_nanos((from_ns + length.as_nanos() as u64).saturating_sub(monotonic_ns()));
        loop {
            match wait_any(&mut self.sessions, deadline, wake) {
                Ok(Wake::Deadline) => return Ok(false),
                Ok(Wake::Ready(_)) => return Ok(true),
                Ok(Wake::Target | Wake::Watchdog) => {}
                Err(DebugError::TargetExited { pid, code }) => match self.session_of(pid) {
                    Some(i) => {
                        let e = DebugError::TargetExited { pid, code };
                        self.leave(i, Some(StopReason::Failed(e.into())));
                    }
                    None => return Err(DebugError::TargetExited { pid, code }),
                },
                Err(e) => return Err(e),
            }
            if stop.load(Ordering::Relaxed) {
                return Ok(true);
            }
        }
    }

    /// Resume, DISABLE and detach every member still attached; every member's record.
    pub fn detach(mut self) -> Vec<Member> {
        while !self.sessions.is_empty() {
            self.leave(0, None);
        }
        std::mem::take(&mut self.members)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{host::processes, test_support::FakeHost};

    const ID: &str = "5eed00000000000000000000000000000000000000000000000000000000abcd";

    /// KFD processes 100 and 101 in container "trainer", 300 on the host; 400 on the host never
    /// opened /dev/kfd.
    fn host() -> (FakeHost, Roots, Vec<KfdProcess>) {
        let mut host = FakeHost::new();
        for (pid, in_container, kfd) in [(100, true, true), (101, true, true), (300, false, true), (400, false, false)]
        {
            if kfd {
                host.kfd_process(pid);
            }
            let cgroup =
                if in_container { format!("0::/system.slice/docker-{ID}.scope\n") } else { "0::/user.slice\n".into() };
            host.process(
                pid,
                "python3",
                &format!("Name:\tpython3\nState:\tS\nTgid:\t{pid}\nNSpid:\t{pid}\nTracerPid:\t0\n"),
                &cgroup,
            );
        }
        host.docker_container(ID, r#"{"Name":"/trainer"}"#);
        let roots = host.roots();
        let (processes, _) = processes::scan(&roots);
        (host, roots, processes)
    }

    fn sels(texts: &[&str]) -> Vec<Selector> {
        texts.iter().map(|t| t.parse().unwrap()).collect()
    }

    #[test]
    fn a_container_and_pids_plan_every_kfd_process_once() {
        let (_dir, roots, processes) = host();
        let pids = plan(&sels(&["container:trainer", "300", "101"]), None, &processes, &roots).unwrap();
        assert_eq!(pids, vec![HostPid(100), HostPid(101), HostPid(300)]);
        let pids = plan(&sels(&["container:5eed00"]), Some(HostPid(300)), &processes, &roots).unwrap();
        assert_eq!(pids, vec![HostPid(100), HostPid(101)]);
    }

    #[test]
    fn bad_selections_name_cause_and_fix() {
        let (_dir, roots, processes) = host();
        let err = |texts: &[&str], online: Option<u32>| {
            plan(&sels(texts), online.map(HostPid), &processes, &roots).unwrap_err().to_string()
        };
        assert_eq!(err(&["300", "300"], None), "`300` is given twice in --offline; give each target once");
        assert_eq!(
            err(&["container:server"], None),
            "--offline container:server: no KFD process runs in a container with that name, id or id prefix (see \
             `gpreempt ps` for the KFD processes and their containers); start its GPU work first — processes that \
             open /dev/kfd in it later are attached then"
        );
        // A pod selector is named as given (not as `container:pod:…`).
        assert_eq!(
            err(&["pod:batch/train"], None),
            "--offline pod:batch/train: no KFD process runs in a pod that matches (see `gpreempt ps` for the KFD \
             processes and their pods); start its GPU work first — processes that open /dev/kfd in it later are \
             attached then"
        );
        assert_eq!(
            err(&["container:trainer"], Some(101)),
            "pid 101 is selected both as online and as offline (--offline container:trainer); a process cannot be \
             preempted on behalf of itself: drop it from one side"
        );
        assert!(
            err(&["300"], Some(300)).starts_with("pid 300 is selected both as online and as offline (--offline 300)")
        );
        assert_eq!(
            err(&["100", "400"], None),
            "--offline 400: pid 400 (python3) has never opened /dev/kfd, so it has no GPU queues to suspend (see \
             `gpreempt ps` for the processes that do)"
        );
        assert_eq!(
            err(&["999"], None),
            "--offline 999: no process with pid 999 (see `gpreempt ps` for the KFD processes)"
        );
    }
}
