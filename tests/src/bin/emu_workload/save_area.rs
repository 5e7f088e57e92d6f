//! A compute queue's context-save (CWSR) area as libhsakmt allocates it, for a node whose
//! CREATE_QUEUE checks it (`kfd_queue_acquire_buffers`, kfd_queue.c 6.12; the emulator's gfx942
//! profile, tests/kfd-emu README "Save-area checks"): one GPU memory object of
//! `PAGE_ALIGN((cwsr_size + debug_memory_size) × num_xcc)` bytes, `ctx_save_restore_size` and
//! `ctl_stack_size` the node's per-XCC figures, one header per XCC. The default (header only)
//! is what the emulator's mi210 profile accepts, without a render node.

use std::{
    collections::BTreeMap,
    fs::{File, OpenOptions},
    os::fd::{AsRawFd, RawFd},
};

use anyhow::{Context, Result, bail};
use gpreempt::kfd::uapi;
use gpreempt_tests::kfd_abi::{ACQUIRE_VM, ALLOC_MEMORY_OF_GPU, AcquireVm, Alloc, ioctl};

use crate::aql::ContextSaveAreaHeader;

const TOPOLOGY: &str = "/sys/class/kfd/kfd/topology/nodes";
/// `KFD_IOC_ALLOC_MEM_FLAGS_USERPTR` (kfd_ioctl.h): the object is the process's own pages.
const USERPTR: u32 = 1 << 2;

/// One node's save-area figures (its topology properties, as libhsakmt reads them).
struct NodeSizes {
    render_minor: u64,
    /// Per XCC (`cwsr_size`, `ctl_stack_size`: 6.18.4+ export them; the emulator always does).
    cwsr_size: u32,
    ctl_stack_size: u32,
    debug_memory_size: u32,
    num_xcc: u32,
}

impl NodeSizes {
    fn of(gpu_id: u32) -> Result<Self> {
        for entry in std::fs::read_dir(TOPOLOGY).context(TOPOLOGY)? {
            let dir = entry?.path();
            let id = std::fs::read_to_string(dir.join("gpu_id")).unwrap_or_default();
            if id.trim().parse::<u32>().ok() != Some(gpu_id) {
                continue;
            }
            let text = std::fs::read_to_string(dir.join("properties"))?;
            let props: BTreeMap<&str, u64> = text
                .lines()
                .filter_map(|l| {
                    let (k, v) = l.split_once(' ')?;
                    Some((k, v.trim().parse().ok()?))
                })
                .collect();
            let get = |k: &str| props.get(k).copied().with_context(|| format!("{} has no {k}", dir.display()));
            let num_xcc = get("num_xcc")?.max(1);
            // libhsakmt's update_ctx_save_restore_size (gfx9): CUs per XCC, waves per XCC, 32
            // debugger bytes per wave aligned to 64.
            let cu_num = get("simd_count")? / get("simd_per_cu")?.max(1) / num_xcc;
            let waves = (cu_num * 40).min(get("array_count")? / get("simd_arrays_per_engine")?.max(1) * 512);
            return Ok(NodeSizes {
                render_minor: get("drm_render_minor")?,
                cwsr_size: u32::try_from(get("cwsr_size")?)?,
                ctl_stack_size: u32::try_from(get("ctl_stack_size")?)?,
                debug_memory_size: u32::try_from((waves * 32).next_multiple_of(64))?,
                num_xcc: u32::try_from(num_xcc)?,
            });
        }
        bail!("no topology node has gpu_id {gpu_id:#x}")
    }
}

/// How this process gives its queues a save area.
pub enum SaveAreas {
    /// A header only (the emulator's mi210 profile does not check the size).
    HeaderOnly,
    /// The full area per queue, in a USERPTR object on the GPU's VM (ACQUIRE_VM of its render
    /// node at the first queue on it; the render node stays open for the process's life).
    Full { kfd: RawFd, render: BTreeMap<u32, File> },
}

impl SaveAreas {
    pub fn full(kfd: RawFd) -> Self {
        SaveAreas::Full { kfd, render: BTreeMap::new() }
    }

    /// Fill `args`' save-area fields for a queue on its `gpu_id` whose error payload is
    /// `err_payload`; returns the first header.
    pub fn provide(
        &mut self,
        args: &mut uapi::CreateQueueArgs,
        header_only: *mut ContextSaveAreaHeader,
    ) -> Result<*mut ContextSaveAreaHeader> {
        let SaveAreas::Full { kfd, render } = self else {
            args.ctx_save_restore_address = header_only as u64;
            args.ctx_save_restore_size = size_of::<ContextSaveAreaHeader>() as u32;
            return Ok(header_only);
        };
        let gpu_id = args.gpu_id;
        let sizes = NodeSizes::of(gpu_id)?;
        if let std::collections::btree_map::Entry::Vacant(slot) = render.entry(gpu_id) {
            let path = format!("/dev/dri/renderD{}", sizes.render_minor);
            let file = OpenOptions::new().read(true).write(true).open(&path).with_context(|| path.clone())?;
            let mut acquire = AcquireVm { drm_fd: file.as_raw_fd() as u32, gpu_id };
            // SAFETY: ACQUIRE_VM's own argument, which holds no pointer.
            let ret = unsafe { ioctl(*kfd, ACQUIRE_VM, &mut acquire) };
            if ret != 0 {
                bail!("ACQUIRE_VM of {path} on gpu {gpu_id:#x}: {ret}");
            }
            slot.insert(file);
        }
        let per_xcc = u64::from(sizes.cwsr_size) + u64::from(sizes.debug_memory_size);
        let total = (per_xcc * u64::from(sizes.num_xcc)).next_multiple_of(4096);
        // SAFETY: a new private anonymous mapping at an address the kernel chooses; it is never
        // unmapped (the queue may use it until the process exits). Pages are touched lazily.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            bail!("mmap of a {total}-byte save area: {}", std::io::Error::last_os_error());
        }
        let mut alloc =
            Alloc { va_addr: base as u64, size: total, mmap_offset: base as u64, gpu_id, flags: USERPTR, handle: 0 };
        // SAFETY: ALLOC_MEMORY_OF_GPU's own argument; the USERPTR range is the mapping above.
        let ret = unsafe { ioctl(*kfd, ALLOC_MEMORY_OF_GPU, &mut alloc) };
        if ret != 0 {
            bail!("ALLOC_MEMORY_OF_GPU (USERPTR, {total} bytes) on gpu {gpu_id:#x}: {ret}");
        }
        // SAFETY: `header_only` is the caller's leaked header.
        let err_payload_addr = unsafe { (*header_only).err_payload_addr };
        // libhsakmt's fill_cwsr_header: a header at the start of each XCC's area, its debugger
        // area after all of them.
        for i in 0..sizes.num_xcc {
            let header = ContextSaveAreaHeader {
                debug_offset: (sizes.num_xcc - i) * sizes.cwsr_size,
                debug_size: sizes.debug_memory_size * sizes.num_xcc,
                err_payload_addr,
                ..Default::default()
            };
            // SAFETY: inside the mapping (i × cwsr_size + 40 bytes < total), 8-byte aligned.
            unsafe {
                base.cast::<u8>().add((i * sizes.cwsr_size) as usize).cast::<ContextSaveAreaHeader>().write(header);
            };
        }
        args.ctx_save_restore_address = base as u64;
        args.ctx_save_restore_size = sizes.cwsr_size;
        args.ctl_stack_size = sizes.ctl_stack_size;
        Ok(base.cast())
    }
}
