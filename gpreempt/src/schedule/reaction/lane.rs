//! One GPU's policy and what the reaction thread knows of the online work there.

use crate::{
    domain::{GpuId, HostPid},
    schedule::{
        policy::{PolicyConfig, PolicyMachine},
        runnable::RunnableTarget,
        seams::Occupancy,
    },
};

/// One GPU's policy and what it knows of the online work there.
pub(super) struct Lane {
    pub gpu: GpuId,
    pub policy: PolicyMachine,
    /// Online work pending in the indices at this step.
    pub pending: bool,
    /// An online process with queues here exited since the last step.
    pub online_gone: bool,
    /// The last step that saw no online work here.
    pub quiet_ns: u64,
    /// When the current online burst was first seen (for the reaction).
    pub visible_ns: Option<u64>,
    /// Some online queue is on this GPU (hints count only then).
    pub online_queues: usize,
    /// The online processes' `cu_occupancy` files of this GPU: waves in flight, which the
    /// indices no longer show once a dispatch has started. Read every `occupancy_ns` (the kernel
    /// asks the hardware: too costly for every step), and at once when an idle resume is due, so
    /// a running online dispatch is never taken for an idle GPU.
    pub occupancy: Vec<(HostPid, Box<dyn Occupancy>)>,
    /// When the files were last read, and whether they showed waves.
    occupancy_read: Option<(u64, bool)>,
    /// The earliest doorbell store seen on this GPU since its last step (the probe's stamp).
    pub doorbell_ns: Option<u64>,
    /// The store that made the current online burst visible, for its detection figure.
    pub published_ns: Option<u64>,
    /// Online work was seen here at the last step.
    pub active: bool,
    /// The arrival probe saw a request for an online process here since the online work was
    /// last seen coming back after a gap: the work that ends the next gap may be its first (a
    /// request that arrived during another's work has its hold ended by that work, so its own
    /// first work after the gap finds no hold open).
    pub arrived_since_gap: bool,
    /// `--runnable`: when the offline processes here last rotated.
    pub rotated_ns: u64,
    /// `--runnable auto`: how many of them run here, learnt.
    pub runnable: RunnableTarget,
}

impl Lane {
    pub fn new(gpu: GpuId, policy: PolicyConfig, now: u64) -> Self {
        Self {
            gpu,
            policy: PolicyMachine::new(policy),
            pending: false,
            online_gone: false,
            quiet_ns: now,
            visible_ns: None,
            online_queues: 0,
            occupancy: Vec::new(),
            occupancy_read: None,
            doorbell_ns: None,
            published_ns: None,
            active: false,
            arrived_since_gap: false,
            rotated_ns: now,
            runnable: RunnableTarget::default(),
        }
    }

    /// Online waves on this GPU now, from the files (a read stays good for `max_age_ns`).
    ///
    /// A busy reading is reused for a quarter of the idle threshold at most: it says the GPU was
    /// busy when it was read, and each step it is reused restarts the policy's idle clock, so a
    /// reading kept for `max_age_ns` (10 ms by default) held the offline work for that long after
    /// the online work ended (the native harness: offline kept 79 % against 84 % with fresh
    /// reads, MI300X profile, Poisson). An idle reading may wait `max_age_ns`: submissions are
    /// seen in the indices and the probe, and a fresh read precedes every idle resume.
    pub fn occupied_now(&mut self, now: u64, max_age_ns: u64) -> bool {
        let busy_max_age = self.policy.idle_threshold_ns() / 4;
        if let Some((at, busy)) = self.occupancy_read
            && (at == now || now.saturating_sub(at) < if busy { max_age_ns.min(busy_max_age) } else { max_age_ns })
        {
            return busy;
        }
        let busy = self.occupancy.iter().any(|(_, f)| f.busy() == Some(true));
        self.occupancy_read = Some((now, busy));
        busy
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    };

    use super::*;

    /// A reader that says what `busy` holds and counts its reads.
    struct Scripted {
        busy: Arc<AtomicBool>,
        reads: Arc<AtomicUsize>,
    }

    impl crate::schedule::seams::Occupancy for Scripted {
        fn gpu(&self) -> GpuId {
            GpuId(0x1000)
        }
        fn busy(&self) -> Option<bool> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            Some(self.busy.load(Ordering::SeqCst))
        }
    }

    #[test]
    fn a_busy_reading_is_reused_for_a_quarter_of_the_idle_threshold_an_idle_one_for_the_interval() {
        const MS: u64 = 1_000_000;
        let policy = PolicyConfig { idle: std::time::Duration::from_millis(2), ..PolicyConfig::default() };
        let mut lane = Lane::new(GpuId(0x1000), policy, 0);
        let (busy, reads) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicUsize::new(0)));
        lane.occupancy.push((HostPid(7), Box::new(Scripted { busy: busy.clone(), reads: reads.clone() })));
        let interval = 10 * MS;
        // Busy at 0: reused until 0.5 ms (2 ms / 4), read again after.
        assert!(lane.occupied_now(0, interval));
        assert!(lane.occupied_now(MS / 2 - 1, interval));
        assert_eq!(reads.load(Ordering::SeqCst), 1);
        busy.store(false, Ordering::SeqCst);
        assert!(!lane.occupied_now(MS / 2, interval));
        assert_eq!(reads.load(Ordering::SeqCst), 2);
        // Idle: reused for the whole interval, unless a fresh one is asked for (max age 0).
        assert!(!lane.occupied_now(MS / 2 + interval - 1, interval));
        assert_eq!(reads.load(Ordering::SeqCst), 2);
        assert!(!lane.occupied_now(MS, 0));
        assert_eq!(reads.load(Ordering::SeqCst), 3);
    }
}
