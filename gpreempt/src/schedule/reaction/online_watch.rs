//! The online side as the reaction thread watches it: the online processes' queues (added and
//! gone), their dispatch indices read at each step, their exits, and the `--hint-socket` lines.

use super::{Reaction, messages::Report};
use crate::{
    domain::{GpuId, HostPid, QueueId},
    model::QueueAddrs,
    schedule::{
        online::{OnlineProcess, ReadError},
        seams::ControlSide,
    },
};

impl<S: ControlSide> Reaction<S> {
    /// `Command::OnlineQueue`: watch `addrs`, a queue of online process `pid`.
    pub(super) fn online_queue(&mut self, pid: HostPid, addrs: QueueAddrs, now: u64) {
        let i = match self.online.iter().position(|p| p.pid == pid) {
            Some(i) => i,
            None => {
                self.online.push(OnlineProcess::new(pid, self.config.watch_writes));
                self.online.len() - 1
            }
        };
        if self.online[i].queue_ids().contains(&addrs.queue_id) {
            // An id reused after a destroy we did not see: its old GPU loses the queue.
            if let Some(gpu) = self.online[i].remove_queue(addrs.queue_id) {
                let lane = self.lane(gpu, now);
                lane.online_queues = lane.online_queues.saturating_sub(1);
            }
        }
        self.online[i].add_queue(addrs);
        self.lane(addrs.gpu_id, now).online_queues += 1;
        self.cover(pid, addrs);
        self.watch_arrivals(pid, now);
    }

    /// `Command::OnlineQueueGone`: stop watching one queue of online process `pid`.
    pub(super) fn online_queue_gone(&mut self, pid: HostPid, queue_id: QueueId, now: u64) {
        self.uncover(pid, Some(queue_id));
        if let Some(p) = self.online.iter_mut().find(|p| p.pid == pid)
            && let Some(gpu) = p.remove_queue(queue_id)
        {
            let lane = self.lane(gpu, now);
            lane.online_queues = lane.online_queues.saturating_sub(1);
        }
    }

    pub(super) fn online_gone(&mut self, pid: HostPid, now: u64) {
        self.uncover(pid, None);
        self.unwatch_arrivals(pid);
        for lane in &mut self.lanes {
            lane.occupancy.retain(|(p, _)| *p != pid);
        }
        let Some(i) = self.online.iter().position(|p| p.pid == pid) else { return };
        let p = self.online.remove(i);
        let gpus: Vec<GpuId> = p.gpus().collect();
        for gpu in gpus {
            let lane = self.lane(gpu, now);
            lane.online_queues = lane.online_queues.saturating_sub(1);
            lane.online_gone = true;
        }
    }

    /// The hint socket's new clients and lines: [`Self::hint`] for this step, the malformed lines
    /// reported. A hint of a server that exited (no online process left) is no online work.
    pub(super) fn read_hints(&mut self) {
        let Some(h) = self.hints.as_mut() else { return };
        let before = h.state.counts;
        let malformed = h.poll();
        let activity = h.state.take_activity();
        let counts = h.state.counts;
        self.hint = activity && !self.online.is_empty();
        for w in malformed {
            self.report(Report::HintMalformed { line: w.line, count: w.count });
        }
        if counts != before
            && let Ok(mut shared) = self.stats.hints.lock()
        {
            *shared = counts;
        }
    }

    /// Read every online process's indices: which GPUs have online work pending.
    pub(super) fn read_online(&mut self, now: u64) {
        for lane in &mut self.lanes {
            lane.pending = false;
        }
        let mut i = 0;
        while i < self.online.len() {
            let p = &mut self.online[i];
            let delays = &self.stats.dispatch_delay;
            match p.poll(now, &mut |_, ns| delays.record(ns)) {
                Ok(poll) => {
                    if poll.pending_queues > 0 {
                        for gpu in p.pending_gpus() {
                            if let Some(lane) = self.lanes.iter_mut().find(|l| l.gpu == gpu) {
                                lane.pending = true;
                            }
                        }
                    }
                }
                Err(ReadError::Gone(pid)) => {
                    self.online_gone(pid, now);
                    self.report(Report::OnlineGone { pid });
                    continue;
                }
                Err(e) => {
                    // A queue destroyed before its destroy reached us: drop the process's queues;
                    // the tracer announces the live ones again.
                    let (pid, ids) = (p.pid, p.queue_ids());
                    self.report(Report::Warning(e.to_string()));
                    for queue_id in ids {
                        self.online_queue_gone(pid, queue_id, now);
                    }
                }
            }
            i += 1;
        }
    }

    /// Online work pending on `gpu` in the indices at `now` (read afresh: between two RESUMEs).
    pub(super) fn online_pending_on(&mut self, gpu: GpuId, now: u64) -> bool {
        self.read_online(now);
        self.lanes.iter().any(|l| l.gpu == gpu && l.pending)
    }
}
