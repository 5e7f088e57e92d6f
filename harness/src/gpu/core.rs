//! The model GPU's logic: pure, on a clock it is handed (ns), so every rule is tested exactly.
//! [`super::ModelGpu`] drives it in real time.
//!
//! - A queue's dispatches start in order; the read index counts started dispatches (a command
//!   processor advances it when it consumes a packet, not when the kernel ends).
//! - [`Bound::Serial`]: one dispatch executes at a time, the queues served in turn (as the
//!   emulator's CP). [`Bound::Shared`]: every mapped queue's head dispatch executes at once and
//!   the executing dispatches share the CUs equally (processor sharing).
//! - An unmap (every SUSPEND and RESUME call on HWS: `execute_queues_cpsch` over every queue of
//!   the device, docs/kfd.md §2.4) stops every queue for its duration; a dispatch executing when
//!   it begins is saved with its remaining time and pays `restore_ns` when it executes again.
//!   Queues suspended at the end of an unmap start nothing until a later unmap resumes them.
//! - Accounting: per client, GPU time of useful work and of restores; the time the GPU was
//!   stalled by unmaps and idle; busy + restore + stalled + idle = elapsed, exactly.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// How concurrent dispatches use the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// One dispatch at a time, queues in turn (pessimistic, as the emulator).
    Serial,
    /// Each queue's head dispatch at once, sharing the CUs (optimistic).
    Shared,
}

/// Which side a queue's client is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    Online,
    Offline,
}

/// A started dispatch: what is left of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Head {
    /// Restore still to do before the work continues, ns.
    restore: u64,
    work: u64,
    executing: bool,
}

impl Head {
    fn left(&self) -> u64 {
        self.restore + self.work
    }
}

#[derive(Clone, Debug)]
struct Queue {
    client: usize,
    side: Side,
    /// Published, not started: GPU time of each, ns.
    pending: VecDeque<u64>,
    head: Option<Head>,
    suspended: bool,
    started: u64,
    completed: u64,
}

/// One client's GPU time, ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ClientTime {
    /// Useful work done.
    pub work_ns: u64,
    /// Restores after preemptions.
    pub restore_ns: u64,
    pub completed: u64,
}

/// The GPU's time since its first event, ns.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Accounting {
    pub elapsed_ns: u64,
    pub idle_ns: u64,
    /// Stopped by unmaps.
    pub stalled_ns: u64,
    pub clients: Vec<ClientTime>,
    pub unmaps: u64,
    /// Dispatches saved by an unmap (CWSR saves).
    pub saves: u64,
}

/// An online busy period: first online dispatch published while none was in flight → the last
/// completed, ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct BusyPeriod {
    pub start_ns: u64,
    pub end_ns: u64,
    /// Some offline queue had a dispatch waiting or started when it began: something to
    /// preempt (without it the period needs no suspend, and one deferred costs nothing).
    pub offline_work: bool,
}

#[derive(Clone, Debug)]
pub struct GpuCore {
    bound: Bound,
    restore_ns: u64,
    queues: Vec<Queue>,
    origin: Option<u64>,
    now: u64,
    unmapped: u32,
    /// Serial: the queue served last (the turn goes on from the next).
    turn: usize,
    acct: Accounting,
    online_in_flight: u64,
    busy_start: Option<u64>,
    busy_offline_work: bool,
    busy: Vec<BusyPeriod>,
}

impl GpuCore {
    pub fn new(bound: Bound, restore_ns: u64) -> Self {
        Self {
            bound,
            restore_ns,
            queues: Vec::new(),
            origin: None,
            now: 0,
            unmapped: 0,
            turn: usize::MAX,
            acct: Accounting::default(),
            online_in_flight: 0,
            busy_start: None,
            busy_offline_work: false,
            busy: Vec::new(),
        }
    }

    /// A queue of `client` (an index into [`Accounting::clients`]); returns its index.
    pub fn add_queue(&mut self, client: usize, side: Side) -> usize {
        if self.acct.clients.len() <= client {
            self.acct.clients.resize(client + 1, ClientTime::default());
        }
        self.queues.push(Queue {
            client,
            side,
            pending: VecDeque::new(),
            head: None,
            suspended: false,
            started: 0,
            completed: 0,
        });
        self.queues.len() - 1
    }

    pub fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// Read index (dispatches started) and completions of queue `q`.
    pub fn indices(&self, q: usize) -> (u64, u64) {
        (self.queues[q].started, self.queues[q].completed)
    }

    pub fn side(&self, q: usize) -> Side {
        self.queues[q].side
    }

    pub fn client(&self, q: usize) -> usize {
        self.queues[q].client
    }

    pub fn suspended(&self, q: usize) -> bool {
        self.queues[q].suspended
    }

    /// Queue `q` has a dispatch executing now (waves in flight: what `cu_occupancy` counts).
    pub fn executing(&self, q: usize) -> bool {
        self.queues[q].head.is_some_and(|h| h.executing)
    }

    pub fn accounting(&self) -> &Accounting {
        &self.acct
    }

    pub fn busy_periods(&self) -> &[BusyPeriod] {
        &self.busy
    }

    /// The online busy period in progress, if any (its start).
    pub fn busy_since(&self) -> Option<u64> {
        self.busy_start
    }

    /// A dispatch of `work_ns` published on queue `q` at `publish_ns` (the client's clock), seen
    /// at `now`.
    pub fn publish(&mut self, now: u64, q: usize, work_ns: u64, publish_ns: u64) {
        self.advance(now);
        if self.queues[q].side == Side::Online {
            if self.online_in_flight == 0 {
                self.busy_start = Some(publish_ns.min(now));
                self.busy_offline_work =
                    self.queues.iter().any(|q| q.side == Side::Offline && (q.head.is_some() || !q.pending.is_empty()));
            }
            self.online_in_flight += 1;
        }
        self.queues[q].pending.push_back(work_ns);
        self.schedule();
    }

    /// An unmap begins: every executing dispatch is saved. Returns how many (each costs the
    /// profile's save inside the ioctl).
    pub fn unmap_begin(&mut self, now: u64) -> usize {
        self.advance(now);
        self.unmapped += 1;
        self.acct.unmaps += 1;
        let mut saved = 0;
        for q in &mut self.queues {
            if let Some(h) = &mut q.head
                && h.executing
            {
                h.executing = false;
                h.restore += self.restore_ns;
                saved += 1;
            }
        }
        self.acct.saves += saved as u64;
        saved
    }

    /// The unmap ends: `suspend` queues stay unmapped (suspended), `resume` ones are mapped again.
    pub fn unmap_end(&mut self, now: u64, suspend: &[usize], resume: &[usize]) {
        self.advance(now);
        self.unmapped = self.unmapped.saturating_sub(1);
        for &q in suspend {
            self.queues[q].suspended = true;
        }
        for &q in resume {
            self.queues[q].suspended = false;
        }
        self.schedule();
    }

    /// When the next dispatch completes if nothing else happens.
    pub fn next_event(&self) -> Option<u64> {
        let (k, min) = self.running();
        (k > 0).then(|| self.now + min * k as u64)
    }

    /// (executing dispatches, least time left among them).
    fn running(&self) -> (usize, u64) {
        self.queues
            .iter()
            .filter_map(|q| q.head.filter(|h| h.executing))
            .fold((0, u64::MAX), |(k, min), h| (k + 1, min.min(h.left())))
    }

    /// Run the clock to `to`, completing and starting dispatches on the way.
    pub fn advance(&mut self, to: u64) {
        let origin = *self.origin.get_or_insert(to);
        if to <= self.now && self.now != 0 {
            return;
        }
        if self.now == 0 {
            self.now = origin;
        }
        loop {
            let (k, min) = self.running();
            let step_end = if k > 0 { (self.now + min * k as u64).min(to) } else { to };
            let dt = step_end - self.now;
            if k == 0 {
                if self.unmapped > 0 {
                    self.acct.stalled_ns += dt;
                } else {
                    self.acct.idle_ns += dt;
                }
            } else {
                self.progress(dt, k);
            }
            self.now = step_end;
            self.acct.elapsed_ns = self.now - origin;
            if k > 0 && self.any_done() {
                self.complete_done();
                self.schedule();
                continue;
            }
            if self.now >= to {
                break;
            }
        }
    }

    fn any_done(&self) -> bool {
        self.queues.iter().any(|q| q.head.is_some_and(|h| h.executing && h.left() == 0))
    }

    /// `dt` of GPU time shared by the `k` executing dispatches (the remainder to the first ones,
    /// so nothing is lost).
    fn progress(&mut self, dt: u64, k: usize) {
        let (share, mut extra) = (dt / k as u64, dt % k as u64);
        for q in &mut self.queues {
            let Some(h) = &mut q.head else { continue };
            if !h.executing {
                continue;
            }
            let mut d = share + u64::from(extra > 0);
            extra = extra.saturating_sub(1);
            let c = &mut self.acct.clients[q.client];
            let r = d.min(h.restore);
            h.restore -= r;
            c.restore_ns += r;
            d -= r;
            let w = d.min(h.work);
            h.work -= w;
            c.work_ns += w;
        }
    }

    fn complete_done(&mut self) {
        for q in &mut self.queues {
            if q.head.is_some_and(|h| h.executing && h.left() == 0) {
                q.head = None;
                q.completed += 1;
                self.acct.clients[q.client].completed += 1;
                if q.side == Side::Online {
                    self.online_in_flight -= 1;
                    if self.online_in_flight == 0
                        && let Some(start) = self.busy_start.take()
                    {
                        let offline_work = self.busy_offline_work;
                        self.busy.push(BusyPeriod { start_ns: start, end_ns: self.now, offline_work });
                    }
                }
            }
        }
    }

    /// Start or continue dispatches as the bound allows.
    fn schedule(&mut self) {
        if self.unmapped > 0 {
            return;
        }
        match self.bound {
            Bound::Shared => {
                for q in &mut self.queues {
                    if q.suspended {
                        continue;
                    }
                    start_head(q);
                    if let Some(h) = &mut q.head {
                        h.executing = true;
                    }
                }
            }
            Bound::Serial => {
                if self.running().0 > 0 {
                    return;
                }
                let n = self.queues.len();
                for i in 1..=n {
                    let qi = self.turn.wrapping_add(i) % n;
                    let q = &mut self.queues[qi];
                    if q.suspended || (q.head.is_none() && q.pending.is_empty()) {
                        continue;
                    }
                    start_head(q);
                    if let Some(h) = &mut q.head {
                        h.executing = true;
                    }
                    self.turn = qi;
                    return;
                }
            }
        }
    }
}

/// Consume the next packet of `q` if it has no started dispatch (the read index moves now).
fn start_head(q: &mut Queue) {
    if q.head.is_none()
        && let Some(work) = q.pending.pop_front()
    {
        q.head = Some(Head { restore: 0, work, executing: false });
        q.started += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;
    const T0: u64 = 1_000_000_000;

    fn conserved(g: &GpuCore) {
        let a = g.accounting();
        let busy: u64 = a.clients.iter().map(|c| c.work_ns + c.restore_ns).sum();
        assert_eq!(busy + a.idle_ns + a.stalled_ns, a.elapsed_ns, "busy + idle + stalled = elapsed");
    }

    #[test]
    fn serial_gpu_consumes_two_queues_in_turn_and_in_order() {
        let mut g = GpuCore::new(Bound::Serial, 100 * US);
        let (a, b) = (g.add_queue(0, Side::Offline), g.add_queue(1, Side::Offline));
        for k in 0..3 {
            g.publish(T0, a, (10 + k) * US, T0);
            g.publish(T0, b, (20 + k) * US, T0);
        }
        // a0 runs at once; the read index of b moves only when a0 is done.
        assert_eq!((g.indices(a), g.indices(b)), ((1, 0), (0, 0)));
        assert_eq!(g.next_event(), Some(T0 + 10 * US));
        g.advance(T0 + 10 * US);
        assert_eq!((g.indices(a), g.indices(b)), ((1, 1), (1, 0)));
        // a0 10, b0 20, a1 11, b1 21, a2 12, b2 22: all done at 96 µs.
        g.advance(T0 + 95 * US);
        assert_eq!((g.indices(a), g.indices(b)), ((3, 3), (3, 2)));
        g.advance(T0 + 96 * US);
        assert_eq!((g.indices(a), g.indices(b)), ((3, 3), (3, 3)));
        assert_eq!(g.next_event(), None);
        let c = &g.accounting().clients;
        assert_eq!((c[0].work_ns, c[1].work_ns, c[0].completed, c[1].completed), (33 * US, 63 * US, 3, 3));
        g.advance(T0 + 200 * US);
        assert_eq!(g.accounting().idle_ns, 104 * US);
        conserved(&g);
    }

    #[test]
    fn a_suspended_queue_starts_nothing_until_resumed() {
        let mut g = GpuCore::new(Bound::Serial, 0);
        let q = g.add_queue(0, Side::Offline);
        assert_eq!(g.unmap_begin(T0), 0);
        g.unmap_end(T0 + 50 * US, &[q], &[]);
        g.publish(T0 + 60 * US, q, 10 * US, T0 + 60 * US);
        g.advance(T0 + 10_000 * US);
        assert_eq!(g.indices(q), (0, 0));
        assert_eq!(g.next_event(), None);
        g.unmap_begin(T0 + 10_000 * US);
        g.unmap_end(T0 + 10_030 * US, &[], &[q]);
        assert_eq!(g.indices(q), (1, 0));
        assert_eq!(g.next_event(), Some(T0 + 10_040 * US));
        g.advance(T0 + 10_040 * US);
        assert_eq!(g.indices(q), (1, 1));
        assert_eq!(g.accounting().stalled_ns, 80 * US);
        conserved(&g);
    }

    #[test]
    fn a_dispatch_caught_by_a_suspend_ends_later_by_exactly_the_hold_and_the_restore() {
        for bound in [Bound::Serial, Bound::Shared] {
            let mut g = GpuCore::new(bound, 100 * US);
            let q = g.add_queue(0, Side::Offline);
            g.publish(T0, q, 1_000 * US, T0);
            // 300 µs done, 700 µs left when the suspend's unmap begins; the call lasts 250 µs
            // (its save inside), the queue stays suspended until a resume at 2000 µs lasting 50 µs.
            assert_eq!(g.unmap_begin(T0 + 300 * US), 1);
            g.unmap_end(T0 + 550 * US, &[q], &[]);
            g.advance(T0 + 2_000 * US);
            assert_eq!(g.indices(q), (1, 0));
            assert_eq!(g.unmap_begin(T0 + 2_000 * US), 0);
            g.unmap_end(T0 + 2_050 * US, &[], &[q]);
            // Ends at 2050 + 100 (restore) + 700 (the rest of its work).
            assert_eq!(g.next_event(), Some(T0 + 2_850 * US), "{bound:?}");
            g.advance(T0 + 2_850 * US);
            assert_eq!(g.indices(q), (1, 1));
            let a = g.accounting();
            assert_eq!((a.clients[0].work_ns, a.clients[0].restore_ns, a.saves), (1_000 * US, 100 * US, 1));
            assert_eq!(a.stalled_ns, 300 * US);
            conserved(&g);
        }
    }

    #[test]
    fn the_unmap_stall_delays_an_online_dispatch_by_exactly_the_stall() {
        let mut g = GpuCore::new(Bound::Serial, 100 * US);
        let (on, off) = (g.add_queue(0, Side::Online), g.add_queue(1, Side::Offline));
        g.unmap_begin(T0);
        g.publish(T0 + 10 * US, on, 500 * US, T0 + 10 * US);
        // Not running, so not saved: no restore, only the stall (T0 → T0 + 400 µs).
        g.unmap_end(T0 + 400 * US, &[off], &[]);
        assert_eq!(g.indices(on), (1, 0));
        g.advance(T0 + 900 * US);
        assert_eq!(g.indices(on), (1, 1));
        assert_eq!(
            g.busy_periods(),
            &[BusyPeriod { start_ns: T0 + 10 * US, end_ns: T0 + 900 * US, offline_work: false }]
        );
        // An online dispatch executing when an unmap begins pays the stall and its restore.
        g.publish(T0 + 1_000 * US, on, 500 * US, T0 + 1_000 * US);
        g.unmap_begin(T0 + 1_200 * US);
        g.unmap_end(T0 + 1_300 * US, &[], &[off]);
        assert_eq!(g.next_event(), Some(T0 + 1_300 * US + 100 * US + 300 * US));
        conserved(&g);
    }

    #[test]
    fn shared_dispatches_split_the_gpu_and_an_online_dispatch_is_consumed_at_once() {
        let mut g = GpuCore::new(Bound::Shared, 0);
        let (on, off) = (g.add_queue(0, Side::Online), g.add_queue(1, Side::Offline));
        g.publish(T0, off, 1_000 * US, T0);
        g.publish(T0 + 100 * US, on, 200 * US, T0 + 100 * US);
        // Read index == write index while it runs: the blind spot `cu_occupancy` covers.
        assert_eq!(g.indices(on), (1, 0));
        assert!(g.executing(on));
        // Two share the GPU: the online one needs 400 µs of wall time.
        assert_eq!(g.next_event(), Some(T0 + 500 * US));
        g.advance(T0 + 500 * US);
        assert_eq!(g.indices(on), (1, 1));
        // The offline one: 100 alone + 200 shared + 700 alone.
        assert_eq!(g.next_event(), Some(T0 + 1_200 * US));
        g.advance(T0 + 1_300 * US);
        let a = g.accounting();
        assert_eq!((a.clients[0].work_ns, a.clients[1].work_ns, a.idle_ns), (200 * US, 1_000 * US, 100 * US));
        conserved(&g);
    }
}
