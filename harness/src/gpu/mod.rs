//! The model GPU: [`core::GpuCore`] (pure, exact) and its real-time driver, one thread per GPU,
//! which takes the clients' published packets from the shared region, runs the core to the
//! present, writes the read indices and completions back and wakes the clients; then sleeps on
//! the GPU's doorbell until a client publishes, a control acts, or the next completion is due.

pub mod core;

use std::{
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use gpreempt::{clock::monotonic_ns, domain::GpuId};

use self::core::{GpuCore, Side};
use crate::shm::{Shm, futex_wait, ring};

/// A queue of this GPU: its slot in the region, its client, what was taken from it.
struct Lane {
    slot: usize,
    client: usize,
    ingested: u64,
    reported: (u64, u64),
}

pub struct State {
    pub core: GpuCore,
    lanes: Vec<Lane>,
}

/// One model GPU.
pub struct ModelGpu {
    pub index: usize,
    pub id: GpuId,
    shm: Arc<Shm>,
    state: Mutex<State>,
}

/// The GPU id KFD would give GPU `index` (sysfs `gpuid`), as the emulator numbers them.
pub fn gpu_id(index: usize) -> GpuId {
    GpuId(0x1000 * (index as u32 + 1))
}

impl ModelGpu {
    pub fn new(index: usize, core: GpuCore, shm: Arc<Shm>) -> Self {
        Self { index, id: gpu_id(index), shm, state: Mutex::new(State { core, lanes: Vec::new() }) }
    }

    /// Serve `slot` of the region as a queue of `client` on this GPU; its index in the core.
    pub fn add_queue(&self, slot: usize, client: usize, side: Side) -> usize {
        let mut s = self.lock();
        s.lanes.push(Lane { slot, client, ingested: 0, reported: (0, 0) });
        s.core.add_queue(client, side)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Bring the model to the present, run `f` on it, publish the result; wakes the driver so it
    /// re-plans its next deadline.
    pub fn with<R>(&self, f: impl FnOnce(&mut GpuCore, u64) -> R) -> R {
        let r = {
            let mut s = self.lock();
            let now = monotonic_ns();
            self.sync(&mut s, now);
            let r = f(&mut s.core, now);
            self.reflect(&mut s);
            r
        };
        ring(&self.shm.doorbell[self.index]);
        r
    }

    /// Take the published packets and run the core to `now`.
    fn sync(&self, s: &mut State, now: u64) {
        let State { core, lanes } = s;
        for (q, lane) in lanes.iter_mut().enumerate() {
            let slot = &self.shm.queues[lane.slot];
            let w = slot.write.load(Ordering::Acquire);
            while lane.ingested < w {
                let (work, published) = slot.packet(lane.ingested);
                core.publish(now, q, work, published);
                lane.ingested += 1;
            }
        }
        core.advance(now);
    }

    /// Read indices and completions into the region; the clients with new completions woken.
    fn reflect(&self, s: &mut State) {
        let State { core, lanes } = s;
        for (q, lane) in lanes.iter_mut().enumerate() {
            let (started, completed) = core.indices(q);
            if (started, completed) == lane.reported {
                continue;
            }
            let slot = &self.shm.queues[lane.slot];
            slot.read.store(started, Ordering::Release);
            slot.completed.store(completed, Ordering::Release);
            if completed != lane.reported.1 {
                ring(&self.shm.client_wake[lane.client]);
            }
            lane.reported = (started, completed);
        }
    }

    /// The driver: until `stop`, serve doorbells and completions on time.
    pub fn run(&self, stop: &AtomicBool) {
        crate::shm::tight_timers();
        let doorbell = &self.shm.doorbell[self.index];
        while !stop.load(Ordering::Acquire) {
            let seen = doorbell.load(Ordering::Acquire);
            let next = {
                let mut s = self.lock();
                let now = monotonic_ns();
                self.sync(&mut s, now);
                self.reflect(&mut s);
                s.core.next_event().map(|t| t.saturating_sub(now))
            };
            // Woken by the doorbell or the due completion; at most 100 ms so `stop` is seen.
            let wait =
                next.map_or(Duration::from_millis(100), |ns| Duration::from_nanos(ns).min(Duration::from_millis(100)));
            if wait.is_zero() {
                continue;
            }
            futex_wait(doorbell, seen, Some(wait));
        }
    }

    /// A copy of the accounting and busy periods, brought to the present.
    pub fn snapshot(&self) -> (self::core::Accounting, Vec<self::core::BusyPeriod>) {
        self.with(|c, _| (c.accounting().clone(), c.busy_periods().to_vec()))
    }

    /// Whether `client` has a dispatch executing here now (its waves in flight).
    pub fn client_executing(&self, client: usize) -> bool {
        self.with(|c, _| (0..c.queue_count()).any(|q| c.client(q) == client && c.executing(q)))
    }

    /// This GPU's queue indices (in the core) of `client`.
    pub fn queues_of(&self, client: usize) -> Vec<usize> {
        let s = self.lock();
        s.lanes.iter().enumerate().filter(|(_, l)| l.client == client).map(|(q, _)| q).collect()
    }

    /// Region slots of `client` on this GPU.
    pub fn slots_of(&self, client: usize) -> Vec<usize> {
        let s = self.lock();
        s.lanes.iter().filter(|l| l.client == client).map(|l| l.slot).collect()
    }
}
