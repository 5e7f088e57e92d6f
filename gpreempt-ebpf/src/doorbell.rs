//! The doorbell probe (`gpreempt schedule`'s, not the tracer's): a uprobe on the ROCm runtime's
//! signal-store exports in the online processes, an object of its own so that the scheduler loads
//! three small maps and one program, none of the tracer's.
//!
//! `hsa_signal_store_screlease(hsa_signal_t signal, hsa_signal_value_t value)` and
//! `hsa_signal_store_relaxed` (ROCR-Runtime `hsa.h`; `_release` is an alias of `_screlease` at the
//! same address in ROCr 5.2 and 6.1's `libhsa-runtime64.so.1`): ROCclr rings a queue's doorbell
//! with them (`rocvirtual.cpp`), raw HSA clients too. See `gpreempt_common::doorbell`.
//!
//! No atomics (the bpf target's core has no atomic read-modify-write; the exchange and
//! compare-and-swap instructions need Linux 5.12): the store count is per CPU, summed by the
//! reader, and two CPUs that both see the entry armed merely send two hits (the reader takes the
//! first).
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, uprobe},
    maps::{HashMap, PerCpuHashMap, RingBuf},
    programs::ProbeContext,
};
use gpreempt_common::doorbell::{DoorbellHit, DoorbellKey, HITS_BYTES, MAX_DOORBELLS};

/// Registered doorbells → armed (non-zero) or not.
#[map]
static DOORBELL_ARMED: HashMap<DoorbellKey, u32> = HashMap::with_max_entries(MAX_DOORBELLS, 0);

/// Registered doorbells → stores seen since registration, per CPU (the tests' exact count).
#[map]
static DOORBELL_STORES: PerCpuHashMap<DoorbellKey, u64> = PerCpuHashMap::with_max_entries(MAX_DOORBELLS, 0);

#[map]
static DOORBELL_HITS: RingBuf = RingBuf::with_byte_size(HITS_BYTES, 0);

#[uprobe]
pub fn doorbell_store(ctx: ProbeContext) -> u32 {
    let signal: u64 = ctx.arg(0).unwrap_or(0);
    let key = DoorbellKey { tgid: (bpf_get_current_pid_tgid() >> 32) as u32, _pad: 0, signal };
    let Some(armed) = DOORBELL_ARMED.get_ptr_mut(&key) else { return 0 };
    if let Some(stores) = DOORBELL_STORES.get_ptr_mut(&key) {
        // SAFETY: this CPU's value of the entry, which only this program on this CPU writes (a
        // uprobe handler runs with preemption disabled).
        unsafe { *stores += 1 };
    }
    // SAFETY: a map value pointer the helper returned; userspace writes it too (re-arming), so
    // volatile accesses.
    if unsafe { core::ptr::read_volatile(armed) } == 0 {
        return 0;
    }
    // SAFETY: as above.
    unsafe { core::ptr::write_volatile(armed, 0) };
    let value: u64 = ctx.arg(1).unwrap_or(0);
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let ktime_ns = unsafe { bpf_ktime_get_ns() };
    // A full ring (the reader stopped) drops the hit: the index poll's cross-check still sees the work.
    let hit = DoorbellHit { tgid: key.tgid, _pad: 0, signal, value, ktime_ns };
    let _ = DOORBELL_HITS.output::<DoorbellHit>(&hit, 0);
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any program that could reach this; it exists only to link.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
