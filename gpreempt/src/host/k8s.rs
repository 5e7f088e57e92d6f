//! Which Kubernetes pod and container a process runs in, from the node alone (no API server).
//!
//! The pod uid and the container id come from the process's cgroup path
//! ([`procinfo::container_from_cgroup`], the kubepods layouts of cgroup v1/v2 with the systemd
//! and cgroupfs drivers). The kubelet's pod directory (`/var/lib/kubelet/pods/<uid>`) proves the
//! pod is on this node, but holds neither its name nor its namespace; the container runtime's
//! on-disk record of the container does, as annotations the kubelet passed through CRI:
//!
//! | runtime                  | record                                                           | keys                                     |
//! |--------------------------|------------------------------------------------------------------|------------------------------------------|
//! | containerd               | `/run/containerd/io.containerd.runtime.v2.task/k8s.io/<id>/config.json` (OCI `annotations`) | `io.kubernetes.cri.sandbox-{name,namespace,uid}`, `io.kubernetes.cri.container-name` |
//! | CRI-O                    | `/run/containers/storage/overlay-containers/<id>/userdata/config.json` (OCI `annotations`) | `io.kubernetes.pod.{name,namespace,uid}`, `io.kubernetes.container.name` |
//! | Docker (cri-dockerd)     | `/var/lib/docker/containers/<id>/config.v2.json` (`Config.Labels`) | `io.kubernetes.pod.{name,namespace,uid}`, `io.kubernetes.container.name` |
//!
//! A record counts only if its pod uid equals the one in the cgroup path; anything missing,
//! unreadable or inconsistent leaves the pod unknown — never guessed.

use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::host::{cri::CriSocket, procinfo::Container};

/// A process's pod, as the node's files name it. In JSON: `{namespace, name, uid}` (the
/// container's name is its own field beside it: `container_name`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The container's name in the pod spec, when the record says.
    #[serde(skip)]
    pub container: Option<String>,
}

/// Where the kubelet and the runtimes keep their state (each may point at a fixture tree).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct K8sRoots {
    /// `/var/lib/kubelet/pods`.
    pub kubelet_pods: PathBuf,
    /// containerd's CRI task bundles (`/run/containerd/io.containerd.runtime.v2.task/k8s.io`).
    pub containerd: PathBuf,
    /// CRI-O's container storage (`/run/containers/storage/overlay-containers`).
    pub crio: PathBuf,
    /// Docker's containers (`/var/lib/docker/containers`).
    pub docker: PathBuf,
    /// The CRI runtime's socket (pod labels).
    pub cri: CriSocket,
}

impl Default for K8sRoots {
    fn default() -> Self {
        Self { cri: CriSocket::node(), ..Self::under(Path::new("/")) }
    }
}

impl K8sRoots {
    /// The standard locations below `root` (`/` on a node, a fixture directory in tests).
    pub fn under(root: &Path) -> Self {
        Self {
            kubelet_pods: root.join("var/lib/kubelet/pods"),
            containerd: root.join("run/containerd/io.containerd.runtime.v2.task/k8s.io"),
            crio: root.join("run/containers/storage/overlay-containers"),
            docker: root.join("var/lib/docker/containers"),
            cri: CriSocket::Discover(root.to_path_buf()),
        }
    }

    /// The node's state beside `roots`: under the directory that holds its `/proc` (`/` on a
    /// node; the captured tree when `roots` points at one).
    pub fn beside(roots: &crate::host::roots::Roots) -> Self {
        Self { cri: roots.cri.clone(), ..Self::under(roots.proc.parent().unwrap_or_else(|| Path::new("/"))) }
    }

    /// The pod of a container found in a cgroup path, or `None` when the node's files do not
    /// say (not in a pod, pod not on this node, no readable runtime record, uids disagree).
    pub fn identify(&self, container: &Container) -> Option<PodRef> {
        let uid = container.pod_uid.as_deref()?;
        if !self.kubelet_pods.join(uid).is_dir() {
            return None;
        }
        let id = container.id.as_str();
        // A bare 64-hex id (cgroupfs driver) does not say which runtime made it: try each.
        let records = [
            (self.containerd.join(id).join("config.json"), Keys::CRI_CONTAINERD),
            (self.crio.join(id).join("userdata/config.json"), Keys::LABELS),
            (self.docker.join(id).join("config.v2.json"), Keys::LABELS),
        ];
        records.iter().find_map(|(path, keys)| {
            let text = fs::read_to_string(path).ok()?;
            let json: serde_json::Value = serde_json::from_str(&text).ok()?;
            let map = json.get("annotations").or_else(|| json.get("Config").and_then(|c| c.get("Labels")))?;
            let get = |key: &str| map.get(key).and_then(|v| v.as_str()).filter(|s| !s.is_empty()).map(str::to_owned);
            if get(keys.uid)? != uid {
                return None;
            }
            Some(PodRef {
                namespace: get(keys.namespace)?,
                name: get(keys.name)?,
                uid: uid.to_owned(),
                container: get(keys.container),
            })
        })
    }
}

/// The annotation (or label) keys of one runtime's record.
struct Keys {
    name: &'static str,
    namespace: &'static str,
    uid: &'static str,
    container: &'static str,
}

impl Keys {
    const CRI_CONTAINERD: Self = Self {
        name: "io.kubernetes.cri.sandbox-name",
        namespace: "io.kubernetes.cri.sandbox-namespace",
        uid: "io.kubernetes.cri.sandbox-uid",
        container: "io.kubernetes.cri.container-name",
    };
    /// CRI-O's annotations and cri-dockerd's Docker labels.
    const LABELS: Self = Self {
        name: "io.kubernetes.pod.name",
        namespace: "io.kubernetes.pod.namespace",
        uid: "io.kubernetes.pod.uid",
        container: "io.kubernetes.container.name",
    };
}

/// The prefix of a pod selector.
pub const POD_PREFIX: &str = "pod:";

/// `pod:NAMESPACE/NAME`, each part a glob (`*` any run, `?` one character).
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct PodPattern {
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PodPatternError {
    #[error("`{0}` is not a pod selector: write pod:NAMESPACE/NAME (globs allowed, e.g. pod:batch/train-*)")]
    NotPod(String),
    #[error("`{0}`: the namespace and the name must both be non-empty (pod:NAMESPACE/NAME)")]
    Empty(String),
}

impl std::str::FromStr for PodPattern {
    type Err = PodPatternError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let rest = s.trim().strip_prefix(POD_PREFIX).ok_or_else(|| PodPatternError::NotPod(s.to_owned()))?;
        let (namespace, name) = rest.split_once('/').ok_or_else(|| PodPatternError::NotPod(s.to_owned()))?;
        if namespace.is_empty() || name.is_empty() || name.contains('/') {
            return Err(PodPatternError::Empty(s.to_owned()));
        }
        Ok(Self { namespace: namespace.to_owned(), name: name.to_owned() })
    }
}

impl std::fmt::Display for PodPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{POD_PREFIX}{}/{}", self.namespace, self.name)
    }
}

impl PodPattern {
    /// Does the pattern name `pod`? An unknown pod matches nothing.
    pub fn matches(&self, pod: Option<&PodRef>) -> bool {
        pod.is_some_and(|p| glob(&self.namespace, &p.namespace) && glob(&self.name, &p.name))
    }
}

/// `*` and `?` globbing over characters (iterative, with one backtrack point).
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::host::procinfo::{Runtime, container_from_cgroup};

    fn fixture(case: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/cgroup").join(case)
    }

    /// The fixture's `proc/self/cgroup` through the cgroup parser, then its node tree.
    fn pod_of(case: &str) -> (Option<Container>, Option<PodRef>) {
        let root = fixture(case);
        let cgroup = fs::read_to_string(root.join("proc/self/cgroup")).unwrap();
        let container = container_from_cgroup(&cgroup);
        let pod = container.as_ref().and_then(|c| K8sRoots::under(&root).identify(c));
        (container, pod)
    }

    fn pod(namespace: &str, name: &str, uid: &str, container: &str) -> Option<PodRef> {
        Some(PodRef {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
            container: Some(container.into()),
        })
    }

    const CONTAINERD_ID: &str = "7c1e0b8f3a2d4e5f60718293a4b5c6d7e8f90123456789abcdef0123456789ab";
    const CRIO_ID: &str = "d2f4a6c8e0b1d3f5a7c9e1b3d5f7a9c1e3b5d7f9a1c3e5b7d9f1a3c5e7b9d1f3";
    const DOCKER_ID: &str = "4b8e2c6a0d4f8b2e6c0a4d8f2b6e0c4a8d2f6b0e4c8a2d6f0b4e8c2a6d0f4b8e";

    #[test]
    fn containerd_systemd_cgroup_v2() {
        let (c, p) = pod_of("containerd-systemd-v2");
        let c = c.unwrap();
        assert_eq!((c.runtime, c.id.as_str()), (Runtime::Containerd, CONTAINERD_ID));
        assert_eq!(p, pod("ml", "trainer-0", "5f1c2b3a-9d8e-4f70-a1b2-c3d4e5f60718", "trainer"));
    }

    #[test]
    fn crio_systemd_cgroup_v2() {
        let (c, p) = pod_of("crio-systemd-v2");
        assert_eq!(c.map(|c| (c.runtime, c.id)), Some((Runtime::CriO, CRIO_ID.to_owned())));
        assert_eq!(p, pod("inference", "server-7d9f8-x2x4q", "0e9d8c7b-6a5f-4e3d-2c1b-0a9f8e7d6c5b", "server"));
    }

    #[test]
    fn containerd_cgroupfs_cgroup_v1_bare_id() {
        let (c, p) = pod_of("containerd-cgroupfs-v1");
        let c = c.unwrap();
        assert_eq!((c.runtime, c.id.as_str()), (Runtime::Kubernetes, CONTAINERD_ID), "the bare id names no runtime");
        assert_eq!(p, pod("batch", "sweep-42", "a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d", "worker"));
    }

    #[test]
    fn docker_cri_dockerd_cgroupfs_cgroup_v1() {
        let (c, p) = pod_of("docker-cgroupfs-v1");
        assert_eq!(c.map(|c| c.id), Some(DOCKER_ID.to_owned()));
        assert_eq!(p, pod("default", "notebook", "9a8b7c6d-5e4f-4321-8765-43210fedcba9", "jupyter"));
    }

    #[test]
    fn a_record_of_another_pod_or_no_kubelet_dir_leaves_the_pod_unknown() {
        let (c, p) = pod_of("uid-mismatch");
        assert!(c.unwrap().pod_uid.is_some());
        assert_eq!(p, None, "the runtime record names another pod uid");
        let (c, p) = pod_of("no-kubelet-dir");
        assert!(c.unwrap().pod_uid.is_some());
        assert_eq!(p, None, "the pod is not on this node");
    }

    #[test]
    fn a_plain_docker_container_is_no_pod() {
        let (c, p) = pod_of("docker-plain");
        assert_eq!(c.map(|c| (c.runtime, c.pod_uid)), Some((Runtime::Docker, None)));
        assert_eq!(p, None);
    }

    #[test]
    fn pod_patterns_parse_and_glob() {
        let p: PodPattern = "pod:ml/trainer-*".parse().unwrap();
        assert_eq!(p.to_string(), "pod:ml/trainer-*");
        let trainer = pod("ml", "trainer-0", "u", "c");
        assert!(p.matches(trainer.as_ref()));
        assert!(!p.matches(pod("ml2", "trainer-0", "u", "c").as_ref()));
        assert!(!p.matches(None), "an unknown pod matches nothing");
        assert!("pod:*/trainer-?".parse::<PodPattern>().unwrap().matches(trainer.as_ref()));
        assert!(!"pod:*/trainer-?".parse::<PodPattern>().unwrap().matches(pod("ml", "trainer-10", "u", "c").as_ref()));
        assert!("pod:m*l/*".parse::<PodPattern>().unwrap().matches(trainer.as_ref()));
        assert_eq!("ml/x".parse::<PodPattern>(), Err(PodPatternError::NotPod("ml/x".into())));
        assert_eq!("pod:ml".parse::<PodPattern>(), Err(PodPatternError::NotPod("pod:ml".into())));
        assert_eq!("pod:/x".parse::<PodPattern>(), Err(PodPatternError::Empty("pod:/x".into())));
        assert_eq!("pod:a/b/c".parse::<PodPattern>(), Err(PodPatternError::Empty("pod:a/b/c".into())));
    }
}
