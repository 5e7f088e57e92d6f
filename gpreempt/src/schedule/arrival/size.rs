//! A request's size, what its lead is learnt by ([`super::lead`]). The probe sees one segment:
//! its payload length is the request's size only when the request fits in it. An HTTP/1.1
//! request larger than the MSS (1448 bytes on a 1500-byte Ethernet MTU: a few hundred prompt
//! tokens of JSON), or whose client writes its headers and its body apart (two segments with
//! TCP_NODELAY), shows in its first segment only its header block. That block carries the body's
//! `Content-Length` (RFC 9112 §6.2; every JSON client of an OpenAI-style server sends one): the
//! size is then the header block plus the body. HTTP/2 (gRPC) compresses its headers (HPACK) and
//! chunked bodies have no length: their size stays the segment's.

use gpreempt_common::arrival::ArrivalHit;

/// The request's size in bytes: the header block plus `Content-Length` where the segment's first
/// bytes are an HTTP/1.x request head that gives one, else the segment's payload (never less).
pub fn request_size(hit: &ArrivalHit) -> u32 {
    let payload = hit.payload_len;
    match http1_length(hit.head()) {
        Some((headers, body)) => u32::try_from(headers.saturating_add(body)).unwrap_or(u32::MAX).max(payload),
        None => payload,
    }
}

/// An HTTP/1.x request head in `head`: (bytes of the header block as far as seen, the body's
/// `Content-Length`).
fn http1_length(head: &[u8]) -> Option<(u64, u64)> {
    let line_end = head.windows(2).position(|w| w == b"\r\n")?;
    let request_line = &head[..line_end];
    if !(request_line.ends_with(b" HTTP/1.1") || request_line.ends_with(b" HTTP/1.0")) {
        return None;
    }
    // The header block ends at the empty line; a head cut short by HEAD_BYTES counts what was
    // seen (the size is a regressor, not an offset).
    let block_end = head.windows(4).position(|w| w == b"\r\n\r\n").map_or(head.len(), |p| p + 4);
    let mut length = None;
    for line in head[line_end + 2..block_end.min(head.len())].split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else { continue };
        if !line[..colon].eq_ignore_ascii_case(b"content-length") {
            continue;
        }
        let value = std::str::from_utf8(&line[colon + 1..]).ok()?.trim_matches([' ', '\t']);
        // A malformed or repeated length (RFC 9112 §6.3: an error) gives no size from the head.
        let n = value.parse::<u64>().ok()?;
        if length.replace(n).is_some_and(|m| m != n) {
            return None;
        }
    }
    Some((block_end as u64, length?))
}

#[cfg(test)]
mod tests {
    use gpreempt_common::arrival::HEAD_BYTES;

    use super::*;

    fn hit(payload_len: u32, bytes: &[u8]) -> ArrivalHit {
        let mut hit = ArrivalHit { payload_len, ..ArrivalHit::default() };
        let n = bytes.len().min(HEAD_BYTES);
        hit.head[..n].copy_from_slice(&bytes[..n]);
        hit.head_len = n as u32;
        hit
    }

    const HEADERS: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n\
        content-type: application/json\r\nContent-Length: 36000\r\n\r\n";

    #[test]
    fn a_header_block_alone_gives_the_request_its_body_length() {
        // Headers written apart from a 36 000-byte body: the first segment is the block (115 bytes).
        assert_eq!(HEADERS.len(), 115);
        assert_eq!(request_size(&hit(115, HEADERS)), 115 + 36_000);
        // A first segment of one MSS with the body's start: the same size.
        let mut first = HEADERS.to_vec();
        first.extend(std::iter::repeat_n(b'x', 1448 - 115));
        assert_eq!(request_size(&hit(1448, &first)), 115 + 36_000);
    }

    #[test]
    fn the_header_name_is_matched_in_any_case_and_the_value_with_its_spaces() {
        let head = b"POST /generate HTTP/1.0\r\nCONTENT-LENGTH: \t 20 \r\n\r\n{\"prompt\": \"four\"}";
        assert_eq!(request_size(&hit(head.len() as u32, head)), 50 + 20);
    }

    #[test]
    fn without_an_http1_head_or_a_valid_length_the_segment_is_the_size() {
        // No Content-Length (a chunked body).
        let chunked = b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n";
        assert_eq!(request_size(&hit(700, chunked)), 700);
        // HTTP/2's connection preface and frames, a TLS record, nothing read.
        assert_eq!(request_size(&hit(900, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")), 900);
        assert_eq!(request_size(&hit(517, &[0x16, 0x03, 0x01, 0x02, 0x00])), 517);
        assert_eq!(request_size(&hit(64, b"")), 64);
        // Malformed, conflicting: no size from the head.
        let bad = b"POST / HTTP/1.1\r\nContent-Length: 12a\r\n\r\n";
        assert_eq!(request_size(&hit(300, bad)), 300);
        let twice = b"POST / HTTP/1.1\r\nContent-Length: 10\r\nContent-Length: 11\r\n\r\n";
        assert_eq!(request_size(&hit(300, twice)), 300);
        // The same length twice is one length.
        let same = b"POST / HTTP/1.1\r\nContent-Length: 10\r\nContent-length: 10\r\n\r\n";
        assert_eq!(request_size(&hit(300, same)), 300.max(same.len() as u32 + 10));
        // A length in the body, not in the header block, is not the request's.
        let in_body = b"POST / HTTP/1.1\r\nHost: a\r\n\r\nContent-Length: 99999\r\n";
        assert_eq!(request_size(&hit(53, in_body)), 53);
    }

    #[test]
    fn a_request_that_fits_its_segment_is_the_segment() {
        let mut whole = b"POST /generate HTTP/1.1\r\nContent-Length: 4\r\n\r\n".to_vec();
        whole.extend(b"abcd");
        assert_eq!(request_size(&hit(whole.len() as u32, &whole)), whole.len() as u32);
    }
}
