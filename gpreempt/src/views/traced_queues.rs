//! What the tracer knows about one process's queues that sysfs does not, for the views that must
//! not disturb the GPU (`gpreempt queues --watch`): a queue's CREATE_QUEUE arguments — type,
//! priority, ring address and size, read/write index addresses, doorbell offset, CWSR area — and
//! when it was created and destroyed, from the model's queue notices ([`QueueNotice`]) while the
//! tracer was attached, for every KFD context's queues (keyed by [`QueueKey`]: a secondary
//! context's queue 0 is not the primary's, Linux 7.0). A queue created before that is known to
//! sysfs only. No debug-trap call is
//! made to learn any of it (docs/kfd.md §2.1: debug ENABLE and DISABLE each refresh the runlist).
//!
//! Also counted: the runlist refreshes (`execute_queues_cpsch`) each caller made while watching,
//! so a view can show that it made none itself.

use std::collections::BTreeMap;

use gpreempt_common::record::KfdFn;
use serde::Serialize;

use super::queues::{QueueRow, queue_column_width};
use crate::{
    domain::HostPid,
    event::{Event, EventKind},
    model::{CreatedQueue, GoneCause, QueueNotice, registry::QueueKey},
};

/// One queue as its CREATE_QUEUE showed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TracedQueue {
    /// Flattened: `queues --watch --json` shows one object per queue, the create arguments
    /// beside the times.
    #[serde(flatten)]
    pub queue: CreatedQueue,
    /// CLOCK_BOOTTIME ns of the CREATE_QUEUE record, and of the queue's end when its process
    /// destroyed it (the model's time: the sysfs removal inside the DESTROY_QUEUE).
    pub created_ns: u64,
    pub destroyed_ns: Option<u64>,
}

/// The tracer's view of process `pid`'s queues.
#[derive(Clone, Debug)]
pub struct TracedQueues {
    pid: HostPid,
    queues: BTreeMap<QueueKey, TracedQueue>,
    /// `execute_queues_cpsch` calls by calling process.
    refreshes: BTreeMap<HostPid, u64>,
}

impl TracedQueues {
    pub fn new(pid: HostPid) -> Self {
        Self { pid, queues: BTreeMap::new(), refreshes: BTreeMap::new() }
    }

    /// Take one of the model's queue notices.
    pub fn apply(&mut self, notice: &QueueNotice) {
        match *notice {
            // A reused id is a new queue: it replaces the destroyed one it was before.
            QueueNotice::Created { pid, ts_ns, queue } if pid == self.pid => {
                self.queues.insert(queue.key(), TracedQueue { queue, created_ns: ts_ns, destroyed_ns: None });
            }
            // Only its process's DESTROY_QUEUE gives a destroyed time: a queue removed with it at
            // teardown was never destroyed by it, and the whole process is gone from sysfs then.
            QueueNotice::Gone { pid, key, ts_ns, cause: GoneCause::Destroyed } if pid == self.pid => {
                if let Some(q) = self.queues.get_mut(&key) {
                    q.destroyed_ns = Some(ts_ns);
                }
            }
            _ => {}
        }
    }

    /// Take one tracer record: a runlist refresh is counted by its caller. (Not a lifecycle
    /// fact, so the model keeps no count of it.)
    pub fn count_refresh(&mut self, event: &Event) {
        if let EventKind::KfdCall(k) = &event.kind
            && k.kfd_fn == KfdFn::ExecuteQueuesCpsch
        {
            *self.refreshes.entry(event.pid).or_default() += 1;
        }
    }

    /// Every queue created while watching, by [`QueueKey`] (the primary context's first).
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
        let Some(q) = self.queues.get(&row.key()).filter(|q| q.destroyed_ns.is_none()).map(|q| &q.queue) else {
            return;
        };
        row.gpu_id.get_or_insert(q.gpu_id);
        row.ring_base = Some(q.ring_base);
        row.ring_size.get_or_insert(u64::from(q.ring_size));
        row.read_pointer_address = Some(q.read_pointer_address);
        row.write_pointer_address = Some(q.write_pointer_address);
        row.cwsr_address = Some(q.cwsr_address);
        row.cwsr_size = Some(q.cwsr_size);
    }
}

/// The text table of the queues created while watching (a header, then a line per queue; nothing
/// without queues), their times in ms since `start_boot_ns` (CLOCK_BOOTTIME).
pub fn table<'a>(queues: impl IntoIterator<Item = &'a TracedQueue>, start_boot_ns: u64) -> Vec<String> {
    let queues: Vec<&TracedQueue> = queues.into_iter().collect();
    if queues.is_empty() {
        return Vec::new();
    }
    let ms = |ns: u64| format!("{:.1}", ns.saturating_sub(start_boot_ns) as f64 / 1e6);
    let w = queue_column_width(queues.iter().map(|q| q.queue.key()));
    let mut lines = vec![format!(
        "{:>w$} {:>6} {:<12} {:>4} {:>16} {:>9} {:>16} {:>16} {:>10} {:>16} {:>9} {:>10} {:>10}",
        "QUEUE",
        "GPU",
        "TYPE",
        "PRIO",
        "RING",
        "RING_SIZE",
        "RPTR",
        "WPTR",
        "DOORBELL",
        "CWSR",
        "CWSR_SIZE",
        "CREATED_MS",
        "GONE_MS"
    )];
    for q in queues {
        let c = &q.queue;
        lines.push(format!(
            "{:>w$} {:>6} {:<12} {:>4} {:>16} {:>9} {:>16} {:>16} {:>10} {:>16} {:>9} {:>10} {:>10}",
            c.key(),
            c.gpu_id.0,
            c.queue_type,
            c.priority,
            format!("{:#x}", c.ring_base),
            c.ring_size,
            format!("{:#x}", c.read_pointer_address),
            format!("{:#x}", c.write_pointer_address),
            c.doorbell_offset.map_or_else(|| "-".to_owned(), |d| format!("{d:#x}")),
            format!("{:#x}", c.cwsr_address),
            c.cwsr_size,
            ms(q.created_ns),
            q.destroyed_ns.map_or_else(|| "-".to_owned(), ms)
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        domain::QueueId,
        event::{KernelResult, QueueDestroy},
        model::Model,
        test_support::{create, ev},
        views::queues::tests::row,
    };

    fn sysfs_row(queue_id: u32) -> QueueRow {
        QueueRow { ring_size: Some(4096), ..row(queue_id, 0x1000, "compute-aql") }
    }

    /// The view of pid 42, fed as `queues --watch` feeds it: each record through the model, the
    /// view taking the model's queue notices and counting refreshes.
    struct Watch {
        model: Model,
        view: TracedQueues,
    }

    impl Watch {
        fn new() -> Self {
            Self { model: Model::new(None), view: TracedQueues::new(HostPid(42)) }
        }

        fn observe(&mut self, event: &Event) {
            if let Some(q) = self.model.apply(event).queue {
                self.view.apply(&q);
            }
            self.view.count_refresh(event);
        }
    }

    #[test]
    fn a_queue_created_while_watching_fills_what_sysfs_lacks_until_it_is_destroyed() {
        let mut w = Watch::new();
        let EventKind::QueueCreate(mut c) = create(1, 0x1000) else { unreachable!() };
        c.ring_base = 0x7f00_0010_0000;
        c.read_pointer = 0x7f00_0000_2000;
        c.write_pointer = 0x7f00_0000_1000;
        c.cwsr_address = 0x7f00_0100_0000;
        c.cwsr_size = 0x1000;
        w.observe(&ev(42, 1_000, EventKind::QueueCreate(c.clone())));
        // Another process's queue 0 and a failed create are not this process's queues.
        let EventKind::QueueCreate(other) = create(0, 0x1000) else { unreachable!() };
        w.observe(&ev(7, 2_000, EventKind::QueueCreate(other)));
        let failed = crate::event::QueueCreate { result: KernelResult(-22), ret: -22, ..c.clone() };
        w.observe(&ev(42, 3_000, EventKind::QueueCreate(failed)));
        let t = &w.view;
        let ids: Vec<QueueId> = t.queues().map(|q| q.queue.queue_id).collect();
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
            (q.created_ns, q.destroyed_ns, q.queue.queue_type.to_string().as_str(), q.queue.doorbell_offset),
            (1_000, None, "compute-aql", Some(0))
        );
        let destroy = QueueDestroy { queue_id: QueueId(1), context_id: None, result: KernelResult(0), ret: 0 };
        let gone = ev(42, 5_000, EventKind::QueueDestroy(destroy));
        w.observe(&gone);
        let t = &w.view;
        assert_eq!(t.queues().next().unwrap().destroyed_ns, Some(gone.ts_ns));
        let mut reused = sysfs_row(1);
        t.enrich(&mut reused);
        assert_eq!(reused, sysfs_row(1), "a destroyed queue's facts are not another queue's");
    }

    /// Linux 7.0: a queue created in a secondary KFD context is shown too, named by its context,
    /// and fills in only its own sysfs row (`context_0/queues/0`), not the primary's queue 0.
    #[test]
    fn a_secondary_context_s_queue_is_shown_named_by_its_context() {
        use crate::test_support::create_in;
        let mut w = Watch::new();
        w.observe(&ev(42, 1_000_000, create(0, 0x1000)));
        let EventKind::QueueCreate(mut c) = create_in(0, 0, 0x1000) else { unreachable!() };
        c.read_pointer = 0x7f00_0000_9080;
        w.observe(&ev(42, 2_500_000, EventKind::QueueCreate(c)));
        let keys: Vec<String> = w.view.queues().map(|q| q.queue.key().to_string()).collect();
        assert_eq!(keys, ["0", "context_0/0"]);
        assert_eq!(
            table(w.view.queues(), 0),
            [
                "      QUEUE    GPU TYPE         PRIO             RING RING_SIZE             RPTR             WPTR   DOORBELL             CWSR CWSR_SIZE CREATED_MS    GONE_MS",
                "          0   4096 compute-aql     7           0x1000      4096   0x7f0000000080   0x7f0000000038        0x0              0x0         0        1.0          -",
                "context_0/0   4096 compute-aql     7           0x1000      4096   0x7f0000009080   0x7f0000000038        0x0              0x0         0        2.5          -",
            ]
        );
        let json = serde_json::to_value(w.view.queues().nth(1)).unwrap();
        assert_eq!((&json["queue_id"], &json["context_id"]), (&serde_json::json!(0), &serde_json::json!(0)));
        let (mut primary, mut secondary) = (sysfs_row(0), QueueRow { context_id: Some(0), ..sysfs_row(0) });
        w.view.enrich(&mut primary);
        w.view.enrich(&mut secondary);
        assert_eq!(
            (primary.read_pointer_address, secondary.read_pointer_address),
            (Some(0x7f00_0000_0080), Some(0x7f00_0000_9080))
        );
        // Its destroy (through its own file) ends it, not the primary's queue 0.
        let destroy = QueueDestroy { queue_id: QueueId(0), context_id: Some(0), result: KernelResult(0), ret: 0 };
        w.observe(&ev(42, 3_000_000, EventKind::QueueDestroy(destroy)));
        let gone: Vec<Option<u64>> = w.view.queues().map(|q| q.destroyed_ns).collect();
        assert_eq!(gone, [None, Some(3_000_000)]);
    }

    #[test]
    fn a_traced_queue_serialises_to_the_fields_queues_watch_prints() {
        let mut w = Watch::new();
        w.observe(&ev(42, 1_000, create(3, 0x1000)));
        let destroy = QueueDestroy { queue_id: QueueId(3), context_id: None, result: KernelResult(0), ret: 0 };
        w.observe(&ev(42, 9_000, EventKind::QueueDestroy(destroy)));
        let q = w.view.queues().next().map(serde_json::to_value).transpose().unwrap();
        assert_eq!(
            q,
            Some(serde_json::json!({
                "queue_id": 3, "context_id": null, "gpu_id": 4096, "queue_type": "compute-aql", "priority": 7, "percentage": 100,
                "ring_base": 4096, "ring_size": 4096, "read_pointer_address": 0x7f00_0000_3080_u64,
                "write_pointer_address": 0x7f00_0000_3038_u64, "doorbell_offset": 0, "cwsr_address": 0,
                "cwsr_size": 0, "created_ns": 1_000, "destroyed_ns": 9_000
            }))
        );
    }

    #[test]
    fn a_queue_destroyed_by_its_process_shows_when_it_went_and_one_torn_down_shows_none() {
        use crate::event::QueueRemoved;
        let removed = |id: u32| {
            EventKind::QueueRemoved(QueueRemoved {
                owner_pid: Some(HostPid(42)),
                queue_id: Some(QueueId(id)),
                context_id: None,
            })
        };
        let destroy = |id: u32, r: i64| {
            EventKind::QueueDestroy(QueueDestroy {
                queue_id: QueueId(id),
                context_id: None,
                result: KernelResult(r),
                ret: r,
            })
        };
        let mut w = Watch::new();
        for id in 0..3 {
            w.observe(&ev(42, 1_000 + u64::from(id), create(id, 0x1000)));
        }
        // As the kernel writes a DESTROY_QUEUE (Linux ≥ 6.2): the sysfs removal in the owner's
        // task once the queue is freed, then the ioctl's return.
        w.observe(&ev(42, 2_000, removed(0)));
        w.observe(&ev(42, 2_010, destroy(0, 0)));
        // A destroy that returned 0 with its removal record lost: its return's time.
        w.observe(&ev(42, 3_500, destroy(1, 0)));
        // Teardown, in KFD's worker (pid 0 here): no destroy, no time.
        w.observe(&ev(0, 4_000, removed(2)));
        let times: Vec<(u32, u64, Option<u64>)> =
            w.view.queues().map(|q| (q.queue.queue_id.0, q.created_ns, q.destroyed_ns)).collect();
        assert_eq!(times, [(0, 1_000, Some(2_000)), (1, 1_001, Some(3_500)), (2, 1_002, None)]);
    }
}
