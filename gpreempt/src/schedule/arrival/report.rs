//! What the arrival path did for one online process, as the scheduler's summary reports it
//! (`arrival` in `ScheduleReport`, one entry per online process the probe watched or could not).

use serde::Serialize;

use gpreempt_common::arrival::ArrivalCounts;

use super::lead::PendingCounts;
use crate::{domain::HostPid, stats::Summary as Stats};

/// One online process's arrival path.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ArrivalReport {
    pub pid: HostPid,
    /// The ports watched at the end (or when it exited).
    pub ports: Vec<u16>,
    /// The cgroup the program was attached to; None when it could not be (see `why`).
    pub cgroup: Option<String>,
    /// Why the arrival path did not watch this process (no cgroup v2, no listening port, …).
    pub why: Option<String>,
    /// The kernel program's counts (every CPU summed).
    pub counts: ArrivalCounts,
    /// Pending holds: arrivals, and how each ended.
    pub pending: PendingCounts,
    /// Arrival → first GPU work published (doorbell store or moved index), µs, per served or
    /// late request.
    pub lead_us: Option<Stats>,
    /// Arrival → first SUSPEND entering the kernel, µs, for arrivals whose SUSPENDs were issued
    /// at once (cold, or a lead shorter than the transitions' cost) and that found the reaction
    /// thread outside the kernel.
    pub arrival_to_suspend_us: Option<Stats>,
    /// Of those, arrival → the reaction thread taking the probe's record, µs: the part of
    /// `arrival_to_suspend_us` spent before gpreempt's own code runs (the ring buffer's wake-up
    /// and the host waking the thread, or the rest of a poll interval); the remainder is the
    /// step up to the SUSPEND.
    pub arrival_to_taken_us: Option<Stats>,
    /// The same for those that arrived while the reaction thread was inside a transition's
    /// ioctls (a RESUME, or another GPU's SUSPEND): each waited for that ioctl to return, which
    /// no thread can cut short (KFD serialises them on its device queue manager's lock).
    pub arrival_to_suspend_in_transition_us: Option<Stats>,
    /// The samples behind `arrival_to_suspend_us`, µs, in arrival order, for a caller in this
    /// process that pools several runs (the harness's p99 over its whole arrival matrix, where
    /// each run has a few dozen). Not in the JSON: the summary above is the run's figure.
    #[serde(skip)]
    pub arrival_to_suspend_samples_us: Vec<f64>,
}
