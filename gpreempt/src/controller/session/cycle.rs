//! The one cycle implementation: SUSPEND_QUEUES (a snapshot first when the target has new
//! queues, one retry of ids that came back INVALID) and RESUME_QUEUES of what was suspended.
//!
//! The ids the kernel confirms suspended are recorded as soon as each SUSPEND returns, before
//! anything else can fail, so every exit path knows what to resume. A cycle allocates nothing:
//! the id arrays and the snapshot buffer keep their capacity across cycles.

use std::os::fd::AsFd;

use nix::errno::Errno;

use super::{MAX_QUEUES_PER_PROCESS, QUEUE_NEW, Session};
use crate::{
    clock::monotonic_ns,
    controller::vocabulary::{Batch, DebugError, Selection, SessionNotice},
    domain::{DebugTrapOp, GpuId, QueueId},
    kfd::{
        dbg_trap,
        uapi::{QueueOutcome, QueueResult, QueueSnapshotEntry, decode_outcomes, queue_status},
    },
};

/// One SUSPEND_QUEUES or RESUME_QUEUES (retry included) without its per-queue verdicts, so a
/// cycle allocates nothing; the verdicts are in [`Session::outcomes`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// The ioctl's return value(s): queues suspended/resumed.
    pub count: i32,
    pub done: u32,
    pub invalid: u32,
    /// RESUME: ids the hardware failed on.
    pub error: u32,
    /// SUSPEND: ids that came back with ERROR — the driver reset them (gone, never retried).
    pub reset: u32,
    /// Ids retried once after a re-snapshot because they came back INVALID.
    pub retried: u32,
    /// Time inside the ioctl(s), ns.
    pub latency_ns: u64,
    /// CLOCK_MONOTONIC just before the (first) ioctl and just after the (last) one.
    pub called_ns: u64,
    pub returned_ns: u64,
    /// No ioctl was needed (nothing to suspend or resume).
    pub skipped: bool,
}

impl Tally {
    /// One RESUME_QUEUES that returned `count` and wrote its verdicts into `array`.
    fn of_ioctl(count: i32, array: &[u32], called_ns: u64, returned_ns: u64) -> Self {
        let (done, invalid, error) = verdicts(array);
        Self {
            count,
            done,
            invalid,
            error,
            reset: 0,
            retried: 0,
            latency_ns: returned_ns - called_ns,
            called_ns,
            returned_ns,
            skipped: false,
        }
    }

    /// One SUSPEND_QUEUES: its ERROR ids are resets, not errors.
    fn of_suspend(count: i32, array: &[u32], called_ns: u64, returned_ns: u64) -> Self {
        let (_, _, reset) = verdicts(array);
        Self { error: 0, reset, ..Self::of_ioctl(count, array, called_ns, returned_ns) }
    }

    fn skipped(now_ns: u64) -> Self {
        Self { skipped: true, called_ns: now_ns, returned_ns: now_ns, ..Self::default() }
    }
}

impl Session {
    /// Queues suspended mid-hold (created while an `All` suspend was held) since the last suspend.
    pub fn late_suspended(&self) -> u32 {
        self.late_suspended
    }

    /// End a hold: the watchdog's RESUME if it already fired during the hold (`true`: the hold
    /// outlived `max_suspend`), otherwise [`Session::resume_tally`] now (`false`).
    pub fn resume_held(&mut self) -> Result<(Tally, bool), DebugError> {
        match self.watchdog_resume.take() {
            Some(t) => Ok((t, true)),
            None => Ok((self.resume_tally()?, false)),
        }
    }

    /// GET_QUEUE_SNAPSHOT. `clear_new` clears EC_QUEUE_NEW on the reported queues, which makes
    /// them suspendable; without it the snapshot changes nothing in the target.
    pub fn snapshot(&mut self, clear_new: bool) -> Result<&[QueueSnapshotEntry], DebugError> {
        self.check_alive()?;
        self.snapshot_into(if clear_new { QUEUE_NEW } else { 0 })?;
        Ok(&self.snap)
    }

    /// SUSPEND_QUEUES (snapshot first for `All`, one retry of INVALID ids after a re-snapshot),
    /// with the per-queue verdicts.
    pub fn suspend(&mut self, selection: &Selection, grace_period: u32) -> Result<Batch, DebugError> {
        let t = self.suspend_tally(selection, grace_period)?;
        Ok(self.batch(t, true))
    }

    /// RESUME_QUEUES of every queue this session suspended, with the per-queue verdicts.
    pub fn resume(&mut self) -> Result<Batch, DebugError> {
        let t = self.resume_tally()?;
        Ok(self.batch(t, false))
    }

    /// The raw id array of the last suspend or resume (verdict bits included).
    pub fn outcomes(&self) -> &[u32] {
        &self.ids
    }

    pub(super) fn batch(&self, t: Tally, suspend: bool) -> Batch {
        Batch {
            count: t.count,
            outcomes: if t.skipped { Vec::new() } else { decode_outcomes(&self.ids) },
            suspend,
            latency_ns: t.latency_ns,
            retried: t.retried,
            skipped: t.skipped,
        }
    }

    /// [`Session::suspend`] without the per-queue verdicts (they stay in [`Session::outcomes`]):
    /// what a timing loop calls every cycle.
    pub fn suspend_tally(&mut self, selection: &Selection, grace_period: u32) -> Result<Tally, DebugError> {
        self.check_alive()?;
        if self.runtime_shut() {
            return Err(self.runtime_shut_down());
        }
        self.late_suspended = 0;
        self.ids.clear();
        match selection {
            Selection::All | Selection::Gpu(_) => {
                if self.queues_dirty || self.known.is_empty() {
                    self.snapshot_into(QUEUE_NEW)?;
                }
                // Queues another hold of this session already suspended stay out: their ids
                // would come back as errors (`suspend_queues` skips a suspended queue, 6.12
                // kfd_device_queue_manager.c). So do queues the driver reset: they are gone.
                let held = self.known.iter().filter(|(id, gpu)| {
                    selection.holds_gpu(*gpu) && !self.suspended.contains(id) && !self.reset.contains(id)
                });
                self.ids.extend(held.map(|(id, _)| id.0));
            }
            Selection::Ids(ids) => {
                if !self.unsafe_gpus.is_empty() {
                    // Where each id lives, before anything reaches a GPU it must not.
                    self.snapshot_into(QUEUE_NEW)?;
                }
                let live = ids.iter().filter(|id| !self.reset.contains(id));
                self.ids.extend(live.take(MAX_QUEUES_PER_PROCESS).map(|id| id.0));
            }
        }
        self.refuse_unsafe_gpus()?;
        if self.ids.is_empty() {
            if let Selection::Gpu(_) = selection {
                // Nothing on that GPU yet: queues created there during the hold are held.
                self.holding.retain(|(held, _)| held != selection);
                self.holding.push((selection.clone(), grace_period));
            }
            return Ok(Tally::skipped(monotonic_ns()));
        }
        let t = self.suspend_array(false, grace_period)?;
        self.finish_suspend(t, selection, grace_period)
    }

    /// [`DebugError::ExpertSchedUnsafe`] if an id in `self.ids` is a queue on a GPU this KFD cannot
    /// suspend safely; nothing is suspended then.
    pub(super) fn refuse_unsafe_gpus(&mut self) -> Result<(), DebugError> {
        let unsafe_gpu = self.ids.iter().find_map(|&raw| {
            let id = raw & queue_status::ID_MASK;
            self.known.iter().find(|(q, gpu)| q.0 == id && self.unsafe_gpus.contains(gpu)).map(|(_, gpu)| *gpu)
        });
        match unsafe_gpu {
            Some(gpu) => {
                self.ids.clear();
                Err(DebugError::ExpertSchedUnsafe { pid: self.pid, gpu, version: self.attached.kfd_version })
            }
            None => Ok(()),
        }
    }

    /// The end of a suspend whose ids are recorded: an `All` or `Gpu` hold picks up queues created
    /// meanwhile; INVALID ids are retried.
    fn finish_suspend(&mut self, t: Tally, selection: &Selection, grace_period: u32) -> Result<Tally, DebugError> {
        match selection {
            Selection::All => {
                self.holding.clear();
                self.holding.push((Selection::All, grace_period));
            }
            Selection::Gpu(_) => {
                self.holding.retain(|(held, _)| held != selection);
                self.holding.push((selection.clone(), grace_period));
            }
            Selection::Ids(_) => {}
        }
        // Everything below may fail: the ids are already in `self.suspended`.
        if self.faults.after_suspend() || t.invalid > 0 {
            return self.after_suspend(t, grace_period);
        }
        Ok(t)
    }

    /// The rare end of a suspend: an injected fault, or INVALID ids — a queue created since the
    /// last snapshot still has EC_QUEUE_NEW: clear it and retry those ids once.
    #[cold]
    fn after_suspend(&mut self, mut t: Tally, grace_period: u32) -> Result<Tally, DebugError> {
        if self.faults.after_suspend() {
            return Err(DebugError::Injected("after-suspend"));
        }
        self.snapshot_into(QUEUE_NEW)?;
        self.retry.clear();
        for &raw in &self.ids {
            let outcome = QueueOutcome::from_raw(raw);
            // INVALID alone: a reset queue (ERROR, perhaps with INVALID) is never retried.
            if outcome.result() == QueueResult::Invalid && self.known.iter().any(|(id, _)| *id == outcome.queue_id) {
                self.retry.push(outcome.queue_id.0);
            }
        }
        if !self.retry.is_empty() {
            let r = self.suspend_array(true, grace_period)?;
            t.count += r.count;
            t.latency_ns += r.latency_ns;
            t.returned_ns = r.returned_ns;
            t.retried = self.retry.len() as u32;
            // Merge the retry's verdicts into the first array.
            for &raw in &self.retry {
                let id = raw & queue_status::ID_MASK;
                if let Some(slot) = self.ids.iter_mut().find(|x| **x & queue_status::ID_MASK == id) {
                    *slot = raw;
                }
            }
            (t.done, t.invalid, t.reset) = verdicts(&self.ids);
        }
        Ok(t)
    }

    /// One SUSPEND_QUEUES of `self.ids` (or `self.retry`); records the handled ids before
    /// returning, so no later failure can lose them.
    pub(super) fn suspend_array(&mut self, retry: bool, grace_period: u32) -> Result<Tally, DebugError> {
        let array = if retry { &mut self.retry } else { &mut self.ids };
        let called_ns = monotonic_ns();
        let result = dbg_trap::suspend_queues(self.kfd.as_fd(), self.pid, array, grace_period);
        let returned_ns = monotonic_ns();
        self.record_suspend(retry, result, called_ns, returned_ns)
    }

    /// What a SUSPEND_QUEUES of `self.ids` (or `self.retry`) returned, recorded: the handled ids
    /// into `self.suspended` and the watchdog armed, before anything else can fail; ids that came
    /// back with ERROR into `self.reset`, with a notice.
    fn record_suspend(
        &mut self,
        retry: bool,
        result: Result<i32, Errno>,
        called_ns: u64,
        returned_ns: u64,
    ) -> Result<Tally, DebugError> {
        let count = match result {
            // `suspend_queues` turns a failed unmap into ERROR bits and returns the count
            // (6.12-7.x); a kernel that passed -ETIME up instead timed out preempting every id
            // of the call: each is as gone as one with ERROR.
            Err(Errno::ETIME) => {
                let array = if retry { &mut self.retry } else { &mut self.ids };
                array.iter_mut().for_each(|raw| *raw |= queue_status::ERROR_MASK);
                0
            }
            result => result.map_err(|errno| self.fail(DebugTrapOp::SUSPEND_QUEUES, errno))?,
        };
        let array = if retry { &self.retry } else { &self.ids };
        let mut newly_reset = Vec::new();
        for &raw in array {
            let outcome = QueueOutcome::from_raw(raw);
            match outcome.suspend_result() {
                QueueResult::Done if !self.suspended.contains(&outcome.queue_id) => {
                    self.suspended.push(outcome.queue_id);
                }
                QueueResult::Reset if !self.reset.contains(&outcome.queue_id) => newly_reset.push(outcome.queue_id),
                _ => {}
            }
        }
        if !newly_reset.is_empty() {
            self.reset.extend_from_slice(&newly_reset);
            self.notices.push(SessionNotice::QueuesReset { queues: newly_reset });
        }
        if !self.suspended.is_empty() && self.suspended_at_ns.is_none() {
            self.suspended_at_ns = Some(returned_ns);
            if let (Some(w), Some(max)) = (&self.watchdog, self.max_suspend_ns) {
                w.arm_from(returned_ns, max);
            }
        }
        Ok(Tally::of_suspend(count, array, called_ns, returned_ns))
    }

    /// Queues the driver reset during this session's suspends (gone; never suspended again).
    pub fn reset_queues(&self) -> &[QueueId] {
        &self.reset
    }

    /// The driver reset `queue` alone (the tracer saw `set_queue_as_reset`): the SUSPEND that
    /// caused it counted it suspended, as 6.12-7.x `suspend_queues` does when the per-queue reset
    /// lets the unmap succeed (docs/kfd.md §2.4). It is gone, as if its SUSPEND had said ERROR:
    /// out of the suspended set (no RESUME maps it again), never in a suspend or resume array
    /// again, with a [`SessionNotice::QueuesReset`]. False when it was known already.
    pub fn queue_reset(&mut self, queue: QueueId) -> bool {
        if self.reset.contains(&queue) {
            return false;
        }
        self.reset.push(queue);
        self.suspended.retain(|&q| q != queue);
        self.notices.push(SessionNotice::QueuesReset { queues: vec![queue] });
        true
    }

    /// RESUME_QUEUES of the queues this session suspended on `gpu`, ending that GPU's hold; its
    /// holds of other GPUs go on.
    pub fn resume_gpu(&mut self, gpu: GpuId) -> Result<Batch, DebugError> {
        let t = self.resume_gpu_tally(gpu)?;
        Ok(self.batch(t, false))
    }

    /// [`Session::resume_gpu`] without the per-queue verdicts. A suspended queue the latest
    /// snapshot does not place (destroyed since) is resumed with any GPU: KFD answers INVALID
    /// for it, which ends nothing else.
    pub fn resume_gpu_tally(&mut self, gpu: GpuId) -> Result<Tally, DebugError> {
        self.check_alive()?;
        self.holding.retain(|(held, _)| *held != Selection::Gpu(gpu));
        let on_gpu = |id: QueueId, known: &[(QueueId, GpuId)]| {
            known.iter().find(|(q, _)| *q == id).is_none_or(|&(_, g)| g == gpu)
        };
        self.ids.clear();
        self.ids.extend(self.suspended.iter().copied().filter(|&id| on_gpu(id, &self.known)).map(u32::from));
        if self.ids.is_empty() {
            if self.suspended.is_empty() {
                self.forget_suspended();
            }
            return Ok(Tally::skipped(monotonic_ns()));
        }
        if self.ids.len() == self.suspended.len() {
            return self.resume_tally();
        }
        let (count, called_ns, returned_ns) = self.resume_ids()?;
        // As in `resume_tally`: whatever the verdict, these ids are not suspended by us any more.
        let known = std::mem::take(&mut self.known);
        self.suspended.retain(|&id| !on_gpu(id, &known));
        self.known = known;
        Ok(Tally::of_ioctl(count, &self.ids, called_ns, returned_ns))
    }

    /// One RESUME_QUEUES of `self.ids` (an injected failure instead, in the VM tests): its count
    /// and the clock around it.
    fn resume_ids(&mut self) -> Result<(i32, u64, u64), DebugError> {
        let called_ns = monotonic_ns();
        let result = if self.faults.take_resume_failure() {
            Err(Errno::EIO)
        } else {
            dbg_trap::resume_queues(self.kfd.as_fd(), self.pid, &mut self.ids)
        };
        let returned_ns = monotonic_ns();
        let count = result.map_err(|errno| self.fail(DebugTrapOp::RESUME_QUEUES, errno))?;
        Ok((count, called_ns, returned_ns))
    }

    /// Whether a hold of this session covers queues on `gpu`.
    pub(super) fn holds_gpu(&self, gpu: GpuId) -> bool {
        self.holding.iter().any(|(held, _)| held.holds_gpu(gpu))
    }

    /// [`Session::resume`] without the per-queue verdicts, like [`Session::suspend_tally`].
    pub fn resume_tally(&mut self) -> Result<Tally, DebugError> {
        self.check_alive()?;
        if self.suspended.is_empty() {
            self.holding.clear();
            return Ok(Tally::skipped(monotonic_ns()));
        }
        self.ids.clear();
        self.ids.extend(self.suspended.iter().copied().map(u32::from));
        let (count, called_ns, returned_ns) = self.resume_ids()?;
        // Whatever the verdict, nothing we suspended is left suspended: INVALID now means the
        // queue is gone (destroyed or its process exited).
        self.forget_suspended();
        Ok(Tally::of_ioctl(count, &self.ids, called_ns, returned_ns))
    }

    pub(super) fn forget_suspended(&mut self) {
        if let Some(w) = &self.watchdog {
            w.disarm();
        }
        self.suspended.clear();
        self.suspended_at_ns = None;
        self.holding.clear();
        self.backoff = None;
    }

    /// GET_QUEUE_SNAPSHOT into `self.snap`, growing it until every queue fits (the kernel
    /// reports the real count and clears `clear_mask` only on the entries it copied, §2.5).
    pub(super) fn snapshot_into(&mut self, clear_mask: u64) -> Result<(), DebugError> {
        let mut capacity = self.snap.capacity().max(self.known.len() + 16).min(MAX_QUEUES_PER_PROCESS);
        loop {
            self.snap.clear();
            self.snap.resize(capacity, QueueSnapshotEntry::default());
            let result = dbg_trap::queue_snapshot(self.kfd.as_fd(), self.pid, clear_mask, &mut self.snap);
            let actual = result.map_err(|e| self.fail(DebugTrapOp::GET_QUEUE_SNAPSHOT, e))?;
            if actual <= capacity || capacity >= MAX_QUEUES_PER_PROCESS {
                self.snap.truncate(actual.min(capacity));
                if clear_mask & QUEUE_NEW != 0 {
                    self.known.clear();
                    self.known.extend(self.snap.iter().map(|e| (QueueId(e.queue_id), GpuId(e.gpu_id))));
                    self.queues_dirty = false;
                }
                return Ok(());
            }
            capacity = actual.min(MAX_QUEUES_PER_PROCESS);
        }
    }
}

/// (done, invalid, error) of an id array the kernel wrote back, by [`QueueOutcome`]'s verdict
/// (the one decoder of the status bits, docs/kfd.md §2.4); for a SUSPEND the third is resets.
fn verdicts(array: &[u32]) -> (u32, u32, u32) {
    let (mut done, mut invalid, mut error) = (0, 0, 0);
    for &raw in array {
        match QueueOutcome::from_raw(raw).result() {
            QueueResult::Done => done += 1,
            QueueResult::Invalid => invalid += 1,
            QueueResult::Error | QueueResult::Reset => error += 1,
        }
    }
    (done, invalid, error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kfd::uapi::queue_status::{ERROR_MASK, INVALID_MASK};

    #[test]
    fn verdicts_count_each_id_once_error_over_invalid() {
        assert_eq!(verdicts(&[0, 1 | INVALID_MASK, 2 | ERROR_MASK | INVALID_MASK, 3]), (2, 1, 1));
        assert_eq!(verdicts(&[]), (0, 0, 0));
    }
}
