//! A KFD debug-trap session on one target process, bound to the thread that created it.
//!
//! KFD checks that the *calling thread* is the ptrace parent of the target's leader (docs/kfd.md
//! §2.1), so everything that touches the target — seize, every `AMDKFD_IOC_DBG_TRAP`, servicing
//! debug events, forwarding the target's signals, detach — happens on the thread that seized it,
//! and so does the caller's timing loop. A [`Session`] is therefore not `Send`. By concern:
//! - this file: attach, detach and what every exit path does;
//! - [`cycle`]: SUSPEND_QUEUES and RESUME_QUEUES, the one cycle implementation;
//! - [`service`]: debug events, the target's stops and exit, the in-process watchdog;
//! - [`wait`]: a hold or gap as one `ppoll` over the sessions' fds and the caller's.
//!
//! Every exit path — [`Session::detach`], drop, a panic — resumes what is suspended, acknowledges
//! pending runtime events, disables debugging and detaches; if the whole controller dies
//! (kill -9) the kernel resumes the queues (debugger mm teardown, §2.7).

mod cycle;
mod faults;
mod service;
mod wait;

use std::{
    marker::PhantomData,
    os::fd::{AsFd, AsRawFd, OwnedFd},
    time::{Duration, Instant},
};

use nix::{errno::Errno, fcntl::OFlag, unistd::pipe2};

pub use self::{
    cycle::Tally,
    wait::{FDS_PER_SESSION, MAX_POLL_FDS, Wake, wait_any},
};
use self::{faults::Faults, service::Backoff};
use super::{
    signal_pipe::{self, SignalPipe},
    target::{self, Target, TargetError},
    tracee::{Tracee, TraceeState},
    vocabulary::{AttachedTarget, DebugError, Detached, Options, Selection, SessionNotice},
    watchdog::Watchdog,
};
use crate::{
    clock::monotonic_ns,
    domain::{DebugTrapOp, GpuId, HostPid, QueueId, RuntimeState},
    host::topology::{self, GpuNode},
    kfd::{
        Device, dbg_trap,
        features::{self, Detection, Signs},
        uapi::{QueueSnapshotEntry, RuntimeInfo, exception},
    },
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
/// First capacity of the session's id arrays; they grow, rarely, for a process with more queues.
const ID_ARRAY_CAPACITY: usize = 32;
/// Before DISABLE: how long the target must raise nothing, and the longest that is waited for.
const QUIET_NS: u64 = 10_000_000;
const QUIESCE_MAX_NS: u64 = 1_000_000_000;
/// DISABLE rounds spent releasing a runtime event raised just before DISABLE (see `disable`).
const RELEASE_ROUNDS: u32 = 8;

/// A debug session; lives and dies on the thread that attached it.
pub struct Session {
    pid: HostPid,
    kfd: Device,
    tracee: Tracee,
    dbg_read: OwnedFd,
    /// KFD holds its own reference to the write end (fget at ENABLE); ours keeps the pipe alive
    /// across a re-ENABLE.
    dbg_write: OwnedFd,
    /// SIGCHLD (the tracee stopped, continued or exited) and SIGIO (KFD wrote the event pipe).
    signals: SignalPipe,
    attached: AttachedTarget,
    enabled: bool,
    runtime_state: RuntimeState,
    /// The runtime was enabled at some point of the session (so DISABLED now means shut down).
    runtime_was_enabled: bool,
    /// Queues (id, GPU) of the latest clearing snapshot.
    known: Vec<(QueueId, GpuId)>,
    queues_dirty: bool,
    /// Ids the kernel confirmed suspended, recorded as soon as each SUSPEND returns.
    suspended: Vec<QueueId>,
    /// Ids a SUSPEND came back with ERROR on: the driver reset them (docs/kfd.md §2.4). Gone: never
    /// suspended, retried or resumed again.
    reset: Vec<QueueId>,
    suspended_at_ns: Option<u64>,
    /// The `All` or `Gpu` suspends being held, each with its grace period: queues created
    /// meanwhile (on a held GPU) are snapshotted and suspended too. Several `Gpu` holds of one
    /// target end independently ([`Session::resume_gpu_tally`]).
    holding: Vec<(Selection, u32)>,
    /// Queues suspended that way since the last suspend.
    late_suspended: u32,
    /// Scratch id arrays (raw ids: the kernel writes verdict bits into them) and the snapshot
    /// buffer.
    ids: Vec<u32>,
    retry: Vec<u32>,
    snap: Vec<QueueSnapshotEntry>,
    max_suspend_ns: Option<u64>,
    backoff: Option<Backoff>,
    /// The watchdog's last successful RESUME, until the caller takes it.
    watchdog_resume: Option<Tally>,
    last_service_ns: u64,
    notices: Vec<SessionNotice>,
    /// Faults injected by the VM tests (nothing without the `fault-injection` feature).
    faults: Faults,
    /// A separate process that SIGKILLs this one when a suspension outlives `max_suspend` while
    /// this process cannot resume it (stopped, frozen, stuck); armed while `suspended` is not empty.
    watchdog: Option<Watchdog>,
    /// GPUs whose queues this KFD cannot suspend safely (gfx12 without the expert-scheduling trap
    /// handler): every suspend that would reach a queue on one of them is refused ([`unsafe_gpus`]).
    unsafe_gpus: Vec<GpuId>,
    /// ptrace links and KFD's parent check are per thread.
    _thread_bound: PhantomData<*const ()>,
}

/// The GPUs of `nodes` whose queues the debug trap cannot suspend safely: gfx12 GPUs unless the
/// trap handler supports gfx12's "expert scheduling" mode (upstream KFD 1.20, Linux 7.x; before
/// it, a suspend saves and restores such kernels' waves wrongly, docs/kfd.md §1.4). `expert` is
/// [`features::expert_sched_trap`]: the version is its only sign; not known present is unsafe.
pub fn unsafe_gpus(expert: &Detection, nodes: &[GpuNode]) -> Vec<GpuId> {
    if expert.is_present() {
        return Vec::new();
    }
    nodes.iter().filter(|n| n.is_gfx12()).map(|n| n.gpu_id).collect()
}

impl Session {
    /// Check the target, seize it and enable the debug trap, on this thread.
    pub fn attach(pid: HostPid, options: &Options) -> Result<Self, DebugError> {
        let target = Target::inspect(&options.roots, pid)?;
        target.check_debuggable(&options.roots)?;
        // Forked before the device and the target are touched, so it holds neither.
        let watchdog = options.max_suspend.map(|_| Watchdog::spawn()).transpose()?;
        let kfd = Device::open_path(&options.device)?;
        let version = kfd.version()?;
        if !version.has_debug_trap() {
            return Err(DebugError::NoDebugTrap(version));
        }
        // Secondary KFD contexts (7.0) were refused by `check_debuggable` from sysfs. A topology
        // that cannot be read names no GPU: nothing is refused for it (the GPUs the target's
        // queues are on still come from the snapshot).
        let expert = features::expert_sched_trap(&Signs { version: Some(version), ..Signs::default() });
        let unsafe_gpus = unsafe_gpus(&expert, &topology::gpu_nodes(&options.roots.sys).unwrap_or_default());
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
            errno => DebugError::Ioctl { op: DebugTrapOp::ENABLE, pid, errno },
        })?;
        let attached = AttachedTarget {
            pid,
            comm: target.comm.clone(),
            kfd_version: version,
            runtime_state: RuntimeState::from_raw(info.runtime_state),
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
            runtime_state: RuntimeState::from_raw(info.runtime_state),
            runtime_was_enabled: RuntimeState::from_raw(info.runtime_state) == RuntimeState::Enabled,
            known: Vec::with_capacity(ID_ARRAY_CAPACITY),
            queues_dirty: true,
            suspended: Vec::with_capacity(ID_ARRAY_CAPACITY),
            reset: Vec::new(),
            suspended_at_ns: None,
            holding: Vec::new(),
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
            unsafe_gpus,
            _thread_bound: PhantomData,
        })
    }

    pub fn attached(&self) -> &AttachedTarget {
        &self.attached
    }

    pub fn pid(&self) -> HostPid {
        self.pid
    }

    /// Notices since the last call.
    pub fn notices(&mut self) -> Vec<SessionNotice> {
        std::mem::take(&mut self.notices)
    }

    /// Ids currently suspended by this session.
    pub fn suspended(&self) -> &[QueueId] {
        &self.suspended
    }

    /// The runtime was enabled during the session and is shut down now (ROCr at exit).
    fn runtime_shut(&self) -> bool {
        self.runtime_was_enabled && self.runtime_state == RuntimeState::Disabled
    }

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
    fn fail(&mut self, op: DebugTrapOp, errno: Errno) -> DebugError {
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
                if self.runtime_shut() {
                    self.runtime_shut_down()
                } else if self.runtime_state != RuntimeState::Enabled {
                    DebugError::RuntimeNotEnabled { pid: self.pid }
                } else {
                    DebugError::NotPtraceParent { pid: self.pid }
                }
            }
            errno => DebugError::Ioctl { op, pid: self.pid, errno },
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

    /// Resume, acknowledge pending runtime events, DISABLE (which resumes every queue again,
    /// §2.3), PTRACE_DETACH. Idempotent.
    fn cleanup(&mut self) -> Detached {
        let mut report = Detached { signals_forwarded: self.tracee.forwarded, ..Detached::default() };
        if self.enabled {
            self.service_tracee();
        }
        if self.enabled {
            if !self.suspended.is_empty() {
                self.faults.clear();
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
            disabled = dbg_trap::disable(self.kfd.as_fd(), self.pid).is_ok();
            if !disabled || !signal_pipe::drain(&self.dbg_read) {
                return disabled;
            }
            let Ok(info) = enable(&self.kfd, self.pid, &self.dbg_write) else { return disabled };
            if RuntimeState::from_raw(info.runtime_state) != self.runtime_state {
                self.note_runtime(RuntimeState::from_raw(info.runtime_state));
                self.send_runtime_ack();
            }
        }
        dbg_trap::disable(self.kfd.as_fd(), self.pid).is_ok() || disabled
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
fn enable(kfd: &Device, pid: HostPid, dbg_write: &OwnedFd) -> Result<RuntimeInfo, Errno> {
    let mut info = RuntimeInfo::default();
    dbg_trap::enable(kfd.as_fd(), pid, SUBSCRIBED, &mut info, dbg_write.as_fd())?;
    Ok(info)
}

#[cfg(test)]
mod tests {
    use std::{cell::RefCell, path::Path, rc::Rc};

    use super::*;
    use crate::{
        controller::vocabulary::Selection,
        kfd::KfdVersion,
        kfd::{
            sys::fake,
            uapi::{DbgTrapArgs, dbg_trap_op, queue_status},
        },
    };

    #[test]
    fn masks_are_the_kernel_bits() {
        assert_eq!(QUEUE_NEW, 1 << 30);
        assert_eq!(PROCESS_RUNTIME, 0x8000_0000_0000);
    }

    #[test]
    fn attaching_to_a_missing_pid_names_it() {
        let err = Session::attach(HostPid(999_999_999), &Options::default()).err().unwrap();
        assert_eq!(err.to_string(), "no process with pid 999999999 (see `gpreempt ps` for the KFD processes)");
    }

    /// A session on pid 4242 whose kernel is the test's fake (`kfd::sys::fake`): no ptrace link,
    /// `/dev/null` as the device, the runtime in `runtime`.
    fn fake_session(runtime: RuntimeState) -> Session {
        let (dbg_read, dbg_write) = pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).unwrap();
        let pid = HostPid(4242);
        Session {
            pid,
            kfd: Device::open_path(Path::new("/dev/null")).unwrap(),
            tracee: Tracee::unseized(pid),
            dbg_read,
            dbg_write,
            signals: SignalPipe::new(&[]).unwrap(),
            attached: AttachedTarget {
                pid,
                comm: "fake".into(),
                kfd_version: crate::kfd::KfdVersion { major: 1, minor: 17 },
                runtime_state: runtime,
                r_debug: 0,
            },
            enabled: true,
            runtime_state: runtime,
            runtime_was_enabled: runtime == RuntimeState::Enabled,
            known: Vec::new(),
            queues_dirty: true,
            suspended: Vec::new(),
            reset: Vec::new(),
            suspended_at_ns: None,
            holding: Vec::new(),
            late_suspended: 0,
            ids: Vec::new(),
            retry: Vec::new(),
            snap: Vec::new(),
            max_suspend_ns: None,
            backoff: None,
            watchdog_resume: None,
            last_service_ns: monotonic_ns(),
            notices: Vec::new(),
            faults: Faults::from_env(),
            watchdog: None,
            unsafe_gpus: Vec::new(),
            _thread_bound: PhantomData,
        }
    }

    /// The ops the fake kernel saw, in order, with the ids of each SUSPEND/RESUME.
    type Calls = Rc<RefCell<Vec<(u32, Vec<u32>)>>>;

    /// A kernel whose process has queues `queues`; `answer` may change a call's result.
    fn kernel(
        queues: &'static [u32],
        mut answer: impl FnMut(&mut DbgTrapArgs, &mut [u32]) -> Option<Result<i32, Errno>> + 'static,
    ) -> (fake::Guard, Calls) {
        let calls: Calls = Rc::default();
        let seen = Rc::clone(&calls);
        let guard = fake::install(move |args| {
            let ids: &mut [u32] = match args.op {
                // SAFETY: the call's own id array.
                dbg_trap_op::SUSPEND_QUEUES => unsafe { fake::ids(args.data[1], args.num_queues()) },
                // SAFETY: as above.
                dbg_trap_op::RESUME_QUEUES => unsafe { fake::ids(args.data[0], args.num_queues()) },
                _ => &mut [],
            };
            seen.borrow_mut().push((args.op, ids.iter().map(|&raw| raw & queue_status::ID_MASK).collect()));
            if let Some(r) = answer(args, ids) {
                return r;
            }
            match args.op {
                dbg_trap_op::GET_QUEUE_SNAPSHOT => {
                    // SAFETY: the call's own buffer.
                    let buf = unsafe { fake::snapshot(args.data[1], args.num_queues()) };
                    for (entry, &id) in buf.iter_mut().zip(queues) {
                        entry.queue_id = id;
                    }
                    args.data[2] = (args.data[2] & !0xffff_ffff) | queues.len() as u64;
                    Ok(0)
                }
                dbg_trap_op::SUSPEND_QUEUES | dbg_trap_op::RESUME_QUEUES => Ok(ids.len() as i32),
                // Nothing pending.
                dbg_trap_op::QUERY_DEBUG_EVENT => Err(Errno::EAGAIN),
                _ => Ok(0),
            }
        });
        (guard, calls)
    }

    fn ops(calls: &Calls) -> Vec<u32> {
        calls.borrow().iter().map(|c| c.0).collect()
    }

    use dbg_trap_op::{
        DISABLE, GET_QUEUE_SNAPSHOT as SNAPSHOT, QUERY_DEBUG_EVENT as QUERY, RESUME_QUEUES, SUSPEND_QUEUES,
    };

    #[test]
    fn suspending_all_snapshots_first_and_resume_resumes_exactly_what_was_suspended() {
        let (_k, calls) = kernel(&[0, 1], |_, _| None);
        let mut s = fake_session(RuntimeState::Enabled);
        let t = s.suspend_tally(&Selection::All, 7).unwrap();
        assert_eq!((t.count, t.done, t.invalid, t.error, t.retried, t.skipped), (2, 2, 0, 0, 0, false));
        assert_eq!(s.suspended(), [0, 1].map(QueueId));
        let r = s.resume_tally().unwrap();
        assert_eq!((r.count, r.done), (2, 2));
        assert_eq!(s.suspended(), [] as [QueueId; 0]);
        assert_eq!(ops(&calls), [SNAPSHOT, SUSPEND_QUEUES, RESUME_QUEUES]);
        assert_eq!(calls.borrow()[2].1, [0, 1]);
        // Nothing suspended: no ioctl.
        assert!(s.resume_tally().unwrap().skipped);
        assert_eq!(calls.borrow().len(), 3);
    }

    #[test]
    fn an_id_that_comes_back_invalid_is_retried_once_after_a_re_snapshot() {
        let mut first = true;
        let (_k, calls) = kernel(&[0, 5], move |args, ids| {
            if args.op == SUSPEND_QUEUES && std::mem::take(&mut first) {
                // Queue 5 is new (EC_QUEUE_NEW set): the kernel refuses it this time.
                ids[1] |= queue_status::INVALID_MASK;
                return Some(Ok(1));
            }
            None
        });
        let mut s = fake_session(RuntimeState::Enabled);
        let t = s.suspend_tally(&Selection::Ids(vec![QueueId(0), QueueId(5)]), 0).unwrap();
        assert_eq!((t.count, t.done, t.invalid, t.retried), (2, 2, 0, 1));
        assert_eq!(ops(&calls), [SUSPEND_QUEUES, SNAPSHOT, SUSPEND_QUEUES]);
        assert_eq!(calls.borrow()[2].1, [5]);
        assert_eq!(s.suspended(), [0, 5].map(QueueId));
    }

    #[test]
    fn eperm_is_told_as_the_runtime_not_enabled_or_the_lost_ptrace_link() {
        let (_k, _calls) = kernel(&[0], |args, _| (args.op == SUSPEND_QUEUES).then_some(Err(Errno::EPERM)));
        let mut never = fake_session(RuntimeState::Disabled);
        let err = never.suspend_tally(&Selection::All, 0).unwrap_err();
        assert!(matches!(err, DebugError::RuntimeNotEnabled { pid: HostPid(4242) }), "{err}");
        let mut enabled = fake_session(RuntimeState::Enabled);
        let err = enabled.suspend_tally(&Selection::All, 0).unwrap_err();
        assert!(matches!(err, DebugError::NotPtraceParent { pid: HostPid(4242) }), "{err}");
        let (_k, _calls) = kernel(&[0], |args, _| (args.op == SUSPEND_QUEUES).then_some(Err(Errno::EIO)));
        let err = enabled.suspend_tally(&Selection::All, 0).unwrap_err();
        assert_eq!(err.to_string(), "AMDKFD_IOC_DBG_TRAP SUSPEND_QUEUES on pid 4242 failed: EIO: I/O error");
    }

    #[test]
    fn a_failed_resume_keeps_the_ids_and_detach_resumes_them_then_disables() {
        let mut resumes = 0;
        let (_k, calls) = kernel(&[3, 4], move |args, _| {
            if args.op == RESUME_QUEUES {
                resumes += 1;
                if resumes == 1 {
                    return Some(Err(Errno::EIO));
                }
            }
            None
        });
        let mut s = fake_session(RuntimeState::Enabled);
        s.suspend_tally(&Selection::All, 0).unwrap();
        let err = s.resume_tally().unwrap_err();
        assert!(matches!(err, DebugError::Ioctl { op: DebugTrapOp::RESUME_QUEUES, errno: Errno::EIO, .. }), "{err}");
        assert_eq!(s.suspended(), [3, 4].map(QueueId), "still suspended: detach must resume them");
        let detached = s.detach();
        assert_eq!((detached.resumed, detached.disabled), (2, true));
        let seen = ops(&calls);
        assert_eq!(&seen[..4], [SNAPSHOT, SUSPEND_QUEUES, RESUME_QUEUES, RESUME_QUEUES]);
        assert_eq!(calls.borrow()[3].1, [3, 4]);
        // Pending events looked at before DISABLE, which comes last and once.
        assert!(seen[4..seen.len() - 1].iter().all(|&op| op == QUERY) && seen.len() > 5, "{seen:?}");
        assert_eq!(seen.last(), Some(&DISABLE));
    }

    /// A process with queues on two GPUs: holding one GPU suspends its queues only, and a queue
    /// created during the hold is suspended late only when it is on the held GPU.
    #[test]
    fn a_gpu_hold_suspends_that_gpus_queues_and_those_created_on_it_meanwhile() {
        const A: u32 = 0x1000;
        const B: u32 = 0x2000;
        let queues: Rc<RefCell<Vec<(u32, u32)>>> = Rc::new(RefCell::new(vec![(0, A), (1, B), (2, A)]));
        let new_queue_pending = Rc::new(RefCell::new(false));
        let calls: Calls = Rc::default();
        let (q, pending, seen) = (Rc::clone(&queues), Rc::clone(&new_queue_pending), Rc::clone(&calls));
        let _k = fake::install(move |args: &mut DbgTrapArgs| {
            let ids: &mut [u32] = match args.op {
                // SAFETY: the call's own id array.
                SUSPEND_QUEUES => unsafe { fake::ids(args.data[1], args.num_queues()) },
                // SAFETY: as above.
                RESUME_QUEUES => unsafe { fake::ids(args.data[0], args.num_queues()) },
                _ => &mut [],
            };
            seen.borrow_mut().push((args.op, ids.to_vec()));
            match args.op {
                SNAPSHOT => {
                    // SAFETY: the call's own buffer.
                    let buf = unsafe { fake::snapshot(args.data[1], args.num_queues()) };
                    for (entry, &(id, gpu)) in buf.iter_mut().zip(q.borrow().iter()) {
                        (entry.queue_id, entry.gpu_id) = (id, gpu);
                    }
                    args.data[2] = (args.data[2] & !0xffff_ffff) | q.borrow().len() as u64;
                    Ok(0)
                }
                SUSPEND_QUEUES | RESUME_QUEUES => Ok(ids.len() as i32),
                // One EC_QUEUE_NEW pending after a create, then nothing.
                QUERY if std::mem::take(&mut *pending.borrow_mut()) => {
                    args.data[0] = QUEUE_NEW;
                    Ok(0)
                }
                QUERY => Err(Errno::EAGAIN),
                _ => Ok(0),
            }
        });
        let mut s = fake_session(RuntimeState::Enabled);
        let t = s.suspend_tally(&Selection::Gpu(GpuId(B)), 0).unwrap();
        assert_eq!((t.count, t.done), (1, 1));
        assert_eq!(s.suspended(), [QueueId(1)], "only the queue on GPU B");
        // A queue created on A during B's hold keeps running.
        queues.borrow_mut().push((3, A));
        *new_queue_pending.borrow_mut() = true;
        assert!(s.service_events());
        assert_eq!((s.suspended(), s.late_suspended()), (&[QueueId(1)][..], 0));
        // One created on B is held with it.
        queues.borrow_mut().push((4, B));
        *new_queue_pending.borrow_mut() = true;
        assert!(s.service_events());
        assert_eq!((s.suspended(), s.late_suspended()), (&[1, 4].map(QueueId)[..], 1));
        let r = s.resume_tally().unwrap();
        assert_eq!((r.count, r.done), (2, 2));
        let suspends: Vec<Vec<u32>> =
            calls.borrow().iter().filter(|c| c.0 == SUSPEND_QUEUES).map(|c| c.1.clone()).collect();
        assert_eq!(suspends, [vec![1], vec![4]]);
        // Holding A now takes every queue on A, the one created meanwhile included.
        s.suspend_tally(&Selection::Gpu(GpuId(A)), 0).unwrap();
        assert_eq!(s.suspended(), [0, 2, 3].map(QueueId));
        // A and B held at once end independently: B's resume leaves A's queues suspended.
        s.suspend_tally(&Selection::Gpu(GpuId(B)), 0).unwrap();
        assert_eq!(s.suspended(), [0, 2, 3, 1, 4].map(QueueId));
        let r = s.resume_gpu_tally(GpuId(B)).unwrap();
        assert_eq!((r.count, r.done), (2, 2));
        assert_eq!(s.suspended(), [0, 2, 3].map(QueueId));
        // A queue created on B now runs (B is not held); one on A is held with A.
        queues.borrow_mut().extend([(5, B), (6, A)]);
        *new_queue_pending.borrow_mut() = true;
        assert!(s.service_events());
        assert_eq!(s.suspended(), [0, 2, 3, 6].map(QueueId));
        let r = s.resume_gpu_tally(GpuId(A)).unwrap();
        assert_eq!((r.count, r.done), (4, 4));
        assert!(s.suspended().is_empty());
        let resumes: Vec<Vec<u32>> =
            calls.borrow().iter().filter(|c| c.0 == RESUME_QUEUES).map(|c| c.1.clone()).collect();
        assert_eq!(resumes, [vec![1, 4], vec![1, 4], vec![0, 2, 3, 6]]);
        // Nothing held any more: a resume of either GPU is no ioctl.
        assert!(s.resume_gpu_tally(GpuId(A)).unwrap().skipped);
    }

    /// gfx12 before KFD 1.20: a suspend that would reach a queue on such a GPU is refused before
    /// any SUSPEND_QUEUES, whatever the selection; the other GPU's queues are suspended as usual.
    #[test]
    fn queues_on_a_gfx12_gpu_are_never_suspended_before_kfd_1_20() {
        const A: u32 = 0x1000;
        const B: u32 = 0x2000;
        let queues: &'static [(u32, u32)] = &[(0, A), (1, B)];
        let calls: Calls = Rc::default();
        let seen = Rc::clone(&calls);
        let _k = fake::install(move |args: &mut DbgTrapArgs| {
            let ids: &mut [u32] = match args.op {
                // SAFETY: the call's own id array.
                SUSPEND_QUEUES => unsafe { fake::ids(args.data[1], args.num_queues()) },
                // SAFETY: as above.
                RESUME_QUEUES => unsafe { fake::ids(args.data[0], args.num_queues()) },
                _ => &mut [],
            };
            seen.borrow_mut().push((args.op, ids.to_vec()));
            match args.op {
                SNAPSHOT => {
                    // SAFETY: the call's own buffer.
                    let buf = unsafe { fake::snapshot(args.data[1], args.num_queues()) };
                    for (entry, &(id, gpu)) in buf.iter_mut().zip(queues) {
                        (entry.queue_id, entry.gpu_id) = (id, gpu);
                    }
                    args.data[2] = (args.data[2] & !0xffff_ffff) | queues.len() as u64;
                    Ok(0)
                }
                SUSPEND_QUEUES | RESUME_QUEUES => Ok(ids.len() as i32),
                QUERY => Err(Errno::EAGAIN),
                _ => Ok(0),
            }
        });
        let node = |node, gpu, gfx| GpuNode {
            node,
            gpu_id: GpuId(gpu),
            gfx_target_version: Some(gfx),
            cwsr_size: None,
            ctl_stack_size: None,
            capability: None,
            shape: Default::default(),
            placement: Default::default(),
        };
        let nodes = [node(1, A, 90010), node(2, B, 120001)];
        let v = |minor| KfdVersion { major: 1, minor };
        let expert = |minor| features::expert_sched_trap(&Signs { version: Some(v(minor)), ..Signs::default() });
        assert_eq!(unsafe_gpus(&expert(17), &nodes), [GpuId(B)]);
        assert_eq!(unsafe_gpus(&expert(19), &nodes), [GpuId(B)]);
        assert_eq!(unsafe_gpus(&expert(20), &nodes), [] as [GpuId; 0]);
        assert_eq!(unsafe_gpus(&features::expert_sched_trap(&Signs::default()), &nodes), [GpuId(B)], "unknown");

        let mut s = fake_session(RuntimeState::Enabled);
        s.unsafe_gpus = unsafe_gpus(&expert(17), &nodes);
        for selection in [Selection::All, Selection::Gpu(GpuId(B)), Selection::Ids(vec![QueueId(1)])] {
            let err = s.suspend_tally(&selection, 0).unwrap_err();
            assert!(
                matches!(err, DebugError::ExpertSchedUnsafe { pid: HostPid(4242), gpu: GpuId(B), version } if version == v(17)),
                "{selection:?}: {err}"
            );
        }
        assert!(!ops(&calls).contains(&SUSPEND_QUEUES), "nothing reached the kernel");
        assert_eq!(s.suspended(), [] as [QueueId; 0]);
        let t = s.suspend_tally(&Selection::Gpu(GpuId(A)), 0).unwrap();
        assert_eq!((t.count, t.done), (1, 1));
        assert_eq!(s.suspended(), [QueueId(0)]);
    }

    /// A preemption that timed out: SUSPEND_QUEUES answers with ERROR (bit 30) on queue 1 of
    /// three (the driver reset it, gfx9 per-queue reset). The batch reports it as reset — not an
    /// error, not a retry — the others are held and resumed, a notice names it, and no later
    /// suspend or resume carries its id again.
    #[test]
    fn a_queue_reset_during_suspend_is_gone_and_never_retried() {
        let mut first = true;
        let (_k, calls) = kernel(&[0, 1, 2], move |args, ids| {
            if args.op == SUSPEND_QUEUES && std::mem::take(&mut first) {
                ids[1] |= queue_status::ERROR_MASK | queue_status::INVALID_MASK;
                return Some(Ok(2));
            }
            None
        });
        let mut s = fake_session(RuntimeState::Enabled);
        let b = s.suspend(&Selection::All, 0).unwrap();
        assert_eq!((b.count, b.done(), b.invalid(), b.error(), b.reset(), b.retried), (2, 2, 0, 0, 1, 0));
        assert_eq!(
            serde_json::to_value(&b).unwrap()["outcomes"][1],
            serde_json::json!({"queue_id": 1, "result": "reset"})
        );
        assert_eq!(s.suspended(), [0, 2].map(QueueId));
        assert_eq!(s.reset_queues(), [QueueId(1)]);
        assert_eq!(s.notices(), [SessionNotice::QueuesReset { queues: vec![QueueId(1)] }]);
        let r = s.resume_tally().unwrap();
        assert_eq!((r.count, r.done), (2, 2));
        // The next cycles leave it out: still in the snapshot (KFD keeps a reset queue until its
        // destroy), never in an id array.
        let t = s.suspend_tally(&Selection::All, 0).unwrap();
        assert_eq!((t.count, t.done, t.reset), (2, 2, 0));
        let t = s.suspend_tally(&Selection::Ids(vec![QueueId(1), QueueId(2)]), 0).unwrap();
        assert_eq!((t.count, t.done), (1, 1));
        let arrays: Vec<Vec<u32>> =
            calls.borrow().iter().filter(|c| c.0 != SNAPSHOT && c.0 != QUERY).map(|c| c.1.clone()).collect();
        // The Ids call asked for 1 and 2: 1 was left out (2 is still held, and KFD counts it).
        assert_eq!(arrays, [vec![0, 1, 2], vec![0, 2], vec![0, 2], vec![2]]);
        assert!(s.notices().is_empty(), "one notice per reset queue");
    }

    /// A per-queue reset as 6.12-7.x report it: SUSPEND_QUEUES counts all three queues suspended
    /// and marks none; the tracer then says queue 1 was reset (`set_queue_as_reset`). The session
    /// takes it as gone: out of the held set (RESUME leaves it out), one notice, never in an
    /// array again; told twice, it is news once.
    #[test]
    fn a_queue_reset_the_suspend_reply_did_not_mark_is_gone_once_the_tracer_says_so() {
        let (_k, calls) = kernel(&[0, 1, 2], |_, _| None);
        let mut s = fake_session(RuntimeState::Enabled);
        let b = s.suspend(&Selection::All, 0).unwrap();
        assert_eq!((b.count, b.done(), b.reset()), (3, 3, 0));
        assert!(s.queue_reset(QueueId(1)));
        assert!(!s.queue_reset(QueueId(1)), "already known");
        assert_eq!(s.suspended(), [0, 2].map(QueueId));
        assert_eq!(s.reset_queues(), [QueueId(1)]);
        assert_eq!(s.notices(), [SessionNotice::QueuesReset { queues: vec![QueueId(1)] }]);
        let r = s.resume_tally().unwrap();
        assert_eq!((r.count, r.done), (2, 2));
        let t = s.suspend_tally(&Selection::All, 0).unwrap();
        assert_eq!((t.count, t.done), (2, 2));
        let arrays: Vec<Vec<u32>> =
            calls.borrow().iter().filter(|c| c.0 != SNAPSHOT && c.0 != QUERY).map(|c| c.1.clone()).collect();
        assert_eq!(arrays, [vec![0, 1, 2], vec![0, 2], vec![0, 2]]);
        assert!(s.notices().is_empty());
    }

    /// A kernel that passes -ETIME up from SUSPEND_QUEUES: every id of the call is gone.
    #[test]
    fn etime_from_suspend_resets_every_id_of_the_call() {
        let (_k, _calls) = kernel(&[4, 5], |args, _| (args.op == SUSPEND_QUEUES).then_some(Err(Errno::ETIME)));
        let mut s = fake_session(RuntimeState::Enabled);
        let t = s.suspend_tally(&Selection::All, 0).unwrap();
        assert_eq!((t.count, t.done, t.invalid, t.error, t.reset, t.retried), (0, 0, 0, 0, 2, 0));
        assert_eq!(s.reset_queues(), [4, 5].map(QueueId));
        assert_eq!(s.suspended(), [] as [QueueId; 0]);
        assert!(s.suspend_tally(&Selection::All, 0).unwrap().skipped, "nothing left to suspend");
    }
}
