//! `gpreempt evaluate` end to end on the KFD emulator (one shared GPU, gpu 0x1000): an online
//! *service* (`emu-workload server`) that takes its requests from outside, the load command that
//! drives it (`emu-workload request`, which prints `requests=K dispatches=D p99_ms=…`), and a
//! training-like offline job (`emu-workload train`). The report is read from `--json`.
//!
//! Exact values: the dispatches the load command reports equal the online queue's write-index
//! movement, in each state and over the whole run (so a load command that drives nothing cannot
//! pass); the states run in the rotated order; the offline queue consumes nothing while held;
//! the scheduled states' in-process tracer counts the driver's suspends and resumes exactly as the
//! scheduler made them; nothing is left suspended or traced after. A metric that never matches is refused after the
//! first (co-located) state, before anything was held.

use std::{
    path::PathBuf,
    process::{Command, Output},
};

use gpreempt_tests::{
    LineHelper, binary,
    controller::rptr_now,
    schedule::{Elapsed, progresses},
    target::tracer_pid,
};
use serde_json::Value;

/// Requests per load run and dispatches per request.
const REQUESTS: u64 = 10;
const DISPATCHES: u64 = 2;

fn socket(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gpreempt-eval-{tag}-{}.sock", std::process::id()))
}

/// The service: one queue, 3 ms dispatches.
fn server(tag: &str) -> (LineHelper, PathBuf) {
    let path = socket(tag);
    let s = LineHelper::spawn(
        "emu-workload",
        &[
            "server",
            "--gpu-id",
            "0x1000",
            "--queues",
            "1",
            "--runtime-enable",
            "--dispatch-us",
            "3000",
            "--socket",
            path.to_str().unwrap(),
        ],
    )
    .unwrap();
    (s, path)
}

/// The training job: one queue kept busy with ~2 ms dispatches.
fn train() -> LineHelper {
    train_logging(None)
}

/// The training job, writing a progress line to `log` whenever dispatches completed.
fn train_logging(log: Option<&std::path::Path>) -> LineHelper {
    train_with(log, &[])
}

/// The training job, with `env` added to its environment (a launcher's rank variables).
fn train_with(log: Option<&std::path::Path>, env: &[(&str, &str)]) -> LineHelper {
    let mut args = vec!["train", "--gpu-ids", "0x1000", "--queues", "1", "--runtime-enable", "--dispatch-us", "2000"];
    if let Some(log) = log {
        args.extend(["--log", log.to_str().unwrap()]);
    }
    LineHelper::spawn_with_env("emu-workload", &args, env).unwrap()
}

/// (pid, address) of a helper's first queue's `field` index.
fn index(w: &LineHelper, field: &str) -> (u32, u64) {
    (w.pid(), w.hello["queues"][0][field].as_u64().unwrap())
}

fn load_command(path: &std::path::Path) -> String {
    format!(
        "{} request --socket {} --requests {REQUESTS} --dispatches {DISPATCHES}",
        binary("emu-workload").unwrap().display(),
        path.display()
    )
}

fn evaluate(args: &[&str]) -> Output {
    let out = Command::new(binary("gpreempt").unwrap()).arg("evaluate").args(args).output().unwrap();
    eprintln!("[evaluate] {}", String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn emu_evaluate_runs_every_state_in_rotated_order_and_the_load_matches_the_online_write_index() {
    let _t = Elapsed::start("emu_evaluate_runs_every_state_in_rotated_order");
    let (mut online, path) = server("rounds");
    let log = std::env::temp_dir().join(format!("gpreempt-eval-train-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    // Rank 1 of a two-rank job, as torchrun would start it: warned of, and otherwise evaluated
    // exactly as a job alone (the warning holds nothing back).
    let offline = train_with(Some(&log), &[("WORLD_SIZE", "2"), ("RANK", "1")]);
    let (online_pid, wptr) = index(&online, "wptr");
    let published_before = rptr_now(online_pid, wptr);
    let out = evaluate(&[
        "--online",
        &online_pid.to_string(),
        "--offline",
        &offline.pid().to_string(),
        "--load",
        &load_command(&path),
        "--metric",
        r"requests=requests=(\d+)",
        "--metric",
        r"dispatches=dispatches=(\d+)",
        "--metric",
        r"p99_ms=p99_ms=([0-9.]+)",
        "--offline-log",
        log.to_str().unwrap(),
        "--offline-metric",
        r"completed=completed (\d+) dispatches",
        "--rounds",
        "2",
        "--idle",
        "5ms",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // The rank is warned of once, before the first state (nothing held yet), with the default
    // --state-timeout (10 min); the warning is on stderr only, the JSON report has no field for it.
    let warning = format!(
        "gpreempt: warning: offline pid {} is rank 1 of a data-parallel job of 2 (WORLD_SIZE=2 in its environment): \
         holding it through online alone (up to --state-timeout, 600 s) stops its peers at their next collective, \
         and a hold longer than the job's collective timeout fails the job; keep --state-timeout below that \
         timeout, or evaluate with a job that runs on this node alone",
        offline.pid()
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.iter().filter(|l| **l == warning).count(), 1, "{stderr}");
    let first_state =
        lines.iter().position(|l| l.contains("round 1: co-located")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(lines.iter().position(|l| *l == warning).unwrap() < first_state, "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = report["runs"].as_array().unwrap();
    let order: Vec<(u64, &str)> =
        runs.iter().map(|r| (r["round"].as_u64().unwrap(), r["state"].as_str().unwrap())).collect();
    assert_eq!(
        order,
        [
            (1, "co_located"),
            (1, "online_alone"),
            (1, "scheduled"),
            (1, "offline_alone"),
            (2, "online_alone"),
            (2, "scheduled"),
            (2, "offline_alone"),
            (2, "co_located"),
        ]
    );
    // The job's own figure, from what its log got in each state: none while it was held, and in
    // every other state its completed count as last logged, which only grows.
    let mut completed_before = 0.0;
    for r in runs {
        if r["state"] == "online_alone" {
            assert!(r.get("offline_metrics").is_none(), "{r}");
            continue;
        }
        let completed = r["offline_metrics"]["completed"].as_f64().unwrap_or_else(|| panic!("{r}"));
        assert!(completed > completed_before, "{completed} after {completed_before}: {r}");
        completed_before = completed;
    }
    let mut reported = 0;
    for r in runs {
        let state = r["state"].as_str().unwrap();
        if state == "offline_alone" {
            // No load: the service published nothing, the training job ran.
            assert_eq!((r["load"].is_null(), r["online_dispatches"].as_u64()), (true, Some(0)), "{r}");
            assert!(r["offline_dispatches"].as_u64().unwrap() > 0, "{r}");
            continue;
        }
        assert_eq!(r["load"]["succeeded"], true, "{r}");
        assert_eq!(r["metrics"]["requests"].as_f64(), Some(REQUESTS as f64), "{r}");
        assert_eq!(r["metrics"]["dispatches"].as_f64(), Some((REQUESTS * DISPATCHES) as f64), "{r}");
        // What the load command says it drove is what the online queue's indices show.
        assert_eq!(r["online_dispatches"].as_u64(), Some(REQUESTS * DISPATCHES), "{r}");
        assert_eq!(r["online_consumed"].as_u64(), Some(REQUESTS * DISPATCHES), "{r}");
        assert!(r["metrics"]["p99_ms"].as_f64().unwrap() > 0.0, "{r}");
        reported += r["metrics"]["dispatches"].as_f64().unwrap() as u64;
        match state {
            "online_alone" => {
                // Held for the whole state: its one queue suspended, not one dispatch consumed.
                assert_eq!(
                    r["held"],
                    serde_json::json!({"processes": 1, "queues_suspended": 1, "queues_resumed": 1, "cpu_threads_ran": true}),
                    "{r}"
                );
                assert_eq!(r["offline_dispatches"].as_u64(), Some(0), "{r}");
            }
            "scheduled" => {
                let s = &r["schedule"];
                let suspends = s["suspends"].as_u64().unwrap();
                assert!(suspends >= 1, "{s}");
                assert_eq!(s["resumes"], s["suspends"], "{s}");
                assert_eq!(s["failed_suspends"], 0, "{s}");
                // The in-process tracer (evaluate's default) saw the driver run every suspend and
                // resume of the one offline process, each preempting the service's queue on the
                // same GPU too.
                let k = &s["kernel"];
                assert_eq!(
                    (k["suspend"]["count"].as_u64(), k["resume"]["count"].as_u64()),
                    (Some(suspends), Some(suspends)),
                    "{k}"
                );
                assert_eq!(k["suspend"]["collateral_online_queues"].as_u64(), Some(suspends), "{k}");
            }
            _ => assert!(r["offline_dispatches"].as_u64().unwrap() > 0, "{r}"),
        }
    }
    // Six load runs; the whole run's write-index movement is exactly what they reported.
    assert_eq!(reported, 6 * REQUESTS * DISPATCHES);
    assert_eq!(rptr_now(online_pid, wptr) - published_before, reported);
    let stats = online.cmd("stats").unwrap();
    assert_eq!((stats["requests"].as_u64(), stats["connections"].as_u64()), (Some(6 * REQUESTS), Some(6)));
    let summary = report["summary"].as_array().unwrap();
    let states: Vec<(&str, u64)> =
        summary.iter().map(|s| (s["state"].as_str().unwrap(), s["runs"].as_u64().unwrap())).collect();
    assert_eq!(states, [("co_located", 2), ("online_alone", 2), ("scheduled", 2), ("offline_alone", 2)]);
    // Online figures are compared with online alone: its own ratio is exactly 1.
    let alone = &summary[1]["figures"];
    let p99 = alone.as_array().unwrap().iter().find(|f| f["figure"] == "p99_ms").unwrap();
    assert_eq!(p99["ratio_to_alone"].as_f64(), Some(1.0), "{p99}");
    let offline_alone = summary[3]["figures"].as_array().unwrap();
    let completed = offline_alone.iter().find(|f| f["figure"] == "completed").unwrap();
    assert_eq!((completed["side"].as_str(), completed["ratio_to_alone"].as_f64()), (Some("offline"), Some(1.0)));
    assert_eq!(report["ended"]["how"], "completed");
    // Nothing left traced or suspended.
    assert_eq!(tracer_pid(offline.pid()).unwrap(), 0);
    assert_eq!(tracer_pid(online_pid).unwrap(), 0);
    let (pid, rptr) = index(&offline, "rptr");
    assert!(progresses(pid, rptr), "the training job's queue does not run after evaluate");
    let _ = std::fs::remove_file(&log);
}

#[test]
fn emu_evaluate_refuses_a_metric_that_never_matches_before_anything_is_held() {
    let _t = Elapsed::start("emu_evaluate_refuses_a_metric_that_never_matches");
    let (online, path) = server("metric");
    let offline = train();
    let (online_pid, wptr) = index(&online, "wptr");
    let published_before = rptr_now(online_pid, wptr);
    let out = evaluate(&[
        "--online",
        &online_pid.to_string(),
        "--offline",
        &offline.pid().to_string(),
        "--load",
        &load_command(&path),
        "--metric",
        r"p95=p95_ms=([0-9.]+)",
        "--no-trace",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--metric p95=p95_ms=([0-9.]+) never matched"), "{stderr}");
    assert!(stderr.contains("nothing was held"), "{stderr}");
    // Its last lines are shown, to fix the regex against.
    assert!(stderr.contains(&format!("requests={REQUESTS} dispatches={}", REQUESTS * DISPATCHES)), "{stderr}");
    assert!(out.stdout.is_empty(), "no report for a refused evaluation");
    // Exactly one load run (the co-located state): no online-alone state ran, so nothing was held.
    assert_eq!(rptr_now(online_pid, wptr) - published_before, REQUESTS * DISPATCHES);
    assert_eq!(tracer_pid(offline.pid()).unwrap(), 0);
    let (pid, rptr) = index(&offline, "rptr");
    assert!(progresses(pid, rptr));
}

#[test]
fn emu_evaluate_refuses_bad_input_naming_the_cause_and_the_fix() {
    let _t = Elapsed::start("emu_evaluate_refuses_bad_input");
    // A load command that is not there: a usage error, refused before the selectors are even looked at.
    let out = evaluate(&["--online", "1", "--offline", "2", "--load", "/nonexistent/loadgen --rps 5"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--load: \"/nonexistent/loadgen\" is not an executable file"), "{stderr}");
    let out = evaluate(&["--online", "1", "--offline", "2", "--load", "no-such-loadgen --rps 5"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("\"no-such-loadgen\" is not found in PATH"), "{stderr}");
    // A pid that does not exist.
    let out = evaluate(&["--online", "4194000", "--offline", "4193999", "--load", "true"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--online 4194000: no process with pid 4194000"), "{stderr}");
    // A metric that is not a NAME=REGEX: a usage error.
    let out = evaluate(&["--online", "1", "--offline", "2", "--load", "true", "--metric", "p99"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("write NAME=REGEX or NAME=json:PATH"), "{stderr}");
}

#[test]
fn emu_evaluate_ctrl_c_ends_the_held_state_releases_everything_and_prints_what_was_measured() {
    use std::{
        process::Stdio,
        sync::mpsc::RecvTimeoutError,
        time::{Duration, Instant},
    };

    use gpreempt_tests::{schedule::holds, target::eventually};
    use nix::{sys::signal, unistd::Pid};

    let _t = Elapsed::start("emu_evaluate_ctrl_c_ends_the_held_state");
    let (online, path) = server("ctrl-c");
    let offline = train();
    let (online_pid, wptr) = index(&online, "wptr");
    let published_before = rptr_now(online_pid, wptr);
    // The first run (co-located) is short; the second (online alone) would run for hours.
    let count = std::env::temp_dir().join(format!("gpreempt-eval-runs-{}", std::process::id()));
    let _ = std::fs::remove_file(&count);
    let exe = binary("emu-workload").unwrap();
    let load = format!(
        "n=$(cat {c} 2>/dev/null || echo 0); echo $((n + 1)) > {c}; if [ \"$n\" -ge 1 ]; then k=1000000; else \
         k={REQUESTS}; fi; exec {exe} request --socket {s} --requests $k --dispatches 1",
        c = count.display(),
        exe = exe.display(),
        s = path.display()
    );
    let mut child = Command::new(binary("gpreempt").unwrap())
        .args(["evaluate", "--online", &online.pid().to_string(), "--offline", &offline.pid().to_string()])
        .args(["--load", &load, "--metric", r"p99_ms=p99_ms=([0-9.]+)", "--rounds", "1", "--no-trace", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = gpreempt_tests::stderr_lines(child.stderr.take().unwrap(), "evaluate");
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) if l.contains("round 1: online alone") => break,
            Ok(_) => {}
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => panic!("online alone never started"),
        }
    }
    // Held: the training job's queue stops (the hold starts right after the line).
    let (pid, rptr) = index(&offline, "rptr");
    assert!(eventually(Duration::from_secs(60), || holds(pid, rptr)), "the offline queue was not held");
    // And the second load run has published: the state measured something before Ctrl-C.
    let published = || rptr_now(online_pid, wptr) - published_before;
    assert!(eventually(Duration::from_secs(60), || published() > REQUESTS), "the second load run published nothing");
    signal::kill(Pid::from_raw(child.id() as i32), signal::Signal::SIGINT).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ended"], serde_json::json!({"how": "interrupted", "signal": "SIGINT"}), "{report}");
    let runs = report["runs"].as_array().unwrap();
    let states: Vec<(&str, bool)> =
        runs.iter().map(|r| (r["state"].as_str().unwrap(), r["interrupted"].as_bool().unwrap())).collect();
    assert_eq!(states, [("co_located", false), ("online_alone", true)]);
    // What was measured until Ctrl-C is there, and the hold was released.
    assert_eq!(runs[1]["held"]["queues_resumed"], 1, "{}", runs[1]);
    assert_eq!(runs[1]["offline_dispatches"], 0, "{}", runs[1]);
    assert!(runs[1]["online_dispatches"].as_u64().unwrap() > 0, "{}", runs[1]);
    assert_eq!(runs[1]["load"]["ended"], "interrupted", "{}", runs[1]);
    assert_eq!(tracer_pid(pid).unwrap(), 0);
    assert!(progresses(pid, rptr), "the training job's queue does not run after Ctrl-C");
    let _ = std::fs::remove_file(&count);
}
