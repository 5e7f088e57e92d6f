//! The configured policies at work: each runs a [`Scheduler`] over debug-trap sessions on a thread of
//! its own. A session is bound to the thread that attached it (ptrace's tracer is a thread, and
//! the session's watchdog and signals are set up on it), so the policy thread attaches, holds,
//! resumes and detaches its offline processes itself. The agent's tracer loop forwards every
//! lifecycle notice of the model (a process or a queue that appears or goes) to every policy
//! thread; a policy never starts a tracer of its own.
//!
//! A reload stops the policies that changed or went (their offline processes resumed and
//! detached: the thread joins only after DISABLE) before it starts the new ones, so no process is
//! ever held by two policies' sessions at once (KFD accepts one debugger per process). A reload
//! that changes the CRI socket restarts the policies that ask it ([`super::cri`]) the same way.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc::Sender,
    },
    thread::{self, JoinHandle},
    time::Duration,
};

use super::{AgentPolicy, PolicyRunner, cri, log_line};
use crate::{
    domain::{GpuId, TransitionKind},
    host::cri::CriSocket,
    metrics::Metrics,
    model::ModelNotice,
    schedule::{self, ScheduleEvent, Scheduler, channel, seams::Seams},
};

/// One policy's thread.
struct Running {
    policy: AgentPolicy,
    /// The CRI socket its `pod-label:` selectors ask.
    cri: CriSocket,
    changes: Sender<ModelNotice>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

/// The [`PolicyRunner`] of `gpreempt agent`: one scheduler thread per policy, fed from the
/// agent's tracer, reporting into the `gpreempt_scheduler_*` families.
pub struct Policies {
    metrics: Metrics,
    running: Vec<Running>,
}

/// One log line on stderr; a write error (a closed pipe) is dropped, never a panic in the agent.
fn log(level: &str, msg: &str, fields: &[(&str, &dyn std::fmt::Display)]) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{}", log_line(level, msg, fields));
}

impl Policies {
    pub fn new(metrics: Metrics) -> Self {
        Self { metrics, running: Vec::new() }
    }

    fn start(&mut self, policy: &AgentPolicy, cri: &CriSocket) {
        // The channel exists before the scheduler resolves its selectors, so a process that
        // opens /dev/kfd while it attaches is still announced to it.
        let (changes, discovery) = channel::pair();
        let stop = Arc::new(AtomicBool::new(false));
        let (p, socket, flag, metrics) = (policy.clone(), cri.clone(), stop.clone(), self.metrics.clone());
        let spawned = thread::Builder::new()
            .name(format!("policy-{}", policy.name))
            .spawn(move || run(&p, &socket, discovery, &flag, &metrics));
        match spawned {
            Ok(thread) => {
                self.running.push(Running { policy: policy.clone(), cri: cri.clone(), changes, stop, thread });
            }
            Err(e) => log("error", "policy thread not started", &[("policy", &policy.name), ("error", &e)]),
        }
    }

    /// Stop the policy threads for which `retire` holds, and wait until each has detached.
    fn stop_where(&mut self, retire: impl Fn(&Running) -> bool) {
        let (gone, kept): (Vec<Running>, Vec<Running>) =
            std::mem::take(&mut self.running).into_iter().partition(|r| retire(r));
        self.running = kept;
        for r in &gone {
            r.stop.store(true, Ordering::Relaxed);
        }
        for r in gone {
            if r.thread.join().is_err() {
                log("error", "policy thread panicked", &[("policy", &r.policy.name)]);
            }
        }
    }
}

/// Does a running policy stop at a [`PolicyRunner::configure`] with `wanted` on `cri`? When it
/// went or changed, when its scheduler has ended (it could not start: a reload retries it), and
/// when it asks the CRI runtime (a `pod-label:` selector) and the socket changed. A policy that
/// asks nothing of the runtime runs on whatever the socket.
fn retires(policy: &AgentPolicy, started_on: &CriSocket, ended: bool, wanted: &[AgentPolicy], cri: &CriSocket) -> bool {
    !wanted.contains(policy) || ended || (started_on != cri && cri::asks_cri(policy))
}

impl PolicyRunner for Policies {
    fn configure(&mut self, policies: &[AgentPolicy], cri: &CriSocket) {
        self.stop_where(|r| retires(&r.policy, &r.cri, r.thread.is_finished(), policies, cri));
        for p in policies {
            if !self.running.iter().any(|r| &r.policy == p) {
                self.start(p, cri);
            }
        }
    }

    fn notice(&mut self, notice: ModelNotice) {
        for r in &self.running {
            // A policy thread that ended (it could not start) has dropped its receiver.
            let _ = r.changes.send(notice);
        }
    }

    fn shutdown(&mut self) {
        self.stop_where(|_| true);
    }
}

/// The scheduler's configuration for `policy`, its `pod-label:` selectors asking `cri`.
fn scheduler_config(policy: &AgentPolicy, cri: &CriSocket) -> schedule::ScheduleConfig {
    let mut config = schedule::ScheduleConfig {
        // The periodic report is not logged; it refreshes the loop-step gauges.
        interval: Duration::from_secs(5),
        ..policy.settings.config(policy.online.clone(), policy.offline.clone())
    };
    config.roots.cri = cri.clone();
    config
}

/// The policy thread: start the scheduler, run it until `stop`, report into `metrics` and the log.
fn run(
    policy: &AgentPolicy,
    cri: &CriSocket,
    discovery: channel::ChannelDiscovery,
    stop: &AtomicBool,
    metrics: &Metrics,
) {
    let name = policy.name.as_str();
    let mut recorder = Recorder { name, metrics, suspended_at_ms: BTreeMap::new() };
    let mut emit = |e: &ScheduleEvent| recorder.event(e);
    let config = scheduler_config(policy, cri);
    let scheduler =
        match Scheduler::start(config.clone(), Seams::host(config.roots.clone(), Box::new(discovery)), &mut emit) {
            Ok(s) => s,
            Err(e) => {
                log("error", "policy not started", &[("policy", &name), ("error", &e)]);
                return;
            }
        };
    log("info", "policy started", &[("policy", &name)]);
    scheduler.run(stop, &mut emit);
}

/// Turns one policy's scheduler events into metrics and log lines.
struct Recorder<'a> {
    name: &'a str,
    metrics: &'a Metrics,
    /// When each GPU's current suspension began (scheduler milliseconds).
    suspended_at_ms: BTreeMap<GpuId, f64>,
}

impl Recorder<'_> {
    fn event(&mut self, event: &ScheduleEvent) {
        let policy = &self.name;
        match event {
            ScheduleEvent::Transition(t) if t.action == TransitionKind::Suspend => {
                self.metrics.scheduler_transition(self.name, t.gpu_id, TransitionKind::Suspend);
                if t.holds() {
                    if let Some(us) = t.reaction_us {
                        self.metrics.scheduler_reaction(self.name, t.gpu_id, us / 1e6);
                    }
                    if let Some(us) = t.detection_us {
                        self.metrics.scheduler_detection(self.name, t.gpu_id, us / 1e6);
                    }
                    self.suspended_at_ms.insert(t.gpu_id, t.t_ms);
                }
                if !t.errors.is_empty() {
                    log(
                        "warn",
                        "suspend failed",
                        &[("policy", policy), ("gpu", &t.gpu_id), ("errors", &t.errors_line())],
                    );
                }
            }
            ScheduleEvent::Transition(t) => {
                self.metrics.scheduler_transition(self.name, t.gpu_id, TransitionKind::Resume);
                if let Some(at) = self.suspended_at_ms.remove(&t.gpu_id) {
                    self.metrics.scheduler_suspended(self.name, t.gpu_id, (t.t_ms - at).max(0.0) / 1e3);
                }
                if !t.errors.is_empty() {
                    log(
                        "warn",
                        "resume failed",
                        &[("policy", policy), ("gpu", &t.gpu_id), ("errors", &t.errors_line())],
                    );
                }
            }
            ScheduleEvent::ResumeSkipped { gpu_id, .. } => self.metrics.scheduler_resume_skipped(self.name, *gpu_id),
            ScheduleEvent::Interval(i) => {
                if let (Some(p50), Some(p99), Some(max)) = (i.loop_step_p50_us, i.loop_step_p99_us, i.loop_step_max_us)
                {
                    self.metrics.scheduler_loop_step(self.name, p50 / 1e6, p99 / 1e6, max / 1e6);
                }
            }
            ScheduleEvent::OfflineAttached { pid, comm, queues, .. } => log(
                "info",
                "offline process attached",
                &[("policy", policy), ("pid", pid), ("comm", comm), ("queues", queues)],
            ),
            ScheduleEvent::OfflineAttachFailed { pid, error } => {
                log("warn", "offline process not attached", &[("policy", policy), ("pid", pid), ("error", error)]);
            }
            ScheduleEvent::OfflineDetached { pid, reason, .. } => {
                log("info", "offline process detached", &[("policy", policy), ("pid", pid), ("reason", reason)]);
            }
            ScheduleEvent::OfflineQueuesHeld { pid, queues } => {
                log(
                    "info",
                    "offline queues created while held, held too",
                    &[("policy", policy), ("pid", pid), ("queues", queues)],
                );
            }
            ScheduleEvent::OfflineQueuesReset { pid, queues } => {
                let queues = queues.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
                log(
                    "warn",
                    "offline queues reset by the driver after a failed preemption (gone)",
                    &[("policy", policy), ("pid", pid), ("queues", &queues)],
                );
            }
            ScheduleEvent::OnlineAdded { pid, queues, .. } => {
                log("info", "online process watched", &[("policy", policy), ("pid", pid), ("queues", queues)]);
            }
            ScheduleEvent::OnlineGone { pid } => {
                log("info", "online process gone", &[("policy", policy), ("pid", pid)]);
            }
            ScheduleEvent::OnlineSeenBy { pid, path, why, .. } => {
                let path = if *path == schedule::DetectionPath::Doorbell { "doorbell" } else { "poll" };
                let why = why.clone().unwrap_or_default();
                log(
                    "info",
                    "online process seen by",
                    &[("policy", policy), ("pid", pid), ("path", &path), ("why", &why)],
                );
            }
            ScheduleEvent::OnlineArrival { pid, ports, why, .. } => {
                let ports = ports.iter().map(u16::to_string).collect::<Vec<_>>().join(",");
                let why = why.clone().unwrap_or_default();
                log(
                    "info",
                    "online process arrivals",
                    &[("policy", policy), ("pid", pid), ("ports", &ports), ("why", &why)],
                );
            }
            ScheduleEvent::WatchdogResumed { t_ms, pid, held_ms, still_held } => {
                log(
                    "warn",
                    "session watchdog resumed an offline process (the scheduler loop stalled)",
                    &[("policy", policy), ("pid", pid), ("held_ms", held_ms), ("still_held", still_held)],
                );
                // Nothing is held any more: the suspensions end here, not at the policies' resumes.
                if *still_held == 0 {
                    for (gpu, at) in std::mem::take(&mut self.suspended_at_ms) {
                        self.metrics.scheduler_suspended(self.name, gpu, (t_ms - at).max(0.0) / 1e3);
                    }
                }
            }
            ScheduleEvent::Warning { message } => log("warn", "policy", &[("policy", policy), ("message", message)]),
            ScheduleEvent::Summary(r) => log(
                "info",
                "policy stopped",
                &[
                    ("policy", policy),
                    ("suspends", &r.suspends),
                    ("resumes", &r.resumes),
                    ("transitions", &(r.suspends + r.resumes)),
                    ("failed_suspends", &r.failed_suspends),
                    ("suspended_ms", &format!("{:.1}", r.suspended_ms)),
                    ("reactions", &r.reaction_us.as_ref().map_or(0, |s| s.count)),
                ],
            ),
            ScheduleEvent::OnlineQueue { .. } | ScheduleEvent::HintMalformed { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{agent::config::AgentConfig, domain::HostPid, schedule::Transition};

    fn transition(action: TransitionKind, t_ms: f64, queues: i64, reaction_us: Option<f64>) -> ScheduleEvent {
        ScheduleEvent::Transition(Transition {
            t_ms,
            gpu_id: crate::domain::GpuId(0x1000),
            action,
            reason: None,
            latency_us: 40.0,
            reaction_us,
            detection_us: reaction_us.map(|r| r / 2.0),
            queues,
            ioctls: 1,
            held_no_ioctl: 0,
            errors: Vec::new(),
        })
    }

    #[test]
    fn a_policy_becomes_the_schedulers_configuration() {
        let text = "[[policy]]\nname = \"p\"\nonline = [\"pod:serving/*\"]\noffline = [\"42\", \"container:batch\"]\n\
                    idle = \"7ms\"\npoll = \"300us\"\noffline_min_share = 0.25\nmax_suspend = \"900ms\"\nno_doorbell = true\n";
        let config = AgentConfig::parse(text, "agent.toml").unwrap();
        let cri = CriSocket::Path("/run/k3s/containerd/containerd.sock".into());
        let c = scheduler_config(&config.policies[0], &cri);
        assert_eq!(c.roots.cri, cri);
        assert_eq!(c.online, config.policies[0].online);
        assert_eq!(c.offline, config.policies[0].offline);
        assert_eq!(
            c.policy,
            crate::schedule::policy::PolicyConfig {
                idle: Duration::from_millis(7),
                max_suspend: Duration::from_millis(900),
                min_share: 0.25,
                ..crate::schedule::policy::PolicyConfig::default()
            }
        );
        assert_eq!(c.poll, Duration::from_micros(300));
        assert!(!c.doorbell);
        assert_eq!(c.interval, Duration::from_secs(5));
    }

    #[test]
    fn a_changed_cri_socket_restarts_exactly_the_policies_that_ask_it() {
        let wanted = &cri::label_and_name_policies();
        let (labels, names) = (&wanted[0], &wanted[1]);
        let (old, new) = (CriSocket::default(), CriSocket::Path("/run/k3s/containerd/containerd.sock".into()));
        // The socket changed: the label policy restarts on the new one, the other runs on.
        assert!(retires(labels, &old, false, wanted, &new));
        assert!(!retires(names, &old, false, wanted, &new));
        // The socket stayed: neither restarts, unless it went or its scheduler ended.
        assert!(!retires(labels, &new, false, wanted, &new));
        assert!(retires(labels, &new, true, wanted, &new));
        assert!(retires(names, &new, false, std::slice::from_ref(labels), &new));
    }

    #[test]
    fn transitions_feed_the_scheduler_families_of_their_policy() {
        let metrics = Metrics::new("node-a", "0.0.0");
        let mut r = Recorder { name: "p", metrics: &metrics, suspended_at_ms: BTreeMap::new() };
        r.event(&transition(TransitionKind::Suspend, 100.0, 2, Some(1500.0)));
        r.event(&transition(TransitionKind::Resume, 350.0, 2, None));
        // A suspend that held nothing adds no suspended time; its resume neither.
        r.event(&transition(TransitionKind::Suspend, 400.0, 0, None));
        r.event(&transition(TransitionKind::Resume, 900.0, 0, None));
        let text = metrics.encode();
        // Series of a family come in hash order: compare them sorted.
        let mut lines: Vec<&str> =
            text.lines().filter(|l| l.starts_with("gpreempt_scheduler_") && !l.contains("_bucket")).collect();
        lines.sort_unstable();
        assert_eq!(
            lines,
            [
                r#"gpreempt_scheduler_detection_seconds_count{hostname="node-a",policy="p",gpu_id="4096"} 1"#,
                r#"gpreempt_scheduler_detection_seconds_sum{hostname="node-a",policy="p",gpu_id="4096"} 0.00075"#,
                r#"gpreempt_scheduler_reaction_seconds_count{hostname="node-a",policy="p",gpu_id="4096"} 1"#,
                r#"gpreempt_scheduler_reaction_seconds_sum{hostname="node-a",policy="p",gpu_id="4096"} 0.0015"#,
                r#"gpreempt_scheduler_suspended_seconds_total{hostname="node-a",policy="p",gpu_id="4096"} 0.25"#,
                r#"gpreempt_scheduler_transitions_total{hostname="node-a",policy="p",gpu_id="4096",transition="resume"} 2"#,
                r#"gpreempt_scheduler_transitions_total{hostname="node-a",policy="p",gpu_id="4096",transition="suspend"} 2"#,
            ]
        );
    }

    #[test]
    fn a_session_watchdog_resume_ends_the_suspended_time_once_nothing_is_held() {
        let metrics = Metrics::new("node-a", "0.0.0");
        let mut r = Recorder { name: "p", metrics: &metrics, suspended_at_ms: BTreeMap::new() };
        r.event(&transition(TransitionKind::Suspend, 100.0, 4, None));
        // Two offline processes: the first one released leaves the other held; the second ends it.
        r.event(&ScheduleEvent::WatchdogResumed { t_ms: 1_100.0, pid: HostPid(7), held_ms: 1_000, still_held: 1 });
        r.event(&ScheduleEvent::WatchdogResumed { t_ms: 1_350.0, pid: HostPid(8), held_ms: 1_250, still_held: 0 });
        // The policy's resume, later, finds nothing left to resume and adds no time.
        r.event(&transition(TransitionKind::Resume, 5_000.0, 0, None));
        let text = metrics.encode();
        let suspended: Vec<&str> =
            text.lines().filter(|l| l.starts_with("gpreempt_scheduler_suspended_seconds_total")).collect();
        assert_eq!(
            suspended,
            [r#"gpreempt_scheduler_suspended_seconds_total{hostname="node-a",policy="p",gpu_id="4096"} 1.25"#]
        );
    }
}
