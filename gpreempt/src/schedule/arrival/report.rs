//! What the arrival path did for one online process, as the scheduler's summary reports it
//! (`arrival` in `ScheduleReport`, one entry per online process the probe watched or could not).

use serde::Serialize;

use super::lead::PendingCounts;
use crate::{domain::HostPid, stats::Summary as Stats};

/// The kernel program's counts for one online process (every CPU summed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SegmentCounts {
    /// TCP segments with payload to a watched port.
    pub segments: u64,
    /// Of them: requests by the patterns.
    pub allowed: u64,
    /// Probes and scrapes (a deny pattern matched).
    pub denied: u64,
    /// Neither (a request's later segments, another protocol).
    pub unmatched: u64,
    /// Of the unmatched, TLS records: the first bytes are opaque.
    pub tls: u64,
    /// Requests that found the process armed: one arrival each.
    pub armings: u64,
}

impl From<gpreempt_common::arrival::ArrivalCounts> for SegmentCounts {
    fn from(c: gpreempt_common::arrival::ArrivalCounts) -> Self {
        Self {
            segments: c.segments,
            allowed: c.allowed,
            denied: c.denied,
            unmatched: c.unmatched,
            tls: c.tls,
            armings: c.armings,
        }
    }
}

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
    pub counts: SegmentCounts,
    /// Pending holds: arrivals, and how each ended.
    pub pending: PendingCounts,
    /// Arrival → first GPU work published (doorbell store or moved index), µs, per served or
    /// late request.
    pub lead_us: Option<Stats>,
    /// Arrival → first SUSPEND entering the kernel, µs, for arrivals whose SUSPENDs were issued
    /// at once (cold, or a lead shorter than the transitions' cost).
    pub arrival_to_suspend_us: Option<Stats>,
}
