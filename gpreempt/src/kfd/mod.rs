//! The KFD user API: ioctl layouts and calls on `/dev/kfd`.

pub mod device;
pub mod uapi;

pub use device::{Device, KfdVersion};
