//! `gpreempt analyze FILE...`: the queue-id analysis as a table or JSON.

use std::{collections::BTreeMap, fs::File, io::BufReader};

use anyhow::{Context, Result, bail};
use gpreempt::{
    analyze::{self, Consistency},
    domain::QueueId,
};

use super::stdout::outln;
use crate::cli::AnalyzeArgs;

pub fn run(args: &AnalyzeArgs) -> Result<()> {
    let mut runs = Vec::new();
    for path in &args.files {
        let file = File::open(path).with_context(|| format!("cannot open recording {}", path.display()))?;
        let name = path.display().to_string();
        let run = analyze::read_run(&name, BufReader::new(file)).with_context(|| format!("reading {name}"))?;
        // Nothing to compare in a file that is no recording: saying "identical" would be a lie.
        if run.records == 0 {
            let what = if run.skipped_lines == 0 {
                "is empty".to_owned()
            } else {
                format!("has no trace record ({} line(s), none of them trace JSON)", run.skipped_lines)
            };
            bail!("{name} {what}: give recordings of `gpreempt trace --json` (or `trace -o FILE`)");
        }
        runs.push(run);
    }
    let a = analyze::analyze(runs);
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&a)?);
        return Ok(());
    }
    outln!("{:<28} {:>8} {:<16} {:>8}  queue ids per gpu (creation order)", "run", "pid", "comm", "queues");
    for run in &a.runs {
        for p in &run.processes {
            let ids: Vec<String> = p
                .queues
                .iter()
                .map(|(gpu, ids)| {
                    format!("{gpu:#x}:[{}]", ids.iter().map(QueueId::to_string).collect::<Vec<_>>().join(","))
                })
                .collect();
            let n: usize = p.queues.values().map(Vec::len).sum();
            outln!("{:<28} {:>8} {:<16} {:>8}  {}", run.file, p.pid, p.comm, n, ids.join(" "));
        }
        if run.skipped_lines > 0 {
            outln!("{:<28} ({} lines were not trace JSON and were skipped)", run.file, run.skipped_lines);
        }
    }
    outln!("");
    outln!("{:<40} {:>5}  consistency of queue ids", "command", "runs");
    for c in &a.consistency {
        let verdict = match c.consistency {
            Consistency::Identical => "identical",
            Consistency::SameCountDifferentIds => "same count, different ids",
            Consistency::DifferentCount => "different count",
        };
        outln!("{:<40} {:>5}  {verdict}", c.command, c.runs);
    }
    if !a.overlaps.is_empty() {
        outln!("");
        outln!("concurrent processes holding the same queue ids (ids are per process in KFD):");
        for o in &a.overlaps {
            // `{gpu: [ids]}` in bare numbers (the domain types' Debug would print `GpuId(7)`).
            let shared: BTreeMap<u32, Vec<u32>> =
                o.shared_ids.iter().map(|(gpu, ids)| (gpu.0, ids.iter().map(|id| id.0).collect())).collect();
            outln!("  {}: pids {} and {}: {shared:?}", o.file, o.pids.0, o.pids.1);
        }
    }
    Ok(())
}
