//! `gpreempt preempt --offline SEL...`: the suspend/resume measurement loop on one target or on
//! several (`gpreempt::controller::group`), its progress line, the summaries and the `--json` record file.

use super::stderr::errln;
use std::{
    io::{IsTerminal, Write},
    path::Path,
    sync::atomic::AtomicBool,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use gpreempt::{
    clock::monotonic_ns,
    controller::{
        group::{self, Group, Hooks, Member},
        measure::{self, Iteration, KernelSide, Plan, RunSummary, StopReason},
        record::{GroupRecord, PlanRecord, RunRecord, TargetRecord},
        session::Session,
        signal_pipe::SignalPipe,
        target::Target,
        vocabulary::{AttachedTarget, Options, Selection},
    },
    domain::{HostPid, QueueId},
    event::Losses,
    host::{processes, roots::Roots, select::Selector},
    kfd::KfdVersion,
    model::ModelNotice,
    pipeline::in_process::{DrainingTracer, TracerOptions},
    schedule::discover::{Discovery, SysfsDiscovery},
    stats::{self, Summary},
};

use super::interrupt;
use super::stdout::{self, out, outln};
use crate::cli::{PreemptArgs, QueueSelectionArg};

pub fn run(args: &PreemptArgs) -> Result<()> {
    let stop = interrupt::install()?;
    let online = match &args.online {
        None => None,
        // A pid need not have opened /dev/kfd yet; it must exist.
        Some(Selector::Pid(pid)) => {
            Target::inspect(&Roots::default(), *pid).with_context(|| format!("--online {pid}"))?;
            Some(*pid)
        }
        Some(selector) => Some(super::one_process(selector, &Roots::default(), "--online")?),
    };
    if args.json {
        // Stdout carries the JSON document; the text summary goes to stderr.
        stdout::divert_text_to_stderr();
    }
    // Ctrl-C also wakes the session's ppoll (the flag alone would wait for its next look).
    let stop_pipe = SignalPipe::new(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP])
        .map_err(|e| anyhow::anyhow!("cannot watch for Ctrl-C: {e}"))?;
    let options = Options { max_suspend: Some(args.max_suspend), ..Options::default() };
    let plan = Plan {
        iterations: args.iterations,
        hold: args.hold,
        gap: args.gap,
        grace_period: args.grace_period,
        selection: match &args.queues {
            QueueSelectionArg::All => Selection::All,
            QueueSelectionArg::Ids(ids) => Selection::Ids(ids.iter().copied().map(QueueId).collect()),
        },
    };
    match args.offline.as_slice() {
        // One pid: the single-target loop and its record shape.
        [Selector::Pid(pid)] => run_one(args, *pid, online, &plan, &options, stop, &stop_pipe),
        _ => run_group(args, online, &plan, options, stop, &stop_pipe),
    }
}

/// How often the tracer's thread drains the ring buffer during a run.
const DRAIN_PERIOD: Duration = Duration::from_millis(10);

/// The in-process tracer on a thread of `scope`, keeping the spans of `offline`, or why not (said
/// once on stderr). Started after the targets are attached, so bad targets and old kernels are
/// refused at once.
fn start_tracer<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    args: &PreemptArgs,
    offline: Vec<HostPid>,
    version: KfdVersion,
) -> Option<DrainingTracer<'scope>> {
    if args.no_trace {
        return None;
    }
    let options = TracerOptions { version: Some(version), ..TracerOptions::default() };
    match DrainingTracer::spawn(scope, options, offline, DRAIN_PERIOD) {
        Ok(t) => Some(t),
        Err(e) => {
            errln!("gpreempt: no kernel-side breakdown (the tracer could not attach: {e}); --no-trace hides this");
            None
        }
    }
}

/// Stop the tracer and give each target's iterations the driver's side (the spans inside its
/// ioctl windows); the tracer's losses. A tracer thread that failed leaves the records as they
/// are.
fn annotate<'a>(
    tracer: Option<DrainingTracer<'_>>,
    targets: impl IntoIterator<Item = (HostPid, &'a mut Vec<Iteration>)>,
    online: Option<HostPid>,
) -> Option<Losses> {
    let tracer = tracer?;
    let Some(drained) = tracer.finish() else {
        errln!("gpreempt: the tracer thread failed; no kernel-side breakdown");
        return None;
    };
    for (pid, iterations) in targets {
        for it in iterations {
            it.kernel = KernelSide::of_iteration(&drained.spans, it, pid, online);
        }
    }
    drained.losses
}

fn run_one(
    args: &PreemptArgs,
    offline: HostPid,
    online: Option<HostPid>,
    plan: &Plan,
    options: &Options,
    stop: &'static AtomicBool,
    stop_pipe: &SignalPipe,
) -> Result<()> {
    // This thread seizes the target and runs the whole plan (docs/kfd.md §2.1).
    let mut session = Session::attach(offline, options)?;
    let version = session.attached().kfd_version;
    let target = session.attached().clone();
    let show_progress = !args.quiet && std::io::stderr().is_terminal();
    // The progress line is throttled to every 100 ms (and always shown for the last iteration).
    let mut shown_ns = 0u64;
    let (run, tracer_losses) = std::thread::scope(|scope| {
        let tracer = start_tracer(scope, args, vec![offline], version);
        attached_line(&target);
        let mut run = measure::run(&mut session, plan, stop, &[stop_pipe.fd()], |c| {
            let now = c.ended_ns();
            if show_progress && (now >= shown_ns + 100_000_000 || c.index + 1 == plan.iterations) {
                progress_line(&c.iteration(), plan.iterations);
                shown_ns = monotonic_ns();
            }
        });
        let losses = annotate(tracer, [(offline, &mut run.iterations)], online);
        (run, losses)
    });
    // Resume whatever is suspended, DISABLE, detach — before reporting anything.
    let detached = session.detach();
    if show_progress {
        errln!();
    }
    let summary = run.summary(plan.iterations);
    print_summary(&summary, &run.iterations);
    if let Some(l) = &tracer_losses {
        outln!("kernel-side tracer: {} records lost ({l})", l.dropped());
    }
    for notice in &run.notices {
        errln!("gpreempt: {}", serde_json::to_string(notice)?);
    }
    if args.json || args.output.is_some() {
        let doc = RunRecord {
            target: &target,
            plan: PlanRecord::of(plan, args.max_suspend.as_millis() as u64),
            iterations: &run.iterations,
            notices: &run.notices,
            summary: &summary,
            detached: &detached,
            tracer_losses: tracer_losses.as_ref(),
        };
        record(args, &doc)?;
    }
    ended(run.stopped.as_ref(), run.iterations.len(), plan.iterations, "target")
}

/// The exit of a run that did `done` of `planned` cycles.
fn ended(stopped: Option<&StopReason>, done: usize, planned: u32, whom: &str) -> Result<()> {
    match stopped {
        None => Ok(()),
        Some(StopReason::Interrupted) => bail!(
            "interrupted by {} after {done} of {planned} iterations; queues resumed, {whom} detached",
            interrupt::received().unwrap_or_else(|| "a signal".into()),
        ),
        Some(reason @ (StopReason::Failed(_) | StopReason::AllTargetsGone)) => {
            bail!("stopped after {done} of {planned} iterations: {reason}")
        }
    }
}

fn attached_line(target: &AttachedTarget) {
    errln!(
        "gpreempt: attached to pid {} ({}), KFD {}, runtime {}",
        target.pid,
        gpreempt::output::text::escape(&target.comm),
        target.kfd_version,
        target.runtime_state.describe()
    );
}

/// What the multi-target loop needs from this side: progress, and the processes that opened
/// `/dev/kfd` (the tracer's process events and the sysfs process list: the tracer starts after
/// the targets are attached and would miss what opened meanwhile). The tracer drains on its own
/// thread; both hooks only read and send channel messages.
struct GroupSide<'t, 'scope> {
    tracer: Option<&'t DrainingTracer<'scope>>,
    /// Pids whose spans the tracer keeps.
    announced: Vec<HostPid>,
    /// Only when a container is selected (a pid selector names its process once).
    sysfs: Option<SysfsDiscovery>,
    changes: Vec<ModelNotice>,
    polled_ns: u64,
    shown_ns: u64,
    show_progress: bool,
    planned: u32,
}

impl Hooks for GroupSide<'_, '_> {
    fn cycle(&mut self, index: u32, members: &[Member]) {
        let now = monotonic_ns();
        if self.show_progress && (now >= self.shown_ns + 100_000_000 || index + 1 == self.planned) {
            let this = members.iter().filter_map(|m| m.run.iterations.last().filter(|it| it.index == index));
            let (n, suspended, failed) =
                this.fold((0, 0, 0), |(n, s, f), it| (n + 1, s + it.suspended, f + usize::from(!it.ok)));
            let mut err = std::io::stderr().lock();
            let width = self.planned.to_string().len();
            let _ = write!(
                err,
                "\r[{:>width$}/{}] {n} target(s): {suspended} queue(s) suspended and resumed, {failed} not ok   ",
                index + 1,
                self.planned
            );
            let _ = err.flush();
            self.shown_ns = monotonic_ns();
        }
    }

    fn opened(&mut self, out: &mut Vec<HostPid>) {
        let from = out.len();
        if let Some(t) = self.tracer {
            t.opened(out);
        }
        let now = monotonic_ns();
        if let Some(sysfs) = self.sysfs.as_mut()
            && now >= self.polled_ns + 100_000_000
        {
            self.polled_ns = now;
            sysfs.poll(&mut self.changes);
            out.extend(self.changes.drain(..).filter_map(|c| match c {
                ModelNotice::ProcessOpened { pid } => Some(pid),
                _ => None,
            }));
        }
        // Offered to the group before their first suspend, so the tracer keeps their spans from
        // that suspend on (a pid the group then refuses costs nothing: it is never suspended).
        if let Some(t) = self.tracer {
            for &pid in &out[from..] {
                if !self.announced.contains(&pid) {
                    self.announced.push(pid);
                    t.keep(pid);
                }
            }
        }
    }
}

/// Several offline targets (pids, containers) held by this thread, cycled together.
fn run_group(
    args: &PreemptArgs,
    online: Option<HostPid>,
    plan: &Plan,
    options: Options,
    stop: &'static AtomicBool,
    stop_pipe: &SignalPipe,
) -> Result<()> {
    let roots = options.roots.clone();
    // Container and pod selectors name the processes that open /dev/kfd later too.
    let watch_new = args.offline.iter().any(|s| matches!(s, Selector::Container(_) | Selector::Pod(_)));
    // The baseline before the scan: whatever opens /dev/kfd after it is offered to the group.
    let sysfs = watch_new.then(|| SysfsDiscovery::new(roots.clone()));
    let (processes, notes) = processes::scan(&roots);
    for note in notes {
        errln!("gpreempt: {note}");
    }
    let pids = group::plan(&args.offline, online, &processes, &roots)?;
    // This thread seizes every target and runs the whole plan (docs/kfd.md §2.1).
    let mut group = Group::attach(&pids, &args.offline, online, options)?;
    for m in group.members() {
        attached_line(&m.target);
    }
    let version = group.members()[0].target.kfd_version;
    let show_progress = !args.quiet && std::io::stderr().is_terminal();
    let (stopped, warnings, members, tracer_losses) = std::thread::scope(|scope| {
        let tracer = start_tracer(scope, args, pids.clone(), version);
        let mut side = GroupSide {
            tracer: tracer.as_ref(),
            announced: pids.clone(),
            sysfs,
            changes: Vec::new(),
            polled_ns: 0,
            shown_ns: 0,
            show_progress,
            planned: plan.iterations,
        };
        let stopped = group.run(plan, stop, &[stop_pipe.fd()], &mut side);
        let warnings = std::mem::take(&mut group.warnings);
        // Resume whatever is suspended, DISABLE, detach — every target — before reporting anything.
        let mut members = group.detach();
        if show_progress {
            errln!();
        }
        let targets = members.iter_mut().map(|m| (m.target.pid, &mut m.run.iterations));
        let losses = annotate(tracer, targets, online);
        (stopped, warnings, members, losses)
    });
    for w in &warnings {
        errln!("gpreempt: {w}");
    }
    let mut targets = Vec::with_capacity(members.len());
    let cycles = members.iter().map(|m| m.first_iteration as usize + m.run.iterations.len()).max().unwrap_or(0);
    for m in &members {
        let planned = plan.iterations.saturating_sub(m.first_iteration);
        let summary = m.run.summary(planned);
        outln!(
            "pid {} ({}){}, from iteration {}:",
            m.target.pid,
            gpreempt::output::text::escape(&m.target.comm),
            if m.picked_up { ", attached when it opened /dev/kfd" } else { "" },
            m.first_iteration
        );
        print_summary(&summary, &m.run.iterations);
        if m.runtime_not_enabled > 0 {
            outln!("iterations skipped, its ROCm runtime not enabled: {}", m.runtime_not_enabled);
        }
        if let Some(why) = &m.run.stopped {
            outln!("left the run early: {why}");
        }
        for notice in &m.run.notices {
            errln!("gpreempt: pid {}: {}", m.target.pid, serde_json::to_string(notice)?);
        }
        targets.push(TargetRecord {
            target: &m.target,
            first_iteration: m.first_iteration,
            picked_up: m.picked_up,
            iterations: &m.run.iterations,
            runtime_not_enabled: m.runtime_not_enabled,
            notices: &m.run.notices,
            summary,
            stopped: m.run.stopped.as_ref(),
            detached: m.detached.as_ref(),
        });
    }
    // A pid named in --offline is expected to last the run, so its early exit (or failure) fails
    // the command; the processes of a selected container may come and go (reported either way).
    let named: Vec<HostPid> =
        args.offline.iter().filter_map(|s| if let Selector::Pid(p) = s { Some(*p) } else { None }).collect();
    let left: Vec<String> = members
        .iter()
        .filter(|m| named.contains(&m.target.pid))
        .filter_map(|m| m.run.stopped.as_ref().map(|why| format!("pid {}: {why}", m.target.pid)))
        .collect();
    if let Some(l) = &tracer_losses {
        outln!("kernel-side tracer: {} records lost ({l})", l.dropped());
    }
    if args.json || args.output.is_some() {
        let doc = GroupRecord {
            version: GroupRecord::VERSION,
            selectors: &args.offline,
            plan: PlanRecord::of(plan, args.max_suspend.as_millis() as u64),
            targets,
            warnings: &warnings,
            cycles,
            stopped: stopped.as_ref(),
            tracer_losses: tracer_losses.as_ref(),
        };
        record(args, &doc)?;
    }
    ended(stopped.as_ref(), cycles, plan.iterations, "targets")?;
    if !left.is_empty() {
        bail!(
            "{} of the {} pids named in --offline left the run early ({}); the other targets ran all {cycles} cycles",
            left.len(),
            named.len(),
            left.join("; ")
        );
    }
    Ok(())
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
    if let Some(c) = &s.cwsr {
        outln!(
            "CWSR save area behind each suspend: {} bytes ({:.1} MiB) over {} queue(s): the most wave state one suspend writes",
            c.bytes,
            c.bytes as f64 / 1048576.0,
            c.queues
        );
    }
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

/// The run's record as JSON: on stdout with `--json`, to the `--output` file (never through a
/// symlink, never half a file: `gpreempt::output::file`).
fn record(args: &PreemptArgs, doc: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(doc)?;
    if args.json {
        stdout::json(&text);
    }
    if let Some(path) = &args.output {
        write_atomically(path, text.as_bytes())?;
    }
    Ok(())
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    Ok(gpreempt::output::file::write_atomically(path, bytes)?)
}
