//! `gpreempt trace`: attach, stream, print, and account for every record on exit.

use std::{
    collections::HashSet,
    fs::File,
    io::{self, BufWriter, IsTerminal, Write},
    time::Instant,
};

use anyhow::{Context, Result};
use gpreempt::{
    report::{Sink, TraceSummary, clock::WallClock, console::Console, jsonl::JsonLines},
    trace::{decode::Event, loader, probes, stream::EventStream},
};
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::TraceArgs;

pub async fn run(args: TraceArgs) -> Result<()> {
    let mut attached = loader::attach(probes::PROBES, None)?;
    // eBPF-side warnings (aya-log) go to our logger; without the log map nothing is lost.
    let _ebpf_log = aya_log::EbpfLogger::init(&mut attached.ebpf).ok();
    let mut stream = EventStream::new(&mut attached)?;

    let clock = WallClock::now();
    let stdout = io::stdout();
    let colour = match args.color.as_str() {
        "always" => true,
        "never" => false,
        _ => stdout.is_terminal() && !args.json,
    };
    let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
    if args.json {
        sinks.push(Box::new(JsonLines::new(stdout.lock(), clock)));
    } else {
        sinks.push(Box::new(Console::new(stdout.lock(), clock, colour)));
    }
    if let Some(path) = &args.output {
        let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        sinks.push(Box::new(JsonLines::new(BufWriter::new(file), clock)));
    }

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
    eprintln!(
        "gpreempt: owner/gpu resolution: {}; {}",
        attached.offset_mode,
        gpreempt::trace::btf::describe(&attached.offsets)
    );
    for p in attached.probes.iter().filter(|p| p.symbol.is_none()) {
        eprintln!("gpreempt: probe {} not attached: {}", p.program, p.missing_reason.as_deref().unwrap_or("?"));
    }

    let mut delivery = Delivery { pids: args.pids.iter().copied().collect(), sinks, events: 0, write_error: None };
    let started = Instant::now();

    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sighup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let deadline = async {
        match args.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = sighup.recv() => break,
            () = &mut deadline => break,
            batch = stream.next_batch(|e| delivery.deliver(e)) => { batch?; }
        }
        if delivery.write_error.as_ref().is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe) {
            break;
        }
    }
    // Records written before we stopped still count.
    stream.drain(|e| delivery.deliver(e));
    let Delivery { mut sinks, events, write_error, .. } = delivery;

    let losses = stream.losses()?;
    let summary =
        TraceSummary { events, dropped: losses.dropped(), losses, duration_ms: started.elapsed().as_millis() as u64 };
    for sink in &mut sinks {
        sink.summary(&summary).ok();
    }
    // Keep the summary readable when stdout carries JSON or is redirected.
    if args.json || !io::stdout().is_terminal() {
        Console::new(io::stderr(), clock, false).summary(&summary).ok();
    }
    io::stdout().flush().ok();
    match write_error {
        Some(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(e).context("writing events"),
        _ => Ok(()),
    }
}

/// Filters events and hands them to every sink; remembers the first write error.
struct Delivery {
    pids: HashSet<u32>,
    sinks: Vec<Box<dyn Sink>>,
    events: u64,
    write_error: Option<io::Error>,
}

impl Delivery {
    fn deliver(&mut self, event: Event) {
        if !self.pids.is_empty() && !self.pids.contains(&event.pid) {
            return;
        }
        self.events += 1;
        for sink in &mut self.sinks {
            if let Err(e) = sink.event(&event) {
                self.write_error.get_or_insert(e);
            }
        }
    }
}
