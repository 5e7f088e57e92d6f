//! The request path's figures (issue 45): what the sender and the served client recorded of each
//! request, joined by its id. *From arrival* = the sender's write → its answer read (what the user
//! feels); *lead* = the sender's write → the client's first dispatch published (the CPU phase,
//! the TCP path and the server thread's wake-up: what the arrival probe has to work with); and,
//! under the scheduler, whether each request's first dispatch found the offline side of the
//! online GPU already held (its SUSPENDs returned), issue 45's "≥ 99 % of requests find the
//! SUSPENDs done before their first doorbell".

use std::collections::BTreeMap;

use gpreempt::stats::Summary;
use serde::Serialize;

use crate::{
    run::Raw,
    sender::ProbeCount,
    server::{Answered, Served},
};

#[derive(Clone, Debug, Default, Serialize)]
pub struct RequestPathFigures {
    /// The cgroup the client ran in (None: the harness's own, see the warnings).
    pub cgroup: Option<String>,
    pub requests_sent: usize,
    pub requests_answered: usize,
    /// Request connections the sender's pool opened.
    pub connections: usize,
    pub latency_from_arrival_ms: Option<Summary>,
    pub lead_ms: Option<Summary>,
    /// The CPU phase as the client spun it (message read → first dispatch published), ms.
    pub cpu_phase_ms: Option<Summary>,
    pub probes: Vec<ProbeCount>,
    /// What the client answered besides the requests.
    pub answered: Answered,
    /// Scheduled states: the share of requests whose first dispatch found the online GPU held.
    pub found_held: Option<f64>,
    pub errors: Vec<String>,
}

/// Per request answered (in id order): its latency from arrival, its lead, and its latency from
/// the first submission, ns.
pub fn joined(raw: &Raw) -> Vec<(u64, u64, u64)> {
    let (Some(sender), Some(online)) = (raw.sender.as_ref(), raw.online()) else { return Vec::new() };
    let served: BTreeMap<u64, &Served> = online.served.iter().map(|s| (s.id, s)).collect();
    let mut sent: Vec<_> = sender.requests.iter().filter(|s| s.answered_ns > 0).collect();
    sent.sort_by_key(|s| s.id);
    sent.iter()
        .filter_map(|s| {
            let c = served.get(&s.id)?;
            Some((
                s.answered_ns.saturating_sub(s.sent_ns),
                c.published_ns.saturating_sub(s.sent_ns),
                c.completed_ns.saturating_sub(c.published_ns),
            ))
        })
        .collect()
}

fn ms(xs: impl Iterator<Item = u64>) -> Option<Summary> {
    Summary::of(&xs.map(|ns| ns as f64 / 1e6).collect::<Vec<_>>())
}

/// `held`: the online GPU's held intervals (scheduled states), for `found_held`.
pub fn reduce(raw: &Raw, held: Option<&[(u64, u64)]>) -> Option<RequestPathFigures> {
    let sender = raw.sender.as_ref()?;
    let online = raw.online();
    let served = online.map_or(&[][..], |o| o.served.as_slice());
    let pairs = joined(raw);
    let found_held = held.filter(|_| !served.is_empty()).map(|held| {
        let n = served.iter().filter(|s| held.iter().any(|&(a, b)| a <= s.published_ns && s.published_ns < b)).count();
        n as f64 / served.len() as f64
    });
    Some(RequestPathFigures {
        cgroup: raw.cgroup.clone(),
        requests_sent: sender.requests.iter().filter(|s| s.sent_ns > 0).count(),
        requests_answered: sender.requests.iter().filter(|s| s.answered_ns > 0).count(),
        connections: sender.connections,
        latency_from_arrival_ms: ms(pairs.iter().map(|p| p.0)),
        lead_ms: ms(pairs.iter().map(|p| p.1)),
        cpu_phase_ms: ms(served.iter().map(|s| s.published_ns.saturating_sub(s.read_ns))),
        probes: sender.probes.clone(),
        answered: online.map(|o| o.answered).unwrap_or_default(),
        found_held,
        errors: sender.errors.clone(),
    })
}
