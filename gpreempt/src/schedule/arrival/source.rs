//! Where the reaction thread's arrivals come from, as a seam: the real [`ArrivalProbe`] (the
//! `cgroup_skb` program, loaded on the reaction thread by [`ProbeLoader`]), or in the scheduler's
//! unit tests a scripted source whose hits a test hands over at chosen instants (a request that
//! arrives during a RESUME, say), which no real socket can time.

use std::{collections::BTreeSet, os::fd::RawFd, path::Path};

use gpreempt_common::arrival::{ArrivalCounts, ArrivalHit};

use super::{ArrivalError, ArrivalProbe, Patterns};
use crate::domain::HostPid;

/// What the reaction thread asks of the arrival path's kernel side.
pub trait ArrivalSource: Send {
    /// Watch `pid` in `cgroup` on `ports`, armed; its slot (the hits' `slot`).
    fn watch(&mut self, pid: HostPid, cgroup: &Path, ports: &BTreeSet<u16>) -> Result<u32, ArrivalError>;
    /// Stop watching `slot`.
    fn unwatch(&mut self, slot: u32);
    /// The ports `slot` watches now.
    fn ports_of(&self, slot: u32) -> BTreeSet<u16>;
    /// Arm `slot`: its next request sends one hit.
    fn arm(&mut self, slot: u32) -> Result<(), ArrivalError>;
    /// What the source saw for `slot` since it was watched.
    fn counts(&self, slot: u32) -> ArrivalCounts;
    /// Take every hit waiting.
    fn drain(&mut self, out: &mut Vec<ArrivalHit>);
    /// Readable when hits are waiting (the reaction thread's wait); None: polled at each step.
    fn fd(&self) -> Option<RawFd>;
}

/// How the reaction thread gets its source, on its own thread (the probe's maps and links are
/// owned by the thread that drops them on every exit path).
pub trait ArrivalLoader: Send + Sync + std::fmt::Debug + 'static {
    fn load(&self, patterns: &Patterns) -> Result<Box<dyn ArrivalSource>, ArrivalError>;
}

/// The real loader: the `cgroup_skb` program.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProbeLoader;

impl ArrivalLoader for ProbeLoader {
    fn load(&self, patterns: &Patterns) -> Result<Box<dyn ArrivalSource>, ArrivalError> {
        Ok(Box::new(ArrivalProbe::load(patterns)?))
    }
}

impl ArrivalSource for ArrivalProbe {
    fn watch(&mut self, pid: HostPid, cgroup: &Path, ports: &BTreeSet<u16>) -> Result<u32, ArrivalError> {
        ArrivalProbe::watch(self, pid, cgroup, ports)
    }

    fn unwatch(&mut self, slot: u32) {
        ArrivalProbe::unwatch(self, slot);
    }

    fn ports_of(&self, slot: u32) -> BTreeSet<u16> {
        ArrivalProbe::ports_of(self, slot)
    }

    fn arm(&mut self, slot: u32) -> Result<(), ArrivalError> {
        ArrivalProbe::arm(self, slot)
    }

    fn counts(&self, slot: u32) -> ArrivalCounts {
        ArrivalProbe::counts(self, slot)
    }

    fn drain(&mut self, out: &mut Vec<ArrivalHit>) {
        ArrivalProbe::drain(self, out);
    }

    fn fd(&self) -> Option<RawFd> {
        Some(ArrivalProbe::fd(self))
    }
}
