//! Where the scheduler meets the host, as four seams: how an offline (or, for one snapshot, an
//! online) process's debug-trap session is attached ([`ControlSide`]), where processes and queues
//! that appear come from ([`Discovery`]), where an online process's waves in flight are read
//! ([`OccupancySource`]), and where requests' arrivals come from ([`ArrivalLoader`]). The real ones
//! drive KFD, the tracer, sysfs and the arrival probe; unit tests plug in recorders and scripts,
//! and the native harness (`harness/`) a model GPU with the real arrival probe, through the same
//! four.

use std::sync::Arc;

use crate::{
    controller::{
        control::Control,
        session::Session,
        vocabulary::{DebugError, Options},
    },
    domain::{GpuId, HostPid},
    host::roots::Roots,
    schedule::{
        arrival::{ArrivalLoader, ProbeLoader},
        discover::Discovery,
        online::{OccupancyFile, occupancy_files},
    },
};

/// How a debug-trap session on a process is attached. The reaction thread attaches every
/// offline process (KFD takes a target's debug-trap calls only from its ptrace tracer, the thread
/// that attached it); the scheduler's own thread attaches an online process once, for the
/// snapshot of its existing queues, and detaches it at once.
pub trait ControlSide: Send + Sync + 'static {
    type Control: Control;
    /// Check the process, seize it and enable the debug trap (one runlist refresh).
    fn attach(&self, pid: HostPid, options: &Options) -> Result<Self::Control, DebugError>;
}

/// The real side: a [`Session`] per process, its ioctls on the calling thread.
#[derive(Clone, Copy, Debug, Default)]
pub struct SessionSide;

impl ControlSide for SessionSide {
    type Control = Session;

    fn attach(&self, pid: HostPid, options: &Options) -> Result<Session, DebugError> {
        Session::attach(pid, options)
    }
}

/// One online process's waves in flight on one GPU: what the dispatch indices no longer show
/// once a dispatch has started.
pub trait Occupancy: Send {
    fn gpu(&self) -> GpuId;
    /// Waves of the process in flight on the GPU now (`None`: unreadable).
    fn busy(&self) -> Option<bool>;
}

impl std::fmt::Debug for dyn Occupancy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Occupancy({:#x})", self.gpu())
    }
}

/// The real reader, one `cu_occupancy` file kept open. The impl sits here, not in `online`, so
/// that `online` needs nothing of the seams (no module cycle).
impl Occupancy for OccupancyFile {
    fn gpu(&self) -> GpuId {
        self.gpu
    }

    fn busy(&self) -> Option<bool> {
        OccupancyFile::busy(self)
    }
}

/// Where the [`Occupancy`] of an online process comes from.
pub trait OccupancySource: Send + Sync + 'static {
    /// One reader per GPU the process uses (none where the kernel offers no figure).
    fn open(&self, pid: HostPid) -> Vec<Box<dyn Occupancy>>;
}

/// The real source: `stats_<gpuid>/cu_occupancy` of the process in KFD's sysfs tree, kept open.
#[derive(Clone, Debug, Default)]
pub struct SysfsOccupancy {
    pub roots: Roots,
}

impl OccupancySource for SysfsOccupancy {
    fn open(&self, pid: HostPid) -> Vec<Box<dyn Occupancy>> {
        occupancy_files(&self.roots.kfd_proc(), pid)
            .iter()
            .filter_map(|f| OccupancyFile::open(f))
            .map(|f| Box::new(f) as Box<dyn Occupancy>)
            .collect()
    }
}

/// The three seams a [`crate::schedule::Scheduler`] starts with.
pub struct Seams<S: ControlSide> {
    pub control: S,
    pub discovery: Box<dyn Discovery>,
    pub occupancy: Arc<dyn OccupancySource>,
    /// Where requests' arrivals come from (used with `ScheduleConfig::arrival`).
    pub arrival: Arc<dyn ArrivalLoader>,
}

impl Seams<SessionSide> {
    /// The real host: debug-trap sessions, `discovery` as started by the caller, sysfs occupancy.
    pub fn host(roots: Roots, discovery: Box<dyn Discovery>) -> Self {
        Self {
            control: SessionSide,
            discovery,
            occupancy: Arc::new(SysfsOccupancy { roots }),
            arrival: Arc::new(ProbeLoader),
        }
    }
}
