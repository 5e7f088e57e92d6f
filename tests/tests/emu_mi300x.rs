//! The KFD emulator's MI300X profile and per-queue reset (tests/kfd-emu README "Profiles",
//! "Per-queue reset"):
//!
//! - `profile=mi300x partition=spx|dpx|qpx|cpx`: one KFD node per compute partition, each with its
//!   gpu id, its share of the package's XCCs, CUs, SDMA engines and memory, the package's
//!   location_id, and the per-XCC save-area sizes (the real SPX node's properties,
//!   tests/kfd-emu/README.md "Profiles" and topology.c, with their sources);
//! - trixie's ROCr 6.1 (bookworm's `rocminfo` run with trixie's loader and libraries) lists the
//!   partitions as gfx942 agents in SPX and CPX;
//! - a HIP 5.7 program with a gfx942 code object of its own (`hip-streams-gfx942`, built by
//!   trixie's clang 17) runs its streams in SPX, and `gpreempt preempt` holds it mid-kernel on one
//!   CPX partition; its results and what the emulated CP executed are exact;
//! - a queue whose CWSR save never completes (the `stuck_queue` hook) is reset alone, as gfx9 does
//!   from 6.12, and the other queues are suspended and resumed normally.
//!
//! The profile tests reload kfd_emu with the profile's parameters and load it again as the pass
//! had it when they end (a guard), so the other emulator tests see the default mi210.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use gpreempt_tests::{
    LineHelper, emu_param, read_sysfs,
    schedule::{Elapsed, LONG, Schedule, holds, progresses, summary},
    wait_kfd_released,
};

// The ROCm sections' helpers (tests/tests/emu_rocm/): what the emulated CP executed, a ROCm
// program run with amdgpu_emu loaded, `gpreempt preempt` on a ROCr 6.1 process and HIP 5.7's
// offline counts. Shared by path; this binary calls some of each module's items only.
#[allow(dead_code)]
#[path = "emu_rocm/emulator.rs"]
mod emulator;
#[allow(dead_code)]
#[path = "emu_rocm/hip.rs"]
mod hip;
#[path = "emu_rocm/preempt_rocm.rs"]
mod preempt_rocm;
#[allow(dead_code)]
#[path = "emu_rocm/rocm_run.rs"]
mod rocm_run;

const EC_QUEUE_NEW: u64 = 1 << 30;
const EC_PROCESS_RUNTIME: u64 = 1 << 47;
const MIB: u64 = 1 << 20;

fn run(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

/// `target/kfd-emu/<release>/<name>`, built by xtask for the running kernel.
fn ko(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).unwrap();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    target.join("kfd-emu").join(release.trim()).join(name)
}

fn kernel_log() -> Vec<String> {
    String::from_utf8_lossy(&run("dmesg", &[]).stdout).lines().map(str::to_owned).collect()
}

/// Unload kfd_emu once every KFD process is gone and load it with `params`.
fn try_reload(params: &[String]) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_dir("/sys/class/kfd/kfd/proc").map(|mut d| d.next().is_some()).unwrap_or(false) {
        if Instant::now() > deadline {
            return Err("kfd processes still alive".into());
        }
        thread::sleep(Duration::from_millis(100));
    }
    // amdgpu_emu holds kfd_emu (its render nodes are registered there) until it goes.
    if Path::new("/sys/module/amdgpu_emu").exists() {
        let mut out = run("rmmod", &["amdgpu_emu"]);
        while !out.status.success() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(100));
            out = run("rmmod", &["amdgpu_emu"]);
        }
        if !out.status.success() {
            return Err(format!("rmmod amdgpu_emu: {}", String::from_utf8_lossy(&out.stderr)));
        }
    }
    if Path::new("/sys/module/kfd_emu").exists() {
        let mut out = run("rmmod", &["kfd_emu"]);
        while !out.status.success() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(100));
            out = run("rmmod", &["kfd_emu"]);
        }
        if !out.status.success() {
            return Err(format!("rmmod kfd_emu: {}", String::from_utf8_lossy(&out.stderr)));
        }
    }
    let out = Command::new("insmod").arg(ko("kfd_emu.ko")).args(params).output().unwrap();
    if !out.status.success() {
        return Err(format!("insmod {params:?}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    while !Path::new("/dev/kfd").exists() {
        if Instant::now() > deadline {
            return Err("/dev/kfd did not come back".into());
        }
        thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn reload(params: &[String]) {
    try_reload(params).unwrap();
}

/// kfd_emu loaded with a profile for the guard's life; dropping it loads it again as the pass had
/// it (the default profile with the pass's parameters).
struct Profile {
    pass: Vec<String>,
}

impl Profile {
    fn load(params: &[&str]) -> Self {
        let names = ["tick_us", "preempt_delay_us", "restore_delay_us", "queue_preemption_timeout_ms", "num_gpus"];
        let pass: Vec<String> = names.iter().map(|p| format!("{p}={}", emu_param(p).unwrap())).collect();
        let mut with: Vec<String> = pass.iter().filter(|p| !p.starts_with("num_gpus=")).cloned().collect();
        with.extend(params.iter().map(|p| (*p).to_owned()));
        // Built first: if the load fails, dropping it loads the pass's kfd_emu again.
        let profile = Profile { pass };
        reload(&with);
        profile
    }
}

impl Drop for Profile {
    /// Also after a failure: the binaries after this one need the pass's kfd_emu.
    fn drop(&mut self) {
        let back = try_reload(&self.pass);
        if !thread::panicking() {
            back.unwrap();
        }
    }
}

fn properties(path: &str) -> BTreeMap<String, u64> {
    read_sysfs(path)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

fn node(n: usize) -> BTreeMap<String, u64> {
    properties(&format!("/sys/class/kfd/kfd/topology/nodes/{n}/properties"))
}

fn gpu_id(n: usize) -> u64 {
    read_sysfs(&format!("/sys/class/kfd/kfd/topology/nodes/{n}/gpu_id")).unwrap().trim().parse().unwrap()
}

fn topology_nodes() -> usize {
    std::fs::read_dir("/sys/class/kfd/kfd/topology/nodes").unwrap().count()
}

#[test]
fn mi300x_partition_modes_expose_one_kfd_node_per_partition_with_its_share_of_the_package() {
    for (mode, parts, packages) in [("spx", 1u64, 1u64), ("dpx", 2, 1), ("qpx", 4, 1), ("cpx", 8, 2)] {
        let _profile =
            Profile::load(&["profile=mi300x", &format!("partition={mode}"), &format!("num_gpus={packages}")]);
        assert_eq!(topology_nodes() as u64, 1 + parts * packages, "{mode}: the CPU and one node per partition");
        for package in 0..packages {
            for k in 0..parts {
                let n = (1 + package * parts + k) as usize;
                let p = node(n);
                assert_eq!(gpu_id(n), 0x1000 * (package + 1) + k, "{mode} node {n}");
                let expect: [(&str, u64); 24] = [
                    ("num_xcc", 8 / parts),
                    ("simd_count", 1216 / parts),
                    ("array_count", 32 / parts),
                    ("simd_arrays_per_engine", 1),
                    ("cu_per_simd_array", 10),
                    ("simd_per_cu", 4),
                    ("max_waves_per_simd", 8),
                    ("lds_size_in_kb", 64),
                    ("wave_front_size", 64),
                    ("gfx_target_version", 90402),
                    ("vendor_id", 4098),
                    ("device_id", 29857),
                    // The partitions of a package share its PCI location and domain.
                    ("location_id", (3 + package) << 8),
                    ("domain", 0),
                    ("num_sdma_engines", 2),
                    ("num_sdma_xgmi_engines", 16 / parts - 2),
                    ("num_cp_queues", 24),
                    ("max_engine_clk_fcompute", 2100),
                    ("fw_version", 166),
                    ("sdma_fw_version", 22),
                    // 0x2C77A280 with PER_QUEUE_RESET (6.12, gfx9) and without SVMAPI (not emulated)
                    ("capability", 0xA477_A280),
                    ("debug_prop", 1511),
                    // per XCC, whatever the mode (kfd_queue_ctx_save_restore_size)
                    ("cwsr_size", 23_203_840),
                    ("ctl_stack_size", 12_288),
                ];
                for (key, value) in expect {
                    assert_eq!(p.get(key), Some(&value), "{mode} node {n} {key}: {p:#?}");
                }
                let mem = properties(&format!("/sys/class/kfd/kfd/topology/nodes/{n}/mem_banks/0/properties"));
                // 196592 MiB per package (a DPX partition shows 98296 MiB), split between partitions
                assert_eq!(mem["size_in_bytes"], 196_592 * MIB / parts, "{mode} node {n}");
            }
        }
        // Each node has a scheduler (CP thread) of its own.
        let threads = run("sh", &["-c", "ps -eo comm | grep -c '^kfd_emu_cp'"]);
        assert_eq!(String::from_utf8_lossy(&threads.stdout).trim(), (parts * packages).to_string(), "{mode}");
    }
}

/// Trixie's dynamic loader and library directory, as `hsa-dispatch-6` names them (its PT_INTERP).
fn rocm6_loader() -> PathBuf {
    let exe = gpreempt_tests::binary("hsa-dispatch-6")
        .expect("hsa-dispatch-6 is built by `cargo xtask test` once `cargo xtask setup` unpacked trixie's ROCm 6.1");
    let bytes = std::fs::read(exe).unwrap();
    let name = b"/ld-linux-x86-64.so.2";
    let end = bytes.windows(name.len()).position(|w| w == name).expect("PT_INTERP") + name.len();
    let start = bytes[..end].iter().rposition(|&b| b == 0).unwrap() + 1;
    PathBuf::from(String::from_utf8(bytes[start..end].to_vec()).unwrap())
}

/// rocminfo's agents: key → value per agent, in order.
fn agents(text: &str) -> Vec<BTreeMap<String, String>> {
    let mut agents: Vec<BTreeMap<String, String>> = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("Agent ") && line.split_whitespace().count() == 2 {
            agents.push(BTreeMap::new());
            continue;
        }
        let Some(agent) = agents.last_mut() else { continue };
        if let Some((key, value)) = line.split_once(':') {
            agent.entry(key.trim().to_owned()).or_insert_with(|| value.trim().to_owned());
        }
    }
    agents
}

#[test]
fn rocr_6_1_lists_mi300x_partitions_as_gfx942_agents_in_spx_and_cpx() {
    let loader = rocm6_loader();
    let lib = loader.parent().unwrap().to_owned();
    for (mode, parts) in [("spx", 1usize), ("cpx", 8)] {
        let _profile = Profile::load(&["profile=mi300x", &format!("partition={mode}"), "num_gpus=1"]);
        assert!(run("modprobe", &["drm"]).status.success());
        let out = run("insmod", &[ko("amdgpu_emu.ko").to_str().unwrap()]);
        assert!(out.status.success(), "insmod amdgpu_emu: {}", String::from_utf8_lossy(&out.stderr));
        // Bookworm's rocminfo (its `lsmod | grep amdgpu` finds amdgpu_emu) on trixie's ROCr 6.1.
        let child = Command::new(&loader)
            .arg("--library-path")
            .arg(&lib)
            .arg("/usr/bin/rocminfo")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        wait_kfd_released(pid).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut rm = run("rmmod", &["amdgpu_emu"]);
        while !rm.status.success() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(100));
            rm = run("rmmod", &["amdgpu_emu"]);
        }
        assert!(
            out.status.success(),
            "{mode} rocminfo: {}\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let agents = agents(&text);
        let gpus: Vec<&BTreeMap<String, String>> =
            agents.iter().filter(|a| a.get("Device Type").map(String::as_str) == Some("GPU")).collect();
        assert_eq!(gpus.len(), parts, "{mode}: {agents:#?}");
        for (k, agent) in gpus.iter().enumerate() {
            let expect = [
                ("Name", "gfx942".to_owned()),
                ("Chip ID", "29857(0x74a1)".to_owned()),
                ("Compute Unit", (304 / parts).to_string()),
                ("SIMDs per CU", "4".to_owned()),
                ("Max Clock Freq. (MHz)", "2100".to_owned()),
                ("Node", (k + 1).to_string()),
            ];
            for (key, value) in expect {
                assert_eq!(agent.get(key), Some(&value), "{mode} agent {k} {key}: {agent:#?}");
            }
        }
        // One ISA per agent. (Its marketing name is libdrm's fallback, "AMD Radeon Graphics":
        // bookworm's amdgpu.ids has no 74A1 line.)
        assert_eq!(text.matches("amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-").count(), parts, "{mode}: {text}");
        assert!(rm.status.success(), "rmmod amdgpu_emu: {}", String::from_utf8_lossy(&rm.stderr));
    }
}

fn workload(args: &[&str]) -> LineHelper {
    LineHelper::spawn("emu-workload", &[&["run"], args].concat()).unwrap()
}

fn rptrs(w: &mut LineHelper) -> Vec<u64> {
    serde_json::from_value(w.cmd("rptr").unwrap()["rptr"].clone()).unwrap()
}

/// Which of w's queues moved in 300 ms.
fn moving(w: &mut LineHelper) -> Vec<bool> {
    let before = rptrs(w);
    thread::sleep(Duration::from_millis(300));
    rptrs(w).iter().zip(&before).map(|(b, a)| b > a).collect()
}

#[test]
fn a_queue_stuck_in_its_preemption_is_reset_alone_and_the_others_are_suspended_normally() {
    let mut w = workload(&["--queues", "3", "--runtime-enable"]);
    let mut bystander = workload(&["--queues", "1"]);
    let mut d = LineHelper::spawn("emu-workload", &["debug", "--pid", &w.pid().to_string()]).unwrap();
    assert_eq!(d.cmd(&format!("enable {EC_PROCESS_RUNTIME}")).unwrap()["ret"], 0);
    assert_eq!(d.cmd(&format!("snapshot {EC_QUEUE_NEW} 4")).unwrap()["num_queues"], 3);
    assert_eq!(moving(&mut w), [true, true, true]);
    let log_at = kernel_log().len();

    // Queue 1 will not reach a save point: the MEC abandons its unmap and KFD resets it alone.
    std::fs::write("/sys/kernel/kfd_emu/stuck_queue", format!("{} 1", w.pid())).unwrap();
    let suspended = d.cmd("suspend 0 0,1,2").unwrap();
    // 6.12's reply: the unmap succeeded once the queue was reset, so suspend_queues() counts every
    // queue and marks none (ERROR only when execute_queues_cpsch fails).
    assert_eq!((suspended["ret"].as_i64(), &suspended["ids"]), (Some(3), &serde_json::json!([0, 1, 2])));
    let pasid: u64 = read_sysfs(&format!("/sys/class/kfd/kfd/proc/{}/pasid", w.pid())).unwrap().trim().parse().unwrap();
    let log = kernel_log();
    let new = &log[log_at..];
    let reset = format!("kfd_emu: queue id 0x1 at pasid 0x{pasid:x} is reset");
    assert!(new.iter().any(|l| l.contains(&reset)), "{reset} in {new:#?}");
    assert_eq!(new.iter().filter(|l| l.contains(" is reset")).count(), 1, "only the stuck queue: {new:#?}");
    assert!(
        new.iter().any(|l| l.contains("Queues reset on process") && l.ends_with(&format!("pid {}", w.pid()))),
        "{new:#?}"
    );
    assert!(!new.iter().any(|l| l.contains("unrecoverable") || l.contains("fence wait")), "no HWS hang: {new:#?}");
    assert_eq!(moving(&mut w), [false, false, false], "suspended");
    assert_eq!(moving(&mut bystander), [true], "the other process's queue was unmapped and mapped again");

    // RESUME answers for every queue; the reset one never runs again, the others do.
    let resumed = d.cmd("resume 0,1,2").unwrap();
    assert_eq!((resumed["ret"].as_i64(), &resumed["ids"]), (Some(3), &serde_json::json!([0, 1, 2])));
    assert_eq!(moving(&mut w), [true, false, true], "the reset queue is gone");
    // A later SUSPEND has no stuck queue left: an ordinary reply, and no further reset.
    assert_eq!(d.cmd("suspend 0 0,2").unwrap()["ret"], 2);
    assert_eq!(kernel_log()[log_at..].iter().filter(|l| l.contains(" is reset")).count(), 1);
    assert_eq!(d.cmd("disable").unwrap()["ret"], 0);
    assert_eq!(moving(&mut w), [true, false, true]);

    // The hook refuses what it cannot make stuck.
    let err = std::fs::write("/sys/kernel/kfd_emu/stuck_queue", format!("{} 1", w.pid())).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "already reset");
    let err = std::fs::write("/sys/kernel/kfd_emu/stuck_queue", "999999 0").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ESRCH));
}

/// `emu-workload run` on `gpu` with one queue and libhsakmt's full save area (the gfx942 profile
/// checks it), its ring kept full of 1 ms dispatches (`fill_us` 1000) or empty (0).
fn partition_client(gpu: &str, fill_us: &str) -> LineHelper {
    workload(&["--gpu-id", gpu, "--queues", "1", "--runtime-enable", "--full-save-area", "--fill-us", fill_us])
}

/// `gpreempt ps` and `queues`, table and JSON, name X's GPU (0x1000) and Y's (0x1001) as the
/// package's partitions 0 and 1 of 8 in CPX: the package's PCI address from the nodes' shared
/// `location_id` (bus 3), the mode from `current_compute_partition` behind partition 0's render
/// node (amdgpu_emu's, as amdgpu's PCI device).
fn partitions_are_named_as_users_see_them(x: u32, y: u32) {
    let gpreempt = gpreempt_tests::binary("gpreempt").unwrap();
    let ps = Command::new(&gpreempt).args(["ps", "--json"]).output().unwrap();
    assert!(ps.status.success(), "{}", String::from_utf8_lossy(&ps.stderr));
    let ps: serde_json::Value = serde_json::from_slice(&ps.stdout).unwrap();
    for (pid, gpu, index) in [(x, 0x1000, 0), (y, 0x1001, 1)] {
        let p = ps["processes"].as_array().unwrap().iter().find(|p| p["pid"] == pid).unwrap();
        // KFD gives a process a device entry on every node at its open: all 8 partitions.
        let gpus = p["gpus"].as_array().unwrap();
        assert_eq!(gpus.len(), 8, "{p}");
        let on = gpus.iter().find(|g| g["gpu_id"] == gpu).unwrap_or_else(|| panic!("{p}"));
        assert_eq!(
            on["partition"],
            serde_json::json!({"package": "0000:03:00.0", "index": index, "count": 8, "mode": "cpx"}),
            "{p}"
        );
    }
    let table = String::from_utf8(Command::new(&gpreempt).arg("ps").output().unwrap().stdout).unwrap();
    // One row per process and GPU: Y's queue on 0x1001.
    let y_row = |l: &&str| l.split_whitespace().next() == Some(&y.to_string()) && l.contains(" 0x1001 ");
    let row = table.lines().find(y_row).unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains(" 0x1001 0000:03:00.0 CPX 1/8 0:compute "), "{table}");
    let queues = Command::new(&gpreempt).args(["queues", &y.to_string(), "--json"]).output().unwrap();
    let queues: serde_json::Value = serde_json::from_slice(&queues.stdout).unwrap();
    assert_eq!(
        (&queues["queues"][0]["gpu_id"], &queues["queues"][0]["partition"]),
        (
            &serde_json::json!(0x1001),
            &serde_json::json!({"package": "0000:03:00.0", "index": 1, "count": 8, "mode": "cpx"})
        ),
        "{queues}"
    );
}

/// The first queue of `w` (pid, read-index address).
fn first_queue(w: &LineHelper) -> (u32, u64) {
    (w.pid(), w.hello["queues"][0]["rptr"].as_u64().unwrap())
}

/// CPX (8 KFD nodes per package): online work on partition 0 (gpu 0x1000) suspends the offline
/// process on partition 0 and never the one on partition 1 (0x1001) of the same package: each
/// partition has its own HWS runlist (kfd_node, Linux 6.5), so a SUSPEND unmaps its partition
/// only. Exact counts from the scheduler's transitions and its tracer's driver report: one
/// SUSPEND_QUEUES per request, for X alone, whose device-wide unmap preempted the online
/// process's queue on 0x1000 (collateral) and nothing of Y's.
#[test]
fn cpx_online_work_on_partition_0_suspends_only_partition_0s_offline_process() {
    let _t = Elapsed::start("cpx_online_work_on_partition_0_suspends_only_partition_0s_offline_process");
    let _profile = Profile::load(&["profile=mi300x", "partition=cpx", "num_gpus=1"]);
    assert!(run("modprobe", &["drm"]).status.success());
    let out = run("insmod", &[ko("amdgpu_emu.ko").to_str().unwrap()]);
    assert!(out.status.success(), "insmod amdgpu_emu: {}", String::from_utf8_lossy(&out.stderr));
    let (p0, p1) = (0x1000u64, 0x1001u64);
    assert_eq!((gpu_id(1), gpu_id(2)), (p0, p1));
    let x = partition_client("0x1000", "1000");
    let y = partition_client("0x1001", "1000");
    let mut online = partition_client("0x1000", "0");
    for w in [&x, &y, &online] {
        assert_eq!(w.hello["errors"], serde_json::json!([]), "{}", w.hello);
    }
    let (x_q, y_q) = (first_queue(&x), first_queue(&y));
    partitions_are_named_as_users_see_them(x.pid(), y.pid());
    let mut s = Schedule::start(&[
        "--online",
        &online.pid().to_string(),
        "--offline",
        &x.pid().to_string(),
        &y.pid().to_string(),
        "--idle",
        "20ms",
    ]);
    let attached = s.wait_events("offline_attached", 2, LONG);
    let by_pid = |pid: u32| attached.iter().find(|a| a["pid"] == pid).unwrap_or_else(|| panic!("{pid}: {attached:?}"));
    assert_eq!((by_pid(x.pid())["queues"].as_u64(), &by_pid(x.pid())["gpus"]), (Some(1), &serde_json::json!([p0])));
    assert_eq!((by_pid(y.pid())["queues"].as_u64(), &by_pid(y.pid())["gpus"]), (Some(1), &serde_json::json!([p1])));
    const REQUESTS: usize = 2;
    for request in 1..=REQUESTS {
        let slot = online.cmd("reserve 0").unwrap()["index"].as_u64().unwrap();
        let susp = s.wait_transitions("suspend", request, LONG);
        let t = &susp[request - 1];
        assert_eq!(
            (t["gpu_id"].as_u64(), t["queues"].as_i64(), t["ioctls"].as_u64()),
            (Some(p0), Some(1), Some(1)),
            "{t}"
        );
        assert!(holds(x_q.0, x_q.1), "X on partition 0 runs during the online request");
        assert!(progresses(y_q.0, y_q.1), "Y on partition 1 is held by online work on partition 0");
        assert_eq!(online.cmd(&format!("commit 0 {slot} 1000")).unwrap()["ret"], 0);
        let res = s.wait_transitions("resume", request, LONG);
        let t = &res[request - 1];
        assert_eq!((t["gpu_id"].as_u64(), t["queues"].as_i64()), (Some(p0), Some(1)), "{t}");
        assert!(progresses(x_q.0, x_q.1));
    }
    let (lines, stderr) = s.stop();
    let sum = summary(&lines);
    assert_eq!((sum["suspends"].as_u64(), sum["resumes"].as_u64()), (Some(2), Some(2)), "{sum}");
    let gpus = sum["gpus"].as_array().unwrap();
    let gpu = |id: u64| gpus.iter().find(|g| g["gpu_id"] == id).unwrap_or_else(|| panic!("{id}: {sum}"));
    assert_eq!(
        (gpu(p0)["scheduled"].as_bool(), gpu(p0)["suspends"].as_u64(), gpu(p0)["resumes"].as_u64()),
        (Some(true), Some(2), Some(2)),
        "{sum}"
    );
    // Partition 1 had offline work only: no policy ran for it, nothing was suspended there.
    assert_eq!(
        (gpu(p1)["scheduled"].as_bool(), gpu(p1)["suspends"].as_u64(), gpu(p1)["failed_suspends"].as_u64()),
        (Some(false), Some(0), Some(0)),
        "{sum}"
    );
    assert!(gpu(p1)["offline_dispatches"].as_u64().unwrap() > 0, "{sum}");
    // The tracer's view of the driver: one suspend and one resume of X per request, each
    // preempting the online process's queue on partition 0 as collateral, and no queue of Y's.
    let k = &sum["kernel"];
    assert!(!stderr.contains("could not attach"), "the scheduler's tracer gives the driver report: {stderr}");
    assert_eq!(
        (k["suspend"]["count"].as_u64(), k["resume"]["count"].as_u64()),
        (Some(REQUESTS as u64), Some(REQUESTS as u64)),
        "{k}"
    );
    assert_eq!(
        (k["suspend"]["collateral_queues"].as_u64(), k["suspend"]["collateral_online_queues"].as_u64()),
        (Some(REQUESTS as u64), Some(REQUESTS as u64)),
        "{k}"
    );
    assert_eq!(k["collateral_pids"], serde_json::json!([online.pid()]), "{k}");
    // KFD's own accounting agrees: Y was never evicted.
    let evicted = read_sysfs(&format!("/sys/class/kfd/kfd/proc/{}/stats_{p1}/evicted_ms", y.pid())).unwrap();
    assert_eq!(evicted.trim(), "0");
    let refused: Vec<&serde_json::Value> = lines.iter().filter(|l| l["event"] == "warning").collect();
    assert!(refused.is_empty(), "{refused:?}\n{stderr}");
    let pids = [x.pid(), y.pid(), online.pid()];
    drop((x, y, online));
    for pid in pids {
        wait_kfd_released(pid).unwrap();
    }
}

/// `gpreempt schedule` meets a per-queue reset: the offline process's queue 1 never reaches a
/// save point (`stuck_queue`), so the first suspend's unmap resets it alone and succeeds. As on
/// 6.12-7.x the SUSPEND_QUEUES reply counts it suspended with no bit (docs/kfd.md §2.4); the
/// tracer's probe on `set_queue_as_reset` tells the scheduler, which reports the queue gone (not a
/// failed suspend), resumes and suspends the other two from then on, and never names queue 1
/// again.
#[test]
fn a_queue_reset_during_a_schedule_suspend_is_reported_gone_and_never_resumed() {
    let _t = Elapsed::start("a_queue_reset_during_a_schedule_suspend_is_reported_gone_and_never_resumed");
    let mut w = workload(&["--queues", "3", "--runtime-enable"]);
    let mut online = workload(&["--queues", "1", "--runtime-enable", "--fill-us", "0"]);
    let mut s =
        Schedule::start(&["--online", &online.pid().to_string(), "--offline", &w.pid().to_string(), "--idle", "20ms"]);
    assert_eq!(s.wait_events("offline_attached", 1, LONG)[0]["queues"], 3);
    assert_eq!(moving(&mut w), [true, true, true]);
    let log_at = kernel_log().len();
    std::fs::write("/sys/kernel/kfd_emu/stuck_queue", format!("{} 1", w.pid())).unwrap();
    for request in 1..=2 {
        let slot = online.cmd("reserve 0").unwrap()["index"].as_u64().unwrap();
        let susp = s.wait_transitions("suspend", request, LONG);
        let t = &susp[request - 1];
        // The first SUSPEND's reply counts the reset queue (the kernel's); later ones leave it out.
        let held = if request == 1 { 3 } else { 2 };
        assert_eq!(
            (t["gpu_id"].as_u64(), t["queues"].as_i64(), t["ioctls"].as_u64()),
            (Some(4096), Some(held), Some(1)),
            "{t}"
        );
        assert_eq!(t["errors"], serde_json::json!([]), "not a failed suspend: {t}");
        let reset = s.wait_events("offline_queues_reset", 1, LONG);
        assert_eq!(reset.len(), 1, "reported once: {reset:?}");
        assert_eq!(
            (reset[0]["pid"].as_u64(), &reset[0]["queues"]),
            (Some(u64::from(w.pid())), &serde_json::json!([1]))
        );
        assert_eq!(moving(&mut w), [false, false, false], "held, and queue 1 reset");
        assert_eq!(online.cmd(&format!("commit 0 {slot} 1000")).unwrap()["ret"], 0);
        let res = s.wait_transitions("resume", request, LONG);
        // Queue 1 is never resumed: only 0 and 2.
        assert_eq!((res[request - 1]["gpu_id"].as_u64(), res[request - 1]["queues"].as_i64()), (Some(4096), Some(2)));
        assert_eq!(moving(&mut w), [true, false, true], "queue 1 is gone");
    }
    let (lines, stderr) = s.stop();
    let sum = summary(&lines);
    assert_eq!((sum["suspends"].as_u64(), sum["resumes"].as_u64()), (Some(2), Some(2)), "{sum}");
    assert_eq!(sum["queues_reset"], serde_json::json!([{"pid": w.pid(), "queue_id": 1}]), "{sum}");
    let gpu = &sum["gpus"][0];
    assert_eq!((gpu["gpu_id"].as_u64(), gpu["failed_suspends"].as_u64()), (Some(4096), Some(0)), "{sum}");
    let warnings: Vec<&serde_json::Value> = lines.iter().filter(|l| l["event"] == "warning").collect();
    assert!(warnings.is_empty(), "{warnings:?}\n{stderr}");
    let log = kernel_log();
    assert_eq!(log[log_at..].iter().filter(|l| l.contains(" is reset")).count(), 1, "{:#?}", &log[log_at..]);
}

/// `tests/rocm/hip_streams.hip` built by trixie's clang 17 against HIP 5.7 with a gfx942 code
/// object, linked to run on trixie's HIP 5.7 and ROCr 6.1 (xtask/src/rocm6.rs).
fn hip_gfx942() -> PathBuf {
    let exe = gpreempt_tests::binary("hip-streams-gfx942").expect(
        "hip-streams-gfx942 is built by `cargo xtask test` once `cargo xtask setup` unpacked trixie's HIP 5.7 and clang 17",
    );
    // Its fat binary holds one device code object, for gfx942 (clang-offload-bundler's entry ids):
    // ROCr would load no other on a gfx942 agent.
    let bytes = std::fs::read(&exe).unwrap();
    let has = |id: &[u8]| bytes.windows(id.len()).any(|w| w == id);
    assert!(has(b"hipv4-amdgcn-amd-amdhsa--gfx942"), "{}: no gfx942 code object", exe.display());
    assert!(!has(b"amdgcn-amd-amdhsa--gfx90a"), "{}: a gfx90a code object too", exe.display());
    exe
}

/// SPX (one KFD node, gpu 0x1000, all 8 XCCs): HIP 5.7 loads the program's gfx942 code object and
/// runs 3 streams' kernels, events and copies, with HIP 5.7's queues and counts on gfx90a but one
/// difference: ROCclr 5.7 marks hipEventRecord with an AMD barrier-value packet on gfx90a only
/// (rocclr/device/rocm/rocsettings.cpp, rocm-5.7.1: `barrier_value_packet_` when `gcnArch == 910`),
/// so on gfx942 its 6 markers are barrier-AND packets.
#[test]
fn a_hip_5_7_program_with_a_gfx942_code_object_runs_its_streams_on_mi300x_in_spx() {
    let _t = Elapsed::start("a_hip_5_7_program_with_a_gfx942_code_object_runs_its_streams_on_mi300x_in_spx");
    const STREAMS: u64 = 3;
    const BYTES: u64 = 4096;
    let exe = hip_gfx942();
    let _profile = Profile::load(&["profile=mi300x", "partition=spx", "num_gpus=1"]);
    let (streams, bytes) = (STREAMS.to_string(), BYTES.to_string());
    let args = [&*streams, "640", &bytes, "hold"].map(std::ffi::OsStr::new);
    let mut run = rocm_run::RocmRun::start(&exe, &args);
    let pid = run.pid;
    hip::hip_streams_until_holding(&mut run, 1, STREAMS, 640, BYTES);
    // ROCr's utility queue (64 packets), one 16384-packet queue per stream and the null stream's,
    // and ROCr's two SDMA queues: HIP 5.7's on gfx90a.
    let compute = |size| (0x1000, 0, size);
    let sdma = (0x1000, 1, 1 << 20);
    let expect = [compute(4096), compute(1 << 20), compute(1 << 20), compute(1 << 20), compute(1 << 20), sdma, sdma];
    assert_eq!(emulator::sysfs_queues(pid), expect);
    hip::hip_streams_release(&mut run, STREAMS);
    // Measured, the same on every run; as gfx90a's (hip.rs) with barriers_value 2 x STREAMS moved
    // to barriers_and.
    let gpu = emulator::counters(&[
        ("kernels", 2 + STREAMS),
        ("barriers_and", 3 + 2 * STREAMS),
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
    assert_eq!(emulator::cp_stats_since(&run.before), BTreeMap::from([(0x1000, gpu)]));
    run.end();
}

/// CPX (8 KFD nodes of one XCC each): a HIP 5.7 training loop with a gfx942 kernel on partition 3
/// (`ROCR_VISIBLE_DEVICES=3`, gpu 0x1003) of 64,000 work-items per kernel (64 ms at the default
/// 1 µs) is held mid-kernel by `gpreempt preempt`, as the gfx90a HIP 5.7 test is, and its results
/// come back exact; the other 7 partitions executed nothing.
#[test]
fn gpreempt_preempt_suspends_a_hip_5_7_gfx942_program_mid_kernel_on_one_cpx_partition() {
    let _t = Elapsed::start("gpreempt_preempt_suspends_a_hip_5_7_gfx942_program_mid_kernel_on_one_cpx_partition");
    let exe = hip_gfx942();
    let _profile = Profile::load(&["profile=mi300x", "partition=cpx", "num_gpus=1"]);
    // `env` runs the program in its own process (exec): the pid is the program's.
    let args = [std::ffi::OsStr::new("ROCR_VISIBLE_DEVICES=3"), exe.as_os_str(), "offline".as_ref(), "64000".as_ref()];
    let mut run = rocm_run::RocmRun::start(Path::new("/usr/bin/env"), &args);
    let pid = run.pid;
    assert_eq!(run.json_line(), serde_json::json!({"pid": pid, "looping": 1}));
    // Its two KFD queues (ROCr's utility queue, the stream's), both on partition 3, which gpreempt
    // names as such.
    assert_eq!(emulator::sysfs_queues(pid), [(0x1003, 0, 4096), (0x1003, 0, 1 << 20)]);
    let queues = emulator::gpreempt_queues(pid);
    let partition = serde_json::json!({"package": "0000:03:00.0", "index": 3, "count": 8, "mode": "cpx"});
    for q in queues["queues"].as_array().unwrap() {
        assert_eq!((&q["gpu_id"], &q["partition"]), (&serde_json::json!(0x1003), &partition), "{queues}");
    }
    // 5 cycles of 300 ms holds, each suspending and resuming both queues.
    preempt_rocm::preempt_two_queues_5_times(pid);
    let rest = run.finish();
    assert_eq!(rest.len(), 2, "{rest:?}");
    let (_, k, longest) = hip::hip_offline_end(&rest[0], &rest[1]);
    let ns = emulator::ns_per_workitem();
    assert!(longest >= 64_000 * ns + 300_000_000, "no kernel was held mid-way: {}", rest[1]);
    // HIP 5.7's counts of the loop on gfx90a (no events: no marker differs), on partition 3 only.
    let mut expect: BTreeMap<u32, BTreeMap<String, u64>> =
        (0..8).map(|p| (0x1000 + p, emulator::counters(&[]))).collect();
    expect.insert(0x1003, emulator::counters(&hip::hip_5_7_offline_counters(k)));
    assert_eq!(emulator::cp_stats_since(&run.before), expect);
    run.end();
}
