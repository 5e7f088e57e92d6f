//! Where gpreempt reads the host's state. Each root stands for a live path and may point at a
//! captured tree instead (unit tests, `gpreempt ps --sysfs-root/--proc-root`, `doctor
//! --sysfs-root/--debugfs-root`), so every reader of `/proc`, `/sys`, Docker's state or KFD's
//! debugfs takes a [`Roots`] rather than a hard-coded path.

use std::path::PathBuf;

use crate::host::cri::CriSocket;

/// The usual procfs mount point.
pub const PROC_ROOT: &str = "/proc";
/// Docker's default data root (`dockerd --data-root`).
pub const DOCKER_ROOT: &str = "/var/lib/docker";
/// Where containers/storage (Podman, Buildah, CRI-O) keeps its container records with the overlay
/// driver, as root: under the default graphroot (`/var/lib/containers/storage`) and, for
/// transient stores, the default runroot (`/run/containers/storage`).
pub const CONTAINERS_STORAGE: [&str; 2] =
    ["/var/lib/containers/storage/overlay-containers", "/run/containers/storage/overlay-containers"];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Roots {
    /// Stands for `/proc`.
    pub proc: PathBuf,
    /// Stands for `/sys` (KFD's per-process tree is `class/kfd/kfd/proc`, module BTF `kernel/btf`).
    pub sys: PathBuf,
    /// Stands for `/var/lib/docker` (container names).
    pub docker: PathBuf,
    /// Stand for [`CONTAINERS_STORAGE`] (Podman's container names).
    pub containers_storage: Vec<PathBuf>,
    /// Stands for `/sys/kernel/debug/kfd` (`mqds`, `hqds`, `rls`; root only).
    pub debugfs_kfd: PathBuf,
    /// The node's CRI runtime (pod labels): `--cri-socket`, or the kubelet's default sockets.
    pub cri: CriSocket,
}

impl Default for Roots {
    fn default() -> Self {
        Self {
            proc: PROC_ROOT.into(),
            sys: "/sys".into(),
            docker: DOCKER_ROOT.into(),
            containers_storage: CONTAINERS_STORAGE.iter().map(PathBuf::from).collect(),
            debugfs_kfd: "/sys/kernel/debug/kfd".into(),
            cri: CriSocket::node(),
        }
    }
}

impl Roots {
    /// `/sys/class/kfd/kfd/proc`: one directory per KFD process (docs/kfd.md §4.1).
    pub fn kfd_proc(&self) -> PathBuf {
        self.sys.join("class/kfd/kfd/proc")
    }
}
