//! `/dev/kfd`: open it and ask its version.

use std::{
    fmt,
    fs::{File, OpenOptions},
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd},
    path::Path,
};

use nix::errno::Errno;

use super::uapi;

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

    /// KFD 1.19: `AMDKFD_IOC_CREATE_PROCESS` makes a secondary KFD context on another
    /// `/dev/kfd` file of the same process; a pid may own several contexts (docs/kfd.md §1.4).
    pub const SECONDARY_CONTEXTS: KfdVersion = KfdVersion { major: 1, minor: 19 };
    /// KFD 1.20: the trap handler supports gfx12 "expert scheduling" mode; before it, suspending
    /// a gfx12 queue running such kernels corrupts its waves (docs/kfd.md §1.4).
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
    /// The ring, read/write index, EOP and context-save addresses in `args` are written by the
    /// kernel and the GPU for as long as the queue lives: they must be this process's memory, of
    /// the sizes given, kept valid until the queue is destroyed (or the kernel must refuse them).
    pub unsafe fn create_queue(&self, args: &mut uapi::CreateQueueArgsV17) -> Result<(), Errno> {
        // SAFETY: `args` is the ioctl's argument struct, alive for the call; the caller vouches
        // for the addresses inside it.
        unsafe { uapi::create_queue(self.file.as_raw_fd(), args) }.map(drop)
    }

    /// `AMDKFD_IOC_DESTROY_QUEUE`.
    pub fn destroy_queue(&self, queue_id: u32) -> Result<(), Errno> {
        let mut args = uapi::DestroyQueueArgs { queue_id, pad: 0 };
        // SAFETY: as above.
        unsafe { uapi::destroy_queue(self.file.as_raw_fd(), &mut args) }.map(drop)
    }

    /// `AMDKFD_IOC_RUNTIME_ENABLE` on this process (what ROCr does at start-up).
    pub fn runtime_enable(&self, args: &mut uapi::RuntimeEnableArgs) -> Result<(), Errno> {
        // SAFETY: as above.
        unsafe { uapi::runtime_enable(self.file.as_raw_fd(), args) }.map(drop)
    }

    /// `AMDKFD_IOC_UPDATE_QUEUE`.
    ///
    /// # Safety
    /// As for [`Device::create_queue`]: the new ring address is the queue's from now on.
    pub unsafe fn update_queue(&self, args: &uapi::UpdateQueueArgs) -> Result<(), Errno> {
        // SAFETY: `args` is the ioctl's argument struct; the caller vouches for its ring address.
        unsafe { uapi::update_queue(self.file.as_raw_fd(), args) }.map(drop)
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
    fn a_missing_device_names_the_fix() {
        let err = Device::open_path(Path::new("/nonexistent/kfd")).unwrap_err();
        assert!(matches!(err, DeviceError::Missing));
        assert!(err.to_string().contains("modprobe amdgpu"));
    }
}
