//! `gpreempt schedule`: keep the offline processes' queues on a GPU suspended while the online
//! processes have work on that GPU, with no change to either.
//!
//! - [`online`]: sees online work from outside (AQL dispatch indices, `cu_occupancy`);
//!   [`doorbell`]: sees it the moment the ROCm runtime rings a doorbell (eBPF uprobes).
//! - [`arrival`]: sees a request reach the online service's socket, before its first kernel
//!   (an eBPF `cgroup_skb` ingress program).
//! - [`hints`]: the optional `begin`/`end` socket.
//! - [`policy`]: when to suspend and resume one GPU (a pure state machine, cost-aware).
//! - [`reaction`]: the real-time thread that reads the indices, runs one policy per GPU and
//!   holds the offline sessions (attached once, kept attached); [`realtime`] its footing;
//!   [`reaper`] closes the links whose close waits for RCU, off that thread;
//!   [`offline`] one offline process as it holds it (idle ones deferred, gangs).
//! - [`discover`]: processes and queues that appear later (tracer, or sysfs).
//! - [`kernel`]: the driver's side of the suspends and resumes (tracer only).
//! - [`config`]: what to schedule and how, and the selectors' checks; [`settings`]: what a user
//!   tunes of it, one type for the flags and the agent's configuration file.
//! - [`seams`]: how sessions are attached, where discovery and occupancy come from (the real
//!   host, or the unit tests' recorders and the native harness's model GPU).
//! - [`scheduler`]: the [`Scheduler`] and its run loop; [`accounting`] its figures;
//!   [`events`] what it reports.
//!
//! [`Scheduler::start`] checks the selectors, starts the reaction thread and has it attach;
//! [`Scheduler::run`] is the other half, on the caller's thread: discovery, the tracer's spans,
//! hints, accounting and every [`ScheduleEvent`], until the stop flag is set; then the reaction
//! thread resumes and detaches everything and the summary is emitted.
//!
//! **Per GPU.** Online work pending on GPU X (the indices of the online queues on X, X's
//! `cu_occupancy`, an open hint when online queues are on X) suspends exactly the offline queues
//! on X (SUSPEND_QUEUES of those ids, one call per offline process with queues there) and its
//! idle resumes them. An offline process with queues on several GPUs is held on each
//! independently; offline work on a GPU with no online work is never touched.
//!
//! Costs the output names: one debug-trap ENABLE and DISABLE per offline process (a runlist
//! refresh each: `debug_refresh_runlist` in `kfd_dbg_trap_activate`/`_deactivate`, kfd_debug.c,
//! Linux 6.12), and for an online process that already has queues when the
//! scheduler starts one snapshot (ENABLE, GET_QUEUE_SNAPSHOT, DISABLE: two refreshes) to learn
//! their index addresses; the online process is never kept attached. On HWS GPUs every suspend
//! and resume unmaps every queue of the device, the online process's too, and KFD takes one
//! process per call: N offline processes on a GPU cost N unmaps per transition (docs/kfd.md).

mod accounting;
pub mod arrival;
pub mod channel;
pub mod config;
pub mod discover;
pub mod doorbell;
pub mod events;
pub mod hints;
pub mod kernel;
pub mod offline;
pub mod online;
pub mod policy;
pub mod reaction;
pub mod realtime;
pub mod reaper;
pub mod runnable;
pub mod scheduler;
pub mod seams;
pub mod settings;
#[cfg(test)]
mod tests;
pub mod wake_latency;

pub use self::{
    config::{DEFAULT_RT_PRIORITY, Role, ScheduleConfig, ScheduleError, check_kernel, check_selection},
    events::{
        DetectionPath, GpuInterval, GpuReport, Interval, ScheduleEvent, ScheduleReport, Transition, TransitionError,
    },
    scheduler::Scheduler,
    settings::SchedulerSettings,
};
