//! What can go wrong talking to the CRI runtime, each a single line that names the socket and
//! what to do about it.

use std::{io, path::PathBuf, time::Duration};

use crate::host::cri::frame::FrameError;

#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error(
        "no CRI runtime socket at {}: start containerd or CRI-O, or name the runtime's socket with --cri-socket PATH (agent config: cri_socket)",
        looked_at.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" or ")
    )]
    NoSocket { looked_at: Vec<PathBuf> },
    #[error(
        "cannot connect to the CRI runtime at {}: {cause}; start containerd or CRI-O, or name the runtime's socket with --cri-socket PATH (agent config: cri_socket)",
        socket.display()
    )]
    Connect { socket: PathBuf, cause: io::Error },
    #[error(
        "the CRI runtime at {} did not answer {method} within {} ms; is it overloaded or hung? (`systemctl status containerd`)",
        socket.display(), timeout.as_millis()
    )]
    Timeout { socket: PathBuf, method: &'static str, timeout: Duration },
    #[error("CRI {method} at {}: HTTP/2: {cause} (is this a CRI runtime's socket?)", socket.display())]
    Http { socket: PathBuf, method: &'static str, cause: hyper::Error },
    #[error("CRI {method} at {}: gRPC status {code}: {message}", socket.display())]
    Status { socket: PathBuf, method: &'static str, code: u32, message: String },
    #[error("CRI {method} at {}: {what}", socket.display())]
    Malformed { socket: PathBuf, method: &'static str, what: Malformed },
    #[error("cannot start the CRI client's event loop: {0}")]
    Runtime(io::Error),
}

/// An answer that is not a gRPC unary response.
#[derive(Debug, thiserror::Error)]
pub enum Malformed {
    #[error("the request could not be built: {0}")]
    Request(String),
    #[error("HTTP status {0} (a gRPC answer is 200)")]
    HttpStatus(u16),
    #[error("the answer carries no grpc-status")]
    NoStatus,
    #[error("grpc-status `{0}` is not a number")]
    BadStatus(String),
    #[error("{0}")]
    Frame(#[from] FrameError),
    #[error("the message does not decode: {0}")]
    Decode(#[from] prost::DecodeError),
}

impl CriError {
    /// The gRPC status code, when the runtime answered with one other than OK (`5` NOT_FOUND:
    /// the pod or container is gone).
    pub fn grpc_code(&self) -> Option<u32> {
        match self {
            Self::Status { code, .. } => Some(*code),
            _ => None,
        }
    }
}
