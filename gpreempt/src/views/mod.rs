//! Snapshot views of the host, beside the event model: the hardware's own queue state
//! ([`hw`]: MQDs, HQDs, runlists from debugfs), a process's queues ([`queues`]: sysfs and the
//! debug-trap snapshot), what the model's queue notices said of them ([`traced_queues`], for
//! `queues --watch`), `ps`'s table of every KFD process ([`processes`]) and the live view of
//! every process's queues and spans ([`top`]).

pub mod hw;
pub mod processes;
pub mod queues;
pub mod top;
pub mod traced_queues;
