//! The one place the library enters `AMDKFD_IOC_DBG_TRAP`: every debug-trap operation of
//! [`super::dbg_trap`] builds its argument struct and passes it here, and
//! [`super::Device::dbg_trap`] passes the one its caller built. Tests replace the kernel
//! with a closure ([`fake::install`]), so the controller's handling of the kernel's answers
//! (verdict bits, errnos, snapshot sizes) runs as host unit tests, as aya's `sys/fake.rs` does for
//! the bpf syscall.

use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;

use super::uapi::{self, DbgTrapArgs};

/// `AMDKFD_IOC_DBG_TRAP`; the ioctl's non-negative result or its errno.
///
/// # Safety
/// Every pointer inside `args` (id arrays, snapshot and info buffers) must point to memory of
/// the size the op's count or size field says, writable and alive for the call: the kernel
/// writes through them. The typed functions of [`super::dbg_trap`] build `args` from
/// references; [`super::Device::dbg_trap`] passes its own caller's contract on. The file referred
/// to by an `ENABLE`'s `dbg_fd` is kept and written to after the call (see there).
#[inline]
pub(super) unsafe fn dbg_trap(kfd: BorrowedFd<'_>, args: &mut DbgTrapArgs) -> Result<i32, Errno> {
    #[cfg(test)]
    if let Some(r) = fake::call(args) {
        return r;
    }
    // SAFETY: `kfd` is an open fd for the call's duration (a borrow); `args` is the ioctl's
    // argument struct and the caller guarantees the pointers inside it.
    unsafe { uapi::dbg_trap(kfd.as_raw_fd(), args) }
}

/// The test-only kernel: a closure that answers each debug-trap call on this thread.
#[cfg(test)]
pub(crate) mod fake {
    use std::cell::RefCell;

    use nix::errno::Errno;

    use super::DbgTrapArgs;

    type Kernel = Box<dyn FnMut(&mut DbgTrapArgs) -> Result<i32, Errno>>;

    thread_local! {
        static KERNEL: RefCell<Option<Kernel>> = const { RefCell::new(None) };
    }

    /// Answer this thread's debug-trap calls with `kernel` until the guard drops.
    pub(crate) fn install(kernel: impl FnMut(&mut DbgTrapArgs) -> Result<i32, Errno> + 'static) -> Guard {
        KERNEL.with(|k| *k.borrow_mut() = Some(Box::new(kernel)));
        Guard(())
    }

    pub(crate) struct Guard(());

    impl Drop for Guard {
        fn drop(&mut self) {
            KERNEL.with(|k| *k.borrow_mut() = None);
        }
    }

    pub(super) fn call(args: &mut DbgTrapArgs) -> Option<Result<i32, Errno>> {
        KERNEL.with(|k| k.borrow_mut().as_mut().map(|kernel| kernel(args)))
    }

    /// The snapshot buffer at `ptr` with room for `len` entries, as the kernel sees it.
    ///
    /// # Safety
    /// `ptr`/`len` must come from a call's arguments, during that call.
    pub(crate) unsafe fn snapshot<'a>(ptr: u64, len: u32) -> &'a mut [crate::kfd::uapi::QueueSnapshotEntry] {
        // SAFETY: the caller passes the buffer of the call it answers.
        unsafe { std::slice::from_raw_parts_mut(ptr as *mut crate::kfd::uapi::QueueSnapshotEntry, len as usize) }
    }

    /// The `u32` array at `ptr` with `len` entries, as the kernel sees it.
    ///
    /// # Safety
    /// `ptr`/`len` must come from a call's arguments, during that call.
    pub(crate) unsafe fn ids<'a>(ptr: u64, len: u32) -> &'a mut [u32] {
        // SAFETY: the caller passes an array of the call it answers.
        unsafe { std::slice::from_raw_parts_mut(ptr as *mut u32, len as usize) }
    }
}
