//! Debian's ROCm 5.2 user space on the emulated GPUs (`tests/kfd-emu`, README "ROCm"): the
//! unmodified `rocminfo` (package `rocminfo`, with `libhsa-runtime64-1` and `libhsakmt1`, which
//! `cargo xtask setup` installs) lists both emulated GPUs as gfx90a agents, through kfd_emu's
//! topology and ioctls and amdgpu_emu's render nodes. Runs in the emulator VM pass of
//! `cargo xtask test`; each test loads amdgpu_emu (built beside kfd_emu) and unloads it at the end,
//! which must leave kfd_emu without references and the kernel log without a warning.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Mutex,
    thread,
    time::{Duration, Instant},
};

use gpreempt_tests::{read_sysfs, wait_kfd_released};

/// One test at a time: each loads and unloads amdgpu_emu.
static MODULE: Mutex<()> = Mutex::new(());

/// `target/kfd-emu/<release>/amdgpu_emu.ko`, built by xtask beside the loaded kfd_emu.ko.
fn amdgpu_emu_ko() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).expect("test binary outside target/<profile>/deps");
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    target.join("kfd-emu").join(release.trim()).join("amdgpu_emu.ko")
}

fn run(cmd: &str, args: &[&str]) -> std::process::Output {
    Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

/// The kernel log's lines so far.
fn kernel_log() -> Vec<String> {
    let out = run("dmesg", &[]);
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
}

/// amdgpu_emu loaded for the guard's life; dropping it unloads it and checks that nothing was left
/// behind: kfd_emu without references (every KFD process released) and no kernel warning.
struct RenderNodes {
    log_at: usize,
}

impl RenderNodes {
    fn load() -> Self {
        let log_at = kernel_log().len();
        // drm.ko (the DRM core amdgpu_emu registers with) left with amdgpu at the pass's start.
        assert!(run("modprobe", &["drm"]).status.success(), "modprobe drm");
        let ko = amdgpu_emu_ko();
        let out = run("insmod", &[ko.to_str().unwrap()]);
        assert!(out.status.success(), "insmod {}: {}", ko.display(), String::from_utf8_lossy(&out.stderr));
        RenderNodes { log_at }
    }
}

impl Drop for RenderNodes {
    fn drop(&mut self) {
        // A released process's last render-file reference drops in delayed_fput (a kworker,
        // a jiffy later): rmmod may find the module busy for that long.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut out = run("rmmod", &["amdgpu_emu"]);
        while !out.status.success() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(100));
            out = run("rmmod", &["amdgpu_emu"]);
        }
        let log = kernel_log();
        let new = log.get(self.log_at..).unwrap_or_default();
        let bad: Vec<&String> =
            new.iter().filter(|l| ["WARNING:", "BUG:", "Oops", "refcount"].iter().any(|w| l.contains(w))).collect();
        if thread::panicking() {
            return;
        }
        assert!(out.status.success(), "rmmod amdgpu_emu: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(read_sysfs("/sys/module/kfd_emu/refcnt").unwrap(), "0\n", "a KFD process or render file left");
        assert!(bad.is_empty(), "kernel log: {bad:#?}");
    }
}

fn topology(node: u32) -> BTreeMap<String, u64> {
    read_sysfs(&format!("/sys/class/kfd/kfd/topology/nodes/{node}/properties"))
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

/// `rocminfo`'s agents: `Agent N` → (`key:` → value) for the agent's top-level lines, plus
/// `Pool N Size` and `ISA 1 Name`.
fn agents(text: &str) -> Vec<BTreeMap<String, String>> {
    let mut agents: Vec<BTreeMap<String, String>> = Vec::new();
    let mut section = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("Agent ") && trimmed[6..].chars().all(|c| c.is_ascii_digit()) {
            agents.push(BTreeMap::new());
            section.clear();
            continue;
        }
        let Some(agent) = agents.last_mut() else { continue };
        if trimmed.starts_with("Pool ") || trimmed.starts_with("ISA ") {
            section = format!("{trimmed} ");
            continue;
        }
        let Some((key, value)) = trimmed.split_once(':') else { continue };
        let key = if line.starts_with("  ") && !line.starts_with("   ") {
            section.clear();
            key.trim().to_owned()
        } else {
            format!("{section}{}", key.trim())
        };
        agent.entry(key).or_insert_with(|| value.trim().to_owned());
    }
    agents
}

#[test]
fn rocminfo_lists_both_emulated_gpus_as_gfx90a_agents() {
    let _one = MODULE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    assert!(Path::new("/usr/bin/rocminfo").exists(), "rocminfo is not installed: run `cargo xtask setup`");
    let nodes = RenderNodes::load();
    // The render nodes the topology names exist (DRM render minors start at 128).
    let minors: Vec<u64> = [1, 2].iter().map(|&n| topology(n)["drm_render_minor"]).collect();
    assert!(minors[0] >= 128 && minors[1] == minors[0] + 1, "render minors {minors:?}");
    for m in &minors {
        assert!(Path::new(&format!("/dev/dri/renderD{m}")).exists(), "/dev/dri/renderD{m}");
    }
    // rocminfo's own check, `lsmod | grep amdgpu`, finds the render-node module.
    let lsmod = String::from_utf8_lossy(&run("lsmod", &[]).stdout).into_owned();
    assert!(lsmod.lines().any(|l| l.starts_with("amdgpu_emu ")), "{lsmod}");

    let child = Command::new("rocminfo").stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "rocminfo: {}\n{text}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("ROCk module is loaded"), "{text}");
    assert!(text.contains("*** Done ***"), "{text}");
    let agents = agents(&text);
    assert_eq!(agents.len(), 3, "a CPU and two GPU agents: {agents:#?}");
    assert_eq!(agents[0]["Device Type"], "CPU");
    assert_eq!(agents[0]["Node"], "0");
    for (gpu, agent) in agents[1..].iter().enumerate() {
        let node = gpu + 1;
        let expect = [
            ("Name", "gfx90a".to_owned()),
            ("Uuid", format!("GPU-4b46445f454d550{node}")),
            ("Marketing Name", "AMD Instinct MI210".to_owned()),
            ("Vendor Name", "AMD".to_owned()),
            ("Feature", "KERNEL_DISPATCH".to_owned()),
            ("Profile", "BASE_PROFILE".to_owned()),
            ("Max Queue Number", "128(0x80)".to_owned()),
            ("Queue Min Size", "64(0x40)".to_owned()),
            ("Queue Max Size", "131072(0x20000)".to_owned()),
            ("Node", node.to_string()),
            ("Device Type", "GPU".to_owned()),
            ("Chip ID", "29711(0x740f)".to_owned()),
            ("Max Clock Freq. (MHz)", "1700".to_owned()),
            ("BDFID", ((2 + node) << 8).to_string()),
            ("Internal Node ID", node.to_string()),
            ("Compute Unit", "304".to_owned()),
            ("SIMDs per CU", "4".to_owned()),
            ("Wavefront Size", "64(0x40)".to_owned()),
            ("L1", "16(0x10) KB".to_owned()),
            ("L2", "8192(0x2000) KB".to_owned()),
            ("Pool 1 Segment", "GLOBAL; FLAGS: COARSE GRAINED".to_owned()),
            ("Pool 1 Size", "67108864(0x4000000) KB".to_owned()),
            ("Pool 2 Segment", "GROUP".to_owned()),
            ("Pool 2 Size", "64(0x40) KB".to_owned()),
            ("ISA 1 Name", "amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-".to_owned()),
        ];
        for (key, value) in expect {
            assert_eq!(agent.get(key), Some(&value), "agent {} {key}: {agent:#?}", node + 1);
        }
    }
    wait_kfd_released(pid).unwrap();
    drop(nodes);
}

#[test]
fn a_rocm_process_killed_mid_run_is_released_and_the_modules_unload() {
    let _one = MODULE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    assert!(Path::new("/usr/bin/rocminfo").exists(), "rocminfo is not installed: run `cargo xtask setup`");
    let nodes = RenderNodes::load();
    let mut child = Command::new("rocminfo").stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let pid = child.id();
    // Killed once it holds /dev/kfd and its render nodes (ACQUIRE_VM follows the open at once).
    let proc_dir = format!("/sys/class/kfd/kfd/proc/{pid}");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !Path::new(&proc_dir).exists() {
        assert!(child.try_wait().unwrap().is_none(), "rocminfo ended before it opened /dev/kfd");
        assert!(Instant::now() < deadline, "rocminfo did not open /dev/kfd within 2 min");
        thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
    wait_kfd_released(pid).unwrap();
    drop(nodes);
}
