//! `gpreempt agent`: the tracer as a node daemon, with Prometheus metrics on HTTP.

use super::{stderr::errln, stdout::outln};
use std::{cell::RefCell, path::Path, rc::Rc, time::Duration};

use anyhow::{Context, Result};
use gpreempt::{
    agent::{
        PolicyRunner,
        config::{self, AgentConfig},
        cri::{self, CriReload},
        http::{self, Health},
        log_line,
        policies::Policies,
        reload::{AsyncWatch, ConfigFile, DirWatch, ReloadError, Trigger},
    },
    clock::boottime_ns,
    host::{cri::CriSocket, k8s::K8sRoots, roots::Roots},
    metrics::{Metrics, Recorder},
    model::Limits,
    pipeline::{
        Observed,
        in_process::{InProcessTracer, TracerOptions},
    },
};
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::AgentArgs;

/// Exited processes kept at most, whatever the grace period (bounds memory under churn).
const FINISHED_MAX: usize = 4096;
/// The loop's housekeeping period: heartbeat, expiry of exited processes, loss counters.
const TICK: Duration = Duration::from_secs(1);

fn log(level: &str, msg: &str, fields: &[(&str, &dyn std::fmt::Display)]) {
    errln!("{}", log_line(level, msg, fields));
}

/// Parse the configuration's text; the older key spellings it uses are logged.
fn parse(text: &str, path: &Path) -> Result<AgentConfig, config::ConfigError> {
    let config = AgentConfig::parse(text, &path.display().to_string())?;
    for w in &config.warnings {
        log("warn", "older configuration key", &[("detail", w)]);
    }
    Ok(config)
}

/// Watch the configuration's directory; without a watch (inotify refused), SIGHUP still reloads.
fn watch_directory(file: &ConfigFile) -> Option<AsyncWatch> {
    match DirWatch::new(file.path()).and_then(DirWatch::into_async) {
        Ok(w) => Some(w),
        Err(e) => {
            log("warn", "configuration changes are not watched; reload with SIGHUP", &[("error", &e)]);
            None
        }
    }
}

/// The next batch of events in the watched directory; never, without a watch.
async fn directory_changed(watch: Option<&AsyncWatch>) -> Result<usize, ReloadError> {
    match watch {
        Some(w) => w.changed().await,
        None => std::future::pending().await,
    }
}

fn describe_policies(c: &AgentConfig) -> String {
    let names: Vec<&str> = c.policies.iter().map(|p| p.name.as_str()).collect();
    if names.is_empty() { "none".into() } else { names.join(",") }
}

/// `agent --check FILE`: the configuration validated, nothing started. The older key spellings
/// it uses are said on stderr; a valid file gets one line on stdout.
fn check(path: &Path) -> Result<()> {
    let config = AgentConfig::load(path)?;
    for w in &config.warnings {
        errln!("gpreempt: warning: {w}");
    }
    let n = config.policies.len();
    let plural = if n == 1 { "policy" } else { "policies" };
    let names = if n == 0 { String::new() } else { format!(": {}", describe_policies(&config)) };
    outln!("{}: valid, {n} {plural}{names}", path.display());
    Ok(())
}

pub async fn run(args: AgentArgs) -> Result<()> {
    if let Some(path) = args.check.as_deref() {
        return check(path);
    }
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sighup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    // The file as read at start; a reload happens when its content differs.
    let (mut file, mut config) = match args.config.as_deref() {
        Some(path) => {
            let (file, text) = ConfigFile::open(path)?;
            let config = parse(&text, path)?;
            (Some(file), config)
        }
        None => (None, AgentConfig::default()),
    };
    let mut watch = file.as_ref().and_then(watch_directory);
    let default_addr = config::DEFAULT_METRICS_ADDR.parse().context("the default metrics address")?;
    let addr = args.metrics_addr.or(config.metrics_addr).unwrap_or(default_addr);
    let hostname = match args.hostname.clone() {
        Some(h) => h,
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .context("reading the hostname (or pass --hostname)")?
            .trim()
            .to_owned(),
    };
    let metrics = Metrics::new(&hostname, env!("CARGO_PKG_VERSION"));
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
    let addr = listener.local_addr().unwrap_or(addr);

    // The policies' CRI socket is chosen here and at every reload (agent::cri); --cri-socket,
    // set at the binary's edge, stands over the file's key.
    let command_line_cri = CriSocket::command_line();
    let roots = Roots::default();
    let limits = Limits { finished_max: FINISHED_MAX, finished_grace_ns: Some(config.process_grace.as_nanos() as u64) };
    let mut tracer = InProcessTracer::start(&TracerOptions {
        btf_dir: args.btf_dir.clone(),
        roots: roots.clone(),
        limits,
        ..TracerOptions::default()
    })?;
    let (probes, missing) = tracer.probe_counts();
    metrics.set_probes(probes, missing);
    metrics.set_partitions(&gpreempt::host::partition::Partitions::read(&roots.sys));
    for p in tracer.probes().probes.iter().filter(|p| p.symbol.is_none()) {
        log(
            "warn",
            "probe not attached",
            &[("program", &p.program), ("reason", &p.missing_reason.as_deref().unwrap_or("?"))],
        );
    }

    let health = Health::default();
    health.beat();
    let server = tokio::spawn(http::serve(listener, metrics.clone(), health.clone()));

    let notes = tracer.take_bootstrap_notes();
    let k8s = K8sRoots::default();
    let recorder = Rc::new(RefCell::new(Recorder::new(
        metrics.clone(),
        Box::new(move |p| p.container.as_ref().and_then(|c| k8s.identify(c))),
    )));
    tracer.pipeline_mut().subscribe(Box::new(recorder.clone()));
    recorder.borrow_mut().refresh(tracer.model());
    for note in notes {
        log("info", "queue map bootstrap", &[("note", &note)]);
    }
    log(
        "info",
        "started",
        &[
            ("metrics_addr", &addr),
            ("hostname", &hostname),
            ("probes", &probes),
            ("probes_missing", &missing),
            ("kfd_module", &tracer.probes().kfd_module.as_deref().unwrap_or("vmlinux")),
            ("processes", &tracer.model().registry().processes.len()),
            ("policies", &describe_policies(&config)),
            ("process_grace_s", &config.process_grace.as_secs()),
        ],
    );
    let cri = cri::in_force(command_line_cri.as_ref(), config.cri_socket.as_deref());
    if let (Some(_), Some(key)) = (&command_line_cri, &config.cri_socket) {
        log("info", "cri_socket in the config is not used: --cri-socket names the socket", &[("cri_socket", key)]);
    }
    log("info", "CRI socket for pod-label: selectors", &[("cri_socket", &cri)]);
    let mut policies = Policies::new(metrics.clone());
    policies.configure(&config.policies, &cri);

    let mut tick = tokio::time::interval(TICK);
    let mut events: u64 = 0;
    let reason = loop {
        tokio::select! {
            _ = sigterm.recv() => break "SIGTERM",
            _ = sigint.recv() => break "SIGINT",
            _ = sighup.recv() => {
                if let Some(file) = file.as_mut() {
                    let cri = command_line_cri.as_ref();
                    reload(file, Trigger::Signal, cri, &mut config, &mut policies, &metrics);
                } else {
                    log("info", "SIGHUP: no --config to reload", &[]);
                }
            }
            changed = directory_changed(watch.as_ref()) => match (changed, file.as_mut()) {
                (Ok(_), Some(file)) => {
                    let cri = command_line_cri.as_ref();
                    reload(file, Trigger::Watch, cri, &mut config, &mut policies, &metrics);
                }
                (Ok(_), None) => {}
                (Err(e), _) => {
                    log("warn", "configuration changes are not watched any more; reload with SIGHUP", &[("error", &e)]);
                    watch = None;
                }
            },
            _ = tick.tick() => {
                health.beat();
                tracer.pipeline_mut().expire(boottime_ns());
                forward_notices(&tracer, &mut policies);
                recorder.borrow_mut().refresh(tracer.model());
                metrics.set_losses(&tracer.losses()?);
            }
            batch = tracer.next_batch(|_| {}) => {
                let n = batch? as u64;
                events += n;
                metrics.add_events(n);
                forward_notices(&tracer, &mut policies);
                recorder.borrow_mut().refresh(tracer.model());
            }
        }
    };
    // Every offline process resumed and detached before the agent goes.
    policies.shutdown();
    // Records written before we stopped still count.
    let n = tracer.drain(|_| {}) as u64;
    metrics.add_events(n);
    let losses = tracer.losses()?;
    server.abort();
    log(
        "info",
        "exiting",
        &[("signal", &reason), ("events", &(events + n)), ("dropped", &losses.dropped()), ("losses", &losses)],
    );
    Ok(())
}

/// Reload the configuration if the file's content changed since it was last read (by the watch or
/// by SIGHUP: a change is applied once, whichever sees it first). An invalid file is rejected,
/// logged and counted; the configuration in force stays. A changed `cri_socket` applies now
/// (agent::cri says why it can), unless `command_line_cri` stands over it.
fn reload(
    file: &mut ConfigFile,
    trigger: Trigger,
    command_line_cri: Option<&CriSocket>,
    config: &mut AgentConfig,
    policies: &mut Policies,
    metrics: &Metrics,
) {
    let parsed = match file.changed(trigger) {
        Ok(None) => {
            if trigger == Trigger::Signal {
                log("info", "config unchanged, nothing reloaded", &[("trigger", &trigger)]);
            }
            return;
        }
        Ok(Some(text)) => parse(&text, file.path()).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    match parsed {
        Ok(new) => {
            metrics.config_reload(true);
            if new.process_grace != config.process_grace || new.metrics_addr != config.metrics_addr {
                log("warn", "process_grace_s and metrics_addr take effect at the next start", &[]);
            }
            match cri::on_reload(command_line_cri, config.cri_socket.as_deref(), new.cri_socket.as_deref()) {
                CriReload::Unchanged => {}
                CriReload::Changed { from, to } => {
                    let restarted: Vec<&str> =
                        new.policies.iter().filter(|p| cri::asks_cri(p)).map(|p| p.name.as_str()).collect();
                    let restarted = if restarted.is_empty() { "none".into() } else { restarted.join(",") };
                    log(
                        "info",
                        "cri_socket changed; the policies with pod-label: selectors restart on it",
                        &[("from", &from), ("to", &to), ("policies", &restarted)],
                    );
                }
                CriReload::Overridden { file, command_line } => log(
                    "warn",
                    "cri_socket changed in the config but is not used: --cri-socket names the socket",
                    &[("cri_socket", &file.as_deref().unwrap_or("(removed)")), ("in_force", &command_line)],
                ),
            }
            // Changed policies, and those asking a CRI socket that changed, stop (their offline
            // processes resumed and detached) before the new ones start.
            let cri = cri::in_force(command_line_cri, new.cri_socket.as_deref());
            policies.configure(&new.policies, &cri);
            log("info", "config reloaded", &[("policies", &describe_policies(&new)), ("trigger", &trigger)]);
            *config = new;
        }
        Err(e) => {
            metrics.config_reload(false);
            log(
                "error",
                "config rejected, keeping the previous one",
                &[("error", &e), ("policies", &describe_policies(config)), ("trigger", &trigger)],
            );
        }
    }
}

/// The model's lifecycle notices since the last call, to the policies (the tracer's spans reach
/// the metrics through their own subscriber: here they are only taken off the channel).
fn forward_notices(tracer: &InProcessTracer, policies: &mut Policies) {
    for o in tracer.observed() {
        if let Observed::Notice(n) = o {
            policies.notice(n);
        }
    }
}
