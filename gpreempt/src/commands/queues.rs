//! `gpreempt queues SEL`: one process's queues from sysfs (by default: nothing the GPU notices, no
//! /dev/kfd) or
//! from a debug-trap snapshot (`--debug-snapshot`, which preempts the GPU's queues twice), once or
//! sampled with `--watch`. While watching, the in-process tracer (when it can attach) adds what
//! only it sees of the queues created meanwhile (`gpreempt::views::traced_queues`).

use super::stderr::errln;
use std::{
    path::PathBuf,
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use gpreempt::{
    clock::boottime_ns,
    controller::{Debugger, measure::sleep_unless, target::Target, vocabulary::Options},
    domain::HostPid,
    host::{partition::Partitions, roots::Roots, sysfs},
    kfd::{Device, KfdVersion},
    model::QueueNotice,
    output::text::escape,
    pipeline::in_process::{InProcessTracer, TracerOptions},
    views::{
        queues::{self, QueueRow, Sample, Source, WatchStats},
        traced_queues::{self, TracedQueue, TracedQueues},
    },
};
use serde_json::json;

use super::interrupt;
use super::stdout::outln;
use crate::cli::QueuesArgs;

/// Where samples come from.
enum Lister {
    DebugTrap(Debugger),
    /// The KFD process directory (`/sys/class/kfd/kfd/proc`) and the pid.
    Sysfs(PathBuf, HostPid),
}

impl Lister {
    fn source(&self) -> Source {
        match self {
            Self::DebugTrap(_) => Source::DebugTrap,
            Self::Sysfs(..) => Source::Sysfs,
        }
    }

    /// Sorted by context, then queue id (KFD lists a process's queues newest first: `list_add` in
    /// pqm_create_queue, 6.12).
    fn sample(&self) -> Result<Vec<QueueRow>> {
        let mut rows: Vec<QueueRow> = match self {
            // Without clearing EC_QUEUE_NEW: looking must not change what a later suspend sees.
            Self::DebugTrap(d) => d.snapshot(false)?.iter().map(QueueRow::from).collect(),
            Self::Sysfs(root, pid) => sysfs::read_process(root, *pid)?.queues.iter().map(QueueRow::from).collect(),
        };
        rows.sort_by_key(QueueRow::key);
        Ok(rows)
    }
}

/// Each row's partition, from the topology (read once: partitions change only with a driver
/// reload).
fn with_partitions(mut rows: Vec<QueueRow>, partitions: &Partitions) -> Vec<QueueRow> {
    for r in &mut rows {
        r.partition = r.gpu_id.and_then(|g| partitions.get(g)).copied();
    }
    rows
}

/// What `--debug-snapshot` costs, said on stderr whenever it is used.
const SNAPSHOT_COST: &str = "gpreempt: --debug-snapshot: debug ENABLE and DISABLE each preempt every queue of every \
                             process on the GPU (a hardware-scheduler runlist refresh), and may reserve a debug VMID \
                             while attached";

pub fn run(args: &QueuesArgs) -> Result<()> {
    let roots = Roots { sys: args.sysfs_root.clone(), proc: args.proc_root.clone(), ..Roots::default() };
    let pid = super::one_process(&args.process, &roots, "queues")?;
    let target = Target::inspect(&roots, pid)?;
    let sysfs = Lister::Sysfs(roots.kfd_proc(), pid);
    // Only the opt-in snapshot opens /dev/kfd: the default reads sysfs and nothing else.
    let (lister, version) = if !args.debug_snapshot {
        (sysfs, None)
    } else {
        let version = Device::open().and_then(|d| d.version()).context("reading the KFD version")?;
        if version.has_debug_trap() {
            errln!("{SNAPSHOT_COST}");
            (Lister::DebugTrap(Debugger::attach(pid, Options::default())?), Some(version))
        } else {
            errln!(
                "gpreempt: KFD {version} has no debug-trap API (needs ≥ {}, Linux 6.5+): showing what sysfs has \
                 (queue id, gpu, type, ring size)",
                KfdVersion::DEBUG_TRAP
            );
            (sysfs, Some(version))
        }
    };
    match args.watch {
        Some(interval) => {
            let tracer = match &lister {
                Lister::Sysfs(_, pid) if !args.no_trace => Watcher::start(*pid, version),
                _ => None,
            };
            watch(args, &target, &lister, interval, tracer)
        }
        None => {
            let rows = with_partitions(lister.sample()?, &Partitions::read(&roots.sys));
            print_once(args, &target, version, lister.source(), &rows)
        }
    }
}

fn print_once(
    args: &QueuesArgs,
    target: &Target,
    version: Option<KfdVersion>,
    source: Source,
    rows: &[QueueRow],
) -> Result<()> {
    if args.ids_only {
        rows.iter().for_each(|q| outln!("{}", q.key()));
    } else if args.json {
        let out =
            json!({"pid": target.pid, "comm": target.comm, "kfd_version": version, "source": source, "queues": rows});
        outln!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        outln!("pid {} ({}): {} queue(s), from {}", target.pid, escape(&target.comm), rows.len(), source_name(source));
        print_table(rows);
    }
    Ok(())
}

fn source_name(source: Source) -> &'static str {
    match source {
        Source::DebugTrap => "the debug-trap snapshot",
        Source::Sysfs => "sysfs",
    }
}

fn print_table(rows: &[QueueRow]) {
    queues::table(rows).iter().for_each(|line| outln!("{line}"));
}

/// The in-process tracer while watching, and what it learnt of the process's queues.
struct Watcher {
    tracer: InProcessTracer,
    queues: TracedQueues,
    /// The model's queue notices in full, from the tracer's pipeline.
    notices: mpsc::Receiver<QueueNotice>,
}

impl Watcher {
    /// `None` (said on stderr) when the tracer cannot attach: the view is then sysfs alone.
    fn start(pid: HostPid, version: Option<KfdVersion>) -> Option<Self> {
        match InProcessTracer::start(&TracerOptions { version, ..TracerOptions::default() }) {
            Ok(mut tracer) => {
                let (tx, notices) = mpsc::channel();
                tracer.pipeline_mut().subscribe(Box::new(tx));
                errln!(
                    "gpreempt: tracer attached: queues created from now on are shown with their ring, index and \
                     CWSR addresses and doorbell (no debug-trap call; --no-trace for sysfs alone)"
                );
                Some(Self { tracer, queues: TracedQueues::new(pid), notices })
            }
            Err(e) => {
                errln!("gpreempt: sysfs only (the tracer could not attach: {e:#}); --no-trace hides this");
                None
            }
        }
    }

    /// Take the records so far (reading the ring buffer's memory, no waiting).
    fn drain(&mut self) {
        let queues = &mut self.queues;
        self.tracer.drain(|event| queues.count_refresh(event));
        self.notices.try_iter().for_each(|n| queues.apply(&n));
    }
}

/// A traced queue with its times relative to the start of the watch, ms.
fn traced_json(q: &TracedQueue, start_boot_ns: u64) -> serde_json::Value {
    let ms = |ns: u64| ns.saturating_sub(start_boot_ns) as f64 / 1e6;
    let mut v = json!(q);
    v["created_ms"] = json!(ms(q.created_ns));
    v["destroyed_ms"] = json!(q.destroyed_ns.map(ms));
    v
}

fn watch(
    args: &QueuesArgs,
    target: &Target,
    lister: &Lister,
    interval: Duration,
    mut tracer: Option<Watcher>,
) -> Result<()> {
    let stop = interrupt::install()?;
    let duration = args.duration.unwrap_or(Duration::from_secs(10));
    let start = Instant::now();
    let start_boot_ns = boottime_ns();
    let mut rows = Vec::new();
    let partitions = Partitions::read(&args.sysfs_root);
    let mut samples = Vec::new();
    while start.elapsed() < duration {
        let tick = Instant::now();
        let mut now = with_partitions(lister.sample()?, &partitions);
        if let Some(t) = tracer.as_mut() {
            t.drain();
            now.iter_mut().for_each(|row| t.queues.enrich(row));
        }
        let sample =
            Sample { t_ms: start.elapsed().as_millis() as u64, queue_ids: now.iter().map(QueueRow::key).collect() };
        if !args.json && !args.ids_only {
            outln!("{}", sample.line());
        }
        samples.push(sample);
        rows.push(now);
        if !sleep_unless(stop, interval.saturating_sub(tick.elapsed())) {
            break;
        }
    }
    if let Some(t) = tracer.as_mut() {
        t.drain();
    }
    let stats = WatchStats::of(&rows).context("no sample was taken")?;
    let last = rows.last().cloned().unwrap_or_default();
    if args.json {
        let traced = tracer.as_ref().map(|t| {
            json!({
                "queues": t.queues.queues().map(|q| traced_json(q, start_boot_ns)).collect::<Vec<_>>(),
                // Runlist refreshes (execute_queues_cpsch) the tracer saw while watching: this
                // view's own, and the watched process's.
                "runlist_refreshes": {
                    "by_this_process": t.queues.refreshes_by(HostPid(std::process::id())),
                    "by_the_process": t.queues.refreshes_by(target.pid),
                },
            })
        });
        let out = json!({
            "pid": target.pid,
            "comm": target.comm,
            "source": lister.source(),
            "samples": samples,
            "stats": stats,
            "queues": last,
            "tracer": traced,
        });
        outln!("{}", serde_json::to_string_pretty(&out)?);
    } else if args.ids_only {
        stats.id_frequency.keys().for_each(|id| outln!("{id}"));
    } else {
        outln!("samples: {}", stats.samples);
        outln!("queue count: min {} / avg {:.2} / max {}", stats.min_count, stats.avg_count, stats.max_count);
        outln!("stable: {}", if stats.stable { "yes (same queue ids in every sample)" } else { "no" });
        for (id, n) in &stats.id_frequency {
            outln!(
                "  queue {id:>4}: in {n} of {} samples ({:.1}%)",
                stats.samples,
                100.0 * *n as f64 / stats.samples as f64
            );
        }
        for (gpu, n) in &stats.per_gpu {
            outln!("  gpu {gpu}: {n} queue observation(s)");
        }
        for (ty, n) in &stats.per_type {
            outln!("  {ty}: {n} queue observation(s)");
        }
        if let Some(t) = &tracer {
            print_traced(t, start_boot_ns);
        }
        outln!("last sample:");
        print_table(&last);
    }
    Ok(())
}

/// The queues created while watching, as the tracer saw their CREATE_QUEUE.
fn print_traced(t: &Watcher, start_boot_ns: u64) {
    outln!("queues created while watching (from the tracer): {}", t.queues.queues().count());
    traced_queues::table(t.queues.queues(), start_boot_ns).iter().for_each(|line| outln!("{line}"));
}
