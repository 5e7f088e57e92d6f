//! gpreempt: see and control the compute queues of AMD GPUs through the stock KFD driver.
//!
//! The floor plan (docs/architecture.md, checked by `tests/floor_plan.rs`), from the bottom up;
//! a module uses only those of the bullets above its own:
//! - [`domain`] (the vocabulary: [`domain::HostPid`], [`domain::QueueId`], [`domain::GpuId`], …),
//!   [`clock`], [`duration`], [`stats`], [`output`], [`deploy`] (the agent's deployment contract):
//!   leaves.
//! - [`kfd`]: the KFD user ABI only (`/dev/kfd`, layouts, one typed function per debug-trap op).
//! - [`host`]: what the host's files say (`/proc`, sysfs, debugfs, container runtimes, selectors).
//! - [`event`]: the low-level event type.
//! - [`trace`]: the eBPF probes that produce it.
//! - [`model`]: what the event stream says (queue map, spans, queue/process lifecycle notices).
//! - [`report`]: output sinks.
//! - [`pipeline`]: events through the model to the sinks and subscribers, and the one in-process
//!   tracer.
//! - [`views`]: snapshot views (hardware queue state, a process's queues, `top`'s view);
//!   [`controller`]: suspend/resume through the debug-trap API (session, watchdog, measurement
//!   loop, the `Control` seam).
//! - [`schedule`]: `gpreempt schedule`; [`doctor`], [`analyze`]: diagnoses.
//! - [`evaluate`]: `gpreempt evaluate`, built on the scheduler; [`metrics`]: the node daemon's
//!   Prometheus series.
//! - [`agent`]: the node daemon.

pub mod agent;
pub mod analyze;
pub mod clock;
pub mod controller;
pub mod deploy;
pub mod doctor;
pub mod domain;
pub mod duration;
pub mod evaluate;
pub mod event;
pub mod host;
pub mod kfd;
pub mod metrics;
pub mod model;
pub mod output;
pub mod pipeline;
pub mod report;
pub mod schedule;
pub mod stats;
/// The unit tests' fake host tree and event builders.
#[cfg(test)]
pub(crate) mod test_support;
pub mod trace;
pub mod views;
