//! `gpreempt analyze`: queue ids across recorded runs (the proof-of-concept's experiments 1-3).
//!
//! Input: JSON Lines recordings of `gpreempt trace --json`, one file per run. For each run, the
//! queue ids each process created, per GPU, in creation order; across runs of the same command,
//! whether those ids were identical; within a run, which concurrently running processes were
//! handed the same ids (queue ids are per process in KFD, so concurrent processes overlap).

use std::{
    collections::{BTreeMap, BTreeSet},
    io::BufRead,
};

use serde::{Deserialize, Serialize};

use crate::domain::{GpuId, HostPid, QueueId};

/// The fields of a recorded event that analysis needs.
#[derive(Debug, Deserialize)]
struct Recorded {
    event: String,
    #[serde(default)]
    pid: HostPid,
    #[serde(default)]
    comm: String,
    #[serde(default)]
    ts_ns: u64,
    #[serde(default)]
    queue_id: Option<QueueId>,
    #[serde(default)]
    gpu_id: Option<GpuId>,
    /// `start` objects of `trace -- CMD` recordings name the command.
    #[serde(default)]
    command: Option<Vec<String>>,
}

/// One process of one run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProcessQueues {
    pub pid: HostPid,
    pub comm: String,
    /// gpu_id → queue ids in creation order (successful creates only).
    pub queues: BTreeMap<GpuId, Vec<QueueId>>,
    pub first_ns: u64,
    pub last_ns: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AnalyzedRun {
    pub file: String,
    /// The traced command if recorded, else the comms of the queue-creating processes.
    pub command: String,
    /// Ordered by first event.
    pub processes: Vec<ProcessQueues>,
    /// Lines that were not JSON objects of the trace format.
    pub skipped_lines: usize,
    /// Lines that were trace records (of any event): none means the file is no recording.
    #[serde(skip)]
    pub records: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Consistency {
    /// Every run gave every process the same ids on the same GPUs.
    Identical,
    /// Same number of queues per process and GPU, different ids.
    SameCountDifferentIds,
    /// The number of processes or queues differs between runs.
    DifferentCount,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CommandConsistency {
    pub command: String,
    pub runs: usize,
    pub consistency: Consistency,
}

/// Two processes of one run whose activity overlapped in time and that hold the same ids.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Overlap {
    pub file: String,
    pub pids: (HostPid, HostPid),
    /// gpu_id → ids both processes were given.
    pub shared_ids: BTreeMap<GpuId, Vec<QueueId>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Analysis {
    pub runs: Vec<AnalyzedRun>,
    pub consistency: Vec<CommandConsistency>,
    pub overlaps: Vec<Overlap>,
}

/// Read one recording.
pub fn read_run(file: &str, reader: impl BufRead) -> std::io::Result<AnalyzedRun> {
    let mut processes: BTreeMap<HostPid, ProcessQueues> = BTreeMap::new();
    let mut command = None;
    let mut skipped_lines = 0;
    let mut records = 0;
    for line in reader.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let Ok(r) = serde_json::from_str::<Recorded>(&line) else {
            skipped_lines += 1;
            continue;
        };
        records += 1;
        if r.event == "start" {
            command = r.command.map(|c| c.join(" "));
            continue;
        }
        if r.event != "queue_create" && r.event != "queue_destroy" {
            continue;
        }
        let p = processes.entry(r.pid).or_insert_with(|| ProcessQueues {
            pid: r.pid,
            comm: r.comm.clone(),
            queues: BTreeMap::new(),
            first_ns: r.ts_ns,
            last_ns: r.ts_ns,
        });
        p.first_ns = p.first_ns.min(r.ts_ns);
        p.last_ns = p.last_ns.max(r.ts_ns);
        if let ("queue_create", Some(id), Some(gpu)) = (r.event.as_str(), r.queue_id, r.gpu_id) {
            p.queues.entry(gpu).or_default().push(id);
        }
    }
    let mut processes: Vec<ProcessQueues> = processes.into_values().filter(|p| !p.queues.is_empty()).collect();
    processes.sort_by_key(|p| (p.first_ns, p.pid));
    let command = command.unwrap_or_else(|| {
        processes.iter().map(|p| p.comm.as_str()).collect::<BTreeSet<_>>().into_iter().collect::<Vec<_>>().join("+")
    });
    Ok(AnalyzedRun { file: file.to_owned(), command, processes, skipped_lines, records })
}

fn consistency(runs: &[&AnalyzedRun]) -> Consistency {
    let ids = |r: &AnalyzedRun| r.processes.iter().map(|p| p.queues.clone()).collect::<Vec<_>>();
    let counts = |r: &AnalyzedRun| {
        r.processes
            .iter()
            .map(|p| p.queues.iter().map(|(g, q)| (*g, q.len())).collect::<BTreeMap<_, _>>())
            .collect::<Vec<_>>()
    };
    let first = runs[0];
    if runs.iter().all(|r| ids(r) == ids(first)) {
        Consistency::Identical
    } else if runs.iter().all(|r| counts(r) == counts(first)) {
        Consistency::SameCountDifferentIds
    } else {
        Consistency::DifferentCount
    }
}

fn overlaps(run: &AnalyzedRun) -> Vec<Overlap> {
    let mut found = Vec::new();
    for (i, a) in run.processes.iter().enumerate() {
        for b in &run.processes[i + 1..] {
            if a.last_ns < b.first_ns || b.last_ns < a.first_ns {
                continue;
            }
            let mut shared_ids = BTreeMap::new();
            for (gpu, ids) in &a.queues {
                let Some(other) = b.queues.get(gpu) else { continue };
                let common: Vec<QueueId> = ids.iter().filter(|id| other.contains(id)).copied().collect();
                if !common.is_empty() {
                    shared_ids.insert(*gpu, common);
                }
            }
            if !shared_ids.is_empty() {
                found.push(Overlap { file: run.file.clone(), pids: (a.pid, b.pid), shared_ids });
            }
        }
    }
    found
}

pub fn analyze(runs: Vec<AnalyzedRun>) -> Analysis {
    let mut by_command: BTreeMap<&str, Vec<&AnalyzedRun>> = BTreeMap::new();
    for r in &runs {
        by_command.entry(r.command.as_str()).or_default().push(r);
    }
    let consistency = by_command
        .into_iter()
        .map(|(command, rs)| CommandConsistency {
            command: command.to_owned(),
            runs: rs.len(),
            consistency: consistency(&rs),
        })
        .collect();
    let overlaps = runs.iter().flat_map(overlaps).collect();
    Analysis { runs, consistency, overlaps }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(pid: u32, comm: &str, ts: u64, gpu: u32, id: Option<u32>) -> String {
        serde_json::json!({"event": "queue_create", "pid": pid, "comm": comm, "ts_ns": ts, "gpu_id": gpu,
            "queue_id": id, "result": if id.is_some() { "OK" } else { "EINVAL" }})
        .to_string()
    }

    fn run(file: &str, lines: &[String]) -> AnalyzedRun {
        read_run(file, lines.join("\n").as_bytes()).unwrap()
    }

    #[test]
    fn per_process_ids_per_gpu_in_creation_order() {
        let r = run(
            "a.jsonl",
            &[
                r#"{"event":"start","command":["./gemm","--size","4096"]}"#.to_owned(),
                create(10, "gemm", 5, 0xf7bc, Some(2)),
                create(10, "gemm", 6, 0xf7bc, Some(0)),
                create(10, "gemm", 7, 0x1234, Some(1)),
                create(10, "gemm", 8, 0xf7bc, None),
                "not json".to_owned(),
                r#"{"event":"summary","events":4,"dropped":0}"#.to_owned(),
            ],
        );
        assert_eq!(r.command, "./gemm --size 4096");
        assert_eq!(r.skipped_lines, 1);
        assert_eq!(r.processes.len(), 1);
        assert_eq!(
            r.processes[0].queues,
            BTreeMap::from([(GpuId(0x1234), vec![QueueId(1)]), (GpuId(0xf7bc), vec![QueueId(2), QueueId(0)])])
        );
    }

    #[test]
    fn consistency_across_runs_of_one_command_and_overlap_of_concurrent_processes() {
        let a = run("1", &[create(1, "gemm", 1, 7, Some(0)), create(1, "gemm", 2, 7, Some(1))]);
        let b = run("2", &[create(2, "gemm", 1, 7, Some(0)), create(2, "gemm", 2, 7, Some(1))]);
        let c = run("3", &[create(3, "gemm", 1, 7, Some(4)), create(3, "gemm", 2, 7, Some(5))]);
        let d = run("4", &[create(4, "gemm", 1, 7, Some(0))]);
        let both = run(
            "5",
            &[
                create(5, "infer", 10, 7, Some(0)),
                create(6, "train", 11, 7, Some(0)),
                create(6, "train", 12, 7, Some(1)),
                create(5, "infer", 13, 7, Some(1)),
                create(7, "late", 100, 7, Some(0)),
            ],
        );
        assert_eq!(analyze(vec![a.clone(), b.clone()]).consistency[0].consistency, Consistency::Identical);
        assert_eq!(analyze(vec![a.clone(), c]).consistency[0].consistency, Consistency::SameCountDifferentIds);
        let x = analyze(vec![a, b, d, both]);
        assert_eq!(
            x.consistency,
            vec![
                CommandConsistency { command: "gemm".into(), runs: 3, consistency: Consistency::DifferentCount },
                CommandConsistency { command: "infer+late+train".into(), runs: 1, consistency: Consistency::Identical },
            ]
        );
        assert_eq!(
            x.overlaps,
            vec![Overlap {
                file: "5".into(),
                pids: (HostPid(5), HostPid(6)),
                shared_ids: BTreeMap::from([(GpuId(7), vec![QueueId(0), QueueId(1)])])
            }],
            "pid 7 started after both ended: no overlap"
        );
    }
}
