//! A KFD debug-trap session on one target process, bound to the thread that created it.
//!
//! KFD checks that the *calling thread* is the ptrace parent of the target's leader (docs/kfd.md
//! §2.1), so everything that touches the target — seize, every `AMDKFD_IOC_DBG_TRAP`, servicing
//! debug events, forwarding the target's signals, detach — happens on the thread that seized it,
//! and so does the caller's timing loop: a hold or a gap is one `ppoll` ([`Session::wait`]) over
//! the debug-event pipe (KFD writes a byte per raised exception, §2.2), a SIGCHLD pipe (the
//! target's stops and exit), and the caller's fds (Ctrl-C, an eventfd), with the watchdog
//! deadline as the timeout. A [`Session`] is therefore not `Send`. One thread may hold several
//! sessions and wait on all of them at once ([`wait_any`]).
//!
//! The per-cycle path ([`Session::suspend_tally`], [`Session::resume_tally`]) allocates nothing:
//! id arrays and snapshot buffers are sized once (`KFD_MAX_NUM_OF_QUEUES_PER_PROCESS`). Cycles
//! with no hold and no gap run in [`Session::back_to_back`], a loop over locals that hands any
//! cycle needing more than the two ioctls to that general path.
//!
//! Every exit path — [`Session::detach`], drop, a panic — resumes what is suspended, acknowledges
//! pending runtime events, disables debugging and detaches; if the whole controller dies
//! (kill -9) the kernel resumes the queues (debugger mm teardown, §2.7).

use std::{
    marker::PhantomData,
    os::fd::{AsRawFd, BorrowedFd, OwnedFd},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use nix::{errno::Errno, fcntl::OFlag, unistd::pipe2};

use super::{
    Device,
    debugger::{Attached, Batch, DebugError, Detached, Notice, Options, Selection},
    target::{self, Target, TargetError},
    tracee::{Tracee, TraceeState},
    uapi::{DbgTrapArgs, QueueSnapshotEntry, RuntimeInfo, dbg_trap_op, decode_outcomes, exception, runtime_state},
    watchdog::Watchdog,
};
use crate::{
    clock::monotonic_ns,
    domain::HostPid,
    signal_pipe::{self, SignalPipe},
};

/// `KFD_EC_MASK(EC_QUEUE_NEW)`: set on every new queue; suspend refuses such queues until a
/// snapshot clears it (docs/kfd.md §2.4).
const QUEUE_NEW: u64 = exception::ec_mask(exception::EC_QUEUE_NEW);
/// `KFD_EC_MASK(EC_PROCESS_RUNTIME)`: the target's runtime was enabled or disabled.
const PROCESS_RUNTIME: u64 = exception::ec_mask(exception::EC_PROCESS_RUNTIME);
/// What the session subscribes to in ENABLE's `exception_mask`.
const SUBSCRIBED: u64 = QUEUE_NEW | PROCESS_RUNTIME;
/// Backstop: a waitpid(WNOHANG) and a look at the event pipe at least this often. The prompt
/// paths are signals: SIGCHLD for the tracee, SIGIO for the event pipe (O_ASYNC), so a loop with
/// no hold and no gap looks at its fds only when one arrived.
const SERVICE_PERIOD_NS: u64 = 1_000_000_000;
/// `KFD_MAX_NUM_OF_QUEUES_PER_PROCESS`: bounds every id array and snapshot buffer.
pub const MAX_QUEUES_PER_PROCESS: usize = 1024;
/// First capacity of the session's id arrays (they grow, rarely, for a process with more
/// queues): small, so the arrays the per-cycle path touches can share a page instead of taking
/// 4 KiB each.
const ID_ARRAY_CAPACITY: usize = 32;
/// The most fds one [`wait_any`] polls (3 per session plus the caller's).
const MAX_POLL_FDS: usize = 64;
/// First and longest delay between watchdog RESUME attempts that failed.
const BACKOFF_FIRST_NS: u64 = 10_000_000;
const BACKOFF_MAX_NS: u64 = 1_000_000_000;
/// Before DISABLE: how long the target must raise nothing, and the longest that is waited for.
const QUIET_NS: u64 = 10_000_000;
const QUIESCE_MAX_NS: u64 = 1_000_000_000;
/// DISABLE rounds spent releasing a runtime event raised just before DISABLE (see `disable`).
const RELEASE_ROUNDS: u32 = 8;

/// What ended a [`Session::wait`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// The deadline passed.
    Deadline,
    /// The caller's fd `extra[i]` is readable (not read: that is the caller's).
    Ready(usize),
    /// A session serviced events (new queues, runtime change): see its notices.
    Target,
    /// The watchdog resumed a session's queues (held longer than `max_suspend`).
    Watchdog,
}

/// One SUSPEND_QUEUES or RESUME_QUEUES (retry included) without its per-queue verdicts, so the
/// per-cycle path allocates nothing; the verdicts are in [`Session::outcomes`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// The ioctl's return value(s): queues suspended/resumed.
    pub count: i32,
    pub done: u32,
    pub invalid: u32,
    pub error: u32,
    /// Ids retried once after a re-snapshot because they came back INVALID.
    pub retried: u32,
    /// Time inside the ioctl(s), ns.
    pub latency_ns: u64,
    /// CLOCK_MONOTONIC just before the (first) ioctl and just after the (last) one.
    pub called_ns: u64,
    pub returned_ns: u64,
    /// No ioctl was needed (nothing to suspend or resume).
    pub skipped: bool,
}

impl Tally {
    /// One ioctl that returned `count` and wrote its verdicts into `array`.
    #[inline(always)]
    fn of_ioctl(count: i32, array: &[u32], called_ns: u64, returned_ns: u64) -> Self {
        let (done, invalid, error) = verdicts(array);
        Self {
            count,
            done,
            invalid,
            error,
            retried: 0,
            latency_ns: returned_ns - called_ns,
            called_ns,
            returned_ns,
            skipped: false,
        }
    }

    #[cold]
    fn skipped(now_ns: u64) -> Self {
        Self { skipped: true, called_ns: now_ns, returned_ns: now_ns, ..Self::default() }
    }
}

/// The most ids [`Session::back_to_back`] keeps in its on-stack arrays; a process with more queues
/// runs every cycle through [`Session::suspend_tally`].
pub const BACK_TO_BACK_MAX_QUEUES: usize = 64;

/// One cycle of [`Session::back_to_back`]: the clock around its two ioctls and what they returned.
/// Every id was suspended (anything else hands the cycle to the general path).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackToBackCycle {
    /// CLOCK_MONOTONIC ns just before and just after each ioctl.
    pub suspend_called_ns: u64,
    pub suspend_returned_ns: u64,
    pub resume_called_ns: u64,
    pub resume_returned_ns: u64,
    /// The ioctls' return values.
    pub suspended: i32,
    pub resumed: i32,
    /// Ids in each call.
    pub queues: u32,
    /// RESUME_QUEUES verdicts other than done (a queue gone since the suspend).
    pub resume_invalid: u32,
    pub resume_error: u32,
}

impl BackToBackCycle {
    /// The cycle as [`Session::suspend_tally`] and [`Session::resume_tally`] would have told it.
    pub fn tallies(&self) -> (Tally, Tally) {
        let suspend = Tally {
            count: self.suspended,
            done: self.queues,
            latency_ns: self.suspend_returned_ns - self.suspend_called_ns,
            called_ns: self.suspend_called_ns,
            returned_ns: self.suspend_returned_ns,
            ..Tally::default()
        };
        let resume = Tally {
            count: self.resumed,
            done: self.queues - self.resume_invalid - self.resume_error,
            invalid: self.resume_invalid,
            error: self.resume_error,
            latency_ns: self.resume_returned_ns - self.resume_called_ns,
            called_ns: self.resume_called_ns,
            returned_ns: self.resume_returned_ns,
            ..Tally::default()
        };
        (suspend, resume)
    }
}

/// How [`Session::back_to_back`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackToBack {
    /// Between two cycles (possibly before the first): the caller's next cycle is its own.
    Between,
    /// After a SUSPEND that needs the general path: the cycle goes on with the caller's hold and
    /// [`Session::resume_held`]; this is the suspend's tally.
    Suspended(Tally),
}

/// Faults injected for the VM tests through `GPREEMPT_TEST_FAULT` (comma separated):
/// `after-suspend` fails the step that follows a successful SUSPEND_QUEUES (as a failed
/// re-snapshot would); `resume=N` fails the next N RESUME_QUEUES with EIO before the ioctl.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Faults {
    after_suspend: bool,
    resume_failures: u32,
}

impl Faults {
    const VAR: &'static str = "GPREEMPT_TEST_FAULT";

    fn parse(spec: &str) -> Self {
        let mut f = Self::default();
        for item in spec.split(',').map(str::trim) {
            match item.split_once('=') {
                None if item == "after-suspend" => f.after_suspend = true,
                Some(("resume", n)) => f.resume_failures = n.parse().unwrap_or(0),
                _ => {}
            }
        }
        f
    }

    fn from_env() -> Self {
        std::env::var(Self::VAR).map(|s| Self::parse(&s)).unwrap_or_default()
    }
}

/// The watchdog's retry state after a RESUME it issued failed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Backoff {
    next_ns: u64,
    delay_ns: u64,
}

impl Backoff {
    /// Exponential, bounded: 10 ms, 20 ms, … 1 s.
    fn after_failure(self, now_ns: u64) -> Self {
        let delay_ns = if self.delay_ns == 0 { BACKOFF_FIRST_NS } else { (self.delay_ns * 2).min(BACKOFF_MAX_NS) };
        Self { next_ns: now_ns + delay_ns, delay_ns }
    }
}

/// A debug session; lives and dies on the thread that attached it.
pub struct Session {
    pid: u32,
    kfd: Device,
    tracee: Tracee,
    dbg_read: OwnedFd,
    /// KFD holds its own reference to the write end (fget at ENABLE); ours keeps the pipe alive
    /// across a re-ENABLE.
    dbg_write: OwnedFd,
    /// SIGCHLD (the tracee stopped, continued or exited) and SIGIO (KFD wrote the event pipe).
    signals: SignalPipe,
    attached: Attached,
    enabled: bool,
    runtime_state: u32,
    /// The runtime was enabled at some point of the session (so DISABLED now means shut down).
    runtime_was_enabled: bool,
    /// Queue ids of the latest clearing snapshot.
    known: Vec<u32>,
    queues_dirty: bool,
    /// Ids the kernel confirmed suspended, recorded as soon as each SUSPEND returns.
    suspended: Vec<u32>,
    suspended_at_ns: Option<u64>,
    /// An `All` suspend is being held with this grace period: queues created meanwhile are
    /// snapshotted and suspended too.
    holding_all: Option<u32>,
    /// Queues suspended that way since the last suspend.
    late_suspended: u32,
    /// Scratch id arrays (the kernel writes verdict bits into them) and the snapshot buffer.
    ids: Vec<u32>,
    retry: Vec<u32>,
    snap: Vec<QueueSnapshotEntry>,
    max_suspend_ns: Option<u64>,
    backoff: Option<Backoff>,
    /// The watchdog's last successful RESUME, until the caller takes it.
    watchdog_resume: Option<Tally>,
    last_service_ns: u64,
    notices: Vec<Notice>,
    faults: Faults,
    /// A separate process that SIGKILLs this one when a suspension outlives `max_suspend` while
    /// this process cannot resume it (stopped, frozen, stuck); armed while `suspended` is not empty.
    watchdog: Option<Watchdog>,
    /// ptrace links and KFD's parent check are per thread.
    _thread_bound: PhantomData<*const ()>,
}

impl Session {
    /// Check the target, seize it and enable the debug trap, on this thread.
    pub fn attach(pid: HostPid, options: &Options) -> Result<Self, DebugError> {
        let pid = pid.0;
        let target = Target::inspect(&options.roots, pid)?;
        target.check_debuggable(&options.roots)?;
        // Forked before the device and the target are touched, so it holds neither.
        let watchdog = options.max_suspend.map(|_| Watchdog::spawn()).transpose()?;
        let kfd = Device::open_path(&options.device)?;
        let version = kfd.version()?;
        if !version.has_debug_trap() {
            return Err(DebugError::NoDebugTrap(version));
        }
        // Before the seize, so no SIGCHLD of the tracee is missed.
        let signals = SignalPipe::new(&[libc::SIGCHLD, libc::SIGIO]).map_err(DebugError::Pipe)?;
        let tracee = Tracee::seize(pid).map_err(|errno| match errno {
            Errno::EPERM => {
                DebugError::PtraceDenied { pid, reason: target::explain_ptrace_denied(&options.roots, &target) }
            }
            Errno::ESRCH => DebugError::Target(TargetError::NoSuchProcess(pid)),
            errno => DebugError::Ptrace { pid, errno },
        })?;
        // The seized pid is still the process inspected above, not a reused pid (its pidfd).
        target.confirm()?;
        // ROCdbgapi's choice: a non-blocking pipe; KFD writes one '.' per raised exception (§2.2).
        let (dbg_read, dbg_write) = pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(DebugError::Pipe)?;
        // SIGIO to this process when KFD writes the pipe (pipe_write's kill_fasync).
        // SAFETY: fcntl on a pipe we own; no pointers.
        unsafe {
            libc::fcntl(dbg_read.as_raw_fd(), libc::F_SETOWN, libc::getpid());
            libc::fcntl(dbg_read.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK | libc::O_ASYNC);
        }
        // On error `tracee` drops here and detaches.
        let info = enable(&kfd, pid, &dbg_write).map_err(|errno| match errno {
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
        Ok(Self {
            pid,
            kfd,
            tracee,
            dbg_read,
            dbg_write,
            signals,
            attached,
            enabled: true,
            runtime_state: info.runtime_state,
            runtime_was_enabled: info.runtime_state == runtime_state::ENABLED,
            known: Vec::with_capacity(ID_ARRAY_CAPACITY),
            queues_dirty: true,
            suspended: Vec::with_capacity(ID_ARRAY_CAPACITY),
            suspended_at_ns: None,
            holding_all: None,
            late_suspended: 0,
            ids: Vec::with_capacity(ID_ARRAY_CAPACITY),
            retry: Vec::with_capacity(ID_ARRAY_CAPACITY),
            snap: Vec::with_capacity(16),
            max_suspend_ns: options.max_suspend.map(|d| d.as_nanos() as u64),
            backoff: None,
            watchdog_resume: None,
            last_service_ns: monotonic_ns(),
            notices: Vec::new(),
            faults: Faults::from_env(),
            watchdog,
            _thread_bound: PhantomData,
        })
    }

    pub fn attached(&self) -> &Attached {
        &self.attached
    }

    pub fn pid(&self) -> HostPid {
        HostPid(self.pid)
    }

    /// Notices since the last call.
    pub fn notices(&mut self) -> Vec<Notice> {
        std::mem::take(&mut self.notices)
    }

    /// Ids currently suspended by this session.
    pub fn suspended(&self) -> &[u32] {
        &self.suspended
    }

    /// Queues suspended mid-hold (created while an `All` suspend was held) since the last suspend.
    #[inline]
    pub fn late_suspended(&self) -> u32 {
        self.late_suspended
    }

    /// End a hold: the watchdog's RESUME if it already fired during the hold (`true`: the hold
    /// outlived `max_suspend`), otherwise [`Session::resume_tally`] now (`false`).
    #[inline(always)]
    pub fn resume_held(&mut self) -> Result<(Tally, bool), DebugError> {
        match self.watchdog_resume.take() {
            Some(t) => Ok((t, true)),
            None => Ok((self.resume_tally()?, false)),
        }
    }

    /// GET_QUEUE_SNAPSHOT. `clear_new` clears EC_QUEUE_NEW on the reported queues, which makes
    /// them suspendable; without it the snapshot changes nothing in the target.
    pub fn snapshot(&mut self, clear_new: bool) -> Result<&[QueueSnapshotEntry], DebugError> {
        self.check_alive()?;
        self.snapshot_into(if clear_new { QUEUE_NEW } else { 0 })?;
        Ok(&self.snap)
    }

    /// SUSPEND_QUEUES (snapshot first for `All`, one retry of INVALID ids after a re-snapshot),
    /// with the per-queue verdicts.
    pub fn suspend(&mut self, selection: &Selection, grace_period: u32) -> Result<Batch, DebugError> {
        let t = self.suspend_tally(selection, grace_period)?;
        Ok(self.batch(t))
    }

    /// RESUME_QUEUES of every queue this session suspended, with the per-queue verdicts.
    pub fn resume(&mut self) -> Result<Batch, DebugError> {
        let t = self.resume_tally()?;
        Ok(self.batch(t))
    }

    /// The raw id array of the last suspend or resume (verdict bits included).
    pub fn outcomes(&self) -> &[u32] {
        &self.ids
    }

    fn batch(&self, t: Tally) -> Batch {
        Batch {
            count: t.count,
            outcomes: if t.skipped { Vec::new() } else { decode_outcomes(&self.ids) },
            latency_ns: t.latency_ns,
            retried: t.retried,
            skipped: t.skipped,
        }
    }

    /// [`Session::suspend`] without allocating. The per-cycle path of a timing loop: inlined into
    /// it whole, with every rare branch (snapshot, retry, failure) out of line, because under
    /// software emulation each call and return on this path is a measurable part of a cycle.
    #[inline(always)]
    pub fn suspend_tally(&mut self, selection: &Selection, grace_period: u32) -> Result<Tally, DebugError> {
        self.check_alive()?;
        if self.runtime_was_enabled && self.runtime_state == runtime_state::DISABLED {
            return Err(self.runtime_shut_down());
        }
        self.late_suspended = 0;
        self.ids.clear();
        match selection {
            Selection::All => {
                if self.queues_dirty || self.known.is_empty() {
                    self.snapshot_into(QUEUE_NEW)?;
                }
                copy_ids(&mut self.ids, &self.known);
            }
            Selection::Ids(ids) => self.ids.extend(ids.iter().take(MAX_QUEUES_PER_PROCESS)),
        }
        if self.ids.is_empty() {
            return Ok(Tally::skipped(monotonic_ns()));
        }
        let t = self.suspend_array(false, grace_period)?;
        self.finish_suspend(t, selection, grace_period)
    }

    /// The end of a suspend whose ids are recorded: an `All` hold picks up queues created
    /// meanwhile; INVALID ids are retried.
    #[inline(always)]
    fn finish_suspend(&mut self, t: Tally, selection: &Selection, grace_period: u32) -> Result<Tally, DebugError> {
        if *selection == Selection::All {
            self.holding_all = Some(grace_period);
        }
        // Everything below may fail: the ids are already in `self.suspended`.
        if self.faults.after_suspend || t.invalid > 0 {
            return self.after_suspend(t, grace_period);
        }
        Ok(t)
    }

    /// Cycles of `selection` with no hold and no gap, as long as nothing needs more than the
    /// two ioctls, appended to `out` (at most `max_cycles`, within `out`'s spare capacity, which
    /// is never grown): per cycle SUSPEND_QUEUES, the watchdog armed, RESUME_QUEUES, the
    /// watchdog disarmed and four clock reads — with the ids, the fd and the flags in locals, so
    /// that the loop reaches no more memory than a program that only issues the two ioctls.
    /// Under software emulation each further page, call level and field load between the two
    /// ioctls measured as a large part of the cycle (BENCHMARKS.md row 5).
    ///
    /// It stops between cycles when `max_cycles` are done, at `until_ns` (CLOCK_MONOTONIC) or when
    /// the backstop look at the target is due (then before any cycle), when `stop` is set or a
    /// signal says the target or KFD has something to service (a signal during a cycle is seen
    /// after it: with no hold there is no suspension a new queue could join), and — without
    /// running a cycle — when the session is in a state only [`Session::suspend_tally`] handles
    /// (a snapshot due, injected faults, something still suspended, more than
    /// [`BACK_TO_BACK_MAX_QUEUES`] ids). A SUSPEND that fails or whose verdicts are not all
    /// "done" hands the cycle over: the session then holds the suspended ids exactly as after
    /// [`Session::suspend_tally`], and the caller goes on with its hold and
    /// [`Session::resume_held`]. A failed RESUME leaves the ids recorded, so the caller's detach
    /// resumes them.
    pub fn back_to_back(
        &mut self,
        selection: &Selection,
        grace_period: u32,
        max_cycles: usize,
        until_ns: u64,
        stop: &AtomicBool,
        out: &mut Vec<BackToBackCycle>,
    ) -> Result<BackToBack, DebugError> {
        let ids: &[u32] = match selection {
            Selection::All => &self.known,
            Selection::Ids(ids) => ids,
        };
        let needs_general_path = self.tracee.is_gone().is_some()
            || (self.runtime_was_enabled && self.runtime_state == runtime_state::DISABLED)
            || self.faults != Faults::default()
            || !self.suspended.is_empty()
            || self.watchdog_resume.is_some()
            || (*selection == Selection::All && self.queues_dirty)
            || ids.is_empty()
            || ids.len() > BACK_TO_BACK_MAX_QUEUES;
        if needs_general_path {
            return Ok(BackToBack::Between);
        }
        let n = ids.len();
        let mut source = [0u32; BACK_TO_BACK_MAX_QUEUES];
        source[..n].copy_from_slice(ids);
        // KFD writes each id's verdict into the array: a fresh copy per call.
        let mut array = [0u32; BACK_TO_BACK_MAX_QUEUES];
        let (pid, kfd) = (self.pid, self.kfd.dbg_trap_fd());
        let arrived = self.signals.flag();
        let watchdog = self.watchdog.as_ref().map(Watchdog::deadline).zip(self.max_suspend_ns);
        // The backstop look at the target is the general path's (its hold or gap polls).
        let until_ns = until_ns.min(self.last_service_ns + SERVICE_PERIOD_NS);
        if monotonic_ns() >= until_ns {
            return Ok(BackToBack::Between);
        }
        // Written through a local pointer, the length set on every way out.
        let (base, start) = (out.as_mut_ptr(), out.len());
        let cycles = max_cycles.min(out.capacity() - start);
        let mut written = 0;
        self.late_suspended = 0;
        while written < cycles {
            // A signal that comes during a cycle waits for this look: with no hold there is no
            // suspension a new queue could join.
            if stop.load(Ordering::Relaxed) | arrived.load(Ordering::Relaxed) {
                break;
            }
            copy_into(&mut array, &source, n);
            let mut args = DbgTrapArgs::suspend_queues(pid, 0, array.as_mut_ptr() as u64, n as u32, grace_period);
            let suspend_called_ns = monotonic_ns();
            let suspended = kfd.call(&mut args);
            let suspend_returned_ns = monotonic_ns();
            if suspended.is_err() || any_failed(&array[..n]) {
                // SAFETY: the first `start + written` elements are initialised.
                unsafe { out.set_len(start + written) };
                return self.hand_over(
                    suspended,
                    &array[..n],
                    suspend_called_ns,
                    suspend_returned_ns,
                    selection,
                    grace_period,
                );
            }
            if let Some((w, max)) = watchdog {
                w.arm_from(suspend_returned_ns, max);
            }
            copy_into(&mut array, &source, n);
            let mut args = DbgTrapArgs::resume_queues(pid, array.as_mut_ptr() as u64, n as u32);
            let resume_called_ns = monotonic_ns();
            let resumed = kfd.call(&mut args);
            let resume_returned_ns = monotonic_ns();
            let resumed = match resumed {
                Ok(count) => count,
                Err(errno) => {
                    // SAFETY: as above.
                    unsafe { out.set_len(start + written) };
                    return Err(self.resume_failed(errno, &source[..n], suspend_returned_ns));
                }
            };
            if let Some((w, _)) = watchdog {
                w.disarm();
            }
            // An id INVALID now is a queue that is gone; the cycle's record says so.
            let (resume_invalid, resume_error) =
                if any_failed(&array[..n]) { resume_failures(&array[..n]) } else { (0, 0) };
            let cycle = BackToBackCycle {
                suspend_called_ns,
                suspend_returned_ns,
                resume_called_ns,
                resume_returned_ns,
                suspended: suspended.unwrap_or_default(),
                resumed,
                queues: n as u32,
                resume_invalid,
                resume_error,
            };
            // SAFETY: `start + written` < `out.capacity()`.
            unsafe { base.add(start + written).write(cycle) };
            written += 1;
            if resume_returned_ns >= until_ns || (resume_invalid | resume_error) != 0 {
                break;
            }
        }
        // SAFETY: the first `start + written` elements are initialised.
        unsafe { out.set_len(start + written) };
        Ok(BackToBack::Between)
    }

    /// A back-to-back SUSPEND that needs the general path, adopted as [`Session::suspend_tally`]
    /// would have recorded it.
    #[cold]
    #[inline(never)]
    fn hand_over(
        &mut self,
        result: Result<i32, Errno>,
        array: &[u32],
        called_ns: u64,
        returned_ns: u64,
        selection: &Selection,
        grace_period: u32,
    ) -> Result<BackToBack, DebugError> {
        copy_ids(&mut self.ids, array);
        let t = self.record_suspend(false, result, called_ns, returned_ns)?;
        self.finish_suspend(t, selection, grace_period).map(BackToBack::Suspended)
    }

    /// A back-to-back RESUME failed: its ids stay suspended, and recorded, for the caller's
    /// detach (or watchdog) to resume.
    #[cold]
    #[inline(never)]
    fn resume_failed(&mut self, errno: Errno, ids: &[u32], suspended_at_ns: u64) -> DebugError {
        copy_ids(&mut self.suspended, ids);
        self.suspended_at_ns = Some(suspended_at_ns);
        self.fail("RESUME_QUEUES", errno)
    }

    /// The rare end of a suspend: an injected fault, or INVALID ids — a queue created since the
    /// last snapshot still has EC_QUEUE_NEW: clear it and retry those ids once.
    #[cold]
    #[inline(never)]
    fn after_suspend(&mut self, mut t: Tally, grace_period: u32) -> Result<Tally, DebugError> {
        if self.faults.after_suspend {
            return Err(DebugError::Injected("after-suspend"));
        }
        self.snapshot_into(QUEUE_NEW)?;
        self.retry.clear();
        for &raw in &self.ids {
            let id = raw & super::uapi::queue_status::ID_MASK;
            if raw & super::uapi::queue_status::INVALID_MASK != 0 && self.known.contains(&id) {
                self.retry.push(id);
            }
        }
        if !self.retry.is_empty() {
            let r = self.suspend_array(true, grace_period)?;
            t.count += r.count;
            t.latency_ns += r.latency_ns;
            t.returned_ns = r.returned_ns;
            t.retried = self.retry.len() as u32;
            // Merge the retry's verdicts into the first array.
            for &raw in &self.retry {
                let id = raw & super::uapi::queue_status::ID_MASK;
                if let Some(slot) = self.ids.iter_mut().find(|x| **x & super::uapi::queue_status::ID_MASK == id) {
                    *slot = raw;
                }
            }
            (t.done, t.invalid, t.error) = verdicts(&self.ids);
        }
        Ok(t)
    }

    /// One SUSPEND_QUEUES of `self.ids` (or `self.retry`); records the handled ids before
    /// returning, so no later failure can lose them.
    #[inline(always)]
    fn suspend_array(&mut self, retry: bool, grace_period: u32) -> Result<Tally, DebugError> {
        let array = if retry { &mut self.retry } else { &mut self.ids };
        let mut args =
            DbgTrapArgs::suspend_queues(self.pid, 0, array.as_mut_ptr() as u64, array.len() as u32, grace_period);
        let called_ns = monotonic_ns();
        let result = self.kfd.dbg_trap(&mut args);
        let returned_ns = monotonic_ns();
        self.record_suspend(retry, result, called_ns, returned_ns)
    }

    /// What a SUSPEND_QUEUES of `self.ids` (or `self.retry`) returned, recorded: the handled ids
    /// into `self.suspended` and the watchdog armed, before anything else can fail.
    #[inline(always)]
    fn record_suspend(
        &mut self,
        retry: bool,
        result: Result<i32, Errno>,
        called_ns: u64,
        returned_ns: u64,
    ) -> Result<Tally, DebugError> {
        let count = result.map_err(|errno| self.fail("SUSPEND_QUEUES", errno))?;
        let array = if retry { &self.retry } else { &self.ids };
        const FAILED: u32 = super::uapi::queue_status::INVALID_MASK | super::uapi::queue_status::ERROR_MASK;
        for &raw in array.iter() {
            if raw & FAILED == 0 && !self.suspended.contains(&raw) {
                self.suspended.push(raw);
            }
        }
        if !self.suspended.is_empty() && self.suspended_at_ns.is_none() {
            self.suspended_at_ns = Some(returned_ns);
            if let (Some(w), Some(max)) = (&self.watchdog, self.max_suspend_ns) {
                // From the stamp just taken: no clock read on the per-cycle path.
                w.arm_from(returned_ns, max);
            }
        }
        Ok(Tally::of_ioctl(count, array, called_ns, returned_ns))
    }

    /// [`Session::resume`] without allocating; inlined like [`Session::suspend_tally`].
    #[inline(always)]
    pub fn resume_tally(&mut self) -> Result<Tally, DebugError> {
        self.check_alive()?;
        if self.suspended.is_empty() {
            self.holding_all = None;
            return Ok(Tally::skipped(monotonic_ns()));
        }
        copy_ids(&mut self.ids, &self.suspended);
        let mut args = DbgTrapArgs::resume_queues(self.pid, self.ids.as_mut_ptr() as u64, self.ids.len() as u32);
        let called_ns = monotonic_ns();
        let result = if self.faults.resume_failures > 0 {
            self.faults.resume_failures -= 1;
            Err(Errno::EIO)
        } else {
            self.kfd.dbg_trap(&mut args)
        };
        let returned_ns = monotonic_ns();
        let count = result.map_err(|errno| self.fail("RESUME_QUEUES", errno))?;
        // Whatever the verdict, nothing we suspended is left suspended: INVALID now means the
        // queue is gone (destroyed or its process exited).
        self.forget_suspended();
        Ok(Tally::of_ioctl(count, &self.ids, called_ns, returned_ns))
    }

    #[inline(always)]
    fn forget_suspended(&mut self) {
        if let Some(w) = &self.watchdog {
            w.disarm();
        }
        self.suspended.clear();
        self.suspended_at_ns = None;
        self.holding_all = None;
        self.backoff = None;
    }

    /// Wait until `deadline`, a readable fd of `extra`, a debug event or the watchdog, servicing
    /// the session meanwhile (one `ppoll`).
    pub fn wait(&mut self, deadline: Instant, extra: &[BorrowedFd<'_>]) -> Result<Wake, DebugError> {
        wait_any(std::slice::from_mut(self), deadline, extra)
    }

    /// The allocation-free form of [`Session::wait`] for a timing loop that already read the
    /// clock: `deadline_ns` and `now_ns` are CLOCK_MONOTONIC. A deadline already passed costs no
    /// system call unless a signal says something happened (or once a second).
    #[inline(always)]
    pub fn wait_ns(&mut self, deadline_ns: u64, now_ns: u64, extra: &[BorrowedFd<'_>]) -> Result<Wake, DebugError> {
        // The zero-length hold or gap of a timing loop, inline: what `wait_ns` would conclude
        // without polling — the deadline passed, no signal arrived, the backstop look is not
        // due, the watchdog is not due.
        if now_ns >= deadline_ns
            && !self.signals.arrived()
            && now_ns < self.last_service_ns + SERVICE_PERIOD_NS
            && self.watchdog_due_ns().is_none_or(|due| now_ns < due)
        {
            return Ok(Wake::Deadline);
        }
        wait_ns(std::slice::from_mut(self), deadline_ns, now_ns, extra)
    }

    #[inline(always)]
    fn check_alive(&self) -> Result<(), DebugError> {
        match self.tracee.is_gone() {
            Some(code) => Err(DebugError::TargetExited { pid: self.pid, code }),
            None => Ok(()),
        }
    }

    /// What a failed ioctl means, after looking at the target: ESRCH is its exit (waitpid has
    /// the status); EPERM is either the runtime no longer enabled (§2.1 step 6: SUSPEND/RESUME
    /// need runtime_state == ENABLED — possibly a RUNTIME_ENABLE(0) whose event is still in the
    /// pipe) or the ptrace-parent check.
    #[cold]
    #[inline(never)]
    fn fail(&mut self, op: &'static str, errno: Errno) -> DebugError {
        match errno {
            Errno::ESRCH => {
                for _ in 0..50 {
                    self.service_tracee();
                    if self.tracee.is_gone().is_some() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                DebugError::TargetExited { pid: self.pid, code: self.tracee.is_gone().unwrap_or(-1) }
            }
            Errno::EPERM => {
                self.service_events();
                if self.runtime_was_enabled && self.runtime_state == runtime_state::DISABLED {
                    self.runtime_shut_down()
                } else if self.runtime_state != runtime_state::ENABLED {
                    DebugError::RuntimeNotEnabled { pid: self.pid }
                } else {
                    DebugError::NotPtraceParent { pid: self.pid }
                }
            }
            errno => DebugError::Ioctl { op, pid: self.pid, errno },
        }
    }

    /// GET_QUEUE_SNAPSHOT into `self.snap`, growing it until every queue fits (the kernel
    /// reports the real count and clears `clear_mask` only on the entries it copied, §2.5).
    #[inline(never)]
    fn snapshot_into(&mut self, clear_mask: u64) -> Result<(), DebugError> {
        let mut capacity = self.snap.capacity().max(self.known.len() + 16).min(MAX_QUEUES_PER_PROCESS);
        loop {
            self.snap.clear();
            self.snap.resize(capacity, QueueSnapshotEntry::default());
            let mut args = DbgTrapArgs::queue_snapshot(
                self.pid,
                clear_mask,
                self.snap.as_mut_ptr() as u64,
                capacity as u32,
                size_of::<QueueSnapshotEntry>() as u32,
            );
            let result = self.kfd.dbg_trap(&mut args);
            result.map_err(|e| self.fail("GET_QUEUE_SNAPSHOT", e))?;
            let actual = args.num_queues() as usize;
            if actual <= capacity || capacity >= MAX_QUEUES_PER_PROCESS {
                self.snap.truncate(actual.min(capacity));
                if clear_mask & QUEUE_NEW != 0 {
                    self.known.clear();
                    self.known.extend(self.snap.iter().map(|e| e.queue_id));
                    self.queues_dirty = false;
                }
                return Ok(());
            }
            capacity = actual.min(MAX_QUEUES_PER_PROCESS);
        }
    }

    /// ROCr disables the runtime on its way out; give the process a moment to finish exiting so
    /// the caller learns the real reason (its exit) rather than the intermediate state.
    #[cold]
    fn runtime_shut_down(&mut self) -> DebugError {
        let deadline = Instant::now() + Duration::from_millis(500);
        while Instant::now() < deadline {
            self.service_tracee();
            if let Some(code) = self.tracee.is_gone() {
                return DebugError::TargetExited { pid: self.pid, code };
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        DebugError::RuntimeDisabled { pid: self.pid }
    }

    /// Debug events: QUERY_DEBUG_EVENT until EAGAIN (docs/kfd.md §2.8), the event pipe drained
    /// before each query so a byte left after the last one means a later event. Queue events
    /// are cleared by the query; EC_PROCESS_RUNTIME is cleared by QUERY_EXCEPTION_INFO and
    /// acknowledged with SEND_RUNTIME_EVENT, which releases the target blocked in runtime
    /// enable/disable. Whether anything was found.
    fn service_events(&mut self) -> bool {
        let mut any = false;
        let mut new_queues = false;
        for _ in 0..MAX_QUEUES_PER_PROCESS {
            signal_pipe::drain(&self.dbg_read);
            let mut args = DbgTrapArgs::query_debug_event(self.pid, QUEUE_NEW);
            if self.kfd.dbg_trap(&mut args).is_err() {
                break; // EAGAIN: nothing pending (or the target is gone).
            }
            let status = args.exception_mask();
            any = true;
            if status & QUEUE_NEW != 0 {
                self.queues_dirty = true;
                new_queues = true;
            }
            if status & PROCESS_RUNTIME != 0 {
                if !self.acknowledge_runtime() {
                    break;
                }
            } else if status & SUBSCRIBED == 0 {
                break;
            }
        }
        if new_queues {
            self.notices.push(Notice::QueuesAppeared);
            if let Some(grace) = self.holding_all {
                self.suspend_late(grace);
            }
        }
        any
    }

    /// Queues created while an `All` suspend is held: snapshot (clears EC_QUEUE_NEW) and suspend
    /// the new ones within the same hold.
    fn suspend_late(&mut self, grace_period: u32) {
        let result = self.snapshot_into(QUEUE_NEW).and_then(|()| {
            self.ids.clear();
            for &id in &self.known {
                if !self.suspended.contains(&id) {
                    self.ids.push(id);
                }
            }
            if self.ids.is_empty() {
                return Ok(0);
            }
            self.suspend_array(false, grace_period).map(|t| t.done)
        });
        match result {
            Ok(0) => {}
            Ok(n) => {
                self.late_suspended += n;
                self.notices.push(Notice::QueuesSuspendedMidHold { count: n });
            }
            Err(e) => self.notices.push(Notice::Failed { op: "suspend new queues", error: e.to_string() }),
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
        self.note_runtime(info.runtime_state);
        self.send_runtime_ack();
        true
    }

    fn note_runtime(&mut self, state: u32) {
        self.runtime_state = state;
        self.runtime_was_enabled |= state == runtime_state::ENABLED;
        // Runtime disable resumed every queue (§2.6).
        if state == runtime_state::DISABLED {
            self.forget_suspended();
        }
        self.notices.push(Notice::RuntimeChanged { runtime_state: state });
    }

    /// SEND_RUNTIME_EVENT(EC_PROCESS_RUNTIME): `up(&p->runtime_enable_sema)` in
    /// kfd_dbg_send_exception_to_runtime (6.12 kfd_debug.c), which wakes the target's thread.
    fn send_runtime_ack(&self) {
        let mut ack = DbgTrapArgs::send_runtime_event(self.pid, PROCESS_RUNTIME, 0, 0);
        let _ = self.kfd.dbg_trap(&mut ack);
    }

    fn service_tracee(&mut self) {
        if self.tracee.is_gone().is_some() {
            return;
        }
        if let TraceeState::Gone(code) = self.tracee.service() {
            // KFD tears the queues down with the process; nothing is left to resume or disable.
            self.forget_suspended();
            self.enabled = false;
            self.notices.push(Notice::TargetExited { code });
        }
    }

    /// When the watchdog is due (CLOCK_MONOTONIC ns), or `None`.
    #[inline(always)]
    fn watchdog_due_ns(&self) -> Option<u64> {
        let (at, max) = (self.suspended_at_ns?, self.max_suspend_ns?);
        Some(self.backoff.map_or(at + max, |b| b.next_ns))
    }

    /// Resume a hold that outlived `max_suspend`; a failed RESUME is retried with a bounded
    /// exponential backoff and reported. Whether it resumed.
    fn watchdog(&mut self, now_ns: u64) -> bool {
        let (Some(due), Some(at)) = (self.watchdog_due_ns(), self.suspended_at_ns) else { return false };
        if now_ns < due {
            return false;
        }
        let held_ms = (now_ns - at) / 1_000_000;
        match self.resume_tally() {
            Ok(t) => {
                let resumed = self.batch(t);
                self.watchdog_resume = Some(t);
                self.notices.push(Notice::WatchdogResumed { held_ms, resumed });
                true
            }
            Err(e) => {
                let b = self.backoff.unwrap_or_default().after_failure(now_ns);
                self.backoff = Some(b);
                self.notices.push(Notice::WatchdogResumeFailed {
                    held_ms,
                    error: e.to_string(),
                    retry_in_ms: b.delay_ns / 1_000_000,
                });
                false
            }
        }
    }

    /// Resume, acknowledge pending runtime events, DISABLE (which resumes every queue again,
    /// §2.3), PTRACE_DETACH. Idempotent.
    fn cleanup(&mut self) -> Detached {
        let mut report = Detached { signals_forwarded: self.tracee.forwarded, ..Detached::default() };
        if self.enabled {
            self.service_tracee();
        }
        if self.enabled {
            if !self.suspended.is_empty() {
                self.faults.resume_failures = 0;
                report.resumed = self.resume_tally().map(|t| t.done as usize).unwrap_or(0);
            }
            report.disabled = self.disable();
            self.enabled = false;
        }
        self.tracee.detach();
        report
    }

    /// DISABLE without leaving a target thread asleep in RUNTIME_ENABLE: KFD raises
    /// EC_PROCESS_RUNTIME and the thread sleeps in `down_interruptible(&p->runtime_enable_sema)`
    /// until SEND_RUNTIME_EVENT, and `kfd_dbg_trap_disable` never ups that semaphore (6.12
    /// kfd_chardev.c `runtime_enable`/`runtime_disable`, kfd_debug.c). So pending events are
    /// acknowledged first, until the target has raised nothing for [`QUIET_NS`] (a thread that
    /// is released makes its next runtime call at once). An event raised between the last query
    /// and DISABLE (both take the target's mutex; the raise writes the event pipe under it)
    /// leaves a byte in the pipe: then re-ENABLE, and if the runtime state moved, acknowledge that
    /// transition, and try again.
    fn disable(&mut self) -> bool {
        let mut disabled = false;
        for _ in 0..RELEASE_ROUNDS {
            self.quiesce();
            let mut args = DbgTrapArgs::bare(self.pid, dbg_trap_op::DISABLE);
            disabled = self.kfd.dbg_trap(&mut args).is_ok();
            if !disabled || !signal_pipe::drain(&self.dbg_read) {
                return disabled;
            }
            let Ok(info) = enable(&self.kfd, self.pid, &self.dbg_write) else { return disabled };
            if info.runtime_state != self.runtime_state {
                self.note_runtime(info.runtime_state);
                self.send_runtime_ack();
            }
        }
        let mut args = DbgTrapArgs::bare(self.pid, dbg_trap_op::DISABLE);
        self.kfd.dbg_trap(&mut args).is_ok() || disabled
    }

    /// Service debug events until none arrives for [`QUIET_NS`] (at most [`QUIESCE_MAX_NS`]).
    fn quiesce(&mut self) {
        let end = monotonic_ns() + QUIESCE_MAX_NS;
        loop {
            self.service_events();
            let mut fd = libc::pollfd { fd: self.dbg_read.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            let ms = (QUIET_NS / 1_000_000) as libc::c_int;
            // SAFETY: one valid pollfd.
            let ready = unsafe { libc::poll(&mut fd, 1, ms) };
            if ready <= 0 || monotonic_ns() >= end {
                self.service_events();
                return;
            }
        }
    }

    /// End the session: resume, DISABLE, PTRACE_DETACH.
    pub fn detach(mut self) -> Detached {
        self.cleanup()
    }
}

impl Drop for Session {
    /// A panic on the session's thread still resumes, disables and detaches.
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// DBG_TRAP ENABLE with our exception mask and event pipe; the runtime info KFD writes back.
fn enable(kfd: &Device, pid: u32, dbg_write: &OwnedFd) -> Result<RuntimeInfo, Errno> {
    let mut info = RuntimeInfo::default();
    let mut args = DbgTrapArgs::enable(
        pid,
        SUBSCRIBED,
        &raw mut info as u64,
        size_of::<RuntimeInfo>() as u32,
        dbg_write.as_raw_fd() as u32,
    );
    kfd.dbg_trap(&mut args)?;
    Ok(info)
}

/// `dst = src` for the id arrays of the per-cycle path, element by element. The volatile writes
/// keep LLVM from turning the loop back into a call to libc's `memcpy` (what `extend_from_slice`
/// compiles to): for the few ids of a process the call costs more than the copy, and under
/// software emulation the two calls per cycle measured about 1.4 µs (a diagnostic build with and
/// without them, interleaved in one boot on the KFD emulator: 6 rounds × 2000 back-to-back
/// cycles, median p50 of the userspace time per cycle 7.4 → 6.0 µs).
#[inline(always)]
fn copy_ids(dst: &mut Vec<u32>, src: &[u32]) {
    dst.clear();
    dst.reserve(src.len());
    let to = dst.as_mut_ptr();
    for (i, &id) in src.iter().enumerate() {
        // SAFETY: `reserve` made room for `src.len()` elements from the start of `dst`.
        unsafe { std::ptr::write_volatile(to.add(i), id) };
    }
    // SAFETY: the first `src.len()` elements were just written.
    unsafe { dst.set_len(src.len()) };
}

/// (done, invalid, error) of an id array the kernel wrote back (docs/kfd.md §2.4).
#[inline(always)]
fn verdicts(array: &[u32]) -> (u32, u32, u32) {
    use super::uapi::queue_status::{ERROR_MASK, INVALID_MASK};
    // Branch-free: every branch ends a translated block under software emulation.
    let (mut invalid, mut error) = (0u32, 0u32);
    for &raw in array {
        let e = u32::from(raw & ERROR_MASK != 0);
        error += e;
        invalid += u32::from(raw & INVALID_MASK != 0) & (e ^ 1);
    }
    (array.len() as u32 - invalid - error, invalid, error)
}

/// `dst[..n] = src[..n]`, element by element with volatile writes: a loop LLVM does not turn into a
/// call to libc's `memcpy` (see [`copy_ids`]).
#[inline(always)]
fn copy_into(dst: &mut [u32; BACK_TO_BACK_MAX_QUEUES], src: &[u32; BACK_TO_BACK_MAX_QUEUES], n: usize) {
    for (to, &id) in dst.iter_mut().zip(src).take(n) {
        // SAFETY: a valid, aligned, exclusive reference.
        unsafe { std::ptr::write_volatile(to, id) };
    }
}

/// Whether any id of an array the kernel wrote back carries INVALID or ERROR (docs/kfd.md §2.4).
#[inline(always)]
fn any_failed(array: &[u32]) -> bool {
    use super::uapi::queue_status::{ERROR_MASK, INVALID_MASK};
    array.iter().fold(0, |all, &raw| all | raw) & (INVALID_MASK | ERROR_MASK) != 0
}

/// (invalid, error) of a RESUME_QUEUES array.
#[cold]
fn resume_failures(array: &[u32]) -> (u32, u32) {
    let (_, invalid, error) = verdicts(array);
    (invalid, error)
}

/// [`Session::wait`] over several sessions held by this thread (the scheduler's offline
/// processes): one `ppoll` over all their fds and `extra`. `Wake::Target`/`Wake::Watchdog` do not
/// say which session: read their notices. A session whose target exited makes every call fail
/// with `DebugError::TargetExited` naming its pid: detach it and wait on the others.
pub fn wait_any(sessions: &mut [Session], deadline: Instant, extra: &[BorrowedFd<'_>]) -> Result<Wake, DebugError> {
    let now_ns = monotonic_ns();
    let left = deadline.saturating_duration_since(Instant::now());
    wait_ns(sessions, now_ns + left.as_nanos() as u64, now_ns, extra)
}

#[inline(never)]
fn wait_ns(
    sessions: &mut [Session],
    deadline_ns: u64,
    mut now_ns: u64,
    extra: &[BorrowedFd<'_>],
) -> Result<Wake, DebugError> {
    let nfds = 3 * sessions.len() + extra.len();
    if nfds > MAX_POLL_FDS {
        return Err(DebugError::TooManyFds(nfds));
    }
    loop {
        let mut woke = None;
        for s in sessions.iter_mut() {
            if s.watchdog(now_ns) {
                woke = Some(Wake::Watchdog);
            }
        }
        if let Some(w) = woke {
            return Ok(w);
        }
        let mut until = deadline_ns;
        let mut due = false;
        for s in sessions.iter() {
            until = until.min(s.watchdog_due_ns().unwrap_or(u64::MAX));
            due |= now_ns >= s.last_service_ns + SERVICE_PERIOD_NS || s.signals.arrived();
        }
        if now_ns >= deadline_ns && !due {
            return Ok(Wake::Deadline);
        }
        let timeout_ns = until.saturating_sub(now_ns).min(SERVICE_PERIOD_NS);
        let mut fds = [libc::pollfd { fd: -1, events: 0, revents: 0 }; MAX_POLL_FDS];
        for (i, s) in sessions.iter().enumerate() {
            fds[3 * i].fd = s.dbg_read.as_raw_fd();
            fds[3 * i + 1].fd = s.signals.fd().as_raw_fd();
            fds[3 * i + 2].fd = -1;
        }
        for (i, fd) in extra.iter().enumerate() {
            fds[3 * sessions.len() + i].fd = fd.as_raw_fd();
        }
        for p in fds.iter_mut().take(nfds) {
            p.events = libc::POLLIN;
        }
        let ts = libc::timespec {
            tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: `fds` holds `nfds` initialised pollfds; ts outlives the call; no sigmask.
        let n = unsafe { libc::ppoll(fds.as_mut_ptr(), nfds as libc::nfds_t, &ts, std::ptr::null()) };
        now_ns = monotonic_ns();
        let mut serviced = false;
        for (i, s) in sessions.iter_mut().enumerate() {
            let (dbg, chld) = (fds[3 * i].revents != 0, fds[3 * i + 1].revents != 0);
            if n > 0 && dbg {
                serviced |= s.service_events();
            }
            // The flag too, not only a readable pipe: a signal between `drain`'s clearing the flag
            // and its read leaves the flag set over an empty pipe, which would keep the
            // back-to-back loop off until the next signal.
            let signalled = (n > 0 && chld) || s.signals.arrived();
            if (signalled && s.signals.drain()) || now_ns >= s.last_service_ns + SERVICE_PERIOD_NS {
                s.service_tracee();
                s.last_service_ns = now_ns;
            }
            s.check_alive()?;
        }
        if n > 0
            && let Some(i) = (0..extra.len()).find(|&i| fds[3 * sessions.len() + i].revents != 0)
        {
            return Ok(Wake::Ready(i));
        }
        if serviced {
            return Ok(Wake::Target);
        }
        if now_ns >= deadline_ns {
            return Ok(Wake::Deadline);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_10_ms_up_to_1_s() {
        let mut b = Backoff::default();
        let mut delays = Vec::new();
        for _ in 0..9 {
            b = b.after_failure(5_000);
            delays.push(b.delay_ns / 1_000_000);
        }
        assert_eq!(delays, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        assert_eq!(b.next_ns, 5_000 + 1_000_000_000);
    }

    #[test]
    fn masks_are_the_kernel_bits() {
        assert_eq!(QUEUE_NEW, 1 << 30);
        assert_eq!(PROCESS_RUNTIME, 0x8000_0000_0000);
    }

    #[test]
    fn faults_parse_from_the_test_variable() {
        assert_eq!(Faults::parse("after-suspend"), Faults { after_suspend: true, resume_failures: 0 });
        assert_eq!(Faults::parse("resume=3, after-suspend"), Faults { after_suspend: true, resume_failures: 3 });
        assert_eq!(Faults::parse(""), Faults::default());
    }

    #[test]
    fn verdicts_count_each_id_once_error_over_invalid() {
        use super::super::uapi::queue_status::{ERROR_MASK, INVALID_MASK};
        assert_eq!(verdicts(&[0, 1 | INVALID_MASK, 2 | ERROR_MASK | INVALID_MASK, 3]), (2, 1, 1));
    }

    #[test]
    fn any_failed_sees_an_invalid_or_error_bit_on_any_id() {
        use super::super::uapi::queue_status::{ERROR_MASK, INVALID_MASK};
        assert!(!any_failed(&[0, 1, 2, 1023]));
        assert!(any_failed(&[0, 1 | INVALID_MASK]));
        assert!(any_failed(&[2 | ERROR_MASK, 3]));
        assert!(!any_failed(&[]));
    }

    #[test]
    fn a_back_to_back_cycle_tells_its_tallies_like_the_general_path() {
        let c = BackToBackCycle {
            suspend_called_ns: 100,
            suspend_returned_ns: 350,
            resume_called_ns: 360,
            resume_returned_ns: 400,
            suspended: 3,
            resumed: 2,
            queues: 3,
            resume_invalid: 1,
            resume_error: 0,
        };
        let (s, r) = c.tallies();
        assert_eq!(
            s,
            Tally { count: 3, done: 3, latency_ns: 250, called_ns: 100, returned_ns: 350, ..Tally::default() }
        );
        assert_eq!(
            r,
            Tally {
                count: 2,
                done: 2,
                invalid: 1,
                latency_ns: 40,
                called_ns: 360,
                returned_ns: 400,
                ..Tally::default()
            }
        );
    }

    #[test]
    fn copy_into_copies_the_first_n_ids_only() {
        let mut dst = [9u32; BACK_TO_BACK_MAX_QUEUES];
        let mut src = [0u32; BACK_TO_BACK_MAX_QUEUES];
        src[..3].copy_from_slice(&[4, 5, 6]);
        copy_into(&mut dst, &src, 2);
        assert_eq!(dst[..3], [4, 5, 9]);
    }

    #[test]
    fn id_copies_replace_the_old_ids_and_grow_past_the_first_capacity() {
        let mut dst = vec![7, 8, 9];
        copy_ids(&mut dst, &[1, 2]);
        assert_eq!(dst, [1, 2]);
        let many: Vec<u32> = (0..MAX_QUEUES_PER_PROCESS as u32).collect();
        let mut grown = Vec::with_capacity(ID_ARRAY_CAPACITY);
        copy_ids(&mut grown, &many);
        assert_eq!(grown, many);
        copy_ids(&mut grown, &[]);
        assert!(grown.is_empty());
    }

    #[test]
    fn attaching_to_a_missing_pid_names_it() {
        let err = Session::attach(HostPid(999_999_999), &Options::default()).err().unwrap();
        assert_eq!(err.to_string(), "no process with pid 999999999 (see `gpreempt ps` for the KFD processes)");
    }
}
