//! `emu-workload server` and `emu-workload request`: an online *service* that takes its work from
//! outside, and the load command that drives it, for `gpreempt evaluate` (which measures a
//! running service under a user's own load generator) and the arrival probe's tests.
//!
//! The server creates its queues as ROCr lays them out (indices inside `amd_queue_t`), prints a
//! hello line, and serves requests; stdin `stats` answers the totals, `stop` (or EOF) ends it with
//! a summary. A request is a CPU phase of `--cpu-ms` (a busy spin, as an LLM server tokenizes and
//! templates before its first kernel; 0 by default), then N dispatches published on the next queue
//! (in turn), answered once they all completed with `done N LATENCY_NS` (the emulated CP's
//! completion records: last end − submission). One request's dispatches at a time per queue.
//!
//! - `--socket PATH`: a Unix socket; each request is a line `N` (1 to 256) answered with the line
//!   `done N LATENCY_NS` (or `error …`). Connections are served one after another.
//! - `--listen ADDR:PORT`: TCP, HTTP/1.1 with keep-alive (port 0: the kernel picks one; the hello
//!   line's `"port"` says which). `POST /generate` with a `Content-Length` body `N` (0 to 256
//!   dispatches; anything after the number and a whitespace byte, a prompt, is read and ignored)
//!   is a request, answered `200 OK` with the body `done N LATENCY_NS\n` (`done 0 0\n` for N = 0,
//!   which is the CPU phase alone). `GET /health` (body `ok\n`) and `GET /metrics` (the totals, one
//!   `emu_workload_<name>_total N` line each) are answered at once with no GPU work and are counted
//!   apart from requests (`health`, `metrics` in `stats` and the summary): the probes and scrapes a
//!   serving pod answers on its API port. Each connection has a thread, so a health prober is not
//!   held behind a request of another connection. A malformed request is answered `400` and its
//!   connection closed; another path `404`, another method `405`.
//!
//! `--no-gpu` opens no /dev/kfd and creates no queue: only requests of 0 dispatches are served
//! (a request for more is answered with an error), so the server runs on any host, as the
//! arrival probe's tests run it.
//!
//! `request` sends `--requests` requests of `--dispatches` dispatches one after another, to
//! `--socket PATH` or over one keep-alive connection to `--url http://HOST:PORT[/PATH]` (`POST`,
//! `/generate` if no path is given), and prints one line a load generator would: `requests=K
//! dispatches=D p50_ms=… p99_ms=… max_ms=…` (wall time from sending a request to its answer),
//! followed in the `--url` mode by ` health=H`: the `GET /health` answered on a second connection
//! every `--health-every-ms` while the requests ran (0 without it). Exit status 0 when every
//! request (and health probe) was answered.

use std::{
    io::{BufRead, BufReader, ErrorKind, Read, Write},
    net::{TcpListener, TcpStream},
    os::unix::net::{UnixListener, UnixStream},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc::TryRecvError,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use gpreempt::{clock::monotonic_ns, kfd::Device};
use serde_json::{Value, json};

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
/// The longest request line or header line, and the most header lines, of an HTTP message.
const MAX_LINE: u64 = 8 * 1024;
const MAX_HEADERS: usize = 100;
/// The largest HTTP body (a prompt) the server reads.
const MAX_BODY: usize = 16 << 20;

pub struct ServerArgs {
    pub gpu_id: u32,
    pub queues: u32,
    /// Exactly one of `socket` and `listen` (the CLI enforces it).
    pub socket: Option<PathBuf>,
    pub listen: Option<String>,
    pub dispatch_us: u64,
    pub cpu_ms: f64,
    pub no_gpu: bool,
    pub runtime_enable: bool,
    pub ring_size: u32,
}

struct Stream {
    q: RocrQueue,
    records: Records,
}

/// What every connection shares: the queues (each behind its own lock, so one request's
/// dispatches at a time per queue: the records are per queue) and the totals.
struct Service {
    streams: Vec<Mutex<Stream>>,
    cost_ns: u64,
    cpu: Duration,
    /// Requests handed to a queue so far: the next one goes to `next % streams`.
    next: AtomicU64,
    requests: AtomicU64,
    dispatches: AtomicU64,
    connections: AtomicU64,
    health: AtomicU64,
    metrics: AtomicU64,
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

/// The CPU phase: a busy spin (a tokenizer computes; it does not sleep).
fn spin(d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}

impl Service {
    /// One request: the CPU phase, then `n` dispatches on the next queue; the GPU latency (ns).
    fn request(&self, n: usize) -> Result<u64> {
        spin(self.cpu);
        let latency_ns = if n == 0 {
            0
        } else {
            if self.streams.is_empty() {
                bail!("this server has no GPU (--no-gpu): a request can ask for 0 dispatches only, not {n}");
            }
            let turn = self.next.fetch_add(1, Ordering::Relaxed) % self.streams.len() as u64;
            // A thread that panicked while holding a queue left it as consistent as any error does.
            let s = self.streams[turn as usize].lock().unwrap_or_else(PoisonError::into_inner);
            serve_one(&s, n, self.cost_ns)?
        };
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.dispatches.fetch_add(n as u64, Ordering::Relaxed);
        Ok(latency_ns)
    }

    fn totals(&self, event: &str) -> Value {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        json!({
            "event": event, "mode": "server", "requests": get(&self.requests), "dispatches": get(&self.dispatches),
            "connections": get(&self.connections), "health": get(&self.health), "metrics": get(&self.metrics),
        })
    }

    /// `GET /metrics`'s body, this scrape counted.
    fn metrics_text(&self) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "emu_workload_requests_total {}\nemu_workload_dispatches_total {}\nemu_workload_health_total {}\n\
             emu_workload_metrics_total {}\n",
            get(&self.requests),
            get(&self.dispatches),
            get(&self.health),
            get(&self.metrics)
        )
    }
}

/// One Unix-socket connection's requests, until it closes.
fn unix_connection(conn: UnixStream, svc: &Service) -> Result<()> {
    conn.set_nonblocking(false)?;
    let mut out = conn.try_clone()?;
    for request in BufReader::new(conn).lines() {
        let request = request?;
        let answer = match request.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_DISPATCHES).contains(&n) => match svc.request(n) {
                Ok(latency_ns) => format!("done {n} {latency_ns}"),
                Err(e) => format!("error {e}"),
            },
            _ => format!("error a request is a number of dispatches, 1 to {MAX_DISPATCHES}: {request:?}"),
        };
        writeln!(out, "{answer}")?;
    }
    Ok(())
}

/// An HTTP/1.1 message: the start line, the headers (names in lower case) and the body.
pub struct Message {
    pub start: String,
    headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Message {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// One CRLF- (or LF-) terminated line of at most [`MAX_LINE`] bytes; `None` at EOF before any byte.
fn read_line(r: &mut impl BufRead) -> Result<Option<String>> {
    let mut buf = Vec::new();
    r.by_ref().take(MAX_LINE).read_until(b'\n', &mut buf)?;
    if buf.is_empty() {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') {
        bail!("a line longer than {MAX_LINE} bytes, or cut short by the peer closing");
    }
    buf.pop();
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    Ok(Some(String::from_utf8(buf).context("a header line that is not UTF-8")?))
}

/// The next message on a connection (a request or a response: the body by `Content-Length`, none
/// without it); `None` when the peer closed between messages.
pub fn read_message(r: &mut impl BufRead) -> Result<Option<Message>> {
    let Some(start) = read_line(r)? else { return Ok(None) };
    if start.is_empty() {
        bail!("an empty start line");
    }
    let mut headers = Vec::new();
    loop {
        let header = read_line(r)?.context("the peer closed inside the headers")?;
        if header.is_empty() {
            break;
        }
        if headers.len() == MAX_HEADERS {
            bail!("more than {MAX_HEADERS} header lines");
        }
        let (name, value) = header.split_once(':').with_context(|| format!("a header without ':': {header:?}"))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let mut message = Message { start, headers, body: Vec::new() };
    if message.header("transfer-encoding").is_some() {
        bail!("chunked bodies are not supported: send Content-Length");
    }
    if let Some(len) = message.header("content-length") {
        let len: usize = len.parse().with_context(|| format!("Content-Length {len:?}"))?;
        if len > MAX_BODY {
            bail!("a body of {len} bytes: at most {MAX_BODY}");
        }
        message.body = vec![0; len];
        r.read_exact(&mut message.body).context("the peer closed inside the body")?;
    }
    Ok(Some(message))
}

fn respond(out: &mut impl Write, status: &str, body: &str, close: bool) -> std::io::Result<()> {
    let connection = if close { "Connection: close\r\n" } else { "" };
    // One write: the whole answer in one segment when it fits.
    let answer = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n{connection}\r\n{body}",
        body.len()
    );
    out.write_all(answer.as_bytes())?;
    out.flush()
}

/// A `POST /generate` body: the number of dispatches, then optionally whitespace and a prompt.
fn dispatches_of(body: &[u8]) -> Result<usize, String> {
    let number = body.split(u8::is_ascii_whitespace).next().unwrap_or_default();
    match std::str::from_utf8(number).ok().and_then(|n| n.parse::<usize>().ok()) {
        Some(n) if n <= MAX_DISPATCHES => Ok(n),
        _ => Err(format!(
            "error the body is a number of dispatches, 0 to {MAX_DISPATCHES} (then optionally whitespace and a \
             prompt): {:?}\n",
            String::from_utf8_lossy(&body[..body.len().min(64)])
        )),
    }
}

/// One HTTP connection's requests, until it closes.
fn http_connection(conn: TcpStream, svc: &Service) -> Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_nodelay(true)?;
    let mut out = conn.try_clone()?;
    let mut input = BufReader::new(conn);
    loop {
        let message = match read_message(&mut input) {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(()),
            Err(e) => {
                respond(&mut out, "400 Bad Request", &format!("error {e:#}\n"), true)?;
                return Ok(());
            }
        };
        let close = message.header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let mut words = message.start.split_whitespace();
        let (method, path) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
        let (status, body) = match (method, path) {
            ("POST", "/generate") => match dispatches_of(&message.body) {
                Ok(n) => match svc.request(n) {
                    Ok(latency_ns) => ("200 OK", format!("done {n} {latency_ns}\n")),
                    Err(e) => ("500 Internal Server Error", format!("error {e:#}\n")),
                },
                Err(e) => ("400 Bad Request", e),
            },
            ("GET", "/health") => {
                svc.health.fetch_add(1, Ordering::Relaxed);
                ("200 OK", "ok\n".to_owned())
            }
            ("GET", "/metrics") => {
                svc.metrics.fetch_add(1, Ordering::Relaxed);
                ("200 OK", svc.metrics_text())
            }
            (_, "/generate" | "/health" | "/metrics") => {
                ("405 Method Not Allowed", format!("error {method} {path}: POST /generate, GET /health or /metrics\n"))
            }
            _ => ("404 Not Found", format!("error no {path:?}: POST /generate, GET /health or /metrics\n")),
        };
        respond(&mut out, status, &body, close)?;
        if close {
            return Ok(());
        }
    }
}

/// Where the server takes its connections.
enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
}

impl Listener {
    /// Accept one waiting connection (the listener is non-blocking) and serve it: a Unix
    /// connection on this thread, to its end; a TCP one on a thread of its own. False if none was
    /// waiting.
    fn serve_next(&self, svc: &Arc<Service>) -> Result<bool> {
        let served = match self {
            Listener::Unix(l, _) => l.accept().map(|(conn, _)| {
                svc.connections.fetch_add(1, Ordering::Relaxed);
                // A client that goes away mid-request ends its connection, not the server.
                if let Err(e) = unix_connection(conn, svc) {
                    let _ = line(&json!({"event": "connection_error", "error": e.to_string()}));
                }
            }),
            Listener::Tcp(l) => l.accept().map(|(conn, _)| {
                svc.connections.fetch_add(1, Ordering::Relaxed);
                let svc = svc.clone();
                thread::spawn(move || {
                    if let Err(e) = http_connection(conn, &svc) {
                        let _ = line(&json!({"event": "connection_error", "error": format!("{e:#}")}));
                    }
                });
            }),
        };
        match served {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e).context("accepting a connection"),
        }
    }
}

pub fn server(a: &ServerArgs) -> Result<()> {
    let (device, runtime): (Option<Device>, Value) = if a.no_gpu {
        (None, Value::Null)
    } else {
        let (device, runtime) = rocr::open(a.runtime_enable)?;
        (Some(device), runtime)
    };
    let streams: Vec<Mutex<Stream>> = match &device {
        None => Vec::new(),
        Some(device) => (0..a.queues.max(1))
            .map(|i| {
                Ok(Mutex::new(Stream {
                    q: rocr::create_queue(device, a.gpu_id, a.ring_size, u64::from(i))?,
                    records: Records::alloc(MAX_DISPATCHES),
                }))
            })
            .collect::<Result<_>>()?,
    };
    if !(a.cpu_ms.is_finite() && a.cpu_ms >= 0.0) {
        bail!("--cpu-ms {} is not a duration in milliseconds", a.cpu_ms);
    }
    let svc = Arc::new(Service {
        streams,
        cost_ns: a.dispatch_us * 1000,
        cpu: Duration::from_secs_f64(a.cpu_ms / 1e3),
        next: AtomicU64::new(0),
        requests: AtomicU64::new(0),
        dispatches: AtomicU64::new(0),
        connections: AtomicU64::new(0),
        health: AtomicU64::new(0),
        metrics: AtomicU64::new(0),
    });
    let queues: Vec<Value> =
        svc.streams.iter().map(|s| rocr::describe(&s.lock().unwrap_or_else(PoisonError::into_inner).q)).collect();
    let mut hello = json!({
        "pid": std::process::id(), "mode": "server", "runtime_enable": runtime, "queues": queues,
        "gpu": device.is_some(), "cpu_ms": a.cpu_ms, "started_ns": monotonic_ns(),
    });
    let listener = match (&a.socket, &a.listen) {
        (Some(socket), _) => {
            // A socket file left by an earlier run would refuse the bind.
            let _ = std::fs::remove_file(socket);
            let l = UnixListener::bind(socket).with_context(|| format!("binding {}", socket.display()))?;
            l.set_nonblocking(true)?;
            hello["socket"] = json!(socket);
            Listener::Unix(l, socket.clone())
        }
        (None, Some(addr)) => {
            let l = TcpListener::bind(addr.as_str()).with_context(|| format!("listening on {addr}"))?;
            l.set_nonblocking(true)?;
            let local = l.local_addr()?;
            hello["listen"] = json!(local.to_string());
            hello["port"] = json!(local.port());
            Listener::Tcp(l)
        }
        (None, None) => bail!("give --socket PATH or --listen ADDR:PORT"),
    };
    line(&hello)?;
    let rx = stdin_commands();
    loop {
        match rx.try_recv() {
            Ok(cmd) if cmd.trim() == "stats" => {
                let mut stats = svc.totals("stats");
                stats["wptr"] = svc
                    .streams
                    .iter()
                    .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).q.mem.write_index())
                    .collect();
                line(&stats)?;
            }
            Ok(cmd) if cmd.trim() == "stop" => break,
            Ok(other) => line(&json!({"event": "error", "error": format!("unknown command {other:?}")}))?,
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => {}
        }
        if !listener.serve_next(&svc)? {
            thread::sleep(Duration::from_millis(1));
        }
    }
    if let Listener::Unix(_, socket) = &listener {
        let _ = std::fs::remove_file(socket);
    }
    // TCP connections still open end with the process.
    line(&svc.totals("summary"))
}

pub struct RequestArgs {
    /// Exactly one of `socket` and `url` (the CLI enforces it).
    pub socket: Option<PathBuf>,
    pub url: Option<String>,
    pub requests: u32,
    pub dispatches: u32,
    pub gap_us: u64,
    pub health_every_ms: Option<u64>,
}

fn ms_at(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() { 0.0 } else { sorted[gpreempt::stats::nearest_rank(sorted.len(), p)] }
}

fn connect(path: &Path) -> Result<UnixStream> {
    UnixStream::connect(path).with_context(|| format!("connecting to the server at {}", path.display()))
}

/// `http://HOST:PORT[/PATH]` → (`HOST:PORT`, the path, `/generate` if none).
fn parse_url(url: &str) -> Result<(String, String)> {
    let rest = url.strip_prefix("http://").with_context(|| format!("--url {url:?}: only http://HOST:PORT[/PATH]"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/generate"),
    };
    if authority.is_empty() || !authority.contains(':') {
        bail!("--url {url:?}: give the port, http://HOST:PORT[/PATH]");
    }
    Ok((authority.to_owned(), path.to_owned()))
}

/// One request/answer exchange on an HTTP connection: the answer's body, if its status is 200.
fn exchange(out: &mut TcpStream, answers: &mut BufReader<TcpStream>, request: &[u8]) -> Result<Vec<u8>> {
    out.write_all(request)?;
    let answer = read_message(answers)?.context("the server closed the connection")?;
    if answer.start.split_whitespace().nth(1) != Some("200") {
        bail!("the server answered {:?}: {}", answer.start, String::from_utf8_lossy(&answer.body).trim_end());
    }
    Ok(answer.body)
}

fn http_connect(authority: &str) -> Result<(TcpStream, BufReader<TcpStream>)> {
    let conn = TcpStream::connect(authority).with_context(|| format!("connecting to the server at {authority}"))?;
    conn.set_nodelay(true)?;
    Ok((conn.try_clone()?, BufReader::new(conn)))
}

/// `GET /health` every `every` on a connection of its own until `stop`: how many were answered.
fn health_prober(authority: String, every: Duration, stop: Arc<AtomicBool>) -> Result<u64> {
    let (mut out, mut answers) = http_connect(&authority)?;
    let request = format!("GET /health HTTP/1.1\r\nHost: {authority}\r\n\r\n");
    let mut answered = 0;
    while !stop.load(Ordering::Relaxed) {
        exchange(&mut out, &mut answers, request.as_bytes()).context("a health probe")?;
        answered += 1;
        thread::sleep(every);
    }
    Ok(answered)
}

/// Sends the requests over one keep-alive connection; the latencies (ms) and the health probes.
fn http_requests(a: &RequestArgs, url: &str) -> Result<(Vec<f64>, u64)> {
    let (authority, path) = parse_url(url)?;
    let stop = Arc::new(AtomicBool::new(false));
    let prober = a.health_every_ms.map(|ms| {
        let (authority, stop) = (authority.clone(), stop.clone());
        thread::spawn(move || health_prober(authority, Duration::from_millis(ms), stop))
    });
    let (mut out, mut answers) = http_connect(&authority)?;
    let body = a.dispatches.to_string();
    // One write per request: its headers and body in one segment.
    let request = format!("POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Length: {}\r\n\r\n{body}", body.len())
        .into_bytes();
    let mut latencies_ms = Vec::with_capacity(a.requests as usize);
    let sent_all = (0..a.requests).try_for_each(|i| {
        if i > 0 && a.gap_us > 0 {
            thread::sleep(Duration::from_micros(a.gap_us));
        }
        let sent = Instant::now();
        let answer = exchange(&mut out, &mut answers, &request).with_context(|| format!("request {i}"))?;
        if !answer.starts_with(b"done ") {
            bail!("request {i}: the server answered {:?}", String::from_utf8_lossy(&answer));
        }
        latencies_ms.push(sent.elapsed().as_secs_f64() * 1e3);
        Ok(())
    });
    stop.store(true, Ordering::Relaxed);
    let health = match prober {
        Some(p) => p.join().map_err(|_| anyhow::anyhow!("the health prober panicked"))??,
        None => 0,
    };
    sent_all?;
    Ok((latencies_ms, health))
}

fn unix_requests(a: &RequestArgs, socket: &Path) -> Result<Vec<f64>> {
    let conn = connect(socket)?;
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
    Ok(latencies_ms)
}

/// The load command: `--requests` requests in turn, then one summary line.
pub fn request(a: &RequestArgs) -> Result<()> {
    let (latencies_ms, health) = match (&a.socket, &a.url) {
        (Some(socket), _) => (unix_requests(a, socket)?, None),
        (None, Some(url)) => {
            let (latencies_ms, health) = http_requests(a, url)?;
            (latencies_ms, Some(health))
        }
        (None, None) => bail!("give --socket PATH or --url http://HOST:PORT"),
    };
    let mut sorted = latencies_ms.clone();
    sorted.sort_by(f64::total_cmp);
    let health = health.map(|h| format!(" health={h}")).unwrap_or_default();
    println!(
        "requests={} dispatches={} p50_ms={:.3} p99_ms={:.3} max_ms={:.3}{health}",
        latencies_ms.len(),
        latencies_ms.len() as u64 * u64::from(a.dispatches),
        ms_at(&sorted, 50.0),
        ms_at(&sorted, 99.0),
        sorted.last().copied().unwrap_or(0.0)
    );
    Ok(())
}
