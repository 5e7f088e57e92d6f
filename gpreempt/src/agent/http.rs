//! The agent's HTTP endpoint (hyper, HTTP/1.1, on the caller's tokio runtime): `/metrics` in
//! OpenMetrics text, `/healthz` (200 while the tracer loop is alive, 503 once it stalled).

use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, header, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::{
    deploy::series::{HEALTH_PATH, METRICS_PATH},
    metrics::{self, Metrics},
};

/// The tracer loop's heartbeat: it [`Health::beat`]s at least every second.
#[derive(Clone, Debug)]
pub struct Health {
    start: Instant,
    last_ms: Arc<AtomicU64>,
}

/// `/healthz` fails when the loop has not beaten for this long (it beats every second; a
/// stalled ring-buffer reader or a wedged loop is what this catches).
pub const STALL: Duration = Duration::from_secs(10);

impl Default for Health {
    fn default() -> Self {
        Self { start: Instant::now(), last_ms: Arc::new(AtomicU64::new(0)) }
    }
}

impl Health {
    pub fn beat(&self) {
        self.last_ms.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn alive(&self) -> bool {
        let since = (self.start.elapsed().as_millis() as u64).saturating_sub(self.last_ms.load(Ordering::Relaxed));
        since < STALL.as_millis() as u64
    }
}

fn respond(req: &Request<Incoming>, metrics: &Metrics, health: &Health) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        if let Ok(v) = header::HeaderValue::from_str(content_type) {
            r.headers_mut().insert(header::CONTENT_TYPE, v);
        }
        r
    };
    const TEXT: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "GET only\n".into());
    }
    match req.uri().path() {
        METRICS_PATH => reply(StatusCode::OK, metrics::CONTENT_TYPE, metrics.encode()),
        HEALTH_PATH if health.alive() => reply(StatusCode::OK, TEXT, "ok\n".into()),
        HEALTH_PATH => reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, "tracer loop stalled\n".into()),
        _ => reply(StatusCode::NOT_FOUND, TEXT, format!("not found: try {METRICS_PATH} or {HEALTH_PATH}\n")),
    }
}

/// Accept connections on `listener` until the task is dropped; each is served on its own task.
pub async fn serve(listener: TcpListener, metrics: Metrics, health: Health) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // Out of fds or a connection reset before accept: the next one may do.
            Err(e) => {
                log::warn!("metrics endpoint: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (metrics, health) = (metrics.clone(), health.clone());
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let response = respond(&req, &metrics, &health);
                async move { Ok::<_, Infallible>(response) }
            });
            if let Err(e) = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await {
                log::debug!("metrics endpoint: connection ended: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_metrics_and_health_over_real_http() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Metrics::new("node-a", "0.1.0");
        metrics.add_events(3);
        let health = Health::default();
        health.beat();
        let server = tokio::spawn(serve(listener, metrics, health));
        let m = get(addr, "/metrics").await;
        assert!(m.starts_with("HTTP/1.1 200 OK\r\n"), "{m}");
        assert!(m.contains(&format!("content-type: {}\r\n", metrics::CONTENT_TYPE)), "{m}");
        assert!(m.contains("\ngpreempt_tracer_events_total{hostname=\"node-a\"} 3\n"), "{m}");
        assert!(m.ends_with("# EOF\n"), "{m}");
        let h = get(addr, "/healthz").await;
        assert!(h.starts_with("HTTP/1.1 200 OK\r\n") && h.ends_with("\r\n\r\nok\n"), "{h}");
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404 Not Found\r\n"));
        server.abort();
    }
}
