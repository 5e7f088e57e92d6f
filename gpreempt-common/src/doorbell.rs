//! The doorbell probe's maps and records (`gpreempt-ebpf`'s `doorbell` object, read by
//! `gpreempt::doorbell`).
//!
//! A ROCm program rings an AQL queue's doorbell through the runtime's export
//! `hsa_signal_store_screlease(queue->doorbell_signal, write_index)` (ROCclr, `rocvirtual.cpp`) or
//! its `_relaxed` twin. The uprobe on those exports looks the call's first argument (the signal
//! handle) up in [`ARMED_MAP`] under the caller's host tgid: a store on a signal not registered
//! there costs one hash lookup and is otherwise ignored. A registered store is counted in
//! [`STORES_MAP`]; if the entry is armed (non-zero), it is disarmed and one [`DoorbellHit`] goes
//! to [`HITS_MAP`], so only the first store after the scheduler re-armed the queue reaches
//! userspace.

/// Map names in the object (the userspace side looks them up by these).
pub const ARMED_MAP: &str = "DOORBELL_ARMED";
pub const STORES_MAP: &str = "DOORBELL_STORES";
pub const HITS_MAP: &str = "DOORBELL_HITS";
/// The uprobe program, attached once per runtime export per online process.
pub const PROGRAM: &str = "doorbell_store";
/// Doorbell signals registered at once, every online process together.
pub const MAX_DOORBELLS: u32 = 4096;
/// Ring buffer size: at most one hit per registered queue is in flight between two re-arms.
pub const HITS_BYTES: u32 = 64 * 1024;

/// One online queue's doorbell signal: the process (host tgid, as `bpf_get_current_pid_tgid`
/// gives it in any pid namespace) and the `hsa_signal_t` handle (an address in that process).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DoorbellKey {
    pub tgid: u32,
    pub _pad: u32,
    pub signal: u64,
}

/// The first store on an armed doorbell.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DoorbellHit {
    pub tgid: u32,
    pub _pad: u32,
    pub signal: u64,
    /// The value stored: the queue's new write index (as ROCclr stores it).
    pub value: u64,
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC, the clock the scheduler stamps with.
    pub ktime_ns: u64,
}

const _: () = {
    assert!(core::mem::size_of::<DoorbellKey>() == 16);
    assert!(core::mem::size_of::<DoorbellHit>() == 32);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: `#[repr(C)]` structs of integers with no padding (sizes asserted above): every bit
    // pattern is a valid value.
    unsafe impl aya::Pod for super::DoorbellKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::DoorbellHit {}
}
