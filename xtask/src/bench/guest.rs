//! Rows 1-6 of `cargo xtask bench`, inside the VM, as root: starts each tool, drives the KFD
//! load, and writes every measurement as a [`Run`] in JSON for the host to tabulate
//! (`bench/mod.rs`).
//!
//! Interleaving: every tool gets its own session (start, measure, stop) in a fixed order, with an
//! untraced session between every two, and the whole order repeats `sessions` times, so drift in
//! the emulated machine shows up in the baseline's spread.

use std::{
    fs,
    io::{BufRead, BufReader, Read, Seek, SeekFrom},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::{
    guest_env::{GuestArgs, RUST_PAIR, cpus, emu_param, kernel_release, process_cpu_ns, set_emu_param},
    results::{Run, RunSizes, Sample, Scenario},
    stats::p50_p99,
};

/// Where the benchmarked tools keep their state in the guest (tmpfs, not the 9p tree).
const SCRATCH: &str = "/tmp/gpreempt-bench";
/// Row 5's copies of the programs it compares, on the guest's tmpfs.
const LOCAL_BIN: &str = "/dev/shm/gpreempt-bench-bin";
const TRACEFS: &str = "/sys/kernel/tracing";
/// A gpu id no KFD node has: CREATE_QUEUE fails with EINVAL after the ioctl handler looked it
/// up, the path every host without a GPU can drive (docs/toolchain.md).
const NO_SUCH_GPU: &str = "0x1234";

/// How much of everything: `--quick` keeps the whole run under 5 minutes.
struct Sizes {
    sessions: usize,
    loops: usize,
    create_ioctls: u32,
    debug_cycles: u32,
    extra_starts: usize,
    rate_step: Duration,
    memory_events: u32,
    controller_runs: usize,
    controller_cycles: u32,
    fence_iterations: u32,
    fence_delays_us: &'static [u32],
}

impl Sizes {
    fn new(quick: bool) -> Self {
        if quick {
            Sizes {
                sessions: 1,
                loops: 2,
                create_ioctls: 10_000,
                debug_cycles: 2_000,
                extra_starts: 0,
                rate_step: Duration::from_secs(1),
                memory_events: 50_000,
                controller_runs: 2,
                controller_cycles: 300,
                fence_iterations: 100,
                fence_delays_us: &[5_000],
            }
        } else {
            Sizes {
                sessions: 1,
                loops: 6,
                // The 4 MiB ring holds ~30k records: a loop that fits shows the per-event cost,
                // not the consumer's catching up.
                create_ioctls: 20_000,
                debug_cycles: 8_000,
                extra_starts: 4,
                rate_step: Duration::from_secs(4),
                memory_events: 1_000_000,
                controller_runs: 5,
                controller_cycles: 1_000,
                fence_iterations: 300,
                fence_delays_us: &[1_000, 5_000],
            }
        }
    }
}

/// The measurements so far; the host groups them by (row, case, tool).
struct Samples(Vec<Sample>);

impl Samples {
    fn add(&mut self, row: &str, case: &str, tool: Tool, value: f64, unit: &str) {
        eprintln!("bench: {row:<12} {case:<22} {:<16} {value:>14.1} {unit}", tool.name());
        self.0.push(Sample { row: row.into(), case: case.into(), tool: tool.name().into(), value, unit: unit.into() });
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tool {
    Untraced,
    Gpreempt,
    Bpftrace,
    /// Empty programs on the same functions (`gpreempt trace --empty-probes`): the kprobe +
    /// kretprobe floor.
    KprobeFloor,
    FtraceFunction,
    FtraceGraph,
    /// `gpreempt preempt --no-trace`
    GpreemptNoTrace,
    /// xtask/bench/dbg_pair.c
    CPair,
    /// xtask/bench/dbg_pair.rs: the same program in Rust.
    RustPair,
    /// The emulator's own figure (the delay it was told to spend).
    Emulator,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Untraced => "untraced",
            Tool::Gpreempt => "gpreempt",
            Tool::Bpftrace => "bpftrace",
            Tool::KprobeFloor => "kprobe-floor",
            Tool::FtraceFunction => "ftrace-function",
            Tool::FtraceGraph => "ftrace-graph",
            Tool::GpreemptNoTrace => "gpreempt-no-trace",
            Tool::CPair => "c-ioctl-pair",
            Tool::RustPair => "rust-ioctl-pair",
            Tool::Emulator => "emulator",
        }
    }
}

/// The amdgpu or emulator scenario's guest half; one [`Run`] at `args.out`.
pub fn run(args: &GuestArgs) -> Result<()> {
    let _ = fs::remove_dir_all(SCRATCH);
    fs::create_dir_all(SCRATCH)?;
    let sizes = Sizes::new(args.quick);
    let mut samples = Samples(Vec::new());
    let mut notes = Vec::new();
    let started = Instant::now();
    match args.scenario {
        Scenario::Amdgpu => amdgpu(args, &sizes, &mut samples, &mut notes)?,
        Scenario::Emulator => emulator(args, &sizes, &mut samples, &mut notes)?,
        Scenario::Colocation => bail!("the co-location scenario has a guest half of its own (bench::guest_main)"),
    }
    let doc = Run {
        scenario: args.scenario,
        kernel: kernel_release(),
        quick: args.quick,
        cpus: cpus(),
        seconds: started.elapsed().as_secs_f64(),
        notes,
        sizes: RunSizes {
            sessions: sizes.sessions as u64,
            loops: sizes.loops as u64,
            create_ioctls: sizes.create_ioctls.into(),
            debug_ioctls: 2 * u64::from(sizes.debug_cycles),
            rate_step_s: sizes.rate_step.as_secs(),
            memory_events: sizes.memory_events.into(),
            controller_runs: sizes.controller_runs as u64,
            controller_cycles: sizes.controller_cycles.into(),
            fence_iterations: sizes.fence_iterations.into(),
        },
        samples: samples.0,
    };
    fs::write(&args.out, serde_json::to_vec_pretty(&doc)?).with_context(|| format!("writing {}", args.out.display()))
}

// ---- rows 1-4: the real driver ----

fn amdgpu(args: &GuestArgs, sizes: &Sizes, samples: &mut Samples, notes: &mut Vec<String>) -> Result<()> {
    let bin = &args.bin;
    // The debug-trap path needs KFD 1.13 (Linux 6.5+): probe it once, untraced.
    let debug_trap = debug_loop(bin, 1).is_ok();
    if !debug_trap {
        notes.push("no debug-trap API on this kernel (KFD < 1.13): debug-trap rows skipped".into());
    }
    // bpftrace first, in the freshly booted guest (its start-up, 55-65 s here, is the longest).
    // The untraced baseline runs between every two tool sessions, so drift shows in its spread.
    let order = [
        Tool::Untraced,
        Tool::Bpftrace,
        Tool::Untraced,
        Tool::Gpreempt,
        Tool::Untraced,
        Tool::KprobeFloor,
        Tool::Untraced,
        Tool::FtraceFunction,
        Tool::Untraced,
        Tool::FtraceGraph,
        Tool::Untraced,
    ];
    for session in 0..sizes.sessions {
        for tool in order {
            let mut s = Session::start(tool, bin)?;
            if let Some(ms) = s.startup_ms {
                samples.add("startup", "all probes attached", tool, ms, "ms");
            }
            for _ in 0..sizes.loops {
                let cpu = s.cpu_ns();
                let ns = create_loop(bin, sizes.create_ioctls)?;
                samples.add("ioctl", "create_queue", tool, ns, "ns/ioctl");
                // The tool's own CPU time (all its threads; ftrace's is the copying `cat`).
                if matches!(tool, Tool::Gpreempt | Tool::Bpftrace) {
                    // Until every event of the loop is out, so its processing is counted. A tool
                    // that loses events does less work: how many arrived is part of the result.
                    let before = s.counted;
                    let delivered = s.settle(before + u64::from(sizes.create_ioctls))? - before;
                    let share = 100.0 * delivered as f64 / f64::from(sizes.create_ioctls);
                    samples.add("ioctl_delivered", "create_queue", tool, share, "% of events");
                }
                if let (Some(a), Some(b)) = (cpu, s.cpu_ns()) {
                    samples.add("tool_cpu", "create_queue", tool, (b - a) / f64::from(sizes.create_ioctls), "ns/ioctl");
                }
                if debug_trap {
                    let ns = debug_loop(bin, sizes.debug_cycles)?;
                    samples.add("ioctl", "debug_trap", tool, ns, "ns/ioctl");
                }
            }
            if session + 1 == sizes.sessions && matches!(tool, Tool::Gpreempt | Tool::Bpftrace) {
                let rate = delivery(&mut s, bin, sizes, samples, notes)?;
                memory(&mut s, bin, sizes, rate, samples)?;
            }
            s.stop()?;
        }
    }
    for _ in 0..sizes.extra_starts {
        // gpreempt only: one bpftrace start takes a minute under emulation.
        let s = Session::start(Tool::Gpreempt, bin)?;
        samples.add("startup", "all probes attached", Tool::Gpreempt, s.startup_ms.unwrap_or(0.0), "ms");
        s.stop()?;
    }
    Ok(())
}

/// `count` CREATE_QUEUE ioctls back to back; ns per ioctl.
fn create_loop(bin: &Path, count: u32) -> Result<f64> {
    let report = json_of(Command::new(bin.join("kfd-client")).args([
        "--count",
        &count.to_string(),
        "create",
        "--gpu-id",
        NO_SUCH_GPU,
    ]))?;
    if report["results"]["EINVAL"].as_u64() != Some(u64::from(count)) {
        bail!("kfd-client: expected {count} EINVAL results, got {}", report["results"]);
    }
    Ok(report["elapsed_ns"].as_f64().unwrap_or(0.0) / f64::from(count))
}

/// `cycles` × (SUSPEND_QUEUES, RESUME_QUEUES) on a forked debuggee; ns per ioctl.
fn debug_loop(bin: &Path, cycles: u32) -> Result<f64> {
    let report = json_of(Command::new(bin.join("trace-debugger")).args(["--cycles", &cycles.to_string()]))?;
    let enabled = report["ops"].get(0).and_then(|o| o["ret"].as_i64());
    if enabled != Some(0) {
        bail!("trace-debugger: DBG_TRAP ENABLE returned {enabled:?}");
    }
    Ok(report["elapsed_ns"].as_f64().unwrap_or(0.0) / (2.0 * f64::from(cycles)))
}

/// Row 2: the highest paced event rate delivered with zero loss, then the loss at twice it.
/// Two generator processes (one per vCPU) share the rate; the tracer competes with them for CPU.
fn delivery(s: &mut Session, bin: &Path, sizes: &Sizes, samples: &mut Samples, notes: &mut Vec<String>) -> Result<f64> {
    let mut rate = 4_000u32;
    let mut best = 0.0f64;
    let mut generator_bound = false;
    for _ in 0..8 {
        let step = paced(s, bin, rate, sizes.rate_step)?;
        eprintln!(
            "bench: {} at {rate}/s: achieved {:.0}/s, {} of {} delivered",
            s.tool.name(),
            step.achieved,
            step.delivered,
            step.issued
        );
        if step.delivered < step.issued {
            break;
        }
        best = best.max(step.achieved);
        if step.achieved < 0.9 * f64::from(rate) {
            generator_bound = true;
            break;
        }
        rate *= 2;
    }
    samples.add("delivery", "zero-loss rate", s.tool, best, "events/s");
    if generator_bound {
        notes.push(format!(
            "{}: the two generators peaked at {best:.0} ioctls/s under this tool with every event delivered, \
             so its zero-loss rate is bounded by the generator, not by the tool",
            s.tool.name()
        ));
    }
    let double = paced(s, bin, (2.0 * best) as u32, sizes.rate_step)?;
    let lost = double.issued.saturating_sub(double.delivered);
    samples.add("delivery", "loss at 2x that rate", s.tool, lost as f64, "events");
    samples.add("delivery", "2x rate achieved", s.tool, double.achieved, "events/s");
    Ok(best)
}

struct Step {
    issued: u64,
    delivered: u64,
    achieved: f64,
}

fn paced(s: &mut Session, bin: &Path, rate: u32, length: Duration) -> Result<Step> {
    let per_generator = rate / 2;
    let count = (u64::from(per_generator) * length.as_millis() as u64 / 1000) as u32;
    let before = s.delivered()?;
    let reports = generators(bin, count, Some(per_generator))?;
    // The pace the loops kept (their own clocks: process start-up is not part of it).
    let slowest = reports.iter().filter_map(|r| r["elapsed_ns"].as_f64()).fold(0.0, f64::max);
    let issued = 2 * u64::from(count);
    let delivered = s.settle(before + issued)? - before;
    Ok(Step { issued, delivered, achieved: if slowest > 0.0 { issued as f64 * 1e9 / slowest } else { 0.0 } })
}

/// Two `kfd-client` CREATE_QUEUE loops at once (one per vCPU), `count` each; their reports.
fn generators(bin: &Path, count: u32, rate: Option<u32>) -> Result<Vec<Value>> {
    let children: Vec<Child> = (0..2)
        .map(|_| {
            let mut cmd = Command::new(bin.join("kfd-client"));
            cmd.args(["--count", &count.to_string()]);
            if let Some(rate) = rate {
                cmd.args(["--rate", &rate.to_string()]);
            }
            cmd.args(["create", "--gpu-id", NO_SUCH_GPU]).stdout(Stdio::piped()).spawn().context("starting kfd-client")
        })
        .collect::<Result<_>>()?;
    children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output()?;
            let text = String::from_utf8_lossy(&out.stdout);
            serde_json::from_str(text.trim()).with_context(|| format!("kfd-client printed {text:?}"))
        })
        .collect()
}

/// Row 4: resident memory after `memory_events` events, paced at the zero-loss rate of row 2
/// so that every one of them reaches the tool.
fn memory(s: &mut Session, bin: &Path, sizes: &Sizes, rate: f64, samples: &mut Samples) -> Result<()> {
    let before = s.delivered()?;
    let per = sizes.memory_events / 2;
    generators(bin, per, Some(((rate / 2.0) as u32).max(1_000)))?;
    let delivered = s.settle(before + 2 * u64::from(per))? - before;
    let (rss, hwm) = s.memory_kib()?;
    samples.add("memory", "events delivered", s.tool, delivered as f64, "events");
    samples.add("memory", "VmRSS", s.tool, rss as f64 / 1024.0, "MiB");
    samples.add("memory", "VmHWM (peak)", s.tool, hwm as f64 / 1024.0, "MiB");
    Ok(())
}

/// One tool attached for a while: its process, its output file and how to count its events.
struct Session {
    tool: Tool,
    child: Option<Child>,
    /// What the tool writes its events to; `queue_create` occurrences are the delivered events.
    output: PathBuf,
    read_at: u64,
    counted: u64,
    startup_ms: Option<f64>,
}

impl Session {
    fn start(tool: Tool, bin: &Path) -> Result<Session> {
        let output = Path::new(SCRATCH).join(format!("{}.out", tool.name()));
        let _ = fs::remove_file(&output);
        eprintln!("bench: starting {}", tool.name());
        let started = Instant::now();
        let child = match tool {
            Tool::Gpreempt | Tool::KprobeFloor => {
                let mut cmd = Command::new(bin.join("gpreempt"));
                if tool == Tool::Gpreempt {
                    cmd.args(["trace", "--json", "--summary-json"])
                        .arg(Path::new(SCRATCH).join("gpreempt-summary.json"));
                } else {
                    cmd.args(["trace", "--empty-probes"]);
                }
                let mut child = cmd
                    .stdout(fs::File::create(&output)?)
                    .stderr(Stdio::piped())
                    .spawn()
                    .context("starting gpreempt trace")?;
                // "gpreempt: attached N probes …" is printed once every probe is attached.
                let stderr = child.stderr.take().context("gpreempt stderr")?;
                let mut lines = BufReader::new(stderr).lines();
                loop {
                    match lines.next() {
                        Some(Ok(line)) if line.starts_with("gpreempt: attached") => break,
                        Some(Ok(_)) => {}
                        _ => bail!("gpreempt trace ended before attaching its probes"),
                    }
                }
                // Keep draining stderr so gpreempt never blocks on it.
                thread::spawn(move || for _ in lines {});
                Some(child)
            }
            Tool::Bpftrace => {
                let script = crate::util::workspace_root().join("xtask/bench/kfd.bt");
                // stdout redirected to the file with -B line: each event line reaches the file as
                // it happens, as gpreempt's do. (`-o FILE` is fully buffered whatever -B says in
                // bpftrace 0.17: "ready" only showed at exit.)
                let mut child = Command::new("bpftrace")
                    .args(["-B", "line"])
                    .arg(&script)
                    .stdout(fs::File::create(&output)?)
                    .stderr(Stdio::null())
                    .spawn()
                    .context("starting bpftrace (run `cargo xtask setup`)")?;
                // BEGIN runs once every probe is attached; it prints "ready".
                let deadline = Instant::now() + Duration::from_secs(900);
                while !fs::read_to_string(&output).is_ok_and(|t| t.contains("ready")) {
                    if let Some(status) = child.try_wait()? {
                        bail!("bpftrace exited ({status}) before attaching");
                    }
                    if Instant::now() > deadline {
                        let _ = child.kill();
                        bail!("bpftrace did not attach within 900 s");
                    }
                    thread::sleep(Duration::from_millis(20));
                }
                Some(child)
            }
            Tool::FtraceFunction | Tool::FtraceGraph => {
                let tracer = if tool == Tool::FtraceFunction { "function" } else { "function_graph" };
                ftrace_write("tracing_on", "0")?;
                ftrace_write("trace", "")?;
                // The proof-of-concept's filter: every function of the amdgpu module.
                ftrace_write("set_ftrace_filter", ":mod:amdgpu")?;
                ftrace_write("current_tracer", tracer)?;
                let child = Command::new("cat")
                    .arg(Path::new(TRACEFS).join("trace_pipe"))
                    .stdout(fs::File::create(&output)?)
                    .spawn()
                    .context("starting cat trace_pipe")?;
                ftrace_write("tracing_on", "1")?;
                Some(child)
            }
            _ => None,
        };
        let startup_ms = matches!(tool, Tool::Gpreempt | Tool::Bpftrace).then(|| started.elapsed().as_secs_f64() * 1e3);
        Ok(Session { tool, child, output, read_at: 0, counted: 0, startup_ms })
    }

    /// `queue_create` events in the output so far.
    fn delivered(&mut self) -> Result<u64> {
        let mut file = fs::File::open(&self.output).with_context(|| format!("opening {}", self.output.display()))?;
        file.seek(SeekFrom::Start(self.read_at))?;
        let mut text = Vec::new();
        file.read_to_end(&mut text)?;
        // Only whole lines: the tool may be mid-write.
        let end = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let needle = b"queue_create";
        self.counted += text[..end].windows(needle.len()).filter(|w| w == needle).count() as u64;
        self.read_at += end as u64;
        Ok(self.counted)
    }

    /// Wait until `expected` events were delivered or none arrived for 2 s; the count then.
    fn settle(&mut self, expected: u64) -> Result<u64> {
        let mut last = self.delivered()?;
        let mut quiet_since = Instant::now();
        while last < expected && quiet_since.elapsed() < Duration::from_secs(2) {
            thread::sleep(Duration::from_millis(100));
            let now = self.delivered()?;
            if now != last {
                (last, quiet_since) = (now, Instant::now());
            }
        }
        Ok(last)
    }

    /// User + system CPU time of the tool's process so far (all threads), ns.
    fn cpu_ns(&self) -> Option<f64> {
        process_cpu_ns(self.child.as_ref()?.id())
    }

    fn memory_kib(&self) -> Result<(u64, u64)> {
        let pid = self.child.as_ref().context("no tracer process")?.id();
        let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
                .with_context(|| format!("no {name} in /proc/{pid}/status"))
        };
        Ok((field("VmRSS:")?, field("VmHWM:")?))
    }

    fn stop(mut self) -> Result<()> {
        eprintln!("bench: stopping {}", self.tool.name());
        let ftrace = matches!(self.tool, Tool::FtraceFunction | Tool::FtraceGraph);
        if ftrace {
            ftrace_write("tracing_on", "0")?;
        }
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            let deadline = Instant::now() + Duration::from_secs(60);
            while child.try_wait()?.is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                }
                thread::sleep(Duration::from_millis(50));
            }
        }
        // Only once nothing reads trace_pipe: the tracer cannot change while it is open (EBUSY).
        if ftrace {
            ftrace_write("current_tracer", "nop")?;
            ftrace_write("set_ftrace_filter", "")?;
        }
        let _ = fs::remove_file(&self.output);
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn ftrace_write(file: &str, value: &str) -> Result<()> {
    let path = Path::new(TRACEFS).join(file);
    fs::write(&path, value).with_context(|| format!("writing {value:?} to {}", path.display()))
}

fn json_of(cmd: &mut Command) -> Result<Value> {
    let out = cmd.stderr(Stdio::inherit()).output().with_context(|| format!("starting {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!("{:?} failed ({})", cmd.get_program(), out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or_default())
        .with_context(|| format!("{:?} printed no JSON: {text}", cmd.get_program()))
}

// ---- rows 5-6: the KFD emulator ----

fn emulator(args: &GuestArgs, sizes: &Sizes, samples: &mut Samples, notes: &mut Vec<String>) -> Result<()> {
    let default_delay = emu_param("preempt_delay_us")?;
    let result = default_profile_rows(args, sizes, samples, notes);
    let result =
        result.and_then(|()| if args.controller_only { Ok(()) } else { gfx942_rows(args, sizes, samples, notes) });
    set_emu_param("preempt_delay_us", default_delay)?;
    result
}

/// Rows 5 and 6 on the module as the VM loaded it: the default profile, mi210 (gfx90a).
fn default_profile_rows(args: &GuestArgs, sizes: &Sizes, samples: &mut Samples, notes: &mut Vec<String>) -> Result<()> {
    let (mut workload, pid) = emu_workload(args, &[])?;
    let result = (|| {
        if !args.no_controller {
            controller_row(args, sizes, samples, notes, &pid)?;
        }
        if !args.controller_only {
            save_area_sample(samples, GFX90A)?;
            emulated_row(sizes, samples, args, &pid, GFX90A)?;
        }
        Ok(())
    })();
    drop(workload.stdin.take());
    let _ = workload.wait();
    result
}

/// Row 6's label of the default profile's cases.
const GFX90A: &str = "gfx90a (mi210)";

/// The gfx942 profiles row 6 also measures: (label, kfd_emu's parameters), one package each.
const GFX942: [(&str, &[&str]); 2] = [
    ("gfx942 SPX (mi300x)", &["profile=mi300x", "partition=spx", "num_gpus=1"]),
    ("gfx942 CPX (mi300x)", &["profile=mi300x", "partition=cpx", "num_gpus=1"]),
];

/// `emu-workload run` with two queues on gpu 0x1000 (the first node) and `extra`; it and its pid.
fn emu_workload(args: &GuestArgs, extra: &[&str]) -> Result<(Child, String)> {
    let mut workload = Command::new(args.bin.join("emu-workload"))
        .args(["run", "--gpu-id", "0x1000", "--queues", "2", "--runtime-enable"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting emu-workload")?;
    let mut hello = String::new();
    BufReader::new(workload.stdout.as_mut().context("emu-workload stdout")?).read_line(&mut hello)?;
    let hello: Value = serde_json::from_str(&hello).context("emu-workload hello")?;
    if hello["errors"].as_array().is_some_and(|e| !e.is_empty()) {
        bail!("emu-workload could not create its queues: {hello}");
    }
    let pid = hello["pid"].as_u64().context("emu-workload pid")?.to_string();
    Ok((workload, pid))
}

/// Row 6 on the gfx942 profile in SPX and CPX: kfd_emu loaded again with the profile (and
/// amdgpu_emu, whose render node maps the save area), the workload's queues each given the whole
/// save area libhsakmt allocates (`--full-save-area`: the profile checks its size at
/// CREATE_QUEUE, tests/kfd-emu README "Save-area checks").
fn gfx942_rows(args: &GuestArgs, sizes: &Sizes, samples: &mut Samples, notes: &mut Vec<String>) -> Result<()> {
    // target/release → target/kfd-emu/<release>/, where the host built the modules for this kernel.
    let kos = args.bin.parent().context("--bin has no parent")?.join("kfd-emu").join(kernel_release());
    notes.push(
        "emulated row: gfx942 cases: kfd_emu loaded again with profile=mi300x partition=spx|cpx num_gpus=1 \
         (its other parameters at their defaults, as the VM loads it) and amdgpu_emu; emu-workload \
         --full-save-area on gpu 0x1000 (SPX: the package; CPX: partition 0 of 8)"
            .into(),
    );
    for (label, params) in GFX942 {
        load_emulator(&kos, params)?;
        save_area_sample(samples, label)?;
        let (mut workload, pid) = emu_workload(args, &["--full-save-area"])?;
        let result = emulated_row(sizes, samples, args, &pid, label);
        drop(workload.stdin.take());
        let _ = workload.wait();
        result?;
    }
    Ok(())
}

/// Unload amdgpu_emu and kfd_emu (once the last KFD process has let go: retried for 30 s) and
/// load kfd_emu with `params`, then amdgpu_emu.
fn load_emulator(kos: &Path, params: &[&str]) -> Result<()> {
    for module in ["amdgpu_emu", "kfd_emu"] {
        if !Path::new("/sys/module").join(module).exists() {
            continue;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while !Command::new("rmmod").arg(module).status()?.success() {
            if Instant::now() > deadline {
                bail!("rmmod {module} failed for 30 s");
            }
            thread::sleep(Duration::from_millis(200));
        }
    }
    let status = Command::new("insmod").arg(kos.join("kfd_emu.ko")).args(params).status()?;
    if !status.success() {
        bail!("insmod kfd_emu.ko {} failed ({status})", params.join(" "));
    }
    // drm.ko, which amdgpu_emu registers with, left with amdgpu when the VM loaded kfd_emu.
    if !Command::new("modprobe").arg("drm").status()?.success() {
        bail!("modprobe drm failed");
    }
    let status = Command::new("insmod").arg(kos.join("amdgpu_emu.ko")).status()?;
    if !status.success() {
        bail!("insmod amdgpu_emu.ko failed ({status})");
    }
    Ok(())
}

/// The save area a compute queue on gpu 0x1000 (topology node 1) gets from libhsakmt, as the
/// profile implies it: `PAGE_ALIGN((cwsr_size + debug_memory_size) x num_xcc)` (kfd_queue.c
/// 6.12, `kfd_queue_acquire_buffers`), `cwsr_size` per XCC from sysfs and the debugger's 32 bytes
/// per wave of an XCC (libhsakmt's `update_ctx_save_restore_size`); in MiB, under `label`.
fn save_area_sample(samples: &mut Samples, label: &str) -> Result<()> {
    let text = fs::read_to_string("/sys/class/kfd/kfd/topology/nodes/1/properties")?;
    let prop = |key: &str| -> Result<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(key).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("node 1 has no {key}"))
    };
    let xcc = prop("num_xcc")?.max(1);
    let cu_per_xcc = prop("simd_count")? / prop("simd_per_cu")?.max(1) / xcc;
    let waves = (cu_per_xcc * 40).min(prop("array_count")? / prop("simd_arrays_per_engine")?.max(1) / xcc * 512);
    let per_xcc = prop("cwsr_size")? + (waves * 32).next_multiple_of(64);
    let per_queue = (per_xcc * xcc).next_multiple_of(4096);
    samples.add("emulated", &format!("{label}: save area per XCC"), Tool::Emulator, per_xcc as f64 / MIB, "MiB");
    samples.add("emulated", &format!("{label}: XCCs"), Tool::Emulator, xcc as f64, "");
    samples.add("emulated", &format!("{label}: save area per queue"), Tool::Emulator, per_queue as f64 / MIB, "MiB");
    Ok(())
}

const MIB: f64 = (1u64 << 20) as f64;

/// Row 5: the controller's userspace time per cycle against the C ioctl pair and its Rust twin.
fn controller_row(
    args: &GuestArgs,
    sizes: &Sizes,
    samples: &mut Samples,
    notes: &mut Vec<String>,
    pid: &str,
) -> Result<()> {
    // The emulated CWSR delay is irrelevant to the userspace cost; keep cycles short.
    set_emu_param("preempt_delay_us", 100)?;
    // Every tool runs from the guest's tmpfs: run from the 9p share, a program's pages are read
    // over virtio when first touched (gpreempt: hundreds of major faults a run) and some of those
    // reads land in the measured windows.
    let local = Path::new(LOCAL_BIN);
    let _ = fs::remove_dir_all(local);
    fs::create_dir_all(local)?;
    let (c_pair, rust_pair, gpreempt) = (local.join("dbg-pair"), local.join(RUST_PAIR), local.join("gpreempt"));
    fs::copy(&args.dbg_pair, &c_pair)?;
    fs::copy(args.dbg_pair.with_file_name(RUST_PAIR), &rust_pair)?;
    fs::copy(args.bin.join("gpreempt"), &gpreempt)?;
    notes.push(format!(
        "controller row: emulator preempt_delay_us = 100, hold 0 ms, gap 0 ms, 2 queues; a guest of its own with 1 vCPU; every program run from {LOCAL_BIN} (tmpfs)"
    ));
    let cycles = sizes.controller_cycles.to_string();
    for _ in 0..sizes.controller_runs {
        // The C baseline, then its Rust twin.
        for (tool, program) in [(Tool::CPair, c_pair.clone()), (Tool::RustPair, rust_pair.clone())] {
            let out = Command::new(&program).args([pid, cycles.as_str(), "0"]).stderr(Stdio::inherit()).output()?;
            if !out.status.success() {
                bail!("{} failed ({})", program.display(), out.status);
            }
            let rows: Vec<[f64; 4]> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| {
                    let v: Vec<f64> = l.split_whitespace().filter_map(|w| w.parse().ok()).collect();
                    (v.len() == 4).then(|| [v[0], v[1], v[2], v[3]])
                })
                .collect();
            // Per cycle: suspend return to the next suspend return, less the resume and next suspend ioctls.
            let overhead: Vec<f64> = rows
                .windows(2)
                .map(|w| (w[1][1] - w[0][1]) - (w[0][3] - w[0][2]) - (w[1][1] - w[1][0]))
                .map(|ns| ns / 1e3)
                .collect();
            add_percentiles(samples, "controller", tool, &overhead);
        }
        for (tool, extra) in [(Tool::GpreemptNoTrace, Some("--no-trace")), (Tool::Gpreempt, None)] {
            let json = Path::new(SCRATCH).join("preempt.json");
            let doc = preempt(local, pid, &cycles, "0", "0", extra, &json)?;
            let its = doc["iterations"].as_array().context("no iterations")?;
            let f = |it: &Value, k: &str| it[k].as_f64().unwrap_or(0.0);
            let overhead: Vec<f64> = its
                .windows(2)
                .map(|w| {
                    (f(&w[1], "suspended_at_ns") - f(&w[0], "suspended_at_ns")) / 1e3
                        - f(&w[0], "resume_us")
                        - f(&w[1], "suspend_us")
                })
                .collect();
            add_percentiles(samples, "controller", tool, &overhead);
        }
    }
    Ok(())
}

/// Row 6: end-to-end suspend latency and the tracer's fence-wait span vs the emulated delay, on
/// the profile `label` names.
fn emulated_row(sizes: &Sizes, samples: &mut Samples, args: &GuestArgs, pid: &str, label: &str) -> Result<()> {
    for &delay in sizes.fence_delays_us {
        set_emu_param("preempt_delay_us", delay.into())?;
        let json = Path::new(SCRATCH).join("fence.json");
        let n = sizes.fence_iterations.to_string();
        let doc = preempt(&args.bin, pid, &n, "2", "2", None, &json)?;
        let its = doc["iterations"].as_array().context("no iterations")?;
        let suspend: Vec<f64> = its.iter().filter_map(|it| it["suspend_us"].as_f64()).collect();
        let fence: Vec<f64> = its.iter().filter_map(|it| it["kernel"]["suspend"]["fence_wait_us"].as_f64()).collect();
        let case = format!("{label}, delay {delay} us");
        for (name, values) in [("suspend ioctl", &suspend), ("fence-wait span", &fence)] {
            for (label, value) in p50_p99(values) {
                samples.add("emulated", &format!("{case}: {name} {label}"), Tool::Gpreempt, value, "us");
            }
        }
        samples.add("emulated", &format!("{case}: emulated CWSR delay"), Tool::Emulator, f64::from(delay), "us");
    }
    Ok(())
}

fn preempt(
    bin: &Path,
    pid: &str,
    iterations: &str,
    hold: &str,
    gap: &str,
    extra: Option<&str>,
    json: &Path,
) -> Result<Value> {
    let mut cmd = Command::new(bin.join("gpreempt"));
    let (hold, gap) = (format!("{hold}ms"), format!("{gap}ms"));
    cmd.args(["preempt", "--offline", pid, "--iterations", iterations, "--hold", &hold, "--gap", &gap, "--quiet"])
        .arg("--output")
        .arg(json)
        .args(extra)
        .stdout(Stdio::null());
    let status = cmd.status().context("starting gpreempt preempt")?;
    if !status.success() {
        bail!("gpreempt preempt failed ({status})");
    }
    serde_json::from_slice(&fs::read(json)?).context("gpreempt preempt --output")
}

fn add_percentiles(samples: &mut Samples, row: &str, tool: Tool, values: &[f64]) {
    for (label, value) in p50_p99(values) {
        samples.add(row, &format!("userspace per cycle {label}"), tool, value, "us");
    }
}
