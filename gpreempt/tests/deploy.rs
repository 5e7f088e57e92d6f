//! The deployment files grant exactly what `gpreempt doctor` says the agent needs
//! (`gpreempt::deploy::AGENT_NEEDS`): no capability, host path or device more or less.

use std::{collections::BTreeSet, path::PathBuf};

use gpreempt::{
    agent::config::AgentConfig,
    deploy::{AGENT_NEEDS, Need},
};
use serde_yaml::Value;

fn deploy(file: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy").join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn names(needs: &[Need]) -> BTreeSet<String> {
    needs.iter().map(|n| n.name.to_owned()).collect()
}

fn optional(needs: &[Need]) -> BTreeSet<String> {
    needs.iter().filter(|n| n.optional).map(|n| n.name.to_owned()).collect()
}

fn documents() -> Vec<Value> {
    let text = deploy("daemonset.yaml");
    serde_yaml::Deserializer::from_str(&text).map(|d| serde::Deserialize::deserialize(d).unwrap()).collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind} in daemonset.yaml"))
}

fn strs(v: &Value) -> BTreeSet<String> {
    v.as_sequence().unwrap().iter().map(|s| s.as_str().unwrap().to_owned()).collect()
}

#[test]
fn the_daemonset_grants_exactly_what_the_agent_needs() {
    let docs = documents();
    let pod = &of_kind(&docs, "DaemonSet")["spec"]["template"];
    let spec = &pod["spec"];
    assert_eq!(spec["hostPID"], true, "KFD names processes by host pid");
    let containers = spec["containers"].as_sequence().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let security = &c["securityContext"];
    assert_eq!((&security["privileged"], &security["allowPrivilegeEscalation"]), (&false.into(), &false.into()));
    assert_eq!(strs(&security["capabilities"]["drop"]), BTreeSet::from(["ALL".to_owned()]));
    let caps: BTreeSet<String> = names(AGENT_NEEDS.capabilities).iter().map(|c| c["CAP_".len()..].to_owned()).collect();
    assert_eq!(strs(&security["capabilities"]["add"]), caps);
    // The runtimes' default seccomp profiles refuse bpf(2) and perf_event_open(2) without
    // CAP_SYS_ADMIN (tests/tests/emu_containers.rs runs the agent under podman with this).
    assert_eq!(security["seccompProfile"]["type"], "Unconfined");
    assert_eq!(security["readOnlyRootFilesystem"], true);

    // hostPath volumes: the needed paths (read-only; optional ones created empty when absent)
    // and devices (read-write), nothing else.
    let mounts = c["volumeMounts"].as_sequence().unwrap();
    let mount_of = |volume: &str| mounts.iter().find(|m| m["name"] == volume).unwrap_or_else(|| panic!("{volume}"));
    let (mut paths, mut devices, mut created) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    for v in spec["volumes"].as_sequence().unwrap() {
        let Some(host) = v.get("hostPath") else { continue };
        let path = host["path"].as_str().unwrap().to_owned();
        let m = mount_of(v["name"].as_str().unwrap());
        assert_eq!(m["mountPath"].as_str(), Some(path.as_str()), "mounted where the agent reads it");
        match host["type"].as_str() {
            Some("CharDevice") => {
                assert_eq!(m.get("readOnly"), None, "{path}: a device is opened read-write");
                devices.insert(path);
            }
            Some(kind @ ("Directory" | "DirectoryOrCreate")) => {
                assert_eq!(m["readOnly"], true, "{path}");
                if kind == "DirectoryOrCreate" {
                    created.insert(path.clone());
                }
                paths.insert(path);
            }
            other => panic!("{path}: hostPath type {other:?}"),
        }
    }
    assert_eq!(paths, names(AGENT_NEEDS.paths));
    assert_eq!(created, optional(AGENT_NEEDS.paths), "only optional paths may be absent");
    assert_eq!(devices, names(AGENT_NEEDS.devices));

    // Prometheus finds it where it listens.
    let annotations = &pod["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
    let port = c["ports"][0]["containerPort"].as_u64().unwrap();
    assert_eq!(annotations["prometheus.io/port"].as_str(), Some(port.to_string().as_str()));

    // The ConfigMap's config is valid and listens on that port, on every interface.
    let text = of_kind(&docs, "ConfigMap")["data"]["agent.toml"].as_str().unwrap();
    let config = AgentConfig::parse(text, "ConfigMap agent.toml").unwrap();
    assert_eq!(config.metrics_addr, Some(format!("0.0.0.0:{port}").parse().unwrap()));
    assert_eq!(strs(&c["args"]), ["agent", "--config", "/etc/gpreempt/agent.toml"].map(str::to_owned).into());
    assert_eq!(c["image"], "gpreempt:latest");
}

/// The image the DaemonSet runs is the one `cargo xtask image` builds: the binary is its
/// entrypoint, root by number, and its default command is the DaemonSet's.
#[test]
fn the_containerfile_builds_what_the_daemonset_runs() {
    let text = deploy("Containerfile");
    let instructions: Vec<&str> = text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).collect();
    assert_eq!(
        instructions,
        [
            "FROM scratch",
            "COPY rootfs/ /",
            "USER 0:0",
            r#"ENTRYPOINT ["/usr/bin/gpreempt"]"#,
            r#"CMD ["agent", "--config", "/etc/gpreempt/agent.toml"]"#
        ]
    );
    let docs = documents();
    let c = &of_kind(&docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["securityContext"]["runAsUser"], 0);
    assert_eq!(c["command"], Value::Null, "the image's entrypoint runs");
}

#[test]
fn the_systemd_unit_grants_exactly_what_the_agent_needs() {
    let unit = deploy("gpreempt-agent.service");
    let values = |key: &str| -> Vec<String> {
        unit.lines().filter_map(|l| l.strip_prefix(key)?.strip_prefix('=')).map(str::to_owned).collect()
    };
    let caps = names(AGENT_NEEDS.capabilities);
    for key in ["CapabilityBoundingSet", "AmbientCapabilities"] {
        let v = values(key);
        assert_eq!(v.len(), 1, "{key}");
        assert_eq!(v[0].split_whitespace().map(str::to_owned).collect::<BTreeSet<_>>(), caps, "{key}");
    }
    let read_only = values("ReadOnlyPaths");
    let paths: BTreeSet<String> = read_only.iter().map(|p| p.trim_start_matches('-').to_owned()).collect();
    let may_be_absent: BTreeSet<String> =
        read_only.iter().filter_map(|p| p.strip_prefix('-')).map(str::to_owned).collect();
    assert_eq!(paths, names(AGENT_NEEDS.paths));
    assert_eq!(may_be_absent, optional(AGENT_NEEDS.paths));
    assert_eq!(values("DevicePolicy"), ["closed"]);
    let devices: BTreeSet<String> = values("DeviceAllow")
        .iter()
        .map(|d| d.strip_suffix(" rw").unwrap_or_else(|| panic!("{d}: read-write")).to_owned())
        .collect();
    assert_eq!(devices, names(AGENT_NEEDS.devices));
    assert_eq!(values("ProtectSystem"), ["strict"]);
    assert_eq!(values("ExecReload"), ["/bin/kill -HUP $MAINPID"]);
}

/// Every metric a dashboard panel queries is one the agent exports (docs/guide/metrics.md lists them
/// all); every panel has a query; every query variable has an "All" value. Whether each query
/// returns data from a live agent is tested in the VM (tests/tests/emu_containers.rs).
#[test]
fn the_dashboard_queries_only_metrics_the_agent_exports() {
    let dash: serde_json::Value = serde_json::from_str(&deploy("grafana-dashboard.json")).unwrap();
    let metrics =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/guide/metrics.md")).unwrap();
    let exported: BTreeSet<&str> =
        metrics.lines().filter_map(|l| l.strip_prefix("| `gpreempt_")?.split('`').next()).collect();
    assert!(exported.len() >= 20, "{exported:?}");
    let mut ids = BTreeSet::new();
    let mut queried = BTreeSet::new();
    for panel in dash["panels"].as_array().unwrap() {
        assert!(ids.insert(panel["id"].as_u64().unwrap()), "panel id {} twice", panel["id"]);
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{} has no query", panel["title"]);
        for t in targets {
            let expr = t["expr"].as_str().unwrap();
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if let Some(name) = word.strip_prefix("gpreempt_") {
                    let family = name.strip_suffix("_bucket").unwrap_or(name);
                    assert!(exported.contains(family), "{}: gpreempt_{family} is not exported", panel["title"]);
                    queried.insert(family.to_owned());
                }
            }
        }
    }
    for family in ["queues", "evictions_total", "debug_trap_operations_total", "scheduler_reaction_seconds"] {
        assert!(queried.contains(family), "no panel shows gpreempt_{family}");
    }
    for v in dash["templating"]["list"].as_array().unwrap() {
        if v["type"] == "query" {
            assert!(v["allValue"].is_string(), "{v}");
        }
    }
}
