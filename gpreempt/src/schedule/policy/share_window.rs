//! The offline job's share of the GPU: the suspensions on record and the slices they leave it.
//! - **Minimum share** (the trade-off): with `min_share` F > 0 the offline job runs at least
//!   F × `share_window` after a share resume before it can be suspended again, so under
//!   continuous online load it gets about F of the GPU in slices, and the online work waits
//!   behind it during those slices.
//! - **No cliff after the watchdog.** With `busy_share` S > 0, a watchdog resume in a burst that
//!   goes on opens a slice of `max_suspend` × S / (1 − S) for the offline job, after which the
//!   same burst may be suspended again: online work busy for longer than `max_suspend` stays
//!   protected 1 − S of the time instead of running unprotected to the burst's end (S = 0 keeps
//!   the previous rule: no second suspend in the burst).

use std::collections::VecDeque;

use super::{PolicyConfig, ns};

/// The offline job's default share of a long online busy period: after a 5 s watchdog a 263 ms
/// slice, so the online work stays protected 95 % of such a period.
pub const DEFAULT_BUSY_SHARE: f64 = 0.05;

#[derive(Clone, Debug)]
pub(super) struct ShareWindow {
    window_ns: u64,
    min_share: f64,
    /// The watchdog's limit, of which a busy slice is a share.
    max_suspend_ns: u64,
    busy_share: f64,
    /// Start of the current suspension (SUSPEND returned).
    since: Option<u64>,
    /// Closed suspensions (start, end) that may still overlap the window.
    history: VecDeque<(u64, u64)>,
    /// No suspend before this (the end of an offline slice).
    no_suspend_until: u64,
}

impl ShareWindow {
    pub(super) fn new(config: &PolicyConfig) -> Self {
        Self {
            window_ns: ns(config.share_window),
            min_share: config.min_share,
            max_suspend_ns: ns(config.max_suspend),
            busy_share: config.busy_share,
            since: None,
            history: VecDeque::new(),
            no_suspend_until: 0,
        }
    }

    /// A suspension started at `now`.
    pub(super) fn opened(&mut self, now: u64) {
        self.since = Some(now);
    }

    /// The suspension, if any, ended at `now`.
    pub(super) fn closed(&mut self, now: u64) {
        if let Some(start) = self.since.take() {
            self.history.push_back((start, now));
        }
    }

    /// How long the current suspension has lasted at `now` (0 when none is open).
    pub(super) fn suspended_for(&self, now: u64) -> u64 {
        now.saturating_sub(self.since.unwrap_or(now))
    }

    /// Time suspended within the window ending at `now`, in ns.
    pub(super) fn suspended_in_window(&mut self, now: u64) -> u64 {
        let from = now.saturating_sub(self.window_ns);
        while self.history.front().is_some_and(|&(_, end)| end <= from) {
            self.history.pop_front();
        }
        let open = self.since.map(|s| (s, now));
        self.history.iter().copied().chain(open).map(|(s, e)| e.saturating_sub(s.max(from))).sum()
    }

    /// Is the window within its suspended-time budget (a suspension may start or go on)?
    pub(super) fn has_room(&mut self, now: u64) -> bool {
        self.min_share <= 0.0 || self.suspended_in_window(now) <= self.budget_ns()
    }

    /// No offline slice is running at `now`.
    pub(super) fn slice_over(&self, now: u64) -> bool {
        now >= self.no_suspend_until
    }

    /// A watchdog resume at `now`: with a busy share, the offline job's slice before the same
    /// burst may be suspended again (false: none, the burst stays resumed).
    pub(super) fn open_busy_slice(&mut self, now: u64) -> bool {
        if self.busy_share > 0.0 {
            self.no_suspend_until = now + self.busy_slice_ns();
            return true;
        }
        false
    }

    /// A minimum-share resume at `now`: the offline job's slice of the window.
    pub(super) fn open_share_slice(&mut self, now: u64) {
        self.no_suspend_until = now + self.slice_ns();
    }

    /// The offline job's slice after a watchdog resume in a burst that goes on.
    fn busy_slice_ns(&self) -> u64 {
        let share = self.busy_share.clamp(0.0, 0.5);
        (self.max_suspend_ns as f64 * share / (1.0 - share)) as u64
    }

    fn slice_ns(&self) -> u64 {
        (self.min_share * self.window_ns as f64) as u64
    }

    /// Suspended time the window allows.
    fn budget_ns(&self) -> u64 {
        ((1.0 - self.min_share) * self.window_ns as f64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::{
        super::{
            Action, PolicyMachine, ResumeReason,
            test_support::{MS, off, on, policy, run},
        },
        *,
    };

    #[test]
    fn minimum_share_gives_the_offline_job_slices_under_continuous_load() {
        // Window 100 ms, share 0.3: at most 70 ms suspended in any 100 ms, then a 30 ms slice.
        // The budget is exceeded at the first poll past it (1 ms polls here).
        let mut p = policy(3, 10_000, 0.3);
        let actions = run(&mut p, 0, 299, on());
        assert_eq!(
            actions,
            vec![
                (0, Action::Suspend),
                (71, Action::Resume(ResumeReason::MinShare)),
                (101, Action::Suspend),
                (172, Action::Resume(ResumeReason::MinShare)),
                (202, Action::Suspend),
                (273, Action::Resume(ResumeReason::MinShare)),
            ]
        );
        // The last window holds the budget plus one poll of suspension.
        assert_eq!(p.suspended_in_window(300 * MS), 71 * MS);
    }

    #[test]
    fn a_burst_longer_than_the_watchdog_gets_a_duty_cycle_not_a_cliff() {
        // max 20 ms, busy share 0.2: after each watchdog resume a 5 ms slice (20 × 0.2 / 0.8),
        // then the same burst is suspended again.
        let mut p = PolicyMachine::new(PolicyConfig { busy_share: 0.2, ..policy(3, 20, 0.0).config });
        let actions = run(&mut p, 0, 80, on());
        assert_eq!(
            actions,
            vec![
                (0, Action::Suspend),
                (20, Action::Resume(ResumeReason::Watchdog)),
                (25, Action::Suspend),
                (45, Action::Resume(ResumeReason::Watchdog)),
                (50, Action::Suspend),
                (70, Action::Resume(ResumeReason::Watchdog)),
                (75, Action::Suspend),
            ]
        );
        // The end of the burst resumes as before, and the next burst has its suspend at once.
        assert_eq!(run(&mut p, 81, 90, off()), vec![(83, Action::Resume(ResumeReason::Idle))]);
        assert_eq!(run(&mut p, 91, 91, on()), vec![(91, Action::Suspend)]);
        // The default share: a 263 ms slice after the 5 s watchdog.
        let w = ShareWindow::new(&PolicyConfig::default());
        assert_eq!(w.busy_slice_ns(), 263_157_894);
    }

    #[test]
    fn only_the_suspensions_within_the_window_count() {
        let config = PolicyConfig { share_window: std::time::Duration::from_millis(100), ..PolicyConfig::default() };
        let mut w = ShareWindow::new(&config);
        for (start, end) in [(0, 10), (50, 70), (120, 130)] {
            w.opened(start * MS);
            w.closed(end * MS);
        }
        w.opened(190 * MS);
        // Window (100, 200]: 10 ms closed and 10 ms open.
        assert_eq!((w.suspended_in_window(200 * MS), w.suspended_for(200 * MS)), (20 * MS, 10 * MS));
        // Straddling the window's start: only its part inside.
        assert_eq!(w.suspended_in_window(225 * MS), 5 * MS + 35 * MS);
        // Closing twice records one suspension.
        w.closed(230 * MS);
        w.closed(240 * MS);
        assert_eq!((w.suspended_in_window(240 * MS), w.suspended_for(240 * MS)), (40 * MS, 0));
    }
}
