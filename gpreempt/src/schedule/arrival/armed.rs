//! The arrival program's armed flags (each slot's credits, `ARMED_CREDITS` records at most),
//! mapped into this process: arming a slot is one store.
//!
//! The slot is armed again in the reaction thread's step that takes its hits, ahead of that
//! step's SUSPENDs, so that requests arriving while they run still send their records (one
//! record per request). Through `BPF_MAP_UPDATE_ELEM` that re-arm cost the step ~6 µs
//! natively (measured in the step); through the mapping it is a store. The map is created
//! BPF_F_MMAPABLE (`ARMED_MAP_FLAGS`, Linux 5.5, kernel/bpf/arraymap.c `array_map_mmap`): the
//! mapping is the array's values themselves, `slot` × [`ARMED_STRIDE`] bytes in, and it holds the
//! map's file (so the map) until it is unmapped.

use std::{
    os::fd::RawFd,
    ptr::NonNull,
    sync::atomic::{AtomicU32, Ordering},
};

use gpreempt_common::arrival::{ARMED_CREDITS, ARMED_STRIDE, MAX_SLOTS};

/// The armed flags of [`MAX_SLOTS`] slots, shared with the program.
pub struct ArmedFlags {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is process memory with no thread affinity; every access is atomic.
unsafe impl Send for ArmedFlags {}

impl ArmedFlags {
    /// Map the values of the armed array map `fd` (created with `ARMED_MAP_FLAGS`).
    pub fn map(fd: RawFd) -> std::io::Result<Self> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
        let len = mapping_len(page);
        // SAFETY: a fresh shared mapping of `len` bytes of `fd` at offset 0; the kernel checks
        // that the map is mmapable and at least this large (EINVAL otherwise).
        let addr = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        };
        if addr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = NonNull::new(addr.cast::<u8>()).ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        Ok(Self { base, len })
    }

    fn flag(&self, slot: u32) -> Option<&AtomicU32> {
        let offset = (slot as usize).checked_mul(ARMED_STRIDE)?;
        if slot >= MAX_SLOTS || offset + ARMED_STRIDE > self.len {
            return None;
        }
        // SAFETY: `offset` lies within the live mapping, 8-aligned (a page-aligned base plus a
        // multiple of ARMED_STRIDE), and the program accesses the same u32 only with single
        // loads and stores: a shared AtomicU32 view of it is sound.
        Some(unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU32>() })
    }

    /// Arm `slot` (false: no such slot).
    pub fn arm(&self, slot: u32) -> bool {
        self.flag(slot).map(|f| f.store(ARMED_CREDITS, Ordering::Release)).is_some()
    }

    /// Disarm `slot` (it is no longer watched).
    pub fn disarm(&self, slot: u32) {
        if let Some(f) = self.flag(slot) {
            f.store(0, Ordering::Release);
        }
    }

    /// Whether `slot` is armed now (credits left: the program takes one per hit).
    #[cfg(test)]
    fn is_armed(&self, slot: u32) -> bool {
        self.flag(slot).is_some_and(|f| f.load(Ordering::Acquire) != 0)
    }
}

/// The mapping's length: every slot's value, in whole pages.
fn mapping_len(page: usize) -> usize {
    (MAX_SLOTS as usize * ARMED_STRIDE).div_ceil(page) * page
}

impl Drop for ArmedFlags {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An anonymous shared page stands in for the map's (the kernel side is the VM tests').
    fn anonymous() -> ArmedFlags {
        let len = mapping_len(4096);
        // SAFETY: a fresh anonymous mapping.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        ArmedFlags { base: NonNull::new(addr.cast()).unwrap(), len }
    }

    #[test]
    fn a_slot_is_one_u32_at_its_stride_and_slots_past_the_map_are_refused() {
        let flags = anonymous();
        assert!(flags.arm(3));
        assert!(flags.is_armed(3));
        assert!(!flags.is_armed(2) && !flags.is_armed(4));
        // The program's view: the u32 at 3 × 8 bytes, the rest of its 8 bytes untouched.
        // SAFETY: within the mapping.
        let words = unsafe { std::slice::from_raw_parts(flags.base.as_ptr().cast::<u32>(), 10) };
        assert_eq!(words, [0, 0, 0, 0, 0, 0, ARMED_CREDITS, 0, 0, 0]);
        flags.disarm(3);
        assert!(!flags.is_armed(3));
        assert!(flags.arm(MAX_SLOTS - 1));
        assert!(!flags.arm(MAX_SLOTS));
        assert!(!flags.is_armed(MAX_SLOTS));
    }

    #[test]
    fn a_descriptor_that_is_no_map_is_refused_with_the_kernels_error() {
        assert_eq!(ArmedFlags::map(-1).err().and_then(|e| e.raw_os_error()), Some(libc::EBADF));
    }
}
