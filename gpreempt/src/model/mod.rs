//! The queue model: who owns the queues (host pid, container, pid inside it).

pub mod hw;
pub mod procinfo;
pub mod ps;
pub mod queues;
pub mod registry;
pub mod spans;
