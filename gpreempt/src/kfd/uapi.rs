//! KFD ioctls. The argument layouts are shared with the eBPF probes and live in
//! `gpreempt_common::kfd_uapi`; this module adds the ioctl request numbers.

pub use gpreempt_common::kfd_uapi::*;

nix::ioctl_read!(get_version, KFD_IOCTL_TYPE, nr::GET_VERSION, GetVersionArgs);
nix::ioctl_readwrite!(create_queue, KFD_IOCTL_TYPE, nr::CREATE_QUEUE, CreateQueueArgsV17);
nix::ioctl_readwrite!(destroy_queue, KFD_IOCTL_TYPE, nr::DESTROY_QUEUE, DestroyQueueArgs);
nix::ioctl_write_ptr!(update_queue, KFD_IOCTL_TYPE, nr::UPDATE_QUEUE, UpdateQueueArgs);
nix::ioctl_readwrite!(smi_events, KFD_IOCTL_TYPE, nr::SMI_EVENTS, SmiEventsArgs);
nix::ioctl_readwrite!(runtime_enable, KFD_IOCTL_TYPE, nr::RUNTIME_ENABLE, RuntimeEnableArgs);
nix::ioctl_readwrite!(dbg_trap, KFD_IOCTL_TYPE, nr::DBG_TRAP, DbgTrapArgs);

/// The kernel's verdict on one queue id of a suspend/resume.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueResult {
    Done,
    /// No such queue, a new queue not yet snapshotted, or one being destroyed.
    Invalid,
    /// The hardware failed to preempt/restore it.
    Error,
    /// Gone: SUSPEND_QUEUES set ERROR on it, so its preemption failed — the driver then resets the
    /// hung queue (gfx9 per-queue reset, 6.12+, `HSA_CAP_PER_QUEUE_RESET_SUPPORTED`) or, failing
    /// that, the GPU. Either way the queue no longer runs; it is never retried (docs/kfd.md §2.4).
    Reset,
}

/// One entry of the queue-id array SUSPEND_QUEUES / RESUME_QUEUES write back (docs/kfd.md §2.4):
/// the kernel ORs INVALID into every entry, clears it for each queue it handled and ORs ERROR
/// into a queue it failed on. Both bits can be set (6.12 `suspend_queues`: a per-queue failure
/// leaves INVALID set), so both are kept; [`QueueOutcome::result`] is the verdict.
/// The one decoder of these bits, for the controller and the tracer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct QueueOutcome {
    pub queue_id: crate::domain::QueueId,
    /// Bit 31: the queue does not exist, is new (EC_QUEUE_NEW) or is being destroyed.
    pub invalid: bool,
    /// Bit 30: the hardware failed to suspend/resume it.
    pub error: bool,
}

impl QueueOutcome {
    pub fn from_raw(raw: u32) -> Self {
        Self {
            queue_id: crate::domain::QueueId(raw & queue_status::ID_MASK),
            invalid: raw & queue_status::INVALID_MASK != 0,
            error: raw & queue_status::ERROR_MASK != 0,
        }
    }

    /// A hardware error wins over invalid.
    pub fn result(self) -> QueueResult {
        if self.error {
            QueueResult::Error
        } else if self.invalid {
            QueueResult::Invalid
        } else {
            QueueResult::Done
        }
    }

    /// The verdict of a SUSPEND_QUEUES: ERROR means the queue is gone ([`QueueResult::Reset`]).
    /// 6.12-7.x `suspend_queues` sets ERROR on every listed queue of a GPU whose unmap failed
    /// (`execute_queues_cpsch` ≠ 0: the fence timed out, -ETIME, and the HWS-hang path ran) and on
    /// a queue `suspend_single_queue` failed on with anything but EBUSY; it returns the number
    /// suspended, not the error (kfd_device_queue_manager.c).
    pub fn suspend_result(self) -> QueueResult {
        match self.result() {
            QueueResult::Error => QueueResult::Reset,
            r => r,
        }
    }

    /// The kernel suspended/resumed this queue.
    pub fn handled(self) -> bool {
        self.result() == QueueResult::Done
    }
}

/// Decode the id array the kernel wrote back.
pub fn decode_outcomes(array: &[u32]) -> Vec<QueueOutcome> {
    array.iter().map(|&raw| QueueOutcome::from_raw(raw)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::QueueId;

    #[test]
    fn outcomes_decode_the_status_bits() {
        let out = decode_outcomes(&[0, 1 | queue_status::INVALID_MASK, 2 | queue_status::ERROR_MASK, 1023]);
        let results: Vec<(QueueId, QueueResult)> = out.iter().map(|o| (o.queue_id, o.result())).collect();
        assert_eq!(
            results,
            [
                (QueueId(0), QueueResult::Done),
                (QueueId(1), QueueResult::Invalid),
                (QueueId(2), QueueResult::Error),
                (QueueId(1023), QueueResult::Done),
            ]
        );
        // Both bits: a hardware error wins over invalid, and both bits are kept.
        let both = QueueOutcome::from_raw(5 | queue_status::INVALID_MASK | queue_status::ERROR_MASK);
        assert_eq!(
            (both.queue_id, both.invalid, both.error, both.result()),
            (QueueId(5), true, true, QueueResult::Error)
        );
        assert!(!both.handled() && out[0].handled());
    }

    /// A SUSPEND's ERROR bit (30, `KFD_DBG_QUEUE_ERROR_MASK`) is a reset queue, whatever INVALID
    /// (bit 31) says; INVALID alone stays a retriable verdict.
    #[test]
    fn a_suspend_error_bit_decodes_as_reset() {
        let verdicts: Vec<(u32, QueueResult)> = [0x0000_0003, 0x8000_0004, 0x4000_0005, 0xC000_0006]
            .map(QueueOutcome::from_raw)
            .iter()
            .map(|o| (o.queue_id.0, o.suspend_result()))
            .collect();
        assert_eq!(
            verdicts,
            [(3, QueueResult::Done), (4, QueueResult::Invalid), (5, QueueResult::Reset), (6, QueueResult::Reset)]
        );
        assert_eq!(QueueOutcome::from_raw(0x4000_0005).result(), QueueResult::Error, "RESUME keeps Error");
    }

    /// Full command values from docs/kfd.md §1.1 (computed with gcc against the real structs).
    #[test]
    fn ioctl_commands_match_the_kernel_headers() {
        type Req = nix::sys::ioctl::ioctl_num_type;
        assert_eq!(nix::request_code_read!(KFD_IOCTL_TYPE, nr::GET_VERSION, 8) as Req, 0x80084B01u32 as Req);
        assert_eq!(
            nix::request_code_readwrite!(KFD_IOCTL_TYPE, nr::CREATE_QUEUE, size_of::<CreateQueueArgs>()) as Req,
            0xC0584B02u32 as Req
        );
        assert_eq!(
            nix::request_code_readwrite!(KFD_IOCTL_TYPE, nr::CREATE_QUEUE, size_of::<CreateQueueArgsV17>()) as Req,
            0xC0604B02u32 as Req
        );
        assert_eq!(
            nix::request_code_readwrite!(KFD_IOCTL_TYPE, nr::DESTROY_QUEUE, size_of::<DestroyQueueArgs>()) as Req,
            0xC0084B03u32 as Req
        );
        assert_eq!(
            nix::request_code_write!(KFD_IOCTL_TYPE, nr::UPDATE_QUEUE, size_of::<UpdateQueueArgs>()) as Req,
            0x40184B07u32 as Req
        );
        assert_eq!(
            nix::request_code_readwrite!(KFD_IOCTL_TYPE, nr::SMI_EVENTS, size_of::<SmiEventsArgs>()) as Req,
            0xC0084B1Fu32 as Req
        );
        assert_eq!(
            nix::request_code_readwrite!(KFD_IOCTL_TYPE, nr::RUNTIME_ENABLE, size_of::<RuntimeEnableArgs>()) as Req,
            0xC0104B25u32 as Req
        );
        assert_eq!(
            nix::request_code_readwrite!(KFD_IOCTL_TYPE, nr::DBG_TRAP, size_of::<DbgTrapArgs>()) as Req,
            0xC0204B26u32 as Req
        );
    }

    #[test]
    fn dbg_trap_union_members_land_at_their_uapi_offsets() {
        let a = DbgTrapArgs::suspend_queues(77, 0x4000_0000, 0xdead_beef_0000, 3, 5);
        assert_eq!((a.pid, a.op), (77, dbg_trap_op::SUSPEND_QUEUES));
        assert_eq!(a.exception_mask(), 0x4000_0000);
        assert_eq!(a.data[1], 0xdead_beef_0000);
        assert_eq!((a.num_queues(), a.grace_period()), (3, 5));
        // num_queues at byte 24, grace_period at byte 28 of the whole struct.
        // SAFETY: a 32-byte `#[repr(C)]` struct of integers with no padding, read as its bytes.
        let bytes: [u8; 32] = unsafe { core::mem::transmute(a) };
        assert_eq!(u32::from_ne_bytes(bytes[24..28].try_into().unwrap()), 3);
        assert_eq!(u32::from_ne_bytes(bytes[28..32].try_into().unwrap()), 5);

        let r = DbgTrapArgs::resume_queues(77, 0x1000, 9);
        assert_eq!((r.data[0], r.num_queues()), (0x1000, 9));
        let s = DbgTrapArgs::queue_snapshot(1, exception::ec_mask(exception::EC_QUEUE_NEW), 0x2000, 4, 64);
        assert_eq!(s.exception_mask(), 0x4000_0000);
        assert_eq!((s.num_queues(), s.entry_size()), (4, 64));
        let e = DbgTrapArgs::enable(1, exception::ec_mask(exception::EC_PROCESS_RUNTIME), 0x3000, 16, 9);
        assert_eq!(e.exception_mask(), 0x8000_0000_0000);
        assert_eq!(e.rinfo_size(), 16);
        assert_eq!(e.data[2] >> 32, 9);
    }
}
