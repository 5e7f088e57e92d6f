//! The little HTTP/1.1 the harness speaks over loopback between its sender and the online
//! client: `POST /generate` (a request, its prompt as the body), `GET /health` and
//! `GET /metrics` (the probes and scrapes a serving pod answers on its API port), keep-alive,
//! bodies framed by `Content-Length` only. Each message is written with one `write`, so a
//! request's first segment carries its start line, as a real client's does, which is what the
//! arrival probe matches.

use std::io::{self, BufRead, Read, Write};

/// Bytes of body per prompt token (English text under a BPE tokenizer: about 4 characters a
/// token, OpenAI's tokenizer guide's rule of thumb).
pub const BYTES_PER_TOKEN: u64 = 4;
/// The largest body sent (12 288 tokens): the Azure slices' longest prompt is 7 436 tokens, and
/// a request of this size still fits one loopback segment (MTU 64 KiB), so the size the probe
/// sees is the request's.
pub const MAX_BODY: u64 = 48 * 1024;
/// A start line or header longer than this is refused (no real message here comes close).
const MAX_LINE: usize = 8 * 1024;
const MAX_HEADERS: usize = 64;

/// The paths the online client answers.
pub const GENERATE: &str = "/generate";
pub const HEALTH: &str = "/health";
pub const METRICS: &str = "/metrics";

/// The header that carries a request's index in the load (the client looks its dispatches up).
const REQUEST_ID: &str = "x-request-id";

/// What a message received by the online client asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ask {
    Generate {
        id: u64,
    },
    Health,
    Metrics,
    /// Anything else (answered 404).
    Other,
}

/// One HTTP message: its start line, headers (names lowercased) and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub start: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Message {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// A request's ask, from its start line (and the id header of a POST).
    pub fn ask(&self) -> Ask {
        let mut words = self.start.split(' ');
        match (words.next(), words.next()) {
            (Some("POST"), Some(GENERATE)) => match self.header(REQUEST_ID).and_then(|v| v.parse().ok()) {
                Some(id) => Ask::Generate { id },
                None => Ask::Other,
            },
            (Some("GET"), Some(HEALTH)) => Ask::Health,
            (Some("GET"), Some(METRICS)) => Ask::Metrics,
            _ => Ask::Other,
        }
    }

    /// A response's status code.
    pub fn status(&self) -> Option<u16> {
        self.start.split(' ').nth(1)?.parse().ok()
    }
}

/// The body's length for a prompt of `tokens` tokens.
pub fn body_len(tokens: u64) -> u64 {
    (tokens * BYTES_PER_TOKEN).clamp(PROMPT_FRAME.len() as u64, MAX_BODY)
}

/// The JSON frame around the prompt's characters.
const PROMPT_FRAME: &str = "{\"prompt\":\"\"}";

/// `POST /generate` for request `id` with a prompt of `tokens` tokens.
pub fn generate(id: u64, tokens: u64) -> Vec<u8> {
    let len = body_len(tokens) as usize;
    let mut out = format!(
        "POST {GENERATE} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nX-Request-Id: {id}\r\n\
         Content-Length: {len}\r\n\r\n{{\"prompt\":\""
    )
    .into_bytes();
    out.resize(out.len() + len - PROMPT_FRAME.len(), b'x');
    out.extend_from_slice(b"\"}");
    out
}

/// `GET path` (a probe or a scrape).
pub fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: harness\r\n\r\n").into_bytes()
}

/// A response with `status` and `body`.
pub fn response(status: u16, body: &[u8]) -> Vec<u8> {
    let reason = if status == 200 { "OK" } else { "Not Found" };
    let mut out = format!("HTTP/1.1 {status} {reason}\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
    out.extend_from_slice(body);
    out
}

/// Write one message with one call (one segment on loopback, up to the MTU).
pub fn send(w: &mut impl Write, message: &[u8]) -> io::Result<()> {
    w.write_all(message)?;
    w.flush()
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

/// One line without its CRLF; None at EOF before any byte.
fn line(r: &mut impl BufRead) -> io::Result<Option<String>> {
    let mut buf = Vec::new();
    let n = r.by_ref().take(MAX_LINE as u64 + 2).read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') {
        return Err(bad(if buf.len() > MAX_LINE { "an HTTP line too long" } else { "a message cut short" }));
    }
    buf.pop();
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    String::from_utf8(buf).map(Some).map_err(|_| bad("an HTTP line not in UTF-8"))
}

/// Read one message; None when the peer closed the connection between messages.
pub fn read(r: &mut impl BufRead) -> io::Result<Option<Message>> {
    let Some(start) = line(r)? else { return Ok(None) };
    let mut headers = Vec::new();
    loop {
        let l = line(r)?.ok_or_else(|| bad("a message cut short in its headers"))?;
        if l.is_empty() {
            break;
        }
        if headers.len() == MAX_HEADERS {
            return Err(bad("too many HTTP headers"));
        }
        let (name, value) = l.split_once(':').ok_or_else(|| bad("an HTTP header without ':'"))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let mut m = Message { start, headers, body: Vec::new() };
    let len: u64 = match m.header("content-length") {
        Some(v) => v.parse().map_err(|_| bad("a bad Content-Length"))?,
        None => 0,
    };
    if len > MAX_BODY {
        return Err(bad("a body over MAX_BODY"));
    }
    m.body.resize(len as usize, 0);
    r.read_exact(&mut m.body)?;
    Ok(Some(m))
}

#[cfg(test)]
mod tests {
    use std::io::{BufReader, Cursor};

    use super::*;

    #[test]
    fn a_request_carries_its_id_and_a_body_of_four_bytes_a_token() {
        let bytes = generate(17, 862);
        assert!(bytes.starts_with(b"POST /generate HTTP/1.1\r\n"));
        let m = read(&mut Cursor::new(&bytes)).unwrap().unwrap();
        assert_eq!(m.ask(), Ask::Generate { id: 17 });
        assert_eq!(m.body.len(), 3_448);
        assert!(m.body.starts_with(b"{\"prompt\":\"xx") && m.body.ends_with(b"x\"}"));
        assert_eq!(body_len(0), 13);
        assert_eq!(body_len(20_000), 49_152);
        assert_eq!(read(&mut Cursor::new(generate(1, 0))).unwrap().unwrap().body, b"{\"prompt\":\"\"}");
    }

    #[test]
    fn probes_and_responses_parse_and_a_stream_of_them_ends_at_eof() {
        let mut stream = get(HEALTH);
        stream.extend(get(METRICS));
        stream.extend(get("/v1/models"));
        stream.extend(response(200, b"{\"id\":3}"));
        let mut r = BufReader::new(Cursor::new(stream));
        assert_eq!(read(&mut r).unwrap().unwrap().ask(), Ask::Health);
        assert_eq!(read(&mut r).unwrap().unwrap().ask(), Ask::Metrics);
        assert_eq!(read(&mut r).unwrap().unwrap().ask(), Ask::Other);
        let answer = read(&mut r).unwrap().unwrap();
        assert_eq!((answer.status(), answer.body.as_slice()), (Some(200), b"{\"id\":3}".as_slice()));
        assert_eq!(read(&mut r).unwrap(), None);
    }

    #[test]
    fn broken_messages_are_errors_not_panics() {
        let err = |b: &[u8]| read(&mut Cursor::new(b.to_vec())).unwrap_err().to_string();
        assert_eq!(err(b"GET / HTTP/1.1\r\nHost"), "a message cut short");
        assert_eq!(err(b"GET / HTTP/1.1\r\n"), "a message cut short in its headers");
        assert_eq!(err(b"GET / HTTP/1.1\r\nHost\r\n\r\n"), "an HTTP header without ':'");
        assert_eq!(err(b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n"), "a bad Content-Length");
        assert_eq!(err(b"POST / HTTP/1.1\r\nContent-Length: 999999\r\n\r\n"), "a body over MAX_BODY");
        assert_eq!(err(&[b'a'; 9_000]), "an HTTP line too long");
        assert_eq!(err(b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab"), "failed to fill whole buffer");
        // A POST without the id header is not a request of the load.
        let m = read(&mut Cursor::new(b"POST /generate HTTP/1.1\r\n\r\n".to_vec())).unwrap().unwrap();
        assert_eq!(m.ask(), Ask::Other);
    }
}
