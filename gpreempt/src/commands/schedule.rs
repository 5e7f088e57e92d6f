//! `gpreempt schedule --online SEL... --offline SEL...`: the scheduler library behind a status
//! line, JSON Lines (`--json`) and the summary.

use super::stderr::errln;
use std::{
    io::{IsTerminal, Write},
    time::Duration,
};

use anyhow::Result;
use gpreempt::{
    controller::vocabulary::Options,
    host::roots::Roots,
    pipeline::in_process::TracerOptions,
    schedule::{
        Interval, ScheduleConfig, ScheduleEvent, ScheduleReport, Scheduler, check_kernel, check_selection,
        discover::{Discovery, SysfsDiscovery, TracerDiscovery},
        kernel::DriverCalls,
        seams::Seams,
    },
    stats::Summary,
};

use super::{interrupt, stdout::outln};
use crate::cli::ScheduleArgs;

pub fn run(args: &ScheduleArgs) -> Result<()> {
    let stop = interrupt::install()?;
    let roots = Roots::default();
    let session = Options::default();
    let version = check_kernel(&session.device)?;
    let config = ScheduleConfig {
        interval: args.interval.max(Duration::from_millis(1)),
        hint_socket: args.hint_socket.clone(),
        roots: roots.clone(),
        session,
        ..args.settings.config(args.online.clone(), args.offline.clone())
    };
    // Bad input is refused before the tracer, which takes seconds to attach.
    check_selection(&config)?;
    // The tracer first, so nothing that appears while the scheduler starts is missed.
    let discovery: Box<dyn Discovery> = if args.no_trace {
        Box::new(SysfsDiscovery::new(roots.clone()))
    } else {
        match TracerDiscovery::start(&TracerOptions {
            version: Some(version),
            roots: roots.clone(),
            ..TracerOptions::default()
        }) {
            Ok(t) => Box::new(t),
            Err(e) => {
                errln!("gpreempt: the tracer could not attach ({e}); finding new processes in sysfs instead");
                Box::new(SysfsDiscovery::new(roots.clone()))
            }
        }
    };
    let status = !args.json && std::io::stderr().is_terminal();
    let json = args.json;
    let mut emit = move |e: &ScheduleEvent| show(e, json, status);
    let scheduler = Scheduler::start(config, Seams::host(roots.clone(), discovery), &mut emit)?;
    errln!("gpreempt: scheduling; Ctrl-C or SIGTERM resumes the offline queues, detaches and prints the summary");
    let report = scheduler.run(stop, &mut emit);
    if status {
        errln!();
    }
    if !json {
        print_report(&report);
    }
    if report.reaction_panicked {
        anyhow::bail!(
            "the reaction thread panicked (message above); its sessions resumed the offline queues and detached \
             every process while it unwound. Please report it with the message"
        );
    }
    if let Some(signal) = interrupt::received() {
        errln!("gpreempt: stopped by {signal}; offline queues resumed, every process detached");
    }
    Ok(())
}

fn show(e: &ScheduleEvent, json: bool, status: bool) {
    if json {
        // A closed stdout (a pipe whose reader left) must not stop the scheduler.
        if let Ok(line) = serde_json::to_string(e) {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
        return;
    }
    match e {
        ScheduleEvent::Interval(i) => {
            if status {
                status_line(i);
            }
        }
        ScheduleEvent::Transition(_) | ScheduleEvent::Summary(_) | ScheduleEvent::ResumeSkipped { .. } => {}
        ScheduleEvent::OfflineAttached { pid, comm, queues, gpus, picked_up } => errln!(
            // Debug formatting escapes control characters a process may put in its comm.
            "gpreempt: offline pid {pid} ({comm:?}) attached{}, {queues} queue(s) on GPU(s) {}",
            if *picked_up { " (picked up)" } else { "" },
            gpu_list(gpus)
        ),
        ScheduleEvent::OfflineAttachFailed { pid, error } => {
            errln!("gpreempt: offline pid {pid} not attached: {error}");
        }
        ScheduleEvent::OfflineDetached { pid, reason, detached } => {
            errln!("gpreempt: offline pid {pid} detached ({reason}; {} queue(s) resumed)", detached.resumed);
        }
        ScheduleEvent::OfflineQueuesHeld { pid, queues } => {
            errln!("gpreempt: offline pid {pid} created queues while held; {queues} queue(s) suspended now");
        }
        ScheduleEvent::OfflineQueuesReset { pid, queues } => errln!(
            "gpreempt: offline pid {pid}: the driver reset queue(s) {} after a failed preemption; gone (their \
             work is lost), not suspended or resumed again; its other queues go on",
            queues.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
        ),
        ScheduleEvent::OnlineAdded { pid, queues, snapshot, occupancy_files } => errln!(
            "gpreempt: online pid {pid} watched, {queues} queue(s){}{}",
            if *snapshot { " (learnt with one debug-trap snapshot: two runlist refreshes)" } else { "" },
            if *occupancy_files > 0 { ", cu_occupancy read" } else { ", no cu_occupancy file" }
        ),
        ScheduleEvent::OnlineSeenBy { pid, path, libraries, probes, why } => match path {
            gpreempt::schedule::DetectionPath::Doorbell => errln!(
                "gpreempt: online pid {pid} seen through the doorbell probe on {} ({}; indices cross-checked)",
                libraries.join(", "),
                if !probes.is_empty() && probes.iter().all(|p| p.implementation) {
                    "on the stores' implementation"
                } else {
                    "on the exported stores"
                }
            ),
            gpreempt::schedule::DetectionPath::Poll => errln!(
                "gpreempt: online pid {pid} seen through the index poll{}",
                why.as_deref().map_or_else(String::new, |w| format!(" ({w})"))
            ),
        },
        ScheduleEvent::OnlineArrival { pid, ports, cgroup, why } => match (cgroup, why) {
            (Some(cgroup), None) => errln!(
                "gpreempt: online pid {pid}'s requests seen on arrival (TCP port {} in cgroup {cgroup})",
                ports.iter().map(u16::to_string).collect::<Vec<_>>().join(", ")
            ),
            (_, why) => errln!(
                "gpreempt: online pid {pid}'s requests not seen on arrival ({}): seen at their first GPU work",
                why.as_deref().unwrap_or("not watched")
            ),
        },
        ScheduleEvent::OnlineQueue { pid, queue_id, .. } => {
            errln!("gpreempt: online pid {pid} queue {queue_id} watched");
        }
        ScheduleEvent::OnlineGone { pid } => errln!("gpreempt: online pid {pid} gone"),
        ScheduleEvent::HintMalformed { line, count } => {
            errln!("gpreempt: warning: hint line {line:?} is neither `begin` nor `end`, ignored ({count} so far)");
        }
        ScheduleEvent::WatchdogResumed { pid, held_ms, still_held, .. } => errln!(
            "gpreempt: warning: the session watchdog resumed offline pid {pid} after {held_ms} ms (the scheduler loop \
             stalled); {still_held} offline process(es) still held"
        ),
        ScheduleEvent::Warning { message } => errln!("gpreempt: warning: {message}"),
    }
}

fn gpu_list(gpus: &[gpreempt::domain::GpuId]) -> String {
    if gpus.is_empty() {
        return "none yet".into();
    }
    gpus.iter().map(|g| format!("{g:#x}")).collect::<Vec<_>>().join(", ")
}

/// One line, rewritten in place: per GPU its state and suspended share, then the totals.
fn status_line(i: &Interval) {
    let gpus: Vec<String> = i
        .gpus
        .iter()
        .map(|g| {
            format!("{:#x} {} {:>3.0}%", g.gpu_id, format!("{:?}", g.state).to_lowercase(), 100.0 * g.suspended_share)
        })
        .collect();
    let mut err = std::io::stderr().lock();
    let _ = write!(
        err,
        "\r{:>8.1} s  {}  transitions {:>6}  reaction p99 {:>7} us  step p99 {:>6} us   ",
        i.t_ms / 1e3,
        if gpus.is_empty() { "no GPU scheduled yet".to_owned() } else { gpus.join(" | ") },
        i.transitions,
        i.reaction_p99_us.map_or_else(|| "-".into(), |v| format!("{v:.0}")),
        i.loop_step_p99_us.map_or_else(|| "-".into(), |v| format!("{v:.0}")),
    );
    let _ = err.flush();
}

fn print_report(r: &ScheduleReport) {
    let line = |s: &Option<Summary>| {
        s.as_ref().map_or_else(
            || "none".to_owned(),
            |s| format!("p50 {:.1}  p99 {:.1}  max {:.1}  (n={})", s.p50, s.p99, s.max, s.count),
        )
    };
    outln!("ran {:.1} s, {} polls", r.elapsed_ms / 1e3, r.polls);
    let rt = &r.realtime;
    outln!(
        "reaction thread: {}{}{}{}; step interval, us: {}",
        if rt.policy == "fifo" { format!("SCHED_FIFO {}", rt.priority) } else { "normal priority".into() },
        rt.cpu.map_or_else(String::new, |c| format!(", on CPU {c}")),
        if rt.memory_locked { ", memory locked" } else { "" },
        rt.cpu_wake_limit_us.map_or_else(String::new, |l| {
            let out = if rt.idle_states_excluded.is_empty() {
                String::new()
            } else {
                format!(" (idle states kept out: {})", rt.idle_states_excluded.join(", "))
            };
            format!(", idle CPUs wake within {l} us{out}")
        }),
        line(&r.loop_step_us)
    );
    outln!(
        "transitions: {} suspends ({} failed), {} resumes {:?}, {} idle resumes skipped (gap shorter than their cost)",
        r.suspends,
        r.failed_suspends,
        r.resumes,
        r.resumes_by_reason,
        r.resumes_skipped
    );
    outln!("offline suspended {:.1} ms ({:.1}% of the time)", r.suspended_ms, 100.0 * r.suspended_share);
    outln!("detection (last poll without online work -> SUSPEND entered), us: {}", line(&r.detection_us));
    outln!("reaction (online work visible -> SUSPEND returned), us: {}", line(&r.reaction_us));
    outln!("suspend latency, us: {}", line(&r.suspend_us));
    outln!("resume latency, us: {}", line(&r.resume_us));
    outln!("online dispatch delay (pending seen -> consumed), us: {}", line(&r.online_dispatch_delay_us));
    let rate = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.1}/s"));
    outln!(
        "offline progress: {} dispatches; {} while running, {} overall",
        r.offline_dispatches,
        rate(r.offline_rate_running_per_s),
        rate(r.offline_rate_overall_per_s)
    );
    for a in &r.arrival {
        let c = &a.counts;
        let p = &a.pending;
        match &a.why {
            None => outln!(
                "arrivals of online pid {}: {} requests ({} segments: {} probes or scrapes, {} other, {} TLS); {} \
                 arrivals: {} held before their first kernel, {} late ({} of them before their SUSPENDs were due), {} \
                 wasted, {} found it busy, {} submissions taken as an earlier request's; lead, us: {}; arrival -> SUSPEND entered, us: {} (of it, arrival -> the \
                 reaction thread took the record: {}; arrived during a transition's ioctls: {})",
                a.pid,
                c.allowed,
                c.segments,
                c.denied,
                c.unmatched,
                c.tls,
                p.arrivals,
                p.served,
                p.late,
                p.late_before_issue,
                p.wasted,
                p.busy,
                p.continued,
                line(&a.lead_us),
                line(&a.arrival_to_suspend_us),
                line(&a.arrival_to_taken_us),
                line(&a.arrival_to_suspend_in_transition_us)
            ),
            Some(why) => outln!("arrivals of online pid {}: not seen ({why})", a.pid),
        }
        if c.tls > 0 && c.allowed == 0 {
            outln!(
                "  its traffic is TLS: the first bytes are opaque, so no request was told from a probe; terminate TLS \
                 before the server or give --arrival-allow any"
            );
        }
    }
    if let Some(h) = &r.hints {
        outln!("hints: {} begin, {} end, {} malformed, {} connection(s)", h.begins, h.ends, h.malformed, h.connections);
    }
    if let Some(k) = &r.kernel {
        let calls = |name: &str, c: &DriverCalls| {
            outln!(
                "in the driver, {name} ({} calls), us: {}; unmap {}; fence wait {}; remap {}",
                c.count,
                line(&c.duration_us),
                line(&c.unmap_us),
                line(&c.fence_wait_us),
                line(&c.remap_us)
            );
            outln!(
                "  collateral: {} queue(s) of other processes preempted, {} of them online",
                c.collateral_queues,
                c.collateral_online_queues
            );
        };
        calls("suspend", &k.suspend);
        calls("resume", &k.resume);
        if !k.collateral_pids.is_empty() {
            let pids: Vec<String> = k.collateral_pids.iter().map(ToString::to_string).collect();
            outln!("  processes preempted as collateral: {}", pids.join(" "));
        }
    }
    for g in &r.gpus {
        let rate = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.1}/s"));
        outln!(
            "GPU {:#x}: {}; {} suspends, {} resumes, {} skipped; suspended {:.1}%; reaction p99 {} us; offline {} \
             dispatches ({} overall)",
            g.gpu_id,
            if g.scheduled { "scheduled" } else { "no online work seen: offline never touched" },
            g.suspends,
            g.resumes,
            g.resumes_skipped,
            100.0 * g.suspended_share,
            g.reaction_us.as_ref().map_or_else(|| "-".into(), |s| format!("{:.0}", s.p99)),
            g.offline_dispatches,
            rate(g.offline_rate_overall_per_s)
        );
    }
    if r.reports_dropped > 0 {
        outln!("records dropped (this side fell behind the reaction thread): {}", r.reports_dropped);
    }
    outln!("runlist refreshes from attaching: {}", r.attach_refreshes);
    outln!(
        "gpreempt CPU: {:.1} ms ({:.2}% of one core); reaction thread {:.1} ms, of it {:.1} ms inside suspends \
         and resumes (the driver's work) and {:.1} ms polling",
        r.cpu_ms,
        100.0 * r.cpu_share,
        r.reaction_cpu_ms,
        r.transition_cpu_ms,
        (r.reaction_cpu_ms - r.transition_cpu_ms).max(0.0)
    );
}
