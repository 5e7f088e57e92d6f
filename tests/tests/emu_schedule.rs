//! `gpreempt schedule` end to end on the KFD emulator (one shared GPU, gpu 0x1000): an online
//! workload with periodic requests and an offline one that saturates the GPU, timed by the
//! completion records the emulated CP writes (CLOCK_MONOTONIC). The scheduler's `--json` stream
//! is read live. Assertions are on counts and orders; where time enters, it is bounded
//! generously and judged over every request, never one sample.

use std::{
    io::Write,
    os::unix::net::UnixStream,
    path::PathBuf,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use gpreempt_tests::{
    LineHelper, binary,
    schedule::{Elapsed, LONG, Privilege, Schedule, holds, progresses, refused, summary},
    target::tracer_pid,
};
use nix::sys::signal::Signal;
use serde_json::Value;

/// The first queue of `w` (pid, read-index address).
fn first_queue(w: &LineHelper) -> (u32, u64) {
    (w.pid(), w.hello["queues"][0]["rptr"].as_u64().unwrap())
}

/// `w`'s first queue runs (its read index moves within 2 s).
fn runs(w: &LineHelper) -> bool {
    let (pid, address) = first_queue(w);
    progresses(pid, address)
}

/// `w`'s first queue is held (its read index stays put for 300 ms).
fn held(w: &LineHelper) -> bool {
    let (pid, address) = first_queue(w);
    holds(pid, address)
}

fn offline_run() -> LineHelper {
    LineHelper::spawn("emu-workload", &["run", "--gpu-id", "0x1000", "--queues", "1", "--runtime-enable"]).unwrap()
}

/// An online process with one empty queue: work only when a test submits it.
fn online_idle() -> LineHelper {
    LineHelper::spawn(
        "emu-workload",
        &["run", "--gpu-id", "0x1000", "--queues", "1", "--runtime-enable", "--fill-us", "0"],
    )
    .unwrap()
}

fn sock_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gpreempt-hints-{tag}-{}.sock", std::process::id()))
}

#[test]
fn emu_schedule_suspends_the_offline_work_during_each_online_request_and_lets_it_run_between() {
    let _t = Elapsed::start("emu_schedule_suspends_the_offline_work_during_each_online_request");
    const REQUESTS: usize = 20;
    let mut offline = LineHelper::spawn(
        "emu-workload",
        &["offline", "--gpu-id", "0x1000", "--runtime-enable", "--dispatch-us", "2000", "--records"],
    )
    .unwrap();
    let mut online =
        LineHelper::spawn("emu-workload", &gpreempt_tests::emu_workload::online_server(&REQUESTS.to_string())).unwrap();
    let mut s = Schedule::between(online.pid(), &offline.pid().to_string(), &["--idle", "5ms", "--interval", "200ms"]);
    let attached = s.wait_events("offline_attached", 1, LONG);
    assert_eq!(attached[0]["queues"], 1);
    let added = s.events("online_added");
    assert_eq!((added[0]["queues"].as_u64(), added[0]["snapshot"].as_bool()), (Some(1), Some(true)));
    online.send("go").unwrap();
    let mut requests = Vec::new();
    for _ in 0..REQUESTS {
        requests.push(online.recv().unwrap());
    }
    assert_eq!(online.recv().unwrap()["event"], "summary");
    // Let the last resume happen, then stop the scheduler and the offline job.
    thread::sleep(Duration::from_millis(300));
    let (lines, _) = s.stop();
    offline.send("stop").unwrap();
    let off = offline.recv().unwrap();
    assert_eq!(off["event"], "summary");
    let records = off["records"].as_array().unwrap();
    let sum = summary(&lines);
    let suspends = sum["suspends"].as_u64().unwrap() as usize;
    // At most one suspend per request (plus one for a burst split by a stalled vCPU).
    assert!((1..=REQUESTS + 1).contains(&suspends), "{suspends} suspends for {REQUESTS} requests: {sum}");
    assert_eq!(sum["failed_suspends"], 0);
    // Every suspend was resumed (idle after the request, or at stop).
    assert_eq!(sum["resumes"].as_u64().unwrap() as usize, suspends, "{sum}");
    // During each request, from 10 ms after its submission (reaction + the emulated 200 µs
    // save, generously bounded for TCG) to its completion, no offline dispatch completes.
    let mut violations = Vec::new();
    let mut between = 0;
    for (i, r) in requests.iter().enumerate() {
        let submit = r["submit_ns"].as_u64().unwrap();
        let end = submit + r["latency_ns"].as_u64().unwrap();
        let inside = records
            .iter()
            .filter(|c| {
                let e = c["end_ns"].as_u64().unwrap();
                e > submit + 10_000_000 && e < end
            })
            .count();
        if inside > 0 {
            violations.push((i, inside));
        }
        // Between this request's end and the next one's submission the offline job runs.
        if let Some(next) = requests.get(i + 1) {
            let next_submit = next["submit_ns"].as_u64().unwrap();
            if records.iter().any(|c| {
                let e = c["end_ns"].as_u64().unwrap();
                e > end && e < next_submit
            }) {
                between += 1;
            }
        }
    }
    // A vCPU stall of the emulated CP under TCG can delay one suspend past 10 ms: allow one
    // request in twenty, and print what happened.
    eprintln!("requests with offline completions inside: {violations:?}; gaps with progress: {between}");
    assert!(violations.len() <= 1, "offline dispatches completed inside online requests: {violations:?}");
    assert!(between >= REQUESTS - 2, "offline progressed in only {between} of {} gaps", REQUESTS - 1);
    assert!(sum["reaction_us"]["count"].as_u64().unwrap() >= 1);
    assert!(sum["offline_dispatches"].as_u64().unwrap() > 0, "{sum}");
    assert_eq!(sum["attach_refreshes"], 4, "online snapshot (2) + offline enable and disable (2)");
    // Each request is one dispatch: a delay closes at most once per request (a dispatch the CP
    // started between two polls is never seen pending).
    let delays = sum["online_dispatch_delay_us"]["count"].as_u64().unwrap() as usize;
    assert!((1..=REQUESTS).contains(&delays), "{sum}");
    // The offline job only progresses while running: its rate while running is at least its
    // rate over the whole run.
    let (running, overall) =
        (sum["offline_rate_running_per_s"].as_f64().unwrap(), sum["offline_rate_overall_per_s"].as_f64().unwrap());
    assert!(overall > 0.0 && running >= overall, "{sum}");
    // The tracer saw the driver run every suspend and resume, and each preempted the online
    // queue on the same GPU too.
    let k = &sum["kernel"];
    assert_eq!(
        (k["suspend"]["count"].as_u64(), k["resume"]["count"].as_u64()),
        (Some(suspends as u64), Some(suspends as u64)),
        "{k}"
    );
    assert_eq!(k["suspend"]["collateral_online_queues"].as_u64(), Some(suspends as u64), "{k}");
    assert_eq!(tracer_pid(offline.pid()).unwrap(), 0);
}

#[test]
fn emu_schedule_hints_drive_suspend_and_resume_exactly_and_malformed_lines_are_counted() {
    let _t = Elapsed::start("emu_schedule_hints_drive_suspend_and_resume_exactly");
    let offline = offline_run();
    let online = online_idle();
    let path = sock_path("drive");
    let mut s = Schedule::between(
        online.pid(),
        &offline.pid().to_string(),
        &["--idle", "20ms", "--hint-socket", path.to_str().unwrap()],
    );
    s.wait_events("offline_attached", 1, LONG);
    assert!(runs(&offline));
    assert_eq!(s.transitions("suspend").len(), 0);
    let mut hint = UnixStream::connect(&path).unwrap();
    hint.write_all(b"begin\n").unwrap();
    let susp = s.wait_transitions("suspend", 1, LONG);
    assert_eq!(susp[0]["queues"], 1);
    assert!(held(&offline), "offline ran during a begin..end");
    hint.write_all(b"what is this\n\xff\n").unwrap();
    s.wait_events("hint_malformed", 2, LONG);
    // Still held: malformed lines change nothing.
    assert!(held(&offline));
    assert_eq!(s.transitions("resume").len(), 0);
    hint.write_all(b"end\n").unwrap();
    let res = s.wait_transitions("resume", 1, LONG);
    assert_eq!(res[0]["reason"], "idle");
    assert!(runs(&offline));
    // A second request: exactly one more suspend and resume.
    hint.write_all(b"begin\nend\n").unwrap();
    s.wait_transitions("resume", 2, LONG);
    drop(hint);
    let (lines, _) = s.stop();
    let sum = summary(&lines);
    assert_eq!((sum["suspends"].as_u64(), sum["resumes"].as_u64()), (Some(2), Some(2)), "{sum}");
    assert_eq!(sum["hints"]["begins"], 2);
    assert_eq!(sum["hints"]["ends"], 2);
    assert_eq!(sum["hints"]["malformed"], 2);
    let malformed: Vec<Value> = lines.iter().filter(|v| v["event"] == "hint_malformed").cloned().collect();
    assert_eq!(malformed.iter().map(|m| m["count"].as_u64().unwrap()).collect::<Vec<_>>(), vec![1, 2]);
    assert!(!path.exists(), "the socket file is removed at exit");
    // In the driver: one SUSPEND_QUEUES per suspend and one RESUME_QUEUES per resume (the
    // detach's DISABLE comes after the summary's count), each a device-wide unmap (HWS) whose
    // fence wait is the emulated CWSR save, preempting the online queue each time.
    let k = &sum["kernel"];
    for call in ["suspend", "resume"] {
        let c = &k[call];
        assert_eq!(c["count"], 2, "{call}: {k}");
        assert_eq!(c["fence_wait_us"]["count"], 2, "{call}: {k}");
        assert!(c["unmap_us"]["p50"].as_f64().unwrap() >= c["fence_wait_us"]["p50"].as_f64().unwrap(), "{k}");
        assert_eq!(c["collateral_online_queues"], 2, "{call}: {k}");
    }
    assert!(k["collateral_pids"].as_array().unwrap().contains(&Value::from(online.pid())), "{k}");
    assert!(runs(&offline));
    assert_eq!(tracer_pid(offline.pid()).unwrap(), 0);
}

/// (t_ms, reason) of every transition of `action` in a stopped scheduler's lines.
fn timed_lines(lines: &[Value], action: &str) -> Vec<(f64, Value)> {
    lines
        .iter()
        .filter(|l| l["event"] == "transition" && l["action"] == action)
        .map(|l| (l["t_ms"].as_f64().unwrap(), l["reason"].clone()))
        .collect()
}

/// (t_ms, reason) of every transition of `action` in the stream.
fn timed(s: &Schedule, action: &str) -> Vec<(f64, Value)> {
    s.transitions(action).iter().map(|t| (t["t_ms"].as_f64().unwrap(), t["reason"].clone())).collect()
}

/// A scheduler with a 400 ms watchdog and `busy_share`, whose hint socket has said `begin` and
/// never says `end` (its stream is returned: dropping it ends the request).
fn request_that_never_ends(
    online: &LineHelper,
    offline: &LineHelper,
    tag: &str,
    busy_share: &str,
) -> (Schedule, UnixStream) {
    let path = sock_path(tag);
    let mut s = Schedule::between(
        online.pid(),
        &offline.pid().to_string(),
        &[
            "--no-trace",
            "--idle",
            "60000ms",
            "--max-suspend",
            "400ms",
            "--busy-share",
            busy_share,
            "--hint-socket",
            path.to_str().unwrap(),
        ],
    );
    s.wait_events("offline_attached", 1, LONG);
    let mut hint = UnixStream::connect(&path).unwrap();
    hint.write_all(b"begin\n").unwrap();
    (s, hint)
}

#[test]
fn emu_schedule_max_suspend_and_min_share_end_suspensions_of_a_request_that_never_ends() {
    let _t = Elapsed::start("emu_schedule_max_suspend_and_min_share");
    let offline = offline_run();
    let online = online_idle();

    // --max-suspend with --busy-share 0 (the rule before the duty cycle): one `begin` and no
    // `end`. One suspend, resumed by the watchdog no sooner than the limit; the same request
    // never gets a second suspend.
    let (mut s, hint) = request_that_never_ends(&online, &offline, "max", "0");
    s.wait_transitions("resume", 1, LONG);
    assert!(runs(&offline), "the offline queue does not run after the watchdog's resume");
    let (susp, res) = (timed(&s, "suspend"), timed(&s, "resume"));
    assert_eq!((susp.len(), res.len()), (1, 1), "{susp:?} {res:?}");
    assert_eq!(res[0].1, "watchdog");
    let held_ms = res[0].0 - susp[0].0;
    assert!((400.0..30_000.0).contains(&held_ms), "held {held_ms} ms");
    drop(hint);
    let (lines, _) = s.stop();
    let sum = summary(&lines);
    assert_eq!((sum["suspends"].as_u64(), sum["resumes"].as_u64()), (Some(1), Some(1)), "{sum}");
    assert_eq!(sum["resumes_by_reason"], serde_json::json!({"watchdog": 1}), "{sum}");

    // The default duty cycle (--busy-share 0.2 here: a 100 ms slice after each 400 ms watchdog):
    // the request that never ends is suspended again after each slice, each hold ended by the
    // watchdog no sooner than the limit.
    let (mut s, hint) = request_that_never_ends(&online, &offline, "duty", "0.2");
    s.wait_transitions("resume", 2, LONG);
    s.wait_transitions("suspend", 3, LONG);
    drop(hint);
    let (lines, _) = s.stop();
    let (susp, res) = (timed_lines(&lines, "suspend"), timed_lines(&lines, "resume"));
    // Alternating from a suspend, one resume per suspend (the stop resumes a hold it finds);
    // every resume is the watchdog's but a last one by the stop.
    assert!(susp.len() >= 3 && res.len() == susp.len(), "{susp:?} {res:?}");
    for (i, ((ts, _), (tr, why))) in susp.iter().zip(&res).enumerate() {
        if i + 1 == res.len() && why == "stop" {
            continue;
        }
        assert_eq!(why, "watchdog", "resume {i}: {res:?}");
        assert!(tr - ts >= 400.0, "hold {i} ended after {} ms", tr - ts);
    }
    for (i, ((tr, _), (next, _))) in res.iter().zip(susp.iter().skip(1)).enumerate() {
        // The 100 ms slice, less the resume ioctl's own time (bounded generously).
        assert!(next - tr >= 50.0, "slice {i}: suspended again {} ms after the watchdog resume", next - tr);
    }
    assert!(runs(&offline));

    // --offline-min-share 0.5 over 2 s windows: a request that never ends is suspended, resumed
    // for the offline job's share ("min_share"), and suspended again after each 1 s slice. Its
    // `end` comes right after the third suspend (the next share resume is about 1 s away), so
    // the last resume is the idle one.
    let path = sock_path("share");
    let mut s = Schedule::between(
        online.pid(),
        &offline.pid().to_string(),
        &[
            "--no-trace",
            "--idle",
            "20ms",
            "--offline-min-share",
            "0.5",
            "--share-window",
            "2000ms",
            "--hint-socket",
            path.to_str().unwrap(),
        ],
    );
    s.wait_events("offline_attached", 1, LONG);
    let mut hint = UnixStream::connect(&path).unwrap();
    hint.write_all(b"begin\n").unwrap();
    s.wait_transitions("resume", 2, LONG);
    s.wait_transitions("suspend", 3, LONG);
    hint.write_all(b"end\n").unwrap();
    s.wait_n("resume after end", 1, LONG, |s| {
        s.transitions("resume").into_iter().filter(|t| t["reason"] == "idle").collect()
    });
    assert!(runs(&offline));
    let (susp, res) = (timed(&s, "suspend"), timed(&s, "resume"));
    // Strictly alternating, starting with a suspend; all but the last resume for the share.
    assert_eq!(susp.len(), res.len(), "{susp:?} {res:?}");
    for (i, ((ts, _), (tr, why))) in susp.iter().zip(&res).enumerate() {
        assert!(ts < tr, "suspend {i} at {ts} ms is not before its resume at {tr} ms");
        let expected = if i + 1 == res.len() { "idle" } else { "min_share" };
        assert_eq!(why, expected, "resume {i}: {res:?}");
    }
    for (i, ((tr, _), (next, _))) in res.iter().zip(susp.iter().skip(1)).enumerate() {
        // The slice, less the resume ioctl's own time (bounded generously).
        assert!(next - tr >= 900.0, "slice {i}: suspended again {} ms after the share resume", next - tr);
    }
    drop(hint);
    let (lines, _) = s.stop();
    let sum = summary(&lines);
    assert_eq!(sum["resumes_by_reason"]["idle"], 1, "{sum}");
    assert!(sum["resumes_by_reason"]["min_share"].as_u64().unwrap() >= 2, "{sum}");
    assert_eq!(tracer_pid(offline.pid()).unwrap(), 0);
}

/// Suspend through a hint, then end things in the way `finish` says; the offline queue must
/// run afterwards and the offline process must not be traced. Without the tracer (exits do not
/// depend on it, and each start takes seconds instead of tens under TCG).
/// The CPU latency PM QoS limit in force (the device reads the aggregate as a binary s32; opening
/// it adds a request at the default value, which changes no minimum).
fn qos_limit() -> i32 {
    let bytes = std::fs::read(gpreempt::schedule::wake_latency::DEVICE).unwrap();
    i32::from_ne_bytes(bytes[..4].try_into().unwrap())
}

/// What `--cpu-wake-latency auto` asks for on this guest.
fn auto_limit() -> u32 {
    use gpreempt::schedule::wake_latency::{IdleStates, WakeLatency};
    IdleStates::read(std::path::Path::new("/sys/devices/system/cpu")).limit_us(WakeLatency::Auto).unwrap()
}

fn held_then(tag: &str, finish: impl FnOnce(&mut Schedule, &mut Option<LineHelper>)) -> Vec<Value> {
    // No request is held before the run (the kernel's default is far above any state's latency).
    let before = qos_limit();
    assert!(before > 1_000_000, "{tag}: a CPU latency request is already held ({before} us)");
    let offline = offline_run();
    let mut online = Some(online_idle());
    let path = sock_path(tag);
    let mut s = Schedule::between(
        online.as_ref().unwrap().pid(),
        &offline.pid().to_string(),
        &["--no-trace", "--idle", "5000ms", "--hint-socket", path.to_str().unwrap()],
    );
    s.wait_events("offline_attached", 1, LONG);
    let mut hint = UnixStream::connect(&path).unwrap();
    hint.write_all(b"begin\n").unwrap();
    s.wait_transitions("suspend", 1, LONG);
    assert!(held(&offline));
    // The reaction thread's CPU wake latency request is in force while it runs.
    assert_eq!(qos_limit(), auto_limit() as i32, "{tag}");
    finish(&mut s, &mut online);
    assert!(runs(&offline), "{tag}: the offline queue does not run afterwards");
    let lines = s.lines();
    drop(s);
    assert_eq!(tracer_pid(offline.pid()).unwrap(), 0, "{tag}");
    // ... and gone with the process, however it ended (kill -9 too): the kernel drops it with the fd.
    assert_eq!(qos_limit(), before, "{tag}: the CPU wake latency request outlived gpreempt");
    lines
}

#[test]
fn emu_schedule_exits_leave_the_offline_job_running_and_untraced() {
    let _t = Elapsed::start("emu_schedule_exits_leave_the_offline_job_running_and_untraced");
    // The online process exits mid-suspension: resumed at once (not after --idle 5ms s).
    let lines = held_then("online-exit", |s, online| {
        drop(online.take());
        let res = s.wait_transitions("resume", 1, Duration::from_secs(4));
        assert_eq!(res[0]["reason"], "online_gone");
    });
    assert!(lines.iter().any(|v| v["event"] == "online_gone"));
    // SIGTERM and SIGINT: resume, detach, summary, exit 0.
    for (tag, signal) in [("sigterm", Signal::SIGTERM), ("sigint", Signal::SIGINT)] {
        held_then(tag, |s, _| {
            s.signal(signal);
            let deadline = Instant::now() + LONG;
            while s.child.try_wait().unwrap().is_none() {
                assert!(Instant::now() < deadline, "{tag}: still running");
                thread::sleep(Duration::from_millis(20));
            }
            thread::sleep(Duration::from_millis(100));
            let res = s.transitions("resume");
            assert_eq!(res.len(), 1, "{tag}");
            assert_eq!(res[0]["reason"], "stop");
            let detached = s.events("offline_detached");
            assert_eq!(detached[0]["detached"]["resumed"], 0, "already resumed by the stop");
            let summaries = s.events("summary");
            assert_eq!(summaries.len(), 1);
            assert_eq!(summaries[0]["realtime"]["cpu_wake_limit_us"], auto_limit(), "{tag}");
        });
    }
    // SIGKILL: the kernel resumes and detaches when the debugger dies.
    held_then("sigkill", |s, _| {
        s.signal(Signal::SIGKILL);
        let _ = s.child.wait();
    });
}

/// `--gang`: the offline pids given together are one job. Online work on 0x1000 holds the job's
/// rank on 0x2000 too, with one SUSPEND_QUEUES of all its queues per rank, and the idle resume
/// resumes both ranks; without online queues on 0x2000 that GPU has no policy of its own.
#[test]
fn emu_schedule_with_gang_online_work_on_one_gpu_holds_the_jobs_rank_on_the_other_too() {
    let _t = Elapsed::start("emu_schedule_with_gang_online_work_on_one_gpu_holds_the_jobs_rank");
    let rank0 = offline_run();
    let rank1 =
        LineHelper::spawn("emu-workload", &["run", "--gpu-id", "0x2000", "--queues", "1", "--runtime-enable"]).unwrap();
    let online = online_idle();
    let path = sock_path("gang");
    let (on, r0, r1) = (online.pid().to_string(), rank0.pid().to_string(), rank1.pid().to_string());
    let mut s = Schedule::start(&[
        "--online",
        &on,
        "--offline",
        &r0,
        "--offline",
        &r1,
        "--gang",
        "--idle",
        "20ms",
        "--hint-socket",
        path.to_str().unwrap(),
    ]);
    s.wait_events("offline_attached", 2, LONG);
    assert!(runs(&rank0) && runs(&rank1));
    let mut hint = UnixStream::connect(&path).unwrap();
    hint.write_all(b"begin\n").unwrap();
    let susp = s.wait_transitions("suspend", 1, LONG);
    assert_eq!(
        (susp[0]["gpu_id"].as_u64(), susp[0]["queues"].as_i64(), susp[0]["ioctls"].as_u64()),
        (Some(0x1000), Some(2), Some(2)),
        "{}",
        susp[0]
    );
    assert!(held(&rank0), "the rank on the online GPU ran during a begin..end");
    assert!(held(&rank1), "the gang's rank on 0x2000 ran during a begin..end");
    hint.write_all(b"end\n").unwrap();
    let res = s.wait_transitions("resume", 1, LONG);
    assert_eq!((res[0]["queues"].as_i64(), res[0]["ioctls"].as_u64()), (Some(2), Some(2)), "{}", res[0]);
    assert!(runs(&rank0) && runs(&rank1));
    drop(hint);
    let (lines, _) = s.stop();
    let sum = summary(&lines);
    assert_eq!(
        (sum["suspends"].as_u64(), sum["resumes"].as_u64(), sum["failed_suspends"].as_u64()),
        (Some(1), Some(1), Some(0)),
        "{sum}"
    );
    let gpus: Vec<Option<u64>> =
        lines.iter().filter(|l| l["event"] == "transition").map(|t| t["gpu_id"].as_u64()).collect();
    assert_eq!(gpus, [Some(0x1000), Some(0x1000)]);
}

#[test]
fn emu_schedule_an_offline_exit_mid_suspension_is_detached_and_a_second_controller_is_refused() {
    let _t = Elapsed::start("emu_schedule_an_offline_exit_mid_suspension_is_detached");
    let (leaving, staying) = (offline_run(), offline_run());
    let online = online_idle();
    let path = sock_path("offline-exit");
    let (on, gone, kept) = (online.pid().to_string(), leaving.pid().to_string(), staying.pid().to_string());
    // Without the tracer: exits are seen by the debug sessions themselves.
    let mut s = Schedule::start(&[
        "--online",
        &on,
        "--offline",
        &gone,
        "--offline",
        &kept,
        "--no-trace",
        // Both on 0x1000 and both runnable: a suspend holds one queue of each.
        "--runnable",
        "all",
        "--idle",
        "5000ms",
        // The hold spans two refused controllers and an exit: longer than the default 5 s
        // watchdog under TCG, which must not be what resumes the queues here.
        "--max-suspend",
        "60000ms",
        "--hint-socket",
        path.to_str().unwrap(),
    ]);
    s.wait_events("offline_attached", 2, LONG);
    let mut hint = UnixStream::connect(&path).unwrap();
    hint.write_all(b"begin\n").unwrap();
    let susp = s.wait_transitions("suspend", 1, LONG);
    assert_eq!(susp[0]["queues"], 2, "one queue of each offline process");
    assert!(held(&staying));
    // A second scheduler and a `preempt` on the held process are refused, naming this one, and
    // leave nothing attached (the online process stays untraced).
    let scheduler = s.child.id();
    let traced_by = format!("is already traced by pid {scheduler} (gpreempt); a process has one tracer");
    let (code, e) = refused(&["--no-trace", "--online", &on, "--offline", &kept], Privilege::Root);
    assert_eq!(code, Some(1), "{e}");
    assert!(e.contains(&traced_by), "{e}");
    let out = Command::new(binary("gpreempt").unwrap())
        .args(["preempt", "--no-trace", "--offline", &kept, "--iterations", "1"])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(e.contains(&traced_by), "{e}");
    assert_eq!(tracer_pid(online.pid()).unwrap(), 0, "a refused controller left the online process traced");
    assert!(held(&staying), "a refused controller resumed the held queue");
    // One offline process exits while held: detached, the other stays held.
    leaving.finish().unwrap();
    let detached = s.wait_events("offline_detached", 1, LONG);
    assert_eq!((detached[0]["pid"].as_u64(), detached[0]["reason"].as_str()), (gone.parse().ok(), Some("exited")));
    assert_eq!(s.transitions("resume").len(), 0);
    assert!(held(&staying));
    hint.write_all(b"end\n").unwrap();
    let res = s.wait_transitions("resume", 1, LONG);
    assert_eq!((res[0]["reason"].as_str(), res[0]["queues"].as_u64()), (Some("idle"), Some(1)));
    assert!(runs(&staying));
    drop(hint);
    let (lines, _) = s.stop();
    let sum = summary(&lines);
    assert_eq!((sum["suspends"].as_u64(), sum["resumes"].as_u64()), (Some(1), Some(1)), "{sum}");
    assert_eq!(tracer_pid(staying.pid()).unwrap(), 0);
    assert!(runs(&staying));
}

/// `emu-workload run` with one queue, moved into `cgroup` before it opens /dev/kfd.
fn in_cgroup(cgroup: &std::path::Path, fill_us: &str) -> LineHelper {
    LineHelper::spawn(
        "emu-workload",
        &[
            "run",
            "--gpu-id",
            "0x1000",
            "--queues",
            "1",
            "--runtime-enable",
            "--fill-us",
            fill_us,
            "--cgroup",
            cgroup.to_str().unwrap(),
        ],
    )
    .unwrap()
}

#[test]
fn emu_schedule_picks_up_an_offline_process_of_a_container_started_later() {
    let _t = Elapsed::start("emu_schedule_picks_up_an_offline_process_of_a_container_started_later");
    let cg = gpreempt_tests::docker_cgroup("5eed0000000000000000000000000000000000000000000000000000000000aa");
    let online = online_idle();
    let path = sock_path("pickup");
    let mut s = Schedule::start(&[
        "--online",
        &online.pid().to_string(),
        "--offline",
        "container:5eed0000",
        "--idle",
        "20ms",
        "--hint-socket",
        path.to_str().unwrap(),
    ]);
    // The scheduler says the container has no KFD process yet.
    let warnings = s.wait_events("warning", 1, LONG);
    assert!(
        warnings.iter().any(|w| w["message"].as_str().unwrap().contains("container:5eed0000 has no KFD process yet")),
        "{warnings:?}"
    );
    let offline = in_cgroup(&cg, "1000");
    let attached = s.wait_events("offline_attached", 1, LONG);
    assert_eq!(attached[0]["pid"].as_u64(), Some(u64::from(offline.pid())));
    assert_eq!(attached[0]["picked_up"], true);
    let mut hint = UnixStream::connect(&path).unwrap();
    hint.write_all(b"begin\n").unwrap();
    let susp = s.wait_transitions("suspend", 1, LONG);
    assert_eq!(susp[0]["queues"], 1);
    assert!(held(&offline));
    hint.write_all(b"end\n").unwrap();
    s.wait_transitions("resume", 1, LONG);
    assert!(runs(&offline));
    s.stop();
    assert_eq!(tracer_pid(offline.pid()).unwrap(), 0);
    drop(offline);
    let _ = std::fs::remove_dir(&cg);
}

/// The online server restarts (new pid, same container) and its queued dispatch alone — read
/// from its indices, no hint — suspends the offline job, which meanwhile creates a queue that
/// is held too. The queued dispatch is a reserved AQL slot whose packet is written later, so
/// the scheduler sees it pending for as long as the test wants: one suspend, one reaction, one
/// dispatch delay, exactly.
#[test]
fn emu_schedule_follows_a_restarted_online_container_and_holds_an_offline_queue_created_mid_suspension() {
    let _t = Elapsed::start("emu_schedule_follows_a_restarted_online_container_and_holds_a_new_offline_queue");
    let cg = gpreempt_tests::docker_cgroup("0c0ffee0000000000000000000000000000000000000000000000000000000bb");
    let first = in_cgroup(&cg, "0");
    let mut offline = offline_run();
    // The online side is selected by its container, not its pid.
    let mut s =
        Schedule::start(&["--online", "container:0c0ffee0", "--offline", &offline.pid().to_string(), "--idle", "20ms"]);
    s.wait_events("offline_attached", 1, LONG);
    let added = s.wait_events("online_added", 1, LONG);
    assert_eq!((added[0]["pid"].as_u64(), added[0]["queues"].as_u64()), (Some(u64::from(first.pid())), Some(1)));
    // The server goes away and comes back with a new pid in the same container.
    let first_pid = first.pid();
    drop(first);
    let gone = s.wait_events("online_gone", 1, LONG);
    assert_eq!(gone[0]["pid"].as_u64(), Some(u64::from(first_pid)));
    let mut second = in_cgroup(&cg, "0");
    let added = s.wait_events("online_added", 2, LONG);
    assert_eq!(
        (added[1]["pid"].as_u64(), added[1]["snapshot"].as_bool()),
        (Some(u64::from(second.pid())), Some(false))
    );
    // Its queue is learnt from the tracer's CREATE_QUEUE record.
    let queue = s.wait_events("online_queue", 1, LONG);
    assert_eq!((queue[0]["pid"].as_u64(), queue[0]["queue_id"].as_u64()), (Some(u64::from(second.pid())), Some(0)));
    assert_eq!(s.transitions("suspend").len(), 0, "nothing pending yet");
    assert!(runs(&offline));
    // A dispatch queued on the new server: the offline job is suspended.
    let slot = second.cmd("reserve 0").unwrap()["index"].as_u64().unwrap();
    let susp = s.wait_transitions("suspend", 1, LONG);
    assert_eq!(susp[0]["queues"], 1);
    assert!(susp[0]["reaction_us"].as_f64().is_some(), "{susp:?}");
    assert!(held(&offline));
    // The offline job creates a queue while held and fills it: held as well.
    let created = offline.cmd("create 0x1000 2 4096 100 7").unwrap();
    assert_eq!((created["ret"].as_i64(), created["queue_id"].as_u64()), (Some(0), Some(1)));
    let late = s.wait_events("offline_queues_held", 1, LONG);
    // The one new queue was suspended into the hold.
    assert_eq!((late[0]["pid"].as_u64(), late[0]["queues"].as_i64()), (Some(u64::from(offline.pid())), Some(1)));
    assert_eq!(offline.cmd("submit 1 40 5000").unwrap()["ret"], 0);
    let new_rptr = created["queue"]["rptr"].as_u64().unwrap();
    assert!(holds(offline.pid(), new_rptr), "the queue created mid-suspension ran");
    assert!(held(&offline));
    assert_eq!(s.transitions("resume").len(), 0);
    // The server's packet is written: the CP runs it, the indices go idle, the offline queues
    // (both) run again.
    assert_eq!(second.cmd(&format!("commit 0 {slot} 1000")).unwrap()["ret"], 0);
    let res = s.wait_transitions("resume", 1, LONG);
    assert_eq!(res[0]["reason"], "idle");
    assert!(progresses(offline.pid(), new_rptr), "the queue created mid-suspension does not run after the resume");
    assert!(runs(&offline));
    let (lines, _) = s.stop();
    let sum = summary(&lines);
    assert_eq!((sum["suspends"].as_u64(), sum["resumes"].as_u64()), (Some(1), Some(1)), "{sum}");
    assert_eq!(sum["reaction_us"]["count"], 1, "{sum}");
    // The reserved dispatch was seen pending, then consumed: one delay.
    assert_eq!(sum["online_dispatch_delay_us"]["count"], 1, "{sum}");
    let (running, overall) =
        (sum["offline_rate_running_per_s"].as_f64().unwrap(), sum["offline_rate_overall_per_s"].as_f64().unwrap());
    assert!(overall > 0.0 && running >= overall, "{sum}");
    assert!(sum["suspended_share"].as_f64().unwrap() > 0.0, "{sum}");
    assert_eq!(tracer_pid(offline.pid()).unwrap(), 0);
    assert_eq!(tracer_pid(second.pid()).unwrap(), 0);
    drop(second);
    let _ = std::fs::remove_dir(&cg);
}

#[test]
fn emu_schedule_bad_input_is_refused_with_cause_and_fix_and_nothing_attached() {
    let _t = Elapsed::start("emu_schedule_bad_input_is_refused_with_cause_and_fix_and_nothing_attached");
    let offline = offline_run();
    let online = online_idle();
    let (on, off) = (online.pid().to_string(), offline.pid().to_string());
    // The checks come before the tracer is needed; without it each refusal is quicker under TCG.
    let refuse = |args: &[&str]| {
        let (code, e) = refused(&[&["--no-trace"], args].concat(), Privilege::Root);
        assert_eq!(code, Some(1), "{args:?}: {e}");
        e
    };
    let e = refuse(&["--online", &on, "--offline", "4000000"]);
    assert!(e.contains("--offline 4000000: no process with pid 4000000 (see `gpreempt ps`"), "{e}");
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let sl = sleeper.id().to_string();
    let e = refuse(&["--online", &on, "--offline", &sl]);
    assert!(e.contains(&format!("--offline {sl}: pid {sl} (sleep) has never opened /dev/kfd")), "{e}");
    let e = refuse(&["--online", &sl, "--offline", &off]);
    assert!(e.contains(&format!("--online {sl}: pid {sl} (sleep) has never opened /dev/kfd")), "{e}");
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let e = refuse(&["--online", &off, "--offline", &off]);
    assert!(e.contains(&format!("pid {off} is selected both as online and as offline")), "{e}");
    // A malformed selector is an argument error (clap's exit status 2).
    let (code, e) = refused(&["--online", &on, "--offline", "container:"], Privilege::Root);
    assert_eq!(code, Some(2), "{e}");
    assert!(e.contains("`container:` needs a container name or id"), "{e}");
    // An online process whose memory gpreempt may not read: root without CAP_SYS_PTRACE, whose
    // permitted set is then not a superset of the (root) target's, which the kernel's
    // capability check requires for ptrace access (security/commoncap.c,
    // cap_ptrace_access_check). Refused before anything is attached, naming cause and fix.
    let (code, e) = refused(&["--no-trace", "--online", &on, "--offline", &off], Privilege::RootWithoutPtrace);
    assert_eq!(code, Some(1), "{e}");
    assert!(
        e.contains(&format!(
            "--online {on}: cannot read the memory of online pid {on} (Operation not permitted (os error 1)): run \
             gpreempt as root or with CAP_SYS_PTRACE"
        )),
        "{e}"
    );
    // Nothing was left attached, and the offline job still runs.
    assert_eq!(tracer_pid(offline.pid()).unwrap(), 0);
    assert_eq!(tracer_pid(online.pid()).unwrap(), 0);
    assert!(runs(&offline));
}

/// Two GPUs: online work on 0x1000 first. Offline process X has a queue on each GPU, Y one on
/// 0x2000 only. Each online request suspends exactly X's queue on 0x1000 (one SUSPEND_QUEUES,
/// for X alone: Y has nothing there), while X's queue on 0x2000 and Y keep running. Then the
/// online process creates a queue on 0x2000: work there suspends X's and Y's queues on 0x2000
/// and not X's on 0x1000. The reaction thread runs SCHED_FIFO (root) and reports its step
/// interval.
#[test]
fn emu_schedule_online_work_on_one_gpu_suspends_only_the_offline_queues_on_that_gpu() {
    let _t = Elapsed::start("emu_schedule_online_work_on_one_gpu_suspends_only_the_offline_queues_on_that_gpu");
    let mut x = offline_run();
    // X's second queue, on 0x2000, is given work before each request.
    let created = x.cmd("create 0x2000 2 4096 100 7").unwrap();
    assert_eq!((created["ret"].as_i64(), created["queue_id"].as_u64()), (Some(0), Some(1)));
    let x_b = created["queue"]["rptr"].as_u64().unwrap();
    let y =
        LineHelper::spawn("emu-workload", &["run", "--gpu-id", "0x2000", "--queues", "1", "--runtime-enable"]).unwrap();
    let mut online = online_idle();
    let mut s = Schedule::start(&[
        "--online",
        &online.pid().to_string(),
        "--offline",
        &x.pid().to_string(),
        &y.pid().to_string(),
        "--idle",
        "20ms",
        // X and Y share 0x2000: both stay runnable there (`auto` may park one once it finds
        // either keeps the GPU busy), so a suspend of 0x2000 is one ioctl per process.
        "--runnable",
        "all",
    ]);
    let attached = s.wait_events("offline_attached", 2, LONG);
    let by_pid = |pid: u32| attached.iter().find(|a| a["pid"] == pid).unwrap_or_else(|| panic!("{pid}: {attached:?}"));
    assert_eq!(
        (by_pid(x.pid())["queues"].as_u64(), by_pid(x.pid())["gpus"].clone()),
        (Some(2), serde_json::json!([4096, 8192]))
    );
    assert_eq!(
        (by_pid(y.pid())["queues"].as_u64(), by_pid(y.pid())["gpus"].clone()),
        (Some(1), serde_json::json!([8192]))
    );
    for request in 1..=2 {
        // 25 dispatches of 40 ms: 1 s of work on X's 0x2000 queue.
        assert_eq!(x.cmd("submit 1 25 40000").unwrap()["ret"], 0);
        let slot = online.cmd("reserve 0").unwrap()["index"].as_u64().unwrap();
        let susp = s.wait_transitions("suspend", request, LONG);
        let t = &susp[request - 1];
        assert_eq!(
            (t["gpu_id"].as_u64(), t["queues"].as_i64(), t["ioctls"].as_u64()),
            (Some(4096), Some(1), Some(1)),
            "{t}"
        );
        assert!(t["detection_us"].as_f64().is_some(), "{t}");
        assert!(held(&x), "X's queue on 0x1000 runs during the online request");
        assert!(progresses(x.pid(), x_b), "X's queue on 0x2000 is held by online work on 0x1000");
        assert!(runs(&y), "Y, on 0x2000 only, is held by online work on 0x1000");
        assert_eq!(online.cmd(&format!("commit 0 {slot} 1000")).unwrap()["ret"], 0);
        let res = s.wait_transitions("resume", request, LONG);
        let t = &res[request - 1];
        assert_eq!(
            (t["gpu_id"].as_u64(), t["queues"].as_i64(), t["reason"].as_str()),
            (Some(4096), Some(1), Some("idle")),
            "{t}"
        );
        assert!(runs(&x));
    }
    // The online process creates a queue on 0x2000 mid-run: that GPU's policy starts, and work
    // there suspends X's and Y's queues on 0x2000 (two processes: two ioctls) and not X's on 0x1000.
    let made = online.cmd("create 0x2000 2 4096 100 7").unwrap();
    assert_eq!((made["ret"].as_i64(), made["queue_id"].as_u64()), (Some(0), Some(1)));
    let watched = s.wait_events("online_queue", 1, LONG);
    assert_eq!((watched[0]["queue_id"].as_u64(), watched[0]["gpu_id"].as_u64()), (Some(1), Some(8192)));
    assert_eq!(x.cmd("submit 1 25 40000").unwrap()["ret"], 0);
    let slot = online.cmd("reserve 1").unwrap()["index"].as_u64().unwrap();
    let susp = s.wait_transitions("suspend", 3, LONG);
    let t = &susp[2];
    assert_eq!(
        (t["gpu_id"].as_u64(), t["queues"].as_i64(), t["ioctls"].as_u64()),
        (Some(8192), Some(2), Some(2)),
        "{t}"
    );
    assert!(runs(&x), "X's queue on 0x1000 is held by online work on 0x2000");
    assert!(holds(x.pid(), x_b));
    assert!(held(&y));
    assert_eq!(online.cmd(&format!("commit 1 {slot} 1000")).unwrap()["ret"], 0);
    let res = s.wait_transitions("resume", 3, LONG);
    assert_eq!((res[2]["gpu_id"].as_u64(), res[2]["queues"].as_i64()), (Some(8192), Some(2)), "{}", res[2]);
    assert!(runs(&y));
    let (lines, stderr) = s.stop();
    let sum = summary(&lines);
    assert_eq!((sum["suspends"].as_u64(), sum["resumes"].as_u64()), (Some(3), Some(3)), "{sum}");
    let gpus = sum["gpus"].as_array().unwrap();
    let gpu = |id: u64| gpus.iter().find(|g| g["gpu_id"] == id).unwrap_or_else(|| panic!("{sum}"));
    assert_eq!(
        (gpu(4096)["scheduled"].as_bool(), gpu(4096)["suspends"].as_u64(), gpu(4096)["resumes"].as_u64()),
        (Some(true), Some(2), Some(2))
    );
    assert_eq!(
        (gpu(8192)["scheduled"].as_bool(), gpu(8192)["suspends"].as_u64(), gpu(8192)["resumes"].as_u64()),
        (Some(true), Some(1), Some(1))
    );
    assert!(gpu(8192)["offline_dispatches"].as_u64().unwrap() > 0, "{sum}");
    // The driver ran one suspend per process per transition: 2 on 0x1000 (X), 2 on 0x2000 (X, Y).
    let k = &sum["kernel"];
    assert_eq!((k["suspend"]["count"].as_u64(), k["resume"]["count"].as_u64()), (Some(4), Some(4)), "{k}");
    // The reaction thread's footing as root, and its step interval.
    assert_eq!(sum["realtime"]["policy"], "fifo", "{sum}");
    assert_eq!(sum["realtime"]["priority"], 20, "{sum}");
    assert!(sum["loop_step_us"]["count"].as_u64().unwrap() > 100, "{sum}");
    assert_eq!(sum["reaction_panicked"], false);
    let refused: Vec<&Value> = lines.iter().filter(|l| l["event"] == "warning").collect();
    assert!(refused.is_empty(), "{refused:?}\n{stderr}");
    for pid in [x.pid(), y.pid(), online.pid()] {
        assert_eq!(tracer_pid(pid).unwrap(), 0);
    }
}

/// Without CAP_SYS_NICE the reaction thread says so once and schedules at normal priority; a
/// reaction thread that dies (an injected panic with a GPU held) leaves nothing suspended or
/// traced, and gpreempt exits 1 naming it.
#[test]
fn emu_schedule_without_cap_sys_nice_and_with_a_dying_reaction_thread_leaves_nothing_held() {
    let _t = Elapsed::start("emu_schedule_without_cap_sys_nice_and_with_a_dying_reaction_thread");
    let offline = offline_run();
    let mut online = online_idle();
    let (on, off) = (online.pid().to_string(), offline.pid().to_string());
    let args = ["--no-trace", "--online", on.as_str(), "--offline", off.as_str(), "--idle", "20ms"];
    let mut s = Schedule::start_with(&args, Privilege::RootWithoutNice, &[]);
    s.wait_events("offline_attached", 1, LONG);
    let slot = online.cmd("reserve 0").unwrap()["index"].as_u64().unwrap();
    s.wait_transitions("suspend", 1, LONG);
    assert!(held(&offline));
    assert_eq!(online.cmd(&format!("commit 0 {slot} 1000")).unwrap()["ret"], 0);
    s.wait_transitions("resume", 1, LONG);
    let (lines, stderr) = s.stop();
    let sum = summary(&lines);
    assert_eq!(sum["realtime"]["policy"], "normal", "{sum}");
    let refusals: Vec<&Value> = lines
        .iter()
        .filter(|l| l["event"] == "warning" && l["message"].as_str().is_some_and(|m| m.contains("SCHED_FIFO")))
        .collect();
    assert_eq!(refusals.len(), 1, "{lines:?}");
    assert!(
        refusals[0]["message"].as_str().unwrap().starts_with("SCHED_FIFO priority 20 refused (Operation not permitted"),
        "{refusals:?}"
    );
    assert!(sum["loop_step_us"]["count"].as_u64().unwrap() > 0, "{sum}");
    assert_eq!((sum["suspends"].as_u64(), sum["resumes"].as_u64()), (Some(1), Some(1)), "{sum}\n{stderr}");
    assert!(runs(&offline));

    // The reaction thread panics right after its first suspend, with the GPU held.
    let mut s = Schedule::start_with(&args, Privilege::Root, &[("GPREEMPT_TEST_FAULT", "reaction-panic")]);
    s.wait_events("offline_attached", 1, LONG);
    let slot = online.cmd("reserve 0").unwrap()["index"].as_u64().unwrap();
    let (status, lines, stderr) = s.wait();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("injected fault: the reaction thread panics with GPU 0x1000 held"), "{stderr}");
    assert!(stderr.contains("gpreempt: error: the reaction thread panicked"), "{stderr}");
    assert_eq!(summary(&lines)["reaction_panicked"], true);
    // Its session resumed and detached while unwinding, with the online work still pending.
    assert_eq!(tracer_pid(offline.pid()).unwrap(), 0);
    assert!(runs(&offline), "the offline queue stayed suspended after the reaction thread died");
    assert_eq!(online.cmd(&format!("commit 0 {slot} 1000")).unwrap()["ret"], 0);
}
