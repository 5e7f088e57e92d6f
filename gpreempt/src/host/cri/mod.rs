//! A client of the node's container runtime over CRI (Kubernetes' Container Runtime Interface):
//! gRPC over HTTP/2 over the runtime's unix socket, spoken directly (no generated bindings, no
//! gRPC framework). gpreempt asks it what the node's files cannot say: which pods carry a label (`pod-label:`
//! selectors), and, for the tests that stand in for a kubelet, it starts pods.
//!
//! - [`socket`]: where the runtime listens (the kubelet's defaults, or `--cri-socket`);
//! - [`frame`]: gRPC's 5-byte message prefix;
//! - [`transport`]: one unary call over an HTTP/2 connection;
//! - [`messages`]: the `runtime.v1` messages used, with CRI's field numbers;
//! - [`client`]: the blocking client, each call under a timeout;
//! - [`error`]: one line per failure, naming the socket and the fix.

pub mod client;
pub mod error;
pub mod frame;
pub mod messages;
pub mod socket;
pub mod transport;

#[cfg(test)]
pub(crate) mod test_server;

pub use client::CriClient;
pub use error::CriError;
pub use socket::CriSocket;
