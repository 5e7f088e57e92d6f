//! `gpreempt agent` scraped by a real Prometheus server (Debian's `prometheus`, installed by
//! `cargo xtask setup`), against the KFD emulator: Prometheus's HTTP API reports the exact queue
//! counts of two workloads and the eviction of one; an exited workload's series leave after the
//! grace period; a configured policy suspends an offline job during an online server's requests
//! and Prometheus has exactly the transitions the agent logs; a broken config keeps the running
//! policy (logged and counted; SIGHUP after it reloads nothing more), a changed one restarts it
//! with no signal at all (the agent watches the config's directory, as a ConfigMap update needs);
//! SIGTERM exits 0 and leaves the offline job running and detached.

use std::{
    net::SocketAddr,
    path::Path,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use gpreempt_tests::{
    LineHelper, agent,
    daemon::Daemon,
    emu_workload, log_field,
    prometheus::{free_port, http_get, query_at},
    scratch,
    target::tracer_pid,
};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use serde_json::Value;

/// Poll `promql` until its results equal `expected` (as (label, value) pairs of `label`), or
/// 120 s pass; returns the last results either way, for the caller's exact assertion.
fn settle(prometheus: SocketAddr, promql: &str, label: &str, expected: &[(&str, f64)]) -> Vec<(String, f64)> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut got: Vec<(String, f64)> = query_at(prometheus, promql)
            .unwrap_or_default()
            .into_iter()
            .map(|(m, v)| (m[label].as_str().unwrap_or("").to_owned(), v))
            .collect();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        let want: Vec<(String, f64)> = expected.iter().map(|(l, v)| ((*l).to_owned(), *v)).collect();
        if got == want || Instant::now() > deadline {
            return got;
        }
        thread::sleep(Duration::from_millis(500));
    }
}

/// A policy over the online servers and the offline job (pids), named `name`.
fn policy_config(name: &str, online: &[u32], offline: u32) -> String {
    let online: Vec<String> = online.iter().map(|p| format!("\"{p}\"")).collect();
    format!(
        "process_grace_s = 2\n\n[[policy]]\nname = \"{name}\"\nonline = [{}]\noffline = [\"{offline}\"]\nidle = \"5ms\"\npoll = \"200us\"\n",
        online.join(", ")
    )
}

const BROKEN: &str =
    "process_grace_s = 2\n\n[[policy]]\nname = \"second\"\nonline = [\"pod:serving\"]\noffline = [\"2\"]\n";

/// Online requests per server: one 20 ms dispatch every 150 ms.
const REQUESTS: u64 = 6;

/// A server that runs `REQUESTS` requests on GPU 0x1000 once told `go`.
fn online_server() -> Result<LineHelper> {
    LineHelper::spawn("emu-workload", &emu_workload::online_server(&REQUESTS.to_string()))
}

/// `go`, then every request's reply and the summary.
fn serve(server: &mut LineHelper) -> Result<()> {
    server.send("go")?;
    for _ in 0..REQUESTS {
        server.recv()?;
    }
    let summary = server.recv()?;
    assert_eq!(summary["event"], "summary", "{summary}");
    Ok(())
}

/// Prometheus's (suspends, resumes) of `policy`, once every suspend has its resume and the value
/// held for two scrapes with at least `suspends_at_least` suspends (or 120 s passed).
fn settled_transitions(prometheus: SocketAddr, policy: &str, suspends_at_least: f64) -> Result<(f64, f64)> {
    let promql = format!("gpreempt_scheduler_transitions_total{{policy=\"{policy}\"}}");
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = (-1.0, -1.0);
    loop {
        let mut now = (0.0, 0.0);
        for (labels, v) in query_at(prometheus, &promql)? {
            // Per GPU: the workloads share the emulator's first GPU.
            if labels["gpu_id"] != "4096" {
                bail!("a transition series of another GPU: {labels}");
            }
            match labels["transition"].as_str() {
                Some("suspend") => now.0 = v,
                Some("resume") => now.1 = v,
                other => bail!("transition label {other:?}"),
            }
        }
        if (now == last && now.0 >= suspends_at_least && now.0 == now.1) || Instant::now() > deadline {
            return Ok(now);
        }
        last = now;
        thread::sleep(Duration::from_millis(2500));
    }
}

/// The read indices of a `run` workload's queues.
fn rptr(w: &mut LineHelper) -> Result<u64> {
    let reply = w.cmd("rptr")?;
    Ok(reply["rptr"].as_array().context("no rptr")?.iter().filter_map(Value::as_u64).sum())
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[test]
fn agent_metrics_scraped_by_prometheus_follow_queues_evictions_policies_and_reloads() -> Result<()> {
    let dir = scratch("emu-agent")?;
    // The policy's processes exist before the agent: its scheduler finds them at start.
    let mut offline =
        LineHelper::spawn("emu-workload", &["run", "--gpu-id", "0x1000", "--queues", "1", "--runtime-enable"])?;
    let (mut online1, mut online2) = (online_server()?, online_server()?);
    let servers = [online1.pid(), online2.pid()];
    let config = dir.join("agent.toml");
    write(&config, &policy_config("first", &servers, offline.pid()))?;
    let (mut agent, started) = agent::start(&config)?;
    assert_eq!(log_field(&started, "policies"), Some("first"));
    let attached = agent.wait_line("offline process attached", Duration::from_secs(60))?;
    assert_eq!(log_field(&attached, "pid"), Some(offline.pid().to_string().as_str()), "{attached}");
    assert_eq!(log_field(&attached, "queues"), Some("1"));
    agent.wait_lines(&[r#"msg="policy started" policy=first"#], Duration::from_secs(60))?;
    assert_eq!(tracer_pid(offline.pid())?, agent.pid(), "the policy thread holds the offline job");
    let agent_addr: SocketAddr = log_field(&started, "metrics_addr").context("no metrics_addr")?.parse()?;
    assert_eq!(http_get(agent_addr, "/healthz")?, (200, "ok\n".to_owned()));

    let prom_addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let prom_config = dir.join("prometheus.yml");
    write(
        &prom_config,
        &format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: gpreempt\n    static_configs:\n      - targets: ['{agent_addr}']\n"
        ),
    )?;
    let mut prometheus = Daemon::spawn(
        "prometheus",
        Command::new("/usr/bin/prometheus")
            .arg(format!("--config.file={}", prom_config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address={prom_addr}")),
    )?;
    prometheus.wait_line("Server is ready to receive web requests", Duration::from_secs(180))?;
    assert_eq!(settle(prom_addr, "up{job=\"gpreempt\"}", "job", &[("gpreempt", 1.0)]), [("gpreempt".into(), 1.0)]);

    // Two workloads with idle rings: 2 queues on GPU 0x1000, 3 on GPU 0x2000.
    let a = LineHelper::spawn(
        "emu-workload",
        &["run", "--gpu-id", "0x1000", "--queues", "2", "--fill-us", "0", "--runtime-enable"],
    )?;
    let b = LineHelper::spawn("emu-workload", &["run", "--gpu-id", "0x2000", "--queues", "3", "--fill-us", "0"])?;
    let (pa, pb) = (a.pid().to_string(), b.pid().to_string());
    let active = format!("gpreempt_queues{{state=\"active\",kfd_process_id=~\"{pa}|{pb}\"}}");
    let got = settle(prom_addr, &active, "kfd_process_id", &[(&pa, 2.0), (&pb, 3.0)]);
    assert_eq!(got, [(pa.clone(), 2.0), (pb.clone(), 3.0)]);
    let by_gpu = settle(prom_addr, &format!("sum by (gpu_id) ({active})"), "gpu_id", &[("4096", 2.0), ("8192", 3.0)]);
    assert_eq!(by_gpu, [("4096".into(), 2.0), ("8192".into(), 3.0)]);
    let creates = format!("gpreempt_queue_creates_total{{kfd_process_id=~\"{pa}|{pb}\"}}");
    assert_eq!(
        settle(prom_addr, &creates, "kfd_process_id", &[(&pa, 2.0), (&pb, 3.0)]),
        [(pa.clone(), 2.0), (pb.clone(), 3.0)]
    );

    // The policy at work: at most one suspend per request (plus one for a burst a stalled vCPU
    // split), every one resumed once the server is idle.
    serve(&mut online1)?;
    let (s1, r1) = settled_transitions(prom_addr, "first", 1.0)?;
    assert!((1.0..=(REQUESTS + 1) as f64).contains(&s1), "{s1} suspends for {REQUESTS} requests");
    assert_eq!(r1, s1, "every suspend resumed");

    // A scripted TTM eviction of A and its restore (the emulator runs kfd_process_evict_queues).
    std::fs::write("/sys/kernel/kfd_emu/evict", &pa)?;
    thread::sleep(Duration::from_millis(300));
    std::fs::write("/sys/kernel/kfd_emu/restore", &pa)?;
    // One eviction and one restore on each GPU A has a device on (the emulator, like amdgpu,
    // evicts per device; both emulated GPUs), each series labelled with its gpu_id.
    let per_gpu = [("4096", 1.0), ("8192", 1.0)];
    let expected: Vec<(String, f64)> = per_gpu.iter().map(|(g, v)| (g.to_string(), *v)).collect();
    let evictions = format!("gpreempt_evictions_total{{kfd_process_id=\"{pa}\",trigger=\"ttm\"}}");
    assert_eq!(settle(prom_addr, &evictions, "gpu_id", &per_gpu), expected);
    let restores = format!("gpreempt_restores_total{{kfd_process_id=\"{pa}\"}}");
    assert_eq!(settle(prom_addr, &restores, "gpu_id", &per_gpu), expected);
    assert_eq!(
        settle(prom_addr, &active, "kfd_process_id", &[(&pa, 2.0), (&pb, 3.0)]),
        [(pa.clone(), 2.0), (pb.clone(), 3.0)]
    );

    // B exits: its series leave the agent once the 2 s grace period has passed.
    assert!(b.finish()?.success());
    let deadline = Instant::now() + Duration::from_secs(60);
    let needle = format!("kfd_process_id=\"{pb}\"");
    let mut exposition = http_get(agent_addr, "/metrics")?.1;
    while exposition.contains(&needle) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(500));
        exposition = http_get(agent_addr, "/metrics")?.1;
    }
    assert!(!exposition.contains(&needle), "{exposition}");
    assert!(exposition.contains(&format!("kfd_process_id=\"{pa}\"")), "{exposition}");

    // A broken config: rejected with its line, counted once, whether the directory watch or the
    // SIGHUP saw it first (the other finds the content unchanged); the running policy stays and
    // keeps scheduling (the second server's requests add transitions).
    write(&config, BROKEN)?;
    agent.signal(Signal::SIGHUP)?;
    let rejected = agent.wait_line("config rejected", Duration::from_secs(60))?;
    assert!(rejected.contains("line 5: policy `second`, online: `pod:serving` is not a pod selector"), "{rejected}");
    assert_eq!(log_field(&rejected, "policies"), Some("first"), "the previous config stays in force");
    let reloads = "gpreempt_config_reloads_total";
    assert_eq!(settle(prom_addr, reloads, "result", &[("rejected", 1.0)]), [("rejected".into(), 1.0)]);
    serve(&mut online2)?;
    let (s2, r2) = settled_transitions(prom_addr, "first", s1 + 1.0)?;
    assert!((1.0..=(REQUESTS + 1) as f64).contains(&(s2 - s1)), "{} suspends for {REQUESTS} requests", s2 - s1);
    assert_eq!(r2, s2, "every suspend resumed");

    // A changed policy restarts: the old one resumes and detaches first, and its final count is
    // exactly what Prometheus scraped; the new one attaches the offline job again. The servers
    // have exited: the new policy's online process is A, whose rings stay empty. No signal: the
    // agent's watch on the config's directory sees the new content (a ConfigMap update).
    write(&config, &policy_config("third", &[a.pid()], offline.pid()))?;
    let lines = agent.wait_lines(
        // The reload's line by its policies too: a needle's words are matched one by one, and the
        // SIGHUP above logged `msg="config unchanged, nothing reloaded"`.
        &[
            r#"msg="policy stopped" policy=first"#,
            r#"msg="config reloaded" policies=third"#,
            r#"msg="policy started" policy=third"#,
        ],
        Duration::from_secs(120),
    )?;
    let stopped = &lines[0];
    assert_eq!(log_field(stopped, "suspends"), Some(s2.to_string().as_str()), "{stopped}");
    assert_eq!(log_field(stopped, "resumes"), Some(r2.to_string().as_str()), "{stopped}");
    assert_eq!(log_field(stopped, "transitions"), Some((s2 + r2).to_string().as_str()), "{stopped}");
    assert_eq!(
        (log_field(&lines[1], "policies"), log_field(&lines[1], "trigger")),
        (Some("third"), Some("file-change"))
    );
    assert_eq!(
        settle(prom_addr, reloads, "result", &[("applied", 1.0), ("rejected", 1.0)]),
        [("applied".into(), 1.0), ("rejected".into(), 1.0)]
    );
    assert_eq!(tracer_pid(offline.pid())?, agent.pid(), "the new policy holds the offline job");

    // SIGTERM: a clean exit; the offline job is detached and keeps running, A too.
    agent.signal(Signal::SIGTERM)?;
    let lines = agent.wait_lines(&[r#"msg="policy stopped" policy=third"#, "msg=exiting"], Duration::from_secs(60))?;
    assert_eq!(log_field(&lines[0], "transitions"), Some("0"), "A never had work: {}", lines[0]);
    assert_eq!(log_field(&lines[1], "signal"), Some("SIGTERM"));
    assert_eq!(log_field(&lines[1], "dropped"), Some("0"));
    let status = agent.wait()?;
    assert_eq!(status.code(), Some(0));
    assert_eq!(tracer_pid(offline.pid())?, 0, "the offline job is detached");
    let before = rptr(&mut offline)?;
    thread::sleep(Duration::from_millis(500));
    let after = rptr(&mut offline)?;
    assert!(after > before, "the offline job runs after the agent's exit: read index {before} -> {after}");
    kill(Pid::from_raw(a.pid() as i32), None).context("the workload survives the agent")?;
    drop(a);
    prometheus.signal(Signal::SIGTERM)?;
    prometheus.wait()?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Resident set size of `pid` in KiB.
fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let value = gpreempt::host::procinfo::status_field(&status, "VmRSS").context("no VmRSS")?;
    Ok(value.trim_end_matches("kB").trim().parse()?)
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat.rsplit_once(')').context("no comm")?.1.split_whitespace().collect();
    Ok(fields[11].parse::<u64>()? + fields[12].parse::<u64>()?)
}

/// Lines of the exposition that belong to a process.
fn process_series(agent: SocketAddr) -> Result<usize> {
    Ok(http_get(agent, "/metrics")?.1.lines().filter(|l| l.contains("kfd_process_id=")).count())
}

/// Processes the soak runs at once.
const CHURN_WORKERS: u32 = 4;

/// `field` of /proc/meminfo, KiB (the guest's kernel memory, to tell a leak in the driver from
/// one in the agent).
fn meminfo_kib(field: &str) -> Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo")?;
    let value = gpreempt::host::procinfo::status_field(&text, field).with_context(|| format!("no {field}"))?;
    Ok(value.trim_end_matches("kB").trim().parse()?)
}

/// One sample of the agent and the guest during the soak.
#[derive(Clone, Copy, Debug)]
struct Sample {
    rss_kib: u64,
    cpu_ticks: u64,
    series: usize,
    unreclaimable_slab_kib: u64,
    available_kib: u64,
}

fn sample(agent_pid: u32, addr: SocketAddr) -> Result<Sample> {
    Ok(Sample {
        rss_kib: rss_kib(agent_pid)?,
        cpu_ticks: cpu_ticks(agent_pid)?,
        series: process_series(addr)?,
        unreclaimable_slab_kib: meminfo_kib("SUnreclaim")?,
        available_kib: meminfo_kib("MemAvailable")?,
    })
}

/// A line on the test's stderr that libtest does not capture (its capture takes `eprintln!`
/// only): the soak's samples are its result, pass or fail.
macro_rules! soak_line {
    ($($arg:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Short-lived KFD processes through the agent (10,000; `GPREEMPT_SOAK_PROCESSES` sets another
/// count): once their grace period has passed, the per-process series are back to the baseline
/// exactly and the agent's resident memory to within 4 MiB of it; no record is lost. A sample
/// every 500 processes gives the peak.
#[test]
#[ignore = "the 10,000-process soak takes tens of minutes under TCG: `cargo xtask test --soak --filter soak`"]
fn agent_metrics_soak_short_lived_processes_return_to_the_baseline() -> Result<()> {
    let n: u32 = std::env::var("GPREEMPT_SOAK_PROCESSES").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    // virtme-ng boots the guest with a console log level that hides even a panic; every kernel
    // message on the console makes a crash, a WARN or the OOM killer visible in the run's output.
    std::fs::write("/proc/sys/kernel/printk", "7").context("raising the console log level")?;
    let dir = scratch("emu-agent")?.join("soak");
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("agent.toml");
    write(&config, "process_grace_s = 1\n")?;
    let (mut agent, started) = agent::start(&config)?;
    let addr: SocketAddr = log_field(&started, "metrics_addr").context("no metrics_addr")?.parse()?;
    let pid = agent.pid();
    // Four at a time (each opens /dev/kfd, creates a queue that runs, and exits with it), so
    // processes come and go while others run, as on a busy node.
    let churn = |count: u32| -> Result<()> {
        thread::scope(|scope| {
            let workers: Vec<_> = (0..CHURN_WORKERS)
                .map(|w| {
                    scope.spawn(move || -> Result<()> {
                        for _ in (w..count).step_by(CHURN_WORKERS as usize) {
                            let p = LineHelper::spawn("emu-workload", &["run", "--gpu-id", "0x1000", "--queues", "1"])?;
                            assert!(p.finish()?.success());
                        }
                        Ok(())
                    })
                })
                .collect();
            workers.into_iter().try_for_each(|w| w.join().map_err(|_| anyhow::anyhow!("a churn worker panicked"))?)
        })
    };
    let settle = || -> Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let series = process_series(addr)?;
            if series == 0 || Instant::now() > deadline {
                return Ok(series);
            }
            thread::sleep(Duration::from_millis(500));
        }
    };
    // Warm up, then take the baseline: the first few hundred processes grow the agent once
    // (a 10,000-process run went from 20.0 MiB after 50 processes to 37.1 MiB by 500, then
    // stayed at exactly that through 10,000: the allocator's arenas, the ring buffer's pages
    // and the maps reaching their working size). Growth after this point is what a leak is.
    churn(500)?;
    assert_eq!(settle()?, 0, "no process's series stay past the grace period");
    let t0 = Instant::now();
    let base = sample(pid, addr)?;
    soak_line!("soak: baseline {base:?}");
    let mut peak = base;
    let mut done = 0;
    while done < n {
        let step = (n - done).min(500);
        churn(step)?;
        done += step;
        let s = sample(pid, addr)?;
        soak_line!("soak: {done} processes, {:.0} s: {s:?}", t0.elapsed().as_secs_f64());
        peak.rss_kib = peak.rss_kib.max(s.rss_kib);
        peak.series = peak.series.max(s.series);
        peak.unreclaimable_slab_kib = peak.unreclaimable_slab_kib.max(s.unreclaimable_slab_kib);
        // The "peak" of available memory is its low point.
        peak.available_kib = peak.available_kib.min(s.available_kib);
    }
    let elapsed = t0.elapsed().as_secs_f64();
    assert_eq!(settle()?, 0, "series back to the baseline");
    let after = sample(pid, addr)?;
    let exposition = http_get(addr, "/metrics")?.1;
    let lost: f64 = exposition
        .lines()
        .filter(|l| l.starts_with("gpreempt_tracer_lost_records_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    let tick = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.unwrap_or(100) as f64;
    let cpu_s = (after.cpu_ticks - base.cpu_ticks) as f64 / tick;
    soak_line!(
        "soak: {n} processes in {elapsed:.1} s; agent RSS KiB baseline {} peak {} after {}; per-process series \
         baseline {} peak {} after {}; agent CPU {cpu_s:.1} s ({:.1}% of one CPU); guest SUnreclaim KiB baseline {} \
         peak {} after {}; guest MemAvailable KiB baseline {} lowest {} after {}",
        base.rss_kib,
        peak.rss_kib,
        after.rss_kib,
        base.series,
        peak.series,
        after.series,
        100.0 * cpu_s / elapsed,
        base.unreclaimable_slab_kib,
        peak.unreclaimable_slab_kib,
        after.unreclaimable_slab_kib,
        base.available_kib,
        peak.available_kib,
        after.available_kib,
    );
    assert_eq!(lost, 0.0, "{exposition}");
    assert_eq!((base.series, after.series), (0, 0));
    assert!(after.rss_kib <= base.rss_kib + 4096, "RSS grew from {} KiB to {} KiB", base.rss_kib, after.rss_kib);
    agent.signal(Signal::SIGTERM)?;
    assert_eq!(agent.wait()?.code(), Some(0));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
