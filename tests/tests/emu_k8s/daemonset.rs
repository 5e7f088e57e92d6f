//! The DaemonSet's pod spec started as a kubelet starts it, beside the pods of `main.rs`:
//! `deploy/kubernetes/base` rendered with `kubectl kustomize` (by `cargo xtask test`, on the
//! host), its DaemonSet's pod template turned into the kubelet's CRI calls
//! (`gpreempt_tests::kubelet`: RunPodSandbox on the pod network with hostPID, the pod's labels and
//! annotations, privileged; CreateContainer with the privileged security context, the hostPath
//! mounts including `/dev/kfd`, the ConfigMap's directory as the kubelet's atomic writer lays it
//! out, no subPath; StartContainer), the agent run from the image `localhost/gpreempt:VERSION`
//! built in the guest from the debug binary and imported with `ctr`. Then, as the kubelet and an
//! operator would see it:
//!
//! - the agent starts, attaches every probe the emulator's KFD resolves, answers `/healthz` (the
//!   DaemonSet's startup probe) and `/metrics` at the pod's IP on the `metrics` port, and labels
//!   the queues of the pods that ran before it with their namespace, pod and container;
//! - the ConfigMap updated to `overlays/scheduling`'s `agent.toml` by the kubelet's `..data`
//!   swap is reloaded, and its `pod-label:` policy holds the offline pod's two queues suspended
//!   during the online pod's request and resumes them after; the agent opened the emulator's
//!   /dev/kfd (KFD made a process of it) and holds the offline process;
//! - a second update that adds `cri_socket` is applied by that reload: the label policy restarts
//!   on the named socket and holds the offline process again;
//! - StopContainer with the pod's grace period (SIGTERM) ends the agent cleanly: the policy
//!   stops, the offline process is detached and runs on.

use std::{
    io::{BufRead, BufReader, Write},
    net::SocketAddr,
    os::unix::{
        fs::{FileTypeExt, MetadataExt},
        net::UnixStream,
    },
    path::Path,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use gpreempt_tests::{
    containerd::{Containerd, SOCKET, kfd_pid_of},
    expected_probes,
    kubelet::{Node, PodPlan, Rendered, follow_log},
    log_field,
    prometheus::{http_get, series},
    target::tracer_pid,
};

const AGENT_UID: &str = "3c9d8e7f-6a5b-4c3d-9e2f-1a0b9c8d7e6f";
const DAEMONSET: &str = "gpreempt-agent";
/// The policy of `overlays/scheduling/agent.toml`.
const POLICY: &str = "inference-first";
/// The online request: 40 dispatches of 40 ms, 1.6 s of emulated GPU work (the server's ring
/// holds 64).
const DISPATCHES: &str = "40";
pub const DISPATCH_US: u64 = 40_000;

/// The image the DaemonSet runs, as `cargo xtask image` names it.
pub fn image() -> String {
    format!("localhost/gpreempt:{}", env!("CARGO_PKG_VERSION"))
}

/// `/metrics` at `addr`, or an error.
fn metrics(addr: SocketAddr) -> Result<String> {
    let (status, body) = http_get(addr, "/metrics")?;
    if status != 200 {
        bail!("/metrics answered {status}: {body}");
    }
    Ok(body)
}

/// Poll `/metrics` until `done` holds for it (within `wait`); the last exposition either way.
fn metrics_until(addr: SocketAddr, wait: Duration, done: impl Fn(&str) -> bool) -> Result<String> {
    let deadline = Instant::now() + wait;
    loop {
        let text = metrics(addr)?;
        if done(&text) || Instant::now() > deadline {
            return Ok(text);
        }
        thread::sleep(Duration::from_millis(250));
    }
}

/// The DaemonSet's pod started beside the pods of `main.rs` on `ctrd` (the offline pod's process
/// `offline`, the online server's request socket `requests`), checked, and stopped.
pub fn agent_beside(ctrd: &mut Containerd, scratch: &Path, offline: u32, requests: &Path) -> Result<()> {
    let base = Rendered::load("base")?;
    let scheduling = Rendered::load("overlays/scheduling")?;
    // The pod's volumes go under the kubelet's directory, which containerd's start mounted.
    let node = Node { name: "vm", scratch };
    let mut plan = PodPlan::daemonset(&base, DAEMONSET, "x7k2p", AGENT_UID, &node)?;
    // The name the kubelet asks containerd for is the one `cargo xtask image` gives the image.
    let agent = plan.containers.first().context("no container")?.clone();
    assert_eq!(agent.image.as_ref().map(|i| i.image.clone()), Some(image()));

    let pod = ctrd.run_sandbox(plan.sandbox.clone())?;
    let ip = ctrd.pod_ip(&pod)?;
    let port = *plan.ports.get("metrics").context("no metrics port")?;
    let addr: SocketAddr = format!("{ip}:{port}").parse()?;
    let agent_id = ctrd.create_and_start(&pod, agent.clone())?;
    let mut log = follow_log("agent", pod.log(&agent.log_path));
    // Loading every program in a TCG guest on a loaded host has taken over a minute; the
    // DaemonSet's startup probe allows 5.
    let started = log.lines.wait_line("msg=started", Duration::from_secs(240))?;
    let expected = expected_probes()?;
    let resolved = expected.iter().filter(|p| p.symbol.is_some()).count();
    assert_eq!(
        [
            log_field(&started, "hostname"),
            log_field(&started, "kfd_module"),
            log_field(&started, "policies"),
            log_field(&started, "metrics_addr")
        ],
        [Some("vm"), Some("kfd_emu"), Some("none"), Some(format!("0.0.0.0:{port}").as_str())],
        "{started}"
    );
    assert_eq!(log_field(&started, "probes"), Some(resolved.to_string().as_str()), "{started}");
    assert_eq!(log_field(&started, "probes_missing"), Some((expected.len() - resolved).to_string().as_str()));
    // The kubelet's probe and a scrape, at the pod's IP from the node.
    assert_eq!(http_get(addr, "/healthz")?, (200, "ok\n".to_owned()));
    let text = metrics(addr)?;
    assert_eq!(series(&text, "gpreempt_probes", &["state=\"attached\""]), resolved as u64, "{text}");
    assert_eq!(series(&text, "gpreempt_build_info", &[&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))]), 1);
    // The pods that ran before the agent, named from its container as the node's files and
    // runtime say.
    let trainer = ["namespace=\"batch\"", "pod=\"train-0\"", "container=\"trainer\"", "state=\"active\""];
    let text = metrics_until(addr, Duration::from_secs(60), |t| series(t, "gpreempt_queues", &trainer) == 2)?;
    assert_eq!(series(&text, "gpreempt_queues", &trainer), 2, "{text}");
    let server = ["namespace=\"serving\"", "pod=\"llm-0\"", "container=\"server\"", "state=\"active\""];
    assert_eq!(series(&text, "gpreempt_queues", &server), 1, "{text}");

    // The ConfigMap updated to the scheduling overlay's, as the kubelet updates the volume.
    plan.config_maps[0].update(&scheduling.config_map("gpreempt-agent")?)?;
    let lines = log.lines.wait_lines(
        &[
            &format!("msg=\"config reloaded\" policies={POLICY}"),
            &format!("msg=\"policy started\" policy={POLICY}"),
            "msg=\"offline process attached\"",
        ],
        Duration::from_secs(120),
    )?;
    assert_eq!(log_field(&lines[0], "trigger"), Some("file-change"), "{}", lines[0]);
    assert_eq!(
        (log_field(&lines[2], "pid"), log_field(&lines[2], "queues")),
        (Some(offline.to_string().as_str()), Some("2")),
        "{}",
        lines[2]
    );
    // The agent opened the emulator's /dev/kfd through the hostPath (KFD made a process of it,
    // a descriptor of it is that device) and holds the offline process.
    let agent_pid = kfd_pid_of(&agent_id, "gpreempt")?;
    let kfd = std::fs::metadata("/dev/kfd")?.rdev();
    let opened = std::fs::read_dir(format!("/proc/{agent_pid}/fd"))?
        .flatten()
        .filter(|fd| std::fs::metadata(fd.path()).is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == kfd))
        .count();
    assert!(opened > 0, "no descriptor of the agent {agent_pid} is /dev/kfd");
    assert_eq!(tracer_pid(offline)?, agent_pid, "the policy holds the offline process");
    let text = metrics(addr)?;
    assert_eq!(series(&text, "gpreempt_config_reloads_total", &["result=\"applied\""]), 1, "{text}");

    // One online request: the offline pod's two queues are suspended while it runs, and
    // resumed after.
    let mut conn = UnixStream::connect(requests)?;
    let reply = thread::spawn({
        let conn = conn.try_clone()?;
        move || -> Result<String> {
            let mut line = String::new();
            BufReader::new(conn).read_line(&mut line)?;
            Ok(line)
        }
    });
    writeln!(conn, "{DISPATCHES}")?;
    let suspended = ["pod=\"train-0\"", "state=\"suspended\""];
    let mut most = 0;
    while !reply.is_finished() {
        most = most.max(series(&metrics(addr)?, "gpreempt_queues", &suspended));
        thread::sleep(Duration::from_millis(50));
    }
    let reply = reply.join().map_err(|_| anyhow::anyhow!("the request's reader panicked"))??;
    assert!(reply.starts_with(&format!("done {DISPATCHES} ")), "{reply}");
    assert_eq!(most, 2, "the offline pod's queues suspended during the request");
    let transitions = |t: &str, kind: &str| {
        let labels = [format!("policy=\"{POLICY}\""), format!("transition=\"{kind}\"")];
        series(t, "gpreempt_scheduler_transitions_total", &[&labels[0], &labels[1]])
    };
    let text = metrics_until(addr, Duration::from_secs(60), |t| {
        series(t, "gpreempt_queues", &trainer) == 2 && transitions(t, "suspend") == transitions(t, "resume")
    })?;
    assert_eq!(series(&text, "gpreempt_queues", &trainer), 2, "resumed: {text}");
    assert!(transitions(&text, "suspend") >= 1, "{text}");
    assert_eq!(transitions(&text, "suspend"), transitions(&text, "resume"), "{text}");
    let online_suspends = ["pod=\"llm-0\"", "operation=\"suspend\""];
    assert_eq!(series(&text, "gpreempt_debug_trap_operations_total", &online_suspends), 0, "{text}");

    // A ConfigMap update that names the runtime's socket: the reload applies it, restarting the
    // label policy on it (its offline process detached, then attached through that socket).
    let mut files = scheduling.config_map("gpreempt-agent")?;
    let toml = files.iter_mut().find(|(k, _)| k == "agent.toml").context("no agent.toml in the ConfigMap")?;
    toml.1 = format!("cri_socket = \"unix://{SOCKET}\"\n{}", toml.1);
    plan.config_maps[0].update(&files)?;
    let lines = log.lines.wait_lines(
        &[
            &format!("msg=\"cri_socket changed; to={SOCKET} policies={POLICY}"),
            &format!("msg=\"policy stopped\" policy={POLICY}"),
            &format!("msg=\"config reloaded\" policies={POLICY}"),
            &format!("msg=\"policy started\" policy={POLICY}"),
            "msg=\"offline process attached\"",
        ],
        Duration::from_secs(120),
    )?;
    let from = r#"from="/run/containerd/containerd.sock or /var/run/crio/crio.sock""#;
    assert!(lines[0].contains(from), "{}", lines[0]);
    assert_eq!(
        (log_field(&lines[4], "pid"), log_field(&lines[4], "queues")),
        (Some(offline.to_string().as_str()), Some("2")),
        "{}",
        lines[4]
    );
    assert_eq!(tracer_pid(offline)?, agent_pid, "the restarted policy holds the offline process");

    // The kubelet ends the pod: StopContainer with its grace period, SIGTERM first.
    ctrd.stop_container(&agent_id, plan.grace_s)?;
    let lines = log
        .lines
        .wait_lines(&[&format!("msg=\"policy stopped\" policy={POLICY}"), "msg=exiting"], Duration::from_secs(60))?;
    assert_eq!(log_field(&lines[1], "signal"), Some("SIGTERM"), "{}", lines[1]);
    assert_eq!(tracer_pid(offline)?, 0, "the offline process is detached");
    assert!(Path::new(&format!("/proc/{offline}")).exists(), "the offline process runs on");
    Ok(())
}
