//! `gpreempt schedule` end to end on the KFD emulator (one shared GPU, gpu 0x1000): an online
//! workload with periodic requests and an offline one that saturates the GPU, timed by the
//! completion records the emulated CP writes (CLOCK_MONOTONIC). The scheduler's `--json` stream
//! is read live. Assertions are on counts and orders; where time enters, it is bounded
//! generously and judged over every request, never one sample.

use std::{
    fs::File,
    io::{BufRead, BufReader, Write},
    os::{unix::fs::FileExt, unix::net::UnixStream},
    path::PathBuf,
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use gpreempt_tests::{LineHelper, binary, target::tracer_pid};
use nix::{sys::signal::Signal, unistd::Pid};
use serde_json::Value;

/// Under TCG the in-process tracer alone takes tens of seconds to start.
const LONG: Duration = Duration::from_secs(240);

/// `gpreempt schedule --json …` with its stdout collected by a reader thread.
struct Schedule {
    child: Child,
    lines: Arc<Mutex<Vec<Value>>>,
    reader: Option<thread::JoinHandle<()>>,
}

impl Schedule {
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(binary("gpreempt").unwrap())
            .arg("schedule")
            .arg("--json")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let reader = thread::spawn(move || {
            for l in out.lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&l) {
                    sink.lock().unwrap().push(v);
                }
            }
        });
        Self { child, lines, reader: Some(reader) }
    }

    /// `--online ONLINE --offline OFFLINE` plus `extra`.
    fn between(online: u32, offline: &str, extra: &[&str]) -> Self {
        let online = online.to_string();
        Self::start(&[&["--online", &online, "--offline", offline], extra].concat())
    }

    fn events(&self, kind: &str) -> Vec<Value> {
        self.lines.lock().unwrap().iter().filter(|v| v["event"] == kind).cloned().collect()
    }

    fn transitions(&self, action: &str) -> Vec<Value> {
        self.events("transition").into_iter().filter(|t| t["action"] == action).collect()
    }

    /// Wait until `find` returns `n` items (panics with the stream and, if the scheduler
    /// exited, its stderr after `timeout`).
    fn wait_n(&mut self, what: &str, n: usize, timeout: Duration, find: impl Fn(&Self) -> Vec<Value>) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let found = find(self);
            if found.len() >= n {
                return found;
            }
            if Instant::now() > deadline || self.child.try_wait().unwrap().is_some() {
                let stderr = self.stderr_now();
                panic!("no {n} `{what}`: {:?}\nstderr: {stderr}", self.lines.lock().unwrap());
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn wait_events(&mut self, kind: &str, n: usize, timeout: Duration) -> Vec<Value> {
        self.wait_n(kind, n, timeout, |s| s.events(kind))
    }

    fn wait_transitions(&mut self, action: &str, n: usize, timeout: Duration) -> Vec<Value> {
        self.wait_n(action, n, timeout, |s| s.transitions(action))
    }

    fn stderr_now(&mut self) -> String {
        if self.child.try_wait().ok().flatten().is_none() {
            return String::new();
        }
        let mut s = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut s);
        }
        s
    }

    fn signal(&self, signal: Signal) {
        nix::sys::signal::kill(Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    /// Wait for exit; the whole stdout has been read when this returns.
    fn wait(mut self) -> (ExitStatus, Vec<Value>, String) {
        let status = self.child.wait().unwrap();
        if let Some(r) = self.reader.take() {
            r.join().unwrap();
        }
        let stderr = self.stderr_now();
        let lines = self.lines.lock().unwrap().clone();
        (status, lines, stderr)
    }

    fn stop(self) -> (Vec<Value>, String) {
        self.signal(Signal::SIGINT);
        let (status, lines, stderr) = self.wait();
        assert!(status.success(), "schedule failed: {stderr}");
        (lines, stderr)
    }
}

impl Drop for Schedule {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn summary(lines: &[Value]) -> Value {
    lines.iter().find(|v| v["event"] == "summary").cloned().unwrap_or_else(|| panic!("no summary in {lines:?}"))
}

fn rptr_now(pid: u32, address: u64) -> u64 {
    let mut buf = [0u8; 8];
    File::open(format!("/proc/{pid}/mem")).unwrap().read_exact_at(&mut buf, address).unwrap();
    u64::from_ne_bytes(buf)
}

/// The read index of `w`'s first queue moves within 2 s (the queue is running).
fn progresses(w: &LineHelper) -> bool {
    let (pid, address) = (w.pid(), w.hello["queues"][0]["rptr"].as_u64().unwrap());
    let a = rptr_now(pid, address);
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if rptr_now(pid, address) > a {
            return true;
        }
        thread::sleep(Duration::from_millis(10));
    }
    false
}

/// The read index of `w`'s first queue stays put for 300 ms (the queue is suspended).
fn holds(w: &LineHelper) -> bool {
    let (pid, address) = (w.pid(), w.hello["queues"][0]["rptr"].as_u64().unwrap());
    // The running dispatch is stopped by the unmap; what started before the suspend returned
    // is visible by now.
    thread::sleep(Duration::from_millis(50));
    let a = rptr_now(pid, address);
    thread::sleep(Duration::from_millis(300));
    rptr_now(pid, address) == a
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
    const REQUESTS: usize = 20;
    let mut offline = LineHelper::spawn(
        "emu-workload",
        &["offline", "--gpu-id", "0x1000", "--runtime-enable", "--dispatch-us", "2000", "--records"],
    )
    .unwrap();
    let mut online = LineHelper::spawn(
        "emu-workload",
        &[
            "online",
            "--gpu-id",
            "0x1000",
            "--runtime-enable",
            "--dispatches",
            "1",
            "--dispatch-us",
            "20000",
            "--period-us",
            "150000",
            "--requests",
            &REQUESTS.to_string(),
            "--wait-go",
        ],
    )
    .unwrap();
    let mut s =
        Schedule::between(online.pid(), &offline.pid().to_string(), &["--idle-ms", "5", "--interval-ms", "200"]);
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
    assert_eq!(tracer_pid(offline.pid()).unwrap(), 0);
}

#[test]
fn emu_schedule_hints_drive_suspend_and_resume_exactly_and_malformed_lines_are_counted() {
    let offline = offline_run();
    let online = online_idle();
    let path = sock_path("drive");
    let mut s = Schedule::between(
        online.pid(),
        &offline.pid().to_string(),
        &["--idle-ms", "20", "--hint-socket", path.to_str().unwrap()],
    );
    s.wait_events("offline_attached", 1, LONG);
    assert!(progresses(&offline));
    assert_eq!(s.transitions("suspend").len(), 0);
    let mut hint = UnixStream::connect(&path).unwrap();
    hint.write_all(b"begin\n").unwrap();
    let susp = s.wait_transitions("suspend", 1, LONG);
    assert_eq!(susp[0]["queues"], 1);
    assert!(holds(&offline), "offline ran during a begin..end");
    hint.write_all(b"what is this\n\xff\n").unwrap();
    s.wait_events("hint_malformed", 2, LONG);
    // Still held: malformed lines change nothing.
    assert!(holds(&offline));
    assert_eq!(s.transitions("resume").len(), 0);
    hint.write_all(b"end\n").unwrap();
    let res = s.wait_transitions("resume", 1, LONG);
    assert_eq!(res[0]["reason"], "idle");
    assert!(progresses(&offline));
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
    assert!(progresses(&offline));
    assert_eq!(tracer_pid(offline.pid()).unwrap(), 0);
}

/// Suspend through a hint, then end things in the way `finish` says; the offline queue must
/// run afterwards and the offline process must not be traced.
fn held_then(tag: &str, finish: impl FnOnce(&mut Schedule, &mut Option<LineHelper>)) -> Vec<Value> {
    let offline = offline_run();
    let mut online = Some(online_idle());
    let path = sock_path(tag);
    let mut s = Schedule::between(
        online.as_ref().unwrap().pid(),
        &offline.pid().to_string(),
        &["--idle-ms", "5000", "--hint-socket", path.to_str().unwrap()],
    );
    s.wait_events("offline_attached", 1, LONG);
    let mut hint = UnixStream::connect(&path).unwrap();
    hint.write_all(b"begin\n").unwrap();
    s.wait_transitions("suspend", 1, LONG);
    assert!(holds(&offline));
    finish(&mut s, &mut online);
    assert!(progresses(&offline), "{tag}: the offline queue does not run afterwards");
    let lines = s.lines.lock().unwrap().clone();
    drop(s);
    assert_eq!(tracer_pid(offline.pid()).unwrap(), 0, "{tag}");
    lines
}

#[test]
fn emu_schedule_exits_leave_the_offline_job_running_and_untraced() {
    // The online process exits mid-suspension: resumed at once (not after --idle-ms 5 s).
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
            assert_eq!(s.events("summary").len(), 1);
        });
    }
    // SIGKILL: the kernel resumes and detaches when the debugger dies.
    held_then("sigkill", |s, _| {
        s.signal(Signal::SIGKILL);
        let _ = s.child.wait();
    });
}

#[test]
fn emu_schedule_an_offline_exit_is_detached_cleanly() {
    let offline = offline_run();
    let online = online_idle();
    let mut s = Schedule::between(online.pid(), &offline.pid().to_string(), &[]);
    s.wait_events("offline_attached", 1, LONG);
    let pid = offline.pid();
    // A second scheduler on the same offline process is refused, naming the first.
    let e = refused(&["--online", &online.pid().to_string(), "--offline", &pid.to_string()]);
    assert!(e.contains(&format!("is already traced by pid {} (gpreempt)", s.child.id())), "{e}");
    assert_eq!(tracer_pid(online.pid()).unwrap(), 0, "the refused scheduler left the online process traced");
    offline.finish().unwrap();
    let detached = s.wait_events("offline_detached", 1, LONG);
    assert_eq!((detached[0]["pid"].as_u64(), detached[0]["reason"].as_str()), (Some(u64::from(pid)), Some("exited")));
    let (lines, _) = s.stop();
    assert_eq!(summary(&lines)["suspends"], 0);
}

#[test]
fn emu_schedule_picks_up_an_offline_process_of_a_container_started_later() {
    // A cgroup named as Docker names its containers makes this process "in container" <id>.
    let id = "5eed0000000000000000000000000000000000000000000000000000000000aa";
    if !std::path::Path::new("/sys/fs/cgroup/cgroup.procs").exists() {
        let ok = Command::new("mount").args(["-t", "cgroup2", "none", "/sys/fs/cgroup"]).status().unwrap();
        assert!(ok.success(), "cannot mount cgroup2 at /sys/fs/cgroup");
    }
    let cg = PathBuf::from(format!("/sys/fs/cgroup/docker-{id}.scope"));
    std::fs::create_dir_all(&cg).unwrap();
    let online = online_idle();
    let path = sock_path("pickup");
    let mut s = Schedule::start(&[
        "--online",
        &online.pid().to_string(),
        "--offline",
        "container:5eed0000",
        "--idle-ms",
        "20",
        "--hint-socket",
        path.to_str().unwrap(),
    ]);
    // The scheduler says the container has no KFD process yet.
    let warnings = s.wait_events("warning", 1, LONG);
    assert!(warnings.iter().any(|w| w["message"].as_str().unwrap().contains("container 5eed0000")), "{warnings:?}");
    let offline = LineHelper::spawn(
        "emu-workload",
        &["run", "--gpu-id", "0x1000", "--queues", "1", "--runtime-enable", "--cgroup", cg.to_str().unwrap()],
    )
    .unwrap();
    let attached = s.wait_events("offline_attached", 1, LONG);
    assert_eq!(attached[0]["pid"].as_u64(), Some(u64::from(offline.pid())));
    assert_eq!(attached[0]["picked_up"], true);
    let mut hint = UnixStream::connect(&path).unwrap();
    hint.write_all(b"begin\n").unwrap();
    let susp = s.wait_transitions("suspend", 1, LONG);
    assert_eq!(susp[0]["queues"], 1);
    assert!(holds(&offline));
    hint.write_all(b"end\n").unwrap();
    s.wait_transitions("resume", 1, LONG);
    assert!(progresses(&offline));
    s.stop();
    assert_eq!(tracer_pid(offline.pid()).unwrap(), 0);
    drop(offline);
    let _ = std::fs::remove_dir(&cg);
}

/// `gpreempt schedule` refusing to start: exit status, the error on stderr.
fn refused(args: &[&str]) -> String {
    // The checks come before the tracer is needed; without it each refusal is quicker under TCG.
    let out = Command::new(binary("gpreempt").unwrap()).args(["schedule", "--no-trace"]).args(args).output().unwrap();
    assert!(!out.status.success(), "{args:?} was accepted");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn emu_schedule_bad_input_is_refused_with_cause_and_fix_and_nothing_attached() {
    let offline = offline_run();
    let online = online_idle();
    let (on, off) = (online.pid().to_string(), offline.pid().to_string());
    let e = refused(&["--online", &on, "--offline", "4000000"]);
    assert!(e.contains("--offline 4000000: no process with pid 4000000 (see `gpreempt ps`"), "{e}");
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let sl = sleeper.id().to_string();
    let e = refused(&["--online", &on, "--offline", &sl]);
    assert!(e.contains(&format!("--offline {sl}: pid {sl} (sleep) has never opened /dev/kfd")), "{e}");
    let e = refused(&["--online", &sl, "--offline", &off]);
    assert!(e.contains(&format!("--online {sl}: pid {sl} (sleep) has never opened /dev/kfd")), "{e}");
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let e = refused(&["--online", &off, "--offline", &off]);
    assert!(e.contains(&format!("pid {off} is selected both as online and as offline")), "{e}");
    let e = refused(&["--online", &on, "--offline", "container:"]);
    assert!(e.contains("`container:` needs a container name or id"), "{e}");
    // Neither process was left attached, and the offline one still runs.
    assert_eq!(tracer_pid(offline.pid()).unwrap(), 0);
    assert_eq!(tracer_pid(online.pid()).unwrap(), 0);
    assert!(progresses(&offline));
}
