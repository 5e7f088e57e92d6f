//! The producer side of an emulated AQL queue (tests/kfd-emu/README.md, "Packet format"): ring,
//! read and write indices, completion records and the CWSR-area error payload, all in this
//! process's memory, which the emulated CP reads and writes.

use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};

use serde::Serialize;

/// AQL packet types (HSA `hsa_packet_type_t`, header bits 0..7).
pub mod packet_type {
    pub const INVALID: u16 = 1;
    pub const KERNEL_DISPATCH: u16 = 2;
}

/// One ring slot: an `hsa_kernel_dispatch_packet_t`. `kernel_object` carries the emulated cost
/// in ns and `completion_signal` the address of a [`CompletionRecord`] (0: none).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default)]
pub struct DispatchPacket {
    pub header: u16,
    pub setup: u16,
    pub workgroup_size: [u16; 3],
    pub reserved0: u16,
    pub grid_size: [u32; 3],
    pub private_segment_size: u32,
    pub group_segment_size: u32,
    pub kernel_object: u64,
    pub kernarg_address: u64,
    pub reserved2: u64,
    pub completion_signal: u64,
}

const _: () = assert!(size_of::<DispatchPacket>() == 64);

impl DispatchPacket {
    /// A well-formed 1-D dispatch of `cost_ns` (304 workgroups of 256: one per CU).
    pub fn dispatch(cost_ns: u64, completion: u64) -> Self {
        Self {
            header: packet_type::KERNEL_DISPATCH,
            setup: 1,
            workgroup_size: [256, 1, 1],
            grid_size: [256 * 304, 1, 1],
            kernel_object: cost_ns,
            completion_signal: completion,
            ..Default::default()
        }
    }
}

/// `struct emu_completion_record`, written by the emulated CP when a dispatch completes.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct CompletionRecord {
    pub start_ns: u64,
    pub end_ns: u64,
    pub packet_index: u64,
    pub off_ns: u64,
    pub first_stop_ns: u64,
    pub last_start_ns: u64,
    pub preemptions: u32,
    pub queue_id: u32,
    pub status: u64,
}

const _: () = assert!(size_of::<CompletionRecord>() == 64);
const RECORD_DONE: u64 = 1;

/// `struct kfd_context_save_area_header` (kfd_ioctl.h): KFD reports queue exceptions to the
/// runtime through the u64 at `err_payload_addr`.
#[repr(C)]
#[derive(Default)]
pub struct ContextSaveAreaHeader {
    pub wave_state: [u32; 4],
    pub debug_offset: u32,
    pub debug_size: u32,
    pub err_payload_addr: u64,
    pub err_event_id: u32,
    pub reserved1: u32,
}

/// Four ring slots, 256-byte aligned: the unit a ring is allocated in, so that its base is
/// aligned as a CP takes it (the MQD holds the ring base as `address >> 8`) and its length is
/// whole slots.
#[repr(C, align(256))]
#[derive(Clone, Copy)]
struct RingChunk([DispatchPacket; 4]);

const _: () = assert!(size_of::<RingChunk>() == 256);

/// The least ring a kernel may use, whatever size it is given: current kernels raise a ring size
/// below `KFD_MIN_QUEUE_RING_SIZE` (1 KiB) to it in `set_queue_properties_from_user`.
const MIN_RING_BYTES: u64 = 1024;

/// Leaked memory of one queue: it must outlive the queue, which the driver may tear down only
/// at process exit.
#[derive(Clone, Copy)]
pub struct QueueMem {
    pub queue_id: u32,
    pub gpu_id: u32,
    pub rptr: *mut u64,
    pub wptr: *mut u64,
    pub ring: *mut DispatchPacket,
    /// Slots this process uses: the ring size asked for, in packets.
    pub ring_packets: u64,
    /// Bytes of ring memory behind `ring`: the size asked for, at least [`MIN_RING_BYTES`],
    /// rounded up to 256 (the contract of `Device::create_queue`).
    pub ring_bytes: u64,
    pub error_payload: *mut u64,
    pub ctx_save: *mut ContextSaveAreaHeader,
}

// SAFETY: every pointer is into leaked memory that lives until the process exits; the indices
// and headers are accessed atomically, the rest of a slot only by its single producer.
unsafe impl Send for QueueMem {}
// SAFETY: as above.
unsafe impl Sync for QueueMem {}

impl QueueMem {
    /// Ring of `ring_size` bytes (slots initialised INVALID, as ROCr does), indices at 0 and a
    /// CWSR area header whose error payload is zero. The ring's memory is 256-byte aligned and
    /// covers at least 1 KiB, what a kernel may use of a smaller ring; `ring_packets` stays the
    /// size asked for.
    pub fn alloc(ring_size: u32) -> Self {
        let ring_packets = u64::from(ring_size) / 64;
        let ring_bytes = u64::from(ring_size).max(MIN_RING_BYTES).next_multiple_of(256);
        let invalid = DispatchPacket { header: packet_type::INVALID, ..Default::default() };
        let chunks = vec![RingChunk([invalid; 4]); (ring_bytes / 256) as usize];
        let ring = Box::leak(chunks.into_boxed_slice()).as_mut_ptr().cast::<DispatchPacket>();
        let pointers: &'static mut [u64; 2] = Box::leak(Box::new([0u64, 0]));
        let rptr = &mut pointers[0] as *mut u64;
        // SAFETY: both point into the leaked array.
        let wptr = unsafe { rptr.add(1) };
        let error_payload = Box::leak(Box::new(0u64)) as *mut u64;
        let ctx_save =
            Box::leak(Box::new(ContextSaveAreaHeader { err_payload_addr: error_payload as u64, ..Default::default() }))
                as *mut ContextSaveAreaHeader;
        Self { queue_id: 0, gpu_id: 0, rptr, wptr, ring, ring_packets, ring_bytes, error_payload, ctx_save }
    }

    fn atomic(p: *mut u64) -> &'static AtomicU64 {
        // SAFETY: `p` is 8-byte aligned leaked memory shared with the kernel.
        unsafe { AtomicU64::from_ptr(p) }
    }

    pub fn read_index(&self) -> u64 {
        Self::atomic(self.rptr).load(Ordering::Acquire)
    }

    pub fn write_index(&self) -> u64 {
        Self::atomic(self.wptr).load(Ordering::Acquire)
    }

    pub fn set_write_index(&self, value: u64) {
        Self::atomic(self.wptr).store(value, Ordering::Release);
    }

    pub fn error_payload(&self) -> u64 {
        Self::atomic(self.error_payload).load(Ordering::Acquire)
    }

    /// Free slots in the ring.
    pub fn space(&self) -> u64 {
        self.ring_packets.saturating_sub(self.write_index().saturating_sub(self.read_index()))
    }

    /// Write `packet` into the next slot (body, then the header with release order, then the
    /// write index); returns its packet index. The caller checked [`Self::space`].
    pub fn publish(&self, packet: DispatchPacket) -> u64 {
        let index = self.write_index();
        self.write_slot(index, packet);
        self.set_write_index(index + 1);
        index
    }

    /// Move the write index past a slot whose header stays INVALID, as an AQL producer does
    /// between reserving a slot and writing its packet: the dispatch is queued for whoever reads
    /// the indices, but the CP waits for the header ([`Self::commit`]). Returns the slot's index.
    pub fn reserve(&self) -> u64 {
        let index = self.write_index();
        self.write_slot(index, DispatchPacket { header: packet_type::INVALID, ..Default::default() });
        self.set_write_index(index + 1);
        index
    }

    /// Write the packet of a slot [`Self::reserve`]d earlier, header last.
    pub fn commit(&self, index: u64, packet: DispatchPacket) {
        self.write_slot(index, packet);
    }

    fn write_slot(&self, index: u64, packet: DispatchPacket) {
        let slot_index = if self.ring_packets == 0 { 0 } else { index % self.ring_packets };
        // SAFETY: the slot is inside the leaked ring and not read by the CP until the header
        // says so; this process is its only producer.
        unsafe {
            let slot = self.ring.add(slot_index as usize);
            let mut body = packet;
            body.header = packet_type::INVALID;
            slot.write_volatile(body);
            AtomicU16::from_ptr(&raw mut (*slot).header).store(packet.header, Ordering::Release);
        }
    }

    /// Write `packets` into the next slots, then move the write index once, so the CP sees them
    /// together (AQL: the doorbell / write index is updated after the packets). The caller
    /// checked [`Self::space`]. Returns the first packet index.
    pub fn publish_batch(&self, packets: &[DispatchPacket]) -> u64 {
        let first = self.write_index();
        for (k, packet) in packets.iter().enumerate() {
            self.write_slot(first + k as u64, *packet);
        }
        self.set_write_index(first + packets.len() as u64);
        first
    }
}

/// Completion records in leaked memory: slot `i` is written by the CP for the dispatch that
/// named it.
#[derive(Clone, Copy)]
pub struct Records {
    base: *mut CompletionRecord,
    len: usize,
}

// SAFETY: leaked memory, status read atomically; see `QueueMem`.
unsafe impl Send for Records {}

impl Records {
    pub fn alloc(len: usize) -> Self {
        let base = Box::leak(vec![CompletionRecord::default(); len.max(1)].into_boxed_slice()).as_mut_ptr();
        Self { base, len: len.max(1) }
    }

    /// Address of slot `i` (cleared, so a stale record is never taken for a new one).
    pub fn arm(&self, i: usize) -> u64 {
        // SAFETY: `i % len` is inside the leaked array; the CP writes it only after the packet
        // naming it is published.
        unsafe {
            let slot = self.base.add(i % self.len);
            slot.write_volatile(CompletionRecord::default());
            slot as u64
        }
    }

    /// Slot `i` if the CP finished writing it.
    pub fn done(&self, i: usize) -> Option<CompletionRecord> {
        // SAFETY: as in `arm`; the status is written last by the CP.
        unsafe {
            let slot = self.base.add(i % self.len);
            if AtomicU64::from_ptr(&raw mut (*slot).status).load(Ordering::Acquire) != RECORD_DONE {
                return None;
            }
            Some(slot.read_volatile())
        }
    }
}
