//! Exit paths and side effects that need real queues (KFD emulator pass): the out-of-process
//! watchdog gets a stopped controller's hold released (finding 3), and `gpreempt queues` looks
//! without preempting anything unless asked to (finding 8).

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use gpreempt_tests::{
    LineHelper, Tracer, binary,
    controller::advances,
    target::{eventually, tracer_pid},
};
use nix::{sys::signal::Signal, unistd::Pid};

const SECOND: Duration = Duration::from_secs(1);

fn workload(args: &[&str]) -> LineHelper {
    LineHelper::spawn("emu-workload", &[&["run"], args].concat()).unwrap()
}

#[test]
fn finding_3_a_stopped_controller_holding_queues_is_killed_by_its_watchdog_and_the_queues_run_again() {
    const MAX_SUSPEND_MS: u64 = 1500;
    let offline = workload(&["--gpu-id", "0x1000", "--queues", "1", "--runtime-enable"]);
    let pid = offline.pid();
    let address = offline.hello["queues"][0]["rptr"].as_u64().unwrap();
    let max = format!("{MAX_SUSPEND_MS}ms");
    let child = Command::new(binary("gpreempt").unwrap())
        .args(["preempt", "--no-trace", "--offline", &pid.to_string(), "--iterations", "1", "--hold", "60000ms"])
        .args(["--max-suspend", &max])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The hold has begun: the read index stops. Then the controller is stopped, as by Ctrl-Z.
    assert!(eventually(30 * SECOND, || !advances(pid, address)), "never suspended");
    nix::sys::signal::kill(Pid::from_raw(child.id() as i32), Signal::SIGSTOP).unwrap();
    let stopped = Instant::now();
    // The queue runs again within --max-suspend + 1 s of the stop (the hold began earlier).
    let mut resumed = None;
    while stopped.elapsed() < 30 * SECOND {
        let window = stopped.elapsed();
        if advances(pid, address) {
            resumed = Some(window);
            break;
        }
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let resumed = resumed.expect("the queue never ran again");
    assert!(
        resumed < Duration::from_millis(MAX_SUSPEND_MS) + SECOND,
        "the queue ran again only {resumed:?} after the controller stopped: {stderr}"
    );
    // SIGKILL from the watchdog; KFD resumed the queues at the debugger's exit (docs/kfd.md §2.7).
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&out.status), Some(libc::SIGKILL), "{stderr}");
    assert!(stderr.contains("gpreempt watchdog: queues stayed suspended past --max-suspend"), "{stderr}");
    assert!(eventually(10 * SECOND, || tracer_pid(pid).ok() == Some(0)), "still traced");
    assert!(advances(pid, address));
}

/// `execute_queues_cpsch` calls made by process `caller` (the ioctl's caller is the event's pid).
fn executes_by(objects: &[serde_json::Value], caller: u32) -> usize {
    objects
        .iter()
        .filter(|o| {
            o["event"] == "kfd_call"
                && o["pid"] == caller
                && o["function"].as_str().is_some_and(|f| f.starts_with("execute_queues_cpsch"))
        })
        .count()
}

#[test]
fn finding_8_queues_reads_sysfs_without_preempting_and_only_the_debug_snapshot_preempts() {
    let tracer = Tracer::start(&[]).unwrap();
    let w = workload(&["--gpu-id", "0x1000", "--queues", "2", "--runtime-enable"]);
    let pid = w.pid().to_string();
    let run = |extra: &[&str]| {
        let child = Command::new(binary("gpreempt").unwrap())
            .args(["queues", &pid, "--json"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let caller = child.id();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (caller, v, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (quiet, default, default_err) = run(&[]);
    assert_eq!(default["source"], "sysfs");
    let ids: Vec<&serde_json::Value> = default["queues"].as_array().unwrap().iter().map(|q| &q["queue_id"]).collect();
    assert_eq!(ids, [0, 1]);
    assert_eq!(default_err, "", "nothing to warn about");
    let (loud, snapshot, snapshot_err) = run(&["--debug-snapshot"]);
    assert_eq!(snapshot["source"], "debug_trap");
    assert_eq!(snapshot["queues"].as_array().unwrap().len(), 2);
    assert!(snapshot_err.contains("debug ENABLE and DISABLE each preempt every queue"), "{snapshot_err}");
    let objects = tracer.stop().unwrap();
    assert_eq!(executes_by(&objects, quiet), 0, "the default path touched the runlist");
    // ENABLE refreshes the runlist of both emulated GPUs (the process has a device on each): 2;
    // DISABLE resumes the process's queues, one execute on the GPU holding them (0x1000), and
    // refreshes both runlists again: 3 (kfd_dbg_trap_activate/_deactivate, 6.12).
    assert_eq!(executes_by(&objects, loud), 5);
    assert_eq!(tracer_pid(w.pid()).unwrap(), 0);
}
