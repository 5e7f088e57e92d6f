//! The doorbell probe on this kernel's uprobes, with the stand-in runtime
//! (`tests/rocm/hsa_store_stub.c` as `doorbell-stub/libhsa-runtime64.so.1`) loaded into this test
//! process, which is then the "online process": exact store counts, one hit per arm, filtering on
//! the registered signals, and the probed instruction restored on detach and after an unmap.

use std::ffi::CString;

use gpreempt::{
    domain::HostPid,
    schedule::doorbell::{Coverage, DoorbellProbe},
};
use gpreempt_common::doorbell::DoorbellHit;
use gpreempt_tests::binary;

type Store = unsafe extern "C" fn(u64, i64);

/// The tests probe this very process and map one library: one at a time, whatever the harness's
/// thread count.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct Stub {
    handle: *mut libc::c_void,
    screlease: Store,
    relaxed: Store,
    path: String,
}

fn open_stub() -> Stub {
    let path = binary("doorbell-stub/libhsa-runtime64.so.1").unwrap().display().to_string();
    let c = CString::new(path.clone()).unwrap();
    // SAFETY: dlopen of the stand-in runtime: two thunks, two stores and a constructor that fills its table.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "dlopen {path}");
    let sym = |name: &str| {
        let n = CString::new(name).unwrap();
        // SAFETY: a symbol of the library just opened.
        let f = unsafe { libc::dlsym(handle, n.as_ptr()) };
        assert!(!f.is_null(), "{name}");
        // SAFETY: the stub's functions have exactly this signature (hsa_signal_t is one u64).
        unsafe { std::mem::transmute::<*mut libc::c_void, Store>(f) }
    };
    Stub { handle, screlease: sym("hsa_signal_store_screlease"), relaxed: sym("hsa_signal_store_relaxed"), path }
}

/// The byte at `address` of this process, as it executes it (0xcc while a uprobe is on it).
fn byte_at(address: u64) -> u8 {
    let mut b = [0u8];
    let mem = std::fs::File::open("/proc/self/mem").unwrap();
    std::os::unix::fs::FileExt::read_exact_at(&mem, &mut b, address).unwrap();
    b[0]
}

/// Where file offset `offset` of the library at `path` is mapped in this process.
fn mapped(path: &str, offset: u64) -> u64 {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter(|l| l.ends_with(path))
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (start, end) = f[0].split_once('-').unwrap();
            let (start, end) = (u64::from_str_radix(start, 16).unwrap(), u64::from_str_radix(end, 16).unwrap());
            let file = u64::from_str_radix(f[2], 16).unwrap();
            (file..file + (end - start)).contains(&offset).then(|| start + offset - file)
        })
        .unwrap_or_else(|| panic!("offset {offset:#x} of {path} is not mapped"))
}

/// The probe's points in the stub: on both exports' implementations (the exports are API-table
/// thunks, as ROCr's are), as addresses in this process.
fn probed(coverage: &Coverage, path: &str) -> Vec<u64> {
    let Coverage::Probe { libraries, points } = coverage else { panic!("not covered: {coverage:?}") };
    assert_eq!(libraries, &[path.to_owned()]);
    let symbols: Vec<&str> = points.iter().map(|p| p.symbol).collect();
    assert_eq!(symbols, ["hsa_signal_store_screlease", "hsa_signal_store_relaxed"]);
    assert!(points.iter().all(|p| p.implementation), "{points:?}");
    points.iter().map(|p| mapped(path, p.offset)).collect()
}

fn drained(probe: &mut DoorbellProbe) -> Vec<DoorbellHit> {
    let mut hits = Vec::new();
    probe.drain(&mut hits);
    hits
}

#[test]
fn stores_are_counted_exactly_and_one_hit_goes_out_per_arm() {
    let _serial = one_at_a_time();
    let stub = open_stub();
    let me = HostPid(std::process::id());
    let mut probe = DoorbellProbe::load().unwrap();
    let exports = (byte_at(stub.screlease as usize as u64), byte_at(stub.relaxed as usize as u64));
    let points = probed(&probe.cover(me), &stub.path);
    // The implementations begin with a push (0x55), now the breakpoint; the exports are untouched.
    assert_eq!(points.iter().map(|&a| byte_at(a)).collect::<Vec<_>>(), [0xcc, 0xcc], "both implementations probed");
    assert_eq!((byte_at(stub.screlease as usize as u64), byte_at(stub.relaxed as usize as u64)), exports);
    // Two queues' doorbell words in our memory (the handle is the word's address, as the stub
    // stores through it); one registered, one not.
    let words = Box::new([0i64; 2]);
    let (online, other) = (&words[0] as *const i64 as u64, &words[1] as *const i64 as u64);
    probe.register(me, online).unwrap();
    // SAFETY: the stub stores the value to the handle's address, a live word of `words`.
    unsafe {
        (stub.screlease)(online, 7);
        (stub.screlease)(online, 8);
        (stub.screlease)(other, 100);
        (stub.relaxed)(online, 9);
        (stub.relaxed)(other, 101);
    }
    assert_eq!(words[0], 9);
    let hits = drained(&mut probe);
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!((hits[0].tgid, hits[0].signal, hits[0].value), (me.0, online, 7), "the first store after the arm");
    assert!(hits[0].ktime_ns > 0 && hits[0].ktime_ns <= gpreempt::clock::monotonic_ns(), "CLOCK_MONOTONIC");
    assert_eq!(probe.stores(me, online), Some(3), "every store on the registered signal, both exports");
    assert_eq!(probe.stores(me, other), None, "an unregistered signal is not counted");
    // Re-armed: the next store (from another thread of the process) sends one more hit.
    probe.arm(me, online).unwrap();
    let (f, addr) = (stub.relaxed, online);
    // SAFETY: as above; `words` outlives the thread (joined here).
    std::thread::spawn(move || unsafe {
        f(addr, 10);
        f(addr, 11);
    })
    .join()
    .unwrap();
    let hits = drained(&mut probe);
    assert_eq!(hits.iter().map(|h| h.value).collect::<Vec<_>>(), vec![10]);
    assert_eq!(probe.stores(me, online), Some(5));
    // Another process's stores on the same handle value are not ours: a forked child is filtered
    // out by the uprobe's pid and by the map's key (its tgid).
    // SAFETY: the child only calls the stub and exits.
    let child = unsafe { libc::fork() };
    if child == 0 {
        probe.arm(me, online).ok();
        // SAFETY: as above, in the child's copy of `words`.
        unsafe { (stub.screlease)(online, 50) };
        // SAFETY: exit without running the parent's destructors.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    assert!(drained(&mut probe).iter().all(|h| h.tgid == me.0), "no hit from the child");
    assert_eq!(probe.stores(me, online), Some(5), "the child's store is not counted");
    // Detached: nothing is counted at once, and the instructions are the library's again once
    // the reaper thread has closed the links (each close waits for RCU grace periods,
    // `schedule/reaper.rs`).
    probe.uncover(me);
    assert_eq!(probe.stores(me, online), None);
    probe.settle();
    assert_eq!(points.iter().map(|&a| byte_at(a)).collect::<Vec<_>>(), [0x55, 0x55]);
    // SAFETY: as above.
    unsafe { (stub.screlease)(online, 12) };
    assert!(drained(&mut probe).is_empty());
    // SAFETY: the handle from dlopen; nothing of the library is used after this.
    unsafe { libc::dlclose(stub.handle) };
}

#[test]
fn a_library_unmapped_while_probed_and_mapped_again_is_probed_anew() {
    let _serial = one_at_a_time();
    let me = HostPid(std::process::id());
    let mut probe = DoorbellProbe::load().unwrap();
    let stub = open_stub();
    assert!(probe.cover(me).covered());
    // Unmapped while attached (dlclose: the last reference): the uprobe goes with the mapping,
    // and detaching afterwards is quiet.
    // SAFETY: nothing of the library is used after this.
    assert_eq!(unsafe { libc::dlclose(stub.handle) }, 0);
    assert!(!std::fs::read_to_string("/proc/self/maps").unwrap().contains("doorbell-stub"), "unmapped");
    probe.uncover(me);
    // Mapped again: a new cover attaches to the new mapping, and it counts.
    let stub = open_stub();
    let points = probed(&probe.cover(me), &stub.path);
    let word = Box::new(0i64);
    let handle = &*word as *const i64 as u64;
    probe.register(me, handle).unwrap();
    // SAFETY: as in the first test.
    unsafe { (stub.screlease)(handle, 1) };
    assert_eq!(probe.stores(me, handle), Some(1));
    assert_eq!(drained(&mut probe).len(), 1);
    drop(probe);
    assert_eq!(byte_at(points[0]), 0x55, "dropping the probe detaches");
    // SAFETY: nothing of the library is used after this.
    unsafe { libc::dlclose(stub.handle) };
}

#[test]
fn a_process_without_the_runtime_is_left_to_the_index_poll() {
    let mut probe = DoorbellProbe::load().unwrap();
    // `sleep` maps no ROCm runtime.
    let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let pid = HostPid(child.id());
    // Its maps are complete once exec has replaced the test binary's image.
    assert!(gpreempt_tests::target::eventually(std::time::Duration::from_secs(10), || {
        std::fs::read_link(format!("/proc/{}/exe", pid.0)).is_ok_and(|e| e.ends_with("sleep"))
    }));
    assert_eq!(probe.cover(pid), Coverage::NoRuntime);
    assert!(!probe.covers(pid));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(matches!(probe.cover(pid), Coverage::Failed(_)), "a process that is gone");
}
