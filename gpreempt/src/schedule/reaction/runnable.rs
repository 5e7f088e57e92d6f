//! `--runnable`: keep only some offline processes runnable on a GPU while it has no online work,
//! the others *parked* (suspended while the GPU has no online work), rotating them so each gets
//! its turn; with `auto`, as many as keep the GPU busy (why and the rule:
//! [`crate::schedule::runnable`]).
//!
//! Parked, a process costs no ioctl when online work comes (it is already held) and none when it
//! ends (it stays parked). Rotation: every `rotate`, while the GPU has no online work, the process
//! parked longest runs (one RESUME) and the one that ran longest is parked (one SUSPEND), so each
//! gets about N/K of the idle time. Not with `--gang`: a job's ranks are held and released
//! together.

use std::sync::atomic::Ordering;

use super::{Reaction, messages::Report};
use crate::{
    controller::{control::Control, vocabulary::Selection},
    domain::GpuId,
    schedule::{
        policy::State,
        runnable::{Runnable, TargetChange},
        seams::ControlSide,
    },
};

/// What one lane's balance does at this step: at most one RESUME and one SUSPEND.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Balance {
    /// Index (into the offline processes) to unpark: its turn to run.
    pub unpark: Option<usize>,
    /// Index to park: it ran longest.
    pub park: Option<usize>,
}

/// The offline processes with queues on a GPU as the balance sees them: (index, parked, when its
/// turn began).
pub(super) fn balance(processes: &[(usize, bool, u64)], runnable: usize, rotate_due: bool) -> Balance {
    let running = processes.iter().filter(|p| !p.1).count();
    let oldest = |parked: bool, except: Option<usize>| {
        processes.iter().filter(|p| p.1 == parked && Some(p.0) != except).min_by_key(|p| (p.2, p.0)).map(|p| p.0)
    };
    if running > runnable {
        return Balance { unpark: None, park: oldest(false, None) };
    }
    if running < runnable {
        return Balance { unpark: oldest(true, None), park: None };
    }
    match (rotate_due, oldest(true, None)) {
        (true, Some(next)) => Balance { unpark: Some(next), park: oldest(false, Some(next)) },
        _ => Balance { unpark: None, park: None },
    }
}

impl<S: ControlSide> Reaction<S> {
    /// Park and rotate the offline processes of every GPU that runs with no online work.
    pub(super) fn balance_runnable(&mut self, now: u64) {
        // A fixed count (None: `auto`, learnt per lane); every process runnable: nothing to do.
        let fixed = match self.config.runnable {
            _ if self.config.gang => return,
            Runnable::All => return,
            Runnable::Keep(n) => Some(n),
            Runnable::Auto => None,
        };
        for i in 0..self.lanes.len() {
            let lane = &self.lanes[i];
            if lane.active || lane.policy.state() != State::Running {
                continue;
            }
            let gpu = lane.gpu;
            let rotate_due = now.saturating_sub(lane.rotated_ns) >= self.config.rotate_ns;
            let processes: Vec<(usize, bool, u64)> = self
                .offline
                .iter()
                .enumerate()
                .filter(|(_, p)| p.has_queues_on(gpu))
                .map(|(k, p)| (k, p.is_parked_on(gpu), p.turn_began(gpu)))
                .collect();
            let runnable = match fixed {
                Some(n) => n,
                None => self.learn_runnable(i, now, &processes),
            };
            let Balance { unpark, park } = balance(&processes, runnable, rotate_due);
            if unpark.is_none() && park.is_none() {
                continue;
            }
            if rotate_due && unpark.is_some() {
                self.lanes[i].rotated_ns = now;
            }
            self.called_kernel = true;
            if let Some(k) = unpark {
                let p = &mut self.offline[k];
                match p.control.resume_gpu(gpu) {
                    Ok(_) => {
                        p.unpark(gpu, now);
                        self.stats.offline_unparks.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        let pid = p.pid;
                        self.report(Report::Warning(format!(
                            "offline pid {pid}: resuming its turn on GPU {gpu:#x} failed: {e}"
                        )));
                    }
                }
            }
            if let Some(k) = park {
                self.park(k, gpu, now);
            }
        }
    }

    /// `auto`: lane `i`'s count of runnable processes, after a look at those running when one
    /// is due (with two offline processes there at least: one has no other to park for).
    fn learn_runnable(&mut self, i: usize, now: u64, processes: &[(usize, bool, u64)]) -> usize {
        let gpu = self.lanes[i].gpu;
        let target = &self.lanes[i].runnable;
        if processes.len() < 2 || !target.look_due(now) {
            return target.of(processes.len());
        }
        // Starved: nothing of the running processes on the GPU (every queue drained, no wave).
        let mut starved = true;
        for &(k, parked, _) in processes {
            if !parked && self.offline[k].idle_on(gpu).is_none() {
                starved = false;
                break;
            }
        }
        let lane = &mut self.lanes[i];
        let counter = match lane.runnable.look(now, starved, processes.len()) {
            Some(TargetChange::Raised(_)) => Some(&self.stats.runnable_raised),
            Some(TargetChange::Lowered(_)) => Some(&self.stats.runnable_lowered),
            None => None,
        };
        if let Some(c) = counter {
            c.fetch_add(1, Ordering::Relaxed);
        }
        lane.runnable.of(processes.len())
    }

    fn park(&mut self, k: usize, gpu: GpuId, now: u64) {
        let p = &mut self.offline[k];
        match p.control.suspend(&Selection::Gpu(gpu)) {
            Ok(b) if b.count > 0 => {
                p.park(gpu, now);
                self.stats.offline_parks.fetch_add(1, Ordering::Relaxed);
            }
            Ok(_) => {
                // Nothing of it there any more: end the empty hold, nothing to park.
                let _ = p.control.resume_gpu(gpu);
            }
            Err(e) => {
                let pid = p.pid;
                self.report(Report::Warning(format!("offline pid {pid}: parking it on GPU {gpu:#x} failed: {e}")));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_extra_runners_are_parked_one_per_step_longest_running_first() {
        // Three running since 0, 5, 3: one runnable, so park the one running since 0, then 3.
        let p = [(0, false, 0), (1, false, 5), (2, false, 3)];
        assert_eq!(balance(&p, 1, false), Balance { unpark: None, park: Some(0) });
        let p = [(0, true, 10), (1, false, 5), (2, false, 3)];
        assert_eq!(balance(&p, 1, false), Balance { unpark: None, park: Some(2) });
    }

    #[test]
    fn a_rotation_runs_the_longest_parked_and_parks_the_longest_running() {
        let p = [(0, true, 10), (1, false, 12), (2, true, 4)];
        assert_eq!(balance(&p, 1, false), Balance { unpark: None, park: None });
        assert_eq!(balance(&p, 1, true), Balance { unpark: Some(2), park: Some(1) });
        // Nothing parked: nothing to rotate.
        assert_eq!(balance(&[(0, false, 1)], 1, true), Balance { unpark: None, park: None });
    }

    #[test]
    fn too_few_running_unparks_one() {
        // The only runner exited: the one parked longest runs.
        let p = [(0, true, 7), (2, true, 4)];
        assert_eq!(balance(&p, 1, false), Balance { unpark: Some(2), park: None });
        assert_eq!(balance(&p, 2, true), Balance { unpark: Some(2), park: None });
    }
}
