//! Who a host pid is: its `comm`, its pid inside its own pid namespace, and the container it runs in.
//!
//! Container names come from the runtime's own records: Docker's `containers/<id>/config.v2.json`
//! ([`docker_name`]), Podman's containers/storage `containers.json` ([`storage_name`]), LXC's
//! cgroup name.
//!
//! KFD names processes by host TGID (docs/kfd.md §4.1), which says little to someone who started a job in a
//! container. Everything here comes from `/proc` and the container runtimes' on-disk state, without calling any
//! container CLI or daemon.
//!
//! # Container detection ([`container_from_cgroup`])
//!
//! Each `/proc/<pid>/cgroup` line is `hierarchy:controllers:path` (cgroup v2 is the single `0::path` line); the
//! first line whose path yields a container wins. Within a path, components are examined outermost first and the
//! **outermost** container component wins: for nested containers (Docker-in-Docker, kind nodes) that is the one
//! the host's runtime knows, so its id matches the host's state (and `docker ps`). Container components:
//!
//! | component                                        | runtime                   | id      |
//! |--------------------------------------------------|---------------------------|---------|
//! | `docker-<64hex>[.scope]`                         | [`Runtime::Docker`]       | hex     |
//! | `docker` followed by `<64hex>` (cgroupfs driver) | [`Runtime::Docker`]       | hex     |
//! | `cri-containerd-<64hex>[.scope]`                 | [`Runtime::Containerd`]   | hex     |
//! | `nerdctl-<64hex>[.scope]`                        | [`Runtime::Containerd`]   | hex     |
//! | `crio-<64hex>[.scope]`                           | [`Runtime::CriO`]         | hex     |
//! | `libpod-<64hex>[.scope]` (rootful and rootless)  | [`Runtime::Podman`]       | hex     |
//! | `lxc` followed by `<name>`; `lxc.payload.<name>` | [`Runtime::Lxc`]          | name    |
//! | `<64hex>` after a kubepods pod component         | [`Runtime::Kubernetes`]   | hex     |
//! | only a kubepods pod component                    | [`Runtime::Kubernetes`]   | pod uid |
//!
//! The runtime is what the cgroup name proves: with the systemd driver the scope prefix names the runtime, with the
//! cgroupfs driver a Kubernetes container is a bare id under `kubepods/…/pod<uid>/` whatever runtime created it,
//! so it is labelled [`Runtime::Kubernetes`]. Monitor processes are not containers: `libpod-conmon-…`,
//! `crio-conmon-…` and `lxc.monitor.…` never match. Ids must be exactly 64 lowercase hex digits, so systemd units
//! such as `docker-cleanup.scope` do not match either.
//!
//! A pod component is `…kubepods…-pod<uid>.slice` (systemd driver; the uid's `-` are written as `_` there and are
//! converted back) or `pod<uid>` below a `kubepods` component (cgroupfs driver). `pod_uid` is set when a pod
//! component precedes the chosen container component.

use std::{
    fmt, fs, io,
    path::{Path, PathBuf},
};

use super::roots::Roots;
use crate::domain::HostPid;

#[derive(Debug, thiserror::Error)]
pub enum ProcInfoError {
    #[error(
        "no process {pid}: {} does not exist (it exited, the pid is wrong, or procfs hides it with hidepid=)",
        path.display()
    )]
    NoSuchProcess { pid: HostPid, path: PathBuf },
    #[error("cannot read {}: {cause}", path.display())]
    Io { path: PathBuf, cause: io::Error },
}

/// Identity of one host pid. Fields are `None` when their file could not be read or parsed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ProcInfo {
    /// Host pid (as KFD names the process).
    pub pid: HostPid,
    /// `/proc/<pid>/comm` without its newline (at most 15 bytes, set by the process itself).
    pub comm: Option<String>,
    /// Pid in the innermost pid namespace (last `NSpid:` value); equals `pid` for a host process.
    pub ns_pid: Option<u32>,
    pub container: Option<Container>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Container {
    pub runtime: Runtime,
    /// Full id as it appears in the cgroup path (LXC: the container name; pod-only: the pod uid).
    pub id: String,
    /// Human name when it can be found without a CLI: Docker's `config.v2.json`, Podman's
    /// `containers.json`, LXC's cgroup name.
    pub name: Option<String>,
    /// Kubernetes pod uid, dashed form.
    pub pod_uid: Option<String>,
}

impl Container {
    /// Does `filter` name this container: its name exactly, or its id or a prefix of it (as
    /// `docker` accepts `3f4e5d6c7b8a` for the full id)? An empty filter names nothing.
    pub fn matches(&self, filter: &str) -> bool {
        self.name.as_deref() == Some(filter) || (!filter.is_empty() && self.id.starts_with(filter))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Runtime {
    Docker,
    Containerd,
    Podman,
    CriO,
    /// In a Kubernetes pod, but the cgroup name does not say which runtime created the container.
    Kubernetes,
    Lxc,
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Runtime::Docker => "docker",
            Runtime::Containerd => "containerd",
            Runtime::Podman => "podman",
            Runtime::CriO => "cri-o",
            Runtime::Kubernetes => "kubernetes",
            Runtime::Lxc => "lxc",
        })
    }
}

/// [`read_with`] with the runtimes' default data roots.
pub fn read(proc_root: &Path, pid: HostPid) -> Result<ProcInfo, ProcInfoError> {
    read_with(&Roots { proc: proc_root.to_owned(), ..Roots::default() }, pid)
}

/// Identity of `pid` from `roots.proc` (normally [`super::roots::PROC_ROOT`]); Docker container names come from
/// `roots.docker/containers/<id>/config.v2.json`, Podman's from `roots.containers_storage`.
pub fn read_with(roots: &Roots, pid: HostPid) -> Result<ProcInfo, ProcInfoError> {
    let dir = roots.proc.join(pid.to_string());
    match fs::metadata(&dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(ProcInfoError::NoSuchProcess { pid, path: dir }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ProcInfoError::NoSuchProcess { pid, path: dir }),
        Err(e) => return Err(ProcInfoError::Io { path: dir, cause: e }),
    }

    // comm is arbitrary bytes chosen by the process (prctl PR_SET_NAME), hence the lossy conversion.
    let comm = read_lossy(&dir.join("comm")).map(|s| s.strip_suffix('\n').unwrap_or(&s).to_string());
    let ns_pid = read_lossy(&dir.join("status")).and_then(|status| ns_pid(&status));
    let container = read_lossy(&dir.join("cgroup")).and_then(|cgroup| container_from_cgroup(&cgroup)).map(|mut c| {
        match c.runtime {
            Runtime::Docker => c.name = docker_name(&roots.docker, &c.id),
            Runtime::Podman => c.name = storage_name(&roots.containers_storage, &c.id),
            _ => {}
        }
        c
    });

    // A process reaped while we read it leaves only `None`s behind; say so instead.
    if !dir.is_dir() {
        return Err(ProcInfoError::NoSuchProcess { pid, path: dir });
    }
    Ok(ProcInfo { pid, comm, ns_pid, container })
}

/// The container described by the contents of a `/proc/<pid>/cgroup` file, by the rules in the module docs.
pub fn container_from_cgroup(cgroup_text: &str) -> Option<Container> {
    cgroup_text.lines().find_map(|line| {
        // The path is the third field and may itself contain ':'.
        let mut fields = line.splitn(3, ':');
        let (_hierarchy, _controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        container_from_path(path.trim_end())
    })
}

/// The first 12 characters of a hex id (as `docker ps` shows it); any other id (an LXC name, a pod uid) whole.
pub fn short_id(id: &str) -> &str {
    if id.len() > 12 && id.bytes().all(|b| b.is_ascii_hexdigit()) { &id[..12] } else { id }
}

/// Docker's name for container `id`: the top-level `"Name"` of its `config.v2.json`, without the leading '/'.
/// `None` when the file is missing (rootless Docker, another data root) or not understood.
pub fn docker_name(docker_root: &Path, id: &str) -> Option<String> {
    // The id is used as a path component: only accept what Docker itself produces.
    if !is_container_hex(id) {
        return None;
    }
    let text = fs::read_to_string(docker_root.join("containers").join(id).join("config.v2.json")).ok()?;
    // Only the top-level "Name": labels and mount points may carry a "Name" of their own.
    let config: serde_json::Value = serde_json::from_str(&text).ok()?;
    let name = config.get("Name")?.as_str()?;
    let name = name.strip_prefix('/').unwrap_or(name);
    (!name.is_empty()).then(|| name.to_string())
}

/// Podman's name for container `id`: the first of `names` in containers/storage's record of it, a
/// `containers.json` (or, for containers kept only in memory, `volatile-containers.json`) array of
/// `{"id", "names", …}` in one of `dirs` (Podman 4.3 writes `--rm` containers to `containers.json`
/// too, flagged `Volatile`). `None` when no record names it.
pub fn storage_name(dirs: &[PathBuf], id: &str) -> Option<String> {
    if !is_container_hex(id) {
        return None;
    }
    let files = dirs.iter().flat_map(|d| [d.join("containers.json"), d.join("volatile-containers.json")]);
    files.filter_map(|f| fs::read_to_string(f).ok()).find_map(|text| {
        let records: Vec<serde_json::Value> = serde_json::from_str(&text).ok()?;
        let record = records.iter().find(|r| r.get("id").and_then(|v| v.as_str()) == Some(id))?;
        let name = record.get("names")?.as_array()?.first()?.as_str()?;
        (!name.is_empty()).then(|| name.to_owned())
    })
}

fn read_lossy(path: &Path) -> Option<String> {
    fs::read(path).ok().map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

/// The value of `key` in the text of a `/proc/<pid>/status` file (`Key:\tvalue` lines), trimmed.
pub fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':').map(str::trim))
}

/// `status_field(status, key)` as a number (`Tgid`, `TracerPid`, `Pid`).
pub fn status_number(status: &str, key: &str) -> Option<u32> {
    status_field(status, key)?.parse().ok()
}

/// The effective capability set, `CapEff:` (hex).
pub fn effective_caps(status: &str) -> Option<u64> {
    u64::from_str_radix(status_field(status, "CapEff")?, 16).ok()
}

/// The pid inside the innermost pid namespace: `NSpid:` lists the pid in every pid namespace the
/// process is in, outermost first (Linux ≥ 4.1).
pub fn ns_pid(status: &str) -> Option<u32> {
    status_field(status, "NSpid")?.split_whitespace().last()?.parse().ok()
}

fn container_from_path(path: &str) -> Option<Container> {
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let mut in_kubepods = false;
    let mut pod_uid: Option<String> = None;
    for (i, &component) in components.iter().enumerate() {
        let next = components.get(i + 1).copied();
        let found = if let Some((runtime, id)) = scope_container(component) {
            Some((runtime, id))
        } else if component == "docker" {
            next.filter(|n| is_container_hex(n)).map(|id| (Runtime::Docker, id))
        } else if component == "lxc" {
            next.map(|name| (Runtime::Lxc, name))
        } else if let Some(name) = component.strip_prefix("lxc.payload.").filter(|n| !n.is_empty()) {
            Some((Runtime::Lxc, name))
        } else if in_kubepods && pod_uid.is_some() && is_container_hex(component) {
            Some((Runtime::Kubernetes, component))
        } else {
            None
        };
        if let Some((runtime, id)) = found {
            let name = (runtime == Runtime::Lxc).then(|| id.to_string());
            return Some(Container { runtime, id: id.to_string(), name, pod_uid });
        }

        if component.contains("kubepods") {
            in_kubepods = true;
            if let Some(uid) = systemd_pod_uid(component) {
                pod_uid = Some(uid);
            }
        } else if in_kubepods && let Some(uid) = component.strip_prefix("pod").filter(|uid| is_uid(uid)) {
            pod_uid = Some(uid.to_string());
        }
    }
    pod_uid.map(|uid| Container { runtime: Runtime::Kubernetes, id: uid.clone(), name: None, pod_uid: Some(uid) })
}

/// `<prefix>-<64hex>.scope` as runc's systemd driver names a container scope (`slice:prefix:id`); the cgroupfs
/// forms of CRI-O and Podman use the same name without `.scope`.
fn scope_container(component: &str) -> Option<(Runtime, &str)> {
    const PREFIXES: [(&str, Runtime); 5] = [
        ("docker-", Runtime::Docker),
        ("cri-containerd-", Runtime::Containerd),
        ("nerdctl-", Runtime::Containerd),
        ("crio-", Runtime::CriO),
        ("libpod-", Runtime::Podman),
    ];
    let unit = component.strip_suffix(".scope").unwrap_or(component);
    PREFIXES.iter().find_map(|&(prefix, runtime)| {
        unit.strip_prefix(prefix).filter(|id| is_container_hex(id)).map(|id| (runtime, id))
    })
}

/// `kubepods-burstable-pod<uid>.slice`, `kubepods-pod<uid>.slice`: systemd escapes '-' inside a slice name
/// component, so the kubelet writes the uid's dashes as '_'.
fn systemd_pod_uid(component: &str) -> Option<String> {
    let unit = component.strip_suffix(".slice")?;
    let uid = &unit[unit.rfind("-pod")? + "-pod".len()..];
    is_uid(uid).then(|| uid.replace('_', "-"))
}

/// Pod uids are UUIDs (or a 32-hex hash for static pods).
fn is_uid(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-' || b == b'_')
}

fn is_container_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::FakeHost;

    const HEX: &str = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899";
    const HEX2: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const UID: &str = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";

    fn container(runtime: Runtime, id: &str, name: Option<&str>, pod_uid: Option<&str>) -> Option<Container> {
        Some(Container {
            runtime,
            id: id.to_string(),
            name: name.map(str::to_string),
            pod_uid: pod_uid.map(str::to_string),
        })
    }

    #[test]
    fn docker_cgroupfs() {
        assert_eq!(container_from_cgroup(&format!("0::/docker/{HEX}\n")), container(Runtime::Docker, HEX, None, None));
    }

    #[test]
    fn docker_systemd() {
        let text = format!("0::/system.slice/docker-{HEX}.scope\n");
        assert_eq!(container_from_cgroup(&text), container(Runtime::Docker, HEX, None, None));
    }

    #[test]
    fn docker_cgroup_v1_takes_first_line_with_a_container() {
        let text = format!(
            "13:rdma:/\n12:pids:/system.slice/docker-{HEX}.scope\n1:name=systemd:/system.slice/docker-{HEX}.scope\n0::/\n"
        );
        assert_eq!(container_from_cgroup(&text), container(Runtime::Docker, HEX, None, None));
    }

    #[test]
    fn nested_docker_reports_the_outermost() {
        let text = format!("0::/system.slice/docker-{HEX}.scope/docker/{HEX2}\n");
        assert_eq!(container_from_cgroup(&text), container(Runtime::Docker, HEX, None, None));
    }

    #[test]
    fn systemd_inside_a_container_still_finds_it() {
        let text = format!("0::/system.slice/docker-{HEX}.scope/system.slice/sshd.service\n");
        assert_eq!(container_from_cgroup(&text), container(Runtime::Docker, HEX, None, None));
    }

    #[test]
    fn kubernetes_systemd_containerd() {
        let uid = UID.replace('-', "_");
        let text = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/cri-containerd-{HEX}.scope\n"
        );
        assert_eq!(container_from_cgroup(&text), container(Runtime::Containerd, HEX, None, Some(UID)));
    }

    #[test]
    fn kubernetes_systemd_guaranteed_qos_crio() {
        let uid = UID.replace('-', "_");
        let text = format!("0::/kubepods.slice/kubepods-pod{uid}.slice/crio-{HEX}.scope\n");
        assert_eq!(container_from_cgroup(&text), container(Runtime::CriO, HEX, None, Some(UID)));
    }

    #[test]
    fn crio_conmon_is_not_the_container() {
        let uid = UID.replace('-', "_");
        let text = format!("0::/kubepods.slice/kubepods-pod{uid}.slice/crio-conmon-{HEX}.scope\n");
        // Only the pod is recognisable.
        assert_eq!(container_from_cgroup(&text), container(Runtime::Kubernetes, UID, None, Some(UID)));
    }

    #[test]
    fn kubernetes_cgroupfs_bare_id() {
        let text = format!("0::/kubepods/besteffort/pod{UID}/{HEX}\n");
        assert_eq!(container_from_cgroup(&text), container(Runtime::Kubernetes, HEX, None, Some(UID)));
        let v1 = format!("11:memory:/kubepods/pod{UID}/{HEX}\n");
        assert_eq!(container_from_cgroup(&v1), container(Runtime::Kubernetes, HEX, None, Some(UID)));
    }

    #[test]
    fn kubernetes_cgroupfs_crio() {
        let text = format!("0::/kubepods/burstable/pod{UID}/crio-{HEX}\n");
        assert_eq!(container_from_cgroup(&text), container(Runtime::CriO, HEX, None, Some(UID)));
    }

    #[test]
    fn kubernetes_pod_slice_without_container() {
        let uid = UID.replace('-', "_");
        let text = format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice\n");
        assert_eq!(container_from_cgroup(&text), container(Runtime::Kubernetes, UID, None, Some(UID)));
    }

    #[test]
    fn kubernetes_under_kubelet_slice() {
        // Kubelet with --cgroup-root=/kubelet.slice (kind nodes, some distributions).
        let uid = UID.replace('-', "_");
        let text = format!(
            "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/\
             kubelet-kubepods-burstable-pod{uid}.slice/cri-containerd-{HEX}.scope\n"
        );
        assert_eq!(container_from_cgroup(&text), container(Runtime::Containerd, HEX, None, Some(UID)));
    }

    #[test]
    fn nerdctl_systemd() {
        let text = format!("0::/system.slice/nerdctl-{HEX}.scope\n");
        assert_eq!(container_from_cgroup(&text), container(Runtime::Containerd, HEX, None, None));
    }

    #[test]
    fn podman_rootful() {
        let text = format!("0::/machine.slice/libpod-{HEX}.scope/container\n");
        assert_eq!(container_from_cgroup(&text), container(Runtime::Podman, HEX, None, None));
    }

    #[test]
    fn podman_rootless() {
        let text = format!("0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{HEX}.scope\n");
        assert_eq!(container_from_cgroup(&text), container(Runtime::Podman, HEX, None, None));
    }

    #[test]
    fn podman_cgroupfs_seen_from_another_containers_cgroup_namespace() {
        // Podman's cgroupfs manager (`libpod_parent`), and the same process as a containerised
        // agent sees it: cgroup v2 paths are relative to the reader's cgroup namespace root.
        for text in [format!("0::/libpod_parent/libpod-{HEX}\n"), format!("0::/../libpod-{HEX}\n")] {
            assert_eq!(container_from_cgroup(&text), container(Runtime::Podman, HEX, None, None), "{text}");
        }
    }

    #[test]
    fn podman_conmon_is_not_the_container() {
        let text = format!("0::/machine.slice/libpod-conmon-{HEX}.scope\n");
        assert_eq!(container_from_cgroup(&text), None);
    }

    #[test]
    fn lxc_legacy() {
        assert_eq!(
            container_from_cgroup("0::/lxc/build-box\n"),
            container(Runtime::Lxc, "build-box", Some("build-box"), None)
        );
    }

    #[test]
    fn lxc_payload() {
        let text = "0::/lxc.payload.c1/system.slice/cron.service\n";
        assert_eq!(container_from_cgroup(text), container(Runtime::Lxc, "c1", Some("c1"), None));
        assert_eq!(container_from_cgroup("0::/lxc.monitor.c1\n"), None);
    }

    #[test]
    fn host_processes_are_not_containers() {
        assert_eq!(container_from_cgroup("0::/user.slice/user-0.slice/session-1.scope\n"), None);
        assert_eq!(container_from_cgroup("0::/init.scope\n"), None);
        assert_eq!(container_from_cgroup("0::/system.slice/docker.service\n"), None);
        assert_eq!(container_from_cgroup("0::/system.slice/containerd.service\n"), None);
        assert_eq!(container_from_cgroup("0::/system.slice/docker-cleanup.scope\n"), None);
        assert_eq!(container_from_cgroup("0::/\n"), None);
    }

    #[test]
    fn garbage_is_not_a_container() {
        assert_eq!(container_from_cgroup(""), None);
        assert_eq!(container_from_cgroup("hello world\n"), None);
        assert_eq!(container_from_cgroup(&format!("docker-{HEX}.scope\n")), None);
        assert_eq!(container_from_cgroup(&format!("0::/docker/{}\n", &HEX[..63])), None);
        assert_eq!(container_from_cgroup(&format!("0::/docker/{}\n", HEX.to_uppercase())), None);
    }

    #[test]
    fn short_ids() {
        assert_eq!(short_id(HEX), "3f4e5d6c7b8a");
        assert_eq!(short_id("c1"), "c1");
        assert_eq!(short_id("build-box-with-a-long-name"), "build-box-with-a-long-name");
        assert_eq!(short_id(UID), UID);
    }

    #[test]
    fn runtime_names() {
        assert_eq!(Runtime::CriO.to_string(), "cri-o");
        assert_eq!(Runtime::Kubernetes.to_string(), "kubernetes");
    }

    /// The shape of a real config.v2.json, with "Name" keys nested before and after the top-level one.
    fn docker_config(name: &str) -> String {
        format!(
            r#"{{"StreamConfig":{{}},"State":{{"Running":true,"Pid":4242}},"ID":"{HEX}","Path":"python3","Args":["-c","print(\"a\\\"b\")"],"Config":{{"Hostname":"3f4e5d6c7b8a","Labels":{{"Name":"decoy"}}}},"NetworkSettings":{{"Networks":{{"bridge":{{"IPAddress":"172.17.0.2"}}}}}},"LogPath":"","Name":"{name}","Driver":"overlay2","MountPoints":{{"/data":{{"Name":"vol","Driver":"local"}}}}}}"#
        )
    }

    /// Process 4242 (python3) with this status and cgroup.
    fn proc_tree(status: &str, cgroup: &str) -> FakeHost {
        let mut host = FakeHost::new();
        host.process(4242, "python3", status, cgroup);
        host
    }

    const STATUS: &str = "Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\nNgid:\t0\nPid:\t4242\n\
                          PPid:\t4200\nNSpid:\t4242\t17\nNSpgid:\t4242\t17\n";

    #[test]
    fn read_docker_process() {
        let mut host = proc_tree(STATUS, &format!("0::/system.slice/docker-{HEX}.scope\n"));
        host.docker_container(HEX, &docker_config("/trainer"));
        let roots = host.roots();
        let info = read_with(&roots, HostPid(4242)).expect("read");
        assert_eq!(
            info,
            ProcInfo {
                pid: HostPid(4242),
                comm: Some("python3".to_string()),
                ns_pid: Some(17),
                container: container(Runtime::Docker, HEX, Some("trainer"), None),
            }
        );
    }

    #[test]
    fn read_docker_without_or_with_garbled_config_has_no_name() {
        let mut host = proc_tree(STATUS, &format!("0::/docker/{HEX}\n"));
        let roots = host.roots();
        let info = read_with(&roots, HostPid(4242)).expect("read");
        assert_eq!(info.container, container(Runtime::Docker, HEX, None, None));

        for garbled in ["", "{", "[\"Name\",\"/x\"]", "{\"Name\":42}", "{\"Config\":{\"Name\":\"/x\"}}", "\u{0}\u{1}"] {
            host.docker_container(HEX, garbled);
            let info = read_with(&roots, HostPid(4242)).expect("read");
            assert_eq!(info.container, container(Runtime::Docker, HEX, None, None), "{garbled:?}");
        }
    }

    /// containers/storage's record as Podman 4.3 writes it (two containers, the second `--rm`).
    fn containers_json(first: &str, second: &str) -> String {
        format!(
            r#"[{{"id":"{first}","names":["alpha"],"image":"d148","layer":"8462","metadata":"{{\"name\":\"alpha\"}}","flags":{{"MountLabel":""}}}},{{"id":"{second}","names":["beta"],"flags":{{"Volatile":true}}}}]"#
        )
    }

    #[test]
    fn read_podman_process_names_it_from_containers_storage() {
        let host = proc_tree(STATUS, &format!("0::/libpod_parent/libpod-{HEX2}\n"));
        let roots = host.roots();
        let dir = &roots.containers_storage[0];
        fs::create_dir_all(dir).expect("mkdir");
        fs::write(dir.join("containers.json"), containers_json(HEX, HEX2)).expect("write");
        let info = read_with(&roots, HostPid(4242)).expect("read");
        assert_eq!(info.container, container(Runtime::Podman, HEX2, Some("beta"), None));
        // A transient store's file, or none, or one without this id.
        fs::remove_file(dir.join("containers.json")).expect("rm");
        assert_eq!(
            read_with(&roots, HostPid(4242)).expect("read").container,
            container(Runtime::Podman, HEX2, None, None)
        );
        fs::write(dir.join("volatile-containers.json"), containers_json(HEX2, HEX)).expect("write");
        assert_eq!(storage_name(&roots.containers_storage, HEX2).as_deref(), Some("alpha"));
        assert_eq!(storage_name(&roots.containers_storage, HEX).as_deref(), Some("beta"));
        for garbled in ["", "{", r#"{"id":"x"}"#, &format!(r#"[{{"id":"{HEX}","names":[]}}]"#)] {
            fs::write(dir.join("volatile-containers.json"), garbled).expect("write");
            assert_eq!(storage_name(&roots.containers_storage, HEX), None, "{garbled:?}");
        }
        assert_eq!(storage_name(&roots.containers_storage, "../x"), None, "not a container id");
    }

    #[test]
    fn read_host_process() {
        let host = proc_tree("Name:\tbash\nNSpid:\t4242\n", "0::/user.slice/user-0.slice/session-1.scope\n");
        let info = read(&host.roots().proc, HostPid(4242)).expect("read");
        assert_eq!(
            info,
            ProcInfo { pid: HostPid(4242), comm: Some("python3".to_string()), ns_pid: Some(4242), container: None }
        );
    }

    #[test]
    fn read_without_nspid_or_files() {
        let host = proc_tree("Name:\tpython3\nPid:\t4242\n", "");
        let proc_root = host.roots().proc;
        fs::remove_file(proc_root.join("4242/comm")).expect("rm");
        fs::remove_file(proc_root.join("4242/cgroup")).expect("rm");
        let info = read(&proc_root, HostPid(4242)).expect("read");
        assert_eq!(info, ProcInfo { pid: HostPid(4242), comm: None, ns_pid: None, container: None });
    }

    #[test]
    fn read_missing_pid_is_an_error() {
        let host = proc_tree(STATUS, "0::/init.scope\n");
        let err = read(&host.roots().proc, HostPid(999_999)).expect_err("no such pid");
        assert!(matches!(err, ProcInfoError::NoSuchProcess { pid: HostPid(999_999), .. }), "{err:?}");
        assert!(err.to_string().starts_with("no process 999999: "), "{err}");
    }

    #[test]
    fn a_container_is_named_by_its_name_its_id_or_an_id_prefix() {
        let c = container(Runtime::Docker, HEX, Some("trainer"), None).expect("container");
        for (filter, named) in
            [("trainer", true), (HEX, true), ("3f4e5d6c7b8a", true), ("3", true), ("", false), ("train", false)]
        {
            assert_eq!(c.matches(filter), named, "{filter:?}");
        }
        let unnamed = container(Runtime::CriO, HEX2, None, None).expect("container");
        assert!(!unnamed.matches("trainer") && unnamed.matches("0123"));
    }

    #[test]
    fn docker_name_is_the_top_level_name_unescaped() {
        let mut host = FakeHost::new();
        let docker_root = host.roots().docker;
        for (json, name) in [
            (r#" { "A" : {"Name":"x"}, "Name" : "/n\u0061me\\" } "#, Some("name\\")),
            (r#"{"Labels":["Name","x"],"Name":"y"}"#, Some("y")),
            (r#"{"A":"Name","B":"z"}"#, None),
            (r#"{"Name":"/"}"#, None),
        ] {
            host.docker_container(HEX, json);
            assert_eq!(docker_name(&docker_root, HEX).as_deref(), name, "{json}");
        }
        assert_eq!(docker_name(&docker_root, "../../etc"), None, "not a container id");
    }
}
