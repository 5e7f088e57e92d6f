//! The arrival probe: a request seen when it reaches the online service's socket, milliseconds
//! before its first kernel on a server that tokenizes or templates first, so the offline side's
//! SUSPENDs can be done by the time the GPU work comes (docs/arrival.md).
//!
//! - [`lead`]: the lead from arrival to first GPU work, learnt, and the pending hold it plans;
//! - [`attribution`]: which pending request a submission is the first work of;
//! - [`ports`]: the watched processes' listening ports, read on a thread of their own;
//! - [`patterns`]: what counts as a request in a segment's first bytes (allow and deny lists);
//! - [`probe`]: the `cgroup_skb` ingress program, per-cgroup attach, per-process ports and armed
//!   flags, the hits;
//! - [`report`]: what the arrival path did per online process (the summary's `arrival`);
//! - [`source`]: the seam between the reaction thread and the probe (unit tests script hits);
//! - [`size`]: a request's size from its first segment (its HTTP/1.1 `Content-Length`).
//!
//! The host facts it rests on are read in `host`: a process's cgroup v2 directory
//! ([`crate::host::cgroup`]) and its listening TCP ports ([`crate::host::sockets`]).

pub mod armed;
pub mod attribution;
pub mod lead;
pub mod patterns;
pub mod ports;
pub mod probe;
pub mod report;
pub mod size;
pub mod source;

pub use patterns::{PatternError, Patterns, Prefix};
pub use probe::{ArrivalError, ArrivalProbe};
pub use source::{ArrivalLoader, ArrivalSource, ProbeLoader};
