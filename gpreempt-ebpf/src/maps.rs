//! Maps shared by every probe, and the helpers that use them.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_boot_ns},
    macros::map,
    maps::{LruHashMap, PerCpuArray, RingBuf},
};
use gpreempt_common::record::{COMM_LEN, EVENTS_BYTES, EntryStash, RecordHeader, RecordKind, StashKey, counter};

/// Records for userspace (`gpreempt::trace::stream`).
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

/// Per-CPU counts of records that could not be delivered, indexed by [`counter`].
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Entry arguments saved by a kprobe for its kretprobe. LRU, so a thread that dies inside a
/// traced call cannot leak a slot forever.
#[map]
static ENTRY_STASH: LruHashMap<StashKey, EntryStash> = LruHashMap::with_max_entries(16 * 1024, 0);

/// Count one undeliverable record.
pub fn count(index: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU while the program runs.
        unsafe { *slot += 1 };
    }
}

fn stash_key(slot: u32) -> StashKey {
    StashKey { pid_tgid: bpf_get_current_pid_tgid(), slot, _pad: 0 }
}

/// Save up to three arguments of the current call for the matching kretprobe.
pub fn stash(slot: u32, args: [u64; 3]) {
    // SAFETY: helper without preconditions.
    let entry_ns = unsafe { bpf_ktime_get_boot_ns() };
    // A full LRU evicts the oldest entry; insert cannot fail in a way we could act on.
    let _ = ENTRY_STASH.insert(&stash_key(slot), &EntryStash { entry_ns, args }, 0);
}

/// Take what the entry probe saved; counts [`counter::ENTRY_MISSING`] when there is nothing.
pub fn take(slot: u32) -> Option<EntryStash> {
    let key = stash_key(slot);
    // SAFETY: the value is copied out before the entry is removed.
    let stash = unsafe { ENTRY_STASH.get(&key) }.copied();
    match stash {
        Some(stash) => {
            let _ = ENTRY_STASH.remove(&key);
            Some(stash)
        }
        None => {
            count(counter::ENTRY_MISSING);
            None
        }
    }
}

/// The header of a record about `current`.
pub fn header(kind: RecordKind, entry_ns: u64) -> RecordHeader {
    let pid_tgid = bpf_get_current_pid_tgid();
    let comm = bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]);
    RecordHeader {
        kind: kind as u32,
        // SAFETY: helpers without preconditions.
        cpu: unsafe { bpf_get_smp_processor_id() },
        entry_ns,
        ts_ns: unsafe { bpf_ktime_get_boot_ns() },
        tgid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        comm,
    }
}

/// Write `record` to [`EVENTS`]; count it as dropped when the ring buffer is full.
pub fn emit<T: 'static>(record: &T) {
    match EVENTS.reserve::<T>(0) {
        Some(mut entry) => {
            // SAFETY: `T` is a plain `#[repr(C)]` record; copying it initialises the slot.
            unsafe { core::ptr::copy_nonoverlapping(record, entry.as_mut_ptr(), 1) };
            entry.submit(0);
        }
        None => count(counter::RINGBUF_FULL),
    }
}
