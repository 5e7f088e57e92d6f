//! The online bursts as the polls see them. A burst is online activity with no gap of the idle
//! threshold or more; it has at most one suspend, and a suspend that failed or was ended by the
//! watchdog is not retried within the same burst (each suspend and resume unmaps every queue of
//! the device on HWS GPUs, the online process's too). Only an offline slice (`share_window.rs`)
//! lets the same burst be suspended again.

use super::Observation;

#[derive(Clone, Debug)]
pub(super) struct Burst {
    /// Last poll that saw online work.
    last_active: Option<u64>,
    /// The previous poll saw no online work.
    was_idle: bool,
    /// This burst already had its suspend.
    served: bool,
}

impl Burst {
    pub(super) fn new() -> Self {
        Self { last_active: None, was_idle: true, served: false }
    }

    /// A poll at `now` that saw online work or not: the gap it ends, when online work is back
    /// after polls that saw none (from the last poll that saw some).
    pub(super) fn poll(&mut self, now: u64, active: bool) -> Option<u64> {
        let ended = if active && self.was_idle { self.last_active.map(|last| now.saturating_sub(last)) } else { None };
        if active {
            self.last_active = Some(now);
        }
        self.was_idle = !active;
        ended
    }

    /// Online idle time at `now` (None before any online work was seen).
    pub(super) fn idle_for(&self, now: u64) -> Option<u64> {
        self.last_active.map(|t| now.saturating_sub(t))
    }

    /// The burst is over once no online work was seen for the threshold, or at once when an
    /// online process exited and no other work is seen: the next online work may have its suspend.
    pub(super) fn end_if_over(&mut self, idle_for: u64, seen: Observation, threshold_ns: u64) {
        if !seen.online_active && (idle_for >= threshold_ns || seen.online_gone) {
            self.served = false;
        }
    }

    pub(super) fn may_suspend(&self) -> bool {
        !self.served
    }

    pub(super) fn serve(&mut self) {
        self.served = true;
    }

    /// An offline slice in a burst that goes on: after it the same burst may be suspended again.
    pub(super) fn allow_another_suspend(&mut self) {
        self.served = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ON: Observation = Observation { online_active: true, online_gone: false, announced: false };
    const OFF: Observation = Observation { online_active: false, online_gone: false, announced: false };

    #[test]
    fn a_gap_ends_at_the_first_poll_that_sees_online_work_again() {
        let mut b = Burst::new();
        // Idle polls before any online work end no gap.
        assert_eq!((b.poll(1, false), b.idle_for(1)), (None, None));
        assert_eq!(b.poll(5, true), None);
        assert_eq!(b.poll(6, true), None);
        assert_eq!(b.poll(8, false), None);
        assert_eq!(b.idle_for(9), Some(3));
        assert_eq!(b.poll(10, true), Some(4));
        assert_eq!(b.poll(11, true), None);
    }

    #[test]
    fn a_burst_has_one_suspend_until_it_ends_or_a_slice_reopens_it() {
        let mut b = Burst::new();
        assert!(b.may_suspend());
        b.serve();
        // Online work still seen, or not for long enough: the same burst.
        b.end_if_over(10, ON, 3);
        b.end_if_over(2, OFF, 3);
        assert!(!b.may_suspend());
        b.end_if_over(3, OFF, 3);
        assert!(b.may_suspend());
        b.serve();
        b.end_if_over(0, Observation { online_active: false, online_gone: true, announced: false }, 3);
        assert!(b.may_suspend());
        b.serve();
        b.allow_another_suspend();
        assert!(b.may_suspend());
    }
}
