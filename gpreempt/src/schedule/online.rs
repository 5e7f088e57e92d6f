//! Seeing online work from outside the online process, without attaching to it.
//!
//! ROCr registers each AQL queue with KFD passing `&amd_queue_t::read_dispatch_id` as the
//! CREATE_QUEUE `read_pointer_address` and `&amd_queue_t::write_dispatch_id` as its
//! `write_pointer_address` (ROCR-Runtime rocm-6.2, `core/runtime/amd_aql_queue.cpp`,
//! `AqlQueue::AqlQueue`; `inc/amd_hsa_queue.h` puts them at offsets 0x80 and 0x38). Both are u64
//! packet indices in the process's memory: the producer bumps the write index, the packet
//! processor the read index when it consumes a packet (starts the dispatch). So `write > read`
//! means dispatches are queued and not yet started. The addresses come from the tracer's
//! CREATE_QUEUE records, or for queues created before the controller started from one debug-trap
//! snapshot (docs/kfd.md §1.2). A dispatch that has started is not visible in the indices: the
//! process's `cu_occupancy` (waves in flight, docs/kfd.md §4.1) shows it, and is read less often
//! because the kernel queries the hardware for it.
//!
//! The indices are read with `process_vm_readv` (one call for every queue of a process), which
//! needs the same rights as ptrace (root, or CAP_SYS_PTRACE).

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use crate::{
    domain::{GpuId, HostPid, QueueId},
    model::QueueAddrs,
};

/// Why an online process's memory could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("pid {0} has exited")]
    Gone(HostPid),
    #[error(
        "cannot read the memory of online pid {pid} ({errno}): run gpreempt as root or with CAP_SYS_PTRACE, \
         and check that no LSM (Yama ptrace_scope=3, SELinux, AppArmor) forbids it"
    )]
    Denied { pid: HostPid, errno: io::Error },
    #[error("reading the queue indices of online pid {pid} failed: {errno} (were its queues destroyed?)")]
    Fault { pid: HostPid, errno: io::Error },
}

/// u64s read per `process_vm_readv` call: the iovec arrays live on the stack, so a poll
/// allocates nothing (a process with more queues takes one call per chunk).
const READ_CHUNK: usize = 64;

/// Read the u64 at each of `addrs` in `pid`'s memory into `out`, with one `process_vm_readv`
/// per [`READ_CHUNK`] addresses; allocates nothing.
pub fn read_u64s(pid: HostPid, addrs: &[u64], out: &mut [u64]) -> Result<(), ReadError> {
    assert_eq!(addrs.len(), out.len(), "one destination per address");
    let pid_raw = libc::pid_t::try_from(pid.0).map_err(|_| ReadError::Gone(pid))?;
    for (addrs, out) in addrs.chunks(READ_CHUNK).zip(out.chunks_mut(READ_CHUNK)) {
        let empty = libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 };
        let (mut local, mut remote) = ([empty; READ_CHUNK], [empty; READ_CHUNK]);
        for ((l, r), (v, &a)) in local.iter_mut().zip(remote.iter_mut()).zip(out.iter_mut().zip(addrs)) {
            *l = libc::iovec { iov_base: (v as *mut u64).cast(), iov_len: 8 };
            *r = libc::iovec { iov_base: a as usize as *mut libc::c_void, iov_len: 8 };
        }
        let n_iov = addrs.len();
        // SAFETY: the first `n_iov` local iovecs point at live u64s of `out`; the remote ones
        // are only read by the kernel, which checks them against the target's address space.
        let n = unsafe { libc::process_vm_readv(pid_raw, local.as_ptr(), n_iov as _, remote.as_ptr(), n_iov as _, 0) };
        if n < 0 {
            let errno = io::Error::last_os_error();
            return Err(match errno.raw_os_error() {
                Some(libc::ESRCH) => ReadError::Gone(pid),
                Some(libc::EPERM) | Some(libc::EACCES) => ReadError::Denied { pid, errno },
                _ => ReadError::Fault { pid, errno },
            });
        }
        if n as usize != n_iov * 8 {
            // A partial read: some queue memory is unmapped (the queue was destroyed).
            return Err(ReadError::Fault { pid, errno: io::Error::from_raw_os_error(libc::EFAULT) });
        }
    }
    Ok(())
}

/// Whether this process may read `pid`'s memory at all. `process_vm_readv` checks access
/// (`mm_access`, PTRACE_MODE_ATTACH_REALCREDS) before it looks at any address and answers EPERM
/// when denied (mm/process_vm_access.c, Linux 6.1 and 6.12), so a read at address 0, which is
/// never mapped (`vm.mmap_min_addr`), faults when access is granted and is refused otherwise.
pub fn check_readable(pid: HostPid) -> Result<(), ReadError> {
    match read_u64s(pid, &[0], &mut [0]) {
        Ok(()) | Err(ReadError::Fault { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// `stats_<gpuid>/cu_occupancy` of `pid` on each GPU it uses (files that do not exist are
/// left out: older kernels and GPUs before gfx9 have none).
pub fn occupancy_files(kfd_proc: &Path, pid: HostPid) -> Vec<PathBuf> {
    let Ok(dir) = fs::read_dir(kfd_proc.join(pid.0.to_string())) else { return Vec::new() };
    let mut files: Vec<PathBuf> = dir
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with("stats_")))
        .map(|e| e.path().join("cu_occupancy"))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// What one poll of a process found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Poll {
    /// Queues with online work: `write > read`, or (when writes are watched) a write index that
    /// moved since the last poll.
    pub pending_queues: usize,
    /// Dispatch delays (first seen pending → consumed) completed at this poll: how many.
    pub delays_closed: usize,
}

/// One online queue and what is known of its backlog.
#[derive(Clone, Debug)]
struct Watched {
    addrs: QueueAddrs,
    /// The write index first seen ahead of the read index, and when.
    pending_since: Option<(u64, u64)>,
    /// `write > read` at the last poll.
    pending: bool,
    /// The write index at the last poll (`None` before the first).
    last_write: Option<u64>,
    /// Work at the last poll: pending, or a submission since the poll before.
    active: bool,
}

/// One online process's queues and their indices, read with one system call per poll.
#[derive(Debug)]
pub struct OnlineProcess {
    pub pid: HostPid,
    /// A write index that moved since the last poll is online work even if the packet
    /// processor consumed it before this poll (see [`OnlineProcess::new`]).
    watch_writes: bool,
    queues: Vec<Watched>,
    addrs: Vec<u64>,
    values: Vec<u64>,
}

impl OnlineProcess {
    /// `watch_writes`: count a submission seen only as a moved write index. An MI300-class
    /// command processor takes a packet within microseconds of the doorbell, so an online
    /// dispatch published between two polls is often consumed (read == write) before the second
    /// one looks; the write index still moved. Without this only `cu_occupancy` (read far less
    /// often: the kernel asks the hardware) would show it.
    pub fn new(pid: HostPid, watch_writes: bool) -> Self {
        Self { pid, watch_writes, queues: Vec::new(), addrs: Vec::new(), values: Vec::new() }
    }

    /// Watch a queue (a repeat of a known id replaces its addresses: ids are reused after destroy).
    pub fn add_queue(&mut self, addrs: QueueAddrs) {
        self.queues.retain(|w| w.addrs.queue_id != addrs.queue_id);
        self.queues.push(Watched { addrs, pending_since: None, pending: false, last_write: None, active: false });
        self.rebuild();
    }

    /// Stop watching a queue; its GPU, if it was watched.
    pub fn remove_queue(&mut self, queue_id: QueueId) -> Option<GpuId> {
        let gpu = self.queues.iter().find(|w| w.addrs.queue_id == queue_id).map(|w| w.addrs.gpu_id);
        self.queues.retain(|w| w.addrs.queue_id != queue_id);
        self.rebuild();
        gpu
    }

    fn rebuild(&mut self) {
        self.addrs = self.queues.iter().flat_map(|w| [w.addrs.read, w.addrs.write]).collect();
        self.values = vec![0; self.addrs.len()];
    }

    pub fn queue_ids(&self) -> Vec<QueueId> {
        self.queues.iter().map(|w| w.addrs.queue_id).collect()
    }

    /// The GPUs of the watched queues (repeats included).
    pub fn gpus(&self) -> impl Iterator<Item = GpuId> + '_ {
        self.queues.iter().map(|w| w.addrs.gpu_id)
    }

    /// The sum of its queues' write indices at the last poll (wrapping): a moved sum is a
    /// submission, whatever the read indices did meanwhile.
    pub fn writes(&self) -> u64 {
        self.queues.iter().filter_map(|w| w.last_write).fold(0, u64::wrapping_add)
    }

    /// GPUs with a queue whose indices showed online work at the last poll (repeats included).
    pub fn pending_gpus(&self) -> impl Iterator<Item = GpuId> + '_ {
        self.queues.iter().filter(|w| w.active).map(|w| w.addrs.gpu_id)
    }

    /// Read every queue's indices at `now` (ns); each closed dispatch delay (first seen pending
    /// → consumed, ns) is handed to `delay`.
    pub fn poll(&mut self, now: u64, delay: &mut impl FnMut(GpuId, u64)) -> Result<Poll, ReadError> {
        read_u64s(self.pid, &self.addrs, &mut self.values)?;
        Ok(self.apply(now, delay))
    }

    /// The bookkeeping of [`OnlineProcess::poll`] over the values just read.
    fn apply(&mut self, now: u64, delay: &mut impl FnMut(GpuId, u64)) -> Poll {
        let mut out = Poll::default();
        for (w, pair) in self.queues.iter_mut().zip(self.values.chunks_exact(2)) {
            let (read, write) = (pair[0], pair[1]);
            if let Some((target, since)) = w.pending_since
                && read >= target
            {
                delay(w.addrs.gpu_id, now.saturating_sub(since));
                out.delays_closed += 1;
                w.pending_since = None;
            }
            w.pending = write > read;
            let moved = self.watch_writes && w.last_write.is_some_and(|last| write != last);
            w.last_write = Some(write);
            w.active = w.pending || moved;
            if w.active {
                out.pending_queues += 1;
            }
            if w.pending && w.pending_since.is_none() {
                w.pending_since = Some((write, now));
            }
        }
        out
    }
}

/// One online process's `cu_occupancy` of one GPU, kept open: sysfs recomputes an attribute at
/// every read at offset 0, so a look is one `pread` (no open and close each time).
#[derive(Debug)]
pub struct OccupancyFile {
    pub gpu: GpuId,
    file: fs::File,
}

impl OccupancyFile {
    /// The file at `path` (`…/stats_<gpuid>/cu_occupancy`), if it names a GPU and opens.
    pub fn open(path: &Path) -> Option<Self> {
        Some(Self { gpu: occupancy_gpu(path)?, file: fs::File::open(path).ok()? })
    }

    /// Another handle on the same file (for the other thread).
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Self { gpu: self.gpu, file: self.file.try_clone()? })
    }

    /// Waves of the process in flight on the GPU now (`None`: unreadable).
    pub fn busy(&self) -> Option<bool> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 32];
        let n = self.file.read_at(&mut buf, 0).ok()?;
        let v: i64 = std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()?;
        Some(v > 0)
    }
}

/// The GPU of an occupancy file `…/stats_<gpuid>/cu_occupancy`.
pub fn occupancy_gpu(file: &Path) -> Option<GpuId> {
    let dir = file.parent()?.file_name()?.to_str()?;
    dir.strip_prefix("stats_")?.parse().ok().map(GpuId)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(id: u32, read: u64, write: u64) -> QueueAddrs {
        QueueAddrs { queue_id: QueueId(id), gpu_id: crate::domain::GpuId(0x1000), read, write }
    }

    #[test]
    fn reads_this_process_memory_in_one_call() {
        let values: [u64; 3] = [7, 0xdead_beef_0000_0001, u64::MAX];
        let addrs: Vec<u64> = values.iter().map(|v| v as *const u64 as u64).collect();
        let mut out = [0u64; 3];
        read_u64s(HostPid(std::process::id()), &addrs, &mut out).unwrap();
        assert_eq!(out, values);
        // Unmapped memory is a fault, not a panic or a zero.
        let err = read_u64s(HostPid(std::process::id()), &[8], &mut [0]).unwrap_err();
        assert!(matches!(err, ReadError::Fault { .. }), "{err}");
        check_readable(HostPid(std::process::id())).unwrap();
    }

    #[test]
    fn pending_is_write_ahead_of_read_and_the_delay_closes_when_consumed() {
        // The indices live in this test; the process reads itself.
        let mut idx: Box<[u64; 4]> = Box::new([0, 0, 5, 5]);
        let base = idx.as_ptr() as u64;
        let mut p = OnlineProcess::new(HostPid(std::process::id()), false);
        p.add_queue(q(0, base, base + 8));
        p.add_queue(QueueAddrs { gpu_id: GpuId(0x2000), ..q(1, base + 16, base + 24) });
        let mut delays = Vec::new();
        let mut delay = |gpu: GpuId, ns: u64| delays.push((gpu.0, ns));
        assert_eq!(p.poll(1_000, &mut delay).unwrap(), Poll::default());
        idx[1] = 3; // three dispatches submitted on queue 0
        assert_eq!(p.poll(2_000, &mut delay).unwrap(), Poll { pending_queues: 1, delays_closed: 0 });
        assert_eq!(p.pending_gpus().collect::<Vec<_>>(), [GpuId(0x1000)]);
        idx[0] = 2; // two started: still pending, the delay is measured to the last one seen
        assert_eq!(p.poll(3_000, &mut delay).unwrap(), Poll { pending_queues: 1, delays_closed: 0 });
        idx[0] = 3;
        assert_eq!(p.poll(4_500, &mut delay).unwrap(), Poll { pending_queues: 0, delays_closed: 1 });
        assert_eq!(p.pending_gpus().count(), 0);
        assert_eq!(p.remove_queue(QueueId(0)), Some(GpuId(0x1000)));
        assert_eq!(p.queue_ids(), vec![QueueId(1)]);
        idx[3] = 6;
        assert_eq!(p.poll(5_000, &mut delay).unwrap().pending_queues, 1);
        assert_eq!(p.pending_gpus().collect::<Vec<_>>(), [GpuId(0x2000)]);
        // Re-adding an id replaces it.
        p.add_queue(q(1, base + 16, base + 16));
        assert_eq!(p.queue_ids(), vec![QueueId(1)]);
        assert_eq!(p.poll(6_000, &mut delay).unwrap().pending_queues, 0);
        assert_eq!(delays, vec![(0x1000, 2_500)]);
        assert_eq!(p.remove_queue(QueueId(9)), None);
    }

    #[test]
    fn a_submission_consumed_between_two_polls_is_seen_by_its_moved_write_index() {
        let mut idx: Box<[u64; 2]> = Box::new([4, 4]);
        let base = idx.as_ptr() as u64;
        let mut watching = OnlineProcess::new(HostPid(std::process::id()), true);
        watching.add_queue(q(0, base, base + 8));
        let mut blind = OnlineProcess::new(HostPid(std::process::id()), false);
        blind.add_queue(q(0, base, base + 8));
        let mut delay = |_: GpuId, _: u64| {};
        // The first look learns the write index: nothing moved yet.
        assert_eq!(watching.poll(1_000, &mut delay).unwrap().pending_queues, 0);
        assert_eq!(blind.poll(1_000, &mut delay).unwrap().pending_queues, 0);
        // Published and consumed before the next poll (an MI300 CP takes it within microseconds).
        idx[1] = 5;
        idx[0] = 5;
        assert_eq!(watching.poll(2_000, &mut delay).unwrap().pending_queues, 1);
        assert_eq!(watching.pending_gpus().collect::<Vec<_>>(), [GpuId(0x1000)]);
        assert_eq!(blind.poll(2_000, &mut delay).unwrap().pending_queues, 0);
        // Nothing moved since: quiet again.
        assert_eq!(watching.poll(3_000, &mut delay).unwrap().pending_queues, 0);
        assert_eq!(watching.pending_gpus().count(), 0);
    }

    #[test]
    fn more_addresses_than_one_call_takes_are_read_in_chunks() {
        let values: Vec<u64> = (0..150).map(|i| i * 3 + 1).collect();
        let addrs: Vec<u64> = values.iter().map(|v| v as *const u64 as u64).collect();
        let mut out = vec![0; values.len()];
        read_u64s(HostPid(std::process::id()), &addrs, &mut out).unwrap();
        assert_eq!(out, values);
    }

    #[test]
    fn occupancy_files_are_found_per_gpu_and_read_open() {
        let dir = tempfile::tempdir().unwrap();
        for (gpu, v) in [("4096", "304\n"), ("8192", "0\n")] {
            let d = dir.path().join(format!("42/stats_{gpu}"));
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("cu_occupancy"), v).unwrap();
        }
        fs::create_dir_all(dir.path().join("42/stats_12288")).unwrap();
        let files = occupancy_files(dir.path(), HostPid(42));
        assert_eq!(files.len(), 2);
        assert_eq!(files.iter().map(|f| occupancy_gpu(f)).collect::<Vec<_>>(), [Some(GpuId(4096)), Some(GpuId(8192))]);
        let open: Vec<OccupancyFile> = files.iter().filter_map(|f| OccupancyFile::open(f)).collect();
        assert_eq!(
            open.iter().map(|f| (f.gpu, f.busy())).collect::<Vec<_>>(),
            [(GpuId(4096), Some(true)), (GpuId(8192), Some(false))]
        );
        // A rewrite is seen by the next look at the open file.
        fs::write(dir.path().join("42/stats_4096/cu_occupancy"), "0\n").unwrap();
        assert_eq!(open[0].try_clone().unwrap().busy(), Some(false));
        assert!(occupancy_files(dir.path(), HostPid(43)).is_empty());
    }
}
