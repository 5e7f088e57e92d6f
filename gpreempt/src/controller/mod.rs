//! The controller: suspend and resume another process's GPU queues through KFD's debug-trap API.
//!
//! - [`vocabulary`]: options, errors, batches, notices — what every part below speaks;
//! - [`session`]: one target on the thread that seized it (attach/detach, the cycle, servicing,
//!   waiting); [`threaded`]: a session on a thread of its own;
//! - [`target`]: the checks before touching a target; [`tracee`]: the ptrace link;
//!   [`watchdog`]: the out-of-process guard; [`signal_pipe`]: signals as a readable fd;
//! - [`measure`]: the suspend/resume measurement loop (`gpreempt preempt`); [`group`]: the same
//!   loop over several targets on one thread; [`record`]: the typed `--json` record of a run;
//! - [`control`]: the [`control::Control`] seam the scheduler drives.
//!
//! It depends on the KFD ABI ([`crate::kfd`]), the host readers ([`crate::host`]) and the model's
//! spans (to match a run's iterations with the driver's), never on the scheduler or the tracer.

pub mod control;
pub mod group;
pub mod measure;
pub mod record;
pub mod session;
pub mod signal_pipe;
pub mod target;
pub mod threaded;
pub mod tracee;
pub mod vocabulary;
pub mod watchdog;

pub use threaded::Debugger;
