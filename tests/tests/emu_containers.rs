//! Real containers on the KFD emulator: Debian's podman in the VM (storage on a tmpfs, images
//! built from deploy/Containerfile without a registry, `gpreempt_tests::podman`).
//!
//! 1. Emulator workloads in named containers are listed by `gpreempt ps` with their container
//!    names and host pids, selected by `--container NAME`, preempted by
//!    `preempt --offline container:NAME` and scheduled by `schedule --online container:A
//!    --offline container:B`, including a process started later in B (`podman exec`).
//! 2. The agent runs inside its image under podman with exactly the privileges it needs
//!    (`gpreempt::deploy::AGENT_NEEDS`, which gpreempt/tests/deploy.rs holds the manifests and the
//!    systemd unit to): the host pid namespace, all capabilities dropped but those, the declared
//!    host paths read-only, /dev/kfd, a read-only root, no privilege escalation, seccomp
//!    unconfined. (The DaemonSet itself runs privileged, for /dev/kfd on a kubelet; podman's
//!    `--device` gives the device-cgroup rule without it.)
//!    The real Prometheus scrapes it; the workloads' series carry their container names; a policy
//!    between the two containers suspends the offline one; and every panel query of
//!    deploy/grafana-dashboard.json returns series.

use std::{
    net::SocketAddr,
    os::unix::net::UnixStream,
    path::Path,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use gpreempt::deploy::AGENT_NEEDS;
use gpreempt_tests::{
    binary,
    daemon::Daemon,
    log_field,
    podman::{self, Workload, podman},
    preempt,
    prometheus::{Prometheus, free_port, http_get},
    schedule::{LONG, Schedule},
    scratch,
    target::tracer_pid,
};
use serde_json::Value;

/// Its queues' read indices do not move for 300 ms (suspended).
fn held(w: &mut Workload) -> Result<bool> {
    let a = w.rptr()?;
    thread::sleep(Duration::from_millis(300));
    Ok(w.rptr()? == a)
}

/// Its queues' read indices move within 2 s (running).
fn runs(w: &mut Workload) -> Result<bool> {
    let a = w.rptr()?;
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
        if w.rptr()? > a {
            return Ok(true);
        }
    }
    Ok(false)
}

fn gpreempt(args: &[&str]) -> Result<std::process::Output> {
    Ok(Command::new(binary("gpreempt")?).args(args).output()?)
}

/// `gpreempt ps --json`'s entry for `pid`: (container runtime, name, id, ns_pid, queue count).
fn ps_entry(ps: &Value, pid: u32) -> Option<(String, String, String, u64, usize)> {
    let p = ps["processes"].as_array()?.iter().find(|p| p["pid"] == pid)?;
    let c = &p["info"]["container"];
    Some((
        c["runtime"].as_str()?.to_owned(),
        c["name"].as_str()?.to_owned(),
        c["id"].as_str()?.to_owned(),
        p["info"]["ns_pid"].as_u64()?,
        p["queues"].as_array()?.len(),
    ))
}

#[test]
fn podman_containers_are_listed_selected_preempted_and_scheduled_by_name() -> Result<()> {
    // Online: one idle queue; offline: two queues kept busy, both on GPU 0x1000.
    let online = Workload::run("serving", &["run", "--gpu-id", "0x1000", "--queues", "1", "--fill-us", "0"])?;
    let mut offline = Workload::run(
        "training",
        &["run", "--gpu-id", "0x1000", "--queues", "2", "--fill-us", "1000", "--runtime-enable"],
    )?;

    // ps: both, by host pid, with podman's names and ids, pid 1 inside each.
    let out = gpreempt(&["ps", "--json"])?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ps: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(
        ps_entry(&ps, online.pid),
        Some(("podman".into(), "serving".into(), online.container_id.clone(), 1, 1)),
        "{ps}"
    );
    assert_eq!(
        ps_entry(&ps, offline.pid),
        Some(("podman".into(), "training".into(), offline.container_id.clone(), 1, 2)),
        "{ps}"
    );
    let out = gpreempt(&["ps", "--container", "training", "--ids-only"])?;
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{}\n", offline.pid));
    let out = gpreempt(&["ps", "--container", &online.container_id[..12], "--ids-only"])?;
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{}\n", online.pid), "by id prefix");

    // preempt --offline container:training: its process only, both queues every cycle.
    let json = scratch("containers")?.join("preempt.json");
    let (doc, cycles) = preempt::cycles("container:training", 5, &json)?;
    assert_eq!(cycles, vec![(offline.pid.into(), vec![(2, 2, true); 5])], "{doc}");
    assert_eq!(tracer_pid(offline.pid)?, 0);
    assert!(runs(&mut offline)?, "left suspended");

    // schedule --online container:serving --offline container:training, with hints.
    let sock = scratch("containers")?.join("hints.sock");
    let mut s = Schedule::start(&[
        "--online",
        "container:serving",
        "--offline",
        "container:training",
        // Two offline processes on 0x1000, both runnable: one ioctl each per suspend.
        "--runnable",
        "all",
        "--idle",
        "20ms",
        "--no-cost-aware",
        "--hint-socket",
        sock.to_str().context("path")?,
    ]);
    let attached = s.wait_events("offline_attached", 1, LONG);
    assert_eq!((attached[0]["pid"].as_u64(), attached[0]["queues"].as_u64()), (Some(offline.pid.into()), Some(2)));
    assert_eq!(attached[0]["picked_up"], false);
    // A second offline process in the same container, started later.
    let mut later = Workload::exec(
        "training",
        &["run", "--gpu-id", "0x1000", "--queues", "1", "--fill-us", "1000", "--runtime-enable"],
    )?;
    let picked = s.wait_events("offline_attached", 2, LONG);
    assert_eq!(picked[1]["pid"].as_u64(), Some(later.pid.into()), "{picked:?}");
    assert_eq!(picked[1]["picked_up"], true);
    assert_eq!(tracer_pid(later.pid)?, s.child.id());
    // Its queue is known to the scheduler once the create is traced: then a request holds all
    // three offline queues, two ioctls (one per process).
    let deadline = Instant::now() + LONG;
    let mut hint = UnixStream::connect(&sock)?;
    let mut requests = 0;
    let suspend = loop {
        std::io::Write::write_all(&mut hint, b"begin\n")?;
        requests += 1;
        let susp = s.wait_transitions("suspend", requests, LONG)[requests - 1].clone();
        if susp["queues"] == 3 || Instant::now() > deadline {
            break susp;
        }
        std::io::Write::write_all(&mut hint, b"end\n")?;
        s.wait_transitions("resume", requests, LONG);
        thread::sleep(Duration::from_millis(200));
    };
    assert_eq!((suspend["queues"].as_i64(), suspend["ioctls"].as_u64()), (Some(3), Some(2)), "{suspend}");
    assert!(held(&mut offline)? && held(&mut later)?, "offline queues run during the request");
    std::io::Write::write_all(&mut hint, b"end\n")?;
    let resumes = s.wait_transitions("resume", requests, LONG);
    assert_eq!(resumes.last().context("no resume")?["queues"], 3);
    assert!(runs(&mut offline)? && runs(&mut later)?, "offline queues held after the request");
    s.stop();
    assert_eq!((tracer_pid(offline.pid)?, tracer_pid(later.pid)?), (0, 0), "detached");
    assert_eq!(tracer_pid(online.pid)?, 0, "the online process is never kept attached");
    drop((later, offline, online));
    Ok(())
}

/// The agent in its image under podman with agent-needs' privileges, and its stderr lines; its
/// container removed on drop.
struct Agent(Daemon);

const AGENT: &str = "gpreempt-agent";

impl Agent {
    fn start(config_dir: &Path) -> Result<Self> {
        podman::ready()?;
        let _ = podman(&["rm", "--force", "--time", "0", AGENT]);
        let caps: Vec<&str> = AGENT_NEEDS.capabilities.iter().map(|c| &c.name["CAP_".len()..]).collect();
        let mut command = Command::new("podman");
        command
            .args(["run", "--rm", "--name", AGENT])
            // hostPID; the test's Prometheus reaches it on the VM's loopback (a pod has its own IP).
            .args(["--pid", "host", "--network", "host", "--user", "0"])
            .args(["--cap-drop", "ALL", "--cap-add", &caps.join(",")])
            .args(["--security-opt", "no-new-privileges", "--security-opt", "seccomp=unconfined", "--read-only"])
            .arg("--volume")
            .arg(format!("{}:/etc/gpreempt:ro", config_dir.display()))
            .args(["--env", "NODE_NAME=vm"]);
        for path in AGENT_NEEDS.paths {
            // DirectoryOrCreate for the optional ones, as the kubelet does; where the VM's
            // read-only root cannot hold one (/var/lib/kubelet, /var/lib/docker) it is absent,
            // as on a node without that runtime.
            if path.optional && std::fs::create_dir_all(path.name).is_err() {
                continue;
            }
            command.arg("--volume").arg(format!("{0}:{0}:ro", path.name));
        }
        for device in AGENT_NEEDS.devices {
            // An optional device the guest's kernel lacks is absent, as on such a node.
            if device.optional && !std::path::Path::new(device.name).exists() {
                continue;
            }
            command.args(["--device", device.name]);
        }
        command.arg(podman::image("gpreempt")).args(["agent", "--config", "/etc/gpreempt/agent.toml"]);
        Ok(Self(Daemon::spawn("agent", &mut command)?))
    }
}

impl std::ops::Deref for Agent {
    type Target = Daemon;
    fn deref(&self) -> &Daemon {
        &self.0
    }
}

impl std::ops::DerefMut for Agent {
    fn deref_mut(&mut self) -> &mut Daemon {
        &mut self.0
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // Then the Daemon kills and reaps the `podman run`.
        let _ = podman(&["rm", "--force", "--time", "0", AGENT]);
    }
}

const PARANOID: &str = "/proc/sys/kernel/perf_event_paranoid";

/// A file's old contents, written back on drop (also when the test fails).
struct Restore {
    path: &'static str,
    old: String,
}

impl Restore {
    fn set(path: &'static str, value: &str, old: String) -> Result<Self> {
        std::fs::write(path, value).with_context(|| format!("writing {path}"))?;
        Ok(Self { path, old })
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = std::fs::write(self.path, &self.old);
    }
}

/// Every panel target's PromQL in the dashboard, with its template variables replaced by their
/// "All" values and Grafana's `$__rate_interval` by a window that covers the whole test.
fn dashboard_queries() -> Result<Vec<(String, String)>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana-dashboard.json");
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let mut vars: Vec<(String, String)> = Vec::new();
    for v in dash["templating"]["list"].as_array().context("no templating")? {
        if v["type"] == "query" {
            let name = v["name"].as_str().context("variable name")?;
            let all = v["allValue"].as_str().with_context(|| format!("${name} has no allValue"))?;
            vars.push((format!("${name}"), all.to_owned()));
        }
    }
    vars.push(("$__rate_interval".into(), "5m".into()));
    // Longest names first: `$pod` must not eat the start of `$podX`.
    vars.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    let mut queries = Vec::new();
    let mut panels: Vec<&Value> = dash["panels"].as_array().context("no panels")?.iter().collect();
    while let Some(p) = panels.pop() {
        panels.extend(p["panels"].as_array().into_iter().flatten());
        for t in p["targets"].as_array().into_iter().flatten() {
            let mut expr = t["expr"].as_str().context("a target without expr")?.to_owned();
            for (name, value) in &vars {
                expr = expr.replace(name, value);
            }
            assert!(!expr.contains('$'), "unreplaced variable in {expr}");
            queries.push((p["title"].as_str().unwrap_or("?").to_owned(), expr));
        }
    }
    Ok(queries)
}

#[test]
fn agent_in_its_image_labels_containers_for_prometheus_and_every_dashboard_panel_has_data() -> Result<()> {
    let dir = scratch("containers-agent")?;
    // The policy's processes exist before the agent: it finds them at start.
    let mut serving = Workload::run("serving", &gpreempt_tests::emu_workload::online_server("6"))?;
    let mut training = Workload::run(
        "training",
        &["run", "--gpu-id", "0x1000", "--queues", "2", "--fill-us", "1000", "--runtime-enable"],
    )?;
    let port = free_port()?;
    let config = dir.join("config");
    std::fs::create_dir_all(&config)?;
    std::fs::write(
        config.join("agent.toml"),
        format!(
            "metrics_addr = \"127.0.0.1:{port}\"\nprocess_grace_s = 60\n\n[[policy]]\nname = \"colocate\"\n\
             online = [\"container:serving\"]\noffline = [\"container:training\"]\nidle = \"5ms\"\npoll = \"200us\"\n"
        ),
    )?;
    // Debian's kernel.perf_event_paranoid (3) lets only CAP_SYS_ADMIN open perf events: the
    // agent with agent-needs' capabilities is refused, saying which setting and how to fix it.
    let paranoid = std::fs::read_to_string(PARANOID)?;
    assert_eq!(paranoid.trim(), "3", "Debian's default");
    let mut refused = Agent::start(&config)?;
    let error = refused.wait_line("gpreempt: error:", Duration::from_secs(300))?;
    assert!(
        error.contains("`perf_event_open` failed (Permission denied (os error 13)): kernel.perf_event_paranoid is 3"),
        "{error}"
    );
    assert!(error.contains("sysctl -w kernel.perf_event_paranoid=2"), "{error}");
    assert_eq!(refused.wait()?.code(), Some(1));
    drop(refused);
    // The node's setting the agent needs (docs/guide/agent.md, "The container image"), for this test only.
    let _paranoid = Restore::set(PARANOID, "2", paranoid)?;
    let mut agent = Agent::start(&config)?;
    // Loading every program in a TCG guest on a loaded host has taken over a minute.
    let started = agent.wait_line("msg=started", Duration::from_secs(300))?;
    assert_eq!(log_field(&started, "policies"), Some("colocate"), "{started}");
    let attached = agent.wait_line("offline process attached", Duration::from_secs(120))?;
    assert_eq!(log_field(&attached, "pid"), Some(training.pid.to_string().as_str()), "{attached}");
    assert_eq!(log_field(&attached, "queues"), Some("2"), "{attached}");
    // The agent's host pid: the container's first process.
    let (agent_pid, _) = podman::inspect(AGENT)?;
    assert_eq!(tracer_pid(training.pid)?, agent_pid, "the policy thread in the container holds the offline job");
    let agent_addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    assert_eq!(http_get(agent_addr, "/healthz")?, (200, "ok\n".to_owned()));

    let prometheus = Prometheus::start(&dir, agent_addr)?;
    // Each workload's series carry its container name and its host pid.
    let (ps, pt) = (serving.pid.to_string(), training.pid.to_string());
    let active = "gpreempt_queues{state=\"active\",container=~\"serving|training\"}";
    assert_eq!(
        prometheus.settle(active, "container", &[("serving", 1.0), ("training", 2.0)]),
        [("serving".into(), 1.0), ("training".into(), 2.0)]
    );
    let pids = prometheus.settle(active, "kfd_process_id", &[(&ps, 1.0), (&pt, 2.0)]);
    let mut want = vec![(ps.clone(), 1.0), (pt.clone(), 2.0)];
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(pids, want);
    for (labels, _) in prometheus.query(active)? {
        assert_eq!(labels["hostname"], "vm", "{labels}");
        assert_eq!(labels.get("pod"), None, "not in a pod: {labels}");
    }

    // The policy at work: the server's requests suspend the training container's queues.
    serving.send("go")?;
    for _ in 0..6 {
        serving.recv()?;
    }
    let summary = serving.recv()?;
    assert_eq!(summary["event"], "summary", "{summary}");
    let transitions = "sum by (transition) (gpreempt_scheduler_transitions_total{policy=\"colocate\",gpu_id=\"4096\"})";
    // Settled: every suspend has its resume and two scrapes 2.5 s apart agree (the counters
    // Prometheus has lag the agent's by up to a scrape).
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = (-1.0, -1.0);
    let (suspends, resumes) = loop {
        let mut now = (0.0, 0.0);
        for (labels, v) in prometheus.query(transitions)? {
            match labels["transition"].as_str() {
                Some("suspend") => now.0 = v,
                Some("resume") => now.1 = v,
                other => bail!("transition label {other:?}"),
            }
        }
        if (now == last && now.0 >= 1.0 && now.0 == now.1) || Instant::now() > deadline {
            break now;
        }
        last = now;
        thread::sleep(Duration::from_millis(2500));
    };
    assert!((1.0..=7.0).contains(&suspends), "{suspends} suspends for 6 requests");
    assert_eq!(resumes, suspends, "every suspend resumed");
    let suspended = "gpreempt_debug_trap_operations_total{operation=\"suspend\",container=\"training\"}";
    assert_eq!(prometheus.settle(suspended, "kfd_process_id", &[(&pt, suspends)]), [(pt.clone(), suspends)]);

    // An eviction and its restore of the training process (the emulator runs the driver's path).
    std::fs::write("/sys/kernel/kfd_emu/evict", &pt)?;
    thread::sleep(Duration::from_millis(300));
    std::fs::write("/sys/kernel/kfd_emu/restore", &pt)?;
    let evictions = "sum by (container) (gpreempt_evictions_total{container=\"training\",trigger=\"ttm\"})";
    assert_eq!(prometheus.settle(evictions, "container", &[("training", 2.0)]), [("training".into(), 2.0)]);

    // A queue created and destroyed while the agent watches (the others existed before it).
    training.send("create 4096 2 65536 100 7")?;
    let created = training.recv()?;
    assert_eq!((created["ret"].as_i64(), created["queue_id"].as_u64()), (Some(0), Some(2)), "{created}");
    training.send("destroy 2")?;
    assert_eq!(training.recv()?["ret"], 0);
    for family in ["gpreempt_queue_creates_total", "gpreempt_queue_destroys_total"] {
        let q = format!("{family}{{container=\"training\"}}");
        assert_eq!(prometheus.settle(&q, "kfd_process_id", &[(&pt, 1.0)]), [(pt.clone(), 1.0)], "{family}");
    }

    // Every panel of the dashboard has data. The scheduler's loop-step gauge is refreshed every
    // 5 s; rate() needs two scrapes after the last change: wait until all answer, then assert.
    let queries = dashboard_queries()?;
    assert!(queries.len() >= 26, "{} panel queries", queries.len());
    let deadline = Instant::now() + Duration::from_secs(60);
    let empty = loop {
        let mut empty = Vec::new();
        for (title, q) in &queries {
            if prometheus.query(q).with_context(|| format!("panel {title}"))?.is_empty() {
                empty.push(format!("{title}: {q}"));
            }
        }
        if empty.is_empty() || Instant::now() > deadline {
            break empty;
        }
        thread::sleep(Duration::from_secs(2));
    };
    assert_eq!(empty, Vec::<String>::new(), "panels without data");

    // SIGTERM (podman stop): the agent exits 0 and leaves the training job detached and running.
    podman(&["stop", "--time", "60", AGENT])?;
    let exiting = agent.wait_line("msg=exiting", Duration::from_secs(60))?;
    assert_eq!(log_field(&exiting, "signal"), Some("SIGTERM"), "{exiting}");
    assert_eq!(agent.wait()?.code(), Some(0));
    assert_eq!(tracer_pid(training.pid)?, 0, "detached");
    assert!(runs(&mut training)?, "the training job runs after the agent's exit");
    drop((serving, training, prometheus));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
