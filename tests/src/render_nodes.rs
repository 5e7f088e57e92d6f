//! amdgpu_emu (the emulated GPUs' render nodes, which ROCr opens beside /dev/kfd) loaded for one
//! test at a time, and the checks its unloading makes: the ROCm tests (`emu_rocm`) and the HIP
//! service of `emu_arrival`.

use std::{
    path::PathBuf,
    process::Command,
    sync::Mutex,
    thread,
    time::{Duration, Instant},
};

use crate::read_sysfs;

/// One test at a time: each loads and unloads amdgpu_emu.
pub static MODULE: Mutex<()> = Mutex::new(());

/// `target/kfd-emu/<release>/amdgpu_emu.ko`, built by xtask beside the loaded kfd_emu.ko.
fn amdgpu_emu_ko() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).expect("test binary outside target/<profile>/deps");
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    target.join("kfd-emu").join(release.trim()).join("amdgpu_emu.ko")
}

pub fn run(cmd: &str, args: &[&str]) -> std::process::Output {
    Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

/// The kernel log's lines so far.
fn kernel_log() -> Vec<String> {
    let out = run("dmesg", &[]);
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
}

/// amdgpu_emu loaded for the guard's life; dropping it unloads it and checks that nothing was left
/// behind: kfd_emu without references (every KFD process released) and no kernel warning.
pub struct RenderNodes {
    log_at: usize,
}

impl RenderNodes {
    pub fn load() -> Self {
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
        // A process's KFD state is released in a workqueue after its last /dev/kfd reference goes
        // (kfd_emu mirrors KFD's kfd_process_wq_release), so its module reference can outlive the
        // render node's for a moment: wait for it within the same deadline (seen: 3 left at once).
        let refcnt = || read_sysfs("/sys/module/kfd_emu/refcnt").unwrap();
        let mut left = refcnt();
        while left != "0\n" && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(100));
            left = refcnt();
        }
        assert_eq!(left, "0\n", "a KFD process or render file left");
        assert!(bad.is_empty(), "kernel log: {bad:#?}");
    }
}
