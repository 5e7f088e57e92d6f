//! GPU partitions as users see them: which package (PCI device) a KFD node belongs to, its index
//! among that package's nodes, and the package's compute partition mode.
//!
//! In DPX/QPX/CPX an MI300X is several KFD nodes, each with its own `gpu_id`, render node and HWS
//! runlist ("drm/amdkfd: Add spatial partitioning support in KFD", Linux 6.5), sharing the
//! package's `location_id` and `domain` (kfd_topology.c prints both from the one PCI function):
//! the nodes of a package are those with the same pair, in node order (kgd2kfd_device_init adds
//! them partition by partition). The mode is amdgpu's `current_compute_partition` attribute of
//! the PCI device ("SPX", "DPX", "TPX", "QPX", "CPX" and a newline: amdgpu_gfx.c
//! `amdgpu_gfx_get_current_compute_partition` → `amdgpu_gfx_compute_mode_desc`, Linux 6.5+ and
//! AMD's DKMS driver); GPUs without partitions (gfx90a and older, consumer parts) have no such
//! file, and the mode is then unknown.

use std::{collections::BTreeMap, fmt, fs, path::Path};

use serde::{Serialize, Serializer};

use super::topology::GpuNode;
use crate::domain::GpuId;

/// amdgpu's compute partition modes (`enum amdgpu_gfx_partition`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PartitionMode {
    Spx,
    Dpx,
    Tpx,
    Qpx,
    Cpx,
}

impl PartitionMode {
    /// The attribute's text (`"CPX\n"`); `None` for "UNKNOWN" or anything else.
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text.trim() {
            "SPX" => Self::Spx,
            "DPX" => Self::Dpx,
            "TPX" => Self::Tpx,
            "QPX" => Self::Qpx,
            "CPX" => Self::Cpx,
            _ => return None,
        })
    }

    /// As the JSON twins and the metric label write it (serde's name): `cpx`.
    pub fn key(self) -> &'static str {
        match self {
            Self::Spx => "spx",
            Self::Dpx => "dpx",
            Self::Tpx => "tpx",
            Self::Qpx => "qpx",
            Self::Cpx => "cpx",
        }
    }

    /// As amdgpu and amd-smi print it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Spx => "SPX",
            Self::Dpx => "DPX",
            Self::Tpx => "TPX",
            Self::Qpx => "QPX",
            Self::Cpx => "CPX",
        }
    }
}

/// A package by its PCI address: `domain` and `location_id` (bus << 8 | devfn) of its nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PackageId {
    pub domain: u32,
    pub location_id: u32,
}

impl fmt::Display for PackageId {
    /// The PCI address as `lspci -D` and amd-smi print it: `0000:03:00.0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (bus, devfn) = (self.location_id >> 8, self.location_id & 0xff);
        write!(f, "{:04x}:{:02x}:{:02x}.{:x}", self.domain, bus & 0xff, devfn >> 3, devfn & 7)
    }
}

impl Serialize for PackageId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// One KFD GPU node's place in its package.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Partition {
    /// The package's PCI address.
    pub package: PackageId,
    /// This node among the package's nodes, from 0.
    pub index: u32,
    /// The package's nodes.
    pub count: u32,
    /// The package's compute partition mode, where amdgpu exposes it.
    pub mode: Option<PartitionMode>,
}

impl Partition {
    /// For tables: `0000:03:00.0 CPX 1/8`; a package of one node with no mode shown is its
    /// address alone, `0000:03:00.0 SPX 0/1` otherwise.
    pub fn label(&self) -> String {
        match self.mode {
            None if self.count == 1 => self.package.to_string(),
            mode => format!("{} {} {}/{}", self.package, mode.map_or("?", PartitionMode::name), self.index, self.count),
        }
    }
}

/// Every GPU node's partition, by gpu id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Partitions(BTreeMap<GpuId, Partition>);

impl Partitions {
    /// The topology under `sys` (`/sys`); none when it cannot be read.
    pub fn read(sys: &Path) -> Self {
        Self::of(sys, &super::topology::gpu_nodes(sys).unwrap_or_default())
    }

    /// `nodes` (in node order) grouped into packages; the mode read under `sys`. A node without
    /// `location_id` or `domain` (kernels before 4.x printed neither) has no partition.
    pub fn of(sys: &Path, nodes: &[GpuNode]) -> Self {
        let mut packages: BTreeMap<PackageId, Vec<&GpuNode>> = BTreeMap::new();
        for n in nodes {
            if let (Some(domain), Some(location_id)) = (n.placement.domain, n.placement.location_id) {
                packages.entry(PackageId { domain, location_id }).or_default().push(n);
            }
        }
        let mut out = BTreeMap::new();
        for (package, mut members) in packages {
            members.sort_by_key(|n| n.node);
            let mode = mode(sys, package, members[0]);
            let count = members.len() as u32;
            for (index, n) in members.iter().enumerate() {
                out.insert(n.gpu_id, Partition { package, index: index as u32, count, mode });
            }
        }
        Self(out)
    }

    pub fn get(&self, gpu: GpuId) -> Option<&Partition> {
        self.0.get(&gpu)
    }

    /// `gpu`'s table label, `-` when unknown.
    pub fn label(&self, gpu: GpuId) -> String {
        self.get(gpu).map_or_else(|| "-".to_owned(), Partition::label)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&GpuId, &Partition)> {
        self.0.iter()
    }
}

/// `current_compute_partition` of the package: on its PCI device, else behind partition 0's
/// render node (the same PCI device; the emulator's `amdgpu_emu` platform device, which has no
/// PCI address, is found this way).
fn mode(sys: &Path, package: PackageId, first: &GpuNode) -> Option<PartitionMode> {
    const ATTR: &str = "current_compute_partition";
    let pci = sys.join("bus/pci/devices").join(package.to_string()).join(ATTR);
    let render = first
        .placement
        .drm_render_minor
        .filter(|&m| m > 0)
        .map(|m| sys.join(format!("class/drm/renderD{m}/device")).join(ATTR));
    [Some(pci), render].into_iter().flatten().find_map(|p| PartitionMode::parse(&fs::read_to_string(p).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::FakeHost;

    const NODES: &str = "sys/class/kfd/kfd/topology/nodes";

    fn node(host: &mut FakeHost, n: u32, gpu_id: u32, location_id: u32, minor: u32) {
        host.file(format!("{NODES}/{n}/gpu_id"), format!("{gpu_id}\n")).file(
            format!("{NODES}/{n}/properties"),
            format!("gfx_target_version 90402\nlocation_id {location_id}\ndrm_render_minor {minor}\ndomain 0\n"),
        );
    }

    /// Two CPX packages of 8 partitions (KFD nodes 1..16, the emulator's gpu ids) and one GPU of
    /// another kind without the attribute: each node's package, index and the package's mode.
    #[test]
    fn cpx_nodes_are_grouped_by_pci_location_with_their_index_and_mode() {
        let mut host = FakeHost::new();
        host.file(format!("{NODES}/0/gpu_id"), "0\n").file(format!("{NODES}/0/properties"), "cpu_cores_count 2\n");
        for k in 0..8 {
            node(&mut host, 1 + k, 0x1000 + k, 0x0300, 128 + k);
            node(&mut host, 9 + k, 0x2000 + k, 0x0400, 136 + k);
        }
        node(&mut host, 17, 0x3000, 0x0c08, 144);
        // Package 0x03 through its PCI device, package 0x04 through partition 0's render node.
        host.file("sys/bus/pci/devices/0000:03:00.0/current_compute_partition", "CPX\n")
            .file("sys/class/drm/renderD136/device/current_compute_partition", "CPX\n")
            // A later partition's render node is not the package's device.
            .file("sys/class/drm/renderD145/device/current_compute_partition", "SPX\n");
        let parts = Partitions::read(&host.path().join("sys"));
        let a = PackageId { domain: 0, location_id: 0x0300 };
        let b = PackageId { domain: 0, location_id: 0x0400 };
        let c = PackageId { domain: 0, location_id: 0x0c08 };
        assert_eq!(parts.iter().count(), 17);
        assert_eq!(
            parts.get(GpuId(0x1000)),
            Some(&Partition { package: a, index: 0, count: 8, mode: Some(PartitionMode::Cpx) })
        );
        assert_eq!(
            parts.get(GpuId(0x1001)),
            Some(&Partition { package: a, index: 1, count: 8, mode: Some(PartitionMode::Cpx) })
        );
        assert_eq!(
            parts.get(GpuId(0x2007)),
            Some(&Partition { package: b, index: 7, count: 8, mode: Some(PartitionMode::Cpx) })
        );
        assert_eq!(parts.get(GpuId(0x3000)), Some(&Partition { package: c, index: 0, count: 1, mode: None }));
        assert_eq!(parts.get(GpuId(0x4000)), None);
        assert_eq!(
            (parts.label(GpuId(0x1001)), parts.label(GpuId(0x2007)), parts.label(GpuId(0x3000)), parts.label(GpuId(1))),
            (
                "0000:03:00.0 CPX 1/8".to_owned(),
                "0000:04:00.0 CPX 7/8".to_owned(),
                "0000:0c:01.0".to_owned(),
                "-".to_owned()
            )
        );
        assert_eq!(
            serde_json::to_value(parts.get(GpuId(0x1001))).unwrap(),
            serde_json::json!({"package": "0000:03:00.0", "index": 1, "count": 8, "mode": "cpx"})
        );
    }

    #[test]
    fn the_attributes_text_and_pci_addresses() {
        let modes = ["SPX\n", "DPX\n", "TPX\n", "QPX\n", "CPX\n", "UNKNOWN\n", ""].map(PartitionMode::parse);
        use PartitionMode::*;
        assert_eq!(modes, [Some(Spx), Some(Dpx), Some(Tpx), Some(Qpx), Some(Cpx), None, None]);
        assert_eq!(PackageId { domain: 0x12, location_id: 0xc1_0d }.to_string(), "0012:c1:01.5");
        assert_eq!(
            Partition { package: PackageId { domain: 0, location_id: 0x300 }, index: 0, count: 1, mode: Some(Spx) }
                .label(),
            "0000:03:00.0 SPX 0/1"
        );
    }
}
