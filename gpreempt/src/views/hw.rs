//! The hardware view behind `gpreempt ps --hw`: per GPU, KFD's queues (sysfs) vs the MQDs KFD
//! holds (debugfs `mqds`) vs the hardware queue slots that are active (debugfs `hqds`).
//!
//! On a multi-XCC GPU every compute queue is mapped once per XCC (MI300X/MI308X: 4 XCCs, so
//! MQD:HQD = 1:4 in `fixtures/debugfs-mi308x`). Fewer active slots than MQDs × XCCs means queues
//! are not mapped right now: suspended, evicted, or left out of an oversubscribed runlist.

use std::{collections::BTreeMap, fs, path::Path};

use serde::Serialize;

use crate::domain::{GpuId, HostPid};
use crate::host::debugfs::{self, HqdNode, MqdProcess, MqdQueueKind, RunlistNode};
use crate::host::processes::KfdProcess;

/// What the HWS runlist of one GPU (debugfs `rls`) maps, counted by PM4 packet.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Runlist {
    /// `No active runlist` in debugfs: HWS has nothing mapped (idle GPU, or every queue unmapped).
    pub active: bool,
    pub dwords: usize,
    /// MAP_PROCESS packets: processes in the runlist.
    pub processes: usize,
    /// MAP_QUEUES packets: queues in the runlist (compute and SDMA).
    pub queues: usize,
    /// RUN_LIST packets (a chained runlist, used when HWS is oversubscribed).
    pub chained: usize,
    /// Dwords that did not decode as type-3 packets (a truncated or unknown IB).
    pub undecoded: usize,
}

// PM4 type-3 opcodes (kfd_pm4_opcodes.h, 6.1–6.12).
const IT_MAP_PROCESS: u32 = 0xA1;
const IT_MAP_QUEUES: u32 = 0xA2;
const IT_RUN_LIST: u32 = 0xA5;

/// Walk the runlist IB: each packet is a type-3 header (type in bits 31:30, body dwords − 1 in
/// bits 29:16, opcode in bits 15:8) followed by its body (`pm_build_pm4_header`, 6.12).
pub fn decode_runlist(node: &RunlistNode) -> Runlist {
    let Some(ib) = &node.runlist else { return Runlist::default() };
    let mut r = Runlist { active: true, dwords: ib.len(), ..Runlist::default() };
    let mut i = 0;
    while i < ib.len() {
        let header = ib[i];
        if header >> 30 != 3 {
            r.undecoded += ib.len() - i;
            break;
        }
        let body = ((header >> 16) & 0x3fff) as usize + 1;
        match (header >> 8) & 0xff {
            IT_MAP_PROCESS => r.processes += 1,
            IT_MAP_QUEUES => r.queues += 1,
            IT_RUN_LIST => r.chained += 1,
            _ => {}
        }
        if i + 1 + body > ib.len() {
            r.undecoded += ib.len() - i;
            break;
        }
        i += 1 + body;
    }
    r
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuHw {
    pub gpu_id: GpuId,
    /// Compute queues KFD lists in sysfs for this GPU (all processes).
    pub kfd_compute_queues: usize,
    /// Compute MQDs in debugfs `mqds` (one per queue, however many per-XCC dumps follow).
    pub mqd_compute_queues: usize,
    /// XCC instances in debugfs `hqds` (1 on GPUs without the `Inst N,` prefix).
    pub xccs: usize,
    pub active_compute_slots: usize,
    pub active_hiqs: usize,
    /// The HWS runlist from debugfs `rls` (`None` when not read).
    pub runlist: Option<Runlist>,
    /// Problems found; empty when the three views agree.
    pub findings: Vec<String>,
}

/// One process as debugfs `mqds` lists it: its pid and its queues per GPU. This is all that names
/// the processes when only debugfs is at hand (a capture without sysfs, or a process sysfs lost).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MqdOwner {
    pub pid: HostPid,
    /// By gpu id, ascending.
    pub gpus: Vec<MqdOwnerGpu>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MqdOwnerGpu {
    pub gpu_id: GpuId,
    pub compute: usize,
    pub sdma: usize,
    /// DIQ and `Bad … queue type` entries.
    pub other: usize,
}

/// The processes of `mqds`, in the file's order, with their queues counted per GPU.
pub fn mqd_owners(mqds: &[MqdProcess]) -> Vec<MqdOwner> {
    mqds.iter()
        .map(|p| {
            let mut gpus: BTreeMap<GpuId, MqdOwnerGpu> = BTreeMap::new();
            for q in &p.queues {
                let g = gpus.entry(q.gpu_id).or_insert_with(|| MqdOwnerGpu { gpu_id: q.gpu_id, ..Default::default() });
                match q.kind {
                    MqdQueueKind::Compute => g.compute += 1,
                    MqdQueueKind::Sdma => g.sdma += 1,
                    MqdQueueKind::Diq | MqdQueueKind::Bad(_) | MqdQueueKind::BadKernel(_) => g.other += 1,
                }
            }
            MqdOwner { pid: p.pid, gpus: gpus.into_values().collect() }
        })
        .collect()
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HwView {
    pub gpus: Vec<GpuHw>,
    /// Every process debugfs `mqds` lists.
    pub mqd_processes: Vec<MqdOwner>,
    pub notes: Vec<String>,
}

/// Compare the three views per GPU.
pub fn compare(processes: &[KfdProcess], mqds: &[MqdProcess], hqds: &[HqdNode], rls: &[RunlistNode]) -> Vec<GpuHw> {
    let mut kfd: BTreeMap<GpuId, usize> = BTreeMap::new();
    for q in processes.iter().flat_map(|p| &p.sysfs.queues) {
        // Kernel enum value 0 is COMPUTE on every version (docs/kfd.md §1); others moved after 6.12.
        if let (Some(gpu), Some(0)) = (q.gpu_id, q.kernel_type) {
            *kfd.entry(gpu).or_default() += 1;
        }
    }
    let mut mqd: BTreeMap<GpuId, usize> = BTreeMap::new();
    for q in mqds.iter().flat_map(|p| &p.queues) {
        if q.kind == MqdQueueKind::Compute {
            *mqd.entry(q.gpu_id).or_default() += 1;
        }
    }
    let mut gpus: Vec<GpuId> = kfd.keys().chain(mqd.keys()).copied().chain(hqds.iter().map(|n| n.gpu_id)).collect();
    gpus.sort_unstable();
    gpus.dedup();
    gpus.into_iter()
        .map(|gpu_id| {
            let node = hqds.iter().find(|n| n.gpu_id == gpu_id);
            let kfd_compute_queues = kfd.get(&gpu_id).copied().unwrap_or(0);
            let mqd_compute_queues = mqd.get(&gpu_id).copied().unwrap_or(0);
            let xccs = node.map_or(1, |n| n.xcc_count().max(1));
            let active_compute_slots = node.map_or(0, HqdNode::active_compute_slots);
            let mut findings = Vec::new();
            if kfd_compute_queues != mqd_compute_queues {
                findings.push(format!(
                    "sysfs lists {kfd_compute_queues} compute queues but debugfs mqds has {mqd_compute_queues} (a process started or exited between the reads, or a hidden process)"
                ));
            }
            let expected = mqd_compute_queues * xccs;
            if node.is_some() && active_compute_slots != expected {
                findings.push(format!(
                    "{active_compute_slots} active compute HQD slots for {mqd_compute_queues} MQDs on {xccs} XCCs (expected {expected}, MQD:HQD 1:{xccs}): {}",
                    if active_compute_slots < expected {
                        "some queues are not mapped (suspended, evicted, or an oversubscribed runlist)"
                    } else {
                        "slots are held by queues KFD does not list"
                    }
                ));
            }
            GpuHw {
                gpu_id,
                kfd_compute_queues,
                mqd_compute_queues,
                xccs,
                active_compute_slots,
                active_hiqs: node.map_or(0, HqdNode::active_hiqs),
                runlist: rls.iter().find(|n| n.gpu_id == gpu_id).map(decode_runlist),
                findings,
            }
        })
        .collect()
}

/// Read `DEBUGFS/kfd/{mqds,hqds}` and compare; a missing or unparsable file is a note.
pub fn view(debugfs_root: &Path, processes: &[KfdProcess]) -> HwView {
    let mut notes = Vec::new();
    let dir = debugfs_root.join("kfd");
    let mut read = |name: &str| match fs::read_to_string(dir.join(name)) {
        Ok(text) => Some(text),
        Err(e) => {
            notes.push(format!(
                "{}: {e} (mount debugfs and run as root: `mount -t debugfs none /sys/kernel/debug`)",
                dir.join(name).display()
            ));
            None
        }
    };
    let (mqds_text, hqds_text, rls_text) = (read("mqds"), read("hqds"), read("rls"));
    let mqds = mqds_text.map(|t| debugfs::parse_mqds(&t)).transpose().unwrap_or_else(|e| {
        notes.push(format!("mqds: {e}"));
        None
    });
    let hqds = hqds_text.map(|t| debugfs::parse_hqds(&t)).transpose().unwrap_or_else(|e| {
        notes.push(format!("hqds: {e}"));
        None
    });
    let rls = rls_text.map(|t| debugfs::parse_rls(&t)).transpose().unwrap_or_else(|e| {
        notes.push(format!("rls: {e}"));
        None
    });
    let gpus = match (&mqds, &hqds) {
        (None, None) => Vec::new(),
        _ => compare(
            processes,
            mqds.as_deref().unwrap_or(&[]),
            hqds.as_deref().unwrap_or(&[]),
            rls.as_deref().unwrap_or(&[]),
        ),
    };
    let mqd_processes = mqds.as_deref().map(mqd_owners).unwrap_or_default();
    HwView { gpus, mqd_processes, notes }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        domain::QueueId,
        host::sysfs::{SysfsProcess, SysfsQueue},
    };

    fn fixture(name: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/debugfs-mi308x").join(name);
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The process of the capture: 5 compute queues on gpu 0xf7bc (ids are not in debugfs).
    fn process(queues: u32) -> KfdProcess {
        KfdProcess {
            sysfs: SysfsProcess {
                pid: HostPid(94314),
                pasid: None,
                queues: (0..queues)
                    .map(|id| SysfsQueue {
                        context: crate::host::sysfs::KfdContext::Primary,
                        queue_id: QueueId(id),
                        gpu_id: Some(GpuId(0xf7bc)),
                        kernel_type: Some(0),
                        ring_size: None,
                    })
                    .collect(),
                gpus: vec![],
                notes: vec![],
            },
            info: None,
            pod: None,
            container_name: None,
        }
    }

    #[test]
    fn the_mi308x_capture_is_consistent_at_1_to_4() {
        let mqds = debugfs::parse_mqds(&fixture("mqds_active.txt")).unwrap();
        let hqds = debugfs::parse_hqds(&fixture("hqds_active.txt")).unwrap();
        let gpus = compare(&[process(5)], &mqds, &hqds, &[]);
        assert_eq!(gpus.len(), 8);
        let g = gpus.iter().find(|g| g.gpu_id == GpuId(0xf7bc)).unwrap();
        assert_eq!(
            (g.kfd_compute_queues, g.mqd_compute_queues, g.xccs, g.active_compute_slots, g.active_hiqs),
            (5, 5, 4, 20, 4)
        );
        assert!(g.findings.is_empty(), "{:?}", g.findings);
        assert_eq!(gpus.iter().map(|g| g.active_hiqs).sum::<usize>(), 32);
    }

    #[test]
    fn unmapped_queues_and_sysfs_mismatches_are_flagged() {
        let mqds = debugfs::parse_mqds(&fixture("mqds_active.txt")).unwrap();
        // The HQDs after the process exited: 0 active slots while 5 MQDs are listed.
        let hqds = debugfs::parse_hqds(&fixture("hqds_after_exit.txt")).unwrap();
        let gpus = compare(&[process(6)], &mqds, &hqds, &[]);
        let g = gpus.iter().find(|g| g.gpu_id == GpuId(0xf7bc)).unwrap();
        assert_eq!(g.active_compute_slots, 0);
        assert_eq!(g.findings.len(), 2);
        assert!(g.findings[0].starts_with("sysfs lists 6 compute queues but debugfs mqds has 5"));
        assert!(g.findings[1].starts_with("0 active compute HQD slots for 5 MQDs on 4 XCCs (expected 20"));
    }

    #[test]
    fn the_capture_names_its_process_and_its_queues_per_gpu() {
        let mqds = debugfs::parse_mqds(&fixture("mqds_active.txt")).unwrap();
        assert_eq!(
            mqd_owners(&mqds),
            [MqdOwner {
                pid: HostPid(94314),
                gpus: vec![MqdOwnerGpu { gpu_id: GpuId(0xf7bc), compute: 5, sdma: 0, other: 0 }]
            }]
        );
    }

    #[test]
    fn a_missing_debugfs_is_a_note_not_a_failure() {
        let v = view(Path::new("/nonexistent-debugfs"), &[]);
        assert!(v.gpus.is_empty());
        assert_eq!(v.notes.len(), 3, "mqds, hqds and rls");
        assert!(v.notes[0].contains("mount -t debugfs"));
    }

    #[test]
    fn runlists_are_counted_by_pm4_packet() {
        // type 3 | (body-1) << 16 | opcode << 8
        let h = |op: u32, body: u32| 3 << 30 | (body - 1) << 16 | op << 8;
        let mut ib = vec![h(IT_MAP_PROCESS, 3), 0, 0, 0];
        ib.extend([h(IT_MAP_QUEUES, 2), 0, 0, h(IT_MAP_QUEUES, 2), 0, 0, h(IT_RUN_LIST, 1), 0]);
        let node = RunlistNode { node: 1, gpu_id: GpuId(0xf7bc), runlist: Some(ib) };
        assert_eq!(
            decode_runlist(&node),
            Runlist { active: true, dwords: 12, processes: 1, queues: 2, chained: 1, undecoded: 0 }
        );
        let truncated = RunlistNode { node: 1, gpu_id: GpuId(1), runlist: Some(vec![h(IT_MAP_QUEUES, 5), 0, 0x1234]) };
        assert_eq!(decode_runlist(&truncated).undecoded, 3);
        let idle = RunlistNode { node: 1, gpu_id: GpuId(1), runlist: None };
        assert_eq!(decode_runlist(&idle), Runlist::default());
    }
}
