//! Every way out of a `gpreempt preempt` session on the real driver (6.12: the debug trap works
//! without a GPU, docs/kfd.md §2.1) leaves the target running, untraced and answering, whatever
//! the target does meanwhile: real-time and glibc-internal signals (finding 1), a vfork that
//! keeps it from reaching the detach stop (finding 6), and gpreempt's stdout going away
//! (finding 9). The target is `seized-target`, whose main thread — the seized one — answers
//! commands on stdin. 6.1 has no debug trap: these tests are skipped there.

use std::{
    process::{Child, Command, Stdio},
    sync::mpsc::Receiver,
    thread,
    time::{Duration, Instant},
};

use gpreempt::{controller::tracee::DETACH_DEADLINE, kfd::Device};
use gpreempt_tests::{
    LineHelper, binary,
    controller::spawn_preempt,
    exit_and_last_line, skip,
    target::{eventually, state, tracer_pid},
};
use nix::{sys::signal::Signal, unistd::Pid};

const SECOND: Duration = Duration::from_secs(1);

fn debug_trap_kernel() -> bool {
    Device::open().and_then(|d| d.version()).is_ok_and(gpreempt::kfd::KfdVersion::has_debug_trap)
}

fn target() -> LineHelper {
    let t = LineHelper::spawn("seized-target", &[]).unwrap();
    assert_eq!(t.hello["runtime_enable"], 0, "{}", t.hello);
    t
}

/// `gpreempt preempt --no-trace` on queue 0 (no GPU: INVALID, docs/kfd.md §2.4) with 5 ms holds
/// and gaps for far longer than the test, returned once attached, with its stderr lines.
fn spawn_endless(pid: u32) -> (Child, Receiver<String>) {
    let pid = pid.to_string();
    spawn_preempt(&["--offline", &pid, "--iterations", "1000000", "--hold", "5ms", "--gap", "5ms", "--queues", "0"])
}

fn signal(pid: u32, signal: Signal) {
    nix::sys::signal::kill(Pid::from_raw(pid as i32), signal).unwrap();
}

/// The last stderr line once `child` has exited.
fn last_stderr_line(stderr: &Receiver<String>) -> String {
    thread::sleep(Duration::from_millis(100));
    stderr.try_iter().last().unwrap_or_default()
}

#[test]
fn finding_1_realtime_and_glibc_internal_signals_reach_the_seized_target_and_the_session_goes_on() {
    gpreempt_tests::skip_without_kfd_open!();
    if !debug_trap_kernel() {
        skip!("KFD {:?} has no debug trap: nothing seizes the target", Device::open().and_then(|d| d.version()));
    }
    let mut t = target();
    let pid = t.pid();
    let rtmin = t.hello["sigrtmin"].as_i64().unwrap() as i32;
    assert_eq!(t.cmd("cancel").unwrap()["cancel"], 0, "glibc's SIGCANCEL handler is installed");
    let (mut child, stderr) = spawn_endless(pid);
    assert_eq!(tracer_pid(pid).unwrap(), child.id());

    // POSIX real-time signals, queued: SIGRTMIN+n n+1 times each.
    for n in 0..4 {
        for _ in 0..=n {
            let value = libc::sigval { sival_ptr: std::ptr::null_mut() };
            // SAFETY: sigqueue with a plain value.
            assert_eq!(unsafe { libc::sigqueue(pid as i32, rtmin + n, value) }, 0);
        }
    }
    // glibc's SIGCANCEL (32) to the main thread, as pthread_cancel sends it (tgkill).
    for _ in 0..2 {
        // SAFETY: tgkill to the target's main thread.
        assert_eq!(unsafe { libc::syscall(libc::SYS_tgkill, pid as i32, pid as i32, 32) }, 0);
    }
    // SIGSETXID (33): setresuid in another thread returns only once the main thread ran
    // glibc's handler.
    assert_eq!(t.cmd("setxid").unwrap()["setxid"], 0);
    // The main thread answers, and every real-time signal ran its handler exactly once.
    assert_eq!(t.cmd("counts").unwrap()["rt"], serde_json::json!([1, 2, 3, 4]));
    assert!(!matches!(state(pid), Ok('t')), "the target is left in a ptrace stop");
    thread::sleep(SECOND);
    assert!(child.try_wait().unwrap().is_none(), "gpreempt gave up: {:?}", stderr.try_iter().collect::<Vec<_>>());
    assert_eq!(tracer_pid(pid).unwrap(), child.id(), "still seized");

    signal(child.id(), Signal::SIGINT);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(1));
    let last = last_stderr_line(&stderr);
    assert!(last.starts_with("gpreempt: error: interrupted by SIGINT after "), "{last}");
    assert!(last.ends_with("queues resumed, target detached"), "{last}");
    assert_eq!(tracer_pid(pid).unwrap(), 0);
    assert_eq!(t.cmd("counts").unwrap()["rt"], serde_json::json!([1, 2, 3, 4]));
}

#[test]
fn finding_6_a_vfork_parent_does_not_hang_detach_and_a_second_ctrl_c_exits_at_once() {
    gpreempt_tests::skip_without_kfd_open!();
    if !debug_trap_kernel() {
        skip!("KFD {:?} has no debug trap: nothing seizes the target", Device::open().and_then(|d| d.version()));
    }
    // The vfork child sleeps far longer than the detach deadline plus a generous margin.
    const CHILD_MS: u64 = 20_000;
    let bound = DETACH_DEADLINE + 8 * SECOND;
    assert!(bound < Duration::from_millis(CHILD_MS));
    let mut t = target();
    let pid = t.pid();
    for second_signal in [false, true] {
        let (mut child, stderr) = spawn_endless(pid);
        assert_eq!(t.cmd(&format!("vfork {CHILD_MS}")).unwrap()["vforking"], true);
        // A vfork parent waits killable in wait_for_vfork_done (kernel/fork.c, 6.12): state D.
        assert!(eventually(10 * SECOND, || state(pid).ok() == Some('D')), "not in the vfork wait: {:?}", state(pid));
        let start = Instant::now();
        signal(child.id(), Signal::SIGINT);
        if second_signal {
            thread::sleep(Duration::from_millis(300));
            signal(child.id(), Signal::SIGINT);
        }
        let status = child.wait().unwrap();
        let took = start.elapsed();
        assert!(took < bound, "gpreempt took {took:?} to exit (the vfork child execs after {CHILD_MS} ms)");
        if second_signal {
            // The second SIGINT's `_exit(128 + SIGINT)`, wherever the cleanup was.
            assert_eq!(status.code(), Some(130), "{status}");
        } else {
            assert_eq!(status.code(), Some(1), "{status}");
            let last = last_stderr_line(&stderr);
            assert!(last.starts_with("gpreempt: error: interrupted by SIGINT after "), "{last}");
        }
        // The kernel ends the ptrace link with the tracer (exit_ptrace, kernel/ptrace.c, 6.12).
        assert!(eventually(10 * SECOND, || tracer_pid(pid).ok() == Some(0)), "still traced");
        // When the child execs, the parent runs on: not left in the interrupt's ptrace stop.
        let done = t.recv().unwrap();
        assert_eq!((done["vforked"].as_bool(), done["status"].as_i64()), (Some(true), Some(0)), "{done}");
        assert_eq!(t.cmd("counts").unwrap()["usr1"], 0);
        assert!(!matches!(state(pid), Ok('t' | 'T')), "{:?}", state(pid));
    }
}

#[test]
fn finding_9_a_closed_stdout_does_not_stop_the_json_record_or_the_cleanup() {
    gpreempt_tests::skip_without_kfd_open!();
    if !debug_trap_kernel() {
        skip!("KFD {:?} has no debug trap: preempt refuses before printing", Device::open().and_then(|d| d.version()));
    }
    let t = target();
    let pid = t.pid();
    let json = std::env::temp_dir().join(format!("exits-epipe-{pid}.json"));
    // A reader that went away (`gpreempt … | head -c1` after head exited): writes fail with EPIPE.
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    let out = Command::new(binary("gpreempt").unwrap())
        .args(["preempt", "--no-trace", "--offline", &pid.to_string(), "--iterations", "20", "--hold", "0ms"])
        .args(["--gap", "0ms", "--queues", "0", "--output", json.to_str().unwrap()])
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(doc["iterations"].as_array().unwrap().len(), 20);
    assert_eq!(doc["detached"]["disabled"], true);
    assert_eq!(tracer_pid(pid).unwrap(), 0);
}

#[test]
fn finding_9_a_symlinked_json_path_is_refused_and_its_target_untouched() {
    gpreempt_tests::skip_without_kfd_open!();
    if !debug_trap_kernel() {
        skip!("KFD {:?} has no debug trap: preempt refuses before writing", Device::open().and_then(|d| d.version()));
    }
    let t = target();
    let pid = t.pid();
    let dir = std::env::temp_dir().join(format!("exits-symlink-{pid}"));
    std::fs::create_dir_all(&dir).unwrap();
    let victim = dir.join("victim");
    std::fs::write(&victim, "keep\n").unwrap();
    let link = dir.join("run.json");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let out = Command::new(binary("gpreempt").unwrap())
        .args(["preempt", "--no-trace", "--offline", &pid.to_string(), "--iterations", "2", "--hold", "0ms"])
        .args(["--gap", "0ms", "--queues", "0", "--output", link.to_str().unwrap()])
        .output()
        .unwrap();
    let (code, last, stderr) = exit_and_last_line(&out);
    assert_eq!(
        (code, last),
        (
            Some(1),
            format!(
                "gpreempt: error: {} is a symbolic link; gpreempt does not write through links (give the real path)",
                link.display()
            )
        ),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep\n");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2, "no temporary file left behind");
    assert_eq!(tracer_pid(pid).unwrap(), 0);
}
