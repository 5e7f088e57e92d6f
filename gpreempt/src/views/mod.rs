//! Snapshot views of the host, beside the event model: the hardware's own queue state
//! ([`hw`]: MQDs, HQDs, runlists from debugfs), a process's queues ([`queues`]: sysfs and the
//! debug-trap snapshot) and what the tracer saw of them ([`traced_queues`], for `queues --watch`).

pub mod hw;
pub mod queues;
pub mod traced_queues;
