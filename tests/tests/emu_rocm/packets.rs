//! ROCr's packets executed by the emulated CP (README "ROCm's packets"): dispatches, barriers,
//! interrupt signals, packets written by hand, a process killed mid-dispatch, and `gpreempt
//! preempt` refused on ROCr 5.2.

use std::{
    collections::BTreeMap,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use gpreempt_tests::{read_sysfs, wait_kfd_released};

use crate::{
    emulator::{GPU0, GPU1, counters, cp_stats_since, ns_per_workitem},
    rocm_run::hsa_dispatch_run,
};

pub(crate) fn rocm_dispatches_barriers_and_interrupt_signals_complete_on_the_emulated_cp() {
    // 640 work-items: each of the code object's dispatches runs 640 x ns_per_workitem ns, a whole
    // number of the GPU clock's 10 ns ticks.
    let grid = 640u64;
    let mut run = hsa_dispatch_run(&["run", &grid.to_string()]);
    let ticks = grid * ns_per_workitem() / 10;
    let text = run.finish().join("\n");
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[2], serde_json::json!({"gpus": 2, "done": true}));
    for (gpu, v) in lines[..2].iter().enumerate() {
        assert_eq!(v["gpu"], gpu, "{v}");
        // The barrier-AND waits on the gate the program holds: not complete after 300 ms, its
        // packet not consumed (A and B were: read index 2 of 4 written).
        assert_eq!(v["blocked"], serde_json::json!({"barrier": 1, "read_index": 2, "write_index": 4}), "{v}");
        let sig = |name: &str| {
            let s = &v[name];
            assert_eq!(s["interrupt"], true, "ROCr's default signals are interrupt signals: {v}");
            (s["value"].as_i64().unwrap(), s["start_ts"].as_u64().unwrap(), s["end_ts"].as_u64().unwrap())
        };
        let (a, b, and, c, or, never) = (sig("a"), sig("b"), sig("and"), sig("c"), sig("or"), sig("never"));
        for (name, s) in [("a", a), ("b", b), ("and", and), ("c", c), ("or", or)] {
            assert_eq!(s.0, 0, "{name} decremented from 1 to 0: {v}");
        }
        assert_eq!(never, (1, 0, 0), "a barrier-OR dependency that never completes is left alone: {v}");
        // Each dispatch ran its whole cost, uninterrupted; one at a time, in queue order, the
        // barriers between them taking no GPU time.
        for (name, s) in [("a", a), ("b", b), ("c", c)] {
            assert_eq!(s.2 - s.1, ticks, "{name}: grid x ns_per_workitem in 10 ns ticks: {v}");
        }
        assert_eq!(and.1, and.2, "{v}");
        assert_eq!(or.1, or.2, "{v}");
        assert!(a.2 <= b.1 && b.2 < and.1 && and.2 <= c.1 && c.2 <= or.1, "completion order: {v}");
        assert_eq!(v["kernel_object"].as_u64().unwrap() % 64, 0, "a kernel descriptor's address: {v}");
        // Every packet consumed: A, B, the barrier-AND, C, the barrier-OR.
        assert_eq!((v["read_index"].as_u64(), v["write_index"].as_u64()), (Some(5), Some(5)), "{v}");
        assert_eq!(v["read_dispatch_id"], 5, "amd_queue_t's read_dispatch_id: {v}");
    }
    // Per GPU: ROCr's blit kernel copying the code object into VRAM and the 3 dispatches (kernels),
    // the code-cache invalidation it sends after loading code (a PM4 IB), the two barriers; six
    // signals (the blit's, A, B, AND, C, OR), all interrupt signals, each setting its KFD event.
    let each = counters(&[
        ("kernels", 4),
        ("barriers_and", 1),
        ("barriers_or", 1),
        ("pm4_ibs", 1),
        ("signals", 6),
        ("interrupts", 6),
        ("events_set", 6),
    ]);
    assert_eq!(cp_stats_since(&run.before), BTreeMap::from([(GPU0, each.clone()), (GPU1, each)]));
    run.end();
}

pub(crate) fn amd_barrier_value_packets_wait_for_their_condition_and_an_unknown_condition_stops_the_queue() {
    // Written by hand through ROCr 5.2's queue (HIP 5.7 writes them per hipEventRecord): one
    // waiting for (gate & 0xf0) >= 0x10 with the gate at 5, a null-signal one and an LT one
    // already met behind it, then one with condition 9.
    // The first holds the queue (nothing consumed, nothing completed, 300 ms later); the gate at
    // 0x13 meets it and all three complete in order; condition 9 is not consumed and stops the
    // queue (EC_QUEUE_PACKET_VENDOR_UNSUPPORTED), which is destroyed cleanly afterwards.
    hand_written_packets(
        "value",
        serde_json::json!({
            "blocked": {"values": [1, 1, 1], "read_index": 0},
            "met": {"values": [0, 0, 0], "read_index": 3},
            "bad": {"value": 1, "read_index": 3, "write_index": 4},
        }),
        &[("barriers_value", 3), ("signals", 3), ("interrupts", 3), ("events_set", 3), ("errors", 1)],
    );
}

/// `hsa-dispatch MODE` (packets written by hand on the first GPU's queue) to its end: its first
/// line is `first`, and the first GPU's `cp_stats` moved by `gpu0` only, the second's not at all.
fn hand_written_packets(mode: &str, first: serde_json::Value, gpu0: &[(&str, u64)]) {
    let mut run = hsa_dispatch_run(&[mode]);
    let text = run.finish().join("\n");
    assert_eq!(
        text.lines().next().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()),
        Some(first),
        "{text}"
    );
    assert_eq!(cp_stats_since(&run.before), BTreeMap::from([(GPU0, counters(gpu0)), (GPU1, counters(&[]))]));
    run.end();
}

pub(crate) fn an_agent_dispatch_packet_stops_a_rocm_queue_with_a_packet_exception_not_a_warning() {
    // Not consumed, not completed (500 ms later): EC_QUEUE_PACKET_UNSUPPORTED on the first
    // GPU's queue, nothing executed; the queue is destroyed cleanly afterwards.
    hand_written_packets(
        "bad",
        serde_json::json!({"bad": {"value": 1, "read_index": 0, "write_index": 1}}),
        &[("errors", 1)],
    );
}

pub(crate) fn a_rocm_process_killed_mid_dispatch_is_released_and_the_modules_unload() {
    // One dispatch of 10^7 work-items: 10 s at the default 1 µs each, killed long before its end.
    let mut run = hsa_dispatch_run(&["hold", "10000000"]);
    let pid = run.pid;
    assert_eq!(run.line(), format!(r#"{{"pid":{pid},"dispatched":1}}"#));
    // The code object is loaded (its blit copy done) once the line is out: the CUs are busy
    // with the one dispatch left.
    let occupancy = format!("/sys/class/kfd/kfd/proc/{pid}/stats_{GPU0}/cu_occupancy");
    let deadline = Instant::now() + Duration::from_secs(120);
    while read_sysfs(&occupancy).unwrap() != "104\n" {
        assert!(Instant::now() < deadline, "the dispatch did not start within 2 min");
        thread::sleep(Duration::from_millis(10));
    }
    run.child.kill().unwrap();
    let status = run.child.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
    wait_kfd_released(pid).unwrap();
    // Only the blit copy and the cache invalidation completed; the killed dispatch never did.
    assert_eq!(
        cp_stats_since(&run.before),
        BTreeMap::from([
            (GPU0, counters(&[("kernels", 1), ("pm4_ibs", 1), ("signals", 1), ("interrupts", 1), ("events_set", 1)])),
            (GPU1, counters(&[]))
        ])
    );
    run.end();
}

pub(crate) fn gpreempt_preempt_refuses_rocm_5_2_with_the_cause_and_its_dispatches_all_complete() {
    // Dispatches of 64,000 work-items (64 ms each at the default 1 µs), one after the other,
    // at least 20 and on until told on stdin: the program is mid-run whatever gpreempt's start-up
    // takes on a loaded machine.
    let mut run = hsa_dispatch_run(&["loop", "64000", "20"]);
    let pid = run.pid;
    assert_eq!(run.line(), format!(r#"{{"pid":{pid},"looping":20}}"#));
    // ROCr 5.2 never calls RUNTIME_ENABLE, so KFD (6.12) refuses SUSPEND_QUEUES (EPERM): gpreempt
    // says why, and leaves the program running.
    let out = Command::new(gpreempt_tests::binary("gpreempt").unwrap())
        .args(["preempt", "--offline", &pid.to_string(), "--iterations", "3", "--hold", "10ms", "--gap", "10ms"])
        .args(["--no-trace"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "pid {pid} has not enabled the ROCm runtime's debug interface (AMDKFD_IOC_RUNTIME_ENABLE)"
        )),
        "{stderr}"
    );
    // Still running after the refusal: now it may end (after its 20th dispatch at the earliest).
    let rest = run.finish();
    let last: serde_json::Value = serde_json::from_str(rest.first().expect("hsa-dispatch's last line")).unwrap();
    let k = last["completed"].as_u64().expect("completed");
    assert!(k >= 20, "{last}");
    // Never suspended: every dispatch took exactly its cost (64,000 work-items, in 10 ns ticks).
    let ticks = 64_000 * ns_per_workitem() / 10;
    assert_eq!(last, serde_json::json!({"completed": k, "read_index": k, "longest_ticks": ticks, "done": true}));
    // The blit copy and the K dispatches, each with its interrupt signal; nothing failed.
    let n = k + 1;
    let gpu0 = counters(&[("kernels", n), ("pm4_ibs", 1), ("signals", n), ("interrupts", n), ("events_set", n)]);
    assert_eq!(cp_stats_since(&run.before), BTreeMap::from([(GPU0, gpu0), (GPU1, counters(&[]))]));
    run.end();
}
