//! What the emulated GPUs show: their gpu ids, KFD's topology and queues in sysfs, and what
//! kfd_emu's CP executed (`cp_stats`) at its `ns_per_workitem`.

use std::{collections::BTreeMap, process::Command};

use gpreempt_tests::read_sysfs;

pub(crate) const GPU0: u32 = 0x1000;
pub(crate) const GPU1: u32 = 0x2000;

pub(crate) fn topology(node: u32) -> BTreeMap<String, u64> {
    read_sysfs(&format!("/sys/class/kfd/kfd/topology/nodes/{node}/properties"))
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

/// The queues of `pid` in KFD's sysfs: (gpuid, type, size) of each, sorted.
pub(crate) fn sysfs_queues(pid: u32) -> Vec<(u32, u32, u64)> {
    let dir = format!("/sys/class/kfd/kfd/proc/{pid}/queues");
    let mut queues: Vec<(u32, u32, u64)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let q = e.unwrap().path();
            let read = |f: &str| std::fs::read_to_string(q.join(f)).unwrap().trim().to_owned();
            (read("gpuid").parse().unwrap(), read("type").parse().unwrap(), read("size").parse().unwrap())
        })
        .collect();
    queues.sort_unstable();
    queues
}

/// `gpreempt queues PID --json` (asserted successful): gpreempt's own view of `pid`'s queues.
pub(crate) fn gpreempt_queues(pid: u32) -> serde_json::Value {
    let out = Command::new(gpreempt_tests::binary("gpreempt").unwrap())
        .args(["queues", &pid.to_string(), "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "gpreempt queues: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `/sys/kernel/kfd_emu/cp_stats`: gpu id → counter → what that GPU's CP executed so far.
pub(crate) fn cp_stats() -> BTreeMap<u32, BTreeMap<String, u64>> {
    read_sysfs("/sys/kernel/kfd_emu/cp_stats")
        .unwrap()
        .lines()
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let counters: BTreeMap<String, u64> =
                words.chunks(2).map(|kv| (kv[0].to_owned(), kv[1].parse().unwrap())).collect();
            (counters["gpu_id"] as u32, counters)
        })
        .collect()
}

/// What each GPU's CP executed between two [`cp_stats`] readings (`gpu_id` left out).
pub(crate) fn cp_stats_since(before: &BTreeMap<u32, BTreeMap<String, u64>>) -> BTreeMap<u32, BTreeMap<String, u64>> {
    cp_stats()
        .into_iter()
        .map(|(gpu, after)| {
            let delta =
                after.iter().filter(|(k, _)| *k != "gpu_id").map(|(k, v)| (k.clone(), v - before[&gpu][k])).collect();
            (gpu, delta)
        })
        .collect()
}

/// The counters a [`cp_stats_since`] GPU entry must show, all others 0.
pub(crate) fn counters(nonzero: &[(&str, u64)]) -> BTreeMap<String, u64> {
    let mut all: BTreeMap<String, u64> = [
        "dispatches",
        "kernels",
        "barriers_and",
        "barriers_or",
        "barriers_value",
        "pm4_ibs",
        "signals",
        "interrupts",
        "events_set",
        "errors",
        "sdma_copies",
        "sdma_bytes",
        "sdma_fills",
        "sdma_fences",
        "sdma_traps",
        "sdma_atomics",
        "sdma_polls",
        "sdma_timestamps",
    ]
    .iter()
    .map(|k| ((*k).to_owned(), 0))
    .collect();
    for (k, v) in nonzero {
        all.insert((*k).to_owned(), *v);
    }
    all
}

pub(crate) fn ns_per_workitem() -> u64 {
    read_sysfs("/sys/module/kfd_emu/parameters/ns_per_workitem").unwrap().trim().parse().unwrap()
}
