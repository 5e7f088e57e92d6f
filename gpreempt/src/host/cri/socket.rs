//! Where the node's CRI runtime listens. Without a configured socket gpreempt looks where the
//! kubelet's documentation says the runtimes listen by default: containerd at
//! `/run/containerd/containerd.sock` (the kubelet's default `--container-runtime-endpoint`), CRI-O
//! at `/var/run/crio/crio.sock` (kubernetes.io, "Container Runtimes", v1.34). The first that
//! exists as a socket is taken; `--cri-socket PATH` (the agent's `cri_socket`) names another,
//! with or without the kubelet's `unix://` scheme.

use std::{
    fmt,
    os::unix::fs::FileTypeExt,
    path::{Path, PathBuf},
    sync::OnceLock,
};

use crate::host::cri::CriError;

/// The runtimes' default sockets, relative to the node's root, in the order they are tried.
pub const DEFAULT_SOCKETS: [&str; 2] = ["run/containerd/containerd.sock", "var/run/crio/crio.sock"];

/// The CRI runtime's socket: named by the user, or looked for under a root.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CriSocket {
    /// The first of [`DEFAULT_SOCKETS`] under this root (`/` on a node) that is a socket.
    Discover(PathBuf),
    /// Exactly this socket.
    Path(PathBuf),
}

impl Default for CriSocket {
    fn default() -> Self {
        Self::Discover(PathBuf::from("/"))
    }
}

/// The socket the command line named (`--cri-socket`), for every [`crate::host::roots::Roots`]
/// the command builds: set once at the binary's edge, before any lookup.
static CONFIGURED: OnceLock<CriSocket> = OnceLock::new();

impl CriSocket {
    /// Name the node's socket for the rest of the process (the CLI's `--cri-socket`). A second
    /// call is ignored: the first, made from the command line, stands.
    pub fn configure(endpoint: &str) {
        let _ = CONFIGURED.set(Self::configured(endpoint));
    }

    /// The node's socket: the one the command line named, or the kubelet's defaults under `/`.
    pub fn node() -> Self {
        Self::command_line().unwrap_or_default()
    }

    /// The socket the command line named, if it named one (it stands over a config file's).
    pub fn command_line() -> Option<Self> {
        CONFIGURED.get().cloned()
    }

    /// A configured endpoint: a path, or the kubelet's `unix:///path` form.
    pub fn configured(endpoint: &str) -> Self {
        Self::Path(PathBuf::from(endpoint.strip_prefix("unix://").unwrap_or(endpoint)))
    }

    /// The socket to connect to; [`CriError::NoSocket`] when discovery finds none.
    pub fn locate(&self) -> Result<PathBuf, CriError> {
        match self {
            Self::Path(path) => Ok(path.clone()),
            Self::Discover(root) => {
                let candidates: Vec<PathBuf> = DEFAULT_SOCKETS.iter().map(|s| root.join(s)).collect();
                candidates.iter().find(|p| is_socket(p)).cloned().ok_or(CriError::NoSocket { looked_at: candidates })
            }
        }
    }
}

/// The socket as a log line names it: the path, or the paths discovery tries, in order.
impl fmt::Display for CriSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Path(path) => write!(f, "{}", path.display()),
            Self::Discover(root) => {
                let tried: Vec<String> = DEFAULT_SOCKETS.iter().map(|s| root.join(s).display().to_string()).collect();
                write!(f, "{}", tried.join(" or "))
            }
        }
    }
}

fn is_socket(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use super::*;

    #[test]
    fn discovers_the_first_default_socket_that_exists() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let err = CriSocket::Discover(root.into()).locate().unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "no CRI runtime socket at {0}/run/containerd/containerd.sock or {0}/var/run/crio/crio.sock: \
                 start containerd or CRI-O, or name the runtime's socket with --cri-socket PATH (agent config: cri_socket)",
                root.display()
            )
        );
        // A regular file where the socket should be is not a socket.
        std::fs::create_dir_all(root.join("var/run/crio")).unwrap();
        std::fs::create_dir_all(root.join("run/containerd")).unwrap();
        std::fs::write(root.join("run/containerd/containerd.sock"), "").unwrap();
        let _crio = UnixListener::bind(root.join("var/run/crio/crio.sock")).unwrap();
        assert_eq!(CriSocket::Discover(root.into()).locate().unwrap(), root.join("var/run/crio/crio.sock"));
        assert_eq!(
            CriSocket::configured("unix:///run/k3s/containerd/containerd.sock").locate().unwrap(),
            PathBuf::from("/run/k3s/containerd/containerd.sock")
        );
        assert_eq!(CriSocket::configured("/x.sock"), CriSocket::Path("/x.sock".into()));
        assert_eq!(CriSocket::configured("unix:///x.sock").to_string(), "/x.sock");
        assert_eq!(CriSocket::default().to_string(), "/run/containerd/containerd.sock or /var/run/crio/crio.sock");
    }
}
