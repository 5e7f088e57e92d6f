//! `gpreempt top`: the in-process tracer, the agent's scheduler state on a thread of its own,
//! and the terminal (ratatui over crossterm) — or one frame as text or JSON.

use super::stderr::errln;
use std::{
    collections::HashMap,
    io::IsTerminal,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use gpreempt::{
    clock::boottime_ns,
    domain::GpuId,
    host::{
        k8s::{K8sRoots, PodRef},
        partition::Partitions,
        procinfo::Container,
        roots::Roots,
        topology,
    },
    model::Limits,
    pipeline::{
        Observed,
        in_process::{InProcessTracer, TracerOptions},
    },
    views::top::{
        Order, Snapshot, SpanLog, SpanRow, TracerStatus,
        render::{self, Action, Ui},
        scheduler::{self, SchedulerStatus},
    },
};
use ratatui::crossterm::event::{self, Event, KeyEventKind};

use super::{interrupt, stdout::outln};
use crate::cli::TopArgs;

/// Exited processes the model keeps (their spans may still arrive; nothing here lists them).
const FINISHED_MAX: usize = 64;
/// How long the loop waits for a key before it looks at the tracer and the signals again.
const TICK: Duration = Duration::from_millis(100);
/// How long `--once`/`--json` wait for the agent's first answer (a scrape gives up within 4 s).
const SCRAPE_WAIT: Duration = Duration::from_secs(5);

/// The tracer, the spans it closed, and what the view needs to name processes and GPUs.
struct Source {
    tracer: InProcessTracer,
    log: SpanLog,
    events: u64,
    topology_gpus: Vec<GpuId>,
    partitions: Partitions,
    k8s: K8sRoots,
    /// Pod lookups by container id: the node's files are read once per container.
    pods: HashMap<String, Option<PodRef>>,
}

impl Source {
    fn start(args: &TopArgs) -> Result<Self> {
        let roots = Roots::default();
        let tracer = InProcessTracer::start(&TracerOptions {
            btf_dir: args.btf_dir.clone(),
            roots: roots.clone(),
            limits: Limits { finished_max: FINISHED_MAX, finished_grace_ns: None },
            ..TracerOptions::default()
        })
        .context(
            "the tracer could not attach (`gpreempt top` needs root and the amdgpu module; see `gpreempt doctor`)",
        )?;
        let topology_gpus =
            topology::gpu_nodes(&roots.sys).map(|nodes| nodes.iter().map(|n| n.gpu_id).collect()).unwrap_or_default();
        Ok(Self {
            tracer,
            log: SpanLog::default(),
            events: 0,
            topology_gpus,
            partitions: Partitions::read(&roots.sys),
            k8s: K8sRoots::beside(&roots),
            pods: HashMap::new(),
        })
    }

    /// Take every record already delivered through the model; keep the spans it closed.
    fn drain(&mut self) {
        self.events += self.tracer.drain(|_| {}) as u64;
        let spans: Vec<_> = self
            .tracer
            .observed()
            .filter_map(|o| match o {
                Observed::Span(s) => Some(s),
                _ => None,
            })
            .collect();
        for s in spans {
            let comm = s.target_pid.and_then(|p| self.tracer.model().comm_of(p));
            self.log.push(SpanRow::of(&s, comm));
        }
    }

    fn snapshot(&mut self, scheduler: SchedulerStatus) -> Snapshot {
        let (attached, missing) = self.tracer.probe_counts();
        let mut tracer =
            TracerStatus { probes_attached: attached, probes_missing: missing, events: self.events, lost: 0 };
        if let Ok(losses) = self.tracer.losses() {
            tracer.set_losses(&losses);
        }
        let (k8s, pods) = (&self.k8s, &mut self.pods);
        let mut pod_of = |c: &Container| pods.entry(c.id.clone()).or_insert_with(|| k8s.identify(c)).clone();
        let mut s = Snapshot::take(
            boottime_ns(),
            self.tracer.model(),
            &self.log,
            &self.topology_gpus,
            &mut pod_of,
            scheduler,
            tracer,
        );
        s.name_partitions(&self.partitions);
        s
    }
}

/// The agent's scheduler state, read every `period` on a thread of its own (a scrape must not
/// stall the keys); the latest wins. The thread ends when the receiver goes.
fn agent_reader(args: &TopArgs) -> mpsc::Receiver<SchedulerStatus> {
    let (tx, rx) = mpsc::channel();
    if args.no_agent {
        return rx;
    }
    let (addr, period) = (args.agent, args.interval);
    thread::spawn(move || {
        while tx.send(scheduler::read(addr)).is_ok() {
            thread::sleep(period);
        }
    });
    rx
}

pub fn run(args: &TopArgs) -> Result<()> {
    let live = !args.once && !args.json;
    if live && !std::io::stdout().is_terminal() {
        bail!("stdout is not a terminal: `gpreempt top` draws a live view; use --once (text) or --json");
    }
    let stop = interrupt::install()?;
    let order = Order { sort: args.sort, reverse: false, filter: args.filter.clone() };
    let mut source = Source::start(args)?;
    let agent = agent_reader(args);
    let mut scheduler = SchedulerStatus::default();
    let latest = |scheduler: &mut SchedulerStatus| {
        if let Some(s) = agent.try_iter().last() {
            *scheduler = s;
        }
    };
    if !live {
        errln!("gpreempt: tracer attached; watching for {:.1} s", args.interval.as_secs_f64());
        let until = Instant::now() + args.interval;
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            source.drain();
            thread::sleep(TICK.min(until.saturating_duration_since(Instant::now())));
        }
        source.drain();
        // The latest scrape, or the first one awaited, so the frame says what the agent answered.
        if !args.no_agent {
            scheduler = agent.try_iter().last().or_else(|| agent.recv_timeout(SCRAPE_WAIT).ok()).unwrap_or_else(|| {
                SchedulerStatus {
                    source: Some(format!("http://{}/metrics", args.agent)),
                    error: Some(format!("no answer within {} s", SCRAPE_WAIT.as_secs())),
                    gpus: Vec::new(),
                }
            });
        }
        let mut snapshot = source.snapshot(scheduler);
        if args.json {
            snapshot.processes = order.apply(&snapshot.processes).into_iter().cloned().collect();
            outln!("{}", serde_json::to_string_pretty(&snapshot)?);
        } else {
            outln!("{}", render::text(&snapshot, &order, args.spans).trim_end());
        }
        return Ok(());
    }
    let mut ui = Ui { order, editing: false };
    let mut terminal = Screen::enter()?;
    let mut next = Instant::now();
    let mut dirty = true;
    loop {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        source.drain();
        latest(&mut scheduler);
        if dirty || Instant::now() >= next {
            let snapshot = source.snapshot(scheduler.clone());
            terminal.0.draw(|f| render::draw(f, &snapshot, &ui)).context("drawing the view")?;
            next = Instant::now() + args.interval;
            dirty = false;
        }
        // A signal interrupts the wait (the handlers are installed without SA_RESTART).
        let ready = match event::poll(TICK) {
            Ok(ready) => ready,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context("reading the terminal"),
        };
        if !ready {
            continue;
        }
        match event::read() {
            Ok(Event::Key(key)) if key.kind == KeyEventKind::Press => match ui.key(key) {
                Action::Quit => break,
                Action::Redraw => dirty = true,
                Action::None => {}
            },
            Ok(Event::Resize(..)) => dirty = true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("reading the terminal"),
        }
    }
    drop(terminal);
    if let Some(signal) = interrupt::received() {
        errln!("gpreempt: top stopped by {signal}");
    }
    Ok(())
}

/// The alternate screen in raw mode while this lives; restored when it drops (every return and
/// unwinding) and, through ratatui's panic hook, before a panic message is printed. Log lines
/// are held back meanwhile: written on the screen they would tear the frame (ratatui redraws
/// only what changed), and what they say — undecodable records — is counted in the title.
struct Screen(ratatui::DefaultTerminal, log::LevelFilter);

/// Set while the screen is taken, so a panic hook and the drop restore it once.
static TAKEN: AtomicBool = AtomicBool::new(false);

impl Screen {
    fn enter() -> Result<Self> {
        TAKEN.store(true, Ordering::Relaxed);
        let level = log::max_level();
        match ratatui::try_init() {
            Ok(t) => {
                log::set_max_level(log::LevelFilter::Off);
                Ok(Self(t, level))
            }
            Err(e) => {
                restore();
                Err(e).context("taking over the terminal (raw mode, alternate screen)")
            }
        }
    }
}

fn restore() {
    if TAKEN.swap(false, Ordering::Relaxed) {
        // Best effort: the terminal may be gone (hangup); nothing else can be done then.
        let _ = ratatui::try_restore();
        let _ = ratatui::crossterm::execute!(std::io::stdout(), ratatui::crossterm::cursor::Show);
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        log::set_max_level(self.1);
        restore();
    }
}
