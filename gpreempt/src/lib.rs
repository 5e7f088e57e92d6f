//! gpreempt: see and control the compute queues of AMD GPUs through the stock KFD driver.
//!
//! - [`kfd`]: the KFD user API (`/dev/kfd` ioctls).
//! - [`trace`]: eBPF probes on the KFD paths of `amdgpu.ko` and the event stream they produce.
//! - [`doctor`]: what this host offers gpreempt and what to do about each gap.
//! - [`model`]: what the event stream says about the host (queue map, spans), applied in one place.
//! - [`report`]: output sinks over that stream (console lines, JSON Lines, Perfetto, summary).
//! - [`preempt`]: the suspend/resume measurement loop on a [`kfd::session::Session`]; [`stats`] its statistics;
//!   [`group`]: the same loop over several offline targets on one thread.
//! - [`output`]: output files that never follow symlinks, and terminal-safe text from other processes.
//! - [`schedule`]: `gpreempt schedule` — online work seen from outside (AQL indices, occupancy,
//!   hints), the policy state machine, and the scheduler driving offline [`kfd::session::Session`]s;
//!   [`select`]: pid and `container:NAME` selectors.
//! - [`signal_pipe`]: signals as a readable fd, so one `ppoll` waits for them too.
//! - [`agent`]: the node daemon's configuration, HTTP endpoint and policy seam.
//! - [`metrics`]: Prometheus series of the event stream (`gpreempt agent`); [`k8s`]: a process's pod.
//! - [`roots`]: where the host's state is read (`/proc`, `/sys`, Docker's state, KFD debugfs).

pub mod agent;
pub mod analyze;
pub mod clock;
pub mod doctor;
pub mod domain;
pub mod group;
pub mod k8s;
pub mod kfd;
pub mod metrics;
pub mod model;
pub mod output;
pub mod preempt;
pub mod report;
pub mod roots;
pub mod schedule;
pub mod select;
pub mod signal_pipe;
pub mod stats;
pub mod trace;
