//! `gpreempt top` on the KFD emulator: `--json` and `--once` name the workload's pid, GPU, queues
//! and their state exactly; the live view, in a real terminal (tmux: `send-keys` in,
//! `capture-pane` out), shows the same row, sorts and filters on its keys, shows the queues
//! suspended while `gpreempt preempt` holds them and the suspend and resume spans, and gives the
//! terminal back as it found it (no alternate screen, the same `stty` settings) on `q` and on
//! SIGTERM.

use std::{
    path::PathBuf,
    process::{Command, Output, Stdio},
    time::Duration,
};

use gpreempt_tests::{LineHelper, binary, prometheus::series, target::eventually, wait_kfd_released};
use serde_json::{Value, json};

/// Under TCG the in-process tracer alone takes tens of seconds to start.
const ATTACH: Duration = Duration::from_secs(240);
const SECOND: Duration = Duration::from_secs(1);

/// Earlier tests' processes leave KFD some time after they exit (a kworker releases them): wait
/// until none is left, so the per-GPU counts are this test's alone.
fn no_kfd_processes() {
    let Ok(dir) = std::fs::read_dir("/sys/class/kfd/kfd/proc") else { return };
    for entry in dir.flatten() {
        if let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) {
            wait_kfd_released(pid).unwrap();
        }
    }
}

fn workload(gpu: &str) -> LineHelper {
    LineHelper::spawn("emu-workload", &["run", "--gpu-id", gpu, "--queues", "2", "--runtime-enable"]).unwrap()
}

fn top(args: &[&str]) -> Output {
    let out = Command::new(binary("gpreempt").unwrap()).arg("top").args(args).output().unwrap();
    assert!(out.status.success(), "gpreempt top {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn emu_top_json_and_once_name_the_workloads_pid_gpu_queues_and_state() {
    no_kfd_processes();
    let w = workload("0x2000");
    let pid = w.pid();
    let out = top(&["--json", "--no-agent", "--interval", "500ms"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let processes = v["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 1, "{v:#}");
    let p = &processes[0];
    assert_eq!(
        (&p["pid"], &p["comm"], &p["evictions"], &p["suspends"]),
        (&json!(pid), &json!("emu-workload"), &json!(0), &json!(0))
    );
    // Both queues predate `top`: read from sysfs (kernel type `compute`), taken as active.
    // `context_id` null: the primary KFD context (a secondary's number otherwise, Linux 7.0).
    let queue = |id: u32| json!({"queue_id": id, "context_id": null, "queue_type": "compute", "state": "active", "state_seen": false});
    assert_eq!(p["gpus"], json!([{"gpu_id": 0x2000, "queues": [queue(0), queue(1)]}]), "{p:#}");
    let zero = json!({"processes": 0, "queues": 0, "active": 0, "evicted": 0, "suspended": 0, "evictions": 0, "suspends": 0, "resumes": 0});
    let mut on = zero.clone();
    on.as_object_mut().unwrap().extend([
        ("processes".into(), json!(1)),
        ("queues".into(), json!(2)),
        ("active".into(), json!(2)),
    ]);
    let gpu = |id: u32, counts: &Value| {
        let mut g = counts.clone();
        g["gpu_id"] = json!(id);
        g["partition"] = json!({"package": package(&format!("{id:#x}")), "index": 0, "count": 1, "mode": null});
        g
    };
    assert_eq!(v["gpus"], json!([gpu(0x1000, &zero), gpu(0x2000, &on)]), "{v:#}");
    assert_eq!(v["spans"], json!([]));
    assert_eq!(v["scheduler"], json!({"source": null, "error": null, "gpus": []}));
    assert!(v["tracer"]["probes_attached"].as_u64().unwrap() > 0, "{v:#}");

    let out = top(&["--once", "--no-agent", "--interval", "500ms", "--filter", &pid.to_string()]);
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("gpreempt top: 1 KFD processes, 2 queues, 2 GPUs; tracer "), "{text}");
    assert!(lines[0].ends_with(&format!("sort pid, filter \"{pid}\"")), "{text}");
    let row = tokens_of(&lines, &pid.to_string()).unwrap_or_else(|| panic!("no row for {pid}: {text}"));
    assert_eq!(row, [&pid.to_string(), "-", "emu-workload", "0x2000", "2", "0,1", "active*", "0", "0"], "{text}");
    assert_eq!(
        gpu_row(&lines, "0x2000"),
        Some(["0x2000", "1", "2", "2", "0", "0", "0", "0", "0"].map(String::from).to_vec())
    );
    assert!(lines.contains(&"scheduler: not read (--no-agent)"), "{text}");
}

/// The whitespace-separated cells of the screen or text line whose first cell is `first` (table
/// borders dropped).
fn tokens_of(lines: &[&str], first: &str) -> Option<Vec<String>> {
    lines.iter().find_map(|l| {
        let cells: Vec<String> =
            l.split(|c: char| c.is_whitespace() || c == '│').filter(|c| !c.is_empty()).map(str::to_owned).collect();
        (cells.first().map(String::as_str) == Some(first)).then_some(cells)
    })
}

/// The emulated GPUs' packages as `top` names them (each an MI210: one partition, the package's
/// PCI address alone, from the node's `domain` and `location_id`).
fn package(gpu: &str) -> &'static str {
    match gpu {
        "0x1000" => "0000:03:00.0",
        "0x2000" => "0000:04:00.0",
        other => panic!("no emulated GPU {other}"),
    }
}

/// The GPU table's row of `gpu`, its PARTITION cell checked to be the GPU's package and left out.
fn gpu_row(lines: &[&str], gpu: &str) -> Option<Vec<String>> {
    let mut cells = tokens_of(lines, gpu)?;
    assert_eq!(cells.get(1).map(String::as_str), Some(package(gpu)), "{cells:?}");
    cells.remove(1);
    Some(cells)
}

/// The span rows (`AGO SPAN PID COMM GPU Q TOTAL UNMAP FENCE REMAP OTHERS`) of `kind` for `pid`,
/// latest first.
fn span_rows(screen: &str, kind: &str, pid: u32) -> Vec<Vec<String>> {
    screen
        .lines()
        .filter_map(|l| {
            let cells: Vec<String> =
                l.split(|c: char| c.is_whitespace() || c == '│').filter(|c| !c.is_empty()).map(str::to_owned).collect();
            (cells.len() == 11 && cells[1] == kind && cells[2] == pid.to_string()).then_some(cells)
        })
        .collect()
}

fn span_row(screen: &str, kind: &str, pid: u32) -> Option<Vec<String>> {
    span_rows(screen, kind, pid).into_iter().next()
}

/// A tmux server of its own (socket in the temp dir), one detached 160x50 session running `sh`.
struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    fn start() -> Self {
        let socket = std::env::temp_dir().join(format!("gpreempt-top-{}.tmux", std::process::id()));
        let t = Self { socket };
        let out = t.tmux(&["new-session", "-d", "-s", "top", "-x", "160", "-y", "50", "sh"]);
        assert!(out.status.success(), "tmux: {}", String::from_utf8_lossy(&out.stderr));
        t
    }

    fn tmux(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-u")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .env("LANG", "C.UTF-8")
            .env("TERM", "xterm-256color")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Type `text` (literally) and, with `enter`, Enter.
    fn type_line(&self, text: &str, enter: bool) {
        assert!(self.tmux(&["send-keys", "-t", "top", "-l", text]).status.success());
        if enter {
            assert!(self.tmux(&["send-keys", "-t", "top", "Enter"]).status.success());
        }
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.tmux(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }

    /// Poll the screen until `ok` holds for it (returns it), or fail with the last one.
    fn until(&self, what: &str, within: Duration, ok: impl Fn(&str) -> bool) -> String {
        let mut last = String::new();
        if eventually(within, || {
            last = self.screen();
            ok(&last)
        }) {
            return last;
        }
        panic!("{what}: not on screen within {within:?}:\n{last}");
    }

    fn alternate_on(&self) -> bool {
        let out = self.tmux(&["display-message", "-p", "-t", "top", "#{alternate_on}"]);
        String::from_utf8_lossy(&out.stdout).trim() == "1"
    }

    /// The pid of the command the pane's shell runs now.
    fn foreground_child(&self) -> u32 {
        let out = self.tmux(&["display-message", "-p", "-t", "top", "#{pane_pid}"]);
        let shell = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let children = std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children")).unwrap();
        children.split_whitespace().next().unwrap().parse().unwrap()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.tmux(&["kill-server"]);
    }
}

fn settings_kept(dir: &std::path::Path, run: u32) {
    let before = std::fs::read_to_string(dir.join(format!("stty-before-{run}"))).unwrap();
    let after = std::fs::read_to_string(dir.join(format!("stty-after-{run}"))).unwrap();
    assert!(!before.trim().is_empty());
    assert_eq!(before, after, "run {run}: the terminal's settings changed");
}

#[test]
fn emu_top_live_view_shows_the_queues_suspended_and_resumed_and_restores_the_terminal() {
    no_kfd_processes();
    let w = workload("0x1000");
    let pid = w.pid();
    let dir = std::env::temp_dir().join(format!("gpreempt-top-{pid}"));
    std::fs::create_dir_all(&dir).unwrap();
    let gpreempt = binary("gpreempt").unwrap();
    let tmux = Tmux::start();
    let run = |n: u32| {
        format!(
            "stty -g > {d}/stty-before-{n}; {g} top --no-agent --interval 250ms; echo top-exit-{n}=$?; stty -g > {d}/stty-after-{n}",
            d = dir.display(),
            g = gpreempt.display()
        )
    };
    tmux.type_line(&run(1), true);
    let screen = tmux.until("the process table", ATTACH, |s| s.contains("KFD processes (1 shown)"));
    assert!(tmux.alternate_on(), "the view draws on the alternate screen");
    let lines: Vec<&str> = screen.lines().collect();
    let p = pid.to_string();
    assert_eq!(
        tokens_of(&lines, &p).unwrap(),
        [&p, "-", "emu-workload", "0x1000", "2", "0,1", "active*", "0", "0"],
        "{screen}"
    );
    assert_eq!(gpu_row(&lines, "0x1000").unwrap(), ["0x1000", "1", "2", "2", "0", "0", "0", "0", "0"], "{screen}");

    // Sort and filter keys.
    tmux.type_line("s", false);
    tmux.until("sort by comm", 30 * SECOND, |s| s.lines().next().is_some_and(|l| l.ends_with("sort comm")));
    tmux.type_line("/nomatch", false);
    tmux.until("the filter being typed", 30 * SECOND, |s| s.contains("filter: nomatch_"));
    tmux.type_line("", true);
    tmux.until("nothing matches", 30 * SECOND, |s| s.contains("KFD processes (0 shown)"));
    tmux.type_line("c", false);
    tmux.until("filter cleared", 30 * SECOND, |s| s.contains("KFD processes (1 shown)"));
    tmux.type_line(&format!("/{pid}"), false);
    tmux.type_line("", true);
    tmux.until("filtered on the pid", 30 * SECOND, |s| {
        s.contains("KFD processes (1 shown)")
            && s.lines().next().is_some_and(|l| l.ends_with(&format!("filter \"{pid}\"")))
    });

    // `preempt` holds both queues: suspended on screen, with the suspend span.
    let preempt = Command::new(&gpreempt)
        .args(["preempt", "--offline", &p, "--iterations", "1", "--hold", "120000ms", "--no-trace", "--quiet"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let screen = tmux.until("the queues suspended", ATTACH, |s| {
        let lines: Vec<&str> = s.lines().collect();
        tokens_of(&lines, &pid.to_string()).is_some_and(|r| r[6] == "suspended")
            && span_row(s, "suspend", pid).is_some()
    });
    let lines: Vec<&str> = screen.lines().collect();
    assert_eq!(
        tokens_of(&lines, &p).unwrap(),
        [&p, "-", "emu-workload", "0x1000", "2", "0,1", "suspended", "0", "1"],
        "{screen}"
    );
    assert_eq!(gpu_row(&lines, "0x1000").unwrap(), ["0x1000", "1", "2", "0", "0", "2", "0", "1", "0"], "{screen}");
    let span = span_row(&screen, "suspend", pid).unwrap();
    assert_eq!(
        (&span[3], &span[4], &span[5]),
        (&"emu-workload".to_owned(), &"0x1000".to_owned(), &"2".to_owned()),
        "{screen}"
    );
    // The driver's time: the suspend took some, and the fence wait is inside the unmap.
    let us = |s: &str| s.parse::<f64>().unwrap_or_else(|_| panic!("{s}: {screen}"));
    assert!(us(&span[6]) > 0.0 && us(&span[8]) <= us(&span[7]) && us(&span[7]) <= us(&span[6]), "{span:?}");

    // Ctrl-C ends the hold: the queues resume, active again (seen by the tracer: no `*`).
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(preempt.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let out = preempt.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let screen = tmux.until("the queues resumed", ATTACH, |s| {
        let lines: Vec<&str> = s.lines().collect();
        tokens_of(&lines, &pid.to_string()).is_some_and(|r| r[6] == "active") && span_row(s, "resume", pid).is_some()
    });
    let lines: Vec<&str> = screen.lines().collect();
    // The RESUME_QUEUES of both queues, then DISABLE's own resume at detach
    // (kfd_dbg_trap_deactivate calls resume_queues(target, 0, NULL), 6.12 kfd_debug.c; nothing
    // is left suspended, so it handles no queue), which the view may not have drained yet: the
    // GPU counts every resume span the view lists.
    let resumes = span_rows(&screen, "resume", pid);
    assert_eq!(resumes.iter().filter(|r| r[5] == "2").count(), 1, "{screen}");
    let n = resumes.len().to_string();
    assert_eq!(gpu_row(&lines, "0x1000").unwrap(), ["0x1000", "1", "2", "2", "0", "0", "0", "1", &n], "{screen}");

    // A scripted TTM eviction (the emulator runs kfd_process_evict_queues, per device: both
    // emulated GPUs): evicted on screen, then, restored, one eviction span per GPU.
    std::fs::write("/sys/kernel/kfd_emu/evict", &p).unwrap();
    let screen = tmux.until("the queues evicted", ATTACH, |s| {
        tokens_of(&s.lines().collect::<Vec<_>>(), &pid.to_string()).is_some_and(|r| r[6] == "evicted")
    });
    let lines: Vec<&str> = screen.lines().collect();
    let n = span_rows(&screen, "resume", pid).len().to_string();
    assert_eq!(gpu_row(&lines, "0x1000").unwrap(), ["0x1000", "1", "2", "0", "2", "0", "0", "1", &n], "{screen}");
    std::fs::write("/sys/kernel/kfd_emu/restore", &p).unwrap();
    let screen = tmux.until("the eviction spans", ATTACH, |s| {
        let lines: Vec<&str> = s.lines().collect();
        tokens_of(&lines, &pid.to_string()).is_some_and(|r| r[6] == "active")
            && gpu_row(&lines, "0x2000").is_some_and(|r| r[6] == "1")
            && gpu_row(&lines, "0x1000").is_some_and(|r| r[6] == "1")
    });
    let lines: Vec<&str> = screen.lines().collect();
    assert_eq!(
        tokens_of(&lines, &p).unwrap(),
        [&p, "-", "emu-workload", "0x1000", "2", "0,1", "active", "2", "1"],
        "{screen}"
    );
    let n = span_rows(&screen, "resume", pid).len().to_string();
    assert_eq!(gpu_row(&lines, "0x1000").unwrap(), ["0x1000", "1", "2", "2", "0", "0", "1", "1", &n], "{screen}");
    assert_eq!(gpu_row(&lines, "0x2000").unwrap(), ["0x2000", "0", "0", "0", "0", "0", "1", "0", "0"], "{screen}");
    let eviction = span_row(&screen, "eviction/ttm", pid).unwrap_or_else(|| panic!("no eviction span: {screen}"));
    assert_eq!((&eviction[3], &eviction[5]), (&"emu-workload".to_owned(), &"0".to_owned()), "{screen}");

    // `q` quits: the shell's next line runs, the terminal as it was.
    tmux.type_line("q", false);
    tmux.until("top's exit status", 30 * SECOND, |s| s.contains("top-exit-1=0"));
    assert!(!tmux.alternate_on(), "the alternate screen was left");
    settings_kept(&dir, 1);

    // SIGTERM: the same.
    tmux.type_line(&run(2), true);
    tmux.until("the second view", ATTACH, |s| s.contains("KFD processes (1 shown)"));
    let top = tmux.foreground_child();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(top as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let screen = tmux.until("top's exit status after SIGTERM", 30 * SECOND, |s| s.contains("top-exit-2=0"));
    assert!(screen.contains("gpreempt: top stopped by SIGTERM"), "{screen}");
    assert!(!tmux.alternate_on(), "the alternate screen was left");
    settings_kept(&dir, 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A plain HTTP/1.0 GET of the agent's `/metrics` (it answers without chunking).
fn exposition(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(30 * SECOND)).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

#[test]
fn emu_top_shows_the_agents_scheduler_per_gpu() {
    no_kfd_processes();
    let offline = workload("0x1000");
    // Six 20 ms requests, 150 ms apart, on 0x1000, once told `go`.
    let mut online = LineHelper::spawn("emu-workload", &gpreempt_tests::emu_workload::online_server("6")).unwrap();
    let dir = std::env::temp_dir().join(format!("gpreempt-top-agent-{}", offline.pid()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[[policy]]\nname = \"colo\"\nonline = [\"{}\"]\noffline = [\"{}\"]\nidle = \"5ms\"\npoll = \"200us\"\n",
            online.pid(),
            offline.pid()
        ),
    )
    .unwrap();
    let mut agent = gpreempt_tests::agent::spawn(Some(&config)).unwrap();
    let mut addr = None;
    let deadline = std::time::Instant::now() + ATTACH;
    while let Some(line) = agent.next_line(deadline.saturating_duration_since(std::time::Instant::now())) {
        if let Some(a) = line.split_whitespace().find_map(|kv| kv.strip_prefix("metrics_addr=")) {
            addr = Some(a.to_owned());
        }
        if line.contains("msg=\"policy started\"") {
            break;
        }
    }
    let addr = addr.expect("the agent never started");
    // The requests: the policy suspends the offline queues during them and resumes after.
    online.send("go").unwrap();
    for _ in 0..7 {
        online.recv().unwrap();
    }
    // Settled: every suspend resumed, the same on two reads a second apart.
    let counts = |text: &str| {
        let of =
            |t: &str| series(text, "gpreempt_scheduler_transitions_total", &["policy=\"colo\"", "gpu_id=\"4096\"", t]);
        (of("transition=\"suspend\""), of("transition=\"resume\""))
    };
    let mut last = (u64::MAX, 0);
    assert!(
        eventually(120 * SECOND, || {
            let now = counts(&exposition(&addr));
            let settled = now == last && now.0 == now.1 && now.0 >= 1;
            last = now;
            std::thread::sleep(SECOND);
            settled
        }),
        "the policy never settled: {last:?}"
    );
    let text = exposition(&addr);
    let reactions = series(&text, "gpreempt_scheduler_reaction_seconds_count", &["policy=\"colo\"", "gpu_id=\"4096\""]);
    let out = top(&["--json", "--agent", &addr, "--interval", "500ms"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &v["scheduler"];
    assert_eq!((&s["source"], &s["error"]), (&json!(format!("http://{addr}/metrics")), &Value::Null), "{s:#}");
    let gpus = s["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 1, "{s:#}");
    let g = &gpus[0];
    assert_eq!(
        (&g["policy"], &g["gpu_id"], &g["state"], &g["suspends"], &g["resumes"], &g["reactions"]),
        (&json!("colo"), &json!(0x1000), &json!("running"), &json!(last.0), &json!(last.1), &json!(reactions)),
        "{g:#}"
    );
    // Between the requests the offline queue runs: active in the tracer's view too.
    let p = v["processes"].as_array().unwrap().iter().find(|p| p["pid"] == offline.pid()).unwrap();
    assert_eq!(p["gpus"][0]["queues"][0]["state"], "active", "{p:#}");
    agent.signal(nix::sys::signal::Signal::SIGTERM).unwrap();
    assert!(agent.wait().unwrap().success());
    std::fs::remove_dir_all(&dir).unwrap();
}
