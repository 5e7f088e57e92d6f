//! What an idle resume costs the online job: the resume itself (on HWS it unmaps the online
//! queues too) plus the next reaction (online work waits behind offline work until the suspend
//! lands). Both are measured on the run, as the medians of the last [`COST_SAMPLES`]: one stalled
//! ioctl does not hold every later gap.

use std::collections::VecDeque;

/// Recent samples a cost is the median of: robust to the odd stalled ioctl (a vCPU or a
/// preempted thread can stretch one sample a hundredfold; an average would then hold the
/// offline job through every gap for the next dozen transitions).
const COST_SAMPLES: usize = 16;

#[derive(Clone, Debug)]
pub(super) struct TransitionCost {
    /// Recent resume ioctls, ns.
    resume: VecDeque<u64>,
    /// Recent reactions (work visible → suspended), ns.
    reaction: VecDeque<u64>,
    /// Until a resume is measured it is taken to cost what a reaction did (the learnt rules;
    /// `--fixed-idle` keeps the previous ones: no cost until both were measured).
    resume_as_reaction: bool,
}

fn push_sample(window: &mut VecDeque<u64>, sample_ns: u64) {
    if window.len() == COST_SAMPLES {
        window.pop_front();
    }
    window.push_back(sample_ns);
}

/// The lower median (no allocation: at most [`COST_SAMPLES`] values, sorted on the stack).
fn median(window: &VecDeque<u64>) -> Option<u64> {
    let mut sorted = [0u64; COST_SAMPLES];
    let n = window.len();
    for (slot, &v) in sorted.iter_mut().zip(window) {
        *slot = v;
    }
    sorted[..n].sort_unstable();
    (n > 0).then(|| sorted[(n - 1) / 2])
}

impl TransitionCost {
    pub(super) fn new(resume_as_reaction: bool) -> Self {
        Self {
            resume: VecDeque::with_capacity(COST_SAMPLES),
            reaction: VecDeque::with_capacity(COST_SAMPLES),
            resume_as_reaction,
        }
    }

    pub(super) fn note_resume(&mut self, ns: u64) {
        push_sample(&mut self.resume, ns);
    }

    pub(super) fn note_reaction(&mut self, ns: u64) {
        push_sample(&mut self.reaction, ns);
    }

    /// What a resume now and the next suspend cost the online job: the medians of the recent
    /// resumes and reactions, ns (None until a reaction was measured). An unmeasured resume is
    /// taken to cost what a reaction did: on HWS both end in one unmap and map of the device's
    /// queues (`execute_queues_cpsch`, kfd_device_queue_manager.c), and the reaction also waited
    /// for detection, so this errs towards holding, the online job's side.
    /// What a suspend costs: the median of the recent reactions (work visible → suspended), ns.
    pub(super) fn suspend_ns(&self) -> Option<u64> {
        median(&self.reaction)
    }

    pub(super) fn ns(&self) -> Option<u64> {
        let reaction = median(&self.reaction)?;
        let resume = median(&self.resume).or(self.resume_as_reaction.then_some(reaction))?;
        Some(resume + reaction)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn one_stalled_transition_does_not_make_every_gap_look_short() {
        // Gaps of 8 ms; resumes of 1 ms and reactions of 1.5 ms, but one reaction stalled for
        // 400 ms (a vCPU or the thread preempted). The median ignores it: every gap resumes.
        let mut c = TransitionCost::new(true);
        for i in 0..20 {
            c.note_resume(MS);
            c.note_reaction(if i == 10 { 400 * MS } else { 3 * MS / 2 });
        }
        assert_eq!(c.ns(), Some(5 * MS / 2));
        assert_eq!(median(&VecDeque::from([5, 1, 3, 2])), Some(2));
        assert_eq!(median(&VecDeque::new()), None);
    }

    #[test]
    fn an_unmeasured_resume_costs_a_reaction_with_the_learnt_rules_only() {
        let (mut learnt, mut fixed) = (TransitionCost::new(true), TransitionCost::new(false));
        assert_eq!((learnt.ns(), fixed.ns()), (None, None));
        learnt.note_reaction(2 * MS);
        fixed.note_reaction(2 * MS);
        assert_eq!((learnt.ns(), fixed.ns()), (Some(4 * MS), None));
        learnt.note_resume(MS);
        fixed.note_resume(MS);
        assert_eq!((learnt.ns(), fixed.ns()), (Some(3 * MS), Some(3 * MS)));
    }
}
