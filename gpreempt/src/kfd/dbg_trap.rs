//! `AMDKFD_IOC_DBG_TRAP`, one typed function per operation the controller uses (docs/kfd.md §2).
//!
//! Each function takes references and a borrowed `/dev/kfd` fd and builds the argument struct
//! inside, so safe code cannot hand the kernel an address of its choosing: the arrays and buffers
//! the kernel writes are the caller's slices, sized by their length. All of them enter the kernel
//! through the one funnel in [`super::sys`].

use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;

use super::{
    sys,
    uapi::{DbgTrapArgs, QueueSnapshotEntry, RuntimeInfo, dbg_trap_op, exception},
};
use crate::domain::{GpuId, HostPid, QueueId};

/// `ENABLE`: debug `pid` from this thread, subscribe to `exception_mask`, have KFD write one byte
/// per raised exception into `events` (a pipe's write end: KFD takes its own reference, fget), and
/// fill `info` with the target's runtime state.
pub(crate) fn enable(
    kfd: BorrowedFd<'_>,
    pid: HostPid,
    exception_mask: u64,
    info: &mut RuntimeInfo,
    events: BorrowedFd<'_>,
) -> Result<(), Errno> {
    let mut args = DbgTrapArgs::enable(
        pid.0,
        exception_mask,
        std::ptr::from_mut(info) as u64,
        size_of::<RuntimeInfo>() as u32,
        events.as_raw_fd() as u32,
    );
    // SAFETY: `rinfo_ptr` is `info`, exclusively borrowed for the call, of the size passed.
    unsafe { sys::dbg_trap(kfd, &mut args) }.map(drop)
}

/// `DISABLE`: stop debugging `pid` (KFD resumes every queue it suspended, docs/kfd.md §2.3).
pub(crate) fn disable(kfd: BorrowedFd<'_>, pid: HostPid) -> Result<(), Errno> {
    let mut args = DbgTrapArgs::bare(pid.0, dbg_trap_op::DISABLE);
    // SAFETY: DISABLE carries no pointer.
    unsafe { sys::dbg_trap(kfd, &mut args) }.map(drop)
}

/// `SUSPEND_QUEUES` of the ids in `ids`; KFD writes each id's verdict bits back into it
/// (`queue_status`, docs/kfd.md §2.4). Returns the number of queues suspended.
pub(crate) fn suspend_queues(
    kfd: BorrowedFd<'_>,
    pid: HostPid,
    ids: &mut [u32],
    grace_period: u32,
) -> Result<i32, Errno> {
    let mut args = DbgTrapArgs::suspend_queues(pid.0, 0, ids.as_mut_ptr() as u64, array_len(ids.len())?, grace_period);
    // SAFETY: `queue_array_ptr` is `ids`, exclusively borrowed, with `num_queues` = its length.
    unsafe { sys::dbg_trap(kfd, &mut args) }
}

/// `RESUME_QUEUES` of the ids in `ids`, verdicts written back as for [`suspend_queues`]. Returns
/// the number of queues resumed.
pub(crate) fn resume_queues(kfd: BorrowedFd<'_>, pid: HostPid, ids: &mut [u32]) -> Result<i32, Errno> {
    let mut args = DbgTrapArgs::resume_queues(pid.0, ids.as_mut_ptr() as u64, array_len(ids.len())?);
    // SAFETY: as in `suspend_queues`.
    unsafe { sys::dbg_trap(kfd, &mut args) }
}

/// `GET_QUEUE_SNAPSHOT` into `buf`, clearing `clear_mask` on the queues copied. Returns the
/// number of queues the process has, which may exceed `buf.len()` (then only `buf.len()` were
/// copied and cleared: docs/kfd.md §2.5).
pub(crate) fn queue_snapshot(
    kfd: BorrowedFd<'_>,
    pid: HostPid,
    clear_mask: u64,
    buf: &mut [QueueSnapshotEntry],
) -> Result<usize, Errno> {
    let mut args = DbgTrapArgs::queue_snapshot(
        pid.0,
        clear_mask,
        buf.as_mut_ptr() as u64,
        array_len(buf.len())?,
        size_of::<QueueSnapshotEntry>() as u32,
    );
    // SAFETY: `snapshot_buf_ptr` is `buf`, exclusively borrowed, `num_queues` entries of
    // `entry_size` bytes.
    unsafe { sys::dbg_trap(kfd, &mut args) }?;
    Ok(args.num_queues() as usize)
}

/// What `QUERY_DEBUG_EVENT` found pending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DebugEvent {
    /// The raised exceptions among those asked for (cleared by the query, except
    /// `EC_PROCESS_RUNTIME`, which [`query_runtime`] clears).
    pub exceptions: u64,
    pub gpu_id: GpuId,
    pub queue_id: QueueId,
}

/// `QUERY_DEBUG_EVENT` for `exception_mask`; `EAGAIN` when nothing is pending.
pub(crate) fn query_debug_event(kfd: BorrowedFd<'_>, pid: HostPid, exception_mask: u64) -> Result<DebugEvent, Errno> {
    let mut args = DbgTrapArgs::query_debug_event(pid.0, exception_mask);
    // SAFETY: QUERY_DEBUG_EVENT carries no pointer.
    unsafe { sys::dbg_trap(kfd, &mut args) }?;
    Ok(DebugEvent {
        exceptions: args.exception_mask(),
        gpu_id: GpuId(args.event_gpu_id()),
        queue_id: QueueId(args.event_queue_id()),
    })
}

/// `QUERY_EXCEPTION_INFO` of `EC_PROCESS_RUNTIME` into `info`, clearing the exception.
pub(crate) fn query_runtime(kfd: BorrowedFd<'_>, pid: HostPid, info: &mut RuntimeInfo) -> Result<(), Errno> {
    let mut args = DbgTrapArgs::query_exception_info(
        pid.0,
        std::ptr::from_mut(info) as u64,
        size_of::<RuntimeInfo>() as u32,
        0,
        exception::EC_PROCESS_RUNTIME,
        true,
    );
    // SAFETY: `info_ptr` is `info`, exclusively borrowed for the call, of the size passed.
    unsafe { sys::dbg_trap(kfd, &mut args) }.map(drop)
}

/// `SEND_RUNTIME_EVENT` of `exception_mask` to the process (no queue): acknowledges a runtime
/// enable/disable and wakes the thread waiting in it (6.12 kfd_debug.c).
pub(crate) fn send_runtime_event(kfd: BorrowedFd<'_>, pid: HostPid, exception_mask: u64) -> Result<(), Errno> {
    let mut args = DbgTrapArgs::send_runtime_event(pid.0, exception_mask, 0, 0);
    // SAFETY: SEND_RUNTIME_EVENT carries no pointer.
    unsafe { sys::dbg_trap(kfd, &mut args) }.map(drop)
}

/// An array length as the ioctl's `u32` count; longer than KFD accepts is `EINVAL` as the kernel
/// would answer (`KFD_MAX_NUM_OF_QUEUES_PER_PROCESS` is 1024).
fn array_len(len: usize) -> Result<u32, Errno> {
    u32::try_from(len).map_err(|_| Errno::EINVAL)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;
    use crate::{
        domain::DebugTrapOp,
        kfd::{sys::fake, uapi::queue_status},
    };

    fn op_of(args: &DbgTrapArgs) -> DebugTrapOp {
        DebugTrapOp(args.op)
    }

    fn devnull() -> std::fs::File {
        std::fs::File::open("/dev/null").unwrap()
    }

    #[test]
    fn suspend_passes_the_callers_ids_and_reads_the_verdicts_back() {
        let _k = fake::install(|args| {
            assert_eq!(
                (op_of(args), args.pid, args.num_queues(), args.grace_period()),
                (DebugTrapOp::SUSPEND_QUEUES, 7, 3, 9)
            );
            // SAFETY: the call's own array.
            let ids = unsafe { fake::ids(args.data[1], args.num_queues()) };
            ids[1] |= queue_status::INVALID_MASK;
            Ok(2)
        });
        let mut ids = [4, 5, 6];
        assert_eq!(suspend_queues(devnull().as_fd(), HostPid(7), &mut ids, 9), Ok(2));
        assert_eq!(ids, [4, 5 | queue_status::INVALID_MASK, 6]);
    }

    #[test]
    fn a_snapshot_reports_more_queues_than_fit() {
        let _k = fake::install(|args| {
            assert_eq!(op_of(args), DebugTrapOp(dbg_trap_op::GET_QUEUE_SNAPSHOT));
            assert_eq!(args.entry_size() as usize, size_of::<QueueSnapshotEntry>());
            args.data[2] = (args.data[2] & !0xffff_ffff) | 5;
            Ok(0)
        });
        let mut buf = [QueueSnapshotEntry::default(); 2];
        assert_eq!(queue_snapshot(devnull().as_fd(), HostPid(1), 0, &mut buf), Ok(5));
    }

    #[test]
    fn errnos_come_back_unchanged() {
        let _k = fake::install(|_| Err(Errno::ESRCH));
        assert_eq!(disable(devnull().as_fd(), HostPid(1)), Err(Errno::ESRCH));
        assert_eq!(query_debug_event(devnull().as_fd(), HostPid(1), 1), Err(Errno::ESRCH));
    }
}
