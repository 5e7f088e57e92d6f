//! What the `serve` and `train` workloads share: their queues as ROCr lays them out (the dispatch
//! indices inside a 256-byte `amd_queue_t`, not in a bare pair of words as `online`/`offline`
//! have them), seeded random numbers, and how they wait for the GPU (on the CPU, busy).

use std::thread;

use anyhow::{Result, bail};
use gpreempt::kfd::{Device, uapi};
use serde_json::{Value, json};

use crate::aql::QueueMem;

/// Byte offsets of the dispatch indices in ROCR-Runtime's `amd_queue_t`
/// (`inc/amd_hsa_queue.h`): after the 40-byte `hsa_queue_t`, `caps` and three reserved words
/// comes `write_dispatch_id`; `read_dispatch_id` opens the second half of the struct.
pub const WRITE_DISPATCH_ID: usize = 0x38;
pub const READ_DISPATCH_ID: usize = 0x80;
const AMD_QUEUE_SIZE: usize = 256;

/// A 256-byte, 64-byte-aligned `amd_queue_t`: the fields ROCr fills before CREATE_QUEUE that a
/// reader of this memory could look at (`hsa_queue_t`'s type, features, ring address, size in
/// packets and id), the two dispatch indices the CP and the producer use, and zeros elsewhere.
#[repr(C, align(64))]
struct AmdQueue([u8; AMD_QUEUE_SIZE]);

const _: () = assert!(size_of::<AmdQueue>() == AMD_QUEUE_SIZE);

impl AmdQueue {
    fn put_u32(&mut self, offset: usize, v: u32) {
        self.0[offset..offset + 4].copy_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, offset: usize, v: u64) {
        self.0[offset..offset + 8].copy_from_slice(&v.to_le_bytes());
    }
}

/// An AQL queue whose indices live in a leaked `amd_queue_t`; `mem.rptr`/`mem.wptr` point into
/// it, so every [`QueueMem`] method works unchanged. `amd_queue` is its address.
#[derive(Clone, Copy)]
pub struct RocrQueue {
    pub mem: QueueMem,
    pub amd_queue: u64,
}

/// CREATE_QUEUE of a compute AQL queue on `gpu_id` whose read and write pointer addresses are
/// `amd_queue_t.read_dispatch_id` and `.write_dispatch_id`, as ROCr passes them.
pub fn create_queue(device: &Device, gpu_id: u32, ring_size: u32, id: u64) -> Result<RocrQueue> {
    let mut mem = QueueMem::alloc(ring_size);
    let mut amd = Box::new(AmdQueue([0; AMD_QUEUE_SIZE]));
    amd.put_u32(0, 0); // hsa_queue_t.type: HSA_QUEUE_TYPE_MULTI
    amd.put_u32(4, 1); // features: HSA_QUEUE_FEATURE_KERNEL_DISPATCH
    amd.put_u64(8, mem.ring as u64); // base_address
    amd.put_u32(24, mem.ring_packets as u32); // size, in packets
    amd.put_u64(32, id); // id
    // read_dispatch_id_field_base_byte_offset: where read_dispatch_id is, from the struct's start.
    amd.put_u32(READ_DISPATCH_ID + 8, READ_DISPATCH_ID as u32);
    let base = Box::leak(amd).0.as_mut_ptr();
    // SAFETY: both offsets are inside the leaked 256-byte struct and 8-byte aligned (the struct
    // is 64-byte aligned), so they are valid u64 locations for the life of the process.
    let (wptr, rptr) = unsafe { (base.add(WRITE_DISPATCH_ID).cast::<u64>(), base.add(READ_DISPATCH_ID).cast::<u64>()) };
    mem.wptr = wptr;
    mem.rptr = rptr;
    let mut args = uapi::CreateQueueArgsV17 {
        base: uapi::CreateQueueArgs {
            ring_base_address: mem.ring as u64,
            write_pointer_address: wptr as u64,
            read_pointer_address: rptr as u64,
            ring_size,
            gpu_id,
            queue_type: uapi::queue_type::COMPUTE_AQL,
            queue_percentage: 100,
            queue_priority: 7,
            ctx_save_restore_address: mem.ctx_save as u64,
            ctx_save_restore_size: size_of::<crate::aql::ContextSaveAreaHeader>() as u32,
            ..Default::default()
        },
        ..Default::default()
    };
    // SAFETY: as in `crate::create`, with the indices in the leaked `amd_queue_t` instead: the
    // ring, the CWSR header and its error payload are `mem`'s (leaked, the ring ≥ 1 KiB and
    // 256-byte aligned), and both index words are 8-byte aligned inside the leaked struct.
    match unsafe { device.create_queue(&mut args) } {
        Ok(()) => {
            mem.queue_id = args.base.queue_id;
            mem.gpu_id = gpu_id;
            Ok(RocrQueue { mem, amd_queue: base as u64 })
        }
        Err(e) => bail!("CREATE_QUEUE on gpu {gpu_id:#x} failed: {}", crate::ret_of(Err(e))),
    }
}

/// The queue as the hello line describes it.
pub fn describe(q: &RocrQueue) -> Value {
    let mut v = crate::describe(&q.mem);
    v["amd_queue"] = json!(q.amd_queue);
    v
}

/// /dev/kfd, RUNTIME_ENABLE (as ROCr does) when asked; the runtime-enable result for the hello.
pub fn open(runtime_enable: bool) -> Result<(Device, Value)> {
    let device = crate::open_kfd()?;
    let runtime = if runtime_enable {
        json!(crate::runtime_enable(&device, uapi::runtime_enable::MODE_ENABLE_MASK))
    } else {
        Value::Null
    };
    Ok((device, runtime))
}

/// How a client waits for a completion: on the CPU, never asleep, as HIP's synchronize does.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Poll {
    /// A tight loop (`spin_loop` hints): HIP's hipDeviceScheduleSpin.
    Spin,
    /// The same loop with `sched_yield` in it: HIP's hipDeviceScheduleYield, which its default
    /// (Auto) picks when there are more active host threads than cores, as in the 2-vCPU VMs.
    Yield,
}

impl Poll {
    /// One turn of the waiting loop.
    pub fn wait(self) {
        match self {
            Poll::Spin => std::hint::spin_loop(),
            Poll::Yield => thread::yield_now(),
        }
    }
}

/// splitmix64 seeding a xorshift64*: reproducible streams from `--seed`, no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Self((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponential with mean `mean` (inter-arrival times of a Poisson process).
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }

    /// Uniform in `[mean (1 - spread), mean (1 + spread)]`, at least 1.
    pub fn around(&mut self, mean: u64, spread: f64) -> u64 {
        let spread = spread.clamp(0.0, 1.0);
        ((mean as f64) * (1.0 - spread + 2.0 * spread * self.unit())).round().max(1.0) as u64
    }

    /// Uniform integer in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo { lo } else { lo + self.next() % (hi - lo + 1) }
    }
}
