//! Pods as the kubelet runs them, on a real containerd (forky's 2.x with bookworm's runc, unpacked
//! by `cargo xtask setup`), with the emulator's KFD clients inside. No kubelet or API server runs
//! here: the test makes the CRI calls a kubelet makes for a pod (its directory under
//! /var/lib/kubelet/pods, RunPodSandbox with the pod's name, namespace, uid and labels,
//! CreateContainer with /dev/kfd, StartContainer) through gpreempt's own CRI client
//! (`gpreempt_tests::containerd`), then checks what gpreempt sees of the pods:
//!
//! - `pod:NAMESPACE/NAME` and `pod-label:KEY=VALUE` resolve to exactly the pods' KFD processes;
//! - `container:NAME` takes the container's name in the pod spec;
//! - `gpreempt ps` shows `namespace/pod/container`, and its JSON the pod and the container's name;
//! - `preempt --offline pod-label:gpreempt.io/role=offline` suspends and resumes the offline
//!   pod's queues, and only those;
//! - `schedule` with label selectors suspends the offline pod's queues during the online pod's
//!   requests (told by `--hint-socket` hints) and resumes them after;
//! - the DaemonSet's own pod, started beside them as the kubelet starts it from the rendered
//!   manifests, runs the agent, whose `pod-label:` policy schedules them ([`daemonset`]). It
//!   shares this test's containerd, images and pods: starting them again would cost CI two
//!   minutes.

mod daemonset;

use std::{io::Write, os::unix::net::UnixStream, process::Command};

use anyhow::{Context, Result, bail};
use gpreempt::{
    domain::HostPid,
    host::{cri::messages::Mount, roots::Roots, select},
};
use gpreempt_tests::{
    binary,
    containerd::{self, WORKLOAD_IMAGE, kfd_pid_of},
    kubelet::Rendered,
    preempt,
    schedule::{LONG, Schedule},
    scratch, skip,
    target::tracer_pid,
};
use serde_json::Value;

const ONLINE_UID: &str = "6a1f0c3e-2b4d-4e5f-8a9b-0c1d2e3f4a5b";
const OFFLINE_UID: &str = "7b2e1d4f-3c5e-4f60-9bac-1d2e3f4a5b6c";

fn gpreempt(args: &[&str]) -> Result<std::process::Output> {
    Ok(Command::new(binary("gpreempt")?).args(args).output()?)
}

fn resolve(selector: &str) -> Result<Vec<u32>> {
    let sel: select::Selector = selector.parse()?;
    let r = select::resolve(&[sel], &Roots::default());
    if let Some(e) = r.lookup_errors.first() {
        bail!("{e}");
    }
    Ok(r.pids.iter().map(|HostPid(p)| *p).collect())
}

#[test]
fn pods_run_through_cri_are_selected_by_name_label_and_container_name_and_the_daemonsets_agent_schedules_them() {
    if let Some(why) = containerd::unavailable() {
        skip!("{why}");
    }
    // Rendered on the host by `cargo xtask test` with the kubectl `cargo xtask setup` installs.
    if let Err(e) = Rendered::load("base") {
        skip!("{e:#}");
    }
    if let Err(e) = pods_by_name_label_and_container_name() {
        panic!("{e:#}");
    }
}

fn pods_by_name_label_and_container_name() -> Result<()> {
    let scratch = scratch("k8s")?;
    let mut ctrd =
        containerd::with_images(&scratch, &[("emu-workload", WORKLOAD_IMAGE), ("gpreempt", &daemonset::image())])?;

    // Online: a server with one idle queue, taking requests (a line `N`: N dispatches) on a
    // socket in a hostPath; offline: two queues kept busy.
    let requests = scratch.join("online");
    std::fs::create_dir_all(&requests)?;
    let online_pod = ctrd.run_pod("serving", "llm-0", ONLINE_UID, &[("gpreempt.io/role", "online"), ("app", "llm")])?;
    let online_id = ctrd.start_container_with(
        &online_pod,
        "server",
        WORKLOAD_IMAGE,
        &[
            "/usr/bin/emu-workload",
            "server",
            "--gpu-id",
            "0x1000",
            "--dispatch-us",
            &daemonset::DISPATCH_US.to_string(),
            "--socket",
            "/run/online/requests.sock",
        ],
        vec![Mount {
            container_path: "/run/online".into(),
            host_path: requests.display().to_string(),
            readonly: false,
        }],
    )?;
    let offline_pod = ctrd.run_pod("batch", "train-0", OFFLINE_UID, &[("gpreempt.io/role", "offline")])?;
    let offline_id = ctrd.start_container(
        &offline_pod,
        "trainer",
        WORKLOAD_IMAGE,
        &[
            "/usr/bin/emu-workload",
            "run",
            "--gpu-id",
            "0x1000",
            "--queues",
            "2",
            "--fill-us",
            "1000",
            "--runtime-enable",
        ],
    )?;
    let online = kfd_pid_of(&online_id, "emu-workload")?;
    let offline = kfd_pid_of(&offline_id, "emu-workload")?;

    // The selectors, as every command resolves them (the runtime found at its default socket).
    assert_eq!(resolve("pod:serving/llm-0")?, [online]);
    assert_eq!(resolve("pod:batch/*")?, [offline]);
    assert_eq!(resolve("pod-label:gpreempt.io/role=offline")?, [offline]);
    assert_eq!(resolve("pod-label:gpreempt.io/role=online,app=llm")?, [online]);
    assert_eq!(resolve("pod-label:gpreempt.io/role!=offline")?, [online]);
    assert_eq!(resolve("pod-label:gpreempt.io/role=canary")?, Vec::<u32>::new());
    assert_eq!(resolve("container:trainer")?, [offline]);
    assert_eq!(resolve("container:server")?, [online]);

    // ps: the pod and the container's name, in the table and in JSON.
    let out = gpreempt(&["ps", "--json"])?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ps: Value = serde_json::from_slice(&out.stdout)?;
    let entry = |pid: u32| -> Option<(Value, Value)> {
        let p = ps["processes"].as_array()?.iter().find(|p| p["pid"] == pid)?;
        Some((p["pod"].clone(), p["container_name"].clone()))
    };
    assert_eq!(
        entry(online),
        Some((serde_json::json!({"namespace": "serving", "name": "llm-0", "uid": ONLINE_UID}), "server".into())),
        "{ps}"
    );
    assert_eq!(
        entry(offline),
        Some((serde_json::json!({"namespace": "batch", "name": "train-0", "uid": OFFLINE_UID}), "trainer".into())),
        "{ps}"
    );
    let out = gpreempt(&["ps"])?;
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let row =
        |pid: u32| table.lines().find(|l| l.split_whitespace().next() == Some(&pid.to_string())).map(str::to_owned);
    assert!(row(online).is_some_and(|r| r.contains(" serving/llm-0/server ")), "{table}");
    assert!(row(offline).is_some_and(|r| r.contains(" batch/train-0/trainer ")), "{table}");
    let out = gpreempt(&["ps", "--container", "trainer", "--ids-only"])?;
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{offline}\n"));

    // preempt by label: the offline pod's process only, both its queues every cycle.
    let (doc, cycles) = preempt::cycles("pod-label:gpreempt.io/role=offline", 3, &scratch.join("preempt.json"))?;
    assert_eq!(cycles, vec![(offline.into(), vec![(2, 2, true); 3])], "{doc}");

    // schedule by labels: the online pod's requests (told by hints) suspend the offline pod's
    // two queues, and their end resumes them.
    let sock = scratch.join("hints.sock");
    let mut s = Schedule::start(&[
        "--online",
        "pod-label:gpreempt.io/role=online",
        "--offline",
        "pod-label:gpreempt.io/role=offline",
        "--idle",
        "20ms",
        "--no-cost-aware",
        "--hint-socket",
        sock.to_str().context("path")?,
    ]);
    let attached = s.wait_events("offline_attached", 1, LONG);
    assert_eq!((attached[0]["pid"].as_u64(), attached[0]["queues"].as_u64()), (Some(offline.into()), Some(2)));
    let mut hint = UnixStream::connect(&sock)?;
    hint.write_all(b"begin\n")?;
    let suspend = s.wait_transitions("suspend", 1, LONG)[0].clone();
    assert_eq!((suspend["queues"].as_i64(), suspend["ioctls"].as_u64()), (Some(2), Some(1)), "{suspend}");
    hint.write_all(b"end\n")?;
    let resume = s.wait_transitions("resume", 1, LONG)[0].clone();
    assert_eq!(resume["queues"].as_i64(), Some(2), "{resume}");
    s.stop();
    assert_eq!(tracer_pid(offline)?, 0, "detached");

    daemonset::agent_beside(&mut ctrd, &scratch, offline, &requests.join("requests.sock"))?;
    drop(ctrd);
    Ok(())
}
