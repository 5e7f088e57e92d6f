//! The memory the clients and the model GPU share: one `/dev/shm` file mapped `MAP_SHARED` by the
//! harness and by every client process, laid out `#[repr(C)]` with atomics only.
//!
//! Per queue, AQL-like u64 dispatch indices: `write` is published by the client (its dispatches),
//! `read` is advanced by the model GPU when it *starts* a dispatch (a command processor consumes
//! the packet), `completed` counts finished dispatches. The scheduler reads `read` and `write` in
//! the client's own address space with `process_vm_readv` (the client tells their addresses), as
//! it reads `amd_queue_t` on hardware. A ring of packets holds each dispatch's GPU time and its
//! publish time (CLOCK_MONOTONIC, so the harness knows when it was published, exactly).
//!
//! Waiting: the model GPU of each GPU waits on that GPU's doorbell word, clients on their own
//! wake word (bumped at each of their completions), with non-private futexes on the shared
//! mapping; nobody spins (the host has 2 cores).

use std::{
    ffi::CString,
    io,
    path::{Path, PathBuf},
    ptr::NonNull,
    sync::atomic::{AtomicU32, AtomicU64, Ordering},
    time::Duration,
};

/// Packets per queue ring (a conversation request of the Azure trace is up to ~700 dispatches).
pub const RING: usize = 4096;
pub const MAX_QUEUES: usize = 16;
pub const MAX_GPUS: usize = 4;
pub const MAX_CLIENTS: usize = 16;
const MAGIC: u64 = 0x6770_7265_6d70_7431; // "gpreempt1"

/// One queue, laid out where the scheduler looks as ROCr's `amd_queue_t` is: the doorbell
/// signal handle at 0x10, the write index at 0x38, the read index at 0x80 (so the doorbell probe
/// finds the handle at write − 0x28, as on hardware); then the packet ring.
#[repr(C, align(64))]
pub struct QueueSlot {
    /// `hsa_queue_t`'s type, features and base_address: unused.
    _hsa_head: [u64; 2],
    /// The doorbell signal handle (`hsa_queue_t::doorbell_signal`): the client's address of
    /// [`Self::doorbell_value`], which the stand-in runtime's store writes.
    pub doorbell_signal: AtomicU64,
    pub doorbell_value: AtomicU64,
    _reserved: [u64; 3],
    /// Dispatches published (client).
    pub write: AtomicU64,
    _pad0: [u64; 8],
    /// Dispatches started (model GPU).
    pub read: AtomicU64,
    _pad1: [u64; 7],
    /// Dispatches completed (model GPU).
    pub completed: AtomicU64,
    /// The client's addresses of `read` and `write` (for the scheduler's snapshot).
    pub read_addr: AtomicU64,
    pub write_addr: AtomicU64,
    /// Pid of the client that owns it; 0 until it attached.
    pub owner: AtomicU32,
    _pad2: u32,
    pub work_ns: [AtomicU64; RING],
    pub publish_ns: [AtomicU64; RING],
}

/// The whole region.
#[repr(C)]
pub struct Region {
    magic: AtomicU64,
    /// CLOCK_MONOTONIC origin of the loads, set with `go`.
    pub start_ns: AtomicU64,
    pub doorbell: [AtomicU32; MAX_GPUS],
    /// Per client: bumped by the model GPU at each completion of one of its queues.
    pub client_wake: [AtomicU32; MAX_CLIENTS],
    /// Set once: the loads start (futex word).
    pub go: AtomicU32,
    /// Set once: long-running clients (offline) stop (clients also get their wake word bumped).
    pub stop: AtomicU32,
    /// Per client: the loopback TCP port it listens on (a served online client, set before it
    /// attaches its queues), else 0.
    pub client_port: [AtomicU32; MAX_CLIENTS],
    /// The data-parallel job's barrier: arrivals in this generation, and the generation.
    pub barrier_arrived: AtomicU32,
    pub barrier_generation: AtomicU32,
    pub queues: [QueueSlot; MAX_QUEUES],
}

/// `FUTEX_WAIT` on a shared (non-private) word: returns when woken, on timeout, or at once if
/// `*word != expected`.
const _: () = {
    assert!(std::mem::offset_of!(QueueSlot, doorbell_signal) == 0x10);
    assert!(std::mem::offset_of!(QueueSlot, write) == 0x38);
    assert!(std::mem::offset_of!(QueueSlot, read) == 0x80);
};

pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|d| libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as _ });
    let ts_ptr = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a live u32 for the call; FUTEX_WAIT only reads it and the timespec.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, ts_ptr, 0usize, 0u32);
    }
}

/// `FUTEX_WAKE` every waiter of a shared word.
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live u32; FUTEX_WAKE does not access memory beyond hashing its address.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX, 0usize, 0usize, 0u32);
    }
}

/// Bump a wake word and wake its waiters.
pub fn ring(word: &AtomicU32) {
    word.fetch_add(1, Ordering::Release);
    futex_wake(word);
}

/// Timers of the calling thread fire when due, not up to 50 µs later (the default slack of a
/// normal thread): the model GPU's completions and the clients' arrivals are timed by them.
pub fn tight_timers() {
    // SAFETY: PR_SET_TIMERSLACK takes a value and touches no memory.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0u64, 0u64, 0u64);
    }
}

/// A mapping of the region; the creator unlinks the file when dropped.
pub struct Shm {
    region: NonNull<Region>,
    path: PathBuf,
    owner: bool,
}

// SAFETY: the region holds atomics only; the pointer stays valid until drop.
unsafe impl Send for Shm {}
// SAFETY: as above: every access through `&Region` is atomic.
unsafe impl Sync for Shm {}

impl Shm {
    /// Create a zeroed region at `path` (a file under /dev/shm).
    pub fn create(path: &Path) -> io::Result<Self> {
        let shm = Self::map(path, true)?;
        shm.magic.store(MAGIC, Ordering::Release);
        Ok(shm)
    }

    /// Map a region another process created.
    pub fn open(path: &Path) -> io::Result<Self> {
        let shm = Self::map(path, false)?;
        if shm.magic.load(Ordering::Acquire) != MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: not a harness region", path.display()),
            ));
        }
        Ok(shm)
    }

    fn map(path: &Path, create: bool) -> io::Result<Self> {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
        let flags = libc::O_RDWR | libc::O_CLOEXEC | if create { libc::O_CREAT | libc::O_EXCL } else { 0 };
        // SAFETY: a NUL-terminated path; the fd is closed below.
        let fd = unsafe { libc::open(c.as_ptr(), flags, 0o600) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let len = size_of::<Region>();
        // SAFETY: `fd` is ours; a fresh file is extended with zeroes (a valid Region: all atomics).
        if create && unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: closing the fd opened above.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        // SAFETY: a shared mapping of `len` bytes of the file; checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        };
        // SAFETY: the mapping keeps the file; the fd is no longer needed.
        unsafe { libc::close(fd) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let region = NonNull::new(p.cast::<Region>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { region, path: path.to_owned(), owner: create })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl std::ops::Deref for Shm {
    type Target = Region;
    fn deref(&self) -> &Region {
        // SAFETY: mapped, page-aligned (so aligned for Region), sized for a Region, and only
        // ever accessed through atomics, by this and other processes.
        unsafe { self.region.as_ref() }
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping made in `map`; no reference into it outlives `self`.
        unsafe { libc::munmap(self.region.as_ptr().cast(), size_of::<Region>()) };
        if self.owner {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl QueueSlot {
    /// Publish one dispatch of `work_ns` (client side): packet first, then the write index.
    pub fn publish(&self, work_ns: u64, publish_ns: u64) -> u64 {
        let w = self.write.load(Ordering::Relaxed);
        let i = (w % RING as u64) as usize;
        self.work_ns[i].store(work_ns, Ordering::Relaxed);
        self.publish_ns[i].store(publish_ns, Ordering::Relaxed);
        self.write.store(w + 1, Ordering::Release);
        w + 1
    }

    /// Packets the ring can still take without overwriting one not yet completed.
    pub fn room(&self) -> u64 {
        RING as u64 - (self.write.load(Ordering::Relaxed) - self.completed.load(Ordering::Acquire))
    }

    /// Packet `i` (0-based), model GPU side: (GPU time, publish time).
    pub fn packet(&self, i: u64) -> (u64, u64) {
        let k = (i % RING as u64) as usize;
        (self.work_ns[k].load(Ordering::Relaxed), self.publish_ns[k].load(Ordering::Relaxed))
    }
}

/// A unique path under /dev/shm for this process.
pub fn fresh_path(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    PathBuf::from(format!("/dev/shm/gpreempt-harness-{}-{tag}-{n}", std::process::id()))
}
