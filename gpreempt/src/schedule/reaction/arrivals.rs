//! The arrival probe on the reaction thread: which online processes it watches (their cgroup and
//! listening ports, refreshed), its hits taken at each step, and the *pending holds* they open.
//!
//! A request that reaches a watched port opens a pending hold for its process
//! ([`super::super::arrival::lead`]): from the planned issue time until the process publishes
//! GPU work (a doorbell store or a moved index) the process's GPUs count as having online work,
//! so their policies suspend the offline side as they would for the work itself, one burst from
//! the arrival to the request's end. The hold ends at the first GPU work (the lead is learnt from
//! it) or, with none, at the plan's bound (counted as wasted: the offline side was held for
//! nothing, the bound keeps that short). The probe takes one of a process's credits as it sends a
//! record; the step that takes the records arms it again at once (its credits full), so each
//! request costs one record, a burst of them included.

use std::{collections::BTreeSet, path::PathBuf};

use gpreempt_common::arrival::ArrivalHit;

use super::{Reaction, messages::Report};
use crate::{
    clock::monotonic_ns,
    domain::{GpuId, HostPid},
    host::{cgroup::cgroup_dir, sockets::tcp_listening_ports},
    schedule::{
        arrival::{
            ArrivalLoader, ArrivalSource,
            attribution::{Attribution, Candidate, attribute},
            lead::{LeadModel, LeadSample, PendingCounts, PendingEnd, PendingPlan},
            ports::PortReader,
            report::ArrivalReport,
            size::request_size,
        },
        config::ArrivalConfig,
        policy::State,
        seams::ControlSide,
    },
    stats::Summary,
};

/// How often a watched process's listening ports are read again (a server that opens its port
/// after its first GPU queue, as vLLM does once the model is loaded, is watched from then on).
const REFRESH_NS: u64 = 2_000_000_000;
/// Pending holds kept per process: more requests than this in their CPU phase at once, none of
/// which reached the GPU, give up the oldest.
const MAX_PENDING: usize = 64;
/// Lead and arrival→suspend samples kept per process for the report.
const REPORT_SAMPLES: usize = 100_000;

/// One request between its arrival and its first GPU work.
#[derive(Clone, Copy, Debug)]
struct Pending {
    arrival_ns: u64,
    /// When the reaction thread took the probe's record.
    taken_ns: u64,
    size: u32,
    plan: PendingPlan,
    /// When the SUSPENDs that hold the offline side for it returned (or the process's GPUs were
    /// already held when it was issued).
    held_ns: Option<u64>,
    /// The process's write-index sum at the first look at its indices after the hold opened
    /// (None: not looked yet): a moved sum is its first submission.
    writes: Option<u64>,
    /// Its lead is learnt from (it found the process's GPUs free of online work).
    learn: bool,
    /// It reached the socket while the reaction thread was inside a transition's ioctls: its
    /// SUSPENDs could start only once they returned (one RESUME at most: a resume is cut short
    /// for it, [`Reaction::arrival_due_on`]).
    in_transition: bool,
}

/// One online process as the arrival path sees it.
struct Watched {
    pid: HostPid,
    /// The probe's slot; None while it is not watched (`why`).
    slot: Option<u32>,
    cgroup: Option<PathBuf>,
    why: Option<String>,
    /// Not watched for good (no cgroup v2, an attach refused): not retried.
    permanent: bool,
    /// What was said last: watched (true) or not (false); said again when it changes.
    said: Option<bool>,
    armed: bool,
    /// A read of its ports is under way on the reader thread.
    reading: bool,
    /// Pending holds, oldest first.
    pending: Vec<Pending>,
    /// Its indices (or a doorbell store) showed GPU work at the last step's look: a submission
    /// seen now may be that work's continuation (`attribution.rs`).
    in_flight: bool,
    model: LeadModel,
    counts: PendingCounts,
    leads_us: Vec<f64>,
    to_suspend_us: Vec<f64>,
    to_taken_us: Vec<f64>,
    to_suspend_in_transition_us: Vec<f64>,
    refreshed_ns: u64,
}

impl Watched {
    fn new(pid: HostPid) -> Self {
        Self {
            pid,
            slot: None,
            cgroup: None,
            why: None,
            permanent: false,
            said: None,
            armed: false,
            reading: false,
            pending: Vec::new(),
            in_flight: false,
            model: LeadModel::default(),
            counts: PendingCounts::default(),
            leads_us: Vec::new(),
            to_suspend_us: Vec::new(),
            to_taken_us: Vec::new(),
            to_suspend_in_transition_us: Vec::new(),
            refreshed_ns: 0,
        }
    }
}

/// The arrival path's state on the reaction thread.
pub(super) struct Arrivals {
    /// None: the probe could not load (`load_error` says why, once per online process).
    probe: Option<Box<dyn ArrivalSource>>,
    load_error: Option<String>,
    config: ArrivalConfig,
    proc_root: PathBuf,
    /// The thread that reads the watched processes' ports (None: the ports are given, the probe
    /// did not load, or the thread could not start: then they are read on this thread).
    reader: Option<PortReader>,
    watched: Vec<Watched>,
    hits: Vec<ArrivalHit>,
    /// The attribution's view of one process's pending holds (kept: no allocation per step).
    candidates: Vec<Candidate>,
    /// The reaction thread's latest transition: when its first ioctl entered the kernel and when
    /// its last returned (None: under way).
    transition: (u64, Option<u64>),
}

impl Arrivals {
    pub(super) fn load(config: ArrivalConfig, proc_root: PathBuf, loader: &dyn ArrivalLoader) -> Self {
        let loaded = config
            .patterns()
            .map_err(|e| e.to_string())
            .and_then(|patterns| loader.load(&patterns).map_err(|e| e.to_string()));
        let (probe, load_error) = match loaded {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(e)),
        };
        // Only needed where the ports are found, not given; spawned only where the probe loaded.
        let reader =
            (probe.is_some() && config.ports.is_empty()).then(|| PortReader::spawn(proc_root.clone()).ok()).flatten();
        Self {
            probe,
            load_error,
            config,
            proc_root,
            reader,
            watched: Vec::new(),
            hits: Vec::new(),
            candidates: Vec::new(),
            transition: (0, Some(0)),
        }
    }

    /// Why the probe could not load, if it could not.
    pub(super) fn load_error(&self) -> Option<&str> {
        self.load_error.as_deref()
    }

    /// The ring buffer's fd, for the reaction thread's wait.
    pub(super) fn fd(&self) -> Option<std::os::fd::RawFd> {
        self.probe.as_ref().and_then(|p| p.fd())
    }

    /// The earliest planned issue time of a pending hold not yet in force at `now` (the wait's
    /// deadline).
    fn next_issue(&self, now: u64) -> Option<u64> {
        self.watched.iter().flat_map(|w| &w.pending).map(|p| p.plan.issue_at_ns).filter(|&t| t > now).min()
    }

    /// How long the thread may wait from `now`, at most `limit_ns`: until the earliest issue time
    /// planned after `step_ns` (the start of the step before the wait, the instant its holds were
    /// judged at). One that came due since, during the step's own work, gives 0: the wait ends at
    /// once instead of sleeping past it (and the next step issues its SUSPENDs).
    pub(super) fn wait_ns(&self, step_ns: u64, now: u64, limit_ns: u64) -> u64 {
        self.next_issue(step_ns).map_or(limit_ns, |at| limit_ns.min(at.saturating_sub(now)))
    }

    /// Watch `pid` (its first queue): its cgroup and ports, armed.
    fn watch(&mut self, pid: HostPid, now: u64) -> Option<Report> {
        if !self.watched.iter().any(|w| w.pid == pid) {
            self.watched.push(Watched::new(pid));
        }
        self.refresh(pid, now);
        self.announce(pid)
    }

    /// When `pid` became watched or stopped being: what the arrival path sees of it (said once
    /// per change).
    fn announce(&mut self, pid: HostPid) -> Option<Report> {
        let ports: Vec<u16> = self.ports_of(pid).into_iter().collect();
        let w = self.watched.iter_mut().find(|w| w.pid == pid)?;
        if w.reading && w.said.is_none() {
            // Its first read is under way: said when it is answered.
            return None;
        }
        let watched = w.slot.is_some() && w.why.is_none();
        if w.said == Some(watched) {
            return None;
        }
        w.said = Some(watched);
        Some(Report::ArrivalWatch {
            pid,
            ports: if watched { ports } else { Vec::new() },
            cgroup: w.cgroup.as_ref().map(|c| c.display().to_string()),
            why: w.why.clone(),
        })
    }

    fn ports_of(&self, pid: HostPid) -> BTreeSet<u16> {
        let slot = self.watched.iter().find(|w| w.pid == pid).and_then(|w| w.slot);
        match (&self.probe, slot) {
            (Some(p), Some(s)) => p.ports_of(s),
            _ => BTreeSet::new(),
        }
    }

    /// Read `pid`'s cgroup and ports again and watch it on them: the ports given
    /// (`--arrival-port`) at once, the ones it listens on through the reader thread (their answer
    /// is applied at a later step, [`Arrivals::take_ports`]).
    fn refresh(&mut self, pid: HostPid, now: u64) {
        let Some(i) = self.watched.iter().position(|w| w.pid == pid) else { return };
        self.watched[i].refreshed_ns = now;
        if self.watched[i].permanent {
            return;
        }
        if self.probe.is_none() {
            let w = &mut self.watched[i];
            w.why = Some(format!("the arrival probe is not available: {}", self.load_error.as_deref().unwrap_or("?")));
            w.permanent = true;
            return;
        }
        let w = &mut self.watched[i];
        if w.cgroup.is_none() {
            match cgroup_dir(&self.proc_root, pid) {
                Ok(c) => w.cgroup = Some(c),
                Err(e) => {
                    w.why = Some(e.to_string());
                    w.permanent = true;
                    return;
                }
            }
        }
        if !self.config.ports.is_empty() {
            let ports = self.config.ports.iter().copied().collect();
            self.apply_ports(pid, Ok(ports));
            return;
        }
        match &self.reader {
            Some(reader) => {
                reader.ask(pid);
                self.watched[i].reading = true;
            }
            // No reader thread: read here (a few ms of the reaction thread every REFRESH_NS).
            None => {
                let read = tcp_listening_ports(&self.proc_root, pid);
                self.apply_ports(pid, read);
            }
        }
    }

    /// The reader's answers so far applied; the processes they were for.
    fn take_ports(&mut self) -> Vec<HostPid> {
        let mut answered = Vec::new();
        while let Some((pid, read)) = self.reader.as_ref().and_then(PortReader::take) {
            if let Some(w) = self.watched.iter_mut().find(|w| w.pid == pid) {
                w.reading = false;
                self.apply_ports(pid, read);
                answered.push(pid);
            }
        }
        answered
    }

    /// Watch `pid` on the ports read (or say why not).
    fn apply_ports(&mut self, pid: HostPid, read: std::io::Result<BTreeSet<u16>>) {
        let Some(w) = self.watched.iter_mut().find(|w| w.pid == pid) else { return };
        let (Some(probe), Some(cgroup)) = (self.probe.as_mut(), w.cgroup.clone()) else { return };
        let ports = match read {
            Ok(p) => p,
            Err(e) => {
                w.why = Some(format!("its sockets cannot be read: {e}"));
                return;
            }
        };
        if ports.is_empty() {
            w.why = Some("it listens on no TCP port yet (or give --arrival-port)".into());
            return;
        }
        match probe.watch(pid, &cgroup, &ports) {
            Ok(slot) => {
                if w.slot.is_none() {
                    w.armed = true;
                }
                w.slot = Some(slot);
                w.why = None;
            }
            Err(e) => {
                w.why = Some(e.to_string());
                w.permanent = matches!(e, crate::schedule::arrival::ArrivalError::Program(_));
            }
        }
    }

    /// Stop watching `pid` (it exited or stops being online); its figures.
    fn unwatch(&mut self, pid: HostPid) -> Option<ArrivalReport> {
        let i = self.watched.iter().position(|w| w.pid == pid)?;
        let report = self.report_of(i);
        let w = self.watched.remove(i);
        if let (Some(probe), Some(slot)) = (self.probe.as_mut(), w.slot) {
            probe.unwatch(slot);
        }
        Some(report)
    }

    fn report_of(&self, i: usize) -> ArrivalReport {
        let w = &self.watched[i];
        let counts = match (&self.probe, w.slot) {
            (Some(p), Some(s)) => p.counts(s),
            _ => Default::default(),
        };
        ArrivalReport {
            pid: w.pid,
            ports: self.ports_of(w.pid).into_iter().collect(),
            cgroup: w.cgroup.as_ref().map(|c| c.display().to_string()),
            why: w.why.clone(),
            counts,
            pending: PendingCounts { open: w.pending.len() as u64, ..w.counts },
            lead_us: Summary::of(&w.leads_us),
            arrival_to_suspend_us: Summary::of(&w.to_suspend_us),
            arrival_to_taken_us: Summary::of(&w.to_taken_us),
            arrival_to_suspend_in_transition_us: Summary::of(&w.to_suspend_in_transition_us),
            arrival_to_suspend_samples_us: w.to_suspend_us.clone(),
        }
    }
}

/// Arm `slot` (false if the probe is gone or the map refused: tried again at the next step).
fn probe_arm(probe: Option<&mut Box<dyn ArrivalSource>>, slot: u32) -> bool {
    probe.is_some_and(|p| p.arm(slot).is_ok())
}

fn push_capped(v: &mut Vec<f64>, x: f64) {
    if v.len() < REPORT_SAMPLES {
        v.push(x);
    }
}

impl<S: ControlSide> Reaction<S> {
    /// The online processes with queues on `gpu`.
    fn online_pids_on(&self, gpu: GpuId) -> Vec<HostPid> {
        self.online.iter().filter(|o| o.gpus().any(|g| g == gpu)).map(|o| o.pid).collect()
    }

    /// The GPUs online process `pid` has queues on.
    fn gpus_of(&self, pid: HostPid) -> Vec<GpuId> {
        self.online.iter().find(|p| p.pid == pid).map(|p| p.gpus().collect()).unwrap_or_default()
    }

    /// `pid`'s first queue: watch it for arrivals (said once).
    pub(super) fn watch_arrivals(&mut self, pid: HostPid, now: u64) {
        let Some(a) = self.arrivals.as_mut() else { return };
        if let Some(r) = a.watch(pid, now) {
            self.report(r);
        }
    }

    /// `pid` is no longer online: its arrival figures.
    pub(super) fn unwatch_arrivals(&mut self, pid: HostPid) {
        let Some(a) = self.arrivals.as_mut() else { return };
        if let Some(r) = a.unwatch(pid) {
            self.report(Report::ArrivalDone(Box::new(r)));
        }
    }

    /// The ports of each watched process asked for again when due, and the answers come back
    /// applied: at the end of a step, after its transitions. The read itself runs on the reader
    /// thread (`arrival/ports.rs`: `/proc/<pid>/net/tcp*` takes milliseconds to build).
    fn refresh_arrivals(&mut self, now: u64) {
        let Some(a) = self.arrivals.as_mut() else { return };
        let due: Vec<HostPid> =
            a.watched.iter().filter(|w| !w.permanent && now >= w.refreshed_ns + REFRESH_NS).map(|w| w.pid).collect();
        let mut said = Vec::new();
        for pid in due {
            a.refresh(pid, now);
            said.extend(a.announce(pid));
        }
        for pid in a.take_ports() {
            said.extend(a.announce(pid));
        }
        for r in said {
            self.report(r);
        }
    }

    /// Between two RESUMEs of `gpu`'s offline processes: whether a request that arrived for an
    /// online process there (its hits taken now, as at a step) plans its SUSPENDs before the
    /// next process could be resumed and suspended again (`now` + the GPU's suspend cost): then
    /// resuming it would only add a RESUME and a SUSPEND ahead of the request's first kernel
    /// (with 3 offline processes at 0.45-0.75 ms each, a request that arrived during the first
    /// RESUME waited for all three before its SUSPENDs began).
    pub(super) fn arrival_due_on(&mut self, gpu: GpuId, now: u64) -> bool {
        if self.arrivals.is_none() {
            return false;
        }
        self.take_arrivals();
        let cost = self.lanes.iter().find(|l| l.gpu == gpu).and_then(|l| l.policy.suspend_cost()).unwrap_or(0);
        self.arrival_holds(gpu, now + cost)
    }

    /// The probe's hits since they were last taken (at each step, and between two RESUMEs): each
    /// opens a pending hold for its process, planned from its learnt lead, and arms the process
    /// again at once (every request is one record).
    pub(super) fn take_arrivals(&mut self) {
        let Some(a) = self.arrivals.as_mut() else { return };
        let Some(probe) = a.probe.as_mut() else { return };
        a.hits.clear();
        probe.drain(&mut a.hits);
        let hits = std::mem::take(&mut a.hits);
        let taken_ns = if hits.is_empty() { 0 } else { monotonic_ns() };
        for h in &hits {
            let Some(i) = self.arrivals.as_ref().and_then(|a| a.watched.iter().position(|w| w.slot == Some(h.slot)))
            else {
                continue;
            };
            let pid = self.arrivals.as_ref().map_or(HostPid(0), |a| a.watched[i].pid);
            // The SUSPENDs take what a suspend of these GPUs has cost (the slowest of them).
            let gpus = self.gpus_of(pid);
            for l in self.lanes.iter_mut().filter(|l| gpus.contains(&l.gpu)) {
                l.arrived_since_gap = true;
            }
            let cost =
                self.lanes.iter().filter(|l| gpus.contains(&l.gpu)).filter_map(|l| l.policy.suspend_cost()).max();
            let held = self.lanes.iter().any(|l| gpus.contains(&l.gpu) && l.policy.state() == State::Suspended);
            // Online work already visible there (another request's): its lead cannot be told from
            // the other's work for sure, so it is not learnt from. It is planned as any other:
            // the other's submissions before its own work could come end no hold
            // (`attribution.rs`), so it needs no hold from its arrival (cold, it has one anyway).
            let busy = self.lanes.iter().any(|l| gpus.contains(&l.gpu) && l.active);
            let Some(a) = self.arrivals.as_mut() else { return };
            let (entered, returned) = a.transition;
            let in_transition = h.ktime_ns >= entered && returned.is_none_or(|r| h.ktime_ns <= r);
            let w = &mut a.watched[i];
            w.counts.arrivals += 1;
            if w.pending.len() >= MAX_PENDING {
                // A flood of requests none of which reached the GPU: the oldest is given up.
                w.pending.remove(0);
                w.counts.end(PendingEnd::Wasted);
            }
            let size = request_size(h);
            let plan = w.model.plan(h.ktime_ns, size, cost.unwrap_or(0));
            if busy {
                w.counts.busy += 1;
            }
            w.pending.push(Pending {
                arrival_ns: h.ktime_ns,
                taken_ns,
                size,
                plan,
                held_ns: held.then_some(h.ktime_ns),
                // Read at this step's look at the indices (after this), not the last one's: a
                // submission published since belongs to an earlier request.
                writes: None,
                learn: !busy,
                in_transition,
            });
            // The probe took a credit as it sent this record: armed again now, before this step's
            // SUSPENDs, so the requests that arrive while they run send their own records. A
            // store into the mapped map (`arrival/armed.rs`), not a syscall on their path.
            if let Some(slot) = w.slot {
                w.armed = probe_arm(a.probe.as_mut(), slot);
            }
        }
        if let Some(a) = self.arrivals.as_mut() {
            a.hits = hits;
        }
    }

    /// Whether a pending hold is in force on `gpu` at `now` (its issue time passed, no GPU work
    /// yet, its bound not reached); `now` may be ahead of the clock ([`Self::arrival_due_on`]).
    pub(super) fn arrival_holds(&self, gpu: GpuId, now: u64) -> bool {
        let Some(a) = &self.arrivals else { return false };
        a.watched.iter().any(|w| {
            w.pending.iter().any(|p| p.plan.issue_at_ns <= now && now < p.plan.release_at_ns)
                && self.online.iter().any(|o| o.pid == w.pid && o.gpus().any(|g| g == gpu))
        })
    }

    /// Every lane whose GPU has a request the probe saw pending (a hold opened, its first GPU work
    /// not yet seen) is marked `arrived_since_gap`: online work that comes back there now may be
    /// its first. No allocation: this runs at every step of the reaction thread.
    pub(super) fn mark_pending_arrivals(&mut self) {
        let Some(a) = &self.arrivals else { return };
        let online = &self.online;
        for lane in &mut self.lanes {
            let gpu = lane.gpu;
            if a.watched
                .iter()
                .any(|w| !w.pending.is_empty() && online.iter().any(|o| o.pid == w.pid && o.gpus().any(|g| g == gpu)))
            {
                lane.arrived_since_gap = true;
            }
        }
    }

    /// A pending hold whose issue time came while its process's GPUs were already held (another
    /// request's hold, or online work, suspended them) is held from this step: no SUSPEND of its
    /// own will come to say so, and without this it would be counted late at its first work.
    pub(super) fn note_holds_in_force(&mut self, now: u64) {
        let Some(a) = self.arrivals.as_mut() else { return };
        for w in a.watched.iter_mut() {
            let Some(o) = self.online.iter().find(|o| o.pid == w.pid) else { continue };
            let mut lanes = self.lanes.iter().filter(|l| o.gpus().any(|g| g == l.gpu)).peekable();
            if lanes.peek().is_none() || !lanes.all(|l| l.policy.state() == State::Suspended) {
                continue;
            }
            for p in w.pending.iter_mut().filter(|p| p.held_ns.is_none() && p.plan.issue_at_ns <= now) {
                p.held_ns = Some(now);
            }
        }
    }

    /// A watched process's submission since its holds' baselines (its write indices moved, read at
    /// this step, or a doorbell store of its GPUs at or after a hold's arrival) ends the pending
    /// hold whose request it is the first work of ([`attribute`]: the nearest prediction; while the
    /// process's earlier work is in flight, none whose own work could not have come yet). It is
    /// stamped with the store where the probe saw one, else `now` (read after the indices: an
    /// upper bound of the submission). That hold's lead is learnt; the others wait for a later
    /// submission. One hold ends per step and process.
    pub(super) fn arrival_progress(&mut self, now: u64) {
        let Some(a) = self.arrivals.as_mut() else { return };
        let candidates = &mut a.candidates;
        for w in a.watched.iter_mut() {
            let Some(o) = self.online.iter().find(|o| o.pid == w.pid) else { continue };
            let store = self.lanes.iter().filter(|l| o.gpus().any(|g| g == l.gpu)).filter_map(|l| l.doorbell_ns).min();
            // The look before this one (read at the previous step) showed the process's work.
            let in_flight = w.in_flight;
            w.in_flight = o.pending_gpus().next().is_some() || store.is_some();
            if w.pending.is_empty() {
                continue;
            }
            let writes = o.writes();
            candidates.clear();
            candidates.extend(w.pending.iter().map(|p| Candidate {
                prediction: p.plan.prediction,
                moved: store.is_some_and(|t| t >= p.arrival_ns) || p.writes.is_some_and(|b| b != writes),
            }));
            let work_ns = store.unwrap_or(now);
            match attribute(candidates, work_ns, in_flight) {
                Attribution::Nothing => {}
                Attribution::Continuation => {
                    w.counts.continued += 1;
                    // Its own first work may have been this one: whatever ends it later is no lead.
                    for (p, c) in w.pending.iter_mut().zip(candidates.iter()) {
                        p.learn &= !c.moved;
                    }
                }
                Attribution::First(i) => {
                    let p = w.pending.remove(i);
                    let work_ns = work_ns.max(p.arrival_ns);
                    let lead_ns = work_ns - p.arrival_ns;
                    let end = match p.held_ns {
                        Some(held) if held <= work_ns => PendingEnd::Served { lead_ns },
                        _ => PendingEnd::Late { lead_ns },
                    };
                    w.counts.end(end);
                    if matches!(end, PendingEnd::Late { .. }) && work_ns < p.plan.issue_at_ns {
                        w.counts.late_before_issue += 1;
                    }
                    if p.learn {
                        w.model.record(LeadSample { size: p.size, lead_ns });
                        push_capped(&mut w.leads_us, lead_ns as f64 / 1e3);
                    }
                }
            }
            // A hold opened at this step takes this look as its baseline (a submission published
            // before it belongs to an earlier request); a movement taken (or judged a
            // continuation) is no later hold's.
            let taken = candidates.iter().any(|c| c.moved);
            for p in &mut w.pending {
                if taken || p.writes.is_none() {
                    p.writes = Some(writes);
                }
            }
        }
    }

    /// A RESUME of `gpu` returned: the pending holds there that counted as held (found their GPUs
    /// already suspended at their arrival) are not any more; the SUSPEND issued for them, or the
    /// next look that finds their GPUs held, says when they are again.
    pub(super) fn arrival_resumed(&mut self, gpu: GpuId) {
        let pids = self.online_pids_on(gpu);
        let Some(a) = self.arrivals.as_mut() else { return };
        for w in a.watched.iter_mut().filter(|w| pids.contains(&w.pid)) {
            for p in &mut w.pending {
                p.held_ns = None;
            }
        }
    }

    /// A SUSPEND of `gpu` entered the kernel at `entered` and returned at `done`: the pending
    /// holds there are held from `done`; for those issued at their arrival, the arrival → SUSPEND
    /// figure.
    pub(super) fn arrival_suspended(&mut self, gpu: GpuId, entered: u64, done: u64) {
        let pids = self.online_pids_on(gpu);
        let Some(a) = self.arrivals.as_mut() else { return };
        for w in a.watched.iter_mut().filter(|w| pids.contains(&w.pid)) {
            for p in &mut w.pending {
                if p.held_ns.is_some() || p.plan.issue_at_ns > entered {
                    continue;
                }
                p.held_ns = Some(done);
                if p.plan.issue_at_ns == p.arrival_ns && p.learn {
                    let us = entered.saturating_sub(p.arrival_ns) as f64 / 1e3;
                    if p.in_transition {
                        push_capped(&mut w.to_suspend_in_transition_us, us);
                    } else {
                        push_capped(&mut w.to_suspend_us, us);
                        push_capped(&mut w.to_taken_us, p.taken_ns.saturating_sub(p.arrival_ns) as f64 / 1e3);
                    }
                }
            }
        }
    }

    /// A transition's first ioctl enters the kernel at `entered`, or (`returned`) its last
    /// returned: arrivals in between wait for it.
    pub(super) fn arrival_transition(&mut self, entered: u64, returned: Option<u64>) {
        if let Some(a) = self.arrivals.as_mut() {
            a.transition = (entered, returned);
        }
    }

    /// Pending holds past their bound end as wasted; a process whose arming failed is armed again;
    /// the ports read again where due.
    pub(super) fn rearm_arrivals(&mut self, now: u64) {
        self.refresh_arrivals(now);
        let Some(a) = self.arrivals.as_mut() else { return };
        let mut armed_now = false;
        for w in &mut a.watched {
            let before = w.pending.len();
            w.pending.retain(|p| now < p.plan.release_at_ns);
            for _ in w.pending.len()..before {
                w.counts.end(PendingEnd::Wasted);
            }
            if let Some(slot) = w.slot
                && !w.armed
            {
                w.armed = probe_arm(a.probe.as_mut(), slot);
                armed_now |= w.armed;
            }
        }
        self.armed_now |= armed_now;
    }

    /// Every watched process's figures (the thread stops).
    pub(super) fn finish_arrivals(&mut self) {
        let pids: Vec<HostPid> =
            self.arrivals.as_ref().map(|a| a.watched.iter().map(|w| w.pid).collect()).unwrap_or_default();
        for pid in pids {
            self.unwatch_arrivals(pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// One watched process with a pending hold planned at each of `issue_at`.
    fn pending_at(issue_at: &[u64]) -> Arrivals {
        let mut w = Watched::new(HostPid(7));
        for &t in issue_at {
            w.pending.push(Pending {
                arrival_ns: 0,
                taken_ns: 0,
                size: 0,
                plan: PendingPlan { issue_at_ns: t, release_at_ns: t + 10 * MS, prediction: None },
                held_ns: None,
                writes: None,
                learn: true,
                in_transition: false,
            });
        }
        Arrivals {
            probe: None,
            load_error: None,
            config: ArrivalConfig::default(),
            proc_root: PathBuf::new(),
            reader: None,
            watched: vec![w],
            hits: Vec::new(),
            candidates: Vec::new(),
            transition: (0, Some(0)),
        }
    }

    #[test]
    fn the_wait_ends_at_the_next_issue_time_and_at_once_for_one_that_came_due_during_the_step() {
        // The step began at 100 ms; the wait begins at 101 ms; the cross-check is 10 ms.
        let (step, now, limit) = (100 * MS, 101 * MS, 10 * MS);
        assert_eq!(pending_at(&[]).wait_ns(step, now, limit), limit, "nothing pending: the cross-check");
        assert_eq!(pending_at(&[120 * MS, 104 * MS]).wait_ns(step, now, limit), 3 * MS, "the earliest, from now");
        assert_eq!(pending_at(&[150 * MS]).wait_ns(step, now, limit), limit, "past the cross-check");
        // Due at 100.5 ms, while the step worked: no wait at all (measured from the wait's start,
        // an issue time already past would be dropped and slept through to the cross-check).
        assert_eq!(pending_at(&[100 * MS + MS / 2, 104 * MS]).wait_ns(step, now, limit), 0);
        // Due at or before the step's start: that step judged it (in force); it sets no deadline.
        assert_eq!(pending_at(&[100 * MS]).wait_ns(step, now, limit), limit);
    }
}
