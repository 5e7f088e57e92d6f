//! The SDMA engines' packets, written by hand (README "SDMA").

use std::{
    collections::BTreeMap,
    thread,
    time::{Duration, Instant},
};

use gpreempt_tests::render_nodes::{MODULE, RenderNodes};

use crate::{
    emulator::{GPU0, GPU1, counters, cp_stats, cp_stats_since},
    run_in_child,
};

/// Set in the child that runs [`sdma_sequence`] (its KFD process lives until it exits).
const SDMA_CHILD: &str = "GPREEMPT_EMU_ROCM_SDMA_CHILD";
const SDMA_TEST: &str = "rocm_sdma_packets_move_bytes_wait_and_stop_the_queue_on_an_unknown_op";

pub(crate) fn rocm_sdma_packets_move_bytes_wait_and_stop_the_queue_on_an_unknown_op() {
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
