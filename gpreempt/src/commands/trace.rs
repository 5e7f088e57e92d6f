//! `gpreempt trace`: attach, stream, keep the queue map and spans, print, and account for every
//! record on exit.

use std::{
    fs::File,
    io::{self, BufWriter, IsTerminal, Write},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use gpreempt::{
    model::{
        ps::Roots,
        registry::Registry,
        spans::{Span, SpanTracker},
    },
    report::{Sink, TraceSummary, clock::WallClock, console::Console, jsonl::JsonLines, perfetto::Perfetto},
    trace::{btf, decode::Event, filter::Filter, loader, probes, stream::EventStream},
};
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::TraceArgs;

/// How long records of a finished `-- CMD` keep arriving (its teardown runs in a kworker).
const COMMAND_GRACE: Duration = Duration::from_millis(500);

fn boottime_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map_or(0, |t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
}

pub async fn run(args: TraceArgs) -> Result<()> {
    // Before anything is announced: a SIGUSR1 right after "attached" must print the map, not kill us.
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sighup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let mut sigusr1 = signal(SignalKind::user_defined1()).context("installing the SIGUSR1 handler")?;
    if args.empty_probes {
        let floor = loader::attach(probes::FLOOR, None, &args.btf_dir)?;
        eprintln!("gpreempt: attached {} empty probes (the kprobe floor); Ctrl-C to stop", floor.attached_count());
        tokio::select! {
            _ = sigint.recv() => {}
            _ = sigterm.recv() => {}
            _ = sighup.recv() => {}
        }
        return Ok(());
    }
    let mut attached = loader::attach(probes::PROBES, None, &args.btf_dir)?;
    // eBPF-side warnings (aya-log) go to our logger; without the log map nothing is lost.
    let _ebpf_log = aya_log::EbpfLogger::init(&mut attached.ebpf).ok();
    let mut stream = EventStream::new(&mut attached)?;
    // Loading parsed vmlinux and module BTF (tens of MiB, freed again once the programs are
    // loaded); give those pages back rather than keep them resident for the whole trace.
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim has no preconditions; it only returns free heap pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }

    let clock = WallClock::now();
    let stdout = io::stdout();
    let colour = match args.color.as_str() {
        "always" => true,
        "never" => false,
        _ => stdout.is_terminal() && !args.json,
    };
    let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
    let mut json_sinks: Vec<usize> = Vec::new();
    // Buffered even on a terminal: the loop flushes once per ring-buffer batch (Sink::flush), so
    // lines still appear as they happen but a burst costs one write(2), not one per event.
    let out = BufWriter::with_capacity(1 << 16, stdout.lock());
    if args.json {
        json_sinks.push(sinks.len());
        sinks.push(Box::new(JsonLines::new(out, clock)));
    } else {
        sinks.push(Box::new(Console::new(out, clock, colour)));
    }
    if let Some(path) = &args.output {
        let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        json_sinks.push(sinks.len());
        sinks.push(Box::new(JsonLines::new(BufWriter::new(file), clock)));
    }
    let perfetto_file = match &args.perfetto {
        Some(path) => Some(File::create(path).with_context(|| format!("cannot create {}", path.display()))?),
        None => None,
    };
    let summary_file = match &args.summary_json {
        Some(path) => Some(File::create(path).with_context(|| format!("cannot create {}", path.display()))?),
        None => None,
    };

    let functions: Vec<String> = attached
        .probes
        .iter()
        .filter_map(|p| p.symbol.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    eprintln!(
        "gpreempt: attached {} probes to {} in [{}]; Ctrl-C to stop",
        attached.attached_count(),
        functions.join(", "),
        attached.kfd_module.as_deref().unwrap_or("vmlinux"),
    );
    eprintln!("gpreempt: owner/gpu resolution: {}; {}", attached.offset_mode, btf::describe(&attached.offsets));
    let [kallsyms_ms, btf_ms, load_ms] = attached.startup_ms;
    log::info!("start-up: kallsyms {kallsyms_ms} ms, BTF {btf_ms} ms, load + attach {load_ms} ms");
    for p in attached.probes.iter().filter(|p| p.symbol.is_none()) {
        eprintln!("gpreempt: probe {} not attached: {}", p.program, p.missing_reason.as_deref().unwrap_or("?"));
    }

    let roots = Roots::default();
    let mut registry = Registry::new(Some(roots.clone()));
    for note in registry.bootstrap(&roots) {
        log::info!("queue map bootstrap: {note}");
    }
    let filter = Filter::new(&args.pids, args.container.clone(), roots.proc.clone());
    let mut d = Delivery {
        filter,
        sinks,
        registry,
        spans: SpanTracker::default(),
        perfetto: perfetto_file.as_ref().map(|_| Perfetto::new()),
        events: 0,
        write_error: None,
    };

    // `-- CMD`: started after the probes are attached, so its first open is seen.
    let (child_done_tx, mut child_done) = tokio::sync::oneshot::channel::<Option<i32>>();
    if let Some((program, rest)) = args.command.split_first() {
        let child = Command::new(program)
            .args(rest)
            .spawn()
            .with_context(|| format!("cannot run {}", args.command.join(" ")))?;
        let pid = child.id();
        d.filter.set_root(pid);
        for &i in &json_sinks {
            if let Err(e) = d.sinks[i].start(&args.command, pid) {
                d.write_error.get_or_insert(e);
            }
        }
        eprintln!("gpreempt: tracing `{}` (pid {pid}) and its children", args.command.join(" "));
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
            _ = sigusr1.recv() => d.print_map(),
            () = tick => d.print_map(),
            code = &mut child_done, if has_command && grace_end.is_none() => {
                child_code = code.ok().flatten();
                grace_end = Some(tokio::time::Instant::now() + COMMAND_GRACE);
            }
            batch = stream.next_batch(|e| d.deliver(e)) => {
                batch?;
                d.flush();
            }
        }
        if d.write_error.as_ref().is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe) {
            break;
        }
    }
    // Records written before we stopped still count.
    stream.drain(|e| d.deliver(e));
    d.flush();
    let now = boottime_ns();
    for span in d.spans.finish(now) {
        d.span(&span);
    }
    d.print_map();

    let losses = stream.losses()?;
    let mut summary = TraceSummary {
        events: d.events,
        dropped: losses.dropped(),
        losses,
        duration_ms: started.elapsed().as_millis() as u64,
        ..Default::default()
    };
    let Delivery { mut sinks, registry, spans, perfetto, mut filter, write_error, .. } = d;
    summary.add_model(&registry, &spans, |pid| filter.keep_pid(pid, &registry));
    for sink in &mut sinks {
        sink.summary(&summary).ok();
    }
    drop(sinks);
    // Keep the summary readable when stdout carries JSON or is redirected.
    if args.json || !io::stdout().is_terminal() {
        Console::new(io::stderr(), clock, false).summary(&summary).ok();
    }
    if let (Some(p), Some(file)) = (perfetto, perfetto_file) {
        let mut out = BufWriter::new(file);
        p.write(&mut out, now).context("writing the Perfetto trace")?;
    }
    if let Some(file) = summary_file {
        let mut out = BufWriter::new(file);
        serde_json::to_writer_pretty(&mut out, &summary).context("writing the summary")?;
        out.write_all(b"\n")?;
        out.flush()?;
    }
    io::stdout().flush().ok();
    if let Some(code) = child_code.filter(|&c| c != 0) {
        eprintln!("gpreempt: `{}` exited with status {code}", args.command.join(" "));
    }
    match write_error {
        Some(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(e).context("writing events"),
        _ => Ok(()),
    }
}

/// Feeds the model, filters, and hands events to every sink; remembers the first write error.
struct Delivery {
    filter: Filter,
    sinks: Vec<Box<dyn Sink>>,
    registry: Registry,
    spans: SpanTracker,
    perfetto: Option<Perfetto>,
    events: u64,
    write_error: Option<io::Error>,
}

impl Delivery {
    fn deliver(&mut self, event: Event) {
        // The model sees everything (collateral needs other processes' queues); output is filtered.
        let closed = self.spans.on_event(&event, &self.registry);
        self.registry.apply(&event);
        if self.filter.keep_event(&event, &self.registry) {
            self.events += 1;
            if let Some(p) = &mut self.perfetto {
                p.event(&event);
            }
            for sink in &mut self.sinks {
                if let Err(e) = sink.event(&event) {
                    self.write_error.get_or_insert(e);
                }
            }
        }
        for span in closed {
            self.span(&span);
        }
    }

    fn span(&mut self, span: &Span) {
        let shown = span.target_pid.is_some_and(|p| self.filter.keep_pid(p, &self.registry))
            || span.collateral.iter().any(|c| self.filter.keep_pid(c.pid, &self.registry));
        if !shown {
            return;
        }
        if let Some(p) = &mut self.perfetto {
            let registry = &self.registry;
            p.span(span, |pid| {
                registry
                    .processes
                    .get(&pid)
                    .or_else(|| registry.finished.iter().find(|e| e.pid == pid))
                    .and_then(|e| e.comm.clone())
            });
        }
        for sink in &mut self.sinks {
            if let Err(e) = sink.span(span) {
                self.write_error.get_or_insert(e);
            }
        }
    }

    fn flush(&mut self) {
        for sink in &mut self.sinks {
            if let Err(e) = sink.flush() {
                self.write_error.get_or_insert(e);
            }
        }
    }

    fn print_map(&mut self) {
        let keep: Vec<u32> =
            self.registry.processes.keys().copied().filter(|&pid| self.filter.keep_pid(pid, &self.registry)).collect();
        let text = self.registry.render(|p| keep.contains(&p.pid));
        let json = self.registry.to_json(|p| keep.contains(&p.pid), boottime_ns());
        for sink in &mut self.sinks {
            if let Err(e) = sink.queue_map(&text, &json) {
                self.write_error.get_or_insert(e);
            }
        }
    }
}
