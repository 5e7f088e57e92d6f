//! The loads: what each client process does, as data the harness generates (seeded) and hands
//! it; the token → GPU-time model of PROFILES.md.

use serde::{Deserialize, Serialize};

use crate::{cpu_phase::CpuPhase, rng::Rng};

/// One online request: when it arrives (ns after the load's start) and its dispatches' GPU times.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub at_ns: u64,
    pub dispatches: Vec<u64>,
    /// Its prompt's tokens (the CPU phase and the body sent over TCP grow with it); 0 where no
    /// prompt is modelled.
    #[serde(default)]
    pub tokens: u64,
}

/// One arrival of the trace, for the continuous-batching server.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Arrival {
    pub at_ns: u64,
    pub context: u64,
    pub generated: u64,
}

/// Tokens → GPU time (PROFILES.md, "Token → GPU-time model": a 1B-class model on an MI300X).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenModel {
    pub prefill_ns_per_token: u64,
    pub decode_step_ns: u64,
    pub per_sequence_ns: u64,
}

impl Default for TokenModel {
    fn default() -> Self {
        Self { prefill_ns_per_token: 5_000, decode_step_ns: 800_000, per_sequence_ns: 20_000 }
    }
}

/// What a client process does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ClientSpec {
    /// Open loop: each request's dispatches published together at its arrival, on the client's
    /// queues in turn; latency = publish of its first dispatch → completion of its last.
    Requests { requests: Vec<Request> },
    /// The same requests, received over loopback TCP (the harness sends them at their arrival
    /// times, `server.rs`): each read, its CPU phase spun, then its dispatches published on the
    /// client's queues in turn (request id modulo queues), its answer sent when they completed.
    Served { requests: Vec<Request>, cpu: CpuPhase },
    /// A continuous-batching engine: while any request is in flight, one step (a dispatch) at a
    /// time, requests joining at the next step, a CPU gap between steps.
    Batching { arrivals: Vec<Arrival>, model: TokenModel, gap_lo_ns: u64, gap_hi_ns: u64, seed: u64 },
    /// The same engine behind a served client (`engine.rs`): the requests received over loopback
    /// TCP at the arrivals' times, each read, its CPU phase spun (its context tokens), then
    /// joining the engine's next step; answered when its last token is generated.
    ServedBatching {
        arrivals: Vec<Arrival>,
        model: TokenModel,
        gap_lo_ns: u64,
        gap_hi_ns: u64,
        seed: u64,
        cpu: CpuPhase,
    },
    /// Training steps kept `inflight` deep until told to stop.
    /// With `host_gap_ns` (lo, hi) not (0, 0): after each step, host work of a uniform time in
    /// [lo, hi] before the next is published (a data loader that cannot keep up).
    Trainer { dispatch_ns: u64, spread: f64, step_dispatches: u32, inflight: u32, host_gap_ns: (u64, u64), seed: u64 },
    /// One rank of a data-parallel job: a step, then a barrier with the other ranks.
    DpRank { dispatch_ns: u64, spread: f64, step_dispatches: u32, ranks: u32, seed: u64 },
}

impl ClientSpec {
    /// A served client's requests as the harness's sender sends them: (arrival after the load's
    /// origin, prompt tokens), by id. None: the client is not served over TCP.
    pub fn sent(&self) -> Option<Vec<(u64, u64)>> {
        match self {
            Self::Served { requests, .. } => Some(requests.iter().map(|r| (r.at_ns, r.tokens)).collect()),
            Self::ServedBatching { arrivals, .. } => Some(arrivals.iter().map(|a| (a.at_ns, a.context)).collect()),
            _ => None,
        }
    }

    /// Whether the client is served over TCP (it listens, in a cgroup of its own).
    pub fn is_served(&self) -> bool {
        matches!(self, Self::Served { .. } | Self::ServedBatching { .. })
    }
}

/// Poisson arrivals at `rate_hz`; 1 to 2K-1 dispatches (uniform) of `dispatch_ns` ± `spread`.
pub fn poisson(
    rate_hz: f64,
    requests: usize,
    mean_dispatches: u64,
    dispatch_ns: u64,
    spread: f64,
    seed: u64,
) -> Vec<Request> {
    let mut rng = Rng::new(seed);
    let mut at = 0.0;
    (0..requests)
        .map(|_| {
            at += rng.exponential(1e9 / rate_hz);
            let n = rng.between(1, mean_dispatches.max(1) * 2 - 1);
            Request {
                at_ns: at as u64,
                dispatches: (0..n).map(|_| rng.around(dispatch_ns, spread)).collect(),
                tokens: 0,
            }
        })
        .collect()
}

/// Which slice of the Azure LLM inference trace 2023 (traces/README.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Trace {
    Conv,
    Code,
}

impl Trace {
    fn csv(self) -> &'static str {
        match self {
            Self::Conv => include_str!("../traces/AzureLLMInferenceTrace_conv_slice.csv"),
            Self::Code => include_str!("../traces/AzureLLMInferenceTrace_code_slice.csv"),
        }
    }

    /// The first `n` arrivals, times relative to the first.
    pub fn arrivals(self, n: usize) -> Vec<Arrival> {
        let rows: Vec<(f64, u64, u64)> = self.csv().lines().skip(1).filter_map(parse_row).take(n).collect();
        let t0 = rows.first().map_or(0.0, |r| r.0);
        rows.iter()
            .map(|&(t, context, generated)| Arrival { at_ns: ((t - t0) * 1e9) as u64, context, generated })
            .collect()
    }
}

/// `2023-11-16 18:15:46.6805900,374,44` → (seconds of the day, context, generated).
fn parse_row(line: &str) -> Option<(f64, u64, u64)> {
    let mut f = line.split(',');
    let time = f.next()?.split(' ').nth(1)?;
    let (context, generated) = (f.next()?.trim().parse().ok()?, f.next()?.trim().parse().ok()?);
    let mut hms = time.split(':');
    let (h, m, s): (f64, f64, f64) = (hms.next()?.parse().ok()?, hms.next()?.parse().ok()?, hms.next()?.parse().ok()?);
    Some((h * 3600.0 + m * 60.0 + s, context, generated))
}

/// The trace served without batching: per request one prefill dispatch and one decode dispatch
/// per generated token after the first (the prefill yields it), published together.
pub fn trace_requests(arrivals: &[Arrival], model: TokenModel) -> Vec<Request> {
    arrivals
        .iter()
        .map(|a| {
            let mut d = vec![(a.context.max(1)) * model.prefill_ns_per_token];
            d.extend(std::iter::repeat_n(
                model.decode_step_ns + model.per_sequence_ns,
                a.generated.saturating_sub(1) as usize,
            ));
            Request { at_ns: a.at_ns, dispatches: d, tokens: a.context }
        })
        .collect()
}

/// Prompts for requests that have none (Poisson): each a `ContextTokens` of the conversation
/// slice of the Azure trace (157 values, median 862, 2-4 107 tokens), drawn uniformly and
/// seeded, so a Poisson load's CPU phases have the spread of a real service's prompts.
pub fn with_prompts(requests: &mut [Request], seed: u64) {
    let contexts: Vec<u64> = Trace::Conv.arrivals(usize::MAX).iter().map(|a| a.context).collect();
    let mut rng = Rng::new(seed ^ PROMPT_SEED);
    for r in requests {
        r.tokens = contexts[rng.between(0, contexts.len() as u64 - 1) as usize];
    }
}

/// Mixed into the load's seed for its prompts (so the dispatches drawn stay those of before).
const PROMPT_SEED: u64 = 0x7072_6f6d_7074;

/// A step of the batching engine: `batch` sequences, `joining_context` prefill tokens.
pub fn step_ns(model: TokenModel, batch: u64, joining_context: u64) -> u64 {
    model.decode_step_ns + model.per_sequence_ns * batch + model.prefill_ns_per_token * joining_context
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_trace_slices_parse_with_times_from_the_first_row() {
        let a = Trace::Conv.arrivals(3);
        assert_eq!(a[0], Arrival { at_ns: 0, context: 374, generated: 44 });
        assert_eq!((a[1].context, a[1].generated), (396, 109));
        assert!((a[1].at_ns as i64 - 4_314_579_000).abs() < 1_000, "{}", a[1].at_ns);
        assert_eq!(Trace::Code.arrivals(1000).len(), 157);
        assert_eq!(Trace::Conv.arrivals(1000).len(), 157);
    }

    #[test]
    fn tokens_map_to_a_prefill_and_one_decode_step_per_later_token() {
        let m = TokenModel::default();
        let r = trace_requests(&[Arrival { at_ns: 5, context: 1000, generated: 3 }], m);
        assert_eq!(r, vec![Request { at_ns: 5, dispatches: vec![5_000_000, 820_000, 820_000], tokens: 1000 }]);
        assert_eq!(step_ns(m, 4, 100), 800_000 + 80_000 + 500_000);
    }

    #[test]
    fn poisson_requests_have_one_to_five_dispatches_within_the_spread() {
        let r = poisson(20.0, 200, 3, MS, 0.5, 1);
        assert_eq!(r.len(), 200);
        assert!(r.windows(2).all(|w| w[0].at_ns <= w[1].at_ns));
        assert!(r.iter().all(|q| (1..=5).contains(&q.dispatches.len())));
        assert!(r.iter().flat_map(|q| &q.dispatches).all(|&d| (MS / 2..=3 * MS / 2).contains(&d)));
        let mean_gap = r[199].at_ns as f64 / 200.0;
        assert!((mean_gap - 50e6).abs() < 10e6, "{mean_gap}");
    }

    #[test]
    fn poisson_prompts_come_from_the_conversation_slice_and_leave_the_dispatches_alone() {
        let mut r = poisson(20.0, 200, 3, MS, 0.5, 1);
        let before = r.clone();
        with_prompts(&mut r, 1);
        let contexts: Vec<u64> = Trace::Conv.arrivals(1000).iter().map(|a| a.context).collect();
        assert!(r.iter().all(|q| contexts.contains(&q.tokens)));
        assert!(r.iter().zip(&before).all(|(a, b)| a.at_ns == b.at_ns && a.dispatches == b.dispatches));
        // Seeded: the same seed, the same prompts; and not all one value.
        let mut again = before.clone();
        with_prompts(&mut again, 1);
        assert_eq!(again, r);
        assert!(r.iter().any(|q| q.tokens != r[0].tokens));
        assert_eq!((contexts.iter().min(), contexts.iter().max()), (Some(&2), Some(&4_107)));
    }
}
