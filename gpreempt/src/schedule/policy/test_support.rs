//! The policy tests' scripted clocks: machines, observations and drivers shared by the tests of
//! every concern and the trace replays.

use std::time::Duration;

use super::{Action, Observation, PolicyConfig, PolicyMachine};

pub(super) const MS: u64 = 1_000_000;

pub(super) fn policy(idle_ms: u64, max_ms: u64, share: f64) -> PolicyMachine {
    PolicyMachine::new(PolicyConfig {
        idle: Duration::from_millis(idle_ms),
        max_suspend: Duration::from_millis(max_ms),
        min_share: share,
        share_window: Duration::from_millis(100),
        cost_aware: false,
        // The rules these tests pin predate the duty cycle and the learnt threshold; each
        // has its own tests.
        busy_share: 0.0,
        learn_idle: false,
    })
}

pub(super) fn on() -> Observation {
    Observation { online_active: true, online_gone: false, announced: false }
}

pub(super) fn off() -> Observation {
    Observation::default()
}

/// Drive `p` from `from` to `to` (inclusive) in 1 ms polls with `seen`; every action is
/// completed at once. Returns (time ms, action).
pub(super) fn run(p: &mut PolicyMachine, from: u64, to: u64, seen: Observation) -> Vec<(u64, Action)> {
    let mut out = Vec::new();
    for t in from..=to {
        if let Some(a) = p.tick(t * MS, seen) {
            match a {
                Action::Suspend => p.suspended(t * MS, true),
                Action::Resume(_) => p.resumed(t * MS),
                Action::HoldThroughGap(_) => {}
            }
            out.push((t, a));
        }
    }
    out
}

/// 200 µs polls from 0 to `end_us` over an online activity trace (bursts as `[start, end)` in
/// µs, in order and apart): (µs, online work seen).
pub(super) fn polls_over(bursts: &[(u64, u64)], end_us: u64) -> Vec<(u64, bool)> {
    let mut next = 0;
    (0..=end_us)
        .step_by(200)
        .map(|t| {
            // The first burst that has not ended is the only candidate.
            while bursts.get(next).is_some_and(|b| b.1 <= t) {
                next += 1;
            }
            (t, bursts.get(next).is_some_and(|&(s, e)| (s..e).contains(&t)))
        })
        .collect()
}

/// Drive `p` through `polls` (µs, online work seen); every suspend and resume completes within
/// the poll and, with `costs` = (resume, reaction) ns, the machine is told each cost that.
/// Returns the actions with their poll time (µs).
pub(super) fn drive(p: &mut PolicyMachine, polls: &[(u64, bool)], costs: Option<(u64, u64)>) -> Vec<(u64, Action)> {
    let mut out = Vec::new();
    for &(t, active) in polls {
        let now = t * 1_000;
        if let Some(a) = p.tick(now, Observation { online_active: active, online_gone: false, announced: false }) {
            match a {
                Action::Suspend => {
                    p.suspended(now, true);
                    costs.inspect(|&(_, reaction)| p.note_reaction(reaction));
                }
                Action::Resume(_) => {
                    p.resumed(now);
                    costs.inspect(|&(resume, _)| p.note_resume(resume));
                }
                Action::HoldThroughGap(_) => {}
            }
            out.push((t, a));
        }
    }
    out
}

/// Replay an online activity trace through a cost-aware machine (2 ms idle) in 200 µs polls,
/// each resume costing `resume_us` and each reaction `reaction_us`.
pub(super) fn replay(bursts: &[(u64, u64)], end_us: u64, resume_us: u64, reaction_us: u64) -> Vec<(u64, Action)> {
    let mut p = PolicyMachine::new(PolicyConfig { idle: Duration::from_millis(2), ..PolicyConfig::default() });
    drive(&mut p, &polls_over(bursts, end_us), Some((resume_us * 1_000, reaction_us * 1_000)))
}

/// (suspends, resumes, holds through a gap) among `actions`.
pub(super) fn kinds(actions: &[(u64, Action)]) -> (usize, usize, usize) {
    let n = |f: fn(&Action) -> bool| actions.iter().filter(|(_, a)| f(a)).count();
    (n(|a| *a == Action::Suspend), n(|a| matches!(a, Action::Resume(_))), n(|a| matches!(a, Action::HoldThroughGap(_))))
}
