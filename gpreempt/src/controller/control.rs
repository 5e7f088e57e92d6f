//! What the scheduler needs from a debug-trap session on one offline process, as a trait so the
//! scheduler's logic can be tested with a recording implementation and judged natively against a
//! model GPU. [`Session`] implements it on the scheduler's reaction thread, the thread that
//! attached it (KFD takes a target's debug-trap calls only from its ptrace tracer thread); how a
//! session is attached is the scheduler's seam (`schedule::seams::ControlSide`).

use crate::{
    controller::{
        session::Session,
        vocabulary::{Batch, DRIVER_GRACE_PERIOD, DebugError, Detached, Selection, SessionNotice},
    },
    domain::{GpuId, QueueId},
    kfd::uapi::QueueSnapshotEntry,
};

/// A debug-trap session the scheduler drives: attached once, suspended and resumed many times.
/// Implementations resume what they suspended and disable debugging when detached or dropped.
pub trait Control: Sized {
    /// SUSPEND_QUEUES of `selection` (queues that appeared are picked up by `All`).
    fn suspend(&mut self, selection: &Selection) -> Result<Batch, DebugError>;
    /// RESUME_QUEUES of everything this session suspended.
    fn resume(&mut self) -> Result<Batch, DebugError>;
    /// RESUME_QUEUES of what this session suspended on `gpu` (its holds of other GPUs go on).
    fn resume_gpu(&mut self, gpu: GpuId) -> Result<Batch, DebugError>;
    /// GET_QUEUE_SNAPSHOT without clearing anything in the target.
    fn snapshot(&mut self) -> Result<Vec<QueueSnapshotEntry>, DebugError>;
    /// Notices since the last call (exit, runtime changes, new queues, watchdog resumes);
    /// `now_ns` is CLOCK_MONOTONIC as the caller last read it.
    fn notices(&mut self, now_ns: u64) -> Vec<SessionNotice>;
    /// `comm` of the target as seen at attach.
    fn comm(&self) -> String;
    /// Resume, DISABLE (one runlist refresh), detach.
    fn detach(self) -> Detached;
    /// The driver reset `queue` after it failed a preemption (the tracer saw it; the SUSPEND
    /// reply did not say): gone, never suspended or resumed again. True when it was news. By
    /// default nothing is: a model GPU resets no queue.
    fn queue_reset(&mut self, _queue: QueueId) -> bool {
        false
    }
}

/// The scheduler's thread is the session's thread: attach, suspend, resume and detach are direct
/// ioctls, with no hand-off.
impl Control for Session {
    fn suspend(&mut self, selection: &Selection) -> Result<Batch, DebugError> {
        Session::suspend(self, selection, DRIVER_GRACE_PERIOD)
    }

    fn resume(&mut self) -> Result<Batch, DebugError> {
        Session::resume(self)
    }

    fn resume_gpu(&mut self, gpu: GpuId) -> Result<Batch, DebugError> {
        Session::resume_gpu(self, gpu)
    }

    fn snapshot(&mut self) -> Result<Vec<QueueSnapshotEntry>, DebugError> {
        Session::snapshot(self, false).map(<[QueueSnapshotEntry]>::to_vec)
    }

    /// Services the session first without blocking (a deadline of now: a system call only when
    /// the target signalled, the debug-event pipe was written, or the periodic look is due), so
    /// exits, runtime changes and new queues are seen at the scheduler's step rate; no clock read.
    fn notices(&mut self, now_ns: u64) -> Vec<SessionNotice> {
        let _ = Session::wait_ns(self, now_ns, now_ns, &[]);
        Session::notices(self)
    }

    fn comm(&self) -> String {
        self.attached().comm.clone()
    }

    fn detach(self) -> Detached {
        Session::detach(self)
    }

    fn queue_reset(&mut self, queue: QueueId) -> bool {
        Session::queue_reset(self, queue)
    }
}
