//! The host's facts a report carries, so that figures sent back can be told apart: the kernel,
//! the KFD ioctl version, each GPU of the KFD topology (its gpu id, the node's `name` and its gfx
//! target), and the ROCm libraries the evaluated processes have mapped (their file names carry
//! the versions: `libamdhip64.so.6.1.60100`, `/opt/rocm-6.1.0/…`).

use std::{collections::BTreeSet, fs, path::Path};

use serde::Serialize;

use crate::{
    domain::{GpuId, HostPid},
    host::{roots::Roots, topology},
    kfd::device::Device,
};

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct HostFacts {
    /// `uname -r`.
    pub kernel: Option<String>,
    pub kfd_version: Option<String>,
    pub gpus: Vec<GpuFacts>,
    pub processes: Vec<ProcessFacts>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuFacts {
    pub gpu_id: GpuId,
    /// The topology node's `name` (the ASIC name the driver gives it).
    pub name: Option<String>,
    /// The gfx target (`gfx942`), from `gfx_target_version`.
    pub gfx: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProcessFacts {
    pub pid: HostPid,
    /// `online` or `offline`.
    pub role: &'static str,
    pub comm: Option<String>,
    /// ROCm libraries and install directories in its memory map.
    pub rocm: Vec<String>,
}

/// `gfx_target_version` (major·10000 + minor·100 + stepping) as the target's name: 90402 →
/// gfx942, 90010 → gfx90a, 120001 → gfx1201 (minor and stepping are hexadecimal digits).
pub fn gfx_name(version: u32) -> String {
    format!("gfx{}{:x}{:x}", version / 10_000, (version / 100) % 100, version % 100)
}

/// ROCm's traces in `/proc/PID/maps` text: the HIP and ROCr library files and `/opt/rocm-X.Y.Z`.
pub fn rocm_in_maps(maps: &str) -> Vec<String> {
    let mut found = BTreeSet::new();
    for path in maps.lines().filter_map(|l| l.split_whitespace().nth(5)) {
        let file = path.rsplit('/').next().unwrap_or(path);
        if file.starts_with("libamdhip64.so") || file.starts_with("libhsa-runtime64.so") {
            found.insert(file.to_owned());
        }
        if let Some(dir) = path.split('/').find(|c| c.starts_with("rocm-")) {
            found.insert(format!("/opt/{dir}"));
        }
    }
    found.into_iter().collect()
}

fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty())
}

/// The facts of this host, and of `processes` (pid, role).
pub fn collect(roots: &Roots, device: &Path, processes: &[(HostPid, &'static str)]) -> HostFacts {
    let kernel = read_trimmed(&roots.proc.join("sys/kernel/osrelease"));
    let kfd_version = Device::open_path(device).ok().and_then(|d| d.version().ok()).map(|v| v.to_string());
    let nodes = topology::gpu_nodes(&roots.sys).unwrap_or_default();
    let gpus = nodes
        .iter()
        .map(|n| GpuFacts {
            gpu_id: n.gpu_id,
            name: read_trimmed(&roots.sys.join(format!("class/kfd/kfd/topology/nodes/{}/name", n.node))),
            gfx: n.gfx_target_version.filter(|&v| v > 0).map(gfx_name),
        })
        .collect();
    let processes = processes
        .iter()
        .map(|&(pid, role)| {
            let dir = roots.proc.join(pid.0.to_string());
            ProcessFacts {
                pid,
                role,
                comm: read_trimmed(&dir.join("comm")),
                rocm: fs::read_to_string(dir.join("maps")).map(|m| rocm_in_maps(&m)).unwrap_or_default(),
            }
        })
        .collect();
    HostFacts { kernel, kfd_version, gpus, processes }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::FakeHost;

    #[test]
    fn gfx_targets_are_named_as_rocm_names_them() {
        assert_eq!(gfx_name(90402), "gfx942");
        assert_eq!(gfx_name(90010), "gfx90a");
        assert_eq!(gfx_name(120001), "gfx1201");
        assert_eq!(gfx_name(110000), "gfx1100");
    }

    #[test]
    fn rocm_versions_come_from_the_mapped_files() {
        let maps = "7f00-7f10 r-xp 00000000 08:01 123 /opt/rocm-6.1.0/lib/libamdhip64.so.6.1.60100\n\
                    7f10-7f20 r-xp 00000000 08:01 124 /opt/rocm-6.1.0/lib/libhsa-runtime64.so.1.13.60100\n\
                    7f20-7f30 r-xp 00000000 08:01 125 /usr/lib/x86_64-linux-gnu/libc.so.6\n\
                    7f30-7f40 rw-p 00000000 00:00 0 \n";
        assert_eq!(
            rocm_in_maps(maps),
            ["/opt/rocm-6.1.0", "libamdhip64.so.6.1.60100", "libhsa-runtime64.so.1.13.60100"]
        );
        assert!(rocm_in_maps("").is_empty());
    }

    #[test]
    fn facts_of_a_fake_host() {
        let mut host = FakeHost::new();
        let nodes = "sys/class/kfd/kfd/topology/nodes";
        host.file("proc/sys/kernel/osrelease", "6.12.0-emu\n")
            .file(format!("{nodes}/0/gpu_id"), "0\n")
            .file(format!("{nodes}/1/gpu_id"), "4096\n")
            .file(format!("{nodes}/1/name"), "aldebaran\n")
            .file(format!("{nodes}/1/properties"), "gfx_target_version 90010\n")
            .file("proc/42/comm", "python3\n")
            .file("proc/42/maps", "1-2 r-xp 0 0:0 1 /opt/rocm-6.2.4/lib/libamdhip64.so.6.2.60204\n");
        let roots = host.roots();
        let f = collect(&roots, Path::new("/nonexistent/kfd"), &[(HostPid(42), "offline")]);
        assert_eq!(f.kernel.as_deref(), Some("6.12.0-emu"));
        assert_eq!(f.kfd_version, None);
        assert_eq!(
            f.gpus,
            [GpuFacts { gpu_id: GpuId(4096), name: Some("aldebaran".into()), gfx: Some("gfx90a".into()) }]
        );
        assert_eq!(f.processes[0].comm.as_deref(), Some("python3"));
        assert_eq!(f.processes[0].rocm, ["/opt/rocm-6.2.4", "libamdhip64.so.6.2.60204"]);
    }
}
