//! What the driver did for the scheduler's suspends and resumes, from the tracer's spans: time
//! in `suspend_queues` / `resume_queues`, split into the HWS unmap (fence wait included), the
//! fence wait itself (the CWSR save) and the remap; and the collateral, the queues of other
//! processes the device-wide unmap preempted (on HWS every suspend and resume runs
//! `execute_queues_cpsch`, which unmaps every dynamic queue of every process on the GPU:
//! docs/kfd.md §2.4).

use std::collections::BTreeSet;

use serde::Serialize;

use crate::{
    domain::HostPid,
    model::spans::{Span, SpanKind},
    stats::Summary as Stats,
};

/// One kind of driver call (suspend or resume), over the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DriverCalls {
    /// Calls seen (one per ioctl per offline process).
    pub count: u64,
    /// Whole call inside the driver, µs.
    pub duration_us: Option<Stats>,
    /// `unmap_queues_cpsch` (or MES remove), fence wait included, µs.
    pub unmap_us: Option<Stats>,
    /// `amdkfd_fence_wait_timeout`: the preemption (CWSR save) latency, µs.
    pub fence_wait_us: Option<Stats>,
    /// `map_queues_cpsch` (or MES add), µs.
    pub remap_us: Option<Stats>,
    /// Queues of other processes the calls preempted.
    pub collateral_queues: u64,
    /// Of those, queues of the online processes.
    pub collateral_online_queues: u64,
}

/// The driver's side of the run (present when the tracer is attached).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct KernelReport {
    pub suspend: DriverCalls,
    pub resume: DriverCalls,
    /// Every process with a queue preempted as collateral, sorted.
    pub collateral_pids: Vec<HostPid>,
}

#[derive(Default)]
struct Samples {
    count: u64,
    duration: Vec<f64>,
    unmap: Vec<f64>,
    fence: Vec<f64>,
    remap: Vec<f64>,
    collateral: u64,
    online: u64,
}

impl Samples {
    fn add(&mut self, span: &Span, online: &BTreeSet<HostPid>) {
        let f = span.driver_figures(|p| online.contains(&p));
        self.count += 1;
        self.duration.push(f.duration_us);
        if let Some(p) = f.phases {
            self.unmap.push(p.unmap_us);
            self.fence.push(p.fence_wait_us);
            self.remap.push(p.remap_us);
        }
        self.collateral += f.collateral_queues as u64;
        self.online += f.collateral_online_queues as u64;
    }

    fn report(&self) -> DriverCalls {
        DriverCalls {
            count: self.count,
            duration_us: Stats::of(&self.duration),
            unmap_us: Stats::of(&self.unmap),
            fence_wait_us: Stats::of(&self.fence),
            remap_us: Stats::of(&self.remap),
            collateral_queues: self.collateral,
            collateral_online_queues: self.online,
        }
    }
}

/// Accumulates the spans of the offline processes' suspends and resumes.
#[derive(Default)]
pub struct KernelBreakdown {
    suspend: Samples,
    resume: Samples,
    pids: BTreeSet<HostPid>,
}

impl KernelBreakdown {
    /// Count `span` if it is a suspend or resume of one of `offline`; `online`: every online
    /// process watched so far (their queues among the collateral are counted apart).
    pub fn add(&mut self, span: &Span, offline: &BTreeSet<HostPid>, online: &BTreeSet<HostPid>) {
        if !span.target_pid.is_some_and(|p| offline.contains(&p)) {
            return;
        }
        match span.kind {
            SpanKind::Suspend => self.suspend.add(span, online),
            SpanKind::Resume => self.resume.add(span, online),
            _ => return,
        }
        self.pids.extend(span.collateral.iter().map(|c| c.pid));
    }

    pub fn report(&self) -> KernelReport {
        KernelReport {
            suspend: self.suspend.report(),
            resume: self.resume.report(),
            collateral_pids: self.pids.iter().copied().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        domain::{GpuId, QueueId},
        model::{registry::Collateral, spans::Breakdown},
    };

    fn span(kind: SpanKind, target: u32, fence_ns: u64, collateral: &[u32]) -> Span {
        Span {
            kind,
            target_pid: Some(HostPid(target)),
            gpu_id: None,
            start_ns: 0,
            end_ns: 10_000,
            duration_ns: 10_000,
            trigger: None,
            queues: vec![QueueId(0)],
            rejected: Vec::new(),
            collateral: collateral
                .iter()
                .map(|&p| Collateral {
                    pid: HostPid(p),
                    queue_id: QueueId(0),
                    context_id: None,
                    gpu_id: Some(GpuId(0x1000)),
                })
                .collect(),
            breakdown: Some(Breakdown {
                unmap_ns: 6_000,
                fence_wait_ns: fence_ns,
                remap_ns: 2_000,
                gpus: vec![GpuId(0x1000)],
            }),
            phases: Vec::new(),
            open: false,
        }
    }

    #[test]
    fn counts_the_offline_calls_and_splits_the_collateral() {
        let offline = BTreeSet::from([HostPid(10)]);
        let online = BTreeSet::from([HostPid(20)]);
        let mut k = KernelBreakdown::default();
        k.add(&span(SpanKind::Suspend, 10, 5_000, &[20, 30]), &offline, &online);
        k.add(&span(SpanKind::Resume, 10, 0, &[20]), &offline, &online);
        // Another debugger's suspend of another process, and an eviction: not ours.
        k.add(&span(SpanKind::Suspend, 11, 5_000, &[20]), &offline, &online);
        k.add(&span(SpanKind::Eviction, 10, 5_000, &[20]), &offline, &online);
        let r = k.report();
        assert_eq!((r.suspend.count, r.resume.count), (1, 1));
        assert_eq!((r.suspend.collateral_queues, r.suspend.collateral_online_queues), (2, 1));
        assert_eq!((r.resume.collateral_queues, r.resume.collateral_online_queues), (1, 1));
        assert_eq!(r.suspend.fence_wait_us.as_ref().map(|s| (s.count, s.p50)), Some((1, 5.0)));
        assert_eq!(r.suspend.unmap_us.as_ref().map(|s| s.p50), Some(6.0));
        assert_eq!(r.resume.remap_us.as_ref().map(|s| s.p50), Some(2.0));
        assert_eq!(r.collateral_pids, vec![HostPid(20), HostPid(30)]);
    }
}
