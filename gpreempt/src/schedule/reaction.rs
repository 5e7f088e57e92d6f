//! The reaction thread: the one thread that holds the offline processes' debug-trap sessions
//! (KFD takes a target's debug-trap calls only from its ptrace tracer, the thread that attached
//! it) and does nothing but react. Each step:
//!
//! 1. take the other threads' commands (new online queues, offline processes to attach) from a
//!    bounded queue, without blocking, and the `--hint-socket` lines received;
//! 2. read the online queues' dispatch indices (one `process_vm_readv` per online process) and,
//!    every `--occupancy` or before an idle resume, their `cu_occupancy` (one `pread` each);
//! 3. per GPU, the policy ([`PolicyMachine`]) over "online work pending on this GPU";
//! 4. SUSPEND_QUEUES / RESUME_QUEUES of that GPU's offline queues (every offline process, with
//!    [`Selection::Gpu`]: a process with no queue there costs no ioctl, one with nothing pending
//!    there is held with none until it submits, and `--gang` holds a job everywhere at once:
//!    [`super::offline`]);
//! 5. a fixed-size [`TransitionRecord`] into a bounded queue, never waiting for its reader.
//!
//! Everything else — the tracer, spans, discovery, output, interval accounting — runs on
//! the thread that started the scheduler. The step interval and the detection latency are
//! measured here, into lock-free histograms the other thread reads.
//!
//! A GPU's policy exists once an online queue (or online occupancy) is seen on it; offline
//! queues on GPUs with no online work are never touched.

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicU64, Ordering},
    mpsc::{Receiver, SyncSender, TryRecvError, TrySendError},
};

use super::{
    doorbell::{
        Coverage, DoorbellProbe,
        signal::doorbell_signal,
        target::ProbePoint,
        wake::{Nudge, wait_readable},
    },
    events::{DetectionPath, DoorbellCount},
    hints::{HintCounts, HintSocket},
    offline::{JobId, Offline},
    online::{OnlineProcess, ReadError},
    policy::{Action, GapVerdict, Observation, PolicyConfig, PolicyMachine, ResumeReason, State},
    realtime::{self, Realtime, RealtimeConfig},
    seams::{ControlSide, Occupancy, OccupancySource},
};
use gpreempt_common::doorbell::DoorbellHit;

use crate::{
    clock::{monotonic_ns, thread_cpu_ns},
    controller::{
        control::Control,
        target::TargetError,
        vocabulary::{Batch, DebugError, Detached, Options, Selection, SessionNotice, SharedError},
    },
    domain::{GpuId, HostPid, QueueId, TransitionKind},
    kfd::uapi::QueueSnapshotEntry,
    model::QueueAddrs,
    stats::Histogram,
};

/// What the other threads ask of the reaction thread.
#[derive(Debug)]
pub enum Command {
    /// Watch an online queue (its GPU's policy starts with the first one).
    OnlineQueue {
        pid: HostPid,
        addrs: QueueAddrs,
    },
    OnlineQueueGone {
        pid: HostPid,
        queue_id: QueueId,
    },
    /// The online process exited: its GPUs resume at once if nothing else is pending there.
    OnlineGone {
        pid: HostPid,
    },
    /// Attach an offline process on this thread (slow: a ptrace seize and a runlist refresh).
    AttachOffline {
        pid: HostPid,
        picked_up: bool,
        job: JobId,
    },
    /// The offline process exited: detach it.
    OfflineGone {
        pid: HostPid,
    },
    /// An online process's occupancy reader for a GPU (see [`Lane::occupancy`]).
    OnlineOccupancy {
        pid: HostPid,
        reader: Box<dyn Occupancy>,
    },
}

/// One suspend or resume of one GPU's offline queues, as the reaction thread records it: fixed
/// size, no allocation (the errors, rare, travel beside it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TransitionRecord {
    /// CLOCK_MONOTONIC when the last ioctl returned, ns.
    pub t_ns: u64,
    pub gpu: GpuId,
    pub kind: TransitionKind,
    pub reason: Option<ResumeReason>,
    /// Time in the ioctls, every offline process together, ns.
    pub latency_ns: u64,
    /// Suspend only: online work first seen → the suspend returned, ns.
    pub reaction_ns: Option<u64>,
    /// Suspend only: the last step that saw this GPU free of online work → the first SUSPEND
    /// entering the kernel, ns. The online work was published after that step, so this bounds
    /// the time from its publication to the suspend from above.
    pub detection_ns: Option<u64>,
    /// Queues suspended or resumed.
    pub queues: u32,
    /// Offline processes an ioctl was issued for.
    pub ioctls: u32,
    /// Offline processes counted as held with no ioctl: idle on the GPU (deferred, see
    /// [`super::offline`]) or already held by their gang.
    pub held_no_ioctl: u32,
}

/// What the reaction thread tells the other threads.
#[derive(Debug)]
pub enum Report {
    /// An offline process is attached; its queues (id, GPU, read-index address) from the snapshot.
    Attached {
        pid: HostPid,
        comm: String,
        queues: Vec<QueueSnapshotEntry>,
        picked_up: bool,
    },
    /// It could not be attached; `retry`: its KFD state was not complete yet.
    AttachFailed {
        pid: HostPid,
        error: DebugError,
        retry: bool,
    },
    Detached {
        pid: HostPid,
        reason: &'static str,
        detached: Detached,
    },
    /// Queues it created while held were suspended too.
    QueuesHeld {
        pid: HostPid,
        queues: u32,
    },
    /// A session's own watchdog resumed every queue of `pid` (this loop did not resume in time).
    WatchdogResumed {
        t_ns: u64,
        pid: HostPid,
        held_ms: u64,
        still_held: usize,
    },
    Transition(TransitionRecord, Vec<(HostPid, SharedError)>),
    /// An idle resume skipped: the gap is predicted shorter than the transitions cost.
    ResumeSkipped {
        t_ns: u64,
        gpu: GpuId,
        verdict: GapVerdict,
    },
    /// Every hold of a GPU ended without its policy (watchdogs, exits): it runs again.
    Released {
        t_ns: u64,
        gpu: GpuId,
    },
    OnlineGone {
        pid: HostPid,
    },
    /// The probe's store count of an online queue it stops filtering on.
    DoorbellStores(DoorbellCount),
    /// How an online process's submissions are seen (once per process, at its first queue).
    SeenBy {
        pid: HostPid,
        path: DetectionPath,
        libraries: Vec<String>,
        probes: Vec<ProbePoint>,
        why: Option<String>,
    },
    /// A malformed `--hint-socket` line.
    HintMalformed {
        line: String,
        count: u64,
    },
    Warning(String),
}

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
}

/// What the reaction thread measures, read live by the other threads.
#[derive(Default)]
pub struct LoopStats {
    /// Start of one step to the start of the next, ns, over the steps that called the kernel for
    /// nothing but the reads: the poll's own cadence. A step that suspended, resumed or attached
    /// is as long as its ioctls (their cost is in the transitions' latency and the reaction
    /// figure); with the doorbell probe most quiet steps are waits, so those few long steps
    /// would otherwise make the percentiles.
    pub step: Histogram,
    /// Steps left out of `step` because they suspended, resumed or attached.
    pub transition_steps: AtomicU64,
    /// Per suspend, see [`TransitionRecord::detection_ns`].
    pub detection: Histogram,
    /// Of them, the suspends whose online work the doorbell probe saw: its store → the first
    /// SUSPEND entering the kernel, exactly.
    pub detection_doorbell: Histogram,
    /// Per hit of the probe the reaction thread took: the store's kernel stamp → the start of
    /// the step that took it (the wake-up's share of `detection_doorbell`; the rest is the
    /// step's own work up to the SUSPEND).
    pub doorbell_wake: Histogram,
    /// Waits on the doorbell probe (the online side idle and covered), and of them those a
    /// submission ended.
    pub doorbell_waits: AtomicU64,
    pub doorbell_wakes: AtomicU64,
    /// Offline processes a suspend found with nothing on the GPU (held with no ioctl), and of
    /// them those suspended later at their first submission within the hold.
    pub offline_deferred: AtomicU64,
    pub offline_late_suspends: AtomicU64,
    /// Resumes of several offline processes stopped between two RESUMEs because online work
    /// was published meanwhile (the rest stayed held).
    pub resumes_cut_short: AtomicU64,
    /// Online dispatch delay seen in the indices: first seen pending → consumed, ns.
    pub dispatch_delay: Histogram,
    pub steps: AtomicU64,
    /// The reaction thread's own CPU time over its run, ns (set when it ends).
    pub cpu_ns: AtomicU64,
    /// Of it, the time inside suspend and resume transitions (the debug-trap ioctls: on HWS,
    /// KFD's unmap, fence wait and remap run on this thread), ns.
    pub transition_cpu_ns: AtomicU64,
    /// Reports dropped because their queue was full (the reader fell behind).
    pub reports_dropped: AtomicU64,
    /// The `--hint-socket` counters, as of the last step that received a line or a client.
    pub hints: std::sync::Mutex<HintCounts>,
}

/// One GPU's policy and what it knows of the online work there.
struct Lane {
    gpu: GpuId,
    policy: PolicyMachine,
    /// Online work pending in the indices at this step.
    pending: bool,
    /// An online process with queues here exited since the last step.
    online_gone: bool,
    /// The last step that saw no online work here.
    quiet_ns: u64,
    /// When the current online burst was first seen (for the reaction).
    visible_ns: Option<u64>,
    /// Some online queue is on this GPU (hints count only then).
    online_queues: usize,
    /// The online processes' `cu_occupancy` files of this GPU: waves in flight, which the
    /// indices no longer show once a dispatch has started. Read every `occupancy_ns` (the kernel
    /// asks the hardware: too costly for every step), and at once when an idle resume is due, so
    /// a running online dispatch is never taken for an idle GPU.
    occupancy: Vec<(HostPid, Box<dyn Occupancy>)>,
    /// When the files were last read, and whether they showed waves.
    occupancy_read: Option<(u64, bool)>,
    /// The earliest doorbell store seen on this GPU since its last step (the probe's stamp).
    doorbell_ns: Option<u64>,
    /// The store that made the current online burst visible, for its detection figure.
    published_ns: Option<u64>,
    /// Online work was seen here at the last step.
    active: bool,
}

impl Lane {
    fn new(gpu: GpuId, policy: PolicyConfig, now: u64) -> Self {
        Self {
            gpu,
            policy: PolicyMachine::new(policy),
            pending: false,
            online_gone: false,
            quiet_ns: now,
            visible_ns: None,
            online_queues: 0,
            occupancy: Vec::new(),
            occupancy_read: None,
            doorbell_ns: None,
            published_ns: None,
            active: false,
        }
    }

    /// Online waves on this GPU now, from the files (a read stays good for `max_age_ns`).
    ///
    /// A busy reading is reused for a quarter of the idle threshold at most: it says the GPU was
    /// busy when it was read, and each step it is reused restarts the policy's idle clock, so a
    /// reading kept for `max_age_ns` (10 ms by default) held the offline work for that long after
    /// the online work ended (the native harness: offline kept 79 % against 84 % with fresh
    /// reads, MI300X profile, Poisson). An idle reading may wait `max_age_ns`: submissions are
    /// seen in the indices and the probe, and a fresh read precedes every idle resume.
    fn occupied_now(&mut self, now: u64, max_age_ns: u64) -> bool {
        let busy_max_age = self.policy.idle_threshold_ns() / 4;
        if let Some((at, busy)) = self.occupancy_read
            && (at == now || now.saturating_sub(at) < if busy { max_age_ns.min(busy_max_age) } else { max_age_ns })
        {
            return busy;
        }
        let busy = self.occupancy.iter().any(|(_, f)| f.busy() == Some(true));
        self.occupancy_read = Some((now, busy));
        busy
    }
}

/// An online queue the doorbell probe filters on.
struct Doorbell {
    pid: HostPid,
    queue_id: QueueId,
    gpu: GpuId,
    signal: u64,
    /// The probe sends a hit at its next store.
    armed: bool,
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
        }
    }

    /// Take the real-time footing, then step until `stop` is set (or the other side hung up);
    /// then resume every GPU, detach every offline process and return what was granted.
    pub fn run(mut self, stop: &AtomicBool) -> Realtime {
        let granted = realtime::apply(self.config.realtime);
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
                if self.wait_for_work() {
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
        self.service_offline(now);
        self.take_hits(now);
        self.read_hints();
        self.read_online(now);
        self.watch_deferred();
        let hint = self.hint;
        for i in 0..self.lanes.len() {
            let occupancy_ns = self.config.occupancy_ns;
            let lane = &mut self.lanes[i];
            let doorbell = lane.doorbell_ns.take();
            let mut active = lane.pending || doorbell.is_some() || (hint && lane.online_queues > 0);
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
            lane.active = active;
            let seen = Observation { online_active: active, online_gone: std::mem::take(&mut lane.online_gone) };
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
        self.rearm();
        true
    }

    /// The probe's hits since the last step: each marks its queue's GPU active for this step
    /// and its doorbell disarmed.
    fn take_hits(&mut self, now: u64) {
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
    fn rearm(&mut self) {
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

    /// The hint socket's new clients and lines: [`Self::hint`] for this step, the malformed lines
    /// reported. A hint of a server that exited (no online process left) is no online work.
    fn read_hints(&mut self) {
        let Some(h) = self.hints.as_mut() else { return };
        let before = h.state.counts;
        let malformed = h.poll();
        let activity = h.state.take_activity();
        let counts = h.state.counts;
        self.hint = activity && !self.online.is_empty();
        for w in malformed {
            self.report(Report::HintMalformed { line: w.line, count: w.count });
        }
        if counts != before
            && let Ok(mut shared) = self.stats.hints.lock()
        {
            *shared = counts;
        }
    }

    /// Whether the thread may wait on the probe: every GPU runs with no online work seen, every
    /// online queue is covered and armed, no hint is open, and nothing was armed at this step.
    fn may_wait(&self) -> bool {
        if self.probe.is_none() || self.armed_now || self.hint || self.config.busy_poll {
            return false;
        }
        self.lanes.iter().all(|l| {
            let covered = self.doorbells.iter().filter(|d| d.gpu == l.gpu && d.armed).count();
            !l.active && l.policy.state() == State::Running && covered >= l.online_queues
        })
    }

    /// The one wait: a hit, a command, a hint client or line, or the cross-check. True when
    /// something woke it.
    fn wait_for_work(&mut self) -> bool {
        let Some(probe) = &self.probe else { return false };
        let mut fds = vec![probe.fd()];
        if let Some(n) = &self.nudge {
            fds.push(n.fd());
        }
        if let Some(h) = &self.hints {
            fds.extend(h.fds());
        }
        let woken = wait_readable(&fds, self.config.cross_check_ns);
        if let Some(n) = &self.nudge {
            n.clear();
        }
        woken
    }

    /// How `pid`'s submissions are seen, decided at its first queue and reported once; with the
    /// probe, `addrs`'s doorbell signal is filtered on (armed).
    fn cover(&mut self, pid: HostPid, addrs: QueueAddrs) {
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
    fn uncover(&mut self, pid: HostPid, queue_id: Option<QueueId>) {
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
            Command::OnlineQueue { pid, addrs } => {
                let i = match self.online.iter().position(|p| p.pid == pid) {
                    Some(i) => i,
                    None => {
                        self.online.push(OnlineProcess::new(pid, self.config.watch_writes));
                        self.online.len() - 1
                    }
                };
                if self.online[i].queue_ids().contains(&addrs.queue_id) {
                    // An id reused after a destroy we did not see: its old GPU loses the queue.
                    if let Some(gpu) = self.online[i].remove_queue(addrs.queue_id) {
                        let lane = self.lane(gpu, now);
                        lane.online_queues = lane.online_queues.saturating_sub(1);
                    }
                }
                self.online[i].add_queue(addrs);
                self.lane(addrs.gpu_id, now).online_queues += 1;
                self.cover(pid, addrs);
            }
            Command::OnlineQueueGone { pid, queue_id } => {
                self.uncover(pid, Some(queue_id));
                if let Some(p) = self.online.iter_mut().find(|p| p.pid == pid)
                    && let Some(gpu) = p.remove_queue(queue_id)
                {
                    let lane = self.lane(gpu, now);
                    lane.online_queues = lane.online_queues.saturating_sub(1);
                }
            }
            Command::OnlineGone { pid } => self.online_gone(pid, now),
            Command::AttachOffline { pid, picked_up, job } => self.attach(pid, picked_up, job),
            Command::OfflineGone { pid } => {
                if let Some(i) = self.offline.iter().position(|p| p.pid == pid) {
                    self.detach(i, "exited", now);
                }
            }
            Command::OnlineOccupancy { pid, reader } => self.lane(reader.gpu(), now).occupancy.push((pid, reader)),
        }
    }

    fn online_gone(&mut self, pid: HostPid, now: u64) {
        self.uncover(pid, None);
        for lane in &mut self.lanes {
            lane.occupancy.retain(|(p, _)| *p != pid);
        }
        let Some(i) = self.online.iter().position(|p| p.pid == pid) else { return };
        let p = self.online.remove(i);
        let gpus: Vec<GpuId> = p.gpus().collect();
        for gpu in gpus {
            let lane = self.lane(gpu, now);
            lane.online_queues = lane.online_queues.saturating_sub(1);
            lane.online_gone = true;
        }
    }

    /// Attach an offline process on this thread; held at once on every GPU held now.
    fn attach(&mut self, pid: HostPid, picked_up: bool, job: JobId) {
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
        let occupancy = if self.config.defer_idle { self.occupancy.open(pid) } else { Vec::new() };
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
                    p.held = p.gpus();
                    p.gang_holds = holds;
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
                    p.held.push(gpu);
                    self.report(Report::QueuesHeld { pid, queues: b.count as u32 });
                }
                Ok(_) => {
                    // Nothing there yet: queues created on it during the hold are held.
                    p.held.push(gpu);
                }
                Err(e) => self.report(Report::Warning(format!(
                    "offline pid {pid} attached while GPU {gpu:#x} is held; suspending it there failed: {e}"
                ))),
            }
        }
    }

    /// Detach offline process `i` (its session resumes what it holds and disables the trap).
    fn detach(&mut self, i: usize, reason: &'static str, now: u64) {
        let p = self.offline.remove(i);
        // Its deferred GPUs too: a GPU it alone was held for runs again.
        let pid = p.pid;
        let held: Vec<GpuId> = p.held.iter().copied().chain(p.deferred.iter().map(|(g, _)| *g)).collect();
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

    /// The sessions' own notices: exits, watchdog resumes, queues held mid-hold.
    fn service_offline(&mut self, now: u64) {
        let mut i = 0;
        while i < self.offline.len() {
            let mut exited = false;
            for n in self.offline[i].control.notices(now) {
                match n {
                    SessionNotice::TargetExited { .. } => exited = true,
                    SessionNotice::WatchdogResumed { held_ms, .. } => {
                        let now = monotonic_ns();
                        let p = &mut self.offline[i];
                        p.gang_holds.clear();
                        let (pid, released) = (p.pid, std::mem::take(&mut p.held));
                        let still_held = self.offline.iter().filter(|p| !p.held.is_empty()).count();
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
                    SessionNotice::Failed { op, error } => {
                        let pid = self.offline[i].pid;
                        self.report(Report::Warning(format!("offline pid {pid}: {op} failed: {error}")));
                    }
                    _ => {}
                }
            }
            if exited {
                self.detach(i, "exited", monotonic_ns());
            } else {
                i += 1;
            }
        }
    }

    /// Read every online process's indices: which GPUs have online work pending.
    fn read_online(&mut self, now: u64) {
        for lane in &mut self.lanes {
            lane.pending = false;
        }
        let mut i = 0;
        while i < self.online.len() {
            let p = &mut self.online[i];
            let delays = &self.stats.dispatch_delay;
            match p.poll(now, &mut |_, ns| delays.record(ns)) {
                Ok(poll) => {
                    if poll.pending_queues > 0 {
                        for gpu in p.pending_gpus() {
                            if let Some(lane) = self.lanes.iter_mut().find(|l| l.gpu == gpu) {
                                lane.pending = true;
                            }
                        }
                    }
                }
                Err(ReadError::Gone(pid)) => {
                    self.online_gone(pid, now);
                    self.report(Report::OnlineGone { pid });
                    continue;
                }
                Err(e) => {
                    // A queue destroyed before its destroy reached us: drop the process's queues;
                    // the tracer announces the live ones again.
                    let (pid, ids) = (p.pid, p.queue_ids());
                    self.report(Report::Warning(e.to_string()));
                    for queue_id in ids {
                        self.command(Command::OnlineQueueGone { pid, queue_id }, now);
                    }
                }
            }
            i += 1;
        }
    }

    /// Online work pending on `gpu` in the indices now (read afresh: between two RESUMEs).
    fn online_pending_on(&mut self, gpu: GpuId) -> bool {
        self.read_online(monotonic_ns());
        self.lanes.iter().any(|l| l.gpu == gpu && l.pending)
    }

    /// Offline processes deferred on a held GPU that submitted since: suspended now.
    fn watch_deferred(&mut self) {
        for i in 0..self.offline.len() {
            let mut k = 0;
            while k < self.offline[i].deferred.len() {
                let p = &mut self.offline[i];
                let (gpu, writes) = p.deferred[k];
                if !p.submitted_since(gpu, writes) {
                    k += 1;
                    continue;
                }
                p.deferred.remove(k);
                self.called_kernel = true;
                let pid = p.pid;
                match p.control.suspend(&Selection::Gpu(gpu)) {
                    Ok(b) if b.count > 0 => {
                        p.held.push(gpu);
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

    /// Carry out lane `i`'s action over every offline process.
    fn act(&mut self, i: usize, action: Action) {
        let gpu = self.lanes[i].gpu;
        let resume = match action {
            Action::Suspend => None,
            Action::Resume(reason) => Some(reason),
            Action::HoldThroughGap(verdict) => {
                self.report(Report::ResumeSkipped { t_ns: monotonic_ns(), gpu, verdict });
                return;
            }
        };
        self.errors.clear();
        self.called_kernel = true;
        // `--gang`: every job with a process on this GPU is held on all of its GPUs.
        self.jobs.clear();
        if self.config.gang {
            self.jobs.extend(self.offline.iter().filter(|p| p.has_queues_on(gpu)).map(|p| p.job));
        }
        let (mut queues, mut ioctls, mut latency_ns, mut no_ioctl) = (0u32, 0u32, 0u64, 0u32);
        let cpu_before = thread_cpu_ns();
        let entered = monotonic_ns();
        for k in 0..self.offline.len() {
            // A resume of several offline processes is one RESUME each, and each unmaps the
            // device's queues (HWS): online work published meanwhile waits for every one left,
            // then for the suspends. Between two, look at the online indices; with work there,
            // leave the rest held (the next suspend holds them with no ioctl).
            if resume.is_some()
                && ioctls > 0
                && self.offline[k].held.contains(&gpu)
                && !self.jobs.contains(&self.offline[k].job)
                && self.online_pending_on(gpu)
            {
                self.stats.resumes_cut_short.fetch_add(1, Ordering::Relaxed);
                break;
            }
            let p = &mut self.offline[k];
            if self.jobs.contains(&p.job) {
                let r = match resume {
                    None if !p.gang_holds.is_empty() => {
                        if !p.gang_holds.contains(&gpu) {
                            p.gang_holds.push(gpu);
                        }
                        no_ioctl += 1;
                        continue;
                    }
                    None => p.control.suspend(&Selection::All),
                    Some(_) => {
                        let before = p.gang_holds.len();
                        p.gang_holds.retain(|g| *g != gpu);
                        if before == 0 || !p.gang_holds.is_empty() {
                            continue;
                        }
                        p.control.resume()
                    }
                };
                match r {
                    Ok(b) => {
                        tally(&b, &mut queues, &mut ioctls, &mut latency_ns);
                        if resume.is_none() {
                            p.gang_holds.push(gpu);
                            p.held = p.gpus();
                        } else {
                            p.held.clear();
                        }
                    }
                    Err(e) => {
                        if resume.is_some() {
                            p.held.clear();
                        }
                        self.errors.push((p.pid, e.into()));
                    }
                }
                continue;
            }
            let held = p.held.contains(&gpu);
            let r = match resume {
                // Still held: a resume cut short for online work left it so.
                None if held => {
                    no_ioctl += 1;
                    continue;
                }
                None => {
                    if self.config.defer_idle
                        && !held
                        && let Some(writes) = p.idle_on(gpu)
                    {
                        p.deferred.push((gpu, writes));
                        self.stats.offline_deferred.fetch_add(1, Ordering::Relaxed);
                        no_ioctl += 1;
                        continue;
                    }
                    p.control.suspend(&Selection::Gpu(gpu))
                }
                Some(_) => {
                    p.deferred.retain(|(g, _)| *g != gpu);
                    if !held {
                        continue;
                    }
                    p.control.resume_gpu(gpu)
                }
            };
            match r {
                Ok(b) => {
                    tally(&b, &mut queues, &mut ioctls, &mut latency_ns);
                    if resume.is_none() && b.count > 0 {
                        p.held.push(gpu);
                    } else if resume.is_none() {
                        // Nothing of it on this GPU: end the empty hold at once, so nothing it
                        // creates there is held past this GPU's policy.
                        let _ = p.control.resume_gpu(gpu);
                    } else {
                        p.held.retain(|g| *g != gpu);
                    }
                }
                Err(e) => {
                    if resume.is_some() {
                        p.held.retain(|g| *g != gpu);
                    }
                    self.errors.push((p.pid, e.into()));
                }
            }
        }
        let now = monotonic_ns();
        self.stats.transition_cpu_ns.fetch_add(thread_cpu_ns().saturating_sub(cpu_before), Ordering::Relaxed);
        let lane = &mut self.lanes[i];
        let record = match resume {
            None => {
                let ok = queues > 0 || no_ioctl > 0;
                lane.policy.suspended(now, ok);
                let reaction_ns = lane.visible_ns.map(|v| now.saturating_sub(v));
                // Through the probe the submission's own time is known; through the poll only
                // the last step that saw none bounds it.
                let published = lane.published_ns.take();
                let detection_ns = Some(entered.saturating_sub(published.unwrap_or(lane.quiet_ns)));
                if ok {
                    if let Some(r) = reaction_ns {
                        lane.policy.note_reaction(r);
                    }
                    if let Some(d) = detection_ns {
                        self.stats.detection.record(d);
                        if published.is_some() {
                            self.stats.detection_doorbell.record(d);
                        }
                    }
                }
                TransitionRecord {
                    t_ns: now,
                    gpu,
                    kind: TransitionKind::Suspend,
                    reason: None,
                    latency_ns,
                    reaction_ns,
                    detection_ns,
                    queues,
                    ioctls,
                    held_no_ioctl: no_ioctl,
                }
            }
            Some(reason) => {
                lane.policy.resumed(now);
                if ioctls > 0 {
                    lane.policy.note_resume(latency_ns);
                }
                TransitionRecord {
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
                }
            }
        };
        let errors = std::mem::take(&mut self.errors);
        let held = record.kind == TransitionKind::Suspend && (record.queues > 0 || record.held_no_ioctl > 0);
        self.report(Report::Transition(record, errors));
        if held && self.panic_after_suspend {
            // Unwinding drops every session, which resumes, disables and detaches (Session's Drop).
            panic!("injected fault: the reaction thread panics with GPU {gpu:#x} held");
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
            self.detach(0, "stopped", now);
        }
        // The store counts of every queue still watched, before the probe goes with this thread.
        let mut pids: Vec<HostPid> = self.doorbells.iter().map(|d| d.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        for pid in pids {
            self.uncover(pid, None);
        }
    }
}

/// One process's answer added to its transition's figures: queues, ioctls issued, their time.
fn tally(b: &Batch, queues: &mut u32, ioctls: &mut u32, latency_ns: &mut u64) {
    if !b.skipped {
        *ioctls += 1;
        *latency_ns += b.latency_ns;
    }
    *queues += b.count.max(0) as u32;
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    };

    use super::*;

    /// A reader that says what `busy` holds and counts its reads.
    struct Scripted {
        busy: Arc<AtomicBool>,
        reads: Arc<AtomicUsize>,
    }

    impl crate::schedule::seams::Occupancy for Scripted {
        fn gpu(&self) -> GpuId {
            GpuId(0x1000)
        }
        fn busy(&self) -> Option<bool> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            Some(self.busy.load(Ordering::SeqCst))
        }
    }

    #[test]
    fn a_busy_reading_is_reused_for_a_quarter_of_the_idle_threshold_an_idle_one_for_the_interval() {
        const MS: u64 = 1_000_000;
        let policy = PolicyConfig { idle: std::time::Duration::from_millis(2), ..PolicyConfig::default() };
        let mut lane = Lane::new(GpuId(0x1000), policy, 0);
        let (busy, reads) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicUsize::new(0)));
        lane.occupancy.push((HostPid(7), Box::new(Scripted { busy: busy.clone(), reads: reads.clone() })));
        let interval = 10 * MS;
        // Busy at 0: reused until 0.5 ms (2 ms / 4), read again after.
        assert!(lane.occupied_now(0, interval));
        assert!(lane.occupied_now(MS / 2 - 1, interval));
        assert_eq!(reads.load(Ordering::SeqCst), 1);
        busy.store(false, Ordering::SeqCst);
        assert!(!lane.occupied_now(MS / 2, interval));
        assert_eq!(reads.load(Ordering::SeqCst), 2);
        // Idle: reused for the whole interval, unless a fresh one is asked for (max age 0).
        assert!(!lane.occupied_now(MS / 2 + interval - 1, interval));
        assert_eq!(reads.load(Ordering::SeqCst), 2);
        assert!(!lane.occupied_now(MS, 0));
        assert_eq!(reads.load(Ordering::SeqCst), 3);
    }
}
