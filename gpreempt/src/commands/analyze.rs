//! `gpreempt analyze FILE...`: the queue-id analysis as a table or JSON.

use std::{fs::File, io::BufReader};

use anyhow::{Context, Result};
use gpreempt::analyze::{self, Consistency};

use crate::cli::AnalyzeArgs;

pub fn run(args: &AnalyzeArgs) -> Result<()> {
    let mut runs = Vec::new();
    for path in &args.files {
        let file = File::open(path).with_context(|| format!("cannot open recording {}", path.display()))?;
        let name = path.display().to_string();
        runs.push(analyze::read_run(&name, BufReader::new(file)).with_context(|| format!("reading {name}"))?);
    }
    let a = analyze::analyze(runs);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&a)?);
        return Ok(());
    }
    println!("{:<28} {:>8} {:<16} {:>8}  queue ids per gpu (creation order)", "run", "pid", "comm", "queues");
    for run in &a.runs {
        for p in &run.processes {
            let ids: Vec<String> = p
                .queues
                .iter()
                .map(|(gpu, ids)| {
                    format!("{gpu:#x}:[{}]", ids.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
                })
                .collect();
            let n: usize = p.queues.values().map(Vec::len).sum();
            println!("{:<28} {:>8} {:<16} {:>8}  {}", run.file, p.pid, p.comm, n, ids.join(" "));
        }
        if run.skipped_lines > 0 {
            println!("{:<28} ({} lines were not trace JSON and were skipped)", run.file, run.skipped_lines);
        }
    }
    println!();
    println!("{:<40} {:>5}  consistency of queue ids", "command", "runs");
    for c in &a.consistency {
        let verdict = match c.consistency {
            Consistency::Identical => "identical",
            Consistency::SameCountDifferentIds => "same count, different ids",
            Consistency::DifferentCount => "different count",
        };
        println!("{:<40} {:>5}  {verdict}", c.command, c.runs);
    }
    if !a.overlaps.is_empty() {
        println!();
        println!("concurrent processes holding the same queue ids (ids are per process in KFD):");
        for o in &a.overlaps {
            println!("  {}: pids {} and {}: {:?}", o.file, o.pids.0, o.pids.1, o.shared_ids);
        }
    }
    Ok(())
}
