//! A KFD debug-trap session on one target process, owned by one dedicated OS thread.
//!
//! KFD checks that the *calling thread* is the ptrace parent of the target's leader (docs/kfd.md §2.1),
//! so the thread that seizes the target issues every `AMDKFD_IOC_DBG_TRAP`. Between requests it
//! services the session: re-injects the target's signals, acknowledges `EC_PROCESS_RUNTIME` so the
//! target never blocks in ROCr start-up or shutdown (§2.6), notes new queues (`EC_QUEUE_NEW`), and
//! resumes a suspension that outlives `max_suspend` (watchdog). Every exit path — `detach`, drop,
//! a panic in either thread — resumes what is suspended, disables debugging and detaches; if the
//! whole controller dies (kill -9) the kernel does the same (debugger mm teardown, §2.7).

use std::{
    os::fd::{AsFd, AsRawFd, OwnedFd},
    path::PathBuf,
    sync::mpsc::{self, Receiver, Sender, TryRecvError},
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use nix::{
    errno::Errno,
    fcntl::OFlag,
    poll::{PollFd, PollFlags, PollTimeout, poll},
    unistd::{pipe2, read, write},
};
use serde::Serialize;

use crate::domain::QueueId;

use super::{
    Device, KfdVersion,
    device::DeviceError,
    target::{self, Target, TargetError},
    tracee::{Tracee, TraceeState},
    uapi::{DbgTrapArgs, QueueSnapshotEntry, RuntimeInfo, dbg_trap_op, exception, runtime_state},
};

/// `KFD_EC_MASK(EC_QUEUE_NEW)`: set on every new queue; suspend refuses such queues until a
/// snapshot clears it (docs/kfd.md §2.4).
const QUEUE_NEW: u64 = exception::ec_mask(exception::EC_QUEUE_NEW);
/// `KFD_EC_MASK(EC_PROCESS_RUNTIME)`: the target's runtime was enabled or disabled.
const PROCESS_RUNTIME: u64 = exception::ec_mask(exception::EC_PROCESS_RUNTIME);
/// What the session subscribes to in ENABLE's `exception_mask`.
const SUBSCRIBED: u64 = QUEUE_NEW | PROCESS_RUNTIME;
/// How often the session thread looks at the tracee and the watchdog when nothing else wakes it.
const SERVICE_PERIOD: Duration = Duration::from_millis(20);
/// `KFD_MAX_NUM_OF_QUEUES_PER_PROCESS`: bounds snapshot buffers.
const MAX_QUEUES_PER_PROCESS: u32 = 1024;

/// `grace_period` value KFD treats as "leave CP_IQ_WAIT_TIME2 as it is" (`USE_DEFAULT_GRACE_PERIOD`,
/// kfd_device_queue_manager.h, 6.5–6.12).
pub const DRIVER_GRACE_PERIOD: u32 = 0xffff_ffff;

/// Settings of a session.
#[derive(Clone, Debug)]
pub struct Options {
    /// Resume automatically when queues stay suspended longer than this.
    pub max_suspend: Option<Duration>,
    pub roots: target::Roots,
    pub device: PathBuf,
}

impl Default for Options {
    fn default() -> Self {
        Self { max_suspend: None, roots: target::Roots::default(), device: PathBuf::from(super::device::KFD_DEVICE) }
    }
}

/// Why a debug session could not start or an operation failed: cause and fix.
#[derive(Debug, thiserror::Error)]
pub enum DebugError {
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error("the debug-trap API needs KFD ≥ 1.13 (Linux 6.5+ or amdgpu-dkms); this kernel has {0}")]
    NoDebugTrap(KfdVersion),
    #[error("cannot ptrace pid {pid}: {reason}")]
    PtraceDenied { pid: u32, reason: String },
    #[error("PTRACE_SEIZE of pid {pid} failed: {errno}")]
    Ptrace { pid: u32, errno: Errno },
    #[error(
        "pid {pid} is already being debugged through KFD (another gpreempt, or rocgdb/ROCdbgapi): EALREADY; \
         stop that debugger first"
    )]
    AlreadyDebugged { pid: u32 },
    #[error(
        "KFD refused to debug pid {pid}: EBUSY — on GPUs without per-VMID debug (MI50/MI60, MI100, RDNA1/2) only \
         one process per GPU can be debugged and one already is, or the process uses GWS"
    )]
    Busy { pid: u32 },
    #[error(
        "KFD refused the debug trap: EINVAL — amdgpu runs without the hardware scheduler (sched_policy=2), which \
         the debug-trap API needs; reload amdgpu with sched_policy=0"
    )]
    NoHws,
    #[error(
        "pid {pid} has not enabled the ROCm runtime's debug interface (AMDKFD_IOC_RUNTIME_ENABLE): it is not a \
         ROCr process, its ROCm is too old, or the GPU firmware lacks debug support; KFD refuses to suspend its \
         queues (EPERM)"
    )]
    RuntimeNotEnabled { pid: u32 },
    #[error(
        "pid {pid} shut its ROCm runtime down (RUNTIME_ENABLE mode 0, as ROCr does at exit or hsa_shut_down): \
         KFD resumed its queues and refuses new suspends"
    )]
    RuntimeDisabled { pid: u32 },
    #[error(
        "KFD says this thread is not the ptrace parent of pid {pid} (EPERM) although it seized it; was it \
         detached by someone else?"
    )]
    NotPtraceParent { pid: u32 },
    #[error("pid {pid} exited (status {code}) during the debug session")]
    TargetExited { pid: u32, code: i32 },
    #[error("AMDKFD_IOC_DBG_TRAP {op} on pid {pid} failed: {errno}")]
    Ioctl { op: &'static str, pid: u32, errno: Errno },
    #[error("cannot create the debug-event pipe: {0}")]
    Pipe(Errno),
    #[error(transparent)]
    Watchdog(#[from] super::watchdog::WatchdogError), // watchdog wiring
    #[error("the debug session thread is gone (it panicked?)")]
    SessionGone,
}

/// What attaching found out.
#[derive(Clone, Debug, Serialize)]
pub struct Attached {
    pub pid: u32,
    pub comm: String,
    pub kfd_version: KfdVersion,
    /// `kfd_runtime_info.runtime_state` at ENABLE ([`runtime_state`]).
    pub runtime_state: u32,
    /// `kfd_runtime_info.r_debug`: ROCr's `_amdgpu_r_debug` address, 0 before runtime enable.
    pub r_debug: u64,
}

pub use super::uapi::{QueueOutcome, QueueResult, decode_outcomes};

/// One SUSPEND_QUEUES or RESUME_QUEUES as seen from userspace.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Batch {
    /// The ioctl's return value: the number of queues suspended/resumed.
    pub count: i32,
    /// Serialised as `{queue_id, result}` per id (the `--json` record's shape).
    #[serde(serialize_with = "verdicts")]
    pub outcomes: Vec<QueueOutcome>,
    /// Time spent in the ioctl(s), retry included.
    pub latency_ns: u64,
    /// Ids retried once after a re-snapshot because they came back INVALID.
    pub retried: u32,
    /// No ioctl was needed (nothing to suspend or resume).
    pub skipped: bool,
}

impl Batch {
    pub fn done(&self) -> usize {
        self.count_of(QueueResult::Done)
    }
    pub fn invalid(&self) -> usize {
        self.count_of(QueueResult::Invalid)
    }
    pub fn error(&self) -> usize {
        self.count_of(QueueResult::Error)
    }
    fn count_of(&self, r: QueueResult) -> usize {
        self.outcomes.iter().filter(|o| o.result() == r).count()
    }
}

fn verdicts<S: serde::Serializer>(outcomes: &[QueueOutcome], s: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Verdict {
        queue_id: QueueId,
        result: QueueResult,
    }
    s.collect_seq(outcomes.iter().map(|o| Verdict { queue_id: o.queue_id, result: o.result() }))
}

/// Which queues to suspend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    /// Every queue of the target (from the latest snapshot, refreshed when queues appear).
    All,
    Ids(Vec<u32>),
}

/// Things that happened in the session without being asked.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "notice", rename_all = "snake_case")]
pub enum Notice {
    TargetExited {
        code: i32,
    },
    /// EC_PROCESS_RUNTIME acknowledged; the target's runtime is now in this state.
    RuntimeChanged {
        runtime_state: u32,
    },
    /// The target created queues (EC_QUEUE_NEW); the next `All` suspend re-snapshots.
    QueuesAppeared,
    /// The watchdog resumed queues held longer than `max_suspend`.
    WatchdogResumed {
        held_ms: u64,
        resumed: Batch,
    },
}

/// How the session ended.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Detached {
    /// Queues resumed at detach (0 when nothing was suspended).
    pub resumed: usize,
    /// DISABLE succeeded (false if the target was already gone).
    pub disabled: bool,
    /// Signals re-injected into the target while it was seized.
    pub signals_forwarded: u64,
}

enum Request {
    Snapshot { clear_new: bool, reply: Sender<Result<Vec<QueueSnapshotEntry>, DebugError>> },
    Suspend { selection: Selection, grace_period: u32, reply: Sender<Result<Batch, DebugError>> },
    Resume { reply: Sender<Result<Batch, DebugError>> },
    Detach { reply: Sender<Detached> },
}

/// Handle to a debug session; dropping it ends the session cleanly.
pub struct Debugger {
    requests: Sender<Request>,
    notices: Receiver<Notice>,
    wake: OwnedFd,
    thread: Option<JoinHandle<()>>,
    attached: Attached,
}

impl Debugger {
    /// Check the target, seize it and enable the debug trap, all on a new session thread.
    pub fn attach(pid: u32, options: Options) -> Result<Self, DebugError> {
        let target = Target::inspect(&options.roots, pid)?;
        target.check_debuggable(&options.roots)?;
        let (wake_read, wake_write) = pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(DebugError::Pipe)?;
        let (requests, request_rx) = mpsc::channel();
        let (notice_tx, notices) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = thread::Builder::new()
            .name(format!("kfd-debug-{pid}"))
            .spawn(move || match Session::start(target, options, notice_tx) {
                Ok((mut session, attached)) => {
                    if ready_tx.send(Ok(attached)).is_ok() {
                        session.run(&request_rx, wake_read);
                    }
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            })
            .map_err(|_| DebugError::SessionGone)?;
        match ready_rx.recv() {
            Ok(Ok(attached)) => Ok(Self { requests, notices, wake: wake_write, thread: Some(thread), attached }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(DebugError::SessionGone)
            }
        }
    }

    pub fn attached(&self) -> &Attached {
        &self.attached
    }

    /// GET_QUEUE_SNAPSHOT. `clear_new` clears EC_QUEUE_NEW on the reported queues, which makes
    /// them suspendable; without it the snapshot changes nothing in the target.
    pub fn snapshot(&self, clear_new: bool) -> Result<Vec<QueueSnapshotEntry>, DebugError> {
        self.call(|reply| Request::Snapshot { clear_new, reply })
    }

    /// SUSPEND_QUEUES (snapshot first for `All`, one retry of INVALID ids after a re-snapshot).
    pub fn suspend(&self, selection: Selection, grace_period: u32) -> Result<Batch, DebugError> {
        self.call(|reply| Request::Suspend { selection, grace_period, reply })
    }

    /// RESUME_QUEUES of every queue this session suspended.
    pub fn resume(&self) -> Result<Batch, DebugError> {
        self.call(|reply| Request::Resume { reply })
    }

    /// Notices since the last call.
    pub fn notices(&self) -> Vec<Notice> {
        self.notices.try_iter().collect()
    }

    /// End the session: resume, DISABLE, PTRACE_DETACH.
    pub fn detach(mut self) -> Detached {
        self.finish()
    }

    fn finish(&mut self) -> Detached {
        let Some(thread) = self.thread.take() else { return Detached::default() };
        let (reply, rx) = mpsc::channel();
        let report = if self.requests.send(Request::Detach { reply }).is_ok() {
            self.kick();
            rx.recv().unwrap_or_default()
        } else {
            Detached::default()
        };
        let _ = thread.join();
        report
    }

    fn call<T>(&self, make: impl FnOnce(Sender<Result<T, DebugError>>) -> Request) -> Result<T, DebugError> {
        let (reply, rx) = mpsc::channel();
        self.requests.send(make(reply)).map_err(|_| DebugError::SessionGone)?;
        self.kick();
        rx.recv().map_err(|_| DebugError::SessionGone)?
    }

    fn kick(&self) {
        let _ = write(self.wake.as_fd(), &[1]);
    }
}

impl Drop for Debugger {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The session thread's state.
struct Session {
    pid: u32,
    kfd: Device,
    tracee: Tracee,
    dbg_read: OwnedFd,
    /// KFD holds its own reference to the write end (fget at ENABLE); ours only keeps the pipe
    /// alive for the session.
    _dbg_write: OwnedFd,
    enabled: bool,
    runtime_state: u32,
    /// The runtime was enabled at some point of the session (so DISABLED now means shut down).
    runtime_was_enabled: bool,
    /// Queue ids of the latest snapshot.
    known: Vec<u32>,
    queues_dirty: bool,
    suspended: Vec<u32>,
    suspended_at: Option<Instant>,
    max_suspend: Option<Duration>,
    notices: Sender<Notice>,
    /// Kills this process if a suspension outlives `max_suspend` while it is stopped (watchdog wiring).
    watchdog: Option<super::watchdog::Watchdog>,
}

impl Session {
    fn start(target: Target, options: Options, notices: Sender<Notice>) -> Result<(Self, Attached), DebugError> {
        // watchdog wiring: forked before the device and the target are touched.
        let watchdog = match options.max_suspend {
            Some(_) => Some(super::watchdog::Watchdog::spawn()?),
            None => None,
        };
        let kfd = Device::open_path(&options.device)?;
        let version = kfd.version()?;
        if !version.has_debug_trap() {
            return Err(DebugError::NoDebugTrap(version));
        }
        let pid = target.pid;
        let tracee = Tracee::seize(pid).map_err(|errno| match errno {
            Errno::EPERM => {
                DebugError::PtraceDenied { pid, reason: target::explain_ptrace_denied(&options.roots, &target) }
            }
            Errno::ESRCH => DebugError::Target(TargetError::NoSuchProcess(pid)),
            errno => DebugError::Ptrace { pid, errno },
        })?;
        // pidfd wiring: the seized pid is still the inspected process (not a reused pid).
        target.confirm()?;
        // ROCdbgapi's choice: a non-blocking pipe; KFD writes one '.' per raised exception (§2.2).
        let (dbg_read, dbg_write) = pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(DebugError::Pipe)?;
        let mut info = RuntimeInfo::default();
        let mut args = DbgTrapArgs::enable(
            pid,
            SUBSCRIBED,
            &raw mut info as u64,
            size_of::<RuntimeInfo>() as u32,
            dbg_write.as_raw_fd() as u32,
        );
        // On error `tracee` drops here and detaches.
        kfd.dbg_trap(&mut args).map_err(|errno| match errno {
            Errno::EALREADY => DebugError::AlreadyDebugged { pid },
            Errno::EBUSY => DebugError::Busy { pid },
            Errno::EINVAL => DebugError::NoHws,
            Errno::ESRCH => DebugError::Target(TargetError::NoSuchProcess(pid)),
            Errno::EPERM => DebugError::NotPtraceParent { pid },
            errno => DebugError::Ioctl { op: "ENABLE", pid, errno },
        })?;
        let attached = Attached {
            pid,
            comm: target.comm.clone(),
            kfd_version: version,
            runtime_state: info.runtime_state,
            r_debug: info.r_debug,
        };
        let session = Self {
            pid,
            kfd,
            tracee,
            dbg_read,
            _dbg_write: dbg_write,
            enabled: true,
            runtime_state: info.runtime_state,
            runtime_was_enabled: info.runtime_state == runtime_state::ENABLED,
            known: Vec::new(),
            queues_dirty: true,
            suspended: Vec::new(),
            suspended_at: None,
            max_suspend: options.max_suspend,
            notices,
            watchdog, // watchdog wiring
        };
        Ok((session, attached))
    }

    fn run(&mut self, requests: &Receiver<Request>, wake: OwnedFd) {
        loop {
            let timeout = self.next_timeout();
            let mut fds =
                [PollFd::new(wake.as_fd(), PollFlags::POLLIN), PollFd::new(self.dbg_read.as_fd(), PollFlags::POLLIN)];
            let _ = poll(&mut fds, PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX));
            drain(&wake);
            if fds[1].revents().is_some_and(|r| r.contains(PollFlags::POLLIN)) {
                drain(&self.dbg_read);
                self.service_events();
            }
            self.service_tracee();
            self.watchdog();
            loop {
                match requests.try_recv() {
                    Ok(Request::Detach { reply }) => {
                        let _ = reply.send(self.cleanup());
                        return;
                    }
                    Ok(request) => self.handle(request),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        self.cleanup();
                        return;
                    }
                }
            }
        }
    }

    fn next_timeout(&self) -> Duration {
        match (self.suspended_at, self.max_suspend) {
            (Some(at), Some(max)) => max.saturating_sub(at.elapsed()).min(SERVICE_PERIOD),
            _ => SERVICE_PERIOD,
        }
    }

    fn handle(&mut self, request: Request) {
        match request {
            Request::Snapshot { clear_new, reply } => {
                let r = self.snapshot(if clear_new { QUEUE_NEW } else { 0 });
                let _ = reply.send(self.with_exit_status(r));
            }
            Request::Suspend { selection, grace_period, reply } => {
                let r = self.suspend(selection, grace_period);
                let _ = reply.send(self.with_exit_status(r));
            }
            Request::Resume { reply } => {
                let r = self.resume();
                let _ = reply.send(self.with_exit_status(r));
            }
            Request::Detach { .. } => unreachable!("handled by run"),
        }
    }

    /// An ioctl's ESRCH only says the target is gone; waitpid has its exit status.
    fn with_exit_status<T>(&mut self, result: Result<T, DebugError>) -> Result<T, DebugError> {
        match result {
            Err(DebugError::TargetExited { pid, code: -1 }) => {
                self.service_tracee();
                Err(DebugError::TargetExited { pid, code: self.tracee.is_gone().unwrap_or(-1) })
            }
            other => other,
        }
    }

    fn check_alive(&mut self) -> Result<(), DebugError> {
        match self.tracee.is_gone() {
            Some(code) => Err(DebugError::TargetExited { pid: self.pid, code }),
            None => Ok(()),
        }
    }

    fn ioctl(&self, op: &'static str, args: &mut DbgTrapArgs) -> Result<i32, DebugError> {
        self.kfd.dbg_trap(args).map_err(|errno| match errno {
            Errno::ESRCH => DebugError::TargetExited { pid: self.pid, code: -1 },
            // §2.1 step 6: SUSPEND/RESUME need runtime_state == ENABLED, else EPERM; the other
            // EPERM is the ptrace-parent check.
            Errno::EPERM if self.runtime_state != runtime_state::ENABLED => {
                DebugError::RuntimeNotEnabled { pid: self.pid }
            }
            Errno::EPERM => DebugError::NotPtraceParent { pid: self.pid },
            errno => DebugError::Ioctl { op, pid: self.pid, errno },
        })
    }

    /// GET_QUEUE_SNAPSHOT, growing the buffer until every queue fits (the kernel reports the
    /// real count and clears `clear_mask` only on the entries it copied, §2.5).
    fn snapshot(&mut self, clear_mask: u64) -> Result<Vec<QueueSnapshotEntry>, DebugError> {
        self.check_alive()?;
        let mut capacity = self.known.len() as u32 + 16;
        loop {
            let mut buf = vec![QueueSnapshotEntry::default(); capacity as usize];
            let mut args = DbgTrapArgs::queue_snapshot(
                self.pid,
                clear_mask,
                buf.as_mut_ptr() as u64,
                capacity,
                size_of::<QueueSnapshotEntry>() as u32,
            );
            self.ioctl("GET_QUEUE_SNAPSHOT", &mut args)?;
            let actual = args.num_queues();
            if actual <= capacity || capacity >= MAX_QUEUES_PER_PROCESS {
                buf.truncate(actual.min(capacity) as usize);
                if clear_mask & QUEUE_NEW != 0 {
                    self.known = buf.iter().map(|e| e.queue_id).collect();
                    self.queues_dirty = false;
                }
                return Ok(buf);
            }
            capacity = actual.min(MAX_QUEUES_PER_PROCESS);
        }
    }

    fn suspend(&mut self, selection: Selection, grace_period: u32) -> Result<Batch, DebugError> {
        self.check_alive()?;
        if self.runtime_was_enabled && self.runtime_state == runtime_state::DISABLED {
            return Err(self.runtime_shut_down());
        }
        let ids = match selection {
            Selection::All => {
                if self.queues_dirty || self.known.is_empty() {
                    self.snapshot(QUEUE_NEW)?;
                }
                self.known.clone()
            }
            Selection::Ids(ids) => ids,
        };
        if ids.is_empty() {
            return Ok(Batch { skipped: true, ..Batch::default() });
        }
        let (mut count, mut outcomes, mut latency) = self.suspend_ids(&ids, grace_period)?;
        // A queue created since the last snapshot still has EC_QUEUE_NEW: clear it and retry once.
        let invalid: Vec<u32> =
            outcomes.iter().filter(|o| o.result() == QueueResult::Invalid).map(|o| o.queue_id.0).collect();
        let mut retried = 0;
        if !invalid.is_empty() {
            self.snapshot(QUEUE_NEW)?;
            let again: Vec<u32> = invalid.into_iter().filter(|id| self.known.contains(id)).collect();
            if !again.is_empty() {
                retried = again.len() as u32;
                let (c, retry_outcomes, l) = self.suspend_ids(&again, grace_period)?;
                count += c;
                latency += l;
                for o in retry_outcomes {
                    if let Some(slot) = outcomes.iter_mut().find(|x| x.queue_id == o.queue_id) {
                        *slot = o;
                    }
                }
            }
        }
        for o in outcomes.iter().filter(|o| o.handled()) {
            if !self.suspended.contains(&o.queue_id.0) {
                self.suspended.push(o.queue_id.0);
            }
        }
        if !self.suspended.is_empty() && self.suspended_at.is_none() {
            self.suspended_at = Some(Instant::now());
            if let (Some(w), Some(max)) = (&self.watchdog, self.max_suspend) {
                w.arm(max); // watchdog wiring
            }
        }
        Ok(Batch { count, outcomes, latency_ns: latency.as_nanos() as u64, retried, skipped: false })
    }

    /// ROCr disables the runtime on its way out; give the process a moment to finish exiting so
    /// the caller learns the real reason (its exit) rather than the intermediate state.
    fn runtime_shut_down(&mut self) -> DebugError {
        let deadline = Instant::now() + Duration::from_millis(500);
        while Instant::now() < deadline {
            self.service_tracee();
            if let Some(code) = self.tracee.is_gone() {
                return DebugError::TargetExited { pid: self.pid, code };
            }
            thread::sleep(Duration::from_millis(10));
        }
        DebugError::RuntimeDisabled { pid: self.pid }
    }

    fn suspend_ids(&self, ids: &[u32], grace_period: u32) -> Result<(i32, Vec<QueueOutcome>, Duration), DebugError> {
        let mut array = ids.to_vec();
        let mut args =
            DbgTrapArgs::suspend_queues(self.pid, 0, array.as_mut_ptr() as u64, array.len() as u32, grace_period);
        let start = Instant::now();
        let count = self.ioctl("SUSPEND_QUEUES", &mut args)?;
        let latency = start.elapsed();
        Ok((count, decode_outcomes(&array), latency))
    }

    fn resume(&mut self) -> Result<Batch, DebugError> {
        self.check_alive()?;
        if self.suspended.is_empty() {
            return Ok(Batch { skipped: true, ..Batch::default() });
        }
        let mut array = self.suspended.clone();
        let mut args = DbgTrapArgs::resume_queues(self.pid, array.as_mut_ptr() as u64, array.len() as u32);
        let start = Instant::now();
        let count = self.ioctl("RESUME_QUEUES", &mut args)?;
        let latency = start.elapsed();
        // Whatever the verdict, nothing we suspended is left suspended: INVALID now means the
        // queue is gone (destroyed or its process exited).
        self.suspended.clear();
        self.suspended_at = None;
        self.watchdog.iter().for_each(|w| w.disarm()); // watchdog wiring
        Ok(Batch {
            count,
            outcomes: decode_outcomes(&array),
            latency_ns: latency.as_nanos() as u64,
            retried: 0,
            skipped: false,
        })
    }

    /// Debug events: QUERY_DEBUG_EVENT until EAGAIN (docs/kfd.md §2.8). Queue events are cleared by
    /// the query itself; EC_PROCESS_RUNTIME is cleared by QUERY_EXCEPTION_INFO and acknowledged
    /// with SEND_RUNTIME_EVENT, which releases the target blocked in runtime enable/disable.
    fn service_events(&mut self) {
        for _ in 0..MAX_QUEUES_PER_PROCESS {
            let mut args = DbgTrapArgs::query_debug_event(self.pid, QUEUE_NEW);
            if self.kfd.dbg_trap(&mut args).is_err() {
                break; // EAGAIN: nothing pending (or the target is gone).
            }
            let status = args.exception_mask();
            if status & QUEUE_NEW != 0 {
                self.queues_dirty = true;
                let _ = self.notices.send(Notice::QueuesAppeared);
            }
            if status & PROCESS_RUNTIME != 0 {
                if !self.acknowledge_runtime() {
                    break;
                }
            } else if status & SUBSCRIBED == 0 {
                break;
            }
        }
    }

    fn acknowledge_runtime(&mut self) -> bool {
        let mut info = RuntimeInfo::default();
        let mut query = DbgTrapArgs::query_exception_info(
            self.pid,
            &raw mut info as u64,
            size_of::<RuntimeInfo>() as u32,
            0,
            exception::EC_PROCESS_RUNTIME,
            true,
        );
        if self.kfd.dbg_trap(&mut query).is_err() {
            return false;
        }
        self.runtime_state = info.runtime_state;
        self.runtime_was_enabled |= info.runtime_state == runtime_state::ENABLED;
        // Runtime disable resumed every queue (§2.6).
        if info.runtime_state == runtime_state::DISABLED {
            self.suspended.clear();
            self.suspended_at = None;
            self.watchdog.iter().for_each(|w| w.disarm()); // watchdog wiring
        }
        let mut ack = DbgTrapArgs::send_runtime_event(self.pid, PROCESS_RUNTIME, 0, 0);
        let _ = self.kfd.dbg_trap(&mut ack);
        let _ = self.notices.send(Notice::RuntimeChanged { runtime_state: info.runtime_state });
        true
    }

    fn service_tracee(&mut self) {
        if self.tracee.is_gone().is_some() {
            return;
        }
        if let TraceeState::Gone(code) = self.tracee.service() {
            // KFD tears the queues down with the process; nothing is left to resume or disable.
            self.suspended.clear();
            self.suspended_at = None;
            self.watchdog.iter().for_each(|w| w.disarm()); // watchdog wiring
            self.enabled = false;
            let _ = self.notices.send(Notice::TargetExited { code });
        }
    }

    fn watchdog(&mut self) {
        let (Some(at), Some(max)) = (self.suspended_at, self.max_suspend) else { return };
        let held = at.elapsed();
        if held < max {
            return;
        }
        let resumed = self.resume().unwrap_or_default();
        let _ = self.notices.send(Notice::WatchdogResumed { held_ms: held.as_millis() as u64, resumed });
    }

    /// Resume, DISABLE (which resumes every queue again, §2.3), PTRACE_DETACH. Idempotent.
    fn cleanup(&mut self) -> Detached {
        let mut report = Detached { signals_forwarded: self.tracee.forwarded, ..Detached::default() };
        if self.enabled {
            self.service_tracee();
        }
        if self.enabled {
            if !self.suspended.is_empty() {
                report.resumed = self.resume().map(|b| b.done()).unwrap_or(0);
            }
            let mut args = DbgTrapArgs::bare(self.pid, dbg_trap_op::DISABLE);
            report.disabled = self.kfd.dbg_trap(&mut args).is_ok();
            self.enabled = false;
        }
        self.tracee.detach();
        report
    }
}

impl Drop for Session {
    /// A panic on the session thread still resumes, disables and detaches.
    fn drop(&mut self) {
        self.cleanup();
    }
}

fn drain(fd: &OwnedFd) {
    let mut buf = [0u8; 256];
    while matches!(read(fd, &mut buf), Ok(n) if n > 0) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_count_verdicts_and_serialise_them_by_id() {
        let b = Batch { count: 2, outcomes: decode_outcomes(&[0, 1 | 1 << 31, 2 | 1 << 30, 3]), ..Batch::default() };
        assert_eq!((b.done(), b.invalid(), b.error()), (2, 1, 1));
        let json = serde_json::to_value(&b).unwrap();
        assert_eq!(json["outcomes"][1], serde_json::json!({"queue_id": 1, "result": "invalid"}));
        assert_eq!(json["outcomes"][2], serde_json::json!({"queue_id": 2, "result": "error"}));
    }

    #[test]
    fn masks_are_the_kernel_bits() {
        assert_eq!(QUEUE_NEW, 1 << 30);
        assert_eq!(PROCESS_RUNTIME, 0x8000_0000_0000);
    }

    #[test]
    fn attaching_to_a_missing_pid_names_it() {
        let err = Debugger::attach(999_999_999, Options::default()).err().unwrap();
        assert_eq!(err.to_string(), "no process with pid 999999999 (see `gpreempt ps` for the KFD processes)");
    }
}
