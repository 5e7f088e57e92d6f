//! HIP (Debian's hipcc; bookworm's HIP 5.2, trixie's 5.7) on the emulated GPU (README "HIP").

use std::{collections::BTreeMap, path::PathBuf};

use gpreempt_tests::wait_kfd_released;

use crate::{
    emulator::{GPU0, GPU1, counters, cp_stats_since, gpreempt_queues, ns_per_workitem, sysfs_queues},
    preempt_rocm::preempt_two_queues_5_times,
    rocm_run::RocmRun,
};

/// `tests/rocm/hip_streams.hip` as built by bookworm's hipcc: on bookworm's HIP 5.2 and ROCr 5.2
/// (`hip-streams`) or trixie's HIP 5.7 and ROCr 6.1 (`hip-streams-6`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Hip {
    V5_2,
    V5_7,
}

impl Hip {
    pub(crate) fn exe(self) -> PathBuf {
        let (name, how) = match self {
            Hip::V5_2 => ("hip-streams", "once `cargo xtask setup` installed hipcc and libamdhip64-dev"),
            Hip::V5_7 => ("hip-streams-6", "once `cargo xtask setup` unpacked trixie's HIP 5.7 and ROCm 6.1"),
        };
        gpreempt_tests::binary(name).unwrap_or_else(|e| panic!("{name} is built by `cargo xtask test` {how}: {e}"))
    }
}

pub(crate) fn hip_run(hip: Hip, args: &[&str]) -> RocmRun {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    RocmRun::start(&hip.exe(), &args)
}

pub(crate) fn hip_streams_run(args: &[&str]) -> RocmRun {
    hip_run(Hip::V5_2, args)
}

/// `hip-streams STREAMS GRID BYTES hold` up to its `holding` line: its first line, then per
/// stream the kernel's emulated time (grid x ns_per_workitem) between the stream's two events and
/// every byte of the hipMemcpy round trip back, in the stream's pattern.
/// `devices`: the GPUs HIP lists (both emulated gfx90a GPUs; one MI300X partition or package).
pub(crate) fn hip_streams_until_holding(run: &mut RocmRun, devices: u64, streams: u64, grid: u64, bytes: u64) {
    let pid = run.pid;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&run.line()).unwrap(),
        serde_json::json!({"pid": pid, "devices": devices, "streams": streams})
    );
    let kernel_ms = (grid * ns_per_workitem()) as f64 / 1e6;
    for i in 0..streams {
        let v: serde_json::Value = serde_json::from_str(&run.line()).unwrap();
        let elapsed = v["elapsed_ms"].as_f64().unwrap();
        assert!(elapsed >= kernel_ms * (1.0 - 1e-6), "hipEventElapsedTime below the kernel's {kernel_ms} ms: {v}");
        let expect = serde_json::json!({
            "stream": i,
            "elapsed_ms": v["elapsed_ms"],
            "bytes": bytes,
            "equal": bytes,
            "first": hip_pattern(i, 0),
            "last": hip_pattern(i, bytes - 1),
        });
        assert_eq!(v, expect);
    }
    assert_eq!(run.line(), format!(r#"{{"holding":{streams}}}"#));
}

/// Tell a holding `hip-streams` to end, and its last line.
pub(crate) fn hip_streams_release(run: &mut RocmRun, streams: u64) {
    if let Some(stdin) = run.child.stdin.as_mut() {
        std::io::Write::write_all(stdin, b"go\n").unwrap();
    }
    assert_eq!(run.finish(), [format!(r#"{{"streams":{streams},"done":true}}"#)]);
}

/// hip-streams' per-stream pattern (`host[k] = k * 131 + stream * 17 + 7`, as bytes).
fn hip_pattern(stream: u64, k: u64) -> u64 {
    (k * 131 + stream * 17 + 7) & 0xff
}

pub(crate) fn a_rocm_hip_program_with_streams_events_and_copies_runs_to_completion_on_the_emulated_gpu() {
    const STREAMS: u64 = 3;
    const BYTES: u64 = 4096;
    let grid = 640u64;
    let mut run = hip_streams_run(&[&STREAMS.to_string(), &grid.to_string(), &BYTES.to_string(), "hold"]);
    let pid = run.pid;
    hip_streams_until_holding(&mut run, 2, STREAMS, grid, BYTES);
    // What HIP 5.2 created in KFD on the first GPU for 3 streams and the copies: ROCr's own
    // 64-packet queue (4 KiB ring); one 4096-packet queue (256 KiB) per stream and one for the
    // null stream the synchronous hipMemcpy runs on (ROCclr, at most 4 per priority); and ROCr's
    // two SDMA queues (1 MiB rings, type 1), host-to-device and device-to-host, created together
    // at the first copy.
    let compute = |size| (GPU0, 0, size);
    let sdma = (GPU0, 1, 1 << 20);
    let expect =
        [compute(4096), compute(256 << 10), compute(256 << 10), compute(256 << 10), compute(256 << 10), sdma, sdma];
    assert_eq!(sysfs_queues(pid), expect, "queues of pid {pid}");
    let v = gpreempt_queues(pid);
    assert_eq!((&v["source"], &v["pid"]), (&serde_json::json!("sysfs"), &serde_json::json!(pid)), "{v}");
    let mut listed: Vec<(u64, String, u64)> = v["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| {
            (
                q["gpu_id"].as_u64().unwrap(),
                q["queue_type"].as_str().unwrap().to_owned(),
                q["ring_size"].as_u64().unwrap(),
            )
        })
        .collect();
    listed.sort();
    let c = |size| (4096, "compute".to_owned(), size);
    let d = (4096, "sdma".to_owned(), 1 << 20);
    assert_eq!(listed, [c(4096), c(256 << 10), c(256 << 10), c(256 << 10), c(256 << 10), d.clone(), d], "{v}");
    hip_streams_release(&mut run, STREAMS);
    // Per stream: its kernel (code-object kernel) between two barrier-AND markers. Once: ROCr's
    // blit kernels loading the program's and ROCclr's code objects into VRAM, each followed by a
    // code-cache invalidation (PM4 IB). Each device-to-host hipMemcpy is one SDMA linear copy of
    // the buffer (the host-to-device one writes through the CPU mapping of VRAM, no GPU packet),
    // with ROCr's dependency poll, start and end timestamps, the signal decrement (atomic add),
    // the mailbox fence and the trap that raises its interrupt. The counts the runtime's own
    // markers and signals reach are ROCclr 5.2's, measured, and the same on every run.
    let gpu0 = counters(&[
        ("kernels", 2 + STREAMS),
        ("barriers_and", 12),
        ("pm4_ibs", 2),
        ("signals", 14),
        ("interrupts", 17),
        ("events_set", 17),
        ("sdma_copies", STREAMS),
        ("sdma_bytes", STREAMS * BYTES),
        ("sdma_fences", STREAMS),
        ("sdma_traps", STREAMS),
        ("sdma_atomics", STREAMS),
        ("sdma_polls", STREAMS),
        ("sdma_timestamps", 2 * STREAMS),
    ]);
    assert_eq!(cp_stats_since(&run.before), BTreeMap::from([(GPU0, gpu0), (GPU1, counters(&[]))]));
    run.end();
}

pub(crate) fn a_rocm_hip_program_killed_with_its_sdma_queues_is_released_and_the_modules_unload() {
    let mut run = hip_streams_run(&["2", "640", "4096", "hold"]);
    let pid = run.pid;
    loop {
        if run.line() == r#"{"holding":2}"# {
            break;
        }
    }
    // Its compute and SDMA queues exist when it is killed.
    let queues = sysfs_queues(pid);
    assert_eq!(queues.iter().filter(|q| q.1 == 1).count(), 2, "{queues:?}");
    run.child.kill().unwrap();
    let status = run.child.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
    wait_kfd_released(pid).unwrap();
    run.end();
}

pub(crate) fn a_hip_5_7_program_on_rocr_6_1_runs_its_streams_with_barrier_value_markers_and_sdma_copies() {
    const STREAMS: u64 = 3;
    const BYTES: u64 = 4096;
    // The same program, built by bookworm's hipcc, on trixie's HIP 5.7 and ROCr 6.1.
    let mut run = hip_run(Hip::V5_7, &[&STREAMS.to_string(), "640", &BYTES.to_string(), "hold"]);
    let pid = run.pid;
    hip_streams_until_holding(&mut run, 2, STREAMS, 640, BYTES);
    let compute = |size| (GPU0, 0, size);
    let sdma = (GPU0, 1, 1 << 20);
    assert_eq!(sysfs_queues(pid), HIP_5_7_QUEUES.map(|(t, size)| if t == 0 { compute(size) } else { sdma }));
    hip_streams_release(&mut run, STREAMS);
    // Unlike 5.2, HIP 5.7 marks each hipEventRecord with an AMD barrier-value packet (2 per
    // stream) and copies both ways on SDMA (2 linear copies per stream, the host-to-device one
    // too). Measured, the same on every run.
    let gpu0 = counters(&[
        ("kernels", 2 + STREAMS),
        ("barriers_and", 3),
        ("barriers_value", 2 * STREAMS),
        ("pm4_ibs", 2),
        ("signals", 13),
        ("interrupts", 19),
        ("events_set", 19),
        ("sdma_copies", 2 * STREAMS),
        ("sdma_bytes", 2 * STREAMS * BYTES),
        ("sdma_fences", 2 * STREAMS),
        ("sdma_traps", 2 * STREAMS),
        ("sdma_atomics", 2 * STREAMS),
        ("sdma_polls", 2 * STREAMS),
    ]);
    assert_eq!(cp_stats_since(&run.before), BTreeMap::from([(GPU0, gpu0), (GPU1, counters(&[]))]));
    run.end();
}

/// HIP 5.7's KFD queues on the first GPU for 3 streams and their copies, (type, ring bytes),
/// measured: as HIP 5.2's (ROCr's utility queue, one per stream and one for the null stream, two
/// SDMA queues) but ROCclr 5.7 gives a stream 16384 packets (1 MiB) where 5.2 gave 4096.
const HIP_5_7_QUEUES: [(u32, u64); 7] =
    [(0, 4096), (0, 1 << 20), (0, 1 << 20), (0, 1 << 20), (0, 1 << 20), (1, 1 << 20), (1, 1 << 20)];

/// The counters of `hip-streams offline` on HIP 5.7 that ran `k` kernels: per step its kernel and
/// the barrier-AND marker hipStreamSynchronize waits on (and once more for the warm-up); once
/// ROCr's two loader blits with their code-cache invalidations, and the final round trip's two
/// SDMA copies of 4096 bytes. Measured, the same on every run.
pub(crate) fn hip_5_7_offline_counters(k: u64) -> Vec<(&'static str, u64)> {
    vec![
        ("kernels", k + 3),
        ("barriers_and", k + 2),
        ("pm4_ibs", 2),
        ("signals", k + 6),
        ("interrupts", k + 8),
        ("events_set", k + 8),
        ("sdma_copies", 2),
        ("sdma_bytes", 2 * 4096),
        ("sdma_fences", 2),
        ("sdma_traps", 2),
        ("sdma_atomics", 2),
        ("sdma_polls", 2),
    ]
}

/// `hip-streams offline`'s last two lines: each kernel's end, and the summary with the round
/// trip's bytes all equal; returns (ends, kernels, longest step in ns).
pub(crate) fn hip_offline_end(ends: &str, done: &str) -> (Vec<u64>, u64, u64) {
    let ends: serde_json::Value = serde_json::from_str(ends).unwrap();
    let done: serde_json::Value = serde_json::from_str(done).unwrap();
    let k = done["completed"].as_u64().expect("completed");
    let ends: Vec<u64> = ends["ends_ns"].as_array().unwrap().iter().map(|e| e.as_u64().unwrap()).collect();
    assert_eq!(ends.len() as u64, k);
    let expect = serde_json::json!({"completed": k, "longest_ns": done["longest_ns"], "bytes": 4096, "equal": 4096, "done": true});
    assert_eq!(done, expect);
    (ends, k, done["longest_ns"].as_u64().unwrap())
}

pub(crate) fn gpreempt_preempt_suspends_a_hip_5_7_program_mid_kernel_and_its_results_come_back_exact() {
    // A HIP training loop on trixie's HIP 5.7 (whose ROCr 6.1 enables the debug interface):
    // kernels of 64,000 work-items (64 ms each at the default 1 µs), each synchronized.
    let mut run = hip_run(Hip::V5_7, &["offline", "64000"]);
    let pid = run.pid;
    assert_eq!(run.json_line(), serde_json::json!({"pid": pid, "looping": 1}));
    // Its two KFD queues (ROCr's utility queue, the stream's) are suspended for 300 ms in each of
    // 5 cycles, far longer than a kernel: the kernel in flight is held mid-way.
    preempt_two_queues_5_times(pid);
    // Resumed, it ends when told: every kernel completed, the round trip's bytes all came back,
    // and at least one step took its kernel's cost plus a whole hold.
    let rest = run.finish();
    assert_eq!(rest.len(), 2, "{rest:?}");
    let (_, k, longest) = hip_offline_end(&rest[0], &rest[1]);
    assert!(longest >= 64_000 * ns_per_workitem() + 300_000_000, "no kernel was held mid-way: {}", rest[1]);
    assert_eq!(
        cp_stats_since(&run.before),
        BTreeMap::from([(GPU0, counters(&hip_5_7_offline_counters(k))), (GPU1, counters(&[]))])
    );
    run.end();
}
