//! Timed spans from the event stream: eviction → restore per (pid, gpu), and each debugger
//! suspend/resume with its HWS breakdown and the queues it preempted, including other
//! processes' queues (collateral: on HWS GPUs the unmap is device-wide, docs/kfd.md §2.4).
//!
//! The nested HWS calls (`execute_queues_cpsch`, `unmap_queues_cpsch`,
//! `amdkfd_fence_wait_timeout`, `map_queues_cpsch`, `pm_send_runlist`, MES) run on the thread
//! that called `suspend_queues`/`resume_queues` and return before it, so their records arrive
//! first: they are kept per thread and claimed by the enclosing call whose time range holds them.
//!
//! Memory stays bounded for a tracer that runs for weeks: at most [`NESTED_KEEP`] unclaimed calls
//! per thread and [`NESTED_THREADS`] threads, the latest [`SAMPLES_KEEP`] latency samples per
//! series, and per-process eviction statistics only while the model keeps the process.

use std::collections::{BTreeMap, HashMap, VecDeque};

use gpreempt_common::record::KfdFn;
use serde::Serialize;

use super::registry::{Collateral, Registry};
use crate::{
    domain::{EvictionTrigger, GpuId, HostPid, QueueId},
    event::{Event, EventKind, KernelResult},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanKind {
    Eviction,
    Suspend,
    Resume,
}

/// A nested HWS/MES call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Phase {
    /// Kernel function name, for output.
    pub function: &'static str,
    /// The probed function, for comparisons.
    #[serde(skip)]
    pub kfd_fn: KfdFn,
    pub gpu_id: Option<GpuId>,
    pub start_ns: u64,
    pub end_ns: u64,
    pub result: KernelResult,
}

impl Phase {
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// Where a suspend/resume spent its time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Breakdown {
    /// `unmap_queues_cpsch` (includes the fence wait) or MES remove.
    pub unmap_ns: u64,
    /// `amdkfd_fence_wait_timeout`: the preemption (CWSR save) latency.
    pub fence_wait_ns: u64,
    /// `map_queues_cpsch` (runlist submission) or MES add.
    pub remap_ns: u64,
    /// GPUs the nested calls touched.
    pub gpus: Vec<GpuId>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Span {
    /// JSON: `"span": "suspend"`.
    #[serde(rename = "span")]
    pub kind: SpanKind,
    pub target_pid: Option<HostPid>,
    /// Eviction: the GPU (when known).
    pub gpu_id: Option<GpuId>,
    pub start_ns: u64,
    pub end_ns: u64,
    pub duration_ns: u64,
    /// Eviction trigger (`ttm`, `svm`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trigger: Option<EvictionTrigger>,
    /// Suspend/resume: the target's queue ids the kernel handled.
    pub queues: Vec<QueueId>,
    /// Suspend/resume: ids that came back INVALID or ERROR.
    pub rejected: Vec<QueueId>,
    pub collateral: Vec<Collateral>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breakdown: Option<Breakdown>,
    pub phases: Vec<Phase>,
    /// Eviction still open when the trace ended.
    pub open: bool,
}

/// One suspend or resume as the driver ran it, in µs: the one conversion of a span into the
/// figures `preempt` (per iteration) and `schedule` (over the run) report.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DriverFigures {
    /// The whole call inside the driver.
    pub duration_us: f64,
    /// Its HWS phases, when the nested calls were traced.
    pub phases: Option<PhaseFigures>,
    /// GPUs the nested calls touched.
    pub gpus: Vec<GpuId>,
    /// Queues of other processes the device-wide unmap preempted.
    pub collateral_queues: usize,
    /// Of those, the online processes' queues.
    pub collateral_online_queues: usize,
    /// The processes those queues belong to, sorted, once each.
    pub collateral_pids: Vec<HostPid>,
}

/// The HWS phases of one call, µs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PhaseFigures {
    /// `unmap_queues_cpsch` (or MES remove), fence wait included.
    pub unmap_us: f64,
    /// `amdkfd_fence_wait_timeout`: the preemption (CWSR save) latency.
    pub fence_wait_us: f64,
    /// `map_queues_cpsch` (or MES add).
    pub remap_us: f64,
}

impl Span {
    /// The driver's figures of this span; `online` tells the online processes' queues apart
    /// among the collateral.
    pub fn driver_figures(&self, online: impl Fn(HostPid) -> bool) -> DriverFigures {
        let us = |ns: u64| ns as f64 / 1e3;
        let mut pids: Vec<HostPid> = self.collateral.iter().map(|c| c.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        DriverFigures {
            duration_us: us(self.duration_ns),
            phases: self.breakdown.as_ref().map(|b| PhaseFigures {
                unmap_us: us(b.unmap_ns),
                fence_wait_us: us(b.fence_wait_ns),
                remap_us: us(b.remap_ns),
            }),
            gpus: self.breakdown.as_ref().map(|b| b.gpus.clone()).unwrap_or_default(),
            collateral_queues: self.collateral.len(),
            collateral_online_queues: self.collateral.iter().filter(|c| online(c.pid)).count(),
            collateral_pids: pids,
        }
    }
}

/// Latency distribution (nearest-rank percentiles).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Latency {
    pub count: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
}

impl Latency {
    pub fn of(samples: &[u64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        let mut s = samples.to_vec();
        s.sort_unstable();
        let rank = |p: f64| s[crate::stats::nearest_rank(s.len(), p)];
        Self {
            count: s.len() as u64,
            p50_ns: rank(50.0),
            p90_ns: rank(90.0),
            p99_ns: rank(99.0),
            max_ns: s[s.len() - 1],
        }
    }
}

/// Latency samples of one series: how many there were, and the latest [`SAMPLES_KEEP`] values.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    count: u64,
    recent: VecDeque<u64>,
}

/// Samples kept per series (8 bytes each): exact percentiles for any trace up to this many
/// suspends, the latest ones beyond.
pub const SAMPLES_KEEP: usize = 1 << 16;

impl Samples {
    pub fn push(&mut self, ns: u64) {
        if self.recent.len() == SAMPLES_KEEP {
            self.recent.pop_front();
        }
        self.recent.push_back(ns);
        self.count += 1;
    }

    /// All samples ever pushed.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The kept samples, oldest first.
    pub fn values(&self) -> impl Iterator<Item = u64> + '_ {
        self.recent.iter().copied()
    }

    /// Percentiles over the kept samples; `count` is every sample.
    pub fn latency(&self) -> Latency {
        let values: Vec<u64> = self.values().collect();
        Latency { count: self.count, ..Latency::of(&values) }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EvictionStats {
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
}

/// Pairs events into spans and keeps the statistics for the exit summary.
#[derive(Debug, Default)]
pub struct SpanTracker {
    open_evictions: HashMap<(HostPid, Option<GpuId>), (u64, EvictionTrigger)>,
    nested: HashMap<u32, VecDeque<Phase>>,
    pub evictions: BTreeMap<HostPid, EvictionStats>,
    pub suspend_ns: Samples,
    pub resume_ns: Samples,
    pub fence_wait_ns: Samples,
    pub collateral_queues: u64,
}

/// At most this many unclaimed nested calls are kept per thread (evictions and queue creation
/// also run the HWS path without a suspend around it).
pub const NESTED_KEEP: usize = 64;
/// At most this many threads with unclaimed nested calls (kworkers come and go).
pub const NESTED_THREADS: usize = 256;

/// HWS unmap (the fence wait inside) or MES's per-queue remove.
const HWS_UNMAP: [KfdFn; 3] = [KfdFn::UnmapQueuesCpsch, KfdFn::MesV11RemoveHwQueue, KfdFn::MesV12RemoveHwQueue];
/// Runlist submission or MES add.
const HWS_REMAP: [KfdFn; 3] = [KfdFn::MapQueuesCpsch, KfdFn::MesV11AddHwQueue, KfdFn::MesV12AddHwQueue];
/// An observed HWS unmap (not MES's per-queue remove) preempts other processes.
const DEVICE_WIDE: [KfdFn; 2] = [KfdFn::UnmapQueuesCpsch, KfdFn::ExecuteQueuesCpsch];

impl SpanTracker {
    /// Feed one event (before `registry.apply` sees it, so the registry shows the state the
    /// event found). Returns the spans it closes.
    pub fn on_event(&mut self, e: &Event, registry: &Registry) -> Vec<Span> {
        match &e.kind {
            EventKind::KfdCall(c) => {
                if c.kfd_fn == KfdFn::FenceWaitTimeout {
                    self.fence_wait_ns.push(e.duration_ns());
                }
                if !self.nested.contains_key(&e.tid) && self.nested.len() >= NESTED_THREADS {
                    self.forget_quietest_thread();
                }
                let nested = self.nested.entry(e.tid).or_default();
                if nested.len() == NESTED_KEEP {
                    nested.pop_front();
                }
                nested.push_back(Phase {
                    function: c.function,
                    kfd_fn: c.kfd_fn,
                    gpu_id: c.gpu_id,
                    start_ns: e.entry_ns,
                    end_ns: e.ts_ns,
                    result: c.result,
                });
                Vec::new()
            }
            EventKind::QueueEviction(v) => {
                self.open_evictions.insert((v.target_pid, v.gpu_id), (e.ts_ns, v.trigger));
                Vec::new()
            }
            EventKind::QueueRestore(v) => {
                let Some((start, trigger)) = self.open_evictions.remove(&(v.target_pid, v.gpu_id)) else {
                    return Vec::new();
                };
                vec![self.eviction(v.target_pid, v.gpu_id, start, e.ts_ns, trigger, false)]
            }
            EventKind::SuspendQueues(s) | EventKind::ResumeQueues(s) => {
                let kind =
                    if matches!(e.kind, EventKind::ResumeQueues(_)) { SpanKind::Resume } else { SpanKind::Suspend };
                let phases: Vec<Phase> = match self.nested.get_mut(&e.tid) {
                    Some(nested) => {
                        let (inside, outside) =
                            nested.drain(..).partition(|p| p.start_ns >= e.entry_ns && p.end_ns <= e.ts_ns);
                        *nested = outside;
                        inside.into_iter().collect()
                    }
                    None => Vec::new(),
                };
                let mut b = Breakdown::default();
                for p in &phases {
                    match p.kfd_fn {
                        KfdFn::FenceWaitTimeout => b.fence_wait_ns += p.duration_ns(),
                        f if HWS_UNMAP.contains(&f) => b.unmap_ns += p.duration_ns(),
                        f if HWS_REMAP.contains(&f) => b.remap_ns += p.duration_ns(),
                        _ => {}
                    }
                    if let Some(g) = p.gpu_id
                        && !b.gpus.contains(&g)
                    {
                        b.gpus.push(g);
                    }
                }
                b.gpus.sort_unstable();
                let device_wide = phases.iter().any(|p| DEVICE_WIDE.contains(&p.kfd_fn));
                let collateral: Vec<Collateral> = if device_wide {
                    let gpus = if b.gpus.is_empty() {
                        s.target_pid.map(|t| registry.gpus_of(t)).unwrap_or_default()
                    } else {
                        b.gpus.clone()
                    };
                    registry.active_queues_of_others(s.target_pid, &gpus)
                } else {
                    Vec::new()
                };
                self.collateral_queues += collateral.len() as u64;
                let duration = e.duration_ns();
                match kind {
                    SpanKind::Resume => self.resume_ns.push(duration),
                    _ => self.suspend_ns.push(duration),
                }
                vec![Span {
                    kind,
                    target_pid: s.target_pid,
                    gpu_id: None,
                    start_ns: e.entry_ns,
                    end_ns: e.ts_ns,
                    duration_ns: duration,
                    trigger: None,
                    queues: s.queues.iter().filter(|o| o.handled()).map(|o| o.queue_id).collect(),
                    rejected: s.queues.iter().filter(|o| !o.handled()).map(|o| o.queue_id).collect(),
                    collateral,
                    breakdown: (!phases.is_empty()).then_some(b),
                    phases,
                    open: false,
                }]
            }
            EventKind::ProcessExit(x) => {
                // Evictions of a process that is gone end with it.
                let Some(pid) = x.owner_pid else { return Vec::new() };
                let keys: Vec<_> = self.open_evictions.keys().filter(|(p, _)| *p == pid).copied().collect();
                let mut spans = Vec::new();
                for key in keys {
                    if let Some((start, trigger)) = self.open_evictions.remove(&key) {
                        spans.push(self.eviction(key.0, key.1, start, e.ts_ns, trigger, true));
                    }
                }
                spans
            }
            _ => Vec::new(),
        }
    }

    /// Drop the thread whose newest unclaimed call is the oldest.
    fn forget_quietest_thread(&mut self) {
        let quietest =
            self.nested.iter().min_by_key(|(_, calls)| calls.back().map_or(0, |p| p.end_ns)).map(|(&t, _)| t);
        if let Some(tid) = quietest {
            self.nested.remove(&tid);
        }
    }

    /// The model no longer keeps `pid`: its statistics go with it.
    pub fn forget(&mut self, pid: HostPid) {
        self.evictions.remove(&pid);
    }

    fn eviction(
        &mut self,
        pid: HostPid,
        gpu_id: Option<GpuId>,
        start: u64,
        end: u64,
        trigger: EvictionTrigger,
        open: bool,
    ) -> Span {
        let duration = end.saturating_sub(start);
        let stats = self.evictions.entry(pid).or_default();
        stats.count += 1;
        stats.total_ns += duration;
        stats.max_ns = stats.max_ns.max(duration);
        Span {
            kind: SpanKind::Eviction,
            target_pid: Some(pid),
            gpu_id,
            start_ns: start,
            end_ns: end,
            duration_ns: duration,
            trigger: Some(trigger),
            queues: Vec::new(),
            rejected: Vec::new(),
            collateral: Vec::new(),
            breakdown: None,
            phases: Vec::new(),
            open,
        }
    }

    /// Close evictions still open at the end of the trace (`now_ns`).
    pub fn finish(&mut self, now_ns: u64) -> Vec<Span> {
        let open: Vec<_> = self.open_evictions.drain().collect();
        open.into_iter()
            .map(|((pid, gpu), (start, trigger))| self.eviction(pid, gpu, start, now_ns, trigger, true))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        event::{QueueEviction, QueueRestore},
        test_support::{call, create, ev, suspend},
    };

    #[test]
    fn a_suspend_claims_its_nested_hws_calls_and_names_the_collateral_queues() {
        let mut reg = Registry::new(None);
        reg.apply(&ev(10, 1, create(0, 0xa)));
        reg.apply(&ev(10, 1, create(1, 0xa)));
        reg.apply(&ev(20, 1, create(0, 0xa))); // another process on the same GPU: collateral
        reg.apply(&ev(20, 1, create(1, 0xb))); // another GPU: not preempted
        let mut t = SpanTracker::default();
        // Debugger thread 30: execute [100,900] ⊃ unmap [110,600] ⊃ fence [150,550]; map [610,890].
        for e in [
            call(30, KfdFn::FenceWaitTimeout, Some(0xa), 150, 550),
            call(30, KfdFn::UnmapQueuesCpsch, Some(0xa), 110, 600),
            call(30, KfdFn::MapQueuesCpsch, Some(0xa), 610, 890),
            call(30, KfdFn::ExecuteQueuesCpsch, Some(0xa), 100, 900),
            call(31, KfdFn::UnmapQueuesCpsch, Some(0xa), 200, 300), // other thread: not ours
        ] {
            assert!(t.on_event(&e, &reg).is_empty());
        }
        let mut s = ev(30, 1000, suspend(10, &[0, 1, 5 | 1 << 31], false));
        s.entry_ns = 50;
        let spans = t.on_event(&s, &reg);
        assert_eq!(spans.len(), 1);
        let span = &spans[0];
        assert_eq!((span.kind, span.target_pid, span.duration_ns), (SpanKind::Suspend, Some(HostPid(10)), 950));
        assert_eq!(span.queues, [QueueId(0), QueueId(1)]);
        assert_eq!(span.rejected, [QueueId(5)]);
        assert_eq!(
            span.breakdown,
            Some(Breakdown { unmap_ns: 490, fence_wait_ns: 400, remap_ns: 280, gpus: vec![GpuId(0xa)] })
        );
        assert_eq!(span.phases.len(), 4);
        assert_eq!(
            span.collateral,
            [Collateral { pid: HostPid(20), queue_id: QueueId(0), context_id: None, gpu_id: Some(GpuId(0xa)) }]
        );
        assert_eq!(t.fence_wait_ns.values().collect::<Vec<_>>(), [400]);
        assert_eq!(t.suspend_ns.values().collect::<Vec<_>>(), [950]);
        assert_eq!(t.collateral_queues, 1);
        // The other thread's call is still waiting for its own parent.
        assert_eq!(t.nested[&31].len(), 1);
        assert!(t.nested[&30].is_empty());
    }

    #[test]
    fn a_suspend_without_a_device_wide_unmap_has_no_collateral() {
        let mut reg = Registry::new(None);
        reg.apply(&ev(20, 1, create(0, 0xa)));
        let mut t = SpanTracker::default();
        t.on_event(&call(30, KfdFn::MesV11RemoveHwQueue, Some(0xa), 10, 20), &reg);
        let mut s = ev(30, 100, suspend(10, &[0], false));
        s.entry_ns = 5;
        let span = &t.on_event(&s, &reg)[0];
        assert!(span.collateral.is_empty());
        assert_eq!(span.breakdown.as_ref().map(|b| b.unmap_ns), Some(10));
    }

    #[test]
    fn evictions_pair_per_pid_and_gpu_and_count() {
        let reg = Registry::new(None);
        let mut t = SpanTracker::default();
        let evict = |gpu| {
            EventKind::QueueEviction(QueueEviction {
                target_pid: HostPid(10),
                gpu_id: Some(GpuId(gpu)),
                trigger: EvictionTrigger::Ttm,
            })
        };
        let restore = |gpu| EventKind::QueueRestore(QueueRestore { target_pid: HostPid(10), gpu_id: Some(GpuId(gpu)) });
        assert!(t.on_event(&ev(1, 100, evict(0xa)), &reg).is_empty());
        assert!(t.on_event(&ev(1, 150, evict(0xb)), &reg).is_empty());
        let a = t.on_event(&ev(1, 400, restore(0xa)), &reg);
        assert_eq!((a[0].duration_ns, a[0].gpu_id, a[0].trigger), (300, Some(GpuId(0xa)), Some(EvictionTrigger::Ttm)));
        assert!(t.on_event(&ev(1, 500, restore(0xc)), &reg).is_empty(), "a restore without eviction is no span");
        let open = t.finish(1150);
        assert_eq!((open[0].duration_ns, open[0].open), (1000, true));
        assert_eq!(t.evictions[&HostPid(10)], EvictionStats { count: 2, total_ns: 1300, max_ns: 1000 });
        t.forget(HostPid(10));
        assert!(t.evictions.is_empty());
    }

    #[test]
    fn unclaimed_calls_and_samples_stay_bounded() {
        let reg = Registry::new(None);
        let mut t = SpanTracker::default();
        for tid in 0..(NESTED_THREADS as u32 + 10) {
            for i in 0..(NESTED_KEEP as u64 + 3) {
                let start = u64::from(tid) * 1000 + i;
                t.on_event(&call(tid, KfdFn::PmSendRunlist, None, start, start + 1), &reg);
            }
        }
        assert_eq!(t.nested.len(), NESTED_THREADS);
        assert!(t.nested.values().all(|calls| calls.len() == NESTED_KEEP));
        assert!(!t.nested.contains_key(&0), "the quietest threads went first");
        let mut s = Samples::default();
        for v in 0..(SAMPLES_KEEP as u64 + 5) {
            s.push(v);
        }
        assert_eq!(
            (s.count(), s.values().count(), s.values().next()),
            (SAMPLES_KEEP as u64 + 5, SAMPLES_KEEP, Some(5))
        );
        assert_eq!(s.latency().count, SAMPLES_KEEP as u64 + 5);
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let samples: Vec<u64> = (1..=100).collect();
        assert_eq!(Latency::of(&samples), Latency { count: 100, p50_ns: 50, p90_ns: 90, p99_ns: 99, max_ns: 100 });
        assert_eq!(Latency::of(&[7]), Latency { count: 1, p50_ns: 7, p90_ns: 7, p99_ns: 7, max_ns: 7 });
        assert_eq!(Latency::of(&[]), Latency::default());
    }
}
