//! `gpreempt schedule`: keep the offline processes' queues on a GPU suspended while the online
//! processes have work on that GPU, with no change to either.
//!
//! - [`online`]: sees online work from outside (AQL dispatch indices, `cu_occupancy`).
//! - [`hints`]: the optional `begin`/`end` socket.
//! - [`policy`]: when to suspend and resume one GPU (a pure state machine, cost-aware).
//! - [`reaction`]: the real-time thread that reads the indices, runs one policy per GPU and
//!   holds the offline sessions (attached once, kept attached); [`realtime`] its footing.
//! - [`discover`]: processes and queues that appear later (tracer, or sysfs).
//! - [`kernel`]: the driver's side of the suspends and resumes (tracer only).
//!
//! [`Scheduler::start`] checks the selectors, starts the reaction thread and has it attach;
//! [`Scheduler::run`] is the other half, on the caller's thread: discovery, the tracer's spans,
//! hints, occupancy reads, accounting and every [`ScheduleEvent`], until the stop flag is set;
//! then the reaction thread resumes and detaches everything and the summary is emitted.
//!
//! **Per GPU.** Online work pending on GPU X (the indices of the online queues on X, X's
//! `cu_occupancy`, an open hint when online queues are on X) suspends exactly the offline queues
//! on X (SUSPEND_QUEUES of those ids, one call per offline process with queues there) and its
//! idle resumes them. An offline process with queues on several GPUs is held on each
//! independently; offline work on a GPU with no online work is never touched.
//!
//! Costs the output names: one debug-trap ENABLE and DISABLE per offline process (a runlist
//! refresh each: `debug_refresh_runlist` in `kfd_dbg_trap_activate`/`_deactivate`, kfd_debug.c,
//! Linux 6.12), and for an online process that already has queues when the
//! scheduler starts one snapshot (ENABLE, GET_QUEUE_SNAPSHOT, DISABLE: two refreshes) to learn
//! their index addresses; the online process is never kept attached. On HWS GPUs every suspend
//! and resume unmaps every queue of the device, the online process's too, and KFD takes one
//! process per call: N offline processes on a GPU cost N unmaps per transition (docs/kfd.md).

pub mod channel;
pub mod discover;
pub mod hints;
pub mod kernel;
pub mod online;
pub mod policy;
pub mod reaction;
pub mod realtime;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc::{self, Receiver, RecvTimeoutError, SyncSender},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use serde::Serialize;

use self::{
    discover::Discovery,
    hints::{HintCounts, HintSocket},
    kernel::{KernelBreakdown, KernelReport},
    online::{OccupancyFile, QueueAddrs, ReadError},
    policy::{GapVerdict, PolicyConfig, ResumeReason, State},
    reaction::{Command, LoopStats, Reaction, ReactionConfig, Report, TransitionAction, TransitionRecord},
    realtime::{Realtime, RealtimeConfig},
};
use crate::{
    clock::monotonic_ns,
    controller::control::Control,
    controller::{
        target::{Target, TargetError},
        vocabulary::{DebugError, Detached, Options, SharedError},
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
    /// Interval between the reaction thread's steps (reads of the online dispatch indices).
    pub poll: Duration,
    /// The reaction thread steps again at once instead of sleeping `poll`.
    pub busy_poll: bool,
    /// Real-time priority, CPU and memory lock of the reaction thread.
    pub realtime: RealtimeConfig,
    /// Interval between reads of the online `cu_occupancy` (the kernel asks the hardware).
    pub occupancy: Duration,
    /// Interval between [`ScheduleEvent::Interval`] reports.
    pub interval: Duration,
    pub hint_socket: Option<PathBuf>,
    pub roots: Roots,
    /// Options of each offline session; its watchdog is set to back the policy's up.
    pub session: Options,
}

/// The reaction thread's default SCHED_FIFO priority: above every normal task and below the
/// kernel's own real-time threads (50 for threaded interrupts, 99 for the watchdogs), so a
/// threaded GPU or timer interrupt still preempts it.
pub const DEFAULT_RT_PRIORITY: u8 = 20;

impl Default for ScheduleConfig {
    fn default() -> Self {
        Self {
            online: Vec::new(),
            offline: Vec::new(),
            policy: PolicyConfig::default(),
            poll: Duration::from_micros(200),
            busy_poll: false,
            realtime: RealtimeConfig { priority: DEFAULT_RT_PRIORITY, cpu: None, lock_memory: true },
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
    #[error("the reaction thread could not start: {0}")]
    Thread(std::io::Error),
    #[error("the reaction thread ended while attaching (it panicked: see the message above)")]
    ThreadDied,
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

/// One suspend or resume of one GPU's offline queues.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Transition {
    /// Milliseconds since start.
    pub t_ms: f64,
    pub gpu_id: GpuId,
    pub action: &'static str,
    /// Why a resume happened (`None` for a suspend).
    pub reason: Option<ResumeReason>,
    /// Time in the ioctls, every offline process together, µs.
    pub latency_us: f64,
    /// Suspend only: online work first seen → SUSPEND returned, µs.
    pub reaction_us: Option<f64>,
    /// Suspend only: the last poll that saw the GPU free of online work → SUSPEND entering the
    /// kernel, µs (an upper bound of online work published → suspend).
    pub detection_us: Option<f64>,
    /// Queues suspended or resumed.
    pub queues: i64,
    /// Offline processes an ioctl was issued for.
    pub ioctls: u32,
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

/// One GPU in a periodic report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuInterval {
    pub gpu_id: GpuId,
    pub state: State,
    /// Share of the interval this GPU's offline queues were suspended.
    pub suspended_share: f64,
    /// Offline dispatches started on this GPU in the interval (read indices).
    pub offline_dispatches: u64,
}

/// A periodic report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Interval {
    pub t_ms: f64,
    pub online_processes: usize,
    pub offline_processes: usize,
    /// Transitions so far, every GPU.
    pub transitions: u64,
    pub reaction_p99_us: Option<f64>,
    /// The reaction thread's step interval so far: p50, p99 and the maximum, µs.
    pub loop_step_p50_us: Option<f64>,
    pub loop_step_p99_us: Option<f64>,
    pub loop_step_max_us: Option<f64>,
    /// Offline dispatches started in the interval, every GPU.
    pub offline_dispatches: u64,
    pub gpus: Vec<GpuInterval>,
}

/// One GPU over the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuReport {
    pub gpu_id: GpuId,
    /// A policy ran for it (online work was seen on it).
    pub scheduled: bool,
    pub suspends: u64,
    pub resumes: u64,
    pub resumes_by_reason: BTreeMap<String, u64>,
    /// Idle resumes skipped because the gap was predicted shorter than the transitions cost.
    pub resumes_skipped: u64,
    pub failed_suspends: u64,
    pub suspended_ms: f64,
    pub suspended_share: f64,
    pub reaction_us: Option<Stats>,
    pub detection_us: Option<Stats>,
    pub suspend_us: Option<Stats>,
    pub resume_us: Option<Stats>,
    pub offline_dispatches: u64,
    pub offline_rate_running_per_s: Option<f64>,
    pub offline_rate_overall_per_s: Option<f64>,
}

/// The end-of-run report; the top-level figures cover every GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ScheduleReport {
    pub elapsed_ms: f64,
    pub suspends: u64,
    pub resumes: u64,
    pub resumes_by_reason: BTreeMap<String, u64>,
    pub resumes_skipped: u64,
    /// Suspends that failed for every offline process.
    pub failed_suspends: u64,
    /// Summed over GPUs.
    pub suspended_ms: f64,
    /// Mean over the GPUs with a policy.
    pub suspended_share: f64,
    pub reaction_us: Option<Stats>,
    pub detection_us: Option<Stats>,
    pub suspend_us: Option<Stats>,
    pub resume_us: Option<Stats>,
    /// Online dispatch delay estimated from the indices: first seen pending → consumed, µs.
    pub online_dispatch_delay_us: Option<Stats>,
    /// Offline dispatches started (read indices), in total and per second.
    pub offline_dispatches: u64,
    pub offline_rate_running_per_s: Option<f64>,
    pub offline_rate_overall_per_s: Option<f64>,
    /// Steps of the reaction thread, and the interval between their starts (µs).
    pub polls: u64,
    pub loop_step_us: Option<Stats>,
    pub realtime: Realtime,
    /// Reports the reaction thread dropped because this side fell behind.
    pub reports_dropped: u64,
    /// The reaction thread panicked (its sessions resumed and detached while it unwound).
    pub reaction_panicked: bool,
    pub hints: Option<HintCounts>,
    /// Runlist refreshes caused by attaching (ENABLE and DISABLE of offline sessions, online snapshots).
    pub attach_refreshes: u64,
    /// This process's CPU time (user + system), ms, and as a share of the elapsed time.
    pub cpu_ms: f64,
    pub cpu_share: f64,
    /// Of it, the reaction thread's, ms; and of that, the time inside suspend and resume
    /// transitions (the debug-trap ioctls, whose driver work runs on the calling thread), ms.
    /// The rest of the reaction thread's CPU is its polling.
    pub reaction_cpu_ms: f64,
    pub transition_cpu_ms: f64,
    /// What the driver did for the suspends and resumes, when the tracer is attached.
    pub kernel: Option<KernelReport>,
    pub gpus: Vec<GpuReport>,
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
        /// Its GPUs (those of its queues), sorted.
        gpus: Vec<GpuId>,
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
    /// A held offline process created queues on a held GPU: they are suspended too.
    OfflineQueuesHeld {
        pid: HostPid,
        queues: u32,
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
    /// A GPU's idle resume was skipped: the rest of the online gap is predicted shorter than
    /// what a resume and the next suspend cost the online job (said once per gap).
    ResumeSkipped {
        t_ms: f64,
        gpu_id: GpuId,
        idle_us: f64,
        predicted_gap_us: f64,
        cost_us: f64,
        /// Recorded gaps the prediction rests on.
        evidence: usize,
    },
    Interval(Interval),
    /// A hint line that is not `begin` or `end` (ignored).
    HintMalformed {
        line: String,
        count: u64,
    },
    /// A session's own watchdog resumed an offline process's queues: they had been held `held_ms`,
    /// past the session's `max_suspend`, because the reaction thread stalled. `still_held`
    /// offline processes remain suspended.
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

/// One GPU's accounting on this side, from the reaction thread's records.
#[derive(Default)]
struct GpuAccount {
    report: GpuReport,
    state: Option<State>,
    /// Since when it is suspended (ns), while it is.
    suspended_since: Option<u64>,
    suspended_ns: u64,
    interval_suspended_ns: u64,
    interval_dispatches: u64,
    reaction_us: Vec<f64>,
    detection_us: Vec<f64>,
    suspend_us: Vec<f64>,
    resume_us: Vec<f64>,
}

impl GpuAccount {
    fn end_suspension(&mut self, t: u64, interval_start: u64) {
        if let Some(since) = self.suspended_since.take() {
            self.suspended_ns += t.saturating_sub(since);
            self.interval_suspended_ns += t.saturating_sub(since.max(interval_start));
        }
    }
}

/// An offline process as this side sees it: its queues' read indices for the progress count.
struct OfflineWatch {
    /// (GPU, read-index address) of each queue.
    reads: Vec<(GpuId, u64)>,
    last: Vec<u64>,
}

/// An online process as this side sees it (its occupancy files are the reaction thread's).
struct OnlineWatch;

/// The scheduler: its reaction thread and, on the caller's thread, everything else.
pub struct Scheduler {
    config: ScheduleConfig,
    discovery: Box<dyn Discovery>,
    hints: Option<HintSocket>,
    commands: SyncSender<Command>,
    reports: Receiver<Report>,
    loop_stats: Arc<LoopStats>,
    reaction_stop: Arc<AtomicBool>,
    reaction: Option<JoinHandle<Realtime>>,
    start_ns: u64,
    cpu_start: f64,
    online: BTreeMap<HostPid, OnlineWatch>,
    offline: BTreeMap<HostPid, OfflineWatch>,
    gpus: BTreeMap<GpuId, GpuAccount>,
    /// Pids already decided on (attached, watched or refused), so a repeated open is ignored.
    seen: BTreeMap<HostPid, Role>,
    /// Offline processes seen opening /dev/kfd whose KFD state was not complete yet, retried
    /// until the deadline (ns).
    retry: Vec<(HostPid, u64)>,
    /// Attaches asked of the reaction thread and not answered yet.
    attaching: BTreeSet<HostPid>,
    hint_sent: bool,
    interval_start: u64,
    attach_refreshes: u64,
    /// The driver's side of the transitions (with the tracer).
    kernel: Option<KernelBreakdown>,
    /// Every online process watched so far (their queues among the collateral).
    online_ever: BTreeSet<HostPid>,
    spans: Vec<Span>,
    realtime: Realtime,
    reaction_panicked: bool,
}

/// How long a picked-up offline process is retried while its KFD state is incomplete.
const PICKUP_RETRY: Duration = Duration::from_secs(2);
/// Reports the reaction thread may have in flight before it drops some (and counts them).
const REPORT_QUEUE: usize = 4096;
/// Commands in flight to the reaction thread (this side waits when it is full).
const COMMAND_QUEUE: usize = 1024;
/// Period of this side's loop: tracer, reports, hints. Nothing on it decides a suspend but the
/// hints, whose `begin` waits at most this long.
const COMPANION_TICK: Duration = Duration::from_millis(2);
/// How long [`Scheduler::start`] waits for the reaction thread to attach one offline process.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(120);

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

fn ns_of(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
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

impl Scheduler {
    /// Check the selectors, start the reaction thread, learn the online queues, have every
    /// offline process attached (on the reaction thread). On any error everything attached so
    /// far is detached before returning. `discovery` must already run, so that nothing that
    /// appears from now on is missed. `C` is the session type the reaction thread drives.
    pub fn start<C: Control + 'static>(
        config: ScheduleConfig,
        discovery: Box<dyn Discovery>,
        emit: &mut dyn FnMut(&ScheduleEvent),
    ) -> Result<Self, ScheduleError> {
        let cpu_start = cpu_ms();
        let (online_sel, offline_sel) = resolve_selection(&config)?;
        let mut session = config.session.clone();
        // The policy's watchdog comes first; the session's backs it up if the thread stalls.
        session.max_suspend = Some(config.policy.max_suspend + Duration::from_millis(500));
        let hints = match &config.hint_socket {
            Some(path) => Some(
                HintSocket::bind(path)
                    .map_err(|source| ScheduleError::HintSocket { path: path.clone(), cause: source })?,
            ),
            None => None,
        };
        let (commands, command_rx) = mpsc::sync_channel(COMMAND_QUEUE);
        let (report_tx, reports) = mpsc::sync_channel(REPORT_QUEUE);
        let loop_stats = Arc::new(LoopStats::default());
        let reaction_stop = Arc::new(AtomicBool::new(false));
        let reaction_config = ReactionConfig {
            policy: config.policy,
            poll_ns: ns_of(config.poll),
            occupancy_ns: ns_of(config.occupancy),
            busy_poll: config.busy_poll,
            realtime: config.realtime,
            session: session.clone(),
        };
        let (stats, stop) = (loop_stats.clone(), reaction_stop.clone());
        let reaction = std::thread::Builder::new()
            .name("gpreempt-react".into())
            .spawn(move || Reaction::<C>::new(reaction_config, command_rx, report_tx, stats).run(&stop))
            .map_err(ScheduleError::Thread)?;
        let kernel = discovery.sees_driver().then(KernelBreakdown::default);
        let start_ns = monotonic_ns();
        let mut s = Self {
            config: ScheduleConfig { session, ..config },
            discovery,
            hints,
            commands,
            reports,
            loop_stats,
            reaction_stop,
            reaction: Some(reaction),
            start_ns,
            cpu_start,
            online: BTreeMap::new(),
            offline: BTreeMap::new(),
            gpus: BTreeMap::new(),
            seen: BTreeMap::new(),
            retry: Vec::new(),
            attaching: BTreeSet::new(),
            hint_sent: false,
            interval_start: start_ns,
            attach_refreshes: 0,
            kernel,
            online_ever: BTreeSet::new(),
            spans: Vec::new(),
            realtime: Realtime::default(),
            reaction_panicked: false,
        };
        if let Err(e) = s.attach_initial::<C>(&online_sel.pids, &offline_sel.pids, emit) {
            s.finish(emit);
            return Err(e);
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

    /// The online processes (learnt here) and the offline ones (attached by the reaction
    /// thread, waited for one by one).
    fn attach_initial<C: Control>(
        &mut self,
        online: &[HostPid],
        offline: &[HostPid],
        emit: &mut dyn FnMut(&ScheduleEvent),
    ) -> Result<(), ScheduleError> {
        for &pid in online {
            self.seen.insert(pid, Role::Online);
            self.add_online::<C>(pid, true, emit)?;
        }
        for &pid in offline {
            self.seen.insert(pid, Role::Offline);
            self.send(Command::AttachOffline { pid, picked_up: false });
            self.attaching.insert(pid);
            let deadline = Instant::now() + ATTACH_TIMEOUT;
            while self.attaching.contains(&pid) {
                let left = deadline.saturating_duration_since(Instant::now());
                match self.reports.recv_timeout(left) {
                    Ok(Report::AttachFailed { pid: p, error, .. }) if p == pid => {
                        return Err(ScheduleError::Debug { role: Role::Offline, pid, cause: error });
                    }
                    Ok(r) => self.take(r, emit),
                    Err(RecvTimeoutError::Timeout) => {
                        return Err(ScheduleError::Debug {
                            role: Role::Offline,
                            pid,
                            cause: DebugError::Target(TargetError::NoSuchProcess(pid)),
                        });
                    }
                    Err(RecvTimeoutError::Disconnected) => return Err(ScheduleError::ThreadDied),
                }
            }
        }
        Ok(())
    }

    fn t_ms(&self, t_ns: u64) -> f64 {
        t_ns.saturating_sub(self.start_ns) as f64 / 1e6
    }

    /// Hand the reaction thread a command (waits only when its queue is full).
    fn send(&self, c: Command) {
        let _ = self.commands.send(c);
    }

    fn gpu(&mut self, gpu: GpuId) -> &mut GpuAccount {
        self.gpus.entry(gpu).or_insert_with(|| GpuAccount {
            report: GpuReport { gpu_id: gpu, ..GpuReport::default() },
            ..GpuAccount::default()
        })
    }

    /// Watch an online process; `initial`: it may already have queues, learnt with one snapshot
    /// (a session of type `C` on this thread, attached and detached at once).
    fn add_online<C: Control>(
        &mut self,
        pid: HostPid,
        initial: bool,
        emit: &mut dyn FnMut(&ScheduleEvent),
    ) -> Result<(), ScheduleError> {
        let kfd_proc = self.config.roots.kfd_proc();
        let has_queues =
            crate::host::sysfs::read_process(&kfd_proc, pid.0).map(|s| !s.queues.is_empty()).unwrap_or(false);
        let mut queues = Vec::new();
        let snapshot = initial && has_queues;
        if snapshot {
            // Before the snapshot, whose attach would fail with a less telling error.
            online::check_readable(pid).map_err(|source| ScheduleError::Unreadable { pid, cause: source })?;
            let mut c = C::attach(pid, &Options { max_suspend: None, ..self.config.session.clone() })
                .map_err(|source| ScheduleError::Debug { role: Role::Online, pid, cause: source })?;
            let entries = c.snapshot();
            c.detach();
            self.attach_refreshes += 2;
            let entries = entries.map_err(|source| ScheduleError::Debug { role: Role::Online, pid, cause: source })?;
            queues.extend(entries.iter().map(|e| QueueAddrs {
                queue_id: QueueId(e.queue_id),
                gpu_id: GpuId(e.gpu_id),
                read: e.read_pointer_address,
                write: e.write_pointer_address,
            }));
        }
        self.watch_online(pid, &queues, snapshot, emit)
    }

    /// Watch an online process with the queues known of it; its indices are read once here, so
    /// an unreadable process is refused rather than ignored.
    fn watch_online(
        &mut self,
        pid: HostPid,
        queues: &[QueueAddrs],
        snapshot: bool,
        emit: &mut dyn FnMut(&ScheduleEvent),
    ) -> Result<(), ScheduleError> {
        let occupancy: Vec<OccupancyFile> = online::occupancy_files(&self.config.roots.kfd_proc(), pid)
            .iter()
            .filter_map(|f| OccupancyFile::open(f))
            .collect();
        // A read of the queues' indices proves access; with none, the access check alone.
        let addrs: Vec<u64> = queues.iter().flat_map(|q| [q.read, q.write]).collect();
        let mut scratch = vec![0; addrs.len()];
        let readable =
            if addrs.is_empty() { online::check_readable(pid) } else { online::read_u64s(pid, &addrs, &mut scratch) };
        readable.map_err(|source| ScheduleError::Unreadable { pid, cause: source })?;
        for &q in queues {
            self.gpu(q.gpu_id);
            self.send(Command::OnlineQueue { pid, addrs: q });
        }
        let occupancy_files = occupancy.len();
        for file in occupancy {
            self.send(Command::OnlineOccupancy { pid, file });
        }
        emit(&ScheduleEvent::OnlineAdded { pid, queues: queues.len(), snapshot, occupancy_files });
        self.online.insert(pid, OnlineWatch);
        self.online_ever.insert(pid);
        Ok(())
    }

    /// Run until `stop` is set, then have the reaction thread resume and detach everything;
    /// returns the report (also emitted as [`ScheduleEvent::Summary`]).
    pub fn run(mut self, stop: &AtomicBool, emit: &mut dyn FnMut(&ScheduleEvent)) -> ScheduleReport {
        let mut changes = Vec::new();
        let mut next_interval = self.start_ns + ns_of(self.config.interval);
        while !stop.load(Ordering::Relaxed) {
            if self.reaction.as_ref().is_none_or(JoinHandle::is_finished) {
                emit(&ScheduleEvent::Warning {
                    message: "the reaction thread ended (it panicked: see the message above); its sessions resumed \
                              and detached the offline processes while it unwound; stopping"
                        .into(),
                });
                break;
            }
            let now = monotonic_ns();
            self.discovery.poll(&mut changes);
            for c in changes.drain(..) {
                self.apply_change(c, emit);
            }
            self.collect_spans();
            let due = std::mem::take(&mut self.retry);
            for (pid, deadline) in due {
                if now >= deadline {
                    emit(&ScheduleEvent::OfflineAttachFailed {
                        pid,
                        error: format!("its KFD state was still incomplete after {PICKUP_RETRY:?}"),
                    });
                } else {
                    self.retry.push((pid, deadline));
                    if !self.attaching.contains(&pid) {
                        self.attaching.insert(pid);
                        self.send(Command::AttachOffline { pid, picked_up: true });
                    }
                }
            }
            self.drain_reports(emit);
            self.poll_hints(emit);
            if now >= next_interval {
                next_interval = now + ns_of(self.config.interval);
                self.interval(now, emit);
            }
            std::thread::sleep(COMPANION_TICK);
        }
        self.finish(emit)
    }

    /// Stop the reaction thread (it resumes and detaches), take its last reports, emit the summary.
    fn finish(&mut self, emit: &mut dyn FnMut(&ScheduleEvent)) -> ScheduleReport {
        self.reaction_stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.reaction.take() {
            match thread.join() {
                Ok(realtime) => self.realtime = realtime,
                Err(_) => self.reaction_panicked = true,
            }
        }
        self.drain_reports(emit);
        // The stop's resumes, before the summary.
        let mut changes = Vec::new();
        self.discovery.poll(&mut changes);
        self.collect_spans();
        self.offline_progress();
        let report = self.report();
        emit(&ScheduleEvent::Summary(Box::new(report.clone())));
        report
    }

    fn drain_reports(&mut self, emit: &mut dyn FnMut(&ScheduleEvent)) {
        while let Ok(r) = self.reports.try_recv() {
            self.take(r, emit);
        }
    }

    /// One report of the reaction thread: accounting and the event.
    fn take(&mut self, r: Report, emit: &mut dyn FnMut(&ScheduleEvent)) {
        match r {
            Report::Attached { pid, comm, queues, picked_up } => {
                self.attaching.remove(&pid);
                self.retry.retain(|(p, _)| *p != pid);
                self.attach_refreshes += 1;
                let reads: Vec<(GpuId, u64)> =
                    queues.iter().map(|q| (GpuId(q.gpu_id), q.read_pointer_address)).collect();
                let mut last = vec![0; reads.len()];
                let addrs: Vec<u64> = reads.iter().map(|r| r.1).collect();
                let _ = online::read_u64s(pid, &addrs, &mut last);
                let mut gpus: Vec<GpuId> = reads.iter().map(|r| r.0).collect();
                gpus.sort_unstable();
                gpus.dedup();
                for &g in &gpus {
                    self.gpu(g);
                }
                self.offline.insert(pid, OfflineWatch { reads, last });
                emit(&ScheduleEvent::OfflineAttached { pid, comm, queues: queues.len(), gpus, picked_up });
            }
            Report::AttachFailed { pid, error, retry } => {
                self.attaching.remove(&pid);
                if retry && self.retry.iter().any(|(p, _)| *p == pid) {
                    return; // retried at the next tick until its deadline
                }
                self.retry.retain(|(p, _)| *p != pid);
                emit(&ScheduleEvent::OfflineAttachFailed { pid, error: error.to_string() });
            }
            Report::Detached { pid, reason, detached } => {
                self.attach_refreshes += 1;
                self.offline_progress();
                self.offline.remove(&pid);
                if reason == "exited" {
                    self.seen.remove(&pid);
                }
                emit(&ScheduleEvent::OfflineDetached { pid, reason, detached });
            }
            Report::QueuesHeld { pid, queues } => emit(&ScheduleEvent::OfflineQueuesHeld { pid, queues }),
            Report::WatchdogResumed { t_ns, pid, held_ms, still_held } => {
                emit(&ScheduleEvent::WatchdogResumed { t_ms: self.t_ms(t_ns), pid, held_ms, still_held });
            }
            Report::Transition(record, errors) => self.transition(record, errors, emit),
            Report::ResumeSkipped { t_ns, gpu, verdict } => {
                self.gpu(gpu).report.resumes_skipped += 1;
                let GapVerdict { idle_ns, predicted_ns, cost_ns, evidence } = verdict;
                emit(&ScheduleEvent::ResumeSkipped {
                    t_ms: self.t_ms(t_ns),
                    gpu_id: gpu,
                    idle_us: idle_ns as f64 / 1e3,
                    predicted_gap_us: predicted_ns as f64 / 1e3,
                    cost_us: cost_ns as f64 / 1e3,
                    evidence,
                });
            }
            Report::Released { t_ns, gpu } => {
                let start = self.interval_start;
                let g = self.gpu(gpu);
                g.end_suspension(t_ns, start);
                g.state = Some(State::Running);
            }
            Report::OnlineGone { pid } => {
                if self.online.remove(&pid).is_some() {
                    self.seen.remove(&pid);
                    emit(&ScheduleEvent::OnlineGone { pid });
                }
            }
            Report::Warning(message) => emit(&ScheduleEvent::Warning { message }),
        }
    }

    fn transition(
        &mut self,
        r: TransitionRecord,
        errors: Vec<(HostPid, SharedError)>,
        emit: &mut dyn FnMut(&ScheduleEvent),
    ) {
        let start = self.interval_start;
        let us = |ns: u64| ns as f64 / 1e3;
        let g = self.gpu(r.gpu);
        g.report.scheduled = true;
        match r.action {
            TransitionAction::Suspend => {
                g.report.suspends += 1;
                g.suspend_us.push(us(r.latency_ns));
                if r.queues > 0 {
                    g.suspended_since = Some(r.t_ns);
                    g.state = Some(State::Suspended);
                    g.reaction_us.extend(r.reaction_ns.map(us));
                    g.detection_us.extend(r.detection_ns.map(us));
                } else {
                    g.state = Some(State::Running);
                    if !errors.is_empty() {
                        g.report.failed_suspends += 1;
                    }
                }
            }
            TransitionAction::Resume => {
                g.report.resumes += 1;
                g.resume_us.push(us(r.latency_ns));
                let reason = r.reason.map_or("unknown", ResumeReason::name);
                *g.report.resumes_by_reason.entry(reason.to_owned()).or_default() += 1;
                g.end_suspension(r.t_ns, start);
                g.state = Some(State::Running);
            }
        }
        let t_ms = self.t_ms(r.t_ns);
        emit(&ScheduleEvent::Transition(Transition {
            t_ms,
            gpu_id: r.gpu,
            action: r.action.name(),
            reason: r.reason,
            latency_us: us(r.latency_ns),
            reaction_us: r.reaction_ns.map(us),
            detection_us: r.detection_ns.map(us),
            queues: i64::from(r.queues),
            ioctls: r.ioctls,
            errors: errors.into_iter().map(|(pid, error)| TransitionError { pid, error }).collect(),
        }));
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
                    if let Err(e) = self.watch_online(pid, &[], false, emit) {
                        emit(&ScheduleEvent::Warning { message: e.to_string() });
                    }
                } else if select::any_matches_new(&self.config.offline, roots, pid) {
                    self.seen.insert(pid, Role::Offline);
                    let deadline = monotonic_ns() + ns_of(PICKUP_RETRY);
                    self.retry.push((pid, deadline));
                    self.attaching.insert(pid);
                    self.send(Command::AttachOffline { pid, picked_up: true });
                }
            }
            ModelNotice::ProcessGone { pid } => {
                self.seen.remove(&pid);
                self.retry.retain(|(p, _)| *p != pid);
                if self.online.remove(&pid).is_some() {
                    self.send(Command::OnlineGone { pid });
                    emit(&ScheduleEvent::OnlineGone { pid });
                }
                if self.offline.contains_key(&pid) {
                    self.send(Command::OfflineGone { pid });
                }
            }
            ModelNotice::QueueCreated { pid, queue: addrs } => {
                if self.online.contains_key(&pid) {
                    self.gpu(addrs.gpu_id);
                    self.send(Command::OnlineQueue { pid, addrs });
                    emit(&ScheduleEvent::OnlineQueue { pid, queue_id: addrs.queue_id, gpu_id: addrs.gpu_id });
                } else if let Some(p) = self.offline.get_mut(&pid) {
                    p.reads.push((addrs.gpu_id, addrs.read));
                    let mut v = [0];
                    let _ = online::read_u64s(pid, &[addrs.read], &mut v);
                    p.last.push(v[0]);
                    self.gpu(addrs.gpu_id);
                }
            }
            ModelNotice::QueueGone { pid, queue_id } => {
                if self.online.contains_key(&pid) {
                    self.send(Command::OnlineQueueGone { pid, queue_id });
                }
            }
        }
    }

    /// Hints: online work on every GPU with online queues while a request is open (a request
    /// that began and ended between two ticks counts for one tick).
    fn poll_hints(&mut self, emit: &mut dyn FnMut(&ScheduleEvent)) {
        let Some(h) = self.hints.as_mut() else { return };
        for w in h.poll() {
            emit(&ScheduleEvent::HintMalformed { line: w.line, count: w.count });
        }
        // A hint of a server that exited is no online work.
        let active = !self.online.is_empty() && h.state.take_activity();
        if active != self.hint_sent {
            self.hint_sent = active;
            self.send(Command::Hint { active });
        }
    }

    fn interval(&mut self, now: u64, emit: &mut dyn FnMut(&ScheduleEvent)) {
        let len = now.saturating_sub(self.interval_start).max(1);
        let dispatches = self.offline_progress();
        let start = self.interval_start;
        let mut gpus = Vec::new();
        let mut transitions = 0;
        let mut reaction = Vec::new();
        for (&gpu_id, g) in &mut self.gpus {
            if let Some(since) = g.suspended_since {
                g.interval_suspended_ns += now.saturating_sub(since.max(start));
            }
            transitions += g.report.suspends + g.report.resumes;
            reaction.extend_from_slice(&g.reaction_us);
            gpus.push(GpuInterval {
                gpu_id,
                state: g.state.unwrap_or(State::Running),
                suspended_share: g.interval_suspended_ns as f64 / len as f64,
                offline_dispatches: std::mem::take(&mut g.interval_dispatches),
            });
            g.interval_suspended_ns = 0;
        }
        self.interval_start = now;
        emit(&ScheduleEvent::Interval(Interval {
            t_ms: self.t_ms(now),
            online_processes: self.online.len(),
            offline_processes: self.offline.len(),
            transitions,
            reaction_p99_us: Stats::of(&reaction).map(|s| s.p99),
            loop_step_p50_us: self.loop_stats.step.percentile_ns(50.0).map(|ns| ns as f64 / 1e3),
            loop_step_p99_us: self.loop_stats.step.percentile_ns(99.0).map(|ns| ns as f64 / 1e3),
            loop_step_max_us: self.loop_stats.step.summary_us().map(|s| s.max),
            offline_dispatches: dispatches,
            gpus,
        }));
    }

    /// The driver's spans of the offline processes' suspends and resumes so far.
    fn collect_spans(&mut self) {
        let Some(kernel) = self.kernel.as_mut() else { return };
        self.discovery.driver_spans(&mut self.spans);
        if self.spans.is_empty() {
            return;
        }
        let offline: BTreeSet<HostPid> = self.offline.keys().copied().collect();
        for span in self.spans.drain(..) {
            kernel.add(&span, &offline, &self.online_ever);
        }
    }

    /// Offline dispatches started since the last call (read indices of every offline queue),
    /// counted per GPU.
    fn offline_progress(&mut self) -> u64 {
        let mut total = 0;
        let mut per_gpu: Vec<(GpuId, u64)> = Vec::new();
        for (&pid, p) in &mut self.offline {
            let addrs: Vec<u64> = p.reads.iter().map(|r| r.1).collect();
            let mut now = vec![0; addrs.len()];
            if online::read_u64s(pid, &addrs, &mut now).is_ok() {
                for ((gpu, _), (n, l)) in p.reads.iter().zip(now.iter().zip(&p.last)) {
                    let d = n.saturating_sub(*l);
                    total += d;
                    per_gpu.push((*gpu, d));
                }
                p.last = now;
            }
        }
        for (gpu, d) in per_gpu {
            let g = self.gpu(gpu);
            g.report.offline_dispatches += d;
            g.interval_dispatches += d;
        }
        total
    }

    fn report(&mut self) -> ScheduleReport {
        let end = monotonic_ns();
        let elapsed_ns = end.saturating_sub(self.start_ns).max(1);
        let elapsed_ms = elapsed_ns as f64 / 1e6;
        let cpu = cpu_ms() - self.cpu_start;
        let per_s = |n: u64, ns: u64| (ns > 0).then(|| n as f64 / (ns as f64 / 1e9));
        let start = self.interval_start;
        let mut all = ScheduleReport::default();
        let (mut reaction, mut suspend, mut resume, mut detection) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut scheduled_gpus = 0usize;
        let mut running_ns_total = 0u64;
        for g in self.gpus.values_mut() {
            g.end_suspension(end, start);
            let r = &mut g.report;
            r.suspended_ms = g.suspended_ns as f64 / 1e6;
            r.suspended_share = g.suspended_ns as f64 / elapsed_ns as f64;
            r.reaction_us = Stats::of(&g.reaction_us);
            r.detection_us = Stats::of(&g.detection_us);
            r.suspend_us = Stats::of(&g.suspend_us);
            r.resume_us = Stats::of(&g.resume_us);
            let running_ns = elapsed_ns.saturating_sub(g.suspended_ns);
            r.offline_rate_running_per_s = per_s(r.offline_dispatches, running_ns);
            r.offline_rate_overall_per_s = per_s(r.offline_dispatches, elapsed_ns);
            all.suspends += r.suspends;
            all.resumes += r.resumes;
            all.resumes_skipped += r.resumes_skipped;
            all.failed_suspends += r.failed_suspends;
            all.suspended_ms += r.suspended_ms;
            all.offline_dispatches += r.offline_dispatches;
            for (k, v) in &r.resumes_by_reason {
                *all.resumes_by_reason.entry(k.clone()).or_default() += v;
            }
            if r.scheduled {
                scheduled_gpus += 1;
                all.suspended_share += r.suspended_share;
            }
            if r.offline_dispatches > 0 {
                running_ns_total += running_ns;
            }
            reaction.extend_from_slice(&g.reaction_us);
            detection.extend_from_slice(&g.detection_us);
            suspend.extend_from_slice(&g.suspend_us);
            resume.extend_from_slice(&g.resume_us);
        }
        let stats = &self.loop_stats;
        ScheduleReport {
            elapsed_ms,
            suspended_share: all.suspended_share / scheduled_gpus.max(1) as f64,
            reaction_us: Stats::of(&reaction),
            detection_us: Stats::of(&detection),
            suspend_us: Stats::of(&suspend),
            resume_us: Stats::of(&resume),
            online_dispatch_delay_us: stats.dispatch_delay.summary_us(),
            offline_rate_running_per_s: per_s(all.offline_dispatches, running_ns_total),
            offline_rate_overall_per_s: per_s(all.offline_dispatches, elapsed_ns),
            polls: stats.steps.load(Ordering::Relaxed),
            loop_step_us: stats.step.summary_us(),
            realtime: self.realtime.clone(),
            reports_dropped: stats.reports_dropped.load(Ordering::Relaxed),
            reaction_panicked: self.reaction_panicked,
            hints: self.hints.as_ref().map(|h| h.state.counts),
            attach_refreshes: self.attach_refreshes,
            cpu_ms: cpu,
            cpu_share: if elapsed_ms > 0.0 { cpu / elapsed_ms } else { 0.0 },
            reaction_cpu_ms: stats.cpu_ns.load(Ordering::Relaxed) as f64 / 1e6,
            transition_cpu_ms: stats.transition_cpu_ns.load(Ordering::Relaxed) as f64 / 1e6,
            kernel: self.kernel.as_ref().map(KernelBreakdown::report),
            gpus: self.gpus.values().map(|g| g.report.clone()).collect(),
            ..all
        }
    }

    /// Each GPU with a policy and its state now (as the reaction thread last reported it).
    pub fn states(&self) -> Vec<(GpuId, State)> {
        self.gpus.iter().filter_map(|(&g, a)| a.state.map(|s| (g, s))).collect()
    }
}

impl Drop for Scheduler {
    /// A scheduler dropped without [`Scheduler::run`] (an error at start, a panic on this side):
    /// the reaction thread still resumes and detaches everything before this returns.
    fn drop(&mut self) {
        self.reaction_stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.reaction.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        fs,
        path::Path,
        sync::{
            Mutex,
            atomic::{AtomicU64, Ordering},
        },
        thread,
    };

    use super::*;
    use crate::{
        controller::vocabulary::{Batch, Selection, SessionNotice},
        kfd::uapi::QueueSnapshotEntry,
    };

    const A: u32 = 0x1000;
    const B: u32 = 0x2000;

    /// What one test's sessions answer and what was asked of them. Tests run in parallel in one
    /// process; a session finds its test by the fake sysfs root in its options.
    struct Script {
        sys: PathBuf,
        online: Vec<QueueSnapshotEntry>,
        offline: Vec<QueueSnapshotEntry>,
        /// Every watchdog resume arrives at the next look after a suspend.
        release_at_once: bool,
        calls: Vec<String>,
    }

    static SCRIPTS: Mutex<Vec<Script>> = Mutex::new(Vec::new());

    fn with_script<T>(sys: &Path, f: impl FnOnce(&mut Script) -> T) -> T {
        let mut scripts = SCRIPTS.lock().unwrap();
        let s = scripts.iter_mut().find(|s| s.sys == sys).expect("a script for this test");
        f(s)
    }

    /// A session that records what the scheduler asks of it (offline calls only: the online
    /// process is this test process in every test).
    struct Recorder {
        pid: HostPid,
        sys: PathBuf,
        online: bool,
        /// GPUs held now.
        held: Vec<GpuId>,
        released: bool,
    }

    impl Recorder {
        fn log(&self, call: String) {
            if !self.online {
                with_script(&self.sys, |s| s.calls.push(call));
            }
        }
    }

    impl Control for Recorder {
        fn attach(pid: HostPid, options: &Options) -> Result<Self, DebugError> {
            let online = pid.0 == std::process::id();
            let r = Self { pid, sys: options.roots.sys.clone(), online, held: Vec::new(), released: false };
            r.log(format!("attach {pid}"));
            Ok(r)
        }
        fn suspend(&mut self, selection: &Selection) -> Result<Batch, DebugError> {
            self.log(format!("suspend {selection:?}"));
            let Selection::Gpu(gpu) = selection else { panic!("the scheduler holds GPUs, not {selection:?}") };
            let n = with_script(&self.sys, |s| s.offline.iter().filter(|q| q.gpu_id == gpu.0).count());
            if n > 0 {
                self.held.push(*gpu);
            }
            Ok(Batch { count: n as i32, latency_ns: 1_000, ..Batch::default() })
        }
        fn resume(&mut self) -> Result<Batch, DebugError> {
            unreachable!("the scheduler resumes per GPU")
        }
        fn resume_gpu(&mut self, gpu: GpuId) -> Result<Batch, DebugError> {
            let n = with_script(&self.sys, |s| s.offline.iter().filter(|q| q.gpu_id == gpu.0).count());
            let held = self.held.contains(&gpu);
            self.held.retain(|g| *g != gpu);
            if held {
                self.log(format!("resume {gpu:#x}"));
                Ok(Batch { count: n as i32, latency_ns: 1_000, ..Batch::default() })
            } else {
                Ok(Batch { skipped: true, ..Batch::default() })
            }
        }
        fn snapshot(&mut self) -> Result<Vec<QueueSnapshotEntry>, DebugError> {
            let online = self.online;
            Ok(with_script(&self.sys, |s| if online { s.online.clone() } else { s.offline.clone() }))
        }
        fn notices(&mut self, _: u64) -> Vec<SessionNotice> {
            let release = with_script(&self.sys, |s| s.release_at_once);
            if !release || self.held.is_empty() {
                return Vec::new();
            }
            self.held.clear();
            self.released = true;
            self.log("watchdog resumed".into());
            vec![SessionNotice::WatchdogResumed { held_ms: 1, resumed: Batch { count: 1, ..Batch::default() } }]
        }
        fn comm(&self) -> String {
            "recorder".into()
        }
        fn detach(self) -> Detached {
            self.log(format!("detach {}", self.pid));
            Detached::default()
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

    /// An online or offline queue on `gpu` whose read and write indices live at `read`/`write`.
    fn queue(id: u32, gpu: u32, read: &AtomicU64, write: &AtomicU64) -> QueueSnapshotEntry {
        QueueSnapshotEntry {
            queue_id: id,
            gpu_id: gpu,
            read_pointer_address: read.as_ptr() as u64,
            write_pointer_address: write.as_ptr() as u64,
            ..QueueSnapshotEntry::default()
        }
    }

    /// A scheduler configuration in a fake sysfs/procfs: this process online with `online`
    /// queues, `offline` offline with `offline_queues` (5 ms idle, 100 µs polls, no real-time
    /// footing: unit tests run wherever). The directory lives as long as the returned guard.
    fn setup(
        offline: u32,
        online: Vec<QueueSnapshotEntry>,
        offline_queues: Vec<QueueSnapshotEntry>,
        release_at_once: bool,
    ) -> (tempfile::TempDir, ScheduleConfig) {
        let dir = tempfile::tempdir().unwrap();
        kfd_process(dir.path(), std::process::id());
        kfd_process(dir.path(), offline);
        let roots = Roots {
            sys: dir.path().join("sys"),
            proc: dir.path().join("proc"),
            docker: dir.path().join("docker"),
            ..Roots::default()
        };
        SCRIPTS.lock().unwrap().push(Script {
            sys: roots.sys.clone(),
            online,
            offline: offline_queues,
            release_at_once,
            calls: Vec::new(),
        });
        let config = ScheduleConfig {
            online: vec![Selector::Pid(HostPid(std::process::id()))],
            offline: vec![Selector::Pid(HostPid(offline))],
            policy: PolicyConfig { idle: Duration::from_millis(5), ..PolicyConfig::default() },
            poll: Duration::from_micros(100),
            realtime: RealtimeConfig::default(),
            session: Options { roots: roots.clone(), ..Options::default() },
            roots,
            ..ScheduleConfig::default()
        };
        (dir, config)
    }

    fn calls(config: &ScheduleConfig) -> Vec<String> {
        with_script(&config.roots.sys, |s| s.calls.clone())
    }

    fn wait_until(config: &ScheduleConfig, what: impl Fn(&[String]) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !what(&calls(config)) {
            assert!(Instant::now() < deadline, "timed out; calls: {:?}", calls(config));
            thread::sleep(Duration::from_millis(1));
        }
    }

    fn count(calls: &[String], prefix: &str) -> usize {
        calls.iter().filter(|c| c.starts_with(prefix)).count()
    }

    /// Events of a run, collected.
    fn sink() -> (Arc<Mutex<Vec<ScheduleEvent>>>, impl FnMut(&ScheduleEvent)) {
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        (events, move |e: &ScheduleEvent| sink.lock().unwrap().push(e.clone()))
    }

    /// No tracer: nothing appears or goes.
    struct Quiet;
    impl Discovery for Quiet {
        fn poll(&mut self, _: &mut Vec<ModelNotice>) {}
        fn sees_queues(&self) -> bool {
            true
        }
    }

    static READ: AtomicU64 = AtomicU64::new(0);
    static WRITE: AtomicU64 = AtomicU64::new(0);
    static OFF_READ: AtomicU64 = AtomicU64::new(0);
    const OFFLINE: u32 = 3_999_999;

    #[test]
    fn pending_online_work_suspends_the_offline_queues_of_its_gpu_once_and_idle_resumes_them() {
        let offline = vec![queue(0, A, &OFF_READ, &OFF_READ)];
        let (_dir, config) = setup(OFFLINE, vec![queue(0, A, &READ, &WRITE)], offline, false);
        let (events, mut emit) = sink();
        let s = Scheduler::start::<Recorder>(config.clone(), Box::new(Quiet), &mut emit).unwrap();
        assert_eq!(calls(&config), [format!("attach {OFFLINE}")]);
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, c) = (stop.clone(), config.clone());
        let driver = thread::spawn(move || {
            // Two bursts of online work: one dispatch each, consumed after the suspend.
            for n in 1..=2u64 {
                WRITE.store(n, Ordering::SeqCst);
                wait_until(&c, |calls| count(calls, "suspend") == n as usize);
                thread::sleep(Duration::from_millis(20));
                READ.store(n, Ordering::SeqCst);
                wait_until(&c, |calls| count(calls, "resume") == n as usize);
            }
            flag.store(true, Ordering::SeqCst);
        });
        let report = s.run(&stop, &mut emit);
        driver.join().unwrap();
        let gpu_a = format!("suspend Gpu(GpuId({A}))");
        assert_eq!(
            calls(&config)[1..],
            [gpu_a.clone(), "resume 0x1000".into(), gpu_a, "resume 0x1000".into(), format!("detach {OFFLINE}")]
        );
        assert_eq!((report.suspends, report.resumes, report.failed_suspends), (2, 2, 0));
        assert_eq!(report.resumes_by_reason, BTreeMap::from([("idle".to_owned(), 2)]));
        // Online snapshot (ENABLE + DISABLE), offline ENABLE and DISABLE.
        assert_eq!(report.attach_refreshes, 4);
        assert_eq!(report.reaction_us.as_ref().map(|r| r.count), Some(2));
        assert_eq!(report.detection_us.as_ref().map(|r| r.count), Some(2));
        assert!(report.loop_step_us.as_ref().is_some_and(|s| s.count > 10), "{:?}", report.loop_step_us);
        assert!(report.polls > 10);
        // The reaction thread's CPU, measured by itself when it ended, holds its transitions'.
        assert!(report.reaction_cpu_ms > 0.0, "{}", report.reaction_cpu_ms);
        assert!(report.transition_cpu_ms <= report.reaction_cpu_ms, "{report:?}");
        // Each dispatch was seen pending once and consumed once.
        assert_eq!(report.online_dispatch_delay_us.as_ref().map(|d| d.count), Some(2));
        assert_eq!(report.realtime, Realtime { policy: "normal", ..Realtime::default() });
        assert_eq!(report.gpus.len(), 1);
        assert_eq!((report.gpus[0].gpu_id, report.gpus[0].suspends, report.gpus[0].scheduled), (GpuId(A), 2, true));
        let events = events.lock().unwrap();
        let kinds: Vec<String> = events
            .iter()
            .filter_map(|e| match e {
                ScheduleEvent::Transition(t) => {
                    Some(format!("{} {:#x} {:?} {}", t.action, t.gpu_id, t.reason, t.queues))
                }
                ScheduleEvent::OnlineAdded { queues, snapshot, .. } => {
                    Some(format!("online_added {queues} {snapshot}"))
                }
                ScheduleEvent::OfflineAttached { queues, gpus, picked_up, .. } => {
                    Some(format!("offline_attached {queues} {gpus:?} {picked_up}"))
                }
                ScheduleEvent::OfflineDetached { reason, .. } => Some(format!("offline_detached {reason}")),
                ScheduleEvent::Summary(_) => Some("summary".into()),
                ScheduleEvent::Interval(_) => None,
                other => Some(format!("{other:?}")),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "online_added 1 true",
                "offline_attached 1 [GpuId(4096)] false",
                "suspend 0x1000 None 1",
                "resume 0x1000 Some(Idle) 1",
                "suspend 0x1000 None 1",
                "resume 0x1000 Some(Idle) 1",
                "offline_detached stopped",
                "summary",
            ]
        );
    }

    static READ2: AtomicU64 = AtomicU64::new(0);
    static WRITE2: AtomicU64 = AtomicU64::new(0);
    const OFFLINE2: u32 = 3_999_998;

    #[test]
    fn time_after_a_session_watchdog_resume_is_not_counted_suspended() {
        let offline = vec![queue(0, A, &OFF_READ, &OFF_READ)];
        let (_dir, config) = setup(OFFLINE2, vec![queue(0, A, &READ2, &WRITE2)], offline, true);
        let (events, mut emit) = sink();
        let s = Scheduler::start::<Recorder>(config.clone(), Box::new(Quiet), &mut emit).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, c) = (stop.clone(), config.clone());
        let driver = thread::spawn(move || {
            // Online work stays pending 300 ms after the session watchdog released the offline
            // process, which runs meanwhile (the burst had its suspend: no second one).
            WRITE2.store(1, Ordering::SeqCst);
            wait_until(&c, |calls| count(calls, "watchdog resumed") == 1);
            let pending = Instant::now();
            thread::sleep(Duration::from_millis(300));
            READ2.store(1, Ordering::SeqCst);
            thread::sleep(Duration::from_millis(50));
            flag.store(true, Ordering::SeqCst);
            pending.elapsed()
        });
        let report = s.run(&stop, &mut emit);
        let pending = driver.join().unwrap();
        assert_eq!(count(&calls(&config), "suspend"), 1);
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
        // Held from the suspend to the next step's look at the session (100 µs steps; bounded
        // generously for a loaded machine), not for the 300 ms the online work stayed pending.
        assert!(pending >= Duration::from_millis(300));
        assert!(report.suspended_ms < 150.0, "suspended {} ms", report.suspended_ms);
    }

    static READ3: AtomicU64 = AtomicU64::new(0);
    static WRITE3: AtomicU64 = AtomicU64::new(0);
    static READ3B: AtomicU64 = AtomicU64::new(0);
    static WRITE3B: AtomicU64 = AtomicU64::new(0);
    const OFFLINE3: u32 = 3_999_997;

    /// A discovery the test feeds.
    struct Fed(Receiver<ModelNotice>);
    impl Discovery for Fed {
        fn poll(&mut self, out: &mut Vec<ModelNotice>) {
            out.extend(self.0.try_iter());
        }
        fn sees_queues(&self) -> bool {
            true
        }
    }

    #[test]
    fn online_work_on_one_gpu_suspends_only_that_gpus_offline_queues_and_a_new_online_gpu_gets_its_policy() {
        // Offline queues on A (ids 0, 2) and B (id 1); online starts with one queue on A.
        let offline = vec![
            queue(0, A, &OFF_READ, &OFF_READ),
            queue(1, B, &OFF_READ, &OFF_READ),
            queue(2, A, &OFF_READ, &OFF_READ),
        ];
        let (_dir, config) = setup(OFFLINE3, vec![queue(0, A, &READ3, &WRITE3)], offline, false);
        let (events, mut emit) = sink();
        let (tx, rx) = mpsc::channel();
        let s = Scheduler::start::<Recorder>(config.clone(), Box::new(Fed(rx)), &mut emit).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, c) = (stop.clone(), config.clone());
        let driver = thread::spawn(move || {
            WRITE3.store(1, Ordering::SeqCst);
            wait_until(&c, |calls| count(calls, "suspend") == 1);
            READ3.store(1, Ordering::SeqCst);
            wait_until(&c, |calls| count(calls, "resume") == 1);
            // The online process creates a queue on B mid-run: B's policy starts with it.
            let queue = QueueAddrs {
                queue_id: QueueId(1),
                gpu_id: GpuId(B),
                read: READ3B.as_ptr() as u64,
                write: WRITE3B.as_ptr() as u64,
            };
            tx.send(ModelNotice::QueueCreated { pid: HostPid(std::process::id()), queue }).unwrap();
            WRITE3B.store(1, Ordering::SeqCst);
            wait_until(&c, |calls| count(calls, "suspend") == 2);
            READ3B.store(1, Ordering::SeqCst);
            wait_until(&c, |calls| count(calls, "resume") == 2);
            flag.store(true, Ordering::SeqCst);
        });
        let report = s.run(&stop, &mut emit);
        driver.join().unwrap();
        assert_eq!(
            calls(&config)[1..],
            [
                format!("suspend Gpu(GpuId({A}))"),
                "resume 0x1000".into(),
                format!("suspend Gpu(GpuId({B}))"),
                "resume 0x2000".into(),
                format!("detach {OFFLINE3}"),
            ]
        );
        let per_gpu: Vec<(GpuId, u64, u64)> = report.gpus.iter().map(|g| (g.gpu_id, g.suspends, g.resumes)).collect();
        assert_eq!(per_gpu, [(GpuId(A), 1, 1), (GpuId(B), 1, 1)]);
        let transitions: Vec<(GpuId, &str, i64)> = events
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                ScheduleEvent::Transition(t) => Some((t.gpu_id, t.action, t.queues)),
                _ => None,
            })
            .collect();
        // Two queues held on A, one on B.
        assert_eq!(
            transitions,
            [(GpuId(A), "suspend", 2), (GpuId(A), "resume", 2), (GpuId(B), "suspend", 1), (GpuId(B), "resume", 1)]
        );
    }

    #[test]
    fn a_gpu_with_online_work_but_no_offline_queue_holds_nothing() {
        static R: AtomicU64 = AtomicU64::new(0);
        static W: AtomicU64 = AtomicU64::new(0);
        const OFF: u32 = 3_999_996;
        // Offline only on B; online only on A.
        let (_dir, config) = setup(OFF, vec![queue(0, A, &R, &W)], vec![queue(0, B, &OFF_READ, &OFF_READ)], false);
        let (_events, mut emit) = sink();
        let s = Scheduler::start::<Recorder>(config.clone(), Box::new(Quiet), &mut emit).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, c) = (stop.clone(), config.clone());
        let driver = thread::spawn(move || {
            W.store(1, Ordering::SeqCst);
            wait_until(&c, |calls| count(calls, "suspend") == 1);
            thread::sleep(Duration::from_millis(30));
            R.store(1, Ordering::SeqCst);
            thread::sleep(Duration::from_millis(30));
            flag.store(true, Ordering::SeqCst);
        });
        let report = s.run(&stop, &mut emit);
        driver.join().unwrap();
        // One SUSPEND asked for A, which held nothing of it (no ioctl in a real session): no
        // resume, and B's queue was never touched.
        assert_eq!(calls(&config)[1..], [format!("suspend Gpu(GpuId({A}))"), format!("detach {OFF}")]);
        assert_eq!((report.suspends, report.resumes, report.suspended_ms), (1, 0, 0.0));
        let b = report.gpus.iter().find(|g| g.gpu_id == GpuId(B)).unwrap();
        assert_eq!((b.scheduled, b.suspends), (false, 0));
    }

    #[test]
    fn a_started_online_dispatch_shown_only_by_cu_occupancy_holds_off_the_idle_resume() {
        static R: AtomicU64 = AtomicU64::new(0);
        static W: AtomicU64 = AtomicU64::new(0);
        const OFF: u32 = 3_999_995;
        let (dir, config) = setup(OFF, vec![queue(0, A, &R, &W)], vec![queue(0, A, &OFF_READ, &OFF_READ)], false);
        let stats = dir.path().join(format!("sys/class/kfd/kfd/proc/{}/stats_{A}", std::process::id()));
        fs::create_dir_all(&stats).unwrap();
        let occupancy = stats.join("cu_occupancy");
        fs::write(&occupancy, "0\n").unwrap();
        // Periodic reads every 10 ms, twice the 5 ms idle: only the fresh read before an idle
        // resume can tell that the dispatch still runs. (A busy read stands until the next
        // periodic one, so the period must stay short of the 5 s watchdog.)
        let config = ScheduleConfig { occupancy: Duration::from_millis(10), ..config };
        let (_events, mut emit) = sink();
        let s = Scheduler::start::<Recorder>(config.clone(), Box::new(Quiet), &mut emit).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, c) = (stop.clone(), config.clone());
        let driver = thread::spawn(move || {
            W.store(1, Ordering::SeqCst);
            wait_until(&c, |calls| count(calls, "suspend") == 1);
            // The dispatch starts (consumed from the ring) and runs for 100 ms: 20 idle periods.
            fs::write(&occupancy, "304\n").unwrap();
            R.store(1, Ordering::SeqCst);
            thread::sleep(Duration::from_millis(100));
            let resumed_while_running = count(&calls(&c), "resume");
            fs::write(&occupancy, "0\n").unwrap();
            wait_until(&c, |calls| count(calls, "resume") == 1);
            flag.store(true, Ordering::SeqCst);
            resumed_while_running
        });
        let report = s.run(&stop, &mut emit);
        assert_eq!(driver.join().unwrap(), 0, "resumed while the online dispatch ran");
        assert_eq!((report.suspends, report.resumes), (1, 1));
        assert_eq!(report.resumes_by_reason, BTreeMap::from([("idle".to_owned(), 1)]));
    }
}
