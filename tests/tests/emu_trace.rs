//! The unchanged `gpreempt` binary against the KFD emulator (emulator VM pass): `trace` sees
//! queue creates that succeed, with ret 0 and the driver's queue id, and destroys of real queues
//! with ret 0; `ps` lists the queues from sysfs. On amdgpu without a GPU every create fails, so
//! only the emulator shows this.

use std::process::Command;

use gpreempt_tests::{LineHelper, Tracer, binary, events_of, summary};

#[test]
fn successful_creates_and_destroys_are_traced_with_their_queue_ids() {
    let tracer = Tracer::start(&[]).unwrap();
    let mut w = LineHelper::spawn("emu-workload", &["run", "--gpu-id", "0x2000", "--queues", "2"]).unwrap();
    let pid = w.pid();
    assert_eq!(w.cmd("destroy 0").unwrap()["ret"], 0);
    assert_eq!(w.cmd("destroy 0").unwrap()["ret"], -22, "already destroyed");
    assert!(w.finish().unwrap().success());
    let objects = tracer.stop().unwrap();

    let creates = events_of(&objects, pid, "queue_create");
    assert_eq!(creates.len(), 2, "{objects:?}");
    for (e, id) in creates.iter().zip([0, 1]) {
        assert_eq!(e["result"], "OK");
        assert_eq!(e["ret"], 0);
        assert_eq!(e["queue_id"], id);
        assert_eq!(e["gpu_id"], 0x2000);
        assert_eq!(e["queue_type"], "compute-aql");
        assert_eq!(e["ring_size"], 4096);
        assert_eq!(e["comm"], "emu-workload");
    }
    let destroys = events_of(&objects, pid, "queue_destroy");
    assert_eq!(destroys.len(), 2, "{objects:?}");
    assert_eq!(
        (&destroys[0]["queue_id"], &destroys[0]["ret"], &destroys[0]["result"]),
        (&0.into(), &0.into(), &"OK".into())
    );
    assert_eq!((&destroys[1]["queue_id"], &destroys[1]["ret"]), (&0.into(), &(-22).into()));
    assert_eq!(summary(&objects).unwrap()["dropped"], 0);
}

#[test]
fn perfetto_draws_each_queue_from_its_create_to_its_end() {
    // The Perfetto sink takes queue lifetimes from the model's queue notices (not the records):
    // on the emulator, where creates succeed, each queue gets its create instant and one
    // complete event on its own track of the process.
    let perfetto = std::env::temp_dir().join(format!("gpreempt-emu-perfetto-{}.json", std::process::id()));
    let tracer = Tracer::start(&["--perfetto", perfetto.to_str().unwrap()]).unwrap();
    let mut w = LineHelper::spawn("emu-workload", &["run", "--gpu-id", "0x2000", "--queues", "2"]).unwrap();
    let pid = w.pid();
    assert_eq!(w.cmd("destroy 0").unwrap()["ret"], 0);
    assert!(w.finish().unwrap().success());
    tracer.stop().unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&perfetto).unwrap()).unwrap();
    let _ = std::fs::remove_file(&perfetto);
    let events = doc["traceEvents"].as_array().unwrap();
    let ours = |ph: &str| -> Vec<&serde_json::Value> {
        events.iter().filter(|e| e["ph"] == ph && e["cat"] == "queue" && e["pid"] == pid).collect()
    };
    // Queue tracks are thread ids 2^24 + queue id (report/perfetto.rs).
    let track = |id: u64| (1u64 << 24) + id;
    let creates: Vec<(u64, u64, &str)> = ours("i")
        .iter()
        .map(|e| {
            (e["tid"].as_u64().unwrap(), e["args"]["gpu_id"].as_u64().unwrap(), e["args"]["type"].as_str().unwrap())
        })
        .collect();
    assert_eq!(creates, [(track(0), 0x2000, "compute-aql"), (track(1), 0x2000, "compute-aql")], "{doc}");
    let lifetimes: Vec<(String, u64, f64)> = ours("X")
        .iter()
        .map(|e| {
            let end = e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap();
            (e["name"].as_str().unwrap().to_owned(), e["tid"].as_u64().unwrap(), end)
        })
        .collect();
    let names: Vec<(&str, u64)> = lifetimes.iter().map(|(n, t, _)| (n.as_str(), *t)).collect();
    assert_eq!(names, [("queue 0", track(0)), ("queue 1", track(1))], "{doc}");
    // Queue 0 was destroyed while the process ran; queue 1 went with it (or at the trace's end).
    assert!(lifetimes[0].2 < lifetimes[1].2, "{lifetimes:?}");
    let name = events.iter().find(|e| e["ph"] == "M" && e["name"] == "process_name" && e["pid"] == pid);
    assert_eq!(name.map(|e| &e["args"]["name"]), Some(&serde_json::json!(format!("emu-workload {pid}"))), "{doc}");
}

#[test]
fn ps_lists_the_emulated_queues_of_a_process() {
    let mut w = LineHelper::spawn("emu-workload", &["run", "--gpu-id", "0x1000", "--queues", "2"]).unwrap();
    assert_eq!(w.cmd("create 0x2000 1 8192 100 3").unwrap()["queue_id"], 2);
    let ps = Command::new(binary("gpreempt").unwrap()).args(["ps", "--json"]).output().unwrap();
    assert!(ps.status.success(), "{}", String::from_utf8_lossy(&ps.stderr));
    let v: serde_json::Value = serde_json::from_slice(&ps.stdout).unwrap();
    let me = v["processes"].as_array().unwrap().iter().find(|p| p["pid"] == w.pid()).cloned().unwrap();
    assert_eq!(
        me["queues"],
        serde_json::json!([
            // A process with no secondary context: every queue is its primary context's.
            {"queue_id": 0, "gpu_id": 4096, "kernel_type": 0, "ring_size": 4096, "context": "primary"},
            {"queue_id": 1, "gpu_id": 4096, "kernel_type": 0, "ring_size": 4096, "context": "primary"},
            {"queue_id": 2, "gpu_id": 8192, "kernel_type": 1, "ring_size": 8192, "context": "primary"},
        ])
    );
    let gpus: Vec<(u64, u64, u64)> = me["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["gpu_id"].as_u64().unwrap(), g["vram_bytes"].as_u64().unwrap(), g["evicted_ms"].as_u64().unwrap()))
        .collect();
    assert_eq!(gpus, [(4096, 0, 0), (8192, 0, 0)]);
    assert_eq!(me["notes"], serde_json::json!([]), "every file ps expects exists");
    assert_eq!(me["info"]["comm"], "emu-workload");
}

#[test]
fn a_ttm_eviction_and_its_restore_make_one_eviction_span_per_gpu() {
    let tracer = Tracer::start(&[]).unwrap();
    let w = LineHelper::spawn("emu-workload", &["run", "--gpu-id", "0x1000", "--queues", "1"]).unwrap();
    let pid = w.pid();
    // The emulator's control files run kfd_process_evict_queues(p, TTM) / _restore_queues in a
    // kworker, which call kfd_smi_event_queue_eviction / _restore as amdgpu does.
    std::fs::write("/sys/kernel/kfd_emu/evict", pid.to_string()).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    std::fs::write("/sys/kernel/kfd_emu/restore", pid.to_string()).unwrap();
    let objects = tracer.stop().unwrap();
    let spans: Vec<&serde_json::Value> =
        objects.iter().filter(|o| o["event"] == "span" && o["span"] == "eviction" && o["pid"] == pid).collect();
    // One span per GPU: like amdgpu, the emulator evicts and restores the process on each device
    // it has (both emulated GPUs), and the tracer pairs evict and restore per (pid, gpu).
    let mut gpus: Vec<u64> = spans.iter().map(|s| s["gpu_id"].as_u64().unwrap()).collect();
    gpus.sort_unstable();
    assert_eq!(gpus, [0x1000, 0x2000], "{objects:?}");
    for span in &spans {
        assert_eq!((&span["trigger"], &span["open"]), (&serde_json::json!("ttm"), &serde_json::json!(false)));
        let ms = span["duration_ns"].as_u64().unwrap() as f64 / 1e6;
        assert!((300.0..10_000.0).contains(&ms), "eviction lasted {ms} ms");
    }
    drop(w);
}
