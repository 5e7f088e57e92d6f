//! What counts as a request in a segment's first bytes: the arrival probe's allow and deny
//! patterns, as a user writes them and as the kernel program compares them (four little-endian
//! words and their masks, [`gpreempt_common::arrival::Pattern`]).
//!
//! A pattern is one of:
//! - text, matched as a prefix of the payload, with the escapes `\r`, `\n`, `\t`, `\\` and `\xNN`
//!   (at most 32 bytes): `POST `, `GET /health`;
//! - `h2:preface`: the HTTP/2 client connection preface (`PRI * HTTP/2.0\r\n`, RFC 9113 §3.4),
//!   which a gRPC client sends with its first request's frames on a new connection;
//! - `h2:headers`: an HTTP/2 HEADERS frame at the start of the segment (RFC 9113 §4.1, §6.2: type
//!   0x01, length under 64 KiB, the reserved bit clear and a client-initiated, odd, stream id): a
//!   new request or gRPC call on an open connection.
//!
//! Deny wins over allow. `--arrival-allow any` leaves the allow list empty: every payload no deny
//! pattern matches is a request (for protocols no pattern describes; TLS hides every byte).

use std::fmt;

use gpreempt_common::arrival::{MAX_PATTERNS, PREFIX_BYTES, PREFIX_WORDS, Pattern, VERDICT_ALLOW, VERDICT_DENY};

/// The allow list by default: a request to an OpenAI-style HTTP/1.1 server is a `POST`; gRPC and
/// HTTP/2 clients open a stream with HEADERS.
pub const DEFAULT_ALLOW: [&str; 3] = ["POST ", "h2:preface", "h2:headers"];
/// The deny list by default: the probes and scrapes a serving pod answers on its API port (vLLM
/// serves `/health`, `/metrics` and `/v1/models` there; Kubernetes probes often use `/ready`).
pub const DEFAULT_DENY: [&str; 4] = ["GET /health", "GET /metrics", "GET /ready", "GET /v1/models"];
/// The allow-list word that empties it.
pub const ANY: &str = "any";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PatternError {
    #[error("arrival pattern {0:?} is empty: give the first bytes of a request, e.g. 'POST '")]
    Empty(String),
    #[error("arrival pattern {pattern:?} is {len} bytes; at most {PREFIX_BYTES} are compared")]
    TooLong { pattern: String, len: usize },
    #[error("arrival pattern {0:?} has a bad escape: use \\r, \\n, \\t, \\\\ or \\xNN")]
    Escape(String),
    #[error("arrival pattern {0:?}: only the allow list takes 'any'")]
    AnyDenied(String),
    #[error("{count} arrival patterns: at most {MAX_PATTERNS} (allow and deny together)")]
    TooMany { count: usize },
}

/// One pattern: a byte prefix with a mask (`None` bytes are not compared).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prefix {
    /// What the user wrote (for messages and the report).
    pub source: String,
    pub bytes: Vec<Option<u8>>,
}

impl Prefix {
    pub fn parse(source: &str) -> Result<Self, PatternError> {
        let bytes = match source {
            "h2:preface" => b"PRI * HTTP/2.0\r\n".iter().map(|&b| Some(b)).collect(),
            // length (3 bytes, the first 0: under 64 KiB), type 0x01, flags (any), stream id (4
            // bytes: the reserved top bit clear, the lowest bit set).
            "h2:headers" => vec![Some(0), None, None, Some(0x01), None, None, None, None, None],
            _ => unescape(source)?.into_iter().map(Some).collect(),
        };
        if bytes.is_empty() {
            return Err(PatternError::Empty(source.into()));
        }
        if bytes.len() > PREFIX_BYTES {
            return Err(PatternError::TooLong { pattern: source.into(), len: bytes.len() });
        }
        Ok(Self { source: source.into(), bytes })
    }

    /// The kernel's form. `h2:headers`'s reserved and odd-stream bits are single bits of a byte.
    fn encode(&self, verdict: u32) -> Pattern {
        let (mut value, mut mask) = ([0u8; PREFIX_BYTES], [0u8; PREFIX_BYTES]);
        for (i, b) in self.bytes.iter().enumerate() {
            if let Some(b) = b {
                value[i] = *b;
                mask[i] = 0xff;
            }
        }
        if self.source == "h2:headers" {
            (mask[5], value[5]) = (0x80, 0);
            (mask[8], value[8]) = (0x01, 0x01);
        }
        let word = |a: &[u8; PREFIX_BYTES], w: usize| {
            let mut le = [0u8; 8];
            le.copy_from_slice(&a[w * 8..w * 8 + 8]);
            u64::from_le_bytes(le)
        };
        let mut p = Pattern { verdict, ..Pattern::default() };
        for w in 0..PREFIX_WORDS {
            p.words[w] = word(&value, w);
            p.mask[w] = word(&mask, w);
        }
        p
    }

    /// Whether a payload matches, as the kernel program decides it (for tests and reports).
    pub fn matches(&self, payload: &[u8]) -> bool {
        let p = self.encode(VERDICT_ALLOW);
        let mut prefix = [0u8; PREFIX_BYTES];
        let n = payload.len().min(PREFIX_BYTES);
        prefix[..n].copy_from_slice(&payload[..n]);
        (0..PREFIX_WORDS).all(|w| {
            let mut le = [0u8; 8];
            le.copy_from_slice(&prefix[w * 8..w * 8 + 8]);
            u64::from_le_bytes(le) & p.mask[w] == p.words[w]
        })
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

fn unescape(s: &str) -> Result<Vec<u8>, PatternError> {
    let bad = || PatternError::Escape(s.into());
    let mut out = Vec::new();
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        out.push(match bytes.next().ok_or_else(bad)? {
            b'r' => b'\r',
            b'n' => b'\n',
            b't' => b'\t',
            b'\\' => b'\\',
            b'x' => {
                let hex = [bytes.next().ok_or_else(bad)?, bytes.next().ok_or_else(bad)?];
                let hex = std::str::from_utf8(&hex).map_err(|_| bad())?;
                u8::from_str_radix(hex, 16).map_err(|_| bad())?
            }
            _ => return Err(bad()),
        });
    }
    Ok(out)
}

/// The allow and deny lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Patterns {
    /// Empty: any payload no deny pattern matches.
    pub allow: Vec<Prefix>,
    pub deny: Vec<Prefix>,
}

impl Default for Patterns {
    fn default() -> Self {
        let parse = |s: &&str| Prefix::parse(s).expect("the default patterns parse");
        Self { allow: DEFAULT_ALLOW.iter().map(parse).collect(), deny: DEFAULT_DENY.iter().map(parse).collect() }
    }
}

impl Patterns {
    /// From the user's lists; an empty list keeps the default, `any` empties the allow list.
    pub fn from_lists(allow: &[String], deny: &[String]) -> Result<Self, PatternError> {
        let defaults = Self::default();
        let allow = if allow.is_empty() {
            defaults.allow
        } else if allow.iter().any(|a| a == ANY) {
            Vec::new()
        } else {
            allow.iter().map(|a| Prefix::parse(a)).collect::<Result<_, _>>()?
        };
        if let Some(any) = deny.iter().find(|d| *d == ANY) {
            return Err(PatternError::AnyDenied(any.clone()));
        }
        let deny = if deny.is_empty() {
            defaults.deny
        } else {
            deny.iter().map(|d| Prefix::parse(d)).collect::<Result<_, _>>()?
        };
        let count = allow.len() + deny.len();
        if count > MAX_PATTERNS as usize {
            return Err(PatternError::TooMany { count });
        }
        Ok(Self { allow, deny })
    }

    /// The kernel's table, deny patterns first.
    pub fn table(&self) -> Vec<Pattern> {
        self.deny
            .iter()
            .map(|d| d.encode(VERDICT_DENY))
            .chain(self.allow.iter().map(|a| a.encode(VERDICT_ALLOW)))
            .collect()
    }

    /// What the kernel program decides for a payload: a request (true) or not.
    pub fn is_request(&self, payload: &[u8]) -> bool {
        !self.deny.iter().any(|d| d.matches(payload))
            && (self.allow.is_empty() || self.allow.iter().any(|a| a.matches(payload)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_tell_requests_from_probes() {
        let p = Patterns::default();
        assert!(p.is_request(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n"));
        assert!(!p.is_request(b"GET /health HTTP/1.1\r\n\r\n"));
        assert!(!p.is_request(b"GET /healthz HTTP/1.1\r\n\r\n"), "a prefix: /healthz too");
        assert!(!p.is_request(b"GET /metrics HTTP/1.1\r\n\r\n"));
        assert!(!p.is_request(b"GET /v1/models HTTP/1.1\r\n\r\n"));
        assert!(!p.is_request(b"GET / HTTP/1.1\r\n\r\n"), "not on the allow list");
        assert!(!p.is_request(b"{\"prompt\": \"a request body's second segment\"}"));
        assert!(p.is_request(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"));
        // HEADERS, 0x2a bytes, END_HEADERS, stream 1; then a DATA frame (type 0) and a SETTINGS
        // frame on stream 0 (even: the server's or the connection's) are no request.
        assert!(p.is_request(&[0, 0, 0x2a, 0x01, 0x04, 0, 0, 0, 1, 0x82]));
        assert!(!p.is_request(&[0, 0, 0x2a, 0x00, 0x01, 0, 0, 0, 1]));
        assert!(!p.is_request(&[0, 0, 0x06, 0x01, 0x04, 0, 0, 0, 2]));
        assert!(!p.is_request(&[0, 0, 0x06, 0x01, 0x04, 0x80, 0, 0, 1]), "the reserved bit");
        assert!(!p.is_request(&[0x16, 0x03, 0x01, 0x02, 0x00]), "a TLS ClientHello is opaque");
    }

    #[test]
    fn the_kernel_words_are_little_endian_with_masks() {
        let t = Patterns::from_lists(&["POST ".into()], &["GET /health".into()]).unwrap().table();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].verdict, VERDICT_DENY);
        assert_eq!(t[0].words[0], u64::from_le_bytes(*b"GET /hea"));
        assert_eq!(t[0].mask[0], u64::MAX);
        assert_eq!(t[0].words[1], u64::from_le_bytes([b'l', b't', b'h', 0, 0, 0, 0, 0]));
        assert_eq!(t[0].mask[1], 0x00ff_ffff);
        assert_eq!((t[0].mask[2], t[0].mask[3]), (0, 0));
        assert_eq!(t[1].verdict, VERDICT_ALLOW);
        assert_eq!(t[1].words[0], u64::from_le_bytes([b'P', b'O', b'S', b'T', b' ', 0, 0, 0]));
        assert_eq!(t[1].mask[0], 0xff_ffff_ffff);
        let h2 = Prefix::parse("h2:headers").unwrap().encode(VERDICT_ALLOW);
        assert_eq!(h2.mask[0], 0x0000_8000_ff00_00ff);
        assert_eq!(h2.words[0], 0x0000_0000_0100_0000);
        assert_eq!((h2.mask[1], h2.words[1]), (0x01, 0x01));
    }

    #[test]
    fn user_lists_replace_the_defaults_and_bad_ones_are_refused_with_the_syntax() {
        let p = Patterns::from_lists(&["any".into()], &[]).unwrap();
        assert!(p.allow.is_empty());
        assert!(p.is_request(b"\x16\x03\x01 a TLS record"));
        assert!(!p.is_request(b"GET /metrics"));
        let p = Patterns::from_lists(&[r"PUT /x\r\n".into()], &[r"\x00\x01".into()]).unwrap();
        assert_eq!(p.allow[0].bytes.len(), 8);
        assert!(p.is_request(b"PUT /x\r\n"));
        assert_eq!(p.deny[0].bytes, vec![Some(0), Some(1)]);
        assert_eq!(Prefix::parse(""), Err(PatternError::Empty(String::new())));
        assert_eq!(Prefix::parse(r"a\q"), Err(PatternError::Escape(r"a\q".into())));
        assert_eq!(Prefix::parse(r"a\x4"), Err(PatternError::Escape(r"a\x4".into())));
        assert!(matches!(Prefix::parse(&"x".repeat(33)), Err(PatternError::TooLong { len: 33, .. })));
        assert_eq!(Patterns::from_lists(&[], &["any".into()]), Err(PatternError::AnyDenied("any".into())));
        let many: Vec<String> = (0..15).map(|i| format!("X{i}")).collect();
        assert_eq!(Patterns::from_lists(&many, &[]), Err(PatternError::TooMany { count: 19 }));
    }
}
