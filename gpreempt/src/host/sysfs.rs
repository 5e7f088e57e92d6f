//! The KFD per-process sysfs tree `/sys/class/kfd/kfd/proc/<pid>/` (docs/kfd.md §4.1).
//!
//! Everything here is world-readable (mode 0444), so this works without root and without opening `/dev/kfd`.
//! Directories appear and disappear while we read them (processes open/close `/dev/kfd`, queues are created and
//! destroyed), so a vanished file is normal: a process that disappears is [`SysfsError::Gone`], a single bad file
//! only costs its field plus a note.

use std::{
    collections::BTreeSet,
    fs, io,
    path::{Path, PathBuf},
};

use super::{kernel_queue_type::KernelQueueType, partition::Partition};
use crate::{
    domain::{GpuId, HostPid, QueueId},
    kfd::features::QueueTypeNumbering,
};

/// Where the KFD publishes one directory per `kfd_process`.
pub const KFD_PROC_ROOT: &str = "/sys/class/kfd/kfd/proc";

/// Kernel `enum kfd_queue_type` values that are the same in 6.1, 6.12 and 7.x. Everything above SDMA was
/// renumbered when DIQ was removed in 7.0 (docs/kfd.md §4.1): [`SysfsQueue::type_name_in`] names those under a
/// detected numbering, [`SysfsQueue::type_name`] only as numbers.
const KERNEL_QUEUE_TYPE_COMPUTE: u32 = 0;
const KERNEL_QUEUE_TYPE_SDMA: u32 = 1;
/// A secondary context's directory inside its primary's: `context_%u` of its `context_id` (Linux 7.0,
/// `kfd_create_process_sysfs`: `kobject_init_and_add(..., primary_process->kobj, "context_%u", context_id)`, commit
/// fac682a1d1af of the CREATE_PROCESS series; patch text read on amd-gfx, Reviewed-by Felix Kuehling).
/// Inside it the same files as a primary's: `pasid`, `queues/<id>/`, `vram_<gpuid>`, `stats_<gpuid>/`.
const CONTEXT_PREFIX: &str = "context_";

#[derive(Debug, thiserror::Error)]
pub enum SysfsError {
    #[error("{} does not exist: the KFD driver is not loaded (run `modprobe amdgpu`) or the path is wrong", .0.display())]
    NotLoaded(PathBuf),
    #[error("process {0} has no KFD sysfs directory any more (it exited or its kfd_process was released)")]
    Gone(HostPid),
    #[error("cannot read {}: {cause}", path.display())]
    Io { path: PathBuf, cause: io::Error },
}

/// One `kfd_process`, as sysfs shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SysfsProcess {
    /// Host TGID (the directory name is `p->lead_thread->pid` in the init pid namespace, not a container pid).
    pub pid: HostPid,
    /// `None` (shown as unknown) when unreadable or when the kernel prints 0: from 6.14 the PASID is per device
    /// (commit 8544374c0f82, "Have kfd driver use same PASID values from graphic driver") and this file keeps
    /// printing `0` for old tools; 0 is never an allocated PASID.
    pub pasid: Option<u32>,
    /// Sorted by `queue_id`.
    pub queues: Vec<SysfsQueue>,
    /// Sorted by `gpu_id`.
    pub gpus: Vec<SysfsGpu>,
    /// Human-readable problems with single files ("queues/3/type: unreadable: ...").
    pub notes: Vec<String>,
}

/// Which KFD context of a process a queue belongs to. Queue ids are per context (each `kfd_process` has its own
/// queue manager, ids 0..1023), so a queue is named by (context, id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KfdContext {
    /// The context `kfd_open` made: `proc/<pid>/`, the only one before Linux 7.0 and the only one the debug trap
    /// reaches (a pid resolves to it).
    Primary,
    /// A context `AMDKFD_IOC_CREATE_PROCESS` made (Linux 7.0): `proc/<pid>/context_<id>/`, id 0..0xFFFE.
    Secondary(u16),
}

/// `queues/<queue_id>/`: one user-mode queue of the process.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SysfsQueue {
    /// The context whose `queues/` directory lists it.
    pub context: KfdContext,
    pub queue_id: QueueId,
    /// Topology gpu_id (`gpuid`, decimal).
    pub gpu_id: Option<GpuId>,
    /// Raw kernel `enum kfd_queue_type` (`type`); see [`SysfsQueue::type_name`].
    pub kernel_type: Option<u32>,
    /// Ring buffer size in bytes (`size`).
    pub ring_size: Option<u64>,
}

impl SysfsQueue {
    /// "compute" or "sdma" for the two values every kernel agrees on, "type N" for the others (their meaning
    /// depends on the kernel version), "unknown" when the file could not be read.
    pub fn type_name(&self) -> String {
        match self.kernel_type {
            Some(KERNEL_QUEUE_TYPE_COMPUTE) => "compute".to_string(),
            Some(KERNEL_QUEUE_TYPE_SDMA) => "sdma".to_string(),
            Some(n) => format!("type {n}"),
            None => "unknown".to_string(),
        }
    }

    /// The kernel queue type's name under `numbering` (docs/kfd.md §4.1), [`SysfsQueue::type_name`] without one.
    pub fn type_name_in(&self, numbering: Option<QueueTypeNumbering>) -> String {
        match (self.kernel_type, numbering) {
            (Some(raw), Some(numbering)) => match KernelQueueType::decode(raw, numbering) {
                Some(t) => t.name().to_owned(),
                None => format!("type {raw}"),
            },
            _ => self.type_name(),
        }
    }
}

/// Per-GPU files of a process (`vram_<gpuid>`, `sdma_<gpuid>`, `stats_<gpuid>/`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SysfsGpu {
    pub gpu_id: GpuId,
    /// VRAM allocated by the process on this GPU, bytes.
    pub vram_bytes: Option<u64>,
    /// SDMA activity, µs. Reading it makes the kernel run a work item that reads the user rptrs.
    pub sdma_us: Option<u64>,
    /// Cumulative time the process' queues were evicted, ms, jiffy resolution. Only the eviction path (TTM, SVM,
    /// userptr, suspend, CRIU, VM fault) adds to it; debugger suspends do not.
    pub evicted_ms: Option<u64>,
    /// CUs occupied by the process' waves at the moment of reading. The file only exists where the kernel has a
    /// `get_cu_occupancy` callback (gfx9+), so its absence is not noted.
    pub cu_occupancy: Option<i64>,
    /// The GPU's package, index and mode: not in the process's directory but in the topology
    /// ([`crate::host::partition::Partitions`]), filled in by the views that show it.
    pub partition: Option<Partition>,
}

/// Host pids that currently have a `kfd_process`, sorted.
pub fn list_pids(root: &Path) -> Result<Vec<HostPid>, SysfsError> {
    let entries = fs::read_dir(root).map_err(|e| match e.kind() {
        // The proc directory is created when the driver loads, even with no process using it.
        io::ErrorKind::NotFound => SysfsError::NotLoaded(root.to_path_buf()),
        _ => SysfsError::Io { path: root.to_path_buf(), cause: e },
    })?;
    let mut pids = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| SysfsError::Io { path: root.to_path_buf(), cause: e })?;
        if let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) {
            pids.push(HostPid(pid));
        }
    }
    pids.sort_unstable();
    Ok(pids)
}

/// The secondary KFD contexts of `pid` (its `context_<id>` directories), sorted; empty on kernels before 7.0 and
/// for a process that never called `AMDKFD_IOC_CREATE_PROCESS`. Secondaries die with their file (kfd_release), so
/// this is what exists now.
pub fn secondary_contexts(root: &Path, pid: HostPid) -> Result<Vec<u16>, SysfsError> {
    let dir = root.join(pid.to_string());
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(SysfsError::Gone(pid)),
        Err(e) => return Err(SysfsError::Io { path: dir, cause: e }),
    };
    let mut ids = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| SysfsError::Io { path: dir.clone(), cause: e })?;
        if let Some(id) = entry.file_name().to_str().and_then(|n| n.strip_prefix(CONTEXT_PREFIX)?.parse::<u16>().ok()) {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// Everything sysfs says about one process.
pub fn read_process(root: &Path, pid: HostPid) -> Result<SysfsProcess, SysfsError> {
    let dir = root.join(pid.to_string());
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(SysfsError::Gone(pid)),
        Err(e) => return Err(SysfsError::Io { path: dir, cause: e }),
    };
    let mut notes = Vec::new();

    // The gpus are only discoverable from file names: one vram_/sdma_/stats_ set per process-device (pdd).
    let mut gpu_ids = BTreeSet::new();
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                notes.push(format!("{}: listing failed: {e}", dir.display()));
                break;
            }
        };
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(suffix) = ["vram_", "sdma_", "stats_"].iter().find_map(|prefix| name.strip_prefix(prefix)) else {
            continue;
        };
        match suffix.parse::<u32>() {
            Ok(gpu_id) => {
                gpu_ids.insert(GpuId(gpu_id));
            }
            Err(_) => notes.push(format!("{name}: gpu id is not a decimal number")),
        }
    }

    let pasid = read_number::<u32>(&dir, "pasid", Presence::Expected, &mut notes).filter(|&pasid| pasid != 0);
    let mut queues = read_queues(&dir, KfdContext::Primary, &mut notes);
    // Queues of secondary contexts (7.0+) are keyed by their context: their ids repeat the primary's.
    for id in secondary_contexts(root, pid).unwrap_or_default() {
        let context_dir = dir.join(format!("{CONTEXT_PREFIX}{id}"));
        let mut context_notes = Vec::new();
        queues.extend(read_queues(&context_dir, KfdContext::Secondary(id), &mut context_notes));
        notes.extend(context_notes.into_iter().map(|n| format!("{CONTEXT_PREFIX}{id}/{n}")));
    }
    let gpus = gpu_ids.into_iter().map(|gpu_id| read_gpu(&dir, gpu_id, &mut notes)).collect();

    // The kernel removes the whole directory when the kfd_process is released; if that happened while we were
    // reading, the notes are just a list of "missing" files, so report the process as gone instead.
    if !dir.is_dir() {
        return Err(SysfsError::Gone(pid));
    }
    Ok(SysfsProcess { pid, pasid, queues, gpus, notes })
}

/// Every process under `root`, plus notes for processes that could not be read (e.g. exited during the scan). A
/// missing root gives no processes and the error message as the only note.
pub fn read_all(root: &Path) -> (Vec<SysfsProcess>, Vec<String>) {
    let pids = match list_pids(root) {
        Ok(pids) => pids,
        Err(e) => return (Vec::new(), vec![e.to_string()]),
    };
    let mut processes = Vec::with_capacity(pids.len());
    let mut notes = Vec::new();
    for pid in pids {
        match read_process(root, pid) {
            Ok(process) => processes.push(process),
            Err(SysfsError::Gone(_)) => notes.push(format!("pid {pid}: exited during the scan")),
            Err(e) => notes.push(format!("pid {pid}: {e}")),
        }
    }
    (processes, notes)
}

fn read_queues(dir: &Path, context: KfdContext, notes: &mut Vec<String>) -> Vec<SysfsQueue> {
    let queues_dir = dir.join("queues");
    let entries = match fs::read_dir(&queues_dir) {
        Ok(entries) => entries,
        Err(e) => {
            // Created together with `pasid` in kfd_create_process, so its absence is worth a note.
            notes.push(format!("queues: {}", describe_io(&e)));
            return Vec::new();
        }
    };
    let mut queue_ids = Vec::new();
    for entry in entries {
        match entry {
            Ok(entry) => match entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) {
                Some(queue_id) => queue_ids.push(QueueId(queue_id)),
                None => notes.push(format!("queues/{}: not a queue id", entry.file_name().to_string_lossy())),
            },
            Err(e) => {
                notes.push(format!("queues: listing failed: {e}"));
                break;
            }
        }
    }
    queue_ids.sort_unstable();

    let mut queues = Vec::with_capacity(queue_ids.len());
    for queue_id in queue_ids {
        let rel = format!("queues/{queue_id}");
        // A queue destroyed while we read it takes its directory with it (kfd_procfs_del_queue): drop it quietly
        // rather than reporting three missing files.
        let mut queue_notes = Vec::new();
        let queue = SysfsQueue {
            context,
            queue_id,
            gpu_id: read_number(dir, &format!("{rel}/gpuid"), Presence::Expected, &mut queue_notes).map(GpuId),
            kernel_type: read_number(dir, &format!("{rel}/type"), Presence::Expected, &mut queue_notes),
            ring_size: read_number(dir, &format!("{rel}/size"), Presence::Expected, &mut queue_notes),
        };
        if dir.join(&rel).is_dir() {
            notes.append(&mut queue_notes);
            queues.push(queue);
        }
    }
    queues
}

fn read_gpu(dir: &Path, gpu_id: GpuId, notes: &mut Vec<String>) -> SysfsGpu {
    SysfsGpu {
        gpu_id,
        vram_bytes: read_number(dir, &format!("vram_{gpu_id}"), Presence::Expected, notes),
        sdma_us: read_number(dir, &format!("sdma_{gpu_id}"), Presence::Expected, notes),
        evicted_ms: read_number(dir, &format!("stats_{gpu_id}/evicted_ms"), Presence::Expected, notes),
        cu_occupancy: read_number(dir, &format!("stats_{gpu_id}/cu_occupancy"), Presence::Optional, notes),
        partition: None,
    }
}

/// Whether a missing file deserves a note.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Presence {
    /// Every kernel creates it alongside its siblings.
    Expected,
    /// Depends on the GPU generation.
    Optional,
}

/// Parses `dir/rel` as one number; any problem becomes `None` and a note naming `rel`.
fn read_number<T: std::str::FromStr>(dir: &Path, rel: &str, presence: Presence, notes: &mut Vec<String>) -> Option<T> {
    let bytes = match fs::read(dir.join(rel)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound && presence == Presence::Optional => return None,
        Err(e) => {
            notes.push(format!("{rel}: {}", describe_io(&e)));
            return None;
        }
    };
    let text = String::from_utf8_lossy(&bytes);
    // Queue files have no trailing newline, the per-process and per-GPU ones end in "\n" (docs/kfd.md §4.1); trim both
    // plus NULs so either form (and a padded buffer) parses.
    let trimmed = text.trim_matches(|c: char| c.is_whitespace() || c == '\0');
    match trimmed.parse::<T>() {
        Ok(value) => Some(value),
        Err(_) => {
            notes.push(format!("{rel}: garbled: {trimmed:?}"));
            None
        }
    }
}

fn describe_io(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::NotFound => "missing".to_string(),
        _ => format!("unreadable: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::FakeHost;

    /// Two processes as a 6.12 kernel shows them: 1234 with three queues on two GPUs (53394 is a gfx9+ part with
    /// cu_occupancy and SVM counters, 20347 is not), and 5678 as printed by a newer kernel (pasid 0), no queues.
    /// The tests read its [`FakeHost::kfd_proc`].
    fn fake_tree() -> FakeHost {
        let mut host = FakeHost::new();
        host.kfd_file(1234, "pasid", "32770\n")
            // Queue files are printed without a trailing newline.
            .kfd_file(1234, "queues/0/size", "1048576")
            .kfd_file(1234, "queues/0/type", "0")
            .kfd_file(1234, "queues/0/gpuid", "53394")
            .kfd_file(1234, "queues/1/size", "524288")
            .kfd_file(1234, "queues/1/type", "1")
            .kfd_file(1234, "queues/1/gpuid", "53394")
            .kfd_file(1234, "queues/12/size", "65536")
            .kfd_file(1234, "queues/12/type", "4")
            .kfd_file(1234, "queues/12/gpuid", "20347")
            .kfd_file(1234, "vram_53394", "268435456\n")
            .kfd_file(1234, "sdma_53394", "1500\n")
            .kfd_file(1234, "stats_53394/evicted_ms", "120\n")
            .kfd_file(1234, "stats_53394/cu_occupancy", "24\n")
            .kfd_file(1234, "counters_53394/faults", "7\n")
            .kfd_file(1234, "counters_53394/page_in", "3\n")
            .kfd_file(1234, "counters_53394/page_out", "1\n")
            .kfd_file(1234, "vram_20347", "0\n")
            .kfd_file(1234, "sdma_20347", "0\n")
            .kfd_file(1234, "stats_20347/evicted_ms", "0\n")
            .kfd_file(5678, "pasid", "0\n")
            .dir("sys/class/kfd/kfd/proc/5678/queues")
            .kfd_file(5678, "vram_20347", "4096\n")
            .kfd_file(5678, "sdma_20347", "0\n")
            .kfd_file(5678, "stats_20347/evicted_ms", "35\n");
        host
    }

    #[test]
    fn list_pids_sorted_and_skips_non_numeric() {
        let mut host = fake_tree();
        host.dir("sys/class/kfd/kfd/proc/not-a-pid").dir("sys/class/kfd/kfd/proc/99");
        assert_eq!(list_pids(&host.kfd_proc()).expect("list"), [99, 1234, 5678].map(HostPid));
    }

    #[test]
    fn reads_every_value_of_a_real_looking_tree() {
        let host = fake_tree();
        let root = host.kfd_proc();
        let p = read_process(&root, HostPid(1234)).expect("read 1234");
        assert_eq!(
            p,
            SysfsProcess {
                pid: HostPid(1234),
                pasid: Some(32770),
                queues: vec![
                    SysfsQueue {
                        context: KfdContext::Primary,
                        queue_id: QueueId(0),
                        gpu_id: Some(GpuId(53394)),
                        kernel_type: Some(0),
                        ring_size: Some(1048576)
                    },
                    SysfsQueue {
                        context: KfdContext::Primary,
                        queue_id: QueueId(1),
                        gpu_id: Some(GpuId(53394)),
                        kernel_type: Some(1),
                        ring_size: Some(524288)
                    },
                    SysfsQueue {
                        context: KfdContext::Primary,
                        queue_id: QueueId(12),
                        gpu_id: Some(GpuId(20347)),
                        kernel_type: Some(4),
                        ring_size: Some(65536)
                    },
                ],
                gpus: vec![
                    SysfsGpu {
                        gpu_id: GpuId(20347),
                        vram_bytes: Some(0),
                        sdma_us: Some(0),
                        evicted_ms: Some(0),
                        cu_occupancy: None,
                        partition: None,
                    },
                    SysfsGpu {
                        gpu_id: GpuId(53394),
                        vram_bytes: Some(268435456),
                        sdma_us: Some(1500),
                        evicted_ms: Some(120),
                        cu_occupancy: Some(24),
                        partition: None,
                    },
                ],
                notes: vec![],
            }
        );
        let names: Vec<String> = p.queues.iter().map(SysfsQueue::type_name).collect();
        assert_eq!(names, ["compute", "sdma", "type 4"]);

        let q = read_process(&root, HostPid(5678)).expect("read 5678");
        assert_eq!(
            q,
            SysfsProcess {
                pid: HostPid(5678),
                pasid: None,
                queues: vec![],
                gpus: vec![SysfsGpu {
                    gpu_id: GpuId(20347),
                    vram_bytes: Some(4096),
                    sdma_us: Some(0),
                    evicted_ms: Some(35),
                    cu_occupancy: None,
                    partition: None,
                }],
                notes: vec![],
            }
        );
    }

    /// A 7.x process with a secondary context: `context_0/queues/0` is a queue of its own, keyed by its context
    /// (queue ids are per context), and the context is listed; a 6.12 tree has none.
    #[test]
    fn secondary_context_queues_are_keyed_by_context() {
        let mut host = fake_tree();
        host.kfd_file(1234, "context_0/pasid", "0\n")
            .kfd_file(1234, "context_0/queues/0/size", "4096")
            .kfd_file(1234, "context_0/queues/0/type", "3")
            .kfd_file(1234, "context_0/queues/0/gpuid", "53394")
            .dir("sys/class/kfd/kfd/proc/1234/context_7/queues")
            .dir("sys/class/kfd/kfd/proc/1234/context_x");
        let root = host.kfd_proc();
        assert_eq!(secondary_contexts(&root, HostPid(1234)).unwrap(), [0, 7]);
        assert_eq!(secondary_contexts(&root, HostPid(5678)).unwrap(), [] as [u16; 0]);
        assert!(matches!(secondary_contexts(&root, HostPid(9)), Err(SysfsError::Gone(HostPid(9)))));
        let p = read_process(&root, HostPid(1234)).expect("read");
        let keys: Vec<(KfdContext, QueueId)> = p.queues.iter().map(|q| (q.context, q.queue_id)).collect();
        assert_eq!(
            keys,
            [
                (KfdContext::Primary, QueueId(0)),
                (KfdContext::Primary, QueueId(1)),
                (KfdContext::Primary, QueueId(12)),
                (KfdContext::Secondary(0), QueueId(0)),
            ]
        );
        assert_eq!(p.queues[3].type_name_in(Some(QueueTypeNumbering::WithoutDiq)), "sdma-xgmi");
        assert!(p.notes.is_empty(), "{:?}", p.notes);
    }

    /// The same raw `type` names differently on 6.12 and 7.x; without a detected numbering only 0 and 1 are named.
    #[test]
    fn queue_type_names_follow_the_numbering() {
        let q = |raw| SysfsQueue {
            context: KfdContext::Primary,
            queue_id: QueueId(0),
            gpu_id: None,
            kernel_type: Some(raw),
            ring_size: None,
        };
        let names = |numbering| [0, 1, 3, 4, 5].map(|raw| q(raw).type_name_in(numbering));
        assert_eq!(names(Some(QueueTypeNumbering::WithDiq)), ["compute", "sdma", "diq", "sdma-xgmi", "sdma-by-eng-id"]);
        assert_eq!(
            names(Some(QueueTypeNumbering::WithoutDiq)),
            ["compute", "sdma", "sdma-xgmi", "sdma-by-eng-id", "type 5"]
        );
        assert_eq!(names(None), ["compute", "sdma", "type 3", "type 4", "type 5"]);
    }

    #[test]
    fn read_all_returns_both_processes() {
        let host = fake_tree();
        let (processes, notes) = read_all(&host.kfd_proc());
        assert_eq!(processes.iter().map(|p| p.pid).collect::<Vec<_>>(), [1234, 5678].map(HostPid));
        assert!(notes.is_empty(), "{notes:?}");
    }

    #[test]
    fn garbled_type_is_none_plus_note() {
        let mut host = fake_tree();
        host.kfd_file(1234, "queues/1/type", "x1\0");
        let p = read_process(&host.kfd_proc(), HostPid(1234)).expect("read");
        assert_eq!(
            p.queues[1],
            SysfsQueue {
                context: KfdContext::Primary,
                queue_id: QueueId(1),
                gpu_id: Some(GpuId(53394)),
                kernel_type: None,
                ring_size: Some(524288)
            }
        );
        assert_eq!(p.queues[1].type_name(), "unknown");
        assert_eq!(p.notes, ["queues/1/type: garbled: \"x1\""]);
    }

    #[test]
    fn unreadable_and_missing_files_are_noted() {
        let mut host = fake_tree();
        let root = host.kfd_proc();
        fs::remove_file(root.join("1234/queues/0/size")).expect("rm");
        host.dir("sys/class/kfd/kfd/proc/1234/queues/0/size"); // read() of a directory fails with EISDIR
        fs::remove_file(root.join("1234/sdma_20347")).expect("rm");
        let p = read_process(&root, HostPid(1234)).expect("read");
        assert_eq!(p.queues[0].ring_size, None);
        assert_eq!(p.gpus[0].sdma_us, None);
        assert_eq!(p.notes, ["queues/0/size: unreadable: Is a directory (os error 21)", "sdma_20347: missing"]);
    }

    #[test]
    fn whitespace_and_nul_are_trimmed() {
        let mut host = fake_tree();
        host.kfd_file(1234, "vram_53394", " 42 \n\0\0");
        let p = read_process(&host.kfd_proc(), HostPid(1234)).expect("read");
        assert_eq!(p.gpus[1].vram_bytes, Some(42));
        assert!(p.notes.is_empty(), "{:?}", p.notes);
    }

    #[test]
    fn process_removed_after_listing_is_gone() {
        let host = fake_tree();
        let root = host.kfd_proc();
        let pids = list_pids(&root).expect("list");
        assert!(pids.contains(&HostPid(5678)));
        fs::remove_dir_all(root.join("5678")).expect("rm");
        let err = read_process(&root, HostPid(5678)).expect_err("must be gone");
        assert!(matches!(err, SysfsError::Gone(HostPid(5678))), "{err:?}");
    }

    #[test]
    fn missing_root_says_modprobe() {
        // A host without KFD: nothing under sys/class/kfd.
        let host = FakeHost::new();
        let root = host.kfd_proc();
        let err = list_pids(&root).expect_err("root is missing");
        assert!(matches!(err, SysfsError::NotLoaded(_)), "{err:?}");
        assert!(err.to_string().contains("modprobe amdgpu"), "{err}");
        let (processes, notes) = read_all(&root);
        assert!(processes.is_empty());
        assert_eq!(notes.len(), 1);
        assert!(notes[0].contains("modprobe amdgpu"), "{notes:?}");
    }
}
