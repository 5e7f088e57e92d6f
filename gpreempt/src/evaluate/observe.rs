//! What is measured from outside, in every state, the same way: the online processes' dispatch
//! delay (a dispatch first seen published → consumed, from their AQL indices, as `schedule`
//! measures it), how many dispatches they published (write-index movement: a load command that
//! drives nothing shows as 0), and the offline processes' progress (dispatches consumed, from
//! their queues' read indices, per GPU). No debug-trap call, no change to either process: the
//! indices are read with `process_vm_readv`.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::{
    clock::monotonic_ns,
    controller::{
        Debugger,
        vocabulary::{DebugError, Options},
    },
    domain::{GpuId, HostPid},
    model::QueueAddrs,
    schedule::online::{OnlineProcess, read_u64s},
};

/// A process and the queues known of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Watched {
    pub pid: HostPid,
    pub queues: Vec<QueueAddrs>,
}

/// The queues of `pid` with their index addresses: one debug-trap snapshot (ENABLE,
/// GET_QUEUE_SNAPSHOT without clearing anything, DISABLE: two runlist refreshes, nothing
/// suspended), as `schedule` learns an online process's queues.
pub fn learn_queues(pid: HostPid, options: &Options) -> Result<Watched, DebugError> {
    let d = Debugger::attach(pid, Options { max_suspend: None, ..options.clone() })?;
    let entries = d.snapshot(false);
    d.detach();
    let queues = entries?.iter().map(QueueAddrs::of_snapshot).collect();
    Ok(Watched { pid, queues })
}

/// What one state's observation found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    pub elapsed: Duration,
    /// Online dispatch delays, µs.
    pub delays_us: Vec<f64>,
    /// Dispatches the online processes published (write indices) and the CP consumed (read).
    pub online_published: u64,
    pub online_consumed: u64,
    /// Offline dispatches consumed per GPU.
    pub offline_consumed: BTreeMap<GpuId, u64>,
    /// Processes whose indices could not be read to the end (exited, queues destroyed): their
    /// figures stop where the reads failed.
    pub unreadable: Vec<HostPid>,
}

/// Every watched queue's read and write index addresses, flat, with who they belong to.
struct Indices {
    pid: HostPid,
    /// (GPU, online?, is_write) per address.
    slots: Vec<(GpuId, bool, bool)>,
    addrs: Vec<u64>,
    first: Vec<u64>,
    last: Vec<u64>,
    ok: bool,
}

impl Indices {
    fn new(w: &Watched, online: bool) -> Self {
        let mut slots = Vec::new();
        let mut addrs = Vec::new();
        for q in &w.queues {
            slots.push((q.gpu_id, online, false));
            addrs.push(q.read);
            if online {
                slots.push((q.gpu_id, online, true));
                addrs.push(q.write);
            }
        }
        let n = addrs.len();
        let mut me = Self { pid: w.pid, slots, addrs, first: vec![0; n], last: vec![0; n], ok: true };
        me.ok = read_u64s(me.pid, &me.addrs, &mut me.first).is_ok();
        me.last.clone_from(&me.first);
        me
    }

    fn read_last(&mut self) {
        if self.ok {
            let mut now = vec![0; self.addrs.len()];
            // A failed read keeps the last good values: the figures stop where the process went.
            match read_u64s(self.pid, &self.addrs, &mut now) {
                Ok(()) => self.last = now,
                Err(_) => self.ok = false,
            }
        }
    }
}

/// How far a state has come, for the progress lines while it runs (totals since its start).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Live {
    pub elapsed: Duration,
    /// Dispatches the online processes published.
    pub online_published: u64,
    /// Offline dispatches consumed, every GPU together.
    pub offline_consumed: u64,
}

/// Called on the observer's thread every so often while a state runs.
pub type Ticker = Box<dyn FnMut(&Live) + Send>;

/// The totals of `indices` as last read.
fn live(indices: &[Indices], elapsed: Duration) -> Live {
    let mut l = Live { elapsed, ..Live::default() };
    for i in indices {
        for (k, &(_, online, write)) in i.slots.iter().enumerate() {
            let moved = i.last[k].saturating_sub(i.first[k]);
            match (online, write) {
                (true, true) => l.online_published += moved,
                (true, false) => {}
                (false, _) => l.offline_consumed += moved,
            }
        }
    }
    l
}

/// An observation running on a thread of its own for one state.
pub struct Observation {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Observed>>,
}

impl Observation {
    /// Start observing now: the indices are read once before this returns (the state's start),
    /// then polled every `sample` for the dispatch delays; every `tick.0`, read again for
    /// `tick.1` (progress while the state runs).
    pub fn start(
        online: &[Watched],
        offline: &[Watched],
        sample: Duration,
        mut tick: Option<(Duration, Ticker)>,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let mut indices: Vec<Indices> = online.iter().map(|w| Indices::new(w, true)).collect();
        indices.extend(offline.iter().map(|w| Indices::new(w, false)));
        let mut procs: Vec<OnlineProcess> = online
            .iter()
            .map(|w| {
                // Only consumption closes a delay; a moved write index alone is not one.
                let mut p = OnlineProcess::new(w.pid, false);
                for &q in &w.queues {
                    p.add_queue(q);
                }
                p
            })
            .collect();
        let flag = stop.clone();
        let started = Instant::now();
        let thread = std::thread::Builder::new().name("gpreempt-observe".into()).spawn(move || {
            let mut delays = Vec::new();
            let mut gone = vec![false; procs.len()];
            let mut next_tick = tick.as_ref().map(|(every, _)| started + *every);
            while !flag.load(Ordering::Relaxed) {
                let now = monotonic_ns();
                for (p, gone) in procs.iter_mut().zip(gone.iter_mut()) {
                    if !*gone {
                        *gone = p.poll(now, &mut |_, ns| delays.push(ns as f64 / 1e3)).is_err();
                    }
                }
                if let (Some(at), Some((every, ticker))) = (next_tick, tick.as_mut())
                    && Instant::now() >= at
                {
                    next_tick = Some(at + *every);
                    for i in &mut indices {
                        i.read_last();
                    }
                    ticker(&live(&indices, started.elapsed()));
                }
                std::thread::sleep(sample);
            }
            for i in &mut indices {
                i.read_last();
            }
            summarise(indices, delays, started.elapsed())
        });
        // A thread that cannot start measures nothing; the state still runs and says so.
        Self { stop, thread: thread.ok() }
    }

    /// End the observation: the indices read once more (the state's end).
    pub fn finish(mut self) -> Observed {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default()
    }
}

impl Drop for Observation {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn summarise(indices: Vec<Indices>, delays_us: Vec<f64>, elapsed: Duration) -> Observed {
    let mut o = Observed { elapsed, delays_us, ..Observed::default() };
    for i in indices {
        if !i.ok {
            o.unreadable.push(i.pid);
        }
        for (k, &(gpu, online, write)) in i.slots.iter().enumerate() {
            let moved = i.last[k].saturating_sub(i.first[k]);
            match (online, write) {
                (true, true) => o.online_published += moved,
                (true, false) => o.online_consumed += moved,
                (false, _) => *o.offline_consumed.entry(gpu).or_default() += moved,
            }
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::QueueId;

    #[test]
    fn index_movement_per_side_and_gpu_and_a_delay_closed_by_consumption() {
        // The indices live in this test; the process reads itself. Online: read, write; offline:
        // two queues on two GPUs (read indices only).
        let idx: Box<[std::sync::atomic::AtomicU64; 4]> = Box::default();
        let base = idx.as_ptr() as u64;
        let me = HostPid(std::process::id());
        let q = |id, gpu, read, write| QueueAddrs { queue_id: QueueId(id), gpu_id: GpuId(gpu), read, write };
        let online = [Watched { pid: me, queues: vec![q(0, 0x1000, base, base + 8)] }];
        let offline = [Watched { pid: me, queues: vec![q(0, 0x1000, base + 16, 0), q(1, 0x2000, base + 24, 0)] }];
        idx[0].store(5, Ordering::SeqCst);
        idx[1].store(5, Ordering::SeqCst);
        // Progress every 20 ms, into a channel.
        let (tx, ticks) = std::sync::mpsc::channel();
        let ticker: Ticker = Box::new(move |l: &Live| {
            let _ = tx.send(*l);
        });
        let obs = Observation::start(
            &online,
            &offline,
            Duration::from_micros(200),
            Some((Duration::from_millis(20), ticker)),
        );
        // Three dispatches published; the observer must see them pending before they are consumed.
        idx[1].store(8, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50));
        idx[0].store(8, Ordering::SeqCst);
        idx[2].store(40, Ordering::SeqCst);
        idx[3].store(7, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50));
        // Ticks carry the totals as read at each: the last one before the end has them all.
        let seen_all = std::time::Instant::now() + Duration::from_secs(60);
        let last = loop {
            let l = ticks.recv_timeout(Duration::from_secs(60)).unwrap();
            if l.offline_consumed == 47 || std::time::Instant::now() > seen_all {
                break l;
            }
        };
        assert_eq!((last.online_published, last.offline_consumed), (3, 47));
        let o = obs.finish();
        assert_eq!((o.online_published, o.online_consumed), (3, 3));
        assert_eq!(o.offline_consumed, BTreeMap::from([(GpuId(0x1000), 40), (GpuId(0x2000), 7)]));
        // One delay at most: the poll thread may not have run while the dispatches were pending
        // on a loaded host (the index counts above do not depend on it).
        assert!(o.delays_us.len() <= 1, "{o:?}");
        assert!(o.unreadable.is_empty());
    }

    #[test]
    fn a_process_that_cannot_be_read_is_named_and_counts_nothing() {
        let offline = [Watched {
            pid: HostPid(999_999_999),
            queues: vec![QueueAddrs { queue_id: QueueId(0), gpu_id: GpuId(1), read: 8, write: 16 }],
        }];
        let o = Observation::start(&[], &offline, Duration::from_millis(1), None).finish();
        assert_eq!(o.unreadable, [HostPid(999_999_999)]);
        assert_eq!(o.offline_consumed, BTreeMap::from([(GpuId(1), 0)]));
    }
}
