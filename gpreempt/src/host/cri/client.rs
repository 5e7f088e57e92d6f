//! The blocking CRI client the rest of gpreempt calls: a current-thread tokio runtime of its own
//! drives one HTTP/2 connection, and every call (the connection too) is bounded by a timeout, so
//! a hung runtime costs a command seconds, never forever.
//!
//! The callers are blocking code that may itself run inside a tokio runtime (the commands run in
//! `main`'s, the agent in its own). Tokio refuses to block on a runtime from inside another, or
//! to drop one there, so a call made from a runtime's thread runs on a short-lived scoped thread,
//! and the client's runtime is shut down in the background when dropped.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::Duration,
};

use crate::host::cri::{
    CriError, CriSocket,
    messages::{
        Call, Container, ContainerFilter, ListContainersRequest, ListPodSandboxRequest, PodSandbox, PodSandboxFilter,
        PodSandboxStatus, PodSandboxStatusRequest, VersionRequest, VersionResponse,
    },
    transport::Channel,
};

/// How long one call (or the connection) may take: the runtime answers a list in milliseconds;
/// two seconds is far beyond a healthy one and short enough for an interactive command.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The CRI API version gpreempt speaks (`runtime.v1`).
pub const API_VERSION: &str = "v1";

pub struct CriClient {
    /// `Some` until dropped.
    runtime: Option<tokio::runtime::Runtime>,
    channel: Channel,
    timeout: Duration,
}

impl Drop for CriClient {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Run `future` to completion on `runtime`, from whatever thread calls.
fn block_on<F>(runtime: &tokio::runtime::Runtime, future: F) -> F::Output
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    if tokio::runtime::Handle::try_current().is_err() {
        return runtime.block_on(future);
    }
    std::thread::scope(|s| match s.spawn(|| runtime.block_on(future)).join() {
        Ok(output) => output,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

impl CriClient {
    /// Connect to the runtime `socket` names, within [`CALL_TIMEOUT`].
    pub fn connect(socket: &CriSocket) -> Result<Self, CriError> {
        Self::connect_path(&socket.locate()?, CALL_TIMEOUT)
    }

    /// Connect to exactly `path`, each call bounded by `timeout`.
    pub fn connect_path(path: &Path, timeout: Duration) -> Result<Self, CriError> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(CriError::Runtime)?;
        let connected = block_on(&runtime, async {
            tokio::time::timeout(timeout, Channel::connect(path))
                .await
                .unwrap_or_else(|_| Err(CriError::Timeout { socket: path.to_owned(), method: "(connect)", timeout }))
        });
        match connected {
            Ok(channel) => Ok(Self { runtime: Some(runtime), channel, timeout }),
            Err(e) => {
                runtime.shutdown_background();
                Err(e)
            }
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.channel.socket().to_owned()
    }

    /// One unary call of the runtime service, bounded by the client's timeout.
    pub fn call<R: Call + Sync>(&mut self, request: &R) -> Result<R::Response, CriError>
    where
        R::Response: Send,
    {
        let (timeout, channel) = (self.timeout, &mut self.channel);
        let Some(runtime) = &self.runtime else { unreachable!("the runtime is taken only by drop") };
        block_on(runtime, async {
            match tokio::time::timeout(timeout, channel.unary(request)).await {
                Ok(answer) => answer,
                Err(_) => Err(CriError::Timeout { socket: channel.socket().to_owned(), method: R::METHOD, timeout }),
            }
        })
    }

    pub fn version(&mut self) -> Result<VersionResponse, CriError> {
        self.call(&VersionRequest { version: API_VERSION.into() })
    }

    /// The pods whose labels include every pair of `labels` (all pods for an empty map).
    pub fn pods_labelled(&mut self, labels: HashMap<String, String>) -> Result<Vec<PodSandbox>, CriError> {
        let filter = PodSandboxFilter { label_selector: labels, ..PodSandboxFilter::default() };
        Ok(self.call(&ListPodSandboxRequest { filter: Some(filter) })?.items)
    }

    pub fn pod_status(&mut self, pod_sandbox_id: &str) -> Result<Option<PodSandboxStatus>, CriError> {
        let request = PodSandboxStatusRequest { pod_sandbox_id: pod_sandbox_id.into(), verbose: false };
        Ok(self.call(&request)?.status)
    }

    /// The containers of one pod, or of every pod for `None`.
    pub fn containers(&mut self, pod_sandbox_id: Option<&str>) -> Result<Vec<Container>, CriError> {
        let filter =
            ContainerFilter { pod_sandbox_id: pod_sandbox_id.unwrap_or("").into(), ..ContainerFilter::default() };
        Ok(self.call(&ListContainersRequest { filter: Some(filter) })?.containers)
    }

    /// The container with exactly this id, if the runtime knows it.
    pub fn container(&mut self, id: &str) -> Result<Option<Container>, CriError> {
        let filter = ContainerFilter { id: id.into(), ..ContainerFilter::default() };
        let list = self.call(&ListContainersRequest { filter: Some(filter) })?.containers;
        Ok(list.into_iter().find(|c| c.id == id))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::host::cri::{
        messages::{ListPodSandboxResponse, PodSandboxMetadata, PodSandboxState},
        test_server::{Reply, TestServer},
    };

    fn pod(id: &str, namespace: &str, name: &str, role: &str) -> PodSandbox {
        PodSandbox {
            id: id.into(),
            metadata: Some(PodSandboxMetadata {
                name: name.into(),
                uid: format!("uid-{id}"),
                namespace: namespace.into(),
                attempt: 0,
            }),
            state: PodSandboxState::SandboxReady as i32,
            labels: HashMap::from([("gpreempt.io/role".into(), role.into())]),
            ..PodSandbox::default()
        }
    }

    #[test]
    fn a_unary_call_is_framed_and_its_answer_decoded() {
        let server = TestServer::start(|method, _| match method {
            "Version" => Reply::message(&VersionResponse {
                version: "0.1.0".into(),
                runtime_name: "containerd".into(),
                runtime_version: "v2.1.9".into(),
                runtime_api_version: "v1".into(),
            }),
            "ListPodSandbox" => Reply::message(&ListPodSandboxResponse {
                items: vec![pod("p1", "serving", "llm-0", "online"), pod("p2", "serving", "llm-1", "online")],
            }),
            _ => Reply::HeadersOnly(12, "unknown method"),
        });
        let mut client = CriClient::connect(&CriSocket::Path(server.socket.clone())).unwrap();
        let version = client.version().unwrap();
        assert_eq!(
            (version.runtime_name.as_str(), version.runtime_version.as_str(), version.runtime_api_version.as_str()),
            ("containerd", "v2.1.9", "v1")
        );
        let labels = HashMap::from([("gpreempt.io/role".to_owned(), "online".to_owned())]);
        let pods = client.pods_labelled(labels.clone()).unwrap();
        assert_eq!(pods.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(), ["p1", "p2"]);
        assert_eq!(pods[1].metadata.as_ref().map(|m| m.name.as_str()), Some("llm-1"));

        // Both calls went over the one connection, as gRPC asks for them.
        let calls = server.calls();
        assert_eq!(
            calls.iter().map(|c| c.path.as_str()).collect::<Vec<_>>(),
            ["/runtime.v1.RuntimeService/Version", "/runtime.v1.RuntimeService/ListPodSandbox"]
        );
        for call in &calls {
            assert_eq!(
                call.headers.get("content-type").map(hyper::header::HeaderValue::as_bytes),
                Some(&b"application/grpc"[..])
            );
            assert_eq!(call.headers.get("te").map(hyper::header::HeaderValue::as_bytes), Some(&b"trailers"[..]));
        }
        assert_eq!(calls[0].decode::<VersionRequest>(), VersionRequest { version: "v1".into() });
        let listed: ListPodSandboxRequest = calls[1].decode();
        assert_eq!(listed.filter.map(|f| (f.id, f.label_selector)), Some((String::new(), labels)));
    }

    #[test]
    fn works_from_inside_another_tokio_runtime() {
        // As `gpreempt queues` calls it: blocking code on the thread of main's runtime.
        let server = TestServer::start(|_, _| {
            Reply::message(&VersionResponse { runtime_name: "cri-o".into(), ..VersionResponse::default() })
        });
        let outer = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let name = outer.block_on(async {
            let mut client = CriClient::connect(&CriSocket::Path(server.socket.clone())).unwrap();
            let name = client.version().unwrap().runtime_name;
            drop(client);
            name
        });
        assert_eq!(name, "cri-o");
    }

    #[test]
    fn a_grpc_error_in_the_trailers_or_the_headers_is_the_runtimes_status() {
        let server = TestServer::start(|method, _| match method {
            "PodSandboxStatus" => Reply::Status(5, "an error occurred when try to find sandbox %22p9%22: not found"),
            _ => Reply::HeadersOnly(12, "unknown service runtime.v1.RuntimeService"),
        });
        let mut client = CriClient::connect(&CriSocket::Path(server.socket.clone())).unwrap();
        let err = client.pod_status("p9").err().unwrap();
        assert_eq!(err.grpc_code(), Some(5));
        assert_eq!(
            err.to_string(),
            format!(
                "CRI PodSandboxStatus at {}: gRPC status 5: an error occurred when try to find sandbox \"p9\": not found",
                server.socket.display()
            )
        );
        let err = client.version().unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "CRI Version at {}: gRPC status 12: unknown service runtime.v1.RuntimeService",
                server.socket.display()
            )
        );
        // The connection outlives failed calls.
        assert_eq!(client.containers(None).unwrap_err().grpc_code(), Some(12));
    }

    #[test]
    fn a_silent_runtime_costs_the_timeout_and_a_missing_one_says_so() {
        let server = TestServer::start(|_, _| Reply::Hang);
        let mut client = CriClient::connect_path(&server.socket, Duration::from_millis(300)).unwrap();
        let start = Instant::now();
        let err = client.version().unwrap_err();
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(2), "took {took:?}");
        assert_eq!(
            err.to_string(),
            format!(
                "the CRI runtime at {} did not answer Version within 300 ms; is it overloaded or hung? (`systemctl status containerd`)",
                server.socket.display()
            )
        );

        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("containerd.sock");
        let err = CriClient::connect(&CriSocket::Path(missing.clone())).err().unwrap();
        assert_eq!(
            err.to_string(),
            format!(
                "cannot connect to the CRI runtime at {}: No such file or directory (os error 2); start containerd or \
                 CRI-O, or name the runtime's socket with --cri-socket PATH (agent config: cri_socket)",
                missing.display()
            )
        );
    }
}
