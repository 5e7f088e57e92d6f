//! eBPF links closed off the reaction thread.
//!
//! Closing a uprobe's link waits for RCU grace periods in the thread that closes it. The kernel
//! stack sampled from `/proc/TID/stack` while it waited (Linux 6.18): `close` → task work →
//! `__fput` → `perf_event_release_kernel` → `__free_event` → `perf_uprobe_destroy` →
//! `perf_trace_event_unreg` → `trace_uprobe_register` (unregister) → `uprobe_unregister_sync` →
//! `synchronize_rcu_tasks_trace` (kernel/events/uprobes.c), and `synchronize_rcu`. When the native
//! harness's online process exited, its doorbell uprobes were detached on the real-time reaction
//! thread, which stood still for 193-271 ms (3 of 8 runs of `harness run --cpu-phase vllm-mi300x
//! --requests 200`): no GPU's lane stepped, no request was taken, for as long.
//!
//! So the reaction thread hands such links to a thread of normal footing that drops them. The
//! owner's drop joins it: no link outlives the probe that made it.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
        mpsc::{Sender, SyncSender, channel, sync_channel},
    },
    thread::JoinHandle,
};

use super::realtime::normal_footing;

/// What goes down the channel, in order.
enum Job {
    /// Anything whose drop may block (a link), dropped on the reaper's thread.
    Drop(Box<dyn Send>),
    /// [`Reaper::settle`]'s marker: answered once everything before it is dropped and counted.
    Settle(SyncSender<()>),
}

impl Job {
    /// Do it and count it in `dropped`; a marker is answered after it is counted.
    fn finish(self, dropped: &AtomicU64) {
        let answer = match self {
            Job::Drop(what) => {
                drop(what);
                None
            }
            Job::Settle(answer) => Some(answer),
        };
        dropped.fetch_add(1, Ordering::Release);
        if let Some(a) = answer {
            let _ = a.send(());
        }
    }
}

/// The reaper thread and the channel to it.
pub struct Reaper {
    /// None when the thread could not start (links are then dropped where they are given), and
    /// once dropped (the thread's loop ends when it is).
    tx: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    /// Items handed over so far: the last one's ticket.
    sent: AtomicU64,
    /// Items dropped so far (in the order handed over), counted by whoever dropped them.
    dropped: Arc<AtomicU64>,
}

impl Reaper {
    /// Start a reaper thread named `name`, at normal priority on the process's CPUs whatever its
    /// creator's ([`normal_footing`]).
    pub fn spawn(name: &str) -> Self {
        let (tx, rx) = channel::<Job>();
        let dropped = Arc::new(AtomicU64::new(0));
        let counted = dropped.clone();
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || {
            normal_footing();
            for job in rx {
                job.finish(&counted);
            }
        });
        let (tx, thread) = match thread {
            Ok(t) => (Some(tx), Some(t)),
            Err(_) => (None, None),
        };
        Self { tx, thread, sent: AtomicU64::new(0), dropped }
    }

    /// Drop `what` on the reaper's thread (here, when the thread could not start); its ticket for
    /// [`Reaper::dropped_through`].
    pub fn reap<T: Send + 'static>(&self, what: T) -> u64 {
        self.send(Job::Drop(Box::new(what)))
    }

    /// Hand `job` to the thread, or do it here when there is none; its ticket.
    fn send(&self, job: Job) -> u64 {
        let ticket = self.sent.fetch_add(1, Ordering::Relaxed) + 1;
        let job = match &self.tx {
            // The thread ends only when this is dropped: a send cannot fail before.
            Some(tx) => tx.send(job).err().map(|e| e.0),
            None => Some(job),
        };
        if let Some(job) = job {
            job.finish(&self.dropped);
        }
        ticket
    }

    /// Whether the item with `ticket`, and every one handed over before it, is dropped (never
    /// waits).
    pub fn dropped_through(&self, ticket: u64) -> bool {
        self.dropped.load(Ordering::Acquire) >= ticket
    }

    /// Wait until everything handed over so far is dropped and counted: a marker goes down the
    /// same channel (in order, with a ticket of its own) and is answered after them.
    pub fn settle(&self) {
        let (answer, answered) = sync_channel(1);
        self.send(Job::Settle(answer));
        // Err only if the thread died (a panic in a drop): nothing left to wait for.
        let _ = answered.recv();
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            // Every link handed over is closed before this returns.
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{Arc, Mutex},
        thread::ThreadId,
    };

    use super::*;

    /// Records the thread that drops it.
    struct Witness(Arc<Mutex<Vec<ThreadId>>>);

    impl Drop for Witness {
        fn drop(&mut self) {
            if let Ok(mut v) = self.0.lock() {
                v.push(std::thread::current().id());
            }
        }
    }

    #[test]
    fn what_is_reaped_is_dropped_on_the_reaper_thread_and_all_of_it_before_the_reaper_is_gone() {
        let dropped = Arc::new(Mutex::new(Vec::new()));
        let reaper = Reaper::spawn("gpreempt-reaper-test");
        for _ in 0..3 {
            reaper.reap(Witness(dropped.clone()));
        }
        drop(reaper);
        let by = dropped.lock().expect("the witnesses' record").clone();
        assert_eq!(by.len(), 3, "every witness dropped by the time the reaper is: {by:?}");
        let here = std::thread::current().id();
        assert!(by.iter().all(|t| *t != here), "dropped on the reaper's thread, not the caller's: {by:?}");
        assert!(by.windows(2).all(|w| w[0] == w[1]), "one reaper thread: {by:?}");
    }

    #[test]
    fn settle_returns_once_everything_handed_over_before_it_is_dropped() {
        let dropped = Arc::new(Mutex::new(Vec::new()));
        let reaper = Reaper::spawn("gpreempt-reaper-test");
        for _ in 0..100 {
            reaper.reap(Witness(dropped.clone()));
        }
        reaper.settle();
        assert_eq!(dropped.lock().expect("the witnesses' record").len(), 100);
        reaper.reap(Witness(dropped.clone()));
        reaper.settle();
        assert_eq!(dropped.lock().expect("the witnesses' record").len(), 101);
    }

    #[test]
    fn tickets_count_the_items_handed_over_and_are_dropped_through_once_settled() {
        let dropped = Arc::new(Mutex::new(Vec::new()));
        let reaper = Reaper::spawn("gpreempt-reaper-test");
        let tickets: Vec<u64> = (0..3).map(|_| reaper.reap(Witness(dropped.clone()))).collect();
        assert_eq!(tickets, [1, 2, 3]);
        // The marker `settle` sends is item 4.
        reaper.settle();
        assert!(reaper.dropped_through(4));
        assert!(!reaper.dropped_through(5), "nothing handed over past the marker");
        assert_eq!(reaper.reap(Witness(dropped.clone())), 5);
    }
}
