//! What to schedule and how: the configuration, why the scheduler cannot start, and the
//! selectors checked against the KFD processes of the moment before anything slow starts.

use std::{path::PathBuf, time::Duration};

use serde::Serialize;

use super::{
    online::ReadError, policy::PolicyConfig, realtime::RealtimeConfig, runnable::Runnable, wake_latency::WakeLatency,
};
use crate::{
    controller::{
        target::{Target, TargetError},
        vocabulary::{DebugError, Options},
    },
    domain::HostPid,
    host::{
        roots::Roots,
        select::{self, Selector},
    },
    kfd::{Device, KfdVersion},
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
    /// Interval between reads of the online `cu_occupancy` (the kernel asks the hardware) while
    /// nothing else asks for one: a fresh read is taken before every idle resume anyway.
    pub occupancy: Duration,
    /// A write index that moved since the last poll is online work, even if it was consumed
    /// before the poll looked (an MI300-class CP takes a packet within microseconds).
    pub watch_writes: bool,
    /// See online submissions through the doorbell probe (eBPF uprobes on the ROCm runtime the
    /// online processes map): while every online queue is covered and idle, the reaction thread
    /// waits for a submission instead of polling. Off, or where it cannot load: the index poll.
    pub doorbell: bool,
    /// See requests reach the online processes' listening ports (the arrival probe, an eBPF
    /// `cgroup_skb` ingress program on their cgroups) and start the SUSPENDs during the request's
    /// CPU phase. None: `--no-arrival`.
    pub arrival: Option<ArrivalConfig>,
    /// While the reaction thread waits on the doorbell probe, it still reads the indices this
    /// often: work that reaches a covered queue without the runtime's export (ROCr's internal
    /// blits, a raw write) is seen at the latest then.
    pub cross_check: Duration,
    /// Interval between [`ScheduleEvent::Interval`] reports.
    pub interval: Duration,
    pub hint_socket: Option<PathBuf>,
    pub roots: Roots,
    /// Options of each offline session; its watchdog is set to back the policy's up.
    pub session: Options,
    /// An offline process with nothing on a held GPU (its queues there drained, no wave in
    /// flight) is held without an ioctl and suspended at its first submission (`--defer-idle-offline`).
    pub defer_idle: bool,
    /// Hold each offline job (one selector) on all of its GPUs or on none.
    pub gang: bool,
    /// Offline processes kept runnable per GPU while it has no online work; the others are
    /// parked and take turns every `rotate` (`--runnable`).
    pub runnable: Runnable,
    pub rotate: Duration,
}

/// The arrival probe's settings (`--arrival-port`, `--arrival-allow`, `--arrival-deny`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArrivalConfig {
    /// Watch these ports only (empty: every TCP port each online process listens on).
    pub ports: Vec<u16>,
    /// Patterns as given (empty: the defaults, [`super::arrival::patterns`]).
    pub allow: Vec<String>,
    pub deny: Vec<String>,
}

impl ArrivalConfig {
    /// The patterns the probe compiles.
    pub fn patterns(&self) -> Result<super::arrival::Patterns, super::arrival::PatternError> {
        super::arrival::Patterns::from_lists(&self.allow, &self.deny)
    }
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
            realtime: RealtimeConfig {
                priority: DEFAULT_RT_PRIORITY,
                cpu: None,
                lock_memory: true,
                wake_latency: WakeLatency::Auto,
            },
            // Submissions are seen in the write indices (`watch_writes`) and a fresh read precedes
            // every idle resume, so the periodic read only backs up queues the scheduler does not
            // watch (no tracer): at the MI300X profile's 50 µs a read, 1 kHz would be 5 % of a
            // core on its own (harness/PROFILES.md).
            occupancy: Duration::from_millis(10),
            watch_writes: true,
            doorbell: true,
            arrival: Some(ArrivalConfig::default()),
            // 100 wakes a second while idle: a step costs microseconds, so far under 1 % of a core.
            cross_check: Duration::from_millis(10),
            interval: Duration::from_secs(1),
            hint_socket: None,
            roots: Roots::default(),
            session: Options::default(),
            // Off: the native harness (BENCHMARKS §9.4) measured the late suspends it leaves inside
            // online requests costing the online P99 more than the ioctls it saves.
            defer_idle: false,
            gang: false,
            // As many as keep the GPU busy: one SUSPEND per transition where one trainer fills the
            // GPU, all of them where none can (the native harness, BENCHMARKS §9.5; runnable.rs).
            runnable: Runnable::Auto,
            rotate: Duration::from_millis(250),
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
    /// A selector that cannot be looked up (a `pod-label:` one with no CRI runtime answering).
    #[error("--{role} {message}")]
    Lookup { role: Role, message: String },
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

/// Check a pid selector's process: it exists, has opened /dev/kfd and has no secondary KFD
/// context (Linux 7.0: DBG_TRAP cannot reach one, docs/kfd.md §1.4), before anything slow starts.
fn check_pid(roots: &Roots, role: Role, pid: HostPid) -> Result<(), ScheduleError> {
    let target = Target::inspect(roots, pid).map_err(|source| ScheduleError::Target { role, pid, cause: source })?;
    if !target.uses_kfd {
        return Err(ScheduleError::Target { role, pid, cause: TargetError::NotKfdProcess { pid, comm: target.comm } });
    }
    refuse_secondary_contexts(role, target)
}

/// A process with a secondary KFD context (Linux 7.0) is refused on either side: DBG_TRAP reaches
/// only its primary context, so such queues can be neither suspended (offline) nor seen (online).
fn refuse_secondary_contexts(role: Role, target: Target) -> Result<(), ScheduleError> {
    if target.secondary_contexts.is_empty() {
        return Ok(());
    }
    let (pid, comm, contexts) = (target.pid, target.comm, target.secondary_contexts);
    let cause = match role {
        Role::Offline => TargetError::SecondaryContexts { pid, comm, contexts },
        Role::Online => TargetError::OnlineSecondaryContexts { pid, comm, contexts },
    };
    Err(ScheduleError::Target { role, pid, cause })
}

/// The selectors resolved against the KFD processes of the moment, or why they cannot be
/// scheduled: nothing selected on a side, a named pid that is gone or no KFD process, a process on
/// both sides. Cheap (sysfs and /proc), so a front end checks it before it starts anything slow
/// (the tracer takes seconds to attach); [`Scheduler::start`] checks it again.
pub fn check_selection(config: &ScheduleConfig) -> Result<(), ScheduleError> {
    resolve_selection(config).map(drop)
}

pub(super) fn resolve_selection(
    config: &ScheduleConfig,
) -> Result<(select::Resolved, select::Resolved), ScheduleError> {
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
        if let Some(message) = r.lookup_errors.first() {
            return Err(ScheduleError::Lookup { role, message: message.clone() });
        }
        for &pid in &r.unmatched_pids {
            check_pid(roots, role, pid)?;
        }
        // The KFD processes selected now, by pid, container or pod: a context_<id> directory
        // refuses one (docs/kfd.md §1.4); one that exits meanwhile is left to the attach.
        for &pid in &r.pids {
            if let Ok(target) = Target::inspect(roots, pid) {
                refuse_secondary_contexts(role, target)?;
            }
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
