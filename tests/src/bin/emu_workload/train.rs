//! `emu-workload train`: an offline client shaped like a training job, unlike `offline`'s one
//! queue kept full by a sleeping thread. It has several queues, possibly on several GPUs
//! (`--gpu-ids`), whose indices live in ROCr's `amd_queue_t`; on each it runs "steps" of a few
//! dispatches of varying cost, keeps `--inflight-steps` of them queued (asynchronous launches),
//! and waits for the oldest step's completion records by polling on the CPU (as a training loop
//! that synchronizes per step with HIP does), never asleep. Each queue is independent: a
//! suspended queue on one GPU does not stop the others (no collective between them).
//!
//! Progress is counted per GPU as dispatches completed and as emulated GPU time completed
//! (`work_ns`, the sum of their costs): with costs that vary, the second is what "throughput"
//! means. `stats` on stdin answers both with `now_ns`; `stop` (or EOF) lets the queued steps
//! finish and prints the summary.

use std::{collections::VecDeque, path::PathBuf, time::Duration};

use anyhow::{Context, Result, bail};
use gpreempt::clock::monotonic_ns;
use serde_json::{Value, json};

use crate::{
    aql::{DispatchPacket, Records},
    load::line,
    rocr::{self, Poll, Rng, RocrQueue},
};

/// Queued steps that make no progress for this long after `stop` fail the run.
const STALL_LIMIT: Duration = Duration::from_secs(120);

pub struct TrainArgs {
    pub gpu_ids: Vec<u32>,
    pub queues: u32,
    pub dispatch_us: u64,
    pub spread: f64,
    pub step_dispatches: u32,
    pub inflight_steps: u32,
    pub seed: u64,
    pub runtime_enable: bool,
    pub ring_size: u32,
    pub poll: Poll,
    pub out: Option<PathBuf>,
    /// A progress log as training jobs write one: a line whenever dispatches completed.
    pub log: Option<PathBuf>,
}

/// One queued step: `n` dispatches in record slots `slot..slot + n` (mod the ring of records).
struct Step {
    slot: usize,
    n: usize,
    cost_ns: u64,
}

struct Stream {
    q: RocrQueue,
    /// Completion records reused in turn: a slot is armed again only after its step completed.
    records: Records,
    capacity: usize,
    next_slot: usize,
    inflight: VecDeque<Step>,
    completed: u64,
    work_ns: u64,
    preempted: u64,
}

impl Stream {
    /// Harvest the completed steps at the front; whether any was.
    fn harvest(&mut self) -> bool {
        let mut any = false;
        while let Some(step) = self.inflight.front() {
            let mut preempted = 0;
            for k in 0..step.n {
                match self.records.done((step.slot + k) % self.capacity) {
                    Some(r) => preempted += u64::from(r.preemptions > 0),
                    None => return any,
                }
            }
            self.completed += step.n as u64;
            self.work_ns += step.cost_ns;
            self.preempted += preempted;
            self.inflight.pop_front();
            any = true;
        }
        any
    }

    fn publish(&mut self, rng: &mut Rng, a: &TrainArgs) -> bool {
        let n = a.step_dispatches.max(1) as usize;
        if self.inflight.len() >= a.inflight_steps.max(1) as usize || self.q.mem.space() < n as u64 {
            return false;
        }
        let costs: Vec<u64> = (0..n).map(|_| rng.around(a.dispatch_us * 1000, a.spread)).collect();
        let slot = self.next_slot;
        let packets: Vec<DispatchPacket> = costs
            .iter()
            .enumerate()
            .map(|(k, &c)| DispatchPacket::dispatch(c, self.records.arm((slot + k) % self.capacity)))
            .collect();
        self.q.mem.publish_batch(&packets);
        self.next_slot = (slot + n) % self.capacity;
        self.inflight.push_back(Step { slot, n, cost_ns: costs.iter().sum() });
        true
    }
}

/// Per GPU: (gpu_id, dispatches completed, work completed in ns), in `--gpu-ids` order.
fn per_gpu(a: &TrainArgs, streams: &[Stream]) -> Vec<Value> {
    a.gpu_ids
        .iter()
        .map(|&g| {
            let mine = streams.iter().filter(|s| s.q.mem.gpu_id == g);
            let (completed, work_ns) = mine.fold((0, 0), |(c, w), s| (c + s.completed, w + s.work_ns));
            json!({"gpu_id": g, "completed": completed, "work_ns": work_ns})
        })
        .collect()
}

pub fn train(a: &TrainArgs) -> Result<()> {
    if a.gpu_ids.is_empty() {
        bail!("--gpu-ids needs at least one gpu id");
    }
    let (device, runtime) = rocr::open(a.runtime_enable)?;
    let capacity = (a.inflight_steps.max(1) * a.step_dispatches.max(1)) as usize;
    let mut streams = Vec::new();
    for i in 0..a.queues.max(1) {
        // Queues spread over the GPUs in turn: queue i on gpu_ids[i % len].
        let gpu = a.gpu_ids[i as usize % a.gpu_ids.len()];
        streams.push(Stream {
            q: rocr::create_queue(&device, gpu, a.ring_size, u64::from(i))?,
            records: Records::alloc(capacity),
            capacity,
            next_slot: 0,
            inflight: VecDeque::new(),
            completed: 0,
            work_ns: 0,
            preempted: 0,
        });
    }
    let hello = json!({
        "pid": std::process::id(), "mode": "train", "runtime_enable": runtime,
        "queues": streams.iter().map(|s| rocr::describe(&s.q)).collect::<Vec<_>>(), "started_ns": monotonic_ns(),
    });
    // Opened (created) before the hello line, so whoever waits for that line finds the file.
    let mut log = match &a.log {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening {}", path.display()))?,
        ),
        None => None,
    };
    let mut logged = 0u64;
    line(&hello)?;
    let rx = crate::load::stdin_commands();
    let mut rng = Rng::new(a.seed);
    let t0 = monotonic_ns();
    let mut stopping: Option<u64> = None;
    loop {
        let mut progressed = false;
        for s in &mut streams {
            progressed |= s.harvest();
        }
        let completed: u64 = streams.iter().map(|s| s.completed).sum();
        if let Some(f) = log.as_mut()
            && completed > logged
        {
            use std::io::Write;
            logged = completed;
            let secs = (monotonic_ns() - t0) as f64 / 1e9;
            writeln!(f, "train: completed {completed} dispatches, {:.1} dispatches/s", completed as f64 / secs)?;
        }
        for s in &mut streams {
            if stopping.is_none() {
                while s.publish(&mut rng, a) {
                    progressed = true;
                }
            }
        }
        match rx.try_recv() {
            Ok(cmd) if cmd.trim() == "stats" => line(&json!({
                "event": "stats", "now_ns": monotonic_ns(),
                "completed": streams.iter().map(|s| s.completed).sum::<u64>(),
                "work_ns": streams.iter().map(|s| s.work_ns).sum::<u64>(), "gpus": per_gpu(a, &streams),
            }))?,
            Ok(cmd) if cmd.trim() == "stop" => stopping = stopping.or(Some(monotonic_ns())),
            Ok(other) => line(&json!({"event": "error", "error": format!("unknown command {other:?}")}))?,
            Err(_) => {}
        }
        if let Some(since) = stopping {
            if streams.iter().all(|s| s.inflight.is_empty()) {
                break;
            }
            if monotonic_ns() - since > STALL_LIMIT.as_nanos() as u64 {
                bail!("queued steps did not complete within {STALL_LIMIT:?} of `stop`");
            }
        }
        if !progressed {
            a.poll.wait();
        }
    }
    let span_ns = monotonic_ns() - t0;
    let summary = json!({
        "event": "summary", "mode": "train", "span_ns": span_ns, "dispatch_us": a.dispatch_us, "spread": a.spread,
        "step_dispatches": a.step_dispatches, "inflight_steps": a.inflight_steps, "seed": a.seed,
        "poll": format!("{:?}", a.poll).to_lowercase(),
        "completed": streams.iter().map(|s| s.completed).sum::<u64>(),
        "work_ns": streams.iter().map(|s| s.work_ns).sum::<u64>(), "gpus": per_gpu(a, &streams),
        "queues": streams.iter().map(|s| json!({"queue_id": s.q.mem.queue_id, "gpu_id": s.q.mem.gpu_id,
            "completed": s.completed, "work_ns": s.work_ns, "preempted": s.preempted})).collect::<Vec<_>>(),
    });
    line(&summary)?;
    if let Some(path) = &a.out {
        let doc = json!({"hello": hello, "summary": summary});
        std::fs::write(path, serde_json::to_vec_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
