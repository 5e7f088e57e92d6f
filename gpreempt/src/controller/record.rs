//! The `gpreempt preempt --json` record: one typed document per run, so the file's shape is
//! declared once (docs/guide/preempt.md) rather than assembled field by field at the edge.

use serde::Serialize;

use super::{
    measure::{Iteration, Plan, RunSummary, StopReason},
    vocabulary::{AttachedTarget, Detached, Selection, SessionNotice},
};
use crate::{
    domain::{GpuId, QueueId},
    event::Losses,
    host::select::Selector,
};

/// The plan as the record shows it: the user's hold, gap and watchdog bound in ms.
#[derive(Clone, Debug, Serialize)]
pub struct PlanRecord {
    pub iterations: u32,
    pub hold_ms: u64,
    pub gap_ms: u64,
    pub grace_period: u32,
    pub queues: QueuesRecord,
    pub max_suspend_ms: u64,
}

/// `"all"` or the queue ids asked for.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum QueuesRecord {
    All(&'static str),
    Gpu { gpu_id: GpuId },
    Ids(Vec<QueueId>),
}

impl PlanRecord {
    pub fn of(plan: &Plan, max_suspend_ms: u64) -> Self {
        Self {
            iterations: plan.iterations,
            hold_ms: plan.hold.as_millis() as u64,
            gap_ms: plan.gap.as_millis() as u64,
            grace_period: plan.grace_period,
            queues: match &plan.selection {
                Selection::All => QueuesRecord::All("all"),
                Selection::Gpu(gpu_id) => QueuesRecord::Gpu { gpu_id: *gpu_id },
                Selection::Ids(ids) => QueuesRecord::Ids(ids.clone()),
            },
            max_suspend_ms,
        }
    }
}

/// Version 1: one target (`--offline PID`), its iterations and summary at the top level.
#[derive(Debug, Serialize)]
pub struct RunRecord<'a> {
    pub target: &'a AttachedTarget,
    pub plan: PlanRecord,
    pub iterations: &'a [Iteration],
    pub notices: &'a [SessionNotice],
    pub summary: &'a RunSummary,
    pub detached: &'a Detached,
    pub tracer_losses: Option<&'a Losses>,
}

/// One target of a group run.
#[derive(Debug, Serialize)]
pub struct TargetRecord<'a> {
    pub target: &'a AttachedTarget,
    pub first_iteration: u32,
    /// Attached when it opened `/dev/kfd` during the run.
    pub picked_up: bool,
    pub iterations: &'a [Iteration],
    pub runtime_not_enabled: u32,
    pub notices: &'a [SessionNotice],
    pub summary: RunSummary,
    pub stopped: Option<&'a StopReason>,
    pub detached: Option<&'a Detached>,
}

/// Version 2: several targets (`--offline` with more than one pid, or a container or pod).
#[derive(Debug, Serialize)]
pub struct GroupRecord<'a> {
    pub version: u32,
    pub selectors: &'a [Selector],
    pub plan: PlanRecord,
    pub targets: Vec<TargetRecord<'a>>,
    pub warnings: &'a [String],
    pub cycles: usize,
    pub stopped: Option<&'a StopReason>,
    pub tracer_losses: Option<&'a Losses>,
}

impl GroupRecord<'_> {
    pub const VERSION: u32 = 2;
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_plan_shows_ms_and_the_queues_asked_for() {
        let plan = Plan {
            iterations: 5,
            hold: Duration::from_millis(3),
            gap: Duration::from_millis(0),
            grace_period: 0,
            selection: Selection::Ids(vec![QueueId(1), QueueId(4)]),
        };
        assert_eq!(
            serde_json::to_value(PlanRecord::of(&plan, 2000)).unwrap(),
            serde_json::json!({"iterations": 5, "hold_ms": 3, "gap_ms": 0, "grace_period": 0, "queues": [1, 4],
                "max_suspend_ms": 2000})
        );
        let all = Plan { selection: Selection::All, ..plan };
        assert_eq!(serde_json::to_value(PlanRecord::of(&all, 2000)).unwrap()["queues"], "all");
    }
}
