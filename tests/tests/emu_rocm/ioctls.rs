//! The ioctls ROCm issues, one by one, with the kernel's answers (README "ROCm"), and the KFD
//! queues ROCr's `hsa_queue_create` makes.

use std::{
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use gpreempt_tests::render_nodes::{MODULE, RenderNodes};
use gpreempt_tests::{
    kfd_abi::{
        ACQUIRE_VM, AVAILABLE_MEMORY, AcquireVm, AmdgpuInfo, Apertures, AperturesArgs, Available, CREATE_EVENT, Clocks,
        CreateEvent, DESTROY_EVENT, DOORBELL, DRM_AMDGPU_INFO, EventData, EventId, FREE_MEMORY_OF_GPU,
        GET_CLOCK_COUNTERS, GET_PROCESS_APERTURES_NEW, GTT, Handle, MAP_MEMORY_TO_GPU, MMIO_REMAP, MapArgs,
        MemoryPolicy, SET_EVENT, SET_MEMORY_POLICY, SET_XNACK_MODE, VRAM, Xnack, alloc, map, wait,
    },
    wait_kfd_released,
};

use crate::{
    emulator::{GPU0, GPU1, gpreempt_queues, sysfs_queues, topology},
    run_in_child,
};

/// [`gpreempt_tests::kfd_abi::ioctl`] for the sequence below, whose arguments are live locals
/// and whose pointer fields point at live buffers of the sequence.
fn ioctl<T>(fd: i32, request: u64, arg: &mut T) -> i32 {
    // SAFETY: every call below passes the argument struct `request` encodes, and the buffers its
    // pointer fields name (apertures, events, device ids, the info reply) outlive the call.
    unsafe { gpreempt_tests::kfd_abi::ioctl(fd, request, arg) }
}

const NO_GPU: u32 = 0x3000;

fn open(path: &str) -> i32 {
    let c = std::ffi::CString::new(path).unwrap();
    // SAFETY: a NUL-terminated path; the fd is closed by the process's exit.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    assert!(fd >= 0, "open {path}: {}", std::io::Error::last_os_error());
    fd
}

/// Set in the child that runs [`ioctl_sequence`]: its KFD process (and the render files
/// ACQUIRE_VM keeps) lives until the process exits, which the parent then checks.
const IOCTL_CHILD: &str = "GPREEMPT_EMU_ROCM_IOCTL_CHILD";
const IOCTL_TEST: &str = "rocms_open_memory_and_event_ioctls_have_the_kernels_answers";

pub(crate) fn rocms_open_memory_and_event_ioctls_have_the_kernels_answers() {
    if std::env::var_os(IOCTL_CHILD).is_some() {
        ioctl_sequence();
        return;
    }
    let _one = MODULE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let nodes = RenderNodes::load();
    run_in_child(IOCTL_TEST, IOCTL_CHILD);
    drop(nodes);
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
    assert_eq!(dev_info[..7], [0x740f, 0, 0x3c, 2, 141, 8, 1]);
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

pub(crate) fn rocm_hsa_queue_create_makes_kfd_queues_on_both_gpus_with_rocrs_amd_queue_t() {
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
    let v = gpreempt_queues(pid);
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
