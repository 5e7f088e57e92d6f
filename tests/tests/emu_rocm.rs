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

// ---- the ioctls ROCm issues, one by one, with the kernel's answers (README "ROCm") ----

const GPU0: u32 = 0x1000;
const GPU1: u32 = 0x2000;
const NO_GPU: u32 = 0x3000;

const fn ioc(dir: u64, ty: u8, nr: u8, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | ((ty as u64) << 8) | nr as u64
}
const fn iow<T>(ty: u8, nr: u8) -> u64 {
    ioc(1, ty, nr, std::mem::size_of::<T>())
}
const fn iowr<T>(ty: u8, nr: u8) -> u64 {
    ioc(3, ty, nr, std::mem::size_of::<T>())
}

#[repr(C)]
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
struct Apertures {
    lds_base: u64,
    lds_limit: u64,
    scratch_base: u64,
    scratch_limit: u64,
    gpuvm_base: u64,
    gpuvm_limit: u64,
    gpu_id: u32,
    pad: u32,
}
#[repr(C)]
#[derive(Default)]
struct AperturesArgs {
    ptr: u64,
    num_of_nodes: u32,
    pad: u32,
}
#[repr(C)]
#[derive(Default)]
struct AcquireVm {
    drm_fd: u32,
    gpu_id: u32,
}
#[repr(C)]
#[derive(Default)]
struct Alloc {
    va_addr: u64,
    size: u64,
    handle: u64,
    mmap_offset: u64,
    gpu_id: u32,
    flags: u32,
}
#[repr(C)]
#[derive(Default)]
struct Handle {
    handle: u64,
}
#[repr(C)]
#[derive(Default)]
struct MapArgs {
    handle: u64,
    ids: u64,
    n_devices: u32,
    n_success: u32,
}
#[repr(C)]
#[derive(Default)]
struct CreateEvent {
    event_page_offset: u64,
    event_trigger_data: u32,
    event_type: u32,
    auto_reset: u32,
    node_id: u32,
    event_id: u32,
    event_slot_index: u32,
}
#[repr(C)]
#[derive(Default)]
struct EventId {
    event_id: u32,
    pad: u32,
}
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct EventData {
    union: [u64; 4],
    ext: u64,
    event_id: u32,
    pad: u32,
}
#[repr(C)]
#[derive(Default)]
struct WaitEvents {
    events_ptr: u64,
    num_events: u32,
    wait_for_all: u32,
    timeout: u32,
    wait_result: u32,
}
#[repr(C)]
#[derive(Default)]
struct Xnack {
    xnack_enabled: i32,
}
#[repr(C)]
#[derive(Default)]
struct Available {
    available: u64,
    gpu_id: u32,
    pad: u32,
}
#[repr(C)]
#[derive(Default)]
struct Clocks {
    gpu: u64,
    cpu: u64,
    system: u64,
    freq: u64,
    gpu_id: u32,
    pad: u32,
}
#[repr(C)]
#[derive(Default)]
struct MemoryPolicy {
    alternate_base: u64,
    alternate_size: u64,
    gpu_id: u32,
    default_policy: u32,
    alternate_policy: u32,
    pad: u32,
}
/// `struct drm_amdgpu_info`: return pointer and size, query, then a 16-byte union.
#[repr(C)]
#[derive(Default)]
struct AmdgpuInfo {
    return_pointer: u64,
    return_size: u32,
    query: u32,
    dword_offset: u32,
    count: u32,
    instance: u32,
    flags: u32,
}

const K: u8 = b'K';
const SET_MEMORY_POLICY: u64 = iow::<MemoryPolicy>(K, 0x04);
const GET_CLOCK_COUNTERS: u64 = iowr::<Clocks>(K, 0x05);
const CREATE_EVENT: u64 = iowr::<CreateEvent>(K, 0x08);
const DESTROY_EVENT: u64 = iow::<EventId>(K, 0x09);
const SET_EVENT: u64 = iow::<EventId>(K, 0x0A);
const WAIT_EVENTS: u64 = iowr::<WaitEvents>(K, 0x0C);
const GET_PROCESS_APERTURES_NEW: u64 = iowr::<AperturesArgs>(K, 0x14);
const ACQUIRE_VM: u64 = iow::<AcquireVm>(K, 0x15);
const ALLOC_MEMORY_OF_GPU: u64 = iowr::<Alloc>(K, 0x16);
const FREE_MEMORY_OF_GPU: u64 = iow::<Handle>(K, 0x17);
const MAP_MEMORY_TO_GPU: u64 = iowr::<MapArgs>(K, 0x18);
const SET_XNACK_MODE: u64 = iowr::<Xnack>(K, 0x21);
const AVAILABLE_MEMORY: u64 = iowr::<Available>(K, 0x23);
const DRM_AMDGPU_INFO: u64 = iow::<AmdgpuInfo>(b'd', 0x45);

const VRAM: u32 = 1;
const GTT: u32 = 2;
const DOORBELL: u32 = 1 << 3;
const MMIO_REMAP: u32 = 1 << 4;

/// The ioctl's result: 0 or the negated errno.
fn ioctl<T>(fd: i32, request: u64, arg: &mut T) -> i32 {
    // SAFETY: `arg` is a live, exclusively borrowed #[repr(C)] argument of the size `request`
    // encodes; the kernel writes at most that many bytes into it.
    let r = unsafe { libc::ioctl(fd, request as _, arg as *mut T) };
    if r < 0 { -std::io::Error::last_os_error().raw_os_error().unwrap_or(0) } else { r }
}

fn open(path: &str) -> i32 {
    let c = std::ffi::CString::new(path).unwrap();
    // SAFETY: a NUL-terminated path; the fd is closed by the process's exit.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    assert!(fd >= 0, "open {path}: {}", std::io::Error::last_os_error());
    fd
}

/// A shared mapping of `len` bytes of `fd` at `offset`, or the negated errno.
fn map(fd: i32, offset: u64, len: usize) -> Result<*mut u64, i32> {
    // SAFETY: a new shared mapping chosen by the kernel; never unmapped while the test reads it.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, offset as i64)
    };
    if p == libc::MAP_FAILED { Err(-std::io::Error::last_os_error().raw_os_error().unwrap_or(0)) } else { Ok(p.cast()) }
}

fn alloc(kfd: i32, gpu_id: u32, size: u64, flags: u32) -> (i32, Alloc) {
    let mut a = Alloc { size, gpu_id, flags, ..Default::default() };
    (ioctl(kfd, ALLOC_MEMORY_OF_GPU, &mut a), a)
}

fn wait(kfd: i32, events: &mut [EventData], timeout_ms: u32) -> (i32, u32) {
    let mut w = WaitEvents {
        events_ptr: events.as_mut_ptr() as u64,
        num_events: events.len() as u32,
        timeout: timeout_ms,
        ..Default::default()
    };
    (ioctl(kfd, WAIT_EVENTS, &mut w), w.wait_result)
}

/// Set in the child that runs [`ioctl_sequence`]: its KFD process (and the render files
/// ACQUIRE_VM keeps) lives until the process exits, which the parent then checks.
const IOCTL_CHILD: &str = "GPREEMPT_EMU_ROCM_IOCTL_CHILD";
const IOCTL_TEST: &str = "rocms_open_memory_and_event_ioctls_have_the_kernels_answers";

#[test]
fn rocms_open_memory_and_event_ioctls_have_the_kernels_answers() {
    if std::env::var_os(IOCTL_CHILD).is_some() {
        ioctl_sequence();
        return;
    }
    let _one = MODULE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let nodes = RenderNodes::load();
    run_in_child(IOCTL_TEST, IOCTL_CHILD);
    drop(nodes);
}

/// Run this binary's `test` again in a child process with `env` set, where the test runs its
/// sequence (the child's KFD process lives until it exits); assert that it passed and wait for
/// its KFD process to be released.
fn run_in_child(test: &str, env: &str) {
    let child = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(env, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // Its libtest lines are renamed so that the harness, which sums every "test result:" line of
    // the log, counts this test once.
    let shown = text.replace("test result:", "child result:");
    assert!(out.status.success(), "{test} in a child failed:\n{shown}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("1 passed"), "{shown}");
    wait_kfd_released(pid).unwrap();
}

/// The ioctl sequence, in a child process of its own (see [`IOCTL_CHILD`]).
fn ioctl_sequence() {
    let (einval, enodev, ebusy, enomem, eperm, efault, eacces) =
        (-libc::EINVAL, -libc::ENODEV, -libc::EBUSY, -libc::ENOMEM, -libc::EPERM, -libc::EFAULT, -libc::EACCES);
    let minor = |node| topology(node)["drm_render_minor"];
    let render0 = open(&format!("/dev/dri/renderD{}", minor(1)));

    // libdrm's amdgpu_device_initialize() questions, on the render node.
    let mut dev_info = [0u32; 64];
    let mut info = AmdgpuInfo {
        return_pointer: dev_info.as_mut_ptr() as u64,
        return_size: 256,
        query: 0x16, // AMDGPU_INFO_DEV_INFO
        ..Default::default()
    };
    assert_eq!(ioctl(render0, DRM_AMDGPU_INFO, &mut info), 0);
    // device_id, chip_rev, external_rev, pci_rev, family, shader engines, arrays per engine
    assert_eq!(dev_info[..7], [0x740f, 0, 0x3c, 2, 141, 8, 2]);
    let mut reg = 0u32;
    info = AmdgpuInfo {
        return_pointer: &mut reg as *mut u32 as u64,
        return_size: 4,
        query: 0x15, // AMDGPU_INFO_READ_MMR_REG
        dword_offset: 0x263e,
        count: 1,
        instance: 0xffff_ffff,
        ..Default::default()
    };
    assert_eq!((ioctl(render0, DRM_AMDGPU_INFO, &mut info), reg), (0, 0x2201_4042));
    info.dword_offset = 0x263d;
    assert_eq!(ioctl(render0, DRM_AMDGPU_INFO, &mut info), efault, "a register outside the readable set");
    info.query = 0x7f;
    assert_eq!(ioctl(render0, DRM_AMDGPU_INFO, &mut info), einval, "an unknown query");
    assert_eq!(map(render0, 1 << 32, 4096).err(), Some(eacces), "an offset with no object");

    let kfd = open("/dev/kfd");
    let mut args = AperturesArgs::default();
    assert_eq!((ioctl(kfd, GET_PROCESS_APERTURES_NEW, &mut args), args.num_of_nodes), (0, 2));
    let mut apertures = [Apertures::default(); 2];
    args.ptr = apertures.as_mut_ptr() as u64;
    assert_eq!(ioctl(kfd, GET_PROCESS_APERTURES_NEW, &mut args), 0);
    for (a, gpu_id) in apertures.iter().zip([GPU0, GPU1]) {
        let expect = Apertures {
            lds_base: 1 << 48,
            lds_limit: (1 << 48) | 0xffff_ffff,
            scratch_base: 2 << 48,
            scratch_limit: (2 << 48) | 0xffff_ffff,
            gpuvm_base: 1 << 16,
            gpuvm_limit: (1 << 47) - 1,
            gpu_id,
            pad: 0,
        };
        assert_eq!(*a, expect);
    }

    assert_eq!(alloc(kfd, GPU0, 8192, GTT).0, enodev, "no VM acquired yet");
    let null = open("/dev/null");
    let render1 = open(&format!("/dev/dri/renderD{}", minor(2)));
    let acquire = |fd: i32, gpu_id| ioctl(kfd, ACQUIRE_VM, &mut AcquireVm { drm_fd: fd as u32, gpu_id });
    assert_eq!(acquire(-1, GPU0), einval, "a bad fd");
    assert_eq!(acquire(null, GPU0), einval, "not a render node");
    assert_eq!(acquire(render1, GPU0), einval, "the other GPU's render node");
    assert_eq!(acquire(render0, NO_GPU), einval, "an unknown gpu");
    assert_eq!(acquire(render0, GPU0), 0);
    assert_eq!(acquire(render0, GPU0), 0, "the same file again");
    assert_eq!(acquire(open(&format!("/dev/dri/renderD{}", minor(1))), GPU0), ebusy, "another file");
    assert_eq!(acquire(render1, GPU1), 0);

    let mut policy = MemoryPolicy { gpu_id: GPU0, default_policy: 2, ..Default::default() };
    assert_eq!(ioctl(kfd, SET_MEMORY_POLICY, &mut policy), einval, "policy 2");
    policy = MemoryPolicy { gpu_id: NO_GPU, ..Default::default() };
    assert_eq!(ioctl(kfd, SET_MEMORY_POLICY, &mut policy), einval, "an unknown gpu");
    policy.gpu_id = GPU0;
    assert_eq!(ioctl(kfd, SET_MEMORY_POLICY, &mut policy), 0);
    let mut clocks = Clocks { gpu_id: GPU0, ..Default::default() };
    assert_eq!(ioctl(kfd, GET_CLOCK_COUNTERS, &mut clocks), 0);
    assert!(
        clocks.gpu > 0 && clocks.cpu > clocks.gpu,
        "the GPU counter runs at 100 MHz: {} / {}",
        clocks.gpu,
        clocks.cpu
    );
    assert_eq!(clocks.freq, 1_000_000_000);
    clocks = Clocks { gpu_id: NO_GPU, ..Default::default() };
    assert_eq!((ioctl(kfd, GET_CLOCK_COUNTERS, &mut clocks), clocks.gpu), (0, 0), "an unknown gpu reads 0");
    let mut xnack = Xnack { xnack_enabled: -1 };
    assert_eq!((ioctl(kfd, SET_XNACK_MODE, &mut xnack), xnack.xnack_enabled), (0, 0));
    assert_eq!(ioctl(kfd, SET_XNACK_MODE, &mut Xnack { xnack_enabled: 1 }), eperm);
    assert_eq!(ioctl(kfd, SET_XNACK_MODE, &mut Xnack { xnack_enabled: 0 }), 0);

    // Memory: errnos, handles, a GTT object seen through two CPU mappings.
    assert_eq!(alloc(kfd, GPU0, 0, GTT).0, einval, "size 0");
    assert_eq!(alloc(kfd, NO_GPU, 8192, GTT).0, einval, "an unknown gpu");
    assert_eq!(alloc(kfd, GPU0, 4096, DOORBELL).0, einval, "a doorbell object is the 8 KiB slice");
    assert_eq!(alloc(kfd, GPU0, 4096, MMIO_REMAP).0, enomem, "no MMIO remap page");
    let (r, gtt) = alloc(kfd, GPU0, 8192, GTT);
    assert_eq!(r, 0);
    assert_eq!(gtt.handle >> 32, u64::from(GPU0));
    assert!(gtt.mmap_offset >= 1 << 32, "a DRM vma offset: {:#x}", gtt.mmap_offset);
    let a = map(render0, gtt.mmap_offset, 8192).unwrap();
    let b = map(render0, gtt.mmap_offset, 8192).unwrap();
    // SAFETY: both are live 8 KiB mappings of the same object.
    unsafe {
        a.add(1000).write_volatile(0x5eed_0000_0000_0001);
        assert_eq!(b.add(1000).read_volatile(), 0x5eed_0000_0000_0001);
    }
    assert_eq!(map(render0, gtt.mmap_offset, 3 * 4096).err(), Some(einval), "past the object's end");
    assert_eq!(map(render1, gtt.mmap_offset, 4096).err(), Some(eacces), "the other GPU's render node");
    let mut m = MapArgs { handle: gtt.handle, n_devices: 0, ..Default::default() };
    assert_eq!(ioctl(kfd, MAP_MEMORY_TO_GPU, &mut m), einval, "no devices");
    let ids = [GPU0, NO_GPU];
    m = MapArgs { handle: gtt.handle, ids: ids.as_ptr() as u64, n_devices: 2, n_success: 0 };
    assert_eq!((ioctl(kfd, MAP_MEMORY_TO_GPU, &mut m), m.n_success), (einval, 1), "an unknown device second");
    let ids = [GPU0, GPU1];
    m = MapArgs { handle: gtt.handle, ids: ids.as_ptr() as u64, n_devices: 2, n_success: 1 };
    assert_eq!((ioctl(kfd, MAP_MEMORY_TO_GPU, &mut m), m.n_success), (0, 2), "resumed at n_success");
    m.handle = (u64::from(GPU0) << 32) | 999;
    m.n_success = 0;
    assert_eq!(ioctl(kfd, MAP_MEMORY_TO_GPU, &mut m), enomem, "an unknown object");
    let mut avail = Available { gpu_id: GPU0, ..Default::default() };
    assert_eq!((ioctl(kfd, AVAILABLE_MEMORY, &mut avail), avail.available), (0, 64 << 30));
    let (r, vram) = alloc(kfd, GPU0, 1 << 20, VRAM);
    assert_eq!(r, 0);
    assert_eq!((ioctl(kfd, AVAILABLE_MEMORY, &mut avail), avail.available), (0, (64 << 30) - (1 << 20)));
    assert_eq!(alloc(kfd, GPU0, 64 << 30, VRAM).0, enomem, "beyond the 64 GiB");
    assert_eq!(ioctl(kfd, FREE_MEMORY_OF_GPU, &mut Handle { handle: vram.handle }), 0);
    assert_eq!(ioctl(kfd, FREE_MEMORY_OF_GPU, &mut Handle { handle: vram.handle }), einval, "freed twice");

    // Events: the first CREATE names the event page (a 32 KiB GTT object, 4096 slots).
    let (r, page) = alloc(kfd, GPU0, 32768, GTT);
    assert_eq!(r, 0);
    let slots = map(render0, page.mmap_offset, 32768).unwrap();
    let mut ev = CreateEvent { event_page_offset: page.handle, auto_reset: 1, ..Default::default() };
    assert_eq!(ioctl(kfd, CREATE_EVENT, &mut ev), 0);
    assert_eq!((ev.event_id, ev.event_slot_index, ev.event_trigger_data), (0, 0, 0));
    assert_eq!(ev.event_page_offset, 2 << 62, "KFD_MMAP_TYPE_EVENTS");
    // SAFETY: slot 0 of the live event page mapping.
    assert_eq!(unsafe { slots.read_volatile() }, u64::MAX, "UNSIGNALED_EVENT_SLOT");
    let mut again = CreateEvent { event_page_offset: page.handle, ..Default::default() };
    assert_eq!(ioctl(kfd, CREATE_EVENT, &mut again), einval, "the event page is already set");
    let mut other = CreateEvent { event_type: 8, ..Default::default() }; // KFD_IOC_EVENT_MEMORY
    assert_eq!((ioctl(kfd, CREATE_EVENT, &mut other), other.event_id), (0, 4096), "non-signal ids from 4096");
    assert_eq!(other.event_page_offset, 0);
    assert_eq!(ioctl(kfd, FREE_MEMORY_OF_GPU, &mut Handle { handle: page.handle }), eperm, "the event page");
    let mut events = [EventData { event_id: 0, ..Default::default() }];
    assert_eq!(wait(kfd, &mut events, 0), (0, 1), "not signalled: TIMEOUT");
    assert_eq!(ioctl(kfd, SET_EVENT, &mut EventId { event_id: other.event_id, pad: 0 }), einval, "not a signal event");
    assert_eq!(ioctl(kfd, SET_EVENT, &mut EventId { event_id: 77, pad: 0 }), einval, "no such event");
    assert_eq!(wait(kfd, &mut [EventData { event_id: 77, ..Default::default() }], 0).0, einval);
    assert_eq!(ioctl(kfd, SET_EVENT, &mut EventId { event_id: 0, pad: 0 }), 0);
    assert_eq!(wait(kfd, &mut events, 0), (0, 0), "signalled: COMPLETE");
    assert_eq!(wait(kfd, &mut events, 0), (0, 1), "auto-reset: consumed by the first wait");
    // A blocked waiter wakes when another thread sets the event.
    let waiter = thread::spawn(move || {
        let started = Instant::now();
        let mut events = [EventData { event_id: 0, ..Default::default() }];
        (wait(kfd, &mut events, 60_000), started.elapsed())
    });
    thread::sleep(Duration::from_millis(300));
    assert_eq!(ioctl(kfd, SET_EVENT, &mut EventId { event_id: 0, pad: 0 }), 0);
    let (result, took) = waiter.join().unwrap();
    assert_eq!(result, (0, 0));
    assert!(took < Duration::from_secs(60), "woken by SET_EVENT, not the timeout: {took:?}");
    assert_eq!(ioctl(kfd, DESTROY_EVENT, &mut EventId { event_id: 0, pad: 0 }), 0);
    assert_eq!(ioctl(kfd, DESTROY_EVENT, &mut EventId { event_id: 0, pad: 0 }), einval, "destroyed twice");
    assert_eq!(ioctl(kfd, FREE_MEMORY_OF_GPU, &mut Handle { handle: gtt.handle }), 0);
    // The rest (the event page, another event, the files, the mappings) goes with the process.
}

/// The queues of `pid` in KFD's sysfs: (gpuid, type, size) of each, sorted.
fn sysfs_queues(pid: u32) -> Vec<(u32, u32, u64)> {
    let dir = format!("/sys/class/kfd/kfd/proc/{pid}/queues");
    let mut queues: Vec<(u32, u32, u64)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let q = e.unwrap().path();
            let read = |f: &str| std::fs::read_to_string(q.join(f)).unwrap().trim().to_owned();
            (read("gpuid").parse().unwrap(), read("type").parse().unwrap(), read("size").parse().unwrap())
        })
        .collect();
    queues.sort_unstable();
    queues
}

#[test]
fn rocm_hsa_queue_create_makes_kfd_queues_on_both_gpus_with_rocrs_amd_queue_t() {
    use std::io::{BufRead, BufReader, Write};

    let _one = MODULE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let exe = gpreempt_tests::binary("hsa-queues").expect(
        "tests/rocm/hsa_queues.c is built by `cargo xtask test` once `cargo xtask setup` installed libhsa-runtime-dev",
    );
    let nodes = RenderNodes::load();
    let mut child = Command::new(exe)
        .args(["1024", "hold"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut queues = Vec::new();
    loop {
        let line = lines.next().expect("hsa-queues ended before holding its queues").unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        if v.get("holding").is_some() {
            assert_eq!(v["holding"], 2);
            break;
        }
        queues.push(v);
    }
    assert_eq!(queues.len(), 2, "{queues:?}");
    for (i, q) in queues.iter().enumerate() {
        assert_eq!(q["pid"], pid);
        assert_eq!(q["agent"], "gfx90a");
        assert_eq!(q["node"], i + 1);
        assert_eq!(q["size"], 1024);
        // ROCr's amd_queue_t: the offsets gpreempt's scheduler reads the indices at.
        assert_eq!(
            (q["write_dispatch_id_offset"].as_u64(), q["read_dispatch_id_offset"].as_u64()),
            (Some(0x38), Some(0x80))
        );
        assert_eq!((q["write_dispatch_id"].as_u64(), q["read_dispatch_id"].as_u64()), (Some(0), Some(0)));
    }
    // What ROCr 5.2 created in KFD for the two hsa_queue_create calls (type 0: compute): on each
    // GPU the 1024-packet queue asked for (64 KiB ring) and a 64-packet one of its own (4 KiB).
    assert_eq!(
        sysfs_queues(pid),
        [(GPU0, 0, 64 * 64), (GPU0, 0, 1024 * 64), (GPU1, 0, 64 * 64), (GPU1, 0, 1024 * 64)],
        "queues of pid {pid}"
    );
    // gpreempt's own view of them (sysfs, no debug trap: ROCr 5.2 never calls RUNTIME_ENABLE).
    let out = Command::new(gpreempt_tests::binary("gpreempt").unwrap())
        .args(["queues", &pid.to_string(), "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "gpreempt queues: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["source"], "sysfs", "{v}");
    assert_eq!(v["pid"], pid, "{v}");
    let mut listed: Vec<(u64, u64)> = v["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| (q["gpu_id"].as_u64().unwrap(), q["ring_size"].as_u64().unwrap()))
        .collect();
    listed.sort_unstable();
    assert_eq!(
        listed,
        [(4096, 64 * 64), (4096, 1024 * 64), (8192, 64 * 64), (8192, 1024 * 64)],
        "two KFD queues per hsa_queue_create: {v}"
    );
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "hsa-queues: {status}\n{stderr}");
    assert_eq!(rest.last().map(String::as_str), Some(r#"{"gpus":2,"done":true}"#));
    wait_kfd_released(pid).unwrap();
    drop(nodes);
}

// ---- ROCr's packets executed by the emulated CP (README "ROCm's packets") ----

/// `/sys/kernel/kfd_emu/cp_stats`: gpu id → counter → what that GPU's CP executed so far.
fn cp_stats() -> BTreeMap<u32, BTreeMap<String, u64>> {
    read_sysfs("/sys/kernel/kfd_emu/cp_stats")
        .unwrap()
        .lines()
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let counters: BTreeMap<String, u64> =
                words.chunks(2).map(|kv| (kv[0].to_owned(), kv[1].parse().unwrap())).collect();
            (counters["gpu_id"] as u32, counters)
        })
        .collect()
}

/// What each GPU's CP executed between two [`cp_stats`] readings (`gpu_id` left out).
fn cp_stats_since(before: &BTreeMap<u32, BTreeMap<String, u64>>) -> BTreeMap<u32, BTreeMap<String, u64>> {
    cp_stats()
        .into_iter()
        .map(|(gpu, after)| {
            let delta =
                after.iter().filter(|(k, _)| *k != "gpu_id").map(|(k, v)| (k.clone(), v - before[&gpu][k])).collect();
            (gpu, delta)
        })
        .collect()
}

/// The counters a [`cp_stats_since`] GPU entry must show, all others 0.
fn counters(nonzero: &[(&str, u64)]) -> BTreeMap<String, u64> {
    let mut all: BTreeMap<String, u64> = [
        "dispatches",
        "kernels",
        "barriers_and",
        "barriers_or",
        "barriers_value",
        "pm4_ibs",
        "signals",
        "interrupts",
        "events_set",
        "errors",
        "sdma_copies",
        "sdma_bytes",
        "sdma_fills",
        "sdma_fences",
        "sdma_traps",
        "sdma_atomics",
        "sdma_polls",
        "sdma_timestamps",
    ]
    .iter()
    .map(|k| ((*k).to_owned(), 0))
    .collect();
    for (k, v) in nonzero {
        all.insert((*k).to_owned(), *v);
    }
    all
}

fn hsa_dispatch() -> (PathBuf, PathBuf) {
    let exe = gpreempt_tests::binary("hsa-dispatch").expect(
        "tests/rocm/hsa_dispatch.c is built by `cargo xtask test` once `cargo xtask setup` installed libhsa-runtime-dev",
    );
    let hsaco = gpreempt_tests::binary("hsa-dispatch-kernel.hsaco").expect(
        "the gfx90a code object is built by `cargo xtask test` once `cargo xtask setup` installed clang-15 and lld-15",
    );
    (exe, hsaco)
}

fn ns_per_workitem() -> u64 {
    read_sysfs("/sys/module/kfd_emu/parameters/ns_per_workitem").unwrap().trim().parse().unwrap()
}

/// `exe ARGS` with piped stdin, stdout and stderr.
fn spawn_piped<I, S>(exe: &Path, args: I) -> std::process::Child
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    Command::new(exe)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", exe.display()))
}

/// A ROCm program run by a test: the one-test-at-a-time lock, amdgpu_emu loaded, `cp_stats`
/// before the program started, and the program with piped stdin, stdout (read as lines) and
/// stderr. [`RocmRun::end`] unloads amdgpu_emu (with its checks) before releasing the lock.
struct RocmRun {
    child: std::process::Child,
    pid: u32,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    before: BTreeMap<u32, BTreeMap<String, u64>>,
    nodes: RenderNodes,
    one: std::sync::MutexGuard<'static, ()>,
}

impl RocmRun {
    fn start(exe: &Path, args: &[&std::ffi::OsStr]) -> Self {
        let one = MODULE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let nodes = RenderNodes::load();
        let before = cp_stats();
        let mut child = spawn_piped(exe, args);
        let pid = child.id();
        let lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
        RocmRun { child, pid, lines, before, nodes, one }
    }

    /// The program's next stdout line; a program that ended instead fails with its stderr.
    fn line(&mut self) -> String {
        match self.lines.next() {
            Some(line) => line.unwrap(),
            None => {
                let status = self.child.wait().unwrap();
                let mut stderr = String::new();
                std::io::Read::read_to_string(&mut self.child.stderr.take().unwrap(), &mut stderr).unwrap();
                panic!("the program ended ({status}) before its next line:\n{stderr}");
            }
        }
    }

    /// Every line left, the exit status (asserted successful, with stderr) and the program's
    /// KFD process released.
    fn finish(&mut self) -> Vec<String> {
        drop(self.child.stdin.take());
        let rest: Vec<String> = self.lines.by_ref().map(Result::unwrap).collect();
        let status = self.child.wait().unwrap();
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut self.child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(status.success(), "{status}\n{}\n{stderr}", rest.join("\n"));
        wait_kfd_released(self.pid).unwrap();
        rest
    }

    fn json_line(&mut self) -> serde_json::Value {
        let line = self.line();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    /// `hsa-dispatch requests`: start them (a line on stdin), read the `n` requests' lines and the
    /// last one, and end the program (asserted successful, its KFD process released).
    fn requests(&mut self, n: usize) -> Vec<serde_json::Value> {
        self.requests_then(n, serde_json::json!({"completed": n, "read_index": n, "done": true}))
    }

    /// `requests` of a program whose last line is `last` (`hip-streams requests` has no read index).
    fn requests_then(&mut self, n: usize, last: serde_json::Value) -> Vec<serde_json::Value> {
        std::io::Write::write_all(self.child.stdin.as_mut().unwrap(), b"go\n").unwrap();
        let requests: Vec<serde_json::Value> = (0..n).map(|_| self.json_line()).collect();
        assert_eq!(self.json_line(), last);
        assert_eq!(self.finish(), Vec::<String>::new());
        requests
    }

    fn end(self) {
        let RocmRun { nodes, one, .. } = self;
        drop(nodes);
        drop(one);
    }
}

fn hsa_dispatch_run(args: &[&str]) -> RocmRun {
    let (exe, hsaco) = hsa_dispatch();
    let mut all: Vec<&std::ffi::OsStr> = vec![hsaco.as_os_str()];
    all.extend(args.iter().map(std::ffi::OsStr::new));
    RocmRun::start(&exe, &all)
}

#[test]
fn rocm_dispatches_barriers_and_interrupt_signals_complete_on_the_emulated_cp() {
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

#[test]
fn amd_barrier_value_packets_wait_for_their_condition_and_an_unknown_condition_stops_the_queue() {
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

#[test]
fn an_agent_dispatch_packet_stops_a_rocm_queue_with_a_packet_exception_not_a_warning() {
    // Not consumed, not completed (500 ms later): EC_QUEUE_PACKET_UNSUPPORTED on the first
    // GPU's queue, nothing executed; the queue is destroyed cleanly afterwards.
    hand_written_packets(
        "bad",
        serde_json::json!({"bad": {"value": 1, "read_index": 0, "write_index": 1}}),
        &[("errors", 1)],
    );
}

#[test]
fn a_rocm_process_killed_mid_dispatch_is_released_and_the_modules_unload() {
    // One dispatch of 10^7 work-items: 10 s at the default 1 µs each, killed long before its end.
    let mut run = hsa_dispatch_run(&["hold", "10000000"]);
    let pid = run.pid;
    assert_eq!(run.line(), format!(r#"{{"pid":{pid},"dispatched":1}}"#));
    // The code object is loaded (its blit copy done) once the line is out: the CUs are busy
    // with the one dispatch left.
    let occupancy = format!("/sys/class/kfd/kfd/proc/{pid}/stats_{GPU0}/cu_occupancy");
    let deadline = Instant::now() + Duration::from_secs(120);
    while read_sysfs(&occupancy).unwrap() != "304\n" {
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

#[test]
fn gpreempt_preempt_refuses_rocm_5_2_with_the_cause_and_its_dispatches_all_complete() {
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

// ---- HIP (Debian's hipcc; bookworm's HIP 5.2, trixie's 5.7) on the emulated GPU (README "HIP") ----

/// `tests/rocm/hip_streams.hip` as built by bookworm's hipcc: on bookworm's HIP 5.2 and ROCr 5.2
/// (`hip-streams`) or trixie's HIP 5.7 and ROCr 6.1 (`hip-streams-6`).
#[derive(Clone, Copy, Debug)]
enum Hip {
    V5_2,
    V5_7,
}

impl Hip {
    fn exe(self) -> PathBuf {
        let (name, how) = match self {
            Hip::V5_2 => ("hip-streams", "once `cargo xtask setup` installed hipcc and libamdhip64-dev"),
            Hip::V5_7 => ("hip-streams-6", "once `cargo xtask setup` unpacked trixie's HIP 5.7 and ROCm 6.1"),
        };
        gpreempt_tests::binary(name).unwrap_or_else(|e| panic!("{name} is built by `cargo xtask test` {how}: {e}"))
    }
}

fn hip_run(hip: Hip, args: &[&str]) -> RocmRun {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    RocmRun::start(&hip.exe(), &args)
}

fn hip_streams_run(args: &[&str]) -> RocmRun {
    hip_run(Hip::V5_2, args)
}

/// `hip-streams STREAMS GRID BYTES hold` up to its `holding` line: its first line, then per
/// stream the kernel's emulated time (grid x ns_per_workitem) between the stream's two events and
/// every byte of the hipMemcpy round trip back, in the stream's pattern.
fn hip_streams_until_holding(run: &mut RocmRun, streams: u64, grid: u64, bytes: u64) {
    let pid = run.pid;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&run.line()).unwrap(),
        serde_json::json!({"pid": pid, "devices": 2, "streams": streams})
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
fn hip_streams_release(run: &mut RocmRun, streams: u64) {
    if let Some(stdin) = run.child.stdin.as_mut() {
        std::io::Write::write_all(stdin, b"go\n").unwrap();
    }
    assert_eq!(run.finish(), [format!(r#"{{"streams":{streams},"done":true}}"#)]);
}

/// hip-streams' per-stream pattern (`host[k] = k * 131 + stream * 17 + 7`, as bytes).
fn hip_pattern(stream: u64, k: u64) -> u64 {
    (k * 131 + stream * 17 + 7) & 0xff
}

#[test]
fn a_rocm_hip_program_with_streams_events_and_copies_runs_to_completion_on_the_emulated_gpu() {
    const STREAMS: u64 = 3;
    const BYTES: u64 = 4096;
    let grid = 640u64;
    let mut run = hip_streams_run(&[&STREAMS.to_string(), &grid.to_string(), &BYTES.to_string(), "hold"]);
    let pid = run.pid;
    hip_streams_until_holding(&mut run, STREAMS, grid, BYTES);
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
    let out = Command::new(gpreempt_tests::binary("gpreempt").unwrap())
        .args(["queues", &pid.to_string(), "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "gpreempt queues: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
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

#[test]
fn a_rocm_hip_program_killed_with_its_sdma_queues_is_released_and_the_modules_unload() {
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

#[test]
fn a_hip_5_7_program_on_rocr_6_1_runs_its_streams_with_barrier_value_markers_and_sdma_copies() {
    const STREAMS: u64 = 3;
    const BYTES: u64 = 4096;
    // The same program, built by bookworm's hipcc, on trixie's HIP 5.7 and ROCr 6.1.
    let mut run = hip_run(Hip::V5_7, &[&STREAMS.to_string(), "640", &BYTES.to_string(), "hold"]);
    let pid = run.pid;
    hip_streams_until_holding(&mut run, STREAMS, 640, BYTES);
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
fn hip_5_7_offline_counters(k: u64) -> Vec<(&'static str, u64)> {
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
fn hip_offline_end(ends: &str, done: &str) -> (Vec<u64>, u64, u64) {
    let ends: serde_json::Value = serde_json::from_str(ends).unwrap();
    let done: serde_json::Value = serde_json::from_str(done).unwrap();
    let k = done["completed"].as_u64().expect("completed");
    let ends: Vec<u64> = ends["ends_ns"].as_array().unwrap().iter().map(|e| e.as_u64().unwrap()).collect();
    assert_eq!(ends.len() as u64, k);
    let expect = serde_json::json!({"completed": k, "longest_ns": done["longest_ns"], "bytes": 4096, "equal": 4096, "done": true});
    assert_eq!(done, expect);
    (ends, k, done["longest_ns"].as_u64().unwrap())
}

#[test]
fn gpreempt_preempt_suspends_a_hip_5_7_program_mid_kernel_and_its_results_come_back_exact() {
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

// ---- the SDMA engines' packets, written by hand (README "SDMA") ----

/// Set in the child that runs [`sdma_sequence`] (its KFD process lives until it exits).
const SDMA_CHILD: &str = "GPREEMPT_EMU_ROCM_SDMA_CHILD";
const SDMA_TEST: &str = "rocm_sdma_packets_move_bytes_wait_and_stop_the_queue_on_an_unknown_op";

#[test]
fn rocm_sdma_packets_move_bytes_wait_and_stop_the_queue_on_an_unknown_op() {
    if std::env::var_os(SDMA_CHILD).is_some() {
        sdma_sequence();
        return;
    }
    let _one = MODULE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let nodes = RenderNodes::load();
    let before = cp_stats();
    run_in_child(SDMA_TEST, SDMA_CHILD);
    // One of each packet, the copy's 1000 bytes; the unknown op stopped the queue (one error).
    let gpu0 = counters(&[
        ("sdma_copies", 1),
        ("sdma_bytes", 1000),
        ("sdma_fills", 1),
        ("sdma_fences", 1),
        ("sdma_atomics", 1),
        ("sdma_timestamps", 1),
        ("sdma_polls", 1),
        ("errors", 1),
    ]);
    assert_eq!(cp_stats_since(&before), BTreeMap::from([(GPU0, gpu0), (GPU1, counters(&[]))]));
    drop(nodes);
}

/// The SDMA sequence, in a child process of its own (see [`SDMA_CHILD`]): a 4 KiB SDMA queue on
/// the first GPU whose ring, pointers and data live in one anonymous mapping of the process.
fn sdma_sequence() {
    use gpreempt::kfd::uapi;
    use std::sync::atomic::{AtomicU64, Ordering};

    const RING: usize = 4096;
    let page = 4096usize;
    // SAFETY: a new private anonymous mapping of 4 pages, never unmapped (the process exits).
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4 * page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    let base = base.cast::<u8>();
    let ring = base.cast::<u32>();
    // SAFETY: inside the live 4-page mapping, 8-byte aligned; the kernel updates rptr atomically.
    let (rptr, wptr) = unsafe { (&*base.add(page).cast::<AtomicU64>(), &*base.add(page + 8).cast::<AtomicU64>()) };
    // SAFETY: offsets inside the live 4-page mapping, aligned for their types.
    let (fence, atomic, stamp, gate) = unsafe {
        (
            base.add(page + 64).cast::<u32>(),
            base.add(page + 128).cast::<u64>(),
            base.add(page + 192).cast::<u64>(),
            base.add(page + 256).cast::<u32>(),
        )
    };
    // SAFETY: pages 2 and 3 of the live mapping.
    let (src, dst) = unsafe { (base.add(2 * page), base.add(3 * page)) };
    // SAFETY: src's 1000 bytes and the u64 at `atomic` are inside the mapping; no queue yet.
    unsafe {
        for k in 0..1000 {
            src.add(k).write((k * 7 + 1) as u8);
        }
        atomic.write(1);
    }
    let kfd = std::fs::OpenOptions::new().read(true).write(true).open("/dev/kfd").unwrap();
    let mut args = uapi::CreateQueueArgsV17 {
        base: uapi::CreateQueueArgs {
            ring_base_address: ring as u64,
            write_pointer_address: wptr as *const AtomicU64 as u64,
            read_pointer_address: rptr as *const AtomicU64 as u64,
            ring_size: RING as u32,
            gpu_id: GPU0,
            queue_type: uapi::queue_type::SDMA,
            queue_percentage: 100,
            queue_priority: 7,
            ..Default::default()
        },
        ..Default::default()
    };
    // SAFETY: `args` is the ioctl's argument struct, alive for the call.
    unsafe { uapi::create_queue(std::os::fd::AsRawFd::as_raw_fd(&kfd), &mut args) }.unwrap();
    let lo = |p: u64| p as u32;
    let hi = |p: u64| (p >> 32) as u32;
    let (s, d, f, a, t, g) = (src as u64, dst as u64, fence as u64, atomic as u64, stamp as u64, gate as u64);
    // SDMA 4 packets (vega10_sdma_pkt_open.h): COPY_LINEAR (count = bytes - 1), CONST_FILL of
    // 64 bytes after the copy, FENCE, ATOMIC ADD64 of -1, GET_GLOBAL_TIMESTAMP, then a memory
    // POLL_REGMEM (func 3: equal) for gate == 7.
    let minus_one = (-1i64) as u64;
    let mut packets: Vec<u32> = vec![1, 999, 0, lo(s), hi(s), lo(d), hi(d)];
    packets.extend([11 | (2 << 30), lo(d + 1000), hi(d + 1000), 0xa5a5_a5a5, 63]);
    packets.extend([5, lo(f), hi(f), 0x2015]);
    packets.extend([10 | (47 << 25), lo(a), hi(a), lo(minus_one), hi(minus_one), 0, 0, 0]);
    packets.extend([13 | (2 << 8), lo(t), hi(t)]);
    let poll_at = packets.len() * 4;
    packets.extend([8 | (3 << 28) | (1 << 31), lo(g), hi(g), 7, 0xffff_ffff, 10 | (0xfff << 16)]);
    let end = packets.len() * 4;
    // an op the engine does not know (4, INDIRECT_BUFFER): the queue stops on it
    packets.extend([4, 0, 0, 0, 0, 0]);
    let bad_end = packets.len() * 4;
    for (i, w) in packets.iter().enumerate() {
        // SAFETY: dword i of the 4 KiB ring (fewer than 1024 dwords are written).
        unsafe { ring.add(i).write_volatile(*w) };
    }
    let wait_rptr = |want: u64| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while rptr.load(Ordering::Acquire) != want {
            assert!(Instant::now() < deadline, "read pointer {} never reached {want}", rptr.load(Ordering::Acquire));
            thread::sleep(Duration::from_millis(5));
        }
    };
    wptr.store(end as u64, Ordering::Release);
    wait_rptr(poll_at as u64);
    // The poll holds the queue: 300 ms later the read pointer still stands on it.
    thread::sleep(Duration::from_millis(300));
    assert_eq!(rptr.load(Ordering::Acquire), poll_at as u64, "the poll waits for the gate");
    // SAFETY: inside the mapping; the engine wrote them before advancing the read pointer.
    unsafe {
        for k in 0..1000 {
            assert_eq!(dst.add(k).read(), (k * 7 + 1) as u8, "byte {k} copied");
        }
        for k in 1000..1064 {
            assert_eq!(dst.add(k).read(), 0xa5, "byte {k} filled");
        }
        assert_eq!(dst.add(1064).read(), 0, "nothing past the fill");
        assert_eq!(fence.read_volatile(), 0x2015);
        assert_eq!(atomic.read_volatile(), 0, "1 + (-1)");
        assert!(stamp.read_volatile() > 0, "a GPU timestamp");
        gate.write_volatile(7);
    }
    wait_rptr(end as u64);
    wptr.store(bad_end as u64, Ordering::Release);
    thread::sleep(Duration::from_millis(300));
    assert_eq!(rptr.load(Ordering::Acquire), end as u64, "the unknown op is not consumed");
    let mut destroy = uapi::DestroyQueueArgs { queue_id: args.base.queue_id, pad: 0 };
    // SAFETY: as above.
    unsafe { uapi::destroy_queue(std::os::fd::AsRawFd::as_raw_fd(&kfd), &mut destroy) }.unwrap();
}

// ---- gpreempt on ROCm programs: trace, schedule, the agent; preempt on ROCm 6.1 ----

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

/// `gpreempt preempt` on `pid`, a ROCr 6.1 process with its utility queue and one more on the
/// first GPU: 5 cycles of 300 ms holds 100 ms apart, each suspending and resuming both queues,
/// every answer successful (its summary and its `--json` record).
fn preempt_two_queues_5_times(pid: u32) {
    let json = std::env::temp_dir().join(format!("preempt-rocm-{pid}.json"));
    let out = Command::new(gpreempt_tests::binary("gpreempt").unwrap())
        .args(["preempt", "--offline", &pid.to_string(), "--iterations", "5", "--hold", "300ms", "--gap", "100ms"])
        .args(["--no-trace", "--output"])
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.lines().next(), Some("5 of 5 iterations, 5 fully successful (100.0%)"), "{stdout}");
    assert_eq!(
        stdout.lines().nth(1),
        Some("queues suspended in total: 10; INVALID answers: 0; ERROR answers: 0"),
        "{stdout}"
    );
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    for it in doc["iterations"].as_array().unwrap() {
        assert_eq!((it["suspended"].as_i64(), it["resumed"].as_i64()), (Some(2), Some(2)), "{it}");
    }
}

#[test]
fn gpreempt_preempt_suspends_rocm_6_1_mid_dispatch_and_every_dispatch_completes() {
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

#[test]
fn schedule_suspends_an_offline_job_during_each_request_of_a_rocm_program_seen_through_rocrs_queue() {
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

#[test]
fn trace_shows_rocrs_queue_ioctls_with_their_exact_arguments() {
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

#[test]
fn the_agent_exports_rocrs_queues_of_a_rocm_program_per_gpu() {
    use gpreempt_tests::{prometheus::http_get, stderr_lines};

    let mut agent = Command::new(gpreempt_tests::binary("gpreempt").unwrap())
        .args(["agent", "--metrics-addr", "127.0.0.1:0", "--hostname", "vm"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = stderr_lines(agent.stderr.take().unwrap(), "agent");
    // Loading every program in a TCG guest on a loaded host has taken over a minute.
    let started = loop {
        let line = log.recv_timeout(Duration::from_secs(240)).expect("the agent did not start within 240 s");
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
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(agent.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
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
    assert!((1..=n + 1).contains(&suspends), "{suspends} suspends for {n} requests: {sum}");
    assert_eq!(sum["failed_suspends"], 0);
    assert_eq!(sum["resumes"].as_u64().unwrap() as usize, suspends, "{sum}");
    assert_protected(&requests, &ends);
    let mut stores: Vec<u64> =
        sum["doorbell_stores"].as_array().unwrap().iter().map(|d| d["stores"].as_u64().unwrap()).collect();
    stores.sort_unstable();
    eprintln!("doorbell stores per online queue: {stores:?}");
    (k, stores)
}

#[test]
fn schedule_protects_a_rocm_5_2_program_against_a_rocm_6_1_training_job() {
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

#[test]
fn schedule_protects_a_hip_program_against_a_hip_training_job() {
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
    // on every run): 2 × REQUESTS + 1. Three queues watched: ROCr's utility queue, the stream's,
    // and one the program created while scheduled; no store through the export on either of those.
    assert_eq!(stores, [0, 0, 2 * REQUESTS as u64 + 1], "doorbell stores per online queue");
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

#[test]
fn evaluate_measures_a_hip_5_7_service_against_a_hip_5_7_training_job() {
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
                assert!((1..=REQUESTS + 1).contains(&suspends), "{s}");
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
