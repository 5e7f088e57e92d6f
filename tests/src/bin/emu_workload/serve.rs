//! `emu-workload serve`: an online client shaped like an inference server, unlike `online`'s
//! fixed period on one queue. Requests arrive as a Poisson process (exponential inter-arrival
//! times, seeded) whether or not earlier ones finished; each is a few dispatches of varying cost
//! on one of several queues ("streams", taken in turn), whose dispatch indices live in ROCr's
//! `amd_queue_t`; the client busy-polls the completion records on the CPU while any request is
//! outstanding, and sleeps only while none is (a server waiting for its next request). One more
//! queue can be created mid-run (`--second-queue-after-ms`), as a server that opens a stream late.
//!
//! Latency of a request = its last dispatch's end (the emulated CP's completion record) minus
//! its submission; how late the submission was after the Poisson arrival is reported apart
//! (`late_ns`), so the CPU side of the client is not mixed into the GPU side.

use std::{io::BufRead, path::PathBuf, thread, time::Duration};

use anyhow::{Context, Result, bail};
use gpreempt::clock::monotonic_ns;
use serde_json::{Value, json};

use crate::{
    aql::{DispatchPacket, Records},
    load::line,
    rocr::{self, Poll, Rng, RocrQueue},
};

/// A request or a ring that makes no progress for this long fails the run (a queue left
/// suspended), rather than hanging it.
const STALL_LIMIT: Duration = Duration::from_secs(120);

pub struct ServeArgs {
    pub gpu_id: u32,
    pub queues: u32,
    pub rate_hz: f64,
    pub dispatches: u32,
    pub dispatch_us: u64,
    pub spread: f64,
    pub requests: u32,
    pub seed: u64,
    pub second_queue_after_ms: Option<u64>,
    pub wait_go: bool,
    pub runtime_enable: bool,
    pub ring_size: u32,
    pub poll: Poll,
    pub out: Option<PathBuf>,
}

/// A submitted request whose dispatches have not all completed.
struct Pending {
    request: u64,
    stream: usize,
    due_ns: u64,
    submit_ns: u64,
    first_index: u64,
    records: Records,
    dispatches: usize,
    cost_ns: u64,
}

impl Pending {
    /// Its result line, once every dispatch has a completion record.
    fn finished(&self, queue_id: u32) -> Option<(u64, Value)> {
        let mut end_ns = 0;
        let mut preemptions = 0;
        for slot in 0..self.dispatches {
            let r = self.records.done(slot)?;
            end_ns = end_ns.max(r.end_ns);
            preemptions += r.preemptions;
        }
        let latency_ns = end_ns.saturating_sub(self.submit_ns);
        Some((
            latency_ns,
            json!({
                "event": "request", "request": self.request, "stream": self.stream, "queue_id": queue_id,
                "dispatches": self.dispatches, "cost_ns": self.cost_ns, "due_ns": self.due_ns,
                "submit_ns": self.submit_ns, "late_ns": self.submit_ns.saturating_sub(self.due_ns),
                "first_index": self.first_index, "latency_ns": latency_ns, "preemptions": preemptions,
            }),
        ))
    }
}

fn percentiles(mut v: Vec<u64>) -> Value {
    v.sort_unstable();
    let p = |q: f64| if v.is_empty() { 0 } else { v[gpreempt::stats::nearest_rank(v.len(), q)] };
    let mean = if v.is_empty() { 0 } else { v.iter().sum::<u64>() / v.len() as u64 };
    json!({"p50": p(50.0), "p99": p(99.0), "min": v.first().copied().unwrap_or(0),
           "max": v.last().copied().unwrap_or(0), "mean": mean, "count": v.len()})
}

pub fn serve(a: &ServeArgs) -> Result<()> {
    if !a.rate_hz.is_finite() || a.rate_hz <= 0.0 {
        bail!("--rate-hz must be a positive number");
    }
    let (device, runtime) = rocr::open(a.runtime_enable)?;
    let mut streams: Vec<RocrQueue> = (0..a.queues.max(1))
        .map(|i| rocr::create_queue(&device, a.gpu_id, a.ring_size, u64::from(i)))
        .collect::<Result<_>>()?;
    let hello = json!({
        "pid": std::process::id(), "mode": "serve", "runtime_enable": runtime,
        "queues": streams.iter().map(rocr::describe).collect::<Vec<_>>(), "started_ns": monotonic_ns(),
    });
    line(&hello)?;
    if a.wait_go {
        let mut go = String::new();
        std::io::stdin().lock().read_line(&mut go).context("waiting for `go` on stdin")?;
    }
    let mut rng = Rng::new(a.seed);
    let mean_gap_ns = 1e9 / a.rate_hz;
    let max_dispatches = u64::from(a.dispatches.max(1)) * 2 - 1;
    let t0 = monotonic_ns();
    let mut next_due = t0 + rng.exponential(mean_gap_ns) as u64;
    let mut second_at = a.second_queue_after_ms.map(|ms| t0 + ms * 1_000_000);
    let mut pending: Vec<Pending> = Vec::new();
    let (mut issued, mut results, mut latencies, mut lates) = (0u64, Vec::new(), Vec::new(), Vec::new());
    let mut preempted = 0u64;
    let mut last_progress = monotonic_ns();
    let mut created_late = Value::Null;
    loop {
        let now = monotonic_ns();
        if let Some(at) = second_at
            && now >= at
        {
            let q = rocr::create_queue(&device, a.gpu_id, a.ring_size, streams.len() as u64)?;
            created_late =
                json!({"event": "queue_created", "t_ms": (now - t0) / 1_000_000, "queue": rocr::describe(&q)});
            line(&created_late)?;
            streams.push(q);
            second_at = None;
        }
        if issued < u64::from(a.requests) && now >= next_due {
            // Drawn at the arrival, in arrival order: the same seed gives the same requests.
            let n = rng.between(1, max_dispatches) as usize;
            let costs: Vec<u64> = (0..n).map(|_| rng.around(a.dispatch_us * 1000, a.spread)).collect();
            let stream = (issued % streams.len() as u64) as usize;
            let q = streams[stream].mem;
            let waiting = monotonic_ns();
            while q.space() < n as u64 {
                if monotonic_ns() - waiting > STALL_LIMIT.as_nanos() as u64 {
                    bail!("no room for {n} packets in queue {} within {STALL_LIMIT:?}", q.queue_id);
                }
                a.poll.wait();
            }
            let records = Records::alloc(n);
            let packets: Vec<DispatchPacket> =
                costs.iter().enumerate().map(|(slot, &c)| DispatchPacket::dispatch(c, records.arm(slot))).collect();
            let submit_ns = monotonic_ns();
            let first_index = q.publish_batch(&packets);
            pending.push(Pending {
                request: issued,
                stream,
                due_ns: next_due,
                submit_ns,
                first_index,
                records,
                dispatches: n,
                cost_ns: costs.iter().sum(),
            });
            issued += 1;
            // Open loop: the next arrival follows this one's due time, not its submission.
            next_due += rng.exponential(mean_gap_ns) as u64;
            continue;
        }
        let mut i = 0;
        while i < pending.len() {
            if let Some((latency_ns, result)) = pending[i].finished(streams[pending[i].stream].mem.queue_id) {
                let p = pending.swap_remove(i);
                latencies.push(latency_ns);
                lates.push(p.submit_ns.saturating_sub(p.due_ns));
                preempted += result["preemptions"].as_u64().unwrap_or(0);
                line(&result)?;
                results.push((p.request, result));
                last_progress = monotonic_ns();
            } else {
                i += 1;
            }
        }
        if issued == u64::from(a.requests) && pending.is_empty() {
            break;
        }
        if pending.is_empty() {
            // Nothing outstanding: a server waits for its next request without the CPU.
            let wake = second_at.map_or(next_due, |s| s.min(next_due));
            let now = monotonic_ns();
            if wake > now {
                thread::sleep(Duration::from_nanos(wake - now));
            }
            last_progress = monotonic_ns();
        } else {
            if monotonic_ns() - last_progress > STALL_LIMIT.as_nanos() as u64 {
                bail!("{} request(s) without a completion within {STALL_LIMIT:?}", pending.len());
            }
            a.poll.wait();
        }
    }
    let elapsed_ns = monotonic_ns() - t0;
    results.sort_by_key(|(i, _)| *i);
    let summary = json!({
        "event": "summary", "mode": "serve", "requests": a.requests, "queues": streams.len(),
        "rate_hz": a.rate_hz, "achieved_rate_hz": issued as f64 * 1e9 / elapsed_ns.max(1) as f64,
        "dispatches_mean": a.dispatches, "dispatch_us": a.dispatch_us, "spread": a.spread, "seed": a.seed,
        "poll": format!("{:?}", a.poll).to_lowercase(), "latency_ns": percentiles(latencies),
        "late_ns": percentiles(lates), "preempted_dispatches": preempted, "queue_created": created_late,
    });
    line(&summary)?;
    if let Some(path) = &a.out {
        let requests: Vec<Value> = results.into_iter().map(|(_, r)| r).collect();
        let doc = json!({"hello": hello, "requests": requests, "summary": summary});
        std::fs::write(path, serde_json::to_vec_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
