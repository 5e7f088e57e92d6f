//! A queue's doorbell signal, read from the online process's memory.
//!
//! ROCr gives KFD `&amd_queue_t::write_dispatch_id` as the queue's write pointer (see
//! `schedule::online`). `amd_queue_t` starts with the `hsa_queue_t` the program sees, whose
//! `doorbell_signal` (an `hsa_signal_t`, one u64 handle) sits at offset 0x10 (type u32, features
//! u32, base_address u64); `write_dispatch_id` sits at 0x38 (after the 40-byte `hsa_queue_t` and
//! `reserved1[4]`). Same layout in ROCr 5.2 (Debian bookworm's `amd_hsa_queue.h`, checked here),
//! 6.1 and 7.x (`inc/amd_hsa_queue.h` unchanged in that part since ROCm 1.x: the queue is shared
//! with the GPU's packet processor and the trap handler, whose firmware and compiler read these
//! offsets, so they cannot move). So the handle is the u64 at `write pointer − 0x38 + 0x10`.
//!
//! A raw KFD client that registers some other address as its write pointer has no such struct:
//! the value read is then whatever lies there, which no runtime export is ever called with, so the
//! queue stays on the index poll (the probe never fires for it).

use crate::{
    domain::HostPid,
    schedule::online::{ReadError, read_u64s},
};

/// `offsetof(amd_queue_t, write_dispatch_id)`.
pub const WRITE_DISPATCH_ID: u64 = 0x38;
/// `offsetof(hsa_queue_t, doorbell_signal)` (= within `amd_queue_t`, which starts with it).
pub const DOORBELL_SIGNAL: u64 = 0x10;

/// Where the doorbell signal handle of the queue whose write pointer is `write` lies.
pub fn doorbell_signal_address(write: u64) -> Option<u64> {
    write.checked_sub(WRITE_DISPATCH_ID).map(|queue| queue + DOORBELL_SIGNAL)
}

/// The doorbell signal handle of that queue in `pid`.
pub fn doorbell_signal(pid: HostPid, write: u64) -> Result<u64, ReadError> {
    let address = doorbell_signal_address(write)
        .ok_or(ReadError::Fault { pid, errno: std::io::Error::from_raw_os_error(libc::EFAULT) })?;
    let mut handle = [0u64];
    read_u64s(pid, &[address], &mut handle)?;
    Ok(handle[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handle_is_0x28_below_the_write_pointer() {
        assert_eq!(doorbell_signal_address(0x7f00_0000_1038), Some(0x7f00_0000_1010));
        assert_eq!(doorbell_signal_address(0x10), None);
    }

    #[test]
    fn the_handle_is_read_from_this_process_memory() {
        // An amd_queue_t-shaped block in our own memory: the handle at 0x10, the write index at 0x38.
        let mut queue = [0u64; 16];
        queue[0x10 / 8] = 0xdead_beef_0042;
        let write = queue.as_ptr() as u64 + WRITE_DISPATCH_ID;
        assert_eq!(doorbell_signal(HostPid(std::process::id()), write).unwrap(), 0xdead_beef_0042);
    }
}
