//! `gpreempt trace`: attach, stream, keep the queue map and spans, print, and account for every
//! record on exit.

use super::stderr::errln;
use std::{
    io::{self, BufWriter, IsTerminal, Write},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use gpreempt::{
    clock::{WallClock, boottime_ns},
    domain::HostPid,
    host::roots::Roots,
    pipeline::filter::Filter,
    pipeline::in_process::{InProcessTracer, TracerOptions},
    report::{console::Console, jsonl::JsonLines, perfetto::Perfetto, summary::SummaryFile},
    trace::{btf, loader, probes},
};
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::TraceArgs;

/// How long records of a finished `-- CMD` keep arriving (its teardown runs in a kworker).
const COMMAND_GRACE: Duration = Duration::from_millis(500);

pub async fn run(args: TraceArgs) -> Result<()> {
    // Before anything is announced: a SIGUSR1 right after "attached" must print the map, not kill us.
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sighup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let mut sigusr1 = signal(SignalKind::user_defined1()).context("installing the SIGUSR1 handler")?;
    if args.empty_probes {
        let floor = loader::attach(probes::FLOOR, None, &args.btf_dir)?;
        errln!("gpreempt: attached {} empty probes (the kprobe floor); Ctrl-C to stop", floor.attached_count());
        tokio::select! {
            _ = sigint.recv() => {}
            _ = sigterm.recv() => {}
            _ = sighup.recv() => {}
        }
        return Ok(());
    }
    let roots = Roots::default();
    let mut tracer = InProcessTracer::start(&TracerOptions {
        btf_dir: args.btf_dir.clone(),
        roots: roots.clone(),
        filter: Filter::new(
            &args.pids.iter().copied().map(HostPid).collect::<Vec<_>>(),
            args.container.clone(),
            roots.proc.clone(),
        ),
        // The sinks show every span; nothing reads them off a channel.
        observe: false,
        ..TracerOptions::default()
    })?;
    let attached = tracer.probes();

    let clock = WallClock::now();
    let stdout = io::stdout();
    let colour = match args.color.as_str() {
        "always" => true,
        "never" => false,
        _ => stdout.is_terminal() && !args.json,
    };
    // Files are created before anything is traced, so a bad path fails at once.
    let create = |path: &std::path::Path| gpreempt::output::file::create(path).context("creating an output file");
    let output = args.output.as_deref().map(create).transpose()?;
    let perfetto = args.perfetto.as_deref().map(create).transpose()?;
    let summary_file = args.summary_json.as_deref().map(create).transpose()?;

    let functions: Vec<String> = attached
        .probes
        .iter()
        .filter_map(|p| p.symbol.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    errln!(
        "gpreempt: attached {} probes to {} in [{}]; Ctrl-C to stop",
        attached.attached_count(),
        functions.join(", "),
        attached.kfd_module.as_deref().unwrap_or("vmlinux"),
    );
    errln!("gpreempt: owner/gpu resolution: {}; {}", attached.offset_mode, btf::describe(&attached.offsets));
    let [kallsyms_ms, btf_ms, load_ms] = attached.startup_ms;
    log::info!("start-up: kallsyms {kallsyms_ms} ms, BTF {btf_ms} ms, load + attach {load_ms} ms");
    for p in attached.probes.iter().filter(|p| p.symbol.is_none()) {
        errln!("gpreempt: probe {} not attached: {}", p.program, p.missing_reason.as_deref().unwrap_or("?"));
    }

    for note in tracer.take_bootstrap_notes() {
        log::info!("queue map bootstrap: {note}");
    }
    let pipeline = tracer.pipeline_mut();
    // Buffered even on a terminal: the loop flushes once per ring-buffer batch (Sink::flush), so
    // lines still appear as they happen but a burst costs one write(2), not one per event.
    let out = BufWriter::with_capacity(1 << 16, stdout.lock());
    if args.json {
        pipeline.add_sink(Box::new(JsonLines::new(out, clock)));
    } else {
        pipeline.add_sink(Box::new(Console::new(out, clock, colour)));
    }
    if let Some(file) = output {
        pipeline.add_sink(Box::new(JsonLines::new(BufWriter::new(file), clock)));
    }
    if let Some(file) = perfetto {
        pipeline.add_sink(Box::new(Perfetto::new(BufWriter::new(file))));
    }
    if let Some(file) = summary_file {
        pipeline.add_sink(Box::new(SummaryFile::new(BufWriter::new(file))));
    }
    // Keep the summary readable when stdout carries JSON or is redirected.
    if args.json || !io::stdout().is_terminal() {
        pipeline.add_sink(Box::new(Console::summary_only(io::stderr(), clock)));
    }

    // `-- CMD`: started after the probes are attached, so its first open is seen.
    let (child_done_tx, mut child_done) = tokio::sync::oneshot::channel::<Option<i32>>();
    if let Some((program, rest)) = args.command.split_first() {
        let child = Command::new(program)
            .args(rest)
            .spawn()
            .with_context(|| format!("cannot run {}", args.command.join(" ")))?;
        let pid = child.id();
        tracer.pipeline_mut().start(&args.command, HostPid(pid));
        errln!("gpreempt: tracing `{}` (pid {pid}) and its children", args.command.join(" "));
        let mut child = child;
        std::thread::spawn(move || {
            let code = child.wait().ok().and_then(|s| s.code());
            let _ = child_done_tx.send(code);
        });
    } else {
        drop(child_done_tx);
    }
    let has_command = !args.command.is_empty();
    let started = Instant::now();

    let deadline = async {
        match args.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let mut map_tick = args.map_interval.map(|i| tokio::time::interval_at(tokio::time::Instant::now() + i, i));
    let mut grace_end: Option<tokio::time::Instant> = None;
    let mut child_code = None;
    loop {
        let grace = async {
            match grace_end {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let tick = async {
            match map_tick.as_mut() {
                Some(t) => {
                    t.tick().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = sighup.recv() => break,
            () = &mut deadline => break,
            () = grace => break,
            _ = sigusr1.recv() => tracer.pipeline_mut().emit_map(boottime_ns()),
            () = tick => {
                let now = boottime_ns();
                tracer.pipeline_mut().expire(now);
                tracer.pipeline_mut().emit_map(now);
            }
            code = &mut child_done, if has_command && grace_end.is_none() => {
                child_code = code.ok().flatten();
                grace_end = Some(tokio::time::Instant::now() + COMMAND_GRACE);
            }
            batch = tracer.next_batch(|_| {}) => {
                batch?;
                tracer.pipeline_mut().flush();
            }
        }
        if tracer.pipeline().broken_pipe() {
            break;
        }
    }
    // Records written before we stopped still count.
    tracer.drain(|_| {});
    let losses = tracer.losses()?;
    let mut pipeline = tracer.into_pipeline();
    pipeline.flush();
    pipeline.finish(boottime_ns(), losses, started.elapsed().as_millis() as u64);
    let write_error = pipeline.take_write_error();
    drop(pipeline);
    io::stdout().flush().ok();
    if let Some(code) = child_code.filter(|&c| c != 0) {
        errln!("gpreempt: `{}` exited with status {code}", args.command.join(" "));
    }
    match write_error {
        Some(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(e).context("writing the trace output"),
        _ => Ok(()),
    }
}
