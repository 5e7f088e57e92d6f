//! `gpreempt trace` against the real amdgpu driver: the queue ioctls a helper makes come out of
//! the tracer with exactly the values it passed, for exactly its pid, with the driver's result.
//! Without a GPU every create fails in `kfd_ioctl_create_queue` ("Could not find gpu id") and
//! every destroy in `pqm_destroy_queue` ("Queue id does not match any known queue"): EINVAL.

use std::{
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use gpreempt_tests::{Tracer, binary, events_of, field, kfd_client, summary};

#[test]
fn create_queue_arguments_and_result_are_traced_exactly() {
    gpreempt_tests::skip_without_kfd_open!();
    let tracer = Tracer::start(&[]).unwrap();
    let (pid, report) = kfd_client(&[
        "create",
        "--gpu-id",
        "0x1234",
        "--type",
        "compute-aql",
        "--ring-size",
        "65536",
        "--priority",
        "7",
        "--percentage",
        "55",
        "--ring-base",
        "0x7f1200000000",
    ])
    .unwrap();
    assert_eq!(report["results"]["EINVAL"], 1, "no GPU: the driver rejects gpu id 0x1234");
    let objects = tracer.stop().unwrap();

    let creates = events_of(&objects, pid, "queue_create");
    assert_eq!(creates.len(), 1, "exactly one create event for pid {pid}: {objects:?}");
    let e = creates[0];
    assert_eq!(e["comm"], "kfd-client");
    assert_eq!(e["gpu_id"], 0x1234);
    assert_eq!(e["queue_type"], "compute-aql");
    assert_eq!(e["ring_size"], 65536);
    assert_eq!(e["priority"], 7);
    assert_eq!(e["percentage"], 55);
    assert_eq!(e["ring_base"], 0x7f12_0000_0000u64);
    assert_eq!(e["write_pointer"], 0x7f13_0000_0000u64);
    assert_eq!(e["read_pointer"], 0x7f13_0000_0008u64);
    assert_eq!(e["result"], "EINVAL");
    assert_eq!(e["ret"], -22);
    assert_eq!(field(e, "queue_id"), &serde_json::Value::Null, "a failed create has no queue id");
    assert_eq!(e["tid"], pid, "single-threaded helper: tid == pid");
    assert!(e["duration_ns"].as_u64().unwrap() > 0);

    let s = summary(&objects).unwrap();
    assert_eq!(s["dropped"], 0);
}

#[test]
fn destroy_queue_id_and_result_are_traced_exactly() {
    gpreempt_tests::skip_without_kfd_open!();
    let tracer = Tracer::start(&[]).unwrap();
    let (pid, report) = kfd_client(&["destroy", "--queue-id", "42"]).unwrap();
    assert_eq!(report["results"]["EINVAL"], 1);
    let objects = tracer.stop().unwrap();

    let destroys = events_of(&objects, pid, "queue_destroy");
    assert_eq!(destroys.len(), 1, "{objects:?}");
    assert_eq!(destroys[0]["queue_id"], 42);
    assert_eq!(destroys[0]["result"], "EINVAL");
    assert_eq!(destroys[0]["ret"], -22);
    assert_eq!(summary(&objects).unwrap()["dropped"], 0);
}

#[test]
fn a_thousand_creates_give_exactly_a_thousand_events_and_no_drops() {
    gpreempt_tests::skip_without_kfd_open!();
    let tracer = Tracer::start(&[]).unwrap();
    let (pid, report) =
        kfd_client(&["create", "--gpu-id", "0x5678", "--type", "compute", "--priority", "3", "--count", "1000"])
            .unwrap();
    assert_eq!(report["results"]["EINVAL"], 1000);
    let objects = tracer.stop().unwrap();

    let creates = events_of(&objects, pid, "queue_create");
    assert_eq!(creates.len(), 1000);
    assert!(creates.iter().all(|e| e["gpu_id"] == 0x5678 && e["queue_type"] == "compute" && e["priority"] == 3));
    assert!(creates.iter().all(|e| e["result"] == "EINVAL"));
    let s = summary(&objects).unwrap();
    assert_eq!(s["dropped"], 0);
    assert_eq!(s["losses"]["ringbuf_full"], 0);
    assert_eq!(s["losses"]["entry_missing"], 0);
}

#[test]
fn pid_filter_keeps_only_that_process() {
    gpreempt_tests::skip_without_kfd_open!();
    // The chosen process destroys queue 55 ten times a second for the whole trace; another
    // process destroys queue 7 while the trace runs.
    let mut chosen = Command::new(binary("kfd-client").unwrap())
        .args(["destroy", "--queue-id", "55", "--count", "1200", "--rate", "10"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = chosen.id();
    let tracer = Tracer::start(&["--pid", &pid.to_string()]).unwrap();
    let (other_pid, _) = kfd_client(&["destroy", "--queue-id", "7"]).unwrap();
    thread::sleep(Duration::from_millis(1500));
    let objects = tracer.stop().unwrap();
    chosen.kill().unwrap();
    chosen.wait().unwrap();

    let mine = events_of(&objects, pid, "queue_destroy");
    assert!(!mine.is_empty(), "the chosen process's destroys are shown: {objects:?}");
    assert!(mine.iter().all(|e| e["queue_id"] == 55 && e["result"] == "EINVAL"), "{mine:?}");
    assert!(events_of(&objects, other_pid, "queue_destroy").is_empty(), "{objects:?}");
    assert!(objects.iter().all(|o| o["pid"].is_null() || o["pid"] == pid || o["owner_pid"] == pid), "{objects:?}");
    assert_eq!(summary(&objects).unwrap()["dropped"], 0);
}
