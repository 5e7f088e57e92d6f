//! The served online client (issue 45's request path): it listens on a loopback TCP port, in a
//! cgroup v2 of its own (the harness placed it there before it ran), and serves keep-alive
//! connections, a thread each, as an HTTP serving stack does: a `POST /generate` is read, its
//! CPU phase spun, its dispatches published on the client's queues, and it is answered when they
//! have completed (or, behind a continuous-batching engine, `engine.rs`: it joins the engine's
//! next step and is answered when its last token is generated); `GET /health` and `GET /metrics`
//! are answered at once, with no GPU work. It ends when every request of its load has been
//! answered.

use std::{
    io::BufReader,
    net::{TcpListener, TcpStream},
    os::fd::AsRawFd,
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use gpreempt::clock::monotonic_ns;
use serde::{Deserialize, Serialize};

use crate::{
    cpu_phase::CpuPhase,
    engine::Engine,
    http::{self, Ask},
    load::Request,
    publisher::Publisher,
};

/// One request as the client served it (CLOCK_MONOTONIC, ns).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Served {
    pub id: u64,
    /// Its message read whole.
    pub read_ns: u64,
    /// Its first dispatch published (after the CPU phase).
    pub published_ns: u64,
    /// Its last dispatch seen complete (the answer is sent then).
    pub completed_ns: u64,
}

/// What else the client answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answered {
    pub health: u64,
    pub metrics: u64,
    /// Anything else (404), and requests of an id the load does not have.
    pub other: u64,
    pub connections: u64,
    /// Connections ended by a broken message or an I/O error.
    pub errors: u64,
}

/// How long a connection thread or the accept loop waits before it looks whether the load is done.
const LOOK: Duration = Duration::from_millis(20);
/// A message that has begun arriving is read with blocking reads; this bounds them if the peer
/// stops half-way (it never does: each message is one write).
const STALL: Duration = Duration::from_secs(5);

/// What `/metrics` answers: a Prometheus text page of about vLLM's size per scrape (~1 KB).
fn metrics_page() -> Vec<u8> {
    let mut page = String::new();
    for i in 0..24 {
        page.push_str(&format!("# TYPE harness_metric_{i} counter\nharness_metric_{i} {i}\n"));
    }
    page.into_bytes()
}

/// Whether `fd` has bytes to read within `timeout` (or was closed).
fn readable(fd: i32, timeout: Duration) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one live pollfd for the call.
    let n = unsafe { libc::poll(&mut p, 1, timeout.as_millis() as i32) };
    n > 0
}

/// What a served client did: each request, and the other answers.
pub(crate) struct ServedRun {
    pub served: Vec<Served>,
    pub answered: Answered,
}

/// What a request's GPU work is, once its CPU phase has run.
pub(crate) enum Backend<'a, P: Publisher> {
    /// Its own dispatches, published together on the client's queues in turn (id modulo queues).
    Direct(&'a [Request]),
    /// A step of the continuous-batching engine each token, with whatever else is in flight.
    Engine(&'a Engine<'a, P>),
}

impl<P: Publisher> Backend<'_, P> {
    fn len(&self) -> usize {
        match self {
            Self::Direct(requests) => requests.len(),
            Self::Engine(engine) => engine.len(),
        }
    }

    fn tokens(&self, id: u64) -> Option<u64> {
        match self {
            Self::Direct(requests) => requests.get(id as usize).map(|r| r.tokens),
            Self::Engine(engine) => engine.tokens(id),
        }
    }
}

struct Shared<'a, P: Publisher> {
    ctx: &'a P,
    backend: Backend<'a, P>,
    cpu: CpuPhase,
    done: AtomicUsize,
    served: Mutex<Vec<Served>>,
    answered: Mutex<Answered>,
    metrics: Vec<u8>,
}

impl<P: Publisher> Shared<'_, P> {
    fn finished(&self) -> bool {
        self.done.load(Ordering::Acquire) >= self.backend.len() || self.ctx.stopped()
    }

    fn count(&self, f: impl FnOnce(&mut Answered)) {
        f(&mut self.answered.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// One request: its CPU phase, its dispatches, its completion. None if the run stopped.
    fn generate(&self, id: u64, read_ns: u64) -> Option<Served> {
        self.cpu.run(self.backend.tokens(id)?);
        match &self.backend {
            Backend::Direct(requests) => {
                let q = id as usize % self.ctx.queue_count();
                let (target, published_ns) = self.ctx.publish(q, &requests.get(id as usize)?.dispatches);
                if !self.ctx.wait_done(q, target) {
                    return None;
                }
                Some(Served { id, read_ns, published_ns, completed_ns: monotonic_ns() })
            }
            Backend::Engine(engine) => {
                let (published_ns, completed_ns) = engine.admit(id)?;
                Some(Served { id, read_ns, published_ns, completed_ns })
            }
        }
    }

    fn connection(&self, stream: TcpStream) {
        self.count(|a| a.connections += 1);
        if self.serve_connection(stream).is_err() {
            self.count(|a| a.errors += 1);
        }
    }

    fn serve_connection(&self, stream: TcpStream) -> std::io::Result<()> {
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(STALL))?;
        let fd = stream.as_raw_fd();
        let mut out = stream.try_clone()?;
        let mut reader = BufReader::new(stream);
        loop {
            if reader.buffer().is_empty() && !readable(fd, LOOK) {
                if self.finished() {
                    return Ok(());
                }
                continue;
            }
            let Some(m) = http::read(&mut reader)? else { return Ok(()) };
            let read_ns = monotonic_ns();
            match m.ask() {
                Ask::Generate { id } => match self.generate(id, read_ns) {
                    Some(served) => {
                        http::send(&mut out, &http::response(200, format!("{{\"id\":{id}}}").as_bytes()))?;
                        self.served.lock().unwrap_or_else(PoisonError::into_inner).push(served);
                        self.done.fetch_add(1, Ordering::AcqRel);
                    }
                    None if self.ctx.stopped() => return Ok(()),
                    None => {
                        self.count(|a| a.other += 1);
                        http::send(&mut out, &http::response(404, b""))?;
                    }
                },
                Ask::Health => {
                    http::send(&mut out, &http::response(200, b"ok"))?;
                    self.count(|a| a.health += 1);
                }
                Ask::Metrics => {
                    http::send(&mut out, &http::response(200, &self.metrics))?;
                    self.count(|a| a.metrics += 1);
                }
                Ask::Other => {
                    http::send(&mut out, &http::response(404, b""))?;
                    self.count(|a| a.other += 1);
                }
            }
        }
    }
}

/// Serve the backend's requests (by id) on `listener` until each has been answered or the run
/// stops.
pub(crate) fn serve<'a, P: Publisher>(
    ctx: &'a P,
    listener: TcpListener,
    backend: Backend<'a, P>,
    cpu: CpuPhase,
) -> ServedRun {
    let shared = Shared {
        ctx,
        backend,
        cpu,
        done: AtomicUsize::new(0),
        served: Mutex::new(Vec::new()),
        answered: Mutex::new(Answered::default()),
        metrics: metrics_page(),
    };
    std::thread::scope(|s| {
        while !shared.finished() {
            if !readable(listener.as_raw_fd(), LOOK) {
                continue;
            }
            match listener.accept() {
                Ok((stream, _)) => {
                    let shared = &shared;
                    s.spawn(move || shared.connection(stream));
                }
                Err(_) => shared.count(|a| a.errors += 1),
            }
        }
    });
    ServedRun {
        served: shared.served.into_inner().unwrap_or_else(PoisonError::into_inner),
        answered: shared.answered.into_inner().unwrap_or_else(PoisonError::into_inner),
    }
}
