//! The offline processes' debug-trap sessions on the reaction thread: attached (and held at once
//! where their GPUs are held), detached, their own notices (exits, watchdog resumes, new queues)
//! served, and the deferred ones watched for their first submission.

use std::sync::atomic::Ordering;

use super::{Reaction, messages::Report};
use crate::{
    controller::{
        control::Control,
        target::TargetError,
        vocabulary::{DebugError, Selection, SessionNotice},
    },
    domain::{GpuId, HostPid},
    schedule::{
        events::DetachReason,
        offline::{JobId, Offline},
        policy::State,
        runnable::Runnable,
        seams::ControlSide,
    },
};

impl<S: ControlSide> Reaction<S> {
    /// Attach an offline process on this thread; held at once on every GPU held now.
    pub(super) fn attach(&mut self, pid: HostPid, picked_up: bool, job: JobId) {
        if self.offline.iter().any(|p| p.pid == pid) {
            return;
        }
        self.called_kernel = true;
        let attached = self.side.attach(pid, &self.config.session).and_then(|mut c| match c.snapshot() {
            Ok(queues) => Ok((c, queues)),
            Err(e) => {
                c.detach();
                Err(e)
            }
        });
        let (control, queues) = match attached {
            Ok(a) => a,
            Err(error) => {
                let retry = matches!(error, DebugError::Target(TargetError::NotKfdProcess { .. }));
                self.report(Report::AttachFailed { pid, error, retry });
                return;
            }
        };
        // Its waves in flight tell a drained queue from an idle GPU: for `--defer-idle-offline`
        // and for `--runnable auto`'s looks.
        let waves = self.config.defer_idle || self.config.runnable == Runnable::Auto;
        let occupancy = if waves { self.occupancy.open(pid) } else { Vec::new() };
        let p = Offline::new(pid, control, job, &queues, occupancy);
        self.report(Report::Attached { pid, comm: p.control.comm(), queues, picked_up });
        self.offline.push(p);
        let i = self.offline.len() - 1;
        let held: Vec<GpuId> =
            self.lanes.iter().filter(|l| l.policy.state() == State::Suspended).map(|l| l.gpu).collect();
        if self.config.gang {
            // Its job is held wherever it shares a held GPU: on all of its GPUs, at once.
            let p = &mut self.offline[i];
            let holds: Vec<GpuId> = held.iter().copied().filter(|g| p.has_queues_on(*g)).collect();
            if holds.is_empty() {
                return;
            }
            match p.control.suspend(&Selection::All) {
                Ok(b) => {
                    p.gang_held_by(holds);
                    self.report(Report::QueuesHeld { pid, queues: b.count.max(0) as u32 });
                }
                Err(e) => self.report(Report::Warning(format!(
                    "offline pid {pid} attached while its gang is held; suspending it failed: {e}"
                ))),
            }
            return;
        }
        for gpu in held {
            let p = &mut self.offline[i];
            match p.control.suspend(&Selection::Gpu(gpu)) {
                Ok(b) if b.count > 0 => {
                    p.hold(gpu);
                    self.report(Report::QueuesHeld { pid, queues: b.count as u32 });
                }
                Ok(_) => {
                    // Nothing there yet: queues created on it during the hold are held.
                    p.hold(gpu);
                }
                Err(e) => self.report(Report::Warning(format!(
                    "offline pid {pid} attached while GPU {gpu:#x} is held; suspending it there failed: {e}"
                ))),
            }
        }
    }

    /// Detach offline process `i` (its session resumes what it holds and disables the trap).
    pub(super) fn detach(&mut self, i: usize, reason: DetachReason, now: u64) {
        let p = self.offline.remove(i);
        // Its deferred GPUs too: a GPU it alone was held for runs again.
        let pid = p.pid;
        let held = p.held_or_deferred();
        let detached = p.control.detach();
        self.report(Report::Detached { pid, reason, detached });
        for gpu in held {
            self.release_if_unheld(gpu, now);
        }
    }

    /// A held GPU whose every hold ended without its policy (exits, watchdogs) runs again.
    fn release_if_unheld(&mut self, gpu: GpuId, now: u64) {
        let still = self.offline.iter().any(|p| p.holds(gpu));
        if let Some(lane) = self.lanes.iter_mut().find(|l| l.gpu == gpu)
            && !still
            && lane.policy.state() == State::Suspended
        {
            lane.policy.resumed(now);
            self.report(Report::Released { t_ns: now, gpu });
        }
    }

    /// The sessions' own notices: exits, watchdog resumes, queues held mid-hold. `now` is the
    /// step's; `clock` reads afresh what serving a notice makes late (a detach takes a runlist
    /// refresh).
    pub(super) fn service_offline(&mut self, now: u64, clock: fn() -> u64) {
        let mut i = 0;
        while i < self.offline.len() {
            let mut exited = false;
            for n in self.offline[i].control.notices(now) {
                match n {
                    SessionNotice::TargetExited { .. } => exited = true,
                    SessionNotice::WatchdogResumed { held_ms, .. } => {
                        let now = clock();
                        let p = &mut self.offline[i];
                        let (pid, released) = (p.pid, p.resumed_by_watchdog());
                        let still_held = self.offline.iter().filter(|p| p.is_held()).count();
                        self.report(Report::WatchdogResumed { t_ns: now, pid, held_ms, still_held });
                        for gpu in released {
                            self.release_if_unheld(gpu, now);
                        }
                    }
                    SessionNotice::QueuesAppeared if self.config.defer_idle => {
                        let p = &mut self.offline[i];
                        if let Err(e) = p.refresh_queues() {
                            let pid = p.pid;
                            self.report(Report::Warning(format!(
                                "offline pid {pid}: the snapshot of its new queues failed ({e}); \
                                 it is suspended like a busy process until one succeeds"
                            )));
                        }
                    }
                    SessionNotice::QueuesSuspendedMidHold { count } => {
                        let pid = self.offline[i].pid;
                        self.report(Report::QueuesHeld { pid, queues: count });
                    }
                    SessionNotice::QueuesReset { queues } => {
                        let pid = self.offline[i].pid;
                        self.report(Report::QueuesReset { pid, queues });
                    }
                    SessionNotice::Failed { op, error } => {
                        let pid = self.offline[i].pid;
                        self.report(Report::Warning(format!("offline pid {pid}: {op} failed: {error}")));
                    }
                    _ => {}
                }
            }
            if exited {
                self.detach(i, DetachReason::Exited, clock());
            } else {
                i += 1;
            }
        }
    }

    /// Offline processes deferred on a held GPU that submitted since: suspended now.
    pub(super) fn watch_deferred(&mut self) {
        for i in 0..self.offline.len() {
            let mut cursor = 0;
            while let Some(gpu) = self.offline[i].next_submission(&mut cursor) {
                let p = &mut self.offline[i];
                self.called_kernel = true;
                let pid = p.pid;
                match p.control.suspend(&Selection::Gpu(gpu)) {
                    Ok(b) if b.count > 0 => {
                        p.hold(gpu);
                        self.stats.offline_late_suspends.fetch_add(1, Ordering::Relaxed);
                        self.report(Report::QueuesHeld { pid, queues: b.count as u32 });
                    }
                    Ok(_) => {
                        // Its queues there went away meanwhile: end the empty hold.
                        let _ = p.control.resume_gpu(gpu);
                    }
                    Err(e) => self.report(Report::Warning(format!(
                        "offline pid {pid} submitted on held GPU {gpu:#x}; suspending it there failed: {e}"
                    ))),
                }
            }
        }
    }
}
