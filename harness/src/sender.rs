//! The harness's sender (issue 45's request path): the online load's requests sent over
//! loopback TCP at their arrival times, as an HTTP client with a keep-alive connection pool does
//! (an idle connection reused, a new one opened when all are busy), and beside them health
//! probes and metric scrapes, each kind on a keep-alive connection of its own. It stamps each
//! request when it is written and when its answer is read: the latency a user feels.

use std::{
    io::BufReader,
    net::TcpStream,
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
        mpsc,
    },
    time::Duration,
};

use gpreempt::clock::monotonic_ns;
use serde::{Deserialize, Serialize};

use crate::http;

/// Connections a pool holds open before the first request (a request finding them all busy opens
/// another, as an HTTP client's pool does).
pub const WARM: usize = 2;

/// What to send and when.
#[derive(Clone, Debug)]
pub struct Plan {
    pub port: u16,
    /// The loads' origin (CLOCK_MONOTONIC, ns).
    pub start_ns: u64,
    /// Per request (its id is its index): arrival after the origin, prompt tokens.
    pub requests: Vec<(u64, u64)>,
    pub health_per_s: f64,
    pub metrics_per_s: f64,
    /// Connections opened before the origin (a client's warm pool).
    pub warm: usize,
}

/// One request from the sender's side (CLOCK_MONOTONIC, ns; `answered_ns` 0: no answer).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sent {
    pub id: u64,
    pub sent_ns: u64,
    pub answered_ns: u64,
}

/// Probes or scrapes of one path.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeCount {
    pub path: String,
    pub sent: u64,
    pub answered: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SenderResult {
    /// In the order answered (or failed).
    pub requests: Vec<Sent>,
    /// Request connections opened in all.
    pub connections: usize,
    pub probes: Vec<ProbeCount>,
    pub errors: Vec<String>,
}

/// Sleep until `deadline`, in slices, returning early (false) once `aborted`.
fn sleep_until(deadline: u64, aborted: &dyn Fn() -> bool) -> bool {
    loop {
        if aborted() {
            return false;
        }
        let now = monotonic_ns();
        if now >= deadline {
            return true;
        }
        std::thread::sleep(Duration::from_nanos((deadline - now).min(20_000_000)));
    }
}

fn connect(port: u16) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_nodelay(true)?;
    // Bounds a read if the client dies without closing (it cannot: the kernel closes its sockets).
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    Ok(s)
}

/// One exchange on a keep-alive connection: the answer's status.
fn exchange(stream: &mut TcpStream, reader: &mut BufReader<TcpStream>, message: &[u8]) -> std::io::Result<u16> {
    http::send(stream, message)?;
    let answer = http::read(reader)?
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the client closed the connection"))?;
    Ok(answer.status().unwrap_or(0))
}

struct Shared<'a> {
    plan: &'a Plan,
    aborted: &'a (dyn Fn() -> bool + Sync),
    results: Mutex<Vec<Sent>>,
    errors: Mutex<Vec<String>>,
    /// Requests answered or failed: the probes stop when every one is.
    ended: AtomicUsize,
}

impl Shared<'_> {
    fn finished(&self) -> bool {
        self.ended.load(Ordering::Acquire) >= self.plan.requests.len() || (self.aborted)()
    }

    fn error(&self, e: String) {
        self.errors.lock().unwrap_or_else(PoisonError::into_inner).push(e);
    }

    fn end(&self, sent: Sent) {
        self.results.lock().unwrap_or_else(PoisonError::into_inner).push(sent);
        self.ended.fetch_add(1, Ordering::AcqRel);
    }

    /// A pooled connection: one job at a time, then it says it is idle again.
    fn worker(&self, index: usize, mut stream: TcpStream, jobs: mpsc::Receiver<u64>, idle: mpsc::Sender<usize>) {
        crate::shm::tight_timers();
        let mut reader = match stream.try_clone() {
            Ok(s) => BufReader::new(s),
            Err(e) => return self.error(format!("a request connection: {e}")),
        };
        let _ = idle.send(index);
        for id in jobs {
            let tokens = self.plan.requests.get(id as usize).map_or(0, |r| r.1);
            let message = http::generate(id, tokens);
            let sent_ns = monotonic_ns();
            match exchange(&mut stream, &mut reader, &message) {
                Ok(200) => self.end(Sent { id, sent_ns, answered_ns: monotonic_ns() }),
                Ok(status) => {
                    self.error(format!("request {id} answered {status}"));
                    self.end(Sent { id, sent_ns, answered_ns: 0 });
                }
                Err(e) => {
                    self.error(format!("request {id}: {e}"));
                    self.end(Sent { id, sent_ns, answered_ns: 0 });
                    return;
                }
            }
            if idle.send(index).is_err() {
                return;
            }
        }
    }

    /// `GET path` every `1/rate` seconds from the origin (the first after half a period) until
    /// every request has ended.
    fn prober(&self, path: &str, rate: f64) -> ProbeCount {
        crate::shm::tight_timers();
        let mut count = ProbeCount { path: path.to_owned(), ..ProbeCount::default() };
        let connected = connect(self.plan.port).and_then(|s| Ok((s.try_clone()?, s)));
        let (mut stream, mut reader) = match connected {
            Ok((s, r)) => (s, BufReader::new(r)),
            Err(e) => {
                self.error(format!("{path} connection: {e}"));
                return count;
            }
        };
        let period = (1e9 / rate) as u64;
        let message = http::get(path);
        let stop = || self.finished();
        for k in 0.. {
            if !sleep_until(self.plan.start_ns + period / 2 + k * period, &stop) {
                break;
            }
            count.sent += 1;
            match exchange(&mut stream, &mut reader, &message) {
                Ok(200) => count.answered += 1,
                Ok(status) => self.error(format!("{path} answered {status}")),
                // The client ends with its last request: a probe in flight then is no error.
                Err(_) if self.finished() => break,
                Err(e) => {
                    self.error(format!("{path}: {e}"));
                    break;
                }
            }
        }
        count
    }
}

/// Send the plan's requests and probes; returns when every request has ended (or `aborted`).
pub fn run(plan: &Plan, aborted: &(dyn Fn() -> bool + Sync)) -> SenderResult {
    let shared = Shared {
        plan,
        aborted,
        results: Mutex::new(Vec::new()),
        errors: Mutex::new(Vec::new()),
        ended: AtomicUsize::new(0),
    };
    let mut connections = 0;
    let probes = std::thread::scope(|s| {
        let shared = &shared;
        let probers: Vec<_> = [(http::HEALTH, plan.health_per_s), (http::METRICS, plan.metrics_per_s)]
            .into_iter()
            .filter(|&(_, rate)| rate > 0.0)
            .map(|(path, rate)| s.spawn(move || shared.prober(path, rate)))
            .collect();
        let (idle_tx, idle_rx) = mpsc::channel::<usize>();
        let mut idle: Vec<usize> = Vec::new();
        let mut jobs: Vec<mpsc::Sender<u64>> = Vec::new();
        let open = |jobs: &mut Vec<mpsc::Sender<u64>>| -> std::io::Result<()> {
            let stream = connect(plan.port)?;
            let (tx, rx) = mpsc::channel();
            let (index, idle) = (jobs.len(), idle_tx.clone());
            jobs.push(tx);
            s.spawn(move || shared.worker(index, stream, rx, idle));
            Ok(())
        };
        for _ in 0..plan.warm {
            if let Err(e) = open(&mut jobs) {
                shared.error(format!("a warm connection: {e}"));
            }
        }
        // The warm connections say they are idle before the first request is due.
        crate::shm::tight_timers();
        for (id, &(at, _)) in plan.requests.iter().enumerate() {
            if !sleep_until(plan.start_ns + at, aborted) {
                break;
            }
            // The most recently idle connection, as a pool's LIFO; a new one when all are busy.
            idle.extend(idle_rx.try_iter());
            let worker = match idle.pop() {
                Some(w) => Some(w),
                None => match open(&mut jobs) {
                    // It says it is idle as soon as it runs.
                    Ok(()) => idle_rx.recv_timeout(Duration::from_secs(5)).ok(),
                    Err(e) => {
                        shared.error(format!("request {id}: connecting: {e}"));
                        None
                    }
                },
            };
            match worker.and_then(|w| jobs[w].send(id as u64).ok()) {
                Some(()) => {}
                None => shared.end(Sent { id: id as u64, sent_ns: 0, answered_ns: 0 }),
            }
        }
        connections = jobs.len();
        // The workers finish their requests in flight, then see their channel closed.
        drop(jobs);
        probers.into_iter().filter_map(|p| p.join().ok()).collect::<Vec<_>>()
    });
    SenderResult {
        requests: shared.results.into_inner().unwrap_or_else(PoisonError::into_inner),
        connections,
        probes,
        errors: shared.errors.into_inner().unwrap_or_else(PoisonError::into_inner),
    }
}
