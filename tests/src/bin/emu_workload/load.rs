//! The `online` and `offline` workloads: one AQL queue each, timed by the completion records
//! the emulated CP writes (CLOCK_MONOTONIC ns), results as JSON Lines on stdout and, with
//! `--out`, one JSON document.

use std::{
    io::{BufRead, Write},
    path::PathBuf,
    sync::mpsc,
    thread,
    time::Duration,
};

use anyhow::{Context, Result};
use gpreempt::clock::monotonic_ns;
use serde_json::{Value, json};

use crate::aql::{CompletionRecord, DispatchPacket, QueueMem, Records};

/// How long a workload waits for ring space or a completion before it gives up (a queue
/// suspended or in error for this long is a failed run, not a hang).
const STALL_LIMIT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_micros(200);

/// stdin's lines on a channel, read by a thread of their own; EOF reads as `stop`.
pub fn stdin_commands() -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel::<String>();
    thread::spawn(move || {
        for l in std::io::stdin().lock().lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
        let _ = tx.send("stop".to_owned());
    });
    rx
}

pub fn line(v: &Value) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{v}")?;
    out.flush()?;
    Ok(())
}

fn write_out(out: Option<&PathBuf>, doc: &Value) -> Result<()> {
    if let Some(path) = out {
        std::fs::write(path, serde_json::to_vec_pretty(doc)?).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Nearest-rank percentile (`q` in 0..=1) of sorted values, 0 for none: gpreempt's own rank
/// (`stats::nearest_rank`), so the workload and the tool report percentiles alike.
fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[gpreempt::stats::nearest_rank(sorted.len(), q * 100.0)]
}

fn wait_done(records: &Records, slot: usize) -> Result<CompletionRecord> {
    let started = std::time::Instant::now();
    loop {
        if let Some(r) = records.done(slot) {
            return Ok(r);
        }
        if started.elapsed() > STALL_LIMIT {
            anyhow::bail!("no completion record in slot {slot} within {STALL_LIMIT:?}");
        }
        thread::sleep(POLL);
    }
}

fn wait_space(q: &QueueMem, n: u64) -> Result<()> {
    let started = std::time::Instant::now();
    while q.space() < n {
        if started.elapsed() > STALL_LIMIT {
            anyhow::bail!("no room for {n} packets in queue {} within {STALL_LIMIT:?}", q.queue_id);
        }
        thread::sleep(POLL);
    }
    Ok(())
}

/// xorshift64*: deterministic jitter without a dependency.
struct Jitter(u64);

impl Jitter {
    fn next(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            return 0;
        }
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % bound
    }
}

pub struct OnlineArgs {
    pub dispatches: u32,
    pub dispatch_us: u64,
    pub period_us: u64,
    pub jitter_us: u64,
    pub requests: u32,
    pub seed: u64,
    pub out: Option<PathBuf>,
}

/// Periodic requests of `dispatches` dispatches each: request i is submitted at
/// start + i * period + jitter (or when request i-1 completed, if later); its latency is the
/// last dispatch's end minus the submission time.
pub fn online(q: &QueueMem, hello: Value, a: &OnlineArgs) -> Result<()> {
    let k = a.dispatches.max(1) as usize;
    let records = Records::alloc(k);
    let cost_ns = a.dispatch_us * 1000;
    let mut jitter = Jitter(a.seed.max(1));
    let mut requests = Vec::new();
    let mut latencies = Vec::new();
    let t0 = monotonic_ns();
    for i in 0..u64::from(a.requests) {
        let due = t0 + i * a.period_us * 1000 + jitter.next(a.jitter_us * 1000);
        let now = monotonic_ns();
        if due > now {
            thread::sleep(Duration::from_nanos(due - now));
        }
        let packets: Vec<DispatchPacket> = (0..k).map(|d| DispatchPacket::dispatch(cost_ns, records.arm(d))).collect();
        wait_space(q, k as u64)?;
        let submit_ns = monotonic_ns();
        let first_index = q.publish_batch(&packets);
        let mut done = Vec::with_capacity(k);
        for d in 0..k {
            done.push(wait_done(&records, d)?);
        }
        let end_ns = done.iter().map(|r| r.end_ns).max().unwrap_or(submit_ns);
        let latency_ns = end_ns.saturating_sub(submit_ns);
        latencies.push(latency_ns);
        let request = json!({
            "event": "request", "request": i, "due_ns": due, "submit_ns": submit_ns, "first_index": first_index,
            "latency_ns": latency_ns, "records": done,
        });
        line(&request)?;
        requests.push(request);
    }
    let mut sorted = latencies.clone();
    sorted.sort_unstable();
    let summary = json!({
        "event": "summary", "mode": "online", "requests": a.requests, "dispatches": k, "dispatch_us": a.dispatch_us,
        "period_us": a.period_us, "jitter_us": a.jitter_us,
        "latency_ns": {"p50": percentile(&sorted, 0.5), "p99": percentile(&sorted, 0.99),
                       "min": sorted.first().copied().unwrap_or(0), "max": sorted.last().copied().unwrap_or(0)},
    });
    line(&summary)?;
    write_out(a.out.as_ref(), &json!({"hello": hello, "requests": requests, "summary": summary}))
}

pub struct OfflineArgs {
    pub dispatch_us: u64,
    pub interval_ms: u64,
    pub records: bool,
    pub out: Option<PathBuf>,
}

/// Keep the ring full of dispatches of `dispatch_us` until `stop` or EOF on stdin; `stats`
/// answers the completed count. At the end every dispatch submitted has completed and the
/// summary lists the completions per interval (by their end time) and every preempted dispatch.
pub fn offline(q: &QueueMem, hello: Value, a: &OfflineArgs) -> Result<()> {
    let slots = (q.ring_packets.max(1) * 2) as usize;
    let records = Records::alloc(slots);
    let cost_ns = a.dispatch_us * 1000;
    let rx = stdin_commands();
    let t0 = monotonic_ns();
    let first = q.write_index();
    let mut harvested: Vec<CompletionRecord> = Vec::new();
    let mut stopping = false;
    let mut last_interval = t0;
    let mut interval_done = 0u64;
    loop {
        // Harvest in order, then refill: slot i is reused only once dispatch i completed.
        while let Some(r) = records.done((first + harvested.len() as u64) as usize) {
            if r.packet_index != first + harvested.len() as u64 {
                break;
            }
            harvested.push(r);
            interval_done += 1;
        }
        let submitted = q.write_index() - first;
        if stopping && harvested.len() as u64 == submitted {
            break;
        }
        if !stopping {
            let room = (harvested.len() as u64 + slots as u64 / 2).saturating_sub(q.write_index() - first);
            let n = q.space().min(room);
            if n > 0 {
                let i = q.write_index();
                let packets: Vec<DispatchPacket> =
                    (i..i + n).map(|i| DispatchPacket::dispatch(cost_ns, records.arm(i as usize))).collect();
                q.publish_batch(&packets);
            }
        }
        match rx.try_recv() {
            Ok(cmd) if cmd.trim() == "stats" => line(&json!({
                "event": "stats", "completed": harvested.len(), "submitted": submitted, "read_index": q.read_index(),
                "now_ns": monotonic_ns(),
            }))?,
            Ok(cmd) if cmd.trim() == "stop" => stopping = true,
            Ok(other) => line(&json!({"event": "error", "error": format!("unknown command {other:?}")}))?,
            Err(_) => {}
        }
        let now = monotonic_ns();
        if a.interval_ms > 0 && now - last_interval >= a.interval_ms * 1_000_000 {
            let secs = (now - last_interval) as f64 / 1e9;
            line(&json!({"event": "interval", "t_ms": (now - t0) / 1_000_000, "completed": interval_done,
                         "per_s": (interval_done as f64 / secs).round()}))?;
            last_interval = now;
            interval_done = 0;
        }
        thread::sleep(POLL);
    }
    let interval_ns = a.interval_ms.max(100) * 1_000_000;
    let mut intervals: Vec<u64> = Vec::new();
    for r in &harvested {
        let k = (r.end_ns.saturating_sub(t0) / interval_ns) as usize;
        if intervals.len() <= k {
            intervals.resize(k + 1, 0);
        }
        intervals[k] += 1;
    }
    let busy_ns: u64 = harvested.iter().map(|r| r.end_ns - r.start_ns - r.off_ns).sum();
    let span_ns = match (harvested.first(), harvested.last()) {
        (Some(f), Some(l)) => l.end_ns - f.start_ns,
        _ => 0,
    };
    let preempted: Vec<&CompletionRecord> = harvested.iter().filter(|r| r.preemptions > 0).collect();
    let mut summary = json!({
        "event": "summary", "mode": "offline", "completed": harvested.len(), "dispatch_us": a.dispatch_us,
        "cost_ns_total": harvested.len() as u64 * cost_ns, "busy_ns_total": busy_ns, "span_ns": span_ns,
        "per_s": if span_ns > 0 { (harvested.len() as f64 * 1e9 / span_ns as f64).round() } else { 0.0 },
        "interval_ms": interval_ns / 1_000_000, "completed_per_interval": intervals, "preempted": preempted,
    });
    if a.records {
        summary["records"] = json!(harvested);
    }
    line(&summary)?;
    write_out(a.out.as_ref(), &json!({"hello": hello, "summary": summary}))
}
