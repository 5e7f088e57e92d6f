//! [`Debugger`]: a [`Session`] run on a thread of its own, for callers that cannot keep the
//! session on their thread (KFD takes debug-trap calls only from the thread that seized the
//! target, so every request is a round trip to that thread).

use std::{
    os::fd::{AsFd, OwnedFd},
    sync::mpsc::{self, Receiver, Sender, TryRecvError},
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use nix::{
    fcntl::OFlag,
    poll::{PollFd, PollFlags, PollTimeout, poll},
    unistd::{pipe2, write},
};

use super::{
    session::Session,
    signal_pipe,
    vocabulary::{AttachedTarget, Batch, DebugError, Detached, Options, Selection, SessionNotice},
};
use crate::{domain::HostPid, kfd::uapi::QueueSnapshotEntry};

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
    notices: Receiver<SessionNotice>,
    wake: OwnedFd,
    thread: Option<JoinHandle<()>>,
    attached: AttachedTarget,
}

impl Debugger {
    /// Check the target, seize it and enable the debug trap, all on a new session thread.
    pub fn attach(pid: HostPid, options: Options) -> Result<Self, DebugError> {
        let (wake_read, wake_write) = pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(DebugError::Pipe)?;
        let (requests, request_rx) = mpsc::channel();
        let (notice_tx, notices) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = thread::Builder::new()
            .name(format!("kfd-debug-{pid}"))
            .spawn(move || match Session::attach(pid, &options) {
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

    pub fn attached(&self) -> &AttachedTarget {
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
    pub fn notices(&self) -> Vec<SessionNotice> {
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
fn serve(mut session: Session, requests: &Receiver<Request>, notices: &Sender<SessionNotice>, wake: OwnedFd) {
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
    fn attaching_to_a_missing_pid_names_it_through_the_thread_too() {
        let err = Debugger::attach(HostPid(999_999_999), Options::default()).err().unwrap();
        assert_eq!(err.to_string(), "no process with pid 999999999 (see `gpreempt ps` for the KFD processes)");
    }
}
