//! What the arrival probe costs per packet, natively (`harness packet-cost`; issue 45: it adds
//! ≤ 1 µs per packet and drops none). A receiver process (`harness sink`) runs in a cgroup v2 of
//! its own; this process sends it small `POST`s and `GET /health`s, alternately, on one loopback
//! keep-alive connection as fast as the connection allows (each request written, its answer read,
//! the next written), and times each exchange. Rounds alternate between: the program not
//! attached; attached with the receiver's port watched and its slot disarmed (every request
//! between two arrivals: the port looked up, the first bytes matched, counted); and armed before
//! each request (one ring record each: the first request after a quiet time). Each exchange
//! delivers one payload segment to the receiver's socket (the request: one `write`, under the
//! MSS) and perhaps a pure ACK (the program returns at once for it): the added time per exchange
//! is the added time per request packet, an upper bound per packet. No scheduler runs here.
//!
//! No packet dropped: every request is answered (the connection would stall or break otherwise),
//! and the program's own counts match what was sent: one segment per request, `POST`s allowed,
//! probes denied, one arming per armed request.

use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader},
    net::TcpStream,
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};
use gpreempt::{
    clock::monotonic_ns,
    domain::HostPid,
    schedule::arrival::{ArrivalProbe, Patterns},
    stats::Summary,
};
use gpreempt_common::arrival::ArrivalCounts;
use serde::Serialize;

use crate::{cgroup::OwnCgroup, http};

/// Prompt tokens of the small `POST`s (a 64-byte body).
const SMALL_TOKENS: u64 = 16;
/// Rounds of each kind, interleaved so that the host's drift falls on all of them alike.
const ROUNDS: usize = 8;

#[derive(Debug, Serialize)]
pub struct PacketCost {
    /// Requests per kind of round and rounds of each kind.
    pub requests: usize,
    pub rounds: usize,
    /// One exchange (request written → answer read), µs, over every round of the kind.
    pub bare_us: Option<Summary>,
    pub disarmed_us: Option<Summary>,
    pub armed_us: Option<Summary>,
    /// Added per request packet: the median over rounds of (the round's p50 − the p50 of the
    /// round without the program just before it), µs.
    pub added_disarmed_us: f64,
    pub added_armed_us: f64,
    /// Exchanges sent and answered (every kind of round).
    pub sent: u64,
    pub answered: u64,
    /// The program's counts over the rounds it was attached, and the hits drained.
    pub counts: ArrivalCounts,
    pub hits: usize,
}

struct Conn {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
    sent: u64,
    answered: u64,
}

impl Conn {
    /// `n` exchanges, alternately a small POST and a GET /health; µs each. `before` runs before
    /// each (untimed).
    fn round(&mut self, n: usize, mut before: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
        let post = http::generate(0, SMALL_TOKENS);
        let probe = http::get(http::HEALTH);
        let mut us = Vec::with_capacity(n);
        for i in 0..n {
            before()?;
            let message = if i % 2 == 0 { &post } else { &probe };
            let t = monotonic_ns();
            http::send(&mut self.stream, message)?;
            self.sent += 1;
            let answer = http::read(&mut self.reader)?.context("the sink closed the connection")?;
            us.push((monotonic_ns() - t) as f64 / 1e3);
            if answer.status() != Some(200) {
                bail!("the sink answered {:?}", answer.status());
            }
            self.answered += 1;
        }
        Ok(us)
    }
}

fn p50(xs: &[f64]) -> f64 {
    Summary::of(xs).map_or(f64::NAN, |s| s.p50)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
}

pub fn measure(requests: usize) -> Result<PacketCost> {
    let cgroup = OwnCgroup::create()?;
    let exe = std::env::current_exe().context("finding the harness binary")?;
    let mut cmd = Command::new(exe);
    cmd.arg("sink").stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    cgroup.place(&mut cmd);
    let mut sink = cmd.spawn().context("starting the sink")?;
    let result = (|| {
        let stdout = sink.stdout.take().context("the sink's stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).context("reading the sink's port")?;
        let port: u16 = line.trim().parse().with_context(|| format!("the sink's port line {line:?}"))?;
        let pid = HostPid(sink.id());
        run_rounds(requests, port, pid, &cgroup)
    })();
    // Closing its stdin ends it; then it is reaped, and the cgroup removed after it.
    drop(sink.stdin.take());
    let _ = sink.wait();
    drop(cgroup);
    result
}

fn run_rounds(requests: usize, port: u16, pid: HostPid, cgroup: &OwnCgroup) -> Result<PacketCost> {
    let stream = TcpStream::connect(("127.0.0.1", port)).context("connecting to the sink")?;
    stream.set_nodelay(true)?;
    let mut conn = Conn { reader: BufReader::new(stream.try_clone()?), stream, sent: 0, answered: 0 };
    let mut probe = ArrivalProbe::load(&Patterns::default())?;
    let ports = BTreeSet::from([port]);
    let per_round = (requests / ROUNDS).max(2);
    // Warm the path (the connection, the caches) before anything is timed.
    conn.round(per_round, || Ok(()))?;
    let (mut bare, mut disarmed, mut armed) = (Vec::new(), Vec::new(), Vec::new());
    let (mut added_disarmed, mut added_armed) = (Vec::new(), Vec::new());
    let mut counts = ArrivalCounts::default();
    let mut hits = Vec::new();
    for _ in 0..ROUNDS {
        let b = conn.round(per_round, || Ok(()))?;
        // Attached and disarmed: watching arms the slot; disarmed, its requests send no record.
        let slot = probe.watch(pid, cgroup.dir(), &ports)?;
        probe.disarm(slot);
        let d = conn.round(per_round, || Ok(()))?;
        let mut i = 0;
        let a = conn.round(per_round, || {
            probe.arm(slot)?;
            i += 1;
            if i % 64 == 0 {
                probe.drain(&mut hits);
            }
            Ok(())
        })?;
        probe.drain(&mut hits);
        counts.add(&probe.counts(slot));
        probe.unwatch(slot);
        if !probe.cgroups().is_empty() {
            bail!("the program stayed attached after the slot was unwatched");
        }
        added_disarmed.push(p50(&d) - p50(&b));
        added_armed.push(p50(&a) - p50(&b));
        bare.extend(b);
        disarmed.extend(d);
        armed.extend(a);
    }
    // Per watched session: 2 × per_round requests, half of them POSTs (the first of each round
    // is a POST), each armed one an arming (the watch's own arm is taken back at once).
    let attached = (ROUNDS * 2 * per_round) as u64;
    let posts = (ROUNDS * 2 * per_round.div_ceil(2)) as u64;
    let expected = ArrivalCounts {
        segments: attached,
        allowed: posts,
        denied: attached - posts,
        unmatched: 0,
        tls: 0,
        armings: (ROUNDS * per_round.div_ceil(2)) as u64,
    };
    if counts != expected {
        bail!("the program counted {counts:?}, {expected:?} were sent");
    }
    if conn.answered != conn.sent {
        bail!("{} requests sent, {} answered", conn.sent, conn.answered);
    }
    Ok(PacketCost {
        requests: per_round * ROUNDS,
        rounds: ROUNDS,
        bare_us: Summary::of(&bare),
        disarmed_us: Summary::of(&disarmed),
        armed_us: Summary::of(&armed),
        added_disarmed_us: median(added_disarmed),
        added_armed_us: median(added_armed),
        sent: conn.sent,
        answered: conn.answered,
        counts,
        hits: hits.len(),
    })
}
