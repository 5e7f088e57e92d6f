//! One gRPC unary call over HTTP/2 over a unix socket: a POST to `/<service>/<method>` with
//! `content-type: application/grpc` and `te: trailers`, the request as one framed message
//! ([`frame`]); the answer is one framed message and `grpc-status` (and `grpc-message`) in the
//! trailers, or in the headers alone when the call failed before any message ("Trailers-Only").
//! grpc/grpc `doc/PROTOCOL-HTTP2.md` describes both.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{HeaderMap, Request, client::conn::http2::SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::host::cri::{
    CriError,
    error::Malformed,
    frame,
    messages::{Call, RUNTIME_SERVICE},
};

/// An HTTP/2 connection to the runtime's socket.
pub struct Channel {
    socket: PathBuf,
    sender: SendRequest<Full<Bytes>>,
}

impl Channel {
    /// Connect and hand the connection's driver to the current tokio runtime.
    pub async fn connect(socket: &Path) -> Result<Self, CriError> {
        let connect_error = |cause| CriError::Connect { socket: socket.to_owned(), cause };
        let stream = tokio::net::UnixStream::connect(socket).await.map_err(connect_error)?;
        let (sender, connection) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|cause| CriError::Http { socket: socket.to_owned(), method: "(handshake)", cause })?;
        tokio::spawn(async move {
            // The connection ends when the client is dropped or the runtime hangs up; a call in
            // flight then gets its own error.
            let _ = connection.await;
        });
        Ok(Self { socket: socket.to_owned(), sender })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Send `request` and decode its answer.
    pub async fn unary<R: Call>(&mut self, request: &R) -> Result<R::Response, CriError> {
        let method = R::METHOD;
        let socket = &self.socket;
        let http = |cause| CriError::Http { socket: socket.clone(), method, cause };
        let malformed = |what| CriError::Malformed { socket: socket.clone(), method, what };
        // HTTP/2 needs an authority; the runtime does not look at it.
        let request = Request::post(format!("http://localhost/{RUNTIME_SERVICE}/{method}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Full::new(frame::encode(request)))
            .map_err(|e| malformed(Malformed::Request(e.to_string())))?;
        self.sender.ready().await.map_err(http)?;
        let response = self.sender.send_request(request).await.map_err(http)?;
        let status = response.status();
        if status != hyper::StatusCode::OK {
            return Err(malformed(Malformed::HttpStatus(status.as_u16())));
        }
        let (parts, body) = response.into_parts();
        // Trailers-Only: the status is in the headers and no message follows.
        if parts.headers.contains_key("grpc-status") {
            grpc_status(&parts.headers).map_err(|e| e.at(socket, method))?;
        }
        let collected = body.collect().await.map_err(http)?;
        let trailers = collected.trailers().cloned();
        let bytes = collected.to_bytes();
        match trailers {
            Some(t) => grpc_status(&t).map_err(|e| e.at(socket, method))?,
            None if parts.headers.contains_key("grpc-status") => {}
            None => return Err(malformed(Malformed::NoStatus)),
        }
        let message = frame::decode(&bytes).map_err(|e| malformed(e.into()))?;
        prost::Message::decode(message).map_err(|e| malformed(e.into()))
    }
}

/// A call's outcome read from its status headers, before the socket and method are known.
enum StatusError {
    Failed { code: u32, message: String },
    Malformed(Malformed),
}

impl StatusError {
    fn at(self, socket: &Path, method: &'static str) -> CriError {
        match self {
            Self::Failed { code, message } => CriError::Status { socket: socket.to_owned(), method, code, message },
            Self::Malformed(what) => CriError::Malformed { socket: socket.to_owned(), method, what },
        }
    }
}

/// `Ok` for `grpc-status: 0`; the code and the percent-decoded `grpc-message` otherwise.
fn grpc_status(headers: &HeaderMap) -> Result<(), StatusError> {
    let Some(status) = headers.get("grpc-status") else {
        return Err(StatusError::Malformed(Malformed::NoStatus));
    };
    let text = String::from_utf8_lossy(status.as_bytes()).into_owned();
    let code: u32 = text.trim().parse().map_err(|_| StatusError::Malformed(Malformed::BadStatus(text)))?;
    if code == 0 {
        return Ok(());
    }
    let message = headers.get("grpc-message").map(|m| percent_decode(m.as_bytes())).unwrap_or_default();
    Err(StatusError::Failed { code, message })
}

/// `grpc-message` is percent-encoded UTF-8 (PROTOCOL-HTTP2.md: "Percent-Encoded").
fn percent_decode(raw: &[u8]) -> String {
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match (raw[i], raw.get(i + 1).copied().and_then(hex), raw.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(hi), Some(lo)) => {
                // Two hex digits are at most 255.
                out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'?'));
                i += 3;
            }
            (b, ..) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_message_is_percent_decoded() {
        assert_eq!(percent_decode(b"pod%20%22x%22 not found"), "pod \"x\" not found");
        assert_eq!(percent_decode(b"100%"), "100%");
        assert_eq!(percent_decode(b"%E2%9C%93"), "\u{2713}");
    }
}
