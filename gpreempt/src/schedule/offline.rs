//! One offline process as the reaction thread holds it: its debug-trap session, the GPUs it is
//! held on, and what its own queues show.
//!
//! **Idle offline processes cost no ioctl** (`--defer-idle-offline`; off by default: the late
//! suspends it leaves inside online requests cost the online P99 more than the ioctls it saves,
//! BENCHMARKS §9.4). On HWS GPUs every SUSPEND_QUEUES unmaps every queue
//! of the device, the online ones too, and KFD takes one process per call (docs/kfd.md), so each
//! offline process held costs the online work one unmap per transition. An offline process with
//! nothing on a GPU at the moment that GPU is held — every one of its queues there with
//! `read == write` (no packet waiting: the CP moves the read index when it takes a packet, as for
//! the online queues, see [`super::online`]) and its `cu_occupancy` there 0 (no wave of it in
//! flight: a dispatch already taken still runs) — has nothing to preempt: it is *deferred*
//! instead, its GPU counted as held without a call. The reaction thread reads the deferred
//! queues' write indices at every step while the GPU is held, and suspends the process at its
//! first submission (one poll interval after it at most; the online work shares the GPU with
//! that one packet meanwhile). A resume of the GPU ends the deferral with no call either.
//!
//! Its queues' index addresses come from the snapshot at attach (GET_QUEUE_SNAPSHOT gives
//! `read_pointer_address` and `write_pointer_address` of every queue, kfd_ioctl.h
//! `kfd_queue_snapshot_entry`) and from one more snapshot each time the session reports queues
//! it created (EC_QUEUE_NEW): no ioctl per transition. Where `cu_occupancy` cannot be read
//! (kernels before 5.x, GPUs before gfx9) or the indices cannot, it is never taken for idle.
//!
//! **Gangs** (`--gang`): the offline processes of one job (one selector: a container or a pod;
//! the pids given on the command line together) are held on every GPU they use whenever any
//! GPU they share with online work is held: a data-parallel job whose rank on the online GPU is
//! held stalls its other ranks at their next collective anyway, and held they leave those GPUs
//! free instead of spinning there.

use super::{online::read_u64s, seams::Occupancy};
use crate::{
    controller::{control::Control, vocabulary::DebugError},
    domain::{GpuId, HostPid},
    host::{roots::Roots, select::Selector},
    kfd::uapi::QueueSnapshotEntry,
    model::QueueAddrs,
};

/// Which job an offline process belongs to, for `--gang`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(pub u32);

/// The job of offline process `pid` among the `--offline` selectors: a container or pod
/// selector is one job, every pid selector together another (the pids given together).
pub fn job_of(selectors: &[Selector], roots: &Roots, pid: HostPid) -> JobId {
    let first_pid = selectors.iter().position(|s| matches!(s, Selector::Pid(_)));
    let i = selectors.iter().position(|s| s.matches_new(roots, pid)).unwrap_or(selectors.len());
    let job = match selectors.get(i) {
        Some(Selector::Pid(_)) => first_pid.unwrap_or(i),
        _ => i,
    };
    JobId(job as u32)
}

/// One offline process held by the reaction thread.
pub(super) struct Offline<C> {
    pub pid: HostPid,
    pub control: C,
    pub job: JobId,
    /// GPUs it is suspended on (the kernel's state).
    held: Vec<GpuId>,
    /// GPUs held without an ioctl because it had nothing there, with the sum of its write
    /// indices there at that moment (a moved sum is a submission).
    deferred: Vec<(GpuId, u64)>,
    /// `--gang`: the GPUs whose policy holds its job now (it is suspended everywhere while any).
    gang_holds: Vec<GpuId>,
    /// `--runnable`: the GPUs it is parked on (suspended while the GPU has no online work, so
    /// that fewer offline processes run there and fewer SUSPENDs are due when online work comes).
    /// A subset of `held`; no policy's hold.
    parked: Vec<GpuId>,
    /// `--runnable`: per GPU, when its current turn (running or parked there) began, ns.
    turns: Vec<(GpuId, u64)>,
    /// Its queues' index addresses.
    queues: Vec<QueueAddrs>,
    /// The last snapshot of its new queues failed: never taken for idle until one succeeds.
    stale: bool,
    /// Its waves in flight per GPU.
    occupancy: Vec<Box<dyn Occupancy>>,
    addrs: Vec<u64>,
    values: Vec<u64>,
}

/// What its queues on one GPU show now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Indices {
    /// Sum of the write indices.
    writes: u64,
    /// Some queue has `write > read`.
    pending: bool,
}

impl<C: Control> Offline<C> {
    pub fn new(
        pid: HostPid,
        control: C,
        job: JobId,
        snapshot: &[QueueSnapshotEntry],
        occupancy: Vec<Box<dyn Occupancy>>,
    ) -> Self {
        let mut p = Self {
            pid,
            control,
            job,
            held: Vec::new(),
            deferred: Vec::new(),
            gang_holds: Vec::new(),
            parked: Vec::new(),
            turns: Vec::new(),
            queues: Vec::new(),
            stale: false,
            occupancy,
            addrs: Vec::new(),
            values: Vec::new(),
        };
        p.learn(snapshot);
        p
    }

    fn learn(&mut self, snapshot: &[QueueSnapshotEntry]) {
        self.queues = snapshot.iter().map(QueueAddrs::of_snapshot).collect();
    }

    /// It created queues: learn their addresses (one GET_QUEUE_SNAPSHOT, clearing nothing).
    pub fn refresh_queues(&mut self) -> Result<(), DebugError> {
        let snapshot = self.control.snapshot();
        self.stale = snapshot.is_err();
        self.learn(&snapshot?);
        Ok(())
    }

    /// The GPUs it has queues on, each once.
    pub fn gpus(&self) -> Vec<GpuId> {
        let mut gpus: Vec<GpuId> = self.queues.iter().map(|q| q.gpu_id).collect();
        gpus.sort_unstable();
        gpus.dedup();
        gpus
    }

    pub fn has_queues_on(&self, gpu: GpuId) -> bool {
        self.queues.iter().any(|q| q.gpu_id == gpu)
    }

    /// Its queues' indices on `gpu` (None: no queue there, or unreadable).
    fn indices(&mut self, gpu: GpuId) -> Option<Indices> {
        self.addrs.clear();
        for q in self.queues.iter().filter(|q| q.gpu_id == gpu) {
            self.addrs.extend([q.read, q.write]);
        }
        if self.addrs.is_empty() {
            return None;
        }
        self.values.clear();
        self.values.resize(self.addrs.len(), 0);
        read_u64s(self.pid, &self.addrs, &mut self.values).ok()?;
        let mut out = Indices { writes: 0, pending: false };
        for rw in self.values.chunks_exact(2) {
            out.writes = out.writes.wrapping_add(rw[1]);
            out.pending |= rw[1] > rw[0];
        }
        Some(out)
    }

    /// Nothing of it to preempt on `gpu` now: its queues there all drained and no wave of it in
    /// flight. Returns the sum of its write indices there, to watch while deferred.
    pub fn idle_on(&mut self, gpu: GpuId) -> Option<u64> {
        if self.stale {
            return None;
        }
        let seen = self.indices(gpu)?;
        if seen.pending {
            return None;
        }
        let waves = self.occupancy.iter().find(|o| o.gpu() == gpu)?.busy()?;
        if waves {
            return None;
        }
        // A packet published between the two reads shows in the write sum at the next watch.
        Some(seen.writes)
    }

    /// Deferred on `gpu`: has it submitted since (or can its queues no longer be read)?
    fn submitted_since(&mut self, gpu: GpuId, writes: u64) -> bool {
        self.indices(gpu).is_none_or(|now| now.pending || now.writes != writes)
    }

    /// Suspended or deferred on `gpu` for its policy (parked is no policy's hold).
    pub fn holds(&self, gpu: GpuId) -> bool {
        (self.held.contains(&gpu) && !self.parked.contains(&gpu)) || self.deferred.iter().any(|(g, _)| *g == gpu)
    }

    /// `--runnable`: suspended on `gpu` while it has no online work, from `now`.
    pub fn park(&mut self, gpu: GpuId, now: u64) {
        if !self.held.contains(&gpu) {
            self.held.push(gpu);
        }
        if !self.parked.contains(&gpu) {
            self.parked.push(gpu);
        }
        self.begin_turn(gpu, now);
    }

    /// `--runnable`: it runs on `gpu` again, from `now`.
    pub fn unpark(&mut self, gpu: GpuId, now: u64) {
        self.parked.retain(|g| *g != gpu);
        self.held.retain(|g| *g != gpu);
        self.begin_turn(gpu, now);
    }

    pub fn is_parked_on(&self, gpu: GpuId) -> bool {
        self.parked.contains(&gpu)
    }

    /// When its current turn on `gpu` (running or parked) began (0: since it was attached).
    pub fn turn_began(&self, gpu: GpuId) -> u64 {
        self.turns.iter().find(|(g, _)| *g == gpu).map_or(0, |(_, t)| *t)
    }

    fn begin_turn(&mut self, gpu: GpuId, now: u64) {
        self.turns.retain(|(g, _)| *g != gpu);
        self.turns.push((gpu, now));
    }

    /// Its queues on `gpu` are suspended (the kernel's state).
    pub fn hold(&mut self, gpu: GpuId) {
        self.held.push(gpu);
    }

    /// Its queues on `gpu` run again.
    pub fn release(&mut self, gpu: GpuId) {
        self.held.retain(|g| *g != gpu);
    }

    /// Suspended on `gpu` (deferred is not).
    pub fn is_held_on(&self, gpu: GpuId) -> bool {
        self.held.contains(&gpu)
    }

    /// Suspended on some GPU.
    pub fn is_held(&self) -> bool {
        !self.held.is_empty()
    }

    /// Held on `gpu` with no ioctl: nothing of it there, its write indices summing to `writes`.
    pub fn defer(&mut self, gpu: GpuId, writes: u64) {
        self.deferred.push((gpu, writes));
    }

    /// `gpu` runs again: its deferral there (if any) ends with no ioctl.
    pub fn undefer(&mut self, gpu: GpuId) {
        self.deferred.retain(|(g, _)| *g != gpu);
    }

    /// Deferred on `gpu`.
    pub fn is_deferred_on(&self, gpu: GpuId) -> bool {
        self.deferred.iter().any(|(g, _)| *g == gpu)
    }

    /// The next of its deferrals, from the `*cursor`-th on, in which it submitted (or whose
    /// queues can no longer be read): no longer deferred there, its GPU to suspend now. The
    /// cursor moves past those it did not submit in, each read once per call sequence.
    pub fn next_submission(&mut self, cursor: &mut usize) -> Option<GpuId> {
        while let Some(&(gpu, writes)) = self.deferred.get(*cursor) {
            if self.submitted_since(gpu, writes) {
                self.deferred.remove(*cursor);
                return Some(gpu);
            }
            *cursor += 1;
        }
        None
    }

    /// Every GPU it is suspended or deferred on (those first, then these).
    pub fn held_or_deferred(&self) -> Vec<GpuId> {
        self.held.iter().copied().chain(self.deferred.iter().map(|(g, _)| *g)).collect()
    }

    /// `--gang`: its job is held by `holds` and it is suspended on all of its GPUs.
    pub fn gang_held_by(&mut self, holds: Vec<GpuId>) {
        self.held = self.gpus();
        self.gang_holds = holds;
    }

    /// `--gang`: `gpu`'s policy holds its job too.
    pub fn join_gang_hold(&mut self, gpu: GpuId) {
        if !self.gang_holds.contains(&gpu) {
            self.gang_holds.push(gpu);
        }
    }

    /// `--gang`: `gpu`'s policy no longer holds its job (it stays suspended while another does).
    pub fn leave_gang_hold(&mut self, gpu: GpuId) {
        self.gang_holds.retain(|g| *g != gpu);
    }

    /// `--gang`: which GPUs' policies hold its job, seen from `gpu`.
    pub fn gang_holds(&self, gpu: GpuId) -> GangHolds {
        match self.gang_holds.as_slice() {
            [] => GangHolds::None,
            [only] if *only == gpu => GangHolds::OnlyThis,
            _ => GangHolds::Others,
        }
    }

    /// Suspended nowhere (a RESUME of every queue of it was asked for).
    pub fn release_all(&mut self) {
        self.held.clear();
        self.parked.clear();
    }

    /// Its session's watchdog resumed every queue of it: no hold is left but its deferrals.
    /// Returns the GPUs it was suspended on.
    pub fn resumed_by_watchdog(&mut self) -> Vec<GpuId> {
        self.gang_holds.clear();
        self.parked.clear();
        std::mem::take(&mut self.held)
    }
}

/// `--gang`: the GPUs whose policies hold an offline process's job, seen from one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GangHolds {
    /// None: its job runs.
    None,
    /// This GPU's alone.
    OnlyThis,
    /// Another GPU's (this one's too or not).
    Others,
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    };

    use super::*;
    use crate::controller::vocabulary::{Batch, Detached, Selection, SessionNotice};

    /// A control whose snapshot is this process's own two "queues" (index pairs in our memory).
    struct Own(Vec<QueueSnapshotEntry>);

    impl Control for Own {
        fn suspend(&mut self, _: &Selection) -> Result<Batch, DebugError> {
            Ok(Batch::default())
        }
        fn resume(&mut self) -> Result<Batch, DebugError> {
            Ok(Batch::default())
        }
        fn resume_gpu(&mut self, _: GpuId) -> Result<Batch, DebugError> {
            Ok(Batch::default())
        }
        fn snapshot(&mut self) -> Result<Vec<QueueSnapshotEntry>, DebugError> {
            Ok(self.0.clone())
        }
        fn notices(&mut self, _: u64) -> Vec<SessionNotice> {
            Vec::new()
        }
        fn comm(&self) -> String {
            "own".into()
        }
        fn detach(self) -> Detached {
            Detached::default()
        }
    }

    struct Waves(GpuId, Arc<AtomicBool>);

    impl Occupancy for Waves {
        fn gpu(&self) -> GpuId {
            self.0
        }
        fn busy(&self) -> Option<bool> {
            Some(self.1.load(Ordering::Relaxed))
        }
    }

    fn entry(id: u32, gpu: u32, rw: &[AtomicU64; 2]) -> QueueSnapshotEntry {
        QueueSnapshotEntry {
            queue_id: id,
            gpu_id: gpu,
            read_pointer_address: rw[0].as_ptr() as u64,
            write_pointer_address: rw[1].as_ptr() as u64,
            ..QueueSnapshotEntry::default()
        }
    }

    #[test]
    fn idle_only_with_every_queue_drained_and_no_wave_then_a_write_ends_the_deferral() {
        let a = Box::new([AtomicU64::new(3), AtomicU64::new(3)]);
        let b = Box::new([AtomicU64::new(7), AtomicU64::new(9)]);
        let waves = Arc::new(AtomicBool::new(false));
        let pid = HostPid(std::process::id());
        let snapshot = vec![entry(1, 0x10, &a), entry(2, 0x20, &b)];
        let occupancy: Vec<Box<dyn Occupancy>> =
            vec![Box::new(Waves(GpuId(0x10), waves.clone())), Box::new(Waves(GpuId(0x20), waves.clone()))];
        let mut p = Offline::new(pid, Own(snapshot.clone()), JobId(0), &snapshot, occupancy);
        assert_eq!(p.gpus(), vec![GpuId(0x10), GpuId(0x20)]);
        // GPU 0x20: two packets waiting. GPU 0x30: no queue of it (not idle: nothing to watch).
        assert_eq!(p.idle_on(GpuId(0x20)), None);
        assert_eq!(p.idle_on(GpuId(0x30)), None);
        // GPU 0x10: drained; a wave in flight still makes it busy.
        waves.store(true, Ordering::Relaxed);
        assert_eq!(p.idle_on(GpuId(0x10)), None);
        waves.store(false, Ordering::Relaxed);
        assert_eq!(p.idle_on(GpuId(0x10)), Some(3));
        assert!(!p.submitted_since(GpuId(0x10), 3));
        // One packet published (read back through process_vm_readv)...
        a[1].store(4, Ordering::Release);
        assert!(p.submitted_since(GpuId(0x10), 3));
        // ...and taken at once by the CP: the write sum still moved.
        a[0].store(4, Ordering::Release);
        assert!(p.submitted_since(GpuId(0x10), 3));
        drop((a, b));
    }

    #[test]
    fn its_holds_are_kept_per_gpu_and_a_gang_is_resumed_by_its_last_hold() {
        let (a, b) = (GpuId(0x10), GpuId(0x20));
        let rw = Box::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let snapshot = vec![entry(1, 0x10, &rw), entry(2, 0x20, &rw)];
        let mut p = Offline::new(HostPid(std::process::id()), Own(snapshot.clone()), JobId(0), &snapshot, Vec::new());
        p.hold(a);
        p.defer(b, 5);
        assert!(p.is_held() && p.is_held_on(a) && !p.is_held_on(b));
        assert!(p.holds(a) && p.holds(b));
        assert_eq!(p.held_or_deferred(), vec![a, b]);
        p.undefer(b);
        p.release(a);
        assert!(!p.is_held() && !p.holds(a) && !p.holds(b));
        // `--gang`: held on both GPUs by A's policy; B's joins; each leaves in turn.
        p.gang_held_by(vec![a]);
        assert_eq!((p.gang_holds(a), p.gang_holds(b)), (GangHolds::OnlyThis, GangHolds::Others));
        assert!(p.is_held_on(a) && p.is_held_on(b));
        p.join_gang_hold(b);
        p.join_gang_hold(b);
        p.leave_gang_hold(a);
        assert_eq!((p.gang_holds(a), p.gang_holds(b)), (GangHolds::Others, GangHolds::OnlyThis));
        // The watchdog ends every hold but the deferrals.
        p.defer(a, 1);
        assert_eq!(p.resumed_by_watchdog(), vec![a, b]);
        assert_eq!((p.gang_holds(b), p.is_held(), p.holds(a)), (GangHolds::None, false, true));
        drop(rw);
    }

    #[test]
    fn the_next_submission_is_taken_once_and_the_cursor_skips_the_quiet_deferrals() {
        let a = Box::new([AtomicU64::new(3), AtomicU64::new(3)]);
        let b = Box::new([AtomicU64::new(7), AtomicU64::new(7)]);
        let snapshot = vec![entry(1, 0x10, &a), entry(2, 0x20, &b)];
        let mut p = Offline::new(HostPid(std::process::id()), Own(snapshot.clone()), JobId(0), &snapshot, Vec::new());
        p.defer(GpuId(0x10), 3);
        p.defer(GpuId(0x20), 7);
        let mut cursor = 0;
        assert_eq!(p.next_submission(&mut cursor), None);
        assert_eq!(cursor, 2);
        b[1].store(8, Ordering::Release);
        let mut cursor = 0;
        assert_eq!(p.next_submission(&mut cursor), Some(GpuId(0x20)));
        assert_eq!(cursor, 1);
        assert_eq!(p.next_submission(&mut cursor), None);
        assert_eq!(p.held_or_deferred(), vec![GpuId(0x10)]);
        drop((a, b));
    }
}
