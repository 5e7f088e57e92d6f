//! The KFD and DRM user API ROCm's runtime uses that gpreempt itself does not (memory, events,
//! apertures, clocks, `DRM_IOCTL_AMDGPU_INFO`), re-declared from `include/uapi/linux/kfd_ioctl.h`
//! and `amdgpu_drm.h` for the tests that issue them one by one (`emu_rocm`), with thin wrappers
//! that return the kernel's answer as a number. The queue ioctls and the ioctl type byte are
//! gpreempt's own (`gpreempt::kfd::uapi`).

const fn ioc(dir: u64, ty: u8, nr: u8, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | ((ty as u64) << 8) | nr as u64
}
const fn iow<T>(ty: u8, nr: u8) -> u64 {
    ioc(1, ty, nr, std::mem::size_of::<T>())
}
const fn iowr<T>(ty: u8, nr: u8) -> u64 {
    ioc(3, ty, nr, std::mem::size_of::<T>())
}

/// `struct kfd_process_device_apertures`: one GPU's apertures.
#[repr(C)]
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Apertures {
    pub lds_base: u64,
    pub lds_limit: u64,
    pub scratch_base: u64,
    pub scratch_limit: u64,
    pub gpuvm_base: u64,
    pub gpuvm_limit: u64,
    pub gpu_id: u32,
    pub pad: u32,
}
/// `struct kfd_ioctl_get_process_apertures_new_args`.
#[repr(C)]
#[derive(Default)]
pub struct AperturesArgs {
    pub ptr: u64,
    pub num_of_nodes: u32,
    pub pad: u32,
}
/// `struct kfd_ioctl_acquire_vm_args`.
#[repr(C)]
#[derive(Default)]
pub struct AcquireVm {
    pub drm_fd: u32,
    pub gpu_id: u32,
}
/// `struct kfd_ioctl_alloc_memory_of_gpu_args`.
#[repr(C)]
#[derive(Default)]
pub struct Alloc {
    pub va_addr: u64,
    pub size: u64,
    pub handle: u64,
    pub mmap_offset: u64,
    pub gpu_id: u32,
    pub flags: u32,
}
/// `struct kfd_ioctl_free_memory_of_gpu_args`.
#[repr(C)]
#[derive(Default)]
pub struct Handle {
    pub handle: u64,
}
/// `struct kfd_ioctl_map_memory_to_gpu_args`.
#[repr(C)]
#[derive(Default)]
pub struct MapArgs {
    pub handle: u64,
    pub ids: u64,
    pub n_devices: u32,
    pub n_success: u32,
}
/// `struct kfd_ioctl_create_event_args`.
#[repr(C)]
#[derive(Default)]
pub struct CreateEvent {
    pub event_page_offset: u64,
    pub event_trigger_data: u32,
    pub event_type: u32,
    pub auto_reset: u32,
    pub node_id: u32,
    pub event_id: u32,
    pub event_slot_index: u32,
}
/// `struct kfd_ioctl_destroy_event_args` and `struct kfd_ioctl_set_event_args`.
#[repr(C)]
#[derive(Default)]
pub struct EventId {
    pub event_id: u32,
    pub pad: u32,
}
/// `struct kfd_event_data`: a 32-byte union, `kfd_event_data_ext`, the event id.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub struct EventData {
    pub union: [u64; 4],
    pub ext: u64,
    pub event_id: u32,
    pub pad: u32,
}
/// `struct kfd_ioctl_wait_events_args`.
#[repr(C)]
#[derive(Default)]
pub struct WaitEvents {
    pub events_ptr: u64,
    pub num_events: u32,
    pub wait_for_all: u32,
    pub timeout: u32,
    pub wait_result: u32,
}
/// `struct kfd_ioctl_set_xnack_mode_args`.
#[repr(C)]
#[derive(Default)]
pub struct Xnack {
    pub xnack_enabled: i32,
}
/// `struct kfd_ioctl_get_available_memory_args`.
#[repr(C)]
#[derive(Default)]
pub struct Available {
    pub available: u64,
    pub gpu_id: u32,
    pub pad: u32,
}
/// `struct kfd_ioctl_get_clock_counters_args`.
#[repr(C)]
#[derive(Default)]
pub struct Clocks {
    pub gpu: u64,
    pub cpu: u64,
    pub system: u64,
    pub freq: u64,
    pub gpu_id: u32,
    pub pad: u32,
}
/// `struct kfd_ioctl_set_memory_policy_args`.
#[repr(C)]
#[derive(Default)]
pub struct MemoryPolicy {
    pub alternate_base: u64,
    pub alternate_size: u64,
    pub gpu_id: u32,
    pub default_policy: u32,
    pub alternate_policy: u32,
    pub pad: u32,
}
/// `struct drm_amdgpu_info`: return pointer and size, query, then a 16-byte union.
#[repr(C)]
#[derive(Default)]
pub struct AmdgpuInfo {
    pub return_pointer: u64,
    pub return_size: u32,
    pub query: u32,
    pub dword_offset: u32,
    pub count: u32,
    pub instance: u32,
    pub flags: u32,
}

const K: u8 = gpreempt::kfd::uapi::KFD_IOCTL_TYPE;
/// The KFD ioctls (`AMDKFD_IOC_*`) and the DRM one (`DRM_IOCTL_AMDGPU_INFO`: DRM_COMMAND_BASE 0x40 +
/// DRM_AMDGPU_INFO 5) of the sequence, each with its argument's size.
pub const SET_MEMORY_POLICY: u64 = iow::<MemoryPolicy>(K, 0x04);
pub const GET_CLOCK_COUNTERS: u64 = iowr::<Clocks>(K, 0x05);
pub const CREATE_EVENT: u64 = iowr::<CreateEvent>(K, 0x08);
pub const DESTROY_EVENT: u64 = iow::<EventId>(K, 0x09);
pub const SET_EVENT: u64 = iow::<EventId>(K, 0x0A);
pub const WAIT_EVENTS: u64 = iowr::<WaitEvents>(K, 0x0C);
pub const GET_PROCESS_APERTURES_NEW: u64 = iowr::<AperturesArgs>(K, 0x14);
pub const ACQUIRE_VM: u64 = iow::<AcquireVm>(K, 0x15);
pub const ALLOC_MEMORY_OF_GPU: u64 = iowr::<Alloc>(K, 0x16);
pub const FREE_MEMORY_OF_GPU: u64 = iow::<Handle>(K, 0x17);
pub const MAP_MEMORY_TO_GPU: u64 = iowr::<MapArgs>(K, 0x18);
pub const SET_XNACK_MODE: u64 = iowr::<Xnack>(K, 0x21);
pub const AVAILABLE_MEMORY: u64 = iowr::<Available>(K, 0x23);
pub const DRM_AMDGPU_INFO: u64 = iow::<AmdgpuInfo>(b'd', 0x45);

/// `KFD_IOC_ALLOC_MEM_FLAGS_*`: where an allocation lives.
pub const VRAM: u32 = 1;
pub const GTT: u32 = 2;
pub const DOORBELL: u32 = 1 << 3;
pub const MMIO_REMAP: u32 = 1 << 4;

/// The ioctl's result: 0 or the negated errno.
///
/// # Safety
///
/// `arg` is the #[repr(C)] argument `request` encodes (its size), and every pointer field in it
/// (`ptr`, `events_ptr`, `ids`, `return_pointer`) points at a live buffer the kernel may read or
/// write for the call.
pub unsafe fn ioctl<T>(fd: i32, request: u64, arg: &mut T) -> i32 {
    // SAFETY: `arg` is a live, exclusively borrowed #[repr(C)] argument of the size `request`
    // encodes; the kernel writes at most that many bytes into it (and the caller's buffers).
    let r = unsafe { libc::ioctl(fd, request as _, arg as *mut T) };
    if r < 0 { -std::io::Error::last_os_error().raw_os_error().unwrap_or(0) } else { r }
}

/// A shared mapping of `len` bytes of `fd` at `offset`, or the negated errno. It is never
/// unmapped: the caller reads and writes through the pointer for as long as its process lives.
pub fn map(fd: i32, offset: u64, len: usize) -> Result<*mut u64, i32> {
    // SAFETY: a new shared mapping at an address the kernel chooses (no existing memory is
    // replaced); nothing is read or written here.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, offset as i64)
    };
    if p == libc::MAP_FAILED { Err(-std::io::Error::last_os_error().raw_os_error().unwrap_or(0)) } else { Ok(p.cast()) }
}

/// ALLOC_MEMORY_OF_GPU of `size` bytes on `gpu_id` with `flags`: the result and the argument back.
pub fn alloc(kfd: i32, gpu_id: u32, size: u64, flags: u32) -> (i32, Alloc) {
    let mut a = Alloc { size, gpu_id, flags, ..Default::default() };
    // SAFETY: ALLOC_MEMORY_OF_GPU's own argument, which holds no pointer.
    (unsafe { ioctl(kfd, ALLOC_MEMORY_OF_GPU, &mut a) }, a)
}

/// WAIT_EVENTS for any of `events`: the result and `wait_result` (0 complete, 1 timeout).
pub fn wait(kfd: i32, events: &mut [EventData], timeout_ms: u32) -> (i32, u32) {
    let mut w = WaitEvents {
        events_ptr: events.as_mut_ptr() as u64,
        num_events: events.len() as u32,
        timeout: timeout_ms,
        ..Default::default()
    };
    // SAFETY: WAIT_EVENTS's own argument; `events_ptr` is `events`, borrowed for the call.
    (unsafe { ioctl(kfd, WAIT_EVENTS, &mut w) }, w.wait_result)
}
