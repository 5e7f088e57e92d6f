//! `emu-workload server` and `emu-workload request`: an online *service* that takes its work from
//! outside, and the load command that drives it, for `gpreempt evaluate` (which measures a
//! running service under a user's own load generator).
//!
//! The server creates its queues as ROCr lays them out (indices inside `amd_queue_t`), prints a
//! hello line, and serves a Unix socket: each request is a line `N`, answered once the N
//! dispatches it published on the next queue (in turn) all completed, with `done N LATENCY_NS`
//! (the emulated CP's completion records: last end − submission). Connections are served one
//! after another; stdin `stats` answers the totals, `stop` (or EOF) ends it with a summary.
//!
//! `request` connects, sends `--requests` requests of `--dispatches` dispatches one after
//! another and prints one line a load generator would: `requests=K dispatches=D p50_ms=… p99_ms=…
//! max_ms=…` (wall time from sending a request to its answer), exit status 0 when every request
//! was answered.

use std::{
    io::{BufRead, BufReader, ErrorKind, Write},
    os::unix::net::{UnixListener, UnixStream},
    path::{Path, PathBuf},
    sync::mpsc::TryRecvError,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use gpreempt::clock::monotonic_ns;
use serde_json::json;

use crate::{
    aql::{DispatchPacket, Records},
    load::{line, stdin_commands},
    rocr::{self, RocrQueue},
};

/// The most dispatches one request may ask for (its completion records are allocated once).
const MAX_DISPATCHES: usize = 256;
/// A request whose dispatches do not all complete in this long is answered with an error (a
/// queue left suspended), rather than hanging its client.
const STALL_LIMIT: Duration = Duration::from_secs(120);
/// How the server waits for completions and connections: briefly asleep, so that it leaves the
/// (two) vCPUs to the emulated CP and the other processes, as a server blocked in
/// hipStreamSynchronize with the blocking-sync flag would.
const WAIT: Duration = Duration::from_micros(100);

pub struct ServerArgs {
    pub gpu_id: u32,
    pub queues: u32,
    pub socket: PathBuf,
    pub dispatch_us: u64,
    pub runtime_enable: bool,
    pub ring_size: u32,
}

struct Stream {
    q: RocrQueue,
    records: Records,
}

struct Totals {
    requests: u64,
    dispatches: u64,
    connections: u64,
}

/// Publish `n` dispatches on `s` and wait for all of them; the latency (ns) by the records.
fn serve_one(s: &Stream, n: usize, cost_ns: u64) -> Result<u64> {
    let packets: Vec<DispatchPacket> = (0..n).map(|k| DispatchPacket::dispatch(cost_ns, s.records.arm(k))).collect();
    let waiting = Instant::now();
    while s.q.mem.space() < n as u64 {
        if waiting.elapsed() > STALL_LIMIT {
            bail!("no room for {n} packets in queue {} within {STALL_LIMIT:?}", s.q.mem.queue_id);
        }
        thread::sleep(WAIT);
    }
    let submit_ns = monotonic_ns();
    s.q.mem.publish_batch(&packets);
    let mut end_ns = submit_ns;
    for k in 0..n {
        loop {
            if let Some(r) = s.records.done(k) {
                end_ns = end_ns.max(r.end_ns);
                break;
            }
            if waiting.elapsed() > STALL_LIMIT {
                bail!("dispatch {k} of a request did not complete within {STALL_LIMIT:?}");
            }
            thread::sleep(WAIT);
        }
    }
    Ok(end_ns.saturating_sub(submit_ns))
}

/// One connection's requests, until it closes.
fn connection(conn: UnixStream, streams: &[Stream], cost_ns: u64, totals: &mut Totals) -> Result<()> {
    conn.set_nonblocking(false)?;
    let mut out = conn.try_clone()?;
    for request in BufReader::new(conn).lines() {
        let request = request?;
        let answer = match request.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_DISPATCHES).contains(&n) => {
                let s = &streams[(totals.requests % streams.len() as u64) as usize];
                match serve_one(s, n, cost_ns) {
                    Ok(latency_ns) => {
                        totals.requests += 1;
                        totals.dispatches += n as u64;
                        format!("done {n} {latency_ns}")
                    }
                    Err(e) => format!("error {e}"),
                }
            }
            _ => format!("error a request is a number of dispatches, 1 to {MAX_DISPATCHES}: {request:?}"),
        };
        writeln!(out, "{answer}")?;
    }
    Ok(())
}

pub fn server(a: &ServerArgs) -> Result<()> {
    let (device, runtime) = rocr::open(a.runtime_enable)?;
    let streams: Vec<Stream> = (0..a.queues.max(1))
        .map(|i| {
            Ok(Stream {
                q: rocr::create_queue(&device, a.gpu_id, a.ring_size, u64::from(i))?,
                records: Records::alloc(MAX_DISPATCHES),
            })
        })
        .collect::<Result<_>>()?;
    // A socket file left by an earlier run would refuse the bind.
    let _ = std::fs::remove_file(&a.socket);
    let listener = UnixListener::bind(&a.socket).with_context(|| format!("binding {}", a.socket.display()))?;
    listener.set_nonblocking(true)?;
    line(&json!({
        "pid": std::process::id(), "mode": "server", "runtime_enable": runtime, "socket": a.socket,
        "queues": streams.iter().map(|s| rocr::describe(&s.q)).collect::<Vec<_>>(), "started_ns": monotonic_ns(),
    }))?;
    let rx = stdin_commands();
    let mut totals = Totals { requests: 0, dispatches: 0, connections: 0 };
    loop {
        match rx.try_recv() {
            Ok(cmd) if cmd.trim() == "stats" => line(&json!({
                "event": "stats", "requests": totals.requests, "dispatches": totals.dispatches,
                "connections": totals.connections,
                "wptr": streams.iter().map(|s| s.q.mem.write_index()).collect::<Vec<_>>(),
            }))?,
            Ok(cmd) if cmd.trim() == "stop" => break,
            Ok(other) => line(&json!({"event": "error", "error": format!("unknown command {other:?}")}))?,
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => {}
        }
        match listener.accept() {
            Ok((conn, _)) => {
                totals.connections += 1;
                // A client that goes away mid-request ends its connection, not the server.
                if let Err(e) = connection(conn, &streams, a.dispatch_us * 1000, &mut totals) {
                    line(&json!({"event": "connection_error", "error": e.to_string()}))?;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(1)),
            Err(e) => return Err(e).context("accepting a connection"),
        }
    }
    let _ = std::fs::remove_file(&a.socket);
    line(&json!({
        "event": "summary", "mode": "server", "requests": totals.requests, "dispatches": totals.dispatches,
        "connections": totals.connections,
    }))
}

pub struct RequestArgs {
    pub socket: PathBuf,
    pub requests: u32,
    pub dispatches: u32,
    pub gap_us: u64,
}

fn ms_at(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() { 0.0 } else { sorted[gpreempt::stats::nearest_rank(sorted.len(), p)] }
}

fn connect(path: &Path) -> Result<UnixStream> {
    UnixStream::connect(path).with_context(|| format!("connecting to the server at {}", path.display()))
}

/// The load command: `--requests` requests in turn, then one summary line.
pub fn request(a: &RequestArgs) -> Result<()> {
    let conn = connect(&a.socket)?;
    let mut out = conn.try_clone()?;
    let mut answers = BufReader::new(conn).lines();
    let mut latencies_ms = Vec::with_capacity(a.requests as usize);
    for i in 0..a.requests {
        if i > 0 && a.gap_us > 0 {
            thread::sleep(Duration::from_micros(a.gap_us));
        }
        let sent = Instant::now();
        writeln!(out, "{}", a.dispatches)?;
        let answer = answers.next().context("the server closed the connection")??;
        if !answer.starts_with("done ") {
            bail!("request {i}: the server answered {answer:?}");
        }
        latencies_ms.push(sent.elapsed().as_secs_f64() * 1e3);
    }
    let mut sorted = latencies_ms.clone();
    sorted.sort_by(f64::total_cmp);
    println!(
        "requests={} dispatches={} p50_ms={:.3} p99_ms={:.3} max_ms={:.3}",
        latencies_ms.len(),
        latencies_ms.len() as u64 * u64::from(a.dispatches),
        ms_at(&sorted, 50.0),
        ms_at(&sorted, 99.0),
        sorted.last().copied().unwrap_or(0.0)
    );
    Ok(())
}
