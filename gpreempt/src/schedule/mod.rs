//! `gpreempt schedule`: keep the offline processes' queues suspended while the online processes
//! have work on the GPU, with no change to either.
//!
//! - [`online`]: sees online work from outside (AQL dispatch indices, `cu_occupancy`).
//! - [`hints`]: the optional `begin`/`end` socket.
//! - [`policy`]: when to suspend and resume (a pure state machine).
//! - [`control`]: the debug-trap session per offline process (attached once, kept attached).
//! - [`discover`]: processes and queues that appear later (tracer, or sysfs).
//! - [`kernel`]: the driver's side of the suspends and resumes (tracer only).
//!
//! [`Scheduler`] ties them together on one thread: [`Scheduler::start`] checks the selectors and
//! attaches, [`Scheduler::run`] polls until the stop flag is set, then resumes and detaches
//! everything. What happens is reported as typed [`ScheduleEvent`]s to a callback.
//!
//! Costs the output names: one debug-trap ENABLE and DISABLE per offline process (a runlist
//! refresh each: `debug_refresh_runlist` in `kfd_dbg_trap_activate`/`_deactivate`, kfd_debug.c,
//! Linux 6.12), and for an online process that already has queues when the
//! scheduler starts one snapshot (ENABLE, GET_QUEUE_SNAPSHOT, DISABLE: two refreshes) to learn
//! their index addresses; the online process is never kept attached. On HWS GPUs every suspend
//! and resume unmaps every queue of the device, the online process's too.

pub mod channel;
pub mod discover;
pub mod hints;
pub mod kernel;
pub mod online;
pub mod policy;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use serde::Serialize;

use self::{
    discover::Discovery,
    hints::{HintCounts, HintSocket},
    kernel::{KernelBreakdown, KernelReport},
    online::{OnlineProcess, QueueAddrs, ReadError},
    policy::{Action, Observation, PolicyConfig, PolicyMachine, ResumeReason, State},
};
use crate::{
    controller::control::Control,
    controller::{
        target::{Target, TargetError},
        vocabulary::{DebugError, Detached, Options, Selection, SessionNotice, SharedError},
    },
    domain::{GpuId, HostPid, QueueId},
    host::{
        roots::Roots,
        select::{self, Selector},
    },
    kfd::{Device, KfdVersion},
    model::{ModelNotice, spans::Span},
    stats::Summary as Stats,
};

/// What to schedule and how.
#[derive(Clone, Debug)]
pub struct ScheduleConfig {
    pub online: Vec<Selector>,
    pub offline: Vec<Selector>,
    pub policy: PolicyConfig,
    /// Interval between reads of the online dispatch indices.
    pub poll: Duration,
    /// Interval between reads of the online `cu_occupancy` (the kernel asks the hardware).
    pub occupancy: Duration,
    /// Interval between [`ScheduleEvent::Interval`] reports.
    pub interval: Duration,
    pub hint_socket: Option<PathBuf>,
    pub roots: Roots,
    /// Options of each offline session; its watchdog is set to back the policy's up.
    pub session: Options,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        Self {
            online: Vec::new(),
            offline: Vec::new(),
            policy: PolicyConfig::default(),
            poll: Duration::from_micros(200),
            occupancy: Duration::from_millis(1),
            interval: Duration::from_secs(1),
            hint_socket: None,
            roots: Roots::default(),
            session: Options::default(),
        }
    }
}

/// Why the scheduler cannot start: cause and fix.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error("--{role} {pid}: {cause}")]
    Target { role: Role, pid: HostPid, cause: TargetError },
    #[error(
        "pid {0} is selected both as online and as offline; a process is one or the other (check the pids and \
         containers given to --online and --offline)"
    )]
    Overlap(HostPid),
    #[error("--offline selects no process and no container: give at least one pid or container:NAME")]
    NoOffline,
    #[error("--online selects no process and no container: give at least one pid or container:NAME")]
    NoOnline,
    #[error("--{role} {pid}: {cause}")]
    Debug { role: Role, pid: HostPid, cause: DebugError },
    #[error("--online {pid}: {cause}")]
    Unreadable { pid: HostPid, cause: ReadError },
    #[error("--hint-socket {}: {cause}", path.display())]
    HintSocket { path: PathBuf, cause: std::io::Error },
    /// No /dev/kfd, or a kernel without the debug trap.
    #[error(transparent)]
    Kernel(DebugError),
}

/// The kernel can suspend another process's queues: /dev/kfd opens and has the debug trap.
/// Checked before anything slow starts (the tracer), so an old kernel is refused at once.
pub fn check_kernel(device: &std::path::Path) -> Result<KfdVersion, ScheduleError> {
    let kfd = Device::open_path(device).map_err(|e| ScheduleError::Kernel(e.into()))?;
    let version = kfd.version().map_err(|e| ScheduleError::Kernel(e.into()))?;
    if !version.has_debug_trap() {
        return Err(ScheduleError::Kernel(DebugError::NoDebugTrap(version)));
    }
    Ok(version)
}

/// Which side a process is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Online,
    Offline,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Online => "online",
            Role::Offline => "offline",
        })
    }
}

/// One suspend or resume of the offline processes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Transition {
    /// Milliseconds since start.
    pub t_ms: f64,
    pub action: &'static str,
    /// Why a resume happened (`None` for a suspend).
    pub reason: Option<ResumeReason>,
    /// Time in the ioctls, every offline process together, µs.
    pub latency_us: f64,
    /// Suspend only: online work first visible → SUSPEND returned, µs.
    pub reaction_us: Option<f64>,
    /// Queues suspended or resumed.
    pub queues: i64,
    /// Offline processes the ioctl failed for, with the error.
    pub errors: Vec<TransitionError>,
}

/// One offline process a transition's ioctl failed for.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TransitionError {
    pub pid: HostPid,
    pub error: SharedError,
}

impl std::fmt::Display for TransitionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {}: {}", self.pid, self.error)
    }
}

impl Transition {
    /// The failures, one line: `pid N: why; pid M: why`.
    pub fn errors_line(&self) -> String {
        self.errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    }
}

/// A periodic report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Interval {
    pub t_ms: f64,
    pub state: State,
    pub online_pending: bool,
    pub online_processes: usize,
    pub offline_processes: usize,
    /// Share of the interval the offline queues were suspended.
    pub suspended_share: f64,
    /// Transitions so far.
    pub transitions: u64,
    pub reaction_p99_us: Option<f64>,
    /// Offline dispatches started in the interval (read indices).
    pub offline_dispatches: u64,
}

/// The end-of-run report.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ScheduleReport {
    pub elapsed_ms: f64,
    pub suspends: u64,
    pub resumes: u64,
    pub resumes_by_reason: BTreeMap<String, u64>,
    /// Suspends that failed for every offline process.
    pub failed_suspends: u64,
    pub suspended_ms: f64,
    pub suspended_share: f64,
    pub reaction_us: Option<Stats>,
    pub suspend_us: Option<Stats>,
    pub resume_us: Option<Stats>,
    /// Online dispatch delay estimated from the indices: first seen pending → consumed, µs.
    pub online_dispatch_delay_us: Option<Stats>,
    /// Offline dispatches started (read indices), in total and per second.
    pub offline_dispatches: u64,
    pub offline_rate_running_per_s: Option<f64>,
    pub offline_rate_overall_per_s: Option<f64>,
    pub polls: u64,
    pub hints: Option<HintCounts>,
    /// Runlist refreshes caused by attaching (ENABLE and DISABLE of offline sessions, online snapshots).
    pub attach_refreshes: u64,
    /// This process's CPU time (user + system), ms, and as a share of the elapsed time.
    pub cpu_ms: f64,
    pub cpu_share: f64,
    /// What the driver did for the suspends and resumes, when the tracer is attached.
    pub kernel: Option<KernelReport>,
}

/// Everything the scheduler reports.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ScheduleEvent {
    /// An offline process is attached (kept attached until it exits or the scheduler stops).
    OfflineAttached {
        pid: HostPid,
        comm: String,
        queues: usize,
        picked_up: bool,
    },
    /// An offline process could not be attached (picked up later: it is skipped).
    OfflineAttachFailed {
        pid: HostPid,
        error: String,
    },
    OfflineDetached {
        pid: HostPid,
        reason: &'static str,
        detached: Detached,
    },
    /// A held offline process created queues: they are suspended too; `queues` is how many of
    /// its queues are suspended now.
    OfflineQueuesHeld {
        pid: HostPid,
        queues: i32,
    },
    /// An online process is watched; `snapshot`: its existing queues were learnt with one
    /// debug-trap snapshot (ENABLE, GET_QUEUE_SNAPSHOT, DISABLE: two runlist refreshes).
    OnlineAdded {
        pid: HostPid,
        queues: usize,
        snapshot: bool,
        occupancy_files: usize,
    },
    OnlineQueue {
        pid: HostPid,
        queue_id: QueueId,
        gpu_id: GpuId,
    },
    OnlineGone {
        pid: HostPid,
    },
    Transition(Transition),
    Interval(Interval),
    /// A hint line that is not `begin` or `end` (ignored).
    HintMalformed {
        line: String,
        count: u64,
    },
    /// A session's own watchdog resumed an offline process's queues: they had been held `held_ms`,
    /// past the session's `max_suspend`, because the scheduler loop stalled. `still_held` offline
    /// processes remain suspended; at 0 the offline work runs again although the policy has not
    /// resumed it (its resume then finds nothing to resume).
    WatchdogResumed {
        t_ms: f64,
        pid: HostPid,
        held_ms: u64,
        still_held: usize,
    },
    Warning {
        message: String,
    },
    Summary(Box<ScheduleReport>),
}

struct OfflineProc<C> {
    pid: HostPid,
    control: C,
    /// Read-index addresses of its queues (for the progress count).
    reads: Vec<u64>,
    last_reads: Vec<u64>,
    suspended: bool,
}

/// Samples and counters behind [`ScheduleReport`].
#[derive(Default)]
struct Metrics {
    reaction_us: Vec<f64>,
    suspend_us: Vec<f64>,
    resume_us: Vec<f64>,
    delay_ns: Vec<u64>,
    resumes_by_reason: BTreeMap<String, u64>,
    suspends: u64,
    resumes: u64,
    failed_suspends: u64,
    suspended_ns: u64,
    running_ns: u64,
    offline_dispatches: u64,
    polls: u64,
    attach_refreshes: u64,
}

/// The scheduler; everything runs on the thread that created it.
pub struct Scheduler<C: Control> {
    config: ScheduleConfig,
    discovery: Box<dyn Discovery>,
    online: Vec<OnlineProcess>,
    offline: Vec<OfflineProc<C>>,
    hints: Option<HintSocket>,
    policy: PolicyMachine,
    metrics: Metrics,
    start: Instant,
    cpu_start: f64,
    /// When the current online burst first became visible.
    visible_at: Option<u64>,
    online_gone: bool,
    /// Pids already decided on (attached, watched or refused), so a repeated open is ignored.
    seen: BTreeMap<HostPid, Role>,
    /// Offline processes seen opening /dev/kfd whose KFD state was not complete yet, retried
    /// until the deadline (ns).
    retry: Vec<(HostPid, u64)>,
    /// The driver's side of the transitions (with the tracer).
    kernel: Option<KernelBreakdown>,
    /// Every online process watched so far (their queues among the collateral).
    online_ever: BTreeSet<HostPid>,
    spans: Vec<Span>,
}

/// How long a picked-up offline process is retried while its KFD state is incomplete.
const PICKUP_RETRY: Duration = Duration::from_secs(2);

fn cpu_ms() -> f64 {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr()) } != 0 {
        return 0.0;
    }
    // SAFETY: initialised by the successful call.
    let u = unsafe { u.assume_init() };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    ms(u.ru_utime) + ms(u.ru_stime)
}

/// Check a pid selector's process: it exists and has opened /dev/kfd.
fn check_pid(roots: &Roots, role: Role, pid: HostPid) -> Result<(), ScheduleError> {
    let target = Target::inspect(roots, pid).map_err(|source| ScheduleError::Target { role, pid, cause: source })?;
    if !target.uses_kfd {
        return Err(ScheduleError::Target { role, pid, cause: TargetError::NotKfdProcess { pid, comm: target.comm } });
    }
    Ok(())
}

/// The selectors resolved against the KFD processes of the moment, or why they cannot be
/// scheduled: nothing selected on a side, a named pid that is gone or no KFD process, a process on
/// both sides. Cheap (sysfs and /proc), so a front end checks it before it starts anything slow
/// (the tracer takes seconds to attach); [`Scheduler::start`] checks it again.
pub fn check_selection(config: &ScheduleConfig) -> Result<(), ScheduleError> {
    resolve_selection(config).map(drop)
}

fn resolve_selection(config: &ScheduleConfig) -> Result<(select::Resolved, select::Resolved), ScheduleError> {
    if config.online.is_empty() {
        return Err(ScheduleError::NoOnline);
    }
    if config.offline.is_empty() {
        return Err(ScheduleError::NoOffline);
    }
    let roots = &config.roots;
    let online_sel = select::resolve(&config.online, roots);
    let offline_sel = select::resolve(&config.offline, roots);
    for (role, r) in [(Role::Online, &online_sel), (Role::Offline, &offline_sel)] {
        for &pid in &r.unmatched_pids {
            check_pid(roots, role, pid)?;
        }
    }
    if let Some(&pid) = online_sel.pids.iter().find(|p| offline_sel.pids.contains(p)) {
        return Err(ScheduleError::Overlap(pid));
    }
    for sel in &config.offline {
        if let Selector::Pid(pid) = sel
            && config.online.contains(&Selector::Pid(*pid))
        {
            return Err(ScheduleError::Overlap(*pid));
        }
    }
    Ok((online_sel, offline_sel))
}

impl<C: Control> Scheduler<C> {
    /// Check the selectors, learn the online queues, attach to every offline process. On any
    /// error everything attached so far is detached before returning. `discovery` must already
    /// run, so that nothing that appears from now on is missed.
    pub fn start(
        config: ScheduleConfig,
        discovery: Box<dyn Discovery>,
        emit: &mut dyn FnMut(&ScheduleEvent),
    ) -> Result<Self, ScheduleError> {
        let cpu_start = cpu_ms();
        let (online_sel, offline_sel) = resolve_selection(&config)?;
        let mut session = config.session.clone();
        // The policy's watchdog comes first; the session's backs it up if this loop stalls.
        session.max_suspend = Some(config.policy.max_suspend + Duration::from_millis(500));
        let hints = match &config.hint_socket {
            Some(path) => Some(
                HintSocket::bind(path)
                    .map_err(|source| ScheduleError::HintSocket { path: path.clone(), cause: source })?,
            ),
            None => None,
        };
        let policy = PolicyMachine::new(config.policy);
        let kernel = discovery.sees_driver().then(KernelBreakdown::default);
        let mut s = Self {
            config: ScheduleConfig { session, ..config },
            discovery,
            online: Vec::new(),
            offline: Vec::new(),
            hints,
            policy,
            metrics: Metrics::default(),
            start: Instant::now(),
            cpu_start,
            visible_at: None,
            online_gone: false,
            seen: BTreeMap::new(),
            retry: Vec::new(),
            kernel,
            online_ever: BTreeSet::new(),
            spans: Vec::new(),
        };
        for &pid in &online_sel.pids {
            s.seen.insert(pid, Role::Online);
            if let Err(e) = s.add_online(pid, true, emit) {
                s.shutdown(emit);
                return Err(e);
            }
        }
        for &pid in &offline_sel.pids {
            s.seen.insert(pid, Role::Offline);
            if let Err(source) = s.attach_offline(pid, false, emit) {
                s.shutdown(emit);
                return Err(ScheduleError::Debug { role: Role::Offline, pid, cause: source });
            }
        }
        for note in online_sel.notes.iter().chain(&offline_sel.notes) {
            emit(&ScheduleEvent::Warning { message: note.clone() });
        }
        for name in online_sel.empty_containers.iter().chain(&offline_sel.empty_containers) {
            emit(&ScheduleEvent::Warning {
                message: format!(
                    "container {name} has no KFD process yet; its processes are picked up when they open /dev/kfd"
                ),
            });
        }
        if !s.discovery.sees_queues() {
            emit(&ScheduleEvent::Warning {
                message: "without the tracer, queues an online process creates from now on are not watched (their \
                          index addresses are unknown); run as root on a kernel with BTF for the tracer"
                    .into(),
            });
        }
        Ok(s)
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn t_ms(&self) -> f64 {
        self.now() as f64 / 1e6
    }

    /// Watch an online process; `initial`: it may already have queues, learnt with one snapshot.
    fn add_online(
        &mut self,
        pid: HostPid,
        initial: bool,
        emit: &mut dyn FnMut(&ScheduleEvent),
    ) -> Result<(), ScheduleError> {
        let kfd_proc = self.config.roots.kfd_proc();
        let mut p = OnlineProcess::new(pid, online::occupancy_files(&kfd_proc, pid));
        let has_queues =
            crate::host::sysfs::read_process(&kfd_proc, pid.0).map(|s| !s.queues.is_empty()).unwrap_or(false);
        let snapshot = initial && has_queues;
        // Before the snapshot, whose attach would fail with a less telling error.
        online::check_readable(pid).map_err(|source| ScheduleError::Unreadable { pid, cause: source })?;
        if snapshot {
            let mut c = C::attach(pid, &Options { max_suspend: None, ..self.config.session.clone() })
                .map_err(|source| ScheduleError::Debug { role: Role::Online, pid, cause: source })?;
            let entries = c.snapshot();
            c.detach();
            self.metrics.attach_refreshes += 2;
            let entries = entries.map_err(|source| ScheduleError::Debug { role: Role::Online, pid, cause: source })?;
            for e in entries {
                p.add_queue(QueueAddrs {
                    queue_id: QueueId(e.queue_id),
                    gpu_id: GpuId(e.gpu_id),
                    read: e.read_pointer_address,
                    write: e.write_pointer_address,
                });
            }
        }
        // One read now, so an unreadable process is refused at start rather than ignored.
        let mut scratch = Vec::new();
        p.poll(self.now(), &mut scratch).map_err(|source| ScheduleError::Unreadable { pid, cause: source })?;
        emit(&ScheduleEvent::OnlineAdded {
            pid,
            queues: p.queue_ids().len(),
            snapshot,
            occupancy_files: usize::from(p.has_occupancy_files()),
        });
        self.online.push(p);
        self.online_ever.insert(pid);
        Ok(())
    }

    fn attach_offline(
        &mut self,
        pid: HostPid,
        picked_up: bool,
        emit: &mut dyn FnMut(&ScheduleEvent),
    ) -> Result<(), DebugError> {
        let mut control = C::attach(pid, &self.config.session)?;
        self.metrics.attach_refreshes += 1;
        let reads: Vec<u64> = control.snapshot().map(|e| e.iter().map(|q| q.read_pointer_address).collect())?;
        let mut last_reads = vec![0; reads.len()];
        let _ = online::read_u64s(pid, &reads, &mut last_reads);
        emit(&ScheduleEvent::OfflineAttached { pid, comm: control.comm(), queues: reads.len(), picked_up });
        let mut proc = OfflineProc { pid, control, reads, last_reads, suspended: false };
        // Picked up while the others are held: hold it too.
        if matches!(self.policy.state(), State::Suspended) {
            proc.suspended = proc.control.suspend(&Selection::All).is_ok_and(|b| b.count > 0);
        }
        self.offline.push(proc);
        Ok(())
    }

    /// Poll until `stop` is set, then resume and detach everything; returns the report (also
    /// emitted as [`ScheduleEvent::Summary`]).
    pub fn run(mut self, stop: &AtomicBool, emit: &mut dyn FnMut(&ScheduleEvent)) -> ScheduleReport {
        let mut changes = Vec::new();
        let mut next_occupancy = 0u64;
        let mut next_interval = u64::try_from(self.config.interval.as_nanos()).unwrap_or(u64::MAX);
        let mut interval_start = 0u64;
        let mut interval_suspended = 0u64;
        let mut last = self.now();
        let mut last_state = self.policy.state();
        while !stop.load(Ordering::Relaxed) {
            let now = self.now();
            // Time accounting of the previous step.
            let step = now.saturating_sub(last);
            if matches!(last_state, State::Suspended | State::Resuming) {
                self.metrics.suspended_ns += step;
                interval_suspended += step;
            } else {
                self.metrics.running_ns += step;
            }
            last = now;

            self.discovery.poll(&mut changes);
            for &c in &changes {
                self.apply_change(c, emit);
            }
            changes.clear();
            self.collect_spans();
            for (pid, deadline) in std::mem::take(&mut self.retry) {
                self.pick_up(pid, deadline, emit);
            }
            self.service_offline(emit);
            if let Some(h) = self.hints.as_mut() {
                for w in h.poll() {
                    emit(&ScheduleEvent::HintMalformed { line: w.line, count: w.count });
                }
            }
            let read_occupancy = now >= next_occupancy;
            if read_occupancy {
                next_occupancy = now + u64::try_from(self.config.occupancy.as_nanos()).unwrap_or(u64::MAX);
            }
            let pending = self.poll_online(now, read_occupancy, emit);
            // Hints count while an online process is watched: an open request of a server
            // that exited is not online work.
            let active = !self.online.is_empty()
                && (pending
                    || self.online.iter().any(|p| p.last_occupancy.is_some_and(|o| o > 0))
                    || self.hints.as_mut().is_some_and(|h| h.state.take_activity()));
            if active && self.visible_at.is_none() {
                self.visible_at = Some(now);
            }
            let seen = Observation { online_active: active, online_gone: std::mem::take(&mut self.online_gone) };
            if let Some(action) = self.policy.tick(now, seen) {
                self.act(action, emit);
            }
            if !active && self.policy.state() == State::Running {
                self.visible_at = None;
            }
            last_state = self.policy.state();
            self.metrics.polls += 1;

            if now >= next_interval {
                let len = now.saturating_sub(interval_start).max(1);
                let dispatches = self.offline_progress();
                emit(&ScheduleEvent::Interval(Interval {
                    t_ms: now as f64 / 1e6,
                    state: self.policy.state(),
                    online_pending: active,
                    online_processes: self.online.len(),
                    offline_processes: self.offline.len(),
                    suspended_share: interval_suspended as f64 / len as f64,
                    transitions: self.metrics.suspends + self.metrics.resumes,
                    reaction_p99_us: Stats::of(&self.metrics.reaction_us).map(|s| s.p99),
                    offline_dispatches: dispatches,
                }));
                interval_start = now;
                interval_suspended = 0;
                next_interval = now + u64::try_from(self.config.interval.as_nanos()).unwrap_or(u64::MAX);
            }
            std::thread::sleep(self.config.poll);
        }
        if let Some(action) = self.policy.stop() {
            self.act(action, emit);
        }
        // The stop's resume, before the detach (whose DISABLE resumes too, not a transition).
        self.discovery.poll(&mut changes);
        self.collect_spans();
        self.offline_progress();
        self.shutdown(emit);
        let report = self.report();
        emit(&ScheduleEvent::Summary(Box::new(report.clone())));
        report
    }

    /// The driver's spans of the offline processes' suspends and resumes so far.
    fn collect_spans(&mut self) {
        let Some(kernel) = self.kernel.as_mut() else { return };
        self.discovery.driver_spans(&mut self.spans);
        if self.spans.is_empty() {
            return;
        }
        let offline: BTreeSet<HostPid> = self.offline.iter().map(|p| p.pid).collect();
        for span in self.spans.drain(..) {
            kernel.add(&span, &offline, &self.online_ever);
        }
    }

    fn apply_change(&mut self, change: ModelNotice, emit: &mut dyn FnMut(&ScheduleEvent)) {
        match change {
            ModelNotice::ProcessOpened { pid } => {
                if self.seen.contains_key(&pid) || pid.0 == std::process::id() {
                    return;
                }
                let roots = &self.config.roots;
                if select::any_matches_new(&self.config.online, roots, pid) {
                    self.seen.insert(pid, Role::Online);
                    if let Err(e) = self.add_online(pid, false, emit) {
                        emit(&ScheduleEvent::Warning { message: e.to_string() });
                    }
                } else if select::any_matches_new(&self.config.offline, roots, pid) {
                    self.seen.insert(pid, Role::Offline);
                    let deadline = self.now() + u64::try_from(PICKUP_RETRY.as_nanos()).unwrap_or(u64::MAX);
                    self.pick_up(pid, deadline, emit);
                }
            }
            ModelNotice::ProcessGone { pid } => {
                self.seen.remove(&pid);
                if let Some(i) = self.online.iter().position(|p| p.pid == pid) {
                    self.online.remove(i);
                    self.online_gone = true;
                    emit(&ScheduleEvent::OnlineGone { pid });
                }
                if let Some(i) = self.offline.iter().position(|p| p.pid == pid) {
                    let p = self.offline.remove(i);
                    let detached = p.control.detach();
                    emit(&ScheduleEvent::OfflineDetached { pid, reason: "exited", detached });
                }
            }
            ModelNotice::QueueCreated { pid, queue: addrs } => {
                if let Some(p) = self.online.iter_mut().find(|p| p.pid == pid) {
                    p.add_queue(addrs);
                    emit(&ScheduleEvent::OnlineQueue { pid, queue_id: addrs.queue_id, gpu_id: addrs.gpu_id });
                } else if let Some(p) = self.offline.iter_mut().find(|p| p.pid == pid) {
                    p.reads.push(addrs.read);
                    p.last_reads.push(0);
                    let i = p.reads.len() - 1;
                    let _ = online::read_u64s(pid, &p.reads[i..], &mut p.last_reads[i..]);
                }
            }
            ModelNotice::QueueGone { pid, queue_id } => {
                if let Some(p) = self.online.iter_mut().find(|p| p.pid == pid) {
                    p.remove_queue(queue_id);
                }
            }
        }
    }

    /// Attach a process that just opened /dev/kfd; while its KFD state is still being set up
    /// (no sysfs entry yet) it is retried at later polls until `deadline`.
    fn pick_up(&mut self, pid: HostPid, deadline: u64, emit: &mut dyn FnMut(&ScheduleEvent)) {
        match self.attach_offline(pid, true, emit) {
            Ok(()) => {}
            Err(DebugError::Target(TargetError::NotKfdProcess { .. })) if self.now() < deadline => {
                self.retry.push((pid, deadline));
            }
            Err(e) => emit(&ScheduleEvent::OfflineAttachFailed { pid, error: e.to_string() }),
        }
    }

    /// The sessions' own notices: exits, watchdog resumes, queues created while held.
    fn service_offline(&mut self, emit: &mut dyn FnMut(&ScheduleEvent)) {
        let mut i = 0;
        while i < self.offline.len() {
            let mut exited = false;
            for n in self.offline[i].control.notices() {
                match n {
                    SessionNotice::TargetExited { .. } => exited = true,
                    SessionNotice::WatchdogResumed { held_ms, .. } => {
                        self.offline[i].suspended = false;
                        let still_held = self.offline.iter().filter(|p| p.suspended).count();
                        let (t_ms, pid) = (self.now() as f64 / 1e6, self.offline[i].pid);
                        emit(&ScheduleEvent::WatchdogResumed { t_ms, pid, held_ms, still_held });
                    }
                    SessionNotice::QueuesAppeared if self.offline[i].suspended => {
                        // A queue created while held runs until it is suspended too.
                        let pid = self.offline[i].pid;
                        match self.offline[i].control.suspend(&Selection::All) {
                            Ok(b) => emit(&ScheduleEvent::OfflineQueuesHeld { pid, queues: b.count }),
                            Err(e) => emit(&ScheduleEvent::Warning {
                                message: format!("pid {pid} created queues while held; suspending them failed: {e}"),
                            }),
                        }
                    }
                    _ => {}
                }
            }
            if exited {
                let p = self.offline.remove(i);
                let pid = p.pid;
                self.seen.remove(&pid);
                let detached = p.control.detach();
                emit(&ScheduleEvent::OfflineDetached { pid, reason: "exited", detached });
            } else {
                i += 1;
            }
        }
        if self.offline.iter().all(|p| !p.suspended)
            && self.policy.state() == State::Suspended
            && !self.offline.is_empty()
        {
            // Every hold ended without us (watchdog, exits): the policy follows.
            self.policy.resumed(self.now());
        }
    }

    /// Read every online process's indices (and occupancy when due): is online work pending?
    fn poll_online(&mut self, now: u64, read_occupancy: bool, emit: &mut dyn FnMut(&ScheduleEvent)) -> bool {
        let mut pending = false;
        let mut i = 0;
        while i < self.online.len() {
            let p = &mut self.online[i];
            match p.poll(now, &mut self.metrics.delay_ns) {
                Ok(poll) => pending |= poll.pending_queues > 0,
                Err(ReadError::Gone(pid)) => {
                    self.online.remove(i);
                    self.seen.remove(&pid);
                    self.online_gone = true;
                    emit(&ScheduleEvent::OnlineGone { pid });
                    continue;
                }
                Err(e) => {
                    // A queue destroyed between its destroy and our notice of it: drop the
                    // queues and learn the live ones again from the tracer.
                    emit(&ScheduleEvent::Warning { message: e.to_string() });
                    for q in p.queue_ids() {
                        p.remove_queue(q);
                    }
                }
            }
            if read_occupancy {
                p.read_occupancy();
            }
            i += 1;
        }
        pending
    }

    fn act(&mut self, action: Action, emit: &mut dyn FnMut(&ScheduleEvent)) {
        let started = Instant::now();
        let mut queues = 0i64;
        let mut errors = Vec::new();
        let suspend = action == Action::Suspend;
        for p in &mut self.offline {
            let r = if suspend {
                p.control.suspend(&Selection::All)
            } else if p.suspended {
                p.control.resume()
            } else {
                continue;
            };
            match r {
                Ok(b) => {
                    queues += i64::from(b.count.max(0));
                    p.suspended = suspend && b.count > 0;
                }
                Err(e) => {
                    if !suspend {
                        p.suspended = false;
                    }
                    errors.push(TransitionError { pid: p.pid, error: e.into() });
                }
            }
        }
        let latency_us = started.elapsed().as_secs_f64() * 1e6;
        let now = self.now();
        let (reaction_us, reason) = if suspend {
            let ok = self.offline.iter().any(|p| p.suspended);
            self.policy.suspended(now, ok);
            self.metrics.suspends += 1;
            self.metrics.suspend_us.push(latency_us);
            if !ok {
                self.metrics.failed_suspends += 1;
            }
            let reaction = self.visible_at.map(|v| now.saturating_sub(v) as f64 / 1e3);
            if ok && let Some(r) = reaction {
                self.metrics.reaction_us.push(r);
            }
            (reaction, None)
        } else {
            self.policy.resumed(now);
            self.metrics.resumes += 1;
            self.metrics.resume_us.push(latency_us);
            let Action::Resume(reason) = action else { unreachable!("not a suspend") };
            *self.metrics.resumes_by_reason.entry(reason.name().to_owned()).or_default() += 1;
            (None, Some(reason))
        };
        emit(&ScheduleEvent::Transition(Transition {
            t_ms: now as f64 / 1e6,
            action: if suspend { "suspend" } else { "resume" },
            reason,
            latency_us,
            reaction_us,
            queues,
            errors,
        }));
    }

    /// Offline dispatches started since the last call (read indices of every offline queue).
    fn offline_progress(&mut self) -> u64 {
        let mut total = 0;
        for p in &mut self.offline {
            let mut now = vec![0; p.reads.len()];
            if online::read_u64s(p.pid, &p.reads, &mut now).is_ok() {
                total += now.iter().zip(&p.last_reads).map(|(n, l)| n.saturating_sub(*l)).sum::<u64>();
                p.last_reads = now;
            }
        }
        self.metrics.offline_dispatches += total;
        total
    }

    /// Resume and detach every offline process (DISABLE: one refresh each).
    fn shutdown(&mut self, emit: &mut dyn FnMut(&ScheduleEvent)) {
        for p in self.offline.drain(..) {
            let pid = p.pid;
            let detached = p.control.detach();
            self.metrics.attach_refreshes += 1;
            emit(&ScheduleEvent::OfflineDetached { pid, reason: "stopped", detached });
        }
    }

    fn report(&self) -> ScheduleReport {
        let m = &self.metrics;
        let elapsed_ms = self.t_ms();
        let cpu = cpu_ms() - self.cpu_start;
        let per_s = |n: u64, ns: u64| (ns > 0).then(|| n as f64 / (ns as f64 / 1e9));
        let delays: Vec<f64> = m.delay_ns.iter().map(|&d| d as f64 / 1e3).collect();
        ScheduleReport {
            elapsed_ms,
            suspends: m.suspends,
            resumes: m.resumes,
            resumes_by_reason: m.resumes_by_reason.clone(),
            failed_suspends: m.failed_suspends,
            suspended_ms: m.suspended_ns as f64 / 1e6,
            suspended_share: m.suspended_ns as f64 / (m.suspended_ns + m.running_ns).max(1) as f64,
            reaction_us: Stats::of(&m.reaction_us),
            suspend_us: Stats::of(&m.suspend_us),
            resume_us: Stats::of(&m.resume_us),
            online_dispatch_delay_us: Stats::of(&delays),
            offline_dispatches: m.offline_dispatches,
            offline_rate_running_per_s: per_s(m.offline_dispatches, m.running_ns),
            offline_rate_overall_per_s: per_s(m.offline_dispatches, m.running_ns + m.suspended_ns),
            polls: m.polls,
            hints: self.hints.as_ref().map(|h| h.state.counts),
            attach_refreshes: m.attach_refreshes,
            cpu_ms: cpu,
            cpu_share: if elapsed_ms > 0.0 { cpu / elapsed_ms } else { 0.0 },
            kernel: self.kernel.as_ref().map(KernelBreakdown::report),
        }
    }

    /// The policy's state now.
    pub fn state(&self) -> State {
        self.policy.state()
    }
}

#[cfg(test)]
mod tests {
    use std::{
        fs,
        path::Path,
        sync::{
            Arc, Mutex,
            atomic::{AtomicU64, Ordering},
        },
        thread,
    };

    use super::*;
    use crate::{controller::vocabulary::Batch, kfd::uapi::QueueSnapshotEntry};

    /// Calls made on the test's sessions, in order.
    static CALLS: Mutex<Vec<String>> = Mutex::new(Vec::new());
    /// The online queue's indices, in this process (the test's "online process").
    static READ: AtomicU64 = AtomicU64::new(0);
    static WRITE: AtomicU64 = AtomicU64::new(0);
    const OFFLINE: u32 = 3_999_999;

    fn log(call: String) {
        CALLS.lock().unwrap().push(call);
    }

    fn calls() -> Vec<String> {
        CALLS.lock().unwrap().clone()
    }

    /// A session that records what the scheduler asks of it; the online one's snapshot names
    /// the indices above.
    struct Recorder {
        pid: HostPid,
    }

    impl Control for Recorder {
        fn attach(pid: HostPid, _: &Options) -> Result<Self, DebugError> {
            log(format!("attach {pid}"));
            Ok(Self { pid })
        }
        fn suspend(&mut self, selection: &Selection) -> Result<Batch, DebugError> {
            log(format!("suspend {} {selection:?}", self.pid));
            Ok(Batch { count: 1, ..Batch::default() })
        }
        fn resume(&mut self) -> Result<Batch, DebugError> {
            log(format!("resume {}", self.pid));
            Ok(Batch { count: 1, ..Batch::default() })
        }
        fn snapshot(&mut self) -> Result<Vec<QueueSnapshotEntry>, DebugError> {
            log(format!("snapshot {}", self.pid));
            Ok(one_queue(&READ, &WRITE))
        }
        fn notices(&mut self) -> Vec<SessionNotice> {
            Vec::new()
        }
        fn comm(&self) -> String {
            "recorder".into()
        }
        fn detach(self) -> Detached {
            log(format!("detach {}", self.pid));
            Detached::default()
        }
    }

    /// Nothing appears or goes.
    struct Quiet;
    impl Discovery for Quiet {
        fn poll(&mut self, _: &mut Vec<ModelNotice>) {}
        fn sees_queues(&self) -> bool {
            true
        }
    }

    fn kfd_process(root: &Path, pid: u32) {
        let dir = root.join(format!("sys/class/kfd/kfd/proc/{pid}/queues/0"));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("gpuid"), "4096").unwrap();
        fs::write(dir.join("type"), "0").unwrap();
        fs::write(root.join(format!("sys/class/kfd/kfd/proc/{pid}/pasid")), "32770\n").unwrap();
        let proc_dir = root.join(format!("proc/{pid}"));
        fs::create_dir_all(&proc_dir).unwrap();
        fs::write(proc_dir.join("comm"), "worker\n").unwrap();
        fs::write(proc_dir.join("status"), format!("Name:\tworker\nNSpid:\t{pid}\n")).unwrap();
        fs::write(proc_dir.join("cgroup"), "0::/user.slice\n").unwrap();
    }

    /// A scheduler configuration in a fake sysfs/procfs: this process online, `offline` offline
    /// (5 ms idle, 100 µs polls). The directory lives as long as the returned guard.
    fn this_process_online_and(offline: HostPid) -> (tempfile::TempDir, ScheduleConfig) {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id();
        kfd_process(dir.path(), me);
        kfd_process(dir.path(), offline.0);
        let roots = Roots {
            sys: dir.path().join("sys"),
            proc: dir.path().join("proc"),
            docker: dir.path().join("docker"),
            ..Roots::default()
        };
        let config = ScheduleConfig {
            online: vec![Selector::Pid(HostPid(me))],
            offline: vec![Selector::Pid(offline)],
            policy: PolicyConfig { idle: Duration::from_millis(5), ..PolicyConfig::default() },
            poll: Duration::from_micros(100),
            roots,
            ..ScheduleConfig::default()
        };
        (dir, config)
    }

    /// One queue on gpu 0x1000 whose read and write indices are `read` and `write`.
    fn one_queue(read: &AtomicU64, write: &AtomicU64) -> Vec<QueueSnapshotEntry> {
        vec![QueueSnapshotEntry {
            queue_id: 0,
            gpu_id: 0x1000,
            read_pointer_address: read.as_ptr() as u64,
            write_pointer_address: write.as_ptr() as u64,
            ..QueueSnapshotEntry::default()
        }]
    }

    #[test]
    fn pending_online_work_suspends_the_offline_queues_once_and_idle_resumes_them() {
        let me = std::process::id();
        let (_dir, config) = this_process_online_and(HostPid(OFFLINE));
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let mut emit = move |e: &ScheduleEvent| sink.lock().unwrap().push(e.clone());
        let s = Scheduler::<Recorder>::start(config, Box::new(Quiet), &mut emit).unwrap();
        assert_eq!(
            calls(),
            vec![
                format!("attach {me}"),
                format!("snapshot {me}"),
                format!("detach {me}"),
                format!("attach {OFFLINE}"),
                format!("snapshot {OFFLINE}"),
            ]
        );
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let driver = thread::spawn(move || {
            let wait_for = |what: &str| {
                while !calls().iter().any(|c| c.starts_with(what)) {
                    thread::sleep(Duration::from_millis(1));
                }
            };
            // Two bursts of online work: one dispatch each, consumed after the suspend.
            for n in 1..=2u64 {
                WRITE.store(n, Ordering::SeqCst);
                while calls().iter().filter(|c| c.starts_with("suspend")).count() < n as usize {
                    thread::sleep(Duration::from_millis(1));
                }
                thread::sleep(Duration::from_millis(20));
                READ.store(n, Ordering::SeqCst);
                while calls().iter().filter(|c| c.starts_with("resume")).count() < n as usize {
                    thread::sleep(Duration::from_millis(1));
                }
            }
            wait_for("resume");
            flag.store(true, Ordering::SeqCst);
        });
        let report = s.run(&stop, &mut emit);
        driver.join().unwrap();
        assert_eq!(
            calls()[5..],
            [
                format!("suspend {OFFLINE} All"),
                format!("resume {OFFLINE}"),
                format!("suspend {OFFLINE} All"),
                format!("resume {OFFLINE}"),
                format!("detach {OFFLINE}"),
            ]
        );
        assert_eq!((report.suspends, report.resumes, report.failed_suspends), (2, 2, 0));
        assert_eq!(report.resumes_by_reason, BTreeMap::from([("idle".to_owned(), 2)]));
        assert_eq!(report.attach_refreshes, 4);
        assert_eq!(report.reaction_us.as_ref().map(|r| r.count), Some(2));
        // Each dispatch was seen pending once and consumed once.
        assert_eq!(report.online_dispatch_delay_us.as_ref().map(|d| d.count), Some(2));
        let events = events.lock().unwrap();
        let kinds: Vec<String> = events
            .iter()
            .map(|e| match e {
                ScheduleEvent::Transition(t) => format!("{} {:?}", t.action, t.reason),
                ScheduleEvent::OnlineAdded { queues, snapshot, .. } => format!("online_added {queues} {snapshot}"),
                ScheduleEvent::OfflineAttached { queues, picked_up, .. } => {
                    format!("offline_attached {queues} {picked_up}")
                }
                ScheduleEvent::OfflineDetached { reason, .. } => format!("offline_detached {reason}"),
                ScheduleEvent::Summary(_) => "summary".into(),
                other => format!("{other:?}"),
            })
            .filter(|k| !k.starts_with("Interval"))
            .collect();
        assert_eq!(
            kinds,
            [
                "online_added 1 true",
                "offline_attached 1 false",
                "suspend None",
                "resume Some(Idle)",
                "suspend None",
                "resume Some(Idle)",
                "offline_detached stopped",
                "summary",
            ]
        );
    }

    /// The online indices of the session-watchdog test, and what its offline session did.
    static READ2: AtomicU64 = AtomicU64::new(0);
    static WRITE2: AtomicU64 = AtomicU64::new(0);
    static SUSPENDS2: AtomicU64 = AtomicU64::new(0);
    static RELEASES2: AtomicU64 = AtomicU64::new(0);
    const OFFLINE2: u32 = 3_999_998;

    /// A session whose own watchdog resumes every suspend at once (as when the scheduler loop
    /// stalls past the session's `max_suspend`): the next `notices` after a suspend says so.
    struct Released {
        pid: HostPid,
        held: bool,
    }

    impl Control for Released {
        fn attach(pid: HostPid, _: &Options) -> Result<Self, DebugError> {
            Ok(Self { pid, held: false })
        }
        fn suspend(&mut self, _: &Selection) -> Result<Batch, DebugError> {
            SUSPENDS2.fetch_add(1, Ordering::SeqCst);
            self.held = true;
            Ok(Batch { count: 1, ..Batch::default() })
        }
        fn resume(&mut self) -> Result<Batch, DebugError> {
            self.held = false;
            Ok(Batch { count: 1, ..Batch::default() })
        }
        fn snapshot(&mut self) -> Result<Vec<QueueSnapshotEntry>, DebugError> {
            Ok(one_queue(&READ2, &WRITE2))
        }
        fn notices(&mut self) -> Vec<SessionNotice> {
            if !std::mem::take(&mut self.held) {
                return Vec::new();
            }
            RELEASES2.fetch_add(1, Ordering::SeqCst);
            vec![SessionNotice::WatchdogResumed { held_ms: 1, resumed: Batch { count: 1, ..Batch::default() } }]
        }
        fn comm(&self) -> String {
            format!("released-{}", self.pid)
        }
        fn detach(self) -> Detached {
            Detached::default()
        }
    }

    #[test]
    fn time_after_a_session_watchdog_resume_is_not_counted_suspended() {
        let (_dir, config) = this_process_online_and(HostPid(OFFLINE2));
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let mut emit = move |e: &ScheduleEvent| sink.lock().unwrap().push(e.clone());
        let s = Scheduler::<Released>::start(config, Box::new(Quiet), &mut emit).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let driver = thread::spawn(move || {
            // Online work stays pending 300 ms after the session watchdog released the offline
            // process, which runs meanwhile (the burst had its suspend: no second one).
            WRITE2.store(1, Ordering::SeqCst);
            while RELEASES2.load(Ordering::SeqCst) == 0 {
                thread::sleep(Duration::from_millis(1));
            }
            let pending = Instant::now();
            thread::sleep(Duration::from_millis(300));
            READ2.store(1, Ordering::SeqCst);
            thread::sleep(Duration::from_millis(50));
            flag.store(true, Ordering::SeqCst);
            pending.elapsed()
        });
        let report = s.run(&stop, &mut emit);
        let pending = driver.join().unwrap();
        assert_eq!((SUSPENDS2.load(Ordering::SeqCst), RELEASES2.load(Ordering::SeqCst)), (1, 1));
        // The policy followed the release (every hold ended without it): no resume transition.
        assert_eq!((report.suspends, report.resumes), (1, 0));
        let released: Vec<(HostPid, usize)> = events
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                ScheduleEvent::WatchdogResumed { pid, still_held, .. } => Some((*pid, *still_held)),
                _ => None,
            })
            .collect();
        assert_eq!(released, [(HostPid(OFFLINE2), 0)]);
        // Held from the suspend to the next poll's look at the session (100 µs polls; bounded
        // generously for a loaded machine), not for the 300 ms the online work stayed pending.
        assert!(pending >= Duration::from_millis(300));
        assert!(report.suspended_ms < 150.0, "suspended {} ms", report.suspended_ms);
    }
}
