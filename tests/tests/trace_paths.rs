//! `gpreempt trace` against the real amdgpu driver, beyond create/destroy: the probe table on this
//! kernel, update_queue, process open/exit and the live map, `-- CMD`, and the Perfetto and
//! summary files. Without a GPU every update fails in `pqm_update_queue_properties` ("No queue %d
//! exists for update operation"): EFAULT; opening /dev/kfd still creates a `kfd_process`, which a kworker releases
//! after the process exits.

use std::{
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use gpreempt_tests::{
    Tracer, binary, events_of, expected_probes, kfd_client, objects_where, skip, summary, vm_kernel, wait_kfd_released,
};
use serde_json::{Value, json};

#[test]
fn probe_table_attaches_what_this_kernel_has_and_says_why_not_the_rest() {
    let mut tracer = Tracer::start(&[]).unwrap();
    let lines = tracer.read_stderr(Duration::from_secs(2)).to_vec();
    tracer.stop().unwrap();
    let attached = &lines[0];
    let missing: Vec<&String> = lines.iter().filter(|l| l.contains("not attached")).collect();
    let resolution = lines.iter().find(|l| l.contains("owner/gpu resolution")).expect("resolution line");
    // The counts come from the probe table and this guest's kallsyms.
    let expected = expected_probes().unwrap();
    let resolved = expected.iter().filter(|p| p.symbol.is_some()).count();
    assert!(attached.starts_with(&format!("gpreempt: attached {resolved} probes to ")), "{resolved}: {attached}");
    assert_eq!(missing.len(), expected.len() - resolved, "{missing:?}");
    // Module BTF is present on the Debian 6.x and 7.x kernels: owners and gpu ids come from struct
    // offsets. 5.10 loads no module BTF (5.11+): the tracer learns pointers.
    if vm_kernel() == "5.10" {
        assert!(resolution.contains("pointer learning ("), "{resolution}");
    } else {
        assert!(resolution.contains("BTF offsets from /sys/kernel/btf/amdgpu"), "{resolution}");
    }
    assert!(resolution.contains("queue.properties.queue_id=48"), "{resolution}");
    match vm_kernel().as_str() {
        "7" => {
            // Debian 7.3.4: the whole table (execute_queues_cpsch.constprop.0 again); lead_thread
            // at byte 88 and the SMI helpers take a task_struct * (module BTF).
            assert_eq!(resolved, expected.len(), "7.3.4 resolves the whole table");
            assert_eq!(resolved, 58);
            assert!(missing.is_empty(), "{missing:?}");
            assert!(resolution.contains("kfd_process.lead_thread=88"), "{resolution}");
            assert!(resolution.contains("kfd_node.id=36"), "{resolution}");
            assert!(resolution.contains("create_process(task)=1 fence_wait(dqm)=1 smi(pid)=0"), "{resolution}");
        }
        "5.10" => {
            // KFD 1.3: no debugger API, no SMI helpers, no MES; execute_queues_cpsch inlined.
            assert_eq!(resolved, 35, "{attached}");
            assert!(missing.contains(&&"gpreempt: probe smi_eviction not attached: kfd_smi_event_queue_eviction is not in /proc/kallsyms: it appeared in KFD 1.10 (Linux 5.19) and this KFD is older".to_owned()), "{missing:?}");
        }
        "6.12" => {
            // The whole table but CREATE_PROCESS (Linux 7.0) and set_queue_as_reset, which Debian
            // 6.12.117's amdgpu.ko inlines (a symbol of its own from 7.x; docs/kfd.md §2.4).
            assert_eq!(resolved, expected.len() - 3, "{attached}");
            assert!(resolution.contains("kfd_process.lead_thread=96"), "{resolution}");
            assert!(attached.contains("execute_queues_cpsch.constprop.0"), "{attached}");
            let create = |program: &str| {
                format!(
                    "gpreempt: probe {program} not attached: kfd_ioctl_create_process is not in /proc/kallsyms: it \
                     appeared in KFD 1.19 (Linux 7.0) and this KFD is older"
                )
            };
            assert_eq!(
                missing,
                [
                    &create("create_context_entry"),
                    &create("create_context_return"),
                    &"gpreempt: probe set_queue_as_reset not attached: set_queue_as_reset is not in /proc/kallsyms for \
                      module amdgpu (inlined or renamed in this build)"
                        .to_owned()
                ],
                "{missing:?}"
            );
            assert!(resolution.contains("kfd_node.id=36"), "{resolution}");
            assert!(resolution.contains("create_process(task)=1 fence_wait(dqm)=1 smi(pid)=1"), "{resolution}");
        }
        "6.1" => {
            // No debugger API, no MES v12, execute_queues_cpsch inlined: some probes stay off.
            assert!(resolved < expected.len(), "{attached}");
            assert!(missing.contains(&&"gpreempt: probe suspend_queues_entry not attached: suspend_queues is not in /proc/kallsyms: it appeared in KFD 1.13 (Linux 6.5) and this KFD is older".to_owned()), "{missing:?}");
            assert!(missing.contains(&&"gpreempt: probe execute_queues_entry not attached: execute_queues_cpsch is not in /proc/kallsyms for module amdgpu (inlined or renamed in this build)".to_owned()), "{missing:?}");
            assert!(resolution.contains("kfd_process.lead_thread=96"), "{resolution}");
            assert!(resolution.contains("kfd_node.id=96"), "6.1 names it kfd_dev.id: {resolution}");
            assert!(resolution.contains("create_process(task)=0 fence_wait(dqm)=0 smi(pid)=1"), "{resolution}");
        }
        other => panic!("unknown VM kernel {other:?}"),
    }
}

#[test]
fn update_queue_arguments_and_result_are_traced_exactly() {
    gpreempt_tests::skip_without_kfd_open!();
    let tracer = Tracer::start(&[]).unwrap();
    let (pid, report) = kfd_client(&[
        "update",
        "--queue-id",
        "9",
        "--ring-base",
        "0x7f3400000000",
        "--ring-size",
        "8192",
        "--percentage",
        "40",
        "--priority",
        "12",
    ])
    .unwrap();
    assert_eq!(report["results"]["EFAULT"], 1, "{report}");
    let objects = tracer.stop().unwrap();
    let updates = events_of(&objects, pid, "queue_update");
    assert_eq!(updates.len(), 1, "{objects:?}");
    let u = updates[0];
    assert_eq!(
        (&u["queue_id"], &u["ring_base"], &u["ring_size"], &u["percentage"], &u["priority"]),
        (&json!(9), &json!(0x7f34_0000_0000u64), &json!(8192), &json!(40), &json!(12))
    );
    assert_eq!((&u["result"], &u["ret"]), (&json!("EFAULT"), &json!(-14)));
    assert_eq!(summary(&objects).unwrap()["dropped"], 0);
}

#[test]
fn process_open_and_exit_keep_the_live_map_current() {
    gpreempt_tests::skip_without_kfd_open!();
    let tracer = Tracer::start(&[]).unwrap();
    let mut client = Command::new(binary("kfd-client").unwrap())
        .args(["hold", "--ms", "60000"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = client.id();
    // Starting a binary over 9p under TCG takes seconds: wait until KFD created its process
    // (kfd_create_process makes the sysfs directory just before it returns).
    let sysfs = format!("/sys/class/kfd/kfd/proc/{pid}");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !std::path::Path::new(&sysfs).exists() {
        assert!(std::time::Instant::now() < deadline, "{sysfs} never appeared");
        thread::sleep(Duration::from_millis(100));
    }
    thread::sleep(Duration::from_millis(500));
    // SIGUSR1: the map while the client holds /dev/kfd open.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(tracer.pid() as i32), nix::sys::signal::Signal::SIGUSR1).unwrap();
    thread::sleep(Duration::from_millis(500));
    client.kill().unwrap();
    client.wait().unwrap();
    wait_kfd_released(pid).unwrap();
    let objects = tracer.stop().unwrap();

    let opens = objects_where(&objects, "process_open", "owner_pid", &json!(pid));
    assert_eq!(opens.len(), 1, "{objects:?}");
    assert_eq!(opens[0]["pid"], pid, "kfd_open runs in the opener's context");
    assert_eq!(opens[0]["comm"], "kfd-client");
    // Teardown: the kworker's events name the owner, not the kworker.
    let exits = objects_where(&objects, "process_exit", "owner_pid", &json!(pid));
    let stages: Vec<&Value> = exits.iter().map(|e| &e["stage"]).collect();
    if vm_kernel() == "5.10" {
        // No module BTF on 5.10: the kfd_process behind kfd_process_wq_release's work_struct is at
        // an offset (release_work) only BTF gives, so that stage has no owner; the dequeue stage
        // takes the kfd_process itself, learned at open (pointer learning).
        assert_eq!(stages, [&json!("kfd_process_dequeue_from_all_devices")]);
    } else {
        assert_eq!(stages, [&json!("kfd_process_wq_release"), &json!("kfd_process_dequeue_from_all_devices")]);
    }
    assert!(exits.iter().all(|e| e["pid"] != pid), "teardown runs in a kworker");

    let maps: Vec<&Value> = objects.iter().filter(|o| o["event"] == "queue_map").collect();
    assert_eq!(maps.len(), 2, "one on SIGUSR1, one at exit");
    let in_map = |m: &Value| m["processes"].as_array().unwrap().iter().any(|p| p["pid"] == pid);
    assert!(in_map(maps[0]), "the open process is in the SIGUSR1 map: {}", maps[0]);
    let entry = maps[0]["processes"].as_array().unwrap().iter().find(|p| p["pid"] == pid).unwrap();
    assert_eq!((&entry["comm"], &entry["ns_pid"], &entry["queues"]), (&json!("kfd-client"), &json!(pid), &json!({})));
    assert!(!in_map(maps[1]), "the exited process left the map: {}", maps[1]);
    let s = summary(&objects).unwrap();
    let p = s["processes"].as_array().unwrap().iter().find(|p| p["pid"] == pid).expect("in the summary");
    assert_eq!((&p["exited"], &p["queues"], &p["queues_created"]), (&json!(true), &json!(0), &json!(0)));
}

#[test]
fn command_mode_traces_only_the_command_and_names_it() {
    gpreempt_tests::skip_without_kfd_open!();
    let kfd_client_path = binary("kfd-client").unwrap();
    let client = kfd_client_path.to_str().unwrap();
    // A bystander making ioctls during the whole trace must not appear.
    let bystander = Command::new(client)
        .args(["destroy", "--queue-id", "5", "--count", "400"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let out = Command::new(binary("gpreempt").unwrap())
        .args(["trace", "--json", "--", client, "destroy", "--queue-id", "77"])
        .output()
        .unwrap();
    let mut bystander = bystander;
    bystander.wait().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    // The client's own JSON report shares stdout; keep the tracer's objects.
    let objects: Vec<Value> =
        text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).filter(|o| o["event"].is_string()).collect();
    let start = &objects[0];
    assert_eq!(start["event"], "start");
    assert_eq!(start["command"], json!([client, "destroy", "--queue-id", "77"]));
    let child = start["pid"].as_u64().unwrap() as u32;
    let destroys: Vec<&Value> = objects.iter().filter(|o| o["event"] == "queue_destroy").collect();
    assert_eq!(destroys.len(), 1, "{destroys:?}");
    assert_eq!((&destroys[0]["pid"], &destroys[0]["queue_id"]), (&json!(child), &json!(77)));
    // Everything shown is the child's: its own calls, or kworker teardown about it.
    assert!(objects.iter().all(|o| o["pid"].is_null() || o["pid"] == child || o["owner_pid"] == child), "{objects:?}");
}

#[test]
fn the_summary_file_is_written() {
    gpreempt_tests::skip_without_kfd_open!();
    let summary_path = std::env::temp_dir().join(format!("gpreempt-summary-{}.json", std::process::id()));
    let tracer = Tracer::start(&["--summary-json", summary_path.to_str().unwrap()]).unwrap();
    let (pid, _) = kfd_client(&["hold", "--ms", "100"]).unwrap();
    wait_kfd_released(pid).unwrap();
    tracer.stop().unwrap();
    let s: Value = serde_json::from_slice(&std::fs::read(&summary_path).unwrap()).unwrap();
    let p = s["processes"].as_array().unwrap().iter().find(|p| p["pid"] == pid).expect("client in the summary");
    assert_eq!((&p["comm"], &p["exited"]), (&json!("kfd-client"), &json!(true)));
    assert_eq!(s["dropped"], 0);
    assert_eq!(s["suspend"]["count"], 0);
}

/// Without a GPU only the debug trap puts anything on a Perfetto track (queue creation fails, no
/// HWS work happens), so the document is checked against `trace-debugger`'s known calls.
#[test]
fn the_perfetto_file_draws_the_debug_trap_calls_and_spans() {
    gpreempt_tests::skip_without_kfd_open!();
    if vm_kernel() != "6.12" {
        skip!(
            "KFD 1.11 (6.1) has no debug trap, and without a GPU no queue is ever created: nothing reaches a \
             Perfetto track on this kernel"
        );
    }
    let perfetto = std::env::temp_dir().join(format!("gpreempt-perfetto-{}.json", std::process::id()));
    let tracer = Tracer::start(&["--perfetto", perfetto.to_str().unwrap()]).unwrap();
    let out = Command::new(binary("trace-debugger").unwrap()).output().unwrap();
    assert!(out.status.success(), "trace-debugger: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    tracer.stop().unwrap();
    let (debugger, target) = (&report["debugger"], &report["target"]);

    let doc: Value = serde_json::from_slice(&std::fs::read(&perfetto).unwrap()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    assert!(events.iter().all(|e| e["ph"].is_string() && e["pid"].is_u64()), "{doc}");
    // The debugger's track is named after it.
    let process_name = |pid: &Value| {
        events
            .iter()
            .find(|e| e["ph"] == "M" && e["name"] == "process_name" && &e["pid"] == pid)
            .map(|e| &e["args"]["name"])
    };
    assert_eq!(process_name(debugger), Some(&json!(format!("trace-debugger {debugger}"))), "{doc}");
    assert!(process_name(target).is_some(), "the target has a track: {doc}");
    // Its four DBG_TRAP ioctls, in order, as complete events naming the target.
    let calls: Vec<(&Value, &Value)> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "debug" && &e["pid"] == debugger)
        .map(|e| (&e["name"], &e["args"]["target_pid"]))
        .collect();
    assert_eq!(
        calls,
        [
            (&json!("dbg_trap enable"), target),
            (&json!("dbg_trap suspend_queues"), target),
            (&json!("dbg_trap resume_queues"), target),
            (&json!("dbg_trap disable"), target)
        ],
        "{doc}"
    );
    // The target's spans: the suspend that rejected ids 0 and 1, its resume, and DISABLE's resume-all.
    let spans: Vec<&Value> =
        events.iter().filter(|e| e["ph"] == "X" && e["cat"] == "span" && &e["pid"] == target).collect();
    let names: Vec<&Value> = spans.iter().map(|e| &e["name"]).collect();
    assert_eq!(names, [&json!("suspend"), &json!("resume"), &json!("resume")], "{doc}");
    assert_eq!((&spans[0]["args"]["queues"], &spans[0]["args"]["rejected"]), (&json!([]), &json!([0, 1])));
}

#[test]
fn without_btf_owners_come_from_pointer_learning() {
    gpreempt_tests::skip_without_kfd_open!();
    // No BTF at all: the kfd_process* → pid map learned at kfd_create_process (ioctl context)
    // names the owner of the teardown; kfd_process_wq_release cannot find its kfd_process.
    let mut tracer = Tracer::start(&["--btf-dir", "/nonexistent"]).unwrap();
    let lines = tracer.read_stderr(Duration::from_secs(1)).to_vec();
    let resolution = lines.iter().find(|l| l.contains("owner/gpu resolution")).expect("resolution line");
    assert!(resolution.contains("pointer learning (no module BTF: cannot read /nonexistent/vmlinux"), "{resolution}");
    let (pid, _) = kfd_client(&["hold", "--ms", "100"]).unwrap();
    wait_kfd_released(pid).unwrap();
    let objects = tracer.stop().unwrap();
    let opens = objects_where(&objects, "process_open", "owner_pid", &json!(pid));
    assert_eq!(opens.len(), 1, "{objects:?}");
    let exits = objects_where(&objects, "process_exit", "owner_pid", &json!(pid));
    let stages: Vec<&Value> = exits.iter().map(|e| &e["stage"]).collect();
    assert_eq!(stages, [&json!("kfd_process_dequeue_from_all_devices")]);
    let s = summary(&objects).unwrap();
    assert!(s["processes"].as_array().unwrap().iter().any(|p| p["pid"] == pid && p["exited"] == true), "{s}");
    // The release itself had no owner to name; that is counted, never silent.
    assert!(s["losses"]["owner_unknown"].as_u64().unwrap() >= 1, "{s}");
}
