//! `cargo xtask test`: every layer, in order, with one closing line `N passed, M failed, K skipped`.
//!
//! 1. `cargo fmt --check`, `cargo clippy -D warnings` and `cargo xtask manifests` (one check each);
//! 2. `cargo test` — unit tests, no root;
//! 3. the integration tests of `tests/` as root inside one VM boot per kernel of the matrix: first
//!    with the real amdgpu driver for every test binary except `emu_*`, then, in the same boot,
//!    with amdgpu unloaded and the KFD emulator module (`tests/kfd-emu`) loaded for the `emu_*`
//!    binaries only.
//!
//! A layer that cannot run (build failure, VM that does not boot) counts as one failure and the
//! other layers still run, so the closing line always accounts for everything.
//!
//! # Skipped tests
//!
//! A test is *skipped* when it cannot run where it is (a file the kernel does not provide, a
//! kernel without the feature under test and nothing to assert instead). Such a test prints one
//! line `SKIPPED: <test>: <why>` on stdout and returns (`gpreempt_tests::skip!` does both; it
//! writes past libtest's output capture, so the line is visible). libtest counts it as passed;
//! this harness moves every such line from passed to skipped, and counts libtest's `ignored` as
//! skipped too. The closing line is `N passed, M failed, K skipped`: `N passed, M failed` first so
//! that anything reading the older line still finds it.
//!
//! Long tests (the agent's 10,000-process soak) are `#[ignore]`d, so a plain run counts them as
//! skipped; `--soak` runs them too (libtest's `--include-ignored`), usually with `--filter`.

use std::{
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::{
    binaries::build_binaries,
    image,
    kmod::{self, Module},
    manifests, setup,
    util::{cargo, describe, output, target_dir, workspace_root},
    vm::{self, Kernel, VmArgs},
};

#[derive(Args, Debug)]
pub struct TestArgs {
    /// Only these kernels (default: the whole matrix).
    #[arg(long = "kernel", value_enum)]
    pub kernels: Vec<Kernel>,
    /// Skip the VM layer (fmt, clippy and unit tests only).
    #[arg(long)]
    pub no_vm: bool,
    /// Only the VM layer (no fmt, clippy or unit tests): for iterating on one kernel.
    #[arg(long, conflicts_with = "no_vm")]
    pub vm_only: bool,
    /// Skip `cargo xtask setup`.
    #[arg(long)]
    pub no_setup: bool,
    /// Only run integration tests whose name contains this.
    #[arg(long)]
    pub filter: Option<String>,
    /// The full integration suite on every kernel (default: 5.10 and 6.1 run the focused set).
    #[arg(long)]
    pub full: bool,
    /// Also run the `#[ignore]`d long tests (the agent's 10,000-process soak); CI leaves them out.
    #[arg(long)]
    pub soak: bool,
    /// Record every kernel text patch in each boot (`target/vm/<kernel>/text_pokes.trace`;
    /// `cargo xtask text-pokes` summarises it; docs/toolchain.md "Kernel text patches").
    #[arg(long)]
    pub audit_text_pokes: bool,
}

/// What a skipped test prints (see the module doc; emitted by `gpreempt_tests::skip!`).
const SKIP_MARKER: &str = "SKIPPED: ";

#[derive(Default, Debug, PartialEq, Eq)]
struct Tally {
    passed: u64,
    failed: u64,
    skipped: u64,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.skipped += other.skipped;
    }

    fn check(ok: bool) -> Tally {
        Tally { passed: u64::from(ok), failed: u64::from(!ok), skipped: 0 }
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} passed, {} failed, {} skipped", self.passed, self.failed, self.skipped)
    }
}

/// Sum libtest's `test result: ok. 16 passed; 0 failed; 1 ignored; …` lines, then move the tests
/// that printed [`SKIP_MARKER`] from passed to skipped. The marker may follow libtest's
/// `test name ... ` on the same line (one test thread prints that before the test runs).
fn parse_libtest(text: &str) -> Tally {
    let mut tally = Tally::default();
    for line in text.lines().filter_map(|l| l.trim_start().strip_prefix("test result: ")) {
        for part in line.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else { continue };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => tally.passed += n,
                "failed" => tally.failed += n,
                "ignored" => tally.skipped += n,
                _ => {}
            }
        }
    }
    let marked = text.lines().filter(|l| l.contains(SKIP_MARKER)).count() as u64;
    let moved = marked.min(tally.passed);
    tally.passed -= moved;
    tally.skipped += moved;
    tally
}

/// Run `cmd`, stream its output, return (success, everything it printed).
fn run_streaming(cmd: &mut Command) -> Result<(bool, String)> {
    println!("xtask test: {}", describe(cmd));
    let mut child = cmd
        .current_dir(workspace_root())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot start {}", describe(cmd)))?;
    let mut text = String::new();
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("{line}");
            text.push_str(&line);
            text.push('\n');
        }
    }
    Ok((child.wait()?.success(), text))
}

fn stage(name: &str, tally: &mut Tally, f: impl FnOnce() -> Result<Tally>) {
    match f() {
        Ok(t) => {
            println!("xtask test: {name}: {t}");
            tally.add(t);
        }
        Err(e) => {
            println!("xtask test: {name}: could not run: {e:#}");
            tally.add(Tally { passed: 0, failed: 1, skipped: 0 });
        }
    }
}

/// The integration test executables of `gpreempt-tests` (built, not run).
fn integration_test_binaries() -> Result<Vec<PathBuf>> {
    // With the binaries' feature (binaries::build_binaries), so the `gpreempt` library they link is the
    // one already built, not a second build without it (fault injection acts only when a test sets
    // GPREEMPT_TEST_FAULT in the binary's environment).
    let json = output(cargo().args([
        "test",
        "--package",
        "gpreempt-tests",
        "--tests",
        "--no-run",
        // Compiler errors rendered to stderr (the log), not buried in the JSON read here.
        "--message-format=json-render-diagnostics",
        "--features",
        "gpreempt/fault-injection",
    ]))?;
    let mut binaries = Vec::new();
    for line in json.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let is_test_target = msg["target"]["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "test"));
        if let (true, Some(exe)) = (is_test_target, msg["executable"].as_str()) {
            binaries.push(PathBuf::from(exe));
        }
    }
    if binaries.is_empty() {
        bail!("no integration test binaries found in tests/");
    }
    Ok(binaries)
}

/// Test binaries of the emulator pass: `tests/tests/emu_*.rs` (cargo names them `emu_<name>-<hash>`).
fn is_emulator_test(exe: &Path) -> bool {
    exe.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("emu_"))
}

/// How much of the integration suite a kernel runs in `cargo xtask test`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every test binary of both passes.
    Full,
    /// [`FOCUSED`] only: what differs by kernel (tracer, doctor, the controller's refusal or
    /// acceptance, one scheduling test), so that four kernels fit CI's hour.
    Focused,
    /// Every real-driver test, the [`FOCUSED`] emulator tests: the newest kernel's own driver
    /// answers all of it (on 7.x most real-driver tests are skipped fast: KFD >= 1.19 opens no
    /// process without a GPU), while the emulator's full pass, ~20 minutes there, would only
    /// repeat on the same emulated KFD what 6.12 runs in full.
    DriverFull,
}

impl Scope {
    /// Whether a test binary runs in full (else only its [`FOCUSED`] tests, or not at all).
    fn runs_in_full(self, exe: &Path) -> bool {
        match self {
            Scope::Full => true,
            Scope::Focused => false,
            Scope::DriverFull => !is_emulator_test(exe),
        }
    }
}

/// The suite per kernel: the full suite on 6.12, the real-driver tests in full and the focused
/// emulator set on 7.x, the focused set on 5.10 and 6.1 (docs/toolchain.md, "CI time"). `--full`
/// runs the full suite everywhere.
pub fn scope(kernel: Kernel) -> Scope {
    match kernel {
        Kernel::V5_10 | Kernel::V6_1 => Scope::Focused,
        Kernel::V6_12 => Scope::Full,
        Kernel::V7 => Scope::DriverFull,
    }
}

/// The focused set: test binary (`tests/tests/<name>.rs`) → the tests of it that run; binaries
/// not listed do not run on a focused kernel.
const FOCUSED: &[(&str, &[&str])] = &[
    // The tracer: the probe table against this kernel, and one ioctl path with exact values.
    ("trace_paths", &["probe_table_attaches_what_this_kernel_has_and_says_why_not_the_rest"]),
    ("trace_queue_ioctls", &["create_queue_arguments_and_result_are_traced_exactly"]),
    ("trace_btf", &["the_running_kernels_btf_gives_every_offset"]),
    (
        "doctor",
        &["reports_the_kfd_version_and_debug_trap_of_this_kernel", "every_queue_probe_resolves_on_the_real_driver"],
    ),
    // The controller on the real driver: refused with the cause (no debug trap on 5.10 / 6.1).
    (
        "controller",
        &[
            "the_kernel_decides_between_the_debug_trap_and_a_clear_refusal",
            "a_debug_session_has_the_kernels_exact_answers",
        ],
    ),
    ("schedule", &["schedule_on_the_real_driver_attaches_with_the_debug_trap_and_is_refused_clearly_without_it"]),
    // The doorbell uprobe on this kernel's uprobes (needs no driver; < 2 s).
    (
        "doorbell",
        &[
            "stores_are_counted_exactly_and_one_hit_goes_out_per_arm",
            "a_library_unmapped_while_probed_and_mapped_again_is_probed_anew",
            "a_process_without_the_runtime_is_left_to_the_index_poll",
        ],
    ),
    // The arrival probe on this kernel's cgroup_skb hook, ring buffer and bpf_links (needs no
    // driver: an HTTP service with no GPU; a few seconds).
    (
        "arrival",
        &[
            "arrival_hits_once_per_credit_and_counts_requests_and_probes_exactly",
            "arrival_counts_a_request_larger_than_a_segment_once",
            "arrival_sizes_a_request_whose_body_follows_its_headers_by_its_content_length",
            "arrival_sees_nothing_on_a_port_it_does_not_watch_in_the_same_cgroup",
            "arrival_probe_dropped_leaves_no_program_attached_or_loaded",
            "arrival_probe_of_a_process_killed_with_sigkill_leaves_no_program_attached_or_loaded",
        ],
    ),
    // The emulator (a current KFD on this kernel, as amdgpu-dkms on 5.10): traced queues,
    // accepted suspends that stop progress, one scheduling test. Not the tests that assert the
    // driver's per-GPU span breakdown: without module BTF (5.10) the HWS calls carry no gpu id.
    ("emu_trace", &["successful_creates_and_destroys_are_traced_with_their_queue_ids"]),
    (
        "emu_module",
        &[
            "module_has_btf_topology_and_version",
            "suspend_stops_progress_within_the_preemption_delay_and_resume_restarts_it",
        ],
    ),
    // Secondary KFD contexts (7.x; the test skips elsewhere) and the extra primary /dev/kfd file
    // that is none (every kernel): a few seconds each.
    (
        "emu_preempt",
        &[
            "queues_lists_the_real_queues_with_every_field",
            "cycles_without_hold_or_gap_suspend_every_queue_and_pick_up_one_created_mid_run",
            "a_process_with_a_secondary_context_is_refused_naming_it_and_its_queues_have_their_own_ids",
            "a_process_with_an_extra_primary_kfd_file_is_preempted_normally",
        ],
    ),
    ("emu_schedule", &["emu_schedule_max_suspend_and_min_share_end_suspensions_of_a_request_that_never_ends"]),
    // Debian's ROCm 5.2 (and trixie's 6.1) on the emulated GPUs (a current KFD on an older kernel, as amdgpu-dkms
    // gives): what differs by kernel is the module's mmaps, events and page pinning, their release when a
    // process dies, ptrace and the debug trap. The emulated CP's packet handling (barriers, SDMA ops, packet
    // exceptions, a HIP program's streams) and ROCr's topology parse are the same on every kernel: 6.12 runs
    // them; the uprobes are the `doorbell` tests above on every kernel. A ROCm test takes 20-40 s of a TCG
    // guest: these 3, one per kernel-side concern, kept CI within its hour (the 6 before took 6 minutes over
    // the three focused kernels).
    (
        "emu_rocm",
        &[
            "rocms_open_memory_and_event_ioctls_have_the_kernels_answers",
            "a_rocm_hip_program_killed_with_its_sdma_queues_is_released_and_the_modules_unload",
            "gpreempt_preempt_suspends_rocm_6_1_mid_dispatch_and_every_dispatch_completes",
        ],
    ),
];

/// `doctor-0123abcd` → the focused tests of `doctor`, if it is in [`FOCUSED`].
fn focused_tests(exe: &Path) -> Option<&'static [&'static str]> {
    let name = exe.file_name()?.to_str()?;
    let stem = name.rsplit_once('-').map_or(name, |(stem, _)| stem);
    FOCUSED.iter().find(|(binary, _)| *binary == stem).map(|(_, tests)| *tests)
}

/// Starts the line the guest appends after each test binary: `xtask test: took NAME SECONDS s`.
const TOOK_MARKER: &str = "xtask test: took ";

/// One pass of a VM boot: which driver provides `/dev/kfd` and which test binaries run on it.
struct Pass<'a> {
    /// The stage name in the closing tally (`VM 6.12`, `VM 6.12 emulator`).
    name: String,
    /// Guest commands that load the driver; they run after the previous pass's tests.
    load: String,
    binaries: &'a [PathBuf],
    /// The pass's log in the guest's writable directory.
    log: &'static str,
}

/// Boot `kernel` once and run every pass in it, in order: the real amdgpu pass, then the emulator
/// pass after `modprobe -r amdgpu` and `insmod kfd_emu.ko` (amdgpu without a GPU holds no device,
/// so it unloads; one boot per kernel instead of two saves a TCG boot of 20-45 s and the test
/// binaries' first load over 9p). A pass whose driver did not load counts as one failure; a test
/// binary that crashed before its summary line too.
fn vm_boot(
    kernel: Kernel,
    focus: Scope,
    passes: &[Pass],
    filter: Option<&str>,
    soak: bool,
    audit: bool,
) -> Vec<(String, Result<Tally>)> {
    // An explicit --filter picks tests by name on every kernel.
    let focus = if filter.is_some() { Scope::Full } else { focus };
    let mut command = String::from("set -o pipefail; ");
    for (i, pass) in passes.iter().enumerate() {
        let rc = format!("\"$GPREEMPT_VM_OUT/pass{i}.rc\"");
        command.push_str(&format!("rc=0; if {{ {}; }}; then ", pass.load));
        for exe in pass.binaries {
            let selection = if focus.runs_in_full(exe) {
                filter.map(vm::shell_quote).unwrap_or_default()
            } else {
                match focused_tests(exe) {
                    Some(names) => format!("--exact {}", names.join(" ")),
                    None => continue,
                }
            };
            // Each binary's wall time goes into the log (`xtask test: took NAME N s`): what
            // CI's hour is spent on, binary by binary.
            let name = exe.file_name().and_then(|n| n.to_str()).unwrap_or("test");
            let stem = name.rsplit_once('-').map_or(name, |(stem, _)| stem);
            command.push_str(&format!(
                "t0=$(date +%s); {} --test-threads=1 {}{} 2>&1 | tee -a \"$GPREEMPT_VM_OUT/{log}\" || rc=1; \
                 echo \"{TOOK_MARKER}{stem} $(( $(date +%s) - t0 )) s\" >> \"$GPREEMPT_VM_OUT/{log}\"; ",
                exe.display(),
                if soak { "--include-ignored " } else { "" },
                selection,
                log = pass.log,
            ));
        }
        command
            .push_str(&format!("else echo 'xtask test: loading the driver failed' >&2; rc=97; fi; echo $rc > {rc}; "));
    }
    command.push_str("exit 0");
    let status = vm::run(&VmArgs {
        kernel,
        cpus: 2,
        timeout: 2700,
        memory: "2G".to_owned(),
        no_amdgpu: true,
        module: None,
        audit_text_pokes: audit,
        command: vec![command],
    });
    let out = vm::out_dir(kernel);
    passes
        .iter()
        .enumerate()
        .map(|(i, pass)| {
            let result = match &status {
                Err(e) => Err(anyhow::anyhow!("{e:#}")),
                Ok(_) => pass_tally(kernel, &out, i, pass),
            };
            (pass.name.clone(), result)
        })
        .collect()
}

fn pass_tally(kernel: Kernel, out: &Path, index: usize, pass: &Pass) -> Result<Tally> {
    let rc_file = out.join(format!("pass{index}.rc"));
    let rc: i32 = fs::read_to_string(&rc_file)
        .with_context(|| format!("the VM did not reach the end of this pass (no {})", rc_file.display()))?
        .trim()
        .parse()
        .with_context(|| format!("bad {}", rc_file.display()))?;
    if rc == 97 {
        bail!("the driver for this pass did not load (see the guest console above)");
    }
    let log = out.join(pass.log);
    let text = fs::read_to_string(&log).with_context(|| format!("the VM wrote no {}", log.display()))?;
    // The guest console is noisy; repeat why tests were skipped where the stage result is.
    for line in text.lines().filter_map(|l| l.find(SKIP_MARKER).map(|at| &l[at..])) {
        println!("xtask test: {}: {line}", kernel.name());
    }
    // The binaries that took longest, as one line.
    let mut took: Vec<(&str, u64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix(TOOK_MARKER)?.strip_suffix(" s")?.rsplit_once(' '))
        .filter_map(|(stem, secs)| Some((stem, secs.parse().ok()?)))
        .collect();
    took.sort_by_key(|t| std::cmp::Reverse(t.1));
    if !took.is_empty() {
        let slowest: Vec<String> = took.iter().take(8).map(|(stem, secs)| format!("{stem} {secs} s")).collect();
        println!("xtask test: {}: slowest binaries: {}", pass.name, slowest.join(", "));
    }
    let mut tally = parse_libtest(&text);
    // A test binary that crashed before its summary line still has to count.
    if rc != 0 && tally.failed == 0 {
        tally.failed = 1;
    }
    Ok(tally)
}

/// The build contexts the container tests (`tests/tests/emu_containers.rs`, `emu_k8s`) build
/// their images from in the VM: `target/vm-images/<binary>`, assembled as `cargo xtask image`
/// does (a second or two: the debug binaries without their debug sections, and four shared
/// objects); and the rendered manifests `emu_k8s` starts the DaemonSet's pod from.
fn vm_images(debug: &Path) -> Result<()> {
    for binary in ["gpreempt", "emu-workload"] {
        image::assemble(&[debug.join(binary)], &target_dir().join("vm-images").join(binary))?;
    }
    // And deploy/kubernetes rendered as `cargo xtask manifests` renders it (`kubectl kustomize`):
    // tests/tests/emu_k8s/daemonset.rs starts the DaemonSet's pod from it, and the guest has no
    // kubectl on its PATH. Without kubectl that test reports itself skipped.
    let out = target_dir().join("vm-images/manifests");
    let _ = std::fs::remove_dir_all(&out);
    match manifests::kubectl() {
        Ok(kubectl) => {
            manifests::render(&kubectl, &manifests::root(), &out)?;
        }
        Err(e) => eprintln!("xtask test: deploy/kubernetes not rendered for the VM: {e:#}"),
    }
    Ok(())
}

/// fmt, clippy and the unit tests: one stage each.
fn checks(tally: &mut Tally) {
    stage("fmt", tally, || Ok(Tally::check(run_streaming(cargo().args(["fmt", "--all", "--check"]))?.0)));
    stage("clippy", tally, || {
        let (ok, _) = run_streaming(cargo().args([
            "clippy",
            "--package",
            "gpreempt-common",
            "--package",
            "gpreempt",
            "--package",
            "xtask",
            "--package",
            "gpreempt-tests",
            "--package",
            "harness",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]))?;
        Ok(Tally::check(ok))
    });
    // Seconds: two Python processes' worth of rendering and schema checks, no build.
    stage("manifests", tally, || Ok(Tally::check(manifests::check()?)));
    stage("unit tests", tally, || {
        let (ok, text) = run_streaming(cargo().args([
            "test",
            "--workspace",
            "--exclude",
            "gpreempt-ebpf",
            "--exclude",
            "gpreempt-tests",
            // As the VM layer's binaries are built (binaries::build_binaries), so the session's fault
            // injection is unit-tested too.
            "--features",
            "gpreempt/fault-injection",
        ]))?;
        let mut t = parse_libtest(&text);
        if !ok && t.failed == 0 {
            t.failed = 1;
        }
        Ok(t)
    });
}

/// What a run from an empty target directory writes there (debug and release builds, the VM
/// layer's kernels and images, the emulator module per kernel): a target directory after many full
/// runs held 25 GiB, 7 of them stale incremental caches, so about 20 GiB. A machine with less free
/// is warned first, so that a linker killed mid-build is understood.
const CLEAN_RUN_BYTES: u64 = 20 << 30;

pub fn run(args: &TestArgs) -> Result<()> {
    crate::util::check_free_space(&target_dir(), CLEAN_RUN_BYTES)?;
    if !args.no_setup {
        setup::run()?;
    }
    let mut tally = Tally::default();
    if !args.vm_only {
        checks(&mut tally);
    }
    if !args.no_vm {
        let kernels = if args.kernels.is_empty() { Kernel::ALL.to_vec() } else { args.kernels.clone() };
        match build_binaries().and_then(|debug| vm_images(&debug)).and_then(|()| integration_test_binaries()) {
            Ok(binaries) => {
                let (emulator, amdgpu): (Vec<PathBuf>, Vec<PathBuf>) =
                    binaries.into_iter().partition(|exe| is_emulator_test(exe));
                for kernel in kernels {
                    let passes = match kmod::build(Module::KfdEmu, kernel) {
                        Ok(ko) => vec![
                            Pass {
                                name: format!("VM {}", kernel.name()),
                                load: "modprobe amdgpu".to_owned(),
                                binaries: &amdgpu,
                                log: "tests.log",
                            },
                            Pass {
                                name: format!("VM {} emulator", kernel.name()),
                                load: format!(
                                    "modprobe -r amdgpu && insmod {}",
                                    vm::shell_quote(&ko.display().to_string())
                                ),
                                binaries: &emulator,
                                log: "emu-tests.log",
                            },
                        ],
                        Err(e) => {
                            stage(&format!("VM {}", kernel.name()), &mut tally, || Err(e));
                            continue;
                        }
                    };
                    let focus = if args.full { Scope::Full } else { scope(kernel) };
                    println!("xtask test: VM {}: {focus:?} suite", kernel.name());
                    let mut this_kernel = Tally::default();
                    let started = std::time::Instant::now();
                    for (name, result) in
                        vm_boot(kernel, focus, &passes, args.filter.as_deref(), args.soak, args.audit_text_pokes)
                    {
                        stage(&name, &mut this_kernel, || result);
                    }
                    // One line per kernel: both passes of its boot, and how long the boot took
                    // (what CI's hour is spent on).
                    println!(
                        "xtask test: kernel {} ({focus:?} suite, {} s): {this_kernel}",
                        kernel.name(),
                        started.elapsed().as_secs()
                    );
                    tally.add(this_kernel);
                }
            }
            Err(e) => stage("VM build", &mut tally, || Err(e)),
        }
    }
    println!("{tally}");
    if tally.failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtest_summaries_are_summed() {
        let text = "running 3 tests\ntest result: ok. 16 passed; 0 failed; 0 ignored; 0 measured\n\
                    test result: FAILED. 2 passed; 1 failed; 0 ignored\n  test result: ok. 0 passed; 0 failed;\n";
        assert_eq!(parse_libtest(text), Tally { passed: 18, failed: 1, skipped: 0 });
        assert_eq!(parse_libtest("nothing here"), Tally::default());
    }

    #[test]
    fn ignored_and_marked_tests_are_skipped_not_passed() {
        // One test thread: the marker follows libtest's `test … ... ` on the same line.
        let text = "running 3 tests\n\
                    test btf::real ... SKIPPED: trace_btf::real: no /sys/kernel/btf/amdgpu\nok\n\
                    test a ... ok\ntest b ... ignored\n\
                    test result: ok. 2 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out\n";
        assert_eq!(parse_libtest(text), Tally { passed: 1, failed: 0, skipped: 2 });
        // Several test threads: the marker on a line of its own.
        let text = "SKIPPED: x: why\ntest result: ok. 1 passed; 0 failed; 0 ignored\n";
        assert_eq!(parse_libtest(text), Tally { passed: 0, failed: 0, skipped: 1 });
        assert_eq!(
            Tally { passed: 3, failed: 1, skipped: 2 }.to_string(),
            "3 passed, 1 failed, 2 skipped",
            "`N passed, M failed` stays a prefix of the closing line"
        );
    }

    #[test]
    fn focused_kernels_run_the_listed_tests_of_the_listed_binaries() {
        assert_eq!(scope(Kernel::V5_10), Scope::Focused);
        assert_eq!(scope(Kernel::V6_1), Scope::Focused);
        assert_eq!(scope(Kernel::V6_12), Scope::Full);
        assert_eq!(scope(Kernel::V7), Scope::DriverFull);
        let (driver, emulator) = (Path::new("/t/doctor-0123abcd"), Path::new("/t/emu_rocm-0123abcd"));
        assert!(Scope::DriverFull.runs_in_full(driver) && !Scope::DriverFull.runs_in_full(emulator));
        assert!(Scope::Full.runs_in_full(emulator) && !Scope::Focused.runs_in_full(driver));
        assert_eq!(
            focused_tests(Path::new("/t/debug/deps/schedule-0123abcd")),
            Some(&["schedule_on_the_real_driver_attaches_with_the_debug_trap_and_is_refused_clearly_without_it"][..])
        );
        assert_eq!(focused_tests(Path::new("/t/debug/deps/emu_agent-0123abcd")), None);
        // Every focused binary exists and every focused test is a test of it.
        for (binary, tests) in FOCUSED {
            // `tests/tests/<name>.rs`, or `<name>/main.rs` for a binary split into modules (its
            // tests stay declared in main.rs).
            let dir = workspace_root().join("tests/tests");
            let file = dir.join(format!("{binary}.rs"));
            let source = if file.exists() { file } else { dir.join(binary).join("main.rs") };
            let text = fs::read_to_string(&source).unwrap_or_else(|e| panic!("{}: {e}", source.display()));
            for test in *tests {
                assert!(text.contains(&format!("fn {test}()")), "{binary} has no test {test}");
            }
        }
    }

    #[test]
    fn emulator_binaries_are_the_emu_prefixed_ones() {
        assert!(is_emulator_test(Path::new("/t/debug/deps/emu_module-0123abcd")));
        assert!(!is_emulator_test(Path::new("/t/debug/deps/trace_queue_ioctls-0123abcd")));
        assert!(!is_emulator_test(Path::new("/t/debug/deps/ps-emu_module")));
    }
}
