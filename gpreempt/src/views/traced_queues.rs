//! What the tracer knows about one process's queues that sysfs does not, for the views that must
//! not disturb the GPU (`gpreempt queues --watch`): a queue's CREATE_QUEUE arguments — type,
//! priority, ring address and size, read/write index addresses, doorbell offset, CWSR area — and
//! when it was created and destroyed, from the records seen while the tracer was attached. A
//! queue created before that is known to sysfs only. No debug-trap call is made to learn any of
//! it (docs/kfd.md §2.1: debug ENABLE and DISABLE each refresh the runlist).
//!
//! Also counted: the runlist refreshes (`execute_queues_cpsch`) each caller made while watching,
//! so a view can show that it made none itself.

use std::collections::BTreeMap;

use gpreempt_common::record::KfdFn;
use serde::Serialize;

use super::queues::QueueRow;
use crate::{
    domain::{GpuId, HostPid, QueueId, QueueType},
    event::{Event, EventKind},
};

/// One queue as its CREATE_QUEUE showed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TracedQueue {
    pub queue_id: QueueId,
    pub gpu_id: GpuId,
    pub queue_type: QueueType,
    pub priority: u32,
    pub percentage: u32,
    pub ring_base: u64,
    pub ring_size: u32,
    pub read_pointer_address: u64,
    pub write_pointer_address: u64,
    /// Doorbell offset KFD returned (absent when the kernel did not report it).
    pub doorbell_offset: Option<u64>,
    pub cwsr_address: u64,
    pub cwsr_size: u32,
    /// CLOCK_BOOTTIME ns of the CREATE_QUEUE and DESTROY_QUEUE records.
    pub created_ns: u64,
    pub destroyed_ns: Option<u64>,
}

/// The tracer's view of process `pid`'s queues.
#[derive(Clone, Debug)]
pub struct TracedQueues {
    pid: HostPid,
    queues: BTreeMap<QueueId, TracedQueue>,
    /// `execute_queues_cpsch` calls by calling process.
    refreshes: BTreeMap<HostPid, u64>,
}

impl TracedQueues {
    pub fn new(pid: HostPid) -> Self {
        Self { pid, queues: BTreeMap::new(), refreshes: BTreeMap::new() }
    }

    /// Take one tracer record.
    pub fn observe(&mut self, event: &Event) {
        match &event.kind {
            EventKind::QueueCreate(c) if event.pid == self.pid && c.result.0 == 0 => {
                let Some(id) = c.queue_id else { return };
                self.queues.insert(
                    id,
                    TracedQueue {
                        queue_id: id,
                        gpu_id: c.gpu_id,
                        queue_type: c.queue_type,
                        priority: c.priority,
                        percentage: c.percentage,
                        ring_base: c.ring_base,
                        ring_size: c.ring_size,
                        read_pointer_address: c.read_pointer,
                        write_pointer_address: c.write_pointer,
                        doorbell_offset: c.doorbell_offset,
                        cwsr_address: c.cwsr_address,
                        cwsr_size: c.cwsr_size,
                        created_ns: event.ts_ns,
                        destroyed_ns: None,
                    },
                );
            }
            EventKind::QueueDestroy(d) if event.pid == self.pid && d.result.0 == 0 => {
                if let Some(q) = self.queues.get_mut(&d.queue_id) {
                    q.destroyed_ns = Some(event.ts_ns);
                }
            }
            EventKind::KfdCall(k) if k.kfd_fn == KfdFn::ExecuteQueuesCpsch => {
                *self.refreshes.entry(event.pid).or_default() += 1;
            }
            _ => {}
        }
    }

    /// Every queue created while watching, by id.
    pub fn queues(&self) -> impl Iterator<Item = &TracedQueue> {
        self.queues.values()
    }

    /// Runlist refreshes (`execute_queues_cpsch`) made by `caller` while watching.
    pub fn refreshes_by(&self, caller: HostPid) -> u64 {
        self.refreshes.get(&caller).copied().unwrap_or(0)
    }

    /// Fill in what sysfs left out of `row` (addresses, CWSR), when this queue's creation was seen
    /// and it is still the same queue (a destroyed id may be reused by a later queue).
    pub fn enrich(&self, row: &mut QueueRow) {
        let Some(q) = self.queues.get(&row.queue_id).filter(|q| q.destroyed_ns.is_none()) else { return };
        row.gpu_id.get_or_insert(q.gpu_id);
        row.ring_base = Some(q.ring_base);
        row.ring_size.get_or_insert(u64::from(q.ring_size));
        row.read_pointer_address = Some(q.read_pointer_address);
        row.write_pointer_address = Some(q.write_pointer_address);
        row.cwsr_address = Some(q.cwsr_address);
        row.cwsr_size = Some(q.cwsr_size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        event::{KernelResult, QueueDestroy},
        test_support::{create, ev},
        views::queues::tests::row,
    };

    fn sysfs_row(queue_id: u32) -> QueueRow {
        QueueRow { ring_size: Some(4096), ..row(queue_id, 0x1000, "compute-aql") }
    }

    #[test]
    fn a_queue_created_while_watching_fills_what_sysfs_lacks_until_it_is_destroyed() {
        let mut t = TracedQueues::new(HostPid(42));
        let EventKind::QueueCreate(mut c) = create(1, 0x1000) else { unreachable!() };
        c.ring_base = 0x7f00_0010_0000;
        c.read_pointer = 0x7f00_0000_2000;
        c.write_pointer = 0x7f00_0000_1000;
        c.cwsr_address = 0x7f00_0100_0000;
        c.cwsr_size = 0x1000;
        t.observe(&ev(42, 1_000, EventKind::QueueCreate(c.clone())));
        // Another process's queue 0 and a failed create are not this process's queues.
        let EventKind::QueueCreate(other) = create(0, 0x1000) else { unreachable!() };
        t.observe(&ev(7, 2_000, EventKind::QueueCreate(other)));
        let failed = crate::event::QueueCreate { result: KernelResult(-22), ret: -22, ..c.clone() };
        t.observe(&ev(42, 3_000, EventKind::QueueCreate(failed)));
        let ids: Vec<QueueId> = t.queues().map(|q| q.queue_id).collect();
        assert_eq!(ids, [QueueId(1)]);
        let (mut before, mut during) = (sysfs_row(0), sysfs_row(1));
        t.enrich(&mut before);
        t.enrich(&mut during);
        assert_eq!(before, sysfs_row(0), "created before watching: sysfs only");
        assert_eq!(
            (during.ring_base, during.read_pointer_address, during.write_pointer_address, during.cwsr_address),
            (Some(0x7f00_0010_0000), Some(0x7f00_0000_2000), Some(0x7f00_0000_1000), Some(0x7f00_0100_0000))
        );
        assert_eq!((during.cwsr_size, during.ring_size), (Some(0x1000), Some(4096)));
        let q = t.queues().next().unwrap();
        assert_eq!(
            (q.created_ns, q.destroyed_ns, q.queue_type.to_string().as_str(), q.doorbell_offset),
            (1_000, None, "compute-aql", Some(0))
        );
        let destroy = QueueDestroy { queue_id: QueueId(1), result: KernelResult(0), ret: 0 };
        let gone = ev(42, 5_000, EventKind::QueueDestroy(destroy));
        t.observe(&gone);
        assert_eq!(t.queues().next().unwrap().destroyed_ns, Some(gone.ts_ns));
        let mut reused = sysfs_row(1);
        t.enrich(&mut reused);
        assert_eq!(reused, sysfs_row(1), "a destroyed queue's facts are not another queue's");
    }
}
