//! `/dev/kfd`: open it and ask its version.

use std::{
    fmt,
    fs::{File, OpenOptions},
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd},
    path::Path,
};

use nix::errno::Errno;

use super::{sys, uapi};

/// The KFD device node.
pub const KFD_DEVICE: &str = "/dev/kfd";

/// KFD ioctl interface version (`AMDKFD_IOC_GET_VERSION`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct KfdVersion {
    pub major: u32,
    pub minor: u32,
}

impl KfdVersion {
    /// First version with `AMDKFD_IOC_RUNTIME_ENABLE` and `AMDKFD_IOC_DBG_TRAP` (Linux 6.5).
    pub const DEBUG_TRAP: KfdVersion = KfdVersion { major: 1, minor: 13 };

    /// Upstream KFD 1.19: `AMDKFD_IOC_CREATE_PROCESS` makes a secondary KFD context on another
    /// `/dev/kfd` file of the same process (docs/kfd.md §1.4). A fallback only: ROCm's DKMS
    /// numbering gives 1.19 another meaning; [`super::features::secondary_contexts`] looks for the
    /// ioctl's handler first.
    pub const SECONDARY_CONTEXTS: KfdVersion = KfdVersion { major: 1, minor: 19 };
    /// Upstream KFD 1.20: the trap handler supports gfx12 "expert scheduling" mode; before it,
    /// suspending a gfx12 queue running such kernels corrupts its waves (docs/kfd.md §1.4). The
    /// only sign there is ([`super::features::expert_sched_trap`]).
    pub const EXPERT_SCHED_TRAP: KfdVersion = KfdVersion { major: 1, minor: 20 };

    pub fn has_debug_trap(self) -> bool {
        self.major == 1 && self >= Self::DEBUG_TRAP
    }

    /// May a process own more than one KFD context (KFD ≥ 1.19)?
    pub fn has_secondary_contexts(self) -> bool {
        self.major == 1 && self >= Self::SECONDARY_CONTEXTS
    }

    /// Can the debug trap suspend gfx12 queues safely whatever their kernels (KFD ≥ 1.20)?
    pub fn has_expert_sched_trap(self) -> bool {
        self.major == 1 && self >= Self::EXPERT_SCHED_TRAP
    }
}

impl fmt::Display for KfdVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("{KFD_DEVICE} does not exist: the amdgpu driver is not loaded (run `modprobe amdgpu`)")]
    Missing,
    #[error("cannot open {KFD_DEVICE}: permission denied (run as root or join the `render` group)")]
    PermissionDenied,
    #[error("cannot open {KFD_DEVICE}: {0}")]
    Open(io::Error),
    #[error("AMDKFD_IOC_GET_VERSION failed: {0}")]
    Version(Errno),
}

/// An open `/dev/kfd`. Opening it creates this process's `kfd_process` in the driver.
#[derive(Debug)]
pub struct Device {
    file: File,
}

impl Device {
    pub fn open() -> Result<Self, DeviceError> {
        Self::open_path(Path::new(KFD_DEVICE))
    }

    pub fn open_path(path: &Path) -> Result<Self, DeviceError> {
        let file = OpenOptions::new().read(true).write(true).open(path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => DeviceError::Missing,
            io::ErrorKind::PermissionDenied => DeviceError::PermissionDenied,
            _ => DeviceError::Open(e),
        })?;
        Ok(Self { file })
    }

    pub fn version(&self) -> Result<KfdVersion, DeviceError> {
        let mut args = uapi::GetVersionArgs::default();
        // SAFETY: `args` is the ioctl's argument struct, alive for the call.
        unsafe { uapi::get_version(self.file.as_raw_fd(), &mut args) }.map_err(DeviceError::Version)?;
        Ok(KfdVersion { major: args.major_version, minor: args.minor_version })
    }

    /// `AMDKFD_IOC_CREATE_QUEUE`; on success the kernel filled `queue_id` and `doorbell_offset`.
    ///
    /// # Safety
    /// KFD keeps the addresses in `args`, and the CP (a GPU's, or `kfd_emu`'s in the tests) reads
    /// and writes through them long after this call returns: until [`Device::destroy_queue`] of
    /// the queue succeeds, or this process's address space goes (exit or exec: KFD stops its
    /// queues from the mm's release notifier, 6.12 `kfd_process_notifier_release_internal`;
    /// dropping this `Device` does not). For that whole time, unless the kernel refuses the call:
    /// - `ring_base_address`: memory of this process, readable and writable (the CP reads the
    ///   packets and may write consumed headers back; `kfd_emu` does), of at least `ring_size`
    ///   bytes and at least 1 KiB (kernels that clamp a smaller ring size up to
    ///   `KFD_MIN_QUEUE_RING_SIZE` use that much), 256-byte aligned (the v9–v11 MQDs hold the base
    ///   as `address >> 8`: a hardware CP ignores the low bits);
    /// - `read_pointer_address`: an 8-byte-aligned `u64` the CP writes (the read index);
    ///   `write_pointer_address`: an 8-byte-aligned `u64` the CP reads (the write index);
    /// - `eop_buffer_address` (if not 0): `eop_buffer_size` bytes, 256-byte aligned (the MQD holds
    ///   it as `address >> 8` too), written by the CP;
    /// - `ctx_save_restore_address` (if not 0): `ctx_save_restore_size` bytes the CP saves wave
    ///   state into; KFD reports queue exceptions into the `u64` its header's `err_payload_addr`
    ///   names (`struct kfd_context_save_area_header`), which must stay valid as well;
    /// - no Rust reference may assume those locations unchanged: access them atomically or
    ///   volatilely (they change behind the compiler's back).
    pub unsafe fn create_queue(&self, args: &mut uapi::CreateQueueArgsV17) -> Result<(), Errno> {
        // SAFETY: `args` is the ioctl's argument struct, alive for the call; the caller vouches
        // for the addresses inside it.
        unsafe { uapi::create_queue(self.file.as_raw_fd(), args) }.map(drop)
    }

    /// `AMDKFD_IOC_DESTROY_QUEUE`. Once it succeeds, neither KFD nor the CP touches the queue's
    /// memory again (a suspended queue's destroy waits for its resume, 6.12
    /// `wait_on_destroy_queue`), which ends the contract of [`Device::create_queue`].
    pub fn destroy_queue(&self, queue_id: u32) -> Result<(), Errno> {
        let mut args = uapi::DestroyQueueArgs { queue_id, pad: 0 };
        // SAFETY: `args` is the ioctl's argument struct, alive for the call; it carries no
        // address.
        unsafe { uapi::destroy_queue(self.file.as_raw_fd(), &mut args) }.map(drop)
    }

    /// `AMDKFD_IOC_RUNTIME_ENABLE` on this process (what ROCr does at start-up). Safe although
    /// `r_debug` is an address: KFD never dereferences it, it only stores it and hands it to a
    /// debugger in `kfd_runtime_info` (6.12 `runtime_enable`).
    pub fn runtime_enable(&self, args: &mut uapi::RuntimeEnableArgs) -> Result<(), Errno> {
        // SAFETY: `args` is the ioctl's argument struct, alive for the call.
        unsafe { uapi::runtime_enable(self.file.as_raw_fd(), args) }.map(drop)
    }

    /// `AMDKFD_IOC_UPDATE_QUEUE`.
    ///
    /// # Safety
    /// As for [`Device::create_queue`]: from this call on, the queue's ring is
    /// `ring_base_address` with `ring_size` bytes (at least 1 KiB, 256-byte aligned), and the CP
    /// reads and writes it until the queue is destroyed; the read/write indices and the
    /// context-save area stay those of the create. An id that is not one of this process's
    /// queues is refused before the address is used (6.12 `pqm_update_queue_properties`:
    /// `EFAULT`).
    pub unsafe fn update_queue(&self, args: &uapi::UpdateQueueArgs) -> Result<(), Errno> {
        // SAFETY: `args` is the ioctl's argument struct; the caller vouches for its ring address.
        unsafe { uapi::update_queue(self.file.as_raw_fd(), args) }.map(drop)
    }

    /// `AMDKFD_IOC_DBG_TRAP` with an argument struct the caller built: any op, any arguments, and
    /// the struct as the kernel copied it back, even when the op failed (`kfd_ioctl()` copies the
    /// arguments out whatever the result; `QUERY_DEBUG_EVENT` zeroes its outputs before
    /// answering `EAGAIN`, 6.12 `kfd_dbg_ev_query_debug_event`). For a debugger that drives the
    /// ABI itself (the tests' `emu-workload debug`); the library's own calls use the typed
    /// functions of [`super::dbg_trap`]. Enters the kernel through the same funnel
    /// (`kfd::sys`). Returns the ioctl's non-negative result (suspend/resume: the number of
    /// queues handled) or its errno.
    ///
    /// # Safety
    /// The kernel writes through the pointers of the op's union member during the call (it keeps
    /// none of them afterwards), so each must be memory of this process, writable, of the size
    /// its count or size field gives, and not otherwise borrowed for the call's duration:
    /// `ENABLE`'s `rinfo_ptr` (`rinfo_size` bytes), `QUERY_EXCEPTION_INFO`'s `info_ptr`
    /// (`info_size` bytes), `SUSPEND_QUEUES`/`RESUME_QUEUES`' `queue_array_ptr` (`num_queues`
    /// `u32`s, read and written back), `GET_QUEUE_SNAPSHOT`'s `snapshot_buf_ptr` (`num_queues`
    /// entries of `entry_size` bytes), and likewise any other op's buffer. `ENABLE`'s `dbg_fd`
    /// is kept (KFD takes its own reference, `fget`) and written to, one byte per raised
    /// exception, until `DISABLE` or the target's exit: it must be a file the caller owns for that
    /// purpose (a pipe's write end), not one some other code of this process uses.
    pub unsafe fn dbg_trap(&self, args: &mut uapi::DbgTrapArgs) -> Result<i32, Errno> {
        // SAFETY: the caller vouches for the pointers and the fd inside `args`; the file is open
        // for the call (borrowed from `self`).
        unsafe { sys::dbg_trap(self.file.as_fd(), args) }
    }
}

impl AsFd for Device {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_trap_needs_1_13_of_major_1() {
        assert!(!KfdVersion { major: 1, minor: 11 }.has_debug_trap());
        assert!(KfdVersion { major: 1, minor: 13 }.has_debug_trap());
        assert!(KfdVersion { major: 1, minor: 17 }.has_debug_trap());
        assert!(!KfdVersion { major: 2, minor: 0 }.has_debug_trap());
        assert_eq!(KfdVersion { major: 1, minor: 17 }.to_string(), "1.17");
    }

    #[test]
    fn the_raw_debug_trap_goes_through_the_funnel_and_returns_the_struct_as_the_kernel_left_it() {
        let _k = crate::kfd::sys::fake::install(|args| {
            assert_eq!((args.pid, args.op), (7, uapi::dbg_trap_op::QUERY_DEBUG_EVENT));
            // 6.12 kfd_dbg_ev_query_debug_event zeroes its outputs, then finds nothing pending.
            args.data = [0; 3];
            Err(Errno::EAGAIN)
        });
        let device = Device::open_path(Path::new("/dev/null")).expect("/dev/null opens read-write");
        let mut args = uapi::DbgTrapArgs::query_debug_event(7, 1 << 30);
        // SAFETY: QUERY_DEBUG_EVENT carries no pointer (and the fake kernel follows none).
        assert_eq!(unsafe { device.dbg_trap(&mut args) }, Err(Errno::EAGAIN));
        assert_eq!(args.exception_mask(), 0, "the outputs of a failed op are the kernel's");
    }

    #[test]
    fn a_missing_device_names_the_fix() {
        let err = Device::open_path(Path::new("/nonexistent/kfd")).unwrap_err();
        assert!(matches!(err, DeviceError::Missing));
        assert!(err.to_string().contains("modprobe amdgpu"));
    }
}
