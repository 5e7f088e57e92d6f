//! The KFD topology in sysfs (`/sys/class/kfd/kfd/topology/nodes/<N>/`): which nodes are GPUs,
//! their gfx target version and, on kernels that export them, the CWSR sizes of a queue.
//!
//! `properties` is one `name value` pair per line (kfd_topology.c, every version). `cwsr_size`
//! and `ctl_stack_size` are properties since Linux 6.19 (docs/kfd.md §4.4); before, the driver
//! kept them to itself and a suspend's saved state could only be estimated.

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
    /// Bytes of the CWSR save area per queue (wave state saved at preemption), ≥ 6.19.
    pub cwsr_size: Option<u64>,
    /// Bytes of the control stack inside it, ≥ 6.19.
    pub ctl_stack_size: Option<u64>,
}

impl GpuNode {
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
        nodes.push(GpuNode {
            node,
            gpu_id: GpuId(gpu_id),
            gfx_target_version: property(&props, "gfx_target_version").and_then(|v| u32::try_from(v).ok()),
            cwsr_size: property(&props, "cwsr_size"),
            ctl_stack_size: property(&props, "ctl_stack_size"),
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
            .file(format!("{nodes}/1/properties"), "simd_count 8\ngfx_target_version 90400\n")
            .file(format!("{nodes}/2/gpu_id"), "8192\n")
            .file(
                format!("{nodes}/2/properties"),
                "gfx_target_version 120001\ncwsr_size 2138112\nctl_stack_size 20480\n",
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
                    ctl_stack_size: None
                },
                GpuNode {
                    node: 2,
                    gpu_id: GpuId(0x2000),
                    gfx_target_version: Some(120_001),
                    cwsr_size: Some(2_138_112),
                    ctl_stack_size: Some(20480)
                },
            ]
        );
        assert!(!gpus[0].is_gfx12());
        assert!(gpus[1].is_gfx12());
    }

    #[test]
    fn no_topology_is_an_error_and_cpu_only_is_empty() {
        let mut host = FakeHost::new();
        assert!(gpu_nodes(&host.path().join("sys")).is_err());
        host.file("sys/class/kfd/kfd/topology/nodes/0/gpu_id", "0\n");
        assert_eq!(gpu_nodes(&host.path().join("sys")).unwrap(), []);
    }
}
