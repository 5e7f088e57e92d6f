//! `cargo xtask bench`: gpreempt against bpftrace, ftrace and a minimal C program, in one run,
//! inside VMs (real amdgpu; the KFD emulator where queues must exist), written to BENCHMARKS.md
//! and BENCHMARKS.json at the workspace root.
//!
//! The host builds everything (release), boots one VM per scenario and runs `xtask bench-guest`
//! there (`guest.rs`), then groups the samples and writes the tables (`report.rs`).

pub mod guest;
mod report;

use std::{fs, path::PathBuf, process::Command, time::Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};

use crate::{
    kmod, setup,
    util::{self, cargo, target_dir, workspace_root},
    vm::{self, Kernel},
};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Fewer repetitions and smaller loops, 6.12 only: finishes in under 5 minutes once built.
    #[arg(long)]
    pub quick: bool,
    /// Kernels for the real-driver rows (repeatable); default 6.1 and 6.12 (`--quick`: 6.12).
    #[arg(long, value_enum)]
    pub kernel: Vec<Kernel>,
    /// Skip `cargo xtask setup`.
    #[arg(long)]
    pub no_setup: bool,
    /// Only the userspace criterion benchmark (no VM).
    #[arg(long)]
    pub no_vm: bool,
    /// Rewrite BENCHMARKS.md from BENCHMARKS.json without measuring anything.
    #[arg(long)]
    pub report_only: bool,
    /// Re-measure only the criterion pipeline row and splice it into BENCHMARKS.json (the VM rows
    /// keep their commit); the numbers it replaces stay in the report as "before".
    #[arg(long)]
    pub criterion_only: bool,
    /// Measure only row 5 (the controller's userspace time per cycle against the C program, on
    /// the emulator, newest kernel of the selection) and print it; BENCHMARKS.* are left as they are.
    #[arg(long)]
    pub controller_only: bool,
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let started = Instant::now();
    let root = workspace_root();
    if args.report_only {
        let path = root.join("BENCHMARKS.json");
        let text =
            fs::read(&path).with_context(|| format!("reading {} (run `cargo xtask bench` first)", path.display()))?;
        fs::write(root.join("BENCHMARKS.md"), report::markdown(&serde_json::from_slice(&text)?))?;
        eprintln!("xtask bench: rewrote BENCHMARKS.md from BENCHMARKS.json");
        return Ok(());
    }
    if args.criterion_only {
        return criterion_only(&root, args.quick);
    }
    if !args.no_setup {
        setup::run()?;
    }
    let kernels = match (args.kernel.is_empty(), args.quick) {
        (false, _) => args.kernel.clone(),
        (true, true) => vec![Kernel::V6_12],
        (true, false) => Kernel::MATRIX.to_vec(),
    };
    eprintln!("xtask bench: building release binaries");
    util::run(cargo().args(["build", "--release", "--package", "gpreempt", "--package", "gpreempt-tests", "--bins"]))?;
    let bench_dir = target_dir().join("bench");
    fs::create_dir_all(&bench_dir)?;
    let dbg_pair = bench_dir.join("dbg-pair");
    util::run(
        Command::new("gcc")
            .args(["-O2", "-Wall", "-o"])
            .arg(&dbg_pair)
            .arg(workspace_root().join("xtask/bench/dbg_pair.c")),
    )?;

    if args.controller_only {
        return controller_only(&dbg_pair, kernels.last().copied().unwrap_or(Kernel::V6_12), args.quick);
    }
    let criterion = criterion(args.quick)?;
    let mut runs = Vec::new();
    if !args.no_vm {
        let mut scenarios: Vec<(Kernel, guest::Scenario)> =
            kernels.iter().map(|&k| (k, guest::Scenario::Amdgpu)).collect();
        // The emulator runs on the newest kernel of the selection (its module builds for both).
        let newest = if kernels.contains(&Kernel::V6_12) || kernels.is_empty() { Kernel::V6_12 } else { kernels[0] };
        scenarios.push((newest, guest::Scenario::Emulator));
        for (kernel, scenario) in scenarios {
            let out = vm::out_dir(kernel).join("bench.json");
            let text = guest(kernel, scenario, &dbg_pair, &out, args.quick, &[])?;
            let doc: Value = serde_json::from_slice(&text)?;
            fs::write(bench_dir.join(format!("{}-{scenario:?}.json", kernel.name()).to_lowercase()), &text)?;
            runs.push(doc);
        }
    }
    let commit = util::output(Command::new("git").args(["rev-parse", "--short", "HEAD"])).unwrap_or_default();
    let results = json!({
        "command": if args.quick { "cargo xtask bench --quick" } else { "cargo xtask bench" },
        "commit": commit.trim(),
        "date": util::output(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"])).unwrap_or_default().trim(),
        "host_cpus": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "seconds": started.elapsed().as_secs_f64(),
        "criterion": criterion,
        "runs": runs,
    });
    fs::write(root.join("BENCHMARKS.json"), serde_json::to_vec_pretty(&results)?)?;
    fs::write(root.join("BENCHMARKS.md"), report::markdown(&results))?;
    eprintln!("xtask bench: wrote BENCHMARKS.md and BENCHMARKS.json in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Boot `kernel` and run `xtask bench-guest` for `scenario` there; the JSON it wrote to `out`.
fn guest(
    kernel: Kernel,
    scenario: guest::Scenario,
    dbg_pair: &std::path::Path,
    out: &std::path::Path,
    quick: bool,
    extra: &[&str],
) -> Result<Vec<u8>> {
    let release = target_dir().join("release");
    let xtask = std::env::current_exe().context("locating the xtask binary")?;
    let mut command = vec![
        xtask.display().to_string(),
        "bench-guest".into(),
        "--scenario".into(),
        format!("{scenario:?}").to_lowercase(),
        "--bin".into(),
        release.display().to_string(),
        "--dbg-pair".into(),
        dbg_pair.display().to_string(),
        "--out".into(),
        out.display().to_string(),
    ];
    if quick {
        command.push("--quick".into());
    }
    command.extend(extra.iter().map(|s| s.to_string()));
    let status = vm::run(&vm::VmArgs {
        kernel,
        timeout: 3600,
        memory: "4G".into(),
        no_amdgpu: false,
        module: (scenario == guest::Scenario::Emulator).then_some(kmod::Module::KfdEmu),
        command,
    })?;
    if status != 0 {
        bail!("the {} {scenario:?} benchmark failed in the VM (status {status})", kernel.name());
    }
    fs::read(out).with_context(|| format!("the VM wrote no {}", out.display()))
}

/// `--controller-only`: row 5 alone, printed as the median over runs of each run's p50 and p99.
fn controller_only(dbg_pair: &std::path::Path, kernel: Kernel, quick: bool) -> Result<()> {
    let out = vm::out_dir(kernel).join("bench-controller.json");
    let text = guest(kernel, guest::Scenario::Emulator, dbg_pair, &out, quick, &["--controller-only"])?;
    let doc: Value = serde_json::from_slice(&text)?;
    let commit = util::output(Command::new("git").args(["rev-parse", "--short", "HEAD"])).unwrap_or_default();
    println!(
        "row 5 on {} at {}: userspace per cycle beyond the two ioctls, median of the runs",
        doc["kernel"],
        commit.trim()
    );
    for tool in ["c-ioctl-pair", "gpreempt-no-trace", "gpreempt"] {
        let mut line = format!("  {tool:<18}");
        for p in ["p50", "p99"] {
            let mut v: Vec<f64> = doc["samples"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|s| s["tool"] == tool && s["case"] == format!("userspace per cycle {p}"))
                .filter_map(|s| s["value"].as_f64())
                .collect();
            v.sort_by(f64::total_cmp);
            let median = v.get(v.len() / 2).copied().unwrap_or(f64::NAN);
            line.push_str(&format!("  {p} {median:>9.2} us (runs: {v:.2?})"));
        }
        println!("{line}");
    }
    Ok(())
}

/// `--criterion-only`: measure the pipeline row again at this commit and keep the rest.
fn criterion_only(root: &std::path::Path, quick: bool) -> Result<()> {
    let path = root.join("BENCHMARKS.json");
    let text =
        fs::read(&path).with_context(|| format!("reading {} (run `cargo xtask bench` first)", path.display()))?;
    let mut results: Value = serde_json::from_slice(&text)?;
    let commit = util::output(Command::new("git").args(["rev-parse", "--short", "HEAD"])).unwrap_or_default();
    let fresh = criterion(quick)?;
    let previous = json!({
        "commit": results["criterion_rerun"]["commit"].as_str().or(results["commit"].as_str()).unwrap_or("?"),
        "criterion": results["criterion"].take(),
    });
    results["criterion"] = fresh;
    results["criterion_rerun"] = json!({
        "commit": commit.trim(),
        "command": "cargo xtask bench --criterion-only",
        "date": util::output(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"])).unwrap_or_default().trim(),
        "previous": previous,
    });
    fs::write(&path, serde_json::to_vec_pretty(&results)?)?;
    fs::write(root.join("BENCHMARKS.md"), report::markdown(&results))?;
    eprintln!("xtask bench: re-measured the pipeline row; rewrote BENCHMARKS.md and BENCHMARKS.json");
    Ok(())
}

/// Row 2's userspace half: `cargo bench --bench pipeline`, read back from criterion's estimates.
fn criterion(quick: bool) -> Result<Value> {
    let mut cmd = cargo();
    cmd.args(["bench", "--package", "gpreempt", "--bench", "pipeline", "--", "--noplot"]);
    if quick {
        cmd.args(["--warm-up-time", "1", "--measurement-time", "3"]);
    }
    util::run(&mut cmd)?;
    let mut out = Vec::new();
    for id in ["decode+map", "decode+map+jsonl"] {
        let dir: PathBuf = target_dir().join("criterion/pipeline").join(id).join("new");
        let read = |name: &str| -> Result<Value> {
            let path = dir.join(name);
            Ok(serde_json::from_slice(&fs::read(&path).with_context(|| format!("reading {}", path.display()))?)?)
        };
        let (estimates, benchmark) = (read("estimates.json")?, read("benchmark.json")?);
        let elements = benchmark["throughput"]["Elements"].as_f64().context("no element throughput")?;
        let ns = |k: &str, f: &str| estimates[k][f].as_f64().unwrap_or(0.0);
        let per_second = |t: f64| if t > 0.0 { elements * 1e9 / t } else { 0.0 };
        out.push(json!({
            "id": id,
            "records_per_iteration": elements,
            "events_per_second": per_second(ns("median", "point_estimate")),
            // The slower end of criterion's 95% interval for the median.
            "events_per_second_low": per_second(estimates["median"]["confidence_interval"]["upper_bound"].as_f64().unwrap_or(0.0)),
            "ns_per_event": ns("median", "point_estimate") / elements,
        }));
    }
    Ok(Value::Array(out))
}
