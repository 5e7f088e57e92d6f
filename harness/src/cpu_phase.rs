//! The online service's CPU phase: what a serving stack does on the CPU between a request
//! reaching its socket and its first kernel (HTTP parsing, chat template, tokenization,
//! scheduling). The arrival probe's lead is this phase: a SUSPEND issued when the request reaches
//! the socket is done before the first kernel when the phase is longer than the SUSPENDs.
//! Named profiles, each cited in PROFILES.md ("CPU phase"); the client spins on the CPU for it
//! (a busy loop, as tokenization is CPU work, not a sleep).

use serde::{Deserialize, Serialize};

use gpreempt::clock::monotonic_ns;

/// A CPU-phase profile: the time from a request read to its first dispatch published.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum CpuPhase {
    /// No CPU phase: the first dispatch is published as the request is read (the harness before
    /// issue 45, and the floor's first premise).
    #[serde(rename = "none")]
    #[value(name = "none")]
    None,
    /// A lean C++ server: Triton ≈ 0.25 ms per request (TGI < 1 ms), whatever the prompt.
    #[serde(rename = "lean")]
    #[value(name = "lean")]
    Lean,
    /// vLLM on MI300X: 3.2 ms + 1.26 µs per prompt token (the fit of request sent → first byte,
    /// 7 ms at 1 k tokens of context and 15 ms at 8 k; tokenization ≈ 500 k tokens/s).
    #[serde(rename = "vllm-mi300x")]
    #[value(name = "vllm-mi300x")]
    VllmMi300x,
}

/// `lean`: Triton's ≈ 0.25 ms per request (PROFILES.md "CPU phase").
const LEAN_NS: u64 = 250_000;
/// `vllm-mi300x`: the fixed part and the part per prompt token (PROFILES.md "CPU phase").
const VLLM_FIXED_NS: u64 = 3_200_000;
const VLLM_PER_TOKEN_PS: u64 = 1_260_000;

impl CpuPhase {
    pub const ALL: [Self; 3] = [Self::None, Self::Lean, Self::VllmMi300x];

    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Lean => "lean",
            Self::VllmMi300x => "vllm-mi300x",
        }
    }

    /// The phase of a request of `tokens` prompt tokens, ns.
    pub fn ns(self, tokens: u64) -> u64 {
        match self {
            Self::None => 0,
            Self::Lean => LEAN_NS,
            Self::VllmMi300x => VLLM_FIXED_NS + tokens * VLLM_PER_TOKEN_PS / 1_000,
        }
    }

    /// Spin on the CPU for the phase of a request of `tokens` tokens; returns when it ended.
    pub fn run(self, tokens: u64) -> u64 {
        spin_until(monotonic_ns() + self.ns(tokens))
    }
}

/// Busy until `deadline` (CLOCK_MONOTONIC ns): CPU work, not a sleep. Returns the time it ended.
pub fn spin_until(deadline: u64) -> u64 {
    loop {
        let now = monotonic_ns();
        if now >= deadline {
            return now;
        }
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profiles_charge_their_cited_figures() {
        assert_eq!(CpuPhase::None.ns(8_000), 0);
        assert_eq!(CpuPhase::Lean.ns(0), 250_000);
        assert_eq!(CpuPhase::Lean.ns(8_000), 250_000);
        // 3.2 ms + 1.26 µs × 1 000 = 4.46 ms; × 8 000 = 13.28 ms; the conv slice's median 862.
        assert_eq!(CpuPhase::VllmMi300x.ns(1_000), 4_460_000);
        assert_eq!(CpuPhase::VllmMi300x.ns(8_000), 13_280_000);
        assert_eq!(CpuPhase::VllmMi300x.ns(862), 4_286_120);
        assert_eq!(CpuPhase::ALL.map(CpuPhase::name), ["none", "lean", "vllm-mi300x"]);
    }

    #[test]
    fn the_names_are_the_same_in_json_and_on_the_command_line() {
        for p in CpuPhase::ALL {
            assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{}\"", p.name()));
            assert_eq!(<CpuPhase as clap::ValueEnum>::from_str(p.name(), false), Ok(p));
        }
    }

    #[test]
    fn the_spin_lasts_its_phase() {
        let start = monotonic_ns();
        let end = CpuPhase::Lean.run(0);
        assert!(end - start >= 250_000, "{}", end - start);
    }
}
