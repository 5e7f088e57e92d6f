//! A client process (`harness client`, hidden): maps the shared region, tells where its queues'
//! indices live in its own memory, waits for `go`, runs its load, prints one JSON result line.
//! Every wait is a futex wait (on its wake word, `go`, or the barrier): a client never spins.

use std::{
    collections::VecDeque,
    net::TcpListener,
    path::Path,
    sync::{
        Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use anyhow::{Context, Result};
use gpreempt::clock::monotonic_ns;
use serde::{Deserialize, Serialize};

use crate::{
    engine::Engine,
    load::{ClientSpec, step_ns},
    rng::Rng,
    server::Backend,
    shm::{QueueSlot, Region, Shm, futex_wait, futex_wake, ring},
};

/// What a client reports.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ClientResult {
    /// Per request: publish of its first dispatch (batching: its arrival) → completion seen, ns.
    pub latencies_ns: Vec<u64>,
    /// Batching: per engine step, publish → completion seen, ns.
    pub step_ns: Vec<u64>,
    /// Batching: per engine step, whether it opened an engine busy period (admitted the first
    /// request after an idle engine): the step that waits for the scheduler's reaction.
    #[serde(default)]
    pub step_opens_busy: Vec<bool>,
    /// Batching: the engine's busy periods (any request in flight), from the publish of the step
    /// that admitted the first request to the completion of the step that finished the last one
    /// (CLOCK_MONOTONIC, ns): the unit the no-flapping goal counts suspends in.
    #[serde(default)]
    pub engine_busy_ns: Vec<(u64, u64)>,
    /// Trainer / data-parallel rank: steps completed, and when each ended (CLOCK_MONOTONIC).
    pub steps: u64,
    pub step_ends_ns: Vec<u64>,
    /// Online clients with the stand-in runtime: each doorbell store's duration, ns (the
    /// uprobe's cost per kernel launch is its difference with and without the probe).
    #[serde(default)]
    pub doorbell_store_ns: Vec<u64>,
    /// A served online client: per request, when it was read, its first dispatch published and
    /// its last seen complete (CLOCK_MONOTONIC, ns), in the order answered.
    #[serde(default)]
    pub served: Vec<crate::server::Served>,
    /// A served online client: the probes and scrapes it answered, and other messages (404).
    #[serde(default)]
    pub answered: crate::server::Answered,
}

use crate::doorbell_stub::Store;

/// The environment variable naming the stand-in runtime (`tests/rocm/hsa_store_stub.c` built as
/// `libhsa-runtime64.so.1`) that online clients ring their doorbells through, as ROCclr does.
pub const DOORBELL_STUB_ENV: &str = "HARNESS_DOORBELL_STUB";

/// The environment variable pinning a client to one CPU (the `same-cpu` variant's online client).
pub const CPU_ENV: &str = "HARNESS_CLIENT_CPU";

/// Pin this process to the CPU [`CPU_ENV`] names, if any.
fn pin_from_env() -> Result<()> {
    let Ok(cpu) = std::env::var(CPU_ENV) else { return Ok(()) };
    let cpu: usize = cpu.parse().with_context(|| format!("{CPU_ENV}={cpu}"))?;
    // This thread, before the client starts any other (they inherit it).
    gpreempt::schedule::realtime::pin(cpu).with_context(|| format!("pinning the client to CPU {cpu}"))
}

/// The stub's store, from the library named by [`DOORBELL_STUB_ENV`] (none: no doorbell rung).
fn doorbell_store() -> Result<Option<Store>> {
    let Some(path) = std::env::var_os(DOORBELL_STUB_ENV) else { return Ok(None) };
    Ok(Some(crate::doorbell_stub::open_store(std::path::Path::new(&path))?.0))
}

/// One queue of the client: its slot and the GPU whose doorbell it rings.
#[derive(Clone, Copy, Debug)]
pub struct QueueRef {
    pub slot: usize,
    pub gpu: usize,
}

/// What a client's loops share: its queues, its wake word, the stand-in runtime's store. Shared
/// by the connection threads of a served client, so each queue publishes under its own lock.
pub(crate) struct Ctx<'a> {
    region: &'a Region,
    wake: &'a AtomicU32,
    queues: Vec<(&'a QueueSlot, usize)>,
    /// One publisher per queue at a time (a served client publishes from several threads).
    publishing: Vec<Mutex<()>>,
    /// The stand-in runtime's doorbell store (online clients), and each call's duration.
    store: Option<Store>,
    store_ns: Mutex<Vec<u64>>,
}

impl crate::publisher::Publisher for Ctx<'_> {
    fn stopped(&self) -> bool {
        Ctx::stopped(self)
    }
    fn queue_count(&self) -> usize {
        Ctx::queue_count(self)
    }
    fn publish(&self, q: usize, dispatches: &[u64]) -> (u64, u64) {
        Ctx::publish(self, q, dispatches)
    }
    fn wait_done(&self, q: usize, target: u64) -> bool {
        Ctx::wait_done(self, q, target)
    }
}

impl Ctx<'_> {
    pub(crate) fn stopped(&self) -> bool {
        self.region.stop.load(Ordering::Acquire) != 0
    }

    pub(crate) fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// Publish dispatches on queue `q` together (waiting for ring room); the write index after
    /// and the publish time.
    pub(crate) fn publish(&self, q: usize, dispatches: &[u64]) -> (u64, u64) {
        // A poisoned lock only means another publisher panicked: the slot is still consistent.
        let _one = self.publishing[q].lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (slot, gpu) = self.queues[q];
        while slot.room() < dispatches.len() as u64 && !self.stopped() {
            let seen = self.wake.load(Ordering::Acquire);
            futex_wait(self.wake, seen, Some(Duration::from_millis(10)));
        }
        let at = monotonic_ns();
        let mut w = 0;
        for &d in dispatches {
            w = slot.publish(d, at);
        }
        if let Some(store) = self.store {
            // As ROCclr rings a queue's doorbell after writing its packets: the new write index
            // to the queue's doorbell signal.
            let before = monotonic_ns();
            // SAFETY: the handle is the address of this slot's `doorbell_value` in our mapping.
            unsafe { store(slot.doorbell_signal.load(Ordering::Relaxed), w as i64) };
            let took = monotonic_ns() - before;
            self.store_ns.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(took);
        }
        ring(&self.region.doorbell[gpu]);
        (w, at)
    }

    /// Wait until queue `q` has completed `target` dispatches (or the run stops).
    pub(crate) fn wait_done(&self, q: usize, target: u64) -> bool {
        loop {
            let seen = self.wake.load(Ordering::Acquire);
            if self.queues[q].0.completed.load(Ordering::Acquire) >= target {
                return true;
            }
            if self.stopped() {
                return false;
            }
            futex_wait(self.wake, seen, Some(Duration::from_millis(100)));
        }
    }
}

fn sleep_until(deadline: u64) {
    let now = monotonic_ns();
    if deadline > now {
        std::thread::sleep(Duration::from_nanos(deadline - now));
    }
}

/// The client's main: `shm` path, its index, its queues, its spec.
pub fn run(shm: &Path, client: usize, queues: &[QueueRef], spec: &ClientSpec) -> Result<ClientResult> {
    crate::shm::tight_timers();
    pin_from_env()?;
    let shm = Shm::open(shm).with_context(|| format!("mapping {}", shm.display()))?;
    // A served client listens before it attaches, so the harness finds its port with its queues
    // (and in this process's cgroup, which the socket is charged to from here on).
    let listener = if spec.is_served() {
        let l = TcpListener::bind(("127.0.0.1", 0)).context("listening on a loopback port")?;
        shm.client_port[client].store(u32::from(l.local_addr()?.port()), Ordering::Release);
        Some(l)
    } else {
        None
    };
    let pid = std::process::id();
    for q in queues {
        let slot = &shm.queues[q.slot];
        // The addresses in this process's memory, which the scheduler reads with process_vm_readv.
        slot.read_addr.store(slot.read.as_ptr() as u64, Ordering::Release);
        slot.write_addr.store(slot.write.as_ptr() as u64, Ordering::Release);
        slot.doorbell_signal.store(slot.doorbell_value.as_ptr() as u64, Ordering::Release);
        slot.owner.store(pid, Ordering::Release);
    }
    // Only the online side rings through the runtime (the offline trainers are raw clients).
    let online = matches!(spec, ClientSpec::Requests { .. } | ClientSpec::Batching { .. }) || spec.is_served();
    let store = if online { doorbell_store()? } else { None };
    while shm.go.load(Ordering::Acquire) == 0 {
        futex_wait(&shm.go, 0, Some(Duration::from_millis(100)));
    }
    let ctx = Ctx {
        region: &shm,
        wake: &shm.client_wake[client],
        queues: queues.iter().map(|q| (&shm.queues[q.slot], q.gpu)).collect(),
        publishing: queues.iter().map(|_| Mutex::new(())).collect(),
        store,
        store_ns: Mutex::new(Vec::new()),
    };
    let t0 = shm.start_ns.load(Ordering::Acquire);
    let mut result = match spec {
        ClientSpec::Requests { requests } => requests_loop(&ctx, t0, requests),
        ClientSpec::Served { requests, cpu } => {
            let l = listener.context("a served client without its listener")?;
            let run = crate::server::serve(&ctx, l, Backend::Direct(requests), *cpu);
            ClientResult {
                latencies_ns: run.served.iter().map(|r| r.completed_ns - r.published_ns).collect(),
                answered: run.answered,
                served: run.served,
                ..ClientResult::default()
            }
        }
        ClientSpec::ServedBatching { arrivals, model, gap_lo_ns, gap_hi_ns, seed, cpu } => {
            let l = listener.context("a served client without its listener")?;
            let engine = Engine::new(&ctx, arrivals, *model, (*gap_lo_ns, *gap_hi_ns));
            let run = std::thread::scope(|s| {
                let engine = &engine;
                let runner = s.spawn(move || engine.run(*seed));
                let run = crate::server::serve(&ctx, l, Backend::Engine(engine), *cpu);
                engine.close();
                // A panicked engine thread recorded what it did before; its record is still read.
                let _ = runner.join();
                run
            });
            let record = engine.into_record();
            ClientResult {
                // Per request: the publish of the step that admitted it → its last step's
                // completion (the unserved engine counts from the arrival: here the arrival is
                // the sender's, in the request path's figures).
                latencies_ns: run.served.iter().map(|r| r.completed_ns - r.published_ns).collect(),
                step_ns: record.step_ns,
                step_opens_busy: record.step_opens_busy,
                engine_busy_ns: record.busy_ns,
                answered: run.answered,
                served: run.served,
                ..ClientResult::default()
            }
        }
        ClientSpec::Batching { arrivals, model, gap_lo_ns, gap_hi_ns, seed } => {
            batching_loop(&ctx, t0, arrivals, *model, (*gap_lo_ns, *gap_hi_ns), *seed)
        }
        ClientSpec::Trainer { dispatch_ns, spread, step_dispatches, inflight, host_gap_ns, seed } => {
            trainer_loop(&ctx, *dispatch_ns, *spread, *step_dispatches, *inflight, *host_gap_ns, *seed)
        }
        ClientSpec::DpRank { dispatch_ns, spread, step_dispatches, ranks, seed } => {
            dp_loop(&ctx, *dispatch_ns, *spread, *step_dispatches, *ranks, *seed)
        }
    };
    result.doorbell_store_ns =
        std::mem::take(&mut *ctx.store_ns.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    Ok(result)
}

fn requests_loop(ctx: &Ctx, t0: u64, requests: &[crate::load::Request]) -> ClientResult {
    let mut out = ClientResult::default();
    // (queue, write index to complete, publish time)
    let mut pending: VecDeque<(usize, u64, u64)> = VecDeque::new();
    let mut next = 0;
    loop {
        let seen = ctx.wake.load(Ordering::Acquire);
        let now = monotonic_ns();
        pending.retain(|&(q, target, at)| {
            let done = ctx.queues[q].0.completed.load(Ordering::Acquire) >= target;
            if done {
                out.latencies_ns.push(now - at);
            }
            !done
        });
        while next < requests.len() && t0 + requests[next].at_ns <= monotonic_ns() {
            let q = next % ctx.queues.len();
            let (target, at) = ctx.publish(q, &requests[next].dispatches);
            pending.push_back((q, target, at));
            next += 1;
        }
        if (next == requests.len() && pending.is_empty()) || ctx.stopped() {
            return out;
        }
        let until_next = requests.get(next).map(|r| (t0 + r.at_ns).saturating_sub(monotonic_ns()));
        match until_next {
            Some(0) => continue,
            Some(ns) => futex_wait(ctx.wake, seen, Some(Duration::from_nanos(ns))),
            None => futex_wait(ctx.wake, seen, Some(Duration::from_millis(100))),
        }
    }
}

fn batching_loop(
    ctx: &Ctx,
    t0: u64,
    arrivals: &[crate::load::Arrival],
    model: crate::load::TokenModel,
    gap: (u64, u64),
    seed: u64,
) -> ClientResult {
    let mut out = ClientResult::default();
    let mut rng = Rng::new(seed);
    // (arrival time, tokens still to generate)
    let mut active: Vec<(u64, u64)> = Vec::new();
    let mut next = 0;
    let mut busy_since: Option<u64> = None;
    while !ctx.stopped() {
        let mut joining = 0;
        while next < arrivals.len() && t0 + arrivals[next].at_ns <= monotonic_ns() {
            active.push((t0 + arrivals[next].at_ns, arrivals[next].generated.max(1)));
            joining += arrivals[next].context;
            next += 1;
        }
        if active.is_empty() {
            match arrivals.get(next) {
                Some(a) => sleep_until(t0 + a.at_ns),
                None => break,
            }
            continue;
        }
        let (target, at) = ctx.publish(0, &[step_ns(model, active.len() as u64, joining)]);
        let opens = busy_since.is_none();
        busy_since.get_or_insert(at);
        if !ctx.wait_done(0, target) {
            break;
        }
        let done = monotonic_ns();
        out.step_ns.push(done - at);
        out.step_opens_busy.push(opens);
        for a in &mut active {
            a.1 -= 1;
            if a.1 == 0 {
                out.latencies_ns.push(done - a.0);
            }
        }
        active.retain(|a| a.1 > 0);
        if active.is_empty()
            && let Some(start) = busy_since.take()
        {
            out.engine_busy_ns.push((start, done));
        }
        // The engine's CPU work between steps (scheduling, sampling): asleep here, to spare cores.
        sleep_until(done + rng.between(gap.0, gap.1));
    }
    out
}

fn trainer_loop(
    ctx: &Ctx,
    dispatch_ns: u64,
    spread: f64,
    n: u32,
    inflight: u32,
    host_gap: (u64, u64),
    seed: u64,
) -> ClientResult {
    let mut out = ClientResult::default();
    let mut rng = Rng::new(seed);
    let mut steps: VecDeque<u64> = VecDeque::new();
    while !ctx.stopped() {
        while steps.len() < inflight.max(1) as usize {
            let d: Vec<u64> = (0..n.max(1)).map(|_| rng.around(dispatch_ns, spread)).collect();
            steps.push_back(ctx.publish(0, &d).0);
        }
        let Some(&target) = steps.front() else { continue };
        if !ctx.wait_done(0, target) {
            break;
        }
        steps.pop_front();
        out.steps += 1;
        let end = monotonic_ns();
        out.step_ends_ns.push(end);
        if host_gap.1 > 0 {
            // The loader's work for the next step, asleep (to spare the cores).
            sleep_until(end + rng.between(host_gap.0, host_gap.1));
        }
    }
    out
}

fn dp_loop(ctx: &Ctx, dispatch_ns: u64, spread: f64, n: u32, ranks: u32, seed: u64) -> ClientResult {
    let mut out = ClientResult::default();
    let mut rng = Rng::new(seed);
    let (arrived, generation) = (&ctx.region.barrier_arrived, &ctx.region.barrier_generation);
    while !ctx.stopped() {
        let d: Vec<u64> = (0..n.max(1)).map(|_| rng.around(dispatch_ns, spread)).collect();
        let target = ctx.publish(0, &d).0;
        if !ctx.wait_done(0, target) {
            break;
        }
        // The all-reduce: every rank waits here for the others.
        let gen_seen = generation.load(Ordering::Acquire);
        if arrived.fetch_add(1, Ordering::AcqRel) + 1 == ranks {
            arrived.store(0, Ordering::Release);
            generation.fetch_add(1, Ordering::AcqRel);
            futex_wake(generation);
        } else {
            while generation.load(Ordering::Acquire) == gen_seen && !ctx.stopped() {
                futex_wait(generation, gen_seen, Some(Duration::from_millis(100)));
            }
        }
        out.steps += 1;
        out.step_ends_ns.push(monotonic_ns());
    }
    out
}
