//! `gpreempt ps` on the real driver: a process that opens /dev/kfd appears in the KFD sysfs tree
//! (created by `kfd_create_process`) and `ps --wait-new` reports exactly its pid.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
};

use gpreempt_tests::{binary, field};

#[test]
fn wait_new_reports_the_pid_of_a_new_kfd_process() {
    gpreempt_tests::skip_without_kfd_open!();
    let mut waiter = Command::new(binary("gpreempt").unwrap())
        .args(["ps", "--wait-new", "--ids-only", "--timeout", "60s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Start the client only once the waiter has its baseline (its start-up under TCG over 9p can
    // take seconds; a fixed sleep raced with it).
    let mut ready = String::new();
    BufReader::new(waiter.stderr.take().unwrap()).read_line(&mut ready).unwrap();
    assert!(ready.starts_with("gpreempt: waiting for a new KFD process ("), "{ready}");
    let mut client = Command::new(binary("kfd-client").unwrap())
        // Long enough for `ps --json` below even on a loaded TCG host; killed once checked.
        .args(["hold", "--ms", "60000"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let out = waiter.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), client.id().to_string());

    // While it holds /dev/kfd, `ps --json` lists it with no queues (no GPU) and its identity.
    let ps = Command::new(binary("gpreempt").unwrap()).args(["ps", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&ps.stdout).unwrap();
    let me = v["processes"].as_array().unwrap().iter().find(|p| p["pid"] == client.id()).cloned().unwrap();
    assert_eq!(me["queues"], serde_json::json!([]));
    assert_eq!(me["info"]["comm"], "kfd-client");
    assert_eq!(me["info"]["ns_pid"], client.id());
    assert_eq!(field(&me["info"], "container"), &serde_json::Value::Null, "a host process");
    client.kill().unwrap();
    client.wait().unwrap();
}

#[test]
fn wait_new_times_out_with_a_clear_error() {
    let out = Command::new(binary("gpreempt").unwrap())
        .args(["ps", "--wait-new", "--container", "nope", "--timeout", "1s"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    // The other test may hold a KFD process meanwhile, so the count in the first line varies.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(lines[0].starts_with("gpreempt: waiting for a new KFD process in container nope ("), "{stderr}");
    assert_eq!(lines[1], "gpreempt: error: no new KFD process in container nope appeared within 1.0 s");
}
