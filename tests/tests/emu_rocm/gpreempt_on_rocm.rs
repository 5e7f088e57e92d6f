//! gpreempt on ROCm programs: trace, schedule, the agent; preempt on ROCm 6.1.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use gpreempt_tests::wait_kfd_released;

use crate::{
    emulator::{GPU0, GPU1, counters, cp_stats_since, ns_per_workitem, sysfs_queues},
    hip::{Hip, hip_5_7_offline_counters, hip_offline_end, hip_run, hip_streams_run},
    preempt_rocm::preempt_two_queues_5_times,
    rocm_run::{RocmRun, hsa_dispatch, hsa_dispatch_run, spawn_piped},
};

/// `hsa-dispatch` built against Debian trixie's ROCm 6.1 runtime (`xtask/src/rocm6.rs`).
fn hsa_dispatch_6() -> PathBuf {
    gpreempt_tests::binary("hsa-dispatch-6").expect(
        "hsa-dispatch-6 is built by `cargo xtask test` once `cargo xtask setup` unpacked trixie's ROCm 6.1 runtime",
    )
}

/// `hsa-dispatch CODE_OBJECT ARGS` on ROCr 5.2 (`hsa-dispatch`) or 6.1 (`hsa-dispatch-6`), not
/// run by a [`RocmRun`]: the second program of a test.
fn hsa_dispatch_spawn(exe: &Path, args: &[&str]) -> std::process::Child {
    let hsaco = hsa_dispatch().1;
    spawn_piped(exe, std::iter::once(hsaco.as_os_str()).chain(args.iter().map(std::ffi::OsStr::new)))
}

pub(crate) fn gpreempt_preempt_suspends_rocm_6_1_mid_dispatch_and_every_dispatch_completes() {
    // The same program on ROCr 6.1: dispatches of 64,000 work-items (64 ms each at the default
    // 1 µs), one after the other, at least 20 and on until told on stdin.
    let hsaco = hsa_dispatch().1;
    let args: Vec<&std::ffi::OsStr> =
        [hsaco.as_os_str()].into_iter().chain(["loop", "64000", "20"].map(std::ffi::OsStr::new)).collect();
    let mut run = RocmRun::start(&hsa_dispatch_6(), &args);
    let pid = run.pid;
    assert_eq!(run.line(), format!(r#"{{"pid":{pid},"looping":20}}"#));
    // ROCr 6 enabled the debug runtime at hsa_init: gpreempt attaches and each of 5 cycles
    // suspends both of ROCr's KFD queues on the GPU (its utility queue and the program's) for
    // 300 ms, far longer than a dispatch, so the program's dispatch in flight is held mid-way.
    preempt_two_queues_5_times(pid);
    // Resumed, the program ends when told: every dispatch completed (its signal at 0, the read
    // index at the last one), and at least one took its cost plus a whole hold: suspended mid-way
    // and finished from where it stopped.
    let rest = run.finish();
    let last: serde_json::Value = serde_json::from_str(rest.first().expect("hsa-dispatch-6's last line")).unwrap();
    let k = last["completed"].as_u64().expect("completed");
    assert!(k >= 20, "{last}");
    assert_eq!((&last["read_index"], &last["done"]), (&k.into(), &true.into()), "{last}");
    let cost = 64_000 * ns_per_workitem() / 10;
    let longest = last["longest_ticks"].as_u64().unwrap();
    // A 300 ms hold is 30,000,000 ticks of the 100 MHz GPU clock.
    assert!(longest >= cost + 30_000_000, "no dispatch was held mid-way: {last}");
    // ROCr 6.1's blit copy of the code object and the K dispatches, each with its interrupt
    // signal, and the cache invalidation (a PM4 IB); nothing failed, nothing ran twice.
    // ROCr 6.1, unlike 5.2, also puts a completion signal on that PM4 IB.
    let n = k + 1;
    let gpu0 =
        counters(&[("kernels", n), ("pm4_ibs", 1), ("signals", n + 1), ("interrupts", n + 1), ("events_set", n + 1)]);
    assert_eq!(cp_stats_since(&run.before), BTreeMap::from([(GPU0, gpu0), (GPU1, counters(&[]))]));
    run.end();
}

/// From 20 ms after each request's doorbell (the reaction and the emulated save, bounded
/// generously for TCG) to 5 ms before its completion the offline job barely progresses, and
/// between requests it runs. Both ends are host stamps taken when a program's thread saw its
/// signal: once the online kernel is done the scheduler resumes the offline job after --idle,
/// while a descheduled vCPU can keep the online thread from stamping its end for longer (a HIP
/// request ends after hipStreamSynchronize's wait), and a loaded guest can stretch a reaction past
/// 20 ms, so a protected request can still show an offline end near either edge (seen: 0-2 of 20
/// requests on a quiet host, 3-4 on a loaded one, one end each). The judgement is therefore the
/// offline job's completion rate inside the requests against its rate between them, over all
/// twenty: protected, a few stray ends (at most a fifth of the rate between); unprotected, the
/// offline job loops without pause and ends dispatches inside every request.
fn assert_protected(requests: &[serde_json::Value], ends: &[u64]) {
    let mut violations = Vec::new();
    let (mut between, mut inside_ends, mut inside_ns, mut between_ends, mut between_ns) =
        (0, 0usize, 0u64, 0usize, 0u64);
    for (i, r) in requests.iter().enumerate() {
        let submit = r["submit_ns"].as_u64().unwrap();
        let end = submit + r["latency_ns"].as_u64().unwrap();
        let (from, to) = (submit + 20_000_000, end.saturating_sub(5_000_000));
        let inside = ends.iter().filter(|&&e| e > from && e < to).count();
        inside_ends += inside;
        inside_ns += to.saturating_sub(from);
        if inside > 0 {
            violations.push((i, inside));
        }
        if let Some(next) = requests.get(i + 1) {
            let next_submit = next["submit_ns"].as_u64().unwrap();
            let n = ends.iter().filter(|&&e| e > end && e < next_submit).count();
            between_ends += n;
            between_ns += next_submit.saturating_sub(end);
            if n > 0 {
                between += 1;
            }
        }
    }
    let rate = |n: usize, ns: u64| n as f64 / (ns.max(1) as f64 / 1e9);
    let (inside_rate, between_rate) = (rate(inside_ends, inside_ns), rate(between_ends, between_ns));
    eprintln!(
        "requests with offline completions inside: {violations:?}; gaps with progress: {between}; offline ends/s \
         inside {inside_rate:.1} ({inside_ends} in {:.0} ms), between {between_rate:.1} ({between_ends} in {:.0} ms)",
        inside_ns as f64 / 1e6,
        between_ns as f64 / 1e6
    );
    assert!(
        inside_rate <= between_rate / 5.0,
        "the offline job ended {inside_rate:.1} dispatches/s inside the ROCm program's requests against \
         {between_rate:.1}/s between them: {violations:?}"
    );
    assert!(between >= requests.len() - 2, "offline progressed in only {between} of {} gaps", requests.len() - 1);
}

pub(crate) fn schedule_suspends_an_offline_job_during_each_request_of_a_rocm_program_seen_through_rocrs_queue() {
    use gpreempt_tests::{
        LineHelper,
        schedule::{LONG, Schedule},
        summary,
    };

    const REQUESTS: usize = 20;
    // The online side is Debian's ROCr itself: one dispatch of 40,000 work-items per request (40 ms
    // at the default 1 µs each), a request every 200 ms. ROCr 5.2 never enables the debug
    // runtime, which the online side does not need: its queues are read, never suspended.
    let mut online = hsa_dispatch_run(&["requests", "40000", &REQUESTS.to_string(), "200000"]);
    let pid = online.pid;
    assert_eq!(online.json_line(), serde_json::json!({"pid": pid, "ready": REQUESTS}));
    let gpu0 = format!("{GPU0:#x}");
    let mut offline = LineHelper::spawn(
        "emu-workload",
        &["offline", "--gpu-id", &gpu0, "--runtime-enable", "--dispatch-us", "2000", "--records"],
    )
    .unwrap();
    let mut s = Schedule::between(pid, &offline.pid().to_string(), &["--idle", "5ms", "--interval", "200ms"]);
    let attached = s.wait_events("offline_attached", 1, LONG);
    assert_eq!(attached[0]["queues"], 1);
    // Every KFD queue ROCr made for the program on the first GPU: the program's own and ROCr's
    // internal one (its blit kernels copied the code object into VRAM), read through GET_QUEUE_SNAPSHOT.
    let added = s.events("online_added");
    assert_eq!((added[0]["queues"].as_u64(), added[0]["snapshot"].as_bool()), (Some(2), Some(true)), "{added:?}");
    // The program maps Debian's ROCr: the doorbell probe is attached to it (the queues' handles
    // read from their amd_queue_t) and the index poll only cross-checks.
    let seen = s.wait_events("online_seen_by", 1, LONG);
    assert_eq!(
        (seen[0]["pid"].as_u64(), seen[0]["path"].as_str()),
        (Some(u64::from(pid)), Some("doorbell")),
        "{seen:?}"
    );
    let libraries = seen[0]["libraries"].as_array().unwrap();
    assert!(libraries.len() == 1 && libraries[0].as_str().unwrap().contains("/libhsa-runtime64.so.1"), "{libraries:?}");
    // Both exports are ROCr's API-table thunks: the probe sits on the implementations they jump
    // to, read from the program's table (one breakpoint trap per store, no single step).
    let probes = seen[0]["probes"].as_array().unwrap();
    assert!(probes.len() == 2 && probes.iter().all(|p| p["implementation"] == true), "{probes:?}");
    let requests = online.requests(REQUESTS);
    // Let the last resume happen, then stop the scheduler and the offline job.
    thread::sleep(Duration::from_millis(300));
    let (lines, _) = s.stop();
    offline.send("stop").unwrap();
    let off = offline.recv().unwrap();
    assert_eq!(off["event"], "summary");
    let records = off["records"].as_array().unwrap();
    let sum = summary(&lines).unwrap();
    let suspends = sum["suspends"].as_u64().unwrap() as usize;
    // At most one suspend per request (plus one for a burst split by a stalled vCPU), each resumed.
    assert!((1..=REQUESTS + 1).contains(&suspends), "{suspends} suspends for {REQUESTS} requests: {sum}");
    assert_eq!(sum["failed_suspends"], 0);
    assert_eq!(sum["resumes"].as_u64().unwrap() as usize, suspends, "{sum}");
    // Exactly one doorbell store per request on the program's queue (hsa_dispatch rings it once
    // per dispatch with hsa_signal_store_screlease), none on ROCr's utility queue (its blit kernels
    // ran before the scheduler started, and ROCr rings its own queues without the export).
    let mut stores: Vec<(u64, u64)> = sum["doorbell_stores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["queue_id"].as_u64().unwrap(), d["stores"].as_u64().unwrap()))
        .collect();
    stores.sort_unstable();
    assert_eq!(stores.iter().map(|s| s.1).collect::<Vec<_>>(), [0, REQUESTS as u64], "{sum}");
    // Some suspends were started by a store the probe saw (the rest by the poll that saw the
    // moved write index first: ROCr bumps it before it rings).
    let by_doorbell = sum["detection_doorbell_us"]["count"].as_u64().unwrap_or(0) as usize;
    assert!((1..=suspends).contains(&by_doorbell), "{by_doorbell} of {suspends}: {sum}");
    // Each of those suspends followed a hit the reaction thread took (its wake-up timed), and
    // every hit was one of the queue's stores (armed: the first of a burst).
    let hits = sum["doorbell_wake_us"]["count"].as_u64().unwrap_or(0) as usize;
    assert!((by_doorbell..=REQUESTS).contains(&hits), "{hits} hits, {by_doorbell} suspends by the probe: {sum}");
    let ends: Vec<u64> = records.iter().map(|c| c["end_ns"].as_u64().unwrap()).collect();
    assert_protected(&requests, &ends);
    // The ROCm program's work all ran on the first GPU: the code object's blit copy, the cache
    // invalidation and the REQUESTS dispatches, each with its interrupt signal; the offline
    // job's dispatches (the project's convention) beside them; the second GPU untouched.
    let delta = cp_stats_since(&online.before);
    let offline_dispatches = delta[&GPU0]["dispatches"];
    assert!(offline_dispatches >= off["completed"].as_u64().unwrap(), "{delta:?} {off}");
    let n = REQUESTS as u64 + 1;
    let gpu0 = counters(&[
        ("dispatches", offline_dispatches),
        ("kernels", n),
        ("pm4_ibs", 1),
        ("signals", n),
        ("interrupts", n),
        ("events_set", n),
    ]);
    assert_eq!(delta, BTreeMap::from([(GPU0, gpu0), (GPU1, counters(&[]))]));
    online.end();
}

pub(crate) fn trace_shows_rocrs_queue_ioctls_with_their_exact_arguments() {
    use gpreempt_tests::{Tracer, events_of, summary};

    let tracer = Tracer::start(&[]).unwrap();
    let mut run = hsa_dispatch_run(&["run", "640"]);
    let pid = run.pid;
    let lines = run.finish();
    assert_eq!(lines.last().map(String::as_str), Some(r#"{"gpus":2,"done":true}"#), "{lines:?}");
    let objects = tracer.stop().unwrap();
    assert_eq!(summary(&objects).unwrap()["dropped"], 0);

    // The queue ioctls in the order ROCr 5.2 made them. Per GPU, hsa_queue_create first makes
    // ROCr's utility queue (GpuAgent::QueueCreate: `queues_[QueueUtility].touch()`, "deferring
    // longer risks exhausting queue count before ISA upload"; amd_gpu_agent.cpp), then the
    // program's; KFD gives each the lowest free id of the process. The program's queue goes
    // with hsa_queue_destroy at the end of its GPU's run, the utility queues at hsa_shut_down.
    let key = |e: &&serde_json::Value| (e["event"].as_str().unwrap().to_owned(), e["queue_id"].as_u64().unwrap());
    let queue_events: Vec<(String, u64)> = objects
        .iter()
        .filter(|o| o["pid"] == pid && (o["event"] == "queue_create" || o["event"] == "queue_destroy"))
        .map(|o| key(&o))
        .collect();
    let ev = |e: &str, q: u64| (e.to_owned(), q);
    assert_eq!(
        queue_events,
        [
            ev("queue_create", 0),  // GPU0: utility
            ev("queue_create", 1),  // GPU0: the program's
            ev("queue_destroy", 1), // GPU0: the program's
            ev("queue_create", 1),  // GPU1: utility
            ev("queue_create", 2),  // GPU1: the program's
            ev("queue_destroy", 2), // GPU1: the program's
            ev("queue_destroy", 0), // hsa_shut_down: GPU0's utility
            ev("queue_destroy", 1), // and GPU1's
        ]
    );
    let creates = events_of(&objects, pid, "queue_create");
    for (e, gpu) in creates.iter().zip([GPU0, GPU0, GPU1, GPU1]) {
        let wptr = e["write_pointer"].as_u64().unwrap();
        // Every argument ROCr passed: an AQL queue of 64 packets (4 KiB), normal priority (7),
        // the whole GPU (100 %), a 4 KiB EOP buffer, and the queue's pointers inside ROCr's
        // amd_queue_t (amd_hsa_queue.h, 5.2: write_dispatch_id at byte 56, read_dispatch_id at 128).
        assert_eq!(
            (
                &e["result"],
                &e["ret"],
                &e["comm"],
                e["gpu_id"].as_u64(),
                &e["queue_type"],
                &e["ring_size"],
                &e["priority"],
                &e["percentage"],
                &e["eop_buffer_size"]
            ),
            (
                &"OK".into(),
                &0.into(),
                &"hsa-dispatch".into(),
                Some(u64::from(gpu)),
                &"compute-aql".into(),
                &4096.into(),
                &7.into(),
                &100.into(),
                &4096.into()
            ),
            "{e}"
        );
        assert_eq!(e["read_pointer"].as_u64(), Some(wptr + 72), "{e}");
        assert_ne!(e["ring_base"], 0, "{e}");
        // The CWSR area: per GPU, from the topology, the same for every queue.
        for field in ["ctl_stack_size", "cwsr_size"] {
            assert!(e[field].as_u64().unwrap() > 0, "{e}");
            assert_eq!(e[field], creates[0][field], "{field}: {e}");
        }
    }
    for d in events_of(&objects, pid, "queue_destroy") {
        assert_eq!((&d["result"], &d["ret"]), (&"OK".into(), &0.into()), "{d}");
    }
    // Each create and destroy updated its GPU's runlist once inside the driver: four on each.
    let calls = events_of(&objects, pid, "kfd_call");
    for gpu in [GPU0, GPU1] {
        let executes = calls.iter().filter(|c| c["function"] == "execute_queues_cpsch" && c["gpu_id"] == gpu).count();
        assert_eq!(executes, 4, "GPU {gpu:#x}: {calls:#?}");
    }
    assert!(calls.iter().all(|c| c["ret"] == 0), "{calls:#?}");
    run.end();
}

pub(crate) fn the_agent_exports_rocrs_queues_of_a_rocm_program_per_gpu() {
    use gpreempt_tests::{agent, prometheus::http_get};

    let mut agent = agent::spawn(None).unwrap();
    // Loading every program in a TCG guest on a loaded host has taken over a minute.
    let started = loop {
        let line = agent.next_line(Duration::from_secs(240)).expect("the agent did not start within 240 s");
        if line.contains("msg=started") {
            break line;
        }
    };
    let addr: std::net::SocketAddr = started
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("metrics_addr="))
        .expect("metrics_addr in the started line")
        .parse()
        .unwrap();
    // Started after the agent, which sees its queues created.
    let mut run = hsa_dispatch_run(&["loop", "64000", "1"]);
    let pid = run.pid;
    assert_eq!(run.line(), format!(r#"{{"pid":{pid},"looping":1}}"#));
    // The program's series: (metric, gpu_id, state) → value, polled until both queues are in.
    let series = || -> BTreeMap<(String, String, String), f64> {
        let text = http_get(addr, "/metrics").unwrap().1;
        let me = format!("kfd_process_id=\"{pid}\"");
        text.lines()
            .filter(|l| l.contains(&me))
            .filter_map(|l| {
                let (name, rest) = l.split_once('{')?;
                let (labels, value) = rest.rsplit_once("} ")?;
                let label = |k: &str| {
                    labels
                        .split(',')
                        .find_map(|kv| kv.strip_prefix(&format!("{k}=\""))?.strip_suffix('"'))
                        .unwrap_or("")
                };
                let key = (name.to_owned(), label("gpu_id").to_owned(), label("state").to_owned());
                Some((key, value.parse().ok()?))
            })
            .collect()
    };
    let key = |m: &str, gpu: u32, state: &str| (m.to_owned(), gpu.to_string(), state.to_owned());
    let queues = key("gpreempt_queues", GPU0, "active");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut now = series();
    while now.get(&queues) != Some(&2.0) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(200));
        now = series();
    }
    // Both of ROCr's KFD queues on the first GPU (its utility queue and the program's), created
    // once each; nothing on the second GPU.
    assert_eq!(now.get(&queues), Some(&2.0), "{now:#?}");
    assert_eq!(now.get(&key("gpreempt_queue_creates_total", GPU0, "")), Some(&2.0), "{now:#?}");
    assert!(now.keys().all(|(_, gpu, _)| gpu != &GPU1.to_string()), "{now:#?}");
    run.finish();
    agent.signal(nix::sys::signal::Signal::SIGTERM).unwrap();
    assert!(agent.wait().unwrap().success());
    run.end();
}

/// The training job of a scheduling test, on trixie's ROCm 6.1 (a runtime that enables the
/// debug interface, so it can be suspended): kernels of about 2 ms back to back on the first GPU.
#[derive(Clone, Copy, Debug)]
enum Training {
    /// `hsa-dispatch-6 offline`: HSA dispatches, each waited for on its signal.
    Hsa,
    /// `hip-streams-6 offline`: HIP 5.7 launches, each followed by hipStreamSynchronize.
    Hip,
}

/// `online` (ready, its requests not started) under `gpreempt schedule` against `training`:
/// each side has 2 KFD queues on the first GPU (the online ones read through
/// GET_QUEUE_SNAPSHOT); the `n` requests, whose last line is `last`, are served; the training
/// job, resumed and detached, ends when told with every kernel completed (and, for HIP, its
/// round trip's bytes back); suspends = resumes, none failed; [`assert_protected`]. Returns the
/// training job's kernel count.
/// Schedules `online`'s `n` requests against a ROCm 6.1 training job; returns the job's steps and,
/// sorted, the doorbell stores the probe counted on each of the online program's queues (its
/// runtime maps ROCr, so the probe sees it: asserted here).
fn schedule_against_rocm_6_1_training(
    online: &mut RocmRun,
    n: usize,
    last: serde_json::Value,
    training: Training,
) -> (u64, Vec<u64>) {
    use std::io::{BufRead, BufReader};

    use gpreempt_tests::{
        schedule::{LONG, Schedule},
        summary,
    };

    let mut offline = match training {
        Training::Hsa => hsa_dispatch_spawn(&hsa_dispatch_6(), &["offline", "2000", "1"]),
        Training::Hip => spawn_piped(&Hip::V5_7.exe(), ["offline", "2048"]),
    };
    let off_pid = offline.id();
    let mut off_out = BufReader::new(offline.stdout.take().unwrap()).lines();
    let mut off_err = offline.stderr.take().unwrap();
    let mut off_line = || -> String {
        off_out.next().map(Result::unwrap).unwrap_or_else(|| {
            let mut stderr = String::new();
            let _ = std::io::Read::read_to_string(&mut off_err, &mut stderr);
            panic!("the training job ended early:\n{stderr}")
        })
    };
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&off_line()).unwrap(),
        serde_json::json!({"pid": off_pid, "looping": 1})
    );
    let mut s = Schedule::between(online.pid, &off_pid.to_string(), &["--idle", "5ms", "--interval", "200ms"]);
    let attached = s.wait_events("offline_attached", 1, LONG);
    assert_eq!((attached[0]["queues"].as_u64(), &attached[0]["gpus"]), (Some(2), &serde_json::json!([GPU0])));
    let added = s.events("online_added");
    assert_eq!((added[0]["queues"].as_u64(), added[0]["snapshot"].as_bool()), (Some(2), Some(true)), "{added:?}");
    let seen = s.wait_events("online_seen_by", 1, LONG);
    assert_eq!(seen[0]["path"], "doorbell", "{seen:?}");
    let probes = seen[0]["probes"].as_array().unwrap();
    assert!(probes.len() == 2 && probes.iter().all(|p| p["implementation"] == true), "{probes:?}");
    let requests = online.requests_then(n, last);
    thread::sleep(Duration::from_millis(300));
    let (lines, _) = s.stop();
    drop(offline.stdin.take());
    let (ends, done) = (off_line(), off_line());
    assert!(offline.wait().unwrap().success());
    wait_kfd_released(off_pid).unwrap();
    let (ends, k) = match training {
        Training::Hsa => {
            let done: serde_json::Value = serde_json::from_str(&done).unwrap();
            let k = done["completed"].as_u64().unwrap();
            assert_eq!((&done["read_index"], &done["done"]), (&k.into(), &true.into()), "{done}");
            let ends: serde_json::Value = serde_json::from_str(&ends).unwrap();
            let ends: Vec<u64> = ends["ends_ns"].as_array().unwrap().iter().map(|e| e.as_u64().unwrap()).collect();
            assert_eq!(ends.len() as u64, k);
            (ends, k)
        }
        Training::Hip => {
            let (ends, k, _) = hip_offline_end(&ends, &done);
            (ends, k)
        }
    };
    let sum = summary(&lines).unwrap();
    let suspends = sum["suspends"].as_u64().unwrap() as usize;
    // One per request, and up to two more as the online program exits after its last request
    // (within the 300 ms before the stop): ROCr's teardown moves its queues' indices before their
    // memory goes, which the scheduler sees as online work (seen in a debug run: the 21st suspend
    // 56 ms after the 20th, then the index read failing with EFAULT, then the exit; two such
    // suspends in a CI run).
    assert!((1..=n + 2).contains(&suspends), "{suspends} suspends for {n} requests: {sum}");
    assert_eq!(sum["failed_suspends"], 0);
    assert_eq!(sum["resumes"].as_u64().unwrap() as usize, suspends, "{sum}");
    assert_protected(&requests, &ends);
    // Per queue id: a queue whose indices could no longer be read during the program's exit is
    // dropped and announced again, so it can have two entries (the second with the stores after
    // the first was counted, none here).
    let mut per_queue: BTreeMap<u64, u64> = BTreeMap::new();
    for d in sum["doorbell_stores"].as_array().unwrap() {
        *per_queue.entry(d["queue_id"].as_u64().unwrap()).or_default() += d["stores"].as_u64().unwrap();
    }
    let mut stores: Vec<u64> = per_queue.into_values().collect();
    stores.sort_unstable();
    eprintln!("doorbell stores per online queue: {stores:?}");
    (k, stores)
}

pub(crate) fn schedule_protects_a_rocm_5_2_program_against_a_rocm_6_1_training_job() {
    const REQUESTS: usize = 20;
    // Both sides are real ROCm runtimes: the online one ROCr 5.2 with a request of one 40 ms
    // kernel every 200 ms (ROCr's utility queue and the program's).
    let mut online = hsa_dispatch_run(&["requests", "40000", &REQUESTS.to_string(), "200000"]);
    let pid = online.pid;
    assert_eq!(online.json_line(), serde_json::json!({"pid": pid, "ready": REQUESTS}));
    let last = serde_json::json!({"completed": REQUESTS, "read_index": REQUESTS, "done": true});
    let (k, stores) = schedule_against_rocm_6_1_training(&mut online, REQUESTS, last, Training::Hsa);
    // One store per request on the program's queue (hsa_dispatch rings once per dispatch), none on
    // ROCr's utility queue.
    assert_eq!(stores, [0, REQUESTS as u64]);
    // Both programs' work on the first GPU: each runtime's blit copy of the code object and cache
    // invalidation (ROCr 6.1 signals its PM4 IB too), the requests and the training dispatches,
    // each with its interrupt signal; nothing on the second GPU.
    let (on, off) = (REQUESTS as u64 + 1, k + 1);
    let gpu0 = counters(&[
        ("kernels", on + off),
        ("pm4_ibs", 2),
        ("signals", on + off + 1),
        ("interrupts", on + off + 1),
        ("events_set", on + off + 1),
    ]);
    assert_eq!(cp_stats_since(&online.before), BTreeMap::from([(GPU0, gpu0), (GPU1, counters(&[]))]));
    online.end();
}

pub(crate) fn schedule_protects_a_hip_program_against_a_hip_training_job() {
    const REQUESTS: usize = 20;
    // The online side is a HIP 5.2 program: per request one 40 ms kernel launched on its stream
    // and hipStreamSynchronize, a request every 200 ms. The training job is a HIP 5.7 program on
    // ROCr 6.1 (HIP 5.2's ROCr 5.2 never enables the debug interface, so it cannot be suspended).
    let mut online = hip_streams_run(&["requests", "40000", &REQUESTS.to_string(), "200000"]);
    let pid = online.pid;
    assert_eq!(online.json_line(), serde_json::json!({"pid": pid, "ready": REQUESTS}));
    // HIP 5.2's KFD queues on the first GPU once its stream exists and its warm-up launch ran:
    // ROCr's utility queue (64 packets, 4 KiB ring; its blit kernels copied HIP's code objects
    // into VRAM) and the 4096-packet queue (256 KiB ring) ROCclr gave the stream. No queue for
    // the null stream, which this program never uses (it gets one at its first use, as the
    // synchronous hipMemcpy of the streams test), nor SDMA queues (no copy).
    assert_eq!(sysfs_queues(pid), [(GPU0, 0, 4096), (GPU0, 0, 256 << 10)], "queues of pid {pid}");
    let (k, stores) = schedule_against_rocm_6_1_training(
        &mut online,
        REQUESTS,
        serde_json::json!({"completed": REQUESTS, "done": true}),
        Training::Hip,
    );
    // ROCclr rings the stream queue's doorbell through the export for each kernel launch and each
    // barrier-AND marker it writes (dispatchGenericAqlPacket): per request one launch and one
    // hipStreamSynchronize marker, and the one more marker the CP counts below (measured, the same
    // on every run): 2 × REQUESTS + 1. Two queues watched: ROCr's utility queue (no store through
    // the export) and the stream's.
    assert_eq!(stores, [0, 2 * REQUESTS as u64 + 1], "doorbell stores per online queue");
    // Both programs' work on the first GPU, nothing on the second. HIP 5.2: ROCr's two loader
    // blits (ROCclr's blit code object and the program's) each with a code-cache invalidation
    // (PM4 IB), the warm-up and the REQUESTS kernels (launched without a completion signal), and
    // ROCclr's barrier-AND markers with their interrupt signals, one per hipStreamSynchronize
    // (the signal it waits on) and one more (measured, the same on every run). HIP 5.7: its
    // K steps, as in the preempt test.
    let hip_markers = REQUESTS as u64 + 2;
    let hip_signals = 2 + hip_markers;
    let mut gpu0 = counters(&hip_5_7_offline_counters(k));
    for (key, n) in [
        ("kernels", 2 + 1 + REQUESTS as u64),
        ("barriers_and", hip_markers),
        ("pm4_ibs", 2),
        ("signals", hip_signals),
        ("interrupts", hip_signals),
        ("events_set", hip_signals),
    ] {
        *gpu0.get_mut(key).unwrap() += n;
    }
    assert_eq!(cp_stats_since(&online.before), BTreeMap::from([(GPU0, gpu0), (GPU1, counters(&[]))]), "k={k}");
    online.end();
}

pub(crate) fn evaluate_measures_a_hip_5_7_service_against_a_hip_5_7_training_job() {
    use gpreempt_tests::target::tracer_pid;

    const REQUESTS: u64 = 10;
    // The online side is a HIP 5.7 *service* on ROCr 6.1 (`hip-streams serve`): per request one
    // ~8 ms kernel on its stream and hipStreamSynchronize, answered on a Unix socket with the
    // line protocol of `emu-workload server`, so `emu-workload request` is the user's load
    // command. The offline side is the HIP 5.7 training loop of the tests above.
    let socket = std::env::temp_dir().join(format!("gpreempt-hip-serve-{}.sock", std::process::id()));
    let socket = socket.to_str().unwrap().to_owned();
    let mut online = hip_run(Hip::V5_7, &["serve", "8192", &socket]);
    let pid = online.pid;
    assert_eq!(online.json_line(), serde_json::json!({"pid": pid, "serving": socket}));
    let mut offline = spawn_piped(&Hip::V5_7.exe(), ["offline", "2048"]);
    let off_pid = offline.id();
    let mut off_out = std::io::BufRead::lines(std::io::BufReader::new(offline.stdout.take().unwrap()));
    let mut off_line = || off_out.next().expect("the training job ended early").unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&off_line()).unwrap(),
        serde_json::json!({"pid": off_pid, "looping": 1})
    );
    let load = format!(
        "{} request --socket {socket} --requests {REQUESTS} --dispatches 1 --gap-us 20000",
        gpreempt_tests::binary("emu-workload").unwrap().display()
    );
    let out = Command::new(gpreempt_tests::binary("gpreempt").unwrap())
        .args(["evaluate", "--online", &pid.to_string(), "--offline", &off_pid.to_string(), "--load", &load])
        .args(["--metric", r"requests=requests=(\d+)", "--metric", r"p99_ms=p99_ms=([0-9.]+)"])
        .args(["--rounds", "1", "--idle", "5ms", "--json"])
        .output()
        .unwrap();
    eprintln!("[evaluate] {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = report["runs"].as_array().unwrap();
    let states: Vec<&str> = runs.iter().map(|r| r["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["co_located", "online_alone", "scheduled", "offline_alone"]);
    for r in runs {
        if r["state"] == "offline_alone" {
            assert_eq!(r["online_dispatches"].as_u64(), Some(0), "{r}");
            assert!(r["offline_dispatches"].as_u64().unwrap() > 0, "{r}");
            continue;
        }
        assert_eq!(r["load"]["succeeded"], true, "{r}");
        assert_eq!(r["metrics"]["requests"].as_f64(), Some(REQUESTS as f64), "{r}");
        // What the load command reports is what the service's queues show: ROCclr writes per
        // request the kernel's dispatch packet and the barrier-AND marker hipStreamSynchronize
        // waits on (as in the HIP protection test), every one consumed by the end of the state.
        assert_eq!(r["online_dispatches"].as_u64(), Some(2 * REQUESTS), "{r}");
        assert_eq!(r["online_consumed"], r["online_dispatches"], "{r}");
        match r["state"].as_str().unwrap() {
            "online_alone" => {
                // The training job's two queues on the GPU (ROCr's utility queue and its
                // stream's) held for the whole state: not one of its dispatches consumed.
                assert_eq!(
                    r["held"],
                    serde_json::json!({"processes": 1, "queues_suspended": 2, "queues_resumed": 2, "cpu_threads_ran": true}),
                    "{r}"
                );
                assert_eq!(r["offline_dispatches"].as_u64(), Some(0), "{r}");
            }
            "scheduled" => {
                let s = &r["schedule"];
                let suspends = s["suspends"].as_u64().unwrap();
                // A SUSPEND answers online work seen after the last RESUME, and a RESUME comes
                // only when the service's queues are empty: at most one per online dispatch. A
                // request is two dispatches here (the launch, then hipStreamSynchronize's marker);
                // a vCPU stalled between them for longer than --idle splits it in two (CI saw 12
                // for 10 requests), so the bound is the dispatches, not the requests.
                assert!((1..=2 * REQUESTS).contains(&suspends), "{s}");
                assert_eq!((&s["resumes"], &s["failed_suspends"]), (&s["suspends"], &0.into()), "{s}");
                // The in-process tracer saw the driver run each of them.
                let k = &s["kernel"];
                assert_eq!(
                    (k["suspend"]["count"].as_u64(), k["resume"]["count"].as_u64()),
                    (Some(suspends), Some(suspends)),
                    "{k}"
                );
            }
            _ => assert!(r["offline_dispatches"].as_u64().unwrap() > 0, "{r}"),
        }
    }
    assert_eq!(report["ended"]["how"], "completed");
    assert_eq!((tracer_pid(pid).unwrap(), tracer_pid(off_pid).unwrap()), (0, 0));
    // Three load runs of REQUESTS requests, one connection each.
    std::io::Write::write_all(online.child.stdin.as_mut().unwrap(), b"stop\n").unwrap();
    assert_eq!(
        online.json_line(),
        serde_json::json!({"requests": 3 * REQUESTS, "kernels": 3 * REQUESTS, "connections": 3, "done": true})
    );
    assert_eq!(online.finish(), Vec::<String>::new());
    drop(offline.stdin.take());
    let (ends, done) = (off_line(), off_line());
    assert!(offline.wait().unwrap().success());
    wait_kfd_released(off_pid).unwrap();
    let (_, k, _) = hip_offline_end(&ends, &done);
    assert!(k > 0);
    online.end();
}
