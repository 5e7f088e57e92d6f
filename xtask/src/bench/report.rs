//! BENCHMARKS.md from the results `cargo xtask bench` collected: one table per row (command,
//! kernel, iterations, median, min-max, ratio to the baseline) and the sentence each row's
//! numbers support. Everything here is computed from the results; nothing is typed in by hand.

use std::fmt::Write;

use super::{
    Section, colocation_report, provenance,
    results::{Benchmarks, Criterion, Reaction, RunSizes, Scenario},
};

/// The samples of one (run, row, case, tool), in run order.
struct Group<'a> {
    kernel: &'a str,
    case: &'a str,
    tool: &'a str,
    unit: &'a str,
    values: Vec<f64>,
}

impl Group<'_> {
    fn median(&self) -> f64 {
        let mut v = self.values.clone();
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => 0.0,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }
    fn min(&self) -> f64 {
        self.values.iter().copied().fold(f64::INFINITY, f64::min)
    }
    fn max(&self) -> f64 {
        self.values.iter().copied().fold(f64::NEG_INFINITY, f64::max)
    }
}

fn groups<'a>(results: &'a Benchmarks, scenario: Scenario, row: &str) -> Vec<Group<'a>> {
    let mut out: Vec<Group<'a>> = Vec::new();
    for run in results.runs.iter().filter(|r| r.scenario == scenario) {
        let kernel = run.kernel.as_str();
        for s in run.samples.iter().filter(|s| s.row == row) {
            let (case, tool) = (s.case.as_str(), s.tool.as_str());
            match out.iter_mut().find(|g| g.kernel == kernel && g.case == case && g.tool == tool) {
                Some(g) => g.values.push(s.value),
                None => out.push(Group { kernel, case, tool, unit: &s.unit, values: vec![s.value] }),
            }
        }
    }
    out
}

fn find<'a, 'b>(gs: &'b [Group<'a>], kernel: &str, case: &str, tool: &str) -> Option<&'b Group<'a>> {
    gs.iter().find(|g| g.kernel == kernel && g.case == case && g.tool == tool)
}

fn med(gs: &[Group], kernel: &str, case: &str, tool: &str) -> Option<f64> {
    find(gs, kernel, case, tool).map(Group::median)
}

fn kernels_of<'a>(gs: &[Group<'a>]) -> Vec<&'a str> {
    let mut k: Vec<&str> = gs.iter().map(|g| g.kernel).collect();
    k.dedup();
    k
}

fn num(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn ratio(v: f64, base: f64) -> String {
    if base > 0.0 { format!("{:.2}×", v / base) } else { "–".into() }
}

/// A table of every group of a row, with the ratio of each median to `baseline`'s in the same
/// kernel and case (`added` also prints the difference).
fn table(md: &mut String, gs: &[Group], baseline: &str, added: bool, iterations: impl Fn(&Group) -> String) {
    let _ = writeln!(
        md,
        "| kernel | case | tool | iterations | median | min – max | {}ratio to {baseline} |",
        if added { format!("added vs {baseline} | ") } else { String::new() }
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|{}---|", if added { "---|" } else { "" });
    for g in gs {
        let base = find(gs, g.kernel, g.case, baseline).map(Group::median);
        let (m, b) = (g.median(), base.unwrap_or(0.0));
        let add = if added {
            format!("{} | ", if base.is_some() { num(m - b) } else { "–".into() })
        } else {
            String::new()
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} {} | {} – {} | {add}{} |",
            g.kernel,
            g.case,
            g.tool,
            iterations(g),
            num(m),
            g.unit,
            num(g.min()),
            num(g.max()),
            ratio(m, b)
        );
    }
    md.push('\n');
}

pub fn markdown(results: &Benchmarks) -> String {
    let mut md = String::new();
    let runs = &results.runs;
    let crit = |id: &str| results.criterion.iter().flatten().find(|c| c.id == id).map(|c| c.ns_per_event);
    // A size of the scenario's first run (0 when there is none).
    let size = |scenario: Scenario, key: fn(&RunSizes) -> u64| {
        runs.iter().find(|r| r.scenario == scenario).map_or(0, |r| key(&r.sizes))
    };
    let mut kernels: Vec<&str> = runs.iter().map(|r| r.kernel.as_str()).collect();
    kernels.sort_unstable();
    kernels.dedup();
    let _ = writeln!(
        md,
        "# Benchmarks\n\nWritten by `cargo xtask bench` (host: {} cores). Each section names the command, commit \
         and date that measured it: `cargo xtask bench --only SECTION` measures one again and keeps the others \
         (sections: {}). Do not edit: rerun it. Machine-readable: `BENCHMARKS.json` (every sample).\n",
        results.host_cpus,
        Section::ALL.map(Section::name).join(", "),
    );
    md.push_str(
        "**Read this first.** Every VM figure comes from QEMU *software emulation* (TCG, 2 vCPUs, no \
         KVM) of Debian's kernels ",
    );
    let _ = write!(md, "({}) ", kernels.join(", "));
    md.push_str(
        "with the real `amdgpu.ko` (no GPU: CREATE_QUEUE fails with EINVAL after the handler ran, \
         SUSPEND/RESUME answer INVALID for each id), or with the KFD emulator module where queues must \
         exist (rows 5-7). Absolute times are many times slower than on real hardware; only the \
         ratios between tools measured in the same run carry over. Tools are interleaved: each gets \
         its own session (start, several loops, stop) in a fixed order, with an untraced session \
         between every two, so the baseline's min – max shows the drift over the run.\n\n",
    );

    // ---- row 1 ----
    md.push_str("## 1. Cost added to a traced KFD ioctl\n\n");
    stamp(&mut md, results, Section::Tracer, "rows 1-4, except the userspace pipeline table of row 2");
    md.push_str(
        "A tight loop of ioctls while each tool is attached: `kfd-client --count N create --gpu-id \
         0x1234` (CREATE_QUEUE) and `trace-debugger --cycles N` (DBG_TRAP SUSPEND_QUEUES + \
         RESUME_QUEUES on a forked, ptrace-seized KFD process; KFD ≥ 1.13 only). Tools: \
         `gpreempt trace --json > file` (all its probes attached); bpftrace with the same probes and \
         fields (`xtask/bench/kfd.bt`, `-B line > file`); the proof-of-concept's ftrace `function` and \
         `function_graph` tracers with `set_ftrace_filter` = `:mod:amdgpu`, `trace_pipe` copied to a \
         file; and the kprobe floor: empty eBPF programs on the same functions (`gpreempt trace \
         --empty-probes`), what any kprobe-based tracer pays before doing anything. Each sample is \
         one loop's ns per ioctl.\n\n",
    );
    let g1 = groups(results, Scenario::Amdgpu, "ioctl");
    table(&mut md, &g1, "untraced", true, |g| {
        let n = if g.case == "create_queue" {
            size(Scenario::Amdgpu, |s| s.create_ioctls)
        } else {
            size(Scenario::Amdgpu, |s| s.debug_ioctls)
        };
        format!("{} × {n}", g.values.len())
    });
    for g in g1.iter().filter(|g| g.tool == "gpreempt") {
        let added = |tool: &str| find(&g1, g.kernel, g.case, tool).map(Group::median);
        let (Some(base), Some(floor), Some(bt)) = (added("untraced"), added("kprobe-floor"), added("bpftrace")) else {
            continue;
        };
        let (ours, floor, bt) = (g.median() - base, floor - base, bt - base);
        let ft = added("ftrace-function").map_or(0.0, |f| f - base);
        let _ = writeln!(
            md,
            "- {} {}: gpreempt adds {} ns per ioctl, bpftrace {} ns, ftrace `function` {} ns; the empty \
             kprobe + kretprobe pair alone costs {} ns, so gpreempt's own work (stash, read, ring-buffer \
             record) is {} ns above that floor{}.",
            g.kernel,
            g.case,
            num(ours),
            num(bt),
            num(ft),
            num(floor),
            num(ours - floor),
            if ours <= bt { " and below bpftrace's" } else { " (bpftrace is cheaper here: see below)" }
        );
    }
    md.push('\n');
    md.push_str(
        "Events that reached the tool's output in those CREATE_QUEUE loops (a tool that loses events \
         during the loop also does less work in it):\n\n",
    );
    let g1d = groups(results, Scenario::Amdgpu, "ioctl_delivered");
    table(&mut md, &g1d, "bpftrace", false, |g| {
        format!("{} × {}", g.values.len(), size(Scenario::Amdgpu, |s| s.create_ioctls))
    });
    md.push_str(
        "The tools' own CPU time per CREATE_QUEUE ioctl in the same loops (user + system time of the \
         tool's process from /proc/PID/stat, all threads, measured until every event of the loop was in \
         its output; for ftrace, the `cat` copying `trace_pipe`). Under emulation the tool competes \
         with the loop for the two vCPUs, so this is part of the cost above.\n\n",
    );
    let g1cpu = groups(results, Scenario::Amdgpu, "tool_cpu");
    table(&mut md, &g1cpu, "bpftrace", false, |g| {
        format!("{} × {}", g.values.len(), size(Scenario::Amdgpu, |s| s.create_ioctls))
    });
    for k in kernels_of(&g1cpu) {
        let cpu = |t: &str| med(&g1cpu, k, "create_queue", t).unwrap_or(0.0);
        let share = |t: &str| med(&g1d, k, "create_queue", t).unwrap_or(0.0) / 100.0;
        let per_event = |t: &str| if share(t) > 0.0 { cpu(t) / share(t) } else { 0.0 };
        let _ = writeln!(
            md,
            "- {k}: per event it actually delivered, gpreempt's process spent {} ns of CPU and bpftrace's \
             {} ns ({} of bpftrace's); bpftrace's lower cost per ioctl in this table comes from the {:.0}% \
             of events it lost. ftrace `function` is cheaper per ioctl than either, but it records only \
             which amdgpu functions ran and when: no arguments, queue ids, gpu ids or results, which is \
             why the proof-of-concept needed debugfs dumps beside it. What gpreempt adds above the empty-probe \
             floor is, for the most part, its consumer formatting every event as JSON on the other vCPU \
             (row 2: {} of the pipeline's {} ns per event, natively, are JSON formatting).\n",
            num(per_event("gpreempt")),
            num(per_event("bpftrace")),
            ratio(per_event("gpreempt"), per_event("bpftrace")),
            100.0 * (1.0 - share("bpftrace")),
            num(crit("decode+map+jsonl").unwrap_or(0.0) - crit("decode+map").unwrap_or(0.0)),
            num(crit("decode+map+jsonl").unwrap_or(0.0)),
        );
    }

    // ---- row 2 ----
    md.push_str("## 2. Event delivery\n\n");
    md.push_str(
        "Two `kfd-client --rate R/2` generators (one per vCPU) issue paced CREATE_QUEUE ioctls for \
         a fixed time while the tool is attached; delivered = `queue_create` events in the tool's \
         output file. The rate doubles from 4,000/s until an event is lost or the generators cannot \
         keep the pace; then it is run once more at twice the best zero-loss rate.\n\n",
    );
    let g2 = groups(results, Scenario::Amdgpu, "delivery");
    table(&mut md, &g2, "bpftrace", false, |g| {
        format!("{} × {} s", g.values.len(), size(Scenario::Amdgpu, |s| s.rate_step_s))
    });
    for k in kernels_of(&g2) {
        let rate = |t: &str| med(&g2, k, "zero-loss rate", t).unwrap_or(0.0);
        let lost = |t: &str| med(&g2, k, "loss at 2x that rate", t).unwrap_or(0.0);
        let _ = writeln!(
            md,
            "- {k}: gpreempt delivered every event up to {} events/s, bpftrace up to {} ({}); at twice \
             its own rate gpreempt lost {} events and bpftrace {} (gpreempt counts each loss in its summary \
             as `ring buffer full`).",
            num(rate("gpreempt")),
            num(rate("bpftrace")),
            ratio(rate("gpreempt"), rate("bpftrace")),
            num(lost("gpreempt")),
            num(lost("bpftrace")),
        );
    }
    for run in runs {
        for n in run.notes.iter().filter(|n| n.contains("generator")) {
            let _ = writeln!(md, "- {} {n}.", run.kernel);
        }
    }
    md.push('\n');
    stamp(&mut md, results, Section::Pipeline, "the userspace pipeline table");
    md.push_str(
        "Userspace alone, on one host core (not emulated): `cargo bench -p gpreempt --bench pipeline` \
         (criterion) decodes ring-buffer records and applies them to the span tracker and the PID → queue \
         map, then also writes JSON Lines to a sink; records are a create/destroy churn of 64 processes.\n\n\
         | pipeline | events/s (median) | ns per event |\n|---|---|---|\n",
    );
    // One criterion result: its id, events per second and ns per event, formatted.
    let cells = |c: &Criterion| (c.id.clone(), num(c.events_per_second), num(c.ns_per_event));
    for c in results.criterion.iter().flatten() {
        let (id, per_second, ns) = cells(c);
        let _ = writeln!(md, "| {id} | {per_second} | {ns} |");
    }
    // What a partial run replaced (`criterion_rerun.previous`: files written before sections).
    let previous = results
        .pipeline_previous
        .as_ref()
        .or_else(|| results.criterion_rerun.as_ref().and_then(|r| r.previous.as_ref()));
    if let Some(previous) = previous {
        let _ = writeln!(md, "\nBefore this measurement, at commit {}, it was:", previous.commit);
        for c in &previous.criterion {
            let (id, per_second, ns) = cells(c);
            let _ = writeln!(md, "- {id}: {per_second} events/s, {ns} ns per event");
        }
    }
    if let (Some(map), Some(json)) = (crit("decode+map"), crit("decode+map+jsonl")) {
        let _ = writeln!(
            md,
            "\nWhat bounds the consumer: decoding and updating the model take {} ns per event, writing the \
             JSON Lines object {} ns more — formatting, not the ring buffer or the model, sets the \
             userspace rate.",
            num(map),
            num(json - map)
        );
    }
    md.push('\n');

    // ---- row 3 ----
    md.push_str("## 3. Start-up: command start to all probes attached\n\n");
    md.push_str(
        "gpreempt: until it prints `gpreempt: attached N probes` (after every program is loaded and \
         attached; it attaches all of its table, more functions than bpftrace's script). bpftrace: \
         until its `BEGIN` block has written `ready` (bpftrace runs BEGIN after attaching every probe).\n\n",
    );
    let g3 = groups(results, Scenario::Amdgpu, "startup");
    table(&mut md, &g3, "bpftrace", false, |g| format!("{} starts", g.values.len()));
    for k in kernels_of(&g3) {
        if let (Some(ours), Some(bt)) =
            (med(&g3, k, "all probes attached", "gpreempt"), med(&g3, k, "all probes attached", "bpftrace"))
        {
            let _ = writeln!(
                md,
                "- {k}: gpreempt is attached after {} s, bpftrace after {} s ({} of bpftrace's time). bpftrace \
                 parses every BTF and compiles its script with LLVM at each start; gpreempt loads a \
                 precompiled object and reads only the struct offsets it needs from BTF. One bpftrace start \
                 takes about a minute under emulation, so it is measured once per run; gpreempt's extra \
                 starts come at the end of the run.\n",
                num(ours / 1e3),
                num(bt / 1e3),
                ratio(ours, bt)
            );
        }
    }

    // ---- row 4 ----
    md.push_str("## 4. Resident memory after many events\n\n");
    let _ = writeln!(
        md,
        "Two generators, paced at the tool's zero-loss rate from row 2, issue {} CREATE_QUEUE ioctls in total; then \
         `VmRSS` and `VmHWM` of the tool's process are read from /proc.\n",
        size(Scenario::Amdgpu, |s| s.memory_events)
    );
    let g4 = groups(results, Scenario::Amdgpu, "memory");
    table(&mut md, &g4, "bpftrace", false, |g| format!("{} run", g.values.len()));
    for k in kernels_of(&g4) {
        if let (Some(ours), Some(bt)) = (med(&g4, k, "VmRSS", "gpreempt"), med(&g4, k, "VmRSS", "bpftrace")) {
            let _ = writeln!(
                md,
                "- {k}: gpreempt holds {} MiB resident, bpftrace {} MiB ({}). gpreempt's peak is the parsed \
                 BTF during load, handed back to the kernel (`malloc_trim`) once the programs are attached; \
                 what stays is mostly the mapped 4 MiB ring buffer, the tokio runtime and the model.\n",
                num(ours),
                num(bt),
                ratio(ours, bt)
            );
        }
    }

    // ---- row 5 ----
    md.push_str("## 5. Controller: userspace time per suspend/resume cycle beyond the two ioctls\n\n");
    stamp(&mut md, results, Section::Controller, "row 5");
    let _ = writeln!(
        md,
        "On the KFD emulator (a target with 2 real queues), {} cycles per run with no hold and no gap: \
         per cycle, the time from one SUSPEND_QUEUES return to the next, less the RESUME_QUEUES and the \
         next SUSPEND_QUEUES ioctl times. Baseline: `xtask/bench/dbg_pair.c`, which only issues the \
         ioctl pair, and its line-for-line Rust twin `xtask/bench/dbg_pair.rs` (standard library only), \
         which shows what the language alone costs here. `gpreempt preempt --hold 0ms --gap 0ms --quiet -o F` with `--no-trace` \
         (the same two ioctls per cycle, with its checks and records) and with its default in-process tracer. The row boots a guest \
         of its own with one vCPU (with two on the two-core host, QEMU's vCPU threads lose their core to host work for \
         milliseconds at a time, and those stalls set the p99 of whichever tool they hit) and every program runs from the \
         guest's tmpfs (from the 9p share, its pages would be read over virtio when first touched, some inside the measured \
         windows). Each sample is one run's p50 or p99.\n",
        size(Scenario::Emulator, |s| s.controller_cycles)
    );
    let g5 = groups(results, Scenario::Emulator, "controller");
    table(&mut md, &g5, "c-ioctl-pair", true, |g| format!("{} runs", g.values.len()));
    for k in kernels_of(&g5) {
        let p = |case: &str, t: &str| med(&g5, k, case, t).unwrap_or(0.0);
        let _ = writeln!(
            md,
            "- {k}: beyond the two ioctls, `gpreempt preempt --no-trace` spends p50 {} µs / p99 {} µs per \
             cycle, the C loop {} µs / {} µs, its Rust twin {} µs / {} µs. KFD accepts debug-trap calls only from the thread that \
             ptrace-seized the target, so that thread runs the whole loop. The controller has one cycle implementation: \
             SUSPEND_QUEUES, the hold, RESUME_QUEUES, the gap, where a hold or a gap is one ppoll (over the debug-event pipe, \
             the target's signals and Ctrl-C) only when it is non-zero; with both at 0, as here, a cycle waits for nothing, and \
             what this row measures between the ioctls is the cycle's own work: its checks, its clock reads and its record of \
             the iteration. With the tracer, a thread of its own drains the ring buffer every 10 ms and matches the spans to \
             iterations by time after the run; its windows are longer than the untraced ones although its probes run inside \
             the ioctls, a difference this row does not break down. Under software emulation every distinct page, call level \
             and field load between the two ioctls is expensive; the Rust twin, which checks nothing, measures the \
             language's own share. The p99 is about the 10th-longest window \
             of a run: a vCPU stall or a preemption that lands in a window makes it, and the longer a tool's windows, the \
             more of them such events hit.\n",
            num(p("userspace per cycle p50", "gpreempt-no-trace")),
            num(p("userspace per cycle p99", "gpreempt-no-trace")),
            num(p("userspace per cycle p50", "c-ioctl-pair")),
            num(p("userspace per cycle p99", "c-ioctl-pair")),
            num(p("userspace per cycle p50", "rust-ioctl-pair")),
            num(p("userspace per cycle p99", "rust-ioctl-pair")),
        );
    }

    // ---- row 6 ----
    md.push_str("## 6. On the emulator: preemption latency and the tracer's accuracy\n\n");
    stamp(&mut md, results, Section::Preemption, "row 6");
    let _ = writeln!(
        md,
        "`gpreempt preempt --iterations {} --hold 2ms --gap 2ms` against the emulator with its \
         emulated CWSR save delay (`preempt_delay_us`) set, on two queues of its first node, for \
         each of its profiles: gfx90a (mi210, the default: one XCC) and gfx942 (mi300x) in SPX (the \
         package as one node of 8 XCCs) and in CPX (partition 0 of 8, one XCC), the gfx942 queues \
         each with the whole save area libhsakmt allocates, which that profile checks at \
         CREATE_QUEUE. The SUSPEND_QUEUES ioctl as gpreempt times it (end-to-end) and the \
         `amdkfd_fence_wait_timeout` span the in-process tracer measures (the same eBPF programs as \
         `gpreempt trace`), against the delay the emulator was told to spend. What the profiles \
         differ in here is the save area per queue (the emulator rows: per XCC, `cwsr_size` plus the \
         debugger's 32 bytes per wave; per queue, that times the node's XCCs, page-aligned, \
         `kfd_queue_acquire_buffers` in 6.12); the emulated save takes the delay it is told \
         whatever the area's size, so the figures show the driver path's cost with each profile's \
         areas and nodes, not the time a real GPU takes to write them. Emulation-only figures: they \
         show gpreempt's added latency and the span's accuracy, not a GPU's.\n",
        size(Scenario::Emulator, |s| s.fence_iterations)
    );
    let g6 = groups(results, Scenario::Emulator, "emulated");
    table(&mut md, &g6, "emulator", false, |g| format!("{} run", g.values.len()));
    for k in kernels_of(&g6) {
        for g in g6.iter().filter(|g| g.kernel == k && g.tool == "emulator") {
            let Some(profile) = g.case.strip_suffix(": save area per queue") else { continue };
            let at = |what: &str| med(&g6, k, &format!("{profile}: {what}"), "emulator").unwrap_or(0.0);
            let _ = writeln!(
                md,
                "- {k}, {profile}: a save area of {} MiB per queue = {} MiB per XCC x {} XCC(s).",
                num(g.median()),
                num(at("save area per XCC")),
                num(at("XCCs")),
            );
        }
        for g in g6.iter().filter(|g| g.kernel == k && g.tool == "emulator") {
            let Some(case) = g.case.strip_suffix(": emulated CWSR delay") else { continue };
            let delay = g.median();
            let at = |what: &str| med(&g6, k, &format!("{case}: {what}"), "gpreempt").unwrap_or(0.0);
            let _ = writeln!(
                md,
                "- {k}, {case}: SUSPEND_QUEUES returned after p50 {} µs (the delay + {} µs of emulated \
                 driver, unmap and ioctl path); the tracer's fence-wait span read p50 {} µs, {} µs above the \
                 delay. The span is exactly what the driver spent in `amdkfd_fence_wait_timeout`; beyond the \
                 delay it holds the emulated CP thread's wake-up and the wait's own polling \
                 (`usleep_range(50, 100)`), both stretched by software emulation.",
                num(at("suspend ioctl p50")),
                num(at("suspend ioctl p50") - delay),
                num(at("fence-wait span p50")),
                num(at("fence-wait span p50") - delay),
            );
        }
    }
    md.push('\n');

    // ---- 7 ----
    md.push_str("## 7. Co-location: online latency and offline throughput, with and without `gpreempt schedule`\n\n");
    if let Some(doc) = &results.colocation {
        stamp(&mut md, results, Section::Colocation, "section 7");
        colocation_report::section(&mut md, doc);
    } else {
        md.push_str("Not measured yet: `cargo xtask bench --only colocation`.\n\n");
    }

    // ---- 8 ----
    md.push_str("## 8. Native reaction path of `gpreempt schedule`\n\n");
    if let Some(r) = &results.reaction {
        stamp(&mut md, results, Section::Reaction, "section 8");
        reaction(&mut md, r);
    } else {
        md.push_str("Not measured yet: `cargo xtask bench --only reaction`.\n\n");
    }

    // ---- 9 ----
    md.push_str("## 9. Native evaluation at hardware time scales\n\n");
    if let Some(doc) = &results.native {
        stamp(&mut md, results, Section::Native, "section 9");
        super::native::section(&mut md, doc);
    } else {
        md.push_str("Not measured yet: `cargo xtask bench --only native`.\n\n");
    }

    md.push_str(REAL_HARDWARE);
    md
}

/// The line naming who measured `section` (`what`: which part of the page it covers).
fn stamp(md: &mut String, results: &Benchmarks, section: Section, what: &str) {
    let p = provenance(results, section);
    let _ = writeln!(md, "*{what}: measured by `{}` at commit `{}` on {}.*\n", p.command, p.commit, p.date);
}

fn reaction(md: &mut String, r: &Reaction) {
    let us = |ns: f64| ns / 1e3;
    let _ = writeln!(
        md,
        "On the host, natively, no VM and no GPU: `cargo bench -p gpreempt --bench reaction` runs the real \
         scheduler (`gpreempt::schedule::Scheduler`: its reaction thread with the index read by `process_vm_readv`, \
         the per-GPU policy and the dispatch to the offline sessions) against an online \"process\" that is the \
         benchmark itself, with the debug-trap session replaced by one that stamps the moment SUSPEND_QUEUES would \
         be issued. A driver thread posts one dispatch (write index + 1) and the sample ends at the stamp; the \
         dispatch is then consumed, the policy resumes, and the next one is posted {} µs later. The reaction \
         thread busy-polls (`--busy-poll`; scheduling class granted: {}), so a sample is the detection (at most \
         one step) plus the step's work, with no sleep: on a real host with the default `--poll` add up to \
         one interval (200 µs) before the change is read, and the ioctl itself after.\n\n\
         | samples | p50 | p99 | max | min | mean loop step |\n|---|---|---|---|---|---|\n\
         | {} | {} µs | {} µs | {} µs | {} µs | {} µs |\n\n\
         The userspace part of the reaction is {} µs at the median and {} µs at p99; the maximum is the host's \
         CPU scheduler taking the core away, not the path.\n",
        r.gap_us,
        r.realtime.as_deref().unwrap_or("not recorded"),
        r.samples,
        num(us(r.p50_ns)),
        num(us(r.p99_ns)),
        num(us(r.max_ns)),
        num(us(r.min_ns)),
        num(us(r.loop_step_ns)),
        num(us(r.p50_ns)),
        num(us(r.p99_ns)),
    );
}

const REAL_HARDWARE: &str = "## What needs real hardware\n\n\
GPU-side numbers cannot come from any machine without an AMD GPU, emulated or not: the preemption \
(CWSR) latency of MI300-class hardware, the online service's P99 against running alone, and the \
offline job's throughput retained. On a ROCm host with Linux ≥ 6.5 (KFD ≥ 1.13), as root:\n\n\
```sh\n\
gpreempt doctor                                   # debug-trap API, probes, cwsr_enable, sched_policy\n\
gpreempt ps                                       # find the online and offline pids\n\
# preemption latency distribution (SUSPEND_QUEUES end to end, and the HWS fence wait inside it):\n\
gpreempt preempt --offline <OFFLINE_PID> --online <ONLINE_PID> --iterations 1000 \\\n\
    --hold 20ms --gap 50ms -o preempt.json\n\
# the same, seen from the driver for every process on the GPU, with Perfetto spans:\n\
gpreempt trace --perfetto trace.json --summary-json summary.json\n\
```\n\n\
Online P99 vs standalone and offline throughput retained: run the online service's own load \
generator twice — alone, then while `gpreempt preempt --offline <OFFLINE_PID> --hold H --gap G \
--iterations N` runs — and compare its P99; read the offline job's throughput (samples/s) in both \
runs.\n";

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn sample(row: &str, case: &str, tool: &str, value: f64) -> Value {
        json!({"row": row, "case": case, "tool": tool, "value": value, "unit": "ns/ioctl"})
    }

    /// A file as an older `cargo xtask bench` wrote it (one stamp for the whole run).
    fn results() -> Benchmarks {
        serde_json::from_value(json!({
            "command": "cargo xtask bench --quick", "commit": "abc1234", "date": "2026-11-21", "seconds": 250.0,
            "host_cpus": 2,
            "criterion": [{"id": "decode+map", "events_per_second": 2.5e6, "events_per_second_low": 2.4e6,
                           "ns_per_event": 400.0, "records_per_iteration": 1000.0}],
            "runs": [{
                "scenario": "amdgpu", "kernel": "6.12.117+deb12-amd64", "quick": true, "cpus": 2, "seconds": 200.0,
                "sizes": {"create_ioctls": 10000, "debug_ioctls": 4000, "sessions": 1, "loops": 2,
                          "rate_step_s": 1, "memory_events": 50000, "controller_runs": 2,
                          "controller_cycles": 300, "fence_iterations": 100},
                "notes": [],
                "samples": [
                    sample("ioctl", "create_queue", "untraced", 1000.0),
                    sample("ioctl", "create_queue", "untraced", 1200.0),
                    sample("ioctl", "create_queue", "untraced", 1100.0),
                    sample("ioctl", "create_queue", "gpreempt", 1500.0),
                    sample("ioctl", "create_queue", "gpreempt", 1700.0),
                    sample("ioctl", "create_queue", "bpftrace", 2100.0),
                    sample("ioctl", "create_queue", "kprobe-floor", 1400.0),
                    sample("ioctl", "create_queue", "ftrace-function", 5100.0),
                ],
            }],
        }))
        .expect("a complete file")
    }

    #[test]
    fn medians_ranges_and_ratios_come_from_the_samples() {
        let r = results();
        let g = groups(&r, Scenario::Amdgpu, "ioctl");
        assert_eq!(g.len(), 5);
        let untraced = find(&g, "6.12.117+deb12-amd64", "create_queue", "untraced").unwrap();
        assert_eq!((untraced.median(), untraced.min(), untraced.max()), (1100.0, 1000.0, 1200.0));
        // An even count takes the mean of the middle two.
        assert_eq!(find(&g, "6.12.117+deb12-amd64", "create_queue", "gpreempt").unwrap().median(), 1600.0);
    }

    #[test]
    fn the_ioctl_table_shows_the_added_cost_and_the_floor_verdict() {
        let md = markdown(&results());
        assert!(md.contains("| 6.12.117+deb12-amd64 | create_queue | gpreempt | 2 × 10000 | 1600 ns/ioctl | 1500 – 1700 | 500 | 1.45× |"), "{md}");
        assert!(md.contains("| 6.12.117+deb12-amd64 | create_queue | untraced | 3 × 10000 | 1100 ns/ioctl | 1000 – 1200 | 0 | 1.00× |"), "{md}");
        assert!(md.contains(
            "- 6.12.117+deb12-amd64 create_queue: gpreempt adds 500 ns per ioctl, bpftrace 1000 ns, ftrace `function` 4000 ns; \
             the empty kprobe + kretprobe pair alone costs 300 ns, so gpreempt's own work (stash, read, ring-buffer record) \
             is 200 ns above that floor and below bpftrace's."
        ), "{md}");
        assert!(md.contains("| decode+map | 2500000 | 400 |"), "{md}");
        assert!(md.contains("at commit `abc1234`"));
    }
}
