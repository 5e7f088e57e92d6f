//! The scheduler's per-GPU state as `top` shows it, read from a running `gpreempt agent`'s
//! `/metrics` endpoint (the agent's `[[policy]]` tables each run the scheduler of `gpreempt
//! schedule`): per policy and GPU, the suspend and resume transitions, the time held, the
//! reaction (online work seen → SUSPEND returned) and the idle resumes skipped. A standalone
//! `gpreempt schedule` serves no endpoint; its suspends and resumes still show in `top` through
//! the tracer (queue states and spans).
//!
//! The endpoint is the agent's OpenMetrics text (agent/http.rs, metrics/mod.rs); this reads the
//! scheduler's families out of it with plain HTTP/1.1 over a local TCP connection, by the names
//! and labels the exporter registers them under (`deploy::series`).

use std::{
    collections::{BTreeMap, HashSet},
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use serde::Serialize;

use crate::{
    deploy::series::{self, METRICS_PATH, label},
    domain::{GpuId, TransitionKind},
};

/// One policy's scheduler on one GPU, as the agent reports it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SchedulerGpu {
    pub policy: String,
    pub gpu_id: GpuId,
    /// `held` while more suspends than resumes were counted (the offline queues on this GPU are
    /// suspended now), else `running`.
    pub state: &'static str,
    pub suspends: u64,
    pub resumes: u64,
    /// Seconds the offline queues were held, counted when each hold ended.
    pub held_s: f64,
    pub reactions: u64,
    /// Mean reaction, µs to 0.1 (`None` before the first).
    pub reaction_mean_us: Option<f64>,
    /// The histogram bucket bound the 99th percentile falls under, µs (infinite past the last).
    pub reaction_p99_le_us: Option<f64>,
    pub resumes_skipped: u64,
}

/// What `top` knows of the scheduler.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SchedulerStatus {
    /// Where it was read (`http://ADDR/metrics`), `None` when `--no-agent`.
    pub source: Option<String>,
    /// Why it could not be read (no agent listening, not an agent, …).
    pub error: Option<String>,
    /// Per policy and GPU, in (policy, gpu) order.
    pub gpus: Vec<SchedulerGpu>,
}

#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error(
        "no gpreempt agent answers on {addr} ({source}); start `gpreempt agent` with [[policy]] \
         tables to see the scheduler here, or pass --agent ADDR (on Kubernetes: the agent pod's IP:9464, \
         see docs/guide/kubernetes.md; --no-agent: do not ask)"
    )]
    Connect { addr: SocketAddr, source: std::io::Error },
    #[error("reading {addr}{path}: {source}", path = METRICS_PATH)]
    Io { addr: SocketAddr, source: std::io::Error },
    #[error("{addr} answered `{status}` instead of 200 OK: is it a gpreempt agent's metrics address?")]
    Status { addr: SocketAddr, status: String },
}

/// How long a scrape may take (the agent answers a local request in well under a millisecond;
/// this bounds a wedged or foreign listener).
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);

/// GET `http://addr/metrics` ([`METRICS_PATH`]): the body, or why not.
pub fn scrape(addr: SocketAddr) -> Result<String, ScrapeError> {
    let io = |source| ScrapeError::Io { addr, source };
    let mut s =
        TcpStream::connect_timeout(&addr, SCRAPE_TIMEOUT).map_err(|source| ScrapeError::Connect { addr, source })?;
    s.set_read_timeout(Some(SCRAPE_TIMEOUT)).map_err(io)?;
    s.set_write_timeout(Some(SCRAPE_TIMEOUT)).map_err(io)?;
    s.write_all(format!("GET {METRICS_PATH} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())
        .map_err(io)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(io)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.lines().next().unwrap_or("").to_owned();
    if !status.starts_with("HTTP/1.1 200") && !status.starts_with("HTTP/1.0 200") {
        return Err(ScrapeError::Status { addr, status });
    }
    Ok(body.to_owned())
}

/// One sample line: `name{label="value",…} number`.
struct Sample<'a> {
    name: &'a str,
    labels: BTreeMap<&'a str, String>,
    value: f64,
}

/// Parse one exposition line; comments and malformed lines give `None`.
fn sample(line: &str) -> Option<Sample<'_>> {
    if line.starts_with('#') || line.is_empty() {
        return None;
    }
    let (name, rest) = match line.find('{') {
        Some(at) => (&line[..at], &line[at + 1..]),
        None => {
            let (name, value) = line.split_once(' ')?;
            return Some(Sample { name, labels: BTreeMap::new(), value: value.trim().parse().ok()? });
        }
    };
    let mut labels = BTreeMap::new();
    let mut rest = rest;
    loop {
        rest = rest.trim_start_matches(',');
        if let Some(after) = rest.strip_prefix('}') {
            let value = after.split_whitespace().next()?;
            return Some(Sample { name, labels, value: value.parse().ok()? });
        }
        let (key, after) = rest.split_once("=\"")?;
        // The value ends at the first quote not escaped by a backslash.
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break i,
                c => value.push(c),
            }
        };
        labels.insert(key, value);
        rest = &after[end + 1..];
    }
}

/// What a scheduler sample fills in `top`'s row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Transitions,
    Held,
    ResumesSkipped,
    Reactions,
    ReactionSum,
    ReactionBucket,
}

/// The samples `top` reads, by their names in the exposition.
fn reads() -> [(String, Field); 6] {
    [
        (series::SCHEDULER_TRANSITIONS.sample(series::Sample::Total), Field::Transitions),
        (series::SCHEDULER_SUSPENDED.sample(series::Sample::Total), Field::Held),
        (series::SCHEDULER_RESUMES_SKIPPED.sample(series::Sample::Total), Field::ResumesSkipped),
        (series::SCHEDULER_REACTION.sample(series::Sample::Count), Field::Reactions),
        (series::SCHEDULER_REACTION.sample(series::Sample::Sum), Field::ReactionSum),
        (series::SCHEDULER_REACTION.sample(series::Sample::Bucket), Field::ReactionBucket),
    ]
}

/// The scheduler families of an agent's exposition, per (policy, gpu).
pub fn parse(exposition: &str) -> Vec<SchedulerGpu> {
    #[derive(Default)]
    struct Acc {
        row: SchedulerGpu,
        reaction_sum_s: f64,
        buckets: Vec<(f64, f64)>,
    }
    // Every sample of a scheduler family names a (policy, gpu), read or not.
    let scheduler: HashSet<String> = series::SCHEDULER.iter().flat_map(series::Family::samples).collect();
    let reads = reads();
    let mut by: BTreeMap<(String, u32), Acc> = BTreeMap::new();
    for s in exposition.lines().filter_map(sample) {
        if !scheduler.contains(s.name) {
            continue;
        }
        let (Some(policy), Some(gpu)) =
            (s.labels.get(label::POLICY), s.labels.get(label::GPU_ID).and_then(|g| g.parse().ok()))
        else {
            continue;
        };
        let acc = by.entry((policy.clone(), gpu)).or_default();
        let count = s.value.max(0.0) as u64;
        match reads.iter().find(|(name, _)| name == s.name).map(|&(_, field)| field) {
            Some(Field::Transitions) => {
                match s.labels.get(label::TRANSITION).and_then(|t| TransitionKind::from_name(t)) {
                    Some(TransitionKind::Suspend) => acc.row.suspends = count,
                    Some(TransitionKind::Resume) => acc.row.resumes = count,
                    None => {}
                }
            }
            Some(Field::Held) => acc.row.held_s = s.value,
            Some(Field::ResumesSkipped) => acc.row.resumes_skipped = count,
            Some(Field::Reactions) => acc.row.reactions = count,
            Some(Field::ReactionSum) => acc.reaction_sum_s = s.value,
            Some(Field::ReactionBucket) => {
                let le = s
                    .labels
                    .get(label::LE)
                    .and_then(|l| if l == "+Inf" { Some(f64::INFINITY) } else { l.parse().ok() });
                if let Some(le) = le {
                    acc.buckets.push((le, s.value));
                }
            }
            None => {}
        }
    }
    by.into_iter()
        .map(|((policy, gpu), mut acc)| {
            let mut row = acc.row;
            row.policy = policy;
            row.gpu_id = GpuId(gpu);
            row.state = if row.suspends > row.resumes { "held" } else { "running" };
            if row.reactions > 0 {
                row.reaction_mean_us = Some((acc.reaction_sum_s / row.reactions as f64 * 1e7).round() / 10.0);
                acc.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
                let rank = 0.99 * row.reactions as f64;
                row.reaction_p99_le_us =
                    acc.buckets.iter().find(|(_, n)| *n >= rank).map(|(le, _)| (le * 1e7).round() / 10.0);
            }
            row
        })
        .collect()
}

/// Scrape and parse: the status `top` shows (an unreachable agent is a status, not a failure).
pub fn read(addr: SocketAddr) -> SchedulerStatus {
    let source = Some(format!("http://{addr}{METRICS_PATH}"));
    match scrape(addr) {
        Ok(body) => SchedulerStatus { source, error: None, gpus: parse(&body) },
        Err(e) => SchedulerStatus { source, error: Some(e.to_string()), gpus: Vec::new() },
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::metrics::Metrics;

    #[test]
    fn reads_the_agents_own_exposition_per_policy_and_gpu() {
        let m = Metrics::new("node-a", "0.1.0");
        // colocate on 0x1000: two suspends, one resume (held now); 3 ms held; reactions of 40 µs
        // and 900 µs; one skipped resume. batch on 0x2000: one suspend and one resume.
        m.scheduler_transition("colocate", GpuId(0x1000), TransitionKind::Suspend);
        m.scheduler_transition("colocate", GpuId(0x1000), TransitionKind::Resume);
        m.scheduler_transition("colocate", GpuId(0x1000), TransitionKind::Suspend);
        m.scheduler_suspended("colocate", GpuId(0x1000), 0.003);
        m.scheduler_reaction("colocate", GpuId(0x1000), 40e-6);
        m.scheduler_reaction("colocate", GpuId(0x1000), 900e-6);
        m.scheduler_resume_skipped("colocate", GpuId(0x1000));
        m.scheduler_transition("batch", GpuId(0x2000), TransitionKind::Suspend);
        m.scheduler_transition("batch", GpuId(0x2000), TransitionKind::Resume);
        let rows = parse(&m.encode());
        assert_eq!(rows.len(), 2, "{rows:?}");
        let (batch, colocate) = (&rows[0], &rows[1]);
        assert_eq!(
            (batch.policy.as_str(), batch.gpu_id, batch.state, batch.suspends, batch.resumes, batch.reactions),
            ("batch", GpuId(0x2000), "running", 1, 1, 0)
        );
        assert_eq!((batch.reaction_mean_us, batch.reaction_p99_le_us), (None, None));
        assert_eq!(
            (colocate.policy.as_str(), colocate.gpu_id, colocate.state, colocate.suspends, colocate.resumes),
            ("colocate", GpuId(0x1000), "held", 2, 1)
        );
        assert_eq!((colocate.held_s, colocate.reactions, colocate.resumes_skipped), (0.003, 2, 1));
        assert_eq!(colocate.reaction_mean_us, Some(470.0));
        // The second sample (900 µs) is the 99th percentile: under the 1 ms bucket bound.
        assert_eq!(colocate.reaction_p99_le_us, Some(1000.0));
    }

    /// Every sample and label `top` reads is one the agent's exporter writes (both take the names
    /// from deploy::series; this holds them to what the encoder makes of them), and every
    /// scheduler sample it writes is one `parse` knows.
    #[test]
    fn every_name_top_reads_is_one_the_exporter_emits() {
        let m = Metrics::new("node-a", "0.1.0");
        let gpu = GpuId(0x1000);
        m.scheduler_transition("p", gpu, TransitionKind::Suspend);
        m.scheduler_transition("p", gpu, TransitionKind::Resume);
        m.scheduler_suspended("p", gpu, 0.5);
        m.scheduler_reaction("p", gpu, 40e-6);
        m.scheduler_detection("p", gpu, 1e-6);
        m.scheduler_resume_skipped("p", gpu);
        m.scheduler_loop_step("p", 1e-6, 2e-6, 3e-6);
        let text = m.encode();
        let emitted: Vec<Sample<'_>> = text.lines().filter_map(sample).collect();
        // Samples per name: two transitions, one each of the counters, the histogram's 16
        // bounds and +Inf.
        let expected = [
            (Field::Transitions, 2),
            (Field::Held, 1),
            (Field::ResumesSkipped, 1),
            (Field::Reactions, 1),
            (Field::ReactionSum, 1),
            (Field::ReactionBucket, 17),
        ];
        for ((name, field), (expected_field, n)) in reads().into_iter().zip(expected) {
            assert_eq!(field, expected_field);
            let of_name: Vec<&Sample<'_>> = emitted.iter().filter(|s| s.name == name).collect();
            assert_eq!(of_name.len(), n, "{name}:\n{text}");
            for s in &of_name {
                assert_eq!(
                    (s.labels[label::POLICY].as_str(), s.labels[label::GPU_ID].as_str()),
                    ("p", "4096"),
                    "{name}"
                );
            }
            let other: BTreeSet<Option<&str>> = of_name
                .iter()
                .map(|s| match field {
                    Field::Transitions => s.labels.get(label::TRANSITION).map(String::as_str),
                    Field::ReactionBucket => s.labels.get(label::LE).map(|_| "le"),
                    _ => None,
                })
                .collect();
            let want: BTreeSet<Option<&str>> = match field {
                Field::Transitions => [Some("resume"), Some("suspend")].into(),
                Field::ReactionBucket => [Some("le")].into(),
                _ => [None].into(),
            };
            assert_eq!(other, want, "{name}");
        }
        let known: HashSet<String> = series::SCHEDULER.iter().flat_map(series::Family::samples).collect();
        let written: BTreeSet<&str> =
            emitted.iter().map(|s| s.name).filter(|n| n.starts_with("gpreempt_scheduler_")).collect();
        assert_eq!(written.len(), 10, "{written:?}");
        assert!(written.iter().all(|n| known.contains(*n)), "{written:?}");
    }

    #[test]
    fn label_values_with_escapes_and_any_label_order() {
        let s = sample(r#"gpreempt_scheduler_transitions_total{transition="resume",policy="a\"b\\c",gpu_id="8192"} 7"#)
            .unwrap();
        assert_eq!((s.name, s.value), ("gpreempt_scheduler_transitions_total", 7.0));
        assert_eq!(s.labels["policy"], "a\"b\\c");
        let rows = parse(&format!(
            "# TYPE x counter\n{}\ngpreempt_processes{{hostname=\"h\"}} 3\ngarbage{{\n",
            r#"gpreempt_scheduler_transitions_total{transition="resume",policy="a\"b\\c",gpu_id="8192"} 7"#
        ));
        assert_eq!(rows.len(), 1);
        assert_eq!(
            (rows[0].policy.as_str(), rows[0].gpu_id, rows[0].resumes, rows[0].state),
            ("a\"b\\c", GpuId(8192), 7, "running")
        );
        assert!(sample("garbage{").is_none());
        assert!(sample("# HELP x").is_none());
    }

    #[test]
    fn an_absent_agent_is_a_status_naming_the_address_and_the_fix() {
        // A port nothing listens on: bind, read the address, close.
        let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let status = read(addr);
        assert_eq!(status.source, Some(format!("http://{addr}/metrics")));
        let error = status.error.unwrap();
        assert!(error.starts_with(&format!("no gpreempt agent answers on {addr} (")), "{error}");
        assert!(error.contains("start `gpreempt agent`"), "{error}");
        assert!(error.contains("or pass --agent ADDR (on Kubernetes: the agent pod's IP:9464, "), "{error}");
        assert!(status.gpus.is_empty());
    }

    #[test]
    fn a_listener_that_is_not_an_agent_is_named() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 512];
            let _ = s.read(&mut buf).unwrap();
            s.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n").unwrap();
        });
        let status = read(addr);
        server.join().unwrap();
        assert_eq!(
            status.error.as_deref(),
            Some(
                format!("{addr} answered `HTTP/1.1 404 Not Found` instead of 200 OK: is it a gpreempt agent's metrics address?")
                    .as_str()
            )
        );
    }
}
