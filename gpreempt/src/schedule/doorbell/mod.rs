//! The doorbell probe: online work seen the moment the ROCm runtime rings a queue's doorbell,
//! from outside the process (eBPF uprobes; no shim, no LD_PRELOAD), so the scheduler's reaction
//! thread can sleep while the online side is idle instead of polling its indices.
//!
//! - [`library`]: which `libhsa-runtime64` a process maps (bundled copies and containers too);
//! - [`signal`]: a queue's doorbell signal handle, read from the process's `amd_queue_t`;
//! - [`probe`]: the uprobe object, per-process attach, the armed flags and the hits;
//! - [`target`]: where in the runtime the uprobe sits (the export's implementation);
//! - [`wake`]: the reaction thread's one wait (the hits, a command, the cross-check).
//!
//! What the probe covers and what it cannot see is in docs/doorbell.md.

pub mod library;
pub mod probe;
pub mod signal;
pub mod target;
pub mod wake;

pub use probe::{Coverage, DoorbellError, DoorbellProbe};
