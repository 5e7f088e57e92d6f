//! `gpreempt queues --watch` on the KFD emulator: the view reads sysfs, and the in-process tracer
//! adds what only it sees of a queue created during the watch — without any debug-trap call and
//! without a runlist refresh of its own (the tracer counts `execute_queues_cpsch` by caller).

use std::{
    process::{Command, Stdio},
    sync::mpsc::RecvTimeoutError,
    thread,
    time::{Duration, Instant},
};

use gpreempt_tests::{LineHelper, binary, stderr_lines, target::tracer_pid};
use serde_json::{Value, json};

/// Under TCG the in-process tracer alone takes tens of seconds to start.
const LONG: Duration = Duration::from_secs(240);

#[test]
fn queues_watch_shows_what_the_tracer_saw_of_a_queue_created_meanwhile_and_refreshes_no_runlist() {
    let mut w =
        LineHelper::spawn("emu-workload", &["run", "--gpu-id", "0x1000", "--queues", "1", "--runtime-enable"]).unwrap();
    let pid = w.pid();
    let mut child = Command::new(binary("gpreempt").unwrap())
        .args(["queues", &pid.to_string(), "--watch", "100ms", "--duration", "600s", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = stderr_lines(child.stderr.take().unwrap(), "gpreempt queues");
    let deadline = Instant::now() + LONG;
    let mut said = Vec::new();
    loop {
        match stderr.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.contains("gpreempt: tracer attached") => break,
            Ok(line) => said.push(line),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                panic!("the tracer never attached: {said:?}")
            }
        }
    }
    // A second queue: compute AQL on gpu 0x1000, ring 4096 bytes, 100 %, priority 7.
    let created = w.cmd("create 4096 2 4096 100 7").unwrap();
    assert_eq!((created["ret"].as_i64(), created["queue_id"].as_u64()), (Some(0), Some(1)));
    // Several 100 ms samples after it.
    thread::sleep(Duration::from_millis(1500));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{said:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["source"], "sysfs");
    let traced = v["tracer"]["queues"].as_array().unwrap();
    // Only the queue created while watching: queue 0 predates the tracer.
    assert_eq!(traced.len(), 1, "{traced:?}");
    let q = &traced[0];
    assert_eq!(
        (&q["queue_id"], &q["gpu_id"], &q["queue_type"], &q["ring_size"], &q["percentage"], &q["priority"]),
        (&json!(1), &json!(4096), &json!("compute-aql"), &json!(4096), &json!(100), &json!(7)),
        "{q}"
    );
    assert_eq!(q["destroyed_ms"], Value::Null);
    assert!(q["created_ms"].as_f64().unwrap() > 0.0, "{q}");
    let rptr = q["read_pointer_address"].as_u64().unwrap();
    assert_ne!(rptr, 0);
    // The last sample: both queues from sysfs, the new one with the tracer's addresses.
    let rows = v["queues"].as_array().unwrap();
    let ids: Vec<&Value> = rows.iter().map(|r| &r["queue_id"]).collect();
    assert_eq!(ids, [0, 1]);
    assert_eq!((&rows[0]["ring_base"], &rows[0]["read_pointer_address"]), (&Value::Null, &Value::Null));
    assert_eq!(rows[1]["read_pointer_address"].as_u64(), Some(rptr));
    assert_eq!(rows[1]["ring_base"], q["ring_base"]);
    assert_eq!(rows[1]["cwsr_address"], q["cwsr_address"]);
    // The view refreshed no runlist; the workload's new active queue did, once (the emulator's
    // create_queue_cpsch executes the runlist for an active queue, as 6.12's does).
    let refreshes = &v["tracer"]["runlist_refreshes"];
    assert_eq!((refreshes["by_this_process"].as_u64(), refreshes["by_the_process"].as_u64()), (Some(0), Some(1)));
    assert_eq!(tracer_pid(pid).unwrap(), 0);
}
