//! The emulated GPU of the KFD emulator (`tests/kfd-emu`, README "Emulated execution"): 64-byte
//! AQL dispatch packets with a cost, one GPU shared by every mapped queue (round-robin at
//! dispatch boundaries), preemption mid-dispatch that keeps the remaining cost, completion
//! records, `cu_occupancy`, and packet errors. Timing assertions use the completion records'
//! emulated times, which are exact; wall-clock bounds are generous and judged over many samples.

use std::{
    path::Path,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use gpreempt::clock::monotonic_ns;
use gpreempt_tests::{LineHelper, emu_param, read_sysfs};
use serde_json::Value;

const EC_QUEUE_NEW: u64 = 1 << 30;
const EC_PROCESS_RUNTIME: u64 = 1 << 47;
const MS: u64 = 1_000_000;

fn helper(args: &[&str]) -> LineHelper {
    LineHelper::spawn("emu-workload", args).unwrap()
}

fn debugger(pid: u32) -> LineHelper {
    let d = helper(&["debug", "--pid", &pid.to_string()]);
    assert_eq!(d.hello["ptrace"], 0, "PTRACE_SEIZE: {}", d.hello);
    d
}

/// A completion record as the workloads print it.
#[derive(Clone, Copy, Debug, PartialEq, serde::Deserialize)]
struct Record {
    start_ns: u64,
    end_ns: u64,
    packet_index: u64,
    off_ns: u64,
    first_stop_ns: u64,
    last_start_ns: u64,
    preemptions: u32,
    queue_id: u32,
}

fn records(v: &Value) -> Vec<Record> {
    serde_json::from_value(v.clone()).unwrap()
}

/// The records of `submit`ted dispatches of queue #`q`, once `n` are complete.
fn wait_records(w: &mut LineHelper, q: usize, n: usize, within: Duration) -> Vec<Record> {
    let deadline = Instant::now() + within;
    loop {
        let r = w.cmd(&format!("records {q}")).unwrap();
        let list = records(&r["records"]);
        if list.len() >= n {
            return list;
        }
        assert!(Instant::now() < deadline, "only {} of {n} records within {within:?}: {r}", list.len());
        thread::sleep(Duration::from_millis(20));
    }
}

/// Every record used exactly its cost on the GPU, whatever its preemptions.
fn assert_cost(r: &Record, cost_ns: u64) {
    assert_eq!(r.end_ns - r.start_ns - r.off_ns, cost_ns, "{r:?}");
    if r.preemptions == 0 {
        assert_eq!((r.off_ns, r.first_stop_ns, r.last_start_ns), (0, r.end_ns, r.start_ns), "{r:?}");
    }
    if r.preemptions == 1 {
        assert_eq!((r.first_stop_ns - r.start_ns) + (r.end_ns - r.last_start_ns), cost_ns, "{r:?}");
    }
}

/// Lines until the one whose `event` is `kind`.
fn until(w: &mut LineHelper, kind: &str) -> Value {
    loop {
        let v = w.recv().unwrap();
        if v["event"] == kind {
            return v;
        }
    }
}

fn kernel_log() -> String {
    let out = Command::new("dmesg").output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn assert_no_kernel_warning() {
    let log = kernel_log();
    for bad in ["WARNING:", "BUG:", "Call Trace", "cut here", "refcount_t", "kfd_emu: The cp might"] {
        assert!(!log.contains(bad), "kernel log has {bad:?}:\n{log}");
    }
}

#[test]
fn one_queue_alone_each_request_takes_k_times_d() {
    let tick_ns = emu_param("tick_us").unwrap() * 1000;
    let mut w = helper(&[
        "online",
        "--gpu-id",
        "0x1000",
        "--dispatches",
        "3",
        "--dispatch-us",
        "2000",
        "--period-us",
        "20000",
        "--requests",
        "30",
    ]);
    let mut delays = Vec::new();
    for i in 0..30u64 {
        let req = w.recv().unwrap();
        assert_eq!((req["event"].as_str(), req["request"].as_u64()), (Some("request"), Some(i)), "{req}");
        let recs = records(&req["records"]);
        let first = req["first_index"].as_u64().unwrap();
        assert_eq!(recs.iter().map(|r| r.packet_index).collect::<Vec<_>>(), [first, first + 1, first + 2]);
        assert_eq!(first, 3 * i, "one queue, three packets per request");
        for r in &recs {
            assert_eq!((r.preemptions, r.queue_id), (0, 0), "{r:?}");
            assert_cost(r, 2 * MS);
        }
        // Back to back on an otherwise idle GPU: K x D exactly from the first start.
        assert_eq!(recs[1].start_ns, recs[0].end_ns);
        assert_eq!(recs[2].start_ns, recs[1].end_ns);
        let submit = req["submit_ns"].as_u64().unwrap();
        assert!(recs[0].start_ns >= submit, "started before it was submitted: {req}");
        assert_eq!(req["latency_ns"].as_u64().unwrap(), recs[2].end_ns - submit);
        delays.push(recs[0].start_ns - submit);
    }
    let summary = w.recv().unwrap();
    assert_eq!((summary["event"].as_str(), summary["requests"].as_u64()), (Some("summary"), Some(30)));
    // latency - K x D is the time until the CP noticed the packets: within the emulated tick,
    // plus whatever the (TCG) host delays the CP thread by, judged on the median.
    delays.sort_unstable();
    let median = delays[delays.len() / 2];
    assert!(median <= tick_ns + 2 * MS, "median doorbell delay {median} ns (tick {tick_ns}): {delays:?}");
    assert!(delays[delays.len() - 1] < 100 * MS, "{delays:?}");
}

#[test]
fn an_online_dispatch_waits_for_the_running_offline_one() {
    let mut off = helper(&["offline", "--gpu-id", "0x1000", "--dispatch-us", "30000", "--records"]);
    thread::sleep(Duration::from_millis(100));
    let mut on =
        helper(&["online", "--gpu-id", "0x1000", "--dispatch-us", "2000", "--period-us", "70000", "--requests", "12"]);
    let mut requests = Vec::new();
    for _ in 0..12 {
        requests.push(on.recv().unwrap());
    }
    until(&mut on, "summary");
    off.send("stop").unwrap();
    let summary = until(&mut off, "summary");
    let offline = records(&summary["records"]);
    for r in &offline {
        assert_cost(r, 30 * MS);
    }
    let mut exact = 0;
    for req in &requests {
        let submit = req["submit_ns"].as_u64().unwrap();
        let rec = records(&req["records"])[0];
        assert_cost(&rec, 2 * MS);
        // The offline dispatch in flight at submission holds the GPU until it ends.
        let Some(ahead) = offline.iter().find(|o| o.start_ns <= submit && submit < o.end_ns) else { continue };
        assert!(rec.start_ns >= ahead.end_ns, "online started inside an offline dispatch: {rec:?} {ahead:?}");
        assert!(req["latency_ns"].as_u64().unwrap() >= ahead.end_ns - submit + 2 * MS, "{req}");
        // Round-robin: the online queue is next at that boundary, and the offline queue after it.
        if rec.start_ns == ahead.end_ns {
            exact += 1;
            let next = offline.iter().find(|o| o.packet_index == ahead.packet_index + 1).unwrap();
            assert_eq!(next.start_ns, rec.end_ns, "{rec:?} {next:?}");
        }
    }
    assert!(exact >= 8, "only {exact} of 12 online dispatches started right at the offline boundary");
    // One GPU: no two dispatches ever ran at the same time.
    let mut all: Vec<(u64, u64)> = offline.iter().map(|r| (r.start_ns, r.end_ns)).collect();
    all.extend(requests.iter().map(|req| {
        let r = records(&req["records"])[0];
        (r.start_ns, r.end_ns)
    }));
    all.sort_unstable();
    assert!(all.windows(2).all(|p| p[0].1 <= p[1].0), "overlapping dispatches: {all:?}");
}

#[test]
fn round_robin_order_is_exact_for_a_scripted_sequence_and_the_gpus_are_independent() {
    // GPU 0x1000 saturated meanwhile: GPU 0x2000's timeline must not notice.
    let mut busy = helper(&["offline", "--gpu-id", "0x1000", "--dispatch-us", "1000"]);
    let mut a = helper(&["run", "--gpu-id", "0x2000", "--fill-us", "0"]);
    let mut b = helper(&["run", "--gpu-id", "0x2000", "--fill-us", "0"]);
    let mut c = helper(&["run", "--gpu-id", "0x2000", "--fill-us", "0"]);
    assert_eq!(a.cmd("submit 0 1 300000").unwrap()["ret"], 0, "A's 300 ms blocker");
    assert_eq!(a.cmd("submit 0 3 10000").unwrap()["ret"], 0);
    thread::sleep(Duration::from_millis(40));
    assert_eq!(b.cmd("submit 0 3 10000").unwrap()["ret"], 0);
    thread::sleep(Duration::from_millis(40));
    assert_eq!(c.cmd("submit 0 3 10000").unwrap()["ret"], 0);
    let ra = wait_records(&mut a, 0, 4, Duration::from_secs(30));
    let rb = wait_records(&mut b, 0, 3, Duration::from_secs(30));
    let rc = wait_records(&mut c, 0, 3, Duration::from_secs(30));
    let mut all: Vec<(u64, u64, char, u64)> = Vec::new();
    for (name, list) in [('A', &ra), ('B', &rb), ('C', &rc)] {
        for r in list.iter() {
            assert_eq!(r.preemptions, 0, "{name} {r:?}");
            all.push((r.start_ns, r.end_ns, name, r.packet_index));
        }
    }
    all.sort_unstable();
    let order: String = all.iter().map(|e| e.2).collect();
    assert_eq!(order, "ABCABCABCA", "{all:?}");
    assert_eq!(all.iter().filter(|e| e.2 == 'A').map(|e| e.3).collect::<Vec<_>>(), [0, 1, 2, 3]);
    // Back to back: each dispatch starts exactly when the previous one ends.
    assert!(all.windows(2).all(|p| p[1].0 == p[0].1), "{all:?}");
    assert_eq!(all[0].1 - all[0].0, 300 * MS);
    busy.send("stop").unwrap();
    let s = until(&mut busy, "summary");
    assert!(s["completed"].as_u64().unwrap() > 100, "GPU 0x1000 kept running: {s}");
    assert_eq!(s["busy_ns_total"], s["cost_ns_total"]);
}

#[test]
fn suspend_mid_dispatch_keeps_the_remaining_cost_and_the_online_pays_each_unmap() {
    let (save_ns, restore_ns) =
        (emu_param("preempt_delay_us").unwrap() * 1000, emu_param("restore_delay_us").unwrap() * 1000);
    let cost = 40 * MS;
    let mut off = helper(&["offline", "--gpu-id", "0x1000", "--dispatch-us", "40000", "--records", "--runtime-enable"]);
    let pid = off.hello["pid"].as_u64().unwrap() as u32;
    let occupancy = format!("/sys/class/kfd/kfd/proc/{pid}/stats_4096/cu_occupancy");
    let mut d = debugger(pid);
    assert_eq!(d.cmd(&format!("enable {EC_PROCESS_RUNTIME}")).unwrap()["ret"], 0);
    assert_eq!(d.cmd(&format!("snapshot {EC_QUEUE_NEW} 4")).unwrap()["num_queues"], 1);
    let mut on = helper(&["run", "--gpu-id", "0x1000", "--fill-us", "0", "--runtime-enable"]);
    thread::sleep(Duration::from_millis(150));

    // 1. Suspend mid-dispatch: nothing completes during the hold, the GPU is empty of it.
    let s0 = monotonic_ns();
    assert_eq!(d.cmd("suspend 0 0").unwrap()["ret"], 1);
    let s1 = monotonic_ns();
    thread::sleep(Duration::from_millis(50));
    let before = until_stats(&mut off);
    assert_eq!(read_sysfs(&occupancy).unwrap(), "0\n", "suspended: no CU occupied");
    thread::sleep(Duration::from_millis(300));
    let after = until_stats(&mut off);
    assert_eq!(before["completed"], after["completed"], "work completed during the hold");
    assert_eq!(before["read_index"], after["read_index"]);
    let r0 = monotonic_ns();
    assert_eq!(d.cmd("resume 0").unwrap()["ret"], 1);
    let r1 = monotonic_ns();

    // 2. The online process's 1 s dispatch is preempted by the suspend and by the resume.
    thread::sleep(Duration::from_millis(100));
    assert_eq!(on.cmd("submit 0 1 1000000").unwrap()["ret"], 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while on.cmd("rptr").unwrap()["rptr"][0] != 1 {
        assert!(Instant::now() < deadline, "online dispatch never started");
        thread::sleep(Duration::from_millis(5));
    }
    thread::sleep(Duration::from_millis(100));
    let t0 = monotonic_ns();
    assert_eq!(d.cmd("suspend 0 0").unwrap()["ret"], 1);
    assert_eq!(d.cmd("resume 0").unwrap()["ret"], 1);
    let t1 = monotonic_ns();
    let online = wait_records(&mut on, 0, 1, Duration::from_secs(20))[0];
    assert_cost(&online, 1000 * MS);
    assert_eq!(online.preemptions, 2, "one device-wide unmap per suspend and per resume: {online:?}");
    assert!((t0..t1).contains(&online.first_stop_ns), "{online:?}");
    assert!(online.off_ns >= 2 * (save_ns + restore_ns), "{online:?}");
    assert!(online.off_ns <= t1 - t0 + 2 * restore_ns, "{online:?}");

    assert_eq!(d.cmd("disable").unwrap()["ret"], 0);
    off.send("stop").unwrap();
    let summary = until(&mut off, "summary");
    let recs = records(&summary["records"]);
    for r in &recs {
        assert_cost(r, cost);
        // Nothing of the offline process ran during the first hold.
        assert!(r.end_ns <= s1 || r.last_start_ns >= r0, "{r:?} ran inside the hold {s1}..{r0}");
        // Nor alongside the online dispatch (one GPU).
        assert!(r.end_ns <= online.start_ns || r.start_ns >= online.end_ns || r.preemptions > 0, "{r:?}");
    }
    let stopped: Vec<&Record> =
        recs.iter().filter(|r| r.preemptions > 0 && (s0..s1).contains(&r.first_stop_ns)).collect();
    assert_eq!(stopped.len(), 1, "exactly one dispatch interrupted by the suspend: {recs:?}");
    let r = stopped[0];
    assert_eq!(r.preemptions, 1, "{r:?}");
    assert!(r.last_start_ns >= r0 && r.last_start_ns <= r1 + 50 * MS, "{r:?} resumed {r0}..{r1}");
    assert_eq!(r.end_ns - r.last_start_ns, cost - (r.first_stop_ns - r.start_ns), "exactly the remaining cost");
    assert_eq!(summary["busy_ns_total"], summary["cost_ns_total"], "work conserved");
}

fn until_stats(w: &mut LineHelper) -> Value {
    w.send("stats").unwrap();
    until(w, "stats")
}

#[test]
fn cu_occupancy_is_nonzero_only_while_the_process_dispatch_runs() {
    let mut a = helper(&["run", "--gpu-id", "0x1000", "--fill-us", "0"]);
    let b = helper(&["run", "--gpu-id", "0x1000", "--fill-us", "0"]);
    let file = |pid: u32, gpu: u32| format!("/sys/class/kfd/kfd/proc/{pid}/stats_{gpu}/cu_occupancy");
    let (fa, fa2, fb) = (file(a.pid(), 4096), file(a.pid(), 8192), file(b.pid(), 4096));
    assert_eq!(read_sysfs(&fa).unwrap(), "0\n");
    assert_eq!(a.cmd("submit 0 5 100000").unwrap()["ret"], 0);
    let mut samples = Vec::new();
    let until_t = Instant::now() + Duration::from_millis(700);
    while Instant::now() < until_t {
        let before = monotonic_ns();
        let value = read_sysfs(&fa).unwrap();
        samples.push((before, monotonic_ns(), value));
        assert_eq!(read_sysfs(&fb).unwrap(), "0\n", "B has nothing running");
        assert_eq!(read_sysfs(&fa2).unwrap(), "0\n", "A has nothing on the other GPU");
        thread::sleep(Duration::from_millis(15));
    }
    let recs = wait_records(&mut a, 0, 5, Duration::from_secs(20));
    assert_eq!(read_sysfs(&fa).unwrap(), "0\n", "all done");
    let mut busy = 0;
    for (before, after, value) in &samples {
        let running = |lo: u64, hi: u64| recs.iter().any(|r| r.start_ns <= hi && r.end_ns >= lo);
        match value.as_str() {
            "104\n" => {
                busy += 1;
                assert!(running(*before, *after), "non-zero at {before}..{after} outside {recs:?}");
            }
            "0\n" => assert!(
                !recs.iter().any(|r| r.start_ns <= *before && r.end_ns >= *after),
                "zero at {before}..{after} while a dispatch ran: {recs:?}"
            ),
            other => panic!("cu_occupancy {other:?}"),
        }
    }
    assert!(busy * 2 >= samples.len(), "{busy} of {} samples non-zero", samples.len());
}

#[test]
fn malformed_packets_put_only_their_queue_in_error_state() {
    let mut busy = helper(&["run", "--gpu-id", "0x1000", "--fill-us", "1000"]);
    let mut w = helper(&["run", "--gpu-id", "0x1000", "--fill-us", "0", "--runtime-enable", "--queues", "7"]);
    // (queue, packet command or raw write index, exception code)
    let cases: [(usize, &str, u32); 7] = [
        (0, "packet 0 0 1 256 256 1000", 23), // VENDOR_SPECIFIC: not AMD's PM4-IB command
        (1, "packet 1 4 1 256 256 1000", 20), // AGENT_DISPATCH: valid AQL, not for a GPU
        (2, "packet 2 9 1 256 256 1000", 19), // reserved type
        (3, "packet 3 2 0 256 256 1000", 16), // dispatch with 0 dimensions
        (4, "packet 4 2 1 0 256 1000", 21),   // workgroup size 0
        (5, "packet 5 2 1 256 256 0", 18),    // cost (kernel_object) 0
        (6, "wptr 6 67", 19),                 // write index 65 packets ahead of a 64-packet ring
    ];
    for &(q, bad, ec) in &cases {
        assert_eq!(w.cmd(&format!("submit {q} 2 1000")).unwrap()["ret"], 0);
        wait_records(&mut w, q, 2, Duration::from_secs(20));
        w.cmd(bad).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let payload = w.cmd(&format!("error {q}")).unwrap()["err_payload"].as_u64().unwrap();
            if payload != 0 {
                assert_eq!(payload, 1 << (ec - 1), "queue {q}: {bad}");
                break;
            }
            assert!(Instant::now() < deadline, "queue {q}: no error reported for {bad}");
            thread::sleep(Duration::from_millis(20));
        }
    }
    // Errored queues consume nothing more; the bad packet is not consumed.
    let rptr = w.cmd("rptr").unwrap()["rptr"].clone();
    assert_eq!(rptr, serde_json::json!([2, 2, 2, 2, 2, 2, 2]));
    assert_eq!(w.cmd("submit 0 1 1000").unwrap()["ret"], 0);
    thread::sleep(Duration::from_millis(300));
    assert_eq!(w.cmd("rptr").unwrap()["rptr"], rptr);
    assert_eq!(w.cmd("records 0").unwrap()["pending"], 1);
    // The GPU is not hung: another process's queue keeps running.
    let r0 = busy.cmd("rptr").unwrap()["rptr"][0].as_u64().unwrap();
    thread::sleep(Duration::from_millis(200));
    assert!(busy.cmd("rptr").unwrap()["rptr"][0].as_u64().unwrap() > r0);
    // A ring size that is not a power of two never makes a queue.
    assert_eq!(w.cmd("create 0x1000 2 3000 100 7").unwrap()["ret"], -22);
    for id in 0..7 {
        assert_eq!(w.cmd(&format!("destroy {id}")).unwrap()["ret"], 0, "destroying errored queue {id}");
    }
    assert_no_kernel_warning();
}

#[test]
fn a_debugger_subscribed_to_a_packet_error_gets_it_instead_of_the_runtime() {
    let mut w = helper(&["run", "--gpu-id", "0x2000", "--fill-us", "0", "--runtime-enable"]);
    let mut d = debugger(w.pid());
    let vendor = 1u64 << 22; // EC_QUEUE_PACKET_VENDOR_UNSUPPORTED (23)
    assert_eq!(d.cmd(&format!("enable {}", vendor | EC_QUEUE_NEW)).unwrap()["ret"], 0);
    assert_eq!(d.cmd(&format!("snapshot {EC_QUEUE_NEW} 4")).unwrap()["num_queues"], 1);
    assert_eq!(d.cmd("pipe").unwrap()["bytes"], 0);
    w.cmd("packet 0 0 1 256 256 1000").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while d.cmd("pipe").unwrap()["text"] != "." {
        assert!(Instant::now() < deadline, "no '.' on the debugger's pipe");
        thread::sleep(Duration::from_millis(20));
    }
    let event = d.cmd(&format!("query {vendor}")).unwrap();
    assert_eq!(
        (event["ret"].as_i64(), event["queue_id"].as_u64(), event["gpu_id"].as_u64(), event["exception_mask"].as_u64()),
        (Some(0), Some(0), Some(0x2000), Some(vendor))
    );
    assert_eq!(w.cmd("error 0").unwrap()["err_payload"], 0, "the runtime is not told when the debugger is");
    assert_eq!(d.cmd("disable").unwrap()["ret"], 0);
    assert_no_kernel_warning();
}

/// Runs last in this binary (libtest orders by name): unloads the module once every process
/// released it, checks the kernel log, and loads it again with the same parameters.
#[test]
fn zz_the_module_unloads_cleanly_and_loads_again() {
    let params = ["num_gpus", "tick_us", "preempt_delay_us", "restore_delay_us", "queue_preemption_timeout_ms"];
    let values: Vec<String> = params.iter().map(|p| format!("{p}={}", emu_param(p).unwrap())).collect();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap().trim().to_owned();
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).unwrap();
    let ko = target.join("kfd-emu").join(&release).join("kfd_emu.ko");
    assert!(ko.exists(), "{}", ko.display());
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_dir("/sys/class/kfd/kfd/proc").unwrap().next().is_some() {
        assert!(Instant::now() < deadline, "kfd processes still alive");
        thread::sleep(Duration::from_millis(100));
    }
    let rmmod = Command::new("rmmod").arg("kfd_emu").output().unwrap();
    assert!(rmmod.status.success(), "rmmod: {}", String::from_utf8_lossy(&rmmod.stderr));
    assert!(!Path::new("/dev/kfd").exists() && !Path::new("/sys/module/kfd_emu").exists());
    assert_no_kernel_warning();
    let insmod = Command::new("insmod").arg(&ko).args(&values).output().unwrap();
    assert!(insmod.status.success(), "insmod: {}", String::from_utf8_lossy(&insmod.stderr));
    assert_eq!(emu_param("preempt_delay_us").unwrap().to_string(), values[2].split('=').nth(1).unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !Path::new("/dev/kfd").exists() {
        assert!(Instant::now() < deadline, "/dev/kfd did not come back");
        thread::sleep(Duration::from_millis(50));
    }
}
