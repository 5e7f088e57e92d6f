//! The KFD user ABI only: `/dev/kfd`, its ioctl layouts and request numbers, and one typed
//! function per debug-trap operation. What a process, a GPU or a session *is* lives above:
//! [`crate::host`] reads the host's files, [`crate::controller`] drives sessions.

pub mod dbg_trap;
pub mod device;
pub mod features;
pub(crate) mod sys;
pub mod uapi;

pub use device::{Device, KfdVersion};
