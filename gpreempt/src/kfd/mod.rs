//! The KFD user API: ioctl layouts and calls on `/dev/kfd`, and the per-process sysfs tree.

pub mod debugfs;
pub mod debugger;
pub mod device;
pub mod session;
pub mod sysfs;
pub mod target;
pub mod tracee;
pub mod uapi;
pub mod watchdog;

pub use debugger::Debugger;
pub use device::{Device, KfdVersion};
