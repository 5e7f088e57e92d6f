//! `gpreempt top`: one snapshot of the live state for a terminal view — every KFD process with its
//! queues per GPU and each queue's state, the eviction and suspend spans as the tracer closes
//! them (with their in-driver times), per-GPU counts, and the scheduler's per-GPU state read from
//! a running agent ([`scheduler`]). This module holds the data, its sorting and filtering and the
//! cells of each row; [`render`] lays them out as text (`--once`) or a ratatui frame.

pub mod render;
pub mod scheduler;

use std::collections::{BTreeMap, VecDeque};

use serde::Serialize;

use self::scheduler::SchedulerStatus;
use crate::{
    domain::{GpuId, HostPid, QueueId},
    event::Losses,
    host::{
        k8s::PodRef,
        partition::{Partition, Partitions},
        procinfo::{self, Container},
    },
    model::{
        Model,
        registry::{ProcessEntry, QueueKey, QueueState},
        spans::{Span, SpanKind},
    },
    output::text::escape,
};

/// One queue of a process and its state, as `top` shows it (the queue's properties — addresses,
/// ring, save area — are `gpreempt queues`' [`crate::views::queues::QueueRow`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueStateRow {
    pub queue_id: QueueId,
    /// The secondary KFD context it is in (Linux 7.0; ids are per context, and DBG_TRAP does not
    /// reach it); `None` (JSON `null`) for the primary one.
    pub context_id: Option<u16>,
    pub queue_type: Option<String>,
    pub state: QueueState,
    /// `false` for a queue found in sysfs when the tracer started and not changed since: sysfs
    /// has no queue state, so it is taken as active (a suspension already in force when `top`
    /// started shows only once the tracer sees that queue change).
    pub state_seen: bool,
}

/// A process's queues on one GPU (`gpu_id` `None`: the tracer did not learn the GPU).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProcessGpu {
    pub gpu_id: Option<GpuId>,
    pub queues: Vec<QueueStateRow>,
}

impl QueueStateRow {
    /// Where it is: its context and id.
    pub fn key(&self) -> QueueKey {
        QueueKey::new(self.context_id, self.queue_id)
    }
}

impl ProcessGpu {
    pub fn count(&self, state: QueueState) -> usize {
        self.queues.iter().filter(|q| q.state == state).count()
    }

    /// `active` when every queue is active (likewise for one other state), else the counts of
    /// the states present: `1 active, 1 suspended`; `-` without queues.
    pub fn state_label(&self) -> String {
        let counts: Vec<(QueueState, usize)> = [QueueState::Active, QueueState::Evicted, QueueState::Suspended]
            .into_iter()
            .map(|s| (s, self.count(s)))
            .filter(|&(_, n)| n > 0)
            .collect();
        match counts.as_slice() {
            [] => "-".to_owned(),
            [(state, _)] => state.name().to_owned(),
            many => many.iter().map(|(s, n)| format!("{n} {}", s.name())).collect::<Vec<_>>().join(", "),
        }
    }
}

/// One KFD process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProcessRow {
    pub pid: HostPid,
    /// Its pid inside its pid namespace.
    pub ns_pid: Option<u32>,
    pub comm: Option<String>,
    /// `runtime:name` (or `runtime:short-id` when the name is unknown).
    pub container: Option<String>,
    /// The pod, when the node's files say which it runs in: `{namespace, name, uid}` in JSON.
    pub pod: Option<PodRef>,
    /// The container's name in its pod's spec, when the runtime's record says.
    pub container_name: Option<String>,
    /// Per GPU, in GPU order.
    pub gpus: Vec<ProcessGpu>,
    /// Evictions (counted as they begin) and debug-trap suspends the tracer saw of it since
    /// `top` started.
    pub evictions: u64,
    pub suspends: u64,
}

impl ProcessRow {
    pub fn queue_count(&self) -> usize {
        self.gpus.iter().map(|g| g.queues.len()).sum()
    }

    pub fn count(&self, state: QueueState) -> usize {
        self.gpus.iter().map(|g| g.count(state)).sum()
    }

    /// What the CONTAINER column shows: `namespace/pod/container` in a pod, else the
    /// container, else `-`.
    pub fn place(&self) -> std::borrow::Cow<'_, str> {
        match (&self.pod, &self.container_name) {
            (Some(pod), Some(container)) => format!("{}/{}/{container}", pod.namespace, pod.name).into(),
            (Some(pod), None) => format!("{}/{}", pod.namespace, pod.name).into(),
            (None, _) => self.container.as_deref().unwrap_or("-").into(),
        }
    }

    /// From the model's entry; `pod_of` names the pod of a container (`None`: not in a pod).
    pub fn of(p: &ProcessEntry, pod_of: &mut dyn FnMut(&Container) -> Option<PodRef>) -> Self {
        let mut gpus: BTreeMap<Option<GpuId>, Vec<QueueStateRow>> = BTreeMap::new();
        for q in p.queues.values() {
            gpus.entry(q.gpu_id).or_default().push(QueueStateRow {
                queue_id: q.queue_id,
                context_id: q.context_id,
                queue_type: q.queue_type.clone(),
                state: q.state,
                state_seen: !(q.bootstrapped && q.since_ns == 0),
            });
        }
        let container = p.container.as_ref().map(|c| match &c.name {
            Some(name) => format!("{}:{name}", c.runtime),
            None => format!("{}:{}", c.runtime, procinfo::short_id(&c.id)),
        });
        let pod = p.container.as_ref().and_then(pod_of);
        let container_name = pod.as_ref().and_then(|r| r.container.clone());
        Self {
            pid: p.pid,
            ns_pid: p.ns_pid,
            comm: p.comm.clone(),
            container,
            pod,
            container_name,
            gpus: gpus.into_iter().map(|(gpu_id, queues)| ProcessGpu { gpu_id, queues }).collect(),
            evictions: p.churn.evictions,
            suspends: p.churn.suspends,
        }
    }
}

/// A span the tracer closed: an eviction (restore or exit ended it), or one debug-trap
/// SUSPEND/RESUME_QUEUES with the driver's time inside it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SpanRow {
    #[serde(rename = "span")]
    pub kind: SpanKind,
    pub pid: Option<HostPid>,
    pub comm: Option<String>,
    /// The GPUs it touched (an eviction's GPU; a suspend's or resume's nested HWS calls).
    pub gpus: Vec<GpuId>,
    /// CLOCK_BOOTTIME ns.
    pub start_ns: u64,
    pub duration_ns: u64,
    /// Suspend/resume: the target's queues the kernel handled.
    pub queues: usize,
    /// Eviction trigger (`ttm`, `svm`, …).
    pub trigger: Option<String>,
    /// In-driver unmap (`unmap_queues_cpsch` or MES remove), fence wait (the preemption itself,
    /// CWSR save) and remap, when the tracer saw the nested calls.
    pub unmap_ns: Option<u64>,
    pub fence_wait_ns: Option<u64>,
    pub remap_ns: Option<u64>,
    /// Other processes' queues a device-wide unmap preempted with it.
    pub collateral: usize,
}

impl SpanRow {
    pub fn of(span: &Span, comm: Option<&str>) -> Self {
        let mut gpus: Vec<GpuId> = span.gpu_id.into_iter().collect();
        if let Some(b) = &span.breakdown {
            gpus.extend(&b.gpus);
        }
        gpus.sort_unstable();
        gpus.dedup();
        let phase = |f: fn(&crate::model::spans::Breakdown) -> u64| span.breakdown.as_ref().map(f);
        Self {
            kind: span.kind,
            pid: span.target_pid,
            comm: comm.map(str::to_owned),
            gpus,
            start_ns: span.start_ns,
            duration_ns: span.duration_ns,
            queues: span.queues.len(),
            trigger: span.trigger.map(|t| t.to_string()),
            unmap_ns: phase(|b| b.unmap_ns),
            fence_wait_ns: phase(|b| b.fence_wait_ns),
            remap_ns: phase(|b| b.remap_ns),
            collateral: span.collateral.len(),
        }
    }
}

/// Spans closed per GPU since `top` started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SpanTotals {
    pub evictions: u64,
    pub suspends: u64,
    pub resumes: u64,
}

/// The latest spans (newest first, at most `keep`) and the per-GPU totals of all of them.
#[derive(Clone, Debug)]
pub struct SpanLog {
    recent: VecDeque<SpanRow>,
    keep: usize,
    totals: BTreeMap<GpuId, SpanTotals>,
    /// Spans that touched no known GPU (5.10: no module BTF, the HWS calls carry no gpu id).
    without_gpu: SpanTotals,
}

/// Spans a [`SpanLog`] keeps by default: more than a terminal shows.
pub const SPANS_KEEP: usize = 256;

impl Default for SpanLog {
    fn default() -> Self {
        Self::new(SPANS_KEEP)
    }
}

impl SpanLog {
    pub fn new(keep: usize) -> Self {
        Self { recent: VecDeque::new(), keep, totals: BTreeMap::new(), without_gpu: SpanTotals::default() }
    }

    pub fn push(&mut self, row: SpanRow) {
        let bump = |t: &mut SpanTotals| match row.kind {
            SpanKind::Eviction => t.evictions += 1,
            SpanKind::Suspend => t.suspends += 1,
            SpanKind::Resume => t.resumes += 1,
        };
        if row.gpus.is_empty() {
            bump(&mut self.without_gpu);
        }
        for g in &row.gpus {
            bump(self.totals.entry(*g).or_default());
        }
        self.recent.push_front(row);
        self.recent.truncate(self.keep);
    }

    pub fn recent(&self) -> impl Iterator<Item = &SpanRow> {
        self.recent.iter()
    }

    pub fn totals(&self, gpu: GpuId) -> SpanTotals {
        self.totals.get(&gpu).copied().unwrap_or_default()
    }

    pub fn without_gpu(&self) -> SpanTotals {
        self.without_gpu
    }

    fn gpus(&self) -> impl Iterator<Item = GpuId> + '_ {
        self.totals.keys().copied()
    }
}

/// One GPU: its processes and queues by state now, and the spans closed on it since `top` started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuCounts {
    pub gpu_id: GpuId,
    /// Its package, index and mode, where the topology names them ([`Snapshot::name_partitions`]).
    pub partition: Option<Partition>,
    pub processes: usize,
    pub queues: usize,
    pub active: usize,
    pub evicted: usize,
    pub suspended: usize,
    #[serde(flatten)]
    pub spans: SpanTotals,
}

/// What the tracer delivered and lost.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TracerStatus {
    pub probes_attached: usize,
    pub probes_missing: usize,
    pub events: u64,
    /// Records that did not become events ([`Losses::dropped`]).
    pub lost: u64,
}

impl TracerStatus {
    pub fn set_losses(&mut self, losses: &Losses) {
        self.lost = losses.dropped();
    }
}

/// Everything one frame shows (and `--json` prints).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Snapshot {
    /// CLOCK_BOOTTIME ns when it was taken (span times are on the same clock).
    pub ts_ns: u64,
    /// Every running KFD process, in pid order (the view sorts and filters its rows).
    pub processes: Vec<ProcessRow>,
    /// Every GPU with queues now, in the topology, or seen in a span, in id order.
    pub gpus: Vec<GpuCounts>,
    /// The latest spans, newest first.
    pub spans: Vec<SpanRow>,
    pub scheduler: SchedulerStatus,
    pub tracer: TracerStatus,
}

impl Snapshot {
    /// The model's processes now, the span log's spans and totals, and the GPUs of the topology
    /// (`topology_gpus`, so a GPU without queues shows its zeros).
    pub fn take(
        ts_ns: u64,
        model: &Model,
        log: &SpanLog,
        topology_gpus: &[GpuId],
        pod_of: &mut dyn FnMut(&Container) -> Option<PodRef>,
        scheduler: SchedulerStatus,
        tracer: TracerStatus,
    ) -> Self {
        let processes: Vec<ProcessRow> =
            model.registry().processes.values().map(|p| ProcessRow::of(p, pod_of)).collect();
        let mut ids: Vec<GpuId> = topology_gpus.to_vec();
        ids.extend(processes.iter().flat_map(|p| p.gpus.iter().filter_map(|g| g.gpu_id)));
        ids.extend(log.gpus());
        ids.sort_unstable();
        ids.dedup();
        let gpus = ids
            .into_iter()
            .map(|gpu_id| {
                let on: Vec<&ProcessGpu> =
                    processes.iter().flat_map(|p| p.gpus.iter().filter(|g| g.gpu_id == Some(gpu_id))).collect();
                GpuCounts {
                    gpu_id,
                    partition: None,
                    processes: on.len(),
                    queues: on.iter().map(|g| g.queues.len()).sum(),
                    active: on.iter().map(|g| g.count(QueueState::Active)).sum(),
                    evicted: on.iter().map(|g| g.count(QueueState::Evicted)).sum(),
                    suspended: on.iter().map(|g| g.count(QueueState::Suspended)).sum(),
                    spans: log.totals(gpu_id),
                }
            })
            .collect();
        Self { ts_ns, processes, gpus, spans: log.recent().cloned().collect(), scheduler, tracer }
    }

    /// Each GPU's partition from the topology (read once: partitions change only with a driver
    /// reload).
    pub fn name_partitions(&mut self, partitions: &Partitions) {
        for g in &mut self.gpus {
            g.partition = partitions.get(g.gpu_id).copied();
        }
    }
}

/// The process table's sort orders (`s` cycles through them in this order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SortKey {
    Pid,
    Comm,
    Container,
    Queues,
    Suspended,
    Evictions,
}

impl SortKey {
    pub const ALL: [SortKey; 6] =
        [Self::Pid, Self::Comm, Self::Container, Self::Queues, Self::Suspended, Self::Evictions];

    pub fn name(self) -> &'static str {
        match self {
            Self::Pid => "pid",
            Self::Comm => "comm",
            Self::Container => "container",
            Self::Queues => "queues",
            Self::Suspended => "suspended",
            Self::Evictions => "evictions",
        }
    }

    pub fn next(self) -> Self {
        let at = Self::ALL.iter().position(|&k| k == self).unwrap_or(0);
        Self::ALL[(at + 1) % Self::ALL.len()]
    }
}

/// How the process table is shown: sort key and direction, and a filter. Counts (queues,
/// suspended, evictions) sort the largest first unless reversed; names and pids ascend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Order {
    pub sort: SortKey,
    pub reverse: bool,
    /// Case-insensitive substring of the pid, comm, container or pod; empty keeps everything.
    pub filter: String,
}

impl Default for Order {
    fn default() -> Self {
        Self { sort: SortKey::Pid, reverse: false, filter: String::new() }
    }
}

impl Order {
    pub fn keeps(&self, p: &ProcessRow) -> bool {
        if self.filter.is_empty() {
            return true;
        }
        let needle = self.filter.to_lowercase();
        let hay = [
            Some(p.pid.to_string()),
            p.comm.clone(),
            p.container.clone(),
            p.pod.as_ref().map(|_| p.place().into_owned()),
        ];
        hay.iter().flatten().any(|h| h.to_lowercase().contains(&needle))
    }

    /// The processes this order shows, in its order (ties by pid).
    pub fn apply<'a>(&self, processes: &'a [ProcessRow]) -> Vec<&'a ProcessRow> {
        let mut rows: Vec<&ProcessRow> = processes.iter().filter(|p| self.keeps(p)).collect();
        rows.sort_by(|a, b| {
            let by = match self.sort {
                SortKey::Pid => a.pid.cmp(&b.pid),
                SortKey::Comm => a.comm.cmp(&b.comm),
                SortKey::Container => a.place().cmp(&b.place()),
                SortKey::Queues => b.queue_count().cmp(&a.queue_count()),
                SortKey::Suspended => b.count(QueueState::Suspended).cmp(&a.count(QueueState::Suspended)),
                SortKey::Evictions => b.evictions.cmp(&a.evictions),
            };
            let by = if self.reverse { by.reverse() } else { by };
            by.then(a.pid.cmp(&b.pid))
        });
        rows
    }
}

/// Column headers of [`process_cells`].
pub const PROCESS_HEADER: [&str; 9] = ["PID", "CONTAINER", "COMM", "GPU", "Q", "IDS", "STATE", "EVICT", "SUSP"];

/// The process table's text cells: one row per process and GPU (a process without queues has
/// one row with `-`); `IDS` names a secondary KFD context's queue by its context
/// (`0,context_0/0`). Names another process controls are escaped for the terminal.
pub fn process_cells(p: &ProcessRow) -> Vec<[String; 9]> {
    let fixed = |gpu: String, q: String, ids: String, state: String| {
        [
            p.pid.to_string(),
            escape(&p.place()).into_owned(),
            escape(p.comm.as_deref().unwrap_or("?")).into_owned(),
            gpu,
            q,
            ids,
            state,
            p.evictions.to_string(),
            p.suspends.to_string(),
        ]
    };
    if p.gpus.is_empty() {
        return vec![fixed("-".into(), "0".into(), "-".into(), "-".into())];
    }
    p.gpus
        .iter()
        .map(|g| {
            let ids: Vec<String> = g.queues.iter().map(|q| q.key().to_string()).collect();
            fixed(
                g.gpu_id.map_or_else(|| "?".to_owned(), |id| format!("{id:#x}")),
                g.queues.len().to_string(),
                ids.join(","),
                g.state_label(),
            )
        })
        .collect()
}

/// Column headers of [`gpu_cells`].
pub const GPU_HEADER: [&str; 10] =
    ["GPU", "PARTITION", "PROCS", "QUEUES", "ACTIVE", "EVICTED", "SUSPENDED", "EVICTIONS", "SUSPENDS", "RESUMES"];

pub fn gpu_cells(g: &GpuCounts) -> [String; 10] {
    [
        format!("{:#x}", g.gpu_id),
        g.partition.map_or_else(|| "-".to_owned(), |p| p.label()),
        g.processes.to_string(),
        g.queues.to_string(),
        g.active.to_string(),
        g.evicted.to_string(),
        g.suspended.to_string(),
        g.spans.evictions.to_string(),
        g.spans.suspends.to_string(),
        g.spans.resumes.to_string(),
    ]
}

/// Column headers of [`span_cells`].
pub const SPAN_HEADER: [&str; 11] =
    ["AGO s", "SPAN", "PID", "COMM", "GPU", "Q", "TOTAL us", "UNMAP us", "FENCE us", "REMAP us", "OTHERS"];

fn micros(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1000.0)
}

/// One span's cells; `now_ns` (the snapshot's time) makes its age. An eviction's trigger follows
/// its name (`eviction/ttm`); `OTHERS` counts the other processes' queues it preempted.
pub fn span_cells(s: &SpanRow, now_ns: u64) -> [String; 11] {
    let kind = match s.kind {
        SpanKind::Eviction => "eviction",
        SpanKind::Suspend => "suspend",
        SpanKind::Resume => "resume",
    };
    let end = s.start_ns.saturating_add(s.duration_ns);
    let opt = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), micros);
    let gpus: Vec<String> = s.gpus.iter().map(|g| format!("{g:#x}")).collect();
    [
        format!("{:.1}", now_ns.saturating_sub(end) as f64 / 1e9),
        match &s.trigger {
            Some(t) => format!("{kind}/{t}"),
            None => kind.to_owned(),
        },
        s.pid.map_or_else(|| "?".to_owned(), |p| p.to_string()),
        escape(s.comm.as_deref().unwrap_or("?")).into_owned(),
        if gpus.is_empty() { "?".to_owned() } else { gpus.join(",") },
        s.queues.to_string(),
        micros(s.duration_ns),
        opt(s.unmap_ns),
        opt(s.fence_wait_ns),
        opt(s.remap_ns),
        s.collateral.to_string(),
    ]
}

#[cfg(test)]
mod tests;
