//! The served continuous-batching engine (issue 45's batching over TCP): requests reach it from
//! the served client's connection threads after their CPU phase (`server.rs`), join at the next
//! step, and leave when their last token is generated; one step (a dispatch) at a time while any
//! request is in flight, with the engine's CPU gap between steps, as vLLM's engine loop runs
//! beside its API server. The offline client's [`crate::client`] `batching_loop` is the same
//! engine fed by the trace's arrival times instead of a socket.

use std::{
    collections::BTreeMap,
    sync::{Condvar, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use gpreempt::clock::monotonic_ns;

use crate::{
    load::{Arrival, TokenModel, step_ns},
    publisher::Publisher,
    rng::Rng,
};

/// How long the engine thread or a waiting connection sleeps before it looks whether the run
/// stopped (the harness's stop flag is not a condition variable).
const LOOK: Duration = Duration::from_millis(20);

/// What the engine recorded, as the unserved engine records it (`ClientResult`'s batching
/// fields).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct EngineRecord {
    /// Per step, publish → completion seen, ns.
    pub step_ns: Vec<u64>,
    /// Per step, whether it opened a busy period (admitted the first request to an idle engine).
    pub step_opens_busy: Vec<bool>,
    /// The busy periods: the opening step's publish → the completion of the step that finished the
    /// last request in flight (CLOCK_MONOTONIC, ns).
    pub busy_ns: Vec<(u64, u64)>,
}

#[derive(Default)]
struct State {
    /// Requests read and through their CPU phase, waiting for the next step.
    joining: Vec<u64>,
    /// Requests ended: id → (the publish of the step that admitted it, its last step's completion).
    ended: BTreeMap<u64, (u64, u64)>,
    /// No request will join any more (every one was answered, or the run stopped).
    closed: bool,
    record: EngineRecord,
}

pub(crate) struct Engine<'a, P: Publisher> {
    ctx: &'a P,
    arrivals: &'a [Arrival],
    model: TokenModel,
    gap: (u64, u64),
    state: Mutex<State>,
    /// The engine thread waits here for requests to join.
    joined: Condvar,
    /// Connection threads wait here for their request's end.
    ended: Condvar,
}

impl<'a, P: Publisher> Engine<'a, P> {
    /// An engine for the requests `arrivals` describes (by id: the index), publishing on the
    /// client's first queue, with a CPU gap between steps uniform in `gap` (ns).
    pub(crate) fn new(ctx: &'a P, arrivals: &'a [Arrival], model: TokenModel, gap: (u64, u64)) -> Self {
        Self {
            ctx,
            arrivals,
            model,
            gap,
            state: Mutex::new(State::default()),
            joined: Condvar::new(),
            ended: Condvar::new(),
        }
    }

    /// The requests the engine serves.
    pub(crate) fn len(&self) -> usize {
        self.arrivals.len()
    }

    /// Request `id`'s prompt tokens (its CPU phase grows with them); None: no such request.
    pub(crate) fn tokens(&self, id: u64) -> Option<u64> {
        self.arrivals.get(id as usize).map(|a| a.context)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicked connection thread leaves the state consistent: each change is one statement.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Request `id` joins at the next step; returns when it has ended: (the publish of the step
    /// that admitted it, its last step's completion). None: no such request, or the engine closed
    /// first (the run stopped).
    pub(crate) fn admit(&self, id: u64) -> Option<(u64, u64)> {
        self.arrivals.get(id as usize)?;
        let mut state = self.lock();
        if state.closed {
            return None;
        }
        state.joining.push(id);
        self.joined.notify_one();
        loop {
            if let Some(&ended) = state.ended.get(&id) {
                return Some(ended);
            }
            if state.closed {
                return None;
            }
            state = self.ended.wait_timeout(state, LOOK).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// No request joins any more: the engine thread ends once those in flight have.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.joined.notify_all();
        self.ended.notify_all();
    }

    /// The engine thread: steps while any request is in flight, until closed and empty (or the
    /// run stopped).
    pub(crate) fn run(&self, seed: u64) {
        let mut rng = Rng::new(seed);
        // (id, tokens still to generate, the publish of the step that admitted it)
        let mut active: Vec<(u64, u64, u64)> = Vec::new();
        let mut busy_since: Option<u64> = None;
        while !self.ctx.stopped() {
            let joining = {
                let mut state = self.lock();
                while active.is_empty() && state.joining.is_empty() && !state.closed && !self.ctx.stopped() {
                    state = self.joined.wait_timeout(state, LOOK).unwrap_or_else(PoisonError::into_inner).0;
                }
                if active.is_empty() && state.joining.is_empty() {
                    // Closed, or stopped, with nothing in flight.
                    break;
                }
                std::mem::take(&mut state.joining)
            };
            let context: u64 = joining.iter().filter_map(|&id| self.tokens(id)).sum();
            let batch = (active.len() + joining.len()) as u64;
            let (target, at) = self.ctx.publish(0, &[step_ns(self.model, batch, context)]);
            for id in joining {
                let generated = self.arrivals.get(id as usize).map_or(1, |a| a.generated.max(1));
                active.push((id, generated, at));
            }
            let opens = busy_since.is_none();
            busy_since.get_or_insert(at);
            if !self.ctx.wait_done(0, target) {
                break;
            }
            let done = monotonic_ns();
            {
                let mut state = self.lock();
                state.record.step_ns.push(done - at);
                state.record.step_opens_busy.push(opens);
                for a in &mut active {
                    a.1 -= 1;
                    if a.1 == 0 {
                        state.ended.insert(a.0, (a.2, done));
                    }
                }
                active.retain(|a| a.1 > 0);
                if active.is_empty()
                    && let Some(start) = busy_since.take()
                {
                    state.record.busy_ns.push((start, done));
                }
            }
            self.ended.notify_all();
            // The engine's CPU work between steps (scheduling, sampling): asleep, to spare cores.
            let until = done + rng.between(self.gap.0, self.gap.1);
            let now = monotonic_ns();
            if until > now {
                std::thread::sleep(Duration::from_nanos(until - now));
            }
        }
        self.close();
    }

    pub(crate) fn into_record(self) -> EngineRecord {
        self.state.into_inner().unwrap_or_else(PoisonError::into_inner).record
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// A queue that completes each dispatch as it is published, and counts them.
    struct Instant {
        published: AtomicU64,
        steps: Mutex<Vec<u64>>,
    }

    impl Publisher for Instant {
        fn stopped(&self) -> bool {
            false
        }
        fn queue_count(&self) -> usize {
            1
        }
        fn publish(&self, q: usize, dispatches: &[u64]) -> (u64, u64) {
            assert_eq!(q, 0);
            self.steps.lock().unwrap().extend_from_slice(dispatches);
            (self.published.fetch_add(dispatches.len() as u64, Ordering::AcqRel) + 1, monotonic_ns())
        }
        fn wait_done(&self, _: usize, _: u64) -> bool {
            true
        }
    }

    #[test]
    fn requests_join_at_the_next_step_and_leave_after_their_tokens() {
        let gpu = Instant { published: AtomicU64::new(0), steps: Mutex::new(Vec::new()) };
        let arrivals =
            [Arrival { at_ns: 0, context: 100, generated: 3 }, Arrival { at_ns: 0, context: 40, generated: 1 }];
        let model = TokenModel { prefill_ns_per_token: 10, decode_step_ns: 1_000, per_sequence_ns: 100 };
        let engine = Engine::new(&gpu, &arrivals, model, (0, 0));
        let (first, second, unknown) = std::thread::scope(|s| {
            let e = &engine;
            let runner = s.spawn(move || e.run(1));
            let first = e.admit(0);
            let second = e.admit(1);
            let unknown = e.admit(7);
            e.close();
            runner.join().unwrap();
            (first, second, unknown)
        });
        assert_eq!(unknown, None);
        let (first, second) = (first.unwrap(), second.unwrap());
        assert!(first.0 <= first.1 && second.0 <= second.1);
        let record = engine.into_record();
        // Request 0 alone, three steps (the first with its 100 prompt tokens); then request 1 alone:
        // one step with its 40. Each was admitted to an idle engine: two busy periods.
        assert_eq!(*gpu.steps.lock().unwrap(), vec![2_100, 1_100, 1_100, 1_500]);
        assert_eq!(record.step_opens_busy, vec![true, false, false, true]);
        assert_eq!(record.step_ns.len(), 4);
        assert_eq!(record.busy_ns.len(), 2);
        assert_eq!(record.busy_ns[0].0, first.0);
        assert_eq!(record.busy_ns[1], second);
    }

    #[test]
    fn a_closed_engine_admits_nothing_and_its_thread_ends() {
        let gpu = Instant { published: AtomicU64::new(0), steps: Mutex::new(Vec::new()) };
        let arrivals = [Arrival { at_ns: 0, context: 1, generated: 1 }];
        let engine = Engine::new(&gpu, &arrivals, TokenModel::default(), (0, 0));
        engine.close();
        assert_eq!(engine.admit(0), None);
        engine.run(1);
        assert!(gpu.steps.lock().unwrap().is_empty());
        assert_eq!(engine.into_record(), EngineRecord::default());
    }
}
