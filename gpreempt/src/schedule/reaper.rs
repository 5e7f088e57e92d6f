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
    sync::mpsc::{Sender, SyncSender, channel, sync_channel},
    thread::JoinHandle,
};

use super::realtime::normal_footing;

/// Anything whose drop may block (a link), dropped on the reaper's thread.
type Reaped = Box<dyn Send>;

/// The reaper thread and the channel to it.
pub struct Reaper {
    /// None when the thread could not start (links are then dropped where they are given), and
    /// once dropped (the thread's loop ends when it is).
    tx: Option<Sender<Reaped>>,
    thread: Option<JoinHandle<()>>,
}

impl Reaper {
    /// Start a reaper thread named `name`, at normal priority on the process's CPUs whatever its
    /// creator's ([`normal_footing`]).
    pub fn spawn(name: &str) -> Self {
        let (tx, rx) = channel::<Reaped>();
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || {
            normal_footing();
            for what in rx {
                drop(what);
            }
        });
        match thread {
            Ok(t) => Self { tx: Some(tx), thread: Some(t) },
            Err(_) => Self { tx: None, thread: None },
        }
    }

    /// Drop `what` on the reaper's thread (here, when the thread could not start).
    pub fn reap<T: Send + 'static>(&self, what: T) {
        let what: Reaped = Box::new(what);
        match &self.tx {
            // The thread ends only when this is dropped: a send cannot fail before.
            Some(tx) => {
                let _ = tx.send(what);
            }
            None => drop(what),
        }
    }

    /// Wait until everything handed over so far is dropped: a marker goes down the same channel
    /// (in order), and its drop answers.
    pub fn settle(&self) {
        let (answer, answered) = sync_channel(1);
        self.reap(Settled(answer));
        // Err only if the thread died without dropping it (a panic in a drop): nothing to wait for.
        let _ = answered.recv();
    }
}

/// [`Reaper::settle`]'s marker: answers when it is dropped.
struct Settled(SyncSender<()>);

impl Drop for Settled {
    fn drop(&mut self) {
        let _ = self.0.try_send(());
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
}
