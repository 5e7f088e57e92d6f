//! What the library's unit tests build their inputs from: [`FakeHost`], a host tree of the files
//! gpreempt reads (`/sys`, `/proc`, Docker's state) in a temporary directory, and the builders of
//! traced events ([`ev`] with [`create`], [`suspend`] or a KFD [`call`]).

use std::{
    fs,
    path::{Path, PathBuf},
};

use gpreempt_common::record::KfdFn;
use tempfile::TempDir;

use crate::{
    domain::{GpuId, HostPid, QueueId, QueueType},
    event::{Event, EventKind, KernelResult, KfdCall, QueueCreate, QueueSuspend},
    host::roots::Roots,
    kfd::uapi::QueueOutcome,
};

/// A fake host in a temporary directory, laid out as the host's roots: `sys/` for `/sys`, `proc/`
/// for `/proc`, `docker/` for `/var/lib/docker` (see [`FakeHost::roots`]). The directory lives as
/// long as the `FakeHost`: keep it bound while the test reads from it.
pub(crate) struct FakeHost {
    dir: TempDir,
}

impl FakeHost {
    /// The pasid [`FakeHost::kfd_process`] writes.
    pub(crate) const PASID: &'static str = "32770\n";

    pub(crate) fn new() -> Self {
        Self { dir: tempfile::tempdir().expect("tempdir") }
    }

    /// The tree's top: `sys/`, `proc/` and `docker/` are under it, and anything else a test lays
    /// out beside them (the kubelet's and the runtimes' state, debugfs).
    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `sys`, `proc` and `docker` in this tree; debugfs stays the live default.
    pub(crate) fn roots(&self) -> Roots {
        let r = self.path();
        Roots {
            sys: r.join("sys"),
            proc: r.join("proc"),
            docker: r.join("docker"),
            containers_storage: vec![r.join("containers/storage/overlay-containers")],
            // The runtimes' sockets are looked for in the tree too (a test may bind one there).
            cri: crate::host::cri::CriSocket::Discover(r.to_path_buf()),
            ..Roots::default()
        }
    }

    /// KFD's per-process tree in this host (`sys/class/kfd/kfd/proc`).
    pub(crate) fn kfd_proc(&self) -> PathBuf {
        self.roots().kfd_proc()
    }

    /// Writes `text` to `rel` (relative to [`FakeHost::path`]), creating the parent directories;
    /// an existing file is replaced.
    pub(crate) fn file(&mut self, rel: impl AsRef<Path>, text: impl AsRef<[u8]>) -> &mut Self {
        let path = self.path().join(rel);
        fs::create_dir_all(path.parent().expect("a file under the tree")).expect("create parent");
        fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        self
    }

    /// Creates the directory `rel` (and its parents), empty unless it exists already.
    pub(crate) fn dir(&mut self, rel: impl AsRef<Path>) -> &mut Self {
        fs::create_dir_all(self.path().join(rel)).expect("create dir");
        self
    }

    /// A KFD process: `sys/class/kfd/kfd/proc/<pid>/pasid` holding [`FakeHost::PASID`].
    pub(crate) fn kfd_process(&mut self, pid: u32) -> &mut Self {
        self.kfd_file(pid, "pasid", Self::PASID)
    }

    /// `sys/class/kfd/kfd/proc/<pid>/<rel>` (`queues/<id>/size`, `vram_<gpu>`, …).
    pub(crate) fn kfd_file(&mut self, pid: u32, rel: &str, text: &str) -> &mut Self {
        self.file(format!("sys/class/kfd/kfd/proc/{pid}/{rel}"), text)
    }

    /// `/proc/<pid>`: `comm` (the name and a newline, as the kernel prints it), `status` and
    /// `cgroup` as given.
    pub(crate) fn process(&mut self, pid: u32, comm: &str, status: &str, cgroup: &str) -> &mut Self {
        self.file(format!("proc/{pid}/comm"), format!("{comm}\n"))
            .file(format!("proc/{pid}/status"), status)
            .file(format!("proc/{pid}/cgroup"), cgroup)
    }

    /// Docker's record of container `id`: `docker/containers/<id>/config.v2.json`.
    pub(crate) fn docker_container(&mut self, id: &str, config_v2_json: &str) -> &mut Self {
        self.file(format!("docker/containers/{id}/config.v2.json"), config_v2_json)
    }
}

/// An event of `pid` (comm `p<pid>`) at `ts_ns` on CPU 0.
pub(crate) fn ev(pid: u32, ts_ns: u64, kind: EventKind) -> Event {
    Event { ts_ns, entry_ns: ts_ns, cpu: 0, pid: HostPid(pid), tid: pid, comm: format!("p{pid}"), kind }
}

/// A successful AQL compute queue creation; its read and write pointers are distinct per queue id.
pub(crate) fn create(queue_id: u32, gpu_id: u32) -> EventKind {
    EventKind::QueueCreate(QueueCreate {
        queue_id: Some(QueueId(queue_id)),
        context_id: None,
        gpu_id: GpuId(gpu_id),
        queue_type: QueueType::ComputeAql,
        priority: 7,
        percentage: 100,
        ring_base: 0x1000,
        ring_size: 4096,
        // Distinct per queue, as ROCr's amd_queue_t fields are.
        read_pointer: 0x7f00_0000_0080 + u64::from(queue_id) * 0x1000,
        write_pointer: 0x7f00_0000_0038 + u64::from(queue_id) * 0x1000,
        doorbell_offset: Some(0),
        eop_buffer: 0,
        eop_buffer_size: 0,
        cwsr_address: 0,
        cwsr_size: 0,
        ctl_stack_size: 0,
        result: KernelResult(0),
        ret: 0,
    })
}

/// [`create`] in secondary KFD context `context_id` (Linux 7.0: its queue ids are its own).
pub(crate) fn create_in(context_id: u16, queue_id: u32, gpu_id: u32) -> EventKind {
    match create(queue_id, gpu_id) {
        EventKind::QueueCreate(c) => EventKind::QueueCreate(QueueCreate { context_id: Some(context_id), ..c }),
        other => other,
    }
}

/// SUSPEND_QUEUES (or RESUME_QUEUES if `resume`) of `target`'s queues; `ids` are the raw
/// per-queue results, bit 31 marking a queue the kernel did not handle.
pub(crate) fn suspend(target: u32, ids: &[u32], resume: bool) -> EventKind {
    let s = QueueSuspend {
        target_pid: Some(HostPid(target)),
        num_queues: ids.len() as u32,
        grace_period: None,
        exception_clear_mask: None,
        queues: ids.iter().map(|&raw| QueueOutcome::from_raw(raw)).collect(),
        handled: Some(ids.iter().filter(|&&r| r >> 31 == 0).count() as u32),
        result: KernelResult(0),
        ret: 0,
    };
    if resume { EventKind::ResumeQueues(s) } else { EventKind::SuspendQueues(s) }
}

/// A successful call of the KFD function `function` by thread `tid` (comm `dbg`), entered at
/// `start` and returned at `end`.
pub(crate) fn call(tid: u32, function: KfdFn, gpu: Option<u32>, start: u64, end: u64) -> Event {
    Event {
        ts_ns: end,
        entry_ns: start,
        cpu: 0,
        pid: HostPid(tid),
        tid,
        comm: "dbg".into(),
        kind: EventKind::KfdCall(KfdCall {
            function: function.name(),
            kfd_fn: function,
            owner_pid: None,
            gpu_id: gpu.map(GpuId),
            trigger: None,
            filter: None,
            filter_param: None,
            grace_period: None,
            fence_value: None,
            timeout_ms: None,
            result: KernelResult(0),
            ret: 0,
        }),
    }
}
