//! The report drawn for people: a terminal table (states × figures: the median over the rounds,
//! its ratio to the state where that side ran alone, the range over the rounds) and the same as
//! Markdown to paste into an issue, each with the host's facts and the notes.

use std::fmt::Write;

use super::{
    metric::MetricSpec,
    report::{ArrivalSummary, Ended, EvaluationReport, FigureSummary, StateSummary},
};

/// A figure's value as the tables show it: three significant digits, no exponent.
fn num(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn cell(f: &FigureSummary) -> String {
    let mut s = num(f.median);
    if let Some(r) = f.ratio_to_alone {
        let _ = write!(s, " ×{r:.2}");
    }
    if f.n > 1 {
        let _ = write!(s, " ({}–{})", num(f.min), num(f.max));
    }
    s
}

/// The figure names, in the order of their first appearance over the states.
fn columns(summary: &[StateSummary]) -> Vec<String> {
    let mut cols: Vec<String> = Vec::new();
    for f in summary.iter().flat_map(|s| &s.figures) {
        if !cols.contains(&f.figure) {
            cols.push(f.figure.clone());
        }
    }
    cols
}

/// Header and rows of the states × figures grid ("-" where a state has no such figure).
fn grid(summary: &[StateSummary]) -> (Vec<String>, Vec<Vec<String>>) {
    let cols = columns(summary);
    let mut header = vec!["state".to_owned(), "runs".to_owned()];
    header.extend(cols.iter().cloned());
    let rows = summary
        .iter()
        .map(|s| {
            let mut row = vec![s.state.label().to_owned(), s.runs.to_string()];
            row.extend(cols.iter().map(|c| s.figures.iter().find(|f| &f.figure == c).map_or_else(|| "-".into(), cell)));
            row
        })
        .collect();
    (header, rows)
}

fn ended_line(r: &EvaluationReport) -> Option<String> {
    match &r.ended {
        Ended::Completed => None,
        Ended::Interrupted { signal } => Some(format!(
            "Interrupted ({}) after {} state run(s); everything was released. The figures are those measured until then.",
            signal.as_deref().unwrap_or("signal"),
            r.runs.len()
        )),
        Ended::Failed { error } => Some(format!("Stopped after {} state run(s): {error}", r.runs.len())),
    }
}

fn facts_lines(r: &EvaluationReport) -> Vec<String> {
    let h = &r.host;
    let mut out = vec![format!(
        "kernel {}, KFD {}",
        h.kernel.as_deref().unwrap_or("unknown"),
        h.kfd_version.as_deref().unwrap_or("unknown")
    )];
    for g in &h.gpus {
        out.push(format!(
            "GPU {:#x}: {}{}",
            g.gpu_id.0,
            g.name.as_deref().unwrap_or("(no name)"),
            g.gfx.as_deref().map_or_else(String::new, |x| format!(" ({x})"))
        ));
    }
    for p in &h.processes {
        out.push(format!(
            "{} pid {} ({}): {}",
            p.role,
            p.pid,
            p.comm.as_deref().unwrap_or("?"),
            if p.rocm.is_empty() { "no ROCm library in its maps".to_owned() } else { p.rocm.join(", ") }
        ));
    }
    out
}

/// Per scheduled run: transitions, and schedule's detection and reaction p99.
fn schedule_lines(r: &EvaluationReport) -> Vec<String> {
    let p99 = |s: &Option<crate::stats::Summary>| s.as_ref().map_or_else(|| "-".into(), |s| num(s.p99));
    r.runs
        .iter()
        .filter_map(|run| {
            let s = run.schedule.as_ref()?;
            Some(format!(
                "round {} scheduled: {} suspends, {} resumes, offline held {:.0}% of the time; detection p99 {} us, \
                 reaction p99 {} us{}",
                run.round,
                s.suspends,
                s.resumes,
                100.0 * s.suspended_share,
                p99(&s.detection_us),
                p99(&s.reaction_us),
                s.kernel.as_ref().map_or_else(String::new, |k| format!(
                    "; in the driver: suspend p99 {} us, fence wait p99 {} us",
                    p99(&k.suspend.duration_us),
                    p99(&k.suspend.fence_wait_us)
                ))
            ))
        })
        .collect()
}

/// Per online process, what the arrival path did over the scheduled runs (none with
/// --no-arrival).
fn arrival_lines(r: &EvaluationReport) -> Vec<String> {
    r.arrival.iter().map(arrival_line).collect()
}

fn arrival_line(a: &ArrivalSummary) -> String {
    let runs = format!("{} scheduled run{}", a.runs, if a.runs == 1 { "" } else { "s" });
    if let Some(why) = &a.why {
        return format!(
            "arrival path, online pid {} ({runs}): not watched, its requests were seen at their first GPU work: {why}",
            a.pid
        );
    }
    let ports: Vec<String> = a.ports.iter().map(u16::to_string).collect();
    let p = &a.pending;
    let open = if p.open > 0 { format!(", {} open", p.open) } else { String::new() };
    let lead = a.lead_p50_us.map_or_else(
        || "-".to_owned(),
        |l| {
            if l.n > 1 {
                format!("{} us ({}–{})", num(l.median), num(l.min), num(l.max))
            } else {
                format!("{} us", num(l.median))
            }
        },
    );
    format!(
        "arrival path, online pid {} on port {} ({runs}): {} requests seen, {} probes/scrapes denied; {} pending \
         holds: {} served, {} late, {} wasted, {} busy{open}; lead p50 {lead}",
        a.pid,
        ports.join(","),
        a.requests,
        a.denied,
        p.arrivals,
        p.served,
        p.late,
        p.wasted,
        p.busy,
    )
}

fn warnings(r: &EvaluationReport) -> Vec<String> {
    r.runs
        .iter()
        .flat_map(|run| run.warnings.iter().map(move |w| format!("round {} {}: {w}", run.round, run.state)))
        .collect()
}

const LEGEND: &str = "Each cell: the median over the rounds, ×ratio to the state where that side ran alone (online \
figures to online alone, offline figures to offline alone), (min–max over the rounds).";

/// The terminal form.
pub fn terminal(r: &EvaluationReport) -> String {
    let (header, rows) = grid(&r.summary);
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            std::iter::once(&header[i])
                .chain(rows.iter().map(|row| &row[i]))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[String]| {
        let padded: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        padded.join("  ").trim_end().to_owned()
    };
    let mut out = String::new();
    let _ = writeln!(out, "{}", line(&header));
    let _ = writeln!(out, "{}", widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>().join("  "));
    for row in &rows {
        let _ = writeln!(out, "{}", line(row));
    }
    let _ = writeln!(out, "{LEGEND}");
    for l in schedule_lines(r).into_iter().chain(arrival_lines(r)) {
        let _ = writeln!(out, "{l}");
    }
    for n in &r.notes {
        let _ = writeln!(out, "note: {n}");
    }
    for w in warnings(r) {
        let _ = writeln!(out, "warning: {w}");
    }
    let _ = writeln!(out, "host: {}", facts_lines(r).join("; "));
    if let Some(e) = ended_line(r) {
        let _ = writeln!(out, "{e}");
    }
    out
}

fn md_escape(s: &str) -> String {
    s.replace('|', "\\|")
}

/// The Markdown form (to paste into an issue).
pub fn markdown(r: &EvaluationReport) -> String {
    let (header, rows) = grid(&r.summary);
    let mut out = String::new();
    let _ = writeln!(out, "### gpreempt evaluate\n");
    let specs = |ms: &[MetricSpec]| {
        if ms.is_empty() {
            "none".to_owned()
        } else {
            ms.iter().map(|m| format!("`{}`", m.to_string().replace('`', "'"))).collect::<Vec<_>>().join(", ")
        }
    };
    let offline = match &r.offline_log {
        Some(path) => format!(
            "; offline metrics from `{}`: {}",
            path.display().to_string().replace('`', "'"),
            specs(&r.offline_metrics)
        ),
        None => String::new(),
    };
    let _ = writeln!(
        out,
        "Load: `{}`; {} round(s); metrics: {}{offline}\n",
        r.load.replace('`', "'"),
        r.rounds,
        specs(&r.metrics)
    );
    let _ = writeln!(out, "| {} |", header.iter().map(|h| md_escape(h)).collect::<Vec<_>>().join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(header.len()));
    for row in &rows {
        let _ = writeln!(out, "| {} |", row.iter().map(|c| md_escape(c)).collect::<Vec<_>>().join(" | "));
    }
    let _ = writeln!(out, "\n{LEGEND}\n");
    for l in schedule_lines(r).into_iter().chain(arrival_lines(r)).chain(r.notes.iter().map(|n| format!("Note: {n}"))) {
        let _ = writeln!(out, "- {}", md_escape(&l));
    }
    for w in warnings(r) {
        let _ = writeln!(out, "- Warning: {}", md_escape(&w));
    }
    if let Some(e) = ended_line(r) {
        let _ = writeln!(out, "- {}", md_escape(&e));
    }
    let _ = writeln!(out, "\nHost:\n");
    for l in facts_lines(r) {
        let _ = writeln!(out, "- {}", md_escape(&l));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        domain::{GpuId, HostPid},
        evaluate::{
            host_facts::{GpuFacts, HostFacts},
            report::{
                REPORT_VERSION, summarise,
                tests::{metrics, offline_metrics, run},
            },
            state::State,
        },
    };

    fn report() -> EvaluationReport {
        use State::*;
        let runs = vec![
            run(1, CoLocated, Some(30.0), 900.0, 50.0),
            run(1, OnlineAlone, Some(10.0), 100.0, 0.0),
            run(1, Scheduled, Some(12.0), 150.0, 80.0),
            run(1, OfflineAlone, None, 0.0, 100.0),
        ];
        let metrics = metrics();
        EvaluationReport {
            version: REPORT_VERSION,
            host: HostFacts {
                kernel: Some("6.12.0".into()),
                kfd_version: Some("1.17".into()),
                gpus: vec![GpuFacts {
                    gpu_id: GpuId(0x1000),
                    name: Some("aldebaran".into()),
                    gfx: Some("gfx90a".into()),
                }],
                processes: Vec::new(),
            },
            online: vec![HostPid(10)],
            offline: vec![HostPid(20)],
            load: "load --n 10 | tee x".into(),
            summary: summarise(&runs, &metrics, &offline_metrics()),
            arrival: Vec::new(),
            metrics,
            offline_log: Some("/var/log/train.log".into()),
            offline_metrics: offline_metrics(),
            rounds: 1,
            runs,
            ended: Ended::Interrupted { signal: Some("SIGINT".into()) },
            notes: vec!["online alone: the offline CPU threads still ran".into()],
        }
    }

    #[test]
    fn the_terminal_table_has_a_row_per_state_and_the_ratios() {
        let text = terminal(&report());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0].split("  ").filter(|c| !c.is_empty()).map(str::trim).collect::<Vec<_>>(),
            [
                "state",
                "runs",
                "p99_ms",
                "online delay p50 us",
                "online delay p99 us",
                "offline dispatches/s",
                "samples_s"
            ]
        );
        assert!(lines[2].starts_with("co-located"), "{text}");
        assert!(lines[2].contains("30.0 ×3.00"), "{text}");
        assert!(lines[2].contains("900 ×9.00"), "{text}");
        assert!(lines[2].contains("50.0 ×0.50"), "{text}");
        assert!(lines[3].starts_with("online alone"), "{text}");
        assert!(lines[4].starts_with("scheduled") && lines[4].contains("12.0 ×1.20"), "{text}");
        assert!(lines[5].starts_with("offline alone") && lines[5].contains(" - "), "{text}");
        assert!(text.contains("note: online alone: the offline CPU threads still ran"));
        assert!(text.contains("GPU 0x1000: aldebaran (gfx90a)"));
        assert!(text.contains("Interrupted (SIGINT) after 4 state run(s)"));
    }

    #[test]
    fn markdown_is_a_pipe_table_with_the_host_facts() {
        let md = markdown(&report());
        assert!(
            md.contains(
                "| state | runs | p99_ms | online delay p50 us | online delay p99 us | offline dispatches/s | samples_s |"
            ),
            "{md}"
        );
        assert!(md.contains("|---|---|---|---|---|---|---|"), "{md}");
        assert!(md.contains("offline metrics from `/var/log/train.log`: `samples_s=samples/s ([0-9.]+)`"), "{md}");
        assert!(md.contains("| scheduled | 1 | 12.0 ×1.20 |"), "{md}");
        // A pipe inside the load command does not break the table or the text.
        assert!(md.contains("Load: `load --n 10 | tee x`"), "{md}");
        assert!(md.contains("- GPU 0x1000: aldebaran (gfx90a)"), "{md}");
        assert!(md.contains("- kernel 6.12.0, KFD 1.17"), "{md}");
    }

    #[test]
    fn the_arrival_path_has_a_line_per_online_process_in_both_forms() {
        use crate::{
            evaluate::report::{
                arrival_summary,
                tests::{arrival, scheduled},
            },
            schedule::arrival::report::ArrivalReport,
        };
        let gone =
            ArrivalReport { pid: HostPid(11), why: Some("no cgroup v2 mount".into()), ..ArrivalReport::default() };
        let runs = vec![
            scheduled(1, vec![arrival(10, 40, 12, [36, 3, 0, 1], Some(31_000.0)), gone]),
            scheduled(2, vec![arrival(10, 40, 11, [38, 1, 1, 0], Some(33_000.0))]),
        ];
        let mut r = report();
        r.arrival = arrival_summary(&runs);
        r.runs = runs;
        let expected = [
            "arrival path, online pid 10 on port 8000 (2 scheduled runs): 80 requests seen, 23 probes/scrapes denied; \
             80 pending holds: 74 served, 4 late, 1 wasted, 1 busy; lead p50 32000 us (31000–33000)",
            "arrival path, online pid 11 (1 scheduled run): not watched, its requests were seen at their first GPU \
             work: no cgroup v2 mount",
        ];
        let text = terminal(&r);
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("arrival path")).collect();
        assert_eq!(lines, expected, "{text}");
        // After the scheduled runs' own lines.
        let at = |needle: &str| text.find(needle).unwrap_or_else(|| panic!("{needle}: {text}"));
        assert!(at("round 2 scheduled:") < at("arrival path"), "{text}");
        let md = markdown(&r);
        let items: Vec<&str> = md.lines().filter_map(|l| l.strip_prefix("- arrival path")).collect();
        assert_eq!(items.len(), 2, "{md}");
        assert_eq!(format!("arrival path{}", items[0]), expected[0]);
        assert_eq!(format!("arrival path{}", items[1]), expected[1]);
        // A single run's lead has no range; --no-arrival (no report) has no line.
        r.arrival = arrival_summary(&r.runs[1..]);
        let text = terminal(&r);
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("arrival path")).collect();
        assert_eq!(
            lines,
            ["arrival path, online pid 10 on port 8000 (1 scheduled run): 40 requests seen, 11 probes/scrapes \
                 denied; 40 pending holds: 38 served, 1 late, 1 wasted, 0 busy; lead p50 33000 us"]
        );
        r.arrival = Vec::new();
        assert!(!terminal(&r).contains("arrival path"));
    }

    #[test]
    fn numbers_keep_three_significant_digits() {
        assert_eq!([num(0.0), num(0.01234), num(1.5), num(12.34), num(1234.4)], ["0", "0.012", "1.50", "12.3", "1234"]);
    }
}
