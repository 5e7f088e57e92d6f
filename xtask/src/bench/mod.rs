//! `cargo xtask bench`: gpreempt against bpftrace, ftrace and a minimal C program, in one run,
//! inside VMs (real amdgpu; the KFD emulator where queues must exist), written to BENCHMARKS.md
//! and BENCHMARKS.json at the workspace root.
//!
//! The host builds everything (release), boots one VM per scenario and runs `xtask bench-guest`
//! there ([`guest_main`]: `guest.rs` for rows 1-6, `colocation.rs` for section 7), reads back what
//! it measured (`results.rs`, the types both sides share), then groups the samples and writes the
//! tables (`report.rs`; section 7 from `colocation_report.rs`).
//!
//! Module dependencies point one way: `guest` and `colocation` use `guest_env` (the guest's
//! arguments and /proc and emulator reads), `results` and `stats`; neither uses the other, and
//! only this module dispatches between them. `report` uses `colocation_report`, which uses
//! `colocation`'s scenario facts (rate, GPUs, sweep sizes); `clock_check` runs `colocation`'s
//! timer floor.

pub mod clock_check;
mod colocation;
mod colocation_report;
mod guest;
mod guest_env;
mod native;
mod report;
mod results;
// The evaluation states' one definition, which names the native section's states. It lives in the
// gpreempt library, which xtask does not depend on (aya in every xtask build); the file needs only
// std and serde, so it is compiled here as it stands. Not every item of it is used here.
#[allow(dead_code, reason = "the gpreempt library's file, compiled whole")]
#[path = "../../../gpreempt/src/evaluate/state.rs"]
mod state;
mod stats;

use std::{fmt::Write as _, fs, path::PathBuf, process::Command, time::Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use self::guest_env::GuestArgs;
use self::{
    guest_env::RUST_PAIR,
    results::{Benchmarks, Criterion, PipelinePrevious, Reaction, Run, Sample, Scenario, Stamp},
};

use crate::{
    kmod, setup,
    util::{self, cargo, target_dir, workspace_root},
    vm::{self, Kernel},
};

/// A part of BENCHMARKS.md that is measured, stored and rendered on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum Section {
    /// Rows 1-4: the tracers on the real amdgpu driver (one VM per kernel).
    Tracer,
    /// Row 2's userspace pipeline (criterion, on the host).
    Pipeline,
    /// Row 5: the controller's userspace time per cycle (emulator VM).
    Controller,
    /// Row 6: preemption latency and the tracer's fence-wait span (emulator VM).
    Preemption,
    /// Section 7: online/offline co-location with and without `gpreempt schedule` (emulator VM).
    Colocation,
    /// Section 8: the native reaction path of `gpreempt schedule` (on the host).
    Reaction,
    /// Section 9: the native evaluation at hardware time scales (`harness suite`, on the host).
    Native,
}

impl Section {
    pub const ALL: [Section; 7] = [
        Section::Tracer,
        Section::Pipeline,
        Section::Controller,
        Section::Preemption,
        Section::Colocation,
        Section::Reaction,
        Section::Native,
    ];

    /// The key in BENCHMARKS.json's `sections` and the `--only` value.
    pub fn name(self) -> &'static str {
        match self {
            Section::Tracer => "tracer",
            Section::Pipeline => "pipeline",
            Section::Controller => "controller",
            Section::Preemption => "preemption",
            Section::Colocation => "colocation",
            Section::Reaction => "reaction",
            Section::Native => "native",
        }
    }

    /// Whether measuring it boots a VM.
    fn needs_vm(self) -> bool {
        !matches!(self, Section::Pipeline | Section::Reaction | Section::Native)
    }
}

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
    /// Measure only these sections (comma-separated or repeated) and keep the others of
    /// BENCHMARKS.json; BENCHMARKS.md is rendered again from the whole file.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Section>,
    /// Only the sections measured on the host (pipeline, reaction): `--only pipeline,reaction`.
    #[arg(long)]
    pub no_vm: bool,
    /// Rewrite BENCHMARKS.md from BENCHMARKS.json without measuring anything.
    #[arg(long)]
    pub report_only: bool,
    /// `--only pipeline` (kept for scripts that use it).
    #[arg(long)]
    pub criterion_only: bool,
    /// `--only controller` (kept for scripts that use it); also prints row 5.
    #[arg(long)]
    pub controller_only: bool,
}

impl BenchArgs {
    /// The sections this run measures, in order; all of them unless narrowed.
    fn sections(&self) -> Vec<Section> {
        let mut s = self.only.clone();
        if self.criterion_only {
            s.push(Section::Pipeline);
        }
        if self.controller_only {
            s.push(Section::Controller);
        }
        if self.no_vm {
            s.extend([Section::Pipeline, Section::Reaction]);
        }
        if s.is_empty() {
            s = Section::ALL.to_vec();
        }
        s.sort_unstable();
        s.dedup();
        s
    }

    /// The command line that measured a section, as the report shows it.
    fn command(&self, sections: &[Section]) -> String {
        let mut c = String::from("cargo xtask bench");
        if self.quick {
            c.push_str(" --quick");
        }
        if sections.len() < Section::ALL.len() {
            let names: Vec<&str> = sections.iter().map(|s| s.name()).collect();
            let _ = write!(c, " --only {}", names.join(","));
        }
        for k in &self.kernel {
            let _ = write!(c, " --kernel {}", k.name());
        }
        c
    }
}

/// `xtask bench-guest`, inside the VM: the scenario's guest half.
pub fn guest_main(args: &GuestArgs) -> Result<()> {
    match args.scenario {
        Scenario::Amdgpu | Scenario::Emulator => guest::run(args),
        Scenario::Colocation => colocation::guest(args),
    }
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let started = Instant::now();
    let root = workspace_root();
    let path = root.join("BENCHMARKS.json");
    if args.report_only {
        let text =
            fs::read(&path).with_context(|| format!("reading {} (run `cargo xtask bench` first)", path.display()))?;
        let results: Benchmarks =
            serde_json::from_slice(&text).with_context(|| format!("parsing {}", path.display()))?;
        fs::write(root.join("BENCHMARKS.md"), report::markdown(&results))?;
        eprintln!("xtask bench: rewrote BENCHMARKS.md from BENCHMARKS.json");
        return Ok(());
    }
    let sections = args.sections();
    let full = sections.len() == Section::ALL.len();
    // A partial run keeps every other section as it was measured.
    let mut results: Benchmarks = match fs::read(&path) {
        Ok(text) if !full => {
            let mut value: Value =
                serde_json::from_slice(&text).with_context(|| format!("parsing {}", path.display()))?;
            // Section 7 is measured again whole, so its stored results are dropped unread: a
            // file written before its format changed still keeps every other section.
            if sections.contains(&Section::Colocation)
                && let Some(doc) = value.as_object_mut()
            {
                doc.remove("colocation");
            }
            serde_json::from_value(value).with_context(|| format!("parsing {}", path.display()))?
        }
        _ => Benchmarks::default(),
    };
    let kernels = match (args.kernel.is_empty(), args.quick) {
        (false, _) => args.kernel.clone(),
        (true, true) => vec![Kernel::V6_12],
        (true, false) => Kernel::MATRIX.to_vec(),
    };
    // The emulator runs on the newest kernel of the selection (its module builds for both).
    let newest = if kernels.contains(&Kernel::V6_12) { Kernel::V6_12 } else { kernels[0] };
    let vm = sections.iter().any(|s| s.needs_vm());
    if vm && !args.no_setup {
        setup::run()?;
    }
    // Taken before anything is built: the binaries measured are the tree as it is now, and a
    // commit made while the run lasts (others work in the same checkout) must not be stamped.
    // `-dirty` when tracked files differ from the commit: the binaries measured were built from
    // the working tree, and the stamp should not claim a commit they were not.
    let commit =
        util::output(Command::new("git").args(["describe", "--always", "--dirty", "--abbrev=7"])).unwrap_or_default();
    let bench_dir = target_dir().join("bench");
    fs::create_dir_all(&bench_dir)?;
    let dbg_pair = bench_dir.join("dbg-pair");
    if vm {
        eprintln!("xtask bench: building release binaries");
        util::run(cargo().args([
            "build",
            "--release",
            "--package",
            "gpreempt",
            "--package",
            "gpreempt-tests",
            "--bins",
        ]))?;
        util::run(
            Command::new("gcc")
                .args(["-O2", "-Wall", "-o"])
                .arg(&dbg_pair)
                .arg(workspace_root().join("xtask/bench/dbg_pair.c")),
        )?;
        // Its Rust twin, next to it (the guest finds it by that name).
        util::run(
            Command::new("rustc")
                .args(["-C", "opt-level=3", "--edition", "2021", "-o"])
                .arg(dbg_pair.with_file_name(RUST_PAIR))
                .arg(workspace_root().join("xtask/bench/dbg_pair.rs")),
        )?;
    }
    let mut measured = Vec::new();
    for &section in &sections {
        let t = Instant::now();
        match section {
            Section::Tracer => {
                let mut runs = Vec::new();
                for &kernel in &kernels {
                    runs.push(guest_results(kernel, Scenario::Amdgpu, &dbg_pair, args.quick, &[], 2)?);
                }
                replace_runs(&mut results, Scenario::Amdgpu, runs);
            }
            Section::Pipeline => {
                let commit = provenance(&results, Section::Pipeline).commit;
                let previous = results.criterion.take();
                results.criterion = Some(criterion(args.quick)?);
                results.pipeline_previous = None;
                results.criterion_rerun = None;
                // A partial run shows the numbers it replaced.
                if !full {
                    results.pipeline_previous = previous.map(|criterion| PipelinePrevious { commit, criterion });
                }
            }
            Section::Controller => {
                // Row 5 boots alone, with one vCPU: with two on this two-core host, QEMU's vCPU
                // threads lose their core to host work for milliseconds at a time, and those
                // stalls, landing in some tools' windows and not others', set the p99.
                let run = guest_results(newest, Scenario::Emulator, &dbg_pair, args.quick, &["--controller-only"], 1)?;
                splice_emulator(&mut results, run, &["controller"]);
                print_controller(&results);
            }
            Section::Preemption => {
                let run = guest_results(newest, Scenario::Emulator, &dbg_pair, args.quick, &["--no-controller"], 2)?;
                splice_emulator(&mut results, run, &["emulated"]);
            }
            Section::Colocation => {
                let previous = previous_gpreempt()?.display().to_string();
                let extra = ["--previous-gpreempt", &previous, "--previous-commit", PREVIOUS_COMMIT];
                let before = host_loadavg();
                let host_floor = colocation::timer_floor()?;
                let mut doc: results::Colocation =
                    guest_results(newest, Scenario::Colocation, &dbg_pair, args.quick, &extra, 2)?;
                doc.host_loadavg = before.zip(host_loadavg()).map(|(a, b)| [a, b]);
                doc.host_timer_floor = Some(host_floor);
                results.colocation = Some(doc);
            }
            Section::Reaction => results.reaction = Some(reaction(args.quick)?),
            Section::Native => results.native = Some(native::run(args.quick)?),
        }
        measured.push((section, t.elapsed().as_secs_f64()));
    }

    let date = util::output(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"])).unwrap_or_default();
    let command = args.command(&sections);
    for (section, seconds) in measured {
        let stamp = Stamp {
            command: command.clone(),
            commit: commit.trim().into(),
            date: date.trim().into(),
            seconds: Some(seconds),
        };
        results.sections.insert(section.name().into(), stamp);
    }
    results.host_cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    fs::write(&path, serde_json::to_vec_pretty(&results)?)?;
    fs::write(root.join("BENCHMARKS.md"), report::markdown(&results))?;
    let names: Vec<&str> = sections.iter().map(|s| s.name()).collect();
    eprintln!(
        "xtask bench: measured {} and wrote BENCHMARKS.md and BENCHMARKS.json in {:.0} s",
        names.join(", "),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The host's 1-minute load average (`None` if /proc/loadavg cannot be read).
fn host_loadavg() -> Option<f64> {
    fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// The last commit before the per-GPU scheduler rework (issue 23): its `gpreempt` is section 7's
/// "previous global policy".
pub const PREVIOUS_COMMIT: &str = "8918a2c";

/// The previous global policy's `gpreempt` (release), built once from [`PREVIOUS_COMMIT`] in a git
/// worktree under `target/prev-sched/src` into a target directory of its own, and reused while it
/// exists (the commit never changes, so neither does the binary).
fn previous_gpreempt() -> Result<PathBuf> {
    let dir = target_dir().join("prev-sched");
    let (src, target) = (dir.join("src"), dir.join("target"));
    let bin = target.join("release").join("gpreempt");
    if bin.exists() {
        return Ok(bin);
    }
    let root = workspace_root();
    if !src.join("Cargo.toml").exists() {
        eprintln!("xtask bench: a git worktree of {PREVIOUS_COMMIT} in {} for the previous scheduler", src.display());
        // A worktree directory deleted by hand (`cargo clean`) is still registered until pruned.
        util::run(Command::new("git").arg("-C").arg(&root).args(["worktree", "prune"]))?;
        util::run(
            Command::new("git")
                .arg("-C")
                .arg(&root)
                .args(["worktree", "add", "--detach"])
                .arg(&src)
                .arg(PREVIOUS_COMMIT),
        )?;
    }
    let head = util::output(Command::new("git").arg("-C").arg(&src).args(["rev-parse", "HEAD"]))?;
    if !head.trim().starts_with(PREVIOUS_COMMIT) {
        bail!(
            "{} is at {} instead of {PREVIOUS_COMMIT}: remove it (`git worktree remove`) and run again",
            src.display(),
            head.trim()
        );
    }
    eprintln!("xtask bench: building the previous scheduler ({PREVIOUS_COMMIT}) once, into {}", target.display());
    // util::run runs in the workspace root: the manifest path names the worktree's workspace.
    util::run(
        cargo()
            .env("CARGO_TARGET_DIR", &target)
            .args(["build", "--release", "--package", "gpreempt", "--manifest-path"])
            .arg(src.join("Cargo.toml")),
    )?;
    Ok(bin)
}

/// Who measured `section`: its own stamp, else (a file written before sections were stamped)
/// the whole file's, or the pipeline's re-run; what is not known reads "cargo xtask bench" and "?".
pub fn provenance(results: &Benchmarks, section: Section) -> Stamp {
    if let Some(own) = results.sections.get(section.name()) {
        return own.clone();
    }
    if section == Section::Pipeline
        && let Some(rerun) = &results.criterion_rerun
    {
        return Stamp {
            command: rerun.command.clone(),
            commit: rerun.commit.clone(),
            date: rerun.date.clone(),
            seconds: None,
        };
    }
    Stamp {
        command: results.command.clone().unwrap_or_else(|| "cargo xtask bench".into()),
        commit: results.commit.clone().unwrap_or_else(|| "?".into()),
        date: results.date.clone().unwrap_or_else(|| "?".into()),
        seconds: None,
    }
}

/// Replace the runs of `scenario` with `runs`, keeping the others.
fn replace_runs(results: &mut Benchmarks, scenario: Scenario, runs: Vec<Run>) {
    results.runs.retain(|r| r.scenario != scenario);
    results.runs.extend(runs);
}

/// Put `rows`' samples of a fresh emulator run in place of the stored ones (the run's other rows
/// keep theirs); with no stored emulator run the fresh one is stored whole.
fn splice_emulator(results: &mut Benchmarks, fresh: Run, rows: &[&str]) {
    let Some(stored) = results.runs.iter_mut().find(|r| r.scenario == Scenario::Emulator) else {
        replace_runs(results, Scenario::Emulator, vec![fresh]);
        return;
    };
    let is_row = |s: &Sample| rows.contains(&s.row.as_str());
    stored.samples.retain(|s| !is_row(s));
    stored.samples.extend(fresh.samples.into_iter().filter(is_row));
    stored.kernel = fresh.kernel;
    stored.sizes = fresh.sizes;
    // Notes name their row first ("controller row: …"); the other rows keep theirs.
    let mine = |n: &String| rows.iter().any(|r| n.starts_with(&format!("{r} row")));
    stored.notes.retain(|n| !mine(n));
    stored.notes.extend(fresh.notes);
}

/// Boot `kernel`, run the guest half of `scenario`, keep a copy of its JSON under target/bench;
/// what it measured (a [`Run`] or a [`results::Colocation`]).
fn guest_results<T: DeserializeOwned>(
    kernel: Kernel,
    scenario: Scenario,
    dbg_pair: &std::path::Path,
    quick: bool,
    extra: &[&str],
    cpus: u32,
) -> Result<T> {
    let name = format!("{}-{scenario:?}", kernel.name()).to_lowercase();
    let out = vm::out_dir(kernel).join(format!("bench-{name}.json"));
    let text = boot_guest(kernel, scenario, dbg_pair, &out, quick, extra, cpus)?;
    let copy = target_dir().join("bench").join(format!("{name}.json"));
    fs::write(&copy, &text)?;
    serde_json::from_slice(&text).with_context(|| {
        format!("reading the results of the {} {scenario:?} guest ({})", kernel.name(), copy.display())
    })
}

/// Boot `kernel` and run `xtask bench-guest` for `scenario` there; the JSON it wrote to `out`.
fn boot_guest(
    kernel: Kernel,
    scenario: Scenario,
    dbg_pair: &std::path::Path,
    out: &std::path::Path,
    quick: bool,
    extra: &[&str],
    cpus: u32,
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
    command.extend(extra.iter().map(std::string::ToString::to_string));
    let status = vm::run(&vm::VmArgs {
        kernel,
        timeout: 3600,
        memory: "4G".into(),
        cpus,
        no_amdgpu: false,
        module: (scenario != Scenario::Amdgpu).then_some(kmod::Module::KfdEmu),
        audit_text_pokes: false,
        command,
    })?;
    if status != 0 {
        bail!("the {} {scenario:?} benchmark failed in the VM (status {status})", kernel.name());
    }
    fs::read(out).with_context(|| format!("the VM wrote no {}", out.display()))
}

/// Row 5 as stored, printed as the median over runs of each run's p50 and p99.
fn print_controller(results: &Benchmarks) {
    let Some(doc) = results.runs.iter().find(|r| r.scenario == Scenario::Emulator) else {
        return;
    };
    println!("row 5 on {}: userspace per cycle beyond the two ioctls, median of the runs", doc.kernel);
    for tool in ["c-ioctl-pair", "rust-ioctl-pair", "gpreempt-no-trace", "gpreempt"] {
        let mut line = format!("  {tool:<18}");
        for p in ["p50", "p99"] {
            let case = format!("userspace per cycle {p}");
            let mut v: Vec<f64> =
                doc.samples.iter().filter(|s| s.tool == tool && s.case == case).map(|s| s.value).collect();
            v.sort_by(f64::total_cmp);
            let median = v.get(v.len() / 2).copied().unwrap_or(f64::NAN);
            line.push_str(&format!("  {p} {median:>9.2} us (runs: {v:.2?})"));
        }
        println!("{line}");
    }
}

/// Section 8: `cargo bench --bench reaction` (a paced loop on the host), its JSON line.
fn reaction(quick: bool) -> Result<Reaction> {
    let mut cmd = cargo();
    cmd.args(["bench", "--package", "gpreempt", "--bench", "reaction", "--"]);
    if quick {
        cmd.arg("--quick");
    }
    let text = util::output(&mut cmd)?;
    let line = text.lines().rev().find(|l| l.starts_with('{')).context("the reaction bench printed no JSON")?;
    serde_json::from_str(line).with_context(|| format!("reading the reaction bench's JSON line {line}"))
}

/// Row 2's userspace half: `cargo bench --bench pipeline`, read back from criterion's estimates.
fn criterion(quick: bool) -> Result<Vec<Criterion>> {
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
        out.push(Criterion {
            id: id.into(),
            records_per_iteration: elements,
            events_per_second: per_second(ns("median", "point_estimate")),
            // The slower end of criterion's 95% interval for the median.
            events_per_second_low: per_second(
                estimates["median"]["confidence_interval"]["upper_bound"].as_f64().unwrap_or(0.0),
            ),
            ns_per_event: ns("median", "point_estimate") / elements,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn args(line: &[&str]) -> BenchArgs {
        Cli::parse_from([&["bench"], line].concat()).bench
    }

    #[test]
    fn only_and_its_aliases_select_sections_and_nothing_selects_all() {
        assert_eq!(args(&[]).sections(), Section::ALL.to_vec());
        assert_eq!(args(&["--only", "colocation"]).sections(), vec![Section::Colocation]);
        assert_eq!(args(&["--only", "reaction,tracer"]).sections(), vec![Section::Tracer, Section::Reaction]);
        assert_eq!(args(&["--controller-only"]).sections(), vec![Section::Controller]);
        assert_eq!(args(&["--criterion-only", "--only", "pipeline"]).sections(), vec![Section::Pipeline]);
        assert_eq!(args(&["--no-vm"]).sections(), vec![Section::Pipeline, Section::Reaction]);
        let a = args(&["--quick", "--only", "colocation", "--kernel", "6.12"]);
        assert_eq!(a.command(&a.sections()), "cargo xtask bench --quick --only colocation --kernel 6.12");
        assert_eq!(args(&[]).command(&Section::ALL), "cargo xtask bench");
    }

    fn sample(row: &str, value: f64) -> Sample {
        Sample { row: row.into(), case: "c".into(), tool: "t".into(), value, unit: "us".into() }
    }

    fn run(scenario: Scenario, kernel: &str, samples: Vec<Sample>, notes: &[&str]) -> Run {
        Run {
            scenario,
            kernel: kernel.into(),
            quick: false,
            cpus: 1,
            seconds: 1.0,
            notes: notes.iter().map(std::string::ToString::to_string).collect(),
            sizes: results::RunSizes {
                sessions: 1,
                loops: 1,
                create_ioctls: 1,
                debug_ioctls: 2,
                rate_step_s: 1,
                memory_events: 1,
                controller_runs: 1,
                controller_cycles: 1,
                fence_iterations: 1,
            },
            samples,
        }
    }

    #[test]
    fn a_spliced_row_replaces_only_its_samples_and_sections_keep_their_stamp() {
        let mut results = Benchmarks {
            command: Some("cargo xtask bench".into()),
            commit: Some("aaa".into()),
            date: Some("d0".into()),
            runs: vec![
                run(Scenario::Amdgpu, "k", vec![sample("ioctl", 1.0)], &[]),
                run(
                    Scenario::Emulator,
                    "k",
                    vec![sample("controller", 1.0), sample("emulated", 2.0)],
                    &["controller row: old", "emulated row: kept"],
                ),
            ],
            ..Benchmarks::default()
        };
        results.sections.insert(
            "controller".into(),
            Stamp {
                command: "cargo xtask bench --only controller".into(),
                commit: "bbb".into(),
                date: "d1".into(),
                seconds: None,
            },
        );
        let fresh = run(Scenario::Emulator, "k2", vec![sample("controller", 5.0)], &["controller row: new"]);
        splice_emulator(&mut results, fresh, &["controller"]);
        let emu = &results.runs[1];
        assert_eq!(emu.kernel, "k2");
        assert_eq!(emu.samples, vec![sample("emulated", 2.0), sample("controller", 5.0)]);
        assert_eq!(emu.notes, ["emulated row: kept", "controller row: new"]);
        assert_eq!(results.runs[0].samples, vec![sample("ioctl", 1.0)]);
        assert_eq!(provenance(&results, Section::Controller).commit, "bbb");
        // Not stamped yet: the whole file's stamp.
        assert_eq!(provenance(&results, Section::Preemption).commit, "aaa");
        // Nothing known: placeholders.
        let empty = Benchmarks::default();
        assert_eq!(provenance(&empty, Section::Tracer).command, "cargo xtask bench");
        assert_eq!(provenance(&empty, Section::Tracer).commit, "?");
    }

    #[test]
    fn with_no_stored_emulator_run_the_fresh_one_is_stored_whole() {
        let mut results = Benchmarks::default();
        let fresh = run(Scenario::Emulator, "k", vec![sample("controller", 5.0), sample("emulated", 1.0)], &[]);
        splice_emulator(&mut results, fresh.clone(), &["controller"]);
        assert_eq!(results.runs, vec![fresh]);
    }
}
