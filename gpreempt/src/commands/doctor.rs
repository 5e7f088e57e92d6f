//! `gpreempt doctor`: print the host report; exit 1 when a check fails.

use std::io::IsTerminal;

use anyhow::{Result, bail};
use gpreempt::{
    doctor::{self, Status},
    host::roots::Roots,
    trace::symbols::Kallsyms,
};

use super::stdout::outln;
use crate::cli::DoctorArgs;

pub fn run(args: &DoctorArgs) -> Result<()> {
    let kallsyms = match Kallsyms::load_path(&args.proc_root.join("kallsyms")) {
        Ok(k) => Some(k),
        Err(e) => {
            log::info!("{e}");
            None
        }
    };
    let roots = Roots {
        sys: args.sysfs_root.clone(),
        proc: args.proc_root.clone(),
        debugfs_kfd: args.debugfs_root.join("kfd"),
        ..Roots::default()
    };
    let report = doctor::diagnose(&roots, kallsyms.as_ref(), None);
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let colour = std::io::stdout().is_terminal();
        for c in &report.checks {
            let (tag, code) = match c.status {
                Status::Ok => ("ok  ", "32"),
                Status::Warn => ("warn", "33"),
                Status::Fail => ("FAIL", "31"),
                Status::Info => ("info", "0"),
            };
            let tag = if colour { format!("\x1b[{code}m{tag}\x1b[0m") } else { tag.to_owned() };
            outln!("{tag}  {:<28} {}", c.name, c.detail);
            if let Some(fix) = &c.fix {
                outln!("      {:<28} → {fix}", "");
            }
        }
    }
    if report.failures() > 0 {
        bail!("{} check(s) failed", report.failures());
    }
    Ok(())
}
