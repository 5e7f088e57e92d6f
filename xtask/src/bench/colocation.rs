//! The co-location benchmark (`cargo xtask bench --only colocation`, BENCHMARKS §7) on the KFD
//! emulator, in scenarios shaped like production rather than like the scheduler's own tests:
//! an inference-like online client (`emu-workload serve`: Poisson arrivals, several queues whose
//! indices sit in ROCr's `amd_queue_t`, dispatches of varying cost, completions polled on the
//! CPU) next to training-like offline processes (`emu-workload train`: several queues, possibly
//! over both emulated GPUs, CPU-polled). Each scenario is measured in one run in five states per
//! round: online alone, offline alone, co-located without gpreempt, under this checkout's
//! `gpreempt schedule` (release binary, default settings), and under the previous global policy
//! (the `gpreempt` binary of [`super::PREVIOUS_COMMIT`]). The rounds repeat with new seeds, so
//! drift and chance show in the per-round spread.
//!
//! This is the guest half ([`guest`]): it writes one [`Colocation`] document, which
//! `colocation_report` (in `report`'s order) turns into the BENCHMARKS.md section.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::{
    guest_env::{GuestArgs, cpus, emu_param, kernel_release, process_cpu_ns, thread_cpu_ns},
    results::{
        Colocation, ColocationScenario, EmulatorParams, GpuRate, GpuTransitions, OfflineSweep, PreviousScheduler,
        ScenarioRound, SchedulerRun, StateRun, Stats, SweepPoint, TimerFloor,
    },
    stats::percentile,
};

/// The name `gpreempt schedule` gives its reaction thread (its CPU is reported apart).
const REACTION_THREAD: &str = "gpreempt-react";

/// The GPU the online client runs on in every scenario.
pub(super) const ONLINE_GPU: u32 = 0x1000;
pub(super) const OTHER_GPU: u32 = 0x2000;

/// How much of everything.
struct Plan {
    rounds: u64,
    /// Online requests per state; at [`RATE_HZ`] they set the window.
    requests: u64,
}

/// Mean online arrival rate. With 1-5 dispatches of 0.5-1.5 ms per request (3 ms of GPU time on
/// average) the online client uses about 6 % of its GPU alone.
pub(super) const RATE_HZ: f64 = 20.0;

impl Plan {
    fn new(quick: bool) -> Self {
        if quick { Plan { rounds: 1, requests: 80 } } else { Plan { rounds: 3, requests: 200 } }
    }

    fn window(&self) -> Duration {
        Duration::from_secs_f64(self.requests as f64 / RATE_HZ)
    }
}

/// A scenario: the online client's and the offline processes' arguments for a round.
struct Spec {
    name: &'static str,
    /// The GPUs whose offline throughput is reported, the online one first.
    gpus: Vec<u32>,
    serve: fn(round: u64, plan: &Plan) -> Vec<String>,
    trains: fn(round: u64) -> Vec<Vec<String>>,
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

/// The serve client: 2 queues on the online GPU, Poisson at [`RATE_HZ`], seeded per round.
fn serve_args(round: u64, plan: &Plan, extra: &str) -> Vec<String> {
    let mut a = words(&format!(
        "serve --gpu-id {ONLINE_GPU:#x} --queues 2 --rate-hz {RATE_HZ} --dispatches 3 --dispatch-us 1000 --spread 0.5 \
         --requests {} --seed {} --runtime-enable --wait-go",
        plan.requests,
        round + 1
    ));
    a.extend(words(extra));
    a
}

/// The scenarios `only` names (all of them when it is empty).
fn specs(only: &[String]) -> Vec<Spec> {
    let all = vec![
        Spec {
            name: "single-gpu",
            gpus: vec![ONLINE_GPU],
            // A third online queue is created halfway through the window: a stream opened
            // mid-run, which the scheduler learns about only from the tracer.
            serve: |round, plan| {
                let half = (plan.window().as_millis() / 2).to_string();
                serve_args(round, plan, &format!("--second-queue-after-ms {half}"))
            },
            trains: |round| {
                vec![
                    words(&format!(
                        "train --gpu-ids {ONLINE_GPU:#x} --queues 2 --dispatch-us 4000 --step-dispatches 4 --seed {} \
                         --runtime-enable",
                        101 + round
                    )),
                    words(&format!(
                        "train --gpu-ids {ONLINE_GPU:#x} --queues 1 --dispatch-us 6000 --step-dispatches 2 --seed {} \
                         --runtime-enable",
                        201 + round
                    )),
                ]
            },
        },
        Spec {
            name: "two-gpu",
            gpus: vec![ONLINE_GPU, OTHER_GPU],
            serve: |round, plan| serve_args(round, plan, ""),
            trains: |round| {
                vec![
                    words(&format!(
                        "train --gpu-ids {ONLINE_GPU:#x},{OTHER_GPU:#x} --queues 2 --dispatch-us 4000 \
                         --step-dispatches 4 --seed {} --runtime-enable",
                        101 + round
                    )),
                    words(&format!(
                        "train --gpu-ids {OTHER_GPU:#x} --queues 1 --dispatch-us 5000 --step-dispatches 3 --seed {} \
                         --runtime-enable",
                        201 + round
                    )),
                ]
            },
        },
    ];
    all.into_iter().filter(|s| only.is_empty() || only.iter().any(|o| o == s.name)).collect()
}

/// The name `--scenario` (and BENCHMARKS.json) knows the sweep by.
pub(super) const SWEEP_NAME: &str = "offline-sweep";
/// Offline processes in the sweep's points, each with one queue on the online GPU.
pub(super) const SWEEP: [u32; 3] = [1, 2, 3];

/// Offline process `i` of the sweep: the same shape for every `i`, its own seed.
fn sweep_train(round: u64, i: u64) -> Vec<String> {
    words(&format!(
        "train --gpu-ids {ONLINE_GPU:#x} --queues 1 --dispatch-us 5000 --step-dispatches 2 --seed {} --runtime-enable",
        301 + 10 * round + i
    ))
}

fn sweep_trains<const N: u64>(round: u64) -> Vec<Vec<String>> {
    (0..N).map(|i| sweep_train(round, i)).collect()
}

/// The sweep's point with `n` offline processes.
fn sweep_spec(n: u32) -> Spec {
    Spec {
        name: SWEEP_NAME,
        gpus: vec![ONLINE_GPU],
        serve: |round, plan| serve_args(round, plan, ""),
        trains: match n {
            1 => sweep_trains::<1>,
            2 => sweep_trains::<2>,
            _ => sweep_trains::<3>,
        },
    }
}

/// The online client alone once, then each point co-located and under this checkout's
/// `gpreempt schedule`.
fn sweep(bin: &Path, current: &Path, plan: &Plan) -> Result<OfflineSweep> {
    let first = sweep_spec(SWEEP[0]);
    eprintln!("bench: colocation {SWEEP_NAME}: online alone");
    let online_alone = online_alone(bin, &first, 0, plan)?;
    let mut points = Vec::new();
    for n in SWEEP {
        let spec = sweep_spec(n);
        eprintln!("bench: colocation {SWEEP_NAME}: {n} offline process(es)");
        let colocated_run = colocated(bin, &spec, 0, plan, None, &[])?;
        log_state(SWEEP_NAME, u64::from(n), "colocated", &colocated_run);
        let schedule = colocated(bin, &spec, 0, plan, Some(current), &[])?;
        log_state(SWEEP_NAME, u64::from(n), "schedule", &schedule);
        points.push(SweepPoint { offline_processes: n, colocated: colocated_run, schedule });
    }
    Ok(OfflineSweep {
        online_alone,
        points,
        serve: (first.serve)(0, plan).join(" "),
        train: sweep_train(0, 0).join(" ").replace("--seed 301", "--seed 301+i"),
    })
}

/// Seconds each half of the timer floor runs.
const FLOOR_SECONDS: f64 = 5.0;
/// Busy loops beside the floor's second half: the co-located states' busy clients (the online
/// client and two offline processes).
const FLOOR_BUSY: u32 = 3;

/// [`TimerFloor`]: a SCHED_FIFO 20 thread sleeping to absolute deadlines 200 µs apart, with
/// `busy` `sched_yield` loops beside it, for `secs`; the intervals between its wake-ups.
/// One floor run: the wake-up intervals (µs) and the sleeping thread's CPU over the run, as a
/// percentage of its wall time.
pub(super) fn timer_floor_run(busy: u32, secs: f64) -> Result<(Stats, f64)> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let loops: Vec<_> = (0..busy)
        .map(|_| {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::yield_now();
                }
            })
        })
        .collect();
    let sampler = std::thread::spawn(move || -> Result<(Vec<f64>, f64)> {
        let param = libc::sched_param { sched_priority: 20 };
        // SAFETY: this thread's own scheduling class; a valid parameter struct.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
            bail!("SCHED_FIFO refused: {}", std::io::Error::last_os_error());
        }
        let clock = |id: libc::clockid_t| {
            let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: a valid out pointer.
            unsafe { libc::clock_gettime(id, &mut ts) };
            ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
        };
        let now = || clock(libc::CLOCK_MONOTONIC);
        let (start, cpu_start, poll) = (now(), clock(libc::CLOCK_THREAD_CPUTIME_ID), 200_000u64);
        let (mut next, mut last, mut out) = (start, start, Vec::new());
        while now() - start < (secs * 1e9) as u64 {
            next += poll;
            let t = now();
            if next <= t {
                next = t + poll;
            }
            let ts = libc::timespec { tv_sec: (next / 1_000_000_000) as i64, tv_nsec: (next % 1_000_000_000) as i64 };
            // SAFETY: a valid deadline; no remaining-time pointer with TIMER_ABSTIME.
            unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) };
            let woke = now();
            out.push((woke - last) as f64 / 1e3);
            last = woke;
        }
        let cpu = clock(libc::CLOCK_THREAD_CPUTIME_ID) - cpu_start;
        Ok((out, 100.0 * cpu as f64 / (now() - start).max(1) as f64))
    });
    let intervals = sampler.join().map_err(|_| anyhow::anyhow!("the timer-floor thread panicked"));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for l in loops {
        let _ = l.join();
    }
    let (v, cpu_pct) = intervals??;
    let stats = Stats {
        count: v.len() as u64,
        max: v.iter().copied().fold(0.0, f64::max),
        mean: None,
        min: None,
        p50: percentile(&v, 0.5),
        p90: Some(percentile(&v, 0.9)),
        p99: percentile(&v, 0.99),
        stddev: None,
    };
    Ok((stats, cpu_pct))
}

pub fn timer_floor() -> Result<TimerFloor> {
    eprintln!(
        "bench: colocation timer floor ({FLOOR_SECONDS} s alone, {FLOOR_SECONDS} s with {FLOOR_BUSY} busy loops)"
    );
    let (idle, idle_cpu) = timer_floor_run(0, FLOOR_SECONDS)?;
    let (busy, busy_cpu) = timer_floor_run(FLOOR_BUSY, FLOOR_SECONDS)?;
    Ok(TimerFloor {
        idle,
        busy,
        busy_loops: FLOOR_BUSY,
        seconds: FLOOR_SECONDS,
        idle_cpu_pct: Some(idle_cpu),
        busy_cpu_pct: Some(busy_cpu),
    })
}

/// A load generator: one JSON object per stdout line, commands on stdin.
struct Workload {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    hello: Value,
}

impl Workload {
    fn spawn(bin: &Path, args: &[String]) -> Result<Self> {
        let mut child = Command::new(bin.join("emu-workload"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting emu-workload")?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().context("emu-workload stdout")?);
        let mut w = Workload { child, stdin, stdout, hello: Value::Null };
        w.hello = w.recv()?;
        if w.hello["pid"].as_u64().is_none() {
            bail!("emu-workload {args:?} said {} instead of its hello", w.hello);
        }
        Ok(w)
    }

    fn pid(&self) -> u64 {
        self.hello["pid"].as_u64().unwrap_or(0)
    }

    fn recv(&mut self) -> Result<Value> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("emu-workload ended early ({:?})", self.child.try_wait()?);
        }
        serde_json::from_str(&line).with_context(|| format!("emu-workload printed {line:?}"))
    }

    fn send(&mut self, line: &str) -> Result<()> {
        let stdin = self.stdin.as_mut().context("emu-workload stdin closed")?;
        writeln!(stdin, "{line}")?;
        Ok(stdin.flush()?)
    }

    /// The next line whose `event` is `kind`.
    fn until(&mut self, kind: &str) -> Result<Value> {
        loop {
            let v = self.recv()?;
            if v["event"] == kind {
                return Ok(v);
            }
        }
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every request's latency (ms), after `go`.
fn requests(w: &mut Workload, n: u64) -> Result<Vec<f64>> {
    w.send("go")?;
    let mut out = Vec::new();
    for _ in 0..n {
        let r = w.until("request")?;
        out.push(r["latency_ns"].as_f64().context("request without latency_ns")? / 1e6);
    }
    w.until("summary")?;
    Ok(out)
}

/// The offline processes of a state.
struct Trains(Vec<Workload>);

/// Per GPU: (dispatches completed, GPU time completed ns) of one `stats` answer, and its time.
type Snapshot = Vec<(BTreeMap<u32, (f64, f64)>, f64)>;

impl Trains {
    fn spawn(bin: &Path, args: &[Vec<String>]) -> Result<Self> {
        let trains = Trains(args.iter().map(|a| Workload::spawn(bin, a)).collect::<Result<_>>()?);
        // Their queues are full and the emulated CPs busy before anything is measured.
        thread::sleep(Duration::from_millis(300));
        Ok(trains)
    }

    fn pids(&self) -> Vec<u64> {
        self.0.iter().map(Workload::pid).collect()
    }

    fn snapshot(&mut self) -> Result<Snapshot> {
        let mut out = Vec::new();
        for w in &mut self.0 {
            w.send("stats")?;
            let s = w.until("stats")?;
            let mut gpus = BTreeMap::new();
            for g in s["gpus"].as_array().context("train stats without gpus")? {
                let id = g["gpu_id"].as_u64().context("gpu without gpu_id")? as u32;
                let e = gpus.entry(id).or_insert((0.0, 0.0));
                e.0 += g["completed"].as_f64().unwrap_or(0.0);
                e.1 += g["work_ns"].as_f64().unwrap_or(0.0);
            }
            out.push((gpus, s["now_ns"].as_f64().unwrap_or(0.0)));
        }
        Ok(out)
    }

    fn stop(self) -> Result<()> {
        for mut w in self.0 {
            w.send("stop")?;
            w.until("summary")?;
        }
        Ok(())
    }
}

/// Offline throughput per GPU of `gpus` between two snapshots: each process's own rate over
/// its own clock readings, summed over the processes.
fn rates(a: &Snapshot, b: &Snapshot, gpus: &[u32]) -> Vec<GpuRate> {
    gpus.iter()
        .map(|&gpu_id| {
            let (mut dispatches_per_s, mut work_share) = (0.0, 0.0);
            for ((ga, ta), (gb, tb)) in a.iter().zip(b) {
                let dt = tb - ta;
                if let (Some(x), Some(y)) = (ga.get(&gpu_id), gb.get(&gpu_id))
                    && dt > 0.0
                {
                    dispatches_per_s += (y.0 - x.0) * 1e9 / dt;
                    work_share += (y.1 - x.1) / dt;
                }
            }
            GpuRate { dispatches_per_s, gpu_id, work_share }
        })
        .collect()
}

/// `gpreempt schedule` with its stdout and stderr collected by threads.
struct Schedule {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<thread::JoinHandle<()>>,
}

impl Schedule {
    fn start(gpreempt: &Path, args: &[String]) -> Result<Self> {
        let mut child = Command::new(gpreempt)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {} schedule", gpreempt.display()))?;
        let (lines, stderr) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(String::new())));
        let out = BufReader::new(child.stdout.take().context("gpreempt stdout")?);
        let err = BufReader::new(child.stderr.take().context("gpreempt stderr")?);
        let (sink, text) = (lines.clone(), stderr.clone());
        let readers = vec![
            thread::spawn(move || {
                for l in out.lines().map_while(Result::ok) {
                    if let Ok(mut sink) = sink.lock() {
                        sink.push(l);
                    }
                }
            }),
            thread::spawn(move || {
                for l in err.lines().map_while(Result::ok) {
                    if let Ok(mut text) = text.lock() {
                        text.push_str(&l);
                        text.push('\n');
                    }
                }
            }),
        ];
        Ok(Schedule { child, lines, stderr, readers })
    }

    fn json(&self) -> Vec<Value> {
        let lines = self.lines.lock().map(|l| l.clone()).unwrap_or_default();
        lines.iter().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    fn stderr(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Wait until `attached()` counts `n` offline processes; the scheduler's stderr if it exits or
    /// `timeout` passes.
    fn wait_attached(&mut self, n: usize, timeout: Duration, attached: impl Fn(&Self) -> usize) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if attached(self) >= n {
                return Ok(());
            }
            if self.child.try_wait()?.is_some() || Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                for r in self.readers.drain(..) {
                    let _ = r.join();
                }
                bail!("gpreempt schedule: {n} offline process(es) not attached; stderr: {}", self.stderr());
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGINT, then wait for it (it resumes and detaches on the way out).
    fn stop(mut self) -> Result<Self> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self.child.wait()?;
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        if !status.success() {
            bail!("gpreempt schedule failed ({status}): {}", self.stderr());
        }
        Ok(self)
    }
}

impl Drop for Schedule {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `gpreempt schedule`'s arguments: its defaults and `extra`, JSON Lines.
fn schedule_args(online: u64, offline: &[u64], extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = vec!["schedule".into()];
    a.extend(extra.iter().map(|e| (*e).to_owned()));
    a.push("--json".into());
    a.extend(["--online".into(), online.to_string(), "--offline".into()]);
    a.extend(offline.iter().map(u64::to_string));
    a
}

/// The `transition` events counted per `gpu_id` (events without one under `None`).
fn transitions(events: &[Value]) -> Vec<GpuTransitions> {
    let mut by: BTreeMap<Option<u32>, GpuTransitions> = BTreeMap::new();
    for e in events.iter().filter(|e| e["event"] == "transition") {
        let gpu_id = e["gpu_id"].as_u64().map(|g| g as u32);
        let c = by.entry(gpu_id).or_insert(GpuTransitions { gpu_id, resumes: 0, suspends: 0, suspend_ioctls: None });
        match e["action"].as_str() {
            Some("suspend") => {
                c.suspends += 1;
                if let Some(n) = e["ioctls"].as_u64() {
                    *c.suspend_ioctls.get_or_insert(0) += n;
                }
            }
            Some("resume") => c.resumes += 1,
            _ => {}
        }
    }
    by.into_values().collect()
}

/// One co-located state: the offline processes, the online client and, with `gpreempt`, a
/// scheduler started on them; the online requests and the offline throughput over their window.
fn colocated(
    bin: &Path,
    spec: &Spec,
    round: u64,
    plan: &Plan,
    gpreempt: Option<&Path>,
    extra: &[&str],
) -> Result<StateRun> {
    let mut trains = Trains::spawn(bin, &(spec.trains)(round))?;
    let mut serve = Workload::spawn(bin, &(spec.serve)(round, plan))?;
    let mut sched = None;
    let mut startup_s = 0.0;
    if let Some(gpreempt) = gpreempt {
        let offline = trains.pids();
        let t = Instant::now();
        let mut s = Schedule::start(gpreempt, &schedule_args(serve.pid(), &offline, extra))?;
        let n = offline.len();
        s.wait_attached(n, Duration::from_secs(600), |s| {
            s.json().iter().filter(|e| e["event"] == "offline_attached").count()
        })?;
        startup_s = t.elapsed().as_secs_f64();
        sched = Some(s);
    }
    let pid = sched.as_ref().map(|s| s.child.id());
    let react_cpu = || pid.and_then(|p| thread_cpu_ns(p, REACTION_THREAD));
    let (a, cpu_a, react_a, t_a) = (trains.snapshot()?, pid.and_then(process_cpu_ns), react_cpu(), Instant::now());
    let latency_ms = requests(&mut serve, plan.requests)?;
    let (b, cpu_b, react_b, window_ms) =
        (trains.snapshot()?, pid.and_then(process_cpu_ns), react_cpu(), t_a.elapsed().as_secs_f64() * 1e3);
    let offline = rates(&a, &b, &spec.gpus);
    let mut scheduler = None;
    if let Some(s) = sched {
        let s = s.stop()?;
        let events = s.json();
        let summary = match events.iter().find(|e| e["event"] == "summary") {
            Some(v) => serde_json::from_value(v.clone()).context("reading gpreempt schedule's summary")?,
            None => bail!("gpreempt schedule printed no summary; stderr: {}", s.stderr()),
        };
        scheduler = Some(SchedulerRun {
            cpu_ms: cpu_a.zip(cpu_b).map(|(a, b)| (b - a) / 1e6),
            reaction_cpu_ms: react_a.zip(react_b).map(|(a, b)| (b - a) / 1e6),
            startup_s,
            summary,
            transitions: transitions(&events),
            window_ms,
        });
    }
    drop(serve);
    trains.stop()?;
    Ok(StateRun { latency_ms, offline, scheduler })
}

/// The online client alone.
fn online_alone(bin: &Path, spec: &Spec, round: u64, plan: &Plan) -> Result<Vec<f64>> {
    let mut serve = Workload::spawn(bin, &(spec.serve)(round, plan))?;
    requests(&mut serve, plan.requests)
}

/// The offline processes alone, over a window as long as the online run's.
fn offline_alone(bin: &Path, spec: &Spec, round: u64, plan: &Plan) -> Result<Vec<GpuRate>> {
    let mut trains = Trains::spawn(bin, &(spec.trains)(round))?;
    let a = trains.snapshot()?;
    thread::sleep(plan.window());
    let b = trains.snapshot()?;
    trains.stop()?;
    Ok(rates(&a, &b, &spec.gpus))
}

fn log_state(spec: &str, round: u64, state: &str, run: &StateRun) {
    let p = |q| percentile(&run.latency_ms, q);
    let off: Vec<String> =
        run.offline.iter().map(|g| format!("{:#x} {:.0} %", g.gpu_id, 100.0 * g.work_share)).collect();
    let mut line = format!(
        "bench: {spec} round {round} {state:<9}: online p50 {:.2} ms p99 {:.2} ms; offline GPU share {}",
        p(0.5),
        p(0.99),
        off.join(", ")
    );
    if let Some(s) = &run.scheduler {
        let st = |x: &Option<Stats>| x.as_ref().map_or("-".into(), |s| format!("{:.0}/{:.0}", s.p50, s.p99));
        let _ = write!(
            line,
            "; {} suspends, {} resumes, reaction p50/p99 {} us, detection {} us, loop step {} us, cpu {:?} ms / {:.0} ms",
            s.summary.suspends,
            s.summary.resumes,
            st(&s.summary.reaction_us),
            st(&s.summary.detection_us),
            st(&s.summary.loop_step_us),
            s.cpu_ms,
            s.window_ms
        );
    }
    eprintln!("{line}");
}

/// The guest half: every scenario, every round, each state once; one JSON document at `args.out`.
pub fn guest(args: &GuestArgs) -> Result<()> {
    let (bin, plan) = (&args.bin, Plan::new(args.quick));
    let previous = args.previous_gpreempt.as_ref().context("--previous-gpreempt is required")?;
    let current = bin.join("gpreempt");
    let started = Instant::now();
    let mut scenarios = Vec::new();
    for spec in specs(&args.colocation_scenarios) {
        let mut rounds = Vec::new();
        for round in 0..plan.rounds {
            let name = spec.name;
            eprintln!("bench: colocation {name} round {}/{}", round + 1, plan.rounds);
            let online_alone = online_alone(bin, &spec, round, &plan)?;
            let offline_alone = offline_alone(bin, &spec, round, &plan)?;
            let colocated_run = colocated(bin, &spec, round, &plan, None, &[])?;
            log_state(name, round, "colocated", &colocated_run);
            // The two schedulers alternate which goes first, so neither always follows the other.
            let order: [(&Path, &str); 2] = if round % 2 == 0 {
                [(&current, "schedule"), (previous, "previous")]
            } else {
                [(previous, "previous"), (&current, "schedule")]
            };
            let mut runs = BTreeMap::new();
            for (gpreempt, state) in order {
                let run = colocated(bin, &spec, round, &plan, Some(gpreempt), &[])?;
                log_state(name, round, state, &run);
                runs.insert(state, run);
            }
            let busy = colocated(bin, &spec, round, &plan, Some(&current), &["--busy-poll"])?;
            log_state(name, round, "busy-poll", &busy);
            rounds.push(ScenarioRound {
                busy_poll: Some(busy),
                colocated: colocated_run,
                offline_alone,
                online_alone,
                previous: runs.remove("previous").context("previous state")?,
                round,
                schedule: runs.remove("schedule").context("schedule state")?,
            });
        }
        scenarios.push(ColocationScenario {
            gpus: spec.gpus.clone(),
            name: spec.name.into(),
            requests: plan.requests,
            rounds,
            serve: (spec.serve)(0, &plan).join(" "),
            train: (spec.trains)(0).iter().map(|t| t.join(" ")).collect(),
        });
    }
    let wanted =
        |name: &str| args.colocation_scenarios.is_empty() || args.colocation_scenarios.iter().any(|s| s == name);
    let sweep = if wanted(SWEEP_NAME) { Some(sweep(bin, &current, &plan)?) } else { None };
    let timer_floor = Some(timer_floor()?);
    let doc = Colocation {
        cpus: cpus(),
        emulator: EmulatorParams {
            tick_us: emu_param("tick_us")?,
            preempt_delay_us: emu_param("preempt_delay_us")?,
            restore_delay_us: emu_param("restore_delay_us")?,
        },
        host_loadavg: None,
        kernel: kernel_release(),
        previous: PreviousScheduler { commit: args.previous_commit.clone().unwrap_or_default() },
        quick: args.quick,
        rounds: plan.rounds,
        scenario: super::results::Scenario::Colocation,
        scenarios,
        seconds: started.elapsed().as_secs_f64(),
        sweep,
        timer_floor,
        host_timer_floor: None,
    };
    fs::write(&args.out, serde_json::to_vec_pretty(&doc)?).with_context(|| format!("writing {}", args.out.display()))
}

pub(super) fn cpu_percent(s: &SchedulerRun) -> Option<f64> {
    s.cpu_ms.map(|c| 100.0 * c / s.window_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions_are_counted_per_gpu_and_unnamed_ones_together() {
        let events: Vec<Value> = serde_json::from_str(
            r#"[{"event": "transition", "gpu_id": 4096, "action": "suspend", "ioctls": 2},
                {"event": "transition", "gpu_id": 4096, "action": "resume", "ioctls": 2},
                {"event": "transition", "gpu_id": 4096, "action": "suspend", "ioctls": 3},
                {"event": "transition", "gpu_id": 8192, "action": "suspend", "ioctls": 1},
                {"event": "transition", "action": "suspend"},
                {"event": "interval", "gpu_id": 4096}]"#,
        )
        .expect("JSON");
        assert_eq!(
            transitions(&events),
            vec![
                GpuTransitions { gpu_id: None, resumes: 0, suspends: 1, suspend_ioctls: None },
                GpuTransitions { gpu_id: Some(4096), resumes: 1, suspends: 2, suspend_ioctls: Some(5) },
                GpuTransitions { gpu_id: Some(8192), resumes: 0, suspends: 1, suspend_ioctls: Some(1) },
            ]
        );
    }
}
