//! `gpreempt preempt --offline PID`: the suspend/resume measurement loop, its progress line, the
//! summary and the `--json` record file.

use std::{
    io::{IsTerminal, Write},
    path::Path,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use gpreempt::{
    domain::HostPid,
    kfd::{
        KfdVersion,
        debugger::{Options, Selection},
        session::Session,
        target::Target,
        uapi::runtime_state,
    },
    model::{Model, spans::Span},
    preempt::{self, Iteration, KernelSide, Plan, RunSummary, StopReason, monotonic_ns},
    roots::Roots,
    signal_pipe::SignalPipe,
    stats::{self, Summary},
    trace::{
        filter::Filter,
        live::Live,
        loader,
        pipeline::{Observed, Pipeline},
        stream::Losses,
    },
};
use serde_json::json;

use super::interrupt;
use super::stdout::{out, outln};
use crate::cli::{PreemptArgs, QueueSelectionArg};

/// The tracer, in-process: the driver's side of every suspend/resume of the offline process.
struct KernelTracer {
    live: Live,
    /// No sinks: the spans reach `observe` through the channel subscriber.
    pipeline: Pipeline,
    observed: std::sync::mpsc::Receiver<Observed>,
    /// The offline process's closed spans so far, matched to iterations by time at the end.
    spans: Vec<Span>,
    offline: HostPid,
    online: Option<HostPid>,
}

impl KernelTracer {
    /// `version`: the KFD version the debug session already read (the probe table's minimums).
    fn start(offline: u32, online: Option<u32>, version: KfdVersion) -> Result<Self> {
        let live = Live::start(Some(version), std::path::Path::new(loader::BTF_DIR))?;
        let roots = Roots::default();
        let mut model = Model::new(Some(roots.clone()));
        model.bootstrap(&roots);
        let mut pipeline = Pipeline::new(model, Filter::default());
        let (tx, observed) = std::sync::mpsc::channel();
        pipeline.subscribe(Box::new(tx));
        Ok(Self { live, pipeline, observed, spans: Vec::new(), offline: HostPid(offline), online: online.map(HostPid) })
    }

    /// Move what the probes recorded so far out of the ring buffer (reading its memory, no
    /// system call) and keep the offline process's spans.
    fn collect(&mut self) {
        let pipeline = &mut self.pipeline;
        self.live.stream.drain(|event| pipeline.deliver(&event));
        let offline = self.offline;
        self.spans.extend(self.observed.try_iter().filter_map(|o| match o {
            Observed::Span(s) if s.target_pid == Some(offline) => Some(s),
            _ => None,
        }));
    }

    /// Each iteration's kernel side: the spans inside its ioctl windows.
    fn annotate(&mut self, iterations: &mut [Iteration]) {
        self.collect();
        for it in iterations {
            it.kernel = KernelSide::of_iteration(&self.spans, it, self.offline, self.online);
        }
    }

    /// What the in-process tracer could not deliver: a lost record is a breakdown that is missing,
    /// and a missed return probe (a suspend waiting in the fence) one that never started.
    fn losses(&self) -> Option<Losses> {
        self.live.stream.losses().ok()
    }
}

pub fn run(args: &PreemptArgs) -> Result<()> {
    let stop = interrupt::install()?;
    if let Some(online) = args.online {
        Target::inspect(&Roots::default(), online).context("--online")?;
    }
    // Ctrl-C also wakes the session's ppoll (the flag alone would wait for its next look).
    let stop_pipe = SignalPipe::new(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP])
        .map_err(|e| anyhow::anyhow!("cannot watch for Ctrl-C: {e}"))?;
    let options = Options { max_suspend: Some(Duration::from_millis(args.max_suspend_ms)), ..Options::default() };
    // This thread seizes the target and runs the whole plan (docs/kfd.md §2.1).
    let mut session = Session::attach(HostPid(args.offline), &options)?;
    // After the session is up, so bad targets and old kernels are refused at once.
    let mut tracer = if args.no_trace {
        None
    } else {
        match KernelTracer::start(args.offline, args.online, session.attached().kfd_version) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!(
                    "gpreempt: no kernel-side breakdown (the tracer could not attach: {e:#}); --no-trace hides this"
                );
                None
            }
        }
    };
    let target = session.attached().clone();
    eprintln!(
        "gpreempt: attached to pid {} ({}), KFD {}, runtime {}",
        target.pid,
        gpreempt::output::text::escape(&target.comm),
        target.kfd_version,
        runtime_name(target.runtime_state)
    );
    let plan = Plan {
        iterations: args.iterations,
        hold: Duration::from_millis(args.hold_ms),
        gap: Duration::from_millis(args.gap_ms),
        grace_period: args.grace_period,
        selection: match &args.queues {
            QueueSelectionArg::All => Selection::All,
            QueueSelectionArg::Ids(ids) => Selection::Ids(ids.clone()),
        },
    };
    let show_progress = !args.quiet && std::io::stderr().is_terminal();
    // Side work between cycles is throttled: the tracer's ring buffer every 10 ms, the progress
    // line every 100 ms (and always for the last iteration).
    let (mut drained_ns, mut shown_ns) = (0u64, 0u64);
    let mut run = preempt::run(&mut session, &plan, stop, &[stop_pipe.fd()], |it| {
        let now = it.resume_returned_ns;
        if let Some(t) = tracer.as_mut()
            && now >= drained_ns + 10_000_000
        {
            t.collect();
            drained_ns = now;
        }
        if show_progress && (now >= shown_ns + 100_000_000 || it.index + 1 == plan.iterations) {
            progress_line(it, plan.iterations);
            shown_ns = monotonic_ns();
        }
    });
    // Resume whatever is suspended, DISABLE, detach — before reporting anything.
    let detached = session.detach();
    if let Some(t) = tracer.as_mut() {
        t.annotate(&mut run.iterations);
    }
    if show_progress {
        eprintln!();
    }
    let summary = run.summary(plan.iterations);
    print_summary(&summary, &run.iterations);
    let tracer_losses = tracer.as_ref().and_then(KernelTracer::losses);
    if let Some(l) = &tracer_losses {
        outln!("kernel-side tracer: {} records lost ({l})", l.dropped());
    }
    for notice in &run.notices {
        eprintln!("gpreempt: {}", serde_json::to_string(notice)?);
    }
    if let Some(path) = &args.json {
        let doc = json!({
            "target": target,
            "plan": {
                "iterations": plan.iterations,
                "hold_ms": args.hold_ms,
                "gap_ms": args.gap_ms,
                "grace_period": plan.grace_period,
                "queues": match &plan.selection { Selection::All => json!("all"), Selection::Ids(ids) => json!(ids) },
                "max_suspend_ms": args.max_suspend_ms,
            },
            "iterations": run.iterations,
            "notices": run.notices,
            "summary": summary,
            "detached": detached,
            "tracer_losses": tracer_losses,
        });
        write_atomically(path, &serde_json::to_vec_pretty(&doc)?)?;
    }
    match &run.stopped {
        None => Ok(()),
        Some(StopReason::Interrupted) => bail!(
            "interrupted by {} after {} of {} iterations; queues resumed, target detached",
            interrupt::received().unwrap_or_else(|| "a signal".into()),
            run.iterations.len(),
            plan.iterations
        ),
        Some(reason @ StopReason::Failed(_)) => {
            bail!("stopped after {} of {} iterations: {reason}", run.iterations.len(), plan.iterations)
        }
    }
}

fn runtime_name(state: u32) -> &'static str {
    match state {
        runtime_state::DISABLED => "not enabled (suspends will fail until the target's ROCm runtime starts)",
        runtime_state::ENABLED => "enabled",
        runtime_state::ENABLED_BUSY => "enabled-busy",
        runtime_state::ENABLED_ERROR => "enabled-error",
        _ => "unknown",
    }
}

fn progress_line(it: &Iteration, total: u32) {
    let us = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
    let mut err = std::io::stderr().lock();
    let _ = write!(
        err,
        "\r[{:>width$}/{total}] suspend {:>9} us  resume {:>9} us  queues {} suspended, {} invalid, {} error   ",
        it.index + 1,
        us(it.suspend_us),
        us(it.resume_us),
        it.suspended,
        it.invalid,
        it.error,
        width = total.to_string().len()
    );
    let _ = err.flush();
}

fn print_summary(s: &RunSummary, iterations: &[Iteration]) {
    outln!("{} of {} iterations, {} fully successful ({:.1}%)", s.completed, s.planned, s.ok, 100.0 * s.success_rate);
    let queues: i64 = iterations.iter().map(|i| i64::from(i.suspended)).sum();
    let invalid: usize = iterations.iter().map(|i| i.invalid).sum();
    let errors: usize = iterations.iter().map(|i| i.error).sum();
    outln!("queues suspended in total: {queues}; INVALID answers: {invalid}; ERROR answers: {errors}");
    if let Some(f) = &s.fence_wait_us {
        outln!("in-driver preemption (fence wait) per suspend (us): {}", line(f));
    }
    if let Some(c) = s.collateral_queues {
        out!("other processes' queues preempted by the device-wide unmaps: {c}");
        match s.online_queues {
            Some(o) if o > 0 => outln!(" (of them the online process's: {o})"),
            _ => outln!(""),
        }
    }
    for (name, summary, hist) in
        [("suspend", &s.suspend_us, &s.suspend_histogram), ("resume", &s.resume_us, &s.resume_histogram)]
    {
        match summary {
            Some(v) => {
                outln!("{name} latency (us): {}", line(v));
                out!("{}", stats::render_histogram(hist, "us", 40));
            }
            None => outln!("{name} latency: no ioctl made"),
        }
    }
}

fn line(s: &Summary) -> String {
    format!(
        "p50 {:.1}  p90 {:.1}  p99 {:.1}  max {:.1}  mean {:.1}  stddev {:.1}  (n={})",
        s.p50, s.p90, s.p99, s.max, s.mean, s.stddev, s.count
    )
}

/// Output-file wiring: never through a symlink, never half a file (`gpreempt::output::file`).
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    Ok(gpreempt::output::file::write_atomically(path, bytes)?)
}
