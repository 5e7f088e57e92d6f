//! The host's idle states for a run: the CPU wake latency request `gpreempt schedule` holds by
//! default (`--cpu-wake-latency auto`, gpreempt/src/schedule/wake_latency.rs), held by the harness
//! itself for every state of the run: alone, co-located, and each scheduler variant. The request
//! is node-wide (every CPU's idle states), so it speeds up the clients' own wake-ups as well as the
//! reaction thread's; were it held only while the scheduler runs, the scheduled states would be
//! compared with baselines on a slower host. Held for all, the ratios compare scheduling alone,
//! and the wake floor is measured both ways to show what the request itself buys.

use gpreempt::schedule::wake_latency::{self, WakeLatency};
use serde::Serialize;

/// What was asked of the host, for the run's JSON.
#[derive(Clone, Debug, Serialize)]
pub struct CpuWake {
    /// The cpuidle driver (`haltpoll` in a KVM guest).
    pub driver: Option<String>,
    /// The limit held for the run, µs (None: refused, see `refused`).
    pub limit_us: Option<u32>,
    /// The idle states it keeps out.
    pub excluded: Vec<String>,
    pub refused: Option<String>,
}

/// Hold the scheduler's default request for as long as the returned request lives.
pub fn hold() -> (CpuWake, Option<wake_latency::Request>) {
    let held = wake_latency::hold(WakeLatency::Auto);
    let refused = held.refused.as_ref().map(|e| format!("{}: {e}", wake_latency::DEVICE));
    let limit_us = held.request.as_ref().map(|r| r.limit_us);
    (CpuWake { driver: held.driver, limit_us, excluded: held.excluded, refused }, held.request)
}
