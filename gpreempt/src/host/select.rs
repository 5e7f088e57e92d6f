//! Which processes a command acts on: a host pid, every KFD process of a container
//! (`container:NAME`, where NAME is a container name, id or id prefix as `docker` accepts them),
//! or every KFD process of the Kubernetes pods `pod:NAMESPACE/NAME` names (globs; the pod is
//! read from the node's files by [`crate::host::k8s`], and an unknown pod matches nothing), or of
//! the pods whose labels satisfy `pod-label:KEY=VALUE[,…]` (asked of the node's CRI runtime by
//! [`crate::host::pod_label`]; when the runtime cannot be reached the selector matches nothing and
//! the resolution's notes say why in one line, while pid and name selectors go on working).
//!
//! A selector resolves against the KFD processes of the moment ([`resolve`], the same scan as
//! `gpreempt ps`) and decides whether a process that opens `/dev/kfd` later belongs to it
//! ([`Selector::matches`], fed by the tracer's process-open notices). Container matching is
//! [`Container::matches`] (name, id, id prefix) or, for a Kubernetes container, its name in the
//! pod spec as the runtime's record gives it ([`K8sRoots::identify`]): one rule for `ps`, the
//! registry and the selectors.

use std::{fmt, str::FromStr};

use serde::Serialize;

use crate::{
    domain::HostPid,
    host::{
        cri::CriClient,
        k8s::{K8sRoots, POD_PREFIX, PodPattern, PodPatternError},
        pod_label::{POD_LABEL_PREFIX, PodLabelError, PodLabelSelector},
        processes::{self, KfdProcess},
        procinfo::{self, Container},
        roots::Roots,
    },
};

/// The prefix that names a container rather than a pid.
const CONTAINER_PREFIX: &str = "container:";

/// One `--online`/`--offline` value.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Selector {
    Pid(HostPid),
    /// Container name, full id or id prefix.
    Container(String),
    /// `pod:NAMESPACE/NAME`, each part a glob.
    Pod(PodPattern),
    /// `pod-label:KEY=VALUE[,KEY2!=VALUE2]`: pods by label, through CRI.
    PodLabel(PodLabelSelector),
}

/// Why a selector does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SelectorError {
    #[error("empty selector: give a host pid (e.g. 4242), container:NAME, pod:NAMESPACE/NAME or pod-label:KEY=VALUE")]
    Empty,
    #[error("`container:` needs a container name or id after it (e.g. container:trainer)")]
    EmptyContainer,
    #[error(
        "`{0}` is none of: a host pid, container:NAME, pod:NAMESPACE/NAME, pod-label:KEY=VALUE (see `gpreempt ps` for the KFD processes)"
    )]
    Invalid(String),
    #[error(transparent)]
    Pod(#[from] PodPatternError),
    #[error(transparent)]
    PodLabel(#[from] PodLabelError),
    #[error("pid 0 names no process; give the host pid of a KFD process (see `gpreempt ps`)")]
    ZeroPid,
}

impl FromStr for Selector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(SelectorError::Empty);
        }
        if let Some(name) = s.strip_prefix(CONTAINER_PREFIX) {
            let name = name.trim();
            return if name.is_empty() { Err(SelectorError::EmptyContainer) } else { Ok(Self::Container(name.into())) };
        }
        if s.starts_with(POD_LABEL_PREFIX) {
            return Ok(Self::PodLabel(s.parse()?));
        }
        if s.starts_with(POD_PREFIX) {
            return Ok(Self::Pod(s.parse()?));
        }
        match s.parse::<u32>() {
            Ok(0) => Err(SelectorError::ZeroPid),
            Ok(pid) => Ok(Self::Pid(HostPid(pid))),
            Err(_) => Err(SelectorError::Invalid(s.into())),
        }
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pid(pid) => write!(f, "{}", pid.0),
            Self::Container(name) => write!(f, "{CONTAINER_PREFIX}{name}"),
            Self::Pod(pattern) => write!(f, "{pattern}"),
            Self::PodLabel(labels) => write!(f, "{labels}"),
        }
    }
}

impl Selector {
    /// Does the process `pid`, in `container` (if any), belong to this selector? A pod is looked
    /// up in the node's files under `k8s`.
    pub fn matches(&self, pid: HostPid, container: Option<&Container>, k8s: &K8sRoots) -> bool {
        match self {
            Self::Pid(p) => *p == pid,
            // A Kubernetes container is named in its pod's spec, not by the runtime: its record says.
            Self::Container(name) => container.is_some_and(|c| {
                c.matches(name)
                    || (c.pod_uid.is_some() && k8s.identify(c).and_then(|p| p.container).as_deref() == Some(name))
            }),
            Self::Pod(pattern) => pattern.matches(container.and_then(|c| k8s.identify(c)).as_ref()),
            Self::PodLabel(labels) => container.is_some_and(|c| {
                CriClient::connect(&k8s.cri)
                    .and_then(|mut client| labels.takes_container(&mut client, &c.id))
                    .unwrap_or_else(|e| {
                        log::warn!("{self}: pid {pid} not taken: {e}");
                        false
                    })
            }),
        }
    }

    /// [`Selector::matches`] for a process of a `ps` scan of `roots`.
    pub fn matches_process(&self, p: &KfdProcess, roots: &Roots) -> bool {
        self.matches(p.pid(), p.info.as_ref().and_then(|i| i.container.as_ref()), &K8sRoots::beside(roots))
    }

    /// [`Selector::matches`] for a pid seen opening `/dev/kfd` now: its container is read from
    /// /proc (a pid selector needs no lookup). False when the process is already gone.
    pub fn matches_new(&self, roots: &Roots, pid: HostPid) -> bool {
        match self {
            Self::Pid(p) => *p == pid,
            Self::Container(_) | Self::Pod(_) | Self::PodLabel(_) => procinfo::read_with(roots, pid)
                .ok()
                .is_some_and(|info| self.matches(pid, info.container.as_ref(), &K8sRoots::beside(roots))),
        }
    }
}

/// True when any of `selectors` takes the new process `pid`.
pub fn any_matches_new(selectors: &[Selector], roots: &Roots, pid: HostPid) -> bool {
    selectors.iter().any(|s| s.matches_new(roots, pid))
}

/// What a set of selectors names now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    /// KFD processes matched, in pid order, without repeats.
    pub pids: Vec<HostPid>,
    /// Pid selectors that name no KFD process now (the caller decides whether that is an error:
    /// see [`crate::controller::target::Target`] for why).
    pub unmatched_pids: Vec<HostPid>,
    /// Container and pod selectors with no KFD process now (their processes may start later),
    /// as written: `container:NAME`, `pod:NAMESPACE/NAME`, `pod-label:KEY=VALUE`.
    pub empty_containers: Vec<String>,
    /// What the scan could not read.
    pub notes: Vec<String>,
    /// Selectors that could not be looked up at all (a `pod-label:` one whose CRI runtime did not
    /// answer), one line each naming the selector, the socket and the fix: unlike an empty
    /// selector, waiting will not fill these.
    pub lookup_errors: Vec<String>,
}

/// Match `selectors` against the KFD processes under `roots` now.
pub fn resolve(selectors: &[Selector], roots: &Roots) -> Resolved {
    let (processes, notes) = processes::scan(roots);
    resolve_in(selectors, &processes, notes, roots)
}

/// [`resolve`] over an already scanned process list (of `roots`).
pub fn resolve_in(selectors: &[Selector], processes: &[KfdProcess], notes: Vec<String>, roots: &Roots) -> Resolved {
    let mut out = Resolved { notes, ..Resolved::default() };
    for sel in selectors {
        let hits: Vec<HostPid> = match sel {
            // One question to the runtime for the whole scan, not one per process.
            Selector::PodLabel(labels) => match labels.containers(&roots.cri) {
                Ok(ids) => processes
                    .iter()
                    .filter(|p| p.info.as_ref().and_then(|i| i.container.as_ref()).is_some_and(|c| ids.contains(&c.id)))
                    .map(KfdProcess::pid)
                    .collect(),
                Err(e) => {
                    out.lookup_errors.push(format!("{sel}: {e}"));
                    Vec::new()
                }
            },
            _ => processes.iter().filter(|p| sel.matches_process(p, roots)).map(KfdProcess::pid).collect(),
        };
        if hits.is_empty() {
            match sel {
                Selector::Pid(pid) => out.unmatched_pids.push(*pid),
                Selector::Container(name) => out.empty_containers.push(format!("container:{name}")),
                Selector::Pod(_) | Selector::PodLabel(_) => out.empty_containers.push(sel.to_string()),
            }
        }
        out.pids.extend(hits);
    }
    out.pids.sort_unstable();
    out.pids.dedup();
    out
}

#[cfg(test)]
mod tests {
    use std::{fs, path::Path};

    use super::*;
    use crate::{
        host::cri::test_server::{FakeRuntime, TestServer},
        test_support::FakeHost,
    };

    const ID_A: &str = "3f1b6c0f5e2d4a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b";
    const ID_B: &str = "aa1b6c0f5e2d4a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b";

    /// KFD processes 100 and 101 in Docker container "trainer", 200 in "server", 300 on the
    /// host; 400 runs in "trainer" but never opened /dev/kfd.
    fn host() -> (FakeHost, Roots) {
        let mut host = FakeHost::new();
        for (pid, id) in [(100, Some(ID_A)), (101, Some(ID_A)), (200, Some(ID_B)), (300, None), (400, Some(ID_A))] {
            if pid != 400 {
                host.kfd_process(pid);
            }
            let cgroup =
                id.map_or_else(|| "0::/user.slice\n".to_owned(), |id| format!("0::/system.slice/docker-{id}.scope\n"));
            host.process(pid, "python3", &format!("Name:\tpython3\nNSpid:\t{pid}\n"), &cgroup);
        }
        host.docker_container(ID_A, r#"{"Name":"/trainer"}"#).docker_container(ID_B, r#"{"Name":"/server"}"#);
        let roots = host.roots();
        (host, roots)
    }

    #[test]
    fn parses_pids_and_containers_with_clear_errors() {
        assert_eq!("4242".parse(), Ok(Selector::Pid(HostPid(4242))));
        assert_eq!(" 7 ".parse(), Ok(Selector::Pid(HostPid(7))));
        assert_eq!("container:trainer".parse(), Ok(Selector::Container("trainer".into())));
        assert_eq!("container:3f1b6c".parse(), Ok(Selector::Container("3f1b6c".into())));
        assert_eq!("".parse::<Selector>(), Err(SelectorError::Empty));
        assert_eq!("container:".parse::<Selector>(), Err(SelectorError::EmptyContainer));
        assert_eq!("0".parse::<Selector>(), Err(SelectorError::ZeroPid));
        assert_eq!("trainer".parse::<Selector>(), Err(SelectorError::Invalid("trainer".into())));
        assert_eq!("-5".parse::<Selector>(), Err(SelectorError::Invalid("-5".into())));
        let err = "trainer".parse::<Selector>().unwrap_err().to_string();
        assert_eq!(
            err,
            "`trainer` is none of: a host pid, container:NAME, pod:NAMESPACE/NAME, pod-label:KEY=VALUE (see `gpreempt ps` \
             for the KFD processes)"
        );
        assert_eq!(
            "pod:batch/train-*".parse(),
            Ok(Selector::Pod(PodPattern { namespace: "batch".into(), name: "train-*".into() }))
        );
        assert_eq!("pod:x".parse::<Selector>(), Err(SelectorError::Pod(PodPatternError::NotPod("pod:x".into()))));
        assert_eq!(
            "pod:x".parse::<Selector>().unwrap_err().to_string(),
            "`pod:x` is not a pod selector: write pod:NAMESPACE/NAME (globs allowed, e.g. pod:batch/train-*)"
        );
        assert_eq!("pod:/x".parse::<Selector>(), Err(SelectorError::Pod(PodPatternError::Empty("pod:/x".into()))));
        assert_eq!(Selector::Pod("pod:ml/*".parse().unwrap()).to_string(), "pod:ml/*");
        assert_eq!(Selector::Container("trainer".into()).to_string(), "container:trainer");
        assert_eq!(Selector::Pid(HostPid(9)).to_string(), "9");
    }

    #[test]
    fn resolves_against_the_kfd_processes_of_the_moment() {
        let (_dir, roots) = host();
        let sels: Vec<Selector> =
            ["container:trainer", "300", "999", "container:nothing"].iter().map(|s| s.parse().unwrap()).collect();
        let r = resolve(&sels, &roots);
        assert_eq!(r.pids, vec![HostPid(100), HostPid(101), HostPid(300)]);
        assert_eq!(r.unmatched_pids, vec![HostPid(999)]);
        assert_eq!(r.empty_containers, vec!["container:nothing".to_owned()]);
        assert_eq!(r.notes, Vec::<String>::new());
        // An id prefix names the same container; the same pid twice is one process.
        let r = resolve(&["container:aa1b6c".parse().unwrap(), "200".parse().unwrap()], &roots);
        assert_eq!(r.pids, vec![HostPid(200)]);
        // A pid that never opened /dev/kfd is not a KFD process.
        let r = resolve(&["400".parse().unwrap()], &roots);
        assert_eq!((r.pids, r.unmatched_pids), (vec![], vec![HostPid(400)]));
    }

    #[test]
    fn pod_selectors_match_the_processes_of_the_pods_the_node_names() {
        let (mut host, roots) = host();
        // Pid 500 runs in pod ml/trainer-0 (containerd, systemd driver, cgroup v2: the fixture).
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/cgroup/containerd-systemd-v2");
        let cgroup = fs::read_to_string(fixture.join("proc/self/cgroup")).unwrap();
        let task = "run/containerd/io.containerd.runtime.v2.task/k8s.io/\
                    7c1e0b8f3a2d4e5f60718293a4b5c6d7e8f90123456789abcdef0123456789ab/config.json";
        host.kfd_file(500, "pasid", "32771\n")
            .process(500, "python3", "Name:\tpython3\nNSpid:\t500\n", &cgroup)
            .dir("var/lib/kubelet/pods/5f1c2b3a-9d8e-4f70-a1b2-c3d4e5f60718")
            .file(task, fs::read_to_string(fixture.join(task)).unwrap());
        let sel = |s: &str| -> Vec<Selector> { vec![s.parse().unwrap()] };
        assert_eq!(resolve(&sel("pod:ml/trainer-*"), &roots).pids, vec![HostPid(500)]);
        // `container:` takes the container's name in the pod spec (the runtime's record says
        // "trainer"), as kubectl names it.
        assert_eq!(resolve(&sel("container:trainer"), &roots).pids, vec![HostPid(100), HostPid(101), HostPid(500)]);
        assert!(any_matches_new(&sel("container:trainer"), &roots, HostPid(500)));
        let (processes, _) = processes::scan(&roots);
        let p500 = processes.iter().find(|p| p.pid() == HostPid(500)).unwrap();
        assert_eq!(
            p500.pod.as_ref().map(|p| (p.namespace.as_str(), p.name.as_str(), p.uid.as_str())),
            Some(("ml", "trainer-0", "5f1c2b3a-9d8e-4f70-a1b2-c3d4e5f60718"))
        );
        assert_eq!(p500.container_name.as_deref(), Some("trainer"));
        assert!(p500.in_container("trainer"));
        let json = serde_json::to_value(p500).unwrap();
        assert_eq!(
            (&json["pod"], &json["container_name"]),
            (
                &serde_json::json!({"namespace": "ml", "name": "trainer-0", "uid": "5f1c2b3a-9d8e-4f70-a1b2-c3d4e5f60718"}),
                &serde_json::json!("trainer")
            )
        );
        assert_eq!(resolve(&sel("pod:*/*"), &roots).pids, vec![HostPid(500)], "Docker's processes are in no pod");
        let none = resolve(&sel("pod:batch/*"), &roots);
        assert_eq!((none.pids, none.empty_containers), (vec![], vec!["pod:batch/*".to_owned()]));
        assert!(any_matches_new(&sel("pod:m?/trainer-0"), &roots, HostPid(500)));
        assert!(!any_matches_new(&sel("pod:ml/trainer-0"), &roots, HostPid(100)));
        // Without the kubelet's pod directory the pod is unknown, and unknown matches nothing.
        fs::remove_dir_all(host.path().join("var/lib/kubelet")).unwrap();
        assert!(!any_matches_new(&sel("pod:*/*"), &roots, HostPid(500)));
    }

    /// Pid 500 in pod serving/llm-0 (labels role=online), 600 and 601 in batch/train-0
    /// (role=offline), containerd with the systemd driver; the runtime answers on the tree's
    /// default containerd socket.
    fn labelled_host() -> (FakeHost, Roots, TestServer) {
        let (mut host, roots) = host();
        let cgroup = |uid: &str, id: &str| {
            format!(
                "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{id}.scope\n",
                uid.replace('-', "_")
            )
        };
        for (pid, uid, id) in [(500, UID_ON, C_ON), (600, UID_OFF, C_OFF), (601, UID_OFF, C_OFF)] {
            host.kfd_process(pid).process(
                pid,
                "python3",
                &format!("Name:\tpython3\nNSpid:\t{pid}\n"),
                &cgroup(uid, id),
            );
        }
        let runtime = FakeRuntime::default()
            .pod("sb-on", "serving", "llm-0", &[("gpreempt.io/role", "online"), ("app", "llm")], &[(C_ON, "server")])
            .pod("sb-off", "batch", "train-0", &[("gpreempt.io/role", "offline")], &[(C_OFF, "trainer")]);
        let server =
            TestServer::start_at(&host.path().join("run/containerd/containerd.sock"), move |m, b| runtime.reply(m, b));
        (host, roots, server)
    }

    const UID_ON: &str = "11111111-2222-4333-8444-555555555555";
    const UID_OFF: &str = "66666666-7777-4888-8999-000000000000";
    const C_ON: &str = "c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0";
    const C_OFF: &str = "d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1";

    #[test]
    fn pod_label_selectors_resolve_through_the_runtime() {
        let (_host, roots, server) = labelled_host();
        let sel = |s: &str| -> Vec<Selector> { vec![s.parse().unwrap()] };
        assert_eq!(resolve(&sel("pod-label:gpreempt.io/role=offline"), &roots).pids, vec![HostPid(600), HostPid(601)]);
        assert_eq!(resolve(&sel("pod-label:gpreempt.io/role=online,app=llm"), &roots).pids, vec![HostPid(500)]);
        assert_eq!(resolve(&sel("pod-label:gpreempt.io/role!=online"), &roots).pids, vec![HostPid(600), HostPid(601)]);
        let none = resolve(&sel("pod-label:gpreempt.io/role=online,app!=llm"), &roots);
        assert_eq!(
            (none.pids, none.empty_containers, none.lookup_errors),
            (vec![], vec!["pod-label:gpreempt.io/role=online,app!=llm".to_owned()], vec![])
        );
        // The `=` requirements went to the runtime as its label filter, the `!=` one stayed here.
        let listed: Vec<_> = server
            .calls()
            .iter()
            .filter(|c| c.path.ends_with("/ListPodSandbox"))
            .map(|c| {
                let request: crate::host::cri::messages::ListPodSandboxRequest = c.decode();
                request.filter.unwrap_or_default().label_selector.len()
            })
            .collect();
        assert_eq!(listed, [1, 2, 0, 1]);
        // A process that opens /dev/kfd later: its container's pod, then that pod's labels.
        assert!(any_matches_new(&sel("pod-label:gpreempt.io/role=offline"), &roots, HostPid(601)));
        assert!(!any_matches_new(&sel("pod-label:gpreempt.io/role=offline"), &roots, HostPid(500)));
        assert!(!any_matches_new(&sel("pod-label:gpreempt.io/role=offline"), &roots, HostPid(100)), "not in a pod");
    }

    #[test]
    fn without_a_runtime_a_label_selector_says_why_and_the_others_still_resolve() {
        let (host, roots) = host();
        let sels: Vec<Selector> =
            ["pod-label:gpreempt.io/role=offline", "container:trainer"].iter().map(|s| s.parse().unwrap()).collect();
        let r = resolve(&sels, &roots);
        assert_eq!(r.pids, vec![HostPid(100), HostPid(101)]);
        assert_eq!(r.empty_containers, vec!["pod-label:gpreempt.io/role=offline".to_owned()]);
        assert_eq!(r.notes, Vec::<String>::new());
        assert_eq!(
            r.lookup_errors,
            vec![format!(
                "pod-label:gpreempt.io/role=offline: no CRI runtime socket at {0}/run/containerd/containerd.sock or \
                 {0}/var/run/crio/crio.sock: start containerd or CRI-O, or name the runtime's socket with \
                 --cri-socket PATH (agent config: cri_socket)",
                host.path().display()
            )]
        );
        assert!(!any_matches_new(&sels[..1], &roots, HostPid(100)));
    }

    #[test]
    fn a_malformed_label_selector_is_refused_with_the_syntax() {
        let err = "pod-label:role".parse::<Selector>().unwrap_err();
        assert!(matches!(err, SelectorError::PodLabel(_)));
        assert_eq!(
            err.to_string(),
            "`pod-label:role`: `role` is a set-based requirement (in, notin, exists), which gpreempt does not take; \
             write pod-label:KEY=VALUE[,KEY2=VALUE2,KEY3!=VALUE3] (kubectl's equality-based selector, e.g. \
             pod-label:gpreempt.io/role=offline)"
        );
        assert_eq!("pod-label:a=b,c!=d".parse::<Selector>().unwrap().to_string(), "pod-label:a=b,c!=d");
    }

    #[test]
    fn matches_a_process_that_opens_kfd_later() {
        let (_dir, roots) = host();
        let trainer: Selector = "container:trainer".parse().unwrap();
        assert!(trainer.matches_new(&roots, HostPid(400)));
        assert!(!trainer.matches_new(&roots, HostPid(200)));
        assert!(!trainer.matches_new(&roots, HostPid(300)));
        // Gone before it could be looked at: not taken.
        assert!(!trainer.matches_new(&roots, HostPid(12345)));
        assert!(Selector::Pid(HostPid(12345)).matches_new(&roots, HostPid(12345)));
        let sels = vec!["200".parse().unwrap(), trainer];
        assert!(any_matches_new(&sels, &roots, HostPid(101)));
        assert!(!any_matches_new(&sels, &roots, HostPid(300)));
    }
}
