//! Prometheus/OpenMetrics series of what the tracer sees, for `gpreempt agent`.
//!
//! [`Metrics`] owns the registry and every metric family; [`Recorder`] is the pipeline
//! [`Subscriber`] that feeds them from the model's notices and spans, and keeps the per-process
//! series bounded: a process's series leave when the model forgets it (its grace period).
//! Naming follows the Prometheus conventions (base units in the name, `_total` on counters);
//! labels follow AMD's device-metrics exporter where they mean the same thing: `hostname` on
//! every series, `kfd_process_id` (the host pid KFD names the process by), `gpu_id` (KFD's
//! `gpu_id`, as `/sys/class/kfd/kfd/topology/nodes/*/gpu_id` shows it), and `pod`,
//! `namespace`, `container` when the process runs in a Kubernetes pod that [`crate::host::k8s`] can
//! name, and `container` alone for a named container outside Kubernetes (Docker, Podman, LXC). The reference table of every series is in docs/guide/metrics.md.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use prometheus_client::{
    encoding::text,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram, info::Info},
    registry::{Metric, Registry, Unit},
};

use crate::{
    deploy::series::{self, label},
    domain::{GpuId, HostPid, TransitionKind},
    event::Losses,
    host::{k8s::PodRef, partition::Partitions},
    model::{
        Model, ModelNotice, QueueAddrs,
        registry::{ProcessEntry, QueueState},
        spans::{Span, SpanKind},
    },
    pipeline::Subscriber,
};

/// A label set: ordered (name, value) pairs; unknown values are left out, never guessed.
pub type Labels = Vec<(&'static str, String)>;

/// Upper bounds (seconds) of every latency histogram: 10 µs to 1 s. A debug-trap suspend under
/// HWS is a runlist round trip (tens of µs to a few ms); an eviction's in-driver work is longer.
pub const LATENCY_BUCKETS: [f64; 16] =
    [1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0];

/// The OpenMetrics content type `/metrics` answers with.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Registers `metric` as `family`: its name, help and unit as deploy::series names them.
fn register(r: &mut Registry, family: &series::Family, metric: impl Metric) {
    if family.seconds {
        r.register_with_unit(family.name, family.help, Unit::Seconds, metric);
    } else {
        r.register(family.name, family.help, metric);
    }
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

type CounterFamily = Family<Labels, Counter>;
type SecondsFamily = Family<Labels, Counter<f64>>;
type GaugeFamily = Family<Labels, Gauge>;
type FloatGaugeFamily = Family<Labels, Gauge<f64, AtomicU64>>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// Every metric family of the agent, registered in one registry. Cheap to clone (the families
/// are shared handles): the HTTP server encodes while the tracer loop updates.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    queues: GaugeFamily,
    queue_creates: CounterFamily,
    queue_destroys: CounterFamily,
    evictions: CounterFamily,
    restores: CounterFamily,
    eviction_seconds: SecondsFamily,
    debug_trap_ops: CounterFamily,
    debug_trap_seconds: HistogramFamily,
    hws_unmap_seconds: HistogramFamily,
    hws_fence_wait_seconds: HistogramFamily,
    hws_remap_seconds: HistogramFamily,
    collateral: CounterFamily,
    events: Counter,
    losses: CounterFamily,
    /// Last cumulative loss counts seen, to turn the stream's totals into counter increments.
    losses_seen: Arc<[AtomicU64; LOSS_CAUSES]>,
    probes: GaugeFamily,
    gpu_partition: GaugeFamily,
    config_reloads: CounterFamily,
    processes: Gauge,
    transitions: CounterFamily,
    suspended_seconds: SecondsFamily,
    reaction_seconds: HistogramFamily,
    detection_seconds: HistogramFamily,
    resumes_skipped: CounterFamily,
    loop_step_seconds: FloatGaugeFamily,
}

const LOSS_CAUSES: usize = 5;

impl Metrics {
    /// Every family of deploy::series registered under its prefix, `hostname` on every series, and
    /// `gpreempt_build_info` set for `version`.
    pub fn new(hostname: &str, version: &str) -> Self {
        let mut registry = Registry::with_prefix_and_labels(
            series::PREFIX,
            [("hostname".into(), hostname.to_owned().into())].into_iter(),
        );
        let histograms = || HistogramFamily::new_with_constructor(latency_histogram as fn() -> Histogram);
        let m = Self {
            registry: Arc::new(Registry::default()),
            queues: GaugeFamily::default(),
            queue_creates: CounterFamily::default(),
            queue_destroys: CounterFamily::default(),
            evictions: CounterFamily::default(),
            restores: CounterFamily::default(),
            eviction_seconds: SecondsFamily::default(),
            debug_trap_ops: CounterFamily::default(),
            debug_trap_seconds: histograms(),
            hws_unmap_seconds: histograms(),
            hws_fence_wait_seconds: histograms(),
            hws_remap_seconds: histograms(),
            collateral: CounterFamily::default(),
            events: Counter::default(),
            losses: CounterFamily::default(),
            losses_seen: Arc::new(Default::default()),
            probes: GaugeFamily::default(),
            gpu_partition: GaugeFamily::default(),
            config_reloads: CounterFamily::default(),
            processes: Gauge::default(),
            transitions: CounterFamily::default(),
            suspended_seconds: SecondsFamily::default(),
            reaction_seconds: histograms(),
            detection_seconds: histograms(),
            resumes_skipped: CounterFamily::default(),
            loop_step_seconds: FloatGaugeFamily::default(),
        };
        let r = &mut registry;
        register(r, &series::BUILD, Info::new(vec![("version", version.to_owned())]));
        register(r, &series::PROCESSES, m.processes.clone());
        register(r, &series::QUEUES, m.queues.clone());
        register(r, &series::QUEUE_CREATES, m.queue_creates.clone());
        register(r, &series::QUEUE_DESTROYS, m.queue_destroys.clone());
        register(r, &series::EVICTIONS, m.evictions.clone());
        register(r, &series::RESTORES, m.restores.clone());
        register(r, &series::EVICTION, m.eviction_seconds.clone());
        register(r, &series::DEBUG_TRAP_OPERATIONS, m.debug_trap_ops.clone());
        register(r, &series::DEBUG_TRAP_DURATION, m.debug_trap_seconds.clone());
        register(r, &series::HWS_UNMAP_DURATION, m.hws_unmap_seconds.clone());
        register(r, &series::HWS_FENCE_WAIT_DURATION, m.hws_fence_wait_seconds.clone());
        register(r, &series::HWS_REMAP_DURATION, m.hws_remap_seconds.clone());
        register(r, &series::COLLATERAL_QUEUES_PREEMPTED, m.collateral.clone());
        register(r, &series::TRACER_EVENTS, m.events.clone());
        register(r, &series::TRACER_LOST_RECORDS, m.losses.clone());
        register(r, &series::PROBES, m.probes.clone());
        register(r, &series::GPU_PARTITION, m.gpu_partition.clone());
        register(r, &series::CONFIG_RELOADS, m.config_reloads.clone());
        register(r, &series::SCHEDULER_TRANSITIONS, m.transitions.clone());
        register(r, &series::SCHEDULER_SUSPENDED, m.suspended_seconds.clone());
        register(r, &series::SCHEDULER_REACTION, m.reaction_seconds.clone());
        register(r, &series::SCHEDULER_DETECTION, m.detection_seconds.clone());
        register(r, &series::SCHEDULER_RESUMES_SKIPPED, m.resumes_skipped.clone());
        register(r, &series::SCHEDULER_LOOP_STEP, m.loop_step_seconds.clone());
        Self { registry: Arc::new(registry), ..m }
    }

    /// The exposition text (OpenMetrics, ending in `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = text::encode(&mut out, &self.registry);
        out
    }

    /// `n` more decoded events.
    pub fn add_events(&self, n: u64) {
        self.events.inc_by(n);
    }

    /// The stream's cumulative losses now.
    pub fn set_losses(&self, losses: &Losses) {
        let causes: [(&str, u64); LOSS_CAUSES] = [
            ("ringbuf_full", losses.ringbuf_full),
            ("read_failed", losses.read_failed),
            ("entry_missing", losses.entry_missing),
            ("decode_error", losses.decode_errors),
            ("return_probe_missed", losses.return_probes_missed.unwrap_or(0)),
        ];
        for ((cause, total), seen) in causes.into_iter().zip(self.losses_seen.iter()) {
            let before = seen.swap(total, Ordering::Relaxed);
            // Created at zero even without a loss: an absent series reads as "not measured".
            self.losses.get_or_create(&vec![("cause", cause.to_owned())]).inc_by(total.saturating_sub(before));
        }
    }

    /// How many probes are attached and how many are missing on this kernel.
    pub fn set_probes(&self, attached: usize, missing: usize) {
        self.probes.get_or_create(&vec![("state", "attached".to_owned())]).set(attached as i64);
        self.probes.get_or_create(&vec![("state", "missing".to_owned())]).set(missing as i64);
    }

    /// Each GPU's package, partition index, count and mode (`mode` left out where amdgpu does
    /// not say it), set once: partitions change only with a driver reload.
    pub fn set_partitions(&self, partitions: &Partitions) {
        for (gpu, p) in partitions.iter() {
            let mut labels = vec![
                (label::GPU_ID, gpu.to_string()),
                ("package", p.package.to_string()),
                ("partition", p.index.to_string()),
                ("partitions", p.count.to_string()),
            ];
            labels.extend(p.mode.map(|m| ("mode", m.key().to_owned())));
            self.gpu_partition.get_or_create(&labels).set(1);
        }
    }

    /// A reload of a changed configuration (watch or SIGHUP): applied (`true`) or rejected.
    pub fn config_reload(&self, ok: bool) {
        let result = if ok { "applied" } else { "rejected" };
        self.config_reloads.get_or_create(&vec![("result", result.to_owned())]).inc();
    }

    /// A policy suspended or resumed its offline queues on `gpu`.
    pub fn scheduler_transition(&self, policy: &str, gpu: GpuId, t: TransitionKind) {
        let labels = vec![
            (label::POLICY, policy.to_owned()),
            (label::GPU_ID, gpu.to_string()),
            (label::TRANSITION, t.name().to_owned()),
        ];
        self.transitions.get_or_create(&labels).inc();
    }

    /// A policy kept its offline queues on `gpu` suspended for `seconds` (added when they resume).
    pub fn scheduler_suspended(&self, policy: &str, gpu: GpuId, seconds: f64) {
        self.suspended_seconds.get_or_create(&policy_gpu(policy, gpu)).inc_by(seconds);
    }

    /// A policy reacted to online activity on `gpu` after `seconds`.
    pub fn scheduler_reaction(&self, policy: &str, gpu: GpuId, seconds: f64) {
        self.reaction_seconds.get_or_create(&policy_gpu(policy, gpu)).observe(seconds);
    }

    /// A policy's suspend on `gpu` entered the kernel `seconds` after the last quiet poll.
    pub fn scheduler_detection(&self, policy: &str, gpu: GpuId, seconds: f64) {
        self.detection_seconds.get_or_create(&policy_gpu(policy, gpu)).observe(seconds);
    }

    /// A policy held through an online gap on `gpu` instead of resuming.
    pub fn scheduler_resume_skipped(&self, policy: &str, gpu: GpuId) {
        self.resumes_skipped.get_or_create(&policy_gpu(policy, gpu)).inc();
    }

    /// A policy's reaction-thread step interval so far: p50, p99 and the maximum, in seconds.
    pub fn scheduler_loop_step(&self, policy: &str, p50: f64, p99: f64, max: f64) {
        for (q, v) in [("0.5", p50), ("0.99", p99), ("1", max)] {
            self.loop_step_seconds
                .get_or_create(&vec![(label::POLICY, policy.to_owned()), ("quantile", q.to_owned())])
                .set(v);
        }
    }
}

/// Per-process families, so one exited process's series can all be removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum PerProcess {
    Queues,
    Creates,
    Destroys,
    Evictions,
    Restores,
    EvictionSeconds,
    DebugTrap,
    Collateral,
}

/// What is kept per process: its identity labels and every series created for it.
#[derive(Debug, Default)]
struct Tracked {
    base: Labels,
    series: HashSet<(PerProcess, Labels)>,
    /// (gpu, queue type) pairs seen, so their gauges go to 0 rather than stall when emptied.
    queue_kinds: HashSet<(Option<GpuId>, String)>,
}

/// Names a process's pod, namespace and container (Kubernetes), or `None` when unknown.
pub type Identify = Box<dyn FnMut(&ProcessEntry) -> Option<PodRef>>;

/// The pipeline subscriber that keeps [`Metrics`] current.
pub struct Recorder {
    metrics: Metrics,
    identify: Identify,
    tracked: HashMap<HostPid, Tracked>,
}

impl Recorder {
    pub fn new(metrics: Metrics, identify: Identify) -> Self {
        Self { metrics, identify, tracked: HashMap::new() }
    }

    /// Processes whose series are kept now (running, or exited within the grace period).
    pub fn tracked(&self) -> usize {
        self.tracked.len()
    }

    /// Per-process series kept now (for the soak: back to the baseline once processes are gone).
    pub fn process_series(&self) -> usize {
        self.tracked.values().map(|t| t.series.len()).sum()
    }

    fn track(&mut self, pid: HostPid, model: &Model) -> &mut Tracked {
        let identify = &mut self.identify;
        self.tracked.entry(pid).or_insert_with(|| {
            let mut base = vec![("kfd_process_id", pid.to_string())];
            let entry = model.process(pid);
            if let Some(pod) = entry.and_then(&mut *identify) {
                base.push(("pod", pod.name));
                base.push(("namespace", pod.namespace));
                if let Some(c) = pod.container {
                    base.push(("container", c));
                }
            } else if let Some(name) = entry.and_then(|p| p.container.as_ref()?.name.clone()) {
                // Outside Kubernetes the runtime's own name (Docker, Podman, LXC) is the container.
                base.push(("container", name));
            }
            Tracked { base, ..Default::default() }
        })
    }

    /// Labels of `pid` plus `extra`, remembered as a series of `family`.
    fn series(&mut self, pid: HostPid, model: &Model, family: PerProcess, extra: &[(&'static str, String)]) -> Labels {
        let t = self.track(pid, model);
        let mut labels = t.base.clone();
        labels.extend_from_slice(extra);
        t.series.insert((family, labels.clone()));
        labels
    }

    /// Set the queue gauges from the live map (states change on events that carry no notice:
    /// evictions and suspends). Call it after each batch of events.
    pub fn refresh(&mut self, model: &Model) {
        for p in model.registry().processes.values() {
            self.track(p.pid, model);
        }
        let pids: Vec<HostPid> = self.tracked.keys().copied().collect();
        for pid in pids {
            let mut counts: BTreeMap<(Option<GpuId>, String, &'static str), i64> = BTreeMap::new();
            if let Some(p) = model.registry().processes.get(&pid) {
                for q in p.queues.values() {
                    let kind = q.queue_type.clone().unwrap_or_else(|| "unknown".to_owned());
                    *counts.entry((q.gpu_id, kind, q.state.name())).or_default() += 1;
                }
            }
            let t = self.track(pid, model);
            for (gpu, kind, _) in counts.keys() {
                t.queue_kinds.insert((*gpu, kind.clone()));
            }
            let kinds: Vec<(Option<GpuId>, String)> = t.queue_kinds.iter().cloned().collect();
            for (gpu, kind) in kinds {
                for state in [QueueState::Active, QueueState::Evicted, QueueState::Suspended] {
                    let mut extra = gpu_label(gpu);
                    extra.push(("queue_type", kind.clone()));
                    extra.push(("state", state.name().to_owned()));
                    let n = counts.get(&(gpu, kind.clone(), state.name())).copied().unwrap_or(0);
                    let labels = self.series(pid, model, PerProcess::Queues, &extra);
                    self.metrics.queues.get_or_create(&labels).set(n);
                }
            }
        }
        self.metrics.processes.set(model.registry().processes.len() as i64);
    }
}

fn gpu_label(gpu: Option<GpuId>) -> Labels {
    gpu.map(|g| ("gpu_id", g.to_string())).into_iter().collect()
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

impl Subscriber for Recorder {
    fn notice(&mut self, notice: ModelNotice, model: &Model) {
        match notice {
            ModelNotice::QueueCreated { pid, queue: QueueAddrs { gpu_id, .. } } => {
                let labels = self.series(pid, model, PerProcess::Creates, &gpu_label(Some(gpu_id)));
                self.metrics.queue_creates.get_or_create(&labels).inc();
            }
            ModelNotice::QueueGone { pid, .. } => {
                let labels = self.series(pid, model, PerProcess::Destroys, &[]);
                self.metrics.queue_destroys.get_or_create(&labels).inc();
            }
            ModelNotice::ProcessOpened { pid } => {
                self.track(pid, model);
            }
            ModelNotice::ProcessGone { .. } | ModelNotice::QueueReset { .. } | ModelNotice::ContextCreated { .. } => {}
        }
    }

    fn span(&mut self, span: &Span, model: &Model) {
        let m = self.metrics.clone();
        let Some(pid) = span.target_pid else { return };
        match span.kind {
            SpanKind::Eviction => {
                let trigger = span.trigger.map_or_else(|| "unknown".to_owned(), |t| t.to_string());
                let mut extra = gpu_label(span.gpu_id);
                extra.push(("trigger", trigger));
                let labels = self.series(pid, model, PerProcess::Evictions, &extra);
                m.evictions.get_or_create(&labels).inc();
                self.series(pid, model, PerProcess::EvictionSeconds, &extra);
                m.eviction_seconds.get_or_create(&labels).inc_by(seconds(span.duration_ns));
                if !span.open {
                    self.series(pid, model, PerProcess::Restores, &extra);
                    m.restores.get_or_create(&labels).inc();
                }
            }
            SpanKind::Suspend | SpanKind::Resume => {
                let op = if span.kind == SpanKind::Suspend { "suspend" } else { "resume" };
                let labels = self.series(pid, model, PerProcess::DebugTrap, &[("operation", op.to_owned())]);
                m.debug_trap_ops.get_or_create(&labels).inc();
                let node = vec![("operation", op.to_owned())];
                m.debug_trap_seconds.get_or_create(&node).observe(seconds(span.duration_ns));
                // A phase the call did not run (no remap after a suspend, no fence wait under MES)
                // is not a zero-length sample.
                if let Some(b) = &span.breakdown {
                    for (family, ns) in [
                        (&m.hws_unmap_seconds, b.unmap_ns),
                        (&m.hws_fence_wait_seconds, b.fence_wait_ns),
                        (&m.hws_remap_seconds, b.remap_ns),
                    ] {
                        if ns > 0 {
                            family.get_or_create(&node).observe(seconds(ns));
                        }
                    }
                }
                let mut victims: BTreeMap<HostPid, u64> = BTreeMap::new();
                for c in &span.collateral {
                    *victims.entry(c.pid).or_default() += 1;
                }
                for (victim, n) in victims {
                    let labels = self.series(victim, model, PerProcess::Collateral, &[]);
                    m.collateral.get_or_create(&labels).inc_by(n);
                }
            }
        }
    }

    fn forgotten(&mut self, pid: HostPid) {
        let Some(t) = self.tracked.remove(&pid) else { return };
        let m = &self.metrics;
        for (family, labels) in &t.series {
            match family {
                PerProcess::Queues => m.queues.remove(labels),
                PerProcess::Creates => m.queue_creates.remove(labels),
                PerProcess::Destroys => m.queue_destroys.remove(labels),
                PerProcess::Evictions => m.evictions.remove(labels),
                PerProcess::Restores => m.restores.remove(labels),
                PerProcess::EvictionSeconds => m.eviction_seconds.remove(labels),
                PerProcess::DebugTrap => m.debug_trap_ops.remove(labels),
                PerProcess::Collateral => m.collateral.remove(labels),
            };
        }
    }
}

/// A [`Recorder`] shared between the pipeline (which feeds it) and the loop that refreshes the
/// queue gauges after each batch.
impl Subscriber for std::rc::Rc<std::cell::RefCell<Recorder>> {
    fn notice(&mut self, notice: ModelNotice, model: &Model) {
        self.borrow_mut().notice(notice, model);
    }
    fn span(&mut self, span: &Span, model: &Model) {
        self.borrow_mut().span(span, model);
    }
    fn forgotten(&mut self, pid: HostPid) {
        self.borrow_mut().forgotten(pid);
    }
}

#[cfg(test)]
mod tests;

fn policy_gpu(policy: &str, gpu: GpuId) -> Labels {
    vec![(label::POLICY, policy.to_owned()), (label::GPU_ID, gpu.to_string())]
}
