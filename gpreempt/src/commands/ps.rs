//! `gpreempt ps`: the KFD processes now, as a table or JSON; `--wait-new` blocks for a new one.

use super::stderr::errln;
use std::{collections::HashSet, time::Instant};

use anyhow::{Result, bail};
use gpreempt::{
    domain::HostPid,
    host::{
        partition::Partitions,
        processes::{self, KfdProcess},
        roots::Roots,
    },
    views::{hw, processes as table},
};

use super::stdout::outln;
use crate::cli::PsArgs;

fn roots(args: &PsArgs) -> Roots {
    Roots { sys: args.sysfs_root.clone(), proc: args.proc_root.clone(), ..Roots::default() }
}

pub async fn run(args: &PsArgs) -> Result<()> {
    let roots = roots(args);
    if args.wait_new {
        return wait_new(args, &roots).await;
    }
    let (mut processes, notes) = processes::scan(&roots);
    let partitions = Partitions::read(&roots.sys);
    with_partitions(&mut processes, &partitions);
    if let Some(c) = &args.container {
        processes.retain(|p| p.in_container(c));
    }
    let hw = if args.hw { Some(hw::view(&args.debugfs_root, &processes)) } else { None };
    if args.ids_only {
        for p in &processes {
            outln!("{}", p.pid());
        }
    } else if args.json {
        let mut out = serde_json::json!({ "processes": processes, "notes": notes });
        if let Some(hw) = &hw {
            out["hw"] = serde_json::to_value(hw)?;
        }
        outln!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_table(&processes, &partitions);
        if let Some(hw) = &hw {
            let pids: Vec<HostPid> = processes.iter().map(KfdProcess::pid).collect();
            crate::commands::hw::print(hw, &pids);
        }
        for n in &notes {
            errln!("note: {n}");
        }
    }
    Ok(())
}

/// Each GPU's partition from the topology (not in the process's directory).
fn with_partitions(processes: &mut [KfdProcess], partitions: &Partitions) {
    for g in processes.iter_mut().flat_map(|p| p.sysfs.gpus.iter_mut()) {
        g.partition = partitions.get(g.gpu_id).copied();
    }
}

fn print_table(processes: &[KfdProcess], partitions: &Partitions) {
    for line in table::table(processes, partitions) {
        outln!("{line}");
    }
}

/// Poll the KFD sysfs tree until a pid that was not there at start appears (KFD creates the
/// directory at the process's first open of /dev/kfd), or until `--timeout`. Without KFD (its
/// sysfs directory absent) nothing can appear: an error at once.
async fn wait_new(args: &PsArgs, roots: &Roots) -> Result<()> {
    let before: HashSet<HostPid> = processes::pids(roots)?.into_iter().collect();
    let scope = args.container.as_deref().map(|c| format!(" in container {c}")).unwrap_or_default();
    let bound = if args.timeout.is_zero() {
        "no time limit".to_owned()
    } else {
        format!("giving up after {} (--timeout)", show(args.timeout))
    };
    // The baseline is taken: anything that opens /dev/kfd from now on is reported. Scripts (and
    // our tests) wait for this line before starting the workload.
    errln!(
        "gpreempt: waiting for a new KFD process{scope} (a pid that opens /dev/kfd from now on; {} already \
         present), {bound}",
        before.len()
    );
    let started = Instant::now();
    loop {
        let now = processes::pids(roots).unwrap_or_default();
        let fresh: Vec<HostPid> = now.into_iter().filter(|p| !before.contains(p)).collect();
        if !fresh.is_empty() {
            let (mut processes, _) = processes::scan(roots);
            let partitions = Partitions::read(&roots.sys);
            with_partitions(&mut processes, &partitions);
            let matching: Vec<&KfdProcess> = processes
                .iter()
                .filter(|p| fresh.contains(&p.pid()))
                .filter(|p| args.container.as_deref().is_none_or(|c| p.in_container(c)))
                .collect();
            if !matching.is_empty() {
                for p in &matching {
                    if args.ids_only {
                        outln!("{}", p.pid());
                    } else if args.json {
                        outln!("{}", serde_json::to_string(p)?);
                    }
                }
                if !args.ids_only && !args.json {
                    print_table(&matching.into_iter().cloned().collect::<Vec<_>>(), &partitions);
                }
                return Ok(());
            }
        }
        if !args.timeout.is_zero() && started.elapsed() > args.timeout {
            bail!("no new KFD process{scope} appeared within {:.1} s", args.timeout.as_secs_f64());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// A bound as a user writes it: `10m`, `30s`, `1h`, `1500ms`.
fn show(d: std::time::Duration) -> String {
    let s = d.as_secs();
    match (d.subsec_nanos(), s) {
        (0, s) if s > 0 && s % 3600 == 0 => format!("{}h", s / 3600),
        (0, s) if s > 0 && s % 60 == 0 => format!("{}m", s / 60),
        (0, s) => format!("{s}s"),
        _ => format!("{}ms", d.as_millis()),
    }
}
