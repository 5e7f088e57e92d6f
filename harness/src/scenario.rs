//! One scenario = (online load, offline set, cost profile, execution bound, scheduler variants),
//! and the client processes it needs on which GPUs.

use serde::Serialize;

use crate::{
    cpu_phase::CpuPhase,
    gpu::core::{Bound, Side},
    load::{self, ClientSpec, Request, TokenModel, Trace},
    profile::Profile,
};

const MS: u64 = 1_000_000;

/// The continuous-batching engine's CPU gap between steps, uniform in [lo, hi] ns (PROFILES.md
/// "Token → GPU-time model": scheduling, sampling, detokenising, "gaps of about a millisecond").
pub const ENGINE_GAP_NS: (u64, u64) = (MS / 2, 3 * MS / 2);

/// The online side.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Online {
    /// Poisson requests (PROFILES.md "Loads"), over `queues` queues in turn.
    Poisson { rate_hz: f64, requests: usize, dispatches: u64, dispatch_ns: u64, spread: f64, queues: usize },
    /// The Azure trace's arrivals and tokens, served without batching.
    Trace { trace: Trace, requests: usize },
    /// The Azure trace through a continuous-batching engine.
    Batching { trace: Trace, requests: usize },
    /// No online work for `seconds` (its queue created, nothing published), then one 1 ms
    /// request to end the run: what the scheduler costs while it waits.
    Idle { seconds: u64 },
}

/// The offline side.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Offline {
    /// `processes` trainers on the online GPU, one queue each; with `host_gap_ns` not (0, 0),
    /// loader-bound: one step in flight, then host work of [lo, hi] ns before the next.
    Trainers { processes: usize, dispatch_ns: u64, spread: f64, step_dispatches: u32, host_gap_ns: (u64, u64) },
    /// A 2-GPU data-parallel job: rank 0 on the online GPU, rank 1 on the other.
    DataParallel { dispatch_ns: u64, spread: f64, step_dispatches: u32 },
}

/// How requests reach the online client (issue 45): over loopback TCP from the harness, each
/// with its CPU phase before its first dispatch, beside health probes and metric scrapes on
/// connections of their own; the client in a cgroup v2 of its own, so the scheduler's arrival
/// probe (`cgroup_skb` ingress) runs on its packets natively.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Serving {
    pub cpu: CpuPhase,
    /// `GET /health` per second (a kubelet's default probe period is 10 s, a load balancer's
    /// health check often 1 s: 1/s is the usual rate taken; 20/s the stress rate).
    pub health_per_s: f64,
    /// `GET /metrics` per second (Prometheus scrapes every 15 s by default: 1/15).
    pub metrics_per_s: f64,
}

/// Probe and scrape rates (PROFILES.md "Requests over TCP").
pub const NO_PROBES: (f64, f64) = (0.0, 0.0);
pub const USUAL_PROBES: (f64, f64) = (1.0, 1.0 / 15.0);
pub const STRESS_PROBES: (f64, f64) = (20.0, 1.0 / 15.0);

impl Serving {
    pub fn new(cpu: CpuPhase, (health_per_s, metrics_per_s): (f64, f64)) -> Self {
        Self { cpu, health_per_s, metrics_per_s }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Scenario {
    pub name: String,
    pub online: Online,
    pub offline: Offline,
    pub profile: Profile,
    pub bound: Bound,
    pub variants: Vec<String>,
    pub seed: u64,
    /// None: the requests are the online client's own, published at their arrival (as before
    /// issue 45); Some: sent over TCP (Poisson, trace and batching loads).
    pub serving: Option<Serving>,
}

/// A client process to start: its side, what it runs, its queues' GPUs.
#[derive(Clone, Debug)]
pub struct ClientPlan {
    pub side: Side,
    pub spec: ClientSpec,
    pub gpus: Vec<usize>,
}

impl Scenario {
    pub fn gpus(&self) -> usize {
        match self.offline {
            Offline::DataParallel { .. } => 2,
            Offline::Trainers { .. } => 1,
        }
    }

    pub fn online_client(&self) -> ClientPlan {
        let model = TokenModel::default();
        let (spec, queues) = match &self.online {
            Online::Poisson { rate_hz, requests, dispatches, dispatch_ns, spread, queues } => {
                let r = load::poisson(*rate_hz, *requests, *dispatches, *dispatch_ns, *spread, self.seed);
                (ClientSpec::Requests { requests: r }, *queues)
            }
            Online::Trace { trace, requests } => {
                let r: Vec<Request> = load::trace_requests(&trace.arrivals(*requests), model);
                (ClientSpec::Requests { requests: r }, 1)
            }
            Online::Idle { seconds } => (
                ClientSpec::Requests {
                    requests: vec![Request { at_ns: seconds * 1_000 * MS, dispatches: vec![MS], tokens: 0 }],
                },
                1,
            ),
            Online::Batching { trace, requests } => (
                ClientSpec::Batching {
                    arrivals: trace.arrivals(*requests),
                    model,
                    gap_lo_ns: ENGINE_GAP_NS.0,
                    gap_hi_ns: ENGINE_GAP_NS.1,
                    seed: self.seed,
                },
                1,
            ),
        };
        let spec = match (spec, self.serving) {
            (ClientSpec::Requests { mut requests }, Some(serving)) => {
                if matches!(self.online, Online::Poisson { .. }) {
                    load::with_prompts(&mut requests, self.seed);
                }
                ClientSpec::Served { requests, cpu: serving.cpu }
            }
            (ClientSpec::Batching { arrivals, model, gap_lo_ns, gap_hi_ns, seed }, Some(serving)) => {
                ClientSpec::ServedBatching { arrivals, model, gap_lo_ns, gap_hi_ns, seed, cpu: serving.cpu }
            }
            (spec, _) => spec,
        };
        ClientPlan { side: Side::Online, spec, gpus: vec![0; queues.max(1)] }
    }

    pub fn offline_clients(&self) -> Vec<ClientPlan> {
        match self.offline {
            Offline::Trainers { processes, dispatch_ns, spread, step_dispatches, host_gap_ns } => (0..processes)
                .map(|i| ClientPlan {
                    side: Side::Offline,
                    spec: ClientSpec::Trainer {
                        dispatch_ns,
                        spread,
                        step_dispatches,
                        inflight: if host_gap_ns.1 > 0 { 1 } else { 2 },
                        host_gap_ns,
                        seed: self.seed + 100 + i as u64,
                    },
                    gpus: vec![0],
                })
                .collect(),
            Offline::DataParallel { dispatch_ns, spread, step_dispatches } => (0..2)
                .map(|rank| ClientPlan {
                    side: Side::Offline,
                    spec: ClientSpec::DpRank {
                        dispatch_ns,
                        spread,
                        step_dispatches,
                        ranks: 2,
                        seed: self.seed + 200 + rank,
                    },
                    gpus: vec![rank as usize],
                })
                .collect(),
        }
    }

    /// Online requests expected (for suspends per request).
    pub fn requests(&self) -> usize {
        match &self.online {
            Online::Poisson { requests, .. } | Online::Trace { requests, .. } | Online::Batching { requests, .. } => {
                *requests
            }
            Online::Idle { .. } => 1,
        }
    }
}

/// The shapes of PROFILES.md "Loads".
pub fn poisson(requests: usize) -> Online {
    Online::Poisson { rate_hz: 20.0, requests, dispatches: 3, dispatch_ns: MS, spread: 0.5, queues: 2 }
}

pub fn trainers(processes: usize) -> Offline {
    Offline::Trainers { processes, dispatch_ns: 4 * MS, spread: 0.5, step_dispatches: 4, host_gap_ns: (0, 0) }
}

/// Loader-bound trainers (PROFILES.md "Loads"): the same steps, one in flight, each followed by
/// 5-25 ms of host work (input decoding and augmentation that cannot keep up with the GPU).
pub fn loader_bound_trainers(processes: usize) -> Offline {
    Offline::Trainers {
        processes,
        dispatch_ns: 4 * MS,
        spread: 0.5,
        step_dispatches: 4,
        host_gap_ns: (5 * MS, 25 * MS),
    }
}

/// §7.3's 1-offline trainer: one queue, steps of 2 dispatches of 5 ms ± 50 %.
pub fn section7_trainer() -> Offline {
    Offline::Trainers { processes: 1, dispatch_ns: 5 * MS, spread: 0.5, step_dispatches: 2, host_gap_ns: (0, 0) }
}

pub fn data_parallel() -> Offline {
    Offline::DataParallel { dispatch_ns: 4 * MS, spread: 0.5, step_dispatches: 4 }
}
