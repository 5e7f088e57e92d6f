//! Maps shared by every probe, and the helpers that use them.

use aya_ebpf::helpers::bpf_probe_read_kernel;
use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_boot_ns},
    macros::map,
    maps::{LruHashMap, PerCpuArray, RingBuf},
};
use gpreempt_common::record::{
    COMM_LEN, CONTEXT_ID_PRIMARY, EVENTS_BYTES, EntryStash, OFFSET_UNKNOWN, ProbeConfig, Record, RecordHeader,
    StashKey, counter,
};

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

/// `kfd_process*` → host tgid, learned at `kfd_create_process` return (ioctl context), for
/// probes in kworker/notifier context when BTF offsets are unavailable (pointer learning).
#[map]
static OWNERS: LruHashMap<u64, u32> = LruHashMap::with_max_entries(16 * 1024, 0);

/// Thread (pid_tgid of a kworker) → the KFD context it is tearing down, set at
/// `kfd_process_wq_release` / `kfd_process_dequeue_from_all_devices` entry so the queue
/// removals nested in the teardown are attributed to their owner and context.
#[map]
static TEARDOWN: LruHashMap<u64, Teardown> = LruHashMap::with_max_entries(1024, 0);

/// A context being torn down: its owner's tgid and its `context_id`.
#[derive(Clone, Copy)]
pub struct Teardown {
    pub owner: u32,
    pub context_id: u32,
}

/// Struct offsets from BTF, set by the loader (`EbpfLoader::override_global`); until then the
/// layout-free [`ProbeConfig::DEFAULT`].
#[unsafe(no_mangle)]
static CONFIG: ProbeConfig = ProbeConfig::DEFAULT;

/// The configuration; a volatile read so the compiler cannot fold the defaults in.
pub fn config() -> ProbeConfig {
    // SAFETY: reading a global the loader initialised before load.
    unsafe { core::ptr::read_volatile(&CONFIG) }
}

/// Read a `T` at `base + offset` in kernel memory.
pub fn read_at<T>(base: u64, offset: u32) -> Option<T> {
    if base == 0 {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel checks the address; a fault returns an error.
    unsafe { bpf_probe_read_kernel((base + u64::from(offset)) as *const T) }.ok()
}

/// Host tgid of a `task_struct*` (vmlinux BTF offset of `tgid`).
pub fn task_tgid(cfg: &ProbeConfig, task: u64) -> Option<u32> {
    if cfg.task_tgid == OFFSET_UNKNOWN {
        return None;
    }
    read_at::<i32>(task, cfg.task_tgid).map(|t| t as u32)
}

/// Host tgid of a `kfd_process*`: `p->lead_thread->tgid` with BTF offsets, else the
/// pointer-learning map. 0 (counted) when neither knows it.
pub fn owner_of_process(cfg: &ProbeConfig, p: u64) -> u32 {
    known_owner(cfg, p).unwrap_or_else(|| {
        count(counter::OWNER_UNKNOWN);
        0
    })
}

/// [`owner_of_process`] without counting a miss: the caller has another way to find it.
pub fn known_owner(cfg: &ProbeConfig, p: u64) -> Option<u32> {
    if cfg.process_lead_thread != OFFSET_UNKNOWN {
        if let Some(tgid) = read_at::<u64>(p, cfg.process_lead_thread).and_then(|task| task_tgid(cfg, task)) {
            return Some(tgid);
        }
    }
    // SAFETY: the value is copied out immediately.
    unsafe { OWNERS.get(&p) }.copied()
}

/// The `context_id` of `p` (`struct kfd_process *`): Linux 7.0 gave each KFD context of a process
/// its own id and its own queue ids (docs/kfd.md §1.4). [`CONTEXT_ID_PRIMARY`] where BTF has no
/// `context_id` (kernels before 7.0, whose contexts are all primary; no module BTF) or the read
/// fails.
pub fn context_of(cfg: &ProbeConfig, p: u64) -> u32 {
    if cfg.process_context_id == OFFSET_UNKNOWN {
        return CONTEXT_ID_PRIMARY;
    }
    read_at::<u16>(p, cfg.process_context_id).map_or(CONTEXT_ID_PRIMARY, u32::from)
}

/// Whether `p` is a secondary KFD context ([`context_of`] is not the primary's): DBG_TRAP and
/// RUNTIME_ENABLE through its file are about that context, whose state the model does not keep.
pub fn is_secondary_context(cfg: &ProbeConfig, p: u64) -> bool {
    context_of(cfg, p) != CONTEXT_ID_PRIMARY
}

/// The `kfd_process*` of a `qcm_process_device*`: `qpd->pqm->process` (offsets 8 and 0 on 6.1/6.12).
pub fn process_of_qpd(cfg: &ProbeConfig, qpd: u64) -> Option<u64> {
    if cfg.qpd_pqm == OFFSET_UNKNOWN || cfg.pqm_process == OFFSET_UNKNOWN {
        return None;
    }
    read_at::<u64>(qpd, cfg.qpd_pqm).and_then(|pqm| read_at::<u64>(pqm, cfg.pqm_process))
}

/// Owner of a `qcm_process_device*`: `qpd->pqm->process` (offsets 8 and 0 on 6.1/6.12).
pub fn owner_of_qpd(cfg: &ProbeConfig, qpd: u64) -> u32 {
    if cfg.qpd_pqm == OFFSET_UNKNOWN || cfg.pqm_process == OFFSET_UNKNOWN {
        count(counter::OWNER_UNKNOWN);
        return 0;
    }
    match read_at::<u64>(qpd, cfg.qpd_pqm).and_then(|pqm| read_at::<u64>(pqm, cfg.pqm_process)) {
        Some(p) => owner_of_process(cfg, p),
        None => {
            count(counter::OWNER_UNKNOWN);
            0
        }
    }
}

/// Topology gpu id of a `kfd_node*` (`kfd_dev*` on 6.1); 0 without BTF.
pub fn gpu_of_node(cfg: &ProbeConfig, node: u64) -> u32 {
    if cfg.node_id == OFFSET_UNKNOWN {
        return 0;
    }
    read_at::<u32>(node, cfg.node_id).unwrap_or(0)
}

/// Topology gpu id of a `device_queue_manager*` (`dqm->dev->id`); 0 without BTF.
pub fn gpu_of_dqm(cfg: &ProbeConfig, dqm: u64) -> u32 {
    if cfg.dqm_dev == OFFSET_UNKNOWN {
        return 0;
    }
    read_at::<u64>(dqm, cfg.dqm_dev).map_or(0, |node| gpu_of_node(cfg, node))
}

pub fn learn_owner(p: u64, tgid: u32) {
    let _ = OWNERS.insert(&p, &tgid, 0);
}

pub fn forget_owner(p: u64) {
    let _ = OWNERS.remove(&p);
}

pub fn set_teardown(owner: u32, context_id: u32) {
    let _ = TEARDOWN.insert(&bpf_get_current_pid_tgid(), &Teardown { owner, context_id }, 0);
}

pub fn teardown_of_thread() -> Option<Teardown> {
    // SAFETY: copied out immediately.
    unsafe { TEARDOWN.get(&bpf_get_current_pid_tgid()) }.copied()
}

pub fn clear_teardown() {
    let _ = TEARDOWN.remove(&bpf_get_current_pid_tgid());
}

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

/// Save up to five arguments of the current call for the matching kretprobe.
pub fn stash(slot: u32, args: [u64; 5]) {
    stash_call(slot, 0, 0, args);
}

/// [`stash`] with the owner and gpu the entry probe resolved.
pub fn stash_call(slot: u32, owner: u32, gpu_id: u32, args: [u64; 5]) {
    // SAFETY: helper without preconditions.
    let entry_ns = unsafe { bpf_ktime_get_boot_ns() };
    // A full LRU evicts the oldest entry; insert cannot fail in a way we could act on.
    let _ = ENTRY_STASH.insert(&stash_key(slot), &EntryStash { entry_ns, owner, gpu_id, args }, 0);
}

/// What the entry probe of `slot` saved on this thread, left in place (the call is still running).
pub fn peek(slot: u32) -> Option<EntryStash> {
    // SAFETY: the value is copied out immediately.
    unsafe { ENTRY_STASH.get(&stash_key(slot)) }.copied()
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

/// The header of a record about `current`; [`emit`] sets its `kind`.
pub fn header(entry_ns: u64) -> RecordHeader {
    let pid_tgid = bpf_get_current_pid_tgid();
    let comm = bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]);
    RecordHeader {
        kind: 0,
        // SAFETY: helpers without preconditions.
        cpu: unsafe { bpf_get_smp_processor_id() },
        entry_ns,
        ts_ns: unsafe { bpf_ktime_get_boot_ns() },
        tgid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        comm,
    }
}

/// Write `record` to [`EVENTS`] with its header's kind set to `R::KIND`; count it as dropped
/// when the ring buffer is full.
pub fn emit<R: Record>(record: &R) {
    match EVENTS.reserve::<R>(0) {
        Some(mut entry) => {
            // SAFETY: `R` is a plain `#[repr(C)]` record; copying it initialises the slot, which
            // is then ours to write until it is submitted.
            unsafe {
                core::ptr::copy_nonoverlapping(record, entry.as_mut_ptr(), 1);
                entry.assume_init_mut().header_mut().kind = R::KIND as u32;
            }
            entry.submit(0);
        }
        None => count(counter::RINGBUF_FULL),
    }
}
