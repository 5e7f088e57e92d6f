//! What the session does without being asked: services KFD's debug events (new queues, the
//! target's runtime enabled or disabled), the target's stops and exit, and the in-process
//! watchdog that resumes a hold outliving `max_suspend`.

use std::os::fd::AsFd;

use super::{MAX_QUEUES_PER_PROCESS, PROCESS_RUNTIME, QUEUE_NEW, SUBSCRIBED, Session, TraceeState, signal_pipe};
use crate::{
    controller::vocabulary::{SessionNotice, SessionOp},
    domain::RuntimeState,
    kfd::{dbg_trap, uapi::RuntimeInfo},
};

/// First and longest delay between watchdog RESUME attempts that failed.
const BACKOFF_FIRST_NS: u64 = 10_000_000;
const BACKOFF_MAX_NS: u64 = 1_000_000_000;

/// The watchdog's retry state after a RESUME it issued failed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Backoff {
    pub(super) next_ns: u64,
    pub(super) delay_ns: u64,
}

impl Backoff {
    /// Exponential, bounded: 10 ms, 20 ms, … 1 s.
    fn after_failure(self, now_ns: u64) -> Self {
        let delay_ns = if self.delay_ns == 0 { BACKOFF_FIRST_NS } else { (self.delay_ns * 2).min(BACKOFF_MAX_NS) };
        Self { next_ns: now_ns + delay_ns, delay_ns }
    }
}

impl Session {
    /// Debug events: QUERY_DEBUG_EVENT until EAGAIN (docs/kfd.md §2.8), the event pipe drained
    /// before each query so a byte left after the last one means a later event. Queue events
    /// are cleared by the query; EC_PROCESS_RUNTIME is cleared by QUERY_EXCEPTION_INFO and
    /// acknowledged with SEND_RUNTIME_EVENT, which releases the target blocked in runtime
    /// enable/disable. Whether anything was found.
    pub(super) fn service_events(&mut self) -> bool {
        let mut any = false;
        let mut new_queues = false;
        for _ in 0..MAX_QUEUES_PER_PROCESS {
            signal_pipe::drain(&self.dbg_read);
            let Ok(event) = dbg_trap::query_debug_event(self.kfd.as_fd(), self.pid, QUEUE_NEW) else {
                break; // EAGAIN: nothing pending (or the target is gone).
            };
            let status = event.exceptions;
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
            self.notices.push(SessionNotice::QueuesAppeared);
            if let Some(&(_, grace)) = self.holding.first() {
                self.suspend_late(grace);
            }
        }
        any
    }

    /// Queues created while an `All` or `Gpu` suspend is held: snapshot (clears EC_QUEUE_NEW) and
    /// suspend the new ones a hold covers (on a held GPU) within the same hold.
    fn suspend_late(&mut self, grace_period: u32) {
        let result = self.snapshot_into(QUEUE_NEW).and_then(|()| {
            self.ids.clear();
            for &(id, gpu) in &self.known {
                if self.holds_gpu(gpu) && !self.suspended.contains(&id) {
                    self.ids.push(id.0);
                }
            }
            if self.ids.is_empty() {
                return Ok(0);
            }
            self.refuse_unsafe_gpus()?;
            self.suspend_array(false, grace_period).map(|t| t.done)
        });
        match result {
            Ok(0) => {}
            Ok(n) => {
                self.late_suspended += n;
                self.notices.push(SessionNotice::QueuesSuspendedMidHold { count: n });
            }
            Err(e) => self.notices.push(SessionNotice::Failed { op: SessionOp::SuspendNewQueues, error: e.into() }),
        }
    }

    fn acknowledge_runtime(&mut self) -> bool {
        let mut info = RuntimeInfo::default();
        if dbg_trap::query_runtime(self.kfd.as_fd(), self.pid, &mut info).is_err() {
            return false;
        }
        self.note_runtime(RuntimeState::from_raw(info.runtime_state));
        self.send_runtime_ack();
        true
    }

    pub(super) fn note_runtime(&mut self, state: RuntimeState) {
        self.runtime_state = state;
        self.runtime_was_enabled |= state == RuntimeState::Enabled;
        // Runtime disable resumed every queue (§2.6).
        if state == RuntimeState::Disabled {
            self.forget_suspended();
        }
        self.notices.push(SessionNotice::RuntimeChanged { runtime_state: state });
    }

    /// SEND_RUNTIME_EVENT(EC_PROCESS_RUNTIME): `up(&p->runtime_enable_sema)` in
    /// kfd_dbg_send_exception_to_runtime (6.12 kfd_debug.c), which wakes the target's thread.
    pub(super) fn send_runtime_ack(&self) {
        let _ = dbg_trap::send_runtime_event(self.kfd.as_fd(), self.pid, PROCESS_RUNTIME);
    }

    pub(super) fn service_tracee(&mut self) {
        if self.tracee.is_gone().is_some() {
            return;
        }
        if let TraceeState::Gone(code) = self.tracee.service() {
            // KFD tears the queues down with the process; nothing is left to resume or disable.
            self.forget_suspended();
            self.enabled = false;
            self.notices.push(SessionNotice::TargetExited { code });
        }
    }

    /// When the watchdog is due (CLOCK_MONOTONIC ns), or `None`.
    pub(super) fn watchdog_due_ns(&self) -> Option<u64> {
        let (at, max) = (self.suspended_at_ns?, self.max_suspend_ns?);
        Some(self.backoff.map_or(at + max, |b| b.next_ns))
    }

    /// Resume a hold that outlived `max_suspend`; a failed RESUME is retried with a bounded
    /// exponential backoff and reported. Whether it resumed.
    pub(super) fn watchdog(&mut self, now_ns: u64) -> bool {
        let (Some(due), Some(at)) = (self.watchdog_due_ns(), self.suspended_at_ns) else { return false };
        if now_ns < due {
            return false;
        }
        let held_ms = (now_ns - at) / 1_000_000;
        match self.resume_tally() {
            Ok(t) => {
                let resumed = self.batch(t, false);
                self.watchdog_resume = Some(t);
                self.notices.push(SessionNotice::WatchdogResumed { held_ms, resumed });
                true
            }
            Err(e) => {
                let b = self.backoff.unwrap_or_default().after_failure(now_ns);
                self.backoff = Some(b);
                self.notices.push(SessionNotice::WatchdogResumeFailed {
                    held_ms,
                    error: e.into(),
                    retry_in_ms: b.delay_ns / 1_000_000,
                });
                false
            }
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
}
