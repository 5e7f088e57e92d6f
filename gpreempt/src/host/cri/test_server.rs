//! A gRPC server over a unix socket in a temporary directory, for the client's tests only: hyper's
//! HTTP/2 server answering each call with what the test scripted (a protobuf message, a gRPC
//! error in the trailers or in the headers alone, or silence). It tests the client's framing,
//! headers and status handling against a real HTTP/2 peer; it is no CRI runtime.

use std::{
    convert::Infallible,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::{HeaderMap, Request, Response, body::Incoming, service::service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::host::cri::{
    frame,
    messages::{Call, RUNTIME_SERVICE},
};

/// What the server answers one call with.
pub enum Reply {
    /// This message (already protobuf-encoded), then `grpc-status: 0` in the trailers.
    Message(Vec<u8>),
    /// No message; this status and percent-encoded message in the trailers.
    Status(u32, &'static str),
    /// "Trailers-Only": the status in the response headers, no body.
    HeadersOnly(u32, &'static str),
    /// No answer for longer than any client timeout in the tests.
    Hang,
}

impl Reply {
    pub fn message(m: &impl prost::Message) -> Self {
        Self::Message(m.encode_to_vec())
    }
}

/// One call the server received.
#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    pub headers: HeaderMap,
    /// The request message's bytes, unframed.
    pub message: Vec<u8>,
}

impl Received {
    pub fn decode<R: Call + Default>(&self) -> R {
        R::decode(self.message.as_slice()).expect("the client sent a message of the call's type")
    }
}

/// The reply to a call, from its method name ("Version") and its request message's bytes.
type Script = dyn Fn(&str, &[u8]) -> Reply + Send + Sync;

pub struct TestServer {
    _dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub received: Arc<Mutex<Vec<Received>>>,
}

impl TestServer {
    /// Serve on a fresh socket in a temporary directory.
    pub fn start(script: impl Fn(&str, &[u8]) -> Reply + Send + Sync + 'static) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let socket = dir.path().join("cri.sock");
        Self::serve(dir, socket, script)
    }

    /// Serve on `socket` (its directory is created), e.g. a runtime's default path in a fake host.
    pub fn start_at(socket: &std::path::Path, script: impl Fn(&str, &[u8]) -> Reply + Send + Sync + 'static) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        if let Some(parent) = socket.parent() {
            std::fs::create_dir_all(parent).expect("the socket's directory");
        }
        Self::serve(dir, socket.to_owned(), script)
    }

    fn serve(
        dir: tempfile::TempDir,
        socket: PathBuf,
        script: impl Fn(&str, &[u8]) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let received = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Script> = Arc::new(script);
        let listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind the test socket");
        listener.set_nonblocking(true).expect("a non-blocking listener");
        let log = received.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
            runtime.block_on(async move {
                let listener = tokio::net::UnixListener::from_std(listener).expect("a tokio listener");
                while let Ok((stream, _)) = listener.accept().await {
                    let (script, log) = (script.clone(), log.clone());
                    let service = service_fn(move |request| answer(request, script.clone(), log.clone()));
                    tokio::spawn(
                        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(stream), service),
                    );
                }
            });
        });
        Self { _dir: dir, socket, received }
    }

    pub fn calls(&self) -> Vec<Received> {
        self.received.lock().expect("the log's lock").clone()
    }
}

async fn answer(
    request: Request<Incoming>,
    script: Arc<Script>,
    log: Arc<Mutex<Vec<Received>>>,
) -> Result<Response<BoxBody<Bytes, Infallible>>, Infallible> {
    let path = request.uri().path().to_owned();
    let headers = request.headers().clone();
    let body = request.into_body().collect().await.map(http_body_util::Collected::to_bytes).unwrap_or_default();
    let message = frame::decode(&body).map(<[u8]>::to_vec).unwrap_or_default();
    log.lock().expect("the log's lock").push(Received { path: path.clone(), headers, message: message.clone() });
    let method = path.strip_prefix(&format!("/{RUNTIME_SERVICE}/")).unwrap_or(&path).to_owned();
    let trailers = |code: u32, message: &str| {
        let mut t = HeaderMap::new();
        t.insert("grpc-status", code.to_string().parse().expect("a header value"));
        if !message.is_empty() {
            t.insert("grpc-message", message.parse().expect("a header value"));
        }
        t
    };
    let grpc = Response::builder().status(200).header("content-type", "application/grpc");
    let response = match script(&method, &message) {
        Reply::Message(bytes) => {
            let mut framed = vec![0];
            framed.extend_from_slice(&u32::try_from(bytes.len()).expect("a small message").to_be_bytes());
            framed.extend_from_slice(&bytes);
            let t = trailers(0, "");
            grpc.body(Full::new(Bytes::from(framed)).with_trailers(async move { Some(Ok(t)) }).boxed())
        }
        Reply::Status(code, message) => {
            let t = trailers(code, message);
            grpc.body(Full::new(Bytes::new()).with_trailers(async move { Some(Ok(t)) }).boxed())
        }
        Reply::HeadersOnly(code, message) => grpc
            .header("grpc-status", code.to_string())
            .header("grpc-message", message)
            .body(Full::new(Bytes::new()).boxed()),
        Reply::Hang => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            grpc.body(Full::new(Bytes::new()).boxed())
        }
    };
    Ok(response.expect("a valid response"))
}

/// A runtime's pods and containers, answering the listing calls as containerd does (label filter
/// ANDed, container filter by id or pod), for the tests of what is built on the client.
#[derive(Clone, Default)]
pub struct FakeRuntime {
    pub pods: Vec<crate::host::cri::messages::PodSandbox>,
    pub containers: Vec<crate::host::cri::messages::Container>,
}

impl FakeRuntime {
    /// Add a pod `namespace/name` with `labels` and one container `container` (id `container_id`).
    pub fn pod(
        mut self,
        id: &str,
        namespace: &str,
        name: &str,
        labels: &[(&str, &str)],
        containers: &[(&str, &str)],
    ) -> Self {
        use crate::host::cri::messages::{Container, ContainerMetadata, PodSandbox, PodSandboxMetadata};
        self.pods.push(PodSandbox {
            id: id.into(),
            metadata: Some(PodSandboxMetadata {
                name: name.into(),
                uid: format!("uid-{name}"),
                namespace: namespace.into(),
                attempt: 0,
            }),
            labels: labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            ..PodSandbox::default()
        });
        for (cid, cname) in containers {
            self.containers.push(Container {
                id: (*cid).into(),
                pod_sandbox_id: id.into(),
                metadata: Some(ContainerMetadata { name: (*cname).into(), attempt: 0 }),
                ..Container::default()
            });
        }
        self
    }

    pub fn reply(&self, method: &str, message: &[u8]) -> Reply {
        use prost::Message;

        use crate::host::cri::messages::{
            ListContainersRequest, ListContainersResponse, ListPodSandboxRequest, ListPodSandboxResponse,
            PodSandboxStatus, PodSandboxStatusRequest, PodSandboxStatusResponse,
        };
        match method {
            "ListPodSandbox" => {
                let filter = ListPodSandboxRequest::decode(message).ok().and_then(|r| r.filter).unwrap_or_default();
                let items = self
                    .pods
                    .iter()
                    .filter(|p| filter.id.is_empty() || p.id == filter.id)
                    .filter(|p| filter.label_selector.iter().all(|(k, v)| p.labels.get(k) == Some(v)))
                    .cloned()
                    .collect();
                Reply::message(&ListPodSandboxResponse { items })
            }
            "ListContainers" => {
                let filter = ListContainersRequest::decode(message).ok().and_then(|r| r.filter).unwrap_or_default();
                let containers = self
                    .containers
                    .iter()
                    .filter(|c| filter.id.is_empty() || c.id == filter.id)
                    .filter(|c| filter.pod_sandbox_id.is_empty() || c.pod_sandbox_id == filter.pod_sandbox_id)
                    .cloned()
                    .collect();
                Reply::message(&ListContainersResponse { containers })
            }
            "PodSandboxStatus" => {
                let id = PodSandboxStatusRequest::decode(message).map(|r| r.pod_sandbox_id).unwrap_or_default();
                match self.pods.iter().find(|p| p.id == id) {
                    Some(p) => Reply::message(&PodSandboxStatusResponse {
                        status: Some(PodSandboxStatus {
                            id: p.id.clone(),
                            metadata: p.metadata.clone(),
                            labels: p.labels.clone(),
                            ..PodSandboxStatus::default()
                        }),
                    }),
                    None => Reply::Status(5, "not found"),
                }
            }
            _ => Reply::HeadersOnly(12, "unimplemented"),
        }
    }
}
