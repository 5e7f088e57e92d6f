//! The unchanged `gpreempt` controller end to end on the KFD emulator (gpus 0x1000/0x2000, the
//! workloads' rings kept full of 1 ms dispatches): queues that really exist and really consume
//! work. The offline workload's read index is sampled from `/proc/<pid>/mem`
//! every millisecond, independently of gpreempt, and lined up with the CLOCK_MONOTONIC instants
//! `gpreempt preempt --json` records per iteration.

use std::{
    fs::File,
    os::unix::fs::FileExt,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
    time::Duration,
};

use gpreempt::clock::monotonic_ns;
use gpreempt_tests::{
    EmuParam, LineHelper, Tracer, binary,
    controller::{advances, rptr_now},
    emu_param, events_of, exit_and_last_line, read_sysfs, skip, summary,
    target::{eventually, tracer_pid},
    vm_kernel, wait_kfd_released,
};
use nix::sys::signal::Signal;
use serde_json::json;

const SECOND: Duration = Duration::from_secs(1);

fn workload(args: &[&str]) -> LineHelper {
    LineHelper::spawn("emu-workload", &[&["run"], args].concat()).unwrap()
}

/// Address of the first queue's read index in the workload.
fn rptr_address(w: &LineHelper) -> u64 {
    w.hello["queues"][0]["rptr"].as_u64().unwrap()
}

/// One read of the read index, bracketed by CLOCK_MONOTONIC before and after the read (a
/// timestamp taken only after could belong to a value read before an event it follows).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Sample {
    before: u64,
    after: u64,
    value: u64,
}

/// Samples another process's queue read index every ~1 ms.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<Sample>>,
}

impl Sampler {
    fn start(pid: u32, address: u64) -> Self {
        let mem = File::open(format!("/proc/{pid}/mem")).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = thread::spawn(move || {
            let mut samples = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let mut buf = [0u8; 8];
                let before = monotonic_ns();
                if mem.read_exact_at(&mut buf, address).is_err() {
                    break;
                }
                samples.push(Sample { before, after: monotonic_ns(), value: u64::from_ne_bytes(buf) });
                thread::sleep(Duration::from_millis(1));
            }
            samples
        });
        Self { stop, thread }
    }

    fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// The first sample read wholly after `t`, and the last read wholly before `t`.
fn first_after(samples: &[Sample], t: u64) -> Option<Sample> {
    samples.iter().copied().find(|s| s.before >= t)
}
fn last_before(samples: &[Sample], t: u64) -> Option<Sample> {
    samples.iter().copied().rev().find(|s| s.after <= t)
}

fn preempt(args: &[&str]) -> Child {
    preempt_with_fault(args, "")
}

/// `gpreempt preempt ARGS` with `GPREEMPT_TEST_FAULT=fault` (the session's fault injection).
fn preempt_with_fault(args: &[&str], fault: &str) -> Child {
    Command::new(binary("gpreempt").unwrap())
        .arg("preempt")
        .args(args)
        .env("GPREEMPT_TEST_FAULT", fault)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn json_of(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// SUSPEND_QUEUES calls the emulator has taken since it loaded (its `suspend_calls`).
fn suspend_calls() -> u64 {
    emu_param("suspend_calls").unwrap()
}

/// Waits (generously) until `more` SUSPEND_QUEUES calls past `since` have reached the emulator:
/// the controller's cycles are under way, however long a loaded host took to start them.
fn await_suspends(since: u64, more: u64) {
    assert!(
        eventually(60 * SECOND, || suspend_calls() >= since + more),
        "fewer than {more} SUSPEND_QUEUES calls in 60 s (had {})",
        suspend_calls() - since
    );
}

#[test]
fn queues_lists_the_real_queues_with_every_field() {
    let offline = workload(&["--gpu-id", "0x1000", "--queues", "2", "--runtime-enable"]);
    let pid = offline.pid().to_string();
    let out = Command::new(binary("gpreempt").unwrap())
        .args(["queues", &pid, "--json", "--debug-snapshot"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["source"], "debug_trap");
    let queues = v["queues"].as_array().unwrap();
    assert_eq!(queues.len(), 2);
    for (i, q) in queues.iter().enumerate() {
        assert_eq!(q["queue_id"], i);
        assert_eq!(q["gpu_id"], 0x1000);
        assert_eq!(q["queue_type"], "compute-aql");
        assert_eq!(q["ring_size"], 4096);
        assert_eq!(q["read_pointer_address"], offline.hello["queues"][i]["rptr"]);
        assert_eq!(q["write_pointer_address"], offline.hello["queues"][i]["wptr"]);
        // Never snapshotted with a clear mask: every queue still carries EC_QUEUE_NEW.
        assert_eq!(q["exceptions"], serde_json::json!(["QUEUE_NEW"]));
    }
    let ids = Command::new(binary("gpreempt").unwrap()).args(["queues", &pid, "--ids-only"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&ids.stdout), "0\n1\n");
    assert_eq!(tracer_pid(offline.pid()).unwrap(), 0);
}

#[test]
fn a_thousand_iterations_stop_the_offline_work_in_every_hold_and_not_in_any_gap() {
    // A 5 ms emulated CWSR save, long against TCG's scheduling noise, so the fence wait is
    // recognisable in every iteration.
    let _delay = EmuParam::set("preempt_delay_us", 5000).unwrap();
    let offline = workload(&["--gpu-id", "0x1000", "--queues", "2", "--runtime-enable"]);
    let online = workload(&["--gpu-id", "0x1000", "--queues", "1", "--runtime-enable"]);
    let (pid, address) = (offline.pid(), rptr_address(&offline));
    let (online_pid, online_address) = (online.pid(), rptr_address(&online));
    let json = std::env::temp_dir().join(format!("emu-preempt-{pid}.json"));
    let sampler = Sampler::start(pid, address);
    let online_before = rptr_now(online_pid, online_address);
    let out = preempt(&[
        "--offline",
        &pid.to_string(),
        "--iterations",
        "1000",
        "--hold",
        "20ms",
        "--gap",
        "50ms",
        "--online",
        &online_pid.to_string(),
        "--output",
        json.to_str().unwrap(),
    ])
    .wait_with_output()
    .unwrap();
    let samples = sampler.finish();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().next(), Some("1000 of 1000 iterations, 1000 fully successful (100.0%)"));
    assert_eq!(stdout.lines().nth(1), Some("queues suspended in total: 2000; INVALID answers: 0; ERROR answers: 0"));
    // Each of the two queues was created with a 40-byte CWSR area (emu-workload passes the size
    // of its ContextSaveAreaHeader; the snapshot reports it back).
    assert_eq!(
        stdout.lines().nth(2),
        Some(
            "CWSR save area behind each suspend: 80 bytes (0.0 MiB) over 2 queue(s): the most wave state one suspend \
             writes"
        )
    );
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(doc["summary"]["cwsr"], serde_json::json!({"queues": 2, "bytes": 80}));
    let its = doc["iterations"].as_array().unwrap();
    assert_eq!(its.len(), 1000);
    let mut gaps_checked = 0;
    let mut stalled_gaps = Vec::new();
    let mut fences = Vec::new();
    for (i, it) in its.iter().enumerate() {
        assert_eq!((it["suspended"].as_i64(), it["resumed"].as_i64()), (Some(2), Some(2)), "iteration {i}");
        assert_eq!((it["invalid"].as_u64(), it["error"].as_u64(), it["ok"].as_bool()), (Some(0), Some(0), Some(true)));
        // Inside the driver (in-process tracer): the unmap waited for the emulated CWSR save
        // (preempt_delay 5 ms) and preempted the online process's queue on the same GPU too.
        let k = &it["kernel"]["suspend"];
        // The emulated CP completes the unmap preempt_delay after it was sent, so the whole unmap
        // takes at least 5 ms and the fence wait, nested in it and entered a little later, about
        // that long (how much later is TCG scheduling: checked over the whole run below).
        let (unmap, fence) = (k["unmap_us"].as_f64().unwrap(), k["fence_wait_us"].as_f64().unwrap());
        assert!(unmap >= 5_000.0, "iteration {i}: unmap {unmap} us");
        assert!(fence > 0.0 && fence <= unmap, "iteration {i}: fence wait {fence} us, unmap {unmap} us");
        fences.push(fence);
        assert_eq!(k["collateral_pids"], serde_json::json!([online_pid]), "iteration {i}");
        assert_eq!(k["gpus"], serde_json::json!([0x1000]), "iteration {i}");
        assert_eq!(k["online_queues"], 1, "iteration {i}");
        // Hold: the queue stops when SUSPEND_QUEUES returns and stays stopped until RESUME.
        let (from, to) = (it["suspended_at_ns"].as_u64().unwrap(), it["resumed_at_ns"].as_u64().unwrap());
        let (a, b) = (first_after(&samples, from).unwrap(), last_before(&samples, to).unwrap());
        if b.before > a.before {
            assert_eq!(a.value, b.value, "iteration {i}: read index moved during the hold ({a:?} -> {b:?})");
        }
        // Gap: from RESUME's return to the next SUSPEND's call the queue runs.
        if let Some(next) = its.get(i + 1) {
            let resumed = to + (it["resume_us"].as_f64().unwrap() * 1e3) as u64;
            let next_call =
                next["suspended_at_ns"].as_u64().unwrap() - (next["suspend_us"].as_f64().unwrap() * 1e3) as u64;
            if next_call > resumed + 10_000_000 {
                let (a, b) = (first_after(&samples, resumed).unwrap(), last_before(&samples, next_call).unwrap());
                // Only windows the sampler really covered (under TCG it is sometimes descheduled).
                if b.before > a.before + 10_000_000 {
                    gaps_checked += 1;
                    if b.value <= a.value {
                        stalled_gaps.push((i, a, b));
                    }
                }
            }
        }
    }
    // Every hold stopped the queue (asserted above). Every gap must show progress too, except
    // that under software emulation the emulated CP kthread itself is sometimes not scheduled for
    // 100+ ms (seen once in 1000 gaps): allow 0.5% of the gaps and print them.
    assert!(gaps_checked > 900, "only {gaps_checked} gaps were covered by samples");
    eprintln!("{} of {gaps_checked} gaps without progress: {stalled_gaps:?}", stalled_gaps.len());
    assert!(stalled_gaps.len() * 200 <= gaps_checked, "gaps without progress: {stalled_gaps:?}");
    // The fence wait measures the emulated CWSR save: its median is the 5 ms delay (less the
    // few µs between sending the unmap and entering the wait). A wait entered more than 2.5 ms
    // late means the vCPU was descheduled by TCG between the unmap and the wait; on a loaded
    // 2-core host that was seen in 1 and in 11 of 1000 iterations, so the bound is 5%: a
    // timing distribution judged over the run, generous enough for the host, while a fence
    // wait that did not measure the save would put the median (or most waits) far off.
    fences.sort_by(f64::total_cmp);
    let median = fences[fences.len() / 2];
    assert!((4_000.0..10_000.0).contains(&median), "median fence wait {median} us");
    let late = fences.iter().filter(|&&f| f < 2_500.0).count();
    eprintln!("{late} of {} fence waits under 2.5 ms", fences.len());
    assert!(late <= 50, "{late} fence waits under 2.5 ms: {:?}", &fences[..late]);
    // The slow tail, judged over the run as well: a vCPU descheduled for 100+ ms stretches the
    // odd wait (seen once in a run on a loaded host); a wait that did not end at the save's
    // completion would stretch most of them.
    let slow = fences.iter().filter(|&&f| f >= 100_000.0).count();
    assert!(slow <= 10, "{slow} fence waits of 100 ms or more: {:?}", &fences[fences.len() - slow..]);
    assert_eq!(doc["summary"]["ok"], 1000);
    assert_eq!(doc["detached"]["disabled"], true);
    // The online process kept running (its queues were only briefly unmapped), the offline one
    // runs again, and nothing is left traced.
    assert!(rptr_now(online_pid, online_address) > online_before);
    assert!(advances(pid, address));
    assert_eq!(tracer_pid(pid).unwrap(), 0);
}

/// A second /dev/kfd file is no secondary context: amdsmi's event notification and
/// rocprofiler-sdk keep one open on the same primary context. Whatever KFD version the driver
/// reports (the emulator at 1.19 here, then its own: 1.17, or 1.19 built for 7.x, where it has
/// CREATE_PROCESS), such a process is scheduled like any other; only `proc/<pid>/context_<id>/`
/// directories in sysfs refuse one (docs/kfd.md §1.5).
#[test]
fn a_process_with_an_extra_primary_kfd_file_is_preempted_normally() {
    let two = workload(&["--gpu-id", "0x1000", "--queues", "1", "--runtime-enable", "--extra-kfd-files", "1"]);
    let run = |pid: u32| {
        preempt(&["--offline", &pid.to_string(), "--iterations", "3", "--hold", "1ms", "--gap", "1ms", "--no-trace"])
            .wait_with_output()
            .unwrap()
    };
    for minor in [Some(19), None] {
        let _version = minor.map(|m| EmuParam::set("kfd_minor_version", m).unwrap());
        let out = run(two.pid());
        assert!(out.status.success(), "KFD 1.{minor:?}: {}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(stdout.lines().next(), Some("3 of 3 iterations, 3 fully successful (100.0%)"), "KFD 1.{minor:?}");
        // Its one queue, every iteration.
        assert_eq!(
            stdout.lines().nth(1),
            Some("queues suspended in total: 3; INVALID answers: 0; ERROR answers: 0"),
            "KFD 1.{minor:?}"
        );
        assert_eq!(tracer_pid(two.pid()).unwrap(), 0, "detached after the run");
    }
    // Two /dev/kfd files, one context: no context_<id> directory.
    let dir = std::fs::read_dir(format!("/sys/class/kfd/kfd/proc/{}", two.pid())).unwrap();
    assert!(dir.map(|e| e.unwrap().file_name()).all(|n| !n.to_string_lossy().starts_with("context_")));
}

/// Linux 7.0's secondary KFD contexts, on the emulator built for 7.x (tests/kfd-emu README
/// "Secondary contexts"): a process turns a second /dev/kfd file into a secondary context with
/// AMDKFD_IOC_CREATE_PROCESS and creates two queues there. Queue ids are per context (its first is
/// 0 again), sysfs shows them under `proc/<pid>/context_0/`, DBG_TRAP through that file is
/// EOPNOTSUPP (the caller's context is not the primary one), a second CREATE_PROCESS on it EINVAL,
/// and `gpreempt preempt` refuses the process before seizing it, naming the context: the pid
/// reaches only the primary context, whose suspend would leave the secondary's queues running.
/// The tracer keys queues by (pid, context, queue id): the primary's queue 0 and the secondary's
/// queue 0 are two queues, each created, destroyed by its own DESTROY_QUEUE, and every queue of
/// either context gone exactly once.
#[test]
fn a_process_with_a_secondary_context_is_refused_naming_it_and_its_queues_have_their_own_ids() {
    if vm_kernel() != "7" {
        skip!("secondary KFD contexts are Linux 7.0's: the emulator built for {} has no CREATE_PROCESS", vm_kernel());
    }
    // The tracer keys what happens in a secondary context by its id (its queue ids repeat the
    // primary's; docs/kfd.md §1.4): it reads kfd_process.context_id from the module's BTF.
    let perfetto = std::env::temp_dir().join("emu-secondary-context.perfetto.json");
    let tracer = Tracer::start(&["--perfetto", perfetto.to_str().unwrap()]).unwrap();
    let mut w = workload(&["--gpu-id", "0x1000", "--queues", "2", "--runtime-enable", "--secondary-context", "2"]);
    let pid = w.pid();
    assert_eq!(w.hello["kfd_version"], "1.19");
    let secondary = &w.hello["secondary"];
    assert_eq!((&secondary["create_process"], &secondary["errors"]), (&json!(0), &json!([])), "{}", w.hello);
    let ids = |queues: &serde_json::Value| -> Vec<u64> {
        queues.as_array().unwrap().iter().map(|q| q["queue_id"].as_u64().unwrap()).collect()
    };
    assert_eq!((ids(&w.hello["queues"]), ids(&secondary["queues"])), (vec![0, 1], vec![0, 1]));
    let dir = format!("/sys/class/kfd/kfd/proc/{pid}");
    let mut contexts: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("context_"))
        .collect();
    contexts.sort();
    assert_eq!(contexts, ["context_0"]);
    let queue_file = |path: &str| read_sysfs(&format!("{dir}/{path}")).unwrap();
    assert_eq!(
        (queue_file("context_0/queues/0/gpuid"), queue_file("context_0/queues/0/type")),
        ("4096".into(), "0".into())
    );
    assert_eq!(queue_file("context_0/queues/1/gpuid"), "4096");
    assert!(!std::path::Path::new(&format!("{dir}/context_0/queues/2")).exists());
    assert_eq!((queue_file("queues/0/gpuid"), queue_file("queues/1/gpuid")), ("4096".into(), "4096".into()));
    // DBG_TRAP DISABLE of itself: through the secondary file EOPNOTSUPP, before any other check;
    // through the primary file the op's own answer (the process is not debug-enabled: EINVAL,
    // docs/kfd.md §2.1).
    assert_eq!(w.cmd("dbg_trap 1 1").unwrap()["ret"], -(nix::errno::Errno::EOPNOTSUPP as i64));
    assert_eq!(w.cmd("dbg_trap 0 1").unwrap()["ret"], -(nix::errno::Errno::EINVAL as i64));
    // "Each FD owns only one kfd_process": a secondary file cannot be made secondary again.
    assert_eq!(w.cmd("create_process").unwrap()["ret"], -(nix::errno::Errno::EINVAL as i64));
    // `ps` shows the secondary's queue keyed by its context, beside the primary's of the same id.
    let ps = Command::new(binary("gpreempt").unwrap()).args(["ps", "--json"]).output().unwrap();
    assert!(ps.status.success(), "{}", String::from_utf8_lossy(&ps.stderr));
    let v: serde_json::Value = serde_json::from_slice(&ps.stdout).unwrap();
    let me = v["processes"].as_array().unwrap().iter().find(|p| p["pid"] == pid).cloned().unwrap();
    let keys: Vec<(serde_json::Value, u64)> = me["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| (q["context"].clone(), q["queue_id"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        keys,
        [(json!("primary"), 0), (json!("primary"), 1), (json!({"secondary": 0}), 0), (json!({"secondary": 0}), 1)],
        "{me}"
    );
    // `queues --watch` (sysfs) lists them too, the secondary's named by their context.
    let watch = |format: &str| {
        let args = ["queues", &pid.to_string(), "--watch", "100ms", "--duration", "250ms", "--no-trace", format];
        let out = Command::new(binary("gpreempt").unwrap()).args(args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let v: serde_json::Value = serde_json::from_str(&watch("--json")).unwrap();
    assert_eq!(v["samples"][0]["queue_ids"], json!(["0", "1", "context_0/0", "context_0/1"]), "{v}");
    let rows: Vec<(&serde_json::Value, &serde_json::Value)> =
        v["queues"].as_array().unwrap().iter().map(|q| (&q["context_id"], &q["queue_id"])).collect();
    assert_eq!(
        rows,
        [(&json!(null), &json!(0)), (&json!(null), &json!(1)), (&json!(0), &json!(0)), (&json!(0), &json!(1))]
    );
    let text = watch("--ids-only");
    assert_eq!(text.lines().collect::<Vec<_>>(), ["0", "1", "context_0/0", "context_0/1"], "{text}");
    // 6.14+ keeps `pasid` but prints 0 (the PASID is per device since; docs/kfd.md §4.1), as the
    // 7.x emulator does: unknown to gpreempt, never an error, the rest of the process intact.
    assert_eq!((queue_file("pasid"), queue_file("context_0/pasid")), ("0\n".into(), "0\n".into()));
    assert_eq!(me["pasid"], json!(null), "{me}");
    // The refusal, before any seize: exit 1, the reason naming the context.
    let out = preempt(&["--offline", &pid.to_string(), "--iterations", "1", "--hold", "1ms", "--no-trace"])
        .wait_with_output()
        .unwrap();
    let (code, last, stderr) = exit_and_last_line(&out);
    assert_eq!(
        (code, last),
        (
            Some(1),
            format!(
                "gpreempt: error: refusing pid {pid} (emu-workload): it has secondary KFD contexts (context_0; \
                 AMDKFD_IOC_CREATE_PROCESS, Linux 7.0), and DBG_TRAP returns EOPNOTSUPP for a secondary context \
                 while the pid names only its primary one, so the queues of those contexts can be neither listed \
                 nor suspended and would keep running while gpreempt reported the process suspended"
            )
        ),
        "{stderr}"
    );
    assert_eq!(tracer_pid(pid).unwrap(), 0, "never seized");
    // `schedule` refuses it at start, on either side, before the tracer attaches: offline, its
    // secondary queues could not be suspended; online, their work could not be seen.
    let other = workload(&["--gpu-id", "0x1000", "--queues", "1", "--runtime-enable"]);
    let schedule = |online: u32, offline: u32| {
        let out = Command::new(binary("gpreempt").unwrap())
            .args(["schedule", "--online", &online.to_string(), "--offline", &offline.to_string()])
            .output()
            .unwrap();
        let (code, last, _) = exit_and_last_line(&out);
        (code, last)
    };
    assert_eq!(
        schedule(other.pid(), pid),
        (
            Some(1),
            format!(
                "gpreempt: error: --offline {pid}: refusing pid {pid} (emu-workload): it has secondary KFD contexts \
                 (context_0; AMDKFD_IOC_CREATE_PROCESS, Linux 7.0), and DBG_TRAP returns EOPNOTSUPP for a secondary \
                 context while the pid names only its primary one, so the queues of those contexts can be neither \
                 listed nor suspended and would keep running while gpreempt reported the process suspended"
            )
        )
    );
    assert_eq!(
        schedule(pid, other.pid()),
        (
            Some(1),
            format!(
                "gpreempt: error: --online {pid}: refusing pid {pid} (emu-workload) as online: it has secondary KFD \
                 contexts (context_0; AMDKFD_IOC_CREATE_PROCESS, Linux 7.0), whose queues DBG_TRAP's snapshot does \
                 not reach and the scheduler does not watch (`gpreempt trace` lists them, by context), so its work \
                 there would go unseen and the offline processes would keep running beside it; plain ROCr opens only \
                 the primary context"
            )
        )
    );
    assert_eq!((tracer_pid(pid).unwrap(), tracer_pid(other.pid()).unwrap()), (0, 0), "neither seized");
    assert!(other.finish().unwrap().success());
    // Both contexts' queues kept running.
    let rptr = |w: &mut LineHelper| w.cmd("rptr").unwrap();
    let before = rptr(&mut w);
    assert!(
        eventually(10 * SECOND, || {
            let now = rptr(&mut w);
            ["rptr", "secondary_rptr"].iter().all(|k| {
                let (a, b) = (before[k].as_array().unwrap(), now[k].as_array().unwrap());
                a.len() == b.len() && a.iter().zip(b).all(|(a, b)| b.as_u64() > a.as_u64())
            })
        }),
        "{before}"
    );
    // Queue 0 of each context destroyed by its own file's DESTROY_QUEUE, the secondary's first.
    assert_eq!(w.cmd("destroy_secondary 0").unwrap()["ret"], 0);
    assert_eq!(w.cmd("destroy 0").unwrap()["ret"], 0);
    assert!(!std::path::Path::new(&format!("{dir}/context_0/queues/0")).exists());
    assert!(!std::path::Path::new(&format!("{dir}/queues/0")).exists());
    // Exit: the secondary (its queue 1) goes with its file, the primary (its queue 1) with the mm.
    assert!(w.finish().unwrap().success());
    wait_kfd_released(pid).unwrap();
    let objects = tracer.stop().unwrap();
    // Every queue of both contexts, keyed by (context_id, queue_id): null is the primary context.
    let key = |e: &serde_json::Value| (e["context_id"].clone(), e["queue_id"].clone());
    let creates: Vec<_> = events_of(&objects, pid, "queue_create")
        .iter()
        .map(|e| (key(e), e["gpu_id"].clone(), e["ret"].clone()))
        .collect();
    let created = |context: serde_json::Value, id: u32| ((context, json!(id)), json!(0x1000), json!(0));
    assert_eq!(
        creates,
        [created(json!(null), 0), created(json!(null), 1), created(json!(0), 0), created(json!(0), 1)],
        "{objects:?}"
    );
    let destroys: Vec<_> =
        events_of(&objects, pid, "queue_destroy").iter().map(|e| (key(e), e["ret"].clone())).collect();
    assert_eq!(destroys, [((json!(0), json!(0)), json!(0)), ((json!(null), json!(0)), json!(0))], "{objects:?}");
    // Conservation: each queue created is gone exactly once (its sysfs removal: in its own
    // DESTROY_QUEUE, or in its context's teardown, in KFD's worker).
    let mut removed: Vec<_> = objects
        .iter()
        .filter(|o| o["event"] == "queue_removed" && o["owner_pid"] == pid)
        .map(|e| (key(e), e["pid"] == pid))
        .collect();
    removed.sort_by_key(|((context, id), _)| (context.as_u64().unwrap_or(u64::MAX), id.as_u64()));
    assert_eq!(
        removed,
        [
            ((json!(0), json!(0)), true),
            ((json!(0), json!(1)), false),
            ((json!(null), json!(0)), true),
            ((json!(null), json!(1)), false)
        ],
        "(key, removed in the owner's own task): {objects:?}"
    );
    let traps: Vec<(&serde_json::Value, &serde_json::Value)> =
        events_of(&objects, pid, "debug_trap").iter().map(|e| (&e["op"], &e["ret"])).collect();
    assert_eq!(traps, [(&json!("disable"), &json!(-22))], "the primary file's DISABLE only: {objects:?}");
    // The tracer learns the secondary context (kfd_ioctl_create_process): context 0 made, then
    // the second CREATE_PROCESS on that file refused (no context).
    let contexts: Vec<(&serde_json::Value, &serde_json::Value)> =
        events_of(&objects, pid, "context_create").iter().map(|e| (&e["context_id"], &e["ret"])).collect();
    assert_eq!(contexts, [(&json!(0), &json!(0)), (&json!(null), &json!(-22))], "{objects:?}");
    assert_eq!(summary(&objects).unwrap()["dropped"], 0);
    // The Perfetto export: a track per queue of either context, the secondary's named by it, each
    // with its lifetime.
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&perfetto).unwrap()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let named = |ph: &str| -> Vec<&str> {
        events
            .iter()
            .filter(|e| e["pid"] == pid && e["ph"] == ph && e["cat"] != "span")
            .filter_map(|e| if ph == "M" { e["args"]["name"].as_str() } else { e["name"].as_str() })
            .filter(|n| n.starts_with("queue "))
            .collect()
    };
    let tracks = ["queue 0", "queue 1", "queue context_0/0", "queue context_0/1"];
    assert_eq!(named("M"), tracks, "{doc}");
    let mut lifetimes = named("X");
    lifetimes.sort_unstable();
    assert_eq!(lifetimes, tracks, "{doc}");
    let _ = std::fs::remove_file(&perfetto);
}

#[test]
fn ctrl_c_and_kill_9_during_a_hold_leave_the_queues_running() {
    let offline = workload(&["--gpu-id", "0x1000", "--queues", "1", "--runtime-enable"]);
    let (pid, address) = (offline.pid(), rptr_address(&offline));
    for signal in [Signal::SIGINT, Signal::SIGKILL] {
        let child = preempt(&["--offline", &pid.to_string(), "--iterations", "3", "--hold", "60000ms", "--no-trace"]);
        // Wait until the hold has begun: the read index stops.
        assert!(eventually(30 * SECOND, || !advances(pid, address)), "never suspended");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
        let out = child.wait_with_output().unwrap();
        if signal == Signal::SIGINT {
            assert_eq!(
                exit_and_last_line(&out).1,
                // The interrupted iteration still suspended and resumed, so it is recorded.
                "gpreempt: error: interrupted by SIGINT after 1 of 3 iterations; queues resumed, target detached"
            );
        }
        // gpreempt resumed them (SIGINT) or the kernel did when the debugger died (SIGKILL, §2.7).
        assert!(eventually(10 * SECOND, || advances(pid, address)), "{signal}: queues left suspended");
        assert!(eventually(10 * SECOND, || tracer_pid(pid).ok() == Some(0)));
    }
}

#[test]
fn session_watchdog_resumes_a_hold_that_outlives_max_suspend_and_says_so() {
    let offline = workload(&["--gpu-id", "0x2000", "--queues", "1", "--runtime-enable"]);
    let (pid, address) = (offline.pid(), rptr_address(&offline));
    let json = std::env::temp_dir().join(format!("emu-watchdog-{pid}.json"));
    let out = preempt(&[
        "--offline",
        &pid.to_string(),
        "--iterations",
        "1",
        "--hold",
        "3000ms",
        "--max-suspend",
        "500ms",
        "--output",
        json.to_str().unwrap(),
    ])
    .wait_with_output()
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let notices = doc["notices"].as_array().unwrap();
    let watchdog: Vec<&serde_json::Value> = notices.iter().filter(|n| n["notice"] == "watchdog_resumed").collect();
    assert_eq!(watchdog.len(), 1, "{notices:?}");
    assert_eq!(watchdog[0]["resumed"]["count"], 1);
    assert!(watchdog[0]["held_ms"].as_u64().unwrap() >= 500);
    // The loop's own resume then finds nothing left to resume, and the iteration says the hold
    // was cut short: not ok, the real hold, the watchdog's intervention.
    let it = &doc["iterations"][0];
    assert_eq!(it["resume_us"], serde_json::Value::Null);
    assert_eq!((it["ok"].as_bool(), it["watchdog"].as_bool()), (Some(false), Some(true)));
    let held = it["held_ms"].as_f64().unwrap();
    assert!((500.0..3000.0).contains(&held), "held {held} ms");
    assert_eq!(doc["summary"]["ok"], 0);
    assert!(advances(pid, address));
}

#[test]
fn session_watchdog_resume_that_fails_backs_off_and_is_reported() {
    let offline = workload(&["--gpu-id", "0x2000", "--queues", "1", "--runtime-enable"]);
    let (pid, address) = (offline.pid(), rptr_address(&offline));
    let json = std::env::temp_dir().join(format!("emu-backoff-{pid}.json"));
    let args = [
        "--offline",
        &pid.to_string(),
        "--iterations",
        "1",
        "--hold",
        "5000ms",
        "--max-suspend",
        "300ms",
        "--no-trace",
        "--output",
        json.to_str().unwrap(),
    ];
    // The first three RESUME_QUEUES fail (EIO, injected before the ioctl).
    let out = preempt_with_fault(&args, "resume=3").wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().next(), Some("1 of 1 iterations, 0 fully successful (0.0%)"));
    let doc = json_of(&json);
    let notices = doc["notices"].as_array().unwrap();
    let failed: Vec<&serde_json::Value> = notices.iter().filter(|n| n["notice"] == "watchdog_resume_failed").collect();
    let retries: Vec<u64> = failed.iter().map(|n| n["retry_in_ms"].as_u64().unwrap()).collect();
    assert_eq!(retries, [10, 20, 40], "{notices:?}");
    for n in &failed {
        assert_eq!(n["error"], format!("AMDKFD_IOC_DBG_TRAP RESUME_QUEUES on pid {pid} failed: EIO: I/O error"), "{n}");
        assert!(n["held_ms"].as_u64().unwrap() >= 300);
    }
    let resumed: Vec<&serde_json::Value> = notices.iter().filter(|n| n["notice"] == "watchdog_resumed").collect();
    assert_eq!(resumed.len(), 1, "{notices:?}");
    assert_eq!(resumed[0]["resumed"]["count"], 1);
    // The retries are spaced (10 + 20 + 40 ms at least), not a spin.
    assert!(resumed[0]["held_ms"].as_u64().unwrap() >= 370, "{notices:?}");
    let it = &doc["iterations"][0];
    assert_eq!((it["ok"].as_bool(), it["watchdog"].as_bool()), (Some(false), Some(true)));
    assert!(it["held_ms"].as_f64().unwrap() < 5000.0);
    assert!(advances(pid, address));
}

#[test]
fn session_fault_after_a_successful_suspend_still_resumes_those_queues() {
    let offline = workload(&["--gpu-id", "0x1000", "--queues", "2", "--runtime-enable"]);
    let (pid, address) = (offline.pid(), rptr_address(&offline));
    let json = std::env::temp_dir().join(format!("emu-fault-{pid}.json"));
    let args = [
        "--offline",
        &pid.to_string(),
        "--iterations",
        "3",
        "--hold",
        "10ms",
        "--no-trace",
        "--output",
        json.to_str().unwrap(),
    ];
    let out = preempt_with_fault(&args, "after-suspend").wait_with_output().unwrap();
    let (code, last, stderr) = exit_and_last_line(&out);
    assert_eq!(
        (code, last.as_str()),
        (
            Some(1),
            "gpreempt: error: stopped after 0 of 3 iterations: injected fault (after-suspend) from GPREEMPT_TEST_FAULT"
        ),
        "{stderr}"
    );
    let doc = json_of(&json);
    assert_eq!(doc["iterations"], serde_json::json!([]));
    // Both queues the SUSPEND handled were recorded before the fault, so detach's RESUME
    // resumed them itself (DISABLE would resume them too, §2.3, but only a recorded id is
    // resumed by RESUME_QUEUES and counted here).
    assert_eq!((doc["detached"]["resumed"].as_u64(), doc["detached"]["disabled"].as_bool()), (Some(2), Some(true)));
    assert!(advances(pid, address));
    assert_eq!(tracer_pid(pid).unwrap(), 0);
}

#[test]
fn session_queue_created_mid_hold_is_suspended_within_the_same_hold() {
    let mut offline = workload(&["--gpu-id", "0x1000", "--queues", "1", "--runtime-enable"]);
    let (pid, address) = (offline.pid(), rptr_address(&offline));
    let json = std::env::temp_dir().join(format!("emu-midhold-{pid}.json"));
    let child = preempt(&[
        "--offline",
        &pid.to_string(),
        "--iterations",
        "1",
        "--hold",
        "10000ms",
        // Longer than the hold: the loop's own RESUME must take the late queue too.
        "--max-suspend",
        "60000ms",
        "--no-trace",
        "--output",
        json.to_str().unwrap(),
    ]);
    assert!(eventually(30 * SECOND, || !advances(pid, address)), "never suspended");
    // A second queue (compute AQL on gpu 0x1000): KFD raises EC_QUEUE_NEW to the debugger.
    let before = suspend_calls();
    let created = offline.cmd("create 4096 2 4096 100 7").unwrap();
    assert_eq!((created["ret"].as_i64(), created["queue_id"].as_u64()), (Some(0), Some(1)));
    // gpreempt sees the event and suspends the new queue (one more SUSPEND_QUEUES call inside the
    // hold); then the queue gets work.
    await_suspends(before, 1);
    let submitted = offline.cmd("submit 1 4 1000").unwrap();
    assert_eq!(submitted["ret"], 0);
    let first = submitted["first"].as_u64().unwrap();
    thread::sleep(SECOND / 2);
    let during = offline.cmd("rptr").unwrap();
    assert_eq!(during["queue_ids"], serde_json::json!([0, 1]));
    assert_eq!(during["rptr"][1].as_u64(), Some(first), "the new queue ran during the hold");
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc = json_of(&json);
    let it = &doc["iterations"][0];
    assert_eq!(
        (it["suspended"].as_i64(), it["late_suspended"].as_u64(), it["resumed"].as_i64(), it["ok"].as_bool()),
        (Some(1), Some(1), Some(2), Some(true)),
        "{it}"
    );
    let notices = doc["notices"].as_array().unwrap();
    assert!(notices.contains(&serde_json::json!({"notice": "queues_suspended_mid_hold", "count": 1})), "{notices:?}");
    // Resumed with the others: its four dispatches run.
    assert!(eventually(30 * SECOND, || offline.cmd("rptr").unwrap()["rptr"][1].as_u64() == Some(first + 4)));
}

/// No hold and no gap: every cycle is SUSPEND_QUEUES then RESUME_QUEUES, and the session looks at
/// the target only when a signal says it has news. A queue created mid-run (KFD raises
/// EC_QUEUE_NEW, SIGIO) is suspended late in the cycle that sees it and in every cycle after;
/// Ctrl-C ends the run between cycles with every queue running.
#[test]
fn cycles_without_hold_or_gap_suspend_every_queue_and_pick_up_one_created_mid_run() {
    let mut offline = workload(&["--gpu-id", "0x1000", "--queues", "2", "--runtime-enable"]);
    let (pid, address) = (offline.pid(), rptr_address(&offline));
    let json = std::env::temp_dir().join(format!("emu-no-hold-{pid}.json"));
    let before_attach = suspend_calls();
    let child = preempt(&[
        "--offline",
        &pid.to_string(),
        "--iterations",
        "1000000",
        "--hold",
        "0ms",
        "--gap",
        "0ms",
        "--no-trace",
        "--output",
        json.to_str().unwrap(),
    ]);
    let controller = child.id();
    assert!(eventually(30 * SECOND, || tracer_pid(pid).ok() == Some(controller)), "never attached");
    // At least 20 cycles with the two queues (counted by the emulator, not guessed from a sleep:
    // a loaded host can take seconds to start them), then a third queue (compute AQL on gpu
    // 0x1000), then at least 20 cycles more.
    await_suspends(before_attach, 20);
    let created = offline.cmd("create 4096 2 4096 100 7").unwrap();
    assert_eq!((created["ret"].as_i64(), created["queue_id"].as_u64()), (Some(0), Some(2)));
    await_suspends(suspend_calls(), 20);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(controller as i32), Signal::SIGINT).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.trim_end().ends_with("of 1000000 iterations; queues resumed, target detached"), "{stderr}");
    let doc = json_of(&json);
    let its = doc["iterations"].as_array().unwrap();
    // (suspended, late, resumed, ok) of each cycle, in order.
    let cycles: Vec<(i64, u64, i64, bool)> = its
        .iter()
        .map(|it| {
            let n = |k: &str| it[k].as_i64().unwrap();
            (n("suspended"), it["late_suspended"].as_u64().unwrap(), n("resumed"), it["ok"].as_bool().unwrap())
        })
        .collect();
    let first_with_three = cycles.iter().position(|c| c.0 == 3).expect("the new queue was never suspended");
    assert!(first_with_three >= 10, "too few cycles before the new queue: {first_with_three}");
    assert!(cycles.len() > first_with_three + 10, "too few cycles after it: {}", cycles.len());
    for (i, &(suspended, late, resumed, ok)) in cycles.iter().enumerate() {
        // Every queue suspended is resumed in the same cycle; the new one, once seen, every time.
        // The cycle during which it appeared may have taken it late (suspended mid-cycle).
        let expected: &[(i64, u64, i64)] = match (i + 1).cmp(&first_with_three) {
            std::cmp::Ordering::Less => &[(2, 0, 2)],
            std::cmp::Ordering::Equal => &[(2, 0, 2), (2, 1, 3)],
            std::cmp::Ordering::Greater => &[(3, 0, 3)],
        };
        assert!(ok && expected.contains(&(suspended, late, resumed)), "cycle {i}: {}", its[i]);
    }
    assert_eq!(doc["summary"]["completed"].as_u64(), Some(cycles.len() as u64));
    // Stamps in order within and across cycles.
    let ns = |it: &serde_json::Value, k: &str| it[k].as_u64().unwrap();
    for w in its.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        assert!(ns(a, "suspend_called_ns") <= ns(a, "suspended_at_ns"));
        assert!(ns(a, "suspended_at_ns") <= ns(a, "resumed_at_ns"));
        assert!(ns(a, "resumed_at_ns") <= ns(a, "resume_returned_ns"));
        assert!(ns(a, "resume_returned_ns") <= ns(b, "suspend_called_ns"));
    }
    // Everything runs again, the new queue included.
    assert!(eventually(10 * SECOND, || advances(pid, address)), "queues left suspended");
    let submitted = offline.cmd("submit 2 4 1000").unwrap();
    assert_eq!(submitted["ret"], 0);
    let first = submitted["first"].as_u64().unwrap();
    assert!(eventually(30 * SECOND, || offline.cmd("rptr").unwrap()["rptr"][2].as_u64() == Some(first + 4)));
    assert!(eventually(10 * SECOND, || tracer_pid(pid).ok() == Some(0)));
}

/// The `--json` record of a multi-target run (`"version": 2`): target pid → its record.
fn targets_of(doc: &serde_json::Value) -> Vec<(u32, &serde_json::Value)> {
    assert_eq!(doc["version"], 2, "{doc}");
    let targets = doc["targets"].as_array().unwrap();
    targets.iter().map(|t| (t["target"]["pid"].as_u64().unwrap() as u32, t)).collect()
}

/// (index, suspended, resumed, invalid, error, ok) of every iteration of a target's record.
fn cycles_of(target: &serde_json::Value) -> Vec<(u64, i64, i64, u64, u64, bool)> {
    target["iterations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|it| {
            (
                it["index"].as_u64().unwrap(),
                it["suspended"].as_i64().unwrap(),
                it["resumed"].as_i64().unwrap(),
                it["invalid"].as_u64().unwrap(),
                it["error"].as_u64().unwrap(),
                it["ok"].as_bool().unwrap(),
            )
        })
        .collect()
}

#[test]
fn group_two_offline_pids_are_each_suspended_and_resumed_in_every_cycle() {
    let a = workload(&["--gpu-id", "0x1000", "--queues", "2", "--runtime-enable"]);
    let b = workload(&["--gpu-id", "0x2000", "--queues", "1", "--runtime-enable"]);
    let (pa, pb) = (a.pid(), b.pid());
    let json = std::env::temp_dir().join(format!("emu-group-{pa}.json"));
    let out = preempt(&[
        "--no-trace",
        "--offline",
        &pb.to_string(),
        &pa.to_string(),
        "--iterations",
        "5",
        "--hold",
        "100ms",
        "--gap",
        "50ms",
        "--output",
        json.to_str().unwrap(),
    ])
    .wait_with_output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc = json_of(&json);
    assert_eq!((doc["cycles"].as_u64(), &doc["stopped"]), (Some(5), &serde_json::Value::Null), "{doc}");
    let targets = targets_of(&doc);
    // In pid order, whatever order they were given in.
    assert_eq!(targets.iter().map(|(p, _)| *p).collect::<Vec<_>>(), [pa.min(pb), pa.max(pb)]);
    for (pid, t) in &targets {
        let n = if *pid == pa { 2 } else { 1 };
        let every: Vec<_> = (0..5).map(|i| (i, n, n, 0, 0, true)).collect();
        assert_eq!(cycles_of(t), every, "pid {pid}: {t}");
        assert_eq!((t["first_iteration"].as_u64(), t["picked_up"].as_bool()), (Some(0), Some(false)));
        assert_eq!((t["summary"]["completed"].as_u64(), t["summary"]["ok"].as_u64()), (Some(5), Some(5)));
        // Nothing was left suspended for detach to resume.
        assert_eq!(t["detached"]["resumed"], 0);
        assert!(stdout.contains(&format!("pid {pid} (")), "{stdout}");
    }
    // One cycle holds both at once: every suspend of a cycle returned before any of its resumes.
    let its = |t: &serde_json::Value, i: usize, k: &str| t["iterations"][i][k].as_u64().unwrap();
    for i in 0..5 {
        let last_suspend = targets.iter().map(|(_, t)| its(t, i, "suspended_at_ns")).max().unwrap();
        let first_resume = targets.iter().map(|(_, t)| its(t, i, "resumed_at_ns")).min().unwrap();
        assert!(last_suspend < first_resume, "cycle {i}: a target was resumed before the other was suspended");
    }
    for (pid, w) in [(pa, &a), (pb, &b)] {
        assert_eq!(tracer_pid(pid).unwrap(), 0);
        assert!(advances(pid, rptr_address(w)), "pid {pid} left suspended");
    }
}

#[test]
fn group_traced_each_targets_iterations_carry_their_own_driver_spans() {
    // A 2 ms emulated CWSR save: every suspend's unmap waits at least that long in the driver.
    let _delay = EmuParam::set("preempt_delay_us", 2000).unwrap();
    let a = workload(&["--gpu-id", "0x1000", "--queues", "2", "--runtime-enable"]);
    let b = workload(&["--gpu-id", "0x2000", "--queues", "1", "--runtime-enable"]);
    let (pa, pb) = (a.pid(), b.pid());
    let json = std::env::temp_dir().join(format!("emu-group-traced-{pa}.json"));
    #[rustfmt::skip]
    let out = preempt(&[
        "--offline", &pa.to_string(), &pb.to_string(), "--iterations", "20", "--hold", "20ms", "--gap", "20ms",
        "--output", json.to_str().unwrap(),
    ])
    .wait_with_output()
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc = json_of(&json);
    assert_eq!((doc["cycles"].as_u64(), &doc["stopped"]), (Some(20), &serde_json::Value::Null), "{doc}");
    for (pid, t) in targets_of(&doc) {
        let (n, gpu) = if pid == pa { (2, 0x1000) } else { (1, 0x2000) };
        let every: Vec<_> = (0..20).map(|i| (i, n, n, 0, 0, true)).collect();
        assert_eq!(cycles_of(t), every, "pid {pid}");
        for (i, it) in t["iterations"].as_array().unwrap().iter().enumerate() {
            // Its own suspend (waiting for the emulated save) and resume inside the driver: the
            // spans were matched to the target and to this iteration's ioctl windows.
            let k = &it["kernel"];
            let (unmap, fence) =
                (k["suspend"]["unmap_us"].as_f64().unwrap(), k["suspend"]["fence_wait_us"].as_f64().unwrap());
            assert!(unmap >= 2_000.0 && fence > 0.0 && fence <= unmap, "pid {pid} iteration {i}: {k}");
            assert!(k["resume"]["duration_us"].as_f64().unwrap() > 0.0, "pid {pid} iteration {i}: {k}");
            // The driver's phases name the GPU they preempted (`dqm->dev->id`, read through BTF
            // offsets that are 0 in the emulator's structs: first members): its own, only.
            assert_eq!(k["suspend"]["gpus"], serde_json::json!([gpu]), "pid {pid} iteration {i}: {k}");
            assert_eq!(k["resume"]["gpus"], serde_json::json!([gpu]), "pid {pid} iteration {i}: {k}");
        }
    }
    for (pid, w) in [(pa, &a), (pb, &b)] {
        assert_eq!(tracer_pid(pid).unwrap(), 0);
        assert!(advances(pid, rptr_address(w)), "pid {pid} left suspended");
    }
}

#[test]
fn group_a_named_pid_that_exits_mid_run_is_detached_the_others_finish_and_the_command_fails() {
    let a = workload(&["--gpu-id", "0x1000", "--queues", "2", "--runtime-enable"]);
    let b = workload(&["--gpu-id", "0x2000", "--queues", "1", "--runtime-enable"]);
    let (pa, pb) = (a.pid(), b.pid());
    let json = std::env::temp_dir().join(format!("emu-group-exit-{pa}.json"));
    #[rustfmt::skip]
    let child = preempt(&[
        "--no-trace", "--offline", &pa.to_string(), &pb.to_string(), "--iterations", "200",
        "--hold", "10ms", "--gap", "10ms", "--output", json.to_str().unwrap(),
    ]);
    // Once gpreempt holds b (its tracer), some cycles run; then b exits on its own.
    let gp = child.id();
    assert!(eventually(60 * SECOND, || tracer_pid(pb).is_ok_and(|t| t == gp)), "pid {pb} never seized");
    thread::sleep(Duration::from_millis(500));
    assert!(b.finish().unwrap().success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "gpreempt: error: 1 of the 2 pids named in --offline left the run early (pid {pb}: pid {pb} exited"
        )),
        "{stderr}"
    );
    assert!(stderr.contains("the other targets ran all 200 cycles"), "{stderr}");
    let doc = json_of(&json);
    assert_eq!((doc["cycles"].as_u64(), &doc["stopped"]), (Some(200), &serde_json::Value::Null), "{doc}");
    let targets = targets_of(&doc);
    let (_, ta) = targets.iter().find(|(p, _)| *p == pa).unwrap();
    let (_, tb) = targets.iter().find(|(p, _)| *p == pb).unwrap();
    // a: every cycle, both of its queues, none failed.
    let every: Vec<_> = (0..200).map(|i| (i, 2, 2, 0, 0, true)).collect();
    assert_eq!(cycles_of(ta), every);
    assert_eq!(ta["stopped"], serde_json::Value::Null);
    // b: the cycles before its exit, then its reason; detached (nothing left suspended).
    let done = cycles_of(tb).len();
    assert!((1..200).contains(&done), "pid {pb} took part in {done} cycles");
    assert!(tb["stopped"].as_str().unwrap().starts_with(&format!("pid {pb} exited")), "{tb}");
    assert!(tb["detached"].is_object(), "{tb}");
    assert_eq!(tracer_pid(pa).unwrap(), 0);
    assert!(advances(pa, rptr_address(&a)), "pid {pa} left suspended");
}

#[test]
fn group_container_selects_its_two_processes_and_attaches_a_third_started_later() {
    let cg = gpreempt_tests::docker_cgroup("5e1ec70000000000000000000000000000000000000000000000000000000042");
    let in_container =
        || workload(&["--gpu-id", "0x1000", "--queues", "1", "--runtime-enable", "--cgroup", cg.to_str().unwrap()]);
    let (a, b) = (in_container(), in_container());
    // Same GPU, not in the container: never attached.
    let outsider = workload(&["--gpu-id", "0x1000", "--queues", "1", "--runtime-enable"]);
    let json = std::env::temp_dir().join(format!("emu-group-container-{}.json", a.pid()));
    let child = preempt(&[
        "--no-trace",
        "--offline",
        "container:5e1ec7",
        "--iterations",
        "100000",
        "--hold",
        "30ms",
        "--gap",
        "30ms",
        "--output",
        json.to_str().unwrap(),
    ]);
    let me = child.id();
    let traced_by_me = |pid: u32| tracer_pid(pid).ok() == Some(me);
    assert!(eventually(30 * SECOND, || traced_by_me(a.pid()) && traced_by_me(b.pid())), "not attached");
    let c = in_container();
    assert!(eventually(30 * SECOND, || traced_by_me(c.pid())), "the later process was not attached");
    // Some cycles with all three (30 + 30 ms each; the record says how many).
    thread::sleep(2 * SECOND);
    assert_eq!(tracer_pid(outsider.pid()).unwrap(), 0);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(me as i32), Signal::SIGINT).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("gpreempt: error: interrupted by SIGINT after"), "{stderr}");
    let doc = json_of(&json);
    let cycles = doc["cycles"].as_u64().unwrap();
    let targets = targets_of(&doc);
    assert_eq!(targets.iter().map(|(p, _)| *p).collect::<Vec<_>>(), [a.pid(), b.pid(), c.pid()]);
    // The two found at start: one suspended and resumed queue in every cycle.
    for (pid, t) in &targets[..2] {
        let every: Vec<_> = (0..cycles).map(|i| (i, 1, 1, 0, 0, true)).collect();
        assert_eq!(cycles_of(t), every, "pid {pid}: {t}");
        assert_eq!((t["first_iteration"].as_u64(), t["picked_up"].as_bool()), (Some(0), Some(false)));
    }
    // The later one: from the cycle after it opened /dev/kfd, every cycle is accounted for.
    let (_, late) = &targets[2];
    let first = late["first_iteration"].as_u64().unwrap();
    assert!(first > 0 && first < cycles, "first {first} of {cycles}");
    assert_eq!(late["picked_up"], true);
    let seen = cycles_of(late);
    let skipped = late["runtime_not_enabled"].as_u64().unwrap();
    assert_eq!(seen.len() as u64 + skipped, cycles - first, "{late}");
    // Attached as it opened /dev/kfd, it may have had no queue yet in its first cycle; from the
    // next one on it has exactly one, suspended and resumed in each.
    let held: Vec<_> = seen.iter().skip(1).copied().collect();
    let every: Vec<_> = seen.iter().skip(1).map(|s| (s.0, 1, 1, 0, 0, true)).collect();
    assert_eq!(held, every, "{late}");
    assert!(held.len() >= 3, "only {} held cycles: {late}", held.len());
    for w in [&a, &b, &c] {
        assert!(eventually(10 * SECOND, || tracer_pid(w.pid()).ok() == Some(0)));
        assert!(advances(w.pid(), rptr_address(w)), "pid {} left suspended", w.pid());
    }
    drop((a, b, c));
    let _ = std::fs::remove_dir(&cg);
}

#[test]
fn group_bad_offline_selections_are_refused_with_cause_and_fix_and_nothing_attached() {
    let a = workload(&["--gpu-id", "0x1000", "--queues", "1", "--runtime-enable"]);
    let b = workload(&["--gpu-id", "0x2000", "--queues", "1", "--runtime-enable"]);
    let (pa, pb) = (a.pid().to_string(), b.pid().to_string());
    let refused = |args: &[&str]| {
        let out = Command::new(binary("gpreempt").unwrap())
            .args(["preempt", "--no-trace", "--offline"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} was accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = refused(&[&pa, &pb, &pa]);
    assert!(e.contains(&format!("`{pa}` is given twice in --offline; give each target once")), "{e}");
    let e = refused(&[&pa, "container:0ddba11"]);
    assert!(e.contains("--offline container:0ddba11: no KFD process runs in a container with that name"), "{e}");
    assert!(e.contains("start its GPU work first"), "{e}");
    let e = refused(&[&pa, &pb, "--online", &pb]);
    assert!(e.contains(&format!("pid {pb} is selected both as online and as offline (--offline {pb})")), "{e}");
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let sl = sleeper.id().to_string();
    let e = refused(&[&pa, &sl]);
    assert!(e.contains(&format!("--offline {sl}: pid {sl} (sleep) has never opened /dev/kfd")), "{e}");
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let e = refused(&[&pa, "container:"]);
    assert!(e.contains("`container:` needs a container name or id"), "{e}");
    // Refused before anything was seized: both run untraced.
    for w in [&a, &b] {
        assert_eq!(tracer_pid(w.pid()).unwrap(), 0);
        assert!(advances(w.pid(), rptr_address(w)));
    }
}
