//! The reaction thread: the one thread that holds the offline processes' debug-trap sessions
//! (KFD takes a target's debug-trap calls only from its ptrace tracer, the thread that attached
//! it) and does nothing but react. Each step:
//!
//! 1. take the other threads' commands (new online queues, offline processes to attach) from a
//!    bounded queue, without blocking, and the `--hint-socket` lines received;
//! 2. read the online queues' dispatch indices (one `process_vm_readv` per online process) and,
//!    every `--occupancy` or before an idle resume, their `cu_occupancy` (one `pread` each);
//! 3. per GPU, the policy ([`PolicyMachine`](super::policy::PolicyMachine)) over "online work
//!    pending on this GPU";
//! 4. SUSPEND_QUEUES / RESUME_QUEUES of that GPU's offline queues (every offline process, with
//!    [`Selection::Gpu`](crate::controller::vocabulary::Selection::Gpu): a process with no queue
//!    there costs no ioctl, one with nothing pending there is held with none until it submits,
//!    and `--gang` holds a job everywhere at once: [`super::offline`]);
//! 5. a fixed-size [`TransitionRecord`] into a bounded queue, never waiting for its reader.
//!
//! Everything else — the tracer, spans, discovery, output, interval accounting — runs on
//! the thread that started the scheduler. The step interval and the detection latency are
//! measured here, into lock-free histograms the other thread reads.
//!
//! A GPU's policy exists once an online queue (or online occupancy) is seen on it; offline
//! queues on GPUs with no online work are never touched.
//!
//! This file is the loop and the one reader of the clock: the rest is handed `now` (or, where a
//! fresh reading must follow an ioctl, the clock itself). [`messages`] what the threads tell
//! each other, [`stats`] what the thread measures, [`lane`] one GPU's policy, [`doorbells`] the
//! probe, [`online_watch`] the online side, [`offline_sessions`] the offline sessions,
//! [`transition`] one suspend or resume, [`arrivals`] the arrival probe and its pending holds,
//! [`runnable`] the offline processes parked and rotated (`--runnable`).

mod arrivals;
mod doorbells;
mod lane;
mod messages;
mod offline_sessions;
mod online_watch;
mod runnable;
mod stats;
mod transition;

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
    mpsc::{Receiver, SyncSender, TryRecvError, TrySendError},
};

use gpreempt_common::doorbell::DoorbellHit;

use self::{arrivals::Arrivals, doorbells::Doorbell, lane::Lane};
pub use self::{
    messages::{Command, Report, TransitionRecord},
    stats::LoopStats,
};
use super::{
    arrival::ArrivalLoader,
    config::ArrivalConfig,
    doorbell::{DoorbellProbe, wake::Nudge},
    events::DetachReason,
    hints::HintSocket,
    offline::{JobId, Offline},
    online::OnlineProcess,
    policy::{Action, Observation, PolicyConfig, State},
    realtime::{self, Realtime, RealtimeConfig},
    seams::{ControlSide, OccupancySource},
};
use crate::{
    clock::{monotonic_ns, thread_cpu_ns},
    controller::{
        control::Control,
        vocabulary::{Options, SharedError},
    },
    domain::{GpuId, HostPid, TransitionKind},
};

/// How the reaction thread runs.
#[derive(Clone, Debug)]
pub struct ReactionConfig {
    pub policy: PolicyConfig,
    /// Interval between steps (ignored with `busy_poll`).
    pub poll_ns: u64,
    /// Interval between reads of the online `cu_occupancy`.
    pub occupancy_ns: u64,
    /// A moved online write index is online work (see `OnlineProcess::new`).
    pub watch_writes: bool,
    /// Step again at once instead of sleeping (for hosts with a core to spare).
    pub busy_poll: bool,
    /// Load the doorbell probe and wait on it while every online queue is covered and idle.
    pub doorbell: bool,
    /// The index poll's period while waiting on the probe.
    pub cross_check_ns: u64,
    pub realtime: RealtimeConfig,
    /// The offline sessions' options.
    pub session: Options,
    /// An offline process with nothing on a GPU is held there without an ioctl until it submits.
    pub defer_idle: bool,
    /// Hold each offline job on all of its GPUs or on none.
    pub gang: bool,
    /// Load the arrival probe and open a pending hold at each request (None: `--no-arrival`).
    pub arrival: Option<ArrivalConfig>,
    /// Where the arrival path's hits come from (the probe; a script in unit tests).
    pub arrival_loader: Arc<dyn ArrivalLoader>,
    /// Where the online processes' cgroup and sockets are read (`/proc`).
    pub proc_root: std::path::PathBuf,
    /// Offline processes kept runnable per GPU while it has no online work, the others parked
    /// ([`runnable`]), rotated every `rotate_ns`.
    pub runnable: crate::schedule::runnable::Runnable,
    pub rotate_ns: u64,
}

/// The reaction loop's state; lives and dies on its thread.
pub struct Reaction<S: ControlSide> {
    config: ReactionConfig,
    /// How the offline sessions are attached.
    side: Arc<S>,
    /// Where the offline processes' waves in flight are read (for [`Offline::idle_on`]).
    occupancy: Arc<dyn OccupancySource>,
    online: Vec<OnlineProcess>,
    offline: Vec<Offline<S::Control>>,
    lanes: Vec<Lane>,
    /// `--hint-socket`: read at every step, its descriptors in the wait.
    hints: Option<HintSocket>,
    /// A hinted request is open, or one began since the last step (a delayed step must not lose
    /// a short request): online work on every GPU with online queues.
    hint: bool,
    commands: Receiver<Command>,
    reports: SyncSender<Report>,
    stats: Arc<LoopStats>,
    errors: Vec<(HostPid, SharedError)>,
    /// `GPREEMPT_TEST_FAULT=reaction-panic` (VM tests, `fault-injection` builds only): panic
    /// right after the first suspend, with the offline queues held.
    panic_after_suspend: bool,
    /// The doorbell probe, loaded when the thread starts (`config.doorbell`).
    probe: Option<DoorbellProbe>,
    /// Online processes already reported as seen by the probe (true) or the poll (false).
    seen_by: Vec<(HostPid, bool)>,
    doorbells: Vec<Doorbell>,
    hits: Vec<DoorbellHit>,
    /// Some queue was armed at this step: read the indices once more before waiting (a store
    /// between the last read and the arm sent no hit).
    armed_now: bool,
    nudge: Option<Arc<Nudge>>,
    /// This step called the kernel to suspend, resume or attach (left out of `LoopStats::step`).
    called_kernel: bool,
    /// This step follows a wait on the probe (see [`Self::step`]'s occupancy reads).
    after_wait: bool,
    /// `--gang`: the jobs a transition of one GPU acts on (kept to allocate once).
    jobs: Vec<JobId>,
    /// The arrival probe and its pending holds, loaded when the thread starts (`config.arrival`).
    arrivals: Option<Arrivals>,
}

impl<S: ControlSide> Reaction<S> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: ReactionConfig,
        side: Arc<S>,
        occupancy: Arc<dyn OccupancySource>,
        commands: Receiver<Command>,
        reports: SyncSender<Report>,
        stats: Arc<LoopStats>,
        nudge: Option<Arc<Nudge>>,
        hints: Option<HintSocket>,
    ) -> Self {
        Self {
            config,
            side,
            occupancy,
            online: Vec::new(),
            offline: Vec::new(),
            lanes: Vec::new(),
            hints,
            hint: false,
            commands,
            reports,
            stats,
            errors: Vec::new(),
            panic_after_suspend: cfg!(feature = "fault-injection")
                && std::env::var("GPREEMPT_TEST_FAULT")
                    .is_ok_and(|v| v.split(',').any(|f| f.trim() == "reaction-panic")),
            probe: None,
            seen_by: Vec::new(),
            doorbells: Vec::new(),
            hits: Vec::new(),
            armed_now: false,
            nudge,
            called_kernel: false,
            after_wait: false,
            jobs: Vec::new(),
            arrivals: None,
        }
    }

    /// Take the real-time footing, then step until `stop` is set (or the other side hung up);
    /// then resume every GPU, detach every offline process and return what was granted.
    pub fn run(mut self, stop: &AtomicBool) -> Realtime {
        // `_wake_latency` holds the PM QoS request until the thread returns (and the kernel drops
        // it with the file on any exit).
        let (granted, _wake_latency) = realtime::apply(self.config.realtime);
        for why in &granted.refused {
            self.report(Report::Warning(why.clone()));
        }
        if self.config.doorbell {
            match DoorbellProbe::load() {
                Ok(p) => self.probe = Some(p),
                Err(e) => self.report(Report::Warning(format!(
                    "the doorbell probe is not available ({e}); online work is seen through the index poll"
                ))),
            }
        }
        if let Some(config) = self.config.arrival.clone() {
            let arrivals = Arrivals::load(config, self.config.proc_root.clone(), &*self.config.arrival_loader);
            if let Some(e) = arrivals.load_error() {
                self.report(Report::Warning(format!(
                    "the arrival probe is not available ({e}); requests are seen at their first GPU work"
                )));
            }
            self.arrivals = Some(arrivals);
        }
        let mut next = monotonic_ns();
        let mut last_step: Option<u64> = None;
        while !stop.load(Ordering::Relaxed) {
            let now = monotonic_ns();
            if std::mem::take(&mut self.called_kernel) {
                self.stats.transition_steps.fetch_add(1, Ordering::Relaxed);
            } else if let Some(last) = last_step {
                self.stats.step.record(now.saturating_sub(last));
            }
            last_step = Some(now);
            if !self.step(now) {
                break;
            }
            self.after_wait = false;
            self.stats.steps.fetch_add(1, Ordering::Relaxed);
            if self.may_wait() {
                // The online side is idle and the probe sees every online queue: wait for a
                // store, a command or the cross-check. The step interval measures the poll's
                // cadence, which this wait is not.
                self.stats.doorbell_waits.fetch_add(1, Ordering::Relaxed);
                if self.wait_for_work(now) {
                    self.stats.doorbell_wakes.fetch_add(1, Ordering::Relaxed);
                }
                self.after_wait = true;
                last_step = None;
                next = monotonic_ns();
            } else if !self.config.busy_poll {
                next += self.config.poll_ns;
                if next <= now {
                    // Behind (a slow ioctl or attach): the cadence starts again from this step.
                    next = now + self.config.poll_ns;
                }
                // A deadline this step's work already passed returns at once.
                realtime::sleep_until(next);
            }
        }
        self.stop();
        self.stats.cpu_ns.store(thread_cpu_ns(), Ordering::Relaxed);
        granted
    }

    /// One step; false when the other side hung up (nothing can be reported any more).
    fn step(&mut self, now: u64) -> bool {
        loop {
            match self.commands.try_recv() {
                Ok(c) => self.command(c, now),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
        self.service_offline(now, monotonic_ns);
        self.take_hits(now);
        self.take_arrivals();
        self.read_hints();
        self.read_online(now);
        // Before the holds end at their first work (next): a hold still open means the work that
        // comes back may be its request's first (the gap it ends then lies between requests).
        self.mark_pending_arrivals();
        self.note_holds_in_force(now);
        // After the read: a submission the read saw was published before this instant (the step's
        // `now` may precede it by the step's own work), so a lead is never shorter than it was.
        self.arrival_progress(monotonic_ns());
        self.watch_deferred();
        let hint = self.hint;
        for i in 0..self.lanes.len() {
            let occupancy_ns = self.config.occupancy_ns;
            let gpu = self.lanes[i].gpu;
            // A held GPU whose pending hold comes due before a RESUME and the SUSPEND after it
            // could both be done stays held: resuming would only put those two ahead of the
            // request's first kernel (the native harness: an idle resume entered 34 µs after a
            // hold's issue time came, and the request's kernel waited for the SUSPEND after it).
            let horizon = match self.lanes[i].policy.state() {
                State::Suspended => self.lanes[i].policy.transition_cost().unwrap_or(0),
                _ => 0,
            };
            let arrival = self.arrival_holds(gpu, now + horizon);
            let lane = &mut self.lanes[i];
            let doorbell = lane.doorbell_ns.take();
            let mut active = lane.pending || doorbell.is_some() || arrival || (hint && lane.online_queues > 0);
            // After a wait on the probe, the idle reading that let the thread wait still holds
            // when the indices agree: a dispatch that started since was published first, and a
            // moved write index is online work (`watch_writes`). Reading the files at every
            // cross-check would cost `cu_occupancy`'s hardware query 100 times a second while
            // nothing happens (MI300X: a walk over every XCC).
            let reuse = self.after_wait && self.config.watch_writes;
            if !active && !lane.occupancy.is_empty() && !reuse {
                // Due every `occupancy_ns`; before an idle resume, fresh (this step's look).
                let max_age = if lane.policy.idle_resume_due(now) { 0 } else { occupancy_ns };
                active = lane.occupied_now(now, max_age);
            }
            if active && lane.visible_ns.is_none() && lane.policy.state() == State::Running {
                lane.visible_ns = Some(now);
                lane.published_ns = doorbell;
            }
            let announced = lane.arrived_since_gap;
            if active && !lane.active {
                // The online work is back: the gap it ends is classified (`announced`), the next
                // one starts with no request seen.
                lane.arrived_since_gap = false;
            }
            lane.active = active;
            let seen =
                Observation { online_active: active, online_gone: std::mem::take(&mut lane.online_gone), announced };
            let action = lane.policy.tick(now, seen);
            if !active {
                lane.quiet_ns = now;
                if lane.policy.state() == State::Running {
                    lane.visible_ns = None;
                    lane.published_ns = None;
                }
            }
            if let Some(action) = action {
                self.act(i, action);
            }
        }
        self.balance_runnable(now);
        self.rearm();
        self.rearm_arrivals(now);
        true
    }

    /// Carry out lane `i`'s action over every offline process: the ioctls each is planned for,
    /// timed here, then the record.
    fn act(&mut self, i: usize, action: Action) {
        let gpu = self.lanes[i].gpu;
        let (kind, resume) = match action {
            Action::Suspend => (TransitionKind::Suspend, None),
            Action::Resume(reason) => (TransitionKind::Resume, Some(reason)),
            Action::HoldThroughGap(verdict) => {
                self.report(Report::ResumeSkipped { t_ns: monotonic_ns(), gpu, verdict });
                return;
            }
        };
        self.errors.clear();
        self.called_kernel = true;
        self.gang_jobs(gpu);
        let cpu_before = thread_cpu_ns();
        let entered = monotonic_ns();
        self.arrival_transition(entered, None);
        let tally = self.execute(gpu, kind, monotonic_ns);
        let now = monotonic_ns();
        self.arrival_transition(entered, Some(now));
        self.stats.transition_cpu_ns.fetch_add(thread_cpu_ns().saturating_sub(cpu_before), Ordering::Relaxed);
        self.conclude(i, resume, tally, entered, now);
        match (kind, self.lanes[i].policy.state()) {
            (TransitionKind::Suspend, State::Suspended) => self.arrival_suspended(gpu, entered, now),
            (TransitionKind::Resume, State::Running) => self.arrival_resumed(gpu),
            _ => {}
        }
    }

    fn report(&self, r: Report) {
        match self.reports.try_send(r) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => {}
            Err(TrySendError::Full(_)) => {
                self.stats.reports_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn lane(&mut self, gpu: GpuId, now: u64) -> &mut Lane {
        let i = match self.lanes.iter().position(|l| l.gpu == gpu) {
            Some(i) => i,
            None => {
                self.lanes.push(Lane::new(gpu, self.config.policy, now));
                self.lanes.len() - 1
            }
        };
        &mut self.lanes[i]
    }

    fn command(&mut self, c: Command, now: u64) {
        match c {
            Command::OnlineQueue { pid, addrs } => self.online_queue(pid, addrs, now),
            Command::OnlineQueueGone { pid, queue_id } => self.online_queue_gone(pid, queue_id, now),
            Command::OnlineGone { pid } => self.online_gone(pid, now),
            Command::AttachOffline { pid, picked_up, job } => self.attach(pid, picked_up, job),
            Command::OfflineGone { pid } => {
                if let Some(i) = self.offline.iter().position(|p| p.pid == pid) {
                    self.detach(i, DetachReason::Exited, now);
                }
            }
            Command::OfflineQueueReset { pid, queue_id } => {
                // Its session's notice reports it (`service_offline`), as a SUSPEND's ERROR does.
                if let Some(p) = self.offline.iter_mut().find(|p| p.pid == pid) {
                    p.control.queue_reset(queue_id);
                }
            }
            Command::OnlineOccupancy { pid, reader } => self.lane(reader.gpu(), now).occupancy.push((pid, reader)),
        }
    }

    /// Resume every held GPU (a `Stop` transition each), then detach every offline process.
    fn stop(&mut self) {
        for i in 0..self.lanes.len() {
            if let Some(action) = self.lanes[i].policy.stop() {
                self.act(i, action);
            }
        }
        let now = monotonic_ns();
        while !self.offline.is_empty() {
            self.detach(0, DetachReason::Stopped, now);
        }
        // The store counts of every queue still watched, before the probe goes with this thread.
        let mut pids: Vec<HostPid> = self.doorbells.iter().map(|d| d.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        for pid in pids {
            self.uncover(pid, None);
        }
        // The arrival figures of every online process still watched; the probe's links go with it.
        self.finish_arrivals();
        self.arrivals = None;
    }
}
