//! "Online alone" without stopping the training job: every offline process's queues held
//! suspended for the whole state through the controller (a debug-trap session per process on a
//! thread of its own, the same rails as `preempt` and `schedule`: queues it creates meanwhile
//! are suspended too, and every exit path resumes and detaches). The suspension bound
//! (`--max-suspend`, the watchdog) is lifted for it: the state holds them on purpose for as
//! long as the load runs. Their CPU threads still run (a training loop may spin waiting for the
//! GPU), which the report says.

use crate::{
    controller::{
        Debugger,
        vocabulary::{DRIVER_GRACE_PERIOD, DebugError, Options, Selection},
    },
    domain::HostPid,
};

/// The offline processes held suspended; dropping it (or [`Hold::release`]) resumes and detaches
/// every one.
pub struct Hold {
    sessions: Vec<Debugger>,
    /// Queues the suspends reported done.
    pub queues: usize,
}

/// How a hold ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Released {
    pub processes: usize,
    pub queues_resumed: usize,
    /// Processes that were gone (exited) when they were released.
    pub gone: usize,
}

impl Hold {
    /// Attach to each of `pids` and suspend all its queues. On an error, those already held are
    /// resumed and detached before it returns.
    pub fn start(pids: &[HostPid], options: &Options) -> Result<Self, (HostPid, DebugError)> {
        let mut hold = Self { sessions: Vec::with_capacity(pids.len()), queues: 0 };
        let options = Options { max_suspend: None, ..options.clone() };
        for &pid in pids {
            let d = Debugger::attach(pid, options.clone()).map_err(|e| (pid, e))?;
            let batch = d.suspend(Selection::All, DRIVER_GRACE_PERIOD).map_err(|e| (pid, e))?;
            hold.queues += batch.done();
            hold.sessions.push(d);
        }
        Ok(hold)
    }

    pub fn processes(&self) -> usize {
        self.sessions.len()
    }

    /// Resume and detach every process.
    pub fn release(mut self) -> Released {
        let mut r = Released::default();
        for d in self.sessions.drain(..) {
            let detached = d.detach();
            r.processes += 1;
            r.queues_resumed += detached.resumed;
            r.gone += usize::from(!detached.disabled);
        }
        r
    }
}
