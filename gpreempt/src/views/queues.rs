//! One process's queues as `gpreempt queues` shows them — from a debug-trap snapshot (every
//! field) or from sysfs (id, gpu, type, ring size) — and the statistics of a `--watch` series.
//! A queue is named by its [`QueueKey`]: sysfs lists a secondary KFD context's queues too
//! (Linux 7.0, `context_0/3`), the snapshot only the primary's.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::{
    domain::{GpuId, QueueId},
    host::{partition::Partition, sysfs::SysfsQueue},
    kfd::uapi::{QueueSnapshotEntry, exception, queue_type},
    model::registry::QueueKey,
};

/// Where a queue listing came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// `AMDKFD_IOC_DBG_TRAP` GET_QUEUE_SNAPSHOT.
    DebugTrap,
    /// `/sys/class/kfd/kfd/proc/<pid>/queues` (no addresses, no exception status).
    Sysfs,
}

/// One queue. Fields sysfs does not have are `None`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueRow {
    pub queue_id: QueueId,
    /// The secondary KFD context whose `context_<id>/queues/` lists it (Linux 7.0); `None` (JSON
    /// `null`) for the primary context, the only one a debug-trap snapshot reaches.
    pub context_id: Option<u16>,
    pub gpu_id: Option<GpuId>,
    /// The gpu's package, index and mode ([`Partition`]), from the topology when it names it.
    pub partition: Option<Partition>,
    /// The ioctl's `KFD_IOC_QUEUE_TYPE_*` name from a snapshot, the kernel's `enum kfd_queue_type`
    /// name from sysfs ([`SysfsQueue::type_name`]): two numberings, so a name, not a
    /// [`crate::domain::QueueType`].
    pub queue_type: String,
    pub ring_base: Option<u64>,
    pub ring_size: Option<u64>,
    pub read_pointer_address: Option<u64>,
    pub write_pointer_address: Option<u64>,
    pub cwsr_address: Option<u64>,
    pub cwsr_size: Option<u32>,
    pub exception_status: Option<u64>,
    /// Names of the bits set in `exception_status`.
    pub exceptions: Vec<String>,
}

impl QueueRow {
    /// Where it is: its context and id.
    pub fn key(&self) -> QueueKey {
        QueueKey::new(self.context_id, self.queue_id)
    }
}

impl From<&QueueSnapshotEntry> for QueueRow {
    fn from(e: &QueueSnapshotEntry) -> Self {
        Self {
            queue_id: QueueId(e.queue_id),
            // DBG_TRAP reaches the primary context only (docs/kfd.md §1.4).
            context_id: None,
            gpu_id: Some(GpuId(e.gpu_id)),
            partition: None,
            // The snapshot reports the ioctl's KFD_IOC_QUEUE_TYPE_* (set_queue_type_for_user, 6.12).
            queue_type: queue_type::name(e.queue_type).map_or_else(|| format!("type {}", e.queue_type), str::to_owned),
            ring_base: Some(e.ring_base_address),
            ring_size: Some(u64::from(e.ring_size)),
            read_pointer_address: Some(e.read_pointer_address),
            write_pointer_address: Some(e.write_pointer_address),
            cwsr_address: Some(e.ctx_save_restore_address),
            cwsr_size: Some(e.ctx_save_restore_area_size),
            exception_status: Some(e.exception_status),
            exceptions: exception_names(e.exception_status),
        }
    }
}

impl From<&SysfsQueue> for QueueRow {
    fn from(q: &SysfsQueue) -> Self {
        Self {
            queue_id: q.queue_id,
            context_id: QueueKey { context: q.context, queue_id: q.queue_id }.context_id(),
            gpu_id: q.gpu_id,
            partition: None,
            queue_type: q.type_name(),
            ring_base: None,
            ring_size: q.ring_size,
            read_pointer_address: None,
            write_pointer_address: None,
            cwsr_address: None,
            cwsr_size: None,
            exception_status: None,
            exceptions: Vec::new(),
        }
    }
}

/// The width of a table's QUEUE column: its header's, or its longest label's (`context_0/3`).
pub fn queue_column_width(keys: impl IntoIterator<Item = QueueKey>) -> usize {
    keys.into_iter().map(|k| k.to_string().len()).fold("QUEUE".len(), usize::max)
}

/// The text table of `rows` (a header, then a line per queue); nothing without rows. Fields the
/// source does not give are `-`.
pub fn table(rows: &[QueueRow]) -> Vec<String> {
    if rows.is_empty() {
        return Vec::new();
    }
    let hex = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:#x}"));
    let num = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
    let w = queue_column_width(rows.iter().map(QueueRow::key));
    let mut lines = vec![format!(
        "{:>w$} {:>6} {:<20} {:<12} {:>16} {:>9} {:>16} {:>16} {:>16} {:>9}  EXCEPTIONS",
        "QUEUE", "GPU", "PARTITION", "TYPE", "RING", "RING_SIZE", "RPTR", "WPTR", "CWSR", "CWSR_SIZE"
    )];
    for q in rows {
        lines.push(format!(
            "{:>w$} {:>6} {:<20} {:<12} {:>16} {:>9} {:>16} {:>16} {:>16} {:>9}  {}",
            q.key(),
            num(q.gpu_id.map(u64::from)),
            q.partition.map_or_else(|| "-".to_owned(), |p| p.label()),
            q.queue_type,
            hex(q.ring_base),
            num(q.ring_size),
            hex(q.read_pointer_address),
            hex(q.write_pointer_address),
            hex(q.cwsr_address),
            num(q.cwsr_size.map(u64::from)),
            if q.exceptions.is_empty() { "-".to_owned() } else { q.exceptions.join(",") }
        ));
    }
    lines
}

/// `EC_*` names of the set bits of an exception status word.
pub fn exception_names(status: u64) -> Vec<String> {
    const NAMES: [(u32, &str); 12] = [
        (exception::EC_QUEUE_WAVE_ABORT, "QUEUE_WAVE_ABORT"),
        (exception::EC_QUEUE_WAVE_TRAP, "QUEUE_WAVE_TRAP"),
        (exception::EC_QUEUE_WAVE_MATH_ERROR, "QUEUE_WAVE_MATH_ERROR"),
        (exception::EC_QUEUE_WAVE_ILLEGAL_INSTRUCTION, "QUEUE_WAVE_ILLEGAL_INSTRUCTION"),
        (exception::EC_QUEUE_WAVE_MEMORY_VIOLATION, "QUEUE_WAVE_MEMORY_VIOLATION"),
        (exception::EC_QUEUE_WAVE_APERTURE_VIOLATION, "QUEUE_WAVE_APERTURE_VIOLATION"),
        (exception::EC_QUEUE_PREEMPTION_ERROR, "QUEUE_PREEMPTION_ERROR"),
        (exception::EC_QUEUE_NEW, "QUEUE_NEW"),
        (exception::EC_DEVICE_QUEUE_DELETE, "DEVICE_QUEUE_DELETE"),
        (exception::EC_DEVICE_NEW, "DEVICE_NEW"),
        (exception::EC_PROCESS_RUNTIME, "PROCESS_RUNTIME"),
        (exception::EC_PROCESS_DEVICE_REMOVE, "PROCESS_DEVICE_REMOVE"),
    ];
    let mut names: Vec<String> = Vec::new();
    for bit in 0..64u32 {
        if status & (1u64 << bit) == 0 {
            continue;
        }
        let ec = bit + 1;
        names.push(NAMES.iter().find(|(code, _)| *code == ec).map_or_else(|| format!("EC_{ec}"), |(_, n)| (*n).into()));
    }
    names
}

/// One `--watch` sample.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Sample {
    /// Milliseconds since the first sample.
    pub t_ms: u64,
    /// Its queues' labels ([`QueueKey`]: `"3"`, `"context_0/3"`).
    pub queue_ids: Vec<QueueKey>,
}

impl Sample {
    /// Its line in `--watch`'s text output: `     200 ms    2 queue(s)  [0, context_0/0]`.
    pub fn line(&self) -> String {
        let ids: Vec<String> = self.queue_ids.iter().map(QueueKey::to_string).collect();
        format!("{:>8} ms  {:>3} queue(s)  [{}]", self.t_ms, self.queue_ids.len(), ids.join(", "))
    }
}

/// The proof-of-concept's watch statistics, over a series of samples.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WatchStats {
    pub samples: usize,
    pub min_count: usize,
    pub avg_count: f64,
    pub max_count: usize,
    /// Every sample had exactly the same queue ids.
    pub stable: bool,
    /// Queue ([`QueueKey`]) → number of samples it was in.
    pub id_frequency: BTreeMap<QueueKey, usize>,
    /// gpu id → queue observations over all samples (sysfs may lack the gpu: key "unknown").
    pub per_gpu: BTreeMap<String, usize>,
    /// queue type → queue observations over all samples.
    pub per_type: BTreeMap<String, usize>,
}

impl WatchStats {
    /// `rows[i]` are the queues of sample `i`.
    pub fn of(rows: &[Vec<QueueRow>]) -> Option<Self> {
        let counts: Vec<usize> = rows.iter().map(Vec::len).collect();
        let min_count = *counts.iter().min()?;
        let max_count = *counts.iter().max()?;
        let sets: Vec<BTreeSet<QueueKey>> = rows.iter().map(|s| s.iter().map(QueueRow::key).collect()).collect();
        let mut id_frequency = BTreeMap::new();
        let mut per_gpu = BTreeMap::new();
        let mut per_type = BTreeMap::new();
        for q in rows.iter().flatten() {
            *per_gpu.entry(q.gpu_id.map_or_else(|| "unknown".to_owned(), |g| g.to_string())).or_insert(0) += 1;
            *per_type.entry(q.queue_type.clone()).or_insert(0) += 1;
        }
        for set in &sets {
            for id in set {
                *id_frequency.entry(*id).or_insert(0) += 1;
            }
        }
        Some(Self {
            samples: rows.len(),
            min_count,
            avg_count: counts.iter().sum::<usize>() as f64 / rows.len() as f64,
            max_count,
            stable: sets.windows(2).all(|w| w[0] == w[1]),
            id_frequency,
            per_gpu,
            per_type,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A row with sysfs's fields only.
    pub(crate) fn row(id: u32, gpu: u32, ty: &str) -> QueueRow {
        QueueRow {
            queue_id: QueueId(id),
            context_id: None,
            gpu_id: Some(GpuId(gpu)),
            partition: None,
            queue_type: ty.into(),
            ring_base: None,
            ring_size: None,
            read_pointer_address: None,
            write_pointer_address: None,
            cwsr_address: None,
            cwsr_size: None,
            exception_status: None,
            exceptions: vec![],
        }
    }

    #[test]
    fn snapshot_entries_become_rows_with_exception_names() {
        let e = QueueSnapshotEntry {
            exception_status: 1 << 30 | 1 << 47,
            ring_base_address: 0x7f00_0000_0000,
            write_pointer_address: 0x1000,
            read_pointer_address: 0x2000,
            ctx_save_restore_address: 0x3000,
            queue_id: 3,
            gpu_id: 0xbeef,
            ring_size: 65536,
            queue_type: queue_type::COMPUTE_AQL,
            ctx_save_restore_area_size: 0x2_0000,
            reserved: 0,
        };
        let r = QueueRow::from(&e);
        assert_eq!((r.queue_id, r.gpu_id, r.queue_type.as_str()), (QueueId(3), Some(GpuId(0xbeef)), "compute-aql"));
        assert_eq!((r.ring_size, r.cwsr_size), (Some(65536), Some(0x2_0000)));
        assert_eq!(r.exceptions, vec!["QUEUE_NEW", "PROCESS_RUNTIME"]);
        assert_eq!(exception_names(1 << 62), vec!["EC_63"]);
    }

    /// Linux 7.0: sysfs lists a secondary KFD context's queues (`context_<id>/queues/`); every
    /// `queues` view names them by their context and never merges them with the primary's of the
    /// same id.
    #[test]
    fn a_secondary_context_s_queue_is_named_by_its_context() {
        use crate::host::sysfs::KfdContext;
        let sysfs = SysfsQueue {
            context: KfdContext::Secondary(0),
            queue_id: QueueId(0),
            gpu_id: Some(GpuId(4096)),
            kernel_type: Some(0),
            ring_size: Some(4096),
        };
        let secondary = QueueRow::from(&sysfs);
        assert_eq!((secondary.context_id, secondary.key().to_string()), (Some(0), "context_0/0".to_owned()));
        let rows = vec![QueueRow { ring_size: Some(4096), ..row(0, 4096, "compute") }, secondary];
        let sample = Sample { t_ms: 200, queue_ids: rows.iter().map(QueueRow::key).collect() };
        assert_eq!(sample.line(), "     200 ms    2 queue(s)  [0, context_0/0]");
        assert_eq!(
            table(&rows),
            [
                "      QUEUE    GPU PARTITION            TYPE                     RING RING_SIZE             RPTR             WPTR             CWSR CWSR_SIZE  EXCEPTIONS",
                "          0   4096 -                    compute                     -      4096                -                -                -         -  -",
                "context_0/0   4096 -                    compute                     -      4096                -                -                -         -  -",
            ]
        );
        let stats = WatchStats::of(&[rows.clone(), rows.clone()]).unwrap();
        assert_eq!((stats.min_count, stats.stable), (2, true));
        let json = serde_json::to_value((&sample, &stats.id_frequency, &rows[1])).unwrap();
        assert_eq!(json[0], serde_json::json!({"t_ms": 200, "queue_ids": ["0", "context_0/0"]}));
        assert_eq!(json[1], serde_json::json!({"0": 2, "context_0/0": 2}));
        assert_eq!((&json[2]["queue_id"], &json[2]["context_id"]), (&serde_json::json!(0), &serde_json::json!(0)));
        // A primary-only table keeps its five-wide column.
        assert_eq!(
            table(&rows[..1])[1],
            "    0   4096 -                    compute                     -      4096                -                -                -         -  -"
        );
    }

    #[test]
    fn watch_stats_match_the_proof_of_concept() {
        let samples = vec![
            vec![row(0, 1, "compute-aql"), row(1, 1, "sdma")],
            vec![row(0, 1, "compute-aql"), row(1, 1, "sdma"), row(2, 2, "compute-aql")],
            vec![row(0, 1, "compute-aql")],
        ];
        let s = WatchStats::of(&samples).unwrap();
        assert_eq!((s.samples, s.min_count, s.max_count, s.stable), (3, 1, 3, false));
        assert_eq!(s.avg_count, 2.0);
        let q = |id| QueueKey::primary(QueueId(id));
        assert_eq!(s.id_frequency, BTreeMap::from([(q(0), 3), (q(1), 2), (q(2), 1)]));
        assert_eq!(s.per_gpu, BTreeMap::from([("1".into(), 5), ("2".into(), 1)]));
        assert_eq!(s.per_type, BTreeMap::from([("compute-aql".into(), 4), ("sdma".into(), 2)]));
        let steady = WatchStats::of(&[vec![row(4, 1, "sdma")], vec![row(4, 1, "sdma")]]).unwrap();
        assert!(steady.stable);
        assert_eq!(WatchStats::of(&[]), None);
    }
}
