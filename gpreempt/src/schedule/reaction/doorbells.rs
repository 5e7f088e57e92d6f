//! The doorbell probe on the reaction thread: the online queues it filters on, its hits taken at
//! each step, its doorbells armed again, and the one wait on it while the online side is idle.

use super::{Reaction, messages::Report};
use crate::{
    clock::monotonic_ns,
    domain::{GpuId, HostPid, QueueId},
    model::QueueAddrs,
    schedule::{
        doorbell::{Coverage, signal::doorbell_signal, wake::wait_readable},
        events::{DetectionPath, DoorbellCount},
        policy::State,
        seams::ControlSide,
    },
};

/// An online queue the doorbell probe filters on.
pub(super) struct Doorbell {
    pub pid: HostPid,
    queue_id: QueueId,
    gpu: GpuId,
    signal: u64,
    /// The probe sends a hit at its next store.
    armed: bool,
}

impl<S: ControlSide> Reaction<S> {
    /// The probe's hits since the last step: each marks its queue's GPU active for this step
    /// and its doorbell disarmed.
    pub(super) fn take_hits(&mut self, now: u64) {
        let Some(probe) = &mut self.probe else { return };
        self.hits.clear();
        probe.drain(&mut self.hits);
        for h in &self.hits {
            let Some(d) = self.doorbells.iter_mut().find(|d| d.pid.0 == h.tgid && d.signal == h.signal) else {
                continue;
            };
            d.armed = false;
            self.stats.doorbell_wake.record(now.saturating_sub(h.ktime_ns));
            if let Some(lane) = self.lanes.iter_mut().find(|l| l.gpu == d.gpu) {
                lane.doorbell_ns = Some(lane.doorbell_ns.map_or(h.ktime_ns, |t| t.min(h.ktime_ns)));
            }
        }
    }

    /// Arm again every doorbell of a GPU that runs with no online work seen: its next store is
    /// the next online burst.
    pub(super) fn rearm(&mut self) {
        self.armed_now = false;
        let Some(probe) = &mut self.probe else { return };
        for d in self.doorbells.iter_mut().filter(|d| !d.armed) {
            let idle = self.lanes.iter().any(|l| l.gpu == d.gpu && !l.active && l.policy.state() == State::Running);
            if idle && probe.arm(d.pid, d.signal).is_ok() {
                d.armed = true;
                self.armed_now = true;
            }
        }
    }

    /// Whether the thread may wait on the probe: every GPU runs with no online work seen, every
    /// online queue is covered and armed, no hint is open, and nothing was armed at this step.
    pub(super) fn may_wait(&self) -> bool {
        if self.probe.is_none() || self.armed_now || self.hint || self.config.busy_poll {
            return false;
        }
        self.lanes.iter().all(|l| {
            let covered = self.doorbells.iter().filter(|d| d.gpu == l.gpu && d.armed).count();
            !l.active && l.policy.state() == State::Running && covered >= l.online_queues
        })
    }

    /// The one wait: a hit, an arrival, a command, a hint client or line, a pending hold's issue
    /// time, or the cross-check. True when something woke it. `step_ns`: the start of the step
    /// before it, the instant its holds were judged at: an issue time that came due since (during
    /// the step's own work) ends the wait at once instead of being slept past.
    pub(super) fn wait_for_work(&mut self, step_ns: u64) -> bool {
        let Some(probe) = &self.probe else { return false };
        let mut fds = vec![probe.fd()];
        if let Some(n) = &self.nudge {
            fds.push(n.fd());
        }
        if let Some(h) = &self.hints {
            fds.extend(h.fds());
        }
        // A request's arrival wakes it too, and a pending hold planned for later ends the wait at
        // its issue time.
        let mut timeout = self.config.cross_check_ns;
        if let Some(a) = &self.arrivals {
            fds.extend(a.fd());
            timeout = a.wait_ns(step_ns, monotonic_ns(), timeout);
        }
        let woken = wait_readable(&fds, timeout);
        if let Some(n) = &self.nudge {
            n.clear();
        }
        woken
    }

    /// How `pid`'s submissions are seen, decided at its first queue and reported once; with the
    /// probe, `addrs`'s doorbell signal is filtered on (armed).
    pub(super) fn cover(&mut self, pid: HostPid, addrs: QueueAddrs) {
        let Some(probe) = &mut self.probe else {
            if !self.seen_by.iter().any(|(p, _)| *p == pid) {
                self.seen_by.push((pid, false));
                let why = if self.config.doorbell { "the doorbell probe is not loaded" } else { "--no-doorbell" };
                self.report(Report::SeenBy {
                    pid,
                    path: DetectionPath::Poll,
                    libraries: Vec::new(),
                    probes: Vec::new(),
                    why: Some(why.into()),
                });
            }
            return;
        };
        let covered = match self.seen_by.iter().find(|(p, _)| *p == pid) {
            Some(&(_, covered)) => covered,
            None => {
                let coverage = probe.cover(pid);
                let covered = coverage.covered();
                self.seen_by.push((pid, covered));
                let (path, libraries, probes, why) = match coverage {
                    Coverage::Probe { libraries, points } => (DetectionPath::Doorbell, libraries, points, None),
                    Coverage::NoRuntime => (
                        DetectionPath::Poll,
                        Vec::new(),
                        Vec::new(),
                        Some("it maps no libhsa-runtime64 (a raw KFD client)".into()),
                    ),
                    Coverage::Failed(why) => (DetectionPath::Poll, Vec::new(), Vec::new(), Some(why)),
                };
                self.report(Report::SeenBy { pid, path, libraries, probes, why });
                covered
            }
        };
        if !covered {
            return;
        }
        let Some(probe) = &mut self.probe else { return };
        // A handle of 0 is no signal (a queue without a runtime's amd_queue_t): the poll keeps it.
        if let Ok(signal) = doorbell_signal(pid, addrs.write)
            && signal != 0
            && probe.register(pid, signal).is_ok()
        {
            self.doorbells.retain(|d| !(d.pid == pid && d.queue_id == addrs.queue_id));
            self.doorbells.push(Doorbell { pid, queue_id: addrs.queue_id, gpu: addrs.gpu_id, signal, armed: true });
        }
    }

    /// Forget `pid`'s doorbell for `queue_id` (or all of its doorbells and its uprobes).
    pub(super) fn uncover(&mut self, pid: HostPid, queue_id: Option<QueueId>) {
        let Some(probe) = &mut self.probe else { return };
        let gone = |d: &Doorbell| d.pid == pid && queue_id.is_none_or(|q| q == d.queue_id);
        let mut counts = Vec::new();
        for d in self.doorbells.iter().filter(|d| gone(d)) {
            let stores = probe.stores(d.pid, d.signal).unwrap_or(0);
            counts.push(DoorbellCount { pid: d.pid, queue_id: d.queue_id, gpu_id: d.gpu, stores });
            probe.unregister(d.pid, d.signal);
        }
        self.doorbells.retain(|d| !gone(d));
        if queue_id.is_none() {
            probe.uncover(pid);
            self.seen_by.retain(|(p, _)| *p != pid);
        }
        for c in counts {
            self.report(Report::DoorbellStores(c));
        }
    }
}
