//! What a kubelet does with a pod of a rendered manifest, done by a test (no kubelet runs in the
//! VM): the pod template of a DaemonSet, as `kubectl kustomize` rendered it, turned into the CRI
//! calls the kubelet makes for it (RunPodSandbox, CreateContainer, StartContainer), its hostPath
//! volumes checked or created by their type, its ConfigMap volume written as the kubelet's
//! atomic writer writes one (a timestamped directory, `..data` pointing at it, each key a symlink
//! through `..data`) and updated as the kubelet updates it (`..data_tmp` renamed over `..data`),
//! and the container's log followed line by line.
//!
//! The manifests are rendered on the host by `cargo xtask test` (`kubectl kustomize`, the
//! kubectl `cargo xtask setup` installs; the guest has no kubectl on its PATH) into
//! `target/vm-images/manifests/<kustomization>.yaml`, as `cargo xtask manifests` renders them.

use std::{
    collections::HashMap,
    io::{Read, Seek, SeekFrom},
    os::unix::fs::{FileTypeExt, symlink},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, bail};
use gpreempt::host::cri::messages::*;
use serde::Deserialize as _;
use serde_yaml::Value;

use crate::{containerd::KUBELET_PODS, daemon::Lines};

/// The objects of one rendered kustomization.
pub struct Rendered {
    objects: Vec<Value>,
}

impl Rendered {
    /// `deploy/kubernetes/<dir>` as `cargo xtask test` rendered it (`base`, `overlays/scheduling`).
    pub fn load(dir: &str) -> Result<Self> {
        let file = crate::podman::vm_images()?.join("manifests").join(format!("{}.yaml", dir.replace('/', "-")));
        let text = std::fs::read_to_string(&file).with_context(|| {
            format!(
                "{}: not rendered (cargo xtask test renders deploy/kubernetes with kubectl kustomize)",
                file.display()
            )
        })?;
        let objects = serde_yaml::Deserializer::from_str(&text)
            .map(Value::deserialize)
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("{} is not YAML", file.display()))?;
        Ok(Self { objects })
    }

    /// The object of `kind` named `name`.
    pub fn object(&self, kind: &str, name: &str) -> Result<&Value> {
        self.objects
            .iter()
            .find(|o| o["kind"].as_str() == Some(kind) && o["metadata"]["name"].as_str() == Some(name))
            .with_context(|| format!("no {kind} {name} in the rendered manifests"))
    }

    /// A ConfigMap's `data`, key by key.
    pub fn config_map(&self, name: &str) -> Result<Vec<(String, String)>> {
        let data = self.object("ConfigMap", name)?["data"].as_mapping().context("a ConfigMap without data")?;
        data.iter().map(|(k, v)| Ok((str_of(k)?.to_owned(), str_of(v)?.to_owned()))).collect()
    }
}

fn str_of(v: &Value) -> Result<&str> {
    v.as_str().with_context(|| format!("not a string: {v:?}"))
}

/// A `metadata.labels`-like map as CRI's.
fn string_map(v: &Value) -> Result<HashMap<String, String>> {
    let Some(map) = v.as_mapping() else { return Ok(HashMap::new()) };
    map.iter().map(|(k, v)| Ok((str_of(k)?.to_owned(), str_of(v)?.to_owned()))).collect()
}

/// A resource quantity as the API writes it (`50m`, `64Mi`, `1`), in its base unit (cores are
/// returned in millicores).
fn quantity(v: &Value, millis: bool) -> Result<i64> {
    let text = match v {
        Value::Number(n) => n.to_string(),
        other => str_of(other)?.to_owned(),
    };
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().with_context(|| format!("quantity {text:?}"))?;
    let factor = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        other => bail!("quantity {text:?}: the unit {other:?} is not one this test reads"),
    };
    let scale = if millis { 1000.0 } else { 1.0 };
    Ok((number * factor * scale).round() as i64)
}

/// The pod a kubelet runs from a DaemonSet's template on this node: its sandbox, its containers
/// (mounts resolved), its ConfigMap volumes and its grace period.
pub struct PodPlan {
    pub sandbox: PodSandboxConfig,
    pub containers: Vec<ContainerConfig>,
    pub config_maps: Vec<ConfigMapVolume>,
    /// `terminationGracePeriodSeconds`: StopContainer's timeout.
    pub grace_s: i64,
    /// Each container's ports by name (`metrics` → 9464).
    pub ports: HashMap<String, i64>,
}

/// The node the pod runs on: its name (`spec.nodeName`) and where a hostPath the VM's read-only
/// root cannot hold (a `DirectoryOrCreate` the kubelet would create empty) goes instead.
pub struct Node<'a> {
    pub name: &'a str,
    pub scratch: &'a Path,
}

impl PodPlan {
    /// The pod `NAME-SUFFIX` (a DaemonSet names its pods so) of DaemonSet `name` in `rendered`,
    /// with `uid`, on `node`.
    pub fn daemonset(rendered: &Rendered, name: &str, suffix: &str, uid: &str, node: &Node) -> Result<Self> {
        let ds = rendered.object("DaemonSet", name)?;
        let namespace = str_of(&ds["metadata"]["namespace"])?.to_owned();
        let template = &ds["spec"]["template"];
        let spec = &template["spec"];
        let pod_name = format!("{name}-{suffix}");
        let flag = |key: &str| spec[key].as_bool().unwrap_or(false);
        // The kubelet's namespaces: hostPID, hostNetwork and hostIPC are the node's; a pod's
        // processes otherwise see only their own container's pids (v1 pods without
        // shareProcessNamespace).
        let mode = |host: bool, otherwise: NamespaceMode| if host { NamespaceMode::Node } else { otherwise } as i32;
        let namespaces = NamespaceOption {
            network: mode(flag("hostNetwork"), NamespaceMode::Pod),
            pid: mode(flag("hostPID"), NamespaceMode::Container),
            ipc: mode(flag("hostIPC"), NamespaceMode::Pod),
        };
        let containers = spec["containers"].as_sequence().context("a pod without containers")?;
        let privileged = containers.iter().any(|c| c["securityContext"]["privileged"].as_bool() == Some(true));

        // The kubelet's labels on the sandbox beside the pod's own, and its annotations.
        let mut labels = string_map(&template["metadata"]["labels"])?;
        labels.insert("io.kubernetes.pod.name".into(), pod_name.clone());
        labels.insert("io.kubernetes.pod.namespace".into(), namespace.clone());
        labels.insert("io.kubernetes.pod.uid".into(), uid.into());
        let mut annotations = string_map(&template["metadata"]["annotations"])?;
        annotations.insert("kubernetes.io/config.source".into(), "api".into());
        let sandbox = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: pod_name.clone(),
                uid: uid.into(),
                namespace: namespace.clone(),
                attempt: 0,
            }),
            // A pod on its own network has its own UTS namespace, named after the pod.
            hostname: if flag("hostNetwork") { String::new() } else { pod_name.clone() },
            // The kubelet's is /var/log/pods/<namespace>_<name>_<uid>: read-only in the VM.
            log_directory: format!("{KUBELET_PODS}/{uid}/logs"),
            labels,
            annotations,
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: format!("/kubepods/{}pod{uid}", qos_class(containers)?.cgroup()),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(namespaces.clone()),
                    privileged,
                }),
            }),
        };

        let pod_dir = Path::new(KUBELET_PODS).join(uid);
        let volumes = spec["volumes"].as_sequence().cloned().unwrap_or_default();
        let mut config_maps = Vec::new();
        let mut host_paths: HashMap<String, PathBuf> = HashMap::new();
        for volume in &volumes {
            let vname = str_of(&volume["name"])?.to_owned();
            if let Some(path) = volume["hostPath"]["path"].as_str() {
                let kind = volume["hostPath"]["type"].as_str().unwrap_or("");
                host_paths.insert(vname, host_path(path, kind, node)?);
            } else if let Some(cm) = volume["configMap"]["name"].as_str() {
                let dir = pod_dir.join("volumes/kubernetes.io~configmap").join(&vname);
                config_maps.push(ConfigMapVolume::create(&dir, &rendered.config_map(cm)?)?);
                host_paths.insert(vname, dir);
            } else {
                bail!("volume {vname}: only hostPath and configMap volumes are run by this test: {volume:?}");
            }
        }

        let mut ports = HashMap::new();
        let mut configs = Vec::new();
        for c in containers {
            let cname = str_of(&c["name"])?.to_owned();
            let strings = |key: &str| -> Result<Vec<String>> {
                c[key].as_sequence().map_or(Ok(Vec::new()), |s| s.iter().map(|v| Ok(str_of(v)?.to_owned())).collect())
            };
            let mut envs = Vec::new();
            for e in c["env"].as_sequence().cloned().unwrap_or_default() {
                let value = match (&e["value"], e["valueFrom"]["fieldRef"]["fieldPath"].as_str()) {
                    (Value::String(v), _) => v.clone(),
                    (_, Some("spec.nodeName")) => node.name.to_owned(),
                    (_, Some("metadata.name")) => pod_name.clone(),
                    (_, Some("metadata.namespace")) => namespace.clone(),
                    (_, Some("metadata.uid")) => uid.to_owned(),
                    _ => bail!("env {:?}: not a value or field this test resolves", e["name"]),
                };
                envs.push(KeyValue { key: str_of(&e["name"])?.to_owned(), value });
            }
            for p in c["ports"].as_sequence().cloned().unwrap_or_default() {
                if let (Some(n), Some(port)) = (p["name"].as_str(), p["containerPort"].as_i64()) {
                    ports.insert(n.to_owned(), port);
                }
            }
            let mut mounts = Vec::new();
            for m in c["volumeMounts"].as_sequence().cloned().unwrap_or_default() {
                if m.get("subPath").is_some() {
                    bail!("volumeMount {:?} has a subPath, which the kubelet never updates", m["name"]);
                }
                let vname = str_of(&m["name"])?;
                mounts.push(Mount {
                    container_path: str_of(&m["mountPath"])?.to_owned(),
                    host_path: host_paths
                        .get(vname)
                        .with_context(|| format!("no volume {vname}"))?
                        .display()
                        .to_string(),
                    readonly: m["readOnly"].as_bool().unwrap_or(false),
                });
            }
            // The kubelet's own mounts: the pod's /etc/hosts (a pod on its own network; the
            // kubelet adds the pod's IP, which the agent never reads) and the termination
            // message file.
            if !flag("hostNetwork") {
                let hosts = pod_dir.join("etc-hosts");
                std::fs::write(&hosts, "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost\n")?;
                mounts.push(Mount {
                    container_path: "/etc/hosts".into(),
                    host_path: hosts.display().to_string(),
                    readonly: false,
                });
            }
            let termination = pod_dir.join("containers").join(&cname);
            std::fs::create_dir_all(&termination)?;
            let termination = termination.join("termination-log");
            std::fs::write(&termination, "")?;
            mounts.push(Mount {
                container_path: c["terminationMessagePath"].as_str().unwrap_or("/dev/termination-log").into(),
                host_path: termination.display().to_string(),
                readonly: false,
            });

            let sc = &c["securityContext"];
            let capabilities = Capability {
                add_capabilities: sc["capabilities"]["add"]
                    .as_sequence()
                    .map_or(Ok(Vec::new()), |s| s.iter().map(|v| Ok(str_of(v)?.to_owned())).collect::<Result<_>>())?,
                drop_capabilities: sc["capabilities"]["drop"]
                    .as_sequence()
                    .map_or(Ok(Vec::new()), |s| s.iter().map(|v| Ok(str_of(v)?.to_owned())).collect::<Result<_>>())?,
            };
            // A kubelet without SeccompDefault runs a container whose pod says nothing Unconfined.
            let seccomp = match sc["seccompProfile"]["type"].as_str() {
                None | Some("Unconfined") => ProfileType::Unconfined,
                Some("RuntimeDefault") => ProfileType::RuntimeDefault,
                Some(other) => bail!("seccompProfile {other}: not one this test runs"),
            };
            configs.push(ContainerConfig {
                metadata: Some(ContainerMetadata { name: cname.clone(), attempt: 0 }),
                image: Some(ImageSpec { image: str_of(&c["image"])?.to_owned() }),
                command: strings("command")?,
                args: strings("args")?,
                envs,
                mounts,
                labels: HashMap::from([
                    ("io.kubernetes.container.name".to_owned(), cname.clone()),
                    ("io.kubernetes.pod.name".to_owned(), pod_name.clone()),
                    ("io.kubernetes.pod.namespace".to_owned(), namespace.clone()),
                    ("io.kubernetes.pod.uid".to_owned(), uid.to_owned()),
                ]),
                log_path: format!("{cname}/0.log"),
                linux: Some(LinuxContainerConfig {
                    resources: Some(resources(c, spec)?),
                    security_context: Some(LinuxContainerSecurityContext {
                        capabilities: Some(capabilities),
                        privileged: sc["privileged"].as_bool().unwrap_or(false),
                        namespace_options: Some(namespaces.clone()),
                        run_as_user: sc["runAsUser"].as_i64().map(|value| Int64Value { value }),
                        readonly_rootfs: sc["readOnlyRootFilesystem"].as_bool().unwrap_or(false),
                        no_new_privs: sc["allowPrivilegeEscalation"].as_bool() == Some(false),
                        seccomp: Some(SecurityProfile { profile_type: seccomp as i32, localhost_ref: String::new() }),
                    }),
                }),
                ..ContainerConfig::default()
            });
        }
        let grace_s = spec["terminationGracePeriodSeconds"].as_i64().unwrap_or(30);
        Ok(Self { sandbox, containers: configs, config_maps, grace_s, ports })
    }
}

/// The QoS class of a pod: its cgroup's place under `kubepods`.
#[derive(Debug, PartialEq)]
enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl Qos {
    fn cgroup(&self) -> &'static str {
        match self {
            Qos::Guaranteed => "",
            Qos::Burstable => "burstable/",
            Qos::BestEffort => "besteffort/",
        }
    }
}

fn qos_class(containers: &[Value]) -> Result<Qos> {
    let (mut any, mut all_equal) = (false, true);
    for c in containers {
        let (requests, limits) = (&c["resources"]["requests"], &c["resources"]["limits"]);
        for resource in ["cpu", "memory"] {
            let (r, l) = (&requests[resource], &limits[resource]);
            any |= !r.is_null() || !l.is_null();
            // A limit alone is its request too.
            all_equal &= !l.is_null() && (r.is_null() || r == l);
        }
    }
    Ok(if !any {
        Qos::BestEffort
    } else if all_equal {
        Qos::Guaranteed
    } else {
        Qos::Burstable
    })
}

/// The cgroup settings the kubelet gives a container: CPU shares from its CPU request, its
/// memory limit, and the OOM score of a critical pod (the priority class `system-node-critical`
/// or `system-cluster-critical`: -997, as a guaranteed pod's) or else of its QoS class.
fn resources(c: &Value, spec: &Value) -> Result<LinuxContainerResources> {
    let (requests, limits) = (&c["resources"]["requests"], &c["resources"]["limits"]);
    // 1024 shares a core; the kubelet's minimum is 2.
    let cpu_shares =
        if requests["cpu"].is_null() { 2 } else { (quantity(&requests["cpu"], true)? * 1024 / 1000).max(2) };
    let memory_limit_in_bytes = if limits["memory"].is_null() { 0 } else { quantity(&limits["memory"], false)? };
    let critical =
        matches!(spec["priorityClassName"].as_str(), Some("system-node-critical" | "system-cluster-critical"));
    let oom_score_adj = if critical {
        -997
    } else {
        match qos_class(std::slice::from_ref(c))? {
            Qos::Guaranteed => -997,
            Qos::BestEffort => 1000,
            Qos::Burstable => {
                let meminfo = std::fs::read_to_string("/proc/meminfo")?;
                let total_kib = gpreempt::host::procinfo::status_field(&meminfo, "MemTotal")
                    .and_then(|v| v.trim_end_matches(" kB").parse::<i64>().ok())
                    .context("no MemTotal in /proc/meminfo")?;
                let request = if requests["memory"].is_null() { 0 } else { quantity(&requests["memory"], false)? };
                (1000 - 1000 * request / (total_kib * 1024)).clamp(3, 999)
            }
        }
    };
    Ok(LinuxContainerResources {
        cpu_shares,
        memory_limit_in_bytes,
        oom_score_adj,
        ..LinuxContainerResources::default()
    })
}

/// A hostPath volume's path on the node, checked (or created) as its `type` asks. The VM's root
/// is the host's, read-only: a `DirectoryOrCreate` it cannot hold (`/var/lib/docker` where the
/// host has no Docker) is an empty directory under the scratch directory instead, which is what
/// the kubelet would have created.
fn host_path(path: &str, kind: &str, node: &Node) -> Result<PathBuf> {
    let p = Path::new(path);
    let meta = std::fs::metadata(p);
    match kind {
        "DirectoryOrCreate" => {
            if std::fs::create_dir_all(p).is_err() {
                let stand_in = node.scratch.join("host-paths").join(path.trim_start_matches('/'));
                std::fs::create_dir_all(&stand_in)?;
                return Ok(stand_in);
            }
        }
        "Directory" if !meta.as_ref().is_ok_and(std::fs::Metadata::is_dir) => bail!("hostPath {path}: not a directory"),
        "CharDevice" if !meta.as_ref().is_ok_and(|m| m.file_type().is_char_device()) => {
            bail!("hostPath {path}: not a character device")
        }
        "" | "Directory" | "CharDevice" => {}
        other => bail!("hostPath type {other}: not one this test checks"),
    }
    Ok(p.to_owned())
}

/// A ConfigMap volume as the kubelet's atomic writer lays it out: the files in a directory
/// `..<timestamp>`, the symlink `..data` to it, and each key a symlink `KEY -> ..data/KEY`; an
/// update writes a new timestamped directory, points a new `..data_tmp` at it, renames that over
/// `..data` (the one atomic step a watcher sees) and removes the old directory.
pub struct ConfigMapVolume {
    pub dir: PathBuf,
    current: PathBuf,
}

impl ConfigMapVolume {
    pub fn create(dir: &Path, files: &[(String, String)]) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let current = Self::write_payload(dir, files)?;
        symlink(current.file_name().context("payload")?, dir.join("..data"))?;
        for (key, _) in files {
            symlink(format!("..data/{key}"), dir.join(key))?;
        }
        Ok(Self { dir: dir.to_owned(), current })
    }

    /// The kubelet's update of the same keys with new content.
    pub fn update(&mut self, files: &[(String, String)]) -> Result<()> {
        let next = Self::write_payload(&self.dir, files)?;
        let tmp = self.dir.join("..data_tmp");
        symlink(next.file_name().context("payload")?, &tmp)?;
        std::fs::rename(&tmp, self.dir.join("..data"))?;
        std::fs::remove_dir_all(&self.current)?;
        self.current = next;
        Ok(())
    }

    /// `..2006_01_02_15_04_05.<nanoseconds>` (the kubelet's: the UTC time and a random suffix).
    fn write_payload(dir: &Path, files: &[(String, String)]) -> Result<PathBuf> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?;
        let (days, secs) = ((now.as_secs() / 86400) as i64, now.as_secs() % 86400);
        let (y, m, d) = gpreempt::clock::civil_from_days(days);
        let name = format!(
            "..{y:04}_{m:02}_{d:02}_{:02}_{:02}_{:02}.{}",
            secs / 3600,
            secs / 60 % 60,
            secs % 60,
            now.subsec_nanos()
        );
        let payload = dir.join(name);
        std::fs::create_dir(&payload)?;
        for (key, text) in files {
            std::fs::write(payload.join(key), text)?;
        }
        Ok(payload)
    }
}

/// A container's log as the runtime writes it (CRI's format: `TIME STREAM P|F TEXT`, a line
/// split into `P` parts and ended by an `F` one), followed on a thread into [`Lines`]; each line
/// is echoed to stderr as `[name] line`. The thread ends with the receiver or the file.
pub fn follow_log(name: &'static str, path: PathBuf) -> ContainerLog {
    let (tx, rx) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    thread::spawn(move || {
        let (mut offset, mut pending, mut partial) = (0u64, Vec::new(), String::new());
        while !stopped.load(Ordering::Relaxed) {
            let mut chunk = Vec::new();
            // Not there yet: the runtime creates it when the container starts.
            if let Ok(mut f) = std::fs::File::open(&path)
                && f.seek(SeekFrom::Start(offset)).and_then(|_| f.read_to_end(&mut chunk)).is_err()
            {
                return;
            }
            offset += chunk.len() as u64;
            pending.extend_from_slice(&chunk);
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let raw: Vec<u8> = pending.drain(..=end).collect();
                let record = String::from_utf8_lossy(&raw[..end]).into_owned();
                let mut fields = record.splitn(4, ' ');
                let (_time, _stream, tag, text) = (fields.next(), fields.next(), fields.next(), fields.next());
                partial.push_str(text.unwrap_or(""));
                if tag == Some("P") {
                    continue;
                }
                let line = std::mem::take(&mut partial);
                eprintln!("[{name}] {line}");
                if tx.send(line).is_err() {
                    return;
                }
            }
            thread::sleep(Duration::from_millis(100));
        }
    });
    ContainerLog { lines: Lines::new(name, rx), stop }
}

/// [`follow_log`]'s lines; the thread stops on drop.
pub struct ContainerLog {
    pub lines: Lines,
    stop: Arc<AtomicBool>,
}

impl Drop for ContainerLog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(quantity(&Value::from("50m"), true).unwrap(), 50);
        assert_eq!(quantity(&Value::from("1"), true).unwrap(), 1000);
        assert_eq!(quantity(&Value::from("256Mi"), false).unwrap(), 256 << 20);
    }
}
