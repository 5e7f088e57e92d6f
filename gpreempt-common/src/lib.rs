//! Every byte that crosses the kernel/user boundary of gpreempt.
//!
//! - [`kfd_uapi`]: the KFD ioctl argument layouts (`include/uapi/linux/kfd_ioctl.h`). The probes
//!   read the kernel's copy of these structs; the controller issues ioctls with them.
//! - [`record`]: what the eBPF programs write into the `EVENTS` ring buffer, one `#[repr(C)]`
//!   record per kind, each starting with a [`record::RecordHeader`].
//! - [`doorbell`]: the doorbell probe's map keys and its one record (uprobes on the ROCm runtime).
//! - [`arrival`]: the arrival probe's patterns, counts and its one record (`cgroup_skb` ingress).
//!
//! Kind tags travel as `u32` and are converted with `TryFrom` on the user side: an unknown value
//! is an error, never undefined behaviour. Structs have no implicit padding, so the eBPF side and
//! the user side agree on every byte.
#![no_std]

pub mod arrival;
pub mod doorbell;
pub mod kfd_uapi;
pub mod record;
