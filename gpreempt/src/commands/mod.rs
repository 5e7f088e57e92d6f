//! The binary's subcommands: argument handling and output around the library.

pub mod agent;
pub mod analyze;
pub mod doctor;
pub mod hw;
pub mod interrupt;
pub mod preempt;
pub mod ps;
pub mod queues;
pub mod schedule;
pub mod stdout;
pub mod top;
pub mod trace;
