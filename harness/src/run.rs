//! Running one state of a scenario: a fresh shared region, model GPUs on their threads, the
//! client processes, and — in the scheduled states — the real `gpreempt::schedule::Scheduler`
//! on this thread with the model seams. The window is the online load's run (from `go` until the
//! online client exits); without online load, a fixed time. What the run starts is owned by
//! [`Started`], so that it stops however the run ends.

use std::{
    io::Write,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use gpreempt::{
    clock::{monotonic_ns, thread_cpu_ns},
    controller::vocabulary::Options,
    domain::HostPid,
    evaluate::{BenchState, State},
    host::select::Selector,
    model::ModelNotice,
    schedule::{ScheduleConfig, ScheduleEvent, ScheduleReport, Scheduler, discover::Discovery, seams::Seams},
};

use crate::{
    cgroup::OwnCgroup,
    client::ClientResult,
    control::{ModelOccupancySource, ModelSide, Stamp, World},
    fake_roots::FakeRoots,
    gpu::{
        ModelGpu,
        core::{Accounting, BusyPeriod, GpuCore, Side},
    },
    idle_cpu::{self, IdleCpu},
    scenario::{ClientPlan, Online, Scenario},
    sender::{self, SenderResult},
    shm::{MAX_CLIENTS, MAX_QUEUES, Shm, futex_wake},
    started::Started,
};

/// What one state measured, raw.
pub struct Raw {
    pub window_ns: u64,
    pub start_ns: u64,
    /// Per GPU: accounting at the window's start and end, busy periods at its end.
    pub before: Vec<Accounting>,
    pub after: Vec<Accounting>,
    pub busy: Vec<Vec<BusyPeriod>>,
    /// Per client (plan order): side, client result.
    pub clients: Vec<(Side, ClientResult)>,
    pub stamps: Vec<Stamp>,
    pub report: Option<ScheduleReport>,
    /// CPU of the thread that ran `Scheduler::run`, ns.
    pub run_thread_cpu_ns: u64,
    /// The idle load's scheduled states: gpreempt's CPU inside its quiet time.
    pub idle_cpu: Option<IdleCpu>,
    /// A served online client: what the harness's sender sent and was answered, and the cgroup
    /// the client ran in (None: it could not have one, see the warnings).
    pub sender: Option<SenderResult>,
    pub cgroup: Option<String>,
    pub warnings: Vec<String>,
}

impl Raw {
    /// The online client's result (none in the offline-alone state).
    pub fn online(&self) -> Option<&ClientResult> {
        self.clients.iter().find(|c| c.0 == Side::Online).map(|c| &c.1)
    }
}

/// What the window's watcher brings back: the online client's output, the GPUs' accounting and
/// busy periods at the window's end, and its end.
type WindowEnd = (Option<Vec<u8>>, Vec<Accounting>, Vec<Vec<BusyPeriod>>, u64);

/// Nothing appears or goes: every client exists before the scheduler starts.
struct Quiet;

impl Discovery for Quiet {
    fn poll(&mut self, _: &mut Vec<ModelNotice>) {}
    fn sees_queues(&self) -> bool {
        true
    }
}

fn spawn_client(
    shm: &Shm,
    index: usize,
    plan: &ClientPlan,
    slots: &[usize],
    dir: &FakeRoots,
    cpu: Option<usize>,
    cgroup: Option<&OwnCgroup>,
) -> Result<Child> {
    let spec_path = dir.file(&format!("spec-{index}.json"));
    std::fs::write(&spec_path, serde_json::to_vec(&plan.spec)?)?;
    let exe = std::env::current_exe().context("finding the harness binary")?;
    let mut cmd = Command::new(exe);
    cmd.arg("client").arg("--shm").arg(shm.path()).arg("--client").arg(index.to_string());
    for (slot, gpu) in slots.iter().zip(&plan.gpus) {
        cmd.arg("--queue").arg(format!("{slot}:{gpu}"));
    }
    cmd.arg("--spec").arg(&spec_path);
    if let Some(stub) = crate::doorbell_stub::path() {
        cmd.env(crate::client::DOORBELL_STUB_ENV, stub);
    }
    if let Some(cpu) = cpu {
        cmd.env(crate::client::CPU_ENV, cpu.to_string());
    }
    if let Some(cgroup) = cgroup {
        cgroup.place(&mut cmd);
    }
    cmd.stdout(Stdio::piped()).stdin(Stdio::null()).stderr(Stdio::inherit());
    cmd.spawn().context("starting a client process")
}

/// Run one state of `sc`: `seconds` is the window of a state without online load (offline
/// alone); the others end with the online load.
pub fn run_state(sc: &Scenario, state: &BenchState, seconds: f64) -> Result<Raw> {
    let shm = Arc::new(Shm::create(&crate::shm::fresh_path("region")).context("creating the shared region")?);
    let gpus: Vec<Arc<ModelGpu>> = (0..sc.gpus())
        .map(|i| Arc::new(ModelGpu::new(i, GpuCore::new(sc.bound, sc.profile.restore_ns), shm.clone())))
        .collect();
    let with_online = state.state().runs_load();
    let with_offline = state.state() != State::OnlineAlone;
    let mut plans = Vec::new();
    if with_online {
        plans.push(sc.online_client());
    }
    if with_offline {
        plans.extend(sc.offline_clients());
    }
    if plans.len() > MAX_CLIENTS {
        bail!("{} clients: at most {MAX_CLIENTS}", plans.len());
    }
    // Slots in order, each on its GPU.
    let mut slots: Vec<Vec<usize>> = Vec::new();
    let mut next_slot = 0;
    for (i, p) in plans.iter().enumerate() {
        let mut mine = Vec::new();
        for &g in &p.gpus {
            if next_slot >= MAX_QUEUES {
                bail!("more than {MAX_QUEUES} queues");
            }
            gpus[g].add_queue(next_slot, i, p.side);
            mine.push(next_slot);
            next_slot += 1;
        }
        slots.push(mine);
    }
    // Before the run's processes and threads, so that it outlives them (the scheduler's pids are
    // KFD processes there).
    let roots = FakeRoots::new()?;
    let mut started = Started::new(shm.clone(), gpus.clone())?;
    let mut warnings = Vec::new();
    // A served online client runs in a cgroup v2 of its own, where the arrival probe attaches.
    let served = with_online && plans.first().is_some_and(|p| p.spec.is_served());
    if served {
        match OwnCgroup::create() {
            Ok(c) => started.cgroup = Some(c),
            Err(e) => warnings.push(format!("the online client runs in the harness's cgroup: {e:#}")),
        }
    }
    let mut pids: Vec<HostPid> = Vec::new();
    // `same-cpu`: the online client on the reaction thread's CPU.
    let same_cpu = state.variant() == Some(crate::variants::SAME_CPU_VARIANT);
    for (i, p) in plans.iter().enumerate() {
        let cpu = (same_cpu && p.side == Side::Online).then_some(crate::variants::SAME_CPU);
        let cgroup = started.cgroup.as_ref().filter(|_| served && i == 0);
        let child = spawn_client(&shm, i, p, &slots[i], &roots, cpu, cgroup)?;
        pids.push(HostPid(child.id()));
        started.adopt(child);
    }
    // Every client has mapped the region and said where its indices are.
    let ready_by = Instant::now() + Duration::from_secs(20);
    while slots.iter().flatten().any(|&s| shm.queues[s].owner.load(Ordering::Acquire) == 0) {
        if Instant::now() > ready_by {
            bail!("the clients did not attach within 20 s");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let world = Arc::new(World::new(shm.clone(), gpus.clone(), sc.profile.clone(), sc.seed ^ 0x5eed));
    {
        let mut clients = world.clients.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        for (i, (&pid, p)) in pids.iter().zip(&plans).enumerate() {
            clients.insert(pid, (i, p.side));
            let queues: Vec<_> = slots[i].iter().zip(&p.gpus).map(|(&s, &g)| (s as u32, gpus[g].id)).collect();
            roots.kfd_process(pid.0, &queues)?;
        }
    }
    // Its port, and its cgroup and sockets where the scheduler looks for them.
    let port = if served {
        roots.served_process(pids[0].0).context("the served client's /proc entries")?;
        match u16::try_from(shm.client_port[0].load(Ordering::Acquire)) {
            Ok(p) if p != 0 => Some(p),
            _ => bail!("the served client attached without a port"),
        }
    } else {
        None
    };
    let mut emit = |e: &ScheduleEvent| {
        if let ScheduleEvent::Warning { message } = e {
            warnings.push(message.clone());
        }
    };
    if let Some(variant) = state.variant() {
        let (_, change) =
            crate::variants::by_name(variant).ok_or_else(|| anyhow::anyhow!("no variant named {variant}"))?;
        let mut config = ScheduleConfig {
            online: pids
                .iter()
                .zip(&plans)
                .filter(|(_, p)| p.side == Side::Online)
                .map(|(&p, _)| Selector::Pid(p))
                .collect(),
            offline: pids
                .iter()
                .zip(&plans)
                .filter(|(_, p)| p.side == Side::Offline)
                .map(|(&p, _)| Selector::Pid(p))
                .collect(),
            // The product's footing (SCHED_FIFO 20 and mlockall where the host grants them, as
            // on a node where the agent runs with CAP_SYS_NICE; the JSON says what was granted).
            realtime: ScheduleConfig::default().realtime,
            interval: Duration::from_secs(3600),
            session: Options { roots: roots.roots(), ..Options::default() },
            roots: roots.roots(),
            ..ScheduleConfig::default()
        };
        change(&mut config);
        let seams = Seams {
            control: ModelSide(world.clone()),
            discovery: Box::new(Quiet),
            occupancy: std::sync::Arc::new(ModelOccupancySource(world.clone())),
            // The real cgroup_skb program on the client's cgroup (requests over loopback TCP).
            arrival: std::sync::Arc::new(gpreempt::schedule::arrival::ProbeLoader),
        };
        started.scheduler = Some(Scheduler::start(config, seams, &mut emit).context("starting the scheduler")?);
    }
    // Go.
    let start_ns = monotonic_ns() + 20_000_000;
    shm.start_ns.store(start_ns, Ordering::Release);
    shm.go.store(1, Ordering::Release);
    futex_wake(&shm.go);
    // The requests, probes and scrapes over TCP, from their origin.
    let sender = match (port, plans.first().map(|p| p.spec.sent()), sc.serving) {
        (Some(port), Some(Some(requests)), Some(serving)) => {
            let plan = sender::Plan {
                port,
                start_ns,
                requests,
                health_per_s: serving.health_per_s,
                metrics_per_s: serving.metrics_per_s,
                warm: sender::WARM,
            };
            let shm = shm.clone();
            Some(started.spawn(move || sender::run(&plan, &move || shm.stop.load(Ordering::Acquire) != 0))?)
        }
        _ => None,
    };
    let before: Vec<Accounting> = {
        while monotonic_ns() < start_ns {
            std::thread::sleep(Duration::from_micros(200));
        }
        gpus.iter().map(|g| g.snapshot().0).collect()
    };
    // The window: until the online client exits (or a fixed time), watched on its own thread
    // so this one can run the scheduler.
    let stop = Arc::new(AtomicBool::new(false));
    let online_watch = if with_online { Some(started.watch(0)?) } else { None };
    let watch = {
        let (stop, gpus) = (stop.clone(), gpus.clone());
        started.spawn(move || -> Result<WindowEnd> {
            let online = match online_watch {
                Some(w) => Some(w.wait().context("waiting for the online client")),
                None => {
                    std::thread::sleep(Duration::from_secs_f64(seconds));
                    None
                }
            };
            let end = monotonic_ns();
            let snaps: Vec<_> = gpus.iter().map(|g| g.snapshot()).collect();
            stop.store(true, Ordering::Release);
            let (after, busy) = snaps.into_iter().unzip();
            Ok((online.transpose()?, after, busy, end))
        })?
    };
    // The idle load: sample the scheduler's threads from 1 s after the start to 0.5 s before
    // the one request.
    let idle_sampler = match (started.scheduler.is_some(), &sc.online) {
        (true, Online::Idle { seconds }) if *seconds >= 3 => {
            let run_thread = idle_cpu::gettid();
            let skip = Duration::from_nanos((start_ns + 1_000_000_000).saturating_sub(monotonic_ns()));
            let window = Duration::from_millis(*seconds * 1000 - 1500);
            Some(started.spawn(move || idle_cpu::measure(run_thread, skip, window))?)
        }
        _ => None,
    };
    let (report, run_thread_cpu_ns) = match started.scheduler.take() {
        Some(s) => {
            let cpu = thread_cpu_ns();
            let report = s.run(&stop, &mut emit);
            (Some(report), thread_cpu_ns() - cpu)
        }
        None => (None, 0),
    };
    let idle_cpu = idle_sampler.and_then(|r| r.recv().ok().flatten());
    let watched = watch.recv().map_err(|_| anyhow::anyhow!("the window's watcher panicked"));
    // Stop the offline clients, whatever happened.
    started.stop_clients();
    let mut results: Vec<(Side, ClientResult)> = Vec::new();
    let (online, after, busy, end_ns) = watched??;
    let sender = sender.map(|r| r.recv()).transpose().map_err(|_| anyhow::anyhow!("the sender panicked"))?;
    if let Some(out) = online {
        results.push((Side::Online, started.collect_from(0, &out)?));
    }
    for i in usize::from(with_online)..plans.len() {
        results.push((Side::Offline, started.collect(i)?));
    }
    let cgroup = started.cgroup.as_ref().map(|c| c.dir().display().to_string());
    // The model GPUs stop and their drivers are joined; the cgroup is removed.
    drop(started);
    let _ = std::io::stderr().flush();
    Ok(Raw {
        window_ns: end_ns.saturating_sub(start_ns),
        start_ns,
        before,
        after,
        busy,
        clients: results,
        stamps: world.stamps(),
        report,
        run_thread_cpu_ns,
        idle_cpu,
        sender,
        cgroup,
        warnings,
    })
}
