//! The debug session's vocabulary (options, errors, batches, notices) and [`Debugger`], a
//! [`Session`] run on a thread of its own for callers that cannot keep the session on their
//! thread. The session itself — everything that touches the target — is `kfd::session`.

use std::{
    os::fd::{AsFd, OwnedFd},
    path::PathBuf,
    sync::mpsc::{self, Receiver, Sender, TryRecvError},
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use nix::{
    errno::Errno,
    fcntl::OFlag,
    poll::{PollFd, PollFlags, PollTimeout, poll},
    unistd::{pipe2, write},
};
use serde::Serialize;

use super::{
    KfdVersion,
    device::DeviceError,
    session::Session,
    target::{self, TargetError},
    uapi::QueueSnapshotEntry,
};
use crate::{
    domain::{HostPid, QueueId},
    signal_pipe,
};

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
    Watchdog(#[from] super::watchdog::WatchdogError),
    #[error("the debug session thread is gone (it panicked?)")]
    SessionGone,
    #[error("injected fault ({0}) from GPREEMPT_TEST_FAULT")]
    Injected(&'static str),
    #[error("cannot wait on {0} file descriptors at once (at most 64: 3 per session plus the caller's)")]
    TooManyFds(usize),
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
    /// Queues created during a hold of every queue were snapshotted and suspended too.
    QueuesSuspendedMidHold {
        count: u32,
    },
    /// The watchdog resumed queues held longer than `max_suspend`.
    WatchdogResumed {
        held_ms: u64,
        resumed: Batch,
    },
    /// The watchdog's RESUME failed; it tries again after `retry_in_ms` (doubling, at most 1 s).
    WatchdogResumeFailed {
        held_ms: u64,
        error: String,
        retry_in_ms: u64,
    },
    /// A step the session took on its own failed.
    Failed {
        op: &'static str,
        error: String,
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

/// A [`Session`] on a thread of its own, for callers that need a handle they can keep on
/// another thread (each call is a round trip to that thread). Dropping it ends the session.
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
        let (wake_read, wake_write) = pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(DebugError::Pipe)?;
        let (requests, request_rx) = mpsc::channel();
        let (notice_tx, notices) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = thread::Builder::new()
            .name(format!("kfd-debug-{pid}"))
            .spawn(move || match Session::attach(HostPid(pid), &options) {
                Ok(session) => {
                    if ready_tx.send(Ok(session.attached().clone())).is_ok() {
                        serve(session, &request_rx, &notice_tx, wake_read);
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

/// The session thread: wait (servicing the target) until a request is signalled, answer it.
fn serve(mut session: Session, requests: &Receiver<Request>, notices: &Sender<Notice>, wake: OwnedFd) {
    loop {
        if session.wait(Instant::now() + Duration::from_secs(1), &[wake.as_fd()]).is_err() {
            // The target is gone: only requests can wake us now.
            let mut fds = [PollFd::new(wake.as_fd(), PollFlags::POLLIN)];
            let _ = poll(&mut fds, PollTimeout::from(1000u16));
        }
        signal_pipe::drain(&wake);
        for n in session.notices() {
            let _ = notices.send(n);
        }
        loop {
            match requests.try_recv() {
                Ok(Request::Snapshot { clear_new, reply }) => {
                    let _ = reply.send(session.snapshot(clear_new).map(<[QueueSnapshotEntry]>::to_vec));
                }
                Ok(Request::Suspend { selection, grace_period, reply }) => {
                    let _ = reply.send(session.suspend(&selection, grace_period));
                }
                Ok(Request::Resume { reply }) => {
                    let _ = reply.send(session.resume());
                }
                Ok(Request::Detach { reply }) => {
                    for n in session.notices() {
                        let _ = notices.send(n);
                    }
                    let _ = reply.send(session.detach());
                    return;
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return,
            }
        }
        for n in session.notices() {
            let _ = notices.send(n);
        }
    }
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
    fn attaching_to_a_missing_pid_names_it_through_the_thread_too() {
        let err = Debugger::attach(999_999_999, Options::default()).err().unwrap();
        assert_eq!(err.to_string(), "no process with pid 999999999 (see `gpreempt ps` for the KFD processes)");
    }
}
