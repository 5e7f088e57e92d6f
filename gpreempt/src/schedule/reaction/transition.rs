//! One suspend or resume of one GPU's offline queues: which offline process gets which ioctl
//! ([`plan`], pure), the ioctls ([`Reaction::execute`]), and what is recorded of them
//! ([`record`], pure) and noted by the policy.

use std::sync::atomic::Ordering;

use super::{
    Reaction,
    messages::{Report, TransitionRecord},
};
use crate::{
    controller::{
        control::Control,
        vocabulary::{Batch, DebugError, Selection},
    },
    domain::{GpuId, TransitionKind},
    schedule::{
        offline::{GangHolds, JobId, Offline},
        policy::ResumeReason,
        seams::ControlSide,
    },
};

/// One offline process as a transition of one GPU finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Facts {
    /// `--gang`: its job has a process with queues on this GPU: it is held or resumed with its
    /// job, everywhere.
    pub in_gang: bool,
    /// `--gang`: which GPUs' policies hold its job now.
    pub gang_holds: GangHolds,
    /// Suspended on this GPU.
    pub held: bool,
    /// Held on this GPU with no ioctl (idle there).
    pub deferred: bool,
    /// `--runnable`: parked on this GPU (suspended while it has no online work).
    pub parked: bool,
}

impl Facts {
    fn of<C: Control>(p: &Offline<C>, gpu: GpuId, gang_jobs: &[JobId]) -> Self {
        Self {
            in_gang: gang_jobs.contains(&p.job),
            gang_holds: p.gang_holds(gpu),
            held: p.is_held_on(gpu),
            deferred: p.is_deferred_on(gpu),
            parked: p.is_parked_on(gpu),
        }
    }
}

/// What one offline process gets in one transition of one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    Nothing,
    /// Already suspended here (a resume cut short for online work left it so): counted as held,
    /// no ioctl.
    StillHeld,
    /// `--gang`: another GPU holds its job already; this one holds it too, no ioctl.
    JoinGangHold,
    /// Nothing of it here: counted as held, no ioctl, until it submits (`writes`: the sum of its
    /// write indices here, watched).
    Defer {
        writes: u64,
    },
    /// SUSPEND_QUEUES of its queues on this GPU.
    Suspend,
    /// `--gang`: SUSPEND_QUEUES of every queue of it.
    SuspendGang,
    /// Its deferral here ends, no ioctl.
    EndDeferral,
    /// RESUME_QUEUES of its queues on this GPU.
    Resume,
    /// `--gang`: this GPU no longer holds its job; another still does.
    LeaveGangHold,
    /// `--gang`: the last hold of its job ends: RESUME_QUEUES of every queue of it.
    ResumeGang,
}

/// What a transition of kind `kind` does to one offline process, given `facts`. With
/// `defer_idle`, a suspend asks `idle` for the process's write indices on the GPU when it has
/// nothing there (None: something to preempt, or unknown); `idle` is read only then, just
/// before that process's turn.
pub(super) fn plan(kind: TransitionKind, facts: Facts, defer_idle: bool, idle: impl FnOnce() -> Option<u64>) -> Step {
    match kind {
        TransitionKind::Suspend if facts.in_gang => match facts.gang_holds {
            GangHolds::None => Step::SuspendGang,
            GangHolds::OnlyThis | GangHolds::Others => Step::JoinGangHold,
        },
        TransitionKind::Resume if facts.in_gang => match facts.gang_holds {
            GangHolds::None => Step::Nothing,
            GangHolds::OnlyThis => Step::ResumeGang,
            GangHolds::Others => Step::LeaveGangHold,
        },
        TransitionKind::Suspend if facts.held => Step::StillHeld,
        TransitionKind::Suspend => match defer_idle.then(idle).flatten() {
            Some(writes) => Step::Defer { writes },
            None => Step::Suspend,
        },
        // Parked by `--runnable`: it stays suspended when the online work ends (its turn comes at
        // a rotation), one RESUME fewer.
        TransitionKind::Resume if facts.parked => Step::Nothing,
        TransitionKind::Resume if facts.held => Step::Resume,
        TransitionKind::Resume if facts.deferred => Step::EndDeferral,
        TransitionKind::Resume => Step::Nothing,
    }
}

/// A transition's figures, every offline process together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Tally {
    /// Queues suspended or resumed.
    pub queues: u32,
    /// Offline processes an ioctl was issued for.
    pub ioctls: u32,
    /// Time in the ioctls, ns.
    pub latency_ns: u64,
    /// Offline processes counted as held with no ioctl.
    pub held_no_ioctl: u32,
}

impl Tally {
    /// One process's answer added to its transition's figures: queues, ioctls issued, their time.
    fn add(&mut self, b: &Batch) {
        if !b.skipped {
            self.ioctls += 1;
            self.latency_ns += b.latency_ns;
        }
        self.queues += b.count.max(0) as u32;
    }
}

/// The online burst a suspend answers, as its GPU's lane saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Burst {
    /// When its online work was first seen.
    pub visible_ns: Option<u64>,
    /// The doorbell store that made it visible (the probe's stamp).
    pub published_ns: Option<u64>,
    /// The last step that saw the GPU free of online work.
    pub quiet_ns: u64,
}

/// What a transition tells the policy and [`super::LoopStats`] besides its record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Notes {
    /// A suspend held something: queues suspended, or processes held with no ioctl.
    pub held: bool,
    /// A suspend that held: its reaction, for the policy.
    pub reaction_ns: Option<u64>,
    /// A resume that called the kernel: its time in the ioctls, for the policy.
    pub resume_ns: Option<u64>,
    /// A suspend that held: its detection, for the stats; `by_doorbell`: the probe saw its work.
    pub detection_ns: Option<u64>,
    pub by_doorbell: bool,
}

/// The record of `gpu`'s suspend (`resume` None) or resume, whose first ioctl entered the kernel
/// at `entered` and last returned at `now`, and what the policy and the stats note of it.
pub(super) fn record(
    gpu: GpuId,
    resume: Option<(ResumeReason, u64)>,
    tally: Tally,
    burst: Burst,
    entered: u64,
    now: u64,
) -> (TransitionRecord, Notes) {
    let Tally { queues, ioctls, latency_ns, held_no_ioctl } = tally;
    match resume {
        None => {
            let held = queues > 0 || held_no_ioctl > 0;
            let reaction_ns = burst.visible_ns.map(|v| now.saturating_sub(v));
            // Through the probe the submission's own time is known; through the poll only
            // the last step that saw none bounds it.
            let detection_ns = Some(entered.saturating_sub(burst.published_ns.unwrap_or(burst.quiet_ns)));
            let record = TransitionRecord {
                t_ns: now,
                gpu,
                kind: TransitionKind::Suspend,
                reason: None,
                latency_ns,
                reaction_ns,
                detection_ns,
                queues,
                ioctls,
                held_no_ioctl,
                idle_threshold_ns: None,
            };
            let notes = Notes {
                held,
                reaction_ns: reaction_ns.filter(|_| held),
                resume_ns: None,
                detection_ns: detection_ns.filter(|_| held),
                by_doorbell: held && burst.published_ns.is_some(),
            };
            (record, notes)
        }
        Some((reason, threshold_ns)) => {
            let record = TransitionRecord {
                t_ns: now,
                gpu,
                kind: TransitionKind::Resume,
                reason: Some(reason),
                latency_ns,
                reaction_ns: None,
                detection_ns: None,
                queues,
                ioctls,
                held_no_ioctl: 0,
                idle_threshold_ns: Some(threshold_ns),
            };
            let notes = Notes {
                held: false,
                reaction_ns: None,
                resume_ns: (ioctls > 0).then_some(latency_ns),
                detection_ns: None,
                by_doorbell: false,
            };
            (record, notes)
        }
    }
}

impl<S: ControlSide> Reaction<S> {
    /// `--gang`: every job with a process on `gpu` is held on all of its GPUs.
    pub(super) fn gang_jobs(&mut self, gpu: GpuId) {
        self.jobs.clear();
        if self.config.gang {
            self.jobs.extend(self.offline.iter().filter(|p| p.has_queues_on(gpu)).map(|p| p.job));
        }
    }

    /// The ioctls of one transition of `gpu`, offline process by offline process, as planned;
    /// `clock` reads the time of the online indices looked at between two RESUMEs.
    pub(super) fn execute(&mut self, gpu: GpuId, kind: TransitionKind, clock: fn() -> u64) -> Tally {
        let mut tally = Tally::default();
        let defer_idle = self.config.defer_idle;
        for k in 0..self.offline.len() {
            let p = &mut self.offline[k];
            let facts = Facts::of(p, gpu, &self.jobs);
            let step = plan(kind, facts, defer_idle, || p.idle_on(gpu));
            // A resume of several offline processes is one RESUME each, and each unmaps the
            // device's queues (HWS): online work published meanwhile waits for every one left,
            // then for the suspends. Between two, look at the online indices and the arrival
            // probe; with work there, or a request whose SUSPENDs are due before this process
            // could run, leave the rest held (the next suspend holds them with no ioctl).
            if step == Step::Resume && tally.ioctls > 0 {
                let now = clock();
                if self.online_pending_on(gpu, now) || self.arrival_due_on(gpu, now) {
                    self.stats.resumes_cut_short.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
            let p = &mut self.offline[k];
            let pid = p.pid;
            let mut settle = |r: Result<Batch, DebugError>| match r {
                Ok(b) => {
                    tally.add(&b);
                    Some(b)
                }
                Err(e) => {
                    self.errors.push((pid, e.into()));
                    None
                }
            };
            match step {
                Step::Nothing => {}
                Step::StillHeld => tally.held_no_ioctl += 1,
                Step::JoinGangHold => {
                    p.join_gang_hold(gpu);
                    tally.held_no_ioctl += 1;
                }
                Step::Defer { writes } => {
                    p.defer(gpu, writes);
                    self.stats.offline_deferred.fetch_add(1, Ordering::Relaxed);
                    tally.held_no_ioctl += 1;
                }
                Step::Suspend => match settle(p.control.suspend(&Selection::Gpu(gpu))) {
                    Some(b) if b.count > 0 => p.hold(gpu),
                    Some(_) => {
                        // Nothing of it on this GPU: end the empty hold at once, so nothing it
                        // creates there is held past this GPU's policy.
                        let _ = p.control.resume_gpu(gpu);
                    }
                    None => {}
                },
                Step::SuspendGang => {
                    if settle(p.control.suspend(&Selection::All)).is_some() {
                        p.gang_held_by(vec![gpu]);
                    }
                }
                Step::EndDeferral => p.undefer(gpu),
                Step::Resume => {
                    p.undefer(gpu);
                    settle(p.control.resume_gpu(gpu));
                    p.release(gpu);
                }
                Step::LeaveGangHold => p.leave_gang_hold(gpu),
                Step::ResumeGang => {
                    p.leave_gang_hold(gpu);
                    settle(p.control.resume());
                    p.release_all();
                }
            }
        }
        tally
    }

    /// Lane `i`'s transition done: its policy told, its figures recorded and reported.
    pub(super) fn conclude(&mut self, i: usize, resume: Option<ResumeReason>, tally: Tally, entered: u64, now: u64) {
        let lane = &mut self.lanes[i];
        let gpu = lane.gpu;
        let published_ns = if resume.is_none() { lane.published_ns.take() } else { None };
        let burst = Burst { visible_ns: lane.visible_ns, published_ns, quiet_ns: lane.quiet_ns };
        let resume_at = resume.map(|reason| (reason, lane.policy.idle_threshold_ns()));
        let (record, notes) = record(gpu, resume_at, tally, burst, entered, now);
        match resume {
            None => lane.policy.suspended(now, notes.held),
            Some(_) => lane.policy.resumed(now),
        }
        if let Some(r) = notes.reaction_ns {
            lane.policy.note_reaction(r);
        }
        if let Some(ns) = notes.resume_ns {
            lane.policy.note_resume(ns);
        }
        if let Some(d) = notes.detection_ns {
            self.stats.detection.record(d);
            if notes.by_doorbell {
                self.stats.detection_doorbell.record(d);
            }
        }
        let errors = std::mem::take(&mut self.errors);
        self.report(Report::Transition(record, errors));
        if notes.held && self.panic_after_suspend {
            // Unwinding drops every session, which resumes, disables and detaches (Session's Drop).
            panic!("injected fault: the reaction thread panics with GPU {gpu:#x} held");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU: GpuId = GpuId(0x1000);

    /// A process on its own (no gang), neither held nor deferred here.
    const FREE: Facts =
        Facts { in_gang: false, gang_holds: GangHolds::None, held: false, deferred: false, parked: false };

    fn never() -> Option<u64> {
        panic!("the idle reading is taken only for a suspend of a process free here, with defer_idle")
    }

    #[test]
    fn a_gang_already_held_elsewhere_is_held_here_with_no_ioctl_and_resumed_by_its_last_hold_only() {
        let gang = Facts { in_gang: true, ..FREE };
        assert_eq!(plan(TransitionKind::Suspend, gang, true, never), Step::SuspendGang);
        let elsewhere = Facts { gang_holds: GangHolds::Others, ..gang };
        assert_eq!(plan(TransitionKind::Suspend, elsewhere, true, never), Step::JoinGangHold);
        assert_eq!(plan(TransitionKind::Resume, elsewhere, true, never), Step::LeaveGangHold);
        let only_here = Facts { gang_holds: GangHolds::OnlyThis, held: true, ..gang };
        assert_eq!(plan(TransitionKind::Suspend, only_here, true, never), Step::JoinGangHold);
        assert_eq!(plan(TransitionKind::Resume, only_here, true, never), Step::ResumeGang);
        assert_eq!(plan(TransitionKind::Resume, gang, true, never), Step::Nothing);
    }

    #[test]
    fn an_idle_process_is_deferred_only_with_defer_idle_and_a_held_one_costs_no_ioctl() {
        assert_eq!(plan(TransitionKind::Suspend, FREE, true, || Some(42)), Step::Defer { writes: 42 });
        assert_eq!(plan(TransitionKind::Suspend, FREE, true, || None), Step::Suspend);
        assert_eq!(plan(TransitionKind::Suspend, FREE, false, never), Step::Suspend);
        let held = Facts { held: true, ..FREE };
        assert_eq!(plan(TransitionKind::Suspend, held, true, never), Step::StillHeld);
    }

    #[test]
    fn a_resume_calls_the_kernel_only_for_a_process_held_here() {
        assert_eq!(plan(TransitionKind::Resume, FREE, true, never), Step::Nothing);
        assert_eq!(plan(TransitionKind::Resume, Facts { deferred: true, ..FREE }, true, never), Step::EndDeferral);
        assert_eq!(plan(TransitionKind::Resume, Facts { held: true, ..FREE }, true, never), Step::Resume);
    }

    #[test]
    fn a_parked_process_is_held_with_no_ioctl_and_stays_parked_when_the_online_work_ends() {
        let parked = Facts { held: true, parked: true, ..FREE };
        assert_eq!(plan(TransitionKind::Suspend, parked, false, never), Step::StillHeld);
        assert_eq!(plan(TransitionKind::Resume, parked, false, never), Step::Nothing);
    }

    #[test]
    fn a_tally_counts_the_queues_of_every_answer_and_the_ioctls_of_those_not_skipped() {
        let mut t = Tally::default();
        t.add(&Batch { count: 3, latency_ns: 400, ..Batch::default() });
        t.add(&Batch { count: 0, latency_ns: 7, skipped: true, ..Batch::default() });
        t.add(&Batch { count: -1, latency_ns: 100, ..Batch::default() });
        assert_eq!(t, Tally { queues: 3, ioctls: 2, latency_ns: 500, held_no_ioctl: 0 });
    }

    #[test]
    fn a_suspend_that_held_is_noted_with_its_reaction_and_its_detection_from_the_doorbell_store() {
        let tally = Tally { queues: 3, ioctls: 2, latency_ns: 500, held_no_ioctl: 1 };
        let burst = Burst { visible_ns: Some(1_000), published_ns: Some(900), quiet_ns: 800 };
        let (recorded, notes) = record(GPU, None, tally, burst, 1_200, 1_700);
        assert_eq!(
            recorded,
            TransitionRecord {
                t_ns: 1_700,
                gpu: GPU,
                kind: TransitionKind::Suspend,
                reason: None,
                latency_ns: 500,
                reaction_ns: Some(700),
                detection_ns: Some(300),
                queues: 3,
                ioctls: 2,
                held_no_ioctl: 1,
                idle_threshold_ns: None,
            }
        );
        let noted =
            Notes { held: true, reaction_ns: Some(700), resume_ns: None, detection_ns: Some(300), by_doorbell: true };
        assert_eq!(notes, noted);
    }

    #[test]
    fn a_suspend_that_held_nothing_is_recorded_but_not_noted_and_the_poll_bounds_its_detection() {
        let burst = Burst { visible_ns: Some(1_000), published_ns: None, quiet_ns: 800 };
        let (recorded, notes) = record(GPU, None, Tally::default(), burst, 1_200, 1_250);
        assert_eq!((recorded.reaction_ns, recorded.detection_ns), (Some(250), Some(400)));
        let noted = Notes { held: false, reaction_ns: None, resume_ns: None, detection_ns: None, by_doorbell: false };
        assert_eq!(notes, noted);
        // Held with no ioctl only (every process idle there): the policy holds the GPU.
        let tally = Tally { held_no_ioctl: 2, ..Tally::default() };
        let (_, notes) = record(GPU, None, tally, burst, 1_200, 1_250);
        assert_eq!((notes.held, notes.detection_ns, notes.by_doorbell), (true, Some(400), false));
    }

    #[test]
    fn a_resume_notes_its_latency_only_when_it_called_the_kernel() {
        let tally = Tally { queues: 3, ioctls: 2, latency_ns: 400, held_no_ioctl: 0 };
        let (recorded, notes) = record(GPU, Some((ResumeReason::Idle, 2_000_000)), tally, Burst::default(), 5, 900);
        assert_eq!(
            recorded,
            TransitionRecord {
                t_ns: 900,
                gpu: GPU,
                kind: TransitionKind::Resume,
                reason: Some(ResumeReason::Idle),
                latency_ns: 400,
                reaction_ns: None,
                detection_ns: None,
                queues: 3,
                ioctls: 2,
                held_no_ioctl: 0,
                idle_threshold_ns: Some(2_000_000),
            }
        );
        assert_eq!(notes.resume_ns, Some(400));
        assert!(!notes.held);
        let (_, notes) = record(GPU, Some((ResumeReason::Stop, 2_000_000)), Tally::default(), Burst::default(), 5, 900);
        assert_eq!(notes.resume_ns, None);
    }
}
