//! The KFD user API: ioctl layouts and calls on `/dev/kfd`, and the per-process sysfs tree.

pub mod debugfs;
pub mod device;
pub mod sysfs;
pub mod uapi;

pub use device::{Device, KfdVersion};
