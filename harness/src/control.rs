//! The kernel boundary, modelled: the scheduler's `Control` side (the debug-trap session of one
//! offline process) and its `cu_occupancy` source, answering from the model GPUs.
//!
//! A SUSPEND or RESUME call blocks the calling thread (the scheduler's reaction thread) asleep —
//! it models an ioctl waiting on the HWS fence — for the profile's sampled duration plus one CWSR
//! save per queue executing when it began; for the whole call every queue of that GPU is unmapped
//! (the online ones too). Each call is stamped (entered, returned) for the harness's detection
//! and reaction figures. A process with no queue on the GPU costs nothing (`Batch.count` 0,
//! skipped), as the real session issues no ioctl for it.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use gpreempt::{
    clock::monotonic_ns,
    controller::{
        control::Control,
        target::TargetError,
        vocabulary::{Batch, DebugError, Detached, Options, Selection, SessionNotice},
    },
    domain::{GpuId, HostPid},
    kfd::uapi::QueueSnapshotEntry,
    schedule::seams::{ControlSide, Occupancy, OccupancySource},
};
use serde::Serialize;

use crate::{
    gpu::{ModelGpu, core::Side},
    profile::Profile,
    rng::Rng,
    shm::Shm,
};

/// SUSPEND or RESUME.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Call {
    Suspend,
    Resume,
}

/// One model ioctl, as the harness saw it.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Stamp {
    pub gpu: usize,
    pub client: usize,
    pub call: Call,
    /// CLOCK_MONOTONIC: entering and leaving the (model) kernel.
    pub entered_ns: u64,
    pub returned_ns: u64,
    /// Suspends of one GPU issued while it had no process held belong to a new transition.
    pub transition: u64,
    pub queues: usize,
}

/// Everything the model controls share.
pub struct World {
    pub shm: Arc<Shm>,
    pub gpus: Vec<Arc<ModelGpu>>,
    pub profile: Profile,
    /// Which client each pid is, and its side.
    pub clients: Mutex<BTreeMap<HostPid, (usize, Side)>>,
    pub stamps: Mutex<Vec<Stamp>>,
    /// Per GPU: processes held now, and the transitions so far.
    held: Mutex<Vec<(usize, u64)>>,
    /// The guest step stretch is charged by one control only (once per reaction step).
    stretch_taken: AtomicBool,
    seed: AtomicU64,
}

impl World {
    pub fn new(shm: Arc<Shm>, gpus: Vec<Arc<ModelGpu>>, profile: Profile, seed: u64) -> Self {
        let n = gpus.len();
        Self {
            shm,
            gpus,
            profile,
            clients: Mutex::new(BTreeMap::new()),
            stamps: Mutex::new(Vec::new()),
            held: Mutex::new(vec![(0, 0); n]),
            stretch_taken: AtomicBool::new(false),
            seed: AtomicU64::new(seed),
        }
    }

    fn client_of(&self, pid: HostPid) -> Option<(usize, Side)> {
        self.clients.lock().ok()?.get(&pid).copied()
    }

    fn rng(&self) -> Rng {
        Rng::new(self.seed.fetch_add(1, Ordering::Relaxed))
    }

    pub fn stamps(&self) -> Vec<Stamp> {
        self.stamps.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// Sleep until the CLOCK_MONOTONIC deadline (not a spin: the ioctl waits on a fence).
fn sleep_until(deadline_ns: u64) {
    let ts = libc::timespec { tv_sec: (deadline_ns / 1_000_000_000) as _, tv_nsec: (deadline_ns % 1_000_000_000) as _ };
    // SAFETY: a valid timespec; an absolute sleep on CLOCK_MONOTONIC (EINTR: the loop below).
    while unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) }
        == libc::EINTR
    {}
}

/// Busy for `ns` on this thread's CPU (the kernel's register walk of a `cu_occupancy` read).
fn spin_for(ns: u64) {
    let end = monotonic_ns() + ns;
    while monotonic_ns() < end {
        std::hint::spin_loop();
    }
}

/// The `ControlSide` seam: attaches model sessions.
#[derive(Clone)]
pub struct ModelSide(pub Arc<World>);

/// One offline (or, for its snapshot, online) process's model session.
pub struct ModelControl {
    world: Arc<World>,
    pid: HostPid,
    client: usize,
    /// GPUs it is held on.
    held: Vec<usize>,
    rng: Rng,
    stretch: bool,
}

impl ControlSide for ModelSide {
    type Control = ModelControl;

    fn attach(&self, pid: HostPid, _options: &Options) -> Result<ModelControl, DebugError> {
        let (client, side) = self.0.client_of(pid).ok_or(DebugError::Target(TargetError::NoSuchProcess(pid)))?;
        let mut c =
            ModelControl { world: self.0.clone(), pid, client, held: Vec::new(), rng: self.0.rng(), stretch: false };
        if side == Side::Offline {
            c.claim_stretch();
        }
        Ok(c)
    }
}

impl ModelControl {
    /// Charge the guest step stretch from this control's `notices` (the first offline one).
    fn claim_stretch(&mut self) {
        self.stretch =
            self.world.profile.step_stretch.is_some() && !self.world.stretch_taken.swap(true, Ordering::AcqRel);
    }

    fn gpu_index(&self, gpu: GpuId) -> Option<usize> {
        self.world.gpus.iter().position(|g| g.id == gpu)
    }

    /// One model ioctl on GPU `g`: unmap, sleep, remap with this process's queues (un)suspended.
    fn call(&mut self, g: usize, call: Call) -> Batch {
        let gpu = self.world.gpus[g].clone();
        let queues = gpu.queues_of(self.client);
        let transition = {
            let mut held = self.world.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let (n, t) = &mut held[g];
            if call == Call::Suspend {
                if *n == 0 {
                    *t += 1;
                }
                *n += 1;
            } else {
                *n = n.saturating_sub(1);
            }
            *t
        };
        let entered = monotonic_ns();
        let saves = gpu.with(crate::gpu::core::GpuCore::unmap_begin);
        let p = &self.world.profile;
        let base = match call {
            Call::Suspend => p.suspend.sample(&mut self.rng),
            Call::Resume => p.resume.sample(&mut self.rng),
        };
        sleep_until(entered + base + saves as u64 * p.save_ns);
        gpu.with(|core, now| match call {
            Call::Suspend => core.unmap_end(now, &queues, &[]),
            Call::Resume => core.unmap_end(now, &[], &queues),
        });
        let returned = monotonic_ns();
        if let Ok(mut s) = self.world.stamps.lock() {
            s.push(Stamp {
                gpu: g,
                client: self.client,
                call,
                entered_ns: entered,
                returned_ns: returned,
                transition,
                queues: queues.len(),
            });
        }
        Batch { count: queues.len() as i32, latency_ns: returned - entered, ..Batch::default() }
    }

    pub fn pid(&self) -> HostPid {
        self.pid
    }
}

impl Control for ModelControl {
    fn suspend(&mut self, selection: &Selection) -> Result<Batch, DebugError> {
        let gpus: Vec<usize> = match selection {
            Selection::Gpu(gpu) => self.gpu_index(*gpu).into_iter().collect(),
            Selection::All | Selection::Ids(_) => (0..self.world.gpus.len()).collect(),
        };
        let mut total = Batch { skipped: true, ..Batch::default() };
        for g in gpus {
            if self.held.contains(&g) || self.world.gpus[g].queues_of(self.client).is_empty() {
                continue;
            }
            let b = self.call(g, Call::Suspend);
            self.held.push(g);
            total.count += b.count;
            total.latency_ns += b.latency_ns;
            total.skipped = false;
        }
        Ok(total)
    }

    fn resume_gpu(&mut self, gpu: GpuId) -> Result<Batch, DebugError> {
        let Some(g) = self.gpu_index(gpu).filter(|g| self.held.contains(g)) else {
            return Ok(Batch { skipped: true, ..Batch::default() });
        };
        self.held.retain(|h| *h != g);
        Ok(self.call(g, Call::Resume))
    }

    fn resume(&mut self) -> Result<Batch, DebugError> {
        let mut total = Batch { skipped: true, ..Batch::default() };
        for g in self.held.clone() {
            let b = self.resume_gpu(self.world.gpus[g].id)?;
            total.count += b.count;
            total.latency_ns += b.latency_ns;
            total.skipped &= b.skipped;
        }
        Ok(total)
    }

    /// Its queues as GET_QUEUE_SNAPSHOT gives them: the index addresses in the client's memory.
    fn snapshot(&mut self) -> Result<Vec<QueueSnapshotEntry>, DebugError> {
        let mut out = Vec::new();
        for gpu in &self.world.gpus {
            for slot in gpu.slots_of(self.client) {
                let q = &self.world.shm.queues[slot];
                out.push(QueueSnapshotEntry {
                    queue_id: slot as u32,
                    gpu_id: gpu.id.0,
                    read_pointer_address: q.read_addr.load(Ordering::Acquire),
                    write_pointer_address: q.write_addr.load(Ordering::Acquire),
                    ..QueueSnapshotEntry::default()
                });
            }
        }
        Ok(out)
    }

    /// Called at every reaction step: in the emulator profile, one control sleeps the guest's
    /// extra wake-up delay here, so the real loop steps at the guest's cadence.
    fn notices(&mut self, _now_ns: u64) -> Vec<SessionNotice> {
        if self.stretch
            && let Some(d) = &self.world.profile.step_stretch
        {
            let extra = d.sample(&mut self.rng);
            if extra > 0 {
                sleep_until(monotonic_ns() + extra);
            }
        }
        Vec::new()
    }

    fn comm(&self) -> String {
        format!("client-{}", self.client)
    }

    fn detach(mut self) -> Detached {
        let resumed = self.resume().map_or(0, |b| b.count.max(0) as usize);
        Detached { resumed, disabled: true, signals_forwarded: 0 }
    }
}

/// `cu_occupancy` of one online process on one GPU.
pub struct ModelOccupancy {
    gpu: Arc<ModelGpu>,
    client: usize,
    world: Arc<World>,
    rng: std::cell::RefCell<Rng>,
}

impl Occupancy for ModelOccupancy {
    fn gpu(&self) -> GpuId {
        self.gpu.id
    }

    /// Spins for the profile's read cost (CPU work in the kernel, counted as gpreempt's), then
    /// answers whether the process has waves in flight on the GPU.
    fn busy(&self) -> Option<bool> {
        let cost = self.world.profile.occupancy_read.sample(&mut self.rng.borrow_mut());
        spin_for(cost);
        Some(self.gpu.client_executing(self.client))
    }
}

/// The `OccupancySource` seam.
pub struct ModelOccupancySource(pub Arc<World>);

impl OccupancySource for ModelOccupancySource {
    fn open(&self, pid: HostPid) -> Vec<Box<dyn Occupancy>> {
        let Some((client, _)) = self.0.client_of(pid) else { return Vec::new() };
        self.0
            .gpus
            .iter()
            .filter(|g| !g.queues_of(client).is_empty())
            .map(|g| {
                let rng = std::cell::RefCell::new(self.0.rng());
                Box::new(ModelOccupancy { gpu: g.clone(), client, world: self.0.clone(), rng }) as Box<dyn Occupancy>
            })
            .collect()
    }
}
