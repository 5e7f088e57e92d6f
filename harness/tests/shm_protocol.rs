//! The client/GPU protocol across a real client process (`harness client`, spawned): the client
//! tells where its indices live in its memory (read there with `process_vm_readv`, as the
//! scheduler does), publishes, blocks on completions; the model GPU consumes exactly what was
//! published and its read index ends equal to the write index.

use std::{
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use gpreempt::{clock::monotonic_ns, domain::HostPid, schedule::online::read_u64s};
use harness::{
    client::ClientResult,
    gpu::{
        ModelGpu,
        core::{Bound, GpuCore, Side},
    },
    load::{ClientSpec, Request},
    shm::{Shm, fresh_path, futex_wake},
};

#[test]
fn a_client_process_publishes_and_the_model_gpu_consumes_exactly_that() {
    let shm = Arc::new(Shm::create(&fresh_path("test")).expect("region"));
    let gpu = Arc::new(ModelGpu::new(0, GpuCore::new(Bound::Serial, 0), shm.clone()));
    assert_eq!(gpu.add_queue(3, 0, Side::Online), 0);
    let stop = Arc::new(AtomicBool::new(false));
    let driver = {
        let (gpu, stop) = (gpu.clone(), stop.clone());
        std::thread::spawn(move || gpu.run(&stop))
    };
    let requests =
        (0..3).map(|i| Request { at_ns: i * 20_000_000, dispatches: vec![100_000, 200_000], tokens: 0 }).collect();
    let spec = std::env::temp_dir().join(format!("harness-test-spec-{}.json", std::process::id()));
    std::fs::write(&spec, serde_json::to_vec(&ClientSpec::Requests { requests }).unwrap()).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_harness"))
        .args(["client", "--shm"])
        .arg(shm.path())
        .args(["--client", "0", "--queue", "3:0", "--spec"])
        .arg(&spec)
        .stdout(Stdio::piped())
        .spawn()
        .expect("client");
    let slot = &shm.queues[3];
    let deadline = Instant::now() + Duration::from_secs(60);
    while slot.owner.load(Ordering::Acquire) == 0 {
        assert!(Instant::now() < deadline, "the client did not attach");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(slot.owner.load(Ordering::Acquire), child.id());
    // The indices, read in the client's own memory.
    let addrs = [slot.read_addr.load(Ordering::Acquire), slot.write_addr.load(Ordering::Acquire)];
    let mut v = [9, 9];
    read_u64s(HostPid(child.id()), &addrs, &mut v).expect("process_vm_readv of the client");
    assert_eq!(v, [0, 0]);
    shm.start_ns.store(monotonic_ns() + 50_000_000, Ordering::Release);
    shm.go.store(1, Ordering::Release);
    futex_wake(&shm.go);
    let out = child.wait_with_output().expect("client output");
    assert!(out.status.success());
    let result: ClientResult = serde_json::from_slice(&out.stdout).expect("client JSON");
    assert_eq!(result.latencies_ns.len(), 3);
    assert!(result.latencies_ns.iter().all(|&l| (300_000..2_000_000_000).contains(&l)), "{:?}", result.latencies_ns);
    assert_eq!(
        (slot.write.load(Ordering::Acquire), slot.read.load(Ordering::Acquire), slot.completed.load(Ordering::Acquire)),
        (6, 6, 6)
    );
    let (acct, busy) = gpu.snapshot();
    assert_eq!((acct.clients[0].work_ns, acct.clients[0].completed), (900_000, 6));
    assert_eq!(acct.clients[0].work_ns + acct.idle_ns + acct.stalled_ns, acct.elapsed_ns);
    assert_eq!(busy.len(), 3);
    stop.store(true, Ordering::Release);
    harness::shm::ring(&shm.doorbell[0]);
    driver.join().unwrap();
    let _ = std::fs::remove_file(spec);
}
