//! The process view behind `gpreempt ps`: every KFD process from sysfs, with its identity from
//! /proc (comm, container, pid inside the container). A process that exits mid-scan or a file
//! that cannot be read becomes a note on that item, never a failure of the whole scan.

use serde::Serialize;

use super::procinfo::{self, ProcInfo};
use crate::domain::HostPid;
use crate::host::k8s::{K8sRoots, PodRef};
use crate::host::roots::Roots;
use crate::host::sysfs::{self, SysfsProcess};

/// One KFD process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KfdProcess {
    #[serde(flatten)]
    pub sysfs: SysfsProcess,
    /// Identity from /proc; `None` when /proc has no such pid (another pid namespace, a captured tree).
    pub info: Option<ProcInfo>,
    /// The Kubernetes pod its container belongs to, when the node's files say
    /// ([`K8sRoots::identify`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
    /// The container's name in its pod's spec (Kubernetes), when the runtime's record says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_name: Option<String>,
}

impl KfdProcess {
    pub fn pid(&self) -> HostPid {
        self.sysfs.pid
    }

    /// Does `filter` (a container name, a full id or an id prefix, or a Kubernetes container's
    /// name) name this process's container?
    pub fn in_container(&self, filter: &str) -> bool {
        self.info.as_ref().and_then(|i| i.container.as_ref()).is_some_and(|c| c.matches(filter))
            || self.container_name.as_deref() == Some(filter)
    }
}

/// Every KFD process now, plus notes on what could not be read.
pub fn scan(roots: &Roots) -> (Vec<KfdProcess>, Vec<String>) {
    let (processes, mut notes) = sysfs::read_all(&roots.kfd_proc());
    let k8s = K8sRoots::beside(roots);
    let processes = processes
        .into_iter()
        .map(|sysfs| {
            let info = match procinfo::read_with(roots, sysfs.pid) {
                Ok(info) => Some(info),
                Err(e) => {
                    notes.push(format!("pid {}: {e}", sysfs.pid));
                    None
                }
            };
            let pod = info.as_ref().and_then(|i| i.container.as_ref()).and_then(|c| k8s.identify(c));
            let container_name = pod.as_ref().and_then(|p| p.container.clone());
            KfdProcess { sysfs, info, pod, container_name }
        })
        .collect();
    (processes, notes)
}

/// The pids under the KFD sysfs tree now (for `--wait-new`).
pub fn pids(roots: &Roots) -> Result<Vec<HostPid>, sysfs::SysfsError> {
    sysfs::list_pids(&roots.kfd_proc())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        domain::{GpuId, QueueId},
        test_support::FakeHost,
    };

    const DOCKER_ID: &str = "3f1b6c0f5e2d4a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b";

    /// A host with one containerised KFD process (pid 94314, pid 17 in its container) with two
    /// compute queues on gpu 63420, and one KFD process that has already left /proc.
    fn host() -> FakeHost {
        let mut host = FakeHost::new();
        host.kfd_process(94314);
        for (q, size) in [(0, "1048576"), (1, "65536")] {
            host.kfd_file(94314, &format!("queues/{q}/gpuid"), "63420")
                .kfd_file(94314, &format!("queues/{q}/type"), "0")
                .kfd_file(94314, &format!("queues/{q}/size"), size);
        }
        host.kfd_file(94314, "vram_63420", "268435456\n")
            .kfd_file(94314, "sdma_63420", "0\n")
            .kfd_file(94314, "stats_63420/evicted_ms", "120\n")
            .kfd_file(94314, "stats_63420/cu_occupancy", "24\n")
            .kfd_file(555, "pasid", "32771\n")
            .process(
                94314,
                "python3",
                "Name:\tpython3\nNSpid:\t94314\t17\n",
                &format!("0::/system.slice/docker-{DOCKER_ID}.scope\n"),
            )
            .docker_container(DOCKER_ID, r#"{"ID":"x","Name":"/trainer"}"#);
        host
    }

    #[test]
    fn joins_sysfs_queues_with_container_identity() {
        let host = host();
        let roots = host.roots();
        let (ps, notes) = scan(&roots);
        assert_eq!(ps.len(), 2);
        let p = ps.iter().find(|p| p.pid() == HostPid(94314)).unwrap();
        assert_eq!(p.sysfs.queues.iter().map(|q| q.queue_id).collect::<Vec<_>>(), [0, 1].map(QueueId));
        assert_eq!(p.sysfs.queues[0].ring_size, Some(1_048_576));
        assert_eq!(p.sysfs.gpus[0].gpu_id, GpuId(63420));
        assert_eq!(p.sysfs.gpus[0].evicted_ms, Some(120));
        assert_eq!(p.sysfs.gpus[0].cu_occupancy, Some(24));
        let info = p.info.as_ref().unwrap();
        assert_eq!((info.comm.as_deref(), info.ns_pid), (Some("python3"), Some(17)));
        let c = info.container.as_ref().unwrap();
        assert_eq!((c.id.as_str(), c.name.as_deref()), (DOCKER_ID, Some("trainer")));
        assert!(p.in_container("trainer"));
        assert!(p.in_container("3f1b6c0f5e2d"));
        assert!(!p.in_container("other"));
        assert!(!p.in_container(""));
        let gone = ps.iter().find(|p| p.pid() == HostPid(555)).unwrap();
        assert_eq!(gone.info, None);
        assert_eq!(notes.len(), 1);
        assert!(notes[0].starts_with("pid 555: no process 555"), "{notes:?}");
        assert_eq!(pids(&roots).unwrap(), [555, 94314].map(HostPid));
    }
}
