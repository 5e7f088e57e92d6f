//! The KFD topology in sysfs (`/sys/class/kfd/kfd/topology/nodes/<N>/`): which nodes are GPUs,
//! their gfx target version and, on kernels that export them, the CWSR sizes of a queue.
//!
//! `properties` is one `name value` pair per line (kfd_topology.c, every version). `cwsr_size`
//! and `ctl_stack_size` are properties since Linux 6.19 and 6.18.4 (stable cherry-pick of
//! "drm/amdkfd: Export the cwsr_size and ctl_stack_size to userspace", docs/kfd.md §4.4); before,
//! the driver kept them to itself and a suspend's saved state could only be estimated. Both are
//! **per XCC**: a queue's save area is that times the XCCs of the node ([`GpuNode::save_area`]).
//!
//! In a partitioned MI300X (DPX/QPX/CPX) each partition is a node of its own, with its own
//! `gpu_id` and `num_xcc` (Linux 6.5, "Add spatial partitioning support in KFD").

use std::{fs, io, path::Path};

use crate::domain::GpuId;

/// One GPU node of the topology.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuNode {
    /// The node directory's index (CPU nodes are counted too).
    pub node: u32,
    pub gpu_id: GpuId,
    /// `gfx_target_version` (e.g. 90402 for gfx942, 120001 for gfx1201).
    pub gfx_target_version: Option<u32>,
    /// `cwsr_size`: bytes of one XCC's context-save area (control stack + wave state), ≥ 6.18.4.
    pub cwsr_size: Option<u64>,
    /// `ctl_stack_size`: bytes of the control stack inside it, ≥ 6.18.4.
    pub ctl_stack_size: Option<u64>,
    /// `capability` (`HSA_CAP_*` bits of include/uapi/linux/kfd_sysfs.h).
    pub capability: Option<u32>,
    /// What [`GpuNode::save_area`] computes from: `num_xcc`, `simd_count`, `simd_per_cu`,
    /// `array_count`, `simd_arrays_per_engine`.
    pub shape: Shape,
    /// Where the node sits: its package's PCI address and its render node
    /// ([`crate::host::partition`] groups the partitions of a package by it).
    pub placement: Placement,
}

/// A node's PCI location and render node, as kfd_topology.c prints them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// `domain`: the PCI domain (`pci_domain_nr`).
    pub domain: Option<u32>,
    /// `location_id`: `pci_dev_id()`, bus << 8 | devfn. Every partition of a package has its
    /// package's (Linux 6.5+ spatial partitioning: the nodes share one PCI function).
    pub location_id: Option<u32>,
    /// `drm_render_minor`: `/dev/dri/renderD<minor>`; partition 0's is the PCI device's own
    /// render node (amdgpu_xcp.c `amdgpu_xcp_dev_alloc`: "xcp #0 shares drm device setting with
    /// adev"), the others' are `amdgpu_xcp` platform devices.
    pub drm_render_minor: Option<u32>,
}

/// The node properties the context-save size depends on (kfd_queue.c
/// `kfd_queue_ctx_save_restore_size`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    pub num_xcc: Option<u32>,
    pub simd_count: Option<u32>,
    pub simd_per_cu: Option<u32>,
    pub array_count: Option<u32>,
    pub simd_arrays_per_engine: Option<u32>,
}

/// `HSA_CAP_PER_QUEUE_RESET_SUPPORTED` (kfd_sysfs.h, added with per-queue reset for gfx9 HWS in
/// 6.12; withheld on SR-IOV VFs): a preemption timeout resets only the hung queue.
pub const HSA_CAP_PER_QUEUE_RESET_SUPPORTED: u32 = 0x8000_0000;

/// `DEBUGGER_BYTES_PER_WAVE` / `DEBUGGER_BYTES_ALIGN` (kfd_queue.c): the debugger's per-wave
/// area after each XCC's save area, which sysfs does not export.
const DEBUGGER_BYTES_PER_WAVE: u64 = 32;
const DEBUGGER_BYTES_ALIGN: u64 = 64;
/// `PAGE_SIZE` on x86-64: the kernel aligns the total up to it.
const PAGE_SIZE: u64 = 4096;

impl GpuNode {
    /// Whether a preemption timeout resets just the stuck queue (capability bit 31), as sysfs says.
    pub fn per_queue_reset(&self) -> Option<bool> {
        self.capability.map(|c| c & HSA_CAP_PER_QUEUE_RESET_SUPPORTED != 0)
    }

    /// The save area one queue of this node needs, in bytes: `ALIGN((cwsr_size + debug_memory_size)
    /// × NUM_XCC, PAGE_SIZE)`, as `kfd_queue_acquire_buffers` checks it (kfd_queue.c, upstream
    /// 2025-2026; the same sum as libhsakmt's `update_ctx_save_restore_size`). `debug_memory_size`
    /// is not in sysfs: `ALIGN(waves × 32, 64)` with waves as `kfd_queue_ctx_save_restore_size`
    /// counts them — gfx < 10.1: `min(cu × 40, array_count / simd_arrays_per_engine × 512)`, else
    /// `cu × 32`, with `cu = simd_count / simd_per_cu / num_xcc` per XCC. sysfs prints
    /// `array_count` summed over the XCCs, so it is divided by `num_xcc` here. None without
    /// `cwsr_size` (before 6.18.4) or the shape.
    pub fn save_area(&self) -> Option<u64> {
        let cwsr = self.cwsr_size?;
        let s = self.shape;
        let xcc = u64::from(s.num_xcc.filter(|&n| n > 0)?);
        let cu = u64::from(s.simd_count?) / u64::from(s.simd_per_cu.filter(|&n| n > 0)?) / xcc;
        let waves = if self.gfx_target_version? < 100_100 {
            let arrays = u64::from(s.array_count?) / xcc / u64::from(s.simd_arrays_per_engine.filter(|&n| n > 0)?);
            (cu * 40).min(arrays * 512)
        } else {
            cu * 32
        };
        let debug = (waves * DEBUGGER_BYTES_PER_WAVE).next_multiple_of(DEBUGGER_BYTES_ALIGN);
        Some(((cwsr + debug) * xcc).next_multiple_of(PAGE_SIZE))
    }

    /// gfx12 (RDNA4): the GPUs whose "expert scheduling" kernels need KFD 1.20's trap handler.
    pub fn is_gfx12(&self) -> bool {
        self.gfx_target_version.is_some_and(|v| (120_000..130_000).contains(&v))
    }
}

/// `name value` lines → the value of `name`.
fn property(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut words = l.split_whitespace();
        (words.next() == Some(name)).then(|| words.next()?.parse().ok()).flatten()
    })
}

/// Every GPU node under `sys` (`/sys`), by node index. CPU nodes (`gpu_id` 0) are left out.
pub fn gpu_nodes(sys: &Path) -> io::Result<Vec<GpuNode>> {
    let mut nodes = Vec::new();
    for entry in fs::read_dir(sys.join("class/kfd/kfd/topology/nodes"))? {
        let dir = entry?.path();
        let Some(node) = dir.file_name().and_then(|n| n.to_str()).and_then(|n| n.parse().ok()) else { continue };
        // A node can vanish while it is read (hot unplug): skip what is not there.
        let Ok(id) = fs::read_to_string(dir.join("gpu_id")) else { continue };
        let Ok(gpu_id) = id.trim().parse::<u32>() else { continue };
        if gpu_id == 0 {
            continue;
        }
        let props = fs::read_to_string(dir.join("properties")).unwrap_or_default();
        let u32_of = |name: &str| property(&props, name).and_then(|v| u32::try_from(v).ok());
        nodes.push(GpuNode {
            node,
            gpu_id: GpuId(gpu_id),
            gfx_target_version: u32_of("gfx_target_version"),
            cwsr_size: property(&props, "cwsr_size"),
            ctl_stack_size: property(&props, "ctl_stack_size"),
            capability: u32_of("capability"),
            shape: Shape {
                num_xcc: u32_of("num_xcc"),
                simd_count: u32_of("simd_count"),
                simd_per_cu: u32_of("simd_per_cu"),
                array_count: u32_of("array_count"),
                simd_arrays_per_engine: u32_of("simd_arrays_per_engine"),
            },
            placement: Placement {
                domain: u32_of("domain"),
                location_id: u32_of("location_id"),
                drm_render_minor: u32_of("drm_render_minor"),
            },
        });
    }
    nodes.sort_by_key(|n| n.node);
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::FakeHost;

    #[test]
    fn gpu_nodes_with_and_without_the_cwsr_properties() {
        let mut host = FakeHost::new();
        let nodes = "sys/class/kfd/kfd/topology/nodes";
        host.file(format!("{nodes}/0/gpu_id"), "0\n")
            .file(format!("{nodes}/0/properties"), "cpu_cores_count 2\nsimd_count 0\n")
            .file(format!("{nodes}/1/gpu_id"), "4096\n")
            .file(format!("{nodes}/1/properties"), "simd_count 8\ngfx_target_version 90400\ncapability 2147483648\n")
            .file(format!("{nodes}/2/gpu_id"), "8192\n")
            .file(
                format!("{nodes}/2/properties"),
                "gfx_target_version 120001\ncwsr_size 2138112\nctl_stack_size 20480\nlocation_id 3072\n\
                 drm_render_minor 129\ndomain 1\n",
            );
        let gpus = gpu_nodes(&host.path().join("sys")).unwrap();
        assert_eq!(
            gpus,
            [
                GpuNode {
                    node: 1,
                    gpu_id: GpuId(0x1000),
                    gfx_target_version: Some(90400),
                    cwsr_size: None,
                    ctl_stack_size: None,
                    capability: Some(0x8000_0000),
                    shape: Shape { simd_count: Some(8), ..Shape::default() },
                    placement: Placement::default(),
                },
                GpuNode {
                    node: 2,
                    gpu_id: GpuId(0x2000),
                    gfx_target_version: Some(120_001),
                    cwsr_size: Some(2_138_112),
                    ctl_stack_size: Some(20480),
                    capability: None,
                    shape: Shape::default(),
                    placement: Placement { domain: Some(1), location_id: Some(0x0c00), drm_render_minor: Some(129) },
                },
            ]
        );
        assert!(!gpus[0].is_gfx12());
        assert!(gpus[1].is_gfx12());
        assert_eq!((gpus[0].per_queue_reset(), gpus[1].per_queue_reset()), (Some(true), None));
        assert_eq!((gpus[0].save_area(), gpus[1].save_area()), (None, None));
    }

    /// MI300X properties (gpuq's SPX mock, docs/kfd.md §4.4) and the per-XCC `cwsr_size`
    /// 23203840 a 6.18.4+ kernel exports: an SPX queue needs 177.4 MiB and a CPX partition's
    /// 22.2 MiB, not the 22.1 MiB per XCC sysfs shows.
    #[test]
    fn mi300x_save_area_per_queue_is_per_xcc_size_plus_debug_times_xccs() {
        let mi300x = |num_xcc: u32| GpuNode {
            node: 1,
            gpu_id: GpuId(0x1000),
            gfx_target_version: Some(90402),
            cwsr_size: Some(23_203_840),
            ctl_stack_size: Some(12_288),
            capability: Some(746_037_888),
            shape: Shape {
                num_xcc: Some(num_xcc),
                simd_count: Some(152 * num_xcc),
                simd_per_cu: Some(4),
                array_count: Some(4 * num_xcc),
                simd_arrays_per_engine: Some(1),
            },
            placement: Placement::default(),
        };
        // 38 CUs per XCC → 1520 waves → debug area 48640 B per XCC; (23203840 + 48640) × XCCs,
        // page-aligned (SPX's 186019840 is a whole number of pages, DPX's and CPX's are not).
        assert_eq!(mi300x(8).save_area(), Some(186_019_840));
        assert_eq!(mi300x(4).save_area(), Some(93_011_968));
        assert_eq!(mi300x(1).save_area(), Some(23_252_992));
        // 0x2C77A280: bit 31 clear in that capture.
        assert_eq!(mi300x(8).per_queue_reset(), Some(false));
        // gfx12 (≥ 10.1): 32 waves per CU; a page-aligned total.
        let rdna4 = GpuNode {
            gfx_target_version: Some(120_001),
            cwsr_size: Some(2_138_112),
            shape: Shape { num_xcc: Some(1), simd_count: Some(64), simd_per_cu: Some(2), ..Shape::default() },
            ..mi300x(1)
        };
        // 32 CUs → 1024 waves → 32768 debug bytes; 2138112 + 32768 is 530 pages.
        assert_eq!(rdna4.save_area(), Some(2_170_880));
    }

    #[test]
    fn no_topology_is_an_error_and_cpu_only_is_empty() {
        let mut host = FakeHost::new();
        assert!(gpu_nodes(&host.path().join("sys")).is_err());
        host.file("sys/class/kfd/kfd/topology/nodes/0/gpu_id", "0\n");
        assert_eq!(gpu_nodes(&host.path().join("sys")).unwrap(), []);
    }
}
