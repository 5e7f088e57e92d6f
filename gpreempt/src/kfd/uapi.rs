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

#[cfg(test)]
mod tests {
    use super::*;

    /// Full command values from design/KFD.md §1.1 (computed with gcc against the real structs).
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
