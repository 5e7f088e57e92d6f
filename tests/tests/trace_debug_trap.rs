//! The debug-trap path against the real driver (6.12 = KFD 1.17; 6.1 has no debugger API): a
//! target that RUNTIME_ENABLEs itself, debugged by `trace-debugger` through PTRACE_SEIZE +
//! DBG_TRAP ENABLE / SUSPEND_QUEUES [0,1] / RESUME_QUEUES [0,1] / DISABLE. Without a GPU the
//! target has no queues: SUSPEND and RESUME handle 0 queues and return both ids with bit 31
//! (INVALID) set; the kernel's `suspend_queues`/`resume_queues` show exactly that.

use std::{
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use gpreempt_tests::{Tracer, binary, events_of, objects_where, summary, vm_kernel};
use serde_json::{Value, json};

fn run_debugger() -> Value {
    let out = Command::new(binary("trace-debugger").unwrap()).output().unwrap();
    assert!(out.status.success(), "trace-debugger: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn debug_trap_ops_and_suspend_resume_are_traced_exactly() {
    gpreempt_tests::skip_without_kfd_open!();
    let tracer = Tracer::start(&[]).unwrap();
    if matches!(vm_kernel().as_str(), "6.1" | "5.10") {
        // KFD 1.11 (6.1.192) and 1.3 (5.10.223): RUNTIME_ENABLE and DBG_TRAP do not exist (ENOTTY, docs/kfd.md §2.1) and their
        // probes are not attached. The tracer still sees both processes open /dev/kfd.
        let child = Command::new(binary("trace-debugger").unwrap())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let debugger = child.id();
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Past kfd_ioctl's command table: ENOTTY on 6.1.192, EINVAL on 5.10.223.
        let errno = gpreempt_tests::without_debug_trap().map_or(libc::ENOTTY, |(_, e)| e as i32);
        assert!(stderr.contains(&format!("DBG_TRAP ENABLE failed: -{errno}")), "{stderr}");
        thread::sleep(Duration::from_millis(500));
        let objects = tracer.stop().unwrap();
        // The forked target opens /dev/kfd first, then the debugger: two opens, both named trace-debugger.
        let opens: Vec<&Value> =
            objects.iter().filter(|o| o["event"] == "process_open" && o["comm"] == "trace-debugger").collect();
        let owners: Vec<&Value> = opens.iter().map(|o| &o["owner_pid"]).collect();
        assert_eq!(owners.len(), 2, "{objects:?}");
        assert_eq!(owners[1], &json!(debugger), "{objects:?}");
        assert_ne!(owners[0], &json!(debugger), "{objects:?}");
        for kind in ["debug_trap", "runtime_enable", "suspend_queues", "resume_queues"] {
            assert!(objects.iter().all(|o| o["event"] != kind), "{kind} on 6.1: {objects:?}");
        }
        return;
    }
    let report = run_debugger();
    let objects = tracer.stop().unwrap();
    let debugger = report["debugger"].as_u64().unwrap() as u32;
    let target = report["target"].as_u64().unwrap() as u32;
    assert_eq!(report["runtime_enable"], 0);
    let ops: Vec<(&Value, &Value)> = report["ops"].as_array().unwrap().iter().map(|o| (&o["op"], &o["ret"])).collect();
    assert_eq!(
        ops,
        [
            (&json!("enable"), &json!(0)),
            (&json!("suspend_queues"), &json!(0)),
            (&json!("resume_queues"), &json!(0)),
            (&json!("disable"), &json!(0))
        ]
    );

    // The target's RUNTIME_ENABLE ioctl.
    let re = events_of(&objects, target, "runtime_enable");
    assert_eq!(re.len(), 1, "{objects:?}");
    assert_eq!((&re[0]["enable"], &re[0]["ttmp_save"], &re[0]["r_debug"]), (&json!(true), &json!(false), &json!(0)));
    assert_eq!(re[0]["result"], "OK");

    // The debugger's DBG_TRAP ioctls, in order, each naming the target.
    let traps = events_of(&objects, debugger, "debug_trap");
    let seen: Vec<(&Value, &Value, &Value)> = traps.iter().map(|t| (&t["op"], &t["target_pid"], &t["ret"])).collect();
    let t = json!(target);
    assert_eq!(
        seen,
        [
            (&json!("enable"), &t, &json!(0)),
            (&json!("suspend_queues"), &t, &json!(0)),
            (&json!("resume_queues"), &t, &json!(0)),
            (&json!("disable"), &t, &json!(0))
        ]
    );
    assert_eq!(traps[0]["exception_mask"], 0);
    assert_eq!((&traps[1]["num_queues"], &traps[1]["grace_period"]), (&json!(2), &json!(5)));
    assert_eq!(traps[2]["num_queues"], 2);
    assert!(traps.iter().all(|t| t["result"] == "OK"));

    // The kernel functions: target from p->lead_thread (BTF), the ids as written back.
    let invalid =
        json!([{"queue_id": 0, "invalid": true, "error": false}, {"queue_id": 1, "invalid": true, "error": false}]);
    let suspends = objects_where(&objects, "suspend_queues", "target_pid", &t);
    assert_eq!(suspends.len(), 1, "{objects:?}");
    let s = suspends[0];
    assert_eq!(s["pid"], debugger, "suspend_queues runs in the debugger's ioctl");
    assert_eq!((&s["num_queues"], &s["grace_period"], &s["exception_clear_mask"]), (&json!(2), &json!(5), &json!(0)));
    assert_eq!((&s["queues"], &s["handled"], &s["result"]), (&invalid, &json!(0), &json!("OK")));
    assert!(s["duration_ns"].as_u64().unwrap() > 0);
    let resumes = objects_where(&objects, "resume_queues", "target_pid", &t);
    assert_eq!(
        (&resumes[0]["num_queues"], &resumes[0]["queues"], &resumes[0]["handled"]),
        (&json!(2), &invalid, &json!(0))
    );
    // DISABLE deactivates the target: resume_queues(target, 0, NULL) resumes everything.
    assert_eq!(resumes.len(), 2, "{resumes:?}");
    assert_eq!((&resumes[1]["num_queues"], &resumes[1]["queues"]), (&json!(0), &json!([])));

    // Spans: the suspend with both ids rejected, no HWS work (no queues), no collateral.
    let spans = objects_where(&objects, "span", "pid", &t);
    let kinds: Vec<&Value> = spans.iter().map(|s| &s["span"]).collect();
    assert_eq!(kinds, [&json!("suspend"), &json!("resume"), &json!("resume")]);
    assert_eq!((&spans[0]["queues"], &spans[0]["rejected"]), (&json!([]), &json!([0, 1])));
    assert_eq!(spans[0]["collateral"], json!([]));
    let s = summary(&objects).unwrap();
    assert_eq!((&s["suspend"]["count"], &s["resume"]["count"]), (&json!(1), &json!(2)));
    assert_eq!(s["dropped"], 0);
}
