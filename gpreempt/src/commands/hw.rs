//! Printing the `ps --hw` view.

use super::stderr::errln;
use std::fmt::Write;

use gpreempt::{domain::HostPid, views::hw::HwView};

/// Print the view; `sysfs_pids` are the processes the `ps` table above already showed.
pub fn print(v: &HwView, sysfs_pids: &[HostPid]) {
    super::stdout::out!("{}", render(v, sysfs_pids));
    for n in &v.notes {
        errln!("note: {n}");
    }
}

/// The per-GPU table, then the processes debugfs `mqds` lists (the only names there are when
/// sysfs is not at hand). Every line, the last included, ends with a newline.
fn render(v: &HwView, sysfs_pids: &[HostPid]) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:>8} {:>10} {:>6} {:>5} {:>13} {:>5} {:>20}  check",
        "GPU", "KFD queues", "MQDs", "XCCs", "active HQDs", "HIQs", "runlist"
    );
    for g in &v.gpus {
        let _ = writeln!(
            out,
            "{:>8} {:>10} {:>6} {:>5} {:>13} {:>5} {:>20}  {}",
            format!("{:#x}", g.gpu_id),
            g.kfd_compute_queues,
            g.mqd_compute_queues,
            g.xccs,
            g.active_compute_slots,
            g.active_hiqs,
            match &g.runlist {
                None => "-".to_owned(),
                Some(r) if !r.active => "none active".to_owned(),
                Some(r) => format!("{} proc, {} queues", r.processes, r.queues),
            },
            if g.findings.is_empty() { "ok".to_owned() } else { g.findings.join("; ") }
        );
    }
    if !v.mqd_processes.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(out, "{:>8} {:>8} {:>8} {:>5} {:>6}  in sysfs", "MQD PID", "GPU", "compute", "SDMA", "other");
        for p in &v.mqd_processes {
            let listed = if sysfs_pids.contains(&p.pid) { "yes" } else { "no" };
            for g in &p.gpus {
                let _ = writeln!(
                    out,
                    "{:>8} {:>8} {:>8} {:>5} {:>6}  {listed}",
                    p.pid,
                    format!("{:#x}", g.gpu_id),
                    g.compute,
                    g.sdma,
                    g.other
                );
            }
            if p.gpus.is_empty() {
                let _ = writeln!(out, "{:>8} {:>8} {:>8} {:>5} {:>6}  {listed}", p.pid, "-", 0, 0, 0);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use gpreempt::views::hw;

    use super::*;

    /// The MI308X capture as `ps --hw --debugfs-root` reads it, with no sysfs tree at all.
    #[test]
    fn captured_debugfs_without_sysfs_names_the_mqds_process() {
        let dir = tempfile::tempdir().unwrap();
        let kfd = dir.path().join("kfd");
        std::fs::create_dir_all(&kfd).unwrap();
        let captures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/debugfs-mi308x");
        std::fs::copy(captures.join("mqds_active.txt"), kfd.join("mqds")).unwrap();
        std::fs::copy(captures.join("hqds_active.txt"), kfd.join("hqds")).unwrap();
        let view = hw::view(dir.path(), &[]);
        let text = render(&view, &[]);
        assert!(text.ends_with('\n'), "{text:?}");
        let lines: Vec<&str> = text.lines().collect();
        let f7bc = lines.iter().find(|l| l.trim_start().starts_with("0xf7bc ")).expect("gpu f7bc row");
        assert_eq!(f7bc.split_whitespace().take(6).collect::<Vec<_>>(), ["0xf7bc", "0", "5", "4", "20", "4"]);
        let header = lines.iter().position(|l| l.trim_start().starts_with("MQD PID")).expect("process table");
        assert_eq!(lines[header + 1].split_whitespace().collect::<Vec<_>>(), ["94314", "0xf7bc", "5", "0", "0", "no"]);
        assert_eq!(lines.len(), header + 2, "one process on one GPU: {text}");
        // The rls file was not captured: that is a note, not a failure.
        assert_eq!(view.notes.len(), 1, "{:?}", view.notes);
    }
}
