//! The deployment files grant exactly what `gpreempt doctor` says the agent needs
//! (`gpreempt::deploy::AGENT_NEEDS`): no capability, host path or device more or less; and the
//! Kubernetes manifests (deploy/kubernetes) hold the facts a kubelet and the Prometheus operator
//! depend on. `cargo xtask manifests` renders and validates them against the API's schemas; this
//! file checks what no schema says.

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use gpreempt::{
    agent::config::{AgentConfig, DEFAULT_METRICS_ADDR},
    deploy::{AGENT_NEEDS, Need},
};
use serde_yaml::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn deploy(file: &str) -> String {
    read(&format!("deploy/{file}"))
}

fn yaml(relative: &str) -> Value {
    serde_yaml::from_str(&read(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

fn names(needs: &[Need]) -> BTreeSet<String> {
    needs.iter().map(|n| n.name.to_owned()).collect()
}

fn optional(needs: &[Need]) -> BTreeSet<String> {
    needs.iter().filter(|n| n.optional).map(|n| n.name.to_owned()).collect()
}

fn strs(v: &Value) -> BTreeSet<String> {
    v.as_sequence()
        .unwrap_or_else(|| panic!("not a list: {v:?}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

/// The capabilities of agent-needs as Kubernetes and podman name them (without `CAP_`).
fn capabilities() -> BTreeSet<String> {
    names(AGENT_NEEDS.capabilities).iter().map(|c| c["CAP_".len()..].to_owned()).collect()
}

/// The agent's default port, where every manifest expects it.
fn default_port() -> u16 {
    DEFAULT_METRICS_ADDR.parse::<SocketAddr>().unwrap().port()
}

const BASE: &str = "deploy/kubernetes/base";

fn daemonset() -> Value {
    yaml(&format!("{BASE}/daemonset.yaml"))
}

fn agent_container(ds: &Value) -> &Value {
    let containers = ds["spec"]["template"]["spec"]["containers"].as_sequence().unwrap();
    assert_eq!(containers.len(), 1);
    &containers[0]
}

#[test]
fn the_daemonset_can_open_kfd_and_grants_exactly_what_the_agent_needs() {
    let ds = daemonset();
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["hostPID"], true, "KFD names processes by host pid");
    let c = agent_container(&ds);
    let security = &c["securityContext"];
    // A hostPath CharDevice gets no device-cgroup rule in an unprivileged container.
    assert_eq!(security["privileged"], true);
    assert_eq!(security.get("allowPrivilegeEscalation"), None, "the API server refuses false with privileged");
    assert_eq!(strs(&security["capabilities"]["drop"]), BTreeSet::from(["ALL".to_owned()]));
    assert_eq!(strs(&security["capabilities"]["add"]), capabilities());
    assert!(capabilities().is_superset(&["SYS_NICE".to_owned(), "IPC_LOCK".to_owned()].into()));
    // The runtimes' default seccomp profiles refuse bpf(2) and perf_event_open(2) without
    // CAP_SYS_ADMIN (tests/tests/emu_containers.rs runs the agent under podman with this).
    assert_eq!(security["seccompProfile"]["type"], "Unconfined");
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["runAsUser"], 0);

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
}

#[test]
fn the_daemonset_lands_on_tainted_amd_gpu_nodes_and_runs_the_versioned_image() {
    let ds = daemonset();
    let spec = &ds["spec"]["template"]["spec"];
    let tolerations: Vec<(&str, &str, &str)> = spec["tolerations"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|t| (t["key"].as_str().unwrap(), t["operator"].as_str().unwrap(), t["effect"].as_str().unwrap()))
        .collect();
    assert_eq!(tolerations, [("amd.com/gpu", "Exists", "NoSchedule"), ("amd-gpu-unhealthy", "Exists", "NoSchedule")]);
    assert_eq!(spec["nodeSelector"]["feature.node.kubernetes.io/amd-gpu"], "true");
    assert_eq!(spec["priorityClassName"], "system-node-critical");

    // The image: fully qualified in the DaemonSet (containerd's CRI expands a short name to
    // docker.io/library/…, not what an imported archive is called), tagged with this crate's
    // version by the kustomization, never pulled when the node has it.
    let c = agent_container(&ds);
    assert_eq!(c["image"], "localhost/gpreempt");
    assert_eq!(c["imagePullPolicy"], "IfNotPresent");
    let k = yaml(&format!("{BASE}/kustomization.yaml"));
    let images = k["images"].as_sequence().unwrap();
    assert_eq!(images.len(), 1);
    assert_eq!(images[0]["name"], "localhost/gpreempt");
    assert_eq!(images[0]["newTag"].as_str(), Some(env!("CARGO_PKG_VERSION")));
}

#[test]
fn the_config_is_a_directory_mount_of_a_configmap_the_kubelet_updates_in_place() {
    let ds = daemonset();
    let spec = &ds["spec"]["template"]["spec"];
    let c = agent_container(&ds);
    assert_eq!(strs(&c["args"]), ["agent", "--config", "/etc/gpreempt/agent.toml"].map(str::to_owned).into());
    assert_eq!(c["command"], Value::Null, "the image's entrypoint runs");
    let config_arg = c["args"][2].as_str().unwrap();
    let config = &c["volumeMounts"].as_sequence().unwrap().iter().find(|m| m["name"] == "config").unwrap();
    assert_eq!(config["mountPath"].as_str(), Path::new(config_arg).parent().and_then(Path::to_str));
    for m in c["volumeMounts"].as_sequence().unwrap() {
        assert_eq!(m.get("subPath"), None, "{m:?}: the kubelet never updates a subPath mount");
    }
    let volume = spec["volumes"].as_sequence().unwrap().iter().find(|v| v["name"] == "config").unwrap();
    let configmap = volume["configMap"]["name"].as_str().unwrap();

    // The kustomization generates that ConfigMap under that exact name (no hash suffix, which
    // would make every change a new ConfigMap and a rolling restart) from base/agent.toml.
    let k = yaml(&format!("{BASE}/kustomization.yaml"));
    let generators = k["configMapGenerator"].as_sequence().unwrap();
    assert_eq!(generators.len(), 1);
    assert_eq!(generators[0]["name"].as_str(), Some(configmap));
    assert_eq!(strs(&generators[0]["files"]), BTreeSet::from(["agent.toml".to_owned()]));
    assert_eq!(generators[0]["options"]["disableNameSuffixHash"], true);

    // base/agent.toml is the sample config with metrics_addr on every interface (kubelet probes
    // and Prometheus reach the pod's IP), and nothing else changed: its policy commented out.
    let sample = deploy("agent.toml");
    let listen = format!("metrics_addr = \"0.0.0.0:{}\"", default_port());
    assert_eq!(sample.matches(&format!("# {listen}\n")).count(), 1);
    let base = read(&format!("{BASE}/agent.toml"));
    assert_eq!(base, sample.replacen(&format!("# {listen}\n"), &format!("{listen}\n"), 1));
    let parsed = AgentConfig::parse(&base, "base/agent.toml").unwrap();
    assert_eq!(parsed.metrics_addr, Some(format!("0.0.0.0:{}", default_port()).parse().unwrap()));
    assert_eq!(parsed.policies, []);
}

#[test]
fn the_namespace_admits_the_pod_and_holds_every_object() {
    let ns = yaml(&format!("{BASE}/namespace.yaml"));
    assert_eq!(ns["kind"], "Namespace");
    // "baseline" refuses hostPID, hostPath, privileged, seccomp Unconfined and SYS_PTRACE.
    assert_eq!(ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "privileged");
    let k = yaml(&format!("{BASE}/kustomization.yaml"));
    assert_eq!(k["namespace"], ns["metadata"]["name"]);
    let resources = strs(&k["resources"]);
    assert_eq!(
        resources,
        ["namespace.yaml", "serviceaccount.yaml", "daemonset.yaml", "service.yaml"].map(str::to_owned).into()
    );

    let sa = yaml(&format!("{BASE}/serviceaccount.yaml"));
    let spec = &daemonset()["spec"]["template"]["spec"];
    assert_eq!(spec["serviceAccountName"], sa["metadata"]["name"]);
    assert_eq!(
        (&sa["automountServiceAccountToken"], &spec["automountServiceAccountToken"]),
        (&false.into(), &false.into())
    );
}

#[test]
fn probes_service_and_monitors_reach_the_agent_on_its_port() {
    let ds = daemonset();
    let pod = &ds["spec"]["template"];
    let c = agent_container(&ds);
    let ports = c["ports"].as_sequence().unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(
        (ports[0]["name"].as_str(), ports[0]["containerPort"].as_u64()),
        (Some("metrics"), Some(u64::from(default_port())))
    );
    // The agent's HTTP endpoint (agent/http.rs): /healthz while the tracer loop beats.
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        assert_eq!(c[probe]["httpGet"]["path"], gpreempt::deploy::series::HEALTH_PATH, "{probe}");
        assert_eq!(c[probe]["httpGet"]["port"], "metrics", "{probe}");
    }
    let annotations = &pod["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
    assert_eq!(annotations["prometheus.io/port"].as_str(), Some(default_port().to_string().as_str()));
    let pod_labels = &pod["metadata"]["labels"];

    // A headless Service: one endpoint per node's agent.
    let svc = yaml(&format!("{BASE}/service.yaml"));
    assert_eq!(svc["spec"]["clusterIP"], "None");
    assert_eq!(&svc["spec"]["selector"], pod_labels);
    let svc_ports = svc["spec"]["ports"].as_sequence().unwrap();
    assert_eq!(svc_ports.len(), 1);
    assert_eq!(svc_ports[0]["name"], "metrics");
    assert_eq!(svc_ports[0]["targetPort"], "metrics");
    assert_eq!(svc_ports[0]["port"].as_u64(), Some(u64::from(default_port())));

    let sm = yaml("deploy/kubernetes/overlays/servicemonitor/servicemonitor.yaml");
    assert_eq!(
        (sm["apiVersion"].as_str(), sm["kind"].as_str()),
        (Some("monitoring.coreos.com/v1"), Some("ServiceMonitor"))
    );
    assert_eq!(sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"]);
    let endpoints = sm["spec"]["endpoints"].as_sequence().unwrap();
    assert_eq!(endpoints.len(), 1);
    assert_eq!((endpoints[0]["port"].as_str(), endpoints[0]["path"].as_str()), (Some("metrics"), Some("/metrics")));

    let pm = yaml("deploy/kubernetes/overlays/podmonitor/podmonitor.yaml");
    assert_eq!(
        (pm["apiVersion"].as_str(), pm["kind"].as_str()),
        (Some("monitoring.coreos.com/v1"), Some("PodMonitor"))
    );
    assert_eq!(&pm["spec"]["selector"]["matchLabels"], pod_labels);
    let endpoints = pm["spec"]["podMetricsEndpoints"].as_sequence().unwrap();
    assert_eq!(endpoints.len(), 1);
    assert_eq!((endpoints[0]["port"].as_str(), endpoints[0]["path"].as_str()), (Some("metrics"), Some("/metrics")));
    for (overlay, file) in [("servicemonitor", "servicemonitor.yaml"), ("podmonitor", "podmonitor.yaml")] {
        let k = yaml(&format!("deploy/kubernetes/overlays/{overlay}/kustomization.yaml"));
        assert_eq!(strs(&k["resources"]), ["../../base", file].map(str::to_owned).into(), "{overlay}");
    }
}

#[test]
fn the_scheduling_overlay_replaces_the_config_with_one_valid_policy() {
    let dir = "deploy/kubernetes/overlays/scheduling";
    let k = yaml(&format!("{dir}/kustomization.yaml"));
    assert_eq!(strs(&k["resources"]), BTreeSet::from(["../../base".to_owned()]));
    let generator = &k["configMapGenerator"][0];
    assert_eq!(generator["name"], yaml(&format!("{BASE}/kustomization.yaml"))["configMapGenerator"][0]["name"]);
    assert_eq!(generator["behavior"], "replace");
    assert_eq!(generator["options"]["disableNameSuffixHash"], true);
    let config = AgentConfig::parse(&read(&format!("{dir}/agent.toml")), "scheduling/agent.toml").unwrap();
    assert_eq!(config.metrics_addr, Some(format!("0.0.0.0:{}", default_port()).parse().unwrap()));
    assert_eq!(config.warnings, Vec::<String>::new());
    assert_eq!(config.policies.len(), 1);
    let policy = &config.policies[0];
    assert_eq!(policy.name, "inference-first");
    assert_eq!(
        policy.online.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["pod-label:gpreempt.io/role=online"]
    );
    assert_eq!(
        policy.offline.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["pod-label:gpreempt.io/role=offline"]
    );
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
    let ds = daemonset();
    let c = agent_container(&ds);
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
        .map(|d| {
            let (path, access) = d.rsplit_once(' ').unwrap_or_else(|| panic!("{d}: no access"));
            // Write-only where the agent only writes (the PM QoS request), read-write otherwise.
            let want = if path == "/dev/cpu_dma_latency" { "w" } else { "rw" };
            assert_eq!(access, want, "{d}");
            path.to_owned()
        })
        .collect();
    assert_eq!(devices, names(AGENT_NEEDS.devices));
    assert_eq!(values("ProtectSystem"), ["strict"]);
    assert_eq!(values("ExecReload"), ["/bin/kill -HUP $MAINPID"]);
}

/// `cargo xtask dist --check` runs the release image with agent-needs' capabilities (xtask does
/// not link gpreempt, so its list is a copy held here to the one home).
#[test]
fn the_release_image_check_runs_the_agent_with_exactly_its_capabilities() {
    let check = read("xtask/src/dist/check.rs");
    let lists: Vec<&str> =
        check.lines().filter_map(|l| l.split(r#""--cap-add", ""#).nth(1)?.split('"').next()).collect();
    assert_eq!(lists.len(), 1, "{lists:?}");
    assert_eq!(lists[0].split(',').map(str::to_owned).collect::<BTreeSet<_>>(), capabilities());
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

/// docs/guide/metrics.md's reference table names exactly the families the agent serves
/// (`deploy::series::FAMILIES`), each with its kind: a family added, renamed or retyped without its
/// row (or a row left for one gone) fails here.
#[test]
fn the_metrics_guide_lists_exactly_the_families_the_agent_serves() {
    use gpreempt::deploy::series::{FAMILIES, Kind};

    // A histogram is documented by its family name, the others by their one sample's name.
    let served: BTreeSet<(String, String)> = FAMILIES
        .iter()
        .map(|f| {
            let name = if f.kind == Kind::Histogram { f.exposed() } else { f.samples()[0].clone() };
            (name, f.kind.name().to_owned())
        })
        .collect();
    let guide = read("docs/guide/metrics.md");
    let documented: BTreeSet<(String, String)> = guide
        .lines()
        .filter_map(|l| {
            let mut cells = l.strip_prefix("| `gpreempt_")?.split('|');
            let name = cells.next()?.trim().trim_end_matches('`');
            Some((format!("gpreempt_{name}"), cells.next()?.trim().to_owned()))
        })
        .collect();
    assert_eq!(documented.len(), FAMILIES.len(), "{documented:#?}");
    assert_eq!(documented, served);
}
