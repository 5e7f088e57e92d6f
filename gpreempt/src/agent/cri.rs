//! Which CRI runtime socket the agent's policies ask which pods carry a label (`pod-label:`
//! selectors), and what a reload that changes `cri_socket` does.
//!
//! `--cri-socket` (or `GPREEMPT_CRI_SOCKET`) stands over the file's `cri_socket`, which stands over
//! the kubelet's default sockets. A changed `cri_socket` takes effect on the reload that reads it,
//! not at the next start. It can, safely: nothing but the policies' `pod-label:` lookups reads the
//! socket, and each lookup connects afresh, so the change is applied by restarting exactly the
//! policies that hold a `pod-label:` selector — the stop (offline processes resumed and detached)
//! and start that a changed policy gets at every reload. The tracer, the metrics and the other
//! policies do not use it and run on untouched. Refusing it until a restart would cost more than
//! it saves: a restart detaches every policy and loses every series, and a ConfigMap update is
//! meant to apply without one (the kubelet swaps the file; nobody restarts the pod).

use super::AgentPolicy;
use crate::host::{cri::CriSocket, select::Selector};

/// The socket in force: the command line's, else the file's `cri_socket`, else the kubelet's
/// defaults.
pub fn in_force(command_line: Option<&CriSocket>, file: Option<&str>) -> CriSocket {
    match (command_line, file) {
        (Some(socket), _) => socket.clone(),
        (None, Some(endpoint)) => CriSocket::configured(endpoint),
        (None, None) => CriSocket::default(),
    }
}

/// What a reload does about the CRI socket, the file's `cri_socket` going from `old` to `new`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CriReload {
    /// The socket in force stays (the key did not change, or changed to the same socket).
    Unchanged,
    /// The socket in force changes: the policies with a `pod-label:` selector restart on it.
    Changed { from: CriSocket, to: CriSocket },
    /// The key changed, but the command line's socket stands over it: nothing changes, and the
    /// log says why the file's value is not used.
    Overridden { file: Option<String>, command_line: CriSocket },
}

/// The reload's decision about the socket.
pub fn on_reload(command_line: Option<&CriSocket>, old: Option<&str>, new: Option<&str>) -> CriReload {
    if let Some(socket) = command_line {
        return if old == new {
            CriReload::Unchanged
        } else {
            CriReload::Overridden { file: new.map(str::to_owned), command_line: socket.clone() }
        };
    }
    let (from, to) = (in_force(None, old), in_force(None, new));
    if from == to { CriReload::Unchanged } else { CriReload::Changed { from, to } }
}

/// Does `policy` ask the CRI runtime anything (does it hold a `pod-label:` selector)?
pub fn asks_cri(policy: &AgentPolicy) -> bool {
    policy.online.iter().chain(&policy.offline).any(|s| matches!(s, Selector::PodLabel(_)))
}

/// Two policies, `labels` (a `pod-label:` selector) and `names` (pod, container and pid
/// selectors), for the tests of what a socket change does.
#[cfg(test)]
pub(super) fn label_and_name_policies() -> Vec<AgentPolicy> {
    let text = "[[policy]]\nname = \"labels\"\nonline = [\"pod:serving/*\"]\noffline = [\"pod-label:role=offline\"]\n\
                [[policy]]\nname = \"names\"\nonline = [\"pod:web/*\"]\noffline = [\"container:trainer\", 42]\n";
    match super::AgentConfig::parse(text, "agent.toml") {
        Ok(c) => c.policies,
        Err(e) => panic!("{e}"),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn path(p: &str) -> CriSocket {
        CriSocket::Path(PathBuf::from(p))
    }

    #[test]
    fn the_command_line_stands_over_the_file_which_stands_over_the_defaults() {
        let cli = path("/run/k3s/containerd/containerd.sock");
        assert_eq!(in_force(Some(&cli), Some("/run/crio/crio.sock")), cli);
        assert_eq!(in_force(None, Some("unix:///run/crio/crio.sock")), path("/run/crio/crio.sock"));
        assert_eq!(in_force(None, None), CriSocket::Discover(PathBuf::from("/")));
    }

    #[test]
    fn a_changed_key_changes_the_socket_on_reload_unless_the_command_line_named_one() {
        assert_eq!(
            on_reload(None, None, Some("/run/k3s/containerd/containerd.sock")),
            CriReload::Changed {
                from: CriSocket::Discover(PathBuf::from("/")),
                to: path("/run/k3s/containerd/containerd.sock")
            }
        );
        assert_eq!(
            on_reload(None, Some("/a.sock"), None),
            CriReload::Changed { from: path("/a.sock"), to: CriSocket::Discover(PathBuf::from("/")) }
        );
        assert_eq!(
            on_reload(None, Some("/a.sock"), Some("/b.sock")),
            CriReload::Changed { from: path("/a.sock"), to: path("/b.sock") }
        );
        // The same socket written another way is no change.
        assert_eq!(on_reload(None, Some("/a.sock"), Some("unix:///a.sock")), CriReload::Unchanged);
        assert_eq!(on_reload(None, Some("/a.sock"), Some("/a.sock")), CriReload::Unchanged);
        assert_eq!(on_reload(None, None, None), CriReload::Unchanged);
        let cli = path("/cli.sock");
        assert_eq!(
            on_reload(Some(&cli), Some("/a.sock"), Some("/b.sock")),
            CriReload::Overridden { file: Some("/b.sock".into()), command_line: cli.clone() }
        );
        assert_eq!(
            on_reload(Some(&cli), Some("/a.sock"), None),
            CriReload::Overridden { file: None, command_line: cli.clone() }
        );
        assert_eq!(on_reload(Some(&cli), Some("/a.sock"), Some("/a.sock")), CriReload::Unchanged);
    }

    #[test]
    fn only_policies_with_a_label_selector_ask_the_runtime() {
        let policies = label_and_name_policies();
        let asking: Vec<&str> = policies.iter().filter(|p| asks_cri(p)).map(|p| p.name.as_str()).collect();
        assert_eq!(asking, ["labels"]);
    }
}
